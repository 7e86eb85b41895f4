"""The report of `templm eval`: one row per task with its overall EM/F1, the seen/future slices and perplexity."""

from __future__ import annotations

import os
from typing import Any, Dict, Mapping

from templm.io import atomic_write
from templm.reports.tables import fmt_number, markdown_table

COLUMNS = ("em", "f1", "seen_f1", "future_f1", "ppl", "count")


def metrics_table(results: Mapping[str, Mapping[str, float]]) -> str:
    """Markdown: one row per task (sorted), the COLUMNS it has (2 decimals), empty cells for the others."""
    rows = [[task] + [fmt_number(metrics.get(c), 2) for c in COLUMNS] for task, metrics in sorted(results.items())]
    return markdown_table(["task", *COLUMNS], rows)


def write_eval_report(result: Mapping[str, Any], path: str) -> Dict[str, str]:
    """Writes the Markdown report of an evaluate_checkpoint result to `path` (atomically)."""
    text = f"# Evaluation of step {result['step']} on {result['split']}\n\n" + metrics_table(result["metrics"]) + "\n"
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    return {"md": atomic_write(path, text)}
