"""The CALM experiment: `run_calm` in process (its results, results.json and the logs, no report), and `templm calm`
end to end (the experiment, then the report), with bad input answered by a message and a non-zero exit."""

import dataclasses
import json
import os

import numpy as np
import pytest

from templm.data.calm_corpus import build_calm_corpus_from_texts
from templm.data.calm_log import read_loss_log
from templm.data.world import WorldConfig
from templm.experiments.calm import (CalmBaselineConfig, CalmModelConfig, CalmStreamConfig, OnlineLearnerConfig,
                                     log_metrics, run_calm)
from templm.io import jsonable
from templm.metrics.calm import compute_metrics
from templm_testing import CALM_TINY_RUN, farm_and_market, folder_contents, run_templm as templm, write_texts

GIN = "gin_configs/calm/txl_online.gin"


# The smallest run that CALM scores: 2 classes x 50 segments of one batch of 2 x 8 tokens, a one-layer model. The
# original's segment law at scale m = 4 / 8 / 2 = 0.25 draws from [0.025, 0.65], which rounds to one batch.
TINY_STREAM = CalmStreamConfig(domains=["sports", "politics"], nswitches=50, switch_frequency=4, window_size=8,
                               batch_size=2)
TINY = dict(model=CalmModelConfig(d_model=32, d_head=16, d_inner=64, n_layer=1, mem_len=8),
            baseline=CalmBaselineConfig(pretrain_batches=20, pretrain_passes=1))
TINY_RUN = CALM_TINY_RUN  # the same run from the command line (tests/support/templm_testing.py)


# -- the experiment, in process ---------------------------------------------------------------------------------------


def test_run_calm_returns_its_results_and_writes_json_and_logs_only(tmp_path, capsys):
    out = tmp_path / "run"
    world = WorldConfig(seed=0, start_year=2014, end_year=2014, subjects_per_relation=10, docs_per_month=10)
    results = run_calm(out_dir=str(out), stream=dataclasses.replace(TINY_STREAM, world=world), **TINY)
    assert sorted(os.listdir(out)) == [".templm.json", "baseline.jsonl", "corpus", "learner.jsonl", "results.json",
                                       "world"]
    assert results["files"] == {name: str(out / name) for name in ("learner.jsonl", "baseline.jsonl",
                                                                   "results.json")}
    assert json.loads((out / "results.json").read_text()) == jsonable(results)
    assert results["corpus"]["classes"] == ["politics", "sports"] and results["corpus"]["world_generated"] is True
    assert results["stream"]["segments"] == 100 and results["stream"]["switches"] == 99
    assert results["config"]["pretrain_batches"] == 20 and len(results["pretrain_losses"]) == 1
    for model in ("learner", "baseline"):
        assert results["metrics"][model] == log_metrics(str(out / f"{model}.jsonl"))
        assert results["metrics"][model] == compute_metrics(read_loss_log(str(out / f"{model}.jsonl")))
    err = capsys.readouterr().err
    assert "CALM: corpus" in err and "CALM: pre-trained on 20 batches" in err and "CALM: wrote" in err


def test_run_calm_refuses_bad_settings_before_writing(tmp_path):
    with pytest.raises(ValueError, match="out_dir"):
        run_calm(out_dir=None)
    with pytest.raises(ValueError, match="rule"):
        run_calm(out_dir=str(tmp_path / "a"), learner=OnlineLearnerConfig(rule="lbfgs"))
    with pytest.raises(ValueError, match="baseline='pretrained'"):
        run_calm(out_dir=str(tmp_path / "a"), learner=OnlineLearnerConfig(rule="rms"),
                 baseline=CalmBaselineConfig(baseline="init"))
    with pytest.raises(ValueError, match="segment_lengths"):
        run_calm(out_dir=str(tmp_path / "a"), stream=CalmStreamConfig(segment_lengths="poisson"))
    assert not (tmp_path / "a").exists()


# -- `templm calm`, end to end ----------------------------------------------------------------------------------------


@pytest.mark.e2e
def test_templm_calm_end_to_end(tmp_path):
    out = tmp_path / "run"
    result = templm("calm", f"--gin_file={GIN}", f"--gin.OUT_DIR='{out}'", *TINY_RUN)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "| learner |" in result.stdout and "| baseline |" in result.stdout
    for name in ("results.json", "report.md", "loss.png", "learner.jsonl", "baseline.jsonl"):
        assert (out / name).stat().st_size > 0, name
    assert (out / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not [f for f in os.listdir(out) if f.endswith(".tmp")]
    assert result.stdout == (out / "report.md").read_text() + "\n"  # the verb prints the report it wrote

    results = json.loads((out / "results.json").read_text())
    assert results["corpus"]["classes"] == ["politics", "sports"]
    assert results["stream"]["segments"] == 100 and results["stream"]["batches"] == 100  # every segment one batch
    for model in ("learner", "baseline"):
        metrics = results["metrics"][model]
        for key in ("loss", "total_pp", "ppl@sw", "rec"):
            assert np.isfinite(metrics[key]), (model, key)
            for c in ("politics", "sports"):
                assert f"{key}_{c}" in metrics
        assert metrics["total_pp"] == pytest.approx(np.exp(metrics["loss"]))
        # The log: the original's field names, one line per batch, and metrics recomputable from it.
        lines = [json.loads(line) for line in (out / f"{model}.jsonl").read_text().splitlines()]
        assert len(lines) == results["stream"]["batches"]
        assert all(list(row) == ["loss", "domain", "domain_name", "sequence"] for row in lines)
        assert [row["sequence"] for row in lines] == list(range(100))
        assert compute_metrics(read_loss_log(str(out / f"{model}.jsonl"))) == metrics
    learner = [json.loads(x)["loss"] for x in (out / "learner.jsonl").read_text().splitlines()]
    baseline = [json.loads(x)["loss"] for x in (out / "baseline.jsonl").read_text().splitlines()]
    assert learner[0] == pytest.approx(baseline[0], rel=1e-5)  # same start, scored before the first step
    assert results["metrics"]["learner"]["loss"] < results["metrics"]["baseline"]["loss"]
    report = (out / "report.md").read_text()
    assert "| sports | learner |" in report and "ppl@sw" in report

    # Run again into its own folder: the run is made afresh and its output is the same (times aside: the report's
    # last line says how long it took).
    def timeless(contents):
        return {name: data.split(b"\nTime: ")[0] if name == "report.md" else data for name, data in contents.items()}

    first = folder_contents(out)
    again = templm("calm", f"--gin_file={GIN}", f"--gin.OUT_DIR='{out}'", *TINY_RUN)
    assert again.returncode == 0, again.stderr[-3000:]
    assert timeless(folder_contents(out)) == timeless(first) and again.stdout == (out / "report.md").read_text() + "\n"
    assert sorted(os.listdir(tmp_path)) == ["run"]  # no lock, partial folder or old copy beside it


@pytest.mark.e2e
def test_bad_input_is_a_message_and_a_non_zero_exit(tmp_path):
    missing = templm("calm", f"--gin_file={GIN}", f"--gin.OUT_DIR='{tmp_path / 'a'}'",
                     f"--gin.templm.CalmStreamConfig.corpus_dir='{tmp_path / 'no_such_corpus'}'")
    assert missing.returncode == 1
    assert f"{tmp_path / 'no_such_corpus'}: not a directory; expected a CALM corpus" in missing.stderr
    assert "Traceback" not in missing.stderr

    corpus = tmp_path / "corpus"
    build_calm_corpus_from_texts(write_texts(tmp_path / "texts", farm_and_market()), str(corpus), "char")
    os.remove(corpus / "vocab" / "market.vocab")
    no_vocab = templm("calm", f"--gin_file={GIN}", f"--gin.OUT_DIR='{tmp_path / 'b'}'",
                      f"--gin.templm.CalmStreamConfig.corpus_dir='{corpus}'")
    assert no_vocab.returncode == 1
    assert "market.vocab" in no_vocab.stderr and "class 'market'" in no_vocab.stderr
    assert "Traceback" not in no_vocab.stderr

    misspelt = templm("calm", f"--gin_file={GIN}", f"--gin.OUT_DIR='{tmp_path / 'c'}'",
                      "--gin.templm.CalmStreamConfig.widow_size=8")
    assert misspelt.returncode == 1 and "widow_size" in misspelt.stderr
    unclosed = templm("calm", f"--gin_file={GIN}", f"--gin.OUT_DIR='{tmp_path / 'c'}'",
                      "--gin.templm.CalmStreamConfig.domains=['sports'")
    assert unclosed.returncode == 1 and "templm calm: error: gin:" in unclosed.stderr
    assert "Traceback" not in unclosed.stderr
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists() and not (tmp_path / "c").exists()
