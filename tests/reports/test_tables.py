"""Tests of templm.reports.tables: Markdown tables and the numbers in them."""

import math

import numpy as np
import pytest

from templm.reports.tables import Estimate, finding_line, fmt_number, fmt_percent, markdown_table


def test_fmt_number():
    assert fmt_number(1.23456) == "1.235" and fmt_number(1.23456, 1) == "1.2" and fmt_number(2, 2) == "2.00"
    assert fmt_number(np.float32(0.5)) == "0.500"
    assert fmt_number(None) == "" and fmt_number(math.nan) == "" and fmt_number(None, missing="-") == "-"
    assert fmt_number(math.inf) == "inf" and fmt_number(-math.inf) == "-inf"


def test_markdown_table():
    table = markdown_table(["name", "K", "ppl"], [["prior", 1, "15.000"], ["exact", "", ""]], align="lrr")
    assert table.split("\n") == ["| name | K | ppl |", "|---|---:|---:|", "| prior | 1 | 15.000 |",
                                 "| exact |  |  |"]
    assert markdown_table(["a"], []) == "| a |\n|---|"
    with pytest.raises(ValueError, match="a row of 1 cells in a table of 2 columns"):
        markdown_table(["a", "b"], [["x"]])
    with pytest.raises(ValueError, match="align"):
        markdown_table(["a", "b"], [], align="lc")


def test_fmt_percent_escaped_cells_and_verdicts():
    assert fmt_percent(0.0123) == "+1.23%" and fmt_percent(-0.5, 1) == "-50.0%"
    assert fmt_percent(np.float64(0)) == "+0.00%"
    assert fmt_percent(None) == "-" and fmt_percent(math.nan) == "-" and fmt_percent(math.inf, missing="") == ""
    assert markdown_table(["word"], [["a|b"]]).split("\n")[-1] == "| a\\|b |"  # a "|" would end the cell


def test_estimates_print_with_their_interval_and_compute_as_their_mean():
    x = Estimate(12.3, 10.1, 14.5)
    assert fmt_number(x, 2) == "12.30 [10.10, 14.50]" and fmt_percent(Estimate(0.5, 0.25, 0.75), 1) == \
        "+50.0% [+25.0%, +75.0%]"
    assert x + 1 == pytest.approx(13.3) and float(x) == 12.3
    assert fmt_number(Estimate(2.0, None, None), 1) == "2.0"  # no interval (one seed): the number alone


def test_a_finding_line_has_the_claim_verdict_test_and_evidence():
    line = finding_line({"claim": "the gap grows", "verdict": "opposite", "test": "slope t-test",
                         "evidence": "slope -0.01 [-0.02, -0.00], p=0.01, n=24."})
    assert line == "- The gap grows: **opposite** (slope t-test). slope -0.01 [-0.02, -0.00], p=0.01, n=24."
    assert finding_line({"name": "gap"}) == "- Gap: **inconclusive**. ."
