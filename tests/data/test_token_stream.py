"""The test stream: pieces and Moses words aligned through character offsets (hand-made tokenisations and
SentencePiece's UTF-8 offsets), documents in date order, months, and the part length of the stream's layout."""

import datetime
import math

import numpy as np
import pytest

from templm.data.records import Document
from templm.data.token_stream import (EOS_WORD, assign_pieces, build_stream, encode_with_offsets, month_number,
                                      month_of, part_length, stream_word_counts, word_counts)
from templm.metrics.stream import month_perplexities, word_log_probs

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
    # Word perplexity is over the 8 Moses words; the EOS word's -1.0 counts in subword perplexity only.
    assert agg["overall"]["n_words"] == 8 and agg["overall"]["n_tokens"] == 10
    assert math.isclose(agg["overall"]["word_ppl"], math.exp(4.5 / 8))
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


def test_sentencepiece_offsets_are_characters(stream_spm):
    sp, _ = stream_spm
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


def test_documents_in_date_order_months_and_word_counts():
    texts = {"b b a": ([5, 5, 6], [(0, 1), (2, 3), (4, 5)]), "c a": ([7, 6], [(0, 1), (2, 3)])}
    docs = [Document("late", DAY(2020, 2, 3), "b b a"), Document("early", DAY(2019, 12, 31), "c a")]
    stream = build_stream(docs, HandTokenizer(texts, eos=2))
    assert stream.doc_ids == ["early", "late"] and stream.doc_months == ["2019-12", "2020-02"]
    np.testing.assert_array_equal(stream.tokens, [2, 7, 6, 2, 5, 5, 6, 2])
    assert list(stream.token_months()) == ["2019-12"] * 3 + ["2020-02"] * 4
    assert stream_word_counts(stream) == {"a": 2, "b": 2, "c": 1}
    assert word_counts(["b b a", docs[1]]) == {"b": 2, "a": 2, "c": 1}
    assert month_of(DAY(2020, 2, 3)) == "2020-02"
    assert month_number("2020-01") - month_number("2019-12") == 1


def test_part_length_is_whole_segments():
    assert part_length(19, 2, 4) == 12  # ceil(19 / 2) = 10 -> 12
    assert part_length(16, 1, 16) == 16 and part_length(17, 1, 16) == 32
    with pytest.raises(ValueError, match="must be >= 1"):
        part_length(10, 0, 4)
