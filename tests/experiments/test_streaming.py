"""The streaming experiment: TIME-STRATIFIED and CONTROL tiny Transformer-XL runs trained through the txl gin
configs, then `templm stream` end to end writes results.json (the experiment), report.md and figures (the report)
with every test month; bad input (a missing split file, split ids the corpus lacks) is named and exits non-zero;
each setup has its own tokenizer, trained on its own training split, and the runs are compared by word perplexity;
a tokenizer changed since training, or a shared stream for models of different vocabularies, is refused."""

import gzip
import json
import os

import gin
import jax
import numpy as np
import pytest

from templm.cli import parse_gin
from templm.data.splits import read_split_file
from templm.errors import ConfigError, DataError
from templm.data.lm_data import load_processor, read_split_documents
from templm.data.readers import read_documents
from templm.data.token_stream import build_stream
from templm.data.vocab import train_spm
from templm.experiments.streaming import PRESETS as STREAM_PRESETS
from templm.experiments.streaming import (DynamicEvalConfig, StreamAnalyses, StreamData, choose_rate,
                                         prepare_preset_data, stream_evaluation)
from templm.io import file_sha256, jsonable
from templm.reports.stream import stream_markdown
from templm.training import lm_trainer, partitioning
from templm.training.configs import CorpusConfig
from templm.training.loop import RunOptions
from templm_testing import run_templm

# Static evaluation and the cheap analyses only: what most tests of stream_evaluation need.
QUICK = dict(dynamic=DynamicEvalConfig(()), analyses=StreamAnalyses(min_test_count=3, topics=False, pos=False))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The tiny_test world has 256 pieces; one layer and a short run keep the fixture to seconds.
TRAIN_BINDINGS = ["VOCAB_SIZE = 256", "TRAIN_STEPS = 12", "BATCH_SIZE = 8", "SAVE_PERIOD = 0",
                  "templm.TransformerXLConfig.n_layer = 1", "templm.OptimizerConfig.warmup_steps = 2",
                  "templm.train_lm.stats_period = 4"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The tiny_test data and two runs trained by `train_lm` bound by txl/{time_stratified,control}.gin + tiny.gin."""
    root = tmp_path_factory.mktemp("stream")
    data = prepare_preset_data(str(root / "data"), "tiny_test", seed=5)
    mesh = partitioning.make_mesh(mesh_shape=(1, 1), devices=jax.devices()[:1])
    dirs = {}
    for name in ("time_stratified", "control"):
        dirs[name] = str(root / name)
        bindings = TRAIN_BINDINGS + [f"MODEL_DIR = '{dirs[name]}'", f"CORPUS = '{data['corpus']}'",
                                     f"SPLIT_DIR = '{data['split_dir']}'",
                                     f"SPM_MODEL = '{data['spm_models'][name]}'"]
        try:
            parse_gin([f"txl/{name}.gin", "txl/tiny.gin"], bindings)
            result = lm_trainer.train_lm(options=RunOptions(mesh=mesh))
        finally:
            gin.clear_config()
        assert result.step == 12
    return {**data, **dirs, "root": root}


def _stream(*args, out=None):
    """`templm stream` in this process: the CompletedProcess."""
    return run_templm("stream", "--gin_file=txl/dynamic_eval.gin", *([f"--gin.OUT_DIR='{out}'"] if out else []),
                      *args)


@pytest.mark.e2e
@pytest.mark.parametrize("stop", ["SIGTERM"])
def test_a_signal_during_dynamic_evaluation_is_one_line_and_no_crash(runs, tmp_path, stop):
    """SIGTERM or Ctrl-C during dynamic evaluation printed the one line and then the process died of a segmentation
    fault (exit 139, 5 of 5 at the smoke preset's size): the signal's exception left a compilation running on XLA's
    thread pool, and the interpreter's teardown freed the device it used (gdb: the compile thread in
    SingleDeviceSharding::Create). The process now ends with its status after its line (dispatch.run). Here the
    signal is sent as the test stream's dynamic step starts; this tiny model compiles in milliseconds, so the test
    holds the contract (75, the line last, no fatal error) rather than catching that window each time. On a loaded
    machine the process can finish before this one reads the line: the signal then comes after results.json, and the
    line says the result is complete (it said "no result was written" beside a whole summary); else there is none."""
    import signal
    import subprocess
    import sys

    variant = "[{'name': 'dynamic', 'rule': 'sgd', 'which': 'all', 'lr': 0.03, 'lrs': [0.01, 0.03]}]"
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.Popen([sys.executable, "-m", "templm.cli", "stream", "--gin_file=txl/dynamic_eval.gin",
                             f"--gin.OUT_DIR='{tmp_path / 'out'}'",
                             f"--gin.TIME_STRATIFIED_DIR='{runs['time_stratified']}'",
                             f"--gin.CONTROL_DIR='{runs['control']}'",
                             f"--gin.templm.DynamicEvalConfig.variants={variant}",
                             "--gin.templm.StreamAnalyses.min_test_count=3", "--gin.templm.StreamAnalyses.n_topics=3"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=repo)
    said = []
    for line in proc.stderr:
        said.append(line)
        if "chosen on the validation stream" in line:  # the test stream's dynamic step comes next
            proc.send_signal(getattr(signal, stop))
            break
    out, rest = proc.communicate(timeout=300)
    assert proc.returncode == 75, "".join(said) + rest[-3000:]
    assert any("chosen on the validation stream" in line for line in said)
    last = rest.strip().splitlines()[-1]  # (after the progress lines already under way)
    assert last.startswith("templm stream: stopped by SIGTERM") and "Traceback" not in rest and \
        "Fatal Python error" not in rest, rest[-3000:]
    if last.endswith("after its results were written; they are complete"):
        assert json.loads(out)["files"]["report.md"] == str(tmp_path / "out" / "report.md")
        assert (tmp_path / "out" / "results.json").exists() and (tmp_path / "out" / "report.md").exists()
    else:
        assert out == "" and not (tmp_path / "out" / "results.json").exists(), last


@pytest.mark.e2e
def test_stream_again_into_its_own_folder_gives_the_same_output(runs, tmp_path):
    """Run again into the folder of its finished run (static evaluation, the cheap analyses), the verb writes the
    same results, report and figures (times aside), with nothing left beside the folder."""
    from templm_testing import folder_contents

    seen = []
    for _ in range(2):
        proc = _stream(f"--gin.TIME_STRATIFIED_DIR='{runs['time_stratified']}'",
                       f"--gin.CONTROL_DIR='{runs['control']}'", "--gin.templm.DynamicEvalConfig.variants=()",
                       "--gin.templm.StreamAnalyses.min_test_count=3", "--gin.templm.StreamAnalyses.topics=False",
                       "--gin.templm.StreamAnalyses.pos=False", out=tmp_path / "out")
        assert proc.returncode == 0, proc.stderr[-3000:]
        seen.append((folder_contents(tmp_path / "out"), proc.stdout))
    assert seen[0] == seen[1] and "results.json" in seen[0][0] and "report.md" in seen[0][0]
    assert sorted(os.listdir(tmp_path)) == ["out"]


def test_gin_configs_pick_the_splits_and_the_paper_model(runs):
    _, _, ts = lm_trainer.load_lm(runs["time_stratified"])
    _, _, ctl = lm_trainer.load_lm(runs["control"])
    assert ts["split_file"].endswith("time_stratified_train.gz") and ctl["split_file"].endswith("control_train.gz")
    assert ts["model_config"]["d_model"] == 64 and ts["model_config"]["eval_mem_len"] == 128
    assert ts["spm_sha256"] != ctl["spm_sha256"] and ts["data_order"] == "shuffle"
    try:
        parse_gin(["txl/control.gin"], ["MODEL_DIR = '/m'", "CORPUS = '/c'", "SPLIT_DIR = '/s'", "SPM_MODEL = '/v'"])
        config = gin.query_parameter("templm.train_lm.config").scoped_selector
        assert config == "MODEL_CONFIG/gin.macro"
        assert gin.query_parameter("templm.TransformerXLConfig.n_layer") == 18
        assert gin.query_parameter("templm.TransformerXLConfig.d_model") == 1024
        assert gin.query_parameter("templm.TransformerXLConfig.tgt_len") == 1024
        assert (gin.query_parameter("templm.TransformerXLConfig.mem_len"),
                gin.query_parameter("templm.TransformerXLConfig.eval_mem_len")) == (384, 1600)
        assert gin.query_parameter("%SPLIT") == "control_train"
        gin.clear_config()
        # The split's tokens from `templm data streams` (txl/streams.gin after the setup's file): no corpus needed.
        parse_gin(["txl/control.gin", "txl/streams.gin"], ["MODEL_DIR = '/m'", "TOKEN_STREAMS = '/t'",
                                                           "SPM_MODEL = '/v'"])
        corpus = CorpusConfig()
        assert (corpus.token_streams, corpus.corpus, corpus.split_dir, corpus.split) == ("/t", None, None,
                                                                                         "control_train")
        corpus.check("templm.CorpusConfig")  # the corpus is not asked for
    finally:
        gin.clear_config()


@pytest.mark.e2e
def test_stream_verb_writes_the_report_for_every_test_month(runs, tmp_path):
    # One variant (each costs a compilation): the RMS rule on the biases, so the verb also collects training
    # gradient statistics; SGD and the other subsets share the code path (tests/evaluation/test_dynamic_eval.py
    # covers them).
    dynamic = "[{'name': 'dynamic_rms_biases', 'rule': 'rms', 'which': 'biases', 'lr': 1e-4, 'eps': 1e-3}]"
    proc = _stream(f"--gin.TIME_STRATIFIED_DIR='{runs['time_stratified']}'", f"--gin.CONTROL_DIR='{runs['control']}'",
                   f"--gin.templm.DynamicEvalConfig.variants={dynamic}", "--gin.templm.DynamicEvalConfig.ms_segments=4",
                   "--gin.templm.StreamAnalyses.min_test_count=3", "--gin.templm.StreamAnalyses.n_topics=3",
                   out=tmp_path / "out")
    out, err = proc.stdout, proc.stderr
    assert proc.returncode == 0, err[-3000:]
    assert sorted(os.listdir(tmp_path / "out")) == [".templm.json", "emerging_words.png", "relative_perplexity.png",
                                                    "report.md", "results.json"]
    with open(tmp_path / "out" / "results.json") as f:
        results = json.load(f)
    with open(os.path.join(runs["split_dir"], "stats.json")) as f:
        test_months = sorted(m for m, n in json.load(f)["test_per_month"].items() if n > 0)
    assert len(test_months) == 12 and results["months"] == test_months
    n_docs = len(read_split_file(os.path.join(runs["split_dir"], "test.gz")))
    assert results["settings"]["n_documents"] == n_docs and results["settings"]["batch_size"] == 1
    assert set(results["runs"]) == {"time_stratified", "control"}
    assert set(results["runs"]["time_stratified"]) == {"static", "dynamic_rms_biases"}
    assert set(results["runs"]["control"]) == {"static"}
    for modes in results["runs"].values():
        for r in modes.values():
            assert sorted(r["by_month"]) == test_months
            assert sum(m["n_tokens"] for m in r["by_month"].values()) == r["overall"]["n_tokens"]
            assert r["overall"]["word_ppl"] > 1.0
    assert set(results["relative"]) == {"static", "dynamic_rms_biases"}
    assert sorted(results["relative"]["static"]["per_month"]) == test_months
    assert results["emerging"]["words"] and "occurrences" in results and "topics" in results
    with open(tmp_path / "out" / "report.md") as f:
        report = f.read()
    for month in test_months:
        assert f"| {month} |" in report
    assert "relative dynamic_rms_biases" in report and "## Emerging words" in report
    assert json.loads(out)["files"]["report.md"] == str(tmp_path / "out" / "report.md")


@pytest.mark.e2e
def test_bad_input_is_named_and_exits_non_zero(runs, tmp_path):
    missing = tmp_path / "no_such_test.gz"
    foreign = tmp_path / "foreign_test.gz"
    with gzip.open(foreign, "wt") as f:
        f.write("20180501\tworld-2018-05-01-999999\n")
    ts, ctl = f"--gin.TIME_STRATIFIED_DIR='{runs['time_stratified']}'", f"--gin.CONTROL_DIR='{runs['control']}'"
    procs = {
        "missing": _stream(ts, ctl, f"--gin.templm.StreamData.test_split_file='{missing}'",
                           out=tmp_path / "a"),
        "foreign": _stream(ts, ctl, f"--gin.templm.StreamData.test_split_file='{foreign}'",
                           out=tmp_path / "b"),
        "train_lm": run_templm(
            "train-lm", "--gin_file=txl/time_stratified.gin", "--gin_file=txl/tiny.gin",
            f"--gin.MODEL_DIR='{tmp_path / 'm'}'", f"--gin.CORPUS='{runs['corpus']}'",
            f"--gin.SPLIT_DIR='{tmp_path / 'nowhere'}'", f"--gin.SPM_MODEL='{runs['spm_model']}'"),
    }
    errors = {}
    for name, proc in procs.items():
        assert proc.returncode == 1, (name, proc.stderr[-3000:])
        errors[name] = proc.stderr
    assert f"{missing}: no such split file" in errors["missing"]
    assert f"{foreign}: 1 of the 1 document ids" in errors["foreign"] and "not in the corpus" in errors["foreign"]
    assert f"{tmp_path / 'nowhere' / 'time_stratified_train.gz'}: no such split file" in errors["train_lm"]
    for name in ("a", "b", "m"):
        assert not os.path.exists(tmp_path / name)  # nothing half-written


def test_each_setup_has_a_tokenizer_trained_on_its_own_training_split(runs, tmp_path):
    """The paper's per-setup SentencePiece models: TIME-STRATIFIED's is exactly the one its training split alone
    gives (so no test-period text reaches it), CONTROL's the one of its split; the shared option trains one on both."""
    files = runs["spm_models"]
    for name in ("time_stratified", "control"):
        ids = {doc_id for _, doc_id in read_split_file(os.path.join(runs["split_dir"], f"{name}_train.gz"))}
        alone = train_spm((d for d in read_documents(runs["corpus"]) if d.id in ids), str(tmp_path / name),
                          vocab_size=STREAM_PRESETS["tiny_test"].vocab_size, seed=5, exact_size=False)
        assert file_sha256(alone) == file_sha256(files[name])
    assert file_sha256(files["time_stratified"]) != file_sha256(files["control"])
    shared = prepare_preset_data(str(tmp_path / "shared"), "tiny_test", seed=5, corpus=runs["corpus"],
                                 shared_tokenizer=True)
    assert shared["spm_models"]["time_stratified"] == shared["spm_models"]["control"]
    assert file_sha256(shared["spm_model"]) not in {file_sha256(f) for f in files.values()}


def test_runs_read_the_stream_with_their_own_tokenizers_and_compare_by_words(runs, tmp_path):
    results = stream_evaluation(str(tmp_path / "out"), runs["time_stratified"], runs["control"], **QUICK)
    test_docs = read_split_documents(runs["corpus"], os.path.join(runs["split_dir"], "test.gz"))
    tokens = {name: build_stream(test_docs, load_processor(runs["spm_models"][name])).n_targets
              for name in ("time_stratified", "control")}
    assert tokens["time_stratified"] != tokens["control"]
    assert results["settings"]["n_tokens_by_run"] == tokens
    for name, modes in results["runs"].items():
        assert modes["static"]["overall"]["n_tokens"] == tokens[name]
        assert modes["static"]["overall"]["n_words"] == results["settings"]["n_words"]
    assert results["inputs"]["shared_tokenizer"] is False
    assert results["inputs"]["spm_models"] == {k: os.path.abspath(v) for k, v in runs["spm_models"].items()}


def test_the_outdated_tokenizer_comparison_scores_time_stratified_with_controls_tokenizer(runs, tmp_path):
    """The paper's Appendix E: TIME-STRATIFIED trained again with CONTROL's tokenizer, scored on the same stream;
    the comparison is the paired per-document test of the two TIME-STRATIFIED runs, with its share of the gap."""
    name = "time_stratified_control_tokenizer"
    other = str(tmp_path / name)
    bindings = TRAIN_BINDINGS + [f"MODEL_DIR = '{other}'", f"CORPUS = '{runs['corpus']}'",
                                 f"SPLIT_DIR = '{runs['split_dir']}'",
                                 f"SPM_MODEL = '{runs['spm_models']['control']}'"]
    try:
        parse_gin(["txl/time_stratified.gin", "txl/tiny.gin"], bindings)
        lm_trainer.train_lm(options=RunOptions(mesh=partitioning.make_mesh(mesh_shape=(1, 1),
                                                                             devices=jax.devices()[:1])))
    finally:
        gin.clear_config()
    results = stream_evaluation(str(tmp_path / "out"), runs["time_stratified"], runs["control"], **QUICK,
                                extra_dirs={name: other})
    tokens = {run: modes["static"]["overall"]["n_tokens"] for run, modes in results["runs"].items()}
    assert tokens[name] == tokens["control"] != tokens["time_stratified"]  # read with CONTROL's tokenizer
    documents = results["documents"]
    own, up_to_date, ctl = (np.array(documents["word_nll"][f"{run}/static"]) / np.array(documents["words"])
                            for run in ("time_stratified", name, "control"))
    comparison = results["tokenizer_comparison"]
    assert comparison["n"] == len(own) and comparison["run"] == name
    assert comparison["effect"] == pytest.approx(np.mean(own - up_to_date))
    assert comparison["share_of_gap"] == pytest.approx(np.mean(own - up_to_date) / np.mean(own - ctl))
    assert comparison["verdict"] in ("appears", "opposite", "inconclusive")
    assert "## Outdated tokenizer (the paper's Appendix E)" in stream_markdown(results)
    with pytest.raises(ConfigError, match="'control' is taken"):
        stream_evaluation(str(tmp_path / "bad"), runs["time_stratified"], runs["control"],
                          extra_dirs={"control": other})


def test_models_with_different_vocabularies_or_no_out_dir_are_refused(runs, tmp_path):
    other_spm = tmp_path / "other.model"
    spm_file = runs["spm_models"]["time_stratified"]
    with open(spm_file, "rb") as src, open(other_spm, "wb") as dst:
        original = src.read()
        dst.write(original + b"\n")  # another file: another SHA-256
    with pytest.raises(DataError, match=f"{runs['time_stratified']}: .* one test stream must serve every model"):
        stream_evaluation(str(tmp_path / "out"), runs["time_stratified"], runs["control"],
                          StreamData(spm_model=str(other_spm)))
    with pytest.raises(DataError, match=f"{runs['control']}: .* one test stream must serve every model"):
        stream_evaluation(str(tmp_path / "out"), runs["time_stratified"], runs["control"], StreamData(spm_model=spm_file))
    try:
        with open(spm_file, "wb") as f:
            f.write(original + b"\n")
        with pytest.raises(DataError, match=f"{spm_file}: the time_stratified model's SentencePiece model has "
                                            "changed since it was trained"):
            stream_evaluation(str(tmp_path / "out"), runs["time_stratified"], runs["control"])
    finally:
        with open(spm_file, "wb") as f:
            f.write(original)
    try:
        parse_gin(["txl/dynamic_eval.gin"], [f"TIME_STRATIFIED_DIR = '{runs['time_stratified']}'",
                                             "CONTROL_DIR = None"])
        with pytest.raises(ConfigError, match="set the gin macro OUT_DIR"):
            stream_evaluation()
    finally:
        gin.clear_config()
    with pytest.raises(DataError, match="not a trained Transformer-XL run"):
        stream_evaluation(str(tmp_path / "out"), str(tmp_path), runs["control"])
    with pytest.raises(ValueError, match=r"dynamic\[0\].*unknown \['learning_rate'\]"):
        stream_evaluation(str(tmp_path / "out"), runs["time_stratified"],
                          dynamic=DynamicEvalConfig([{"name": "d", "rule": "sgd", "learning_rate": 0.1}]))
    assert not os.path.exists(tmp_path / "out")


def test_stream_evaluation_writes_results_json_only(runs, tmp_path):
    """The experiment writes its numbers, nothing for people: report.md and figures are the report's (the verb's)."""
    results = stream_evaluation(str(tmp_path / "out"), runs["time_stratified"], runs["control"], **QUICK)
    assert sorted(os.listdir(tmp_path / "out")) == [".templm.json", "results.json"]
    assert results["files"] == {"results.json": str(tmp_path / "out" / "results.json")}
    with open(tmp_path / "out" / "results.json") as f:
        written = json.load(f)
    assert written == jsonable({k: v for k, v in results.items() if k != "files"})
    assert set(written["runs"]) == {"time_stratified", "control"} and set(written["relative"]) == {"static"}


def test_dynamic_rates_are_chosen_on_the_validation_stream(runs, tmp_path):
    """A variant with candidate rates takes the one with the lowest perplexity on the TIME-STRATIFIED validation
    stream (the months before the test period) and runs the test stream with it; without candidates, its lr."""
    variants = [{"name": "dynamic", "rule": "sgd", "which": "all", "lr": 0.5, "lrs": [1e-4, 0.3, 3.0]},
                {"name": "fixed", "rule": "sgd", "which": "biases", "lr": 0.05}]
    results = stream_evaluation(str(tmp_path / "out"), runs["time_stratified"], runs["control"],
                                dynamic=DynamicEvalConfig(variants), analyses=QUICK["analyses"])
    chosen = results["dynamic"]["chosen"]
    assert set(chosen) == {"time_stratified/dynamic"}  # the variant without candidates is not swept
    ppl = chosen["time_stratified/dynamic"]["validation_subword_ppl"]
    assert {"0.0001", "0.3", "3.0"} <= set(ppl)  # and more beyond an edge where the best was there (choose_rate)
    assert chosen["time_stratified/dynamic"]["lr"] == float(min(ppl, key=ppl.get))
    assert results["dynamic"]["validation_split_file"].endswith("time_stratified_validation.gz")
    with pytest.raises(ValueError, match="lrs must be a list of positive rates"):
        stream_evaluation(str(tmp_path / "bad"), runs["time_stratified"], runs["control"],
                          dynamic=DynamicEvalConfig([{"name": "d", "rule": "sgd", "lrs": [0.1, -1]}]))


def test_a_rate_grid_widens_while_the_best_rate_is_at_its_edge():
    """Four of five variants once chose the edge of their three-rate grid, so the best rate was never bracketed: the
    grid now grows by its own ratio beyond the edge the best rate sits at, at most three times."""
    import math

    def valley(centre):
        calls = []

        def evaluate(lr):
            calls.append(lr)
            return 10 + math.log(lr / centre) ** 2
        return evaluate, calls

    evaluate, calls = valley(0.5)
    lr, tried = choose_rate(evaluate, (0.01, 0.03, 0.1))
    assert [round(x, 6) for x in tried] == [0.01, 0.03, 0.1, 0.3, 0.9] and math.isclose(lr, 0.3)
    evaluate, calls = valley(1e-9)  # far below: three widenings, then the edge is kept
    lr, tried = choose_rate(evaluate, (1e-4, 1e-3))
    assert len(tried) == 5 and math.isclose(lr, 1e-7) and len(calls) == 5
    evaluate, calls = valley(0.03)  # bracketed from the start: nothing more is evaluated
    assert choose_rate(evaluate, (0.01, 0.03, 0.1))[0] == 0.03 and len(calls) == 3
    lr, tried = choose_rate(lambda x: float("nan") if x > 0.05 else 1 / x, (0.01, 0.1))  # NaN counts as worst
    assert lr == 0.01 and [round(x, 6) for x in tried] == [0.001, 0.01, 0.1]
    evaluate, calls = valley(2.0)  # one rate: both sides are tried
    lr, tried = choose_rate(evaluate, (0.5,))
    assert [round(x, 6) for x in tried] == [0.166667, 0.5, 1.5, 4.5] and lr == 1.5


def test_the_increasing_distance_layout_trains_on_its_file_and_streams_the_main_test(runs, tmp_path):
    """The release's Appendix C layout, `increasing_distance/split_<train until>/train.gz` alone (written here as
    the release writes it: gzipped `YYYYMMDD<TAB>id` lines): a model trains on it as on any split file, and is tested
    on the main split's test and validated on its TIME-STRATIFIED validation (the release's instructions); without
    them the missing test file is named."""
    import datetime

    main = read_split_file(os.path.join(runs["split_dir"], "time_stratified_train.gz"))
    until = max(date for date, _ in main) - datetime.timedelta(days=365)
    kept = [(date, doc_id) for date, doc_id in main if date <= until]
    assert 0 < len(kept) < len(main)
    folder = tmp_path / "increasing_distance" / f"split_{until.isoformat()}"
    folder.mkdir(parents=True)
    with gzip.open(folder / "train.gz", "wt", encoding="utf-8") as f:
        f.writelines(f"{date.strftime('%Y%m%d')}\t{doc_id}\n" for date, doc_id in kept)
    model_dir = str(tmp_path / "distant")
    bindings = TRAIN_BINDINGS + [f"MODEL_DIR = '{model_dir}'", f"CORPUS = '{runs['corpus']}'",
                                 f"SPLIT_DIR = '{folder}'", "SPLIT = 'train'",
                                 f"SPM_MODEL = '{runs['spm_models']['time_stratified']}'"]
    try:
        parse_gin(["txl/time_stratified.gin", "txl/tiny.gin"], bindings)
        result = lm_trainer.train_lm(options=RunOptions(mesh=partitioning.make_mesh(mesh_shape=(1, 1),
                                                                             devices=jax.devices()[:1])))
    finally:
        gin.clear_config()
    assert result.step == 12 and result.data["documents"] == len(kept)
    with pytest.raises(DataError, match="test.gz"):  # its own folder has no test split
        stream_evaluation(str(tmp_path / "no_test"), model_dir, runs["control"], **QUICK)
    results = stream_evaluation(str(tmp_path / "out"), model_dir, runs["control"],
                                StreamData(split_dir=runs["split_dir"]), **QUICK)
    assert results["inputs"]["test_split_file"] == os.path.join(runs["split_dir"], "test.gz")
    assert results["inputs"]["checkpoints"]["time_stratified"]["split_file"] == str(folder / "train.gz")
    test_months = {date.strftime("%Y-%m") for date, _ in read_split_file(os.path.join(runs["split_dir"], "test.gz"))}
    assert set(results["months"]) == test_months


def test_a_moved_folder_of_runs_finds_its_files_where_it_now_is(runs, tmp_path):
    """A run's record names the files beside it (vocabulary, splits, world) relative to its folder: a copy of the
    whole folder streams from the copy's own files (a reproduction moved after a SIGTERM could not be finished: the
    records held the old folder's absolute paths)."""
    import shutil

    moved = tmp_path / "moved"
    shutil.copytree(runs["root"], moved)
    results = stream_evaluation(str(tmp_path / "out"), str(moved / "time_stratified"), str(moved / "control"),
                                **QUICK)
    inputs = results["inputs"]
    assert inputs["test_split_file"] == str(moved / "data" / "splits" / "test.gz")
    assert inputs["spm_models"] == {name: str(moved / "data" / f"spm_{name}.model")
                                    for name in ("time_stratified", "control")}
    assert inputs["corpus"] == str(moved / "data" / "world" / "news.jsonl")
    _, _, meta = lm_trainer.load_lm(str(moved / "time_stratified"))
    assert meta["split_file"] == str(moved / "data" / "splits" / "time_stratified_train.gz")
