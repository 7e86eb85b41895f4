"""The statistical tests behind every finding: each returns a "test result", a plain JSON-able dict

    {"test": name, "effect": float, "interval": [low, high], "p_value": float (two-sided), "n": int,
     "confidence": 0.95, "verdict": "appears" | "opposite" | "inconclusive" | "not applicable", ...test-specific keys}

`effect` is in the claim's units (a mean difference, a slope, a rank correlation...), `interval` its confidence
interval and `p_value` the two-sided p-value of "no effect". The verdict comes from one place, `verdict()`: the claim
says which sign the effect should have (`direction` +1 or -1); the finding "appears" when the test rejects "no effect"
at level `alpha` with the claimed sign, is the "opposite" when it rejects it with the other sign, and is otherwise
"inconclusive". A sign of a difference alone is never a finding (DESIGN.md, "Findings"). A claim that presumes what
the data does not show (a slope to flatten that does not rise) is "not applicable" (`not_applicable`), said as such;
a claim that is several tests at once (a crossing, a claim for every alpha) is their intersection-union (`all_of`).

Numbers that cannot be computed (a t-test on one value, a slope over a constant x) are None, never NaN or infinity,
and a result with a None effect or p-value is "inconclusive" with a "reason" key saying why. Every resampling test is
seeded, so the same inputs give the same result.

Several seeds of one experiment: run the test per seed, then `combine_seeds` tests the per-seed effects with a
one-sample t-test; `mean_interval` gives the mean and t-interval the report shows for any number over seeds.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Hashable, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import scipy.stats

from templm.io import jsonable

ALPHA = 0.05
NOT_APPLICABLE = "not applicable"
VERDICTS = ("appears", "opposite", "inconclusive", NOT_APPLICABLE)

PAIRED_TEST = "paired bootstrap (interval) and sign-flip permutation test (p) of the mean difference"
WELCH_TEST = "Welch's t-test of the difference of means"
SLOPE_TEST = "least-squares slope with a t-test on the slope"
CLUSTERED_SLOPE_TEST = "least-squares slope with a cluster bootstrap (interval and p)"
RANK_TREND_TEST = "Spearman rank correlation with the group order (p), stratified bootstrap (interval)"
ONE_SAMPLE_TEST = "one-sample t-test of the mean against 0"

# A cluster bootstrap over a handful of clusters is overconfident (two clusters that agree give the smallest p there
# is): below this many clusters clustered_slope gives no p-value.
MIN_CLUSTERS = 5

_BOOTSTRAP_CELLS = 4_000_000  # resamples x items held in memory at once by the vectorised bootstraps
# Above this many pairs paired_difference takes the percentile interval: BCa's jackknife costs n**2, and at this size
# the two intervals agree.
BCA_MAX_N = 5000


# --------------------------------------------------------------------------------------------------------------------
# The verdict and the shape of a test result.


def _finite(value: Any) -> Optional[float]:
    """`value` as a Python float, or None where it is None, NaN or infinite."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _check_direction(direction: Any) -> int:
    if isinstance(direction, bool) or direction not in (1, -1):
        raise ValueError("direction must be +1 (the claim: the effect is positive) or -1 (negative), "
                         f"got {direction!r}")
    return int(direction)


def _check_level(name: str, value: float) -> float:
    if not 0.0 < float(value) < 1.0:
        raise ValueError(f"{name} must lie strictly between 0 and 1, got {value!r}")
    return float(value)


def verdict(effect: Optional[float], p_value: Optional[float], direction: int, alpha: float = ALPHA) -> str:
    """"appears" when p_value < alpha and the effect has the claimed sign (`direction` +1: positive, -1: negative),
    "opposite" when p_value < alpha and the effect has the other sign, otherwise "inconclusive" (also for a None or NaN
    effect or p-value, and for an effect of exactly 0)."""
    direction = _check_direction(direction)
    alpha = _check_level("alpha", alpha)
    effect, p_value = _finite(effect), _finite(p_value)
    if effect is None or p_value is None or effect == 0.0 or not p_value < alpha:
        return "inconclusive"
    return "appears" if (effect > 0) == (direction > 0) else "opposite"


def untested(test: str, reason: str) -> Dict[str, Any]:
    """The result of a test that could not be run, in the shape of the others: inconclusive, with the reason."""
    return {"test": test, "effect": None, "interval": [None, None], "p_value": None, "n": 0,
            "verdict": "inconclusive", "reason": reason, "evidence": reason}


def not_applicable(test: str, reason: str) -> Dict[str, Any]:
    """The result of a test whose claim presumes what the data does not show (the claim that dynamic evaluation
    flattens an upward slope, on a slope that is not upward): not run, verdict "not applicable", with the reason."""
    return {**untested(test, f"not applicable: {reason}"), "verdict": NOT_APPLICABLE}


def all_of(parts: Mapping[str, Mapping[str, Any]], test: str, alpha: float = ALPHA,
           direction: int = +1) -> Dict[str, Any]:
    """Several tests that a claim needs to pass together, joined as an intersection-union test: "appears" when every
    part appears at level `alpha` (no correction is needed for that), "opposite" when a part contradicts the claim at
    level alpha / the number of parts (Bonferroni: with many parts, one reversed by chance is no finding), otherwise
    "inconclusive". `direction`: the sign of every part's effect that supports the claim (+1: positive, -1:
    negative). The effect and interval are the weakest part's (its effect least in the claim's direction), the
    p-value the largest of the parts' (the intersection-union test's), n the weakest part's. Each part's effect,
    interval, p, n and verdict are kept under "parts"."""
    direction = _check_direction(direction)
    if not parts:
        raise ValueError("all_of needs at least one part")
    verdicts = [r.get("verdict") for r in parts.values()]
    if any(r.get("effect") is None for r in parts.values()):
        missing = [k for k, r in parts.items() if r.get("effect") is None]
        reasons = "; ".join(f"{k}: {parts[k].get('reason', 'not computed')}" for k in missing)
        out = untested(test, f"a part of the test could not be computed ({reasons})")
    else:
        weakest = min(parts, key=lambda k: direction * parts[k]["effect"])
        p_values = [r.get("p_value") for r in parts.values()]
        out = {"test": test, "effect": parts[weakest]["effect"], "interval": list(parts[weakest]["interval"]),
               "p_value": None if any(p is None for p in p_values) else max(p_values), "n": parts[weakest]["n"],
               "confidence": parts[weakest].get("confidence", 0.95), "weakest": weakest,
               "verdict": ("appears" if all(v == "appears" for v in verdicts) else
                           "opposite" if any(verdict(r["effect"], r.get("p_value"), direction, alpha / len(parts)) ==
                                             "opposite" for r in parts.values()) else "inconclusive")}
    out["parts"] = {k: {key: r.get(key) for key in ("effect", "interval", "p_value", "n", "verdict")}
                    for k, r in parts.items()}
    return jsonable(out)


def _result(test: str, effect: Any, interval: Sequence[Any], p_value: Any, n: int, confidence: float, direction: int,
            alpha: float, reason: Optional[str] = None, **extra: Any) -> Dict[str, Any]:
    """A test result with its verdict; every number JSON-safe (NaN and infinity become None)."""
    effect, p_value = _finite(effect), _finite(p_value)
    low, high = (_finite(v) for v in interval)
    result: Dict[str, Any] = {"test": test, "effect": effect, "interval": [low, high], "p_value": p_value,
                              "n": int(n), "confidence": float(confidence),
                              "verdict": verdict(effect, p_value, direction, alpha)}
    if reason is not None:
        result["reason"] = reason
    elif result["verdict"] == "inconclusive" and (effect is None or p_value is None):
        result["reason"] = "the test could not be computed"
    result.update(extra)
    return jsonable(result)


def _values(values: Any, name: str) -> np.ndarray:
    """A 1-D float64 array of finite values; ValueError naming `name` otherwise."""
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1:
        raise ValueError(f"{name} must be a flat sequence of numbers, got shape {array.shape}")
    if not np.all(np.isfinite(array)):
        bad = int(np.flatnonzero(~np.isfinite(array))[0])
        raise ValueError(f"{name}[{bad}] is {array[bad]}: every value must be finite")
    return array


def _mean(x: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(x, axis=axis)


def _is_constant(x: np.ndarray) -> bool:
    return x.size == 0 or bool(np.all(x == x[0]))


def _percentile_interval(distribution: np.ndarray, confidence: float) -> Tuple[Optional[float], Optional[float]]:
    """The percentile interval of the finite values of a bootstrap distribution; (None, None) when there are none."""
    finite = distribution[np.isfinite(distribution)]
    if finite.size == 0:
        return None, None
    low, high = np.quantile(finite, [(1.0 - confidence) / 2.0, (1.0 + confidence) / 2.0])
    return float(low), float(high)


# --------------------------------------------------------------------------------------------------------------------
# Intervals of a sample's mean.


def mean_interval(values: Sequence[float], confidence: float = 0.95) -> Tuple[float, Optional[float], Optional[float]]:
    """(mean, low, high): the t-interval of the mean of `values`; (value, None, None) for a single value."""
    confidence = _check_level("confidence", confidence)
    x = _values(values, "values")
    if x.size == 0:
        raise ValueError("mean_interval needs at least one value")
    mean = float(np.mean(x))
    if x.size == 1:
        return mean, None, None
    half = float(scipy.stats.t.ppf((1.0 + confidence) / 2.0, x.size - 1) * scipy.stats.sem(x))
    return mean, mean - half, mean + half


# --------------------------------------------------------------------------------------------------------------------
# Two samples: paired items, independent samples.


def paired_difference(a: Sequence[float], b: Sequence[float], direction: int, alpha: float = ALPHA,
                      confidence: float = 0.95, n_resamples: int = 9999, seed: int = 0) -> Dict[str, Any]:
    """The mean of a - b over items measured under both conditions (e.g. per-query F1 of two models on the same
    queries). effect = mean(a - b); interval: BCa bootstrap of the mean difference (percentile above BCA_MAX_N
    pairs or where BCa cannot be computed; see "interval_method"); p_value: the two-sided sign-flip permutation
    test (exact when 2**n <= n_resamples, otherwise n_resamples random flips). Both seeded with `seed`. n = number
    of pairs."""
    direction = _check_direction(direction)
    confidence = _check_level("confidence", confidence)
    x, y = _values(a, "a"), _values(b, "b")
    if x.size != y.size:
        raise ValueError(f"a and b must hold the same items: {x.size} values in a, {y.size} in b")
    if x.size < 2:
        raise ValueError(f"a paired test needs at least 2 pairs, got {x.size}")
    d = x - y
    n = int(d.size)
    extra = {"mean_a": float(np.mean(x)), "mean_b": float(np.mean(y)),
             "stderr": float(scipy.stats.sem(d)) if not _is_constant(d) else 0.0, "n_resamples": int(n_resamples)}
    if not np.any(d):
        return _result(PAIRED_TEST, 0.0, [0.0, 0.0], 1.0, n, confidence, direction, alpha,
                       reason="every difference is 0", interval_method="none", **extra)
    effect = float(np.mean(d))
    # The p-value: flip the sign of each difference independently (for one sample, permutation_type="samples" does
    # exactly that), comparing |mean| under the flips with the observed one.
    batch = max(1, _BOOTSTRAP_CELLS // n)
    permutation = scipy.stats.permutation_test((d,), _mean, permutation_type="samples", vectorized=True,
                                               n_resamples=n_resamples, batch=batch, alternative="two-sided",
                                               rng=np.random.default_rng(seed))
    if _is_constant(d):  # the same difference for every item: every resample has that mean
        interval, method = (effect, effect), "none"
    else:
        method = "BCa" if n <= BCA_MAX_N else "percentile"
        boot = scipy.stats.bootstrap((d,), _mean, vectorized=True, n_resamples=n_resamples, batch=batch,
                                     confidence_level=confidence, method=method, rng=np.random.default_rng(seed))
        interval = (boot.confidence_interval.low, boot.confidence_interval.high)
        if _finite(interval[0]) is None or _finite(interval[1]) is None:
            interval, method = _percentile_interval(boot.bootstrap_distribution, confidence), "percentile"
    return _result(PAIRED_TEST, effect, interval, permutation.pvalue, n, confidence, direction, alpha,
                   interval_method=method, **extra)


def welch(a: Sequence[float], b: Sequence[float], direction: int, alpha: float = ALPHA,
          confidence: float = 0.95) -> Dict[str, Any]:
    """Two independent samples: effect = mean(a) - mean(b), Welch's t-test (unequal variances) for the p-value and
    its confidence interval of the difference. n = n_a + n_b."""
    direction = _check_direction(direction)
    confidence = _check_level("confidence", confidence)
    x, y = _values(a, "a"), _values(b, "b")
    mean_a = float(np.mean(x)) if x.size else None
    mean_b = float(np.mean(y)) if y.size else None
    effect = mean_a - mean_b if mean_a is not None and mean_b is not None else None
    extra = {"n_a": int(x.size), "n_b": int(y.size), "mean_a": mean_a, "mean_b": mean_b}
    reason = None
    if x.size < 2 or y.size < 2:
        reason = f"Welch's t-test needs at least 2 values in each sample (a has {x.size}, b has {y.size})"
    elif _is_constant(x) and _is_constant(y):
        reason = "both samples are constant: no spread to test the difference against"
    if reason is not None:
        return _result(WELCH_TEST, effect, [None, None], None, x.size + y.size, confidence, direction, alpha,
                       reason=reason, df=None, stderr=None, **extra)
    test = scipy.stats.ttest_ind(x, y, equal_var=False)
    ci = test.confidence_interval(confidence_level=confidence)
    stderr = math.sqrt(float(np.var(x, ddof=1)) / x.size + float(np.var(y, ddof=1)) / y.size)
    return _result(WELCH_TEST, effect, [ci.low, ci.high], test.pvalue, x.size + y.size, confidence, direction, alpha,
                   df=_finite(test.df), stderr=stderr, **extra)


# --------------------------------------------------------------------------------------------------------------------
# Trends: a slope over independent points, a slope over clustered points, a rank trend over ordered groups.


def slope(x: Sequence[float], y: Sequence[float], direction: int, alpha: float = ALPHA,
          confidence: float = 0.95) -> Dict[str, Any]:
    """The least-squares slope of y on x (effect, in y units per x unit) with the two-sided t-test on the slope
    (df = n - 2) and the interval slope +- t * stderr. The test "Mind the Gap" uses for its monthly trend."""
    direction = _check_direction(direction)
    confidence = _check_level("confidence", confidence)
    xs, ys = _values(x, "x"), _values(y, "y")
    if xs.size != ys.size:
        raise ValueError(f"x and y must be the same points: {xs.size} values in x, {ys.size} in y")
    n = int(xs.size)
    df = n - 2
    if n < 3:
        return _result(SLOPE_TEST, None, [None, None], None, n, confidence, direction, alpha,
                       reason=f"a slope test needs at least 3 points, got {n}", intercept=None, stderr=None,
                       df=None)
    if _is_constant(xs):
        return _result(SLOPE_TEST, None, [None, None], None, n, confidence, direction, alpha,
                       reason="x is constant: no slope", intercept=None, stderr=None, df=df)
    if _is_constant(ys):
        return _result(SLOPE_TEST, 0.0, [0.0, 0.0], None, n, confidence, direction, alpha,
                       reason="y is constant: the slope is 0 and the t-test is undefined", intercept=float(ys[0]),
                       stderr=0.0, df=df)
    fit = scipy.stats.linregress(xs, ys)
    half = float(scipy.stats.t.ppf((1.0 + confidence) / 2.0, df)) * float(fit.stderr)
    return _result(SLOPE_TEST, fit.slope, [fit.slope - half, fit.slope + half], fit.pvalue, n, confidence, direction,
                   alpha, intercept=_finite(fit.intercept), stderr=_finite(fit.stderr), df=df,
                   rvalue=_finite(fit.rvalue))


def _cluster_ids(clusters: Sequence[Hashable], n: int) -> Tuple[np.ndarray, List[Hashable]]:
    """Each point's cluster as an index 0..k-1 (in order of first appearance) and the k labels."""
    if len(clusters) != n:
        raise ValueError(f"clusters must name the cluster of every point: {len(clusters)} labels for {n} points")
    index: Dict[Hashable, int] = {}
    ids = np.fromiter((index.setdefault(c, len(index)) for c in clusters), dtype=np.int64, count=n)
    return ids, list(index)


def clustered_slope(x: Sequence[float], y: Sequence[float], clusters: Sequence[Hashable], direction: int,
                    alpha: float = ALPHA, confidence: float = 0.95, n_resamples: int = 2000, seed: int = 0, *,
                    min_clusters: int = MIN_CLUSTERS) -> Dict[str, Any]:
    """The least-squares slope of y on x where the points come in clusters that are not independent (one query
    scored by several experts): the interval and p-value come from a cluster bootstrap that resamples whole clusters
    with replacement and refits the slope. Percentile interval; p = 2 * min(share of slopes <= 0, share >= 0),
    floored at 1 / (resamples used + 1). Resamples whose x is constant have no slope and are left out (counted in
    "n_degenerate_resamples"). Fewer than `min_clusters` clusters (at least 2) give no p-value: inconclusive with a
    "reason". n = number of clusters; "n_points" the points."""
    direction = _check_direction(direction)
    confidence = _check_level("confidence", confidence)
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be at least 1, got {n_resamples}")
    xs, ys = _values(x, "x"), _values(y, "y")
    if xs.size != ys.size:
        raise ValueError(f"x and y must be the same points: {xs.size} values in x, {ys.size} in y")
    ids, labels = _cluster_ids(clusters, xs.size)
    k, n_points = len(labels), int(xs.size)
    extra = {"n_points": n_points, "n_resamples": int(n_resamples)}

    def inconclusive(effect, reason):
        return _result(CLUSTERED_SLOPE_TEST, effect, [None, None], None, k, confidence, direction, alpha,
                       reason=reason, intercept=None, stderr=None, n_degenerate_resamples=None, **extra)

    if n_points < 3:
        return inconclusive(None, f"a slope test needs at least 3 points, got {n_points}")
    if _is_constant(xs):
        return inconclusive(None, "x is constant: no slope")
    fit = scipy.stats.linregress(xs, ys)
    effect = _finite(fit.slope)
    if k < max(2, min_clusters):
        return inconclusive(effect, f"a cluster bootstrap needs at least {max(2, min_clusters)} clusters, got {k}")

    # Per-cluster sums of the centred points: a resample's slope follows from how often it draws each cluster.
    xc, yc = xs - xs.mean(), ys - ys.mean()
    sums = np.stack([np.bincount(ids, weights=w, minlength=k)
                     for w in (np.ones_like(xc), xc, yc, xc * xc, xc * yc)], axis=1)  # [k, 5]
    rng = np.random.default_rng(seed)
    slopes = np.empty(n_resamples)
    step = max(1, _BOOTSTRAP_CELLS // k)
    for start in range(0, n_resamples, step):
        rows = min(step, n_resamples - start)
        draws = rng.integers(0, k, size=(rows, k)) + k * np.arange(rows)[:, None]
        counts = np.bincount(draws.ravel(), minlength=rows * k).reshape(rows, k).astype(np.float64)
        w, sx, sy, sxx, sxy = (counts @ sums).T
        sxx_c = w * sxx - sx * sx  # = w * sum of squared deviations of x in the resample
        with np.errstate(divide="ignore", invalid="ignore"):
            slopes[start:start + rows] = np.where(sxx_c > 1e-12 * w * sxx, (w * sxy - sx * sy) / sxx_c, np.nan)
    valid = slopes[np.isfinite(slopes)]
    extra["n_degenerate_resamples"] = int(n_resamples - valid.size)
    if valid.size == 0:
        return _result(CLUSTERED_SLOPE_TEST, effect, [None, None], None, k, confidence, direction, alpha,
                       reason="no resample of the clusters had a varying x", intercept=_finite(fit.intercept),
                       stderr=None, **extra)
    share = min(float(np.mean(valid <= 0.0)), float(np.mean(valid >= 0.0)))
    p_value = min(1.0, max(2.0 * share, 1.0 / (valid.size + 1)))
    return _result(CLUSTERED_SLOPE_TEST, effect, _percentile_interval(valid, confidence), p_value, k, confidence,
                   direction, alpha, intercept=_finite(fit.intercept),
                   stderr=float(np.std(valid, ddof=1)) if valid.size > 1 else None, **extra)


def _spearman_along_last_axis(positions: np.ndarray):
    """statistic(*groups, axis=-1) for scipy.stats.bootstrap: Spearman's rho between each item's group position and
    its value, over resampled groups (ties get average ranks; NaN where the values are all equal)."""
    position_ranks = scipy.stats.rankdata(positions)
    position_ranks = position_ranks - position_ranks.mean()

    def statistic(*groups: np.ndarray, axis: int = -1) -> np.ndarray:
        values = np.concatenate([np.moveaxis(g, axis, -1) for g in groups], axis=-1)
        ranks = scipy.stats.rankdata(values, axis=-1)
        ranks = ranks - ranks.mean(axis=-1, keepdims=True)
        with np.errstate(divide="ignore", invalid="ignore"):
            return (ranks @ position_ranks) / (np.sqrt(np.sum(ranks * ranks, axis=-1))
                                               * np.sqrt(position_ranks @ position_ranks))

    return statistic


def rank_trend(values_by_group: Mapping[Hashable, Sequence[float]], order: Sequence[Hashable], direction: int,
               alpha: float = ALPHA, confidence: float = 0.95, n_resamples: int = 2000,
               seed: int = 0) -> Dict[str, Any]:
    """Do the values rise (direction +1) or fall (-1) along `order`, the groups from lowest to highest expected rank
    (e.g. ("never", "rare", "frequent"))? effect = Spearman's rho between each item's position in `order` and its
    value, p-value from scipy.stats.spearmanr; the interval is a percentile bootstrap that resamples items within
    each group (seeded). Extra: "group_means" and "group_intervals" (t-interval of each group's mean), "n_by_group".
    Groups of values_by_group not in `order` are left out and listed in "ignored_groups". n = number of items."""
    direction = _check_direction(direction)
    confidence = _check_level("confidence", confidence)
    order = list(order)
    if len(order) < 2 or len(set(order)) != len(order):
        raise ValueError(f"order must list at least 2 distinct groups, got {order!r}")
    groups = {g: _values(values_by_group[g], f"values_by_group[{g!r}]") for g in order if g in values_by_group}
    group_means, group_intervals = {}, {}
    for g, v in groups.items():
        if v.size:
            mean, low, high = mean_interval(v, confidence)
            group_means[g], group_intervals[g] = mean, [low, high]
    extra: Dict[str, Any] = {"order": order, "n_by_group": {g: int(v.size) for g, v in groups.items()},
                             "group_means": group_means, "group_intervals": group_intervals}
    ignored = [g for g in values_by_group if g not in order]
    if ignored:
        extra["ignored_groups"] = ignored
    n = int(sum(v.size for v in groups.values()))
    missing = [g for g in order if g not in groups]
    small = [g for g in order if g in groups and groups[g].size < 2]
    reason = None
    if missing:
        reason = f"no values for the group(s) {', '.join(map(str, missing))}"
    elif small:
        reason = f"fewer than 2 values in the group(s) {', '.join(map(str, small))}"
    elif _is_constant(np.concatenate(list(groups.values()))):
        reason = "every value is the same: no ranks to correlate"
    if reason is not None:
        return _result(RANK_TREND_TEST, None, [None, None], None, n, confidence, direction, alpha, reason=reason,
                       **extra)

    samples = tuple(groups[g] for g in order)
    positions = np.concatenate([np.full(v.size, i, dtype=np.float64) for i, v in enumerate(samples)])
    values = np.concatenate(samples)
    rho, p_value = scipy.stats.spearmanr(positions, values)
    statistic = _spearman_along_last_axis(positions)
    boot = scipy.stats.bootstrap(samples, statistic, vectorized=True, paired=False, n_resamples=n_resamples,
                                 batch=max(1, _BOOTSTRAP_CELLS // n), method="percentile",
                                 confidence_level=confidence, rng=np.random.default_rng(seed))
    interval = _percentile_interval(boot.bootstrap_distribution, confidence)
    return _result(RANK_TREND_TEST, rho, interval, p_value, n, confidence, direction, alpha,
                   n_resamples=int(n_resamples), **extra)


# --------------------------------------------------------------------------------------------------------------------
# One sample, and several seeds of one finding.


def one_sample(values: Sequence[float], direction: int, alpha: float = ALPHA, confidence: float = 0.95,
               test_name: Optional[str] = None) -> Dict[str, Any]:
    """The mean of `values` against 0 with a one-sample t-test (and its t-interval). Used over per-seed effects.
    n = number of values; one value (or values all equal) gives no test: inconclusive with a "reason"."""
    direction = _check_direction(direction)
    confidence = _check_level("confidence", confidence)
    name = test_name or ONE_SAMPLE_TEST
    x = _values(values, "values")
    n = int(x.size)
    if n == 0:
        return _result(name, None, [None, None], None, 0, confidence, direction, alpha, reason="no values",
                       stderr=None, df=None)
    if n == 1:
        return _result(name, x[0], [None, None], None, 1, confidence, direction, alpha, reason="one value",
                       stderr=None, df=None)
    if _is_constant(x):
        return _result(name, x[0], [None, None], None, n, confidence, direction, alpha,
                       reason="every value is the same: no spread to test the mean against", stderr=0.0, df=n - 1)
    test = scipy.stats.ttest_1samp(x, 0.0)
    ci = test.confidence_interval(confidence_level=confidence)
    return _result(name, np.mean(x), [ci.low, ci.high], test.pvalue, n, confidence, direction, alpha,
                   stderr=float(scipy.stats.sem(x)), df=int(test.df))


def _seed_summary(result: Mapping[str, Any]) -> Dict[str, Any]:
    interval = result.get("interval") or [None, None]
    return {"effect": _finite(result.get("effect")), "interval": [_finite(v) for v in interval],
            "p_value": _finite(result.get("p_value")), "n": result.get("n"), "verdict": result.get("verdict")}


def combine_seeds(per_seed: Sequence[Mapping[str, Any]], direction: int, alpha: float = ALPHA,
                  confidence: float = 0.95) -> Dict[str, Any]:
    """One finding measured on several seeds: a one-sample t-test over the per-seed effects (`one_sample`), with the
    per-seed results kept, reduced to effect, interval, p_value, n and verdict, under "per_seed". Seeds whose effect
    is None (untested, or not applicable there) are left out and counted in "missing_seeds"; a claim not applicable
    on every seed is not applicable over them, and one tested on no seed (a stage --skip left out) is untested over
    them, with the first seed's reason. A single seed's result is returned as it is (plus "per_seed")."""
    direction = _check_direction(direction)
    per_seed = list(per_seed)
    if not per_seed:
        raise ValueError("combine_seeds needs the result of at least one seed")
    summaries = [_seed_summary(r) for r in per_seed]
    if len(per_seed) > 1 and all(s["verdict"] == NOT_APPLICABLE for s in summaries):
        reason = per_seed[0].get("reason") or "not applicable"
        reason = reason.replace("not applicable: ", "")
        result = not_applicable(per_seed[0].get("test") or "", f"on every seed ({reason})")
        result["per_seed"] = summaries
        return result
    if len(per_seed) > 1 and all(s["effect"] is None for s in summaries):
        reasons = [r.get("reason") or "not tested" for r in per_seed]
        reason = reasons[0] if len(set(reasons)) == 1 else f"on no seed (seed 1 of {len(reasons)}: {reasons[0]})"
        result = untested(per_seed[0].get("test") or "", reason)
        result["per_seed"] = summaries
        return result
    if len(per_seed) == 1:
        single = jsonable(dict(per_seed[0]))
        single["per_seed"] = summaries
        return single
    effects = [s["effect"] for s in summaries if s["effect"] is not None]
    seeds = "1 seed" if len(effects) == 1 else f"{len(effects)} seeds"
    result = one_sample(effects, direction, alpha, confidence,
                        test_name=f"one-sample t-test over the per-seed effects ({seeds})")
    result["per_seed_test"] = per_seed[0].get("test")
    result["missing_seeds"] = len(summaries) - len(effects)
    result["per_seed"] = summaries
    return result


def describe(result: Mapping[str, Any], unit: str = "", digits: int = 2) -> str:
    """A test result in one line for the evidence of a finding: `+3.10 F1 [+1.20, +5.00], p=0.002, n=412`."""
    def signed(x: Any) -> str:
        return "n/a" if x is None else f"{x:+.{digits}f}"

    low, high = (list(result.get("interval") or []) + [None, None])[:2]
    p = result.get("p_value")
    return (f"{signed(result.get('effect'))}{(' ' + unit) if unit else ''} [{signed(low)}, {signed(high)}], "
            f"p={'n/a' if p is None else f'{p:.3g}'}, n={result.get('n')}")
