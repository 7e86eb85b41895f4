"""CALM: online continual-learning evaluation of language models on a text stream that switches between classes.

The protocol of Kruszewski et al., "Evaluating Online Continual Learning with CALM": a stream of token windows is
drawn from several classes (languages or domains) and switches class at random points; an online learner scores
every batch (its loss is logged) before it trains on it. This module holds the data and metrics half: the corpus
layout and its tokenised cache, the `CALM` iterator, the loss log and `compute_metrics`, and two corpus builders.

Corpus layout (as the original)
-------------------------------
``<root>/<class>.txt``, one file per class (class name = file stem; classes sorted by name, class index = position
in that order), and ``<root>/vocab/*.vocab``. The vocabulary is the union of the entries of the vocab files, read in
file-name order; each line is ``token`` or ``token<TAB>count`` (the count, when given, must be a non-negative
integer and is otherwise ignored). Surrounding whitespace is stripped from an entry and entries that are empty after
stripping are skipped, so whitespace is never read from a vocab file. Ids:

- ``<unk>`` is always id 0 (`UNK_ID`); a token outside the vocabulary reads as ``<unk>``.
- char level: ids 1, 2, 3 are space, tab and newline (the original adds these three too); word level: id 1 is
  ``<eol>`` (`EOL`), the end-of-line token.
- then the vocab files' entries in order of first appearance (duplicates keep their first id).

Text is read as UTF-8 (invalid bytes are a `DataError` naming the file and line) with ``\\r\\n`` and lone ``\\r``
read as ``\\n``. Char level: one token per character, newlines included. Word level: every line (a final line
without a newline counts as a line; a trailing newline does not start another) is split on whitespace and followed
by ``<eol>``, so line structure survives (the original dropped newlines at word level).

Cache: the token ids of each class are cached beside the data as ``<root>/.cache/<class>.<level>.npy`` (int32) with
``<class>.<level>.json`` recording the sha256 of the source bytes, of the vocabulary (its id-ordered token list) and
of the array. A cache whose hashes do not match is rebuilt; files are written to a temporary name and renamed, array
first, JSON last, so a reader never takes a half-written cache. A corpus directory that cannot be written is read
without caching.

The stream
----------
Each class's token array is cut into `batch_size` equal rows (the classic LM batchify; the remainder of
``len % batch_size`` tokens is dropped), giving a ``[batch_size, rows]`` stream. A batch is ``inputs =
stream[:, p:p+window_size]`` and ``targets = stream[:, p+1:p+window_size+1]``; the class's position `p` then moves on
by `window_size`, and a later segment of the class resumes at exactly that position. When fewer than
``window_size + 1`` columns remain, the class wraps around to position 0. A class needs at least
``window_size + 1`` columns (``batch_size * (window_size + 1)`` tokens), otherwise its file is a `DataError`.

Segments: the class order holds every class `nswitches` times with no class directly after itself (the original
shuffles and then swaps up to 1000 times, which may leave repeats; here the order is drawn position by position among
the classes that keep a repeat-free completion possible, each with probability proportional to its remaining
count, so it never fails; at least two classes are required). Segment lengths in batches follow a discrete
truncated exponential with support ``1 .. ceil(10 * m)`` and ``P(k) ~ exp(-lambda * k)``, where ``m =
switch_frequency / window_size / batch_size`` and `lambda` is solved so that the mean is exactly `m` (the original
draws a continuous truncated exponential shifted by ``0.1 m`` and rounds, which biases the mean); when ``m <= 1``
every segment is one batch. ALL draws come from ``numpy.random.default_rng(seed)``: first the class order, then the
segment lengths in segment order.

The log and the metrics
-----------------------
`log_loss` / `LossLogger` write one JSON line per batch with exactly the original's fields ``loss``, ``domain``
(class index), ``domain_name`` and ``sequence`` (segment id), so logs are comparable with the original's.

`compute_metrics(log_file)` follows the original implementation (germank/CALM ``metrics.py``) in every edge:

- A log whose last line has ``sequence < 99`` (fewer than 100 segments, ids counting from 0) gives ``{}``; so does an
  empty log.
- Burn-in: lines with ``sequence < 50`` are dropped BEFORE anything else, so a burn-in segment never serves as the
  "previous segment of the same class": the first segment of each class after the burn-in is unscored.
- ``loss`` is the mean over all remaining lines; ``total_pp = exp(loss)``, or ``inf`` when ``loss >= 20``.
- Segments are scored in log order. A segment is scored when an earlier remaining segment of its class exists; its
  reference is the mean loss of the most recent such segment. The last segment of the log (which may be cut short)
  is never scored; it still counts in ``loss`` and ``loss_<c>``.
- ``ppl@sw = exp(mean over scored segments of the mean of their first 10 losses)``: a segment with fewer than 10
  batches contributes the mean of all its losses. The mean pools all scored segments (not a mean of class means).
- ``rec`` = mean over scored segments of the number of batches before the first loss strictly below the reference
  (0 when the first batch is already below; the segment length when no loss is below).
- Per class, keyed by class name: ``loss_<c>`` (mean over the class's remaining lines, last segment included),
  ``total_pp_<c>`` (``inf`` when ``loss_<c> >= 20``; the original tested the overall loss here, a slip that is not
  repeated), ``ppl@sw_<c>`` and ``rec_<c>`` over the class's scored segments.
- A mean over nothing is not reported: a class without scored segments has no ``ppl@sw_<c>``/``rec_<c>`` key, and a
  log without any scored segment has no ``ppl@sw``/``rec`` (the original returned NaN there). ``ppl@sw`` is ``inf``
  only where exp overflows.
- Segment ids must not decrease from line to line, a segment keeps one class, and a class index keeps one name;
  anything else (and any malformed line) is a `DataError` naming the file and line.

Corpus builders
---------------
`build_calm_corpus_from_texts` turns a directory of ``*.txt`` files (one class per file) into the layout above, with
``vocab/<class>.vocab`` files of ``token<TAB>count`` lines (most frequent first; whitespace characters are left out
at char level, where space, tab and newline are built in). `build_calm_corpus_from_world` makes one class per news
domain of the embedded world (see `WORLD_DOMAINS` and `world_sentence_source`).
"""

from __future__ import annotations

import collections
import dataclasses
import glob
import hashlib
import json
import logging
import math
import os
import re
import shutil
import tempfile
from typing import IO, Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from templm.data.records import DataError

UNK = "<unk>"
UNK_ID = 0
EOL = "<eol>"
LEVELS = ("char", "word")
CHAR_SPECIALS = (" ", "\t", "\n")

BURN_IN_SEGMENTS = 50  # segments with id below this are dropped from the metrics
MIN_SEGMENTS = 100  # a log needs a segment with id MIN_SEGMENTS - 1 to be scored
SWITCH_WINDOW = 10  # ppl@sw looks at the first this many batches of a segment
MAX_LOG_LOSS = 20.0  # total_pp is inf from this mean loss on
LENGTH_CAP_FACTOR = 10  # segment lengths are capped at ceil(LENGTH_CAP_FACTOR * mean)

CACHE_DIR = ".cache"
_CACHE_FORMAT = 1
LOG_FIELDS = ("loss", "domain", "domain_name", "sequence")

logger = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------------------------------
# Vocabulary and tokenisation.


class CalmVocabulary:
    """Token <-> id for one corpus and level. `tokens[i]` is the token of id i; unknown tokens map to `UNK_ID`."""

    def __init__(self, tokens: Sequence[str], level: str):
        if level not in LEVELS:
            raise ValueError(f"model_level must be one of {LEVELS}, got {level!r}")
        self.level = level
        self.tokens: Tuple[str, ...] = tuple(tokens)
        if not self.tokens or self.tokens[UNK_ID] != UNK:
            raise ValueError(f"id {UNK_ID} must be {UNK!r}")
        self._index = {t: i for i, t in enumerate(self.tokens)}
        if len(self._index) != len(self.tokens):
            raise ValueError("vocabulary tokens must be distinct")
        self.sha256 = hashlib.sha256(json.dumps([level, self.tokens], ensure_ascii=False).encode("utf-8")).hexdigest()

    unk_id = UNK_ID

    def __len__(self) -> int:
        return len(self.tokens)

    def __contains__(self, token: str) -> bool:
        return token in self._index

    def __getitem__(self, i: int) -> str:
        return self.tokens[i]

    def id(self, token: str) -> int:
        return self._index.get(token, UNK_ID)

    def split(self, text: str) -> List[str]:
        """The tokens of `text` at this level (char: characters; word: words of each line, each line closed by
        `EOL`). `text` is taken as already newline-normalised."""
        if self.level == "char":
            return list(text)
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()  # a trailing newline does not start another line
        out: List[str] = []
        for line in lines:
            out.extend(line.split())
            out.append(EOL)
        return out

    def encode(self, text: str) -> np.ndarray:
        """int32 ids of `text`."""
        tokens = self.split(text)
        get = self._index.get
        return np.fromiter((get(t, UNK_ID) for t in tokens), dtype=np.int32, count=len(tokens))

    def decode(self, ids: Sequence[int]) -> str:
        """Char level: the characters joined; word level: the words of a line joined by spaces, `EOL` a newline."""
        tokens = [self.tokens[int(i)] for i in np.asarray(ids).reshape(-1)]
        if self.level == "char":
            return "".join(tokens)
        out, line = [], []
        for token in tokens:
            if token == EOL:
                out.append(" ".join(line) + "\n")
                line = []
            else:
                line.append(token)
        return "".join(out) + " ".join(line)

    def __repr__(self) -> str:
        return f"CalmVocabulary({len(self)} tokens, level={self.level!r})"


def _read_text(path: str) -> Tuple[str, str]:
    """(newline-normalised text, sha256 of the raw bytes); bad UTF-8 is a DataError naming the line."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise DataError(f"cannot read: {e.strerror or e}", path) from e
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise DataError(f"invalid UTF-8 at byte {e.start}; expected UTF-8 text", path, line) from e
    return text.replace("\r\n", "\n").replace("\r", "\n"), hashlib.sha256(raw).hexdigest()


def _vocab_entry(line: str, path: str, lineno: int) -> Optional[str]:
    """The token on one vocab line (`token` or `token<TAB>count`), or None for an entry that is only whitespace."""
    line = line.rstrip("\n")
    if "\t" in line:
        token, count = line.rsplit("\t", 1)
        count = count.strip()
        if not count.isdigit():
            raise DataError(f"expected `token` or `token<TAB>count` with a non-negative integer count, got "
                            f"count {count!r}", path, lineno)
    else:
        token = line
    token = token.strip()
    return token or None


def read_vocabulary(corpus_path: str, model_level: str) -> CalmVocabulary:
    """The vocabulary of a CALM corpus at `model_level` (see the module docstring for ids and file format)."""
    if model_level not in LEVELS:
        raise ValueError(f"model_level must be one of {LEVELS}, got {model_level!r}")
    vocab_dir = os.path.join(corpus_path, "vocab")
    files = sorted(glob.glob(os.path.join(glob.escape(vocab_dir), "*.vocab")))
    if not files:
        raise DataError("no vocabulary: expected one or more vocab/*.vocab files", vocab_dir)
    tokens = [UNK] + (list(CHAR_SPECIALS) if model_level == "char" else [EOL])
    seen = set(tokens)
    for path in files:
        try:
            with open(path, encoding="utf-8") as f:
                for lineno, line in enumerate(f, 1):
                    token = _vocab_entry(line, path, lineno)
                    if token is not None and token not in seen:
                        seen.add(token)
                        tokens.append(token)
        except UnicodeDecodeError as e:
            raise DataError(f"invalid UTF-8: {e.reason}; expected UTF-8 text", path) from e
        except OSError as e:
            raise DataError(f"cannot read: {e.strerror or e}", path) from e
    return CalmVocabulary(tokens, model_level)


def _atomic_write(path: str, write) -> None:
    """Calls write(binary file) on a temporary file beside `path`, then renames it into place."""
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(dir=directory, prefix="." + os.path.basename(path) + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def cache_paths(txt_path: str, level: str) -> Tuple[str, str]:
    """(array path, metadata path) of the token cache of one class file."""
    root, name = os.path.split(txt_path)
    stem = os.path.splitext(name)[0]
    base = os.path.join(root, CACHE_DIR, f"{stem}.{level}")
    return base + ".npy", base + ".json"


def _load_cache(npy_path: str, meta_path: str, source_sha: str, vocab: CalmVocabulary) -> Optional[np.ndarray]:
    try:
        with open(meta_path, encoding="utf-8") as f:
            meta = json.load(f)
        if (meta.get("format") != _CACHE_FORMAT or meta.get("level") != vocab.level
                or meta.get("source_sha256") != source_sha or meta.get("vocab_sha256") != vocab.sha256):
            return None
        ids = np.load(npy_path, allow_pickle=False)
        if ids.dtype != np.int32 or ids.ndim != 1 or ids.shape[0] != meta.get("tokens"):
            return None
        if hashlib.sha256(ids.tobytes()).hexdigest() != meta.get("array_sha256"):
            return None
        if ids.size and (ids.min() < 0 or ids.max() >= len(vocab)):
            return None
        return ids
    except (OSError, ValueError, TypeError, AttributeError):
        return None


def load_class_tokens(txt_path: str, vocab: CalmVocabulary, cache: bool = True) -> np.ndarray:
    """The int32 token ids of one class file, from the cache when it matches the text and vocabulary."""
    text, source_sha = _read_text(txt_path)
    npy_path, meta_path = cache_paths(txt_path, vocab.level)
    if cache:
        ids = _load_cache(npy_path, meta_path, source_sha, vocab)
        if ids is not None:
            return ids
    ids = vocab.encode(text)
    if cache:
        meta = {"format": _CACHE_FORMAT, "level": vocab.level, "source": os.path.basename(txt_path),
                "source_sha256": source_sha, "vocab_sha256": vocab.sha256, "tokens": int(ids.shape[0]),
                "array_sha256": hashlib.sha256(ids.tobytes()).hexdigest()}
        try:
            os.makedirs(os.path.dirname(npy_path), exist_ok=True)
            _atomic_write(npy_path, lambda f: np.save(f, ids, allow_pickle=False))
            _atomic_write(meta_path, lambda f: f.write((json.dumps(meta, indent=1) + "\n").encode("utf-8")))
        except OSError as e:
            logger.warning("CALM: could not write the token cache for %s (%s); continuing without it", txt_path, e)
    return ids


def class_files(corpus_path: str) -> List[str]:
    """The class files of a corpus, sorted by class name; a DataError when there are none."""
    if not os.path.isdir(corpus_path):
        raise DataError("not a directory; expected a CALM corpus (<class>.txt files and vocab/)", corpus_path)
    files = sorted(glob.glob(os.path.join(glob.escape(corpus_path), "*.txt")),
                   key=lambda p: os.path.splitext(os.path.basename(p))[0])
    files = [p for p in files if os.path.isfile(p)]
    if not files:
        raise DataError("no class files: expected one <class>.txt per class", corpus_path)
    return files


# --------------------------------------------------------------------------------------------------------------------
# Random segmentation.


def _truncated_mean(lam: float, cap: int) -> float:
    """Mean of P(k) ~ exp(-lam k) on k = 1..cap."""
    tail = cap / math.expm1(lam * cap) if lam * cap < 700 else 0.0  # the truncation's share; 0 once negligible
    return -1.0 / math.expm1(-lam) - tail


def segment_length_rate(mean: float) -> Tuple[float, int]:
    """(lambda, cap) of the segment length law for a mean of `mean` batches (> 1): P(k) ~ exp(-lambda k), 1 <= k <=
    cap = ceil(LENGTH_CAP_FACTOR * mean), with lambda solved (by bisection) so that the mean is exactly `mean`."""
    cap = max(2, math.ceil(LENGTH_CAP_FACTOR * mean))
    lo, hi = 0.01 / cap, 50.0  # mean(lo) is about (cap + 1) / 2 > mean; mean(hi) is about 1 < mean
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if _truncated_mean(mid, cap) > mean:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi), cap


def draw_segment_lengths(rng: np.random.Generator, mean: float, n: int) -> np.ndarray:
    """`n` segment lengths (int64, in batches) with mean `mean` (see `segment_length_rate`); all 1 when mean <= 1."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if not mean > 0 or not math.isfinite(mean):
        raise ValueError(f"mean segment length must be a positive number, got {mean}")
    if mean <= 1:
        return np.ones(n, dtype=np.int64)
    lam, cap = segment_length_rate(mean)
    u = rng.random(n)
    # Inverse CDF: F(k) = (1 - exp(-lam k)) / (1 - exp(-lam cap)); the smallest k with F(k) >= u.
    total = -math.expm1(-lam * cap)
    k = np.ceil(-np.log1p(-u * total) / lam)
    return np.clip(k, 1, cap).astype(np.int64)


def draw_class_order(rng: np.random.Generator, nclasses: int, nswitches: int) -> List[int]:
    """Every class `nswitches` times, in random order, never one class twice in a row.

    Position by position, the next class is drawn among those that leave a repeat-free completion possible, with
    probability proportional to its remaining count. A multiset of n items whose first item must differ from p can be
    laid out without repeats iff p occurs at most n // 2 times and every other class at most (n + 1) // 2 times.
    """
    if nclasses < 2:
        raise ValueError(f"CALM needs at least two classes, got {nclasses}")
    if nswitches < 1:
        raise ValueError(f"nswitches must be >= 1, got {nswitches}")
    counts = [nswitches] * nclasses
    remaining = nclasses * nswitches
    order: List[int] = []
    prev = -1
    while remaining:
        n_after = remaining - 1
        candidates, weights = [], []
        for c in range(nclasses):
            if counts[c] == 0 or c == prev:
                continue
            counts[c] -= 1
            ok = counts[c] <= n_after // 2 and all(counts[d] <= (n_after + 1) // 2 for d in range(nclasses) if d != c)
            counts[c] += 1
            if ok:
                candidates.append(c)
                weights.append(counts[c])
        if not candidates:  # impossible by the condition above; kept as a guard
            raise RuntimeError("no repeat-free class order exists")
        p = np.asarray(weights, dtype=np.float64)
        choice = candidates[int(rng.choice(len(candidates), p=p / p.sum()))]
        order.append(choice)
        counts[choice] -= 1
        remaining -= 1
        prev = choice
    return order


# --------------------------------------------------------------------------------------------------------------------
# The iterator.


@dataclasses.dataclass(frozen=True)
class CalmBatch:
    """One batch of the stream: `inputs` and `targets` are int32 [batch_size, window_size], targets the inputs'
    next tokens. `domain` is the class index, `domain_name` its name, `sequence` the segment id (from 0) and `batch`
    the batch index within the segment (from 0)."""

    inputs: np.ndarray
    targets: np.ndarray
    domain: int
    domain_name: str
    sequence: int
    batch: int


class CALM:
    """The CALM stream over the corpus at `corpus_path` (see the module docstring for layout, segmentation and seed).

        calm = CALM("data/news", "char", switch_frequency=10000, nswitches=100, window_size=20, batch_size=10, seed=0)
        with LossLogger("loss_log.jsonl") as log:
            for item in calm:
                loss = evaluate(item.inputs, item.targets)   # score first ...
                train(item.inputs, item.targets)            # ... then learn
                log.log(item, loss)
        print(compute_metrics("loss_log.jsonl"))

    Iterating again replays the identical stream. `cache=False` tokenises without reading or writing the cache.
    """

    def __init__(self, corpus_path: str, model_level: str, switch_frequency: float, nswitches: int,
                 window_size: int, batch_size: int, seed: int, cache: bool = True):
        if model_level not in LEVELS:
            raise ValueError(f"model_level must be one of {LEVELS}, got {model_level!r}")
        for name, value in (("nswitches", nswitches), ("window_size", window_size), ("batch_size", batch_size)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if isinstance(switch_frequency, bool) or not isinstance(switch_frequency, (int, float, np.integer,
                                                                                    np.floating)) \
                or not math.isfinite(switch_frequency) or switch_frequency <= 0:
            raise ValueError(f"switch_frequency must be a positive number of tokens, got {switch_frequency!r}")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
        self.corpus_path = corpus_path
        self.model_level = model_level
        self.switch_frequency = float(switch_frequency)
        self.nswitches = int(nswitches)
        self.window_size = int(window_size)
        self.batch_size = int(batch_size)
        self.seed = int(seed)
        files = class_files(corpus_path)
        if len(files) < 2:
            raise DataError(f"CALM needs at least two classes, found {len(files)} <class>.txt file", corpus_path)
        self._vocab = read_vocabulary(corpus_path, model_level)
        self._class_names = tuple(os.path.splitext(os.path.basename(p))[0] for p in files)
        self._streams: List[np.ndarray] = []
        for path in files:
            ids = load_class_tokens(path, self._vocab, cache=cache)
            rows = ids.shape[0] // self.batch_size
            if rows < self.window_size + 1:
                raise DataError(f"{ids.shape[0]} {model_level} tokens are too few: batch_size {self.batch_size} x "
                                f"(window_size {self.window_size} + 1) = "
                                f"{self.batch_size * (self.window_size + 1)} needed", path)
            stream = ids[: rows * self.batch_size].reshape(self.batch_size, rows).copy()
            stream.setflags(write=False)
            self._streams.append(stream)
        rng = np.random.default_rng(self.seed)
        order = draw_class_order(rng, len(files), self.nswitches)
        lengths = draw_segment_lengths(rng, self.mean_segment_length, len(order))
        self._segments: Tuple[Tuple[int, int], ...] = tuple((int(c), int(n)) for c, n in zip(order, lengths))
        self._current: Optional[CalmBatch] = None

    @property
    def mean_segment_length(self) -> float:
        """The configured mean segment length in batches: switch_frequency / window_size / batch_size."""
        return self.switch_frequency / self.window_size / self.batch_size

    @property
    def vocab(self) -> CalmVocabulary:
        return self._vocab

    @property
    def class_names(self) -> Tuple[str, ...]:
        return self._class_names

    @property
    def segments(self) -> Tuple[Tuple[int, int], ...]:
        """The planned segments, in stream order: (class index, length in batches)."""
        return self._segments

    @property
    def current(self) -> Optional[CalmBatch]:
        """The batch most recently yielded (None before the first)."""
        return self._current

    def class_stream(self, domain: int) -> np.ndarray:
        """The read-only [batch_size, rows] token stream of class `domain`."""
        return self._streams[domain]

    def __len__(self) -> int:
        """Total number of batches."""
        return sum(n for _, n in self._segments)

    def __iter__(self) -> Iterator[CalmBatch]:
        w = self.window_size
        position = [0] * len(self._streams)
        for sequence, (domain, length) in enumerate(self._segments):
            stream = self._streams[domain]
            name = self._class_names[domain]
            for batch in range(length):
                p = position[domain]
                if p + w + 1 > stream.shape[1]:
                    p = 0  # wrap around to the start of the class's data
                item = CalmBatch(np.ascontiguousarray(stream[:, p:p + w]),
                                 np.ascontiguousarray(stream[:, p + 1:p + w + 1]), domain, name, sequence, batch)
                position[domain] = p + w
                self._current = item
                yield item


# --------------------------------------------------------------------------------------------------------------------
# The loss log.


def _log_fields(item: Union[CalmBatch, CALM, Mapping[str, Any]]) -> Tuple[int, str, int]:
    if isinstance(item, CALM):
        if item.current is None:
            raise ValueError("the CALM iterator has not yielded a batch yet")
        item = item.current
    if isinstance(item, CalmBatch):
        return item.domain, item.domain_name, item.sequence
    if isinstance(item, Mapping):
        try:
            return int(item["domain"]), str(item["domain_name"]), int(item["sequence"])
        except KeyError as e:
            raise ValueError(f"a log item needs domain, domain_name and sequence; missing {e}") from None
    raise TypeError(f"expected a CalmBatch, a CALM iterator or a mapping, got {type(item).__name__}")


def log_loss(file: IO[str], item: Union[CalmBatch, CALM, Mapping[str, Any]], loss: Any) -> None:
    """Writes one JSON line `{"loss", "domain", "domain_name", "sequence"}` (the original's fields) to `file`.

    `item` is the batch the loss belongs to (or the CALM iterator, meaning its current batch, as in the original, or a
    mapping with those fields); `loss` is any scalar (numpy and JAX scalars included). NaN is refused; an infinite
    loss is written as Python's json writes it (`Infinity`), which `compute_metrics` reads."""
    domain, domain_name, sequence = _log_fields(item)
    value = float(np.asarray(loss).reshape(()))  # raises on non-scalars
    if math.isnan(value):
        raise ValueError(f"loss is NaN (segment {sequence}, class {domain_name!r})")
    row = {"loss": value, "domain": domain, "domain_name": domain_name, "sequence": sequence}
    file.write(json.dumps(row, ensure_ascii=False) + "\n")


class LossLogger:
    """A loss log written to a temporary file and renamed to `path` on `close()` (a `with` block that raises
    leaves nothing behind). `log(item, loss)` as `log_loss`."""

    def __init__(self, path: str):
        self.path = path
        directory = os.path.dirname(os.path.abspath(path))
        fd, self._tmp = tempfile.mkstemp(dir=directory, prefix="." + os.path.basename(path) + ".", suffix=".tmp")
        self._file: Optional[IO[str]] = os.fdopen(fd, "w", encoding="utf-8")
        self.count = 0

    def log(self, item: Union[CalmBatch, CALM, Mapping[str, Any]], loss: Any) -> None:
        if self._file is None:
            raise ValueError(f"the loss log {self.path} is closed")
        log_loss(self._file, item, loss)
        self.count += 1

    def close(self) -> None:
        if self._file is None:
            return
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        self._file = None
        os.replace(self._tmp, self.path)

    def abort(self) -> None:
        """Discards the log."""
        if self._file is not None:
            self._file.close()
            self._file = None
        try:
            os.unlink(self._tmp)
        except OSError:
            pass

    def __enter__(self) -> "LossLogger":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


# --------------------------------------------------------------------------------------------------------------------
# Metrics.


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def read_loss_log(log_file: str) -> List[Tuple[float, int, str, int]]:
    """The (loss, domain, domain_name, sequence) rows of a loss log, validated (see the module docstring)."""
    rows: List[Tuple[float, int, str, int]] = []
    names: Dict[int, str] = {}
    domains: Dict[str, int] = {}
    try:
        f = open(log_file, encoding="utf-8")
    except OSError as e:
        raise DataError(f"cannot read the loss log: {e.strerror or e}", log_file) from e
    with f:
        lineno = 0
        try:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    raise DataError("empty line; expected a JSON object with loss, domain, domain_name, sequence",
                                    log_file, lineno)
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise DataError(f"not JSON ({e.msg}); expected an object with loss, domain, domain_name, "
                                    f"sequence", log_file, lineno) from None
                if not isinstance(row, dict):
                    raise DataError(f"expected a JSON object, got {type(row).__name__}", log_file, lineno)
                missing = [k for k in LOG_FIELDS if k not in row]
                if missing:
                    raise DataError(f"missing field(s) {', '.join(missing)}", log_file, lineno)
                loss, domain, name, sequence = (row[k] for k in LOG_FIELDS)
                if isinstance(loss, bool) or not isinstance(loss, (int, float)) or math.isnan(loss):
                    raise DataError(f"loss must be a number, got {loss!r}", log_file, lineno)
                if not _is_int(domain) or domain < 0:
                    raise DataError(f"domain must be a class index (integer >= 0), got {domain!r}", log_file,
                                    lineno)
                if not isinstance(name, str):
                    raise DataError(f"domain_name must be a string, got {name!r}", log_file, lineno)
                if not _is_int(sequence) or sequence < 0:
                    raise DataError(f"sequence must be a segment id (integer >= 0), got {sequence!r}", log_file,
                                    lineno)
                if names.setdefault(domain, name) != name:
                    raise DataError(f"class {domain} is named {name!r} here but {names[domain]!r} earlier",
                                    log_file, lineno)
                if domains.setdefault(name, domain) != domain:
                    raise DataError(f"class name {name!r} has index {domain} here but {domains[name]} earlier",
                                    log_file, lineno)
                if rows:
                    prev_sequence, prev_domain = rows[-1][3], rows[-1][1]
                    if sequence < prev_sequence:
                        raise DataError(f"segment id {sequence} after {prev_sequence}; segment ids must not "
                                        f"decrease", log_file, lineno)
                    if sequence == prev_sequence and domain != prev_domain:
                        raise DataError(f"segment {sequence} changes class from {prev_domain} to {domain}",
                                        log_file, lineno)
                rows.append((float(loss), domain, name, sequence))
        except UnicodeDecodeError as e:
            raise DataError(f"invalid UTF-8 ({e.reason})", log_file, lineno + 1) from None
    return rows


def _exp(x: float) -> float:
    try:
        return math.exp(x)
    except OverflowError:
        return float("inf")


def compute_metrics(log_file: str) -> Dict[str, float]:
    """CALM metrics of a loss log: loss, total_pp, ppl@sw, rec and their per-class versions (`<metric>_<class>`).

    `{}` for a log with fewer than 100 segments. Every edge case (burn-in before the previous-segment lookup, the
    unscored last segment, ...) follows the original implementation; see the module docstring."""
    rows = read_loss_log(log_file)
    if not rows or rows[-1][3] < MIN_SEGMENTS - 1:
        return {}
    rows = [r for r in rows if r[3] >= BURN_IN_SEGMENTS]
    losses = np.asarray([r[0] for r in rows], dtype=np.float64)
    # Segments after the burn-in, in log order: (class name, losses).
    segments: List[Tuple[str, np.ndarray]] = []
    start = 0
    for i in range(1, len(rows) + 1):
        if i == len(rows) or rows[i][3] != rows[start][3]:
            segments.append((rows[start][2], losses[start:i]))
            start = i
    loss = float(losses.mean())
    results: Dict[str, float] = {"loss": loss, "total_pp": _exp(loss) if loss < MAX_LOG_LOSS else float("inf")}
    intensity: Dict[str, List[float]] = collections.defaultdict(list)
    duration: Dict[str, List[int]] = collections.defaultdict(list)
    previous: Dict[str, float] = {}
    for name, seg in segments[:-1]:  # the last segment may be cut short: never scored
        if name in previous:
            intensity[name].append(float(seg[:SWITCH_WINDOW].mean()))
            below = np.flatnonzero(seg < previous[name])
            duration[name].append(int(below[0]) if below.size else int(seg.size))
        previous[name] = float(seg.mean())
    all_intensity = [x for xs in intensity.values() for x in xs]
    all_duration = [x for xs in duration.values() for x in xs]
    if all_intensity:
        results["ppl@sw"] = _exp(float(np.mean(all_intensity)))
        results["rec"] = float(np.mean(all_duration))
    by_class: Dict[str, List[np.ndarray]] = collections.defaultdict(list)
    for name, seg in segments:
        by_class[name].append(seg)
    for name in sorted(by_class):
        class_loss = float(np.concatenate(by_class[name]).mean())
        results[f"loss_{name}"] = class_loss
        results[f"total_pp_{name}"] = _exp(class_loss) if class_loss < MAX_LOG_LOSS else float("inf")
    for name in sorted(intensity):
        results[f"ppl@sw_{name}"] = _exp(float(np.mean(intensity[name])))
        results[f"rec_{name}"] = float(np.mean(duration[name]))
    return results


# --------------------------------------------------------------------------------------------------------------------
# Corpus builders.


def _vocab_counts(text: str, level: str) -> List[Tuple[str, int]]:
    if level == "char":
        counts = collections.Counter(ch for ch in text if ch.strip())
    else:
        counts = collections.Counter(text.split())
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))


_CLASS_NAME = re.compile(r"^[^/\\\x00]+$")


def write_calm_corpus(texts: Mapping[str, str], out_dir: str, level: str) -> Dict[str, Dict[str, int]]:
    """Writes `texts` ({class name: text}) as a CALM corpus at `out_dir`: `<class>.txt` and `vocab/<class>.vocab`
    (token<TAB>count, most frequent first). Built in `<out_dir>.partial` and renamed, so nothing half-written stays;
    an existing `out_dir` is replaced only when it is empty or a CALM corpus (has vocab/). Returns per-class counts."""
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
    if len(texts) < 1:
        raise ValueError("no classes to write")
    for name in texts:
        if not _CLASS_NAME.match(name) or name in (".", "..") or name.startswith("."):
            raise ValueError(f"class name {name!r} cannot be a file stem")
    out_dir = out_dir.rstrip("/\\") or out_dir
    if os.path.exists(out_dir):
        if not os.path.isdir(out_dir) or (os.listdir(out_dir) and not os.path.isdir(os.path.join(out_dir, "vocab"))):
            raise FileExistsError(f"{out_dir} exists and is not a CALM corpus; refusing to replace it")
    tmp = out_dir + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(os.path.join(tmp, "vocab"))
    stats: Dict[str, Dict[str, int]] = {}
    vocab = CalmVocabulary([UNK] + (list(CHAR_SPECIALS) if level == "char" else [EOL]), level)
    try:
        for name in sorted(texts):
            text = texts[name]
            with open(os.path.join(tmp, f"{name}.txt"), "w", encoding="utf-8", newline="\n") as f:
                f.write(text)
            counts = _vocab_counts(text, level)
            with open(os.path.join(tmp, "vocab", f"{name}.vocab"), "w", encoding="utf-8", newline="\n") as f:
                for token, count in counts:
                    f.write(f"{token}\t{count}\n")
            n_lines = text.count("\n") + (1 if text and not text.endswith("\n") else 0)
            stats[name] = {"lines": n_lines, "tokens": len(vocab.split(text)),
                           "types": len(counts)}
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if os.path.exists(out_dir):
        shutil.rmtree(out_dir)
    os.replace(tmp, out_dir)
    return stats


def build_calm_corpus_from_texts(src_dir: str, out_dir: str, level: str) -> Dict[str, Dict[str, int]]:
    """A CALM corpus at `out_dir` from the `*.txt` files of `src_dir` (one class per file, class = file stem).

    The texts are copied newline-normalised; an empty (or whitespace-only) file is a DataError naming it. Returns
    {class: {"lines", "tokens", "types"}} (tokens at `level`, `<eol>` included at word level)."""
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
    if os.path.realpath(src_dir) == os.path.realpath(out_dir):
        raise ValueError("out_dir must differ from src_dir")
    texts: Dict[str, str] = {}
    for path in class_files(src_dir):
        text, _ = _read_text(path)
        if not text.strip():
            raise DataError("empty class file; expected text", path)
        texts[os.path.splitext(os.path.basename(path))[0]] = text
    return write_calm_corpus(texts, out_dir, level)


# The embedded world's sentences come from templates; each template source belongs to at most one domain.
# Sources: a relation id (its NEWS_TEMPLATES and START_TEMPLATES), "topic:<name>" (TOPICS), "burst"
# (BURST_TEMPLATES), and the calibration relations host_city / based_in / located_in.
WORLD_DOMAINS: Dict[str, Tuple[str, ...]] = {
    "sports": ("P54", "P286", "topic:sport"),
    "politics": ("P39", "P102", "P6"),
    "business": ("P108", "P488", "P127", "based_in", "topic:economy"),
    "education": ("P69",),
    "technology": ("topic:technology",),
    "weather": ("topic:weather",),
    "health": ("topic:health",),
}
# Left out by default: "burst" (storms, scandals, strikes, summits: no single domain), "host_city" (games, cups,
# festivals, expos) and "located_in" (landmarks).

_DATE_PATTERN = r"\d{1,2} [A-Z][a-z]+ \d{4}"
_NAME_PATTERN = r"[A-Z][^.]*?"  # entity names start with a capital and hold no full stop


def _template_pattern(template: str) -> "re.Pattern[str]":
    out = []
    for piece in re.split(r"(\{[a-z]\})", template):
        if piece == "{d}":
            out.append(_DATE_PATTERN)
        elif re.fullmatch(r"\{[a-z]\}", piece):
            out.append(_NAME_PATTERN)
        else:
            out.append(re.escape(piece))
    return re.compile("".join(out))


def world_templates() -> List[Tuple[str, str, "re.Pattern[str]"]]:
    """(source, template, compiled pattern) of every sentence template of the embedded world."""
    from templm.data import world

    out = []
    for relation, templates in world.NEWS_TEMPLATES.items():
        out.extend((relation, t, _template_pattern(t)) for t in templates)
    for relation, templates in world.START_TEMPLATES.items():
        out.extend((relation, t, _template_pattern(t)) for t in templates)
    out.extend(("burst", t, _template_pattern(t)) for t in world.BURST_TEMPLATES)
    for topic, (_, _, templates) in world.TOPICS.items():
        out.extend((f"topic:{topic}", t, _template_pattern(t)) for t in templates)
    return out


def _literal_length(template: str) -> int:
    return len(re.sub(r"\{[a-z]\}", "", template))


def world_sentence_source(sentence: str, templates: Optional[Sequence[Tuple[str, str, "re.Pattern[str]"]]] = None
                          ) -> Optional[str]:
    """The template source of one world sentence (see `WORLD_DOMAINS`), or None when no template matches.

    A sentence matches a template when the whole sentence fits it, entity slots standing for capitalised names
    without full stops and {d} for a date like "4 March 2014". When several templates fit (a short template such as
    "{s} plays for {o}." also fits "X, who plays for Y, was named man of the match."), the one with the most literal
    text wins, ties going to the earlier template in `world_templates()` order."""
    best: Optional[Tuple[int, str]] = None
    for source, template, pattern in (templates if templates is not None else world_templates()):
        if pattern.fullmatch(sentence):
            score = _literal_length(template)
            if best is None or score > best[0]:
                best = (score, source)
    return None if best is None else best[1]


_SENTENCE_SPLIT = re.compile(r"(?<=\.)\s+")


def build_calm_corpus_from_world(world_dir: str, out_dir: str, level: str = "word",
                                 domains: Optional[Mapping[str, Sequence[str]]] = None) -> Dict[str, Any]:
    """A CALM corpus with one class per news domain of the embedded world at `world_dir` (its news.jsonl).

    Each document is cut into sentences after every full stop (the world's sentences end with one and its names hold
    none); each sentence is assigned the template source that `world_sentence_source` finds and the domain of that
    source in `domains` (default `WORLD_DOMAINS`); sentences of other sources, or of none, are left out. A domain
    file holds its sentences one per line, in document order. Domains without sentences are not written. Returns
    {"classes": {domain: {"lines", "tokens", "types"}}, "sentences": n, "left_out": {source or "unmatched": n}}.
    """
    domains = WORLD_DOMAINS if domains is None else domains
    domain_of: Dict[str, str] = {}
    for domain, sources in domains.items():
        for source in sources:
            if source in domain_of and domain_of[source] != domain:
                raise ValueError(f"source {source!r} is in two domains: {domain_of[source]!r} and {domain!r}")
            domain_of[source] = domain
    templates = world_templates()
    known = {s for s, _, _ in templates}
    unknown = sorted(set(domain_of) - known)
    if unknown:
        raise ValueError(f"unknown template source(s) {unknown}; known: {sorted(known)}")
    path = os.path.join(world_dir, "news.jsonl")
    lines: Dict[str, List[str]] = collections.defaultdict(list)
    left_out: Dict[str, int] = collections.Counter()
    total = 0
    try:
        f = open(path, encoding="utf-8")
    except OSError as e:
        raise DataError(f"cannot read the world's news: {e.strerror or e}", path) from e
    with f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                doc = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"not JSON ({e.msg}); expected a document object", path, lineno) from None
            if not isinstance(doc, dict) or not isinstance(doc.get("text"), str):
                raise DataError("expected an object with a string field `text`", path, lineno)
            for sentence in _SENTENCE_SPLIT.split(doc["text"].strip()):
                sentence = " ".join(sentence.split())
                if not sentence:
                    continue
                total += 1
                source = world_sentence_source(sentence, templates)
                domain = domain_of.get(source) if source is not None else None
                if domain is None:
                    left_out[source or "unmatched"] += 1
                else:
                    lines[domain].append(sentence)
    if not lines:
        raise DataError("no sentence of the world's news falls in any domain", path)
    texts = {domain: "\n".join(ls) + "\n" for domain, ls in lines.items()}
    classes = write_calm_corpus(texts, out_dir, level)
    return {"classes": classes, "sentences": total, "left_out": dict(sorted(left_out.items()))}
