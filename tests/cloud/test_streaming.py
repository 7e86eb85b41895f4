"""train-lm and stream with every input and output in an emulator bucket (tests/cloud/conftest.py)."""

import json
import os

import pytest

from templm import paths
from cloud_testing import bucket_files, local_files, params_equal, timeless, upload
from templm_testing import run_templm


TXL_TINY = ["--gin_file=txl/tiny.gin", "--gin.VOCAB_SIZE=256", "--gin.TRAIN_STEPS=6",
            "--gin.BATCH_SIZE=8", "--gin.SAVE_PERIOD=0", "--gin.templm.TransformerXLConfig.n_layer=1",
            "--gin.templm.OptimizerConfig.warmup_steps=2", "--gin.templm.train_lm.stats_period=3"]
STREAM_QUICK = ["--gin_file=txl/dynamic_eval.gin",
                "--gin.templm.DynamicEvalConfig.variants=[{'name': 'dynamic', 'rule': 'sgd', 'lr': 0.03}]",
                "--gin.templm.StreamAnalyses.min_test_count=3", "--gin.templm.StreamAnalyses.topics=False",
                "--gin.templm.StreamAnalyses.pos=False"]


def _without_timings(results):
    return {key: value for key, value in results.items() if key != "timings_sec"}


@pytest.mark.e2e
def test_train_lm_and_stream_read_and_write_a_bucket_as_a_local_folder(gcs, bucket, tmp_path):
    """The Transformer-XL half with every input (corpus, split folder, SentencePiece models) and every output (the
    two runs, the stream's results, report and figures) in the bucket: the same training summaries and the same
    results.json, report and figures as the same commands on local folders, the records naming the bucket's files;
    nothing made where the commands ran, nothing left in the bucket beside the outputs."""
    from templm.experiments.streaming import prepare_preset_data

    here = tmp_path / "local"
    data = prepare_preset_data(str(here / "data"), "tiny_test", seed=5)
    there = f"gs://{bucket}"
    upload(str(here / "data"), f"{there}/data")
    uploaded = set(gcs.objects(bucket))
    work = tmp_path / "cwd"
    work.mkdir()
    summaries, results = {}, {}
    for root in (str(here), there):
        for name in ("time_stratified", "control"):
            result = run_templm(
                "train-lm", f"--gin_file=txl/{name}.gin", *TXL_TINY, f"--gin.MODEL_DIR='{root}/{name}'",
                f"--gin.CORPUS='{root}/data/world/news.jsonl'", f"--gin.SPLIT_DIR='{root}/data/splits'",
                f"--gin.SPM_MODEL='{root}/data/{paths.basename(data['spm_models'][name])}'", cwd=work)
            assert result.returncode == 0, (root, name, result.stderr[-3000:])
            summaries[root, name] = json.loads(result.stdout.strip().splitlines()[-1])
        result = run_templm("stream", *STREAM_QUICK, f"--gin.TIME_STRATIFIED_DIR='{root}/time_stratified'",
                            f"--gin.CONTROL_DIR='{root}/control'", f"--gin.OUT_DIR='{root}/stream'", cwd=work)
        assert result.returncode == 0, (root, result.stderr[-3000:])
        assert json.loads(result.stdout)["files"]["results.json"] == f"{root}/stream/results.json"
        with paths.open(f"{root}/stream/results.json") as f:
            results[root] = json.load(f)
    assert os.listdir(work) == []  # no ./gs:/... folder where the commands ran

    for name in ("time_stratified", "control"):
        local, remote_run = summaries[str(here), name], summaries[there, name]
        for summary in (local, remote_run):
            summary["train"] = {k: summary["train"][k] for k in ("loss", "ppl", "grad_norm", "param_norm")}
        assert remote_run == local and local["step"] == 6, name
    # The same numbers; the inputs are the bucket's files where the local run's were the local ones.
    local_text = json.dumps(_without_timings(results[str(here)]), sort_keys=True).replace(str(here), there)
    assert json.dumps(_without_timings(results[there]), sort_keys=True) == local_text
    inputs = results[there]["inputs"]
    assert inputs["checkpoints"]["control"] == {"dir": f"{there}/control", "step": 6,
                                                "split_file": f"{there}/data/splits/control_train.gz"}
    assert inputs["spm_models"]["time_stratified"] == f"{there}/data/spm_time_stratified.model"

    names = set(gcs.objects(bucket)) - uploaded
    stream_files = sorted(n.split("/", 1)[1] for n in names if n.startswith("stream/") and not n.endswith("/"))
    assert stream_files == sorted(os.listdir(here / "stream"))
    assert {"report.md", "relative_perplexity.png", "results.json"} <= set(stream_files)
    for name in stream_files:
        if name != "results.json":  # compared above, less its timings
            local = (here / "stream" / name).read_bytes()
            assert gcs.read(bucket, f"stream/{name}") == local.replace(str(here).encode(), there.encode()), name
    for run in ("time_stratified", "control"):
        assert {f"{run}/config.gin", f"{run}/metrics.jsonl", f"{run}/checkpoints/6/commit_success.txt"} <= names
        same, meta = params_equal(str(here / run / "checkpoints"), f"{there}/{run}/checkpoints")
        assert same, run
        # The record names the bucket's files beside the run relative to it, as a local run's record does.
        assert (meta["split_file"], meta["spm_model"]) == (f"../data/splits/{run}_train.gz", f"../data/spm_{run}.model")
    assert not [n for n in names if ".templm.lock" in n or ".templm-probe" in n or ".partial" in n]


@pytest.mark.e2e
def test_the_appendices_into_a_bucket_as_into_a_local_folder(gcs, bucket, tmp_path):
    """`templm appendices` (C: appendix B's shifted periods are streaming experiments, as the study's) with --out in
    the bucket: its world, splits (the increasing-distance split files put as objects), models and stream there, and
    the local run's results.json (folder names and timings aside)."""
    args = ["--preset=tiny_test", "--which=distance", "--gaps=0,12"]  # two models a run: the bucket is the point
    work = tmp_path / "cwd"
    work.mkdir()
    local, there = str(tmp_path / "app"), f"gs://{bucket}/app"
    for out in (local, there):
        result = run_templm("appendices", f"--out={out}", *args, cwd=work)
        assert result.returncode == 0, result.stderr[-3000:]
    assert os.listdir(work) == []
    with open(os.path.join(local, "results.json"), encoding="utf-8") as f:
        expected = timeless(json.loads(f.read().replace(local, "<OUT>")))
    found = timeless(json.loads(gcs.read(bucket, "app/results.json").decode().replace(there, "<OUT>")))
    assert found == expected
    names = set(gcs.objects(bucket))
    assert {"app/report.md", "app/figures/appendix_c.png"} <= names
    assert any("increasing_distance/split_" in n and n.endswith("train.gz") for n in names)


@pytest.mark.e2e
def test_calm_into_a_bucket_as_into_a_local_folder(gcs, bucket, tmp_path):
    """`templm data calm` (a corpus from the embedded world) and `templm calm` (its world, corpus, loss logs,
    results and report) with every folder in the bucket: the local run's corpus bytes and CALM metrics."""
    from templm_testing import CALM_TINY_RUN

    work = tmp_path / "cwd"
    work.mkdir()
    local, there = str(tmp_path / "calm"), f"gs://{bucket}/calm"
    for out in (local, there):
        world = ["--gin.WorldConfig.end_year=2014", "--gin.WorldConfig.docs_per_month=10"]
        result = run_templm("data", "calm", f"--world_dir={out}/world", f"--out={out}/corpus",
                            "--domains=sports,politics", *world, cwd=work)
        assert result.returncode == 0, result.stderr[-3000:]
        result = run_templm("calm", "--gin_file=calm/txl_online.gin", f"--gin.OUT_DIR='{out}/run'",
                            f"--gin.templm.CalmStreamConfig.corpus_dir='{out}/corpus'", *CALM_TINY_RUN, cwd=work)
        assert result.returncode == 0, result.stderr[-3000:]
    assert os.listdir(work) == []
    corpus = {n: b for n, b in local_files(os.path.join(local, "corpus")).items() if not n.startswith(".cache")}
    assert {n[len("calm/corpus/"):]: b for n, b in bucket_files(gcs, bucket).items()
            if n.startswith("calm/corpus/")} == corpus
    with open(os.path.join(local, "run", "results.json"), encoding="utf-8") as f:
        expected = json.loads(f.read().replace(local, "<OUT>"))
    found = json.loads(gcs.read(bucket, "calm/run/results.json").decode().replace(there, "<OUT>"))
    assert found["metrics"] == expected["metrics"] and found["corpus"] == expected["corpus"]
    assert {"calm/run/learner.jsonl", "calm/run/baseline.jsonl", "calm/run/report.md", "calm/run/loss.png"} <= set(
        gcs.objects(bucket))
