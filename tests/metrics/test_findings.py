"""Every finding's test on constructed inputs (the registry of templm/metrics/findings.py, both halves): a clear
effect gives "appears", its mirror "opposite", and a difference inside the noise "inconclusive"; over several seeds
the verdict comes from the per-seed effects."""

import json
import math

import numpy as np
import pytest

from templm.metrics.findings import (APPENDICES, BY_NAME, HALVES, IMPORTANCE_SAMPLING, STREAMING, STUDY, TIME_AWARE,
                                     combine, combine_findings, judge, of_half)

SEEN, NEW = [2014, 2015, 2016], 2017


def by_name(results):
    return judge(results, TIME_AWARE)


def stream_findings(results):
    """The streaming half's findings by their short names (gap, growth, dynamic)."""
    return {name[len("streaming_"):]: f for name, f in judge(results, STREAMING).items()}


def noise(n, scale, seed=0):
    return np.random.default_rng(seed).normal(0.0, scale, n)


def exact_mean(values, mean):
    values = np.asarray(values, float)
    return values - values.mean() + mean


# --------------------------------------------------------------------------------------------------------------------
# Temporal beats Uniform: a paired test over the same seen-year queries.


def per_query(uniform, temporal, years):
    return {"world": {"seen_years": SEEN}, "per_query": {"id": [f"q{i}" for i in range(len(years))],
                                                         "year": years, "f1": {"uniform": list(uniform),
                                                                               "temporal": list(temporal)}}}


def test_temporal_beats_uniform_three_ways():
    n = 50
    years = [SEEN[i % 3] for i in range(n)]
    uniform = np.clip(50 + noise(n, 20, 1), 0, 100)
    clear = uniform + 10 + noise(n, 3, 2)
    assert by_name(per_query(uniform, clear, years))["temporal_beats_uniform"]["verdict"] == "appears"
    assert by_name(per_query(clear, uniform, years))["temporal_beats_uniform"]["verdict"] == "opposite"
    # The case: 50.01 vs 50.00 over 50 queries, a difference inside the noise.
    flat_u = exact_mean(uniform, 50.00)
    flat_t = exact_mean(flat_u + noise(n, 10, 3), 50.01)
    found = by_name(per_query(flat_u, flat_t, years))["temporal_beats_uniform"]
    assert found["verdict"] == "inconclusive" and found["n"] == 50
    assert found["effect"] == pytest.approx(0.01) and found["interval"][0] < 0 < found["interval"][1]
    assert "Temporal 50.01 vs Uniform 50.00" in found["evidence"]
    # Only the seen years count: future-year queries are left out.
    future = by_name(per_query(list(uniform) + [0.0] * 10, list(clear) + [100.0] * 10, years + [NEW] * 10))
    assert future["temporal_beats_uniform"]["n"] == n


def test_the_table_2_contrasts_take_their_own_slice_and_models():
    """Temporal against Uniform on the future years, and against the routed Yearly experts on the seen years: each
    on its own queries, so that a model that wins one slice and loses the other is judged apart on each."""
    n = 40
    years = [SEEN[i % 3] for i in range(n)] + [NEW] * n
    base = np.clip(50 + noise(2 * n, 15, 4), 0, 100)
    temporal = np.concatenate([base[:n] - 8 + noise(n, 2, 5), base[n:] + 9 + noise(n, 2, 6)])
    results = {"world": {"seen_years": SEEN, "future_years": [NEW]},
               "per_query": {"id": [f"q{i}" for i in range(2 * n)], "year": years,
                             "f1": {"uniform": list(base), "temporal": list(temporal), "yearly": list(base)}}}
    found = by_name(results)
    assert found["temporal_beats_uniform"]["verdict"] == "opposite" and found["temporal_beats_uniform"]["n"] == n
    future = found["temporal_beats_uniform_future"]
    assert future["verdict"] == "appears" and future["n"] == n and future["effect"] == pytest.approx(
        float(np.mean(temporal[n:] - base[n:])))
    assert found["temporal_beats_yearly"]["verdict"] == "opposite"
    assert "Yearly" in found["temporal_beats_yearly"]["evidence"]
    del results["per_query"]["f1"]["yearly"]
    assert by_name(results)["temporal_beats_yearly"]["reason"] == "no per-query F1 of both Temporal and Yearly"


def test_table_2s_other_contrasts_yearly_over_uniform_and_temporal_over_uniform_on_customnews():
    """Table 2: "The two approaches which condition the predictions on time, Yearly and Temporal, improve over
    Uniform": the Yearly experts over Uniform on the seen-year queries, and Temporal over Uniform on the seen-year
    CustomNews spans, each on its own items."""
    n = 40
    years = [SEEN[i % 3] for i in range(n)] + [NEW] * 10
    uniform = np.clip(40 + noise(n + 10, 15, 30), 0, 100)
    yearly = np.concatenate([uniform[:n] + 7 + noise(n, 2, 31), uniform[n:] - 30])  # future queries: left out
    temporal = np.concatenate([uniform[:n] - 6 + noise(n, 2, 32), uniform[n:] + 30])
    spans = {"id": [f"s{i}" for i in range(n + 10)], "year": years,
             "f1": {"uniform": list(uniform), "temporal": list(temporal)}}
    results = {"world": {"seen_years": SEEN},
               "per_query": {"id": [f"q{i}" for i in range(n + 10)], "year": years,
                             "f1": {"uniform": list(uniform), "yearly": list(yearly), "temporal": list(uniform)},
                             "customnews": spans}}
    found = by_name(results)
    assert found["yearly_beats_uniform"]["verdict"] == "appears" and found["yearly_beats_uniform"]["n"] == n
    assert found["yearly_beats_uniform"]["effect"] == pytest.approx(float(np.mean(yearly[:n] - uniform[:n])))
    news = found["temporal_beats_uniform_customnews"]
    assert news["verdict"] == "opposite" and news["n"] == n and "CustomNews span F1 Temporal" in news["evidence"]


def loglik(order, n=30):
    """Seen and future CustomNews spans with each model's target log-likelihood: `order` maps a model to how many
    nats below the best model its log-likelihood is, on (seen, future) spans."""
    years = [SEEN[i % 3] for i in range(n)] + [NEW] * n
    best = -20 + noise(2 * n, 4, 40)
    lik = {m: list(best - np.array([seen] * n + [future] * n) + noise(2 * n, 0.3, 41 + k))
           for k, (m, (seen, future)) in enumerate(order.items())}
    return {"world": {"seen_years": SEEN, "future_years": [NEW]},
            "per_query": {"id": [], "year": [], "f1": {},
                          "customnews": {"id": [f"s{i}" for i in range(2 * n)], "year": years,
                                         "f1": {m: [0.0] * (2 * n) for m in order}, "loglik": lik}}}


def test_table_7s_perplexity_order_is_every_pair_of_it():
    """Table 7: Temporal lowest on seen and future spans, Uniform below Yearly on the future ones; each pair a paired
    test of the spans' log-likelihood, and the order appears only when every pair does."""
    paper = by_name(loglik({"temporal": (0, 0), "uniform": (1, 1), "yearly": (1.5, 3)}))["perplexity_order"]
    assert paper["verdict"] == "appears" and len(paper["parts"]) == 5
    assert paper["effect"] == pytest.approx(1.0, abs=0.2)  # the weakest pairs: Temporal vs Uniform, 1 nat
    assert paper["mean_nll"]["future"]["temporal"] < paper["mean_nll"]["future"]["uniform"] < \
        paper["mean_nll"]["future"]["yearly"]
    # The demo's case: the future slice has Temporal above Uniform.
    demo = by_name(loglik({"temporal": (0, 1), "uniform": (1, 0), "yearly": (2, 2)}))["perplexity_order"]
    assert demo["verdict"] == "opposite" and demo["parts"]["temporal below uniform, future years"]["verdict"] == \
        "opposite"
    # Temporal lowest, but Uniform and Yearly level on the future years: the order is not shown in full.
    level = by_name(loglik({"temporal": (0, 0), "uniform": (1, 1), "yearly": (1, 1)}))["perplexity_order"]
    assert level["verdict"] == "inconclusive" and level["weakest"] == "uniform below yearly, future years"
    without = loglik({"temporal": (0, 0), "uniform": (1, 1)})
    assert "no per-span log-likelihoods" in by_name(without)["perplexity_order"]["reason"]


def test_yearly_beats_temporal_on_customnews_takes_the_spans_not_the_queries():
    """Table 2's other half: on CustomNews's seen-year masked spans the Yearly experts beat Temporal. The test reads
    the spans' own per-example F1 (per_query["customnews"]), so TempLAMA's queries cannot decide it."""
    n = 60
    years = [SEEN[i % 3] for i in range(n)] + [NEW] * 20
    temporal = np.clip(40 + noise(n + 20, 15, 8), 0, 100)

    def results(yearly):
        queries = {"id": ["q0", "q1"], "year": SEEN[:2], "f1": {"temporal": [100.0, 100.0], "yearly": [0.0, 0.0]}}
        return {"world": {"seen_years": SEEN},
                "per_query": {**queries, "customnews": {"id": [f"s{i}" for i in range(n + 20)], "year": years,
                                                        "f1": {"temporal": list(temporal), "yearly": list(yearly)}}}}

    better = np.concatenate([temporal[:n] + 6 + noise(n, 3, 9), np.zeros(20)])  # the future spans: left out
    found = by_name(results(better))["yearly_beats_temporal_customnews"]
    assert found["verdict"] == "appears" and found["n"] == n
    assert found["effect"] == pytest.approx(float(np.mean(better[:n] - temporal[:n])))
    assert "CustomNews span F1 Yearly" in found["evidence"]
    assert by_name(results(temporal - 6 + noise(n + 20, 3, 10)))["yearly_beats_temporal_customnews"]["verdict"] == \
        "opposite"
    assert by_name(results(temporal + noise(n + 20, 3, 11)))["yearly_beats_temporal_customnews"]["verdict"] == \
        "inconclusive"
    assert by_name({"per_query": {"id": [], "year": [], "f1": {}}})["yearly_beats_temporal_customnews"]["reason"] == \
        "no per-query F1 of both Yearly and Temporal"


def test_table_2s_future_customnews_contrasts_take_the_future_spans():
    """Table 2's 2019-20 CustomNews column: Temporal above Uniform ("training with temporal context improves F1 scores
    on the 2019-20 slices") and above the Yearly experts, whose last seen year's expert answers every future year
    ("significantly worse on CustomNews"). Only the future years' spans count: the seen years', where here the order is
    the reverse, are left out."""
    n = 50
    years = [SEEN[i % 3] for i in range(40)] + [NEW] * n
    temporal = np.clip(45 + noise(40 + n, 15, 12), 0, 100)
    seen_reversed = temporal[:40] + 20 + noise(40, 3, 15)  # the other models far above Temporal on the seen years
    below = np.concatenate([seen_reversed, temporal[40:] - 8 + noise(n, 3, 13)])
    level = np.concatenate([seen_reversed, temporal[40:] + noise(n, 3, 14)])

    def results(uniform, yearly):
        return {"world": {"seen_years": SEEN, "future_years": [NEW]},
                "per_query": {"id": [], "year": [], "f1": {},
                              "customnews": {"id": [f"s{i}" for i in range(40 + n)], "year": years,
                                             "f1": {"temporal": list(temporal), "uniform": list(uniform),
                                                    "yearly": list(yearly)}}}}

    found = by_name(results(below, level))
    over_uniform = found["temporal_beats_uniform_customnews_future"]
    assert over_uniform["verdict"] == "appears" and over_uniform["n"] == n
    assert over_uniform["effect"] == pytest.approx(float(np.mean(temporal[40:] - below[40:])))
    assert "future-year CustomNews span F1 Temporal" in over_uniform["evidence"]
    assert found["temporal_beats_yearly_customnews_future"]["verdict"] == "inconclusive"
    reversed_ = by_name(results(level, 2 * temporal - below))  # the Yearly experts 8 F1 above Temporal
    assert reversed_["temporal_beats_yearly_customnews_future"]["verdict"] == "opposite"
    assert reversed_["temporal_beats_uniform_customnews_future"]["verdict"] == "inconclusive"


def durations(uniform_long, uniform_short, n=40, seed=0):
    """Seen-year queries, half with answers lasting 6 years, half 2 years, the Yearly experts at 50 on both;
    Uniform `uniform_long` / `uniform_short` F1 points above them; a future query and one of unknown duration."""
    yearly = np.clip(50 + noise(2 * n, 10, seed), 0, 100)
    lead = np.array([uniform_long] * n + [uniform_short] * n, float)
    uniform = yearly + lead + noise(2 * n, 3, seed + 1)
    return {"world": {"seen_years": SEEN},
            "per_query": {"id": [f"q{i}" for i in range(2 * n + 2)], "year": [SEEN[i % 3] for i in range(2 * n)]
                          + [NEW, SEEN[0]], "duration": [6] * n + [2] * n + [1, None],
                          "f1": {"uniform": list(uniform) + [100.0, 100.0], "yearly": list(yearly) + [0.0, 0.0],
                                 "temporal": list(yearly + 1) + [0.0, 0.0]}}}


def test_duration_tradeoff_three_ways():
    """Figure 2 (right): Uniform ahead of the Yearly experts on long-lived answers, behind on short-lived ones."""
    found = by_name(durations(+8, -8))["duration_tradeoff"]
    assert found["verdict"] == "appears" and found["n"] == 80  # the future query and the unknown duration left out
    assert set(found["parts"]) == {"long", "short"} and found["effect"] == pytest.approx(8, abs=1.5)
    assert all(p["verdict"] == "appears" and p["n"] == 40 for p in found["parts"].values())
    assert found["groups"]["long"]["n"] == 40 and found["groups"]["short"]["n"] == 40
    assert found["groups"]["long"]["uniform"] > found["groups"]["long"]["yearly"] + 5
    assert ">= 5 years (n=40)" in found["evidence"] and "< 5 years (n=40)" in found["evidence"]
    assert by_name(durations(-8, +8))["duration_tradeoff"]["verdict"] == "opposite"
    # A lead of the same size at every duration is no trade-off: the short side is reversed.
    assert by_name(durations(+5, +5, seed=3))["duration_tradeoff"]["verdict"] == "opposite"
    # A lead that only grows with the duration (an interaction, Uniform ahead on both sides) is no crossing either:
    # the old test of the interaction called it "appears".
    grows = by_name(durations(+12, +3, seed=5))["duration_tradeoff"]
    assert grows["verdict"] == "opposite" and grows["parts"]["short"]["verdict"] == "opposite"
    # Uniform ahead on long answers, level on short ones: half the crossing is not shown.
    half = by_name(durations(+8, 0, seed=6))["duration_tradeoff"]
    assert half["verdict"] == "inconclusive" and half["weakest"] == "short"
    no_durations = durations(+8, -8)
    del no_durations["per_query"]["duration"]
    assert "answer durations" in by_name(no_durations)["duration_tradeoff"]["reason"]


# --------------------------------------------------------------------------------------------------------------------
# Yearly experts fall off with the year gap: a slope over queries scored by every expert.


def yearly(f1_of_gap, seed=0):
    years = [2012 + i % 7 for i in range(70)]  # 2012..2018, ten queries a year
    experts = (2013, 2015, 2017)
    f1 = {str(e): list(np.clip([f1_of_gap(abs(y - e)) for y in years] + noise(len(years), 5, seed + e), 0, 100))
          for e in experts}
    return {"yearly": {"per_query": {"id": [f"q{i}" for i in range(70)], "year": years, "f1": f1}}}


def test_yearly_falloff_three_ways():
    falls = by_name(yearly(lambda gap: 80 - 12 * gap))["yearly_falloff"]
    assert falls["verdict"] == "appears" and falls["effect"] < -8 and falls["n"] == 70
    assert set(falls["sides"]) == {"past", "future"}
    assert by_name(yearly(lambda gap: 20 + 12 * gap))["yearly_falloff"]["verdict"] == "opposite"
    both = yearly(lambda gap: 80 - 12 * gap)
    both["yearly"]["customnews"] = yearly(lambda gap: 60 - 5 * gap, seed=1)["yearly"]  # the detail on CustomNews
    detail = by_name(both)["yearly_falloff"]["customnews"]
    assert detail["verdict"] == "appears" and set(detail["sides"]) == {"past", "future"}
    assert by_name(yearly(lambda gap: 50.0))["yearly_falloff"]["verdict"] == "inconclusive"


# --------------------------------------------------------------------------------------------------------------------
# Multi-answer facts fall faster: Welch's test of the per-query change into the future.


def degradation(multi_mean, single_mean, n=25):
    change = list(multi_mean + noise(n, 0.2, 4)) + list(single_mean + noise(n, 0.2, 5))
    return {"degradation": {"temporal": {"items": {"id": [f"q{i}" for i in range(2 * n)],
                                                   "group": ["multiple"] * n + ["single"] * n,
                                                   "mean_change": change}}}}


def test_multi_answer_falls_faster_three_ways():
    found = by_name(degradation(-1.0, -0.1))["multi_answer_falls_faster"]
    assert found["verdict"] == "appears" and found["n"] == 50 and found["effect"] == pytest.approx(-0.9, abs=0.15)
    assert by_name(degradation(-0.1, -1.0))["multi_answer_falls_faster"]["verdict"] == "opposite"
    assert by_name(degradation(-0.5, -0.5))["multi_answer_falls_faster"]["verdict"] == "inconclusive"
    one = degradation(-1.0, -0.1, n=1)  # the case: n = 1 cannot decide anything
    assert by_name(one)["multi_answer_falls_faster"]["verdict"] == "inconclusive"


# --------------------------------------------------------------------------------------------------------------------
# Entropy orders frequent > rare > never: a rank correlation with the rate of change.


def calibration(means, n=12):
    classes, years, values = [], [], []
    for c, mean in means.items():
        for i in range(n):
            classes.append(c)
            years.append(2019 + i % 3)
            values.append(float(np.clip(mean + noise(1, 0.05, len(values))[0], 0, 1)))
    return {"calibration": {"temporal": {"items": {"class": classes, "year": years, "normalized_entropy": values,
                                                   "entropy": values}}}}


def test_entropy_order_three_ways():
    found = by_name(calibration({"frequent": 0.9, "rare": 0.5, "never": 0.1}))["entropy_order"]
    assert found["verdict"] == "appears" and found["effect"] > 0.8
    assert set(found["growth_per_year"]) == {"frequent", "rare", "never"}
    assert by_name(calibration({"frequent": 0.1, "rare": 0.5, "never": 0.9}))["entropy_order"]["verdict"] == \
        "opposite"
    assert by_name(calibration({"frequent": 0.5, "rare": 0.5, "never": 0.5}))["entropy_order"]["verdict"] == \
        "inconclusive"


def test_entropy_order_takes_one_value_per_query_not_one_per_query_and_year():
    """12 queries (4 a class) asked about 11 future years: each query's level is its own (a query effect much larger
    than the years' noise), the classes' means in the claimed order but by less than the queries' spread. As 132
    independent items the order looks significant; per query (the unit that is sampled) it is not."""
    from templm.metrics import statistics

    rng = np.random.default_rng(21)
    classes, years, values, queries = [], [], [], []
    for c, mean in (("never", 0.45), ("rare", 0.5), ("frequent", 0.55)):
        for q in range(4):
            level = mean + rng.normal(0, 0.12)
            for year in range(2019, 2030):
                classes.append(c)
                years.append(year)
                values.append(float(level + rng.normal(0, 0.01)))
                queries.append(f"{c}{q}/P39")
    items = {"query": queries, "class": classes, "year": years, "normalized_entropy": values, "entropy": values}
    found = by_name({"calibration": {"temporal": {"items": items}}})["entropy_order"]
    assert found["n"] == 12 and found["n_items"] == 132 and found["n_by_group"] == {"never": 4, "rare": 4,
                                                                                   "frequent": 4}
    as_items = statistics.rank_trend({c: [v for v, k in zip(values, classes) if k == c] for c in ("never", "rare",
                                                                                                  "frequent")},
                                     order=("never", "rare", "frequent"), direction=+1)
    assert as_items["verdict"] == "appears" and found["verdict"] == "inconclusive"


# --------------------------------------------------------------------------------------------------------------------
# Adaptation: every alpha gains on the new year and keeps >= 80 % of the old years' F1.


def adapted_f1(new_shift, old_factor, alphas, seed=0):
    years = [NEW] * 40 + [SEEN[i % 3] for i in range(60)]
    base = np.clip(40 + noise(100, 15, 6), 0, 100)
    new = np.array([y == NEW for y in years])
    f1 = {"base": list(base)}
    for k, a in enumerate(alphas):
        adapted = np.where(new, base + new_shift, base * old_factor) + noise(100, 2, 7 + k + seed)
        f1[a] = list(np.clip(adapted, 0, 100))
    return {"id": [f"q{i}" for i in range(100)], "year": years, "f1": f1}


def adaptation(new_shift, old_factor, alphas=("0.3", "0.7"), uniform_old_factor=None):
    regimes = {"temporal": {"per_query": {"templama": adapted_f1(new_shift, old_factor, alphas)}}}
    if uniform_old_factor is not None:
        regimes["uniform"] = {"per_query": {"templama": adapted_f1(new_shift, uniform_old_factor, alphas, seed=50)}}
    return {"adaptation": {"new_year": NEW, "old_years": SEEN, "regimes": regimes}}


def test_adaptation_three_ways():
    found = by_name(adaptation(+15, 1.0))["adaptation"]
    assert found["verdict"] == "appears" and found["n"] == 40 and found["n_old"] == 60
    assert set(found["alphas"]) == {"0.3", "0.7"} and all(
        a["gain"]["verdict"] == "appears" and a["kept"]["verdict"] == "appears" for a in found["alphas"].values())
    assert set(found["parts"]) == {"gain at alpha 0.3", "old years kept at alpha 0.3"}  # the claim: up to 0.6
    assert found["alphas"]["0.7"]["in_claim"] is False and "0.7 (beyond the claim)" in found["evidence"]
    assert by_name(adaptation(-15, 0.3))["adaptation"]["verdict"] == "opposite"
    null = adaptation(0.0, 0.8)  # no gain on the new year (its noise centred), the old years at the margin
    f1 = null["adaptation"]["regimes"]["temporal"]["per_query"]["templama"]["f1"]
    jitter = noise(40, 2, 12)
    f1["0.3"][:40] = list(np.asarray(f1["base"][:40]) + jitter - jitter.mean())
    assert by_name(null)["adaptation"]["verdict"] == "inconclusive"
    # One alpha passing is not enough: the claim is about every alpha up to 0.6.
    mixed = adaptation(+15, 1.0, alphas=("0.3", "0.6"))
    f1 = mixed["adaptation"]["regimes"]["temporal"]["per_query"]["templama"]["f1"]
    f1["0.6"] = list(f1["base"])
    assert by_name(mixed)["adaptation"]["verdict"] == "inconclusive"
    # An alpha beyond the claim that forgets the old years does not decide it.
    beyond = adaptation(+15, 1.0)
    f1 = beyond["adaptation"]["regimes"]["temporal"]["per_query"]["templama"]["f1"]
    f1["0.7"] = [0.0] * len(f1["base"])
    assert by_name(beyond)["adaptation"]["verdict"] == "appears"
    # The new slice is every future year (the paper's 2019-20), where the run names them.
    two = adaptation(+15, 1.0)
    two["world"] = {"future_years": [NEW, NEW + 1]}
    pq = two["adaptation"]["regimes"]["temporal"]["per_query"]["templama"]
    pq["year"] = [NEW + 1 if y == NEW and i % 2 else y for i, y in enumerate(pq["year"])]
    both = by_name(two)["adaptation"]
    assert both["new_years"] == [NEW, NEW + 1] and both["n"] == 40 and both["verdict"] == "appears"


def test_temporal_forgets_less_three_ways():
    less = by_name(adaptation(+15, 0.95, uniform_old_factor=0.6))["temporal_forgets_less"]
    assert less["verdict"] == "appears" and less["n"] == 60 and less["effect"] < 0
    assert by_name(adaptation(+15, 0.6, uniform_old_factor=0.95))["temporal_forgets_less"]["verdict"] == "opposite"
    assert by_name(adaptation(+15, 0.9, uniform_old_factor=0.9))["temporal_forgets_less"]["verdict"] == "inconclusive"
    assert by_name(adaptation(+15, 0.9))["temporal_forgets_less"]["verdict"] == "inconclusive"  # no Uniform runs


def matched(new_factor, old_factor, alphas=("0.5",), seed=0):
    """The Temporal model retrained from scratch and fine-tuned at `alphas`, each alpha's F1 the retrained model's
    times `new_factor` on the new year and `old_factor` on the old years."""
    years = [NEW] * 40 + [SEEN[i % 3] for i in range(60)]
    retrained = np.clip(45 + noise(100, 15, seed), 5, 75)
    new = np.array([y == NEW for y in years])
    f1 = {"base": list(retrained * 0.7), "retrained": list(retrained)}
    for k, a in enumerate(alphas):
        jitter = noise(100, 2, seed + 1 + k)
        jitter[new] -= jitter[new].mean()  # each slice's mean exactly its factor times the retrained model's
        jitter[~new] -= jitter[~new].mean()
        f1[a] = list(np.where(new, new_factor, old_factor) * retrained + jitter)
    return {"adaptation": {"new_year": NEW, "old_years": SEEN, "regimes": {"temporal": {"per_query": {"templama": {
        "id": [f"q{i}" for i in range(100)], "year": years, "f1": f1}}}}}}


def test_adapted_matches_retrained_three_ways():
    """Section 3.3: alpha 0.5 after a short fine-tune matches the retrained model: at least 90 % of its F1 on the new
    year and on the old years, each a paired non-inferiority test; both must pass."""
    found = by_name(matched(1.0, 1.0))["adapted_matches_retrained"]
    assert found["verdict"] == "appears" and found["alpha"] == "0.5"
    assert set(found["slices"]) == {"new_years", "old_years"} and found["slices"]["new_years"]["n"] == 40
    assert found["slices"]["old_years"]["adapted_f1"] == pytest.approx(found["slices"]["old_years"]["retrained_f1"],
                                                                       rel=0.05)
    # Better than retrained also passes: the claim is that the cheap update loses nothing.
    assert by_name(matched(1.3, 1.1))["adapted_matches_retrained"]["verdict"] == "appears"
    # Forgetting the old years fails the claim even when the new year is learnt.
    forgot = by_name(matched(1.0, 0.6))["adapted_matches_retrained"]
    assert forgot["verdict"] == "opposite" and forgot["weakest"] == "old_years"
    assert by_name(matched(0.9, 0.9, seed=4))["adapted_matches_retrained"]["verdict"] == "inconclusive"
    other = by_name(matched(1.0, 1.0, alphas=("0.3", "0.7")))["adapted_matches_retrained"]
    assert other["verdict"] == "inconclusive" and "the run's alphas: 0.3, 0.7" in other["reason"]


# --------------------------------------------------------------------------------------------------------------------
# The streaming findings: paired over documents, a slope over months.


def stream_results(gap_nats, growth, dynamic_nats, n_docs=48, months=24):
    month_of = [f"{2018 + (m + 3) // 12}-{(m + 3) % 12 + 1:02d}" for m in range(months)]
    docs_month = [month_of[d % months] for d in range(n_docs)]
    words = np.full(n_docs, 100.0)
    ctl = 2.0 + noise(n_docs, 0.2, 8)
    ts = ctl + gap_nats + noise(n_docs, 0.05, 9)
    dyn = ts + dynamic_nats + noise(n_docs, 0.05, 10)
    per_month = {m: 0.5 + growth * i + float(noise(1, 0.02, 11 + i)[0]) for i, m in enumerate(month_of)}
    return {"documents": {"month": docs_month, "words": words.tolist(),
                          "word_nll": {"time_stratified/static": (ts * words).tolist(),
                                       "control/static": (ctl * words).tolist(),
                                       "time_stratified/dynamic": (dyn * words).tolist()}},
            "relative": {"static": {"per_month": per_month},
                         # Dynamic evaluation takes half the growth away (the slopes' comparison), with its own noise.
                         "dynamic": {"per_month": {m: v - 0.3 - 0.5 * growth * i + float(noise(1, 0.02, 50 + i)[0])
                                                   for i, (m, v) in enumerate(per_month.items())}}}}


def test_stream_findings_three_ways():
    found = stream_findings(stream_results(0.5, 0.01, -0.3))
    assert {k: v["verdict"] for k, v in found.items()} == {"gap": "appears", "growth": "appears",
                                                          "dynamic": "appears", "dynamic_slope": "appears",
                                                          "size_slope": "inconclusive"}  # no larger model
    assert found["dynamic_slope"]["effect"] == pytest.approx(-0.005, abs=0.002)
    assert found["gap"]["effect"] == pytest.approx(0.5, abs=0.05) and found["gap"]["n"] == 48
    assert found["growth"]["n"] == 24 and found["growth"]["effect"] == pytest.approx(0.01, abs=0.003)
    assert found["dynamic"]["gap_narrows"]["verdict"] == "appears"
    assert set(judge(stream_results(0.5, 0.01, -0.3), STREAMING)) == {f.name for f in of_half(STREAMING)}
    mirror = stream_findings(stream_results(-0.5, -0.01, +0.3))
    # A falling gap has no upward slope for dynamic evaluation to flatten: that claim is not applicable (the old test
    # called a static slope that falls faster than the dynamic one "appears").
    assert {k: v["verdict"] for k, v in mirror.items()} == {"gap": "opposite", "growth": "opposite",
                                                           "dynamic": "opposite", "dynamic_slope": "not applicable",
                                                           "size_slope": "inconclusive"}
    assert "static model's is not upward" in mirror["dynamic_slope"]["reason"]
    # An upward gap that dynamic evaluation makes steeper is the opposite.
    steeper = stream_results(0.5, 0.01, -0.3)
    steeper["relative"]["dynamic"]["per_month"] = {m: v + 0.005 * i for i, (m, v) in
                                                   enumerate(steeper["relative"]["static"]["per_month"].items())}
    assert stream_findings(steeper)["dynamic_slope"]["verdict"] == "opposite"
    # The smoke report's "+0.01% per month" growth: inside the noise of the monthly values.
    flat = stream_findings(stream_results(0.0, 0.0001, 0.0))
    assert {k: v["verdict"] for k, v in flat.items()} == {"gap": "inconclusive", "growth": "inconclusive",
                                                         "dynamic": "inconclusive", "dynamic_slope": "not applicable",
                                                         "size_slope": "inconclusive"}
    no_dynamic = stream_results(0.5, 0.01, -0.3)
    del no_dynamic["documents"]["word_nll"]["time_stratified/dynamic"]
    assert stream_findings(no_dynamic)["dynamic"]["verdict"] == "inconclusive"


# --------------------------------------------------------------------------------------------------------------------
# Several seeds, and what results.json holds.


def test_seeds_combine_through_their_effects():
    seeds = [by_name(per_query(u, u + 10 + noise(50, 3, s), [SEEN[i % 3] for i in range(50)]))
             for s, u in enumerate(np.clip(50 + noise(150, 20, 12), 0, 100).reshape(3, 50))]
    combined = combine([s["temporal_beats_uniform"] for s in seeds], BY_NAME["temporal_beats_uniform"].direction)
    assert combined["verdict"] == "appears" and combined["n"] == 3 and len(combined["per_seed"]) == 3
    assert combined["effect"] == pytest.approx(np.mean([s["temporal_beats_uniform"]["effect"] for s in seeds]))
    everything = combine_findings(seeds)  # the shape of one seed's findings, in the registry's order
    assert list(everything) == [f.name for f in of_half(TIME_AWARE)]
    assert all(f["claim"] == BY_NAME[n].claim and f["half"] == TIME_AWARE for n, f in everything.items())
    one = combine([seeds[0]["temporal_beats_uniform"]], +1)
    assert one["verdict"] == seeds[0]["temporal_beats_uniform"]["verdict"]
    # Small effects (a slope per month) keep two significant digits in the evidence, not "-0.00".
    slopes = combine([{"effect": e, "verdict": "appears"} for e in (-0.0021, -0.0034, -0.0012)], -1)
    assert "per seed: -0.0021 (appears), -0.0034 (appears), -0.0012 (appears)" in slopes["evidence"]
    assert "effects -0.0022 [" in slopes["evidence"]


def test_a_finding_tested_on_no_seed_says_why_over_the_seeds():
    """A run over seeds with --skip adaptation (or --only time_aware) combined each untested finding as a mean of
    no effects ("mean of 3 seeds' effects n/a [n/a, n/a], p=n/a, n=0"); it says the stage was skipped, as each seed
    does. A claim not applicable on every seed says that, not a mean of nothing."""
    skipped = judge({}, TIME_AWARE, skipped={"adaptation": "--skip adaptation"})["adaptation"]
    assert skipped["effect"] is None and skipped["skipped"] == "adaptation"
    combined = combine([skipped] * 3, BY_NAME["adaptation"].direction)
    assert combined["verdict"] == "inconclusive" and combined["effect"] is None and combined["n"] == 0
    assert combined["evidence"] == "not tested: the adaptation stage was skipped (--skip adaptation)"
    assert combined["test"] == skipped["test"] and len(combined["per_seed"]) == 3
    other = {**skipped, "reason": "not tested: no TempLAMA"}
    assert combine([skipped, other], +1)["evidence"] == ("on no seed (seed 1 of 2: not tested: the adaptation stage "
                                                         "was skipped (--skip adaptation))")
    flat = {"effect": None, "verdict": "not applicable", "reason": "not applicable: the static slope is not upward",
            "test": "t-test"}
    assert combine([flat, flat], -1)["evidence"] == "not applicable: on every seed (the static slope is not upward)"
    tested = {"effect": 1.5, "verdict": "appears", "test": "t-test"}  # one seed with an effect: the mean of one
    assert combine([tested, skipped], +1)["evidence"].startswith("mean of 2 seeds' effects +1.50")


def test_each_finding_is_json_with_the_evidence_fields():
    for half in HALVES:
        for found in judge({}, half).values():  # nothing to test: every finding says so
            assert found["verdict"] == "inconclusive" and found["reason"] and found["half"] == half
    both = {**judge({**per_query([50.0, 60.0, 70.0], [55.0, 66.0, 71.0], SEEN), **degradation(-1.0, -0.1)}),
            **judge(stream_results(0.5, 0.01, -0.3), STREAMING)}
    assert list(both) == [f.name for f in STUDY]  # one shape, one order, both halves
    for name, found in both.items():
        text = json.dumps(found, allow_nan=False)
        assert {"claim", "half", "verdict", "test", "effect", "interval", "p_value", "n", "evidence"} <= set(found)
        assert found["claim"] == BY_NAME[name].claim and found["half"] == BY_NAME[name].half
        assert found["verdict"] in ("appears", "opposite", "inconclusive") and text


def test_a_skipped_stage_leaves_its_findings_untested_and_says_why():
    results = {**stream_results(0.5, 0.01, -0.3)}
    found = judge(results, STREAMING, skipped={"extra: streaming": "the corpus cannot be split: one month"})
    for f in found.values():
        assert f["verdict"] == "inconclusive" and f["n"] == 0 and f["effect"] is None
        assert f["evidence"] == "not tested: the streaming stage was skipped (the corpus cannot be split: one month)"
    assert found["streaming_gap"]["test"] == "paired bootstrap of the per-document log word perplexity difference"
    time_aware = judge({**per_query([50.0] * 3, [60.0] * 3, SEEN), "skipped": {"calibration": "no file"}})
    assert time_aware["entropy_order"]["skipped"] == "calibration"
    assert "skipped" not in time_aware["temporal_beats_uniform"]


def test_both_halves_combine_over_seeds_in_the_same_shape():
    seeds = [{**judge(per_query(u, u + 10 + noise(50, 3, s), [SEEN[i % 3] for i in range(50)])),
              **judge(stream_results(0.5 + 0.1 * s, 0.01 + 0.004 * s, -0.3 - 0.1 * s), STREAMING)}
             for s, u in enumerate(np.clip(50 + noise(100, 20, 5), 0, 100).reshape(2, 50))]
    combined = combine_findings(seeds)
    assert list(combined) == [f.name for f in STUDY]
    gap = combined["streaming_gap"]
    assert gap["half"] == STREAMING and len(gap["per_seed"]) == 2 and gap["n"] == 2
    assert gap["effect"] == pytest.approx(np.mean([s["streaming_gap"]["effect"] for s in seeds]))
    del seeds[1]["streaming_growth"]  # a finding one seed lacks is left out, not combined from the other
    assert "streaming_growth" not in combine_findings(seeds)


def is_results(k_gain, token_gain, flat_gain, gold_gain, n=30, temperatures=(0.5, 2.0)):
    """An is-eval run's per-document estimates (nats a document): the trained proposal at K=1 and K=8, each level,
    each temperature and the gold proposal, shifted by the given gains over the text proposal's document level at
    K=8 (K=1 below it by k_gain), with noise."""
    base = -100.0 + noise(n, 5.0, 11)
    est = {"text": {"document": {"1": base - k_gain + noise(n, 0.3, 1), "8": base},
                    "sentence": {"1": base - k_gain, "8": base + token_gain / 2},
                    "token": {"1": base - k_gain, "8": base + token_gain + noise(n, 0.3, 2)}}}
    proposals = [{"label": "text", "temperature": 1.0, "gold_weight": 0.0}]
    for t in temperatures:
        label = f"text, tau={t:g}"
        proposals.append({"label": label, "temperature": t, "gold_weight": 0.0})
        gain = flat_gain if t == max(temperatures) else -abs(flat_gain)
        est[label] = {"document": {"1": base - 2 * k_gain, "8": base + gain + noise(n, 0.3, 3)}}
    proposals.append({"label": "gold", "temperature": 1.0, "gold_weight": 0.9})
    est["gold"] = {"document": {"1": base, "8": base + gold_gain + noise(n, 0.3, 4)}}
    est = {p: {level: {k: list(map(float, v)) for k, v in ks.items()} for level, ks in levels.items()}
           for p, levels in est.items()}
    return {"config": {"ks": [1, 8]}, "per_document": {"ids": [str(i) for i in range(n)], "tokens": [50] * n,
                                                       "proposals": proposals, "estimates": est}}


def test_the_importance_sampling_effects_are_paired_tests_over_the_documents():
    found = judge(is_results(2.0, 0.5, 1.0, -1.0), IMPORTANCE_SAMPLING)
    assert list(found) == [f.name for f in of_half(IMPORTANCE_SAMPLING)]
    assert found["is_tightens_with_k"]["verdict"] == "appears"
    assert found["is_tightens_with_k"]["effect"] == pytest.approx(2.0, abs=0.2)
    assert found["is_tightens_with_k"]["n"] == 30
    assert found["is_token_level_optimistic"]["verdict"] == "appears"
    assert found["is_flatter_proposal_tighter"]["verdict"] == "appears"
    assert "temperature 2 vs 1" in found["is_flatter_proposal_tighter"]["evidence"]
    assert set(found["is_flatter_proposal_tighter"]["by_temperature"]) == {"text", "text, tau=0.5", "text, tau=2"}
    gold = found["is_gold_proposal_tighter"]
    assert gold["verdict"] == "opposite" and gold["effect"] == pytest.approx(-1.0, abs=0.2)
    # perplexities of both sides: exp(-sum / tokens)
    assert gold["ppl_a"] == pytest.approx(math.exp(-sum(is_results(2, .5, 1, -1)["per_document"]["estimates"]["gold"]
                                                        ["document"]["8"]) / 1500))
    quiet = judge(is_results(0.0, 0.0, 0.0, 0.0), IMPORTANCE_SAMPLING)
    assert quiet["is_gold_proposal_tighter"]["verdict"] == "inconclusive"
    cold = judge(is_results(2.0, 0.5, 1.0, 0.0, temperatures=(0.5,)), IMPORTANCE_SAMPLING)
    assert cold["is_flatter_proposal_tighter"]["reason"] == "no proposal at a temperature above 1 in this run"
    assert judge({}, IMPORTANCE_SAMPLING)["is_tightens_with_k"]["n"] == 0


def appendix_results(period_gaps, slope, n=40, gaps=(0, 6, 12, 18)):
    """An appendices run: each shifted period's streaming_gap (effect, verdict[, p]) over 30 + k test documents, and per-document log word
    perplexities growing by `slope` nats a month of distance, with per-document offsets and noise."""
    periods = []
    for k, (effect, verdict, *p) in enumerate(period_gaps):
        p_value = p[0] if p else 0.001 if verdict != "inconclusive" else 0.4
        periods.append({"shift_years": k, "months": [f"{2018 - k}-04", f"{2020 - k}-03"], "relative_increase": 0.1,
                        "findings": {"streaming_gap": {"effect": effect, "interval": [effect - 0.01, effect + 0.01],
                                                       "p_value": p_value, "n": 30 + k, "verdict": verdict}}})
    base = 4.0 + noise(n, 0.5, 21)
    documents = {str(g): (base + slope * g + noise(n, 0.02, 30 + g)).tolist() for g in gaps}
    return {"periods": periods, "distance": {"documents": documents,
                                             "word_ppl": {str(g): float(np.exp(np.mean(v)))
                                                          for g, v in documents.items()}}}


def test_the_appendices_findings():
    found = judge(appendix_results([(0.05, "appears"), (0.08, "appears"), (0.03, "appears")], 0.01), APPENDICES)
    assert list(found) == ["appendix_every_period_gap", "appendix_distance_growth"]
    every = found["appendix_every_period_gap"]
    # the weakest period's gap and its documents, the largest p
    assert every["verdict"] == "appears" and every["effect"] == 0.03 and every["n"] == 32
    assert every["p_value"] == 0.001 and every["weakest"] == "2016-04..2018-03"
    assert [r["verdict"] for r in every["per_period"]] == ["appears"] * 3
    growth = found["appendix_distance_growth"]
    assert growth["verdict"] == "appears" and growth["effect"] == pytest.approx(0.01, abs=0.002)
    assert growth["n"] == 4 and "18 months" in growth["evidence"]  # the unit is the model: one per distance
    assert growth["documents"]["n"] == 40 and growth["documents"]["verdict"] == "appears"
    # Four models whose perplexities differ but not with the distance: over 40 documents each, their differences are
    # "significant" by the documents; over the models, the distance explains nothing.
    zigzag = appendix_results([(0.05, "appears")], 0.0)
    for g, offset in zip(("0", "6", "12", "18"), (0.05, -0.05, 0.05, -0.05)):
        zigzag["distance"]["documents"][g] = [v + offset for v in zigzag["distance"]["documents"][g]]
    unit = judge(zigzag, APPENDICES)["appendix_distance_growth"]
    assert unit["documents"]["verdict"] != "inconclusive" and unit["verdict"] == "inconclusive"
    mixed = judge(appendix_results([(0.05, "appears"), (0.01, "inconclusive")], -0.01), APPENDICES)
    assert mixed["appendix_every_period_gap"]["verdict"] == "inconclusive"
    assert mixed["appendix_distance_growth"]["verdict"] == "opposite"
    against = judge(appendix_results([(0.05, "appears"), (-0.04, "opposite")], 0.0), APPENDICES)
    assert against["appendix_every_period_gap"]["verdict"] == "opposite"
    # A period reversed at p=0.04 is "opposite" alone, not among two periods (Bonferroni: 0.025).
    weak = judge(appendix_results([(0.05, "appears"), (-0.04, "opposite", 0.04)], 0.0), APPENDICES)
    assert weak["appendix_every_period_gap"]["verdict"] == "inconclusive"
    assert judge({}, APPENDICES)["appendix_distance_growth"]["reason"] == \
        "0 training distance(s) in this run: a slope over models needs at least three"


def test_verdicts_on_scores_at_the_floor_are_marked_and_say_why():
    """A study whose models barely learnt (every TempLAMA F1 below 5, or CustomNews perplexity near the vocabulary's
    size) still gets its tests, but each verdict is marked with what puts it at the floor; a study above it is not."""
    from templm.metrics.findings import at_floor

    n = 50
    years = [SEEN[i % 3] for i in range(n)]
    uniform = np.zeros(n)
    temporal = np.where(np.arange(n) % 10 == 0, 100.0 / 3, 0.0)  # 0.84 vs 0.07 F1 is the case: a few hits

    def study(f1, ppl):
        return {**per_query(uniform, temporal, years), "model_config": {"vocab_size": 1000},
                "regimes": {m: {"templama": {"f1": f1[m]}, "customnews": {"ppl": ppl}} for m in f1}}

    low = study({"uniform": 0.07, "temporal": 0.84}, 40.0)
    assert at_floor(low) == ["every model's TempLAMA F1 is below 5 (Uniform 0.07, Temporal 0.84): the models "
                             "barely answer"]
    found = by_name(low)
    assert found["temporal_beats_uniform"]["floor"] == at_floor(low)[0]
    assert "floor" not in found["adaptation"]  # untested: nothing to mark
    guessing = study({"uniform": 30.0, "temporal": 35.0}, 600.0)
    assert at_floor(guessing) == ["every model's CustomNews perplexity is at least 50% of the vocabulary's 1000 "
                                  "pieces (Uniform 600.0, Temporal 600.0): near guessing"]
    assert at_floor(study({"uniform": 30.0, "temporal": 35.0}, 40.0)) == []
    assert "floor" not in by_name(study({"uniform": 30.0, "temporal": 35.0}, 40.0))["temporal_beats_uniform"]
    # The streaming half: each run's subword perplexity against its own tokenizer's size.
    runs = {"time_stratified": {"static": {"overall": {"subword_ppl": 300.0}}},
            "control": {"static": {"overall": {"subword_ppl": 290.0}}}}
    stream = {"runs": runs, "settings": {"vocab_size_by_run": {"time_stratified": 512, "control": 512}}}
    assert at_floor(stream, STREAMING) and at_floor({**stream, "runs": {
        k: {"static": {"overall": {"subword_ppl": 30.0}}} for k in runs}}, STREAMING) == []
    # Over seeds: marked when every seed is at the floor.
    seeds = combine_findings([found, found])
    assert seeds["temporal_beats_uniform"]["floor"].startswith("on every seed")
