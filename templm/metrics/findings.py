"""The findings the time-aware T5 reproduction expects (Dhingra et al.), each judged from the numbers of a results
dict: True (it appears in these numbers), False (it does not) or None (they cannot judge it), with the evidence.
The report (templm.reports.reproduction) words the verdicts."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from templm.io import jsonable, lookup

CHANGE_CLASSES = ("frequent", "rare", "never")
OLD_F1_KEPT = 0.8  # "keeps most of its old-year F1": at least this share of the un-adapted model's


def _num(value: Optional[float], digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _finding_temporal_beats_uniform(results) -> Tuple[Optional[bool], str]:
    t = lookup(results, "regimes", "temporal", "templama", "seen_f1")
    u = lookup(results, "regimes", "uniform", "templama", "seen_f1")
    if t is None or u is None:
        return None, "no seen-year TempLAMA F1 for both Temporal and Uniform"
    return t > u, f"seen-year TempLAMA F1: Temporal {t:.2f}, Uniform {u:.2f}"


def _finding_yearly_falloff(results) -> Tuple[Optional[bool], str]:
    f = lookup(results, "yearly", "falloff", default={}) or {}
    zero, other, slope = f.get("f1_gap0"), f.get("f1_other_gaps"), f.get("slope_per_year")
    if zero is None or other is None or slope is None:
        return None, "fewer than two year gaps measured"
    return zero > other and slope < 0, (f"F1 at gap 0 {zero:.2f}, at other gaps {other:.2f}; slope "
                                        f"{slope:+.2f} F1 per year of distance")


def _mean_delta(group: Mapping[str, Any]) -> Optional[float]:
    means = list((group or {}).get("mean", {}).values())
    return sum(means) / len(means) if means else None


def _finding_multi_answer_falls_faster(results) -> Tuple[Optional[bool], str]:
    groups = lookup(results, "degradation", "temporal", "groups", default={}) or {}
    single, multiple = _mean_delta(groups.get("single")), _mean_delta(groups.get("multiple"))
    ns, nm = lookup(groups, "single", "count", default=0), lookup(groups, "multiple", "count", default=0)
    if single is None or multiple is None:
        return None, (f"Temporal model answered {ns} single-answer and {nm} multi-answer queries correctly at the "
                      "last seen year: both groups are needed")
    return multiple < single, (f"Temporal model, mean change over the gaps: multi-answer {multiple:+.3f} nats "
                               f"(n={nm}), single-answer {single:+.3f} nats (n={ns})")


def _class_means(results, regime: str, key: str = "normalized_entropy") -> Dict[str, float]:
    table = lookup(results, "calibration", regime, key, default={}) or {}
    return {c: sum(v.values()) / len(v) for c, v in table.items() if v}


def _finding_entropy_order(results) -> Tuple[Optional[bool], str]:
    means = _class_means(results, "temporal")
    if not all(c in means for c in CHANGE_CLASSES):
        return None, "the Temporal model's calibration entropies lack a change class"
    f, r, n = (means[c] for c in CHANGE_CLASSES)
    return f > r > n, (f"Temporal model, normalized entropy over future years: frequent {f:.3f}, rare {r:.3f}, "
                       f"never {n:.3f}")


def _finding_adaptation(results) -> Tuple[Optional[bool], str]:
    summary = lookup(results, "adaptation", "summary", default={}) or {}
    base, alphas = summary.get("base"), summary.get("alphas") or {}
    if not base or not alphas or base.get("new_f1") is None:
        return None, "no adaptation runs"
    good, parts = [], []
    for alpha, row in sorted(alphas.items(), key=lambda kv: float(kv[0])):
        gain = row.get("new_gain")
        kept = row.get("old_kept")
        kept_ok = (kept >= OLD_F1_KEPT) if kept is not None else (row.get("old_f1") or 0) >= (base.get("old_f1") or 0)
        if gain is not None and gain > 0 and kept_ok:
            good.append(alpha)
        parts.append(f"alpha {alpha}: new-year {_num(gain, 2) if gain is None else f'{gain:+.2f}'} F1, old years "
                     f"{'n/a' if kept is None else f'{100 * kept:.0f}%'} kept")
    return bool(good), (f"base new-year F1 {_num(base['new_f1'])}, old-years F1 {_num(base.get('old_f1'))}; "
                        + "; ".join(parts) + (f" (holds for alpha {', '.join(good)})" if good else ""))


FINDINGS: Tuple[Tuple[str, str, Callable], ...] = (
    ("temporal_beats_uniform", "Temporal beats Uniform on seen-year TempLAMA F1", _finding_temporal_beats_uniform),
    ("yearly_falloff", "Yearly experts fall off with the year gap", _finding_yearly_falloff),
    ("multi_answer_falls_faster", "The log-likelihood of multi-answer facts falls faster into the future than that "
     "of single-answer facts", _finding_multi_answer_falls_faster),
    ("entropy_order", "Entropy over candidates orders frequent > rare > never changing relations",
     _finding_entropy_order),
    ("adaptation", f"Alpha-mixture adaptation gains on the new year while keeping most (>= {OLD_F1_KEPT:.0%}) of "
     "the old-years F1", _finding_adaptation),
)


def findings(results: Mapping[str, Any]) -> List[Dict[str, Any]]:
    """[{name, statement, holds, evidence}] for each expected finding, judged from `results`."""
    results = jsonable(results)
    out = []
    for name, statement, judge in FINDINGS:
        holds, evidence = judge(results)
        out.append({"name": name, "statement": statement, "holds": holds, "evidence": evidence})
    return out
