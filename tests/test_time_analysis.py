"""Time analyses: the pure computations against hand-computed values; the model-running glue (scores, degradation
into the future, calibration entropy, the yearly router on a SeqIO task) against an independent computation on a
fixed tiny T5.

Compiled functions are shared through module-scoped fixtures (one small model, one scorer, one ModelFns).
"""

import functools
import math

import jax
import numpy as np
import pytest

from templm.data.records import Answer, DataError, Query
from templm.evaluation import time_analysis as ta
from templm.evaluation.adaptation import curve_from_log, new_and_old_f1, summarize
from templm.evaluation.future_probes import (TextScorer, future_calibration, future_degradation, read_calibration,
                                             year_input)
from templm.evaluation.routing import YearRouter, evaluate_router, make_year_router
from templm.models import t5

CFG = t5.T5Config(vocab_size=400, emb_dim=32, num_heads=2, head_dim=16, mlp_dim=64, num_encoder_layers=1,
                  num_decoder_layers=1, relative_attention_num_buckets=8, relative_attention_max_distance=16)
LENGTHS = {"inputs": 32, "targets": 8}


def q(subject, year, *answers, relation="P54", text="<subject> plays for _X_."):
    return Query(id=f"{subject}_{relation}_{year}", relation=relation, subject_id=subject, year=year,
                 query=text.replace("<subject>", subject), answers=tuple(Answer(a, a) for a in answers))


# --------------------------------------------------------------------------------------------------------------------
# The router.


def test_router_picks_its_year_the_closest_and_clamps_out_of_range_years():
    router = YearRouter({2016: "b", 2014: "a", 2019: "c"})
    assert router.years == [2014, 2016, 2019]
    assert [router.route(y) for y in (2014, 2016, 2019)] == [2014, 2016, 2019]
    assert router.route(2017) == 2016  # closest
    assert router.route(2018) == 2019  # closest
    assert router.route(2015) == 2016  # a tie goes to the later (more recent) expert
    assert router.route(2003) == 2014 and router.route(2013) == 2014  # before the first: the first
    assert router.route(2020) == 2019 and router.route(2050) == 2019  # past the last: the last
    assert YearRouter({2015: "x"}).route(1990) == 2015
    assert make_year_router(experts={"2015": "x"}).route(2020) == 2015  # gin gives keys as written
    with pytest.raises(ValueError, match="at least one expert"):
        YearRouter({})


# --------------------------------------------------------------------------------------------------------------------
# Durations and answer groups.


def test_duration_buckets():
    assert [ta.duration_bucket(n) for n in (1, 2, 3, 4, 5, 11)] == ["1", "2", "3-4", "3-4", "5+", "5+"]
    with pytest.raises(ValueError):
        ta.duration_bucket(0)


def test_answer_durations_count_the_years_with_the_same_answer_set():
    queries = [q("A", 2014, "X"), q("A", 2015, "X"), q("A", 2016, "Y"), q("A", 2017, "X"),
               q("A", 2018, "X", "Y"), q("A", 2019, "Y", "X"),  # the same set in another order
               q("B", 2014, "X"), q("A", 2014, "Z", relation="P108")]
    d = ta.answer_durations(queries)
    assert d["A_P54_2014"] == d["A_P54_2015"] == d["A_P54_2017"] == 3
    assert d["A_P54_2016"] == 1
    assert d["A_P54_2018"] == d["A_P54_2019"] == 2
    assert d["B_P54_2014"] == 1 and d["A_P108_2014"] == 1  # other subject, other relation: counted apart
    # Dicts work as well as Query objects.
    assert ta.answer_durations([{"id": "s", "subject_id": "S", "relation": "P", "year": 2014, "answers": ["u"]}]) == {
        "s": 1}
    groups = ta.answer_groups(queries)
    assert groups[("A", "P54")] == "multiple" and groups[("B", "P54")] == "single"


def test_f1_by_duration_by_hand():
    durations = {"a": 1, "b": 2, "c": 3, "d": 7, "e": 8}
    answers = {"a": ["Kula United"], "b": ["X"], "c": ["X"], "d": ["Rovers City"], "e": ["Q"]}
    predictions = {"a": "Kula", "b": "X", "c": "Y", "d": "the Rovers City", "e": "Q"}
    out = ta.f1_by_duration(predictions, answers, durations)
    assert list(out) == ["1", "2", "3-4", "5+"]
    assert out["1"] == {"count": 1.0, "f1": pytest.approx(100 * 2 / 3), "em": 0.0}  # P = 1, R = 1/2
    assert out["2"]["f1"] == 100.0 and out["3-4"]["f1"] == 0.0
    assert out["5+"] == {"count": 2.0, "f1": 100.0, "em": 100.0}  # articles are dropped
    assert ta.f1_by_duration({}, {}, {}) == {b: {"count": 0.0} for b in ta.DURATION_BUCKETS}


# --------------------------------------------------------------------------------------------------------------------
# Pooled metrics, year gaps.


def test_pooled_f1_and_perplexity_by_hand():
    metrics = {"f1_2014": 10.0, "count_2014": 1.0, "f1_2015": 40.0, "count_2015": 3.0, "f1": 99.0,
               "count_2016": 0.0, "ppl_2014": math.e, "tokens_2014": 10.0, "ppl_2015": math.e ** 3,
               "tokens_2015": 30.0}
    assert ta.pooled_qa(metrics, [2014, 2015]) == pytest.approx((10 + 120) / 4)
    assert ta.pooled_qa(metrics, [2016]) is None
    assert ta.pooled_perplexity(metrics, [2014, 2015]) == pytest.approx(math.exp((10 * 1 + 30 * 3) / 40))
    assert ta.pooled_perplexity(metrics, [2019]) is None
    assert new_and_old_f1(metrics, 2015, [2014]) == {"new_f1": 40.0, "old_f1": 10.0}


def test_f1_by_year_gap_and_falloff_by_hand():
    experts = {2014: {"f1_2014": 60.0, "count_2014": 2.0, "f1_2015": 30.0, "count_2015": 2.0},
               2015: {"f1_2014": 20.0, "count_2014": 2.0, "f1_2015": 80.0, "count_2015": 2.0, "f1_2016": 10.0,
                      "count_2016": 6.0, "count_2017": 0.0}}
    by_gap = ta.f1_by_year_gap(experts)
    assert by_gap == {-1: {"f1": 20.0, "count": 2.0}, 0: {"f1": 70.0, "count": 4.0},
                      1: {"f1": pytest.approx((30 * 2 + 10 * 6) / 8), "count": 8.0}}
    f = ta.falloff(by_gap)
    assert f["f1_gap0"] == 70.0 and f["f1_other_gaps"] == pytest.approx((20 * 2 + 15 * 8) / 10)
    # Weighted least squares of F1 on |gap|: points (0, 70, w4) and (1, 16, w10) -> slope 16 - 70.
    assert f["slope_per_year"] == pytest.approx(-54.0)
    assert ta.falloff({0: {"f1": 5.0, "count": 1.0}})["slope_per_year"] is None


# --------------------------------------------------------------------------------------------------------------------
# Log-likelihood change and entropy.


def test_loglik_change_and_means_by_group_by_hand():
    base = [-1.0, -2.0, -0.5]
    shifted = [[-1.5, -3.0], [-2.0, -2.0], [-0.5, -1.5]]
    deltas = ta.loglik_change(base, shifted)
    np.testing.assert_allclose(deltas, [[-0.5, -2.0], [0.0, 0.0], [0.0, -1.0]])
    means = ta.mean_change_by_gap(deltas, ["multiple", "single", "multiple"], [1, 2])
    assert means["multiple"] == {"count": 2, "mean": {1: -0.25, 2: -1.5}}
    assert means["single"] == {"count": 1, "mean": {1: 0.0, 2: 0.0}}
    empty = ta.mean_change_by_gap(np.zeros((0, 2)), [], [1, 2])
    assert empty == {"single": {"count": 0, "mean": {}}, "multiple": {"count": 0, "mean": {}}}
    with pytest.raises(ValueError, match="shape"):
        ta.loglik_change([0.0, 1.0], [[1.0]])


def test_entropy_over_candidates_by_hand():
    # Scores that are the logs of a distribution give that distribution back: H(1/2, 1/4, 1/4) = 1.5 ln 2.
    scores = np.log([0.5, 0.25, 0.25])
    np.testing.assert_allclose(ta.candidate_distribution(scores), [0.5, 0.25, 0.25])
    assert ta.entropy(scores) == pytest.approx(1.5 * math.log(2))
    assert ta.entropy(scores - 7.0) == pytest.approx(1.5 * math.log(2))  # only differences matter
    assert ta.entropy(scores, normalize=True) == pytest.approx(1.5 * math.log(2) / math.log(3))
    assert ta.entropy([-3.0] * 5) == pytest.approx(math.log(5))
    assert ta.entropy([0.0, -1000.0]) == pytest.approx(0.0, abs=1e-12)  # a certain model
    assert ta.entropy([1.0], normalize=True) == 0.0
    table = ta.mean_by_class_and_year([1.0, 3.0, 2.0, 5.0], ["never", "never", "frequent", "other"],
                                      [2019, 2019, 2020, 2019])
    assert table == {"frequent": {2020: 2.0}, "never": {2019: 2.0}, "other": {2019: 5.0}}


def test_adaptation_summary_and_curve_by_hand(tmp_path):
    base = {"new_f1": 10.0, "old_f1": 40.0}
    runs = {"0.5": {"new_f1": 25.0, "old_f1": 36.0, "steps": 50}}
    s = summarize(base, runs, {"new_f1": 30.0, "old_f1": 41.0, "steps": 400}, base_steps=300)
    assert s["alphas"]["0.5"] == {"new_f1": 25.0, "old_f1": 36.0, "steps": 50, "total_steps": 350,
                                  "new_gain": 15.0, "old_kept": pytest.approx(0.9), "new_vs_retrained": -5.0}
    assert s["retrained"]["steps"] == 400 and s["base"]["steps"] == 300
    log = tmp_path / "metrics.jsonl"
    log.write_text('{"step": 5, "split": "train", "loss": 1.0}\n'
                   '{"step": 5, "split": "test/templama_temporal", "f1_2015": 20.0, "count_2015": 1.0, '
                   '"f1_2014": 50.0, "count_2014": 3.0}\n')
    assert curve_from_log(str(log), "templama_temporal", "test", 2015, [2014]) == [
        {"step": 5, "new_f1": 20.0, "old_f1": 50.0}]


# --------------------------------------------------------------------------------------------------------------------
# Glue on a fixed tiny model: scores against an independent computation.


@pytest.fixture(scope="module")
def model():
    return t5.EncoderDecoderModel(CFG)


@pytest.fixture(scope="module")
def params(model):
    return jax.jit(functools.partial(model.init, input_len=LENGTHS["inputs"],
                                     target_len=LENGTHS["targets"]))(jax.random.PRNGKey(0))


@pytest.fixture(scope="module")
def scorer(model):
    import seqio

    return TextScorer(model, seqio.ByteVocabulary(extra_ids=0), LENGTHS, batch_size=4)


@pytest.fixture(scope="module")
def reference(model, params, scorer):
    """log p(target | input) by hand: the unpadded ids, one forward pass, a float64 log-softmax, a sum."""
    forward = jax.jit(lambda p, enc, dec: model.module.apply({"params": p}, enc, dec))

    @functools.lru_cache(maxsize=None)
    def loglik(inputs: str, target: str) -> float:
        vocab = scorer.vocabulary
        enc = np.array([list(vocab.encode(inputs))[:LENGTHS["inputs"] - 1] + [1]], np.int32)
        tgt = list(vocab.encode(target))[:LENGTHS["targets"] - 1] + [1]
        dec = np.array([[0] + tgt[:-1]], np.int32)
        logits = np.asarray(forward(params, enc, dec), np.float64)[0]
        logp = logits - logits.max(-1, keepdims=True)
        logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
        return float(sum(logp[i, t] for i, t in enumerate(tgt)))

    return loglik


def test_text_scorer_matches_an_independent_log_likelihood(params, scorer, reference):
    inputs = ["year: 2016 Kolus Fatar plays for <extra_id_0>.", "In 2019, Ratu attended <extra_id_0>.",
              "a much longer input " * 5]
    targets = ["Kula United", "University of Podipis", "x"]
    got = scorer.score(params, inputs, targets)  # 3 rows in a batch of 4: padding rows are dropped
    np.testing.assert_allclose(got, [reference(i, t) for i, t in zip(inputs, targets)], rtol=1e-4, atol=1e-4)
    batch = scorer.encode(inputs[:1], targets[:1])
    assert batch["decoder_input_tokens"][0, 0] == 0
    np.testing.assert_array_equal(batch["decoder_input_tokens"][0, 1:], batch["decoder_target_tokens"][0, :-1])
    np.testing.assert_array_equal(batch["decoder_loss_weights"], batch["decoder_target_tokens"] > 0)
    assert year_input("temporal", 2019, "X plays for _X_.") == "year: 2019 X plays for <extra_id_0>."
    assert year_input("uniform", 2019, "X plays for _X_.") == "In 2019, X plays for <extra_id_0>."


def test_degradation_glue_against_hand_computed_changes(params, scorer, reference):
    text = "<subject> plays for _X_."
    # Answers are set to what the model predicts at the reference year, so those queries count as answered.
    ref = 2016
    predicted = scorer.predict(params, [year_input("temporal", ref, text.replace("<subject>", s))
                                        for s in ("Ana", "Bo")])
    queries = [q("Ana", 2014, predicted[0]), q("Ana", 2015, predicted[0]), q("Ana", 2016, predicted[0]),
               q("Bo", 2015, "Someone Else"), q("Bo", 2016, predicted[1]),
               q("Cy", 2016, "Never Predicted Answer")]
    out = future_degradation(scorer, params, "temporal", queries, ref, max_gap=2)
    assert out["queries"] == 3 and out["answered"] == 2 and out["gaps"] == [1, 2]

    def delta(subject, answer, gap):
        base = reference(year_input("temporal", ref, f"{subject} plays for _X_."), answer)
        return reference(year_input("temporal", ref + gap, f"{subject} plays for _X_."), answer) - base

    groups = out["groups"]
    assert groups["single"]["count"] == 1 and groups["multiple"]["count"] == 1
    for gap in (1, 2):
        assert groups["single"]["mean"][gap] == pytest.approx(delta("Ana", predicted[0], gap), abs=2e-4)
        assert groups["multiple"]["mean"][gap] == pytest.approx(delta("Bo", predicted[1], gap), abs=2e-4)


def test_calibration_glue_against_hand_computed_entropy(params, scorer, reference, tmp_path):
    path = tmp_path / "calibration.jsonl"
    path.write_text(
        '{"id": "E1_host_city_2014", "relation": "host_city", "query": "The Foo Games is hosted by _X_.", '
        '"change_class": "frequent", "candidates": ["Aa", "Bbb", "Cc"]}\n'
        '{"id": "E1_host_city_2015", "relation": "host_city", "query": "The Foo Games is hosted by _X_.", '
        '"change_class": "frequent", "candidates": ["Aa", "Bbb", "Cc"]}\n'
        '{"id": "L1_located_in_2014", "relation": "located_in", "query": "Bar Tower is located in _X_.", '
        '"change_class": "never", "candidates": ["Aa", "Dd"]}\n')
    calibration = read_calibration(str(path))
    assert len(calibration) == 2  # one per subject and relation
    out = future_calibration(scorer, params, "uniform", calibration, [2019, 2020])
    assert out["count"] == {"frequent": 1, "never": 1}
    for row in calibration:
        for year in (2019, 2020):
            scores = [reference(year_input("uniform", year, row["query"]), c) for c in row["candidates"]]
            p = np.exp(np.array(scores) - max(scores))
            p /= p.sum()
            h = float(-(p * np.log(p)).sum())
            assert out["entropy"][row["change_class"]][year] == pytest.approx(h, abs=1e-4)
            assert out["normalized_entropy"][row["change_class"]][year] == pytest.approx(
                h / math.log(len(p)), abs=1e-4)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "E1_host_city_2014", "relation": "host_city"}\n')
    with pytest.raises(DataError, match=r"bad\.jsonl:1"):
        read_calibration(str(bad))


# --------------------------------------------------------------------------------------------------------------------
# The router on a SeqIO task: each example gets exactly its expert's output, metrics as for any model.


@pytest.fixture(scope="module")
def task_data(task_data_for):
    from templm.data.task_data import TaskDataConfig
    from templm.data.world import WorldConfig

    return task_data_for("routing", TaskDataConfig(world=WorldConfig(seed=1, start_year=2014, end_year=2017,
                                                                     subjects_per_relation=4, docs_per_month=2),
                                                   vocab_size=290, future_years=1))


def test_router_evaluation_routes_each_example_to_its_expert(model, task_data, tmp_path):
    from templm.evaluation import qa_metrics
    from templm.evaluation.task_eval import evaluate_model, with_params
    from templm.training.checkpoints import Checkpointer
    from templm.training.inference import ModelFns

    init = jax.jit(functools.partial(model.init, input_len=LENGTHS["inputs"], target_len=LENGTHS["targets"]))
    experts = {2014: init(jax.random.PRNGKey(1)), 2016: init(jax.random.PRNGKey(2))}
    saver = Checkpointer(str(tmp_path / "expert_2014" / "checkpoints"), save_period=0)
    saver.save(1, {"params": experts[2014]}, {"step": 1})
    saver.close()
    fns = ModelFns(model, None, batch_size=8, max_decode_length=LENGTHS["targets"])
    router = YearRouter({2014: str(tmp_path / "expert_2014"), 2016: experts[2016]})  # a path is loaded on use
    routed = evaluate_router(router, fns, "templama_uniform", LENGTHS, split="test")
    alone = {year: evaluate_model(with_params(fns, p), "templama_uniform", LENGTHS, split="test")
             for year, p in experts.items()}
    years = {ex["year"] for ex in routed.examples}
    assert years == {2014, 2015, 2016, 2017}
    by_id = {year: {ex["id"]: ex for ex in e.examples} for year, e in alone.items()}
    want_expert = {2014: 2014, 2015: 2016, 2016: 2016, 2017: 2016}
    for ex in routed.examples:
        assert ex["expert"] == want_expert[ex["year"]]
        own = by_id[ex["expert"]][ex["id"]]
        assert ex["prediction"] == own["prediction"]
        assert ex["score"] == pytest.approx(own["score"], abs=1e-4)
    expected = qa_metrics.qa_scores([ex["prediction"] for ex in routed.examples],
                                    [ex["answers"] for ex in routed.examples],
                                    [ex["year"] for ex in routed.examples], [2014, 2015, 2016], [2017])
    for key in ("f1", "em", "count", "seen_f1", "future_f1", "f1_2015", "count_2017"):
        assert routed.metrics[key] == pytest.approx(expected[key])
    assert "ppl" in routed.metrics and "ppl_2017" in routed.metrics
