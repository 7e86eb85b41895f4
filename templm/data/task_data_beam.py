"""`templm data tasks --runner=...`: the work of the task data that grows with the corpus, on Apache Beam.

`task_data.prepare_task_data(config, out, via=OnBeam(options))` runs the single process's build with three of its
parts here; everything else (the yearly buckets drawn from the index, the entity detector's fit on the first
training documents, TempLAMA's records, SentencePiece's training on the sample, the manifest) is the single
process's code, so the folder is the same bytes:

* The corpus index (what the clean-up keeps) is `splits_beam`'s pipeline, which also says where each kept document
  is: its file's rank and its number in the file.
* The salient-span records: each corpus file is read whole by one worker, which makes the examples of the file's
  kept documents and writes them, in the file's order, to one shard per split and year in the work folder, with
  their counts. The driver then knows where each file's records fall in the single process's order (the files'
  ranks, then the numbers in each file), and each output file (a split's year, or one of its `files_per_year`
  parts, records dealt out in turn) is written by one worker copying the shards' record frames in rank order
  (no TensorFlow there: a frame carries its own checksums). A worker holds one document, or one record, at a time.
* The vocabulary's sample: the records' workers also count each file's training lines by year; the driver numbers
  the lines as the single process reads them (the Temporal prefixes, then the seen years' training documents in
  corpus order), draws the numbers its reservoir sampling would keep from their count alone
  (`vocab.reservoir_lines`: its generator's draws do not depend on the lines), and one worker a file sends back the
  drawn lines. The driver holds the sample, as the single process does, and trains SentencePiece on it.

Not on Beam: `one_span_per_sentence` (it draws spans with one generator across the corpus in order), the entity
detector's fit (the first 5,000 training documents, read by the driver) and SentencePiece's training itself.
"""

from __future__ import annotations

import bisect
import json
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from templm import paths
from templm.data.beam_work import pipeline as beam_pipeline, read_lines, work_folder
from templm.data.filters import FilterConfig
from templm.data.readers import Corpus, corpus_files, read_documents
from templm.data.splits import CorpusIndex
from templm.data.splits_beam import index_and_places_beam
from templm.errors import ConfigError


def _shard(work: str, rank: int, split: str, year: int) -> str:
    return paths.join(work, "shards", f"{rank:06d}", f"{split}-{year}.tfrecord")


def _kept_numbers(work: str, rank: int) -> set:
    with paths.open(paths.join(work, "kept", f"{rank:06d}.json"), "r") as f:
        return set(json.load(f))


def _write_kept(work: str, places: Dict[int, List[int]]) -> None:
    """Each file's kept document numbers in the work folder, where its worker reads them (`_kept_numbers`)."""
    paths.makedirs(paths.join(work, "kept"))
    for rank, numbers in places.items():
        with paths.open(paths.join(work, "kept", f"{rank:06d}.json"), "w") as f:
            json.dump(numbers, f)


class _ExtractFile:
    """The records of one corpus file's kept documents (a Beam FlatMap over (rank, path)): written to a shard per
    split and year in the file's order; yields one JSON line per shard, ["records", split, year, rank, records,
    first number], and per year the vocabulary's training lines of its training documents, ["lines", year, rank,
    lines]."""

    def __init__(self, work: str, fmt: str, split_of: Dict[str, str], detector: Any, detector_name: str):
        self.work, self.fmt, self.split_of = work, fmt, split_of
        self.detector, self.detector_name = detector, detector_name

    def __call__(self, element: Tuple[int, str]) -> Iterator[str]:
        import random

        import tensorflow as tf  # in the worker: the records are tf.train.Example protos

        from templm.data.salient_spans import make_entity_detector, ssm_examples
        from templm.data.task_data import document_example
        from templm.data.tfrecords import RecordFile
        from templm.data.vocab import split_sentences_for_spm

        rank, path = element
        if self.detector is None:  # a spaCy pipeline: loaded in the worker, not shipped to it
            self.detector = make_entity_detector(self.detector_name)
        kept = _kept_numbers(self.work, rank)
        shards: Dict[Tuple[str, int], list] = {}  # (split, year) -> [writer, records, first number]
        lines: Dict[int, int] = {}
        try:
            for number, doc in enumerate(read_documents(path, format=self.fmt), 1):
                if number not in kept:
                    continue
                split = self.split_of.get(doc.id, "train")
                if split == "train":
                    lines[doc.date.year] = lines.get(doc.date.year, 0) + len(split_sentences_for_spm(doc.text))
                examples = ssm_examples(doc.text, self.detector, False, random.Random(0))  # (rng unused: all spans)
                for i, example in enumerate(examples):
                    key = (split, doc.date.year)
                    if key not in shards:
                        target = _shard(self.work, rank, *key)
                        paths.makedirs(paths.dirname(target))
                        shards[key] = [RecordFile(target), 0, number]
                    shards[key][0].write(document_example(tf, example, doc, i))
                    shards[key][1] += 1
        finally:
            for writer, _, _ in shards.values():
                writer.close()
        for (split, year), (_, records, first) in shards.items():
            yield json.dumps(["records", split, year, rank, records, first])
        for year, count in lines.items():
            yield json.dumps(["lines", year, rank, count])


def _frames(f: Any) -> Iterator[bytes]:
    """The records of an open TFRecord file as they are framed on disk (length, its CRC, the data, its CRC): a
    record's frame copied into another file is that record there, checksums included, without TensorFlow."""
    while True:
        head = f.read(12)
        if not head:
            return
        if len(head) < 12:
            raise ValueError(f"a truncated record frame ({len(head)} bytes)")
        length = int.from_bytes(head[:8], "little")
        rest = f.read(length + 4)
        if len(rest) < length + 4:
            raise ValueError("a truncated record")
        yield head + rest


class _WritePart:
    """One output record file (a Beam Map over (split, year, part, [(rank, offset, records), ...])): the shards'
    records whose place in the year's single order (offset + number in the shard) falls to this part, their frames
    copied (one part a year: the shards' bytes one after the other, which is the same file)."""

    def __init__(self, work: str, folder: str, files: int):
        self.work, self.folder, self.files = work, folder, files

    def __call__(self, element: Tuple[str, int, int, List[List[int]]]) -> None:
        import shutil

        from templm.data.task_data import record_file_name
        from templm.io import atomic_write

        split, year, part, pieces = element

        def write(temporary: str) -> None:
            with paths.open(temporary, "wb") as out:
                for rank, offset, _ in pieces:
                    with paths.open(_shard(self.work, rank, split, year), "rb") as f:
                        if self.files == 1:
                            shutil.copyfileobj(f, out, 1 << 20)
                            continue
                        for j, frame in enumerate(_frames(f)):
                            if (offset + j) % self.files == part:
                                out.write(frame)

        atomic_write(paths.join(self.folder, record_file_name(split, year, part, self.files)), write)


class OnBeam:
    """The `via` of `task_data.prepare_task_data` that runs the clean-up, the salient-span records and the
    vocabulary's sample as Beam pipelines with `pipeline_options` (Beam's own flags). `work_dir`: as
    `splits_beam.index_corpus_beam`'s."""

    def __init__(self, pipeline_options: Sequence[str], work_dir: Optional[str] = None):
        self.pipeline_options = list(pipeline_options)
        self.work_dir = work_dir
        self.lines: Dict[Tuple[int, int], int] = {}  # (file rank, year) -> the vocabulary's lines, from `customnews`

    def check(self, config: Any) -> None:
        """Refuses, before any work, what the pipelines cannot make the single process's way."""
        if config.one_span_per_sentence:
            raise ConfigError("--one_span_per_sentence draws one span a sentence with a single generator across the "
                              "corpus in order, which a pipeline cannot share: build it without --runner")

    def index(self, corpus: Corpus, fmt: str, clean: Optional[FilterConfig]
              ) -> Tuple[CorpusIndex, Dict[int, List[int]]]:
        return index_and_places_beam(corpus, self.pipeline_options, fmt, "raise", clean, self.work_dir)

    def customnews(self, corpus: Corpus, fmt: str, places: Dict[int, List[int]], split_of: Dict[str, str],
                   detector: Any, config: Any, root: str) -> Dict[str, Dict[str, int]]:
        """Writes `root`/customnews/ as the single process does; returns its counts {split: {year: records}}, the
        splits in the order their first record comes in the corpus (the manifest's order)."""
        import apache_beam as beam
        from apache_beam.options.pipeline_options import PipelineOptions

        from templm.data.salient_spans import BuiltinEntityDetector

        files = corpus_files(corpus)
        options = PipelineOptions(self.pipeline_options)
        shipped = detector if isinstance(detector, BuiltinEntityDetector) else None
        with work_folder(options, "templm-tasks-", self.work_dir) as work:
            _write_kept(work, places)
            with beam_pipeline(options) as pipeline:
                (pipeline
                 | "files" >> beam.Create([(rank, files[rank]) for rank in sorted(places)])
                 | "spread the files" >> beam.Reshuffle()
                 | "salient spans" >> beam.FlatMap(_ExtractFile(work, fmt, split_of, shipped, config.detector))
                 | "write counts" >> beam.io.WriteToText(paths.join(work, "counts")))
            counted = [json.loads(line) for line in read_lines(paths.join(work, "counts") + "*")]
            self.lines = {(rank, year): n for _, year, rank, n in (c for c in counted if c[0] == "lines")}
            parts, counts = _deal([c[1:] for c in counted if c[0] == "records"], config.files_per_year)
            folder = paths.join(root, "customnews")
            if parts:
                paths.makedirs(folder)
                with beam_pipeline(options) as pipeline:
                    (pipeline
                     | "record files" >> beam.Create(parts)
                     | "spread them" >> beam.Reshuffle()
                     | "write" >> beam.Map(_WritePart(work, folder, config.files_per_year)))
        return counts

    def spm_sample(self, corpus: Corpus, fmt: str, places: Dict[int, List[int]], split_of: Dict[str, str],
                   seen_years: Sequence[int], prefixes: Sequence[Any], max_sentences: int, seed: int
                   ) -> Tuple[List[str], int]:
        """The vocabulary's sample (lines, lines seen) as `vocab.sample_sentences` draws it from `prefixes` then the
        seen years' training documents in corpus order: the lines' numbers from the counts `customnews` made, the
        drawn ones (`vocab.reservoir_lines`) read back by one worker a file."""
        import apache_beam as beam
        from apache_beam.options.pipeline_options import PipelineOptions

        from templm.data.vocab import reservoir_lines, split_sentences_for_spm

        head = [line for doc in prefixes for line in split_sentences_for_spm(doc.text)]
        files, seen_years = corpus_files(corpus), set(seen_years)
        offsets, seen = {}, len(head)
        for rank in sorted(places):
            offsets[rank] = seen
            seen += sum(n for (r, year), n in self.lines.items() if r == rank and year in seen_years)
        slots = reservoir_lines(seen, max_sentences, seed)
        wanted: Dict[int, List[int]] = {}
        ranks = sorted(offsets)
        starts = [offsets[rank] for rank in ranks]
        for number in sorted(n for n in slots if n >= len(head)):
            # the file holding line `number`: the last whose first line is at most it (one without lines is passed)
            rank = ranks[bisect.bisect_right(starts, number) - 1]
            wanted.setdefault(rank, []).append(number)
        found = {n: head[n] for n in slots if n < len(head)}
        if wanted:
            options = PipelineOptions(self.pipeline_options)
            with work_folder(options, "templm-spm-", self.work_dir) as work:
                _write_kept(work, {rank: places[rank] for rank in wanted})
                with beam_pipeline(options) as pipeline:
                    (pipeline
                     | "files" >> beam.Create([(rank, files[rank], offsets[rank], numbers)
                                               for rank, numbers in sorted(wanted.items())])
                     | "spread the files" >> beam.Reshuffle()
                     | "drawn lines" >> beam.FlatMap(_SampleFile(work, fmt, split_of, sorted(seen_years)))
                     | "write lines" >> beam.io.WriteToText(paths.join(work, "lines")))
                for line in read_lines(paths.join(work, "lines") + "*"):
                    number, text = json.loads(line)
                    found[number] = text
        return [found[n] for n in slots], seen


class _SampleFile:
    """The drawn vocabulary lines of one corpus file (a Beam FlatMap over (rank, path, offset, numbers)): its seen
    years' training documents' lines numbered from `offset` in the file's order; yields [number, line] for the
    drawn numbers."""

    def __init__(self, work: str, fmt: str, split_of: Dict[str, str], seen_years: List[int]):
        self.work, self.fmt, self.split_of, self.seen_years = work, fmt, split_of, set(seen_years)

    def __call__(self, element: Tuple[int, str, int, List[int]]) -> Iterator[str]:
        from templm.data.vocab import split_sentences_for_spm

        rank, path, number, drawn = element
        kept, drawn = _kept_numbers(self.work, rank), set(drawn)
        for place, doc in enumerate(read_documents(path, format=self.fmt), 1):
            if place not in kept or doc.id in self.split_of or doc.date.year not in self.seen_years:
                continue
            for line in split_sentences_for_spm(doc.text):
                if number in drawn:
                    yield json.dumps([number, line])
                number += 1


def _deal(shards: List[List[Any]], files: int) -> Tuple[List[tuple], Dict[str, Dict[str, int]]]:
    """From the shards' [split, year, rank, records, first number]: the output files to write, (split, year, part,
    [(rank, offset, records), ...]) with each shard's offset in its year's single order, and the counts by split
    (in the order of each split's first record in the corpus) and year."""
    by_key: Dict[Tuple[str, int], List[Tuple[int, int]]] = {}
    first: Dict[str, Tuple[int, int]] = {}
    for split, year, rank, records, number in shards:
        by_key.setdefault((split, year), []).append((rank, records))
        first[split] = min(first.get(split, (rank, number)), (rank, number))
    parts = []
    counts: Dict[str, Dict[str, int]] = {split: {} for split in sorted(first, key=first.get)}
    for (split, year), pieces in sorted(by_key.items()):
        offset, placed = 0, []
        for rank, records in sorted(pieces):
            placed.append((rank, offset, records))
            offset += records
        counts[split][str(year)] = offset
        parts += [(split, year, part, placed) for part in range(min(files, offset))]
    return parts, counts
