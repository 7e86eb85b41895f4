"""tools/world_stats.py: the world's statistics beside the papers' come from counting, on inputs whose counts are
known here, and README's table is the tool's."""

import datetime
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tools"))

import world_stats  # noqa: E402

D = datetime.date


def test_year_mentions_count_sentences_naming_a_year_and_their_own_year():
    sents = [(D(2015, 3, 1), "The club moved in 2015."), (D(2015, 3, 1), "It began in 2012 and in 2015."),
             (D(2016, 1, 2), "No year here, 12015 or 201 is none."), (D(2016, 5, 5), "Since 1999 it was so.")]
    assert world_stats.year_mentions(sents) == {"year_mentions": 0.75, "publication_year_mentions": 0.5}


def test_novel_words_are_the_test_months_words_the_training_period_never_saw():
    cutoff, start, end = D(2017, 12, 31), D(2018, 4, 1), D(2018, 12, 31)
    docs = [(D(2017, 6, 1), "alpha beta gamma"), (D(2018, 2, 1), "zeta in validation only"),  # not counted
            (D(2018, 4, 2), "alpha zeta"), (D(2018, 5, 2), "zeta"), (D(2018, 6, 2), "zeta beta"),
            (D(2018, 7, 2), "zeta"), (D(2018, 8, 2), "zeta omega"), (D(2019, 1, 5), "omega omega omega")]
    found = world_stats.novel_words(docs, cutoff, start, end)
    # test tokens: alpha zeta zeta zeta beta zeta zeta omega = 8, novel: 5 zeta + 1 omega = 6
    assert found["novel_tokens"] == pytest.approx(6 / 8)
    assert found["novel_types"] == pytest.approx(2 / 4)  # zeta and omega of alpha, beta, zeta, omega
    assert found["novel_reappear"] == pytest.approx(1 / 2)  # zeta: four months after its first; omega: none


def test_answer_changes_compare_each_year_with_the_year_before():
    def row(subject, year, *answers):
        return {"id": f"{subject}_P54_{year}", "answer": [{"wikidata_id": a} for a in answers]}

    rows = [row("Q1", 2014, "A"), row("Q1", 2015, "A"), row("Q1", 2016, "B"), row("Q1", 2018, "C"),
            row("Q2", 2014, "A", "B"), row("Q2", 2015, "B", "A")]
    # consecutive pairs: Q1 2014-15 same, 2015-16 changed (2016-18 is not consecutive), Q2 2014-15 same
    assert world_stats.answer_changes(rows) == {"answer_changes": pytest.approx(1 / 3),
                                                "multi_answer": pytest.approx(2 / 6)}


def test_readme_holds_the_tools_table_between_its_markers():
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    block = readme.split(world_stats.BEGIN, 1)[1].split(world_stats.END, 1)[0]
    for _, what, paper in world_stats.ROWS:
        assert f"| {what} |" in block and f"| {paper} |" in block
    assert "`python tools/world_stats.py --presets" in block


def test_unstated_answers_are_the_queries_no_sentence_of_their_year_states():
    stated = {("Q1", "P54", "A", 2014), ("Q1", "P54", "B", 2016), ("Q2", "P54", "B", 2015)}
    rows = [{"id": "Q1_P54_2014", "answer": [{"wikidata_id": "A"}]},  # stated
            {"id": "Q1_P54_2015", "answer": [{"wikidata_id": "A"}]},  # stated in 2014 only: a year away
            {"id": "Q1_P54_2016", "answer": [{"wikidata_id": "B"}]},  # stated
            {"id": "Q2_P54_2015", "answer": [{"wikidata_id": "A"}, {"wikidata_id": "B"}]},  # one answer stated
            {"id": "Q2_P108_2015", "answer": [{"wikidata_id": "B"}]}]  # another relation
    assert world_stats.unstated_answers(rows, stated) == {"unstated_answers": pytest.approx(2 / 5)}
