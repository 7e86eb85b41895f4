"""Tests of templm.reports.tables: Markdown tables and the numbers in them."""

import math

import numpy as np
import pytest

from templm.reports.tables import VERDICTS, fmt_number, fmt_percent, markdown_table


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
    assert [VERDICTS[h] for h in (True, False, None)] == ["appears", "does not appear", "cannot be judged"]
