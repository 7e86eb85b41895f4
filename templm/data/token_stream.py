"""The test stream of the streaming-perplexity study (Lazaridou et al., "Mind the Gap"): pieces, words and months.

The test documents are read as ONE stream in date order (ties keep their input order): each document's SentencePiece
pieces followed by an end-of-document token (EOS). The stream starts with an EOS too, so the first piece of the first
document is predicted like every other one; "the stream's targets" are ``tokens[1:]`` and every per-token array here
is indexed by target position. For each target the stream remembers its document (and so its month, ``YYYY-MM``) and
its word.

Words. Word-level numbers use the words of the Moses tokenizer (sacremoses ``MosesTokenizer(lang="en")``,
``escape=False``), run line by line, as the paper. A word's log-probability is the sum of its pieces'. Words and
pieces are mapped onto each other through character offsets:

  * piece offsets come from SentencePiece itself (``encode(text, return_type="proto")``: ``begin``/``end`` of every
    piece in the ORIGINAL text, in UTF-8 bytes; converted here to character offsets), so normalisation never shifts
    them;
  * Moses does not report offsets; its words are substrings of the line (it only inserts or removes spaces, and drops
    ASCII control characters), so each word is found left to right: at the next non-space position, else by a search
    a few characters ahead; a word Moses has altered (not found) takes the non-space run at the cursor;
  * a piece belongs to the word containing its first non-space character (so "\u2581" + "Hello" belongs to
    "Hello", and a piece spanning "a," belongs to "a"). A piece with no non-space character (a bare "\u2581") looks
    ahead to the next non-space character; a character outside every word (dropped by Moses) goes to the next word
    (the last word at the end of a document). Words split over several pieces sum them; a word left with no piece
    (its characters inside a piece anchored in the previous word) keeps log-probability 0 and still counts as a word:
    the total log-probability is always the total over pieces, the word count always Moses's count;
  * every EOS is a word of its own (``EOS_WORD``), as ``<eos>`` in WikiText: word-level perplexity is
    exp(-sum of all target log-probabilities / (Moses words + EOS tokens)).

Layout. A stream is evaluated as `batch_size` contiguous parts of equal length (`part_length`: a multiple of the
segment length) that run as the rows of a batch (templm.evaluation.stream_eval); the analyses of which earlier
tokens a prediction could see (templm.metrics.stream) use the same part length.

Both models of a comparison must share the vocabulary: one stream serves both.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import re
from typing import Any, Iterable, List, Optional, Sequence, Tuple

import numpy as np
from sacremoses import MosesTokenizer

from templm.data.records import Document

EOS_WORD = "</s>"
MOSES_LANG = "en"
_SEARCH_AHEAD = 16  # characters a Moses word may sit beyond the cursor (dropped control characters, odd spacing)
_NONSPACE = re.compile(r"\S")

# ----------------------------------------------------------------------------------------------------------------
# Tokenisation with offsets.


def _processor(tokenizer: Any) -> Any:
    """The sentencepiece processor of a seqio vocabulary, or the object itself."""
    if hasattr(tokenizer, "encode_with_offsets"):
        return tokenizer
    return getattr(tokenizer, "tokenizer", tokenizer)


def _byte_to_char(text: str, byte_offsets: np.ndarray) -> np.ndarray:
    """Character offsets of UTF-8 byte offsets that fall on character boundaries (inside a character: its start)."""
    encoded_len = len(text.encode("utf-8"))
    if encoded_len == len(text):
        return byte_offsets
    lengths = np.fromiter((len(c.encode("utf-8")) for c in text), dtype=np.int64, count=len(text))
    starts = np.concatenate([[0], np.cumsum(lengths)])  # byte start of char i; starts[-1] = total bytes
    return np.searchsorted(starts, byte_offsets, side="right") - 1


def encode_with_offsets(tokenizer: Any, text: str) -> Tuple[np.ndarray, np.ndarray]:
    """(piece ids [P] int32, character spans [P, 2] int64 into `text`) of one text.

    tokenizer: a sentencepiece processor, a seqio SentencePieceVocabulary (its `.tokenizer` is used), or any object
    with its own ``encode_with_offsets(text) -> (ids, spans)`` (e.g. a hand-made tokenisation).
    """
    proc = _processor(tokenizer)
    if hasattr(proc, "encode_with_offsets"):
        ids, spans = proc.encode_with_offsets(text)
        ids = np.asarray(ids, np.int32).reshape(-1)
        spans = np.asarray(spans, np.int64).reshape(-1, 2)
        if len(ids) != len(spans):
            raise ValueError(f"tokenizer returned {len(ids)} ids but {len(spans)} spans")
        return ids, spans
    try:
        proto = proc.encode(text, return_type="proto")
    except (TypeError, ValueError):  # sentencepiece < 0.2
        proto = proc.encode(text, out_type="immutable_proto")
    pieces = list(proto.pieces)
    ids = np.fromiter((p.id for p in pieces), dtype=np.int32, count=len(pieces))
    byte_spans = np.array([(p.begin, p.end) for p in pieces], dtype=np.int64).reshape(-1, 2)
    return ids, _byte_to_char(text, byte_spans)


_MOSES = {}


def moses_words(text: str, lang: str = MOSES_LANG) -> List[str]:
    """The Moses words of a text (tokenised line by line, escape=False)."""
    return [w for _, words in _moses_lines(text, lang) for w in words]


def _moses_lines(text: str, lang: str):
    if lang not in _MOSES:
        _MOSES[lang] = MosesTokenizer(lang=lang)
    tok = _MOSES[lang]
    start = 0
    for line in text.splitlines(keepends=True):
        stripped = line.rstrip("\r\n")
        yield start, (tok.tokenize(stripped, escape=False) if stripped.strip() else [])
        start += len(line)


def align_words(text: str, words: Sequence[str], start: int = 0) -> np.ndarray:
    """Character spans [W, 2] of `words` (in order) in `text`, searching from `start` (see the module docstring)."""
    spans = np.zeros((len(words), 2), np.int64)
    pos = start
    n = len(text)
    for k, word in enumerate(words):
        while pos < n and text[pos].isspace():
            pos += 1
        if text.startswith(word, pos):
            begin = pos
        else:
            begin = text.find(word, pos, pos + len(word) + _SEARCH_AHEAD)
        if begin >= 0 and word:
            end = begin + len(word)
        else:  # altered by the tokenizer: take the non-space run at the cursor, at most len(word) characters
            begin = end = pos
            while end < n and not text[end].isspace() and end - begin < max(len(word), 1):
                end += 1
        spans[k] = (begin, end)
        pos = end
    return spans


def word_spans(text: str, lang: str = MOSES_LANG) -> Tuple[List[str], np.ndarray]:
    """(Moses words, their character spans [W, 2]) of a text."""
    words: List[str] = []
    spans = []
    for line_start, line_words in _moses_lines(text, lang):
        if line_words:
            spans.append(align_words(text, line_words, line_start))
            words.extend(line_words)
    return words, (np.concatenate(spans) if spans else np.zeros((0, 2), np.int64))


def assign_pieces(text: str, piece_spans: np.ndarray, spans_of_words: np.ndarray) -> np.ndarray:
    """The word index [P] of every piece: the word containing the piece's first non-space character.

    A piece without one looks ahead to the next non-space character; a character outside every word goes to the next
    word (the last word when none follows). Requires at least one word; word spans sorted and non-overlapping.
    """
    piece_spans = np.asarray(piece_spans, np.int64).reshape(-1, 2)
    spans_of_words = np.asarray(spans_of_words, np.int64).reshape(-1, 2)
    n_words = len(spans_of_words)
    if n_words == 0:
        raise ValueError("assign_pieces needs at least one word")
    nonspace = np.fromiter((m.start() for m in _NONSPACE.finditer(text)), dtype=np.int64)
    if len(nonspace):
        at = np.searchsorted(nonspace, piece_spans[:, 0], side="left")
        anchor = np.where(at < len(nonspace), nonspace[np.minimum(at, len(nonspace) - 1)], len(text))
    else:
        anchor = np.full(len(piece_spans), len(text), np.int64)
    idx = np.searchsorted(spans_of_words[:, 0], anchor, side="right") - 1
    inside = (idx >= 0) & (anchor < spans_of_words[np.maximum(idx, 0), 1])
    return np.where(inside, idx, np.minimum(idx + 1, n_words - 1)).astype(np.int64)


# ----------------------------------------------------------------------------------------------------------------
# The token stream.


@dataclasses.dataclass
class TokenStream:
    """A test stream. tokens [L+1] (a leading EOS, then each document's pieces and an EOS); per target (tokens[1:]):
    token_doc [L], token_word [L]; per word: word_text [W], word_doc [W], word_is_eos [W]; per document:
    doc_ids [D], doc_months [D] ("YYYY-MM"). documents: the sorted test documents, when built from them."""

    tokens: np.ndarray
    token_doc: np.ndarray
    token_word: np.ndarray
    word_text: List[str]
    word_doc: np.ndarray
    word_is_eos: np.ndarray
    doc_ids: List[str]
    doc_months: List[str]
    eos_id: int = 1
    documents: Optional[List[Document]] = None

    def __post_init__(self):
        self.tokens = np.asarray(self.tokens, np.int32)
        self.token_doc = np.asarray(self.token_doc, np.int64)
        self.token_word = np.asarray(self.token_word, np.int64)
        self.word_doc = np.asarray(self.word_doc, np.int64)
        self.word_is_eos = np.asarray(self.word_is_eos, bool)
        n = len(self.tokens) - 1
        if n < 1:
            raise ValueError("a token stream needs at least one target token")
        if self.token_doc.shape != (n,) or self.token_word.shape != (n,):
            raise ValueError(f"token_doc and token_word must have one entry per target ({n})")
        w = len(self.word_text)
        if self.word_doc.shape != (w,) or self.word_is_eos.shape != (w,):
            raise ValueError(f"word_doc and word_is_eos must have one entry per word ({w})")
        if len(self.doc_months) != len(self.doc_ids):
            raise ValueError("doc_ids and doc_months must have one entry per document")
        if n and (self.token_word.min() < 0 or self.token_word.max() >= w):
            raise ValueError("token_word holds an index outside the words")

    @property
    def n_targets(self) -> int:
        return len(self.tokens) - 1

    @property
    def n_words(self) -> int:
        return len(self.word_text)

    @property
    def months(self) -> List[str]:
        return sorted(set(self.doc_months))

    def token_months(self) -> np.ndarray:
        """Month ("YYYY-MM") of every target [L]."""
        return np.asarray(self.doc_months, dtype=object)[self.token_doc]

    def word_first_token(self) -> np.ndarray:
        """Target index [W] of each word's first piece (-1 for a word without pieces)."""
        first = np.full(self.n_words, self.n_targets, np.int64)
        np.minimum.at(first, self.token_word, np.arange(self.n_targets))
        return np.where(first == self.n_targets, -1, first)

    def word_n_pieces(self) -> np.ndarray:
        return np.bincount(self.token_word, minlength=self.n_words)


def month_of(date: datetime.date) -> str:
    return f"{date.year:04d}-{date.month:02d}"


def month_number(month: str) -> int:
    """Months since year 0 of a "YYYY-MM" month: consecutive months differ by 1, across a year boundary too."""
    year, mon = month.split("-")
    return int(year) * 12 + int(mon) - 1


def part_length(n_targets: int, batch_size: int, seg_len: int) -> int:
    """Targets per part when `n_targets` are cut into `batch_size` parallel parts of whole segments of `seg_len`
    (the last part padded): ceil(n_targets / batch_size) rounded up to a multiple of seg_len."""
    if batch_size < 1 or seg_len < 1:
        raise ValueError(f"batch_size and seg_len must be >= 1, got {batch_size} and {seg_len}")
    part = -(-n_targets // batch_size)
    return -(-part // seg_len) * seg_len


def build_stream(documents: Iterable[Document], tokenizer: Any, *, eos_id: Optional[int] = None,
                 lang: str = MOSES_LANG) -> TokenStream:
    """The test stream of `documents` in date order (stable), tokenised with `tokenizer` (see encode_with_offsets),
    each document followed by EOS (`eos_id`, default the processor's eos_id()), with documents, months and words."""
    docs = sorted(documents, key=lambda d: d.date)
    if not docs:
        raise ValueError("build_stream needs at least one document")
    if eos_id is None:
        proc = _processor(tokenizer)
        eos_id = int(proc.eos_id()) if hasattr(proc, "eos_id") else 1
    tokens = [np.array([eos_id], np.int32)]
    token_doc, token_word, word_doc, word_eos = [], [], [], []
    word_text: List[str] = []
    for d, doc in enumerate(docs):
        ids, pspans = encode_with_offsets(tokenizer, doc.text)
        words, wspans = word_spans(doc.text, lang)
        base = len(word_text)
        if words and len(ids):
            local = assign_pieces(doc.text, pspans, wspans)
        else:  # no Moses word: whatever pieces there are belong to the document's EOS word
            local = np.full(len(ids), len(words), np.int64)
        tokens += [ids, np.array([eos_id], np.int32)]
        token_doc.append(np.full(len(ids) + 1, d, np.int64))
        token_word += [base + local, np.array([base + len(words)], np.int64)]
        word_text += words + [EOS_WORD]
        word_doc.append(np.full(len(words) + 1, d, np.int64))
        word_eos.append(np.arange(len(words) + 1) == len(words))
    return TokenStream(tokens=np.concatenate(tokens), token_doc=np.concatenate(token_doc),
                       token_word=np.concatenate(token_word), word_text=word_text,
                       word_doc=np.concatenate(word_doc), word_is_eos=np.concatenate(word_eos),
                       doc_ids=[d.id for d in docs], doc_months=[month_of(d.date) for d in docs], eos_id=eos_id,
                       documents=docs)


def word_counts(documents: Iterable[Any], lang: str = MOSES_LANG) -> collections.Counter:
    """Counter of Moses words over documents (Document records or strings), e.g. the training split."""
    counts: collections.Counter = collections.Counter()
    for doc in documents:
        counts.update(moses_words(doc if isinstance(doc, str) else doc.text, lang))
    return counts


def stream_word_counts(stream: TokenStream) -> collections.Counter:
    """Counter of the stream's Moses words (EOS words excluded)."""
    return collections.Counter(w for w, e in zip(stream.word_text, stream.word_is_eos) if not e)
