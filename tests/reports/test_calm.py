"""The CALM report: report.md from a results dict, loss.png from the run's loss logs, both written atomically."""

import math
import os

import numpy as np
import pytest

from templm.data.calm_log import LossLogger, read_loss_log
from templm.errors import DataError
from templm.metrics.calm import compute_metrics
from templm.reports.calm import format_report, read_model_losses, write_calm_report

CLASSES = ["news", "sport"]


def _write_logs(out_dir, segments=104):
    """learner.jsonl / baseline.jsonl of a run of `segments` two-batch segments alternating between the classes; the
    learner's loss falls within each segment, the baseline's stays at 2."""
    with LossLogger(os.path.join(out_dir, "learner.jsonl")) as learner, \
            LossLogger(os.path.join(out_dir, "baseline.jsonl")) as baseline:
        for seq in range(segments):
            item = {"domain": seq % 2, "domain_name": CLASSES[seq % 2], "sequence": seq}
            for batch in range(2):
                learner.log(item, 1.5 - 0.5 * batch)
                baseline.log(item, 2.0)


def _results(out_dir, metrics, wraps=None):
    return {
        "config": {"model_level": "word", "batch_size": 4, "window_size": 32, "switch_frequency": 256,
                   "nswitches": 52, "seed": 3, "rule": "adam", "lr": 0.001, "which": "all", "baseline": "pretrained",
                   "pretrain_lr": 0.003, "pretrain_batches": 20, "pretrain_passes": 2,
                   "model": {"n_layer": 2, "d_model": 64, "n_head": 2, "mem_len": 32}},
        "corpus": {"dir": os.path.join(out_dir, "corpus"), "classes": CLASSES, "vocab_size": 321},
        "stream": {"batches": 208, "segments": 104, "mean_segment_length": 2.0, "burn_in_batches": 100,
                   "wraps": wraps or {c: 0 for c in CLASSES}},
        "parameters": 104780,
        "metrics": metrics,
        "timing": {"pretrain_s": 1.25, "stream_s": 2.5, "batches_per_s": 83.2, "total_s": 4.0},
    }


def test_write_calm_report_writes_the_tables_and_the_figure(tmp_path):
    out = str(tmp_path)
    _write_logs(out)
    metrics = {name: compute_metrics(read_loss_log(os.path.join(out, f"{name}.jsonl")))
               for name in ("learner", "baseline")}
    paths = write_calm_report(_results(out, metrics), out)
    assert paths == {"report.md": os.path.join(out, "report.md"), "loss.png": os.path.join(out, "loss.png")}
    assert open(paths["loss.png"], "rb").read()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not [f for f in os.listdir(out) if f.endswith(".tmp")]
    report = open(paths["report.md"], encoding="utf-8").read()
    # Learner: every segment [1.5, 1.0], loss 1.25; the first loss of a segment is below the previous mean (1.25)
    # nowhere, the second everywhere: rec 1. Baseline: loss 2 everywhere, never strictly below: rec = length 2.
    lines = report.splitlines()
    i = lines.index("| model | loss | total_pp | ppl@sw | rec |")
    assert lines[i + 1:i + 4] == ["|---|---:|---:|---:|---:|",
                                  f"| learner | 1.250 | {math.exp(1.25):.3f} | {math.exp(1.25):.3f} | 1.000 |",
                                  f"| baseline | 2.000 | {math.exp(2):.3f} | {math.exp(2):.3f} | 2.000 |"]
    i = lines.index("| class | model | loss | total_pp | ppl@sw | rec |")
    assert lines[i + 1] == "|---|---|---:|---:|---:|---:|"
    assert lines[i + 2].startswith("| news | learner | 1.250 |") and lines[i + 5].startswith("| sport | baseline |")
    assert "Stream: 208 batches of 4 x 32 tokens in 104 segments" in report and "104,780 parameters" in report
    assert "first 20 batches of the stream (2 pass(es))" in report
    assert lines[-1] == "Time: pre-training 1.2s, stream 2.5s (83.2 batches/s, both models), total 4.0s."
    assert "Note:" not in report


def test_report_marks_missing_and_infinite_numbers_and_wraps(tmp_path):
    out = str(tmp_path)
    metrics = {"learner": {"loss": 21.0, "total_pp": math.inf, "loss_news": 21.0, "total_pp_news": math.inf},
               "baseline": {"loss": 2.0, "total_pp": None, "rec": 0.5}}
    report = format_report(_results(out, metrics, wraps={"news": 2, "sport": 0}))
    assert "| learner | 21.000 | inf | - | - |" in report  # no ppl@sw / rec: nothing was scored
    assert "| baseline | 2.000 | - | - | 0.500 |" in report  # null in a results.json read back
    assert "| sport | learner | - | - | - | - |" in report
    assert "ran out of text and started again (news 2x)" in report


def test_report_of_a_short_stream_says_there_are_no_metrics(tmp_path):
    report = format_report(_results(str(tmp_path), {"learner": {}, "baseline": {}}))
    assert report.endswith("The log has fewer than 100 segments: CALM reports no metrics.\n")
    assert "| model |" not in report


def test_the_figure_reads_both_logs_which_must_match(tmp_path):
    out = str(tmp_path)
    _write_logs(out, segments=3)
    losses = read_model_losses(os.path.join(out, "learner.jsonl"), os.path.join(out, "baseline.jsonl"))
    np.testing.assert_array_equal(losses["learner"], [1.5, 1.0] * 3)
    np.testing.assert_array_equal(losses["baseline"], [2.0] * 6)
    assert losses["domain"].tolist() == [0, 0, 1, 1, 0, 0] and losses["sequence"].tolist() == [0, 0, 1, 1, 2, 2]
    with open(os.path.join(out, "baseline.jsonl"), "a", encoding="utf-8") as f:
        f.write('{"loss": 2.0, "domain": 1, "domain_name": "sport", "sequence": 3}\n')
    with pytest.raises(DataError, match="7 batches") as e:
        read_model_losses(os.path.join(out, "learner.jsonl"), os.path.join(out, "baseline.jsonl"))
    assert e.value.path.endswith("baseline.jsonl")
    other = tmp_path / "other"
    other.mkdir()
    _write_logs(str(other), segments=3)
    lines = (other / "baseline.jsonl").read_text().splitlines()
    lines[4] = lines[5] = '{"loss": 2.0, "domain": 1, "domain_name": "sport", "sequence": 2}'  # another class
    (other / "baseline.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match="expected the logs of one run") as e:
        read_model_losses(str(other / "learner.jsonl"), str(other / "baseline.jsonl"))
    assert e.value.line == 5
