"""Markdown tables and numbers in them, shared by the report writers."""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence

# How a report words a finding's verdict (a finding's "holds": True, False, or None when the numbers are missing).
VERDICTS = {True: "appears", False: "does not appear", None: "cannot be judged"}


def fmt_number(x: Optional[Any], digits: int = 3, missing: str = "") -> str:
    """`x` with `digits` decimals; `missing` for None and NaN, "inf" / "-inf" for an infinity."""
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
