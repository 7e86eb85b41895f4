"""The CALM metrics on loss-log rows: a designed log whose every number is worked out by hand, the 100-segment
minimum, and the total_pp cut-off."""

import json
import math

import pytest

from templm.data.calm_log import read_loss_log
from templm.metrics.calm import compute_metrics


def _rows(segments, names):
    """segments: [(class name, [losses])], ids 0.. in order; class index = position in `names`. The rows of the log
    (loss, domain, domain_name, sequence)."""
    return [(float(loss), names.index(name), name, seq) for seq, (name, losses) in enumerate(segments)
            for loss in losses]


NAMES = ["A", "B", "C", "D"]


def _designed_segments():
    # Burn-in (ids 0..49): A/B alternate with loss 100 (D once); were they kept, every A and B segment after the
    # burn-in would be scored against a previous mean of 100, and the mean loss would be far above 10.
    burn = [("D", [100.0])] + [("A" if i % 2 else "B", [100.0]) for i in range(1, 50)]
    post = [
        ("A", [4.0, 4.0]),  # 50: first A after the burn-in: unscored; A's reference becomes 4
        ("B", [6.0]),  # 51: unscored; B's reference 6
        ("A", [5.0, 3.0, 2.0]),  # 52: rec 1 (3 < 4 at index 1); first-10 mean 10/3 (fewer than 10 losses)
        ("B", [7.0] * 10 + [1.0, 1.0]),  # 53: rec 10; first-10 mean 7 (the 1.0s are the 11th and 12th); B's ref 6
        ("C", [9.0]),  # 54: only C segment: unscored
    ]
    # 55..100: A at odd ids, B at even, each [3, 3]. The first of each is below its reference (rec 0), the rest
    # equal to it, never strictly below (rec 2 = the segment length).
    post += [("A" if i % 2 else "B", [3.0, 3.0]) for i in range(55, 101)]
    post += [("B", [50.0, 50.0, 50.0])]  # 101: the last segment, never scored
    return burn + post


def test_metrics_on_a_designed_log():
    m = compute_metrics(_rows(_designed_segments(), NAMES))
    loss = (8 + 6 + 10 + 72 + 9 + 46 * 6 + 150) / (2 + 1 + 3 + 12 + 1 + 46 * 2 + 3)
    assert m["loss"] == pytest.approx(loss)
    assert m["total_pp"] == pytest.approx(math.exp(loss))
    # Scored: A 52 (rec 1, I 10/3), A 55 (0, 3), 22 more A (2, 3); B 53 (10, 7), B 56 (0, 3), 22 more B (2, 3).
    assert m["rec_A"] == pytest.approx((1 + 0 + 22 * 2) / 24)
    assert m["rec_B"] == pytest.approx((10 + 0 + 22 * 2) / 24)
    assert m["rec"] == pytest.approx((1 + 10 + 2 * 22 * 2) / 48)
    assert m["ppl@sw_A"] == pytest.approx(math.exp((10 / 3 + 23 * 3) / 24))
    assert m["ppl@sw_B"] == pytest.approx(math.exp((7 + 23 * 3) / 24))
    assert m["ppl@sw"] == pytest.approx(math.exp((10 / 3 + 7 + 46 * 3) / 48))
    assert m["loss_A"] == pytest.approx((8 + 10 + 23 * 6) / (2 + 3 + 46))
    assert m["loss_B"] == pytest.approx((6 + 72 + 23 * 6 + 150) / (1 + 12 + 46 + 3))  # last segment included
    assert m["loss_C"] == 9.0 and m["total_pp_C"] == pytest.approx(math.exp(9))
    # C was never scored (one segment), D only appeared in the burn-in.
    assert set(m) == {"loss", "total_pp", "ppl@sw", "rec", "loss_A", "total_pp_A", "ppl@sw_A", "rec_A", "loss_B",
                      "total_pp_B", "ppl@sw_B", "rec_B", "loss_C", "total_pp_C"}
    assert all(isinstance(v, float) for v in m.values())


def test_metrics_need_100_segments():
    segments = _designed_segments()
    short = _rows(segments[:99], NAMES)  # ids 0..98
    exact = _rows(segments[:100], NAMES)  # ids 0..99
    assert compute_metrics(short) == {}
    assert compute_metrics(exact)["loss"] > 0
    assert compute_metrics([]) == {}  # an empty log


def test_total_pp_is_inf_from_loss_20():
    m = compute_metrics(_rows([("A" if i % 2 else "B", [25.0 if i % 2 else 1.0]) for i in range(100)], NAMES))
    assert m["loss"] == 13.0 and m["total_pp"] == pytest.approx(math.exp(13))
    assert m["total_pp_A"] == math.inf and m["total_pp_B"] == pytest.approx(math.e)
    assert m["ppl@sw_A"] == pytest.approx(math.exp(25))  # only total_pp has the cut-off
    at_20 = _rows([("A" if i % 2 else "B", [20.0]) for i in range(100)], NAMES)
    assert compute_metrics(at_20)["total_pp"] == math.inf
    below_20 = _rows([("A" if i % 2 else "B", [19.5]) for i in range(100)], NAMES)
    assert compute_metrics(below_20)["total_pp"] == pytest.approx(math.exp(19.5))



def test_metrics_of_a_log_file_are_those_of_its_rows(tmp_path):
    # The thin way to score a log file: read its rows, then compute.
    rows = _rows(_designed_segments(), NAMES)
    path = tmp_path / "log.jsonl"
    path.write_text("".join(json.dumps({"loss": loss, "domain": domain, "domain_name": name, "sequence": seq}) + "\n"
                            for loss, domain, name, seq in rows))
    assert read_loss_log(str(path)) == rows
    assert compute_metrics(read_loss_log(str(path))) == compute_metrics(rows)
