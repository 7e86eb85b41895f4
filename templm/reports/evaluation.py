"""The report of `templm eval`: one row per task with its overall EM/F1, the seen/future slices and perplexity."""

from __future__ import annotations

import re
from typing import Any, Dict, List, Mapping, Optional, Sequence

from templm import paths
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
    paths.makedirs(paths.dirname(paths.absolute(path)))
    return {"md": atomic_write(path, text)}


def subset_notes(results: Mapping[str, Mapping[str, float]], num_examples: Optional[int],
                 years: Sequence[int] = ()) -> List[str]:
    """What `templm eval --num_examples N` left out: it scores each task's first N examples, and a task's examples
    come in year order, so the later years may have none. One line per task whose `count_YYYY` keys miss some of
    `years` (the task data's) or whose future slice is empty; none without num_examples."""
    if not num_examples:
        return []
    notes = []
    for task, metrics in results.items():
        have = sorted(int(k[len("count_"):]) for k in metrics if re.fullmatch(r"count_\d+", k))
        if not have:
            continue
        missing = [y for y in years if y not in have]
        future_empty = "future_count" in metrics and not (metrics["future_count"] or 0) > 0
        if missing or future_empty:
            what = f"years {have[0]}-{have[-1]} only" if have[0] != have[-1] else f"year {have[0]} only"
            left = f", none of {', '.join(map(str, missing))}" if missing else ""
            empty = "; its future slice is empty (future_f1 has no value)" if future_empty else ""
            notes.append(f"{task}: --num_examples {num_examples} scored the split's first {num_examples} examples, "
                         f"which come in year order: {what}{left}{empty}. Leave --num_examples unset to score "
                         "every year")
    return notes
