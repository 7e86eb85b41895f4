"""Statistical tests (templm/metrics/statistics.py): constructed samples whose answer is known, p-values against
scipy's own functions, hand-enumerated permutation p-values, degenerate inputs, determinism and JSON safety."""

import json
import math

import numpy as np
import pytest
import scipy.stats

from templm.metrics import statistics as st

FAST = 499  # resamples for the bootstrap tests where the exact number does not matter


def rng(seed=0):
    return np.random.default_rng(seed)


def assert_json_safe(value):
    """Plain Python JSON types only, every float finite; json.dumps(allow_nan=False) accepts it."""
    json.dumps(value, allow_nan=False)

    def walk(v):
        if isinstance(v, dict):
            assert all(type(k) is str for k in v), v
            for item in v.values():
                walk(item)
        elif isinstance(v, list):
            for item in v:
                walk(item)
        else:
            assert v is None or type(v) in (str, bool, int, float), (type(v), v)
            if type(v) is float:
                assert math.isfinite(v), v

    walk(value)


def assert_shape(result, *, n=None):
    assert set(result) >= {"test", "effect", "interval", "p_value", "n", "confidence", "verdict"}
    assert result["verdict"] in st.VERDICTS
    assert isinstance(result["interval"], list) and len(result["interval"]) == 2
    if n is not None:
        assert result["n"] == n
    if result["p_value"] is not None:
        assert 0.0 < result["p_value"] <= 1.0
    low, high = result["interval"]
    if low is not None and result["effect"] is not None:
        assert low - 1e-9 <= result["effect"] <= high + 1e-9
    assert_json_safe(result)


def assert_no_test(result, effect="any"):
    """A degenerate input: inconclusive, no p-value, no interval, and a reason."""
    assert result["verdict"] == "inconclusive"
    assert result["p_value"] is None
    assert result["interval"] == [None, None]
    assert result["reason"]
    if effect != "any":
        assert result["effect"] == effect
    assert_json_safe(result)


# --------------------------------------------------------------------------------------------------------------------
# verdict()


@pytest.mark.parametrize("effect, p, direction, expected", [
    (0.5, 0.01, 1, "appears"), (-0.5, 0.01, -1, "appears"),
    (-0.5, 0.01, 1, "opposite"), (0.5, 0.01, -1, "opposite"),
    (0.5, 0.05, 1, "inconclusive"),  # p == alpha does not reject
    (0.5, 0.0499999, 1, "appears"),
    (0.5, 0.2, 1, "inconclusive"), (-0.5, 0.2, 1, "inconclusive"),
    (0.0, 0.001, 1, "inconclusive"), (-0.0, 0.001, -1, "inconclusive"),  # a tie has no sign
    (None, 0.001, 1, "inconclusive"), (0.5, None, 1, "inconclusive"),
    (float("nan"), 0.001, 1, "inconclusive"), (0.5, float("nan"), 1, "inconclusive"),
    (float("inf"), 0.001, 1, "inconclusive"),
    (np.float64(0.3), np.float64(0.001), 1, "appears"),
])
def test_verdict(effect, p, direction, expected):
    assert st.verdict(effect, p, direction) == expected


def test_verdict_alpha_and_bad_arguments():
    assert st.verdict(1.0, 0.03, 1, alpha=0.01) == "inconclusive"
    assert st.verdict(1.0, 0.03, 1, alpha=0.05) == "appears"
    assert st.ALPHA == 0.05 and st.VERDICTS == ("appears", "opposite", "inconclusive", "not applicable")
    for direction in (0, 2, True, "+"):
        with pytest.raises(ValueError):
            st.verdict(1.0, 0.01, direction)
    with pytest.raises(ValueError):
        st.verdict(1.0, 0.01, 1, alpha=1.5)


# --------------------------------------------------------------------------------------------------------------------
# paired_difference


def per_query_f1(mean_b=50.0, difference=0.0, noise=10.0, n=50, seed=0):
    """Two models' per-query F1 on the same n queries: b spread over 0..100 with mean exactly `mean_b`, a = b plus
    per-query noise centred so that mean(a) - mean(b) is exactly `difference`."""
    r = rng(seed)
    b = r.uniform(0.0, 100.0, n)
    b = b - b.mean() + mean_b
    e = r.normal(0.0, noise, n)
    a = b + (e - e.mean()) + difference
    return a, b


def test_paired_a_hundredth_of_f1_over_50_queries_is_inconclusive():
    # The case of issue 15: 50.01 vs 50.00 over the same 50 queries is not a finding in either direction.
    a, b = per_query_f1(50.0, 0.01)
    assert np.mean(a) == pytest.approx(50.01) and np.mean(b) == pytest.approx(50.00)
    for direction in (1, -1):
        r = st.paired_difference(a, b, direction)
        assert_shape(r, n=50)
        assert r["verdict"] == "inconclusive"
        assert r["effect"] == pytest.approx(0.01)
        assert r["p_value"] > 0.5
        assert r["interval"][0] < 0.0 < r["interval"][1]
        assert r["mean_a"] == pytest.approx(50.01) and r["mean_b"] == pytest.approx(50.0)


def test_paired_ten_f1_over_50_queries_appears_and_its_mirror_is_opposite():
    a, b = per_query_f1(45.0, 10.0, noise=10.0)
    up = st.paired_difference(a, b, 1)
    assert_shape(up, n=50)
    assert up["verdict"] == "appears" and up["effect"] == pytest.approx(10.0)
    assert up["p_value"] == pytest.approx(2 / 10000)  # no flip reaches the observed mean: the floor of 9999 flips
    assert up["interval"][0] > 5.0 and up["interval"][1] < 15.0
    assert st.paired_difference(a, b, -1)["verdict"] == "opposite"
    down = st.paired_difference(b, a, -1)  # the mirror: b - a is -10, claimed negative
    assert down["verdict"] == "appears" and down["effect"] == pytest.approx(-10.0)
    assert down["interval"] == pytest.approx([-up["interval"][1], -up["interval"][0]], abs=1.0)
    assert st.paired_difference(b, a, 1)["verdict"] == "opposite"


def test_paired_exact_sign_flip_p_value_by_hand():
    # 2**5 = 32 sign patterns; only all-plus and all-minus reach |mean| >= 3: p = 2/32, not significant although
    # every difference is positive. With 6 pairs: 2/64 < 0.05.
    r = st.paired_difference([1, 2, 3, 4, 5], [0, 0, 0, 0, 0], 1)
    assert r["p_value"] == pytest.approx(2 / 32) and r["verdict"] == "inconclusive" and r["effect"] == 3.0
    r6 = st.paired_difference([1, 2, 3, 4, 5, 6], [0] * 6, 1)
    assert r6["p_value"] == pytest.approx(2 / 64) and r6["verdict"] == "appears"
    # One negative difference: patterns with |mean| >= observed (sum 13 of total 15): flips of nothing or of the
    # 1 only (sums 15, 13) on each side: 4 of 32.
    r = st.paired_difference([-1, 2, 3, 4, 5], [0] * 5, 1)
    assert r["p_value"] == pytest.approx(4 / 32)


def test_paired_interval_contains_the_true_difference():
    # Population difference 2.0; a sample of 200 pairs with noise sd 3: the 95% interval covers 2.
    r_ = rng(7)
    b = r_.normal(10.0, 5.0, 200)
    a = b + 2.0 + r_.normal(0.0, 3.0, 200)
    r = st.paired_difference(a, b, 1, n_resamples=FAST)
    assert r["interval"][0] < 2.0 < r["interval"][1]
    assert r["interval_method"] == "BCa"
    # Its width is close to the normal-theory one, 2 * 1.96 * sd / sqrt(n).
    width = 2 * 1.96 * np.std(a - b, ddof=1) / math.sqrt(200)
    assert r["interval"][1] - r["interval"][0] == pytest.approx(width, rel=0.25)
    assert r["stderr"] == pytest.approx(scipy.stats.sem(a - b))


def test_paired_is_seeded_and_repeats_exactly():
    a, b = per_query_f1(50.0, 1.5, seed=3)
    first = st.paired_difference(a, b, 1, n_resamples=FAST, seed=5)
    assert st.paired_difference(a, b, 1, n_resamples=FAST, seed=5) == first
    assert st.paired_difference(list(a), list(b), 1, n_resamples=FAST, seed=5) == first
    other = st.paired_difference(a, b, 1, n_resamples=FAST, seed=6)
    assert other["interval"] != first["interval"]
    assert other["effect"] == first["effect"]


def test_paired_degenerate_cases():
    r = st.paired_difference([0.3, 0.5, 0.9], [0.3, 0.5, 0.9], 1)
    assert r["effect"] == 0.0 and r["interval"] == [0.0, 0.0] and r["p_value"] == 1.0
    assert r["verdict"] == "inconclusive" and r["reason"]
    assert_json_safe(r)
    # The same non-zero difference on every item: the interval collapses, the sign-flip test still answers.
    r = st.paired_difference([2.0] * 8, [1.0] * 8, 1)
    assert r["effect"] == 1.0 and r["interval"] == [1.0, 1.0] and r["p_value"] == pytest.approx(2 / 256)
    assert r["verdict"] == "appears"
    with pytest.raises(ValueError, match="same items"):
        st.paired_difference([1, 2, 3], [1, 2], 1)
    with pytest.raises(ValueError, match="at least 2 pairs"):
        st.paired_difference([1], [2], 1)
    with pytest.raises(ValueError, match="finite"):
        st.paired_difference([1, float("nan")], [2, 3], 1)
    with pytest.raises(ValueError, match="direction"):
        st.paired_difference([1, 2], [2, 3], 0)


# --------------------------------------------------------------------------------------------------------------------
# welch


def test_welch_matches_scipy_and_gives_the_three_verdicts():
    r_ = rng(1)
    a, b = r_.normal(5.0, 1.0, 30), r_.normal(3.0, 2.0, 40)
    r = st.welch(a, b, 1)
    assert_shape(r, n=70)
    ref = scipy.stats.ttest_ind(a, b, equal_var=False)
    ci = ref.confidence_interval(0.95)
    assert r["p_value"] == pytest.approx(ref.pvalue) and r["df"] == pytest.approx(ref.df)
    assert r["interval"] == pytest.approx([ci.low, ci.high])
    assert r["effect"] == pytest.approx(np.mean(a) - np.mean(b))
    assert (r["n_a"], r["n_b"]) == (30, 40) and r["mean_a"] == pytest.approx(np.mean(a))
    assert r["interval"][0] < 2.0 < r["interval"][1]  # the true difference
    assert r["verdict"] == "appears"
    assert st.welch(a, b, -1)["verdict"] == "opposite"
    assert st.welch(b, a, -1)["verdict"] == "appears"
    same = st.welch(r_.normal(0, 1, 30), r_.normal(0.01, 1, 30), 1)
    assert same["verdict"] == "inconclusive"
    wide = st.welch(a, b, 1, confidence=0.99)
    assert wide["confidence"] == 0.99 and wide["interval"][0] < r["interval"][0]


def test_welch_degenerate_cases():
    r = st.welch([1.0], [2.0, 3.0], 1)
    assert_no_test(r, effect=-1.5)
    assert "at least 2" in r["reason"] and r["n"] == 3
    r = st.welch([], [2.0, 3.0], 1)
    assert_no_test(r, effect=None)
    assert r["mean_a"] is None
    r = st.welch([1.0, 1.0], [2.0, 2.0], -1)
    assert_no_test(r, effect=-1.0)
    assert "constant" in r["reason"]


# --------------------------------------------------------------------------------------------------------------------
# slope


def test_slope_matches_linregress_and_contains_the_true_slope():
    r_ = rng(2)
    x = np.arange(24.0)  # e.g. months
    y = 30.0 + 0.5 * x + r_.normal(0.0, 1.0, 24)
    r = st.slope(x, y, 1)
    assert_shape(r, n=24)
    fit = scipy.stats.linregress(x, y)
    assert r["effect"] == pytest.approx(fit.slope) and r["p_value"] == pytest.approx(fit.pvalue)
    assert r["intercept"] == pytest.approx(fit.intercept) and r["stderr"] == pytest.approx(fit.stderr)
    assert r["df"] == 22
    t = scipy.stats.t.ppf(0.975, 22)
    assert r["interval"] == pytest.approx([fit.slope - t * fit.stderr, fit.slope + t * fit.stderr])
    assert r["interval"][0] < 0.5 < r["interval"][1]
    assert r["verdict"] == "appears"
    assert st.slope(x, y, -1)["verdict"] == "opposite"
    assert st.slope(x, -y, -1)["verdict"] == "appears"
    flat = st.slope(x, 30.0 + r_.normal(0.0, 1.0, 24), 1)
    assert flat["verdict"] == "inconclusive" and flat["interval"][0] < 0.0 < flat["interval"][1]


def test_slope_degenerate_cases():
    assert_no_test(st.slope([1, 2], [3, 4], 1), effect=None)
    r = st.slope([3, 3, 3, 3], [1, 2, 3, 4], 1)
    assert_no_test(r, effect=None)
    assert "x is constant" in r["reason"]
    r = st.slope([1, 2, 3, 4], [5, 5, 5, 5], 1)
    assert r["effect"] == 0.0 and r["p_value"] is None and r["verdict"] == "inconclusive" and r["reason"]
    assert_json_safe(r)
    exact = st.slope([1, 2, 3, 4], [2, 4, 6, 8], 1)  # a perfect line: zero stderr, the interval collapses
    assert exact["effect"] == pytest.approx(2.0) and exact["interval"] == pytest.approx([2.0, 2.0])
    assert exact["verdict"] == "appears"
    assert_json_safe(exact)
    with pytest.raises(ValueError):
        st.slope([1, 2, 3], [1, 2], 1)


# --------------------------------------------------------------------------------------------------------------------
# clustered_slope


def clustered_points(n_clusters, slope_, cluster_sd, noise_sd, seed, per_cluster=5):
    """Queries (clusters) each scored at year gaps 0..per_cluster-1; every query has its own level (cluster_sd)."""
    r_ = rng(seed)
    x = np.tile(np.arange(float(per_cluster)), n_clusters)
    clusters = np.repeat([f"q{i}" for i in range(n_clusters)], per_cluster)
    level = np.repeat(r_.normal(0.0, cluster_sd, n_clusters), per_cluster)
    y = 60.0 + slope_ * x + level + r_.normal(0.0, noise_sd, x.size)
    return x, y, clusters


def test_clustered_slope_verdicts_and_interval():
    x, y, c = clustered_points(30, -2.0, 10.0, 2.0, seed=3)
    r = st.clustered_slope(x, y, c, -1, n_resamples=FAST)
    assert_shape(r, n=30)
    assert r["n_points"] == 150 and r["n_degenerate_resamples"] == 0
    assert r["effect"] == pytest.approx(scipy.stats.linregress(x, y).slope)
    assert r["interval"][0] < -2.0 < r["interval"][1]
    assert r["verdict"] == "appears" and r["p_value"] == pytest.approx(1 / (FAST + 1))
    assert st.clustered_slope(x, y, c, 1, n_resamples=FAST)["verdict"] == "opposite"
    x0, y0, c0 = clustered_points(30, 0.0, 10.0, 2.0, seed=4)
    flat = st.clustered_slope(x0, y0, c0, -1, n_resamples=FAST)
    assert flat["verdict"] == "inconclusive" and flat["interval"][0] < 0.0 < flat["interval"][1]


def test_clustered_slope_is_wider_than_the_naive_one_when_clusters_disagree():
    # Six queries with their own slopes (three rise, three fall; mean +0.32) scored at 20 year gaps, no noise: 120
    # points look like a clear rise to a test that takes them as independent (p ~ 0.006), but six clusters that
    # disagree are no finding.
    x = np.tile(np.arange(20.0), 6)
    c = np.repeat(np.arange(6), 20)
    y = np.repeat([1.2, -0.5, 1.0, -0.4, 0.9, -0.3], 20) * x + np.repeat([0.0, 5.0, -3.0, 2.0, 1.0, -1.0], 20)
    naive = st.slope(x, y, 1)
    clustered = st.clustered_slope(x, y, c, 1, n_resamples=FAST)
    assert clustered["effect"] == pytest.approx(naive["effect"])
    assert naive["verdict"] == "appears" and clustered["verdict"] == "inconclusive"
    assert clustered["p_value"] > naive["p_value"]
    assert clustered["interval"][1] - clustered["interval"][0] > naive["interval"][1] - naive["interval"][0]


def test_clustered_slope_with_one_point_per_cluster_tracks_the_ordinary_slope():
    r_ = rng(9)
    x = r_.uniform(0, 10, 80)
    y = 1.5 * x + r_.normal(0, 4, 80)
    clustered = st.clustered_slope(x, y, range(80), 1, n_resamples=FAST)
    naive = st.slope(x, y, 1)
    assert clustered["interval"] == pytest.approx(naive["interval"], abs=0.15)
    assert clustered["stderr"] == pytest.approx(naive["stderr"], rel=0.3)


def test_clustered_slope_is_seeded_and_keeps_whole_clusters():
    x, y, c = clustered_points(12, 1.0, 3.0, 1.0, seed=5)
    first = st.clustered_slope(x, y, c, 1, n_resamples=FAST, seed=1)
    assert st.clustered_slope(x, y, list(c), 1, n_resamples=FAST, seed=1) == first
    assert st.clustered_slope(x, y, c, 1, n_resamples=FAST, seed=2)["interval"] != first["interval"]
    # Cluster labels are names only: other labels with the same grouping give the same result.
    relabelled = [{"q%d" % i: (i * 7) % 13 for i in range(12)}[v] for v in c]
    assert st.clustered_slope(x, y, relabelled, 1, n_resamples=FAST, seed=1) == first


def test_clustered_slope_degenerate_cases():
    # Each cluster sits at one x: resamples that draw a single cluster have no slope and are left out.
    x = [0.0, 0.0, 1.0, 1.0, 2.0, 2.0]
    y = [1.0, 1.2, 2.0, 2.2, 3.1, 2.9]
    r = st.clustered_slope(x, y, [0, 0, 1, 1, 2, 2], 1, n_resamples=FAST, min_clusters=3)
    assert 0 < r["n_degenerate_resamples"] < FAST
    assert r["p_value"] == pytest.approx(1 / (FAST - r["n_degenerate_resamples"] + 1))  # every valid slope > 0
    assert_shape(r, n=3)
    # Fewer clusters than MIN_CLUSTERS: no p-value. Two clusters at two x would otherwise "appear" with the smallest
    # p there is, since every resample that has a slope has the same one.
    few = st.clustered_slope([0, 0, 1, 1], [1, 2, 3, 4], [0, 0, 1, 1], 1, n_resamples=FAST)
    assert_no_test(few, effect=pytest.approx(2.0))
    assert f"at least {st.MIN_CLUSTERS} clusters" in few["reason"] and few["n"] == 2
    assert st.clustered_slope([0, 0, 1, 1], [1, 2, 3, 4], [0, 0, 1, 1], 1, n_resamples=FAST,
                              min_clusters=2)["verdict"] == "appears"
    assert_no_test(st.clustered_slope([1, 1, 1], [1, 2, 3], [0, 1, 2], 1), effect=None)
    assert_no_test(st.clustered_slope([1, 2], [1, 2], [0, 1], 1), effect=None)
    one = st.clustered_slope([1, 2, 3], [1, 2, 4], ["a", "a", "a"], 1, min_clusters=1)
    assert_no_test(one)
    assert one["effect"] == pytest.approx(1.5) and "at least 2 clusters" in one["reason"] and one["n"] == 1
    with pytest.raises(ValueError, match="clusters"):
        st.clustered_slope([1, 2, 3], [1, 2, 3], [0, 1], 1)


# --------------------------------------------------------------------------------------------------------------------
# rank_trend

ORDER = ("never", "rare", "frequent")


def test_rank_trend_rising_falling_and_flat():
    r_ = rng(11)
    rising = {"never": r_.normal(0.2, 0.1, 25), "rare": r_.normal(0.4, 0.1, 25), "frequent": r_.normal(0.6, 0.1, 25)}
    r = st.rank_trend(rising, ORDER, 1, n_resamples=FAST)
    assert_shape(r, n=75)
    positions = np.repeat([0, 1, 2], 25)
    ref = scipy.stats.spearmanr(positions, np.concatenate([rising[g] for g in ORDER]))
    assert r["effect"] == pytest.approx(ref.statistic) and r["p_value"] == pytest.approx(ref.pvalue)
    assert r["verdict"] == "appears"
    assert st.rank_trend(rising, ORDER, -1, n_resamples=FAST)["verdict"] == "opposite"
    assert st.rank_trend(rising, ORDER[::-1], -1, n_resamples=FAST)["verdict"] == "appears"
    assert r["group_means"] == pytest.approx({g: float(np.mean(v)) for g, v in rising.items()})
    for g in ORDER:
        _, low, high = st.mean_interval(rising[g])
        assert r["group_intervals"][g] == pytest.approx([low, high])
    assert r["n_by_group"] == {g: 25 for g in ORDER}
    flat = {g: r_.normal(0.5, 0.1, 25) for g in ORDER}
    f = st.rank_trend(flat, ORDER, 1, n_resamples=FAST)
    assert f["verdict"] == "inconclusive" and f["interval"][0] < 0.0 < f["interval"][1]


def test_rank_trend_bootstrap_interval_and_determinism():
    r_ = rng(12)
    data = {g: r_.normal(m, 0.3, 15) for g, m in zip(ORDER, (0.0, 0.2, 0.4))}
    first = st.rank_trend(data, ORDER, 1, n_resamples=FAST, seed=3)
    assert st.rank_trend({g: list(v) for g, v in data.items()}, list(ORDER), 1, n_resamples=FAST, seed=3) == first
    assert st.rank_trend(data, ORDER, 1, n_resamples=FAST, seed=4)["interval"] != first["interval"]
    # Groups whose values do not overlap: rho is below 1 only for the ties of the positions (0.956 here), and a
    # resample can only raise it (to 1 when each group draws one value twice), so the interval is [0.956, 1].
    ordered = {"never": [0.1, 0.2], "rare": [0.3, 0.4], "frequent": [0.5, 0.6]}
    perfect = st.rank_trend(ordered, ORDER, 1, n_resamples=FAST)
    assert perfect["effect"] == pytest.approx(scipy.stats.spearmanr([0, 0, 1, 1, 2, 2], [1, 2, 3, 4, 5, 6]).statistic)
    assert perfect["interval"] == pytest.approx([perfect["effect"], 1.0])


def test_rank_trend_degenerate_cases():
    r = st.rank_trend({"never": [0.1, 0.2], "rare": [0.3, 0.4]}, ORDER, 1)
    assert_no_test(r, effect=None)
    assert "frequent" in r["reason"] and r["group_means"]["never"] == pytest.approx(0.15)
    r = st.rank_trend({"never": [0.1, 0.2], "rare": [0.3], "frequent": [0.5, 0.6]}, ORDER, 1)
    assert_no_test(r, effect=None)
    assert "rare" in r["reason"] and r["group_intervals"]["rare"] == [None, None]
    r = st.rank_trend({g: [0.5, 0.5] for g in ORDER}, ORDER, 1)
    assert_no_test(r, effect=None)
    r = st.rank_trend({"never": [0, 1], "rare": [1, 2], "frequent": [2, 3], "other": [9, 9]}, ORDER, 1,
                      n_resamples=FAST)
    assert r["ignored_groups"] == ["other"] and r["n"] == 6
    with pytest.raises(ValueError):
        st.rank_trend({"never": [1, 2]}, ("never",), 1)
    with pytest.raises(ValueError):
        st.rank_trend({"never": [1, 2]}, ("never", "never"), 1)


# --------------------------------------------------------------------------------------------------------------------
# one_sample, combine_seeds, mean_interval


def test_one_sample_matches_scipy():
    values = [0.8, 1.1, 0.95, 1.3, 0.7]
    r = st.one_sample(values, 1)
    ref = scipy.stats.ttest_1samp(values, 0.0)
    ci = ref.confidence_interval(0.95)
    assert_shape(r, n=5)
    assert r["effect"] == pytest.approx(np.mean(values)) and r["p_value"] == pytest.approx(ref.pvalue)
    assert r["interval"] == pytest.approx([ci.low, ci.high]) and r["df"] == 4
    assert r["verdict"] == "appears" and r["test"] == st.ONE_SAMPLE_TEST
    assert st.one_sample(values, -1)["verdict"] == "opposite"
    assert st.one_sample([-v for v in values], -1)["verdict"] == "appears"
    assert st.one_sample([0.5, -0.4, 0.2, -0.3], 1)["verdict"] == "inconclusive"
    assert st.one_sample(values, 1, test_name="custom")["test"] == "custom"


def test_one_sample_degenerate_cases():
    r = st.one_sample([0.4], 1)
    assert_no_test(r, effect=0.4)
    assert r["reason"] == "one value" and r["n"] == 1
    r = st.one_sample([0.4, 0.4, 0.4], 1)
    assert_no_test(r, effect=0.4)
    assert_no_test(st.one_sample([], 1), effect=None)


def seed_result(effect, p=0.01, n=50):
    interval = [None, None] if effect is None else [effect - 0.5, effect + 0.5]
    return {"test": st.PAIRED_TEST, "effect": effect, "interval": interval, "p_value": p,
            "n": n, "confidence": 0.95, "verdict": st.verdict(effect, p, 1), "mean_a": 1.0, "mean_b": 0.0}


def test_combine_seeds():
    seeds = [seed_result(e) for e in (1.0, 1.2, 0.9)]
    r = st.combine_seeds(seeds, 1)
    ref = scipy.stats.ttest_1samp([1.0, 1.2, 0.9], 0.0)
    assert_shape(r, n=3)
    assert r["test"] == "one-sample t-test over the per-seed effects (3 seeds)"
    assert r["effect"] == pytest.approx(1.0333333) and r["p_value"] == pytest.approx(ref.pvalue)
    assert r["verdict"] == "appears" and r["missing_seeds"] == 0 and r["per_seed_test"] == st.PAIRED_TEST
    assert r["per_seed"][1] == {"effect": 1.2, "interval": [0.7, 1.7], "p_value": 0.01, "n": 50, "verdict": "appears"}
    assert st.combine_seeds(seeds, -1)["verdict"] == "opposite"
    # Seeds that disagree in sign are no finding, however clear each seed is on its own.
    assert st.combine_seeds([seed_result(e) for e in (1.0, -0.8, 0.9)], 1)["verdict"] == "inconclusive"


def test_combine_seeds_missing_and_single():
    seeds = [seed_result(1.0), seed_result(None, p=None), seed_result(1.1), seed_result(0.95)]
    r = st.combine_seeds(seeds, 1)
    assert r["n"] == 3 and r["missing_seeds"] == 1 and len(r["per_seed"]) == 4
    assert r["per_seed"][1]["effect"] is None
    assert_json_safe(r)
    two_missing = st.combine_seeds([seed_result(1.0), seed_result(None, p=None)], 1)
    assert_no_test(two_missing, effect=1.0)
    assert two_missing["missing_seeds"] == 1 and two_missing["test"].endswith("(1 seed)")
    none_left = st.combine_seeds([seed_result(None, p=None)] * 2, 1)
    assert_no_test(none_left, effect=None)
    single = seed_result(0.7)
    one = st.combine_seeds([single], 1)
    assert {k: v for k, v in one.items() if k != "per_seed"} == single
    assert one["per_seed"] == [{"effect": 0.7, "interval": single["interval"], "p_value": 0.01, "n": 50,
                                "verdict": "appears"}]
    assert "per_seed" not in single  # the caller's dict is left as it was
    with pytest.raises(ValueError):
        st.combine_seeds([], 1)


def test_mean_interval():
    values = [2.0, 4.0, 6.0, 8.0]
    mean, low, high = st.mean_interval(values)
    ref = scipy.stats.t.interval(0.95, 3, loc=5.0, scale=scipy.stats.sem(values))
    assert mean == 5.0 and (low, high) == pytest.approx(ref)
    assert st.mean_interval([3.0]) == (3.0, None, None)
    assert st.mean_interval([3.0, 3.0]) == (3.0, 3.0, 3.0)
    _, low90, high90 = st.mean_interval(values, confidence=0.9)
    assert low < low90 < high90 < high
    with pytest.raises(ValueError):
        st.mean_interval([])


# --------------------------------------------------------------------------------------------------------------------
# Every result, JSON-safe.


def test_every_result_is_json_safe_and_finite():
    a, b = per_query_f1(50.0, 3.0)
    x, y, c = clustered_points(8, 1.0, 2.0, 1.0, seed=1)
    results = [
        st.paired_difference(a, b, 1, n_resamples=FAST), st.paired_difference([1, 1], [1, 1], 1),
        st.welch(a, b, 1), st.welch([1], [2], 1), st.welch([1, 1], [1, 1], 1),
        st.slope(x, y, 1), st.slope([1, 1, 1], [1, 2, 3], 1), st.slope([1, 2, 3], [4, 4, 4], -1),
        st.clustered_slope(x, y, c, 1, n_resamples=FAST), st.clustered_slope([1, 2], [3, 4], [0, 0], 1),
        st.rank_trend({"never": [1, 2], "rare": [2, 3], "frequent": [3, 5]}, ORDER, 1, n_resamples=FAST),
        st.rank_trend({}, ORDER, 1),
        st.one_sample([1.0, 2.0], 1), st.one_sample([1.0], 1),
        st.combine_seeds([seed_result(1.0), seed_result(float("nan"), p=float("nan"))], 1),
    ]
    for result in results:
        assert_json_safe(result)
        assert result["verdict"] in st.VERDICTS
        assert result["confidence"] == 0.95
    assert results[-1]["missing_seeds"] == 1


def test_all_of_is_an_intersection_union_test_and_a_reversed_part_is_corrected_for_the_parts():
    def part(effect, p):
        return {"effect": effect, "interval": [effect - 1, effect + 1], "p_value": p, "n": 10,
                "verdict": st.verdict(effect, p, +1)}

    both = st.all_of({"a": part(2.0, 0.001), "b": part(1.0, 0.03)}, "t")
    assert both["verdict"] == "appears" and both["effect"] == 1.0 and both["p_value"] == 0.03
    assert both["weakest"] == "b" and set(both["parts"]) == {"a", "b"}
    assert st.all_of({"a": part(2.0, 0.001), "b": part(0.5, 0.2)}, "t")["verdict"] == "inconclusive"
    # A part reversed at p=0.03 is "opposite" alone, not among two parts (Bonferroni: 0.025); at p=0.01 it is.
    assert st.all_of({"a": part(2.0, 0.001), "b": part(-1.0, 0.03)}, "t")["verdict"] == "inconclusive"
    assert st.all_of({"a": part(2.0, 0.001), "b": part(-1.0, 0.01)}, "t")["verdict"] == "opposite"
    missing = st.all_of({"a": part(2.0, 0.001), "b": st.untested("t", "no data")}, "t")
    assert missing["verdict"] == "inconclusive" and missing["effect"] is None and "b: no data" in missing["reason"]
    # A claim of negative effects: the weakest part is the one nearest zero from below, and a positive part reversed.
    lower = st.all_of({"a": {**part(-2.0, 0.001), "verdict": "appears"}, "b": {**part(-0.5, 0.01),
                                                                              "verdict": "appears"}}, "t", direction=-1)
    assert lower["verdict"] == "appears" and lower["weakest"] == "b" and lower["effect"] == -0.5
    assert st.all_of({"a": part(-2.0, 0.001), "b": part(1.0, 0.01)}, "t", direction=-1)["verdict"] == "opposite"
    assert st.all_of({"a": part(-2.0, 0.001), "b": part(1.0, 0.03)}, "t", direction=-1)["verdict"] == "inconclusive"
    with pytest.raises(ValueError, match="direction"):
        st.all_of({"a": part(1.0, 0.01)}, "t", direction=0)


def test_a_claim_not_applicable_on_every_seed_is_not_applicable_over_them():
    na = st.not_applicable("slope test", "the static slope is not upward")
    assert na["verdict"] == "not applicable" and na["reason"].startswith("not applicable: ") and na["effect"] is None
    combined = st.combine_seeds([na, na], direction=-1)
    assert combined["verdict"] == "not applicable" and len(combined["per_seed"]) == 2
    # Where it applies on some seeds, those seeds' effects are tested and the others counted as missing.
    applies = {"effect": -0.5, "interval": [-1, 0], "p_value": 0.01, "n": 10, "verdict": "appears"}
    mixed = st.combine_seeds([na, applies, {**applies, "effect": -0.7}], direction=-1)
    assert mixed["missing_seeds"] == 1 and mixed["n"] == 2 and mixed["verdict"] != "not applicable"
