"""Time-aware analyses as pure functions of numbers and queries (no model): what Dhingra et al. plot and tabulate.

- answer durations: how many years a query's answer set holds for its subject and relation, bucketed 1, 2, 3-4, 5+
  (the paper's Figure 2: averaging over years helps long-lived answers, hurts short-lived ones);
- F1 of yearly experts by the gap between the test year and the expert's year;
- pooled F1 and perplexity over a set of years, from the per-year metric keys of `templm.metrics.qa`;
- the change in log-likelihood of an answer as the input year moves into the future, by gap and answer group;
- the entropy of a model's distribution over a fixed candidate set (softmax of the candidates' scores).

The model-running glue lives in `templm.evaluation.future_probes` (scores and predictions) and
`templm.evaluation.task_eval` (SeqIO task evaluation); these functions only combine what they return, so each one
can be checked against numbers computed by hand.
"""

from __future__ import annotations

import collections
import math
import re
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import scipy.stats

from templm.metrics import qa

DURATION_BUCKETS = ("1", "2", "3-4", "5+")
SINGLE, MULTIPLE = "single", "multiple"
_YEAR_KEY = re.compile(r"^(f1|em|count|ppl|tokens)_(\d{4})$")


# --------------------------------------------------------------------------------------------------------------------
# Queries: who they ask about and how long their answers last.


def _query_fields(q: Any) -> Tuple[str, str, str, int, Tuple[str, ...]]:
    """(id, subject, relation, year, answer names) of a `records.Query` or a dict with the same fields."""
    if isinstance(q, Mapping):
        answers = q["answers"]
        subject = q.get("subject_id", q.get("subject"))
        return str(q["id"]), str(subject), str(q["relation"]), int(q["year"]), tuple(str(a) for a in answers)
    return q.id, q.subject_id, q.relation, int(q.year), tuple(q.answer_names)


def duration_bucket(years: int) -> str:
    """The Figure 2 bucket of an answer that holds for `years` years: "1", "2", "3-4" or "5+"."""
    if years < 1:
        raise ValueError(f"an answer holds for at least one year, got {years}")
    if years <= 2:
        return str(years)
    return "3-4" if years <= 4 else "5+"


def answer_durations(queries: Iterable[Any],
                     facts: Optional[Iterable[Tuple[str, str, str, Optional[int], Optional[int]]]] = None
                     ) -> Dict[str, int]:
    """For each query id, how many years the fact of its (first) answer lasts (Dhingra et al., Figure 2: a query is
    grouped by the duration of its answer's fact, "computed from the duration of their corresponding facts in
    Wikidata").

    With `facts`, (subject id, relation, answer name, first year, last year) rows (a year None where the source
    has no bound), the duration is that of the fact holding in the query's year: a fact held 2008-2011 lasts 4
    years even when the queries start in 2010. A query whose answer has no such fact, or whose fact lacks a bound,
    falls back to the queries themselves, one per subject, relation and year: the run of consecutive years, through
    the query's year, in which that answer holds; answers A 2010-13, {A, B} 2014, B 2015-16, A 2017 give the 2014
    query (first answer A) 5 years, 2010-2014, and the 2017 one 1 year; a year without the answer (or without a
    query) ends the run. `queries` are `records.Query` objects or dicts with id, subject_id (or subject), relation,
    year, answers.
    """
    spans: Dict[Tuple[str, str, str], List[Tuple[int, int]]] = collections.defaultdict(list)
    for subject, relation, answer, first_year, last_year in (facts or ()):
        if first_year is not None and last_year is not None:
            spans[(str(subject), str(relation), str(answer))].append((int(first_year), int(last_year)))
    rows = [_query_fields(q) for q in queries]
    holds: Dict[Tuple[str, str, str], set] = collections.defaultdict(set)
    for _, subject, relation, year, answers in rows:
        for answer in answers:
            holds[(subject, relation, answer)].add(year)
    out = {}
    for qid, subject, relation, year, answers in rows:
        if not answers:
            continue
        covering = [(a, b) for a, b in spans.get((subject, relation, answers[0]), ()) if a <= year <= b]
        if covering:
            out[qid] = max(b - a + 1 for a, b in covering)
            continue
        years = holds[(subject, relation, answers[0])]
        first, last = year, year
        while first - 1 in years:
            first -= 1
        while last + 1 in years:
            last += 1
        out[qid] = last - first + 1
    return out


def answer_groups(queries: Iterable[Any]) -> Dict[Tuple[str, str], str]:
    """(subject, relation) -> "single" when one answer holds over the whole span of its queries, else "multiple"."""
    answers_of: Dict[Tuple[str, str], set] = collections.defaultdict(set)
    for _, subject, relation, _, answers in (_query_fields(q) for q in queries):
        answers_of[(subject, relation)].update(answers)
    return {key: SINGLE if len(names) == 1 else MULTIPLE for key, names in answers_of.items()}


def qa_by_group(predictions: Mapping[str, str], answers: Mapping[str, Sequence[str]],
                groups: Mapping[str, str], order: Optional[Sequence[str]] = None) -> Dict[str, Dict[str, float]]:
    """Mean F1 and EM (x100) and the count of the examples of each group.

    `predictions`, `answers` and `groups` are keyed by example id; an id without a group is left out. Groups are
    reported in `order` when given (a listed group with no example gets only its count, 0), else sorted.
    """
    members: Dict[str, List[str]] = collections.defaultdict(list)
    for qid in predictions:
        if qid in groups:
            members[groups[qid]].append(qid)
    names = list(order) if order is not None else sorted(members)
    out: Dict[str, Dict[str, float]] = {}
    for name in names:
        ids = members.get(name, [])
        row = {"count": float(len(ids))}
        if ids:
            row["f1"] = 100.0 * math.fsum(qa.token_f1(predictions[i], answers[i]) for i in ids) / len(ids)
            row["em"] = 100.0 * math.fsum(qa.exact_match(predictions[i], answers[i]) for i in ids) / len(ids)
        out[name] = row
    return out


def f1_by_duration(predictions: Mapping[str, str], answers: Mapping[str, Sequence[str]],
                   durations: Mapping[str, int]) -> Dict[str, Dict[str, float]]:
    """F1/EM/count per answer-duration bucket (1, 2, 3-4, 5+) of the examples in `predictions` (keyed by id)."""
    buckets = {qid: duration_bucket(d) for qid, d in durations.items()}
    return qa_by_group(predictions, answers, buckets, DURATION_BUCKETS)


# --------------------------------------------------------------------------------------------------------------------
# Metrics pooled over years.


def per_year(metrics: Mapping[str, float], name: str) -> Dict[int, float]:
    """{year: value} of the per-year keys `name_YYYY` (name: f1, em, count, ppl or tokens) in a metrics dict."""
    out = {}
    for key, value in metrics.items():
        m = _YEAR_KEY.match(key)
        if m and m.group(1) == name:
            out[int(m.group(2))] = float(value)
    return dict(sorted(out.items()))


def pooled_qa(metrics: Mapping[str, float], years: Iterable[int], name: str = "f1") -> Optional[float]:
    """The example-weighted mean of `name_Y` (f1 or em) over `years` from the `count_Y` keys; None without examples."""
    values, counts = per_year(metrics, name), per_year(metrics, "count")
    total = weighted = 0.0
    for year in years:
        n = counts.get(int(year), 0.0)
        if n > 0:
            total += n
            weighted += n * values[int(year)]
    return weighted / total if total > 0 else None


def pooled_perplexity(metrics: Mapping[str, float], years: Iterable[int]) -> Optional[float]:
    """Token-level perplexity over `years` from `ppl_Y` and `tokens_Y`: exp(sum_Y tokens_Y log ppl_Y / sum tokens)."""
    ppl, tokens = per_year(metrics, "ppl"), per_year(metrics, "tokens")
    total = nll = 0.0
    for year in years:
        n = tokens.get(int(year), 0.0)
        if n > 0 and int(year) in ppl:
            total += n
            nll += n * math.log(ppl[int(year)])
    return math.exp(nll / total) if total > 0 else None


# --------------------------------------------------------------------------------------------------------------------
# Yearly experts by year gap.


def f1_by_year_gap(expert_metrics: Mapping[int, Mapping[str, float]]) -> Dict[int, Dict[str, float]]:
    """{gap: {"f1", "count"}} where gap = test year - expert year, pooled over experts weighted by example count.

    `expert_metrics` maps each expert's year to its QA metrics on a test set covering several years (the per-year
    keys f1_Y and count_Y). Gaps are negative for years before the expert's, positive after.
    """
    weighted: Dict[int, float] = collections.defaultdict(float)
    counts: Dict[int, float] = collections.defaultdict(float)
    for expert_year, metrics in expert_metrics.items():
        f1, count = per_year(metrics, "f1"), per_year(metrics, "count")
        for year, n in count.items():
            if n > 0:
                gap = year - int(expert_year)
                weighted[gap] += n * f1[year]
                counts[gap] += n
    return {gap: {"f1": weighted[gap] / counts[gap], "count": counts[gap]} for gap in sorted(counts)}


def falloff(by_gap: Mapping[int, Mapping[str, float]]) -> Dict[str, Optional[float]]:
    """How F1 changes with |gap|: F1 at gap 0, the count-weighted F1 at every other gap, and the least-squares slope
    of F1 against |gap| (weighted by count; F1 points per year of distance, negative when F1 falls off)."""
    at_zero = by_gap.get(0, {}).get("f1")
    others = [(abs(int(g)), row["f1"], row["count"]) for g, row in by_gap.items() if int(g) != 0 and row["count"]]
    off = (math.fsum(f * n for _, f, n in others) / math.fsum(n for _, _, n in others)) if others else None
    points = [(abs(int(g)), row["f1"], row["count"]) for g, row in by_gap.items() if row["count"]]
    slope = None
    if len({x for x, _, _ in points}) >= 2:
        w = np.array([n for _, _, n in points], np.float64)
        x = np.array([x for x, _, _ in points], np.float64)
        y = np.array([f for _, f, _ in points], np.float64)
        xm, ym = np.average(x, weights=w), np.average(y, weights=w)
        slope = float(np.sum(w * (x - xm) * (y - ym)) / np.sum(w * (x - xm) ** 2))
    return {"f1_gap0": at_zero, "f1_other_gaps": off, "slope_per_year": slope}


# --------------------------------------------------------------------------------------------------------------------
# Degradation into the future: log-likelihood change of a once-correct answer.


def loglik_change(base: Sequence[float], shifted: Sequence[Sequence[float]]) -> np.ndarray:
    """[N, G] changes in log-likelihood: shifted[n, g] - base[n] (nats; negative = the answer became less likely).

    `base[n]` is the log-likelihood of example n's answer at the reference year, `shifted[n, g]` the same answer's
    log-likelihood with the input year moved by the g-th gap.
    """
    base = np.asarray(base, np.float64).reshape(-1)
    shifted = np.asarray(shifted, np.float64)
    if shifted.ndim != 2 or shifted.shape[0] != base.shape[0]:
        raise ValueError(f"shifted scores must be [N, gaps] with N = {base.shape[0]}, got shape {shifted.shape}")
    return shifted - base[:, None]


def mean_change_by_gap(deltas: np.ndarray, groups: Sequence[str], gaps: Sequence[int],
                       order: Sequence[str] = (SINGLE, MULTIPLE)) -> Dict[str, Dict[str, Any]]:
    """{group: {"count": n, "mean": {gap: mean delta}, "interval": {gap: [low, high]}}} over the rows of `deltas`
    ([N, G]) in each group; the interval is the 95 % t-interval of the mean (only with two rows or more).

    A group without rows has count 0 and an empty "mean".
    """
    deltas = np.asarray(deltas, np.float64)
    if deltas.ndim != 2 or deltas.shape != (len(groups), len(gaps)):
        raise ValueError(f"deltas must have shape ({len(groups)}, {len(gaps)}), got {deltas.shape}")
    groups = np.asarray(list(groups), dtype=object)
    out = {}
    for name in order:
        rows = deltas[groups == name]
        out[name] = {"count": int(rows.shape[0]),
                     "mean": {int(g): float(v) for g, v in zip(gaps, rows.mean(axis=0))} if rows.shape[0] else {}}
        if rows.shape[0] > 1:
            half = scipy.stats.t.ppf(0.975, rows.shape[0] - 1) * rows.std(axis=0, ddof=1) / math.sqrt(rows.shape[0])
            out[name]["interval"] = {int(g): [float(m - h), float(m + h)]
                                     for g, m, h in zip(gaps, rows.mean(axis=0), half)}
    return out


# --------------------------------------------------------------------------------------------------------------------
# Calibration into the future: entropy over a fixed candidate set.


def candidate_distribution(scores: Sequence[float]) -> np.ndarray:
    """Softmax over one query's candidate log-likelihoods (a distribution restricted to the candidate set)."""
    s = np.asarray(scores, np.float64).reshape(-1)
    if s.size == 0:
        raise ValueError("no candidates to form a distribution over")
    e = np.exp(s - s.max())
    return e / e.sum()


def entropy(scores: Sequence[float], normalize: bool = False) -> float:
    """Entropy (nats) of `candidate_distribution(scores)`; with `normalize`, divided by log(K) so 1 is uniform."""
    p = candidate_distribution(scores)
    h = float(-np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0)))
    if normalize:
        return h / math.log(p.size) if p.size > 1 else 0.0
    return h


def mean_by_class_and_year(values: Sequence[float], classes: Sequence[str], years: Sequence[int],
                           order: Sequence[str] = ("frequent", "rare", "never")) -> Dict[str, Dict[int, float]]:
    """{class: {year: mean value}} (classes in `order`, then any others sorted); used for entropies."""
    sums: Dict[Tuple[str, int], List[float]] = collections.defaultdict(list)
    for v, c, y in zip(values, classes, years):
        sums[(c, int(y))].append(float(v))
    present = {c for c, _ in sums}
    names = [c for c in order if c in present] + sorted(present - set(order))
    return {c: {y: math.fsum(v) / len(v) for (cc, y), v in sorted(sums.items()) if cc == c} for c in names}
