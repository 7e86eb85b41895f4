"""The training data of a language model: the documents of one split, tokenised and laid out as parallel streams.

The documents a split file names (`templm data splits`: TIME-STRATIFIED or CONTROL train) are read from the corpus
and ordered

  * ``order="date"`` (default): by date, then id -- the order of the split file, the paper's setting; every epoch
    reads the same stream;
  * ``order="shuffle"``: by a permutation of whole documents drawn for each epoch e from
    ``numpy.random.default_rng([seed, e])``; documents stay intact, only their order changes. A short run then sees
    documents from the whole training period rather than its first weeks (the smoke experiment uses this).

Each document is tokenised with the SentencePiece model and followed by EOS; the epoch's stream starts with an EOS
too (exactly the layout of the test stream in templm.data.token_stream). The stream is cut into `batch_size`
contiguous rows of equal length (the classic `batchify`: row b holds tokens [b*n, (b+1)*n)) and the rows are read
side by side in segments of `seg_len` tokens: step k of an epoch takes inputs ``rows[:, kT:(k+1)T]`` and targets
``rows[:, kT+1:(k+1)T+1]``. The few tokens that do not fill a segment at the end of a row are dropped.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from typing import Any, Dict, Iterable, List, Optional, Tuple

import numpy as np

from templm import paths
from templm.data.readers import Corpus, describe_corpus
from templm.data.records import Document
from templm.data.splits import apply_split
from templm.data.vocab import load_vocabulary
from templm.errors import DataError

DATA_ORDERS = ("date", "shuffle")


def split_path(split_file: Optional[str], split_dir: Optional[str], split: str) -> str:
    """The split file: `split_file` if given, else `split_dir/split.gz` (the WMT release and `templm data splits`), or
    `split_dir/split` where only that exists (a release folder that was gunzipped: the release gzips every file)."""
    if split_file:
        return os.fspath(split_file)
    if not split_dir:
        raise ValueError("give a split file (split_file) or a split folder (split_dir) and a split name")
    compressed = paths.join(os.fspath(split_dir), f"{split}.gz")
    plain = paths.join(os.fspath(split_dir), split)
    return plain if not paths.exists(compressed) and paths.isfile(plain) else compressed


def require_split_file(split_file: str) -> None:
    """A DataError naming a split file that does not exist."""
    if not paths.exists(split_file):
        raise DataError("no such split file (write one with `templm data splits`)", split_file)


def read_split_documents(corpus: Corpus, split_file: str, format: str = "auto", on_error: str = "raise",
                         allow_missing: bool = False) -> List[Document]:
    """The documents of `corpus` that `split_file` names, sorted by date then id.

    Raises DataError naming the split file when it does not exist, names no document, or names ids the corpus does
    not hold (unless allow_missing: then a warning).
    """
    split_file = os.fspath(split_file)
    require_split_file(split_file)
    where = describe_corpus(corpus)
    docs_iter, report = apply_split(corpus, split_file, format, on_error)
    docs = sorted(docs_iter, key=lambda d: (d.date, d.id))
    if report.missing and not allow_missing:
        raise DataError(f"{report.missing} of the {report.expected} document ids of this split are not in the "
                        f"corpus {where} (first: {', '.join(report.missing_ids)}); is it the split of another "
                        "corpus?", split_file)
    if not docs:
        raise DataError(f"none of the split's {report.expected} ids is in the corpus {where}", split_file)
    return docs


def load_processor(spm_model: str):
    """The sentencepiece processor of a T5-style SentencePiece model (checked by templm.data.vocab), without seqio's
    sentinel ids: a language model needs only the trained pieces (ids 0 .. get_piece_size() - 1)."""
    return load_vocabulary(os.fspath(spm_model), extra_ids=0).tokenizer


def tokenize_documents(documents: Iterable[Document], processor: Any) -> Tuple[np.ndarray, np.ndarray]:
    """(tokens, offsets): every document's pieces followed by EOS, concatenated (int32), and the start of each
    document in it [D + 1] (document d is tokens[offsets[d]:offsets[d+1]], its EOS last)."""
    texts = [d.text for d in documents]
    eos = int(processor.eos_id())
    pieces = processor.encode(texts) if texts else []
    lengths = np.array([len(p) + 1 for p in pieces], np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    tokens = np.empty(int(offsets[-1]), np.int32)
    for d, p in enumerate(pieces):
        tokens[offsets[d]:offsets[d + 1] - 1] = p
        tokens[offsets[d + 1] - 1] = eos
    return tokens, offsets


@dataclasses.dataclass
class LMData:
    """Tokenised documents laid out as `batch_size` parallel streams in segments of `seg_len` (module docstring).

    `batch(position)` is the segment at a data position (a global step): epoch = position // segments_per_epoch,
    segment k = position % segments_per_epoch; `reset` is 1 on every row at k = 0 (start the memory afresh).
    """

    tokens: np.ndarray
    offsets: np.ndarray
    eos_id: int
    batch_size: int
    seg_len: int
    order: str = "date"
    seed: int = 0

    def __post_init__(self):
        if self.order not in DATA_ORDERS:
            raise ValueError(f"data_order must be one of {DATA_ORDERS}, got {self.order!r}")
        if self.batch_size < 1 or self.seg_len < 1:
            raise ValueError(f"batch_size and tgt_len must be >= 1, got {self.batch_size} and {self.seg_len}")
        self._epoch = None
        self._rows = None

    @property
    def n_documents(self) -> int:
        return len(self.offsets) - 1

    @property
    def row_len(self) -> int:
        return (len(self.tokens) + 1) // self.batch_size

    @property
    def segments_per_epoch(self) -> int:
        return max(0, (self.row_len - 1) // self.seg_len)

    @property
    def tokens_per_epoch(self) -> int:
        return self.segments_per_epoch * self.batch_size * self.seg_len

    def fingerprint(self) -> str:
        digest = hashlib.sha256()
        digest.update(self.tokens.astype("<i4").tobytes())
        digest.update(self.offsets.astype("<i8").tobytes())
        return digest.hexdigest()

    def document_order(self, epoch: int) -> np.ndarray:
        if self.order == "date":
            return np.arange(self.n_documents)
        return np.random.default_rng([int(self.seed), int(epoch)]).permutation(self.n_documents)

    def epoch_stream(self, epoch: int) -> np.ndarray:
        """[EOS] + the documents (each with its EOS) in the epoch's order."""
        order = self.document_order(epoch)
        parts = [np.array([self.eos_id], np.int32)]
        if self.order == "date":
            parts.append(self.tokens)
        else:
            parts += [self.tokens[self.offsets[d]:self.offsets[d + 1]] for d in order]
        return np.concatenate(parts)

    def rows(self, epoch: int) -> np.ndarray:
        """The epoch's stream as [batch_size, row_len] (batchify)."""
        if self._epoch != epoch:
            stream = self.epoch_stream(epoch)
            n = self.row_len
            self._rows = stream[:self.batch_size * n].reshape(self.batch_size, n)
            self._epoch = epoch
        return self._rows

    def batch(self, position: int, rows: Optional[slice] = None) -> Dict[str, np.ndarray]:
        """{"inputs", "targets": [B, T] int32, "reset": [B] int32} at a data position (only `rows`, if given)."""
        per_epoch = self.segments_per_epoch
        if per_epoch < 1:
            raise ValueError("the data holds no complete segment")
        epoch, k = divmod(int(position), per_epoch)
        data = self.rows(epoch)
        if rows is not None:
            data = data[rows]
        t = self.seg_len
        return {"inputs": np.ascontiguousarray(data[:, k * t:(k + 1) * t]),
                "targets": np.ascontiguousarray(data[:, k * t + 1:(k + 1) * t + 1]),
                "reset": np.full(data.shape[0], int(k == 0), np.int32)}
