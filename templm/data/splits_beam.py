"""The corpus index of `templm data splits` on Apache Beam: reading, the language filter and the near-duplicate
removal in parallel (`templm data splits --runner=...`), for a corpus one process cleans too slowly (WMT News Crawl
to the paper's cut-off is tens of millions of documents; the clean-up handles about 850 a second a core).

The rules are the single process's (`splits.index_corpus` with `filters.DocumentFilter`), computed without its
order-dependent state:

* Each file is read whole by one worker, by the reader of its format; a document's place in the corpus is (the
  file's rank, its number in the file), the order the single process reads in.
* A repeated id: its first document is the one used, the later ones counted (a combine by id).
* The language check on that document, as the single process makes it.
* Near-duplicates: the single process drops a document when one it kept earlier is an LSH candidate (an equal band
  of the MinHash signature) with an estimated Jaccard similarity at the threshold. Here: documents with equal
  signatures are grouped and all but the earliest dropped (whatever happens to the earliest, each later one has the
  same candidates and similarities as it, and it as one more); the rest are grouped by band, and each pair in a
  band whose similarity reaches the threshold is an edge from the later document to the earlier one. The driver
  then walks the documents with edges in corpus order: one is dropped when an earlier end of its edges is kept.
  That is the single process's decision for every document, so the same documents are kept.

The driver holds what the splits are drawn from (date and id of each kept document, as the single process does)
and the similar pairs; the workers hold a file's reader, or one id's, one signature's or one band's group.
Where it differs: an id with a tab or a line break is named by its number in its file, not in the corpus.
"""

from __future__ import annotations

import collections
import json
import time
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from templm import console, paths
from templm.data.beam_work import pipeline as beam_pipeline, read_lines, work_folder
from templm.data.filters import FilterConfig, Signer, filter_stats, language_check, similarity
from templm.data.readers import Corpus, corpus_files, describe_corpus, read_documents, resolve_corpus
from templm.data.splits import CorpusIndex, active_clean, check_id, sorted_index

Place = Tuple[int, int]  # (the file's rank in the corpus, the document's number in the file)


class _ReadFile:
    """One corpus file's documents (a Beam FlatMap): (id, (file rank, number, day ordinal, text))."""

    def __init__(self, format: str, on_error: str):
        self.format, self.on_error = format, on_error

    def __call__(self, element: Tuple[int, str]) -> Iterator[Tuple[str, tuple]]:
        rank, path = element
        for number, doc in enumerate(read_documents(path, format=self.format, on_error=self.on_error), 1):
            check_id(doc.id, number, path)
            yield doc.id, (rank, number, doc.date.toordinal(), doc.text)


def _first_of_id():
    """A combine of one id's documents: (how many, the first in corpus order)."""
    import apache_beam as beam

    class FirstOfId(beam.CombineFn):
        def create_accumulator(self):
            return 0, None

        def add_input(self, accumulator, value):
            count, first = accumulator
            return count + 1, value if first is None or value[:2] < first[:2] else first

        def merge_accumulators(self, accumulators):
            count, first = 0, None
            for n, value in accumulators:
                count += n
                if value is not None and (first is None or value[:2] < first[:2]):
                    first = value
            return count, first

        def extract_output(self, accumulator):
            return accumulator

    return FirstOfId()


class _Check:
    """The language check and the signature of an id's first document (a Beam FlatMap): counts to "counts", a
    document kept without a near-duplicate check to "kept", else (signature bytes, (rank, number, ordinal, id))."""

    def __init__(self, config: Optional[FilterConfig]):
        self.config = config
        self.signer: Optional[Signer] = None

    def __call__(self, element: Tuple[str, Tuple[int, tuple]]) -> Iterator[Any]:
        from apache_beam import pvalue

        if self.signer is None and self.config is not None and self.config.near_duplicate_threshold is not None:
            self.signer = Signer(self.config)  # in the worker: its permutations drawn there once
        doc_id, (count, (rank, number, ordinal, text)) = element
        yield pvalue.TaggedOutput("counts", ("read", count))
        if count > 1:
            yield pvalue.TaggedOutput("counts", ("later_copies", count - 1))
        c = self.config
        if c is not None and c.language is not None:
            verdict, language = language_check(c, text)
            if verdict == "unchecked":
                yield pvalue.TaggedOutput("counts", ("language_unchecked", 1))
            elif verdict == "other_language":
                yield pvalue.TaggedOutput("counts", ("other_language", 1))
                yield pvalue.TaggedOutput("counts", (f"language:{language}", 1))
                return
        if self.signer is None:
            yield pvalue.TaggedOutput("kept", json.dumps([rank, number, ordinal, doc_id]))
            return
        yield self.signer(text).tobytes(), (rank, number, ordinal, doc_id)


def _earliest_of_equal(element: Tuple[bytes, List[tuple]]) -> Iterator[Any]:
    """Documents with one signature: the earliest goes on, the others are near-duplicates (counted)."""
    from apache_beam import pvalue

    signature, documents = element
    documents = sorted(documents)
    if len(documents) > 1:
        yield pvalue.TaggedOutput("counts", ("equal_signature", len(documents) - 1))
    yield signature, documents[0]


class _Bands:
    """A document's LSH band keys (a Beam FlatMap): ((band, its values), (place, signature))."""

    def __init__(self, config: FilterConfig):
        self.config = config
        self.bands: Optional[List[Tuple[int, int]]] = None

    def __call__(self, element: Tuple[bytes, tuple]) -> Iterator[Tuple[Tuple[int, bytes], Tuple[Place, bytes]]]:
        if self.bands is None:
            self.bands = Signer(self.config).bands
        signature, (rank, number, _, _) = element
        for band, (start, end) in enumerate(self.bands):
            yield (band, signature[4 * start:4 * end]), ((rank, number), signature)


class _Pairs:
    """The similar pairs of one band's documents (a Beam FlatMap): (later place, earlier place) for each pair whose
    estimated similarity reaches the threshold."""

    def __init__(self, threshold: float):
        self.threshold = threshold

    def __call__(self, element: Tuple[Any, List[Tuple[Place, bytes]]]) -> Iterator[str]:
        _, members = element
        if len(members) < 2:
            return
        members = sorted(members)
        values = [np.frombuffer(signature, dtype=np.uint32) for _, signature in members]
        for later in range(1, len(members)):
            for earlier in range(later):
                if similarity(values[earlier], values[later]) >= self.threshold:
                    yield json.dumps([list(members[later][0]), list(members[earlier][0])])


def index_corpus_beam(corpus_path: Corpus, pipeline_options: Sequence[str], format: str = "auto",
                      on_error: str = "raise", clean: Optional[FilterConfig] = FilterConfig(),
                      work_dir: Optional[str] = None) -> CorpusIndex:
    """`splits.index_corpus` as a Beam pipeline run with `pipeline_options` (Beam's own flags, e.g.
    ["--runner=FnApiRunner", "--direct_num_workers=2"]): the same index (module docstring). `work_dir`: as
    `wikidata_beam.build_templama_beam`'s."""
    return index_and_places_beam(corpus_path, pipeline_options, format, on_error, clean, work_dir)[0]


def index_and_places_beam(corpus_path: Corpus, pipeline_options: Sequence[str], format: str = "auto",
                          on_error: str = "raise", clean: Optional[FilterConfig] = FilterConfig(),
                          work_dir: Optional[str] = None) -> Tuple[CorpusIndex, Dict[int, List[int]]]:
    """`index_corpus_beam`'s index and where its documents are: {file rank: the numbers in that file of the documents
    the index holds, ascending} (what a later pipeline over the same files keeps, `task_data_beam`)."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    corpus = resolve_corpus(corpus_path)
    files = corpus_files(corpus)
    where = describe_corpus(corpus)
    config = active_clean(clean)
    for path in files:  # a missing file or an unknown format, said here rather than by a worker
        read_documents(path, format=format, on_error=on_error)
    begun = time.monotonic()
    options = PipelineOptions(list(pipeline_options))
    with work_folder(options, "templm-splits-", work_dir) as work:
        with beam_pipeline(options) as pipeline:
            checked = (pipeline
                       | "files" >> beam.Create(list(enumerate(files)))
                       | "spread the files" >> beam.Reshuffle()
                       | "read" >> beam.FlatMap(_ReadFile(format, on_error))
                       | "first of each id" >> beam.CombinePerKey(_first_of_id())
                       | "check" >> beam.FlatMap(_Check(config)).with_outputs("counts", "kept", main="signed"))
            counts = [checked.counts]
            kept = [checked.kept]
            if config is not None and config.near_duplicate_threshold is not None:
                distinct = (checked.signed | "by signature" >> beam.GroupByKey()
                            | "earliest of equal" >> beam.FlatMap(_earliest_of_equal).with_outputs(
                                "counts", main="documents"))
                counts.append(distinct.counts)
                kept.append(distinct.documents | "candidates" >> beam.Map(
                    lambda item: json.dumps([item[1][0], item[1][1], item[1][2], item[1][3]])))
                (distinct.documents | "bands" >> beam.FlatMap(_Bands(config)) | "by band" >> beam.GroupByKey()
                 | "similar pairs" >> beam.FlatMap(_Pairs(float(config.near_duplicate_threshold)))
                 | "distinct pairs" >> beam.Distinct()
                 | "write pairs" >> beam.io.WriteToText(paths.join(work, "pairs")))
            (tuple(counts) | "all counts" >> beam.Flatten() | "sum" >> beam.CombinePerKey(sum)
             | "count lines" >> beam.MapTuple(lambda key, n: json.dumps([key, n]))
             | "write counts" >> beam.io.WriteToText(paths.join(work, "counts")))
            (tuple(kept) | "all kept" >> beam.Flatten()
             | "write documents" >> beam.io.WriteToText(paths.join(work, "documents")))
        counts_read = dict(json.loads(line) for line in read_lines(paths.join(work, "counts") + "*"))
        documents = [json.loads(line) for line in read_lines(paths.join(work, "documents") + "*")]
        pairs = [json.loads(line) for line in read_lines(paths.join(work, "pairs") + "*")] if config else []
    dropped = _near_duplicates(pairs)
    documents.sort(key=lambda d: (d[0], d[1]))
    ordinals = [ordinal for rank, number, ordinal, _ in documents if (rank, number) not in dropped]
    ids = [doc_id for rank, number, _, doc_id in documents if (rank, number) not in dropped]
    places: Dict[int, List[int]] = collections.defaultdict(list)
    for rank, number, _, _ in documents:
        if (rank, number) not in dropped:
            places[rank].append(number)
    del documents
    filtered = None
    if config is not None:
        languages = collections.Counter({key.split(":", 1)[1]: n for key, n in counts_read.items()
                                         if key.startswith("language:")})
        filtered = filter_stats(config, counts_read.get("other_language", 0), languages,
                                counts_read.get("language_unchecked", 0),
                                counts_read.get("equal_signature", 0) + len(dropped), len(ids))
    console.say(f"{where}: indexed {counts_read.get('read', 0)} documents on Beam in "
                f"{time.monotonic() - begun:.0f}s")
    return sorted_index(ordinals, ids, counts_read.get("read", 0), counts_read.get("later_copies", 0), filtered,
                        corpus, where, config), dict(places)


def _near_duplicates(pairs: List[List[List[int]]]) -> set:
    """The places dropped as near-duplicates: in corpus order, a document with an earlier similar one that is kept."""
    earlier: Dict[Place, List[Place]] = collections.defaultdict(list)
    for later, first in pairs:
        earlier[tuple(later)].append(tuple(first))
    dropped: set = set()
    for place in sorted(earlier):
        if any(other not in dropped for other in earlier[place]):
            dropped.add(place)
    return dropped
