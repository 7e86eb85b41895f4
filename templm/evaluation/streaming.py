"""Streaming perplexity across time (Lazaridou et al., "Mind the Gap"): token streams, per-month perplexity, analyses.

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

Layout. `layout_stream` cuts the targets into `batch_size` contiguous parts of equal length (a multiple of the segment
length T; the last part padded with weight 0) that run as the B rows of a batch, in segments of T tokens:
``[N, B, T]`` inputs, targets and weights. `evaluate_stream` scores them with static or dynamic evaluation
(templm.evaluation.dynamic_eval, memory carried across segments and documents) and returns log-probabilities back in
stream order. ``batch_size=1`` is the paper's setting (one stream, the memory always holds the true history); with
B > 1 each part starts with an empty memory.

Analyses (all pure functions of a stream and its log-probabilities):

  * `month_perplexities`: perplexity per test month and overall, subword and word level;
  * `relative_increase`: (ppl_TS - ppl_CTL) / ppl_CTL per month and its least-squares slope per month (Figure 1);
  * `emerging_words`: frequent test words unseen or much rarer in training, and `word_group_perplexity` over them;
  * `occurrence_table`: first versus later occurrences of a word in a document, split by whether the earlier
    occurrence is still in the model's context (segment + memory);
  * `assign_topics` / `topic_perplexity`: scikit-learn LDA topics per document, perplexity per topic;
  * `pos_tags` / `pos_perplexity`: perplexity per part of speech, only when spaCy and an English model are installed.

`stream_results` gathers all of them into one JSON-able dict and `write_stream_report` writes results.json, report.md
and PNG figures. The usual recipe (what `templm stream` does):

    stream = build_stream(test_docs, processor)
    lp = {"time_stratified": {"static": evaluate_stream(model, ts_params, stream),
                              "dynamic": evaluate_stream(model, ts_params, stream, rule="sgd", lr=...)},
          "control": {"static": evaluate_stream(model, ctl_params, stream)}}
    results = stream_results(stream, lp, seg_len=T, mem_len=M, train_counts=word_counts(train_docs))
    write_stream_report(results, out_dir)

Both models must share the vocabulary (one stream serves both); the relative increase is computed at word level.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import json
import math
import os
import re
import tempfile
from typing import Any, Collection, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

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
        from sacremoses import MosesTokenizer
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


# ----------------------------------------------------------------------------------------------------------------
# Layout and evaluation.


@dataclasses.dataclass
class StreamLayout:
    """inputs, targets, weights [N, B, T]; target b*part_len + n*T + t of the stream sits at [n, b, t]."""

    inputs: np.ndarray
    targets: np.ndarray
    weights: np.ndarray
    n_targets: int
    part_len: int
    seg_len: int

    @property
    def batch_size(self) -> int:
        return self.inputs.shape[1]


def layout_stream(tokens: np.ndarray, batch_size: int = 1, seg_len: int = 16) -> StreamLayout:
    """Cut a token stream (targets = tokens[1:]) into `batch_size` parallel parts of segments of `seg_len`."""
    tokens = np.asarray(tokens.tokens if isinstance(tokens, TokenStream) else tokens, np.int32).reshape(-1)
    if batch_size < 1 or seg_len < 1:
        raise ValueError(f"batch_size and seg_len must be >= 1, got {batch_size} and {seg_len}")
    n = len(tokens) - 1
    if n < 1:
        raise ValueError("the stream needs at least two tokens")
    part = -(-n // batch_size)
    part = -(-part // seg_len) * seg_len
    padded = np.zeros(batch_size * part + 1, np.int32)
    padded[:n + 1] = tokens
    starts = np.arange(batch_size)[:, None] * part + np.arange(part)[None, :]  # [B, P]
    n_seg = part // seg_len

    def cut(a):
        return np.ascontiguousarray(a.reshape(batch_size, n_seg, seg_len).transpose(1, 0, 2))

    return StreamLayout(inputs=cut(padded[starts]), targets=cut(padded[starts + 1]),
                        weights=cut((starts < n).astype(np.float32)), n_targets=n, part_len=part, seg_len=seg_len)


def unlayout(layout: StreamLayout, values: Any) -> np.ndarray:
    """Per-target values [N, B, T] back in stream order [n_targets]."""
    values = np.asarray(values)
    return values.transpose(1, 0, 2).reshape(-1)[:layout.n_targets]


def evaluate_stream(model: Any, params: Any, tokens: Any, *, batch_size: int = 1, seg_len: Optional[int] = None,
                    mem_len: Optional[int] = None, rule: Optional[str] = None, lr: float = 0.0,
                    which: Any = "all", decay: float = 0.0, eps: Optional[float] = None, ms: Any = None,
                    normalise_decay: bool = False) -> np.ndarray:
    """Log-probabilities [n_targets] float32 of a stream (a TokenStream or tokens [L+1]) in stream order.

    rule=None: static evaluation; "sgd" / "rms": dynamic evaluation with lr, which, decay, eps, ms, normalise_decay
    (templm.evaluation.dynamic_eval). seg_len defaults to the model's tgt_len, mem_len to its evaluation memory.
    """
    from templm.evaluation import dynamic_eval

    seg_len = model.config.tgt_len if seg_len is None else int(seg_len)
    layout = layout_stream(tokens, batch_size, seg_len)
    segments = (layout.inputs, layout.targets, layout.weights)
    if rule is None:
        lp = dynamic_eval.static_eval_stream(model, params, segments, mem_len)
    else:
        lp = dynamic_eval.dynamic_eval_stream(
            model, params, segments, mem_len, rule, lr, which, decay=decay,
            eps=dynamic_eval.DEFAULT_EPS if eps is None else eps, ms=ms, normalise_decay=normalise_decay)
    return unlayout(layout, lp).astype(np.float32)


# ----------------------------------------------------------------------------------------------------------------
# Aggregation.


def perplexity(log_prob_sum: float, count: int) -> float:
    """exp(-sum / count); nan for count 0."""
    return float(math.exp(-log_prob_sum / count)) if count else float("nan")


def word_log_probs(stream: TokenStream, token_log_probs: Any) -> np.ndarray:
    """Per-word log-probabilities [W]: the sum of each word's pieces (0 for a word without pieces)."""
    lp = np.asarray(token_log_probs, np.float64).reshape(-1)
    if lp.shape != (stream.n_targets,):
        raise ValueError(f"expected {stream.n_targets} token log-probs, got {lp.shape}")
    return np.bincount(stream.token_word, weights=lp, minlength=stream.n_words)


def group_perplexity(log_probs: Any, groups: Sequence[Any]) -> Dict[Any, Dict[str, float]]:
    """{group: {"ppl", "n"}} of log-probs by group label (labels sorted)."""
    lp = np.asarray(log_probs, np.float64).reshape(-1)
    groups = np.asarray(groups)
    out = {}
    for g in sorted(set(groups.tolist())):
        sel = groups == g
        out[g] = {"ppl": perplexity(float(lp[sel].sum()), int(sel.sum())), "n": int(sel.sum())}
    return out


def month_perplexities(stream: TokenStream, token_log_probs: Any) -> Dict[str, Any]:
    """Perplexity overall and per month, subword level (every target, EOS included) and word level (Moses words +
    EOS): {"overall": {...}, "by_month": {month: {...}}}, each {"subword_ppl", "word_ppl", "n_tokens", "n_words"}."""
    tok = np.asarray(token_log_probs, np.float64).reshape(-1)
    wlp = word_log_probs(stream, tok)
    months = np.asarray(stream.doc_months, dtype=object)
    by_token = group_perplexity(tok, months[stream.token_doc])
    by_word = group_perplexity(wlp, months[stream.word_doc])
    by_month = {}
    for m in stream.months:
        t = by_token.get(m, {"ppl": float("nan"), "n": 0})
        w = by_word.get(m, {"ppl": float("nan"), "n": 0})
        by_month[m] = {"subword_ppl": t["ppl"], "word_ppl": w["ppl"], "n_tokens": t["n"], "n_words": w["n"]}
    overall = {"subword_ppl": perplexity(float(tok.sum()), len(tok)),
               "word_ppl": perplexity(float(wlp.sum()), len(wlp)), "n_tokens": len(tok), "n_words": len(wlp)}
    return {"overall": overall, "by_month": by_month}


def _month_number(month: str) -> int:
    year, mon = month.split("-")
    return int(year) * 12 + int(mon) - 1


def relative_increase(ts_by_month: Mapping[str, float], ctl_by_month: Mapping[str, float]
                      ) -> Tuple[Dict[str, float], float, float]:
    """Relative perplexity increase of TIME-STRATIFIED over CONTROL per month, (ts - ctl) / ctl, over the months
    both have, and the least-squares line through it: (per_month, slope per month, intercept at the first month).

    x is the number of months since the first common month (gaps count). With one month the slope is nan and the
    intercept that month's value; with none both are nan.
    """
    months = sorted(set(ts_by_month) & set(ctl_by_month), key=_month_number)
    per_month = {m: (float(ts_by_month[m]) - float(ctl_by_month[m])) / float(ctl_by_month[m]) for m in months}
    if not months:
        return per_month, float("nan"), float("nan")
    if len(months) == 1:
        return per_month, float("nan"), per_month[months[0]]
    x = np.array([_month_number(m) - _month_number(months[0]) for m in months], np.float64)
    y = np.array([per_month[m] for m in months], np.float64)
    slope, intercept = np.polyfit(x, y, 1)
    return per_month, float(slope), float(intercept)


# ----------------------------------------------------------------------------------------------------------------
# Analyses.


def emerging_words(train_counts: Mapping[str, int], test_counts: Mapping[str, int], min_test_count: int = 50,
                   ratio: float = 5.0) -> List[str]:
    """Words with at least `min_test_count` test occurrences that are unseen in training or whose relative
    frequency in training is at least `ratio` times lower than in the test data; most frequent first (ties by word).
    """
    train_total = sum(train_counts.values())
    test_total = sum(test_counts.values())
    out = []
    for word, n in test_counts.items():
        if n < min_test_count:
            continue
        m = train_counts.get(word, 0)
        if m == 0 or (n / test_total) >= ratio * (m / train_total):
            out.append(word)
    return sorted(out, key=lambda w: (-test_counts[w], w))


def word_group_perplexity(stream: TokenStream, word_lp: Any, words: Collection[str]) -> Dict[str, Any]:
    """Word-level perplexity over every occurrence of `words` together and per word: {"overall": {"ppl", "n"},
    "per_word": {word: {"ppl", "n"}}}."""
    wanted = set(words)
    wlp = np.asarray(word_lp, np.float64)
    sel = np.fromiter((w in wanted for w in stream.word_text), dtype=bool, count=stream.n_words)
    sel &= ~stream.word_is_eos
    texts = np.asarray(stream.word_text, dtype=object)
    per_word = group_perplexity(wlp[sel], texts[sel]) if sel.any() else {}
    return {"overall": {"ppl": perplexity(float(wlp[sel].sum()), int(sel.sum())), "n": int(sel.sum())},
            "per_word": {w: per_word.get(w, {"ppl": float("nan"), "n": 0}) for w in words}}


def context_start(target: Any, *, seg_len: int, mem_len: int, part_len: int) -> np.ndarray:
    """The earliest target index whose token the model sees when it predicts `target` (vectorised).

    Target i of part b (i in [b*part_len, (b+1)*part_len)), at offset t = (i - b*part_len) % seg_len in its segment,
    attends to the inputs from max(b*part_len, i - t - mem_len) to i; input k is the token of target k - 1.
    """
    i = np.asarray(target, np.int64)
    part_start = (i // part_len) * part_len
    t = (i - part_start) % seg_len
    return np.maximum(part_start, i - t - mem_len) - 1


OCCURRENCE_CATEGORIES = ("first", "later_in_context", "later_out_of_context")


def occurrence_table(stream: TokenStream, word_lp: Any, *, seg_len: int, mem_len: int, batch_size: int = 1,
                     only: Optional[Collection[str]] = None) -> Dict[str, Dict[str, float]]:
    """Word-level perplexity of first versus later occurrences of a word within its document.

    A later occurrence is "in context" when every piece of the word's previous occurrence in the document is still
    visible to the model when it predicts the later occurrence's first piece (segment + memory, see `context_start`,
    for the layout `layout_stream(stream, batch_size, seg_len)`), "out of context" otherwise. EOS words and words
    without pieces are left out; `only` restricts the table to some words. Returns {category: {"ppl", "n"}}.
    """
    wlp = np.asarray(word_lp, np.float64)
    first_tok = stream.word_first_token()
    part_len = layout_stream(stream.tokens, batch_size, seg_len).part_len
    starts = context_start(np.maximum(first_tok, 0), seg_len=seg_len, mem_len=mem_len, part_len=part_len)
    wanted = None if only is None else set(only)
    sums = dict.fromkeys(OCCURRENCE_CATEGORIES, 0.0)
    counts = dict.fromkeys(OCCURRENCE_CATEGORIES, 0)
    last_seen: Dict[str, int] = {}
    current_doc = -1
    for k, word in enumerate(stream.word_text):
        if stream.word_is_eos[k] or first_tok[k] < 0 or (wanted is not None and word not in wanted):
            continue
        if stream.word_doc[k] != current_doc:
            current_doc = int(stream.word_doc[k])
            last_seen = {}
        previous = last_seen.get(word)
        if previous is None:
            category = "first"
        else:
            category = "later_in_context" if first_tok[previous] >= starts[k] else "later_out_of_context"
        sums[category] += float(wlp[k])
        counts[category] += 1
        last_seen[word] = k
    return {c: {"ppl": perplexity(sums[c], counts[c]), "n": counts[c]} for c in OCCURRENCE_CATEGORIES}


def assign_topics(texts: Sequence[str], n_topics: int = 10, seed: int = 0, max_features: int = 5000,
                  n_top_words: int = 8, max_iter: int = 50) -> Tuple[np.ndarray, List[List[str]]]:
    """LDA topics (scikit-learn LatentDirichletAllocation, batch variational Bayes for `max_iter` passes, over
    CountVectorizer counts of at most `max_features` words, English stop words removed): (argmax topic of each
    document [D], the `n_top_words` heaviest words of each topic)."""
    from sklearn.decomposition import LatentDirichletAllocation
    from sklearn.feature_extraction.text import CountVectorizer

    vectorizer = CountVectorizer(stop_words="english", max_features=max_features)
    try:
        counts = vectorizer.fit_transform(texts)
    except ValueError:  # no word survives (empty or stop-word-only documents)
        return np.zeros(len(texts), np.int64), [[] for _ in range(n_topics)]
    lda = LatentDirichletAllocation(n_components=n_topics, random_state=seed, learning_method="batch",
                                    max_iter=max_iter)
    doc_topic = lda.fit_transform(counts)
    vocab = vectorizer.get_feature_names_out()
    top = [[str(vocab[j]) for j in np.argsort(-row)[:n_top_words]] for row in lda.components_]
    return np.argmax(doc_topic, axis=1).astype(np.int64), top


def topic_perplexity(stream: TokenStream, token_log_probs: Any, doc_topic: Any) -> Dict[int, Dict[str, float]]:
    """{topic: {"subword_ppl", "word_ppl", "n_tokens", "n_words", "n_docs"}} for documents assigned to topics."""
    doc_topic = np.asarray(doc_topic, np.int64)
    tok = np.asarray(token_log_probs, np.float64)
    by_token = group_perplexity(tok, doc_topic[stream.token_doc])
    by_word = group_perplexity(word_log_probs(stream, tok), doc_topic[stream.word_doc])
    n_docs = collections.Counter(doc_topic.tolist())
    return {int(k): {"subword_ppl": by_token[k]["ppl"], "word_ppl": by_word[k]["ppl"], "n_tokens": by_token[k]["n"],
                     "n_words": by_word[k]["n"], "n_docs": n_docs[k]} for k in by_token}


def pos_tags(stream: TokenStream, model_name: str = "en_core_web_sm") -> Tuple[Optional[List[str]], Optional[str]]:
    """Universal POS tag of every word (EOS words: "EOS") with spaCy on the Moses words, or (None, reason) when
    spaCy or its English model is not installed."""
    try:
        import spacy
        from spacy.tokens import Doc
    except ImportError:
        return None, "spaCy is not installed"
    try:
        nlp = spacy.load(model_name, disable=["parser", "ner", "lemmatizer"])
    except (OSError, ImportError) as e:
        return None, f"spaCy model {model_name!r} is not available: {e}"
    tags = ["EOS"] * stream.n_words
    bounds = np.flatnonzero(np.diff(np.concatenate([[-1], stream.word_doc, [-1]])))
    for a, b in zip(bounds[:-1], bounds[1:]):
        idx = [k for k in range(a, b) if not stream.word_is_eos[k]]
        if not idx:
            continue
        doc = Doc(nlp.vocab, words=[stream.word_text[k] for k in idx])
        for _, proc in nlp.pipeline:
            doc = proc(doc)
        for k, token in zip(idx, doc):
            tags[k] = token.pos_ or "X"
    return tags, None


def pos_perplexity(stream: TokenStream, word_lp: Any, tags: Sequence[str]) -> Dict[str, Dict[str, float]]:
    """{POS tag: {"ppl", "n"}} over words (EOS words left out)."""
    keep = ~stream.word_is_eos
    return group_perplexity(np.asarray(word_lp)[keep], np.asarray(tags, dtype=object)[keep])


# ----------------------------------------------------------------------------------------------------------------
# All results.


def stream_results(stream: TokenStream, runs: Mapping[str, Mapping[str, Any]], *, seg_len: int, mem_len: int,
                   batch_size: int = 1, train_counts: Optional[Mapping[str, int]] = None, min_test_count: int = 50,
                   ratio: float = 5.0, n_topics: int = 10, seed: int = 0, primary: str = "time_stratified",
                   baseline: str = "control", topics: bool = True, pos: bool = True,
                   settings: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """Every analysis of a stream as one JSON-able dict.

    runs: {run name: {mode: token log-probs [n_targets]}}, modes "static" and any dynamic variants ("dynamic",
    "dynamic_biases", ...), e.g. {"time_stratified": {"static": lp, "dynamic": lp}, "control": {"static": lp}}.
    relative[mode]: `primary` in that mode against `baseline` STATIC (the paper: a dynamically evaluated
    TIME-STRATIFIED model against the static CONTROL), word level. The per-word analyses (emerging words, occurrences,
    topics, POS) use every mode of `primary`; emerging words need `train_counts`.
    """
    if primary not in runs:
        raise ValueError(f"runs must hold the primary run {primary!r}; got {sorted(runs)}")
    results: Dict[str, Any] = {
        "settings": dict(settings or {}, seg_len=seg_len, mem_len=mem_len, batch_size=batch_size,
                         n_documents=len(stream.doc_ids), n_tokens=stream.n_targets, n_words=stream.n_words),
        "months": stream.months,
        "primary": primary,
        "baseline": baseline,
        "runs": {name: {mode: month_perplexities(stream, lp) for mode, lp in modes.items()}
                 for name, modes in runs.items()},
    }
    modes = list(runs[primary])
    word_lps = {mode: word_log_probs(stream, lp) for mode, lp in runs[primary].items()}

    relative = {}
    if baseline in runs and "static" in runs[baseline]:
        ctl = {m: v["word_ppl"] for m, v in results["runs"][baseline]["static"]["by_month"].items()}
        for mode in modes:
            ts = {m: v["word_ppl"] for m, v in results["runs"][primary][mode]["by_month"].items()}
            per_month, slope, intercept = relative_increase(ts, ctl)
            relative[mode] = {"per_month": per_month, "slope": slope, "intercept": intercept}
    results["relative"] = relative

    if train_counts is not None:
        test_counts = stream_word_counts(stream)
        words = emerging_words(train_counts, test_counts, min_test_count, ratio)
        results["emerging"] = {
            "min_test_count": min_test_count, "ratio": ratio,
            "words": [{"word": w, "train_count": int(train_counts.get(w, 0)), "test_count": int(test_counts[w])}
                      for w in words],
            "perplexity": {mode: word_group_perplexity(stream, word_lps[mode], words) for mode in modes},
        }

    results["occurrences"] = {mode: occurrence_table(stream, word_lps[mode], seg_len=seg_len, mem_len=mem_len,
                                                     batch_size=batch_size) for mode in modes}

    if topics and stream.documents is not None:
        doc_topic, top_words = assign_topics([d.text for d in stream.documents], n_topics, seed)
        results["topics"] = {
            "n_topics": n_topics, "top_words": top_words,
            "perplexity": {mode: topic_perplexity(stream, lp, doc_topic) for mode, lp in runs[primary].items()},
        }

    if pos:
        tags, reason = pos_tags(stream)
        results["pos"] = {"skipped": reason} if tags is None else \
            {"perplexity": {mode: pos_perplexity(stream, word_lps[mode], tags) for mode in modes}}
    return results


# ----------------------------------------------------------------------------------------------------------------
# Report.


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return _jsonable(value.tolist())
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, (datetime.date,)):
        return value.isoformat()
    return value


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    return f"{float(value):.{digits}f}"


def _pct(value: Any) -> str:
    return "-" if value is None or not math.isfinite(float(value)) else f"{100 * float(value):+.2f}%"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> List[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    return lines + [""]


def _markdown(results: Mapping[str, Any]) -> str:
    primary, baseline = results.get("primary", "time_stratified"), results.get("baseline", "control")
    runs = results.get("runs", {})
    modes = list(runs.get(primary, {}))
    out = ["# Streaming perplexity", ""]
    settings = results.get("settings", {})
    if settings:
        out += ["Settings: " + ", ".join(f"{k}={v}" for k, v in settings.items()), ""]

    out += ["## Overall", ""]
    rows = [[name, mode, _fmt(a["overall"]["subword_ppl"]), _fmt(a["overall"]["word_ppl"]),
             _fmt(a["overall"]["n_tokens"]), _fmt(a["overall"]["n_words"])]
            for name, by_mode in runs.items() for mode, a in by_mode.items()]
    out += _table(["run", "mode", "subword ppl", "word ppl", "tokens", "words"], rows)

    relative = results.get("relative", {})
    for level in ("word", "subword"):
        out += [f"## Perplexity per month ({level} level)", ""]
        header = ["month"]
        cols = []
        for name, by_mode in runs.items():
            for mode in by_mode:
                header.append(f"{name} {mode}")
                cols.append((name, mode))
        if level == "word":
            header += [f"relative {mode}" for mode in relative]
        rows = []
        for m in results.get("months", []):
            row = [m] + [_fmt(runs[n][md]["by_month"].get(m, {}).get(f"{level}_ppl")) for n, md in cols]
            if level == "word":
                row += [_pct(relative[mode]["per_month"].get(m)) for mode in relative]
            rows.append(row)
        out += _table(header, rows)
    if relative:
        out += [f"Relative increase = (ppl {primary} - ppl {baseline} static) / ppl {baseline} static, word level; "
                "least-squares line over months:", ""]
        out += _table(["mode", "slope per month", "intercept"],
                      [[mode, _pct(r["slope"]), _pct(r["intercept"])] for mode, r in relative.items()])

    emerging = results.get("emerging")
    if emerging is not None:
        out += [f"## Emerging words (>= {emerging['min_test_count']} test occurrences, unseen in training or "
                f">= {emerging['ratio']}x rarer there)", ""]
        perp = emerging["perplexity"]
        out += ["Pooled word perplexity: " + ", ".join(
            f"{mode} {_fmt(p['overall']['ppl'])} over {p['overall']['n']} occurrences" for mode, p in perp.items()),
            ""]
        rows = [[w["word"], w["train_count"], w["test_count"]] +
                [_fmt(perp[mode]["per_word"].get(w["word"], {}).get("ppl")) for mode in perp]
                for w in emerging["words"]]
        out += _table(["word", "train count", "test count"] + [f"ppl {mode}" for mode in perp], rows)

    occ = results.get("occurrences")
    if occ:
        out += ["## First and later occurrences of a word in a document", ""]
        occ_modes = list(occ)
        rows = [[c, _fmt(occ[occ_modes[0]][c]["n"])] + [_fmt(occ[mode][c]["ppl"]) for mode in occ_modes]
                for c in OCCURRENCE_CATEGORIES]
        out += _table(["occurrence", "words"] + [f"ppl {mode}" for mode in occ_modes], rows)

    topics = results.get("topics")
    if topics:
        out += ["## Perplexity per topic (LDA, word level)", ""]
        perp = topics["perplexity"]
        t_modes = list(perp)
        rows = []
        for k, words in enumerate(topics["top_words"]):
            first = perp[t_modes[0]].get(k) or perp[t_modes[0]].get(str(k))
            if not first:
                continue
            rows.append([k, " ".join(words), first["n_docs"], first["n_words"]] +
                        [_fmt((perp[mode].get(k) or perp[mode].get(str(k)))["word_ppl"]) for mode in t_modes])
        out += _table(["topic", "top words", "docs", "words"] + [f"ppl {mode}" for mode in t_modes], rows)

    pos = results.get("pos")
    if pos is not None:
        out += ["## Perplexity per part of speech", ""]
        if "skipped" in pos:
            out += [f"Skipped: {pos['skipped']}.", ""]
        else:
            perp = pos["perplexity"]
            p_modes = list(perp)
            tags = sorted(perp[p_modes[0]])
            out += _table(["POS", "words"] + [f"ppl {mode}" for mode in p_modes],
                          [[t, perp[p_modes[0]][t]["n"]] + [_fmt(perp[mode][t]["ppl"]) for mode in p_modes]
                           for t in tags])
    return "\n".join(out)


def _figure_relative(results: Mapping[str, Any], path: str) -> bool:
    relative = results.get("relative") or {}
    if not relative:
        return False
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for mode, r in relative.items():
        months = sorted(r["per_month"], key=_month_number)
        if not months:
            continue
        x = np.array([_month_number(m) - _month_number(months[0]) for m in months], np.float64)
        y = np.array([100 * (r["per_month"][m] if r["per_month"][m] is not None else np.nan) for m in months])
        line, = ax.plot(x, y, marker="o", label=f"{mode}")
        if r.get("slope") is not None and math.isfinite(r["slope"]):
            ax.plot(x, 100 * (r["intercept"] + r["slope"] * x), linestyle="--", color=line.get_color(),
                    label=f"{mode} fit ({100 * r['slope']:+.2f}%/month)")
        ax.set_xticks(x)
        ax.set_xticklabels(months, rotation=45, ha="right", fontsize=7)
    ax.axhline(0.0, color="grey", linewidth=0.5)
    ax.set_ylabel("relative perplexity increase over CONTROL (%)")
    ax.set_title("TIME-STRATIFIED vs CONTROL, per test month")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=100)
    return True


def _figure_emerging(results: Mapping[str, Any], path: str, max_words: int = 20) -> bool:
    emerging = results.get("emerging")
    if not emerging or not emerging["words"]:
        return False
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    words = [w["word"] for w in emerging["words"][:max_words]]
    perp = emerging["perplexity"]
    fig = Figure(figsize=(max(5, 0.45 * len(words) + 2), 4))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    width = 0.8 / max(len(perp), 1)
    x = np.arange(len(words))
    highest = 1.0
    for j, (mode, p) in enumerate(perp.items()):
        vals = [p["per_word"].get(w, {}).get("ppl") for w in words]
        vals = [np.nan if v is None else v for v in vals]
        highest = max([highest] + [v for v in vals if np.isfinite(v)])
        ax.bar(x + j * width, vals, width, label=mode)
    ax.set_xticks(x + width * (len(perp) - 1) / 2)
    ax.set_xticklabels(words, rotation=45, ha="right", fontsize=7)
    ax.set_yscale("log")
    ax.set_ylim(1.0, highest * 3.0)  # perplexity >= 1: bars rise from 1, their heights on a log scale
    ax.set_ylabel("word perplexity")
    ax.set_title("Emerging words")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=100)
    return True


def write_stream_report(results: Mapping[str, Any], out_dir: str) -> Dict[str, str]:
    """Writes results.json, report.md, relative_perplexity.png and (with emerging words) emerging_words.png into
    out_dir. Every file is written under a temporary name and renamed into place once all are complete; on an error
    nothing new is left behind. Returns {name: path} of the files written."""
    out_dir = os.fspath(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    clean = _jsonable(results)
    pending: List[Tuple[str, str]] = []

    def temp(name: str) -> str:
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=out_dir)
        os.close(fd)
        pending.append((tmp, os.path.join(out_dir, name)))
        return tmp

    try:
        with open(temp("results.json"), "w", encoding="utf-8") as f:
            json.dump(clean, f, indent=1, sort_keys=False, allow_nan=False)
            f.write("\n")
        with open(temp("report.md"), "w", encoding="utf-8") as f:
            f.write(_markdown(clean) + "\n")
        for name, draw in (("relative_perplexity.png", _figure_relative), ("emerging_words.png", _figure_emerging)):
            tmp = temp(name)
            if not draw(clean, tmp):
                os.remove(tmp)
                pending.pop()
        for tmp, final in pending:
            os.chmod(tmp, 0o644)
            os.replace(tmp, final)
        written = {os.path.basename(final): final for _, final in pending}
        pending = []
        return written
    finally:
        for tmp, _ in pending:
            try:
                os.remove(tmp)
            except OSError:
                pass
