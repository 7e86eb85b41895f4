"""`templm appendices` end to end on the tiny_test preset's world: Appendix B's shifted test periods and Appendix C's
training sets at increasing distance, each with its models, results.json, the findings, report.md and the figures;
bad flags answered before any work."""

import datetime
import json
import os

import numpy as np
import pytest

from templm.experiments.appendices import shift_years
from templm_testing import folder_contents, run_templm as templm

pytestmark = pytest.mark.e2e


def test_both_appendices_end_to_end(tmp_path):
    out = tmp_path / "app"
    result = templm("appendices", f"--out={out}", "--preset=tiny_test", "--shifts=0,1", "--gaps=0,6,12")
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads((out / "results.json").read_text())
    periods = data["periods"]
    assert [p["cutoff"] for p in periods] == ["2017-12-31", "2016-12-31"]
    assert [(p["months"][0], p["months"][-1]) for p in periods] == [("2018-04", "2019-03"), ("2017-04", "2018-03")]
    for p in periods:  # each period's own splits, models and stream
        stream = json.loads((out / "shifted" / f"shift_{p['shift_years']}" / "stream" / "results.json").read_text())
        ts = stream["runs"]["time_stratified"]["static"]["overall"]["word_ppl"]
        assert p["word_ppl"]["time_stratified"] == ts and "dynamic" not in stream["runs"]["time_stratified"]
        assert p["relative_increase"] == pytest.approx(ts / p["word_ppl"]["control"] - 1.0)
    distance = data["distance"]
    assert distance["gaps"] == [0, 6, 12] and distance["ends"] == {"0": "2017-12-31", "6": "2017-06-30",
                                                                    "12": "2016-12-31"}
    assert distance["size"] == 144  # 2015-01..2016-12, 6 documents a month: what the furthest set leaves
    for g in ("0", "6", "12"):
        assert len(distance["documents"][g]) == 24  # the one test stream: 12 months of 2 documents
        assert (out / "distance" / f"gap_{g}" / "checkpoints").is_dir()
    stream = json.loads((out / "distance" / "stream" / "results.json").read_text())
    words = np.asarray(stream["documents"]["words"], float)
    nll = np.asarray(stream["documents"]["word_nll"]["gap_6/static"], float)
    np.testing.assert_allclose(distance["documents"]["6"], nll / words)
    assert set(data["findings"]) == {"appendix_every_period_gap", "appendix_distance_growth"}
    every = data["findings"]["appendix_every_period_gap"]  # two periods, n the weakest one's test documents
    assert len(every["per_period"]) == 2 and every["n"] == 24 and set(every["parts"]) == {
        r["test"] for r in every["per_period"]}
    growth = data["findings"]["appendix_distance_growth"]  # over the three models, the documents' slope a detail
    assert growth["n"] == 3 and growth["documents"]["n"] == 24
    assert result.stdout == (out / "report.md").read_text() + "\n"
    assert "## Appendix B: shifted test periods (Figure 8)" in result.stdout
    for name in ("appendix_b.png", "appendix_c.png"):
        assert (out / "figures" / name).read_bytes()[:4] == b"\x89PNG"


def test_the_appendices_again_into_their_own_folder_give_the_same_output(tmp_path):
    """Run again into the folder of its finished run, the verb builds its periods afresh (data, models, streams) and
    writes the same results, report and figures (times aside), with nothing left beside the folder."""
    out = tmp_path / "app"
    seen = []
    for _ in range(2):
        result = templm("appendices", f"--out={out}", "--preset=tiny_test", "--which=shifted", "--shifts=0")
        assert result.returncode == 0, result.stderr[-3000:]
        seen.append((folder_contents(out), result.stdout))
    assert seen[0] == seen[1] and "results.json" in seen[0][0] and "report.md" in seen[0][0]
    assert sorted(os.listdir(tmp_path)) == ["app"]


def test_bad_flags_are_one_line_and_a_usage_exit(tmp_path):
    for flag, message in [("--which=shifted,future", "--which must be shifted, distance or both"),
                          ("--shifts=0,-1", "--shifts must be whole numbers of years"),
                          ("--gaps=six", "--gaps must be whole numbers of months"),
                          ("--preset=huge", "--preset")]:
        result = templm("appendices", f"--out={tmp_path / 'z'}", flag)
        assert result.returncode == 2 and message in result.stderr, (flag, result.stderr[-800:])
        assert "Traceback" not in result.stderr
    assert not (tmp_path / "z").exists()


def test_a_leap_day_moves_back_to_the_28th():
    assert shift_years(datetime.date(2016, 2, 29), 1) == datetime.date(2015, 2, 28)
    assert shift_years(datetime.date(2017, 12, 31), 2) == datetime.date(2015, 12, 31)
