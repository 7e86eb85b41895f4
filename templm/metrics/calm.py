"""The CALM metrics of a loss log: loss, total_pp, ppl@sw and rec, overall and per class, as pure numbers.

The rows are a log's (loss, domain, domain_name, sequence) lines in log order, as `templm.data.calm_log.read_loss_log`
reads them (one row per batch: its mean loss, class index, class name and segment id); scoring a log file is
``compute_metrics(read_loss_log(path))``.

`compute_metrics(rows)` follows the original implementation (germank/CALM ``metrics.py``) in every edge:

- A log whose last line has ``sequence < 99`` (fewer than 100 segments, ids counting from 0) gives ``{}``; so does an
  empty log.
- Burn-in: lines with ``sequence < 50`` are dropped BEFORE anything else, so a burn-in segment never serves as the
  "previous segment of the same class": the first segment of each class after the burn-in is unscored.
- ``loss`` is the mean over all remaining lines; ``total_pp = exp(loss)``, or ``inf`` when ``loss >= 20``.
- Segments are scored in log order. A segment is scored when an earlier remaining segment of its class exists; its
  reference is the mean loss of the most recent such segment. The last segment of the log (which may be cut short)
  is never scored; it still counts in ``loss`` and ``loss_<c>``.
- ``ppl@sw = exp(mean over scored segments of the mean of their first 10 losses)``: a segment with fewer than 10
  batches contributes the mean of all its losses. The mean pools all scored segments (not a mean of class means).
- ``rec`` = mean over scored segments of the number of batches before the first loss strictly below the reference
  (0 when the first batch is already below; the segment length when no loss is below).
- Per class, keyed by class name: ``loss_<c>`` (mean over the class's remaining lines, last segment included),
  ``total_pp_<c>`` (``inf`` when ``loss_<c> >= 20``; the original tested the overall loss here, a slip that is not
  repeated), ``ppl@sw_<c>`` and ``rec_<c>`` over the class's scored segments.
- A mean over nothing is not reported: a class without scored segments has no ``ppl@sw_<c>``/``rec_<c>`` key, and a
  log without any scored segment has no ``ppl@sw``/``rec`` (the original returned NaN there). ``ppl@sw`` is ``inf``
  only where exp overflows.
- Segment ids must not decrease from line to line, a segment keeps one class, and a class index keeps one name;
  anything else (and any malformed line) is a `DataError` naming the file and line (checked by `read_loss_log` as it
  reads the log, so the rows given here already hold).
"""

from __future__ import annotations

import collections
import math
from typing import Dict, List, Sequence, Tuple

import numpy as np

BURN_IN_SEGMENTS = 50  # segments with id below this are dropped from the metrics
MIN_SEGMENTS = 100  # a log needs a segment with id MIN_SEGMENTS - 1 to be scored
SWITCH_WINDOW = 10  # ppl@sw looks at the first this many batches of a segment
MAX_LOG_LOSS = 20.0  # total_pp is inf from this mean loss on


def _exp(x: float) -> float:
    try:
        return math.exp(x)
    except OverflowError:
        return float("inf")


def compute_metrics(rows: Sequence[Tuple[float, int, str, int]]) -> Dict[str, float]:
    """CALM metrics of a loss log's rows (loss, domain, domain_name, sequence): loss, total_pp, ppl@sw, rec and their
    per-class versions (`<metric>_<class>`).

    `{}` for a log with fewer than 100 segments. Every edge case (burn-in before the previous-segment lookup, the
    unscored last segment, ...) follows the original implementation; see the module docstring."""
    if not rows or rows[-1][3] < MIN_SEGMENTS - 1:
        return {}
    rows = [r for r in rows if r[3] >= BURN_IN_SEGMENTS]
    losses = np.asarray([r[0] for r in rows], dtype=np.float64)
    # Segments after the burn-in, in log order: (class name, losses).
    segments: List[Tuple[str, np.ndarray]] = []
    start = 0
    for i in range(1, len(rows) + 1):
        if i == len(rows) or rows[i][3] != rows[start][3]:
            segments.append((rows[start][2], losses[start:i]))
            start = i
    loss = float(losses.mean())
    results: Dict[str, float] = {"loss": loss, "total_pp": _exp(loss) if loss < MAX_LOG_LOSS else float("inf")}
    intensity: Dict[str, List[float]] = collections.defaultdict(list)
    duration: Dict[str, List[int]] = collections.defaultdict(list)
    previous: Dict[str, float] = {}
    for name, seg in segments[:-1]:  # the last segment may be cut short: never scored
        if name in previous:
            intensity[name].append(float(seg[:SWITCH_WINDOW].mean()))
            below = np.flatnonzero(seg < previous[name])
            duration[name].append(int(below[0]) if below.size else int(seg.size))
        previous[name] = float(seg.mean())
    all_intensity = [x for xs in intensity.values() for x in xs]
    all_duration = [x for xs in duration.values() for x in xs]
    if all_intensity:
        results["ppl@sw"] = _exp(float(np.mean(all_intensity)))
        results["rec"] = float(np.mean(all_duration))
    by_class: Dict[str, List[np.ndarray]] = collections.defaultdict(list)
    for name, seg in segments:
        by_class[name].append(seg)
    for name in sorted(by_class):
        class_loss = float(np.concatenate(by_class[name]).mean())
        results[f"loss_{name}"] = class_loss
        results[f"total_pp_{name}"] = _exp(class_loss) if class_loss < MAX_LOG_LOSS else float("inf")
    for name in sorted(intensity):
        results[f"ppl@sw_{name}"] = _exp(float(np.mean(intensity[name])))
        results[f"rec_{name}"] = float(np.mean(duration[name]))
    return results


