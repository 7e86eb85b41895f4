"""Rebuilds TempLAMA from a Wikidata JSON dump (`latest-all.json.gz` / `.bz2`, or uncompressed).

The dump is one JSON array with one entity a line: the first line is `[`, the last `]`, and every entity line but
the last ends with `,`. `build_templama` streams it and keeps, for the nine TempLAMA relations, the statements that
can become queries:

- the main snak is a value snak whose datavalue is a `wikibase-entityid` of an item;
- a start (qualifier P580) or an end (P582) is known: a time value of precision 9 (year), 10 (month) or 11 (day);
  lower precisions, years past 2100 and malformed values count as missing. Month or day `00` means unknown: a
  start takes the first day of the known period, an end the last;
- the statement overlaps `start_year..end_year` (it does not end before `start_year` or start after `end_year`)
  and does not end before it starts;
- the subject has an English label and, with `require_enwiki` (the default, as the paper), an `enwiki` sitelink.

Object names are known only once the object's own line has been read. The pass keeps the kept statements and,
for the ids they reference, a label table filled as those ids' lines go by, so memory grows with the kept
statements, never with the dump. An object whose line came *before* the first statement naming it is looked up
afterwards by a second, label-only pass over just those ids (a line whose id is not wanted is skipped without
being parsed; the pass stops once every id is found). A statement whose object never gets an English label (and
`enwiki` sitelink, with `require_enwiki`) is dropped.

Per subject and relation, statements are sorted by (start, end) and consecutive statements with the same object are
merged (union of their intervals: overlapping or adjacent ones become one, a gap stays a gap). A subject is kept
when it has more than one distinct object; per relation at most `max_subjects` subjects are kept, the most popular
first (most sitelinks, then most statements, then the lower id). Queries, answers, most_frequent / most_recent and
the subject-disjoint 20/10/70 split come from `templm.data.templama`.
"""

from __future__ import annotations

import calendar
import dataclasses
import datetime
import json
import os
import re
import time
import zlib
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Set, Tuple

from absl import logging

from templm import console, paths, remote
from templm.data.readers import MAX_LINE_BYTES, open_text, read_line
from templm.data.records import MAX_DATE, MIN_DATE
from templm.data.templama import (SPLITS, TEMPLATES, Fact, changing_facts, queries_from_facts, split_by_subject,
                                  write_queries)
from templm.errors import DataError, loads_json
from templm.io import format_duration

START_QUALIFIER = "P580"
END_QUALIFIER = "P582"
MAX_YEAR = 2100
MIN_PRECISION = 9  # year; 10 = month, 11 = day
PROGRESS_EVERY = 1_000_000  # lines between progress log lines

def _unresolved_text(unresolved: Set[str], absent: Set[str], require_enwiki: bool) -> str:
    """What the message of an empty release says of the statements' objects that got no name: which ids have no
    entity line in the dump at all (a dump cut to the subjects' lines) and which have one without an English label
    (or enwiki sitelink)."""
    if not unresolved:
        return ""
    no_line = sorted(unresolved & absent, key=_id_key)
    unnamed = sorted(unresolved - absent, key=_id_key)
    parts = []
    if no_line:
        parts.append(f"{len(no_line)} have no entity line in the dump (first: {', '.join(no_line[:5])}; a dump must "
                     "hold the objects' entity lines too, for their labels)")
    if unnamed:
        parts.append(f"{len(unnamed)} have an entity line without an English label"
                     + (" or enwiki sitelink" if require_enwiki else "") + f" (first: {', '.join(unnamed[:5])})")
    return f"; {len(unresolved)} object(s) of the kept statements could not be named: " + " and ".join(parts)


_TIME = re.compile(r"^([+-]?)(\d+)-(\d{2})-(\d{2})T")
# The id of a dump line as Wikidata writes it (`{"type":"item","id":"Q42",...`), read without parsing the line.
_LINE_ID = re.compile(rb'^\s*\{\s*(?:"type"\s*:\s*"[a-z]+"\s*,\s*)?"id"\s*:\s*"([^"\\]+)"')

# Why a statement was dropped, in the order the rules are applied; each is a key of the returned stats.
_DROPS = ("dropped_subject_no_label", "dropped_subject_no_enwiki", "dropped_not_item", "dropped_no_dates",
          "dropped_ends_before_start_year", "dropped_starts_after_end_year", "dropped_end_before_start")


@dataclasses.dataclass
class _Subject:
    name: str
    sitelinks: int
    claims: int
    statements: Dict[str, List[Tuple[str, Optional[datetime.date], Optional[datetime.date]]]]


class _Dump:
    """The entity lines of a dump: `(line number, parsed entity)`, with progress logging and file-named errors."""

    def __init__(self, path: str, what: str):
        self.path = path
        self.what = what
        self.lines = 0
        self.size = paths.size(path) if paths.exists(path) else 0

    def raw_lines(self) -> Iterator[Tuple[int, bytes]]:
        started = time.monotonic()
        with open_text(self.path) as f:
            while True:
                try:
                    raw, whole = read_line(f, MAX_LINE_BYTES)
                except (OSError, EOFError, zlib.error) as e:  # corrupt or truncated compressed file
                    raise DataError(f"corrupt or truncated file after line {self.lines}: {e}", self.path) from None
                if not raw:
                    break
                self.lines += 1
                if not whole:
                    raise DataError(f"a line longer than {MAX_LINE_BYTES:,} bytes: not read (an entity is megabytes "
                                    "at most)", self.path, self.lines)
                if self.lines % PROGRESS_EVERY == 0:
                    self._progress(started, f)
                yield self.lines, raw
        elapsed = max(time.monotonic() - started, 1e-9)
        console.say(f"{self.what} {self.path}: done, {self.lines} lines in {format_duration(elapsed)} "
                    f"({self.lines / elapsed:.0f} lines/s)")

    def _progress(self, started: float, f: Any) -> None:
        elapsed = max(time.monotonic() - started, 1e-9)
        rate = self.lines / elapsed
        try:
            done = f.tell() / self.size if self.size else 0.0  # the file's bytes read (compressed ones of a .gz)
        except (OSError, ValueError):
            done = 0.0
        eta = f", ETA {format_duration((1 - done) * elapsed / done)}" if 0 < done < 1 else ""
        console.say(f"{self.what} {self.path}: {self.lines} lines, {rate:.0f} lines/s, {100 * done:.1f}% of the "
                    f"file{eta}")

    def parse(self, lineno: int, raw: bytes) -> Optional[Dict[str, Any]]:
        """The entity on a line, or None for `[`, `]` and blank lines; a DataError for anything else."""
        try:
            text = raw.decode("utf-8").strip()
        except UnicodeDecodeError as e:
            raise DataError(f"invalid UTF-8 at byte {e.start}", self.path, lineno) from None
        if text.endswith(","):
            text = text[:-1].rstrip()
        if text in ("", "[", "]"):
            return None
        try:
            entity = loads_json(text)
        except json.JSONDecodeError as e:
            raise DataError(f"malformed JSON: {e.msg} at column {e.colno}; expected one entity object a line",
                            self.path, lineno) from None
        if not isinstance(entity, dict):
            raise DataError(f"expected an entity object, got {type(entity).__name__}", self.path, lineno)
        if not isinstance(entity.get("id"), str) or not entity["id"]:
            raise DataError("entity without an 'id' string", self.path, lineno)
        return entity


def _english_label(entity: Dict[str, Any]) -> Optional[str]:
    labels = entity.get("labels")
    label = labels.get("en") if isinstance(labels, dict) else None
    value = label.get("value") if isinstance(label, dict) else None
    return value.strip() if isinstance(value, str) and value.strip() else None


def _sitelinks(entity: Dict[str, Any]) -> Dict[str, Any]:
    links = entity.get("sitelinks")
    return links if isinstance(links, dict) else {}


def _claims(entity: Dict[str, Any]) -> Dict[str, Any]:
    claims = entity.get("claims")
    return claims if isinstance(claims, dict) else {}


def _item_object(statement: Any) -> Optional[str]:
    """The item id a statement's main snak points to, or None (novalue / somevalue / not an item)."""
    snak = statement.get("mainsnak") if isinstance(statement, dict) else None
    if not isinstance(snak, dict) or snak.get("snaktype") != "value":
        return None
    datavalue = snak.get("datavalue")
    if not isinstance(datavalue, dict) or datavalue.get("type") != "wikibase-entityid":
        return None
    value = datavalue.get("value")
    if not isinstance(value, dict):
        return None
    item = value.get("id")
    if not isinstance(item, str) and isinstance(value.get("numeric-id"), int):
        item = f"Q{value['numeric-id']}"
    kind = value.get("entity-type", "item")
    if kind != "item" or not isinstance(item, str) or not item.startswith("Q"):
        return None
    return item


def parse_time(value: Any, is_end: bool) -> Tuple[Optional[datetime.date], str]:
    """A Wikidata time value (`{"time": "+2014-03-00T00:00:00Z", "precision": 10}`) as a date, and a status.

    Status is "ok", "low_precision" (coarser than a year), "after_2100" or "invalid"; the date is None unless "ok".
    Month or day `00` (or finer than the precision) is unknown: a start takes the first, an end the last day.
    """
    if not isinstance(value, dict) or not isinstance(value.get("time"), str):
        return None, "invalid"
    precision = value.get("precision")
    if not isinstance(precision, int) or isinstance(precision, bool):
        return None, "invalid"
    if precision < MIN_PRECISION:
        return None, "low_precision"
    match = _TIME.match(value["time"].strip())
    if not match:
        return None, "invalid"
    sign, year_text, month_text, day_text = match.groups()
    year = int(year_text) * (-1 if sign == "-" else 1)
    if year > MAX_YEAR:
        return None, "after_2100"
    month = int(month_text) if precision >= 10 else 0
    day = int(day_text) if precision >= 11 and month else 0
    if year < 1:  # before the common era: as early as a date can be
        return (datetime.date(1, 12, 31) if is_end else datetime.date(1, 1, 1)), "ok"
    if not 0 <= month <= 12:
        return None, "invalid"
    if not is_end:
        first_day = day or 1
        try:
            return datetime.date(year, month or 1, first_day), "ok"
        except ValueError:
            return None, "invalid"
    last_month = month or 12
    last_day = calendar.monthrange(year, last_month)[1]
    if day > last_day:
        return None, "invalid"
    return datetime.date(year, last_month, day or last_day), "ok"


def _qualifier_date(statement: Dict[str, Any], prop: str, is_end: bool,
                    stats: Dict[str, Any]) -> Optional[datetime.date]:
    """The first usable date among a statement's `prop` qualifiers; unusable ones are counted by status."""
    qualifiers = statement.get("qualifiers")
    snaks = qualifiers.get(prop) if isinstance(qualifiers, dict) else None
    if not isinstance(snaks, list):
        return None
    found = None
    for snak in snaks:
        if not isinstance(snak, dict) or snak.get("snaktype") != "value":
            continue  # somevalue (unknown) / novalue: missing
        datavalue = snak.get("datavalue")
        value = datavalue.get("value") if isinstance(datavalue, dict) and datavalue.get("type") == "time" else None
        date, status = parse_time(value, is_end)
        if status != "ok":
            stats[f"dates_{status}"] += 1
        elif found is None:
            found = date
    return found


def _id_key(entity_id: str) -> Tuple[int, int, str]:
    digits = entity_id[1:]
    return (0, int(digits), entity_id) if digits.isdigit() else (1, 0, entity_id)


def _sort_key(statement: Tuple[str, Optional[datetime.date], Optional[datetime.date]]):
    _, start, end = statement
    return (start or datetime.date.min, end or datetime.date.max)


def merge_statements(statements: Iterable[Tuple[str, Optional[datetime.date], Optional[datetime.date]]]
                     ) -> Tuple[List[Tuple[str, Optional[datetime.date], Optional[datetime.date]]], int]:
    """Sorts `(object, start, end)` by (start, end) and merges consecutive ones with the same object.

    Two consecutive intervals of one object that overlap or touch become their union; with a gap between them both
    stay (the union of two disjoint intervals). None is an open start / end. Returns the statements and the number
    of merges.
    """
    merged: List[Tuple[str, Optional[datetime.date], Optional[datetime.date]]] = []
    merges = 0
    for obj, start, end in sorted(statements, key=_sort_key):
        if merged and merged[-1][0] == obj:
            _, prev_start, prev_end = merged[-1]
            if prev_end is None or start is None or start <= prev_end + datetime.timedelta(days=1):
                merged[-1] = (obj, prev_start, None if prev_end is None or end is None else max(prev_end, end))
                merges += 1
                continue
        merged.append((obj, start, end))
    return merged, merges


def _check_settings(dump_path: str, start_year: int, end_year: int, max_subjects: Optional[int],
                    relations: Optional[Sequence[str]]) -> List[str]:
    """The relations asked for (all nine by default), once the settings and the dump's presence are checked."""
    relations = list(TEMPLATES) if relations is None else list(relations)
    unknown = [r for r in relations if r not in TEMPLATES]
    if unknown or not relations:
        raise ValueError(f"relations must be a non-empty subset of {sorted(TEMPLATES)}, got unknown {unknown}")
    if start_year > end_year:
        raise ValueError(f"start_year {start_year} is after end_year {end_year}")
    if start_year < MIN_DATE.year or end_year > MAX_DATE.year:
        raise ValueError(f"years {start_year}-{end_year}: templm's readers accept dates from {MIN_DATE.year} to "
                         f"{MAX_DATE.year} only, so the queries must lie within them")
    if max_subjects is not None and max_subjects < 1:
        raise ValueError(f"max_subjects must be at least 1 (or None for all), got {max_subjects}")
    if not paths.exists(dump_path):
        remote.check_location(dump_path, "the dump", write=False)  # in a bucket: why not
        raise DataError("no such file", dump_path)
    return relations


def _initial_stats(dump_path: str, start_year: int, end_year: int, max_subjects: Optional[int],
                   require_enwiki: bool, seed: int, relations: Sequence[str]) -> Dict[str, Any]:
    """stats.json's settings and its counters at zero, before the dump is read."""
    return {
        "dump": dump_path, "start_year": start_year, "end_year": end_year, "max_subjects": max_subjects,
        "require_enwiki": require_enwiki, "seed": seed, "relations": list(relations),
        "entities": 0, "statements": 0, **{key: 0 for key in _DROPS}, "statements_kept": 0,
        "dates_low_precision": 0, "dates_after_2100": 0, "dates_invalid": 0,
    }


def build_templama(dump_path: str, out_dir: str, start_year: int = 2010, end_year: int = 2020,
                   max_subjects: Optional[int] = 1000, require_enwiki: bool = True, seed: int = 0,
                   relations: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """Builds TempLAMA from a Wikidata JSON dump; writes `out_dir/{train,val,test}.jsonl` and `out_dir/stats.json`.

    Args:
      dump_path: the dump (`.json`, `.json.gz` or `.json.bz2`).
      out_dir: created if needed; the four files appear together at the end (nothing is left on an error).
      start_year, end_year: the years queried (inclusive).
      max_subjects: the most subjects kept per relation, the most popular first; None keeps all.
      require_enwiki: subjects and objects must have an English Wikipedia sitelink (the paper's rule; the default).
      seed: the subject-disjoint train / val / test split (20/10/70).
      relations: a subset of `templama.TEMPLATES` (default: all nine).

    Returns the stats also written to stats.json. Raises DataError (file and line) on a line that is not JSON.
    """
    dump_path, out_dir = os.fspath(dump_path), os.fspath(out_dir)
    relations = _check_settings(dump_path, start_year, end_year, max_subjects, relations)
    begun = time.monotonic()
    stats = _initial_stats(dump_path, start_year, end_year, max_subjects, require_enwiki, seed, relations)

    # Pass 1: kept statements, and labels of the ids they reference as those lines go by.
    subjects: Dict[str, _Subject] = {}
    wanted: Set[str] = set()      # objects of kept statements
    seen: Set[str] = set()        # wanted ids whose line was read after they were wanted
    names: Dict[str, str] = {}    # English labels of wanted ids that qualify as objects
    dump = _Dump(dump_path, "wikidata pass 1")
    for lineno, raw in dump.raw_lines():
        entity = dump.parse(lineno, raw)
        if entity is None:
            continue
        stats["entities"] += 1
        entity_id = entity["id"]
        label = _english_label(entity)
        links = _sitelinks(entity)
        qualifies = label is not None and (not require_enwiki or "enwiki" in links)
        if entity.get("type", "item") == "item" and entity_id.startswith("Q"):
            _read_subject(entity_id, label, links, _claims(entity), relations, start_year, end_year, require_enwiki,
                          stats, subjects, wanted)
        if entity_id in wanted and entity_id not in seen:
            seen.add(entity_id)
            if qualifies:
                names[entity_id] = label

    # Objects whose line came before they were referenced: one label-only pass over just those ids.
    for subject_id, subject in subjects.items():
        if subject_id in wanted:
            names.setdefault(subject_id, subject.name)
    missing = wanted - seen - set(names)
    stats["passes"] = 1
    stats["objects_looked_up"] = len(missing)
    found = 0
    if missing:
        stats["passes"] = 2
        dump = _Dump(dump_path, "wikidata pass 2 (labels)")
        for lineno, raw in dump.raw_lines():
            match = _LINE_ID.match(raw)
            if match and match.group(1).decode("utf-8", "replace") not in missing:
                continue
            entity = dump.parse(lineno, raw)
            if entity is None or entity["id"] not in missing:
                continue
            missing.discard(entity["id"])
            label = _english_label(entity)
            if label is not None and (not require_enwiki or "enwiki" in _sitelinks(entity)):
                names[entity["id"]] = label
                found += 1
            if not missing:
                break
    stats["objects_found_late"] = found

    return _finish(dump_path, out_dir, subjects, names, missing, stats, relations, start_year, end_year,
                   max_subjects, require_enwiki, seed, begun)


def _finish(dump_path: str, out_dir: str, subjects: Dict[str, _Subject], names: Dict[str, str], missing: Set[str],
            stats: Dict[str, Any], relations: Sequence[str], start_year: int, end_year: int,
            max_subjects: Optional[int], require_enwiki: bool, seed: int, begun: float) -> Dict[str, Any]:
    """From the dump's kept subjects and the names of the objects they reference (`missing`: objects with no entity
    line), the queries and their split, written to `out_dir` with stats.json; the stats returned. The same for the
    single-process reading and the Beam pipeline (templm.data.wikidata_beam), whose outputs are therefore the
    same."""
    # Per subject and relation: resolved objects, merged intervals, more than one object, the most popular first.
    stats.update(dropped_object_unresolved=0, statements_merged=0, subject_relations=0,
                 subject_relations_one_object=0, subject_relations_cut=0)
    candidates: Dict[str, List[Tuple[str, List[Fact]]]] = {relation: [] for relation in relations}
    unresolved: Set[str] = set()  # objects of kept statements that got no name
    for subject_id, subject in subjects.items():
        for relation, statements in subject.statements.items():
            resolved = [s for s in statements if s[0] in names]
            unresolved.update(s[0] for s in statements if s[0] not in names)
            stats["dropped_object_unresolved"] += len(statements) - len(resolved)
            merged, merges = merge_statements(resolved)
            stats["statements_merged"] += merges
            stats["subject_relations"] += 1
            facts = changing_facts([Fact(subject_id, relation, obj, start, end) for obj, start, end in merged],
                                   start_year, end_year)  # every kept statement covers a year of the window
            if not facts:
                stats["subject_relations_one_object"] += 1
                continue
            candidates[relation].append((subject_id, facts))
    facts: List[Fact] = []
    per_relation: Dict[str, Dict[str, int]] = {}
    for relation in relations:
        ranked = sorted(candidates[relation], key=lambda c: (-subjects[c[0]].sitelinks, -subjects[c[0]].claims,
                                                             _id_key(c[0])))
        kept = ranked if max_subjects is None else ranked[:max_subjects]
        stats["subject_relations_cut"] += len(ranked) - len(kept)
        per_relation[relation] = {"subjects": len(kept), "queries": 0}
        for subject_id, subject_facts in kept:
            names.setdefault(subject_id, subjects[subject_id].name)
            facts.extend(subject_facts)

    queries = queries_from_facts(facts, names, start_year, end_year)
    for query in queries:
        per_relation[query.relation]["queries"] += 1
    splits = split_by_subject(queries, seed)
    stats.update(
        subjects=len({q.subject_id for q in queries}), queries=len(queries), per_relation=per_relation,
        splits={name: len(splits[name]) for name in SPLITS},
        split_subjects={name: len({q.subject_id for q in splits[name]}) for name in SPLITS},
        seconds=round(time.monotonic() - begun, 3))
    if not queries:  # an empty release would look like a result: nothing is written
        drops = ", ".join(f"{key} {stats[key]}" for key in _DROPS if stats.get(key))
        raise DataError(f"no TempLAMA queries for {start_year}..{end_year}: {stats['entities']} entities read, "
                        f"{stats['statements']} statements of the relations {', '.join(relations)}, "
                        f"{stats['statements_kept']} kept" + (f" ({drops})" if drops else "") +
                        _unresolved_text(unresolved, missing, require_enwiki) +
                        f", {stats['subject_relations_one_object']} subject-relations left with fewer than two "
                        "objects; check the dump, the relations and the years (nothing was written)", dump_path)
    _write_all(out_dir, splits, stats)
    logging.info("wikidata %s: %d queries (%s) about %d subjects written to %s", dump_path, len(queries),
                 ", ".join(f"{name} {stats['splits'][name]}" for name in SPLITS), stats["subjects"], out_dir)
    return stats



def _read_subject(entity_id: str, label: Optional[str], links: Dict[str, Any], claims: Dict[str, Any],
                  relations: Sequence[str], start_year: int, end_year: int, require_enwiki: bool,
                  stats: Dict[str, Any], subjects: Dict[str, _Subject], wanted: Set[str]) -> None:
    """Applies the statement rules to one entity's claims; keeps what passes in `subjects`, its objects in `wanted`."""
    lists = [(relation, claims.get(relation)) for relation in relations]
    lists = [(relation, statements) for relation, statements in lists if isinstance(statements, list) and statements]
    if not lists:
        return
    count = sum(len(statements) for _, statements in lists)
    stats["statements"] += count
    if label is None:
        stats["dropped_subject_no_label"] += count
        return
    if require_enwiki and "enwiki" not in links:
        stats["dropped_subject_no_enwiki"] += count
        return
    kept: Dict[str, List[Tuple[str, Optional[datetime.date], Optional[datetime.date]]]] = {}
    for relation, statements in lists:
        for statement in statements:
            obj = _item_object(statement)
            if obj is None:
                stats["dropped_not_item"] += 1
                continue
            start = _qualifier_date(statement, START_QUALIFIER, False, stats)
            end = _qualifier_date(statement, END_QUALIFIER, True, stats)
            if start is None and end is None:
                stats["dropped_no_dates"] += 1
            elif end is not None and end.year < start_year:
                stats["dropped_ends_before_start_year"] += 1
            elif start is not None and start.year > end_year:
                stats["dropped_starts_after_end_year"] += 1
            elif start is not None and end is not None and end < start:
                stats["dropped_end_before_start"] += 1
            else:
                kept.setdefault(relation, []).append((obj, start, end))
                wanted.add(obj)
                stats["statements_kept"] += 1
    if kept:
        n_claims = sum(len(v) for v in claims.values() if isinstance(v, list))
        subjects[entity_id] = _Subject(label, len(links), n_claims, kept)


def _write_all(out_dir: str, splits: Dict[str, list], stats: Dict[str, Any]) -> None:
    """Writes the splits and stats.json under temporary names, then renames them all; on an error removes them."""
    os.makedirs(out_dir, exist_ok=True)
    finals = [os.path.join(out_dir, f"{name}.jsonl") for name in SPLITS] + [os.path.join(out_dir, "stats.json")]
    partials = [path + ".partial" for path in finals]
    try:
        for name, partial in zip(SPLITS, partials):
            write_queries(partial, splits[name])
        with open(partials[-1], "w", encoding="utf-8") as f:
            json.dump(stats, f, indent=2, sort_keys=True)
            f.write("\n")
        for partial, final in zip(partials, finals):
            os.replace(partial, final)
    except BaseException:
        for partial in partials:
            for path in (partial, partial + ".tmp"):
                if os.path.exists(path):
                    os.remove(path)
        raise
