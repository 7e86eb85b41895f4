"""Salient spans: sentence splitting, date regexes, the built-in entity detector, SSM examples, cloze queries, and the
built-in detector's recall on the entity mentions the embedded world wrote."""

import importlib.util
import json
import os
import random

import pytest

from templm.data.salient_spans import (
    SENTINEL,
    BuiltinEntityDetector,
    SpacyEntityDetector,
    SsmExample,
    cloze_to_ssm,
    find_dates,
    make_entity_detector,
    salient_spans,
    split_sentences,
    ssm_examples,
)
from templm.data.world import WorldConfig, generate_world


def sentences(text):
    return [text[s:e] for s, e in split_sentences(text)]


def dates(text):
    return [text[s:e] for s, e in find_dates(text)]


def entities(text, detector=None):
    return [text[s:e] for s, e in (detector or BuiltinEntityDetector())(text)]


# -- sentences -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, spans", [
    # Abbreviations and single initials do not end a sentence.
    ("Mr. Smith went home. Dr. Jones stayed.", [(0, 20), (21, 38)]),
    ("The U.S. economy grew. It was fine.", [(0, 22), (23, 35)]),
    ("J. Doe arrived. He left.", [(0, 15), (16, 24)]),
    ("He lives at No. 10 Downing Street.", [(0, 34)]),
    ("See Fig. 3 for details.", [(0, 23)]),
    ("It began in Sept. 2015 and ended.", [(0, 33)]),
    # A closing quote or bracket after the period stays with the sentence; an opening one may start the next.
    ('He said "Stop." Then he left.', [(0, 15), (16, 29)]),
    ("He said 'go.' \"Then\" she left.", [(0, 13), (14, 30)]),
    ("He left (finally.) Then came.", [(0, 18), (19, 29)]),
    ("It costs $5. [Note] here.", [(0, 12), (13, 25)]),
    # ! and ?
    ("Wow! Really? Yes.", [(0, 4), (5, 12), (13, 17)]),
    ("Really?! Yes.", [(0, 8), (9, 13)]),
    ('Why? "Because" he said.', [(0, 4), (5, 23)]),
    # A digit after the period starts a sentence; a decimal point does not end one.
    ("It ended in 2014. 2015 was better.", [(0, 17), (18, 34)]),
    ("Prices rose 3.5 percent. Then fell.", [(0, 24), (25, 35)]),
    # No split without whitespace after the period, nor before a lower-case letter.
    ("He left.Then came.", [(0, 18)]),
    ("the end. lower case start.", [(0, 26)]),
    # Newlines always split; blank lines and surrounding whitespace are dropped.
    ("one\ntwo\n\nthree", [(0, 3), (4, 7), (9, 14)]),
    ("Mr.\nSmith", [(0, 3), (4, 9)]),
    ("  Hi there.   Bye now.  ", [(2, 11), (14, 22)]),
    ("It ended.\tThen more.", [(0, 9), (10, 20)]),
    ("", []),
    ("   \n  ", []),
])
def test_split_sentences_exact_spans(text, spans):
    assert split_sentences(text) == spans


def test_split_sentences_pieces_read_back():
    text = "Mr. Smith met Dr. Jones in the U.S. on Monday. \"Why?\" asked J. Doe!\nNew line (here.) 2015 came."
    assert sentences(text) == ["Mr. Smith met Dr. Jones in the U.S. on Monday.", '"Why?" asked J. Doe!',
                               "New line (here.)", "2015 came."]


@pytest.mark.parametrize("text", ["He met (Mr. Smith) today.", 'She watched "Dr. Who" last night.',
                                  "Ask (J. Doe) now."])
def test_abbreviation_after_opening_bracket_or_quote_does_not_split(text):
    assert split_sentences(text) == [(0, len(text))]


def test_the_word_no_ends_a_sentence():
    assert sentences("The answer was no. He left.") == ["The answer was no.", "He left."]


def test_multi_letter_initials_do_not_split():
    assert sentences("A.B. Smith came. He left.") == ["A.B. Smith came.", "He left."]


# -- dates -----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, expected", [
    ("On 12 March 2014 it rained.", [(3, 16)]),
    ("On March 12, 2014 it rained.", [(3, 17)]),
    ("In March 2014 it rained.", [(3, 13)]),
    ("On 1 May 2014 it rained.", [(3, 13)]),
    ("Sept. 2015 was hot.", [(0, 10)]),
    ("Sept 2015 was hot.", [(0, 9)]),
    ("Sep 2015 was hot.", [(0, 8)]),
    ("By Jan. 5, 2014 it was over.", [(3, 15)]),
    ("By 5 Jan. 2014 it was over.", [(3, 14)]),
    ("ISO 2014-03-12 here", [(4, 14)]),
    ("in 2014, since 1999, until 2020", [(3, 7), (15, 19), (27, 31)]),
    ("In 2014 it rained.", [(3, 7)]),
    ("It rained during 2013.", [(17, 21)]),
    ("It rained by 2019.", [(13, 17)]),
    ("the year 2012 and the season 2013", [(9, 13), (29, 33)]),
])
def test_find_dates_exact_spans(text, expected):
    assert find_dates(text) == expected


@pytest.mark.parametrize("text", [
    "2014 people came.",  # a bare number, no date context
    "He stayed in room 1999.",
    "Call 2014 now.",
    "It rained in 1899.",  # outside 1900-2099
    "It will rain in 2100.",
    "Not a date: 2014-13-40.",  # no month 13
    "12 March 20145",  # no five-digit years
    "Within 2014 steps.",  # 'in' inside a word is no context
    "12 march 2014",  # months are capitalised
])
def test_find_dates_ignores_numbers_that_are_not_dates(text):
    assert find_dates(text) == []


def test_find_dates_longest_match_wins():
    assert dates("On 12 March 2014 it rained.") == ["12 March 2014"]  # not "March 2014"
    assert dates("On March 12, 2014 it rained.") == ["March 12, 2014"]
    assert dates("In 2014-03-12 it rained.") == ["2014-03-12"]  # not the year after "In"
    assert dates("since 12 March 2014 and in May 2015, until 2020.") == ["12 March 2014", "May 2015", "2020"]


def test_mid_year_is_a_date():
    assert dates("Sales fell in mid-2014.") == ["2014"]


# -- entities --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, expected", [
    ("Ann Lee works for Acme Labs.", [(0, 7), (18, 27)]),
    ("She studied at the University of Rufimok last year.", [(19, 40)]),
    ("He met the Minister of Finance of Baloria yesterday.", [(11, 41)]),
    ("He met Ann Lee of Acme Labs today.", [(7, 14), (18, 27)]),  # two names, not one across "of"
    ("Ann Lee of the Green Party spoke.", [(0, 7), (15, 26)]),
    ("The Kalimor Rovers won.", [(4, 18)]),  # "The" dropped
    ("On Monday Ann Lee spoke.", [(10, 17)]),  # "On" and the weekday dropped
    ("As Minister of Health of Tovia, Ann Lee signed.", [(3, 30), (32, 39)]),  # "As" dropped
    ("Supporters of Zazefos United cheered.", [(14, 28)]),  # a common word that starts the sentence
    ("Crowds gathered in Kalimor for the Dupa Games.", [(19, 26), (35, 45)]),  # one-word names mid-sentence
    ("The Bank of England and the Bank of France met.", [(4, 19), (28, 42)]),
    ("He met Ann Lee, Bob Roe and Cy Poe.", [(7, 14), (16, 23), (28, 34)]),
    ("We saw the U.S. Army.", [(11, 20)]),
    ("On 12 March 2014, Ann Lee spoke.", [(18, 25)]),  # the date is no entity
    ("Sales rose in March at Acme Labs.", [(23, 32)]),
    ("Paris is big.", []),  # a lone sentence-initial word is not known as a name
    ("He said I am here.", []),
])
def test_builtin_detector_exact_spans(text, expected):
    assert BuiltinEntityDetector()(text) == expected


def test_sentence_initial_word_known_from_the_same_text():
    text = "Paris is big. We love Paris."
    assert BuiltinEntityDetector()(text) == [(0, 5), (22, 27)]


def test_fit_learns_mid_sentence_capitals_so_initial_university_is_kept():
    text = "University of Rufimok welcomed its student Ann Lee."
    unfitted = BuiltinEntityDetector()
    assert entities(text, unfitted) == ["Rufimok", "Ann Lee"]
    fitted = unfitted.fit(["Students praised the University of Rufimok and Ann Lee."])
    assert fitted.known_names == frozenset({"University", "Rufimok", "Ann", "Lee"})  # not "Students"
    assert unfitted.known_names == frozenset()  # fit returns a new detector
    assert entities(text, fitted) == ["University of Rufimok", "Ann Lee"]
    # A word the corpus never capitalises mid-sentence still opens no name.
    assert entities("Supporters of Zazefos United cheered.", fitted) == ["Zazefos United"]


def test_min_length_counts_characters():
    assert BuiltinEntityDetector()("He met X today.") == []
    assert BuiltinEntityDetector(min_length=1)("He met X today.") == [(7, 8)]


def test_new_inside_a_name_is_kept():
    assert entities("He went to New York.") == ["New York"]


# -- salient spans and SSM examples ----------------------------------------------------------------------------------

TEXT = ("On 12 March 2014, Ann Lee joined Acme Labs. Markets in Kalimor closed higher. "
        "The central bank kept rates steady.")


def test_salient_spans_dates_and_entities_in_text_order():
    assert salient_spans(TEXT) == [(3, 16), (18, 25), (33, 42), (55, 62)]
    assert [TEXT[s:e] for s, e in salient_spans(TEXT)] == ["12 March 2014", "Ann Lee", "Acme Labs", "Kalimor"]


def test_salient_spans_overlaps_resolved_longest_then_earliest():
    text = "Zazefos May 2014 was busy."
    # A plain callable is a valid detector; its spans compete with the dates.
    assert salient_spans(text, detector=lambda t, s: [(12, 16)]) == [(8, 16)]  # the longer date wins
    assert salient_spans(text, detector=lambda t, s: [(0, 11)]) == [(0, 11)]  # the longer entity wins
    assert salient_spans(text, detector=lambda t, s: [(4, 12)]) == [(4, 12)]  # a tie goes to the earlier span
    assert salient_spans(text, detector=lambda t, s: [(0, 7)]) == [(0, 7), (8, 16)]  # no overlap: both kept


def test_ssm_examples_one_per_span_exact():
    assert ssm_examples(TEXT) == [
        SsmExample("On <extra_id_0>, Ann Lee joined Acme Labs.", "12 March 2014", 3, 16),
        SsmExample("On 12 March 2014, <extra_id_0> joined Acme Labs.", "Ann Lee", 18, 25),
        SsmExample("On 12 March 2014, Ann Lee joined <extra_id_0>.", "Acme Labs", 33, 42),
        SsmExample("Markets in <extra_id_0> closed higher.", "Kalimor", 55, 62),
    ]
    for ex in ssm_examples(TEXT):
        assert ex.inputs.count(SENTINEL) == 1
        assert TEXT[ex.start:ex.end] == ex.targets
        assert ex.inputs.replace(SENTINEL, ex.targets) in sentences(TEXT)


def test_ssm_examples_one_per_sentence_seeded():
    def draw(seed):
        return [(ex.targets, ex.start) for ex in ssm_examples(TEXT, one_per_sentence=True, rng=random.Random(seed))]

    # One example per sentence that has a span; the last sentence has none.
    assert draw(0) == [("Ann Lee", 18), ("Kalimor", 55)]
    assert draw(1) == [("12 March 2014", 3), ("Kalimor", 55)]
    assert draw(0) == draw(0)
    assert {draw(seed)[0][0] for seed in range(20)} == {"12 March 2014", "Ann Lee", "Acme Labs"}


def test_ssm_examples_no_spans_no_examples():
    assert ssm_examples("the central bank kept rates steady.") == []
    assert ssm_examples("") == []


def test_cloze_to_ssm():
    assert cloze_to_ssm("Ann Lee plays for _X_.") == "Ann Lee plays for <extra_id_0>."
    assert cloze_to_ssm("_X_ plays for _X_.") == "<extra_id_0> plays for _X_."  # only the first
    with pytest.raises(ValueError, match="no _X_"):
        cloze_to_ssm("Ann Lee plays for Acme Labs.")


# -- detectors by name -----------------------------------------------------------------------------------------------


def test_make_entity_detector_builtin():
    assert make_entity_detector() == BuiltinEntityDetector()
    assert make_entity_detector("builtin") == BuiltinEntityDetector()


@pytest.mark.skipif(importlib.util.find_spec("spacy") is not None, reason="spaCy is installed here")
def test_spacy_detector_without_spacy_says_spacy_is_needed():
    with pytest.raises(ValueError, match=r"'en_core_web_sm' needs spaCy"):
        SpacyEntityDetector("en_core_web_sm")
    with pytest.raises(ValueError, match="needs spaCy"):
        make_entity_detector("en_core_web_sm")


@pytest.mark.skipif(importlib.util.find_spec("spacy") is None, reason="spaCy is not installed here")
def test_spacy_detector_missing_pipeline_says_not_installed():
    with pytest.raises(ValueError, match="is not installed"):
        SpacyEntityDetector("no_such_pipeline_xyz")


# -- recall on the embedded world ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def world_news(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("world") / "w")
    generate_world(WorldConfig(seed=3, start_year=2012, end_year=2014, subjects_per_relation=10, docs_per_month=30),
                   out)
    with open(os.path.join(out, "news.jsonl"), encoding="utf-8") as f:
        docs = [json.loads(line) for line in f]
    with open(os.path.join(out, "mentions.jsonl"), encoding="utf-8") as f:
        mentions = [json.loads(line) for line in f]
    assert [d["id"] for d in docs] == [m["id"] for m in mentions]
    return docs, mentions


def _recall(docs, mentions, find):
    total = hits = 0
    for doc, mention in zip(docs, mentions):
        found = set(find(doc["text"]))
        for start, end, _ in mention["entities"]:
            total += 1
            hits += (start, end) in found
    return hits, total


def test_builtin_detector_recall_on_world_mentions(world_news):
    docs, mentions = world_news
    assert len(docs) == 3 * 12 * 30
    unfitted = BuiltinEntityDetector()
    fitted = unfitted.fit(doc["text"] for doc in docs)
    hits_u, total = _recall(docs, mentions, unfitted)
    hits_f, _ = _recall(docs, mentions, fitted)
    hits_s, _ = _recall(docs, mentions, lambda text: salient_spans(text, fitted))
    assert total > 5000
    recall_u, recall_f, recall_s = hits_u / total, hits_f / total, hits_s / total
    print(f"world entity recall: fitted {recall_f:.4f} ({hits_f}/{total}), unfitted {recall_u:.4f} "
          f"({hits_u}/{total}), salient_spans fitted {recall_s:.4f}")
    assert recall_f >= 0.90
    assert recall_u >= 0.90
    assert hits_f >= hits_u  # fitting only adds sentence-initial names
    assert recall_s >= 0.90  # dates do not swallow the entity spans


def test_world_mentions_read_back_as_the_entity_text(world_news):
    # The spans in mentions.jsonl are what the recall test compares against: they must cut names out of the text.
    docs, mentions = world_news
    for doc, mention in zip(docs[:200], mentions[:200]):
        for start, end, _ in mention["entities"]:
            piece = doc["text"][start:end]
            assert piece and piece == piece.strip() and piece[0].isupper()
