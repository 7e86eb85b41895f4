"""The CALM stream: a seeded sequence of token windows that switches between the classes of a CALM corpus.

The corpus (layout, vocabulary, token cache) is `calm_corpus`; the per-batch loss log is `calm_log`.

The stream
----------
Each class's token array is cut into `batch_size` equal rows (the classic LM batchify; the remainder of
``len % batch_size`` tokens is dropped), giving a ``[batch_size, rows]`` stream. A batch is ``inputs =
stream[:, p:p+window_size]`` and ``targets = stream[:, p+1:p+window_size+1]``; the class's position `p` then moves on
by `window_size`, and a later segment of the class resumes at exactly that position. When fewer than
``window_size + 1`` columns remain, the class wraps around to position 0 (`class_wraps` counts how often). A class
needs at least ``window_size + 1`` columns (``batch_size * (window_size + 1)`` tokens), otherwise its file is a
`DataError`.

Segments: the class order holds every class `nswitches` times with no class directly after itself (the original
shuffles and then swaps up to 1000 times, which may leave repeats; here the order is drawn position by position among
the classes that keep a repeat-free completion possible, each with probability proportional to its remaining
count, so it never fails; at least two classes are required). Segment lengths in batches follow `segment_lengths`,
with ``m = switch_frequency / window_size / batch_size``:

- "original" (the default): the law of the original CALM code, a continuous exponential of scale `m` shifted by
  ``0.1 m`` and truncated ``10 m`` scales later (scipy's ``truncexpon(b=10 m, loc=0.1 m, scale=m)``), rounded to
  the nearest integer and raised to at least 1. Its mean is above `m` (about ``1.1 m`` plus the rounding's share);
- "exact_mean": a discrete truncated exponential with support ``1 .. ceil(10 * m)`` and ``P(k) ~ exp(-lambda *
  k)``, `lambda` solved so that the mean is exactly `m`; every segment is one batch when ``m <= 1``.

ALL draws come from ``numpy.random.default_rng(seed)``: first the class order, then the segment lengths in segment
order (the original draws each class's lengths apart; the lengths are independent of the order and of each other,
so the stream's law is the same).
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
from scipy import stats

from templm.data.calm_corpus import LEVELS, CalmVocabulary, class_files, load_class_tokens, read_vocabulary
from templm.errors import DataError

LENGTH_CAP_FACTOR = 10  # segment lengths are capped at ceil(LENGTH_CAP_FACTOR * mean)
SEGMENT_LAWS = ("original", "exact_mean")  # the segment length laws (module docstring)


def check_segment_law(law: str) -> None:
    """A ValueError naming the choices unless `law` is one of SEGMENT_LAWS."""
    if law not in SEGMENT_LAWS:
        raise ValueError(f"segment_lengths must be one of {SEGMENT_LAWS}, got {law!r}")


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


def draw_segment_lengths(rng: np.random.Generator, mean: float, n: int, law: str = "exact_mean") -> np.ndarray:
    """`n` segment lengths (int64, in batches) for a configured mean of `mean` batches, by `law` (module docstring):
    "exact_mean" (see `segment_length_rate`; all 1 when mean <= 1) or "original" (the original CALM's law)."""
    check_segment_law(law)
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if not mean > 0 or not math.isfinite(mean):
        raise ValueError(f"mean segment length must be a positive number, got {mean}")
    if law == "original":
        law_of_x = stats.truncexpon(b=LENGTH_CAP_FACTOR * mean, loc=0.1 * mean, scale=mean)
        return np.maximum(1, np.rint(law_of_x.rvs(size=n, random_state=rng))).astype(np.int64)
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
    """The CALM stream over the corpus at `corpus_path` (layout: `calm_corpus`; segmentation and seed: the module
    docstring). With `calm_log.LossLogger`, `calm_log.read_loss_log` and `templm.metrics.calm.compute_metrics`:

        calm = CALM("data/news", "char", switch_frequency=10000, nswitches=100, window_size=20, batch_size=10, seed=0)
        with LossLogger("loss_log.jsonl") as log:
            for item in calm:
                loss = evaluate(item.inputs, item.targets)   # score first ...
                train(item.inputs, item.targets)            # ... then learn
                log.log(item, loss)
        print(compute_metrics(read_loss_log("loss_log.jsonl")))

    Iterating again replays the identical stream. `cache=False` tokenises without reading or writing the cache;
    `segment_lengths` is the segment length law, "original" or "exact_mean" (module docstring).
    """

    def __init__(self, corpus_path: str, model_level: str, switch_frequency: float, nswitches: int,
                 window_size: int, batch_size: int, seed: int, cache: bool = True,
                 segment_lengths: str = "original"):
        check_segment_law(segment_lengths)
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
        self.segment_lengths = segment_lengths
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
        lengths = draw_segment_lengths(rng, self.mean_segment_length, len(order), segment_lengths)
        self._segments: Tuple[Tuple[int, int], ...] = tuple((int(c), int(n)) for c, n in zip(order, lengths))
        self._current: Optional[CalmBatch] = None

    @property
    def mean_segment_length(self) -> float:
        """m = switch_frequency / window_size / batch_size, in batches: the "exact_mean" law's mean, the "original"
        law's exponential scale (module docstring)."""
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
# Where the stream wraps and switches.


def class_wraps(stream: CALM) -> Dict[str, int]:
    """How many times each class of the stream runs out of text and restarts from its beginning."""
    used = [0] * len(stream.class_names)
    for domain, length in stream.segments:
        used[domain] += length
    out = {}
    for d, name in enumerate(stream.class_names):
        per_pass = (stream.class_stream(d).shape[1] - 1) // stream.window_size
        out[name] = max(0, used[d] - 1) // per_pass
    return out


def switch_points(sequence: Sequence[int]) -> List[int]:
    """Batch indices where a new segment starts (the first batch excluded), from the batches' segment ids."""
    s = np.asarray(sequence)
    return [int(i) for i in np.flatnonzero(s[1:] != s[:-1]) + 1]
