"""Streaming analysis: stream building and word alignment, layout, per-month and relative perplexity, emerging words,
occurrences in and out of context, topics, POS (skipped without spaCy) and the report files."""

import collections
import datetime
import json
import math
import os
import random

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import flax.linen as nn

from templm.data.records import Document
from templm.data.vocab import train_spm
from templm.evaluation.streaming import (EOS_WORD, TokenStream, assign_pieces, assign_topics, build_stream,
                                         context_start, emerging_words, encode_with_offsets, evaluate_stream,
                                         layout_stream, month_perplexities, occurrence_table, pos_tags,
                                         relative_increase, stream_results, topic_perplexity, unlayout,
                                         word_counts, word_log_probs, write_stream_report)
from templm.models.transformer_xl import TXL_CONFIGS, TransformerXL

DAY = datetime.date


class HandTokenizer:
    """A hand-made tokenisation: fixed pieces and character offsets per text."""

    def __init__(self, table, eos=1):
        self.table = table
        self.eos = eos

    def encode_with_offsets(self, text):
        ids, spans = self.table[text]
        return ids, spans

    def eos_id(self):
        return self.eos


def hand_stream(words_per_doc, months):
    """A TokenStream with one piece per word (piece id = 10 + position), each doc followed by its EOS word."""
    tokens, token_doc, token_word, word_text, word_doc, word_eos = [1], [], [], [], [], []
    for d, words in enumerate(words_per_doc):
        for w in words + [EOS_WORD]:
            tokens.append(1 if w == EOS_WORD else 10 + len(tokens))
            token_doc.append(d)
            token_word.append(len(word_text))
            word_text.append(w)
            word_doc.append(d)
            word_eos.append(w == EOS_WORD)
    return TokenStream(tokens=tokens, token_doc=token_doc, token_word=token_word, word_text=word_text,
                       word_doc=word_doc, word_is_eos=word_eos, doc_ids=[f"d{i}" for i in range(len(months))],
                       doc_months=months)


# ------------------------------------------------------------------------------------------------------------------
# Words and pieces.


def test_word_log_probs_on_a_hand_made_tokenisation():
    text = "Hello, world!  It's ok."
    # Moses: Hello , world ! It 's ok .
    pieces = [(0, 3), (3, 6),      # "Hel" | "lo,": spans two words, belongs to Hello (first non-space char)
              (6, 7),              # a bare space: goes to the next word, world
              (7, 10), (10, 13),   # "wor" | "ld!" -> world; "!" gets no piece
              (13, 17),            # "  It" -> It
              (17, 18), (18, 19),  # "'" | "s" -> 's (a word split over two pieces)
              (19, 23)]            # " ok." -> ok; "." gets no piece
    ids = list(range(20, 29))
    tok = HandTokenizer({text: (ids, pieces)})
    stream = build_stream([Document("x", DAY(2021, 3, 9), text)], tok)
    assert stream.word_text == ["Hello", ",", "world", "!", "It", "'s", "ok", ".", EOS_WORD]
    np.testing.assert_array_equal(stream.tokens, [1] + ids + [1])
    np.testing.assert_array_equal(stream.token_word, [0, 0, 2, 2, 2, 4, 5, 5, 6, 8])
    lp = -np.arange(1, 11, dtype=np.float64) / 10  # -0.1 .. -1.0, the last one the EOS
    wlp = word_log_probs(stream, lp)
    np.testing.assert_allclose(wlp, [-0.3, 0, -1.2, 0, -0.6, -1.5, -0.9, 0, -1.0])
    agg = month_perplexities(stream, lp)
    assert agg["overall"]["n_words"] == 9 and agg["overall"]["n_tokens"] == 10
    assert math.isclose(agg["overall"]["word_ppl"], math.exp(5.5 / 9))
    assert math.isclose(agg["overall"]["subword_ppl"], math.exp(5.5 / 10))
    assert list(agg["by_month"]) == ["2021-03"]
    np.testing.assert_array_equal(stream.word_n_pieces(), [2, 0, 3, 0, 1, 2, 1, 0, 1])
    np.testing.assert_array_equal(stream.word_first_token(), [0, -1, 2, -1, 5, 6, 8, -1, 9])


def test_assign_pieces_edges():
    text = " ab  \x01cd"  # words "ab" (1..3) and "cd" (6..8); "\x01" belongs to no word
    words = np.array([[1, 3], [6, 8]])
    pieces = np.array([[0, 0], [0, 2], [2, 3], [3, 5], [5, 6], [6, 8], [8, 8]])
    # empty piece at 0 -> next non-space "a"; " a" -> ab; "b" -> ab; "  " -> looks ahead to "\x01" (in no word) ->
    # the next word cd; "\x01" -> cd; "cd" -> cd; empty piece at the end -> the last word
    np.testing.assert_array_equal(assign_pieces(text, pieces, words), [0, 0, 0, 1, 1, 1, 1])


@pytest.fixture(scope="module")
def spm_model(tmp_path_factory):
    rng = random.Random(3)
    lexicon = ["".join(rng.choice("abcdefghiklmnoprstuvy") for _ in range(rng.randint(2, 7))) for _ in range(60)]
    docs = [Document(f"t{i}", DAY(2019, 1 + i % 12, 1),
                     " ".join(rng.choice(lexicon) for _ in range(12)) + ". Café, naïve!") for i in range(60)]
    path = train_spm(docs, str(tmp_path_factory.mktemp("spm") / "spm"), vocab_size=64, seed=0)
    import sentencepiece
    return sentencepiece.SentencePieceProcessor(model_file=path), lexicon


def test_sentencepiece_offsets_are_characters(spm_model):
    sp, _ = spm_model
    text = "Café  naïve\nrésumé, x"
    ids, spans = encode_with_offsets(sp, text)
    assert len(ids) == len(spans) and spans[-1][1] == len(text)
    # Pieces tile the text (in characters, although SentencePiece reports UTF-8 bytes).
    rebuilt = "".join(text[b:e] for b, e in spans)
    assert rebuilt.replace(" ", "").replace("\n", "") == text.replace(" ", "").replace("\n", "")
    stream = build_stream([Document("r", DAY(2020, 5, 1), text)], sp)
    assert stream.word_text == ["Café", "naïve", "résumé", ",", "x", EOS_WORD]
    np.testing.assert_array_equal(stream.tokens[1:-1], ids)
    for k, w in enumerate(stream.word_text[:-1]):  # the characters of a word's pieces are the word
        assert "".join(text[b:e] for b, e in spans[stream.token_word[:-1] == k]).strip() == w


# ------------------------------------------------------------------------------------------------------------------
# Layout and evaluation.


def test_layout_round_trip():
    tokens = np.arange(100, 120)  # 19 targets
    layout = layout_stream(tokens, batch_size=2, seg_len=4)
    assert layout.inputs.shape == (3, 2, 4) and layout.part_len == 12
    np.testing.assert_array_equal(unlayout(layout, layout.targets), tokens[1:])
    np.testing.assert_array_equal(unlayout(layout, layout.inputs), tokens[:-1])
    assert layout.weights.sum() == 19 and layout.weights[-1, 1, -1] == 0
    np.testing.assert_array_equal(layout.inputs[1, 1], [116, 117, 118, 119])  # part 1 starts at target 12


def test_evaluate_stream_batches_are_independent_streams():
    """With batch_size=2 the first part is evaluated exactly as the first half alone with batch_size=1."""
    model = TransformerXL(TXL_CONFIGS["tiny"])
    params = nn.unbox(jax.jit(model.init)(jax.random.PRNGKey(0), jnp.zeros((1, 16), jnp.int32)))["params"]
    tokens = np.random.default_rng(0).integers(0, 256, 129)
    both = evaluate_stream(model, params, tokens, batch_size=2, seg_len=16, mem_len=16)
    first = evaluate_stream(model, params, tokens[:65], batch_size=1, seg_len=16, mem_len=16)
    assert both.shape == (128,) and first.shape == (64,)
    np.testing.assert_allclose(both[:64], first, atol=1e-5)
    assert np.all(np.isfinite(both)) and np.all(both < 0)


# ------------------------------------------------------------------------------------------------------------------
# Aggregation.


def test_per_month_aggregation_on_hand_made_log_probs():
    stream = hand_stream([["a", "b"], ["c"], ["d", "e", "f"]], ["2020-02", "2020-01", "2020-02"])
    lp = np.array([-1.0, -2.0, -0.5,   -3.0, -1.0,   -0.2, -0.4, -0.6, -0.8])
    # two-piece word in doc 1: merge "c" and its EOS into one word to check sums across pieces
    stream.token_word[3] = stream.token_word[4] = 3
    agg = month_perplexities(stream, lp)
    jan, feb = agg["by_month"]["2020-01"], agg["by_month"]["2020-02"]
    assert list(agg["by_month"]) == ["2020-01", "2020-02"]
    assert jan["n_tokens"] == 2 and math.isclose(jan["subword_ppl"], math.exp(4.0 / 2))
    assert jan["n_words"] == 2 and math.isclose(jan["word_ppl"], math.exp(4.0 / 2))  # (c+EOS: -4, empty word: 0)
    assert feb["n_tokens"] == 7 and math.isclose(feb["subword_ppl"], math.exp(5.5 / 7))
    assert feb["n_words"] == 7 and math.isclose(feb["word_ppl"], math.exp(5.5 / 7))
    assert math.isclose(agg["overall"]["subword_ppl"], math.exp(9.5 / 9))


def test_relative_increase_and_slope():
    ctl = {"2020-01": 100.0, "2020-02": 100.0, "2020-03": 200.0, "2019-12": 50.0}
    ts = {"2020-01": 110.0, "2020-02": 120.0, "2020-03": 260.0}
    per_month, slope, intercept = relative_increase(ts, ctl)
    assert list(per_month) == ["2020-01", "2020-02", "2020-03"]
    np.testing.assert_allclose(list(per_month.values()), [0.1, 0.2, 0.3])
    assert math.isclose(slope, 0.1) and math.isclose(intercept, 0.1, abs_tol=1e-12)
    # A gap counts as months: x = 0 and 3; across a year boundary.
    per_month, slope, intercept = relative_increase({"2019-11": 1.0, "2020-02": 1.6}, {"2019-11": 1.0, "2020-02": 1.0})
    assert math.isclose(slope, 0.2) and math.isclose(intercept, 0.0, abs_tol=1e-12)
    # Scattered points: numpy's least squares by hand.
    x, y = np.array([0, 1, 2, 3.0]), np.array([0.0, 0.3, 0.1, 0.5])
    per_month, slope, intercept = relative_increase({f"2021-0{i + 1}": 100 * (1 + v) for i, v in enumerate(y)},
                                                    {f"2021-0{i + 1}": 100.0 for i in range(4)})
    want_slope = ((x - x.mean()) * (y - y.mean())).sum() / ((x - x.mean()) ** 2).sum()
    assert math.isclose(slope, want_slope) and math.isclose(intercept, y.mean() - want_slope * x.mean())
    _, slope, intercept = relative_increase({"2021-01": 2.0}, {"2021-01": 1.0})
    assert math.isnan(slope) and intercept == 1.0


# ------------------------------------------------------------------------------------------------------------------
# Analyses.


def test_emerging_words_on_a_synthetic_count_table():
    train = collections.Counter({"the": 10000, "covid": 0, "brexit": 10, "vote": 300, "rare": 1, "tweet": 40})
    train["filler"] = 100000 - sum(train.values())  # train total 100,000
    test = collections.Counter({"the": 1000, "covid": 60, "brexit": 80, "vote": 120, "rare": 49, "tweet": 50,
                                "zoom": 50})
    test["filler"] = 10000 - sum(test.values())  # test total 10,000
    # relative frequencies (train, test): brexit 1e-4 vs 8e-3 (80x: in); vote 3e-3 vs 1.2e-2 (4x: out at ratio 5,
    # in at 3); tweet 4e-4 vs 5e-3 (12.5x: in); rare below 50 test occurrences; covid/zoom unseen in training.
    assert emerging_words(train, test) == ["brexit", "covid", "tweet", "zoom"]
    assert emerging_words(train, test, ratio=3.0) == ["vote", "brexit", "covid", "tweet", "zoom"]
    assert emerging_words(train, test, min_test_count=60, ratio=20.0) == ["brexit", "covid"]


def test_occurrence_table_on_a_tiny_hand_made_stream():
    # One piece per word: word k of the stream is target k. Segments of 4, memory 2, one stream.
    doc0 = ["a", "b", "a", "c", "d", "e", "f", "g", "a", "a"]  # targets 0..9, EOS at 10
    doc1 = ["a", "b"]                                            # targets 11, 12 (a new document: firsts again)
    stream = hand_stream([doc0, doc1], ["2020-01", "2020-01"])
    lp = -np.arange(1, stream.n_targets + 1, dtype=np.float64)
    # target 2 ("a", t=2): sees targets from max(0, 2-2-2)-1 = -1: the "a" at 0 is in context.
    # target 8 ("a", t=0): sees from max(0, 8-0-2)-1 = 5: the "a" at 2 is out.
    # target 9 ("a", t=1): sees from max(0, 9-1-2)-1 = 5: the "a" at 8 is in.
    assert list(context_start(np.array([2, 8, 9]), seg_len=4, mem_len=2, part_len=16)) == [-1, 5, 5]
    table = occurrence_table(stream, word_log_probs(stream, lp), seg_len=4, mem_len=2)
    firsts = [0, 1, 3, 4, 5, 6, 7, 11, 12]
    assert table["first"]["n"] == len(firsts)
    assert math.isclose(table["first"]["ppl"], math.exp(sum(k + 1 for k in firsts) / len(firsts)))
    assert table["later_in_context"]["n"] == 2 and math.isclose(table["later_in_context"]["ppl"], math.exp(13 / 2))
    assert table["later_out_of_context"]["n"] == 1 and math.isclose(table["later_out_of_context"]["ppl"],
                                                                    math.exp(9.0))
    only = occurrence_table(stream, word_log_probs(stream, lp), seg_len=4, mem_len=2, only={"b"})
    assert only["first"]["n"] == 2 and only["later_in_context"]["n"] == 0
    # A bigger memory brings the far occurrence into context.
    wide = occurrence_table(stream, word_log_probs(stream, lp), seg_len=4, mem_len=8)
    assert wide["later_in_context"]["n"] == 3 and wide["later_out_of_context"]["n"] == 0
    # Two parallel streams: a part starts with an empty memory.
    assert list(context_start(np.array([16, 17]), seg_len=4, mem_len=8, part_len=16)) == [15, 15]


def test_topics_group_documents_and_perplexity():
    rng = random.Random(0)
    fruit = "apple banana orange fruit juice pear mango lemon".split()
    sport = "goal match football league referee striker keeper penalty".split()
    texts = [" ".join(rng.choice(fruit if d % 2 == 0 else sport) for _ in range(30)) for d in range(6)]
    doc_topic, top_words = assign_topics(texts, n_topics=2, seed=0, n_top_words=4)
    assert len(set(doc_topic[[0, 2, 4]])) == 1 and len(set(doc_topic[[1, 3, 5]])) == 1
    assert doc_topic[0] != doc_topic[1]
    assert set(top_words[doc_topic[0]]) <= set(fruit) and set(top_words[doc_topic[1]]) <= set(sport)
    stream = hand_stream([["x", "y"]] * 6, ["2020-01"] * 6)
    lp = -np.repeat(np.arange(1.0, 7.0), 3)  # every target of doc d has log-prob -(d + 1)
    per_topic = topic_perplexity(stream, lp, doc_topic)
    assert sum(v["n_docs"] for v in per_topic.values()) == 6
    assert math.isclose(per_topic[int(doc_topic[0])]["subword_ppl"], math.exp((1 + 3 + 5) / 3))
    assert math.isclose(per_topic[int(doc_topic[1])]["word_ppl"], math.exp((2 + 4 + 6) / 3))


def test_pos_is_skipped_cleanly_without_spacy():
    stream = hand_stream([["The", "cat", "sat"]], ["2020-01"])
    tags, reason = pos_tags(stream)
    if tags is None:
        assert "spaCy" in reason
    else:
        assert len(tags) == stream.n_words and tags[-1] == "EOS"


# ------------------------------------------------------------------------------------------------------------------
# Results and report.


def test_stream_results_and_report_files(spm_model, tmp_path):
    sp, lexicon = spm_model
    rng = np.random.default_rng(0)
    test_docs = [Document(f"d{i}", DAY(2020, 1 + i % 3, 1 + i),
                          " ".join(["zorblat"] * 3 + [lexicon[j] for j in rng.integers(0, 60, 10)]) + ".")
                 for i in range(9)]
    stream = build_stream(test_docs, sp)
    assert stream.months == ["2020-01", "2020-02", "2020-03"]
    assert [d.date for d in stream.documents] == sorted(d.date for d in test_docs)
    base = -rng.uniform(0.5, 3.0, stream.n_targets)
    months = np.asarray(stream.doc_months)[stream.token_doc]
    drift = np.select([months == "2020-01", months == "2020-02"], [0.0, 0.1], 0.2)
    runs = {"time_stratified": {"static": base - drift, "dynamic": base - drift / 2},
            "control": {"static": base}}
    train_counts = word_counts(" ".join(lexicon[j] for j in rng.integers(0, 60, 400)) for _ in range(5))
    results = stream_results(stream, runs, seg_len=16, mem_len=16, train_counts=train_counts, min_test_count=20,
                             n_topics=2, settings={"model": "tiny"})
    assert [w["word"] for w in results["emerging"]["words"]] == ["zorblat"]
    rel = results["relative"]
    assert rel["static"]["slope"] > rel["dynamic"]["slope"] > 0
    assert abs(rel["static"]["per_month"]["2020-01"]) < 1e-9

    out = tmp_path / "report"
    written = write_stream_report(results, str(out))
    assert set(written) == {"results.json", "report.md", "relative_perplexity.png", "emerging_words.png"}
    assert sorted(os.listdir(out)) == sorted(written)  # no temporary file left
    loaded = json.loads((out / "results.json").read_text())
    assert loaded["months"] == ["2020-01", "2020-02", "2020-03"]
    assert math.isclose(loaded["relative"]["static"]["slope"], rel["static"]["slope"])
    md = (out / "report.md").read_text()
    for heading in ("## Perplexity per month (word level)", "## Emerging words", "## First and later occurrences",
                    "## Perplexity per topic", "| zorblat |"):
        assert heading in md
    for png in ("relative_perplexity.png", "emerging_words.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # A failure half-way leaves the previous report as it was and no temporary files.
    before = (out / "results.json").read_bytes()
    with pytest.raises(TypeError):
        write_stream_report(dict(results, broken=object()), str(out))
    assert (out / "results.json").read_bytes() == before
    assert sorted(os.listdir(out)) == sorted(written)


def test_stream_findings_and_their_report_lines():
    """The streaming half's findings from a hand-made summary: each verdict follows its number's sign."""
    from templm.stream_experiment import stream_findings, summary_markdown

    summary = {"overall_word_ppl": {"time_stratified/static": 12.0, "time_stratified/dynamic": 9.0,
                                    "control/static": 8.0},
               "relative": {"static": {"mean": 0.5, "slope_per_month": -0.01, "first_month": 0.6, "last_month": 0.4},
                            "dynamic": {"mean": 0.1, "slope_per_month": 0.0, "first_month": 0.2, "last_month": 0.0}},
               "dynamic_gain": {"dynamic": -0.25}, "months": ["2018-01", "2018-02"]}
    found = stream_findings(summary)
    assert {k: v["holds"] for k, v in found.items()} == {"gap": True, "growth": False, "dynamic": True}
    assert found["growth"]["evidence"] == "slope -1.00% per month"
    text = summary_markdown(summary)
    assert ("- The gap grows month by month (the fitted slope of the relative increase > 0): **does not appear**."
            in text)
    assert "| time_stratified/dynamic | 9.00 |" in text
    summary["dynamic_gain"] = {}
    assert stream_findings(summary)["dynamic"]["holds"] is None
