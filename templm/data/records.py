"""The record types every reader yields and date parsing (bad input raises templm.errors.DataError)."""

from __future__ import annotations

import dataclasses
import datetime
import re
from typing import Optional, Tuple


# Dates outside this range are treated as data errors (a year 0213 or 9999 is a typo, not news).
MIN_DATE = datetime.date(1900, 1, 1)
MAX_DATE = datetime.date(2100, 12, 31)


@dataclasses.dataclass(frozen=True)
class Document:
    """One dated text: a news article, an abstract, a generated world document."""

    id: str
    date: datetime.date
    text: str
    source: str = ""


@dataclasses.dataclass(frozen=True)
class Answer:
    """A Wikidata item as TempLAMA names it: `{"wikidata_id": ..., "name": ...}`; `aliases`, the item's other names
    where a release lists them (`"name": [name, alias, ...]`), count as correct answers too."""

    wikidata_id: str
    name: str
    aliases: Tuple[str, ...] = ()

    @property
    def names(self) -> Tuple[str, ...]:
        return (self.name,) + tuple(a for a in self.aliases if a != self.name)


@dataclasses.dataclass(frozen=True)
class Query:
    """One TempLAMA cloze query: `query` holds `_X_` where an answer goes; `answers` are all objects valid in `year`."""

    id: str
    relation: str
    subject_id: str
    year: int
    query: str
    answers: Tuple[Answer, ...]
    most_frequent: Optional[Answer] = None
    most_recent: Optional[Answer] = None

    @property
    def answer_names(self) -> Tuple[str, ...]:
        """The answers' own names, one per answer (what a model is trained on)."""
        return tuple(a.name for a in self.answers)

    @property
    def gold_names(self) -> Tuple[str, ...]:
        """Every name of every answer, aliases included, each once (what a prediction is scored against: the best
        F1 or exact match over them)."""
        return tuple(dict.fromkeys(name for a in self.answers for name in a.names))

    def to_json(self) -> dict:
        """The TempLAMA release format (list-valued `answer`; an answer with aliases as `"name": [name, alias...]`,
        the alias-list variant of the release)."""
        def item(a):
            if a is None:
                return None
            return {"wikidata_id": a.wikidata_id, "name": list(a.names) if a.aliases else a.name}
        return {
            "query": self.query,
            "answer": [item(a) for a in self.answers],
            "date": str(self.year),
            "id": self.id,
            "most_frequent_answer": item(self.most_frequent),
            "most_recent_answer": item(self.most_recent),
            "relation": self.relation,
        }


_DATE_FORMATS = (
    (re.compile(r"^\d{4}-\d{2}-\d{2}$"), "%Y-%m-%d"),
    (re.compile(r"^\d{8}$"), "%Y%m%d"),
    (re.compile(r"^\d{4}-\d{2}$"), "%Y-%m"),
)


def parse_date(value: object, min_date: datetime.date = MIN_DATE,
               max_date: datetime.date = MAX_DATE) -> datetime.date:
    """Parses `YYYY-MM-DD`, `YYYYMMDD`, `YYYY-MM` (first of the month) or an ISO 8601 datetime.

    Raises ValueError with what was expected; readers wrap it in a DataError that names the file and line.
    """
    if not isinstance(value, str):
        raise ValueError(f"date must be a string, got {type(value).__name__} {value!r}")
    text = value.strip()
    date = None
    if len(text) == 10 and text[4] == "-" and text[7] == "-":  # the common case, without strptime
        try:
            date = datetime.date(int(text[:4]), int(text[5:7]), int(text[8:]))
        except ValueError:
            if _DATE_FORMATS[0][0].match(text):
                raise ValueError(f"invalid date {value!r}") from None
    for pattern, fmt in _DATE_FORMATS if date is None else ():
        if pattern.match(text):
            try:
                date = datetime.datetime.strptime(text, fmt).date()
            except ValueError:
                raise ValueError(f"invalid date {value!r}") from None
            break
    if date is None:
        if "T" in text or " " in text:
            try:
                date = datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).date()
            except ValueError:
                pass
    if date is None:
        raise ValueError(f"unparsable date {value!r}: expected YYYY-MM-DD, YYYYMMDD, YYYY-MM or an ISO 8601 datetime")
    if not min_date <= date <= max_date:
        raise ValueError(f"date {value!r} out of range {min_date.isoformat()}..{max_date.isoformat()}")
    return date
