"""The study's expected findings, both halves in one registry (`REGISTRY`), each a statistical test on the per-item
numbers of one run's results (templm.metrics.statistics), and their combination over several seeds.

`judge(results, half)` gives {name: finding} for one half of the study; a finding is a dict: "claim", "half", and the
test result: "test", "effect", "interval" ([low, high], 95 %), "p_value", "n", "verdict" ("appears": the test
supports the claim at the level alpha; "opposite": it supports the reverse; "inconclusive": neither; "not
applicable": the claim presumes what the data does not show), plus "evidence" (one line with the numbers),
test-specific details and "floor" where the scores it compares are near the floor (`at_floor`: the models barely
learnt; its verdict then compares noise). Over several seeds (`combine_findings`, the same shape),
"per_seed" holds each seed's result and the verdict comes from a test on the per-seed effects.

The time-aware half (Dhingra et al.), on the T5 study's results:

    temporal_beats_uniform     paired bootstrap / sign-flip test over the same seen-year test queries of the
                               per-query F1, Temporal minus Uniform (claim: > 0)
    temporal_beats_uniform_future  the same over the future-year test queries (claim: > 0)
    temporal_beats_yearly      the same, Temporal minus the routed Yearly experts, seen years (claim: > 0)
    yearly_beats_uniform       the same, the routed Yearly experts minus Uniform, seen years (claim: > 0)
    temporal_beats_uniform_customnews  the same over the seen-year CustomNews masked spans (claim: > 0)
    perplexity_order           Table 7: paired tests over the CustomNews test spans of the target log-likelihood for
                               each pair of Temporal < Uniform < Yearly (seen and future years; Uniform < Yearly on
                               future years), intersection-union (claim: > 0)
    yearly_beats_temporal_customnews  the same, the Yearly experts minus Temporal, seen-year CustomNews (claim: > 0)
    temporal_beats_uniform_customnews_future  the same over the future-year CustomNews spans, Temporal minus Uniform
                               (claim: > 0)
    temporal_beats_yearly_customnews_future  the same, Temporal minus the Yearly experts (the last seen year's expert
                               on every future year), future-year CustomNews (claim: > 0)
    duration_tradeoff          the crossing: paired tests over the seen-year queries, Uniform minus Yearly > 0 on
                               answers lasting >= 5 years and < 0 on shorter ones (intersection-union)
    yearly_falloff             least-squares slope of a yearly expert's per-query F1 against |test year - expert
                               year|, with a cluster bootstrap over queries (claim: < 0); the past and future sides
                               (the paper's asymmetry) as details
    multi_answer_falls_faster  Welch's t-test of the per-query log-likelihood change into the future (mean over the
                               gaps), multi-answer minus single-answer queries (claim: < 0)
    entropy_order              Spearman rank correlation of each query's normalized entropy over the candidates
                               (its mean over the future years: one value per query) with the relation's rate of
                               change (never < rare < frequent) (claim: > 0); each class's mean with its interval
                               and its slope over the future years as details
    adaptation                 for every alpha up to 0.6 (the paper's claim), paired tests over the same test
                               queries: the future years' F1 gain (combined, as the paper measures) of the adapted
                               Temporal model over the un-adapted one (> 0) and old-years F1 above OLD_F1_KEPT of the
                               un-adapted model's (adapted - 0.8 x base > 0); it appears only when every alpha passes
                               both (an intersection-union test: its p-value is the largest)
    temporal_forgets_less      for every alpha, a paired test over the old-year test queries of the F1 each model
                               lost by fine-tuning, Temporal minus Uniform (claim < 0; intersection-union over the
                               alphas); CustomNews as a detail

The streaming half (Lazaridou et al.), on one stream run's results (templm.metrics.stream.judge_*):

    streaming_gap              paired test over the test documents of the log word perplexity, TIME-STRATIFIED minus
                               CONTROL (claim > 0)
    streaming_growth           the t-test on the least-squares slope of the monthly relative increase (claim > 0)
    streaming_dynamic          paired test over the test documents, dynamic evaluation minus static (claim < 0); whether
                               the monthly gap narrows, paired over months, as a detail
    streaming_dynamic_slope    the t-test on the least-squares slope of the monthly difference of the relative
                               increases, dynamic minus static: the slopes' difference (claim < 0); "not
                               applicable" unless streaming_growth appears (the claim presumes an upward slope)
    streaming_size_slope       the t-test on the least-squares slope of the monthly relative increase of a larger
                               TIME-STRATIFIED model minus SLOPE_KEPT x the smaller's (claim > 0: size does not
                               flatten the slope; non-inferiority); "not applicable" unless streaming_growth appears
                               (a margin on a slope that does not rise is no claim about size)

Not part of the study, the effects Logan, Gardner and Singh measure, on one `templm is-eval` run of a latent LM
(templm.metrics.importance_sampling.judge_*; `STUDY` is the study's findings alone): each a paired test over the
evaluated documents of their estimated log-likelihoods.

    is_tightens_with_k         the trained proposal, document level, the largest K minus the smallest (claim > 0)
    is_token_level_optimistic  token-level aggregation minus document level, the largest K (claim > 0)
    is_flatter_proposal_tighter  the proposal at the largest temperature minus the trained one (claim > 0)
    is_gold_proposal_tighter   the proposal that sees the gold annotations minus the text-only one (claim > 0)

And Mind the Gap's appendices on one `templm appendices` run (templm.metrics.stream.judge_every_period_gap,
judge_distance_growth):

    appendix_every_period_gap  each shifted test period's streaming_gap test, intersection-union (claim > 0)
    appendix_distance_growth   the slope of the per-document log word perplexity on the months between the end of
                               the training set and the cut-off, cluster bootstrap over documents (claim > 0)
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from templm.io import jsonable, lookup
from templm.metrics import importance_sampling, statistics, stream

CHANGE_CLASSES = ("frequent", "rare", "never")
OLD_F1_KEPT = 0.8  # "keeps most of its old-year F1": at least this share of the un-adapted model's
ADAPTED_UP_TO = 0.6  # Dhingra et al., section 5: "minimal degradation on the 2010-18 slice up to alpha=0.6"
SHORT_DURATION = 5  # Dhingra et al., Figure 2: Uniform "does worse on queries whose answers persist for less than 5"
MATCH_ALPHA = 0.5  # the paper's alpha whose short fine-tune "matches" the retrained model
RETRAINED_F1_MATCHED = 0.9  # "matches": at least this share of the retrained model's F1 (a non-inferiority margin)


def _fmt(x: Optional[float], digits: int = 2, sign: bool = True) -> str:
    if x is None:
        return "n/a"
    return f"{x:+.{digits}f}" if sign else f"{x:.{digits}f}"


# --------------------------------------------------------------------------------------------------------------------
# One seed.


def _paired_regimes(results, better: str, worse: str, slice_: str, alpha, dataset: str = "templama"
                    ) -> Dict[str, Any]:
    """Paired bootstrap / sign-flip test over the same test examples of one slice ("seen" or "future" years) of the
    per-example F1, `better` minus `worse` (claim > 0): TempLAMA's queries, or CustomNews's masked spans."""
    name = "paired bootstrap of the per-query F1 difference"
    pq = results.get("per_query") or {}
    if dataset == "customnews":
        pq = pq.get("customnews") or {}
    label = {"templama": "TempLAMA F1", "customnews": "CustomNews span F1"}[dataset]
    f1 = pq.get("f1") or {}
    if better not in f1 or worse not in f1:
        return statistics.untested(name, f"no per-query F1 of both {better.title()} and {worse.title()}")
    years = set(lookup(results, "world", f"{slice_}_years", default=[]) or [])
    keep = np.array([y in years for y in pq["year"]], bool)
    x, y = np.asarray(f1[better], float)[keep], np.asarray(f1[worse], float)[keep]
    if len(x) < 2:
        return statistics.untested(name, f"fewer than two {slice_}-year test examples")
    out = statistics.paired_difference(x, y, direction=+1, alpha=alpha)
    out["evidence"] = (f"{slice_}-year {label} {better.title()} {x.mean():.2f} vs {worse.title()} "
                       f"{y.mean():.2f}: difference {statistics.describe(out, 'F1')}")
    return out


def _temporal_beats_uniform(results, alpha) -> Dict[str, Any]:
    return _paired_regimes(results, "temporal", "uniform", "seen", alpha)


def _temporal_beats_uniform_future(results, alpha) -> Dict[str, Any]:
    return _paired_regimes(results, "temporal", "uniform", "future", alpha)


def _temporal_beats_yearly(results, alpha) -> Dict[str, Any]:
    return _paired_regimes(results, "temporal", "yearly", "seen", alpha)


def _yearly_beats_temporal_customnews(results, alpha) -> Dict[str, Any]:
    return _paired_regimes(results, "yearly", "temporal", "seen", alpha, dataset="customnews")


def _temporal_beats_uniform_customnews_future(results, alpha) -> Dict[str, Any]:
    return _paired_regimes(results, "temporal", "uniform", "future", alpha, dataset="customnews")


def _temporal_beats_yearly_customnews_future(results, alpha) -> Dict[str, Any]:
    return _paired_regimes(results, "temporal", "yearly", "future", alpha, dataset="customnews")


def _yearly_beats_uniform(results, alpha) -> Dict[str, Any]:
    return _paired_regimes(results, "yearly", "uniform", "seen", alpha)


def _temporal_beats_uniform_customnews(results, alpha) -> Dict[str, Any]:
    return _paired_regimes(results, "temporal", "uniform", "seen", alpha, dataset="customnews")


# Table 7's ordering, each pair (lower perplexity, higher) on a slice: "The Temporal model has lowest perplexities on
# both the seen and unseen slices of evaluation data. The Uniform model has lower perplexity than the Yearly one,
# especially on the future slices where we use the 2018 expert for the latter."
PERPLEXITY_ORDER = (("temporal", "uniform", "seen"), ("temporal", "uniform", "future"),
                    ("temporal", "yearly", "seen"), ("temporal", "yearly", "future"),
                    ("uniform", "yearly", "future"))


def _perplexity_order(results, alpha) -> Dict[str, Any]:
    """Dhingra et al., Table 7: CustomNews masked-span perplexity ordered Temporal < Uniform < Yearly (PERPLEXITY_ORDER:
    Temporal lowest on the seen and the future slice, Uniform below Yearly on the future slice). Each pair a paired
    test over the same test spans of their target log-likelihood (nats; the same target under both models, so the
    difference is one of perplexity), lower-perplexity model minus the other > 0; intersection-union over the pairs."""
    name = ("paired tests over the CustomNews test spans of the target log-likelihood, for each pair of Table 7's "
            "ordering (Temporal < Uniform, Temporal < Yearly on seen and future years; Uniform < Yearly on future "
            "years), intersection-union")
    pq = lookup(results, "per_query", "customnews", default=None) or {}
    loglik = pq.get("loglik") or {}
    if not all(m in loglik for m in ("temporal", "uniform", "yearly")):
        return statistics.untested(name, "no per-span log-likelihoods of Temporal, Uniform and the Yearly experts on "
                                         "CustomNews")
    years = {slice_: set(lookup(results, "world", f"{slice_}_years", default=[]) or [])
             for slice_ in ("seen", "future")}
    parts, means = {}, {}
    for lower, higher, slice_ in PERPLEXITY_ORDER:
        keep = np.array([y in years[slice_] for y in pq["year"]], bool)
        if keep.sum() < 2:
            return statistics.untested(name, f"fewer than two {slice_}-year CustomNews test spans")
        a, b = np.asarray(loglik[lower], float)[keep], np.asarray(loglik[higher], float)[keep]
        parts[f"{lower} below {higher}, {slice_} years"] = statistics.paired_difference(a, b, direction=+1,
                                                                                          alpha=alpha)
        for model, values in ((lower, a), (higher, b)):
            means.setdefault(slice_, {})[model] = float(-values.mean())
    out = statistics.all_of(parts, name, alpha)
    out["mean_nll"] = means
    out["evidence"] = ("CustomNews mean span NLL (nats) " + "; ".join(
        f"{slice_}: " + ", ".join(f"{m.title()} {v:.3f}" for m, v in by_model.items())
        for slice_, by_model in means.items()) + "; " + "; ".join(
        f"{k} {statistics.describe(v, 'nats', 3)} ({v['verdict']})" for k, v in out["parts"].items()))
    return out


def _duration_tradeoff(results, alpha) -> Dict[str, Any]:
    """Dhingra et al., section 3.2 (Figure 2, right): "The uniformly trained model has higher performance on queries
    whose answers persist for a long time, but it does worse on queries whose answers persist for less than 5 years.
    The opposite is true for the year-specific models." A crossing, tested on both sides over the seen-year queries
    (paired over the same queries): Uniform minus Yearly F1 > 0 on answers lasting >= SHORT_DURATION years, and
    Yearly minus Uniform > 0 on shorter ones; it appears when both sides do (intersection-union), is the opposite
    when either side is significantly reversed. Each group's mean F1 of every model as details."""
    name = (f"paired tests over the seen-year queries, intersection-union: Uniform minus Yearly F1 > 0 on answers "
            f"lasting >= {SHORT_DURATION} years and < 0 on shorter ones")
    pq = results.get("per_query") or {}
    f1 = pq.get("f1") or {}
    if "uniform" not in f1 or "yearly" not in f1 or not pq.get("duration"):
        return statistics.untested(name, "no per-query F1 of Uniform and the Yearly experts with answer durations")
    seen = set(lookup(results, "world", "seen_years", default=[]) or [])
    duration = np.array([np.nan if d is None else float(d) for d in pq["duration"]], float)
    keep = np.array([y in seen for y in pq["year"]], bool) & np.isfinite(duration)
    scores = {m: np.asarray(v, float)[keep] for m, v in f1.items()}
    long = duration[keep] >= SHORT_DURATION
    uniform, yearly = scores["uniform"], scores["yearly"]
    if long.sum() < 2 or (~long).sum() < 2:
        out = statistics.untested(name, f"fewer than two seen-year queries on a side (answers lasting >= "
                                        f"{SHORT_DURATION} years: {int(long.sum())}, shorter: {int((~long).sum())})")
    else:
        out = statistics.all_of(
            {"long": statistics.paired_difference(uniform[long], yearly[long], direction=+1, alpha=alpha),
             "short": statistics.paired_difference(yearly[~long], uniform[~long], direction=+1, alpha=alpha)}, name,
            alpha)
        out["n"] = int(keep.sum())
    out["groups"] = {group: {"n": int(mask.sum()), **{m: float(v[mask].mean()) if mask.any() else None
                                                       for m, v in scores.items()}}
                     for group, mask in (("long", long), ("short", ~long))}

    def group_text(group):
        g = out["groups"][group]
        return (f"{'>=' if group == 'long' else '<'} {SHORT_DURATION} years (n={g['n']}): "
                + ", ".join(f"{m.title()} {_fmt(g.get(m), sign=False)}" for m in ("uniform", "yearly", "temporal")
                            if m in g))

    parts = out.get("parts") or {}
    sides = "; ".join(f"{'Uniform - Yearly, long answers' if k == 'long' else 'Yearly - Uniform, short answers'} "
                      f"{statistics.describe(v, 'F1')} ({v['verdict']})" for k, v in parts.items())
    out["evidence"] = (f"seen-year TempLAMA F1 by answer duration, {group_text('long')}; {group_text('short')}"
                       + (f"; {sides}" if sides else f"; {out.get('reason', '')}"))
    return out


def _yearly_falloff(results, alpha) -> Dict[str, Any]:
    out = _falloff(lookup(results, "yearly", "per_query", default=None), alpha)
    news = lookup(results, "yearly", "customnews", "per_query", default=None)
    if news:  # the same test on CustomNews (the masked span's F1), as a detail
        detail = _falloff(news, alpha)
        out["customnews"] = {k: detail[k] for k in ("effect", "interval", "p_value", "n", "verdict", "sides")
                             if k in detail}
        out["evidence"] += f"; CustomNews span F1 slope {statistics.describe(detail, 'F1 per year')}"
    return out


def _falloff(pq, alpha) -> Dict[str, Any]:
    """The slope of the yearly experts' per-query F1 on |test year - expert year|, and its past and future sides."""
    name = "least-squares slope of per-query F1 on |year gap|, cluster bootstrap over queries"
    if not pq or len(pq.get("f1") or {}) < 1:
        return statistics.untested(name, "no per-query F1 of the yearly experts")
    years = np.asarray(pq["year"], float)
    x, y, clusters, signed = [], [], [], []
    for expert, scores in pq["f1"].items():
        gap = years - float(expert)
        x.append(np.abs(gap))
        signed.append(gap)
        y.append(np.asarray(scores, float))
        clusters.append(np.arange(len(years)))
    x, y, clusters, signed = (np.concatenate(v) for v in (x, y, clusters, signed))
    if len(np.unique(x)) < 2:
        return statistics.untested(name, "a single year gap: at least two experts or two test years are needed")
    out = statistics.clustered_slope(x, y, clusters, direction=-1, alpha=alpha)
    out["test"] = name
    sides = {}
    for side, keep in (("past", signed <= 0), ("future", signed >= 0)):  # gap 0 belongs to both sides
        if len(np.unique(x[keep])) >= 2:
            sides[side] = statistics.clustered_slope(x[keep], y[keep], clusters[keep], direction=-1, alpha=alpha)
    out["sides"] = {k: {key: v[key] for key in ("effect", "interval", "p_value", "n", "verdict")}
                    for k, v in sides.items()}
    side_text = "; ".join(f"{k} {statistics.describe(v, 'F1/year')}" for k, v in sides.items())
    out["evidence"] = (f"slope {statistics.describe(out, 'F1 per year of distance')}"
                       + (f" ({side_text})" if side_text else ""))
    return out


def _multi_answer_falls_faster(results, alpha) -> Dict[str, Any]:
    items = lookup(results, "degradation", "temporal", "items", default=None)
    name = "Welch's t-test of the mean log-likelihood change, multi- minus single-answer queries"
    if not items:
        return statistics.untested(name, "no per-query log-likelihood changes of the Temporal model")
    groups = np.asarray(items["group"], object)
    change = np.asarray(items["mean_change"], float)
    multi, single = change[groups == "multiple"], change[groups == "single"]
    out = statistics.welch(multi, single, direction=-1, alpha=alpha)
    out["test"] = name
    out["evidence"] = (f"Temporal model, mean change over the gaps: multi-answer "
                       f"{_fmt(float(multi.mean()) if len(multi) else None, 3)} nats (n={len(multi)}), single-answer "
                       f"{_fmt(float(single.mean()) if len(single) else None, 3)} nats (n={len(single)}); difference "
                       f"{statistics.describe(out, 'nats', 3)}")
    return out


def _entropy_order(results, alpha) -> Dict[str, Any]:
    """Dhingra et al., section 4 (Figure 4): the models' uncertainty into the future "is ordered correctly according
    to intuition: highest for the queries of frequently-changing facts, and lowest for queries whose answers are
    expected not to change". One value per query (its normalized entropy averaged over the future years: the years
    of one query are not independent items), then Spearman's rank correlation of those values with the change class
    (never < rare < frequent; claim > 0)."""
    items = lookup(results, "calibration", "temporal", "items", default=None)
    name = ("Spearman rank correlation of each query's normalized entropy (mean over the future years) with the rate "
            "of change (never < rare < frequent)")
    if not items:
        return statistics.untested(name, "no per-query entropies of the Temporal model")
    classes = np.asarray(items["class"], object)
    values = np.asarray(items["normalized_entropy"], float)
    years = np.asarray(items["year"], float)
    queries = items.get("query")
    if queries is None:  # results written before items named their query: each query's years are consecutive
        per_query = max(1, len(set(items["year"])))
        queries = [i // per_query for i in range(len(values))]
    queries = np.asarray(queries, object)
    order = list(dict.fromkeys(queries.tolist()))
    by_class: Dict[str, list] = {c: [] for c in CHANGE_CLASSES}
    for q in order:
        keep = queries == q
        c = classes[keep][0]
        if c in by_class:
            by_class[c].append(float(values[keep].mean()))
    out = statistics.rank_trend(by_class, order=tuple(reversed(CHANGE_CLASSES)), direction=+1, alpha=alpha)
    out["test"] = name
    out["n_items"] = int(len(values))
    growth = {}
    for c in CHANGE_CLASSES:
        keep = classes == c
        if keep.sum() >= 3 and len(np.unique(years[keep])) >= 2:
            g = statistics.clustered_slope(years[keep], values[keep], queries[keep], direction=+1, alpha=alpha)
            growth[c] = {key: g[key] for key in ("effect", "interval", "p_value", "n", "verdict")}
    out["growth_per_year"] = growth
    means = out.get("group_means") or {}
    out["evidence"] = ("Temporal model, each query's normalized entropy over the future years: "
                       + ", ".join(f"{c} {_fmt(means.get(c), 3, sign=False)} (n={len(by_class[c])})"
                                   for c in CHANGE_CLASSES)
                       + f"; rank correlation over the queries {statistics.describe(out, '', 3)}")
    return out


def _future_slice(results, years: np.ndarray) -> Tuple[np.ndarray, list]:
    """The adaptation's "new" test slice: every future year's queries, as the paper measures the update ("the combined
    performance on 2019-20 held out data", section 5) though it adapts to the first future year's news alone; the
    adaptation's own year where the run names no future years."""
    future = list(lookup(results, "world", "future_years", default=None) or [])
    if not future:
        future = [lookup(results, "adaptation", "new_year")]
    return np.array([y in future for y in years], bool), sorted(y for y in future if y is not None)


def _adaptation(results, alpha) -> Dict[str, Any]:
    """Dhingra et al., section 5 (Figure 5): fine-tuned on alpha mixtures of the new year's news and the old years',
    "the Temporal model also adapts to 2019, but shows minimal degradation on the 2010-18 slice up to alpha=0.6".
    For every alpha up to ADAPTED_UP_TO, two paired tests over the same TempLAMA test queries: the F1 gain on the
    future years' queries (combined, as the paper measures) of the adapted Temporal model over the un-adapted one
    (> 0), and the old years' F1 above OLD_F1_KEPT of the un-adapted model's (adapted - 0.8 x base > 0); it appears
    when every one of them passes (intersection-union). Larger alphas are reported as details, outside the claim."""
    pq = lookup(results, "adaptation", "regimes", "temporal", "per_query", "templama", default=None)
    name = (f"paired tests per alpha up to {ADAPTED_UP_TO:g}: future-years F1 gain > 0 and old-years F1 > "
            f"{OLD_F1_KEPT:g} x un-adapted (intersection-union)")
    old_years = set(lookup(results, "adaptation", "old_years", default=[]) or [])
    if not pq or "base" not in pq["f1"] or lookup(results, "adaptation", "new_year") is None:
        return statistics.untested(name, "no adaptation runs with per-query F1")
    years = np.asarray(pq["year"], object)
    new, new_years = _future_slice(results, years)
    old = np.array([y in old_years for y in years], bool)
    base = np.asarray(pq["f1"]["base"], float)
    every = sorted((a for a in pq["f1"] if a not in ("base", "retrained")), key=float)
    alphas = [a for a in every if float(a) <= ADAPTED_UP_TO + 1e-9]
    if not alphas or new.sum() < 2 or old.sum() < 2:
        return statistics.untested(name, f"no alpha up to {ADAPTED_UP_TO:g} (the run's: {', '.join(every) or 'none'}),"
                                         " or fewer than two future-year or old-year queries")
    details: Dict[str, Any] = {}
    tests: Dict[str, Any] = {}
    for a in every:
        adapted = np.asarray(pq["f1"][a], float)
        gain = statistics.paired_difference(adapted[new], base[new], direction=+1, alpha=alpha)
        kept = statistics.paired_difference(adapted[old], OLD_F1_KEPT * base[old], direction=+1, alpha=alpha)
        details[a] = {"gain": {k: gain[k] for k in ("effect", "interval", "p_value", "verdict")},
                      "kept": {k: kept[k] for k in ("effect", "interval", "p_value", "verdict")},
                      "old_kept": float(adapted[old].mean() / base[old].mean()) if base[old].mean() > 0 else None,
                      "in_claim": a in alphas}
        if a in alphas:
            tests[f"gain at alpha {a}"], tests[f"old years kept at alpha {a}"] = gain, kept
    out = statistics.all_of(tests, name, alpha)
    out.update(n=int(new.sum()), n_old=int(old.sum()), new_years=new_years, alphas=details)

    def kept_text(share):
        return "n/a" if share is None else f"{100 * share:.0f}%"

    out["evidence"] = (f"future-year ({', '.join(map(str, new_years))}) F1 un-adapted {base[new].mean():.2f}; "
                       + "; ".join(f"alpha {a}{'' if v['in_claim'] else ' (beyond the claim)'}: gain "
                                   f"{v['gain']['effect']:+.2f} F1 ({v['gain']['verdict']}), old years "
                                   f"{kept_text(v['old_kept'])} kept ({v['kept']['verdict']})"
                                   for a, v in details.items()))
    return out


def _adapted_matches_retrained(results, alpha) -> Dict[str, Any]:
    """Dhingra et al., section 3.3: with alpha 0.5, the Temporal model fine-tuned briefly "matches" the Temporal
    model retrained from scratch. A non-inferiority test on each slice (the future years combined, as the paper
    measures the update, and the old years), paired over
    the same TempLAMA test queries: adapted F1 above RETRAINED_F1_MATCHED x the retrained model's (claim > 0); it
    appears when both slices pass, is the opposite when either is below at alpha / 2 (intersection-union,
    templm.metrics.statistics.all_of)."""
    name = (f"paired non-inferiority tests on the future years and the old years: adapted (alpha {MATCH_ALPHA:g}) F1 "
            f"minus {RETRAINED_F1_MATCHED:g} x the retrained model's > 0 (intersection-union)")
    pq = lookup(results, "adaptation", "regimes", "temporal", "per_query", "templama", default=None)
    new_year = lookup(results, "adaptation", "new_year")
    old_years = set(lookup(results, "adaptation", "old_years", default=[]) or [])
    if not pq or "retrained" not in pq["f1"] or new_year is None:
        return statistics.untested(name, "no retrained Temporal model with per-query F1")
    key = next((a for a in pq["f1"] if a not in ("base", "retrained") and float(a) == MATCH_ALPHA), None)
    if key is None:
        have = ", ".join(sorted((a for a in pq["f1"] if a not in ("base", "retrained")), key=float)) or "none"
        return statistics.untested(name, f"no fine-tune at alpha {MATCH_ALPHA:g}, the paper's (the run's alphas: "
                                         f"{have})")
    years = np.asarray(pq["year"], object)
    adapted, retrained = np.asarray(pq["f1"][key], float), np.asarray(pq["f1"]["retrained"], float)
    parts = {}
    new, _ = _future_slice(results, years)
    for part, mask in (("new_years", new), ("old_years", np.array([y in old_years for y in years]))):
        if mask.sum() < 2:
            return statistics.untested(name, f"fewer than two {part.replace('_', ' ')} test queries")
        test = statistics.paired_difference(adapted[mask], RETRAINED_F1_MATCHED * retrained[mask], direction=+1,
                                            alpha=alpha)
        test["adapted_f1"], test["retrained_f1"] = float(adapted[mask].mean()), float(retrained[mask].mean())
        parts[part] = test
    out = statistics.all_of(parts, name, alpha)
    out["alpha"] = key
    out["slices"] = {k: {f: t[f] for f in ("effect", "interval", "p_value", "n", "verdict", "adapted_f1",
                                           "retrained_f1")} for k, t in parts.items()}
    out["evidence"] = f"alpha {key}: " + "; ".join(
        f"{k.replace('_', ' ')} F1 adapted {t['adapted_f1']:.2f} vs retrained {t['retrained_f1']:.2f}, margin test "
        f"{statistics.describe(t, 'F1')}" for k, t in parts.items())
    return out


def _aligned(pq: Mapping[str, Any], ids: Sequence[str], name: str) -> np.ndarray:
    where = {i: k for k, i in enumerate(pq["id"])}
    return np.asarray([pq["f1"][name][where[i]] for i in ids], float)


def _temporal_forgets_less(results, alpha) -> Dict[str, Any]:
    """Dhingra et al., section 3.3: adapted to a new year, Temporal forgets the old years less than Uniform. Per
    alpha, a paired test over the old-year TempLAMA test queries of the F1 each model lost in the fine-tune
    (Temporal's minus Uniform's, claim < 0), joined over the alphas (intersection-union, all_of: appears when every
    alpha's does, the opposite when one is reversed at alpha / the number of alphas). CustomNews as details."""
    name = ("paired tests per alpha over the old-year queries: Temporal's F1 loss minus Uniform's, both fine-tuned on "
            "the same alpha mixture (intersection-union)")
    regimes = lookup(results, "adaptation", "regimes", default={}) or {}
    old_years = set(lookup(results, "adaptation", "old_years", default=[]) or [])
    parts: Dict[str, Any] = {}
    for folder in ("templama", "customnews"):
        t = lookup(regimes, "temporal", "per_query", folder, default=None)
        u = lookup(regimes, "uniform", "per_query", folder, default=None)
        if not t or not u or "base" not in t["f1"] or "base" not in u["f1"]:
            continue
        years = dict(zip(t["id"], t["year"]))
        ids = sorted(i for i in set(t["id"]) & set(u["id"]) if years[i] in old_years)
        alphas = sorted((a for a in t["f1"] if a not in ("base", "retrained") and a in u["f1"]), key=float)
        if len(ids) < 2 or not alphas:
            continue
        parts[folder] = {}
        for a in alphas:
            forget_t = _aligned(t, ids, "base") - _aligned(t, ids, a)
            forget_u = _aligned(u, ids, "base") - _aligned(u, ids, a)
            parts[folder][a] = statistics.paired_difference(forget_t, forget_u, direction=-1, alpha=alpha)
    if "templama" not in parts:
        return statistics.untested(name, "no adapted Uniform and Temporal models with per-query F1 on the old years")
    out = statistics.all_of(parts["templama"], name, alpha, direction=-1)
    out["weakest_alpha"] = out.pop("weakest")
    out["alphas"] = {folder: {a: {k: r[k] for k in ("effect", "interval", "p_value", "n", "verdict")}
                              for a, r in by_alpha.items()} for folder, by_alpha in parts.items()}
    out["evidence"] = "old-years F1 lost by Temporal minus by Uniform: " + "; ".join(
        f"{folder} alpha {a}: {statistics.describe(r, 'F1')}" for folder, by_alpha in parts.items()
        for a, r in by_alpha.items())
    return out


@dataclasses.dataclass(frozen=True)
class Finding:
    """One expected finding of the study: its `name` (unique over both halves), the `claim` in words, the sign the
    claim gives the effect (`direction`), the `half` of the study whose results it is tested on ("time-aware": the
    T5 study's results dict; "streaming": one stream run's results, templm.metrics.stream), the stages its numbers
    come from (`needs`: where the run's results["skipped"] names one, the finding is not tested and says why) and
    `judge(results, alpha)`, the test."""

    name: str
    claim: str
    direction: int
    half: str
    needs: Tuple[str, ...]
    judge: Callable[[Mapping[str, Any], float], Dict[str, Any]]


TIME_AWARE, STREAMING = "time-aware", "streaming"
# Not halves of the study: the effects of Logan, Gardner and Singh on one `templm is-eval` run of a latent LM, and
# Mind the Gap's appendices B and C on one `templm appendices` run.
IMPORTANCE_SAMPLING = "importance-sampling"
APPENDICES = "streaming-appendices"
STUDY_HALVES = (TIME_AWARE, STREAMING)
HALVES = STUDY_HALVES + (IMPORTANCE_SAMPLING, APPENDICES)

# Every finding of the study, in the order the report and the command line list them.
REGISTRY: Tuple[Finding, ...] = (
    Finding("temporal_beats_uniform", "Temporal beats Uniform on seen-year TempLAMA F1", +1, TIME_AWARE,
            ("data", "evaluate"), _temporal_beats_uniform),
    Finding("temporal_beats_uniform_future", "Temporal beats Uniform on future-year TempLAMA F1 (Dhingra et al., "
            "Table 2's 2019-20 column)", +1, TIME_AWARE, ("data", "evaluate"), _temporal_beats_uniform_future),
    Finding("temporal_beats_yearly", "Temporal beats the Yearly experts on seen-year TempLAMA F1 (Table 2)", +1,
            TIME_AWARE, ("data", "evaluate"), _temporal_beats_yearly),
    Finding("yearly_beats_uniform", "The Yearly experts beat Uniform on seen-year TempLAMA F1 (Table 2: \"Yearly and "
            "Temporal improve over Uniform\")", +1, TIME_AWARE, ("data", "evaluate"), _yearly_beats_uniform),
    Finding("temporal_beats_uniform_customnews", "Temporal beats Uniform on seen-year CustomNews span F1 (Table 2)",
            +1, TIME_AWARE, ("data", "evaluate"), _temporal_beats_uniform_customnews),
    Finding("perplexity_order", "CustomNews perplexity is lowest for Temporal on seen and future years, and Uniform's "
            "is below Yearly's on future years (Table 7)", +1, TIME_AWARE, ("data", "evaluate"), _perplexity_order),
    Finding("yearly_beats_temporal_customnews", "The Yearly experts beat Temporal on seen-year CustomNews span F1 "
            "(Table 2: short-lived facts)", +1, TIME_AWARE, ("data", "evaluate"), _yearly_beats_temporal_customnews),
    Finding("temporal_beats_uniform_customnews_future", "Temporal beats Uniform on future-year CustomNews span F1 "
            "(Table 2's 2019-20 column)", +1, TIME_AWARE, ("data", "evaluate"),
            _temporal_beats_uniform_customnews_future),
    Finding("temporal_beats_yearly_customnews_future", "Temporal beats the Yearly experts (the last seen year's) on "
            "future-year CustomNews span F1 (Table 2's 2019-20 column)", +1, TIME_AWARE, ("data", "evaluate"),
            _temporal_beats_yearly_customnews_future),
    Finding("yearly_falloff", "Yearly experts fall off with the year gap", -1, TIME_AWARE, ("data", "evaluate"),
            _yearly_falloff),
    Finding("duration_tradeoff", f"Uniform beats the Yearly experts on answers lasting >= {SHORT_DURATION} years and "
            "does worse on shorter ones: a crossing (Figure 2, right)", +1, TIME_AWARE, ("data", "evaluate"),
            _duration_tradeoff),
    Finding("multi_answer_falls_faster", "The log-likelihood of multi-answer facts falls faster into the future "
            "than that of single-answer facts", -1, TIME_AWARE, ("data", "future probes"),
            _multi_answer_falls_faster),
    Finding("entropy_order", "Entropy over candidates orders frequent > rare > never changing relations", +1,
            TIME_AWARE, ("data", "future probes", "calibration"), _entropy_order),
    Finding("adaptation", f"Alpha-mixture adaptation gains on the new year while keeping most (>= {OLD_F1_KEPT:.0%}) "
            "of the old-years F1", +1, TIME_AWARE, ("data", "adaptation"), _adaptation),
    Finding("adapted_matches_retrained", f"With alpha {MATCH_ALPHA:g}, a short fine-tune of Temporal matches (>= "
            f"{RETRAINED_F1_MATCHED:.0%} of) the Temporal model retrained from scratch on the new and the old years",
            +1, TIME_AWARE, ("data", "adaptation"), _adapted_matches_retrained),
    Finding("temporal_forgets_less", "Adapted to a new year, the Temporal model forgets the old years less than the "
            "Uniform model", -1, TIME_AWARE, ("data", "adaptation"), _temporal_forgets_less),
    Finding("streaming_gap", "TIME-STRATIFIED perplexity is above CONTROL's on the test documents", +1, STREAMING,
            ("streaming",), stream.judge_gap),
    Finding("streaming_growth", "the gap grows month by month (the slope of the monthly relative increase, the "
            "paper's t-test)", +1, STREAMING, ("streaming",), stream.judge_growth),
    Finding("streaming_dynamic", "dynamic evaluation (SGD, all parameters) lowers TIME-STRATIFIED perplexity", -1,
            STREAMING, ("streaming",), stream.judge_dynamic),
    Finding("streaming_dynamic_slope", "dynamic evaluation reduces the upward slope of the gap (Mind the Gap, "
            "section 5: the t-test on the slopes)", -1, STREAMING, ("streaming",), stream.judge_dynamic_slope),
    Finding("streaming_size_slope", f"a larger TIME-STRATIFIED model keeps the upward slope of the gap (Mind the Gap, "
            f"section 4: model size has no significant effect on it): its slope at least {stream.SLOPE_KEPT:.0%} of "
            "the smaller model's", +1, STREAMING, ("streaming",), stream.judge_size_slope),
    Finding("is_tightens_with_k", "More samples tighten the importance-sampled estimate: the document-level "
            "estimated likelihood rises from the smallest to the largest K (Logan et al., Figure 1)", +1,
            IMPORTANCE_SAMPLING, (), importance_sampling.judge_tightens_with_k),
    Finding("is_token_level_optimistic", "Aggregating samples per token, finer than the model's latent unit, "
            "reports a higher likelihood (lower perplexity) than the document-level estimate (Logan et al., "
            "section 4)", +1, IMPORTANCE_SAMPLING, (), importance_sampling.judge_token_level_optimistic),
    Finding("is_flatter_proposal_tighter", "A flatter proposal (the largest temperature) gives a tighter estimate "
            "than the trained proposal at the largest K (the proposal's temperature, Logan et al., section 4)", +1,
            IMPORTANCE_SAMPLING, (), importance_sampling.judge_flatter_proposal_tighter),
    Finding("is_gold_proposal_tighter", "A proposal that sees the gold annotations gives a tighter estimate than "
            "one that sees the text only (Logan et al., section 4)", +1, IMPORTANCE_SAMPLING, (),
            importance_sampling.judge_gold_proposal_tighter),
    Finding("appendix_every_period_gap", "TIME-STRATIFIED perplexity is above CONTROL's in every shifted "
            "test period (Mind the Gap, Appendix B, Figure 8)", +1, APPENDICES, (), stream.judge_every_period_gap),
    Finding("appendix_distance_growth", "the further the training period ends before the test period, the higher "
            "the perplexity (Mind the Gap, Appendix C, Figure 9)", +1, APPENDICES, (),
            stream.judge_distance_growth),
)
BY_NAME: Mapping[str, Finding] = {f.name: f for f in REGISTRY}
# The study's findings (both halves), what `templm reproduce` tests and reports.
STUDY: Tuple[Finding, ...] = tuple(f for f in REGISTRY if f.half in STUDY_HALVES)


def of_half(half: str) -> Tuple[Finding, ...]:
    if half not in HALVES:
        raise ValueError(f"unknown half of the study {half!r}: one of {', '.join(HALVES)}")
    return tuple(f for f in REGISTRY if f.half == half)


# Scores near the floor: a study whose models barely learnt still gets verdicts, but they compare noise.
FLOOR_F1 = 5.0  # every model's TempLAMA F1 below this (x100): the models barely answer a query
FLOOR_PERPLEXITY_SHARE = 0.5  # every model's perplexity at least this share of its vocabulary's size: near guessing


def at_floor(results: Mapping[str, Any], half: str = TIME_AWARE) -> List[str]:
    """What says that the scores one half's findings compare are near the floor (the models barely learnt): the
    time-aware half's every model's TempLAMA F1 below FLOOR_F1, or its every model's CustomNews perplexity at least
    FLOOR_PERPLEXITY_SHARE of the vocabulary's size; the streaming half's every run's subword perplexity so. Empty
    when nothing does (or the results do not hold the numbers)."""
    out = []
    if half == TIME_AWARE:
        regimes = results.get("regimes") or {}
        f1 = {m: lookup(r, "templama", "f1", default=None) for m, r in regimes.items()}
        f1 = {m: v for m, v in f1.items() if v is not None}
        if f1 and all(v < FLOOR_F1 for v in f1.values()):
            out.append(f"every model's TempLAMA F1 is below {FLOOR_F1:g} ("
                       + ", ".join(f"{m.title()} {v:.2f}" for m, v in f1.items()) + "): the models barely answer")
        vocab = lookup(results, "model_config", "vocab_size", default=None)
        ppl = {m: lookup(r, "customnews", "ppl", default=None) for m, r in regimes.items()}
        ppl = {m: v for m, v in ppl.items() if v is not None}
        if vocab and ppl and all(v >= FLOOR_PERPLEXITY_SHARE * vocab for v in ppl.values()):
            out.append(f"every model's CustomNews perplexity is at least {FLOOR_PERPLEXITY_SHARE:.0%} of the "
                       f"vocabulary's {vocab} pieces (" + ", ".join(f"{m.title()} {v:.1f}" for m, v in ppl.items())
                       + "): near guessing")
    elif half == STREAMING:
        sizes = lookup(results, "settings", "vocab_size_by_run", default=None) or {}
        ppl = {name: lookup(run, "static", "overall", "subword_ppl", default=None)
               for name, run in (results.get("runs") or {}).items()}
        ppl = {name: v for name, v in ppl.items() if v is not None and sizes.get(name)}
        if ppl and all(v >= FLOOR_PERPLEXITY_SHARE * sizes[name] for name, v in ppl.items()):
            out.append(f"every Transformer-XL's subword perplexity is at least {FLOOR_PERPLEXITY_SHARE:.0%} of its "
                       "vocabulary's size (" + ", ".join(f"{name} {v:.1f} of {sizes[name]}" for name, v in ppl.items())
                       + "): near guessing")
    return out


def judge(results: Mapping[str, Any], half: str = TIME_AWARE, alpha: float = statistics.ALPHA,
          skipped: Optional[Mapping[str, str]] = None) -> Dict[str, Dict[str, Any]]:
    """{name: finding} for each finding of `half`, in REGISTRY order, tested on that half's results; a finding is a
    dict {"claim", "half", "verdict", "test", "effect", "interval", "p_value", "n", "evidence", ...}, the one shape
    results.json, the seeds' combination, the report and the command line all use. A finding whose stage was skipped
    (`skipped`, default results["skipped"]: {stage: reason}; an extra stage is named "extra: NAME") is not tested,
    with the reason."""
    results = jsonable(results)
    if skipped is None:
        skipped = results.get("skipped") or {}
    skipped = {k[len("extra: "):] if k.startswith("extra: ") else k: v for k, v in skipped.items()}
    out = {}
    for finding in of_half(half):
        stage = next((stage for stage in finding.needs if stage in skipped), None)
        if stage is None:
            found = jsonable(finding.judge(results, alpha))
        else:
            test = finding.judge({}, alpha).get("test", "")
            found = {**statistics.untested(test, f"not tested: the {stage} stage was skipped ({skipped[stage]})"),
                     "skipped": stage}
        out[finding.name] = {"claim": finding.claim, "half": finding.half, **found}
    floor = at_floor(results, half)
    for found in out.values():  # a verdict on scores at the floor is marked as such
        if floor and found.get("effect") is not None:
            found["floor"] = "; ".join(floor)
    return out


# --------------------------------------------------------------------------------------------------------------------
# Several seeds.


def combine(per_seed: Sequence[Mapping[str, Any]], direction: int, alpha: float = statistics.ALPHA
            ) -> Dict[str, Any]:
    """One finding over several seeds (per_seed: its result on each seed, in seed order): the verdict from a
    one-sample t-test of the per-seed effects (statistics.combine_seeds), each seed's result under "per_seed"."""
    out = statistics.combine_seeds([dict(r) for r in per_seed], direction=direction, alpha=alpha)
    if len(per_seed) > 1 and any(r.get("effect") is not None for r in per_seed):  # else the reason it has none
        digits = _digits([r.get("effect") for r in per_seed])
        out["evidence"] = (f"mean of {len(per_seed)} seeds' effects {statistics.describe(out, digits=digits)}; per "
                           "seed: " + ", ".join(f"{_fmt(r.get('effect'), digits)} ({r.get('verdict')})"
                                                for r in per_seed))
    return jsonable(out)


def _digits(values: Sequence[Optional[float]]) -> int:
    """Decimals that show the largest of `values` with at least two significant digits (2 at the least): a slope
    of 0.0021 per month is +0.0021, not +0.00."""
    largest = max((abs(v) for v in values if v is not None and math.isfinite(v) and v != 0), default=1.0)
    return max(2, 1 - math.floor(math.log10(largest)))


def combine_findings(per_seed: Sequence[Mapping[str, Mapping[str, Any]]], alpha: float = statistics.ALPHA
                     ) -> Dict[str, Dict[str, Any]]:
    """The findings of several seeds ({name: finding} each, as `judge` gives them) combined, finding by finding, in
    REGISTRY order: the findings every seed holds."""
    names = [f.name for f in REGISTRY if all(f.name in seed for seed in per_seed)]
    out = {name: {"claim": BY_NAME[name].claim, "half": BY_NAME[name].half,
                  **combine([seed[name] for seed in per_seed], BY_NAME[name].direction, alpha)} for name in names}
    for name, found in out.items():  # at the floor on every seed: the combined verdict is marked so
        floors = [seed[name].get("floor") for seed in per_seed]
        if len(per_seed) > 1 and all(floors):
            found["floor"] = f"on every seed, e.g. seed 1 of {len(per_seed)}: {floors[0]}"
    return out
