"""Adaptation (templm/experiments/adaptation.py): the comparison it tabulates and the curve read from the trainer's
metrics log, against hand-computed values."""

import pytest

from templm.experiments.adaptation import curve_from_log, new_and_old_f1, summarize


def test_adaptation_summary_and_curve_by_hand(tmp_path):
    base = {"new_f1": 10.0, "old_f1": 40.0}
    runs = {"0.5": {"new_f1": 25.0, "old_f1": 36.0, "steps": 50}}
    s = summarize(base, runs, {"new_f1": 30.0, "old_f1": 41.0, "steps": 400}, base_steps=300)
    assert s["alphas"]["0.5"] == {"new_f1": 25.0, "old_f1": 36.0, "steps": 50, "total_steps": 350,
                                  "new_gain": 15.0, "old_kept": pytest.approx(0.9), "new_vs_retrained": -5.0}
    assert s["retrained"]["steps"] == 400 and s["base"]["steps"] == 300
    log = tmp_path / "metrics.jsonl"
    log.write_text('{"step": 5, "split": "train", "loss": 1.0}\n'
                   '{"step": 5, "split": "test/templama_temporal", "f1_2015": 20.0, "count_2015": 1.0, '
                   '"f1_2014": 50.0, "count_2014": 3.0}\n')
    assert curve_from_log(str(log), "templama_temporal", "test", 2015, [2014]) == [
        {"step": 5, "new_f1": 20.0, "old_f1": 50.0}]


def test_new_and_old_f1_pool_the_years_by_hand():
    metrics = {"f1_2014": 10.0, "count_2014": 1.0, "f1_2015": 40.0, "count_2015": 3.0, "f1": 99.0,
               "count_2016": 0.0}
    assert new_and_old_f1(metrics, 2015, [2014]) == {"new_f1": 40.0, "old_f1": 10.0}
