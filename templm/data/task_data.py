"""Record files behind the SeqIO tasks: CustomNews salient-span-masking examples and TempLAMA cloze queries.

`prepare_task_data(config, out_dir)` turns a corpus (or the embedded world) into

    customnews/{train,validation,test}-YYYY.tfrecord   one SSM example per salient span of each document
    templama/{train,validation,test}-YYYY.tfrecord      one example per TempLAMA query
    (with files_per_year N > 1: {split}-YYYY-0000i-of-0000N.tfrecord, the year's records dealt out in turn)
    splits/yearly/YYYY_{train,validation,test}.gz      which documents went where (split-file format)
    spm/vocab.model                                    SentencePiece model trained on the seen years' training documents
    manifest.json                                      years, seen/future slices, counts, vocabulary, config

Every file is made from the documents the clean-up keeps (templm.data.splits.index_corpus: no other language, no
near-copy of an earlier document, a repeated id's first document only), the documents the splits are drawn from.

Files are split by year so a Yearly task reads only its year and a Uniform or Temporal task reads them all, and
optionally each year into several files, so that a training run's data shards (one per host) can each read whole
files of their own (templm/training/input_pipeline.py; a split with fewer files than shards is read whole by every
shard). Records are tf.train.Example protos with `inputs`, `targets`, `answers` (every gold answer), `year` and
`id`. Record files (rather than a generator) make shuffling seeded and resumable, and keep seqio from re-running the
extraction.

`ensure_task_data(out_dir, config)` prepares the folder once, under a file lock, so two processes that start at the
same time do not both build it; everything is written under `out_dir.partial` and renamed at the end.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import datetime
import itertools
import json
import os
import random
import time
from typing import Any, Dict, Iterator, Optional, Sequence, Tuple

from absl import logging

from templm.data.readers import (Corpus, TemplamaReader, describe_corpus, read_documents, resolve_corpus,
                                 templama_split_files)
from templm.data.records import Document
from templm.data.salient_spans import BuiltinEntityDetector, cloze_to_ssm, make_entity_detector, ssm_examples
from templm.data.filters import FilterConfig
from templm.data.splits import CorpusIndex, index_corpus, read_split_file, yearly_buckets
from templm.data.tfrecords import RecordFile
from templm.data.vocab import train_spm
from templm.data.world import WORLD_VERSION, WorldConfig, generate_world
from templm import console, paths
from templm.errors import DataError, require_numbers
from templm.io import write_json
from templm.outputs import build_output_folder, locked
from templm.settings import Settings

SPLITS = ("train", "validation", "test")
MANIFEST = "manifest.json"
MANIFEST_VERSION = 1


@dataclasses.dataclass(frozen=True)
class TaskDataConfig:
    """What to build the tasks from. `corpus=None` means the embedded world drawn with `world`."""

    corpus: Optional[Corpus] = None  # one file, a glob pattern or a list of either
    corpus_format: str = "auto"
    templama_dir: Optional[str] = None  # {train,val,test}.json (or .jsonl) as released; default: the world's
    world: WorldConfig = WorldConfig()
    vocab_size: int = 768  # the world's vocabulary is small; use 32000 for a real news corpus
    exact_vocab_size: bool = True  # False: vocab_size is an upper bound (train_spm's exact_size)
    max_spm_sentences: int = 1_000_000
    detector: str = "builtin"  # or the name of an installed spaCy pipeline
    one_span_per_sentence: bool = False
    heldout_per_year: int = 2000
    heldout_fraction: float = 0.1
    future_years: int = 2  # the last N years are the "future" slice; the rest are "seen"
    seed: int = 0
    clean: Optional[FilterConfig] = FilterConfig()  # other languages and near-duplicates out (None: keep all)
    files_per_year: int = 1  # record files per split and year (>= the data shards of a multi-host training run)

    def __post_init__(self):
        if isinstance(self.corpus, list):  # a list of files: kept as a tuple, so the config stays hashable
            object.__setattr__(self, "corpus", tuple(self.corpus))
        require_numbers("TaskDataConfig", {"future_years": (self.future_years, int, 0, None),
                                           "vocab_size": (self.vocab_size, int, 4, None),
                                           "heldout_per_year": (self.heldout_per_year, int, 0, None),
                                           "seed": (self.seed, int, 0, None)})


def _tf():
    import tensorflow as tf  # deferred: seconds to import; the writer and the manifest reader need it

    return tf


def document_example(tf, example: Any, doc: Document, number: int) -> bytes:
    """The record of a document's `number`-th salient-span example (`salient_spans.SsmExample`)."""
    return _example(tf, example.inputs, example.targets, [example.targets], doc.date.year, f"{doc.id}#{number}")


def _example(tf, inputs: str, targets: str, answers: Sequence[str], year: int, example_id: str):
    def text(values):
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[v.encode("utf-8") for v in values]))

    return tf.train.Example(features=tf.train.Features(feature={
        "inputs": text([inputs]), "targets": text([targets]), "answers": text(answers), "id": text([example_id]),
        "year": tf.train.Feature(int64_list=tf.train.Int64List(value=[year])),
    })).SerializeToString(deterministic=True)


def record_file_name(split: str, year: int, part: int, files: int) -> str:
    """The name of a split's record file of `year`: the part-th of `files` (records dealt out in turn)."""
    return f"{split}-{year}" + (f"-{part:05d}-of-{files:05d}" if files > 1 else "") + ".tfrecord"


class _Writers:
    """`files` TFRecord writers per (folder, split, year), opened on first use; records dealt out in turn."""

    def __init__(self, root: str, files: int = 1):
        self.root = root
        self.files = files
        self.open: Dict[Tuple[str, str, int, int], RecordFile] = {}
        self.counts: Dict[str, Dict[str, Dict[str, int]]] = collections.defaultdict(
            lambda: collections.defaultdict(lambda: collections.defaultdict(int)))

    def write(self, folder: str, split: str, year: int, record: bytes) -> None:
        part = self.counts[folder][split][str(year)] % self.files
        key = (folder, split, year, part)
        if key not in self.open:
            os.makedirs(os.path.join(self.root, folder), exist_ok=True)
            self.open[key] = RecordFile(os.path.join(self.root, folder, record_file_name(split, year, part,
                                                                                         self.files)))
        self.open[key].write(record)
        self.counts[folder][split][str(year)] += 1

    def close(self) -> None:
        """Closes every writer (each one, even after one failed), then raises the first failure."""
        failures = []
        for writer in self.open.values():
            try:
                writer.close()
            except Exception as e:  # noqa: BLE001  (re-raised below, once every file is closed)
                failures.append(e)
        if failures:
            raise failures[0]


def _split_of_documents(split_dir: str, years: Sequence[int]) -> Dict[str, str]:
    split_of: Dict[str, str] = {}
    for year in years:
        for split in ("validation", "test"):
            path = os.path.join(split_dir, "yearly", f"{year}_{split}.gz")
            if os.path.exists(path):
                for _, doc_id in read_split_file(path):
                    split_of[doc_id] = split
    return split_of


def kept_documents(corpus: Corpus, fmt: str, index: CorpusIndex) -> Iterator[Document]:
    """The corpus's documents that `index` holds (those the clean-up kept; of a repeated id, its first document), in
    corpus order: what the task records and the vocabulary are made from, so that a near-copy of a held-out document
    or an article in another language, removed from the splits, is not trained on either."""
    kept = set(index.ids.tolist())
    for doc in read_documents(corpus, fmt):
        if doc.id in kept:
            kept.discard(doc.id)  # a later document under the same id is not the one the index holds
            yield doc


def _training_documents(corpus: Corpus, fmt: str, index: CorpusIndex, split_of: Dict[str, str]) -> Iterator:
    return (doc for doc in kept_documents(corpus, fmt, index) if doc.id not in split_of)


def prepare_task_data(config: TaskDataConfig, out_dir: str, overwrite: bool = False, via: Any = None) -> dict:
    """Builds the task folder for `config` at `out_dir` (see the module docstring). Returns the manifest. `out_dir`
    is replaced only when it is absent, empty or templm task data, unless `overwrite`. `via`: where the work that
    grows with the corpus runs (`templm.data.task_data_beam.OnBeam`: the clean-up and the salient-span records as
    Beam pipelines; None: in this process)."""
    if config.files_per_year < 1:  # before any work
        raise DataError(f"files_per_year must be at least 1, not {config.files_per_year}")
    if via is not None:
        via.check(config)
    final = paths.absolute(out_dir)
    return build_output_folder(out_dir, "task data", lambda tmp: _prepare(config, tmp, final, via), overwrite)


def _retarget(value, tmp: str, final: str):
    """`value` with every path under the partial folder `tmp` named where it will be once the folder is in place."""
    if isinstance(value, dict):
        return {k: _retarget(v, tmp, final) for k, v in value.items()}
    if isinstance(value, list):
        return [_retarget(v, tmp, final) for v in value]
    if isinstance(value, str) and (value == tmp or value.startswith(tmp + os.sep)):
        return final + value[len(tmp):]
    return value


def _prepare(config: TaskDataConfig, root: str, final: Optional[str] = None, via: Any = None) -> dict:
    corpus, templama_dir, fmt = config.corpus, config.templama_dir, config.corpus_format
    if corpus is None:
        generate_world(config.world, os.path.join(root, "world"), lock=False)  # inside our own partial folder
        corpus, fmt = os.path.join(root, "world", "news.jsonl"), "jsonl"
        templama_dir = templama_dir or os.path.join(root, "world", "templama")
    if via is None:
        index, places = index_corpus(corpus, fmt, clean=config.clean), None
    else:
        index, places = via.index(corpus, fmt, config.clean)
    buckets = yearly_buckets(corpus, os.path.join(root, "splits"), heldout_per_year=config.heldout_per_year,
                             heldout_fraction=config.heldout_fraction, seed=config.seed, format=fmt,
                             clean=config.clean, index=index)
    if final is not None:  # the world's corpus sits in this partial folder: stats.json names its final place
        stats_path = os.path.join(root, "splits", "stats.json")
        with open(stats_path, encoding="utf-8") as f:
            stats = json.load(f)
        write_json(stats_path, _retarget(stats, os.path.abspath(root), final))
    years = sorted(int(y) for y in buckets["years"])
    split_of = _split_of_documents(os.path.join(root, "splits"), years)
    logging.info("task data: %d years (%d-%d), %d held-out documents", len(years), years[0], years[-1],
                 len(split_of))

    # Entity detection learns which words the corpus capitalises mid-sentence from a sample of training documents.
    detector = make_entity_detector(config.detector)
    if isinstance(detector, BuiltinEntityDetector):
        sample = []
        for doc in _training_documents(corpus, fmt, index, split_of):
            sample.append(doc.text)
            if len(sample) >= 5000:
                break
        detector = detector.fit(sample)

    tf = _tf()
    writers = _Writers(root, config.files_per_year)
    rng = random.Random(config.seed)
    ticker = console.Ticker("task data", len(index), "documents") if via is None else None
    begun = time.monotonic()
    try:
        if via is not None:  # the records written by the pipeline's workers, their counts in the single order
            counts = via.customnews(corpus, fmt, places, split_of, detector, config, root)
            if counts:
                writers.counts["customnews"] = counts
        else:
            for n, doc in enumerate(kept_documents(corpus, fmt, index), 1):
                ticker.update(n)
                for i, ex in enumerate(ssm_examples(doc.text, detector, config.one_span_per_sentence, rng)):
                    writers.write("customnews", split_of.get(doc.id, "train"), doc.date.year,
                                  document_example(tf, ex, doc, i))
        records = sum(n for by_year in writers.counts.get("customnews", {}).values() for n in by_year.values())
        logging.info("%s: %d salient-span records of %d documents in %.1fs%s", describe_corpus(corpus), records,
                     len(index), time.monotonic() - begun, " on Beam" if via is not None else "")
        query_years = set()
        corpus_years, outside = set(years), {}  # outside: queries of years without news, year -> count
        if templama_dir:
            for split, path in templama_split_files(templama_dir).items():
                for q in TemplamaReader(path):
                    if q.year not in corpus_years:
                        outside[q.year] = outside.get(q.year, 0) + 1
                        continue
                    # Training uses one answer's name, drawn per query; evaluation keeps every name of every answer
                    # (aliases too) in `answers`, and a prediction scores its best F1 over them.
                    target = random.Random(f"{config.seed}-{q.id}").choice(q.answer_names)
                    writers.write("templama", split, q.year,
                                  _example(tf, cloze_to_ssm(q.query), target, q.gold_names, q.year, q.id))
                    query_years.add(q.year)
    finally:
        if ticker is not None:
            ticker.close()
        writers.close()

    if outside:
        console.warn(f"{sum(outside.values())} TempLAMA queries of {', '.join(map(str, sorted(outside)))} are left "
                     f"out: the corpus has no news of those years ({min(years)}-{max(years)}), so no model could "
                     "learn what they ask, and no year of a study can be one without news")
    all_years = sorted(set(years) | query_years)
    n_future = min(config.future_years, max(0, len(all_years) - 1))
    if n_future < config.future_years:  # the data cannot honour it: said, not silently changed
        console.warn(f"future_years={config.future_years} asks for more than the data's {len(all_years)} year(s) "
                     f"{all_years[0]}-{all_years[-1]} can give with one seen year left: the last {n_future} are the "
                     "future years")
    seen_years = set(all_years[:len(all_years) - n_future])

    spm_prefix = os.path.join(root, "spm", "vocab")
    os.makedirs(os.path.dirname(spm_prefix))
    # The vocabulary is trained on the seen years' training documents only, so no model of the study has seen a
    # piece of the future (words that only appear then are spelled in older pieces). The Temporal prefix
    # ("year: 2014 ") must be in it even where the corpus never writes a colon.
    prefixes = [Document(f"prefix-{y}", datetime.date(y, 1, 1), f"year: {y}") for y in years]
    seen_documents = (doc for doc in _training_documents(corpus, fmt, index, split_of)
                      if doc.date.year in seen_years)
    sample = None if via is None else via.spm_sample(corpus, fmt, places, split_of, sorted(seen_years), prefixes,
                                                     config.max_spm_sentences, config.seed)
    train_spm(itertools.chain(prefixes, seen_documents), spm_prefix, vocab_size=config.vocab_size,
              max_sentences=config.max_spm_sentences, seed=config.seed, exact_size=config.exact_vocab_size,
              sample=sample)
    manifest = {
        "version": MANIFEST_VERSION,
        "years": all_years,
        "seen_years": all_years[:len(all_years) - n_future],
        "future_years": all_years[len(all_years) - n_future:],
        "vocabulary": "spm/vocab.model",
        "counts": {folder: {split: dict(sorted(by_year.items())) for split, by_year in splits.items()}
                   for folder, splits in writers.counts.items()},
        # Where the data came from, as absolute files (a pattern expanded): the study's later stages read them again.
        "config": _jsonable({**dataclasses.asdict(config),
                             "corpus": None if config.corpus is None else resolve_corpus(config.corpus),
                             "templama_dir": config.templama_dir and paths.absolute(config.templama_dir)}),
    }
    with open(os.path.join(root, MANIFEST), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1)
    return manifest


def _jsonable(value):
    return json.loads(json.dumps(value, default=str))


def read_manifest(data_dir: str) -> Optional[dict]:
    """The manifest of a task-data folder (any path tf.io.gfile reads: local, gs://, ram://), None where it has none."""
    gfile = _tf().io.gfile
    path = os.path.join(data_dir, MANIFEST)
    if not gfile.exists(path):
        return None
    try:
        with gfile.GFile(path, "r") as f:
            manifest = json.loads(f.read())
    except json.JSONDecodeError as e:
        raise DataError(f"corrupt task manifest: {e}", path) from None
    if manifest.get("version") != MANIFEST_VERSION:
        raise DataError(f"task data version {manifest.get('version')}, expected {MANIFEST_VERSION}: rebuild it "
                        f"with `templm data tasks --out {data_dir}`", path)
    return manifest


def ensure_task_data(data_dir: str, config: TaskDataConfig = TaskDataConfig()) -> dict:
    """The manifest of `data_dir`, preparing the folder first (once, under a lock) when it has none."""
    manifest = read_manifest(data_dir)
    if manifest is not None:
        return manifest
    # Processes that share a local folder wait for the one that builds it; in a bucket, the build's own lock object
    # refuses a second builder (build_output_folder).
    with (contextlib.nullcontext() if paths.is_url(data_dir) else
          locked(data_dir.rstrip("/") + ".lock", f"the task data folder {data_dir}", wait=True)):
        manifest = read_manifest(data_dir)  # another process may have built it while we waited
        if manifest is None:
            logging.info("preparing task data in %s (first use)", data_dir)
            manifest = prepare_task_data(config, data_dir)
    return manifest


def default_data_dir(cache_dir: Optional[str] = None) -> str:
    """Where the embedded world's task data lives: `cache_dir` (default: templm.settings' cache_dir, $TEMPLM_CACHE,
    else ~/.cache/templm)/world-v1.3 (the task data's layout version, then the world generator's)."""
    cache = cache_dir or Settings.from_environment().cache_dir
    return os.path.join(cache, f"world-v{MANIFEST_VERSION}.{WORLD_VERSION}")
