"""`templm reproduce` (templm/experiments/reproduce.py, its report from templm/reports/reproduction.py) end to end
through the CLI, on the `tiny_test` preset (the `smoke` preset, which `make demo` runs,
is the same pipeline with a bigger world and more steps): every stage runs, report.md has its sections, the figures
and results.json are there with their keys, and a stage re-run with the same seed repeats exactly (the task data
example for example, the trained parameters bit for bit, the evaluation's numbers)."""

import dataclasses
import importlib.metadata
import json
import os

import jax
import numpy as np
import pytest

from templm.experiments.reproduce import (PRESETS, SOFTWARE, ExtraStage, Reproduction, StudyData, pretrain,
                                         run_extra_stage, train_models)
from templm.data.readers import TemplamaReader
from templm.errors import cpu_model
from templm.metrics import qa
from templm.metrics.findings import STREAMING, STUDY
from templm.metrics.statistics import VERDICTS, verdict
from templm.reports import reproduction as report
from templm_testing import TINY_STUDY, run_templm_stopped
from templm_testing import run_templm as templm

pytestmark = pytest.mark.e2e

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PRESET = PRESETS["tiny_test"]
# The study the suite runs once (tests/conftest.py's `tiny_study`): the preset with its batches from two data shards.
STUDY_PRESET = dataclasses.replace(PRESET, data_shards=2)
STAGES = ["data", "train uniform and temporal", "train yearly experts", "evaluate", "future probes", "adaptation",
          "extra: streaming"]


@pytest.fixture(scope="module")
def run_dir(tiny_study):
    """The suite's tiny reproduction (`templm reproduce` with TINY_STUDY, in-process, shared with the multi-host
    test); what it printed is checked here."""
    out, stdout, stderr = tiny_study()
    assert f"templm reproduce: tiny_test preset, seed 0: {out}/report.md" in stdout
    for finding in STUDY:  # both halves, streaming_gap etc. included
        assert f"  {finding.name}: " in stdout
    assert "reproduce [1/7] data: starting" in stderr and "ETA" in stderr  # progress
    assert "  trained uniform: 6 steps" in stderr
    return out


@pytest.fixture(scope="module")
def results(run_dir):
    with open(run_dir / "results.json", encoding="utf-8") as f:
        return json.load(f)


def test_report_and_figures(run_dir):
    assert {"report.md", "results.json", "run.json", "figures", "data", "models"} <= set(os.listdir(run_dir))
    uniform = run_dir / "models" / "uniform" / "checkpoints"
    final = max(int(step) for step in os.listdir(uniform) if step.isdigit())
    assert not (uniform / str(final) / "input").exists()  # a model of fixed length keeps no input state at its end
    # each model's folder is shaped as T5X's: the study's operative gin config and the train/ summaries
    config = (run_dir / "models" / "uniform" / "config.gin").read_text()
    assert "Study.name = 'tiny_test'" in config and "Study.steps = 6" in config
    assert "Study.data_shards = 2" in config  # the command line's binding on top of the preset
    assert any(name.startswith("events.out") for name in os.listdir(run_dir / "models" / "uniform" / "train"))
    text = (run_dir / "report.md").read_text()
    for heading in ("## The run", "## Expected findings", "## TempLAMA F1 and CustomNews F1 and perplexity",
                    "## Yearly experts by year gap", "## F1 by how long the answer stays valid",
                    "## Degradation into the future", "## Calibration on future relations",
                    "## Adaptation to a new year (2017)", "## Timing"):
        assert heading in text
    assert "preset `tiny_test`, seed 0" in text and "seen (training) 2016, future 2017" in text
    # the installed versions that shape the numbers, in results.json and the report's last line
    with open(run_dir / "results.json", encoding="utf-8") as f:
        timing = json.load(f)["timing"]
    software = timing["software"]
    assert software["sentencepiece"] == importlib.metadata.version("sentencepiece")
    # and the processor, whose instructions shape them too
    processor = None
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            processor = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), None)
    assert f"CPU cores ({processor or cpu_model()}), " in timing["machine"]
    assert software["jaxlib"] == importlib.metadata.version("jaxlib") and set(software) == set(SOFTWARE)
    assert f" cpu device(s), with jax {jax.__version__}, jaxlib " in text.splitlines()[-1]
    # The Temporal model asked as of its last seen year: each F1 from its prediction and the query's gold names, and
    # the report's line with both means.
    with open(run_dir / "results.json", encoding="utf-8") as f:
        as_of = json.load(f)["future_as_of"]
    gold = {q.id: q.gold_names for q in TemplamaReader(str(run_dir / "data" / "world" / "templama" / "test.jsonl"))}
    assert as_of["f1_as_of"] == [100.0 * qa.token_f1(p, gold[i]) for p, i in zip(as_of["prediction_as_of"],
                                                                                  as_of["id"])]
    own, then = (sum(as_of[k]) / len(as_of[k]) for k in ("f1_own_year", "f1_as_of"))
    assert (f"Asked as of 2016 (templm's diagnostic, not a test of either paper): on the {len(as_of['id'])} "
            f"future-year TempLAMA test queries the Temporal model scores F1 {own:.2f} with each query's own year "
            f"in its prefix") in " ".join(text.split())
    assert f"and {then:.2f} with `year: 2016`" in text
    for name in report.FIGURES:
        data = (run_dir / "figures" / f"{name}.png").read_bytes()
        assert data[:4] == b"\x89PNG", name
    assert not [f for f in os.listdir(run_dir) if f.endswith(".tmp")]


def test_the_streaming_half_runs_inside_reproduce(run_dir, results):
    """The Transformer-XL stage: TIME-STRATIFIED and CONTROL models trained on their own world, static and dynamic
    evaluation of the test stream, its section and figures in the report, its timings under "timing"."""
    stream = results["extra"]["streaming"]
    assert stream["preset"] == "tiny_test"
    ppl = stream["overall_word_ppl"]
    assert {"time_stratified/static", "control/static", "time_stratified/dynamic"} <= set(ppl)
    assert all(v is not None and v > 1 for v in ppl.values())
    assert stream["relative"]["static"]["mean"] == pytest.approx(
        ppl["time_stratified/static"] / ppl["control/static"] - 1, abs=0.5)  # a mean of monthly ratios, not overall
    gain = stream["dynamic_gain"]["dynamic"]
    assert gain == pytest.approx(ppl["time_stratified/dynamic"] / ppl["time_stratified/static"] - 1, rel=1e-9)
    assert len(stream["months"]) == 12
    text = (run_dir / "report.md").read_text()
    assert "## Streaming perplexity and dynamic evaluation (Transformer-XL)" in text
    assert "figures/stream_relative_perplexity.png" in text and "## streaming" not in text
    assert "findings" not in stream  # the stage's findings are the study's, in one place
    assert {n for n, f in results["findings"].items() if f["half"] == STREAMING} == {
        "streaming_gap", "streaming_growth", "streaming_dynamic", "streaming_dynamic_slope", "streaming_size_slope"}
    # The preset's larger TIME-STRATIFIED model (tiny_test: two layers against one), trained and scored on the same
    # stream against the same CONTROL model: the size comparison is tested on the run's own months.
    # The size comparison presumes the smaller model's upward slope (streaming_growth appears); else it is not
    # applicable, with both slopes as details.
    size = results["findings"]["streaming_size_slope"]
    if results["findings"]["streaming_growth"]["verdict"] == "appears":
        assert size["n"] == 12 and size["verdict"] == verdict(size["effect"], size["p_value"], +1)
        assert size["word_ppl"]["large"] == pytest.approx(ppl["time_stratified_large/static"], rel=1e-9)
    else:
        assert size["verdict"] == "not applicable" and size["effect"] is None
        assert results["findings"]["streaming_dynamic_slope"]["verdict"] == "not applicable"
    assert size["slope_large"] is not None and size["slope_small"] is not None
    dynamic = results["findings"]["streaming_dynamic"]
    assert dynamic["verdict"] == verdict(dynamic["effect"], dynamic["p_value"], -1)
    assert (dynamic["effect"] < 0) == (gain < 0)  # per document and overall, the same direction here
    assert (run_dir / "figures" / "stream_relative_perplexity.png").read_bytes()[:4] == b"\x89PNG"
    assert set(results["timing"]["extra"]["streaming"]) == {"data", "train_time_stratified", "train_control",
                                                            "train_time_stratified_large", "evaluate"}
    assert os.path.isdir(run_dir / "stream_experiment" / "time_stratified")


def test_the_streaming_paths_are_relative_so_a_moved_run_reports_whole(run_dir, results, tmp_path):
    """results.json names the streaming half's files relative to the run's folder: the report rebuilt in a copy of
    the folder draws the streaming figures from the copy's stream results (and nothing from the original)."""
    stream = results["extra"]["streaming"]
    assert stream["out_dir"] == "stream_experiment"
    assert stream["results"] == os.path.join("stream_experiment", "stream", "results.json")
    moved = tmp_path / "moved"
    os.makedirs(moved / "stream_experiment" / "stream")
    with open(run_dir / "stream_experiment" / "stream" / "results.json", encoding="utf-8") as f:
        stream_results = json.load(f)
    stream_results["relative"] = {"static": stream_results["relative"]["static"]}  # the figure must come from it
    with open(moved / "stream_experiment" / "stream" / "results.json", "w", encoding="utf-8") as f:
        json.dump(stream_results, f)
    report.write_report(results, str(moved))
    assert {f"{name}.png" for name in report.FIGURES} | {"stream_relative_perplexity.png"} == set(
        os.listdir(moved / "figures")) - {"stream_emerging_words.png"}
    assert (moved / "stream_experiment" / "stream" / "report.md").exists()
    original = run_dir / "figures" / "stream_relative_perplexity.png"
    assert (moved / "figures" / "stream_relative_perplexity.png").read_bytes() != original.read_bytes()


def test_results_json_holds_every_stage(results):
    assert set(results) == {"adaptation", "calibration", "config", "degradation", "duration", "extra", "findings",
                            "future_as_of", "model_config", "models", "per_query", "preset", "regimes", "seed",
                            "summary", "timing", "world", "yearly"}
    assert results["preset"] == "tiny_test" and results["seed"] == 0
    assert results["world"]["seen_years"] == [2016] and results["world"]["future_years"] == [2017]
    for regime in ("uniform", "yearly", "temporal"):
        templama, customnews = results["regimes"][regime]["templama"], results["regimes"][regime]["customnews"]
        for key in ("seen_f1", "future_f1", "f1_2016", "f1_2017", "count_2017"):
            assert key in templama, (regime, key)
        assert customnews["ppl_2016"] > 1 and customnews["ppl_2017"] > 1
        assert set(results["duration"][regime]) == {"1", "2", "3-4", "5+"}
    assert results["regimes"]["yearly"]["routes"] == {"2016": 2016, "2017": 2016}
    params = results["models"]["uniform"]["params"]
    assert params > 0
    steps = {name: m["steps"] for name, m in results["models"].items()}
    assert steps == {"uniform": PRESET.steps, "temporal": PRESET.steps, "yearly_2016": PRESET.yearly_steps,
                     "adapt_alpha0.5": PRESET.adapt_steps, "adapt_uniform_alpha0.5": PRESET.adapt_steps,
                     "retrain": PRESET.retrain_steps, "retrain_uniform": PRESET.retrain_steps}
    assert results["summary"]["yearly"]["params"] == params  # one expert
    assert set(results["yearly"]["by_gap"]) == {"0", "1"}
    assert set(results["yearly"]["customnews"]["by_gap"]) == {"0", "1"}  # the experts on CustomNews spans too
    assert "customnews" in results["findings"]["yearly_falloff"]
    for regime in ("uniform", "temporal", "yearly"):  # CustomNews: the masked span's F1 by year
        assert {"f1_2016", "f1_2017", "seen_f1"} <= set(results["regimes"][regime]["customnews"])
    for regime in ("uniform", "temporal"):
        assert results["degradation"][regime]["gaps"] == list(range(1, PRESET.max_gap + 1))
        assert results["calibration"][regime]["years"] == [2017, 2018]
        assert set(results["calibration"][regime]["entropy"]) == {"frequent", "rare", "never"}
    for regime in ("temporal", "uniform"):  # both regimes adapted, scored on TempLAMA and CustomNews
        adapted = results["adaptation"]["regimes"][regime]
        summary = adapted["summary"]
        assert set(summary["alphas"]) == {"0.5"} and summary["retrained"]["steps"] == PRESET.retrain_steps
        assert summary["alphas"]["0.5"]["total_steps"] == PRESET.steps + PRESET.adapt_steps
        assert set(adapted["customnews_summary"]["alphas"]) == {"0.5"}
        assert set(adapted["per_query"]) == {"templama", "customnews"}
        # Each regime against itself retrained from scratch (the paper's "models retrained from scratch").
        assert adapted["retrained"]["steps"] == PRESET.retrain_steps
        assert summary["retrained"]["new_f1"] == adapted["retrained"]["new_f1"]
        assert set(adapted["per_query"]["templama"]["f1"]) == {"base", "0.5", "retrained"}
    assert results["adaptation"]["retrained"] == results["adaptation"]["regimes"]["temporal"]["retrained"]
    assert results["models"]["retrain_uniform"]["regime"] == "uniform"
    assert [name for name, _ in results["timing"]["stages"]] == STAGES  # in run order
    assert set(results["findings"]) == {f.name for f in STUDY}
    assert all(f["verdict"] in VERDICTS for f in results["findings"].values())
    ids = results["per_query"]["id"]
    assert ids and set(results["per_query"]["f1"]) == {"uniform", "temporal", "yearly"}
    assert all(len(v) == len(ids) for v in results["per_query"]["f1"].values())
    seen = [f for f, y in zip(results["per_query"]["f1"]["temporal"], results["per_query"]["year"]) if y == 2016]
    assert sum(seen) / len(seen) == pytest.approx(results["regimes"]["temporal"]["templama"]["f1_2016"])
    # Each query's answer duration (the world's fact spans: at least one year), and CustomNews's spans per example.
    durations = results["per_query"]["duration"]
    assert len(durations) == len(ids) and all(d is None or d >= 1 for d in durations) and any(durations)
    news = results["per_query"]["customnews"]
    assert set(news["f1"]) == {"uniform", "temporal", "yearly"} and len(news["id"]) == sum(
        results["regimes"]["temporal"]["customnews"][f"count_{y}"] for y in (2016, 2017))
    for regime in ("temporal", "yearly"):
        spans = [f for f, y in zip(news["f1"][regime], news["year"]) if y == 2016]
        assert sum(spans) / len(spans) == pytest.approx(results["regimes"][regime]["customnews"]["f1_2016"])

    # The Temporal model on the future years with its own year (the raw-text scorer: each query's F1 as the seqio
    # evaluation's) and as of the last seen year.
    as_of = results["future_as_of"]
    future = {i: f for i, f, y in zip(ids, results["per_query"]["f1"]["temporal"], results["per_query"]["year"])
              if y == 2017}
    assert as_of["as_of"] == 2016 and sorted(as_of["id"]) == sorted(future) and set(as_of["year"]) == {2017}
    assert dict(zip(as_of["id"], as_of["f1_own_year"])) == pytest.approx(future)
    assert len(as_of["f1_as_of"]) == len(as_of["prediction_as_of"]) == len(future)

    def keys(tree, path=()):  # wall-clock numbers live under "timing" only
        if isinstance(tree, dict):
            for k, v in tree.items():
                yield path + (k,)
                yield from keys(v, path + (k,))
    assert not [p for p in keys({k: v for k, v in results.items() if k != "timing"})
                if "wall" in p[-1] or p[-1] in ("total_s", "seconds")]


def _contents(path):
    """A file's bytes; for record files the parsed examples (protobuf map fields serialise in any order)."""
    if path.endswith(".tfrecord"):
        import tensorflow as tf

        return [tf.train.Example.FromString(r.numpy()) for r in tf.data.TFRecordDataset(path)]
    with open(path, "rb") as f:
        return f.read()


def test_a_stage_repeats_exactly_with_the_same_seed(run_dir, results, tmp_path):
    """The data stage and the Uniform model's training, re-run here, give the CLI run's data (the same files, the
    same examples) and parameters; the re-trained model's TempLAMA numbers are the ones in results.json."""
    from templm import tasks
    from templm.evaluation.task_eval import evaluate_model
    from templm.training.checkpoints import load_params
    from templm.evaluation.inference import ModelFns

    again = Reproduction(STUDY_PRESET, str(tmp_path), seed=0)
    try:
        data = again.prepare_data()
        compared = 0
        for folder, _, files in os.walk(run_dir / "data"):
            for name in files:
                path = os.path.join(folder, name)
                relative = os.path.relpath(path, run_dir / "data")
                if relative == os.path.join("splits", "stats.json"):
                    continue  # names the folder it was written in
                other = os.path.join(again.data_dir, relative)
                assert _contents(path) == _contents(other), relative
                compared += 1
        assert compared > 20
        again.configure(again.data_dir)
        uniform = again.train("uniform", "uniform", "uniform_mixture", PRESET.steps)
        params = uniform.params
        assert uniform.record["steps"] == PRESET.steps == results["models"]["uniform"]["steps"]
        assert uniform.record["train_loss"] == results["models"]["uniform"]["train_loss"]
        stored, _ = load_params(str(run_dir / "models" / "uniform" / "checkpoints"))
        for x, y in zip(jax.tree.leaves(params), jax.tree.leaves(stored)):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
        again.configure(again.data_dir)
        fns = ModelFns(again.model, params, batch_size=PRESET.eval_batch_size,
                       max_decode_length=PRESET.targets_length)
        metrics = evaluate_model(fns, "templama_uniform", again.lengths).metrics
        assert metrics == pytest.approx(results["regimes"]["uniform"]["templama"], abs=1e-9)

        # The hook for extra stages (the Transformer-XL streaming half): what a stage sees and where its output goes.
        seen = {}

        def probe(context):
            seen.update(preset=context.preset.name, seed=context.seed, years=context.manifest["years"],
                        figures=os.path.isdir(context.figures_dir), models=sorted(context.results["models"]))
            return {"markdown": "Streaming numbers.", "value": 3, "timings_sec": {"train": 1.5}}

        value = run_extra_stage(again, ExtraStage("probe", probe), data, {"models": {"uniform": uniform.record}})
        assert seen == {"preset": "tiny_test", "seed": 0, "years": [2016, 2017], "figures": True,
                        "models": ["uniform"]}
        assert value == {"markdown": "Streaming numbers.", "value": 3, "timings_sec": {"train": 1.5}}
    finally:
        tasks.configure()


def test_a_pretrained_model_is_where_every_model_starts(run_dir, tmp_path):
    """With Study.pretrain_steps, a starting model trains first on the seen years' news alone (no year prefix, no
    TempLAMA; here under T5's random spans, Study.pretrain_objective; the last seen year's alone with
    Study.pretrain_snapshot) and the models of the study start from it: the
    Uniform model trained here on the study's data, seed and steps differs from the study's own Uniform (trained from
    scratch) only by its start."""
    from templm import tasks
    from templm.training.checkpoints import load_params

    preset = dataclasses.replace(STUDY_PRESET, pretrain_steps=3, pretrain_objective="random_spans")
    run = Reproduction(preset, str(tmp_path), seed=0, data=StudyData(task_data=str(run_dir / "data")))
    try:
        data = run.prepare_data()
        start = pretrain(run, data)["pretrained"]
        assert start.params is None  # the others read its checkpoint
        assert {k: start.record[k] for k in ("regime", "mixture", "steps", "init", "years")} == {
            "regime": "pretrain", "mixture": "customnews_random_spans", "steps": 3, "init": "scratch",
            "years": data.seen}
        # Study.pretrain_snapshot: the last seen year's news alone (this study has one seen year: the same batches;
        # test_registry's training-years test shows what the train split then holds), the study's years after it.
        snapshot = Reproduction(dataclasses.replace(preset, pretrain_snapshot=True), str(tmp_path / "snapshot"),
                                seed=0, data=StudyData(task_data=str(run_dir / "data")))
        assert pretrain(snapshot, snapshot.prepare_data())["pretrained"].record["years"] == [max(data.seen)]
        assert tasks.current()["train_years"] == data.seen
        run.configure(data.data_dir)
        uniform = run.train("uniform", "uniform", "uniform_mixture", PRESET.steps)
        assert uniform.record["init"] == "pretrained" and uniform.record["steps"] == PRESET.steps
        scratch, _ = load_params(str(run_dir / "models" / "uniform" / "checkpoints"))
        differ = [not np.array_equal(np.asarray(x), np.asarray(y))
                  for x, y in zip(jax.tree.leaves(uniform.params), jax.tree.leaves(scratch))]
        assert all(differ)
    finally:
        tasks.configure()


def test_cli_flags_and_the_demo_target():
    help_text = templm("reproduce", "--help")
    assert help_text.returncode == 0
    for flag in ("--preset", "--out", "--seed", "smoke: every stage"):
        assert flag in help_text.stdout
    bad = templm("reproduce", "--preset=huge", "--out=/tmp/never-written")
    assert bad.returncode != 0 and "huge" in bad.stderr
    assert not os.path.exists("/tmp/never-written")
    with open(os.path.join(ROOT, "Makefile"), encoding="utf-8") as f:
        assert "templm reproduce --preset smoke --out $(DEMO_DIR)" in f.read()


def test_a_rerun_that_fails_on_a_damaged_model_keeps_the_results_and_says_what_to_do(run_dir, tmp_path):
    """A finished run whose Uniform model's only checkpoint is damaged: the rerun names the model's folder and the
    way forward (remove it, run again), exits 1, and results.json and report.md are still the finished run's."""
    import shutil

    out = tmp_path / "run"
    shutil.copytree(run_dir, out)
    before = {name: (out / name).read_bytes() for name in ("results.json", "report.md")}
    checkpoints = out / "models" / "uniform" / "checkpoints"
    (step,) = [name for name in os.listdir(checkpoints) if name.isdigit()]
    files = [os.path.join(folder, name) for folder, _, names in os.walk(checkpoints / step) for name in names]
    target = max(files, key=os.path.getsize)  # the parameters' largest file
    with open(target, "r+b") as f:
        f.truncate(os.path.getsize(target) // 2)
    result = templm(*TINY_STUDY, f"--out={out}")
    assert result.returncode == 1, result.stderr[-3000:]
    assert "no intact checkpoint to restore" in result.stderr
    assert f"remove {out / 'models' / 'uniform'} and run the same command again to train it afresh" in result.stderr
    assert {name: (out / name).read_bytes() for name in before} == before


def test_seeds_named_twice_are_refused(tmp_path):
    """(A run of several seeds, stopped and resumed, is tests/cloud/test_study.py's, into a bucket.)"""
    bad = templm("reproduce", "--preset=tiny_test", f"--out={tmp_path / 'x'}", "--seeds=1,1")
    assert bad.returncode == 1 and "distinct" in bad.stderr


def _steps_saved(model_dir):
    checkpoints = model_dir / "checkpoints"
    return sorted(int(s) for s in os.listdir(checkpoints) if s.isdigit()) if checkpoints.exists() else []


def test_when_one_training_of_a_stage_fails_the_one_beside_it_stops_with_its_checkpoint(tmp_path):
    """Study.trainings_at_once (2 in the preset): a training that fails at its start stops the one beside it after
    that one's step, with a checkpoint a rerun resumes from; a training not yet started never starts; the failure is
    what the stage raises."""
    assert STUDY_PRESET.trainings_at_once == 2
    run = Reproduction(STUDY_PRESET, str(tmp_path), seed=0)
    data = run.prepare_data()
    run.configure(data.data_dir)
    jobs = [("uniform", "uniform", "uniform_mixture", 10 ** 6), ("broken", "uniform", "no_such_mixture", 6),
            ("later", "uniform", "uniform_mixture", 6)]
    with pytest.raises(ValueError, match="no_such_mixture"):
        train_models(run, jobs)
    steps = _steps_saved(tmp_path / "models" / "uniform")
    assert steps and steps[-1] < 10 ** 6
    assert not (tmp_path / "models" / "later").exists()


def test_ctrl_c_while_two_models_train_stops_both_with_their_checkpoints(tmp_path):
    """Ctrl-C while Uniform and Temporal train at once: both stop after their step with a checkpoint, the command
    exits 130 with one line, and nothing of the run's results is written."""
    import signal

    out = tmp_path / "run"
    models = out / "models"
    started = lambda: all((models / m / "train").exists() for m in ("uniform", "temporal"))  # noqa: E731
    result = run_templm_stopped(started, *TINY_STUDY, "--gin.Study.steps=1000000", f"--out={out}", sig=signal.SIGINT)
    assert result.returncode == 130, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    for name in ("uniform", "temporal"):
        steps = _steps_saved(models / name)
        assert steps and steps[-1] < 10 ** 6, name
    assert not (out / "results.json").exists() and not (out / "report.md").exists()
