"""`templm data tasks --runner=...`: the work of the task data that grows with the corpus, on Apache Beam.

`task_data.prepare_task_data(config, out, via=OnBeam(options))` runs the single process's build with two of its
parts here; everything else (the yearly buckets drawn from the index, the entity detector's fit on the first
training documents, TempLAMA's records, the vocabulary, the manifest) is the single process's code, so the folder
is the same bytes:

* The corpus index (what the clean-up keeps) is `splits_beam`'s pipeline, which also says where each kept document
  is: its file's rank and its number in the file.
* The salient-span records: each corpus file is read whole by one worker, which makes the examples of the file's
  kept documents and writes them, in the file's order, to one shard per split and year in the work folder, with
  their counts. The driver then knows where each file's records fall in the single process's order (the files'
  ranks, then the numbers in each file), and each output file (a split's year, or one of its `files_per_year`
  parts, records dealt out in turn) is written by one worker reading the shards in rank order. A worker holds one
  document, or one record, at a time.

Not on Beam: `one_span_per_sentence` (it draws spans with one generator across the corpus in order), and the
vocabulary's sample, read by the launching process in one streaming pass.
"""

from __future__ import annotations

import json
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from templm import paths
from templm.data.beam_work import read_lines, work_folder
from templm.data.filters import FilterConfig
from templm.data.readers import Corpus, corpus_files, read_documents
from templm.data.splits import CorpusIndex
from templm.data.splits_beam import index_and_places_beam
from templm.errors import ConfigError


def _shard(work: str, rank: int, split: str, year: int) -> str:
    return paths.join(work, "shards", f"{rank:06d}", f"{split}-{year}.tfrecord")


class _ExtractFile:
    """The records of one corpus file's kept documents (a Beam FlatMap over (rank, path)): written to a shard per
    split and year in the file's order; yields one JSON line per shard, [split, year, rank, records, first number]."""

    def __init__(self, work: str, fmt: str, split_of: Dict[str, str], detector: Any, detector_name: str):
        self.work, self.fmt, self.split_of = work, fmt, split_of
        self.detector, self.detector_name = detector, detector_name

    def __call__(self, element: Tuple[int, str]) -> Iterator[str]:
        import random

        from templm.data.salient_spans import make_entity_detector, ssm_examples
        from templm.data.task_data import _tf, document_example
        from templm.data.tfrecords import RecordFile

        rank, path = element
        if self.detector is None:  # a spaCy pipeline: loaded in the worker, not shipped to it
            self.detector = make_entity_detector(self.detector_name)
        with paths.open(paths.join(self.work, "kept", f"{rank:06d}.json"), "r") as f:
            kept = set(json.load(f))
        tf = _tf()
        shards: Dict[Tuple[str, int], list] = {}  # (split, year) -> [writer, records, first number]
        try:
            for number, doc in enumerate(read_documents(path, format=self.fmt), 1):
                if number not in kept:
                    continue
                split = self.split_of.get(doc.id, "train")
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
            yield json.dumps([split, year, rank, records, first])


class _WritePart:
    """One output record file (a Beam Map over (split, year, part, [(rank, offset, records), ...])): the shards'
    records whose place in the year's single order (offset + number in the shard) falls to this part."""

    def __init__(self, work: str, folder: str, files: int):
        self.work, self.folder, self.files = work, folder, files

    def __call__(self, element: Tuple[str, int, int, List[List[int]]]) -> None:
        from templm.data.task_data import _tf, record_file_name
        from templm.data.tfrecords import RecordFile

        split, year, part, pieces = element
        tf = _tf()
        with RecordFile(paths.join(self.folder, record_file_name(split, year, part, self.files))) as out:
            for rank, offset, _ in pieces:
                for j, record in enumerate(tf.data.TFRecordDataset(_shard(self.work, rank, split, year))
                                           .as_numpy_iterator()):
                    if (offset + j) % self.files == part:
                        out.write(record)


class OnBeam:
    """The `via` of `task_data.prepare_task_data` that runs the clean-up and the salient-span records as Beam
    pipelines with `pipeline_options` (Beam's own flags). `work_dir`: as `splits_beam.index_corpus_beam`'s."""

    def __init__(self, pipeline_options: Sequence[str], work_dir: Optional[str] = None):
        self.pipeline_options = list(pipeline_options)
        self.work_dir = work_dir

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
            paths.makedirs(paths.join(work, "kept"))
            for rank, numbers in places.items():
                with paths.open(paths.join(work, "kept", f"{rank:06d}.json"), "w") as f:
                    json.dump(numbers, f)
            with beam.Pipeline(options=options) as pipeline:
                (pipeline
                 | "files" >> beam.Create([(rank, files[rank]) for rank in sorted(places)])
                 | "spread the files" >> beam.Reshuffle()
                 | "salient spans" >> beam.FlatMap(_ExtractFile(work, fmt, split_of, shipped, config.detector))
                 | "write counts" >> beam.io.WriteToText(paths.join(work, "counts")))
            shards = [json.loads(line) for line in read_lines(paths.join(work, "counts") + "*")]
            parts, counts = _deal(shards, config.files_per_year)
            folder = paths.join(root, "customnews")
            if parts:
                paths.makedirs(folder)
                with beam.Pipeline(options=options) as pipeline:
                    (pipeline
                     | "record files" >> beam.Create(parts)
                     | "spread them" >> beam.Reshuffle()
                     | "write" >> beam.Map(_WritePart(work, folder, config.files_per_year)))
        return counts


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
