"""TempLAMA: relation templates, queries from time-scoped facts, subject-disjoint splits, the release format.

Shared by the embedded world (`templm.data.world`) and the Wikidata builder (`templm.data.wikidata`), so both apply
the same covering rule: a fact with interval [start, end] answers every year from max(start.year, start_year) to
min(end.year, end_year); a missing start means start_year and a missing end means end_year.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import json
import os
import random
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from templm.data.records import Answer, Query
from templm.io import NamedWrites

# The nine TempLAMA relations and their cloze templates (Dhingra et al., Table 8).
TEMPLATES: Dict[str, str] = {
    "P54": "<subject> plays for _X_.",
    "P39": "<subject> holds the position of _X_.",
    "P108": "<subject> works for _X_.",
    "P102": "<subject> is a member of the _X_.",
    "P286": "_X_ is the head coach of <subject>.",
    "P69": "<subject> attended _X_.",
    "P488": "_X_ is the chair of <subject>.",
    "P6": "_X_ is the head of the government of <subject>.",
    "P127": "<subject> is owned by _X_.",
}

SPLITS = ("train", "val", "test")
SPLIT_FRACTIONS = (0.2, 0.1, 0.7)


@dataclasses.dataclass(frozen=True)
class Fact:
    """`subject` stands in `relation` to `object` from `start` to `end` (inclusive; None = open)."""

    subject: str
    relation: str
    object: str
    start: Optional[datetime.date]
    end: Optional[datetime.date]

    def covers(self, start_year: int, end_year: int) -> range:
        first = max(self.start.year if self.start else start_year, start_year)
        last = min(self.end.year if self.end else end_year, end_year)
        return range(first, last + 1)

    def valid_on(self, date: datetime.date) -> bool:
        return (self.start is None or self.start <= date) and (self.end is None or date <= self.end)


def _sort_key(fact: Fact) -> Tuple[datetime.date, datetime.date]:
    return (fact.start or datetime.date.min, fact.end or datetime.date.max)


def queries_for_subject(facts: Sequence[Fact], names: Mapping[str, str], start_year: int, end_year: int,
                        template: Optional[str] = None) -> List[Query]:
    """All queries for one subject and relation: one per covered year, every object valid that year an answer."""
    if not facts:
        return []
    subject, relation = facts[0].subject, facts[0].relation
    if any(f.subject != subject or f.relation != relation for f in facts):
        raise ValueError("queries_for_subject takes the facts of one subject and one relation")
    template = template or TEMPLATES[relation]
    ordered = sorted(facts, key=_sort_key)
    by_year: Dict[int, List[str]] = collections.defaultdict(list)
    years_of: Dict[str, int] = collections.Counter()
    for fact in ordered:
        for year in fact.covers(start_year, end_year):
            if fact.object not in by_year[year]:
                by_year[year].append(fact.object)
                years_of[fact.object] += 1
    if not by_year:
        return []
    first_seen: Dict[str, int] = {}
    for fact in ordered:
        first_seen.setdefault(fact.object, len(first_seen))
    most_frequent = min(years_of, key=lambda o: (-years_of[o], first_seen[o]))
    last_year = max(by_year)
    most_recent = by_year[last_year][-1]
    text = template.replace("<subject>", names[subject])

    def answer(obj: str) -> Answer:
        return Answer(obj, names[obj])

    return [
        Query(id=f"{subject}_{relation}_{year}", relation=relation, subject_id=subject, year=year, query=text,
              answers=tuple(answer(o) for o in by_year[year]), most_frequent=answer(most_frequent),
              most_recent=answer(most_recent))
        for year in sorted(by_year)
    ]


def changing_facts(facts: Iterable[Fact], start_year: int, end_year: int) -> List[Fact]:
    """TempLAMA's selection (Dhingra et al., section 2.1: "subject and relation pairs which have multiple objects at
    different times"; the Wikidata builder applies the same rule): the facts that cover a year of
    start_year..end_year, of the subjects and relations that have more than one distinct object among them. A subject
    whose one object holds all along asks nothing that changes with time. Order kept."""
    inside = [f for f in facts if len(f.covers(start_year, end_year))]
    objects: Dict[Tuple[str, str], set] = collections.defaultdict(set)
    for fact in inside:
        objects[(fact.subject, fact.relation)].add(fact.object)
    return [f for f in inside if len(objects[(f.subject, f.relation)]) > 1]


def queries_from_facts(facts: Iterable[Fact], names: Mapping[str, str], start_year: int, end_year: int,
                       templates: Mapping[str, str] = TEMPLATES) -> List[Query]:
    """Queries for every (subject, relation) in `facts`, ordered by relation, subject and year."""
    groups: Dict[Tuple[str, str], List[Fact]] = collections.defaultdict(list)
    for fact in facts:
        groups[(fact.relation, fact.subject)].append(fact)
    queries: List[Query] = []
    for (relation, _), group in sorted(groups.items()):
        queries.extend(queries_for_subject(group, names, start_year, end_year, templates[relation]))
    return queries


def split_by_subject(queries: Sequence[Query], seed: int,
                     fractions: Sequence[float] = SPLIT_FRACTIONS) -> Dict[str, List[Query]]:
    """Assigns each subject to one split by a seeded draw (20/10/70 by default); no subject is in two splits."""
    subjects = sorted({q.subject_id for q in queries})
    random.Random(seed).shuffle(subjects)
    n_train = round(len(subjects) * fractions[0])
    n_val = round(len(subjects) * fractions[1])
    split_of = {}
    for i, subject in enumerate(subjects):
        split_of[subject] = SPLITS[0] if i < n_train else SPLITS[1] if i < n_train + n_val else SPLITS[2]
    out: Dict[str, List[Query]] = {name: [] for name in SPLITS}
    for q in queries:
        out[split_of[q.subject_id]].append(q)
    return out


def write_queries(path: str, queries: Iterable[Query], extra: Optional[Mapping[str, Mapping]] = None) -> int:
    """Writes queries in the release format, one JSON object a line; `extra[q.id]` adds fields. Returns the count."""
    n = 0
    tmp = path + ".tmp"
    try:
        with NamedWrites(tmp, "w", shown=path, encoding="utf-8") as f:
            for q in queries:
                obj = q.to_json()
                if extra and q.id in extra:
                    obj.update(extra[q.id])
                f.write(json.dumps(obj, ensure_ascii=False) + "\n")
                n += 1
    except BaseException:
        os.remove(tmp)
        raise
    os.replace(tmp, path)
    return n
