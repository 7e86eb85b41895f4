"""Time analyses (templm/metrics/time_analysis.py): the pure computations against hand-computed values."""

import math

import numpy as np
import pytest

from templm.data.records import Answer, Query
from templm.metrics import time_analysis as ta


def q(subject, year, *answers, relation="P54", text="<subject> plays for _X_."):
    return Query(id=f"{subject}_{relation}_{year}", relation=relation, subject_id=subject, year=year,
                 query=text.replace("<subject>", subject), answers=tuple(Answer(a, a) for a in answers))


# --------------------------------------------------------------------------------------------------------------------
# Durations and answer groups.


def test_duration_buckets():
    assert [ta.duration_bucket(n) for n in (1, 2, 3, 4, 5, 11)] == ["1", "2", "3-4", "3-4", "5+", "5+"]
    with pytest.raises(ValueError):
        ta.duration_bucket(0)


def test_answer_durations_are_the_span_of_the_first_answers_fact():
    # The example: A 2010-13, {A, B} 2014, B 2015-16, A 2017.
    example = [q("S", 2010, "A"), q("S", 2011, "A"), q("S", 2012, "A"), q("S", 2013, "A"), q("S", 2014, "A", "B"),
               q("S", 2015, "B"), q("S", 2016, "B"), q("S", 2017, "A")]
    d = ta.answer_durations(example)
    assert d["S_P54_2014"] == 5 and ta.duration_bucket(d["S_P54_2014"]) == "5+"  # A held 2010-2014
    assert d["S_P54_2017"] == 1  # the 2017 fact lasted one year
    assert d["S_P54_2015"] == d["S_P54_2016"] == 3 and d["S_P54_2011"] == 5  # B 2014-2016; A 2010-2014

    queries = [q("A", 2014, "X"), q("A", 2015, "X"), q("A", 2016, "Y"), q("A", 2017, "X"),
               q("A", 2018, "X", "Y"), q("A", 2019, "Y", "X"),  # the first answer decides
               q("B", 2014, "X"), q("A", 2014, "Z", relation="P108")]
    d = ta.answer_durations(queries)
    assert d["A_P54_2014"] == d["A_P54_2015"] == 2  # X 2014-2015, then Y
    assert d["A_P54_2016"] == 1
    assert d["A_P54_2017"] == d["A_P54_2018"] == 3  # X 2017-2019
    assert d["A_P54_2019"] == 2  # Y 2018-2019
    assert d["B_P54_2014"] == 1 and d["A_P108_2014"] == 1  # other subject, other relation: counted apart
    # Dicts work as well as Query objects.
    assert ta.answer_durations([{"id": "s", "subject_id": "S", "relation": "P", "year": 2014, "answers": ["u"]}]) == {
        "s": 1}
    # From the facts' own spans (Dhingra et al.: "the duration of their corresponding facts in Wikidata"): X held
    # 2011-2015 for A, so its queries inside 2014-2015 get 5 years, not the 2 the query window shows; a fact without
    # an end, or an answer without a fact, falls back to the queries.
    facts = [("A", "P54", "X", 2011, 2015), ("A", "P54", "Y", 2016, None), ("A", "P54", "X", 2017, 2030)]
    d = ta.answer_durations(queries, facts)
    assert d["A_P54_2014"] == d["A_P54_2015"] == 5
    assert d["A_P54_2016"] == 1  # Y's fact has no end: the queries' run
    assert d["A_P54_2017"] == d["A_P54_2018"] == 14 and d["A_P54_2019"] == 2
    assert d["B_P54_2014"] == 1
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
    assert means["multiple"]["count"] == 2 and means["multiple"]["mean"] == {1: -0.25, 2: -1.5}
    # the 95 % t-interval of each gap's mean: two rows, t(0.975, 1) = 12.706 times the standard error 0.25, 0.5
    assert means["multiple"]["interval"][1] == pytest.approx([-0.25 - 12.7062 * 0.25, -0.25 + 12.7062 * 0.25], abs=1e-3)
    assert means["multiple"]["interval"][2] == pytest.approx([-1.5 - 12.7062 * 0.5, -1.5 + 12.7062 * 0.5], abs=1e-3)
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


def test_the_studys_durations_come_from_the_worlds_fact_spans(tmp_path):
    """On the embedded world the study groups queries by the span of their answer's fact (the paper's "duration of
    their corresponding facts in Wikidata"), which starts before the queried years for most facts; a TempLAMA
    release's rows carry no spans, and the queries' own run of years is used."""
    from templm.data import TemplamaReader
    from templm.data.world import WorldConfig, generate_world
    from templm.experiments.reproduce import TaskData, world_fact_spans

    data_dir = tmp_path / "data"
    generate_world(WorldConfig(seed=5, start_year=2014, end_year=2017, subjects_per_relation=6, docs_per_month=2),
                   str(data_dir / "world"))
    data = TaskData(str(data_dir), {}, [2014, 2015], [2016, 2017], "embedded world", {}, 2)
    queries = list(TemplamaReader(str(data_dir / "world" / "templama" / "test.jsonl")))
    spans = world_fact_spans(data)
    from_facts, from_queries = ta.answer_durations(queries, spans), ta.answer_durations(queries)
    assert set(from_facts) == set(from_queries)
    # A fact spans at least its run of queried years, unless the same answer came back in a later fact of the next
    # year (two facts, one run of queries): rare.
    assert sum(from_facts[i] >= from_queries[i] for i in from_queries) >= 0.9 * len(queries)
    assert sum(from_facts[i] > from_queries[i] for i in from_queries) > len(queries) / 4  # begun before 2014
    import shutil

    shutil.copytree(data_dir / "world" / "templama", tmp_path / "release")
    release = TaskData(str(data_dir), {"config": {"templama_dir": str(tmp_path / "release")}}, [2014, 2015],
                       [2016, 2017], "corpus", {}, 2)
    assert world_fact_spans(release) is None
