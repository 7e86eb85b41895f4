"""Streaming corpus readers: JSON lines, WMT document-level News Crawl, arXiv OAI metadata, TempLAMA releases.

Every reader reads one line at a time (constant memory), opens `.gz` and `.bz2` files transparently, and on a bad
line either raises a `DataError` naming the file, the line number and what was wrong (`on_error="raise"`) or skips
the line and counts it (`on_error="skip"`; the count is logged when the file is done and kept in `reader.skipped`).
"""

from __future__ import annotations

import base64
import binascii
import bz2
import csv
import datetime
import email.utils
import gzip
import hashlib
import json
import os
import re
import zlib
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from templm import console, paths, remote
from templm.data.records import MAX_DATE, MIN_DATE, Answer, Document, Query, parse_date
from templm.errors import DataError, as_os_error, loads_json

ON_ERROR = ("raise", "skip")
# The longest line a reader takes whole (a WMT document, a Wikidata entity: megabytes at most). A longer one (a
# crafted or broken file: a gzip of a 3 GB "line") is read through in pieces and dropped, never held in memory.
MAX_LINE_BYTES = 256 << 20
# A compressed file that gives more than MAX_RATIO bytes for each byte read of it, once it has given MIN_BOMB_BYTES,
# is refused: text compresses 3 to 20 times (WMT's gzip about 3, Wikidata's bz2 about 17), a compression bomb a
# thousand times (gzip) or millions (bzip2).
MAX_RATIO = 200
MIN_BOMB_BYTES = 64 << 20


def read_line(f: Any, limit: int = MAX_LINE_BYTES) -> Tuple[bytes, bool]:
    """(the next line of the binary file `f`, whether it was whole): a line longer than `limit` bytes is read to its
    end in pieces of a megabyte and dropped, returning its first `limit` bytes and False."""
    raw = f.readline(limit + 1)
    if len(raw) <= limit or raw.endswith(b"\n"):
        return raw, True
    rest = raw
    while rest and not rest.endswith(b"\n"):
        rest = f.readline(1 << 20)
    return raw[:limit], False


def open_text(path: str, mode: str = "rb"):
    """Opens `path` for binary reading or writing, through gzip or bz2 when its name ends in `.gz` or `.bz2`. A file
    opened to read is held to the limits on untrusted input (`Guarded`): its lines to `MAX_LINE_BYTES` when iterated,
    its decompressed size to `MAX_RATIO` times the bytes read of it, on a local disk and in a bucket alike."""
    path = os.fspath(path)
    if "r" in mode and not paths.exists(path):
        remote.check_location(path, "the file", write=False)  # in a bucket: why not (no bucket, no route, ...)
        raise DataError("no such file", path)
    if paths.isdir(path):
        raise DataError("is a folder; expected a file", path)
    decompress = gzip.open if path.endswith(".gz") else bz2.open if path.endswith(".bz2") else None
    if "r" not in mode:
        raw = paths.open(path, mode) if paths.is_url(path) else path
        if decompress is not None:
            return decompress(raw, mode)
        return raw if paths.is_url(path) else open(path, mode)
    # A bucket's GFile reads whole lines only (its readline takes no size): buffered, it reads a line in pieces.
    raw = paths.binary_stream(paths.open(path, "rb")) if paths.is_url(path) else open(path, "rb")
    if decompress is None:
        return Guarded(raw, path)
    counted = _Counted(raw)
    try:
        return Guarded(decompress(counted, "rb"), path, counted)
    except BaseException:
        raw.close()
        raise


class _Counted:
    """A compressed file as its decompressor reads it, counting the bytes read."""

    def __init__(self, raw: Any):
        self.raw = raw
        self.bytes = 0

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(n)
        self.bytes += len(data)
        return data

    def close(self) -> None:
        self.raw.close()


class Guarded:
    """A file opened to read untrusted input: a line iterated over longer than `MAX_LINE_BYTES` is a DataError
    naming it (`read_line` drops it instead), and a compressed file that decompresses to more than `MAX_RATIO` times
    the bytes read of it (past `MIN_BOMB_BYTES`) is a DataError naming the file, before more of it is read."""

    mode = "rb"

    def __init__(self, stream: Any, path: str, counted: Optional[_Counted] = None):
        self.stream = stream
        self.path = path
        self.counted = counted
        self.given = 0
        self.lines = 0
        self.closed = False

    def _checked(self, data: bytes) -> bytes:
        self.given += len(data)
        if (self.counted is not None and self.given > MIN_BOMB_BYTES
                and self.given > MAX_RATIO * max(self.counted.bytes, 1)):
            raise DataError(f"decompresses to more than {MAX_RATIO:,} times its size ({self.given:,} bytes "
                            f"from {self.counted.bytes:,}): refused as a compression bomb, not read further "
                            "(text compresses 3 to 20 times)", self.path)
        return data

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:  # the whole file, in pieces so that a bomb is stopped on the way
            pieces = []
            while True:
                piece = self.read(1 << 20)
                if not piece:
                    return b"".join(pieces)
                pieces.append(piece)
        return self._checked(self.stream.read(n))

    def readline(self, limit: int = -1) -> bytes:
        return self._checked(self.stream.readline(limit))

    def tell(self) -> int:
        """How far into the file on disk reading has gone (of a compressed file, the compressed bytes read): its
        share of the file's size is a reader's progress."""
        return self.counted.bytes if self.counted is not None else self.stream.tell()

    def __iter__(self) -> "Guarded":
        return self

    def __next__(self) -> bytes:
        raw, whole = read_line(self, MAX_LINE_BYTES)
        if not raw:
            raise StopIteration
        self.lines += 1
        if not whole:
            raise DataError(f"a line longer than {MAX_LINE_BYTES:,} bytes: not read", self.path, self.lines)
        return raw

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            try:
                self.stream.close()
            finally:
                if self.counted is not None:
                    self.counted.close()

    def __enter__(self) -> "Guarded":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def read_failure(error: BaseException, path: str, where: str) -> Exception:
    """What a failed read of `path` is: the system's refusal (no permission, an I/O error: an OSError with its errno,
    naming the file) or bytes that are not what they claim (a corrupt or truncated compressed file: a DataError)."""
    if isinstance(error, OSError) and error.errno:
        return as_os_error(error, path, f"reading it {where}")
    return DataError(f"corrupt or truncated file {where}: {error}", path)


class Reader:
    """Base of the line readers: numbering, decoding, error policy. Subclasses implement `parse(line)`."""

    source = ""

    def __init__(self, path: str, on_error: str = "raise", min_date: datetime.date = MIN_DATE,
                 max_date: datetime.date = MAX_DATE, max_line_bytes: int = MAX_LINE_BYTES):
        if on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
        self.path = os.fspath(path)
        self.on_error = on_error
        self.min_date = min_date
        self.max_date = max_date
        self.max_line_bytes = max_line_bytes
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
                    raw, whole = read_line(f, self.max_line_bytes)
                except (OSError, EOFError, zlib.error) as e:
                    raise read_failure(e, self.path, f"after line {lineno}") from None
                if not raw:
                    break
                lineno += 1
                if not whole:
                    self._bad(DataError(f"a line longer than {self.max_line_bytes:,} bytes: not read (a document "
                                        "or record is megabytes at most)", self.path, lineno))
                    continue
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
                    self._bad(DataError(reason, self.path, lineno))
                    continue
                self.read += 1
                yield record
        self._said("line(s)")

    def _bad(self, error: DataError) -> None:
        """A bad record: raised, or (on_error="skip") counted with the first five messages kept."""
        if self.on_error == "raise":
            raise error from None
        self.skipped += 1
        if len(self.first_errors) < 5:
            self.first_errors.append(str(error))

    def _said(self, what: str, where: Optional[str] = None) -> None:
        """The one warning of a read that skipped bad records."""
        if self.skipped:
            console.warn(f"{where or self.path}: skipped {self.skipped} bad {what} of {self.skipped + self.read}; "
                         "first: " + "; ".join(self.first_errors))

    def _date(self, value: Any) -> datetime.date:
        return parse_date(value, self.min_date, self.max_date)


def _json_object(line: str) -> Dict[str, Any]:
    try:
        obj = loads_json(line)
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


def _names(value: Any, field: str, what: str) -> List[str]:
    """A name field of a TempLAMA answer: one string, or a list of strings (the alias-list variant)."""
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise ValueError(f"{what}: '{field}' must be a string or a non-empty list of strings, got "
                         f"{json.dumps(value)[:60]}")
    if not all(n.strip() for n in names):
        raise ValueError(f"empty name in {what}")
    return names


def _answer(value: Any, what: str) -> Answer:
    """One answer: an object {'wikidata_id', 'name'} ('name' a string or a list of aliases), or a list of such objects
    of one entity (its aliases, one object each)."""
    forms = value if isinstance(value, list) and value and all(isinstance(v, dict) for v in value) else [value]
    names, ids = [], []
    for form in forms:
        if not isinstance(form, dict) or "name" not in form:
            raise ValueError(f"{what} must be an object with 'wikidata_id' and 'name' (a string, or a list of "
                             f"aliases), or a list of such objects for one entity's aliases; got "
                             f"{json.dumps(value)[:80]}")
        # A mirror's row keeps the release's own name in `original_name` and lists aliases (some with its marks) in
        # `name`: the release's name is what a model is trained on, every other name an alias.
        if form.get("original_name") is not None:
            names += _names(form["original_name"], "original_name", what)
        names += _names(form["name"], "name", what)
        if form.get("wikidata_id") is not None:
            ids.append(str(form["wikidata_id"]))
    if len(set(ids)) > 1:
        raise ValueError(f"{what}: the aliases of one answer name different entities {sorted(set(ids))}: give each "
                         "entity as its own answer")
    unique = list(dict.fromkeys(names))
    return Answer(ids[0] if ids else "", unique[0], tuple(unique[1:]))


TEMPLAMA_SPLITS = {"train": "train", "validation": "val", "test": "test"}  # split -> the release's file stem
TEMPLAMA_SUFFIXES = (".json", ".jsonl", ".json.gz", ".jsonl.gz")


def templama_split_files(folder: str) -> Dict[str, str]:
    """{"train", "validation", "test": path} of a TempLAMA release folder: `{train,val,test}.json` as Google's
    templama.py writes them and the release ships them (JSON lines despite the name), or `.jsonl` (templm's
    builder), optionally gzipped. DataError naming the folder when a split is missing or present twice."""
    folder = os.fspath(folder)
    if not paths.isdir(folder):
        raise DataError("no such TempLAMA folder", folder)
    files = {}
    present = set(paths.listdir(folder))
    for split, stem in TEMPLAMA_SPLITS.items():
        found = [paths.join(folder, stem + suffix) for suffix in TEMPLAMA_SUFFIXES
                 if stem + suffix in present and paths.isfile(paths.join(folder, stem + suffix))]
        if not found:
            raise DataError(f"no TempLAMA {stem} split: expected {stem}.json (as the release ships it) or "
                            f"{stem}.jsonl", folder)
        if len(found) > 1:
            raise DataError(f"two TempLAMA {stem} splits ({', '.join(paths.basename(f) for f in found)}): keep "
                            "one", folder)
        files[split] = found[0]
    return files


class TemplamaReader(Reader):
    """TempLAMA release lines; `answer` may be a list of `{wikidata_id, name}` or one such object, and `name` a list
    of aliases (the first is the answer's name and the rest its aliases; where a mirror gives `original_name`, that is
    the answer's name and every `name` an alias)."""

    source = "templama"

    def __init__(self, path: str, *args: Any, quiet_repeats: bool = False, **kwargs: Any):
        super().__init__(path, *args, **kwargs)
        self.quiet_repeats = quiet_repeats

    def __iter__(self) -> Iterator[Query]:
        """The file's queries, an id once: a later row with an id read before is dropped (the first row is the
        query), and one warning names them (unless `quiet_repeats`: a file read again whose reading said them), so
        task data, evaluation and a study count the same queries."""
        seen = set()
        repeated: Dict[str, int] = {}
        for query in super().__iter__():
            if query.id in seen:
                repeated[query.id] = repeated.get(query.id, 0) + 1
                continue
            seen.add(query.id)
            yield query
        self.duplicates = sum(repeated.values())
        if repeated and not self.quiet_repeats:
            named = ", ".join(list(repeated)[:5]) + (f" and {len(repeated) - 5} more" if len(repeated) > 5 else "")
            console.warn(f"{self.path}: {self.duplicates} row(s) repeat the id of an earlier row ({named}): the first "
                         f"row of each id is the query, the later ones are left out ({len(seen)} queries)")

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


class DelimitedReader(Reader):
    """A table of documents, as researchers keep news: comma-separated (`csv`) or tab-separated (`tsv`) values
    with a header row naming the columns `id`, `date` and `text` (any order, any case, other columns ignored);
    quoted fields may hold the delimiter and line breaks (Python's csv dialect, as spreadsheets and pandas write
    them). A field over the csv module's 131,072 characters is a bad row, named with its line."""

    delimiter = ","
    source = "csv"
    COLUMNS = ("id", "date", "text")

    def __iter__(self) -> Iterator[Document]:
        self.read = self.skipped = 0
        self.first_errors = []
        try:
            with open_text(self.path) as raw, paths.text_stream(raw, "utf-8-sig", newline="") as f:
                rows = csv.reader(f, delimiter=self.delimiter)
                header = next(rows, None)
                if header is None:
                    return
                names = [h.strip().lower() for h in header]
                absent = [c for c in self.COLUMNS if c not in names]
                if absent:
                    raise DataError(f"the header names no {', '.join(repr(c) for c in absent)} column: a "
                                    f"{self.source.upper()} corpus has a header row with columns id, date and text "
                                    f"(found {', '.join(repr(h) for h in header[:8])})", self.path, 1)
                where = {c: names.index(c) for c in self.COLUMNS}
                while True:
                    lineno = rows.line_num + 1
                    try:
                        row = next(rows)
                    except StopIteration:
                        break
                    except (csv.Error, UnicodeDecodeError) as e:
                        self._bad(DataError(f"malformed {self.source.upper()} row: {e}", self.path, lineno))
                        continue
                    if not any(cell.strip() for cell in row):
                        continue
                    try:
                        if len(row) != len(header):
                            raise ValueError(f"expected {len(header)} fields as the header, got {len(row)}")
                        doc_id = row[where["id"]].strip()
                        if not doc_id:
                            raise ValueError("empty id")
                        doc = Document(doc_id, self._date(row[where["date"]]), _text(row[where["text"]]),
                                       self.source)
                    except ValueError as e:
                        self._bad(DataError(str(e), self.path, lineno))
                        continue
                    self.read += 1
                    yield doc
        except (OSError, EOFError, zlib.error) as e:
            raise read_failure(e, self.path, "while reading it") from None
        self._said("row(s)")


class TsvReader(DelimitedReader):
    delimiter = "\t"
    source = "tsv"


# The date in a text file's name: 2014-03-07, 2014_03_07 or 20140307, not inside a longer run of digits.
_NAME_DATE = re.compile(r"(?<!\d)(\d{4})[-_]?(\d{2})[-_]?(\d{2})(?!\d)")
TEXT_DATES_FILE = "dates.tsv"  # the sidecar of a folder of text files: `file name<TAB>date` per line


class TextFolderReader(Reader):
    """A folder of articles, one UTF-8 text file each (`*.txt`, in sub-folders too, in sorted order): the id is the
    file's path in the folder without `.txt`, the text its contents, and the date the one in its name
    (`2014-03-07-storm.txt`, `20140307_storm.txt`) or, for names without one, the folder's `dates.tsv` (`name.txt
    <TAB> date` per line; it wins over the name where it lists a file). A file with no date is a bad document,
    named."""

    source = "text"

    def __iter__(self) -> Iterator[Document]:
        self.read = self.skipped = 0
        self.first_errors = []
        folder = self.path
        names = sorted(_text_files(folder))
        if not names:
            raise DataError("a folder of text files holds no .txt file", folder)
        dates = self._sidecar(folder)
        for name in names:
            path = paths.join(folder, name)
            try:
                found = dates.get(name)
                if found is None:
                    match = _NAME_DATE.search(paths.basename(name))
                    if match is None:
                        raise ValueError(f"no date: its name has none (2014-03-07, 20140307) and "
                                         f"{TEXT_DATES_FILE} does not list it")
                    found = "-".join(match.groups())
                date = self._date(found)
                with open_text(path) as f:
                    try:
                        text = f.read().decode("utf-8-sig")
                    except UnicodeDecodeError as e:
                        raise ValueError(f"invalid UTF-8 at byte {e.start}") from None
                doc = Document(name[:-len(".txt")], date, _text(text.strip()), self.source)
            except ValueError as e:
                self._bad(DataError(str(e), path))
                continue
            self.read += 1
            yield doc
        self._said("file(s)", folder)

    def _sidecar(self, folder: str) -> Dict[str, str]:
        path = paths.join(folder, TEXT_DATES_FILE)
        if not paths.exists(path):
            return {}
        dates: Dict[str, str] = {}
        with open_text(path) as f:
            for lineno, raw in enumerate(f, 1):
                line = raw.decode("utf-8-sig").rstrip("\r\n")
                if not line.strip():
                    continue
                fields = line.split("\t")
                if len(fields) != 2:
                    raise DataError(f"expected 2 tab-separated fields (file name, date), got {len(fields)}", path,
                                    lineno)
                dates[fields[0].strip()] = fields[1].strip()
        return dates


def _text_files(folder: str) -> List[str]:
    """The `.txt` files under `folder`, as paths relative to it with '/'."""
    found = []
    for name in paths.listdir(folder):
        path = paths.join(folder, name)
        if paths.isdir(path):
            found += [f"{name}/{inner}" for inner in _text_files(path)]
        elif name.endswith(".txt"):
            found.append(name)
    return found


FORMATS: Dict[str, Callable[..., Reader]] = {
    "jsonl": JsonlReader,
    "wmt": WmtDocsReader,
    "arxiv": ArxivReader,
    "csv": DelimitedReader,
    "tsv": TsvReader,
    "text": TextFolderReader,
}


def detect_format(path: str) -> str:
    """A corpus format from the path and the first line (a UTF-8 byte-order mark ignored): a folder holds text
    files; `news-docs` in the name is WMT; a first line that is a JSON object is jsonl (arxiv with its abstract and
    versions), three tab-separated fields starting with a date WMT's, a header naming id, date and text a CSV or
    TSV table; otherwise the name decides (`.csv`, `.tsv`; `.json`, `.jsonl`: JSON lines, whose reader then names
    the bad line). Anything else is a DataError naming the file and the formats templm reads."""
    path = os.fspath(path)
    if paths.isdir(path):
        return "text"
    name = paths.basename(path)
    if "news-docs" in name:
        return "wmt"
    stem = name[:-len(".gz")] if name.endswith(".gz") else name[:-len(".bz2")] if name.endswith(".bz2") else name
    first = b""
    try:
        with open_text(path) as f:
            for raw in f:
                if raw.strip():
                    first = raw
                    break
    except (OSError, EOFError, zlib.error) as e:
        raise read_failure(e, path, "at its first line") from None
    if first.startswith(b"\xef\xbb\xbf"):
        first = first[3:]
    if not first:
        return "jsonl"  # an empty file: no documents
    try:
        obj = loads_json(first.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        obj = None
    if isinstance(obj, dict):
        return "arxiv" if "abstract" in obj and "versions" in obj else "jsonl"
    if first.count(b"\t") == 2 and first.split(b"\t")[0].strip().isdigit():
        return "wmt"
    delimiter = "\t" if b"\t" in first else ","
    header = [h.strip().strip('"').lower() for h in first.decode("utf-8", "replace").strip().split(delimiter)]
    if {"id", "date", "text"} <= set(header):
        return "tsv" if delimiter == "\t" else "csv"
    for suffix, fmt in ((".csv", "csv"), (".tsv", "tsv"), (".json", "jsonl"), (".jsonl", "jsonl")):
        if stem.endswith(suffix):
            return fmt
    raise DataError(f"not a corpus format templm reads: its first line is {first[:60]!r}. The formats: JSON lines "
                    "{\"id\", \"date\", \"text\"} (jsonl), WMT document-level News Crawl (wmt), the arXiv OAI "
                    "snapshot (arxiv), CSV or TSV with a header row naming id, date and text (csv, tsv), a folder of "
                    ".txt files (text); --format names one", path)


# A corpus is one file, a glob pattern, or a list of either: WMT News Crawl ships one file per year.
Corpus = Union[str, "os.PathLike[str]", Sequence[Union[str, "os.PathLike[str]"]]]
_GLOB_CHARS = ("*", "?", "[")


def corpus_files(corpus: Corpus) -> List[str]:
    """The files of a corpus argument, in order: each entry as given, a glob pattern (an entry with * ? or [ that
    is not itself a file) replaced by its matches in sorted order (so `news-docs.20*.en.filtered.gz` reads the
    years in order). DataError naming the entry for a pattern that matches no file, and for a file named twice."""
    entries = [corpus] if isinstance(corpus, (str, os.PathLike)) else list(corpus)
    if not entries:
        raise DataError("no corpus file given", "--corpus")
    files: List[str] = []
    for entry in entries:
        entry = os.fspath(entry)
        if any(c in entry for c in _GLOB_CHARS) and not paths.exists(entry):
            matches = [m for m in paths.glob(entry) if not paths.isdir(m)]
            if not matches:
                raise DataError("no file matches this pattern", entry)
            files.extend(matches)
        else:
            files.append(entry)
    seen: Dict[str, str] = {}
    for path in files:
        key = path if paths.is_url(path) else os.path.realpath(path)
        if key in seen:
            raise DataError(f"the corpus names this file twice (also as {seen[key]})", path)
        seen[key] = path
    return files


def resolve_corpus(corpus: Corpus) -> Union[str, List[str]]:
    """The corpus as absolute paths, patterns expanded: one str for one file, else the list (what a run records)."""
    files = [paths.absolute(path) for path in corpus_files(corpus)]
    return files[0] if len(files) == 1 else files


def describe_corpus(corpus: Corpus) -> str:
    """A corpus for messages: its one file, or its first file and how many follow."""
    files = corpus_files(corpus)
    return files[0] if len(files) == 1 else f"{files[0]} (+{len(files) - 1} more file(s))"


class CorpusReader:
    """The documents of several corpus files, file after file, each read by the reader of its own format (detected
    per file with format="auto"); counts, errors and `path` (for messages) as a single Reader's."""

    def __init__(self, files: Sequence[str], format: str, on_error: str, **kwargs):
        self.files = list(files)
        self.readers = [_reader(path, format, on_error, **kwargs) for path in self.files]
        self.path = f"{self.files[0]} (+{len(self.files) - 1} more file(s))"
        self.on_error = on_error

    @property
    def read(self) -> int:
        return sum(r.read for r in self.readers)

    @property
    def skipped(self) -> int:
        return sum(r.skipped for r in self.readers)

    @property
    def first_errors(self) -> List[str]:
        return [e for r in self.readers for e in r.first_errors][:5]

    def __iter__(self) -> Iterator[Any]:
        for reader in self.readers:
            yield from reader


def _reader(path: str, format: str, on_error: str, **kwargs) -> Reader:
    if format == "auto":
        format = detect_format(path)
    if format not in FORMATS:
        raise ValueError(f"unknown corpus format {format!r}; expected one of {sorted(FORMATS)} or 'auto'")
    return FORMATS[format](path, on_error=on_error, **kwargs)


def read_documents(corpus: Corpus, format: str = "auto", on_error: str = "raise",
                   **kwargs) -> Union[Reader, CorpusReader]:
    """A reader of the Documents of `corpus` (one file, a glob pattern, or a list of either: `corpus_files`);
    `format` is one of FORMATS or "auto" (detected per file)."""
    if format != "auto" and format not in FORMATS:
        raise ValueError(f"unknown corpus format {format!r}; expected one of {sorted(FORMATS)} or 'auto'")
    files = corpus_files(corpus)
    if len(files) == 1:
        return _reader(files[0], format, on_error, **kwargs)
    return CorpusReader(files, format, on_error, **kwargs)
