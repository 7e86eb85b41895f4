"""TIME-STRATIFIED / CONTROL splits ("Mind the Gap", Lazaridou et al. 2021) and yearly buckets (time-aware T5).

A split is a file of document ids, one `YYYYMMDD<TAB>doc_id` line per document in date order then id order, gzipped
when its name ends in `.gz`: the format of the published WMT / arXiv split files. The corpus itself is never copied;
`apply_split` streams a corpus and keeps the documents a split file names.

The protocol (`make_splits`), for a cut-off date C:

- TIME-STRATIFIED train: every document dated on or before C.
- TIME-STRATIFIED validation: a uniform sample of the documents in the `validation_months` months after C.
- test: the `test_months` months after those; `test_docs_per_month` documents sampled in each month (all of them if the
  month has fewer). Both setups share it.
- CONTROL validation: a sample of the test period's non-test documents, as large as TIME-STRATIFIED validation where the
  test period allows. It is drawn before CONTROL train, so the two are disjoint.
- CONTROL train: exactly as many documents as TIME-STRATIFIED train: the most recent documents counted backwards from
  the end of the test period, skipping test and CONTROL validation documents. Its share of documents from the test
  period is the paper's Table 1 column.

Memory: one streaming pass keeps only an int32 day ordinal per document and its id string (no texts, no Document
objects); sampling then works on index arrays with seeded numpy Generators, so a seed gives byte-identical files.
Outputs are written to temporary names in the output folder and renamed into place only once all are complete.
"""

from __future__ import annotations

import array
import dataclasses
import datetime
import gzip
import json
import os
import tempfile
import time
import zlib
from typing import Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
from absl import logging

from templm import console, paths
from templm.data.filters import DocumentFilter, FilterConfig
from templm.data.readers import (Corpus, describe_corpus, open_text, read_documents, read_failure,
                                 resolve_corpus)
from templm.data.records import Document
from templm.errors import DataError
from templm.io import NamedWrites

SPLIT_NAMES = ("time_stratified_train", "time_stratified_validation", "control_train", "control_validation", "test")
YEARLY_PARTS = ("train", "validation", "test")
STATS_FILE = "stats.json"
MISSING_IDS_SHOWN = 10  # how many missing ids a SplitReport lists

# Stream purposes, folded into each Generator's seed so that every sample has its own stream (changing the number of
# test months does not change the validation sample, and adding a year to a corpus does not change another year's).
_VALIDATION, _TEST, _CONTROL_VALIDATION, _YEARLY = 1, 2, 3, 4


class UnsplittableCorpus(DataError):
    """The corpus cannot give TIME-STRATIFIED / CONTROL splits with these settings: no document before the cut-off,
    in the validation window or in the test period, too few for CONTROL train, or degenerate splits. A study skips
    its streaming half on it; `templm data splits` reports it as bad input."""


# ----------------------------------------------------------------------------------------------------------- dates


def add_months(date: datetime.date, months: int) -> datetime.date:
    """`date` moved by whole months, the day clamped to the month's length (Jan 31 + 1 month = Feb 28/29)."""
    index = date.year * 12 + date.month - 1 + months
    year, month = divmod(index, 12)
    month += 1
    next_first = datetime.date(year + (month == 12), month % 12 + 1, 1)
    last_day = (next_first - datetime.timedelta(days=1)).day
    return datetime.date(year, month, min(date.day, last_day))


def cutoff_for(last_date: datetime.date, test_months: int, validation_months: int) -> datetime.date:
    """The latest cut-off whose validation and test months end with the month of `last_date` (a corpus's last
    document): the test period is that month and the `test_months - 1` before it, validation the months before."""
    validation_first = add_months(datetime.date(last_date.year, last_date.month, 1),
                                  -(test_months - 1 + validation_months))
    return validation_first - datetime.timedelta(days=1)


def _period_label(start: datetime.date) -> str:
    return start.strftime("%Y-%m") if start.day == 1 else start.isoformat()


def _iso(ordinal: int) -> str:
    return datetime.date.fromordinal(int(ordinal)).isoformat()


# ------------------------------------------------------------------------------------------- the streaming pass


@dataclasses.dataclass
class CorpusIndex:
    """Every distinct document of a corpus that the clean-up keeps, as (day ordinal, id), sorted by date then id:
    what the splits are drawn from (`index_corpus`; on Beam, `templm.data.splits_beam.index_corpus_beam`)."""

    dates: np.ndarray          # int32 day ordinals, ascending
    ids: np.ndarray            # object array of id strings, same order
    read: int                  # documents the reader yielded
    duplicates: int            # later documents whose id was already seen (dropped; the first one is kept)
    filtered: Optional[dict] = None  # filters.filter_stats: what the clean-up removed, with its settings
    corpus: Optional[Union[str, List[str]]] = None  # the corpus, resolved (`readers.resolve_corpus`)
    clean: Optional[FilterConfig] = None  # the clean-up it was made with (`active_clean`)

    def __len__(self) -> int:
        return len(self.dates)

    def span(self, first: datetime.date, last: datetime.date) -> Tuple[int, int]:
        """Positions [lo, hi) of the documents dated first..last inclusive."""
        lo = int(np.searchsorted(self.dates, first.toordinal(), side="left"))
        hi = int(np.searchsorted(self.dates, last.toordinal(), side="right"))
        return lo, max(lo, hi)


def index_corpus(corpus_path: Corpus, format: str = "auto", on_error: str = "raise",
                 clean: Optional[FilterConfig] = FilterConfig()) -> CorpusIndex:
    """One streaming pass over the corpus keeping (date, id) of each document that the clean-up keeps: the index
    `make_splits`, `yearly_buckets` and `distance_splits` draw from (give it to them to read the corpus once).

    A repeated id's first document is the one used: a later one is dropped and counted (`duplicates`) whatever the
    clean-up said of the first, so a document the clean-up removed does not come back under its id."""
    corpus_path = resolve_corpus(corpus_path)
    doc_filter = _document_filter(clean)
    reader = read_documents(corpus_path, format=format, on_error=on_error)
    ordinals = array.array("i")
    ids: List[str] = []
    seen = set() if doc_filter is not None else None
    n_read = later_copies = 0
    start = last_log = time.monotonic()
    for doc in reader:
        doc_id = doc.id
        n_read += 1
        check_id(doc_id, n_read, reader.path)
        if seen is not None:  # the clean-up looks at each id's first document only
            if doc_id in seen:
                later_copies += 1
                continue
            seen.add(doc_id)
            if doc_filter.reason(doc) is not None:
                continue
        ordinals.append(doc.date.toordinal())
        ids.append(doc_id)
        now = time.monotonic()
        if now - last_log >= 30.0:
            last_log = now
            console.say(f"{reader.path}: indexed {n_read} documents ({n_read / (now - start):.0f}/s)")
    del seen
    index = sorted_index(ordinals, ids, n_read, later_copies, doc_filter.stats() if doc_filter else None,
                         corpus_path, reader.path, doc_filter.config if doc_filter else None)
    logging.info("%s: indexed %d documents in %.1fs", reader.path, len(index), time.monotonic() - start)
    return index


def check_id(doc_id: str, number: int, where: str) -> None:
    """A split file's id: no tab, no line break (DataError naming the document's number and the corpus)."""
    if "\t" in doc_id or "\n" in doc_id or "\r" in doc_id:
        raise DataError(f"document #{number} has id {doc_id!r}: a split file cannot hold an id with a tab or a line "
                        "break", where)


def sorted_index(ordinals: Sequence[int], ids: List[str], read: int, later_copies: int, filtered: Optional[dict],
                 corpus_path: Union[str, List[str]], where: str, clean: Optional[FilterConfig]) -> CorpusIndex:
    """The CorpusIndex of the kept documents' (day ordinal, id) in corpus order: a repeated id's later documents
    dropped (counted with `later_copies`, those dropped already), then sorted by date and id. DataError naming the
    corpus when no document is left. `ids` is emptied (its strings move into the index)."""
    n = len(ids)
    if n == 0:
        raise DataError("no documents" + (f" left of {read} after the clean-up {filtered}" if read else ""), where)
    dates = np.array(ordinals, dtype=np.int32)
    id_array = np.empty(n, dtype=object)
    id_array[:] = ids
    ids.clear()
    # Duplicate ids sit next to each other in id order; a stable sort keeps the first occurrence first.
    by_id = np.argsort(id_array, kind="stable")
    sorted_ids = id_array[by_id]
    duplicate = np.zeros(n, dtype=bool)
    duplicate[by_id[1:]] = sorted_ids[1:] == sorted_ids[:-1]
    del sorted_ids
    id_rank = np.empty(n, dtype=np.int64)
    id_rank[by_id] = np.arange(n)
    del by_id
    order = np.lexsort((id_rank, dates))
    del id_rank
    order = order[~duplicate[order]]
    duplicates = later_copies + int(duplicate.sum())
    if duplicates:
        console.warn(f"{where}: {duplicates} document(s) repeat an earlier id; only the first occurrence of "
                     "each id is used")
    if filtered is not None and (filtered["other_language_removed"] or filtered["near_duplicates_removed"]):
        parts = ([f"{filtered['other_language_removed']} document(s) not in {filtered['language']!r}"]
                 if filtered["other_language_removed"] else []) + \
            ([f"{filtered['near_duplicates_removed']} near-duplicate(s)"] if filtered["near_duplicates_removed"]
             else [])
        console.say(f"{where}: left out " + " and ".join(parts) + " (stats.json, \"cleaned\")")
    return CorpusIndex(dates=dates[order], ids=id_array[order], read=read, duplicates=duplicates, filtered=filtered,
                       corpus=corpus_path, clean=clean)


def _given_index(index: Optional[CorpusIndex], corpus_path: Union[str, List[str]], format: str, on_error: str,
                 clean: Optional[FilterConfig]) -> CorpusIndex:
    """`index` where given (ValueError unless it is of this corpus with this clean-up), else the corpus indexed."""
    if index is None:
        return index_corpus(corpus_path, format, on_error, clean)
    if not isinstance(index, CorpusIndex):
        raise ValueError(f"index must be a CorpusIndex (index_corpus) or None, got {type(index).__name__}")
    if index.corpus != corpus_path:
        raise ValueError(f"the index is of the corpus {index.corpus}, not of {corpus_path}")
    wanted = active_clean(clean)
    if index.clean != wanted:
        raise ValueError(f"the index was made with the clean-up {index.clean}, not {wanted}")
    return index


def active_clean(clean: Optional[FilterConfig]) -> Optional[FilterConfig]:
    """The clean-up `clean` asks for: itself, or None where it is None or removes nothing (ValueError where it is
    not a FilterConfig)."""
    if clean is not None and not isinstance(clean, FilterConfig):
        raise ValueError(f"clean must be a templm.data.filters.FilterConfig or None, got {clean!r}")
    return clean if clean is not None and clean.active else None


def _document_filter(clean: Optional[FilterConfig]) -> Optional[DocumentFilter]:
    config = active_clean(clean)
    return DocumentFilter(config) if config is not None else None


def _sample(rng: np.random.Generator, lo: int, hi: int, size: int) -> np.ndarray:
    """`size` positions drawn without replacement from [lo, hi) (all of them if fewer), ascending."""
    count = hi - lo
    if size >= count:
        return np.arange(lo, hi, dtype=np.int64)
    return np.sort(lo + rng.choice(count, size=size, replace=False)).astype(np.int64)


def _sample_from(rng: np.random.Generator, pool: np.ndarray, size: int) -> np.ndarray:
    if size >= len(pool):
        return pool.astype(np.int64)
    return np.sort(pool[rng.choice(len(pool), size=size, replace=False)]).astype(np.int64)


# ------------------------------------------------------------------------------------------------------- writing


_UMASK = os.umask(0)
os.umask(_UMASK)


class _AtomicOutputs:
    """Files written to temporary names in their folder and renamed into place together by `commit`. A file whose
    place is a URL (gs://) is written to a local temporary file and put as one object at `commit`."""

    def __init__(self):
        self._pending: List[Tuple[str, str]] = []

    def __enter__(self) -> "_AtomicOutputs":
        return self

    def temp_path(self, final_path: str) -> str:
        if paths.is_url(final_path):
            fd, tmp = tempfile.mkstemp(prefix="templm-split-", suffix=".tmp")
        else:
            folder, name = os.path.split(final_path)
            os.makedirs(folder or ".", exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder or ".")
        os.close(fd)
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600 files; give them the usual mode
        self._pending.append((tmp, final_path))
        return tmp

    def commit(self) -> None:
        for tmp, final in self._pending:
            if paths.is_url(final):
                paths.copy(tmp, final, overwrite=True)
                os.remove(tmp)
            else:
                os.replace(tmp, final)
        self._pending = []

    def __exit__(self, *exc) -> None:
        for tmp, _ in self._pending:  # an error before commit: leave nothing behind
            try:
                os.remove(tmp)
            except OSError:
                pass
        self._pending = []


def _write_positions(outputs: _AtomicOutputs, path: str, index: CorpusIndex, positions: np.ndarray) -> None:
    positions = np.sort(positions)
    _write_split(outputs.temp_path(path), path, index.dates[positions], index.ids[positions])


def _write_split(tmp: str, final: str, dates: np.ndarray, ids: Sequence[str]) -> None:
    """Writes `YYYYMMDD<TAB>id` lines to `tmp`, gzipped when `final` ends in `.gz` (with a fixed header: no name, no
    time stamp, so equal content gives equal bytes)."""
    if final.endswith(".gz"):
        with NamedWrites(tmp, "wb", shown=final) as raw, \
                gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=6, mtime=0) as f:
            _write_lines(f, dates, ids)
    else:
        with NamedWrites(tmp, "wb", shown=final) as f:
            _write_lines(f, dates, ids)


def _write_lines(f, dates: np.ndarray, ids: Sequence[str]) -> None:
    day_text: Dict[int, str] = {}
    chunk: List[str] = []
    for ordinal, doc_id in zip(dates.tolist(), ids):
        text = day_text.get(ordinal)
        if text is None:
            text = day_text[ordinal] = datetime.date.fromordinal(ordinal).strftime("%Y%m%d")
        chunk.append(f"{text}\t{doc_id}\n")
        if len(chunk) >= 65536:
            f.write("".join(chunk).encode("utf-8"))
            chunk = []
    if chunk:
        f.write("".join(chunk).encode("utf-8"))


def _load_stats(out_dir: str) -> dict:
    """The existing stats.json of `out_dir` (sections written by other calls are kept), or {}."""
    path = paths.join(out_dir, STATS_FILE)
    if not paths.exists(path):
        return {}
    try:
        with paths.open(path, "r", encoding="utf-8") as f:
            stats = json.load(f)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(f"not valid JSON ({e}); delete it to start the statistics afresh", path) from None
    if not isinstance(stats, dict):
        raise DataError(f"expected a JSON object, got {type(stats).__name__}", path)
    return stats


def _write_stats(outputs: _AtomicOutputs, out_dir: str, stats: dict) -> None:
    tmp = outputs.temp_path(os.path.join(out_dir, STATS_FILE))
    with NamedWrites(tmp, "w", shown=os.path.join(out_dir, STATS_FILE), encoding="utf-8") as f:
        json.dump(stats, f, indent=2, sort_keys=True)
        f.write("\n")


def _range_stats(index: CorpusIndex, positions: np.ndarray) -> dict:
    if len(positions) == 0:
        return {"documents": 0, "first_date": None, "last_date": None}
    dates = index.dates[positions]
    return {"documents": int(len(positions)), "first_date": _iso(dates.min()), "last_date": _iso(dates.max())}


def _check_positive(name: str, value: int, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


# ------------------------------------------------------------------------------------------------- make_splits


def make_splits(corpus_path: Corpus, out_dir: str, cutoff: Optional[datetime.date] = datetime.date(2017, 9, 30),
                test_months: int = 24, validation_months: int = 3, test_docs_per_month: int = 1000,
                validation_docs: Optional[int] = None, seed: int = 0, format: str = "auto",
                on_error: str = "raise", clean: Optional[FilterConfig] = FilterConfig(),
                min_control_test_share: float = 0.02, allow_degenerate: bool = False,
                index: Optional[CorpusIndex] = None) -> dict:
    """Writes the TIME-STRATIFIED and CONTROL splits of a corpus and returns their statistics.

    Args:
      corpus_path: any corpus `read_documents` accepts (JSONL, WMT news-docs, arXiv OAI; .gz / .bz2 too; one
        file, a glob pattern or a list of either).
      out_dir: receives `{time_stratified_train, time_stratified_validation, control_train, control_validation,
        test}.gz` and `stats.json` (other sections of an existing stats.json, e.g. "yearly", are kept).
      cutoff: the last day of TIME-STRATIFIED training data (the paper's WMT cut-off, 2017-09-30, by default); None:
        from the corpus, the latest cut-off whose validation and test months end with its last month (`cutoff_for`).
      test_months: months in the test period, which starts `validation_months` months after the day after `cutoff`.
      validation_months: months after the cut-off that TIME-STRATIFIED validation is drawn from.
      test_docs_per_month: documents sampled from each test month (all of them if a month has fewer).
      validation_docs: size of each validation set. Default (None): `validation_months * test_docs_per_month`
        (3000 with the defaults), i.e. the test set's monthly density; all documents of the window if it has fewer.
      seed: every sample comes from numpy Generators seeded with it; the same seed gives byte-identical files.
      format: corpus format, one of `templm.data.FORMATS` or "auto".
      on_error: "raise" (default) or "skip" bad corpus lines, as in `read_documents`.
      clean: the paper's clean-up before splitting (templm.data.filters): documents in another language than
        English and near-duplicates of an earlier document are left out of every split. None: none.
      min_control_test_share: the least share of CONTROL train that must lie in the test period; below it the two
        training sets are nearly the same documents and the comparison says nothing.
      allow_degenerate: write degenerate splits (empty test months, CONTROL train below `min_control_test_share` in
        the test period) with a warning instead of refusing them; stats.json lists the problems either way.
      index: the corpus's `index_corpus` with this clean-up, made once for several calls (or on Beam); None: made.

    Returns:
      The statistics written to stats.json: `splits` (per split: documents, first_date, last_date), `periods`
      (first/last day of the train, validation and test periods), `test_per_month`,
      `control_train_test_period_documents` and `control_train_test_period_share` (fraction of CONTROL train dated in
      the test period), the settings, and corpus counts (`corpus_documents`, `duplicates_dropped`, first/last date,
      and `cleaned`: what the clean-up removed, per reason, with its settings; None without one).

    Raises:
      DataError (naming the corpus) if it has no document on or before the cut-off, none in the validation window or
      none in the test period, or if the splits are degenerate (unless `allow_degenerate`); ValueError on bad
      arguments.
    """
    if cutoff is not None and (not isinstance(cutoff, datetime.date) or isinstance(cutoff, datetime.datetime)):
        raise ValueError(f"cutoff must be a datetime.date or None (from the corpus), got {cutoff!r}")
    _check_positive("test_months", test_months)
    _check_positive("validation_months", validation_months)
    _check_positive("test_docs_per_month", test_docs_per_month)
    if validation_docs is None:
        validation_docs = validation_months * test_docs_per_month
    _check_positive("validation_docs", validation_docs)
    _check_positive("seed", seed, 0)
    corpus_path = resolve_corpus(corpus_path)
    where = describe_corpus(corpus_path)
    out_dir = os.fspath(out_dir)

    index = _given_index(index, corpus_path, format, on_error, clean)
    corpus_span = f"the corpus spans {_iso(index.dates[0])}..{_iso(index.dates[-1])}"
    cutoff_from_corpus = cutoff is None
    if cutoff_from_corpus:
        cutoff = cutoff_for(datetime.date.fromordinal(int(index.dates[-1])), test_months, validation_months)
        console.say(f"{where}: cut-off {cutoff.isoformat()}, the latest whose {validation_months} validation and "
                    f"{test_months} test months end with the corpus ({corpus_span})")
    validation_first = cutoff + datetime.timedelta(days=1)
    test_first = add_months(validation_first, validation_months)
    validation_last = test_first - datetime.timedelta(days=1)
    month_starts = [add_months(test_first, k) for k in range(test_months + 1)]
    test_last = month_starts[-1] - datetime.timedelta(days=1)

    # TIME-STRATIFIED train: everything up to the cut-off.
    _, train_hi = index.span(datetime.date.min, cutoff)
    if train_hi == 0:
        raise UnsplittableCorpus(f"no document dated on or before the cut-off {cutoff.isoformat()}; {corpus_span}",
                        where)
    ts_train = np.arange(train_hi, dtype=np.int64)

    # TIME-STRATIFIED validation: a uniform sample of the months after the cut-off.
    val_lo, val_hi = index.span(validation_first, validation_last)
    if val_hi == val_lo:
        raise UnsplittableCorpus(f"no document dated {validation_first.isoformat()}..{validation_last.isoformat()} for "
                        f"validation; {corpus_span}", where)
    ts_validation = _sample(np.random.default_rng([seed, _VALIDATION]), val_lo, val_hi, validation_docs)

    # Test: a sample of each month of the test period.
    test_parts, test_per_month = [], {}
    for k in range(test_months):
        lo, hi = index.span(month_starts[k], month_starts[k + 1] - datetime.timedelta(days=1))
        part = _sample(np.random.default_rng([seed, _TEST, k]), lo, hi, test_docs_per_month)
        test_parts.append(part)
        test_per_month[_period_label(month_starts[k])] = int(len(part))
    test = np.concatenate(test_parts)
    if len(test) == 0:
        raise UnsplittableCorpus(f"no document dated {test_first.isoformat()}..{test_last.isoformat()} for the test "
                        f"period; {corpus_span}", where)
    empty = [label for label, count in test_per_month.items() if count == 0]

    # CONTROL validation: from the test period, excluding test documents (drawn before CONTROL train takes the rest).
    test_lo, test_hi = index.span(test_first, test_last)
    available = np.ones(test_hi, dtype=bool)
    available[test] = False
    pool = np.flatnonzero(available[test_lo:]) + test_lo
    control_validation = _sample_from(np.random.default_rng([seed, _CONTROL_VALIDATION]), pool, len(ts_validation))
    if len(control_validation) < len(ts_validation):
        console.warn(f"{where}: CONTROL validation has {len(control_validation)} documents, fewer than "
                     f"TIME-STRATIFIED validation's {len(ts_validation)}: the test period has no more non-test "
                     "documents")

    # CONTROL train: the most recent non-test, non-validation documents up to the end of the test period.
    available[control_validation] = False
    candidates = np.flatnonzero(available)
    del available
    if len(candidates) < len(ts_train):  # a guard: TIME-STRATIFIED train is among the candidates
        raise UnsplittableCorpus(f"only {len(candidates)} documents up to {test_last.isoformat()} outside the test and "
                        f"validation sets; CONTROL train needs {len(ts_train)}", where)
    control_train = candidates[len(candidates) - len(ts_train):].astype(np.int64)
    del candidates
    in_test_period = int(np.count_nonzero(control_train >= test_lo))
    share = in_test_period / len(control_train)
    degenerate = []
    if empty:
        degenerate.append(f"{len(empty)} of {test_months} test months have no documents ({', '.join(empty[:6])}"
                          + (", ..." if len(empty) > 6 else "") + ")")
    if share < min_control_test_share:
        degenerate.append(f"only {in_test_period} documents ({share:.1%}) of CONTROL train lie in the test period, "
                          f"below {min_control_test_share:.0%}: CONTROL and TIME-STRATIFIED train are nearly the same "
                          "documents")
    if degenerate and not allow_degenerate:
        raise UnsplittableCorpus(f"degenerate splits with the cut-off {cutoff.isoformat()}: " + "; ".join(degenerate) +
                        f"; {corpus_span}; choose an earlier cut-off or fewer test months, or allow it "
                        "(--allow_degenerate); nothing was written", where)
    for problem in degenerate:
        console.warn(f"{where}: degenerate splits: {problem}")

    splits = {
        "time_stratified_train": ts_train,
        "time_stratified_validation": ts_validation,
        "control_train": control_train,
        "control_validation": control_validation,
        "test": test,
    }
    section = {
        "corpus": corpus_path,
        "seed": int(seed),
        "cutoff": cutoff.isoformat(),
        "cutoff_from_corpus": cutoff_from_corpus,
        "validation_months": int(validation_months),
        "test_months": int(test_months),
        "test_docs_per_month": int(test_docs_per_month),
        "validation_docs": int(validation_docs),
        "corpus_documents": index.read,
        "duplicates_dropped": index.duplicates,
        "cleaned": index.filtered,
        "corpus_first_date": _iso(index.dates[0]),
        "corpus_last_date": _iso(index.dates[-1]),
        "periods": {
            "train": {"first_date": _iso(index.dates[0]), "last_date": cutoff.isoformat()},
            "validation": {"first_date": validation_first.isoformat(), "last_date": validation_last.isoformat()},
            "test": {"first_date": test_first.isoformat(), "last_date": test_last.isoformat()},
        },
        "splits": {name: _range_stats(index, positions) for name, positions in splits.items()},
        "test_per_month": test_per_month,
        "control_train_test_period_documents": in_test_period,
        "control_train_test_period_share": share,
        "min_control_test_share": float(min_control_test_share),
        "degenerate": degenerate,
    }

    stats = _load_stats(out_dir)
    stats.update(section)
    with _AtomicOutputs() as outputs:
        for name, positions in splits.items():
            _write_positions(outputs, os.path.join(out_dir, f"{name}.gz"), index, positions)
        _write_stats(outputs, out_dir, stats)
        outputs.commit()
    logging.info("%s: wrote splits to %s: %s; CONTROL train %.1f%% from the test period", where, out_dir,
                 ", ".join(f"{name} {len(p)}" for name, p in splits.items()), 100.0 * section[
                     "control_train_test_period_share"])
    return section


# ------------------------------------------------------------------------------------------ increasing distance

DISTANCE_FOLDER = "increasing_distance"  # the published layout: SPLIT_DIR/increasing_distance/split_<date>/train.gz


def distance_split_dir(split_dir: str, end: datetime.date) -> str:
    return os.path.join(split_dir, DISTANCE_FOLDER, f"split_{end.isoformat()}")


def distance_splits(corpus_path: Corpus, split_dir: str, gaps_months: Sequence[int], size: Optional[int] = None,
                    format: str = "auto", on_error: str = "raise",
                    clean: Optional[FilterConfig] = FilterConfig(), index: Optional[CorpusIndex] = None) -> dict:
    """"Mind the Gap", Appendix C: training sets of one size whose periods end further and further before the
    cut-off of the splits in `split_dir` (made by `make_splits`; its test set stays the test set of them all).

    For each gap g (months), the set ends on the last day of the month g months before the cut-off's month and holds
    the `size` most recent documents dated up to then (default: as many as the largest gap leaves, so that every set
    has the same size). Each is written as split_dir/increasing_distance/split_<end>/train.gz, the paper's
    published layout, and described in stats.json's "increasing_distance" section, which is returned: {"size",
    "gaps": {g: {"end", "split_dir", "documents", "first_date", "last_date"}}}. Raises UnsplittableCorpus (naming
    the corpus) where a gap leaves fewer than `size` documents, or none. `index`: as `make_splits`'."""
    gaps = sorted({int(g) for g in gaps_months})
    if not gaps or gaps[0] < 0:
        raise ValueError(f"gaps_months must be months of at least 0, got {list(gaps_months)}")
    stats = _load_stats(split_dir)
    if "cutoff" not in stats:
        raise DataError("stats.json names no cut-off: not a folder of `templm data splits`", split_dir)
    cutoff = datetime.date.fromisoformat(stats["cutoff"])
    corpus_path = resolve_corpus(corpus_path)
    where = describe_corpus(corpus_path)
    index = _given_index(index, corpus_path, format, on_error, clean)
    month_end = add_months(datetime.date(cutoff.year, cutoff.month, 1), 1) - datetime.timedelta(days=1)
    ends = {g: add_months(month_end + datetime.timedelta(days=1), -g) - datetime.timedelta(days=1) for g in gaps}
    available = {g: index.span(datetime.date.min, min(ends[g], cutoff))[1] for g in gaps}
    if size is None:
        size = available[gaps[-1]]
    _check_positive("size", size)
    short = [g for g in gaps if available[g] < size]
    if short or available[gaps[-1]] == 0:
        raise UnsplittableCorpus(f"a training set {short[0] if short else gaps[-1]} months before the cut-off "
                                 f"{cutoff.isoformat()} would hold {available[short[0] if short else gaps[-1]]} "
                                 f"documents, fewer than {size}; the corpus starts {_iso(index.dates[0])}", where)
    section = {"size": int(size), "cutoff": cutoff.isoformat(), "gaps": {}}
    with _AtomicOutputs() as outputs:
        for g in gaps:
            hi = available[g]
            positions = np.arange(hi - size, hi, dtype=np.int64)
            folder = distance_split_dir(split_dir, ends[g])
            _write_positions(outputs, os.path.join(folder, "train.gz"), index, positions)
            section["gaps"][str(g)] = {"end": ends[g].isoformat(), "split_dir": folder,
                                       **_range_stats(index, positions)}
        stats[DISTANCE_FOLDER] = section
        _write_stats(outputs, split_dir, stats)
        outputs.commit()
    return section


# ------------------------------------------------------------------------------------------------ yearly buckets


def yearly_buckets(corpus_path: Corpus, out_dir: str, heldout_per_year: int = 2000, heldout_fraction: float = 0.1,
                   seed: int = 0, format: str = "auto", on_error: str = "raise",
                   clean: Optional[FilterConfig] = FilterConfig(), index: Optional[CorpusIndex] = None) -> dict:
    """Groups a corpus by year, holding out documents of each year for validation and test (time-aware T5 side).

    Each year Y holds out `min(heldout_per_year, floor(heldout_fraction * n_Y))` documents drawn at random (seeded by
    `seed` and Y, so a year's buckets do not depend on the other years); half of them (rounded down) are validation,
    the rest test, and every other document of Y is train. Writes `out_dir/yearly/{Y}_{train,validation,test}.gz` in
    the split-file format for every year that has documents, and a "yearly" section in `out_dir/stats.json` (other
    sections kept), which is also returned: the settings and, per year, `train`, `validation`, `test` counts and the
    year's first and last document date. `index`: as `make_splits`'.
    """
    _check_positive("heldout_per_year", heldout_per_year, 0)
    if isinstance(heldout_fraction, bool) or not isinstance(heldout_fraction, (int, float)) or \
            not 0.0 <= heldout_fraction <= 1.0:
        raise ValueError(f"heldout_fraction must be a number in [0, 1], got {heldout_fraction!r}")
    _check_positive("seed", seed, 0)
    corpus_path = resolve_corpus(corpus_path)
    where = describe_corpus(corpus_path)
    out_dir = os.fspath(out_dir)

    index = _given_index(index, corpus_path, format, on_error, clean)
    first_year = datetime.date.fromordinal(int(index.dates[0])).year
    last_year = datetime.date.fromordinal(int(index.dates[-1])).year
    years: Dict[str, dict] = {}
    buckets = []
    for year in range(first_year, last_year + 1):
        lo, hi = index.span(datetime.date(year, 1, 1), datetime.date(year, 12, 31))
        n = hi - lo
        if n == 0:
            continue
        heldout = min(heldout_per_year, int(heldout_fraction * n))
        chosen = lo + np.random.default_rng([seed, _YEARLY, year]).permutation(n)[:heldout]
        validation = np.sort(chosen[:heldout // 2])
        test = np.sort(chosen[heldout // 2:])
        train_mask = np.ones(n, dtype=bool)
        train_mask[chosen - lo] = False
        train = np.flatnonzero(train_mask) + lo
        buckets.append((year, {"train": train, "validation": validation, "test": test}))
        years[str(year)] = {"train": int(len(train)), "validation": int(len(validation)), "test": int(len(test)),
                            "first_date": _iso(index.dates[lo]), "last_date": _iso(index.dates[hi - 1])}
    section = {
        "corpus": corpus_path,
        "seed": int(seed),
        "heldout_per_year": int(heldout_per_year),
        "heldout_fraction": float(heldout_fraction),
        "corpus_documents": index.read,
        "duplicates_dropped": index.duplicates,
        "cleaned": index.filtered,
        "years": years,
    }
    stats = _load_stats(out_dir)
    stats["yearly"] = section
    with _AtomicOutputs() as outputs:
        for year, parts in buckets:
            for part in YEARLY_PARTS:
                _write_positions(outputs, os.path.join(out_dir, "yearly", f"{year}_{part}.gz"), index, parts[part])
        _write_stats(outputs, out_dir, stats)
        outputs.commit()
    logging.info("%s: wrote yearly buckets for %d year(s) to %s", where, len(years),
                 os.path.join(out_dir, "yearly"))
    return section


# ------------------------------------------------------------------------------------------- reading and applying


def read_split_file(path: str) -> List[Tuple[datetime.date, str]]:
    """The (date, id) pairs of a split file (`YYYYMMDD<TAB>doc_id` per line; gzip/bz2 by suffix), in file order.

    Blank lines are skipped. A malformed line (wrong field count, bad date, empty id) or an id listed twice raises a
    DataError naming the file and the line.
    """
    path = os.fspath(path)
    pairs: List[Tuple[datetime.date, str]] = []
    first_line: Dict[str, int] = {}
    with open_text(path) as f:
        lineno = 0
        while True:
            try:
                raw = next(f, b"")  # a line over readers.MAX_LINE_BYTES is a DataError naming it
            except (OSError, EOFError, zlib.error) as e:
                raise read_failure(e, path, f"after line {lineno}") from None
            if not raw:
                break
            lineno += 1
            if not raw.strip():
                continue
            try:
                line = raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as e:
                raise DataError(f"invalid UTF-8 at byte {e.start}", path, lineno) from None
            fields = line.split("\t")
            if len(fields) != 2:
                raise DataError(f"expected 2 tab-separated fields (YYYYMMDD, doc_id), got {len(fields)}: "
                                f"{line[:80]!r}", path, lineno)
            date_text, doc_id = fields
            if not (len(date_text) == 8 and date_text.isdigit()):
                raise DataError(f"unparsable date {date_text!r}: expected YYYYMMDD", path, lineno)
            try:
                date = datetime.date(int(date_text[:4]), int(date_text[4:6]), int(date_text[6:]))
            except ValueError:
                raise DataError(f"invalid date {date_text!r}", path, lineno) from None
            if not doc_id.strip():
                raise DataError("empty doc_id", path, lineno)
            if doc_id in first_line:
                raise DataError(f"doc_id {doc_id!r} already listed on line {first_line[doc_id]}", path, lineno)
            first_line[doc_id] = lineno
            pairs.append((date, doc_id))
    return pairs


class SplitReport:
    """What `apply_split` found; the counts are final once its document iterator is exhausted (`done`)."""

    def __init__(self, corpus_path: str, split_path: str, expected: int):
        self.corpus_path = corpus_path
        self.split_path = split_path
        self.expected = expected          # ids in the split file
        self.found = 0                    # documents yielded
        self.date_mismatches = 0          # yielded documents whose corpus date differs from the split file's
        self.duplicates = 0               # corpus documents skipped because their id was already yielded
        self.done = False
        self._missing: Optional[int] = None
        self._missing_ids: List[str] = []

    def _require_done(self) -> None:
        if not self.done:
            raise RuntimeError("the split's documents have not all been read yet: iterate them to the end first")

    @property
    def missing(self) -> int:
        """Split ids with no document in the corpus."""
        self._require_done()
        return self._missing

    @property
    def missing_ids(self) -> List[str]:
        """The first (up to MISSING_IDS_SHOWN) missing ids, in split-file order."""
        self._require_done()
        return list(self._missing_ids)

    def as_dict(self) -> dict:
        self._require_done()
        return {"corpus": self.corpus_path, "split": self.split_path, "expected": self.expected, "found": self.found,
                "missing": self._missing, "missing_ids": list(self._missing_ids),
                "date_mismatches": self.date_mismatches, "duplicates": self.duplicates}

    def __repr__(self) -> str:
        state = f"missing={self._missing}" if self.done else "reading"
        return f"SplitReport(expected={self.expected}, found={self.found}, {state})"


def apply_split(corpus_path: Corpus, split_path: str, format: str = "auto",
                on_error: str = "raise") -> Tuple[Iterator[Document], SplitReport]:
    """Streams the corpus documents a split file names, in corpus order.

    Returns `(documents, report)`: `documents` is an iterator that yields each split id's first document; once it is
    exhausted, `report.found`, `report.missing` (split ids absent from the corpus) and `report.missing_ids` (the
    first few) are final, and any missing ids have been logged as a warning. The split file is read (and validated)
    at once; the corpus only as the iterator is consumed.
    """
    corpus_path = resolve_corpus(corpus_path)
    where = describe_corpus(corpus_path)
    split_path = os.fspath(split_path)
    pending: Dict[str, datetime.date] = dict((doc_id, date) for date, doc_id in read_split_file(split_path))
    report = SplitReport(corpus_path, split_path, len(pending))
    reader = read_documents(corpus_path, format=format, on_error=on_error)

    def documents() -> Iterator[Document]:
        yielded = set()
        for doc in reader:
            expected_date = pending.pop(doc.id, None)
            if expected_date is None:
                if doc.id in yielded:
                    report.duplicates += 1
                continue
            yielded.add(doc.id)
            if doc.date != expected_date:
                report.date_mismatches += 1
            report.found += 1
            yield doc
        report._missing = len(pending)
        report._missing_ids = [doc_id for doc_id, _ in zip(pending, range(MISSING_IDS_SHOWN))]
        report.done = True
        warn_split_report(where, split_path, report.expected, len(pending), report._missing_ids,
                          report.date_mismatches)

    return documents(), report


def warn_split_report(where: str, split_path: str, expected: int, missing: int, missing_ids: Sequence[str],
                      date_mismatches: int) -> None:
    """The warnings of a split applied to a corpus (`where`): the ids it names that the corpus lacks (the first
    few), and the documents whose date differs from the split file's."""
    if missing:
        console.warn(f"{where}: {missing} of {expected} id(s) in {split_path} are not in the corpus; first: "
                     f"{', '.join(missing_ids)}")
    if date_mismatches:
        console.warn(f"{where}: {date_mismatches} document(s) of {split_path} have a date other than the split "
                     "file's")


def check_split_ids(corpus_path: Corpus, split_files: Dict[str, str], format: str = "auto",
                    on_error: str = "raise") -> Dict[str, dict]:
    """Checks split files against the corpus before any work reads them: {name: {"expected", "found", "missing",
    "missing_ids" (the first MISSING_IDS_SHOWN)}} from one pass over the corpus's ids. Ids a split names that the
    corpus lacks (real splits and corpora drift apart) are counted here and said in one warning per file; their
    documents are then simply absent. A split that names none of the corpus's documents is a DataError naming it
    (the split of another corpus, most likely)."""
    corpus_path = resolve_corpus(corpus_path)
    where = describe_corpus(corpus_path)
    wanted = {name: [doc_id for _, doc_id in read_split_file(path)] for name, path in split_files.items()}
    every = set().union(*wanted.values()) if wanted else set()
    present = set()
    for doc in read_documents(corpus_path, format=format, on_error=on_error):
        if doc.id in every:
            present.add(doc.id)
    report = {}
    for name, ids in wanted.items():
        path = split_files[name]
        missing = [doc_id for doc_id in ids if doc_id not in present]
        if len(missing) == len(ids):
            raise DataError(f"none of the split's {len(ids)} document ids is in the corpus {where}: is it the split "
                            "of another corpus?", path)
        report[name] = {"expected": len(ids), "found": len(ids) - len(missing), "missing": len(missing),
                        "missing_ids": missing[:MISSING_IDS_SHOWN]}
        if missing:
            console.warn(f"{where}: {len(missing)} of {len(ids)} id(s) in {path} are not in the corpus (first: "
                         f"{', '.join(missing[:MISSING_IDS_SHOWN])}); the split is read without them")
    return report
