"""Streaming corpus readers: JSON lines, WMT document-level News Crawl, arXiv OAI metadata, TempLAMA releases.

Every reader reads one line at a time (constant memory), opens `.gz` and `.bz2` files transparently, and on a bad
line either raises a `DataError` naming the file, the line number and what was wrong (`on_error="raise"`) or skips
the line and counts it (`on_error="skip"`; the count is logged when the file is done and kept in `reader.skipped`).
"""

from __future__ import annotations

import base64
import binascii
import bz2
import datetime
import email.utils
import gzip
import hashlib
import json
import os
import zlib
from typing import Any, Callable, Dict, Iterator, List

from templm import console
from templm.data.records import MAX_DATE, MIN_DATE, Answer, Document, Query, parse_date
from templm.errors import DataError

ON_ERROR = ("raise", "skip")


def open_text(path: str, mode: str = "rb"):
    """Opens `path` for binary reading or writing, through gzip or bz2 when its name ends in `.gz` or `.bz2`."""
    path = os.fspath(path)
    if "r" in mode and not os.path.exists(path):
        raise DataError("no such file", path)
    if os.path.isdir(path):
        raise DataError("is a folder; expected a file", path)
    if path.endswith(".gz"):
        return gzip.open(path, mode)
    if path.endswith(".bz2"):
        return bz2.open(path, mode)
    return open(path, mode)


class Reader:
    """Base of the line readers: numbering, decoding, error policy. Subclasses implement `parse(line)`."""

    source = ""

    def __init__(self, path: str, on_error: str = "raise", min_date: datetime.date = MIN_DATE,
                 max_date: datetime.date = MAX_DATE):
        if on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
        self.path = os.fspath(path)
        self.on_error = on_error
        self.min_date = min_date
        self.max_date = max_date
        self.read = 0
        self.skipped = 0
        self.first_errors: List[str] = []

    def parse(self, line: str) -> Any:
        raise NotImplementedError  # each subclass defines its format

    def __iter__(self) -> Iterator[Any]:
        self.read = self.skipped = 0
        self.first_errors = []
        with open_text(self.path) as f:
            lineno = 0
            while True:
                try:
                    raw = f.readline()
                except (OSError, EOFError, zlib.error) as e:  # corrupt or truncated compressed file
                    raise DataError(f"corrupt or truncated file after line {lineno}: {e}", self.path) from None
                if not raw:
                    break
                lineno += 1
                if not raw.strip():
                    continue
                if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte-order mark
                    raw = raw[3:]
                try:
                    try:
                        line = raw.decode("utf-8")
                    except UnicodeDecodeError as e:
                        raise ValueError(f"invalid UTF-8 at byte {e.start}") from None
                    record = self.parse(line.rstrip("\r\n"))
                except (ValueError, KeyError, TypeError) as e:
                    reason = e.reason if isinstance(e, DataError) else (
                        f"missing field {e}" if isinstance(e, KeyError) else str(e))
                    error = DataError(reason, self.path, lineno)
                    if self.on_error == "raise":
                        raise error from None
                    self.skipped += 1
                    if len(self.first_errors) < 5:
                        self.first_errors.append(str(error))
                    continue
                self.read += 1
                yield record
        if self.skipped:
            console.warn(f"{self.path}: skipped {self.skipped} bad line(s) of {self.skipped + self.read}; first: "
                         + "; ".join(self.first_errors))

    def _date(self, value: Any) -> datetime.date:
        return parse_date(value, self.min_date, self.max_date)


def _json_object(line: str) -> Dict[str, Any]:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"malformed JSON: {e.msg} at column {e.colno}") from None
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    return obj


def _field(obj: Dict[str, Any], name: str, kind: Any = str) -> Any:
    if name not in obj or obj[name] is None:
        raise ValueError(f"missing field {name!r}")
    value = obj[name]
    if not isinstance(value, kind):
        expected = " or ".join(k.__name__ for k in kind) if isinstance(kind, tuple) else kind.__name__
        raise ValueError(f"field {name!r} must be {expected}, got {type(value).__name__}")
    return value


def _text(value: str, what: str = "text") -> str:
    if not value.strip():
        raise ValueError(f"empty {what}")
    return value


class JsonlReader(Reader):
    """`{"id", "date", "text"}` per line."""

    source = "jsonl"

    def parse(self, line: str) -> Document:
        obj = _json_object(line)
        doc_id = obj.get("id")
        if isinstance(doc_id, int) and not isinstance(doc_id, bool):
            doc_id = str(doc_id)
        if not isinstance(doc_id, str) or not doc_id:
            raise ValueError("missing field 'id'")
        date = self._date(_field(obj, "date"))
        return Document(doc_id, date, _text(_field(obj, "text")), self.source)


class WmtDocsReader(Reader):
    """WMT document-level News Crawl: `YYYYMMDD<TAB>base64(sentence-split doc)<TAB>base64(unsplit doc)`.

    The text is the sentence-split field (sentences joined by newlines); the id is the sha256 hex digest of the raw,
    still-base64 third field, the id used by the published TIME-STRATIFIED / CONTROL split files.
    """

    source = "wmt"

    def parse(self, line: str) -> Document:
        fields = line.split("\t")
        if len(fields) != 3:
            raise ValueError(f"expected 3 tab-separated fields (date, base64 split doc, base64 doc), got {len(fields)}")
        date_field, split_doc, raw_doc = fields
        if not (len(date_field) == 8 and date_field.isdigit()):
            raise ValueError(f"unparsable date {date_field!r}: expected YYYYMMDD")
        date = self._date(date_field)
        try:
            text = base64.b64decode(split_doc, validate=True).decode("utf-8")
        except (binascii.Error, ValueError):
            raise ValueError("field 2 is not base64 of UTF-8 text") from None
        doc_id = hashlib.sha256(raw_doc.encode("ascii", "replace")).hexdigest()
        return Document(doc_id, date, _text(text.strip("\n")), self.source)


class ArxivReader(Reader):
    """The arXiv OAI metadata snapshot: text = abstract (whitespace collapsed), date = first version's creation."""

    source = "arxiv"

    def parse(self, line: str) -> Document:
        obj = _json_object(line)
        doc_id = _field(obj, "id")
        abstract = " ".join(_field(obj, "abstract").split())
        versions = _field(obj, "versions", list)
        if not versions or not isinstance(versions[0], dict) or "created" not in versions[0]:
            raise ValueError("missing field 'versions[0].created'")
        created = versions[0]["created"]
        if not isinstance(created, str):
            raise ValueError(f"unparsable date {created!r}: versions[0].created must be a string")
        try:
            stamp = email.utils.parsedate_to_datetime(created)
        except (TypeError, ValueError):
            raise ValueError(f"unparsable date {created!r}: expected RFC 2822 like 'Mon, 2 Apr 2007 19:18:42 GMT'") \
                from None
        date = self._date(stamp.date().isoformat())
        return Document(doc_id, date, _text(abstract, "abstract"), self.source)


def _answer(value: Any, what: str) -> Answer:
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        raise ValueError(f"{what} must be an object with 'wikidata_id' and 'name'")
    if not value["name"].strip():
        raise ValueError(f"empty name in {what}")
    wikidata_id = value.get("wikidata_id")
    return Answer("" if wikidata_id is None else str(wikidata_id), value["name"])


class TemplamaReader(Reader):
    """TempLAMA release lines; `answer` may be a list of `{wikidata_id, name}` or one such object."""

    source = "templama"

    def parse(self, line: str) -> Query:
        obj = _json_object(line)
        query = _field(obj, "query")
        if "_X_" not in query:
            raise ValueError("query has no _X_ placeholder")
        raw = _field(obj, "answer", (list, dict))
        answers = tuple(_answer(a, "answer") for a in (raw if isinstance(raw, list) else [raw]))
        if not answers:
            raise ValueError("empty answer list")
        year_text = str(_field(obj, "date", (str, int))).strip()
        if not year_text.isdigit():
            raise ValueError(f"unparsable date {year_text!r}: expected a year")
        year = int(year_text)
        if not self.min_date.year <= year <= self.max_date.year:
            raise ValueError(f"year {year} out of range {self.min_date.year}..{self.max_date.year}")
        qid = _field(obj, "id")
        relation = obj.get("relation") or (qid.split("_")[1] if qid.count("_") >= 2 else "")
        if not isinstance(relation, str):
            raise ValueError(f"field 'relation' must be str, got {type(relation).__name__}")
        if not relation:
            raise ValueError("missing field 'relation'")
        most_frequent = obj.get("most_frequent_answer")
        most_recent = obj.get("most_recent_answer")
        return Query(
            id=qid, relation=relation, subject_id=qid.split("_")[0], year=year, query=query, answers=answers,
            most_frequent=None if most_frequent is None else _answer(most_frequent, "most_frequent_answer"),
            most_recent=None if most_recent is None else _answer(most_recent, "most_recent_answer"))


FORMATS: Dict[str, Callable[..., Reader]] = {
    "jsonl": JsonlReader,
    "wmt": WmtDocsReader,
    "arxiv": ArxivReader,
}


def detect_format(path: str) -> str:
    """Guesses a corpus format from the file name, then from its first line."""
    name = os.path.basename(os.fspath(path))
    if "news-docs" in name:
        return "wmt"
    first = b""
    try:
        with open_text(path) as f:
            for raw in f:
                if raw.strip():
                    first = raw
                    break
    except (OSError, EOFError, zlib.error) as e:
        raise DataError(f"corrupt or truncated file at its first line: {e}", os.fspath(path)) from None
    try:
        obj = json.loads(first.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return "wmt" if first.count(b"\t") == 2 else "jsonl"
    if isinstance(obj, dict) and "abstract" in obj and "versions" in obj:
        return "arxiv"
    return "jsonl"


def read_documents(path: str, format: str = "auto", on_error: str = "raise", **kwargs) -> Reader:
    """A Reader of Documents for `path`; `format` is one of FORMATS or "auto"."""
    if format == "auto":
        format = detect_format(path)
    if format not in FORMATS:
        raise ValueError(f"unknown corpus format {format!r}; expected one of {sorted(FORMATS)} or 'auto'")
    return FORMATS[format](path, on_error=on_error, **kwargs)
