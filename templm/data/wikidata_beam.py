"""TempLAMA from a Wikidata dump on Apache Beam: `templm data templama --runner=...`, for a dump that one process
reads too slowly (the full dump is about 1.5 TB of JSON lines).

The entity lines are read and scanned in parallel by the rules of `templm.data.wikidata` (the same `_read_subject`
on each line: the kept subjects with their statements, the ids of the objects they reference, each entity's English
label where it qualifies as an object's name, the counts of stats.json). The objects' names are a join of the
referenced ids with the labels, by id, so no line order matters and there is no second pass. What is left is small
(the kept subjects and their objects' names): the driver reads it back and finishes as the single-process reading
does (`wikidata._finish`: merged intervals, the most popular subjects, queries, the subject-disjoint split), so
train/val/test.jsonl are the same bytes, and stats.json the same counts, except how the single process found its
names (`passes`, `objects_looked_up`, `objects_found_late`: here 1, 0, 0) and `seconds`.

Where it differs: a malformed line is named by the file and its first characters, not its line number (Beam reads a
file in pieces, with no line numbers); a line is not held to `readers.MAX_LINE_BYTES`.
"""

from __future__ import annotations

import collections
import datetime
import json
import os
import time
from typing import Any, Dict, Iterator, Optional, Sequence, Set, Tuple

from templm import paths
from templm.data import wikidata
from templm.data.beam_work import pipeline as beam_pipeline, read_lines, work_folder
from templm.errors import DataError

# The stats.json keys of the single process's two-pass name lookup, and their values here (one pass, a join).
LOOKUP_STATS = {"passes": 1, "objects_looked_up": 0, "objects_found_late": 0}


def _date(value: Optional[datetime.date]) -> Optional[str]:
    return None if value is None else value.isoformat()


def _undate(value: Optional[str]) -> Optional[datetime.date]:
    return None if value is None else datetime.date.fromisoformat(value)


class _Scan:
    """The work on one entity line (a Beam FlatMap): ("label", (id, its qualifying label or None)), ("subject",
    its JSON) and ("wanted", object id) where it is a kept subject, and ("stats", its counts)."""

    def __init__(self, dump_path: str, relations: Sequence[str], start_year: int, end_year: int,
                 require_enwiki: bool):
        self.dump_path = dump_path
        self.dump = wikidata._Dump(dump_path, "")  # its parse, made once (making one reads the file's size)
        self.relations = list(relations)
        self.start_year, self.end_year = start_year, end_year
        self.require_enwiki = require_enwiki

    def __call__(self, raw: bytes) -> Iterator[Tuple[str, Any]]:
        try:
            entity = self.dump.parse(None, raw)
        except DataError as e:
            begins = raw[:80].decode("utf-8", "replace")
            raise DataError(f"{e.args[0]} (the line that begins {begins!r})", self.dump_path) from None
        if entity is None:
            return
        counts: collections.Counter = collections.Counter(entities=1)
        entity_id = entity["id"]
        label = wikidata._english_label(entity)
        links = wikidata._sitelinks(entity)
        qualifies = label is not None and (not self.require_enwiki or "enwiki" in links)
        yield "label", (entity_id, label if qualifies else None)
        if entity.get("type", "item") == "item" and entity_id.startswith("Q"):
            subjects: Dict[str, wikidata._Subject] = {}
            wanted: Set[str] = set()
            wikidata._read_subject(entity_id, label, links, wikidata._claims(entity), self.relations,
                                   self.start_year, self.end_year, self.require_enwiki, counts, subjects, wanted)
            for subject_id, subject in subjects.items():
                yield "subject", json.dumps({
                    "id": subject_id, "name": subject.name, "sitelinks": subject.sitelinks, "claims": subject.claims,
                    "statements": {relation: [[obj, _date(start), _date(end)] for obj, start, end in statements]
                                   for relation, statements in subject.statements.items()}}, sort_keys=True)
            for obj in sorted(wanted):
                yield "wanted", obj
        yield "stats", dict(counts)


def _tagged(kind: str):
    return lambda item: item[0] == kind


def _named(element: Tuple[str, Dict[str, list]]) -> Iterator[str]:
    """One referenced id with the labels of its lines: its name (or that it has no qualifying label, or no line)."""
    entity_id, found = element
    if not found["wanted"]:
        return
    labels = [label for label in found["label"] if label is not None]
    yield json.dumps({"id": entity_id, "name": min(labels) if labels else None, "line": bool(found["label"])})


def _sum_counts(counts: Sequence[Dict[str, int]]) -> Dict[str, int]:
    total: collections.Counter = collections.Counter()
    for c in counts:
        total.update(c)
    return dict(total)


def build_templama_beam(dump_path: str, out_dir: str, pipeline_options: Sequence[str], start_year: int = 2010,
                        end_year: int = 2020, max_subjects: Optional[int] = 1000, require_enwiki: bool = True,
                        seed: int = 0, relations: Optional[Sequence[str]] = None,
                        work_dir: Optional[str] = None) -> Dict[str, Any]:
    """`wikidata.build_templama` as a Beam pipeline run with `pipeline_options` (Beam's own flags, e.g.
    ["--runner=FnApiRunner", "--direct_num_workers=2"]); the same files in `out_dir` (module docstring).
    `work_dir`: where the pipeline leaves its small results for the driver, a folder every worker can write
    (default: a new folder under the options' --temp_location, a bucket on Dataflow; else a temporary folder here);
    removed when the driver has read them."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    dump_path, out_dir = os.fspath(dump_path), os.fspath(out_dir)
    relations = wikidata._check_settings(dump_path, start_year, end_year, max_subjects, relations)
    begun = time.monotonic()
    stats = wikidata._initial_stats(dump_path, start_year, end_year, max_subjects, require_enwiki, seed, relations)
    scan = _Scan(dump_path, relations, start_year, end_year, require_enwiki)
    options = PipelineOptions(list(pipeline_options))
    with work_folder(options, "templm-wikidata-", work_dir) as work:
        return _run(beam, options, scan, dump_path, out_dir, work, stats,
                    relations, start_year, end_year, max_subjects, require_enwiki, seed, begun)


def _run(beam: Any, options: Any, scan: _Scan, dump_path: str, out_dir: str, work: str, stats: Dict[str, Any],
         relations: Sequence[str], start_year: int, end_year: int, max_subjects: Optional[int], require_enwiki: bool,
         seed: int, begun: float) -> Dict[str, Any]:
    """The pipeline into `work`, then the driver's finish from what it left there."""
    with beam_pipeline(options) as pipeline:
        scanned = (pipeline
                   | "read" >> beam.io.ReadFromText(dump_path, coder=beam.coders.BytesCoder())
                   | "scan" >> beam.FlatMap(scan))
        (scanned | "stats" >> beam.Filter(_tagged("stats")) | "counts" >> beam.Map(lambda item: item[1])
         | "sum" >> beam.CombineGlobally(_sum_counts) | "stats json" >> beam.Map(json.dumps)
         | "write stats" >> beam.io.WriteToText(paths.join(work, "stats"), num_shards=1, shard_name_template=""))
        (scanned | "subjects" >> beam.Filter(_tagged("subject")) | "subject json" >> beam.Map(lambda i: i[1])
         | "write subjects" >> beam.io.WriteToText(paths.join(work, "subjects")))
        wanted = (scanned | "wanted" >> beam.Filter(_tagged("wanted"))
                  | "wanted ids" >> beam.Map(lambda item: (item[1], True)))
        labels = scanned | "labels" >> beam.Filter(_tagged("label")) | "label pairs" >> beam.Map(lambda i: i[1])
        ({"wanted": wanted, "label": labels} | "join" >> beam.CoGroupByKey()
         | "names" >> beam.FlatMap(_named) | "write names" >> beam.io.WriteToText(paths.join(work, "names")))
    counts = read_lines(paths.join(work, "stats"))
    subjects = {}
    for line in read_lines(paths.join(work, "subjects") + "*"):
        row = json.loads(line)
        subjects[row["id"]] = wikidata._Subject(
            row["name"], row["sitelinks"], row["claims"],
            {relation: [(obj, _undate(start), _undate(end)) for obj, start, end in statements]
             for relation, statements in row["statements"].items()})
    names: Dict[str, str] = {}
    missing: Set[str] = set()
    for line in read_lines(paths.join(work, "names") + "*"):
        row = json.loads(line)
        if row["name"] is not None:
            names[row["id"]] = row["name"]
        elif not row["line"]:
            missing.add(row["id"])
    for line in counts:
        for key, value in json.loads(line).items():
            stats[key] = stats.get(key, 0) + value
    stats.update(LOOKUP_STATS)
    return wikidata._finish(dump_path, out_dir, subjects, names, missing, stats, relations, start_year, end_year,
                            max_subjects, require_enwiki, seed, begun)

