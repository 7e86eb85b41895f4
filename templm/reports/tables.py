"""Markdown tables and numbers in them, shared by the report writers."""

from __future__ import annotations

import math
from typing import Any, Mapping, Optional, Sequence


class Estimate(float):
    """A number known with an interval (the mean of several seeds' values and its 95 % interval): it computes as
    the mean, and the formatters below print it as "mean [low, high]"."""

    def __new__(cls, mean: float, low: Optional[float], high: Optional[float]):
        value = super().__new__(cls, mean)
        value.low, value.high = low, high
        return value

    @property
    def has_interval(self) -> bool:
        return self.low is not None and self.high is not None


def fmt_number(x: Optional[Any], digits: int = 3, missing: str = "") -> str:
    """`x` with `digits` decimals; `missing` for None and NaN, "inf" / "-inf" for an infinity; an Estimate with
    its interval, "12.30 [10.10, 14.50]"."""
    if isinstance(x, Estimate) and x.has_interval:
        return (f"{fmt_number(float(x), digits, missing)} [{fmt_number(x.low, digits, missing)}, "
                f"{fmt_number(x.high, digits, missing)}]")
    if x is None:
        return missing
    x = float(x)
    if math.isnan(x):
        return missing
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return f"{x:.{digits}f}"


def fmt_percent(x: Optional[Any], digits: int = 2, missing: str = "-") -> str:
    """A fraction as a signed percentage, 0.0123 -> "+1.23%"; `missing` for None, NaN and infinities."""
    if x is None or not math.isfinite(float(x)):
        return missing
    if isinstance(x, Estimate) and x.has_interval:
        return (f"{100 * float(x):+.{digits}f}% [{fmt_percent(x.low, digits, missing)}, "
                f"{fmt_percent(x.high, digits, missing)}]")
    return f"{100 * float(x):+.{digits}f}%"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]], align: Optional[str] = None) -> str:
    """A Markdown table (no trailing newline): `header` cells, then one line per row of cells (str() of each, a "|"
    inside a cell escaped).

    `align`: one letter per column, "l" (left, the default) or "r" (right, for numbers), e.g. "llr".
    """
    align = align or "l" * len(header)
    if len(align) != len(header) or set(align) - {"l", "r"}:
        raise ValueError(f"align must be one of l/r per column ({len(header)} columns), got {align!r}")
    lines = ["| " + " | ".join(header) + " |", "|" + "".join("---:|" if a == "r" else "---|" for a in align)]
    for row in rows:
        if len(row) != len(header):
            raise ValueError(f"a row of {len(row)} cells in a table of {len(header)} columns: {row!r}")
        lines.append("| " + " | ".join(str(cell).replace("|", "\\|") for cell in row) + " |")
    return "\n".join(lines)


def finding_line(finding: Mapping[str, Any]) -> str:
    """A finding as one Markdown list item: its claim, the verdict in bold, the test, and the evidence with the effect,
    its interval, p and n ("appears": the test supports the claim at its level; "opposite": it supports the reverse;
    "inconclusive": neither; "not applicable": the claim presumes what the data does not show), marked where the
    scores it compares are near the floor."""
    claim = str(finding.get("claim") or finding.get("name", ""))
    claim = claim[:1].upper() + claim[1:]
    test = f" ({finding['test']})" if finding.get("test") else ""
    evidence = str(finding.get("evidence") or "").rstrip(".")
    floor = " (on scores at the floor)" if finding.get("floor") else ""
    return f"- {claim}: **{finding.get('verdict', 'inconclusive')}**{floor}{test}. {evidence}."
