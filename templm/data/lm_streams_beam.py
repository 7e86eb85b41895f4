"""`templm data streams --runner=...`: the language model's token streams (templm.data.lm_streams) on Apache Beam,
the same files byte for byte as the single process writes.

One pipeline:

* Which document each split id names. One worker reads each split file (its (date, id) lines numbered), one worker
  each corpus file ((id, file rank, number in the file, date) of every document); grouped by id, an id of a split
  takes its first document in corpus order (the lowest (rank, number)), as `splits.apply_split`. The split's ids
  the corpus lacks are counted (and the first few, in split-file order, named), as are the documents whose date
  differs from the split file's.
* The streams. Grouped by corpus file, one worker a file reads it again, tokenises the documents it was given and
  appends each to a shard of its split and month (`shards/<split>/<YYYY-MM>/<rank>.bin`: the date, id and tokens
  of each document). Grouped by split and month, one worker a month reads the shards' headers only (date, id,
  where the tokens are), sorts them by (date, id), and writes the month's two .npy files, copying each document's
  tokens from its shard (no month's tokens are held at once). The driver writes the manifest from the months'
  counts.

A worker holds one document's text and its file's kept numbers, a month's (date, id, place) keys, or one id's group;
the driver holds the counts.
"""

from __future__ import annotations

import json
import struct
from typing import Any, Dict, Iterator, List, Mapping, Sequence, Tuple

from templm import paths
from templm.data.beam_work import pipeline as beam_pipeline, read_lines, work_folder
from templm.data.lm_streams import check_found, month_files, split_entry, write_manifest, write_npy
from templm.data.readers import Corpus, corpus_files, describe_corpus, read_documents, resolve_corpus
from templm.data.splits import MISSING_IDS_SHOWN, read_split_file, warn_split_report

_HEAD = struct.Struct("<IIQ")  # a shard record: date ordinal, id bytes, tokens; then the id, then the tokens (int32)


def _shard(work: str, split: str, month: str, rank: int) -> str:
    return paths.join(work, "shards", split, month, f"{rank:06d}.bin")


class _SplitIds:
    """A split file's ids (a Beam FlatMap over (split, file)): (id, ["split", split, line, date ordinal])."""

    def __call__(self, element: Tuple[str, str]) -> Iterator[Tuple[str, list]]:
        name, path = element
        for line, (date, doc_id) in enumerate(read_split_file(path)):
            yield doc_id, ["split", name, line, date.toordinal()]


class _Places:
    """A corpus file's documents (a Beam FlatMap over (rank, file)): (id, ["doc", rank, number, date ordinal])."""

    def __init__(self, fmt: str, on_error: str):
        self.fmt, self.on_error = fmt, on_error

    def __call__(self, element: Tuple[int, str]) -> Iterator[Tuple[str, list]]:
        rank, path = element
        for number, doc in enumerate(read_documents(path, format=self.fmt, on_error=self.on_error), 1):
            yield doc.id, ["doc", rank, number, doc.date.toordinal()]


def _join(element: Tuple[str, List[list]]) -> Iterator[Any]:
    """One id's split entries and documents: the place each split takes it from (main output: (rank, (number,
    split))), or its absence ("missing": (split, (line, id))); "counts": (key, 1) for a date that differs."""
    import apache_beam as beam

    doc_id, values = element
    docs = sorted(tuple(v[1:]) for v in values if v[0] == "doc")
    for _, name, line, ordinal in (v for v in values if v[0] == "split"):
        yield beam.pvalue.TaggedOutput("counts", (f"expected:{name}", 1))
        if not docs:
            yield beam.pvalue.TaggedOutput("missing", (name, (line, doc_id)))
            yield beam.pvalue.TaggedOutput("counts", (f"missing:{name}", 1))
            continue
        rank, number, doc_ordinal = docs[0]
        if doc_ordinal != ordinal:
            yield beam.pvalue.TaggedOutput("counts", (f"date_mismatches:{name}", 1))
        yield rank, (number, name)


class _TokenizeFile:
    """One corpus file's kept documents tokenised into shards per split and month (a Beam FlatMap over (rank,
    [(number, split), ...])): yields ((split, month), rank) for each shard it wrote, once all are closed."""

    def __init__(self, work: str, files: Sequence[str], fmt: str, on_error: str, spm_model: str):
        self.work, self.files, self.fmt, self.on_error, self.spm_model = work, list(files), fmt, on_error, spm_model
        self.processor = None

    def __call__(self, element: Tuple[int, List[Tuple[int, str]]]) -> Iterator[Tuple[Tuple[str, str], int]]:
        from templm.data.lm_data import load_processor, tokenize_documents
        from templm.data.token_stream import month_of

        rank, numbered = element
        path = self.files[rank]
        if self.processor is None:
            self.processor = load_processor(self.spm_model)
        kept: Dict[int, List[str]] = {}
        for number, name in sorted(numbered):
            kept.setdefault(int(number), []).append(name)
        shards: Dict[Tuple[str, str], Any] = {}
        try:
            for number, doc in enumerate(read_documents(path, format=self.fmt, on_error=self.on_error), 1):
                if number not in kept:
                    continue
                tokens, _ = tokenize_documents([doc], self.processor)
                key = doc.id.encode("utf-8")
                record = (_HEAD.pack(doc.date.toordinal(), len(key), len(tokens)) + key
                          + tokens.astype("<i4").tobytes())
                for name in kept[number]:
                    where = (name, month_of(doc.date))
                    if where not in shards:
                        target = _shard(self.work, name, where[1], rank)
                        paths.makedirs(paths.dirname(target))
                        shards[where] = paths.open(target, "wb")
                    shards[where].write(record)
        finally:
            for f in shards.values():
                f.close()
        for where in shards:
            yield where, rank


def _headers(f: Any) -> Iterator[Tuple[int, str, int, int]]:
    """(date ordinal, id, offset of the tokens, tokens) of each record of an open shard, skipping the tokens."""
    while True:
        head = f.read(_HEAD.size)
        if not head:
            return
        ordinal, id_bytes, n = _HEAD.unpack(head)
        doc_id = f.read(id_bytes).decode("utf-8")
        offset = f.tell()
        f.seek(4 * n, 1)
        yield ordinal, doc_id, offset, n


class _WriteMonth:
    """One split's month (a Beam Map over ((split, month), [rank, ...])): its documents from the shards in (date,
    id) order as the month's tokens and lengths files; returns a JSON line [split, month, documents, tokens, first
    date ordinal, last date ordinal]."""

    def __init__(self, work: str, folder: str):
        self.work, self.folder = work, folder

    def __call__(self, element: Tuple[Tuple[str, str], List[int]]) -> str:
        import numpy as np

        (name, month), ranks = element
        ranks = sorted(set(ranks))
        keys = []
        for rank in ranks:
            with paths.open(_shard(self.work, name, month, rank), "rb") as f:
                keys.extend((ordinal, doc_id, rank, offset, n) for ordinal, doc_id, offset, n in _headers(f))
        keys.sort(key=lambda k: (k[0], k[1]))
        lengths = np.array([k[4] for k in keys], np.int64)
        files = {rank: paths.open(_shard(self.work, name, month, rank), "rb") for rank in ranks}
        try:
            def chunks():
                for _, _, rank, offset, n in keys:
                    files[rank].seek(offset)
                    yield np.frombuffer(files[rank].read(4 * n), "<i4")

            tokens_file, lengths_file = month_files(self.folder, name, month)
            paths.makedirs(paths.dirname(tokens_file))
            write_npy(tokens_file, chunks(), int(lengths.sum()), "<i4")
            write_npy(lengths_file, [lengths], len(lengths), "<i8")
        finally:
            for f in files.values():
                f.close()
        return json.dumps([name, month, len(keys), int(lengths.sum()), keys[0][0], keys[-1][0]])


def write_streams_beam(corpus: Corpus, split_files: Mapping[str, str], spm_model: str, folder: str,
                       pipeline_options: Sequence[str], format: str = "auto", on_error: str = "raise",
                       work_dir: str = None) -> dict:
    """`lm_streams.write_streams` as a Beam pipeline run with `pipeline_options` (Beam's own flags): the same
    folder (module docstring). `work_dir`: as `splits_beam.index_corpus_beam`'s."""
    import datetime

    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from templm.data.lm_data import load_processor, require_split_file

    corpus = resolve_corpus(corpus)
    files = corpus_files(corpus)
    spm_model = paths.absolute(spm_model)
    eos_id = int(load_processor(spm_model).eos_id())  # a bad model file, said here rather than by a worker
    split_files = {name: paths.absolute(path) for name, path in split_files.items()}
    for path in split_files.values():
        require_split_file(path)
    for path in files:  # a missing file or an unknown format, said here rather than by a worker
        read_documents(path, format=format, on_error=on_error)
    options = PipelineOptions(list(pipeline_options))
    with work_folder(options, "templm-streams-", work_dir) as work:
        with beam_pipeline(options) as pipeline:
            ids = (pipeline | "split files" >> beam.Create(sorted(split_files.items()))
                   | "split ids" >> beam.FlatMap(_SplitIds()))
            places = (pipeline | "corpus files" >> beam.Create(list(enumerate(files)))
                      | "spread the files" >> beam.Reshuffle()
                      | "places" >> beam.FlatMap(_Places(format, on_error)))
            joined = ((ids, places) | "both" >> beam.Flatten() | "by id" >> beam.GroupByKey()
                      | "join" >> beam.FlatMap(_join).with_outputs("missing", "counts", main="kept"))
            (joined.kept | "by file" >> beam.GroupByKey()
             | "tokenise" >> beam.FlatMap(_TokenizeFile(work, files, format, on_error, spm_model))
             | "by month" >> beam.GroupByKey()
             | "write months" >> beam.Map(_WriteMonth(work, folder))
             | "write month lines" >> beam.io.WriteToText(paths.join(work, "months")))
            (joined.counts | "sum" >> beam.CombinePerKey(sum)
             | "count lines" >> beam.MapTuple(lambda key, n: json.dumps([key, n]))
             | "write counts" >> beam.io.WriteToText(paths.join(work, "counts")))
            (joined.missing | "first missing" >> beam.combiners.Top.SmallestPerKey(MISSING_IDS_SHOWN)
             | "missing lines" >> beam.MapTuple(lambda name, first: json.dumps([name, [i for _, i in first]]))
             | "write missing" >> beam.io.WriteToText(paths.join(work, "missing")))
        counts = dict(json.loads(line) for line in read_lines(paths.join(work, "counts") + "*"))
        missing_ids = dict(json.loads(line) for line in read_lines(paths.join(work, "missing") + "*"))
        months = [json.loads(line) for line in read_lines(paths.join(work, "months") + "*")]
    entries = {}
    for name, split_file in split_files.items():  # in the given order, as the single process checks them
        mine = sorted(m for m in months if m[0] == name)
        missing, mismatches = counts.get(f"missing:{name}", 0), counts.get(f"date_mismatches:{name}", 0)
        warn_split_report(describe_corpus(corpus), split_file, counts.get(f"expected:{name}", 0), missing,
                          missing_ids.get(name, []), mismatches)
        check_found(name, len(mine), missing, split_file, corpus)
        first, last = (datetime.date.fromordinal(ordinal).isoformat() for ordinal in (mine[0][4], mine[-1][5]))
        entries[name] = split_entry(split_file, {m[1]: (m[2], m[3]) for m in mine}, first, last, missing,
                                    missing_ids.get(name, []), mismatches)
    return write_manifest(folder, corpus, spm_model, eos_id, entries)
