"""Tests for templm.data.records, templm.data.readers and templm.data.templama.

Every test writes real files under tmp_path and reads them through the real readers; expected values (ids, dates,
texts, sha256 digests, line numbers) are computed here independently of the library.
"""

from __future__ import annotations

import base64
import bz2
import dataclasses
import datetime
import gzip
import hashlib
import json
import os
import pathlib
import random
import string

import pytest

from templm.data import readers
from templm.data.readers import (
    ArxivReader,
    JsonlReader,
    TemplamaReader,
    WmtDocsReader,
    detect_format,
    open_text,
    read_documents,
)
from templm.data.records import MAX_DATE, MIN_DATE, Answer, Document, Query, parse_date
from templm.errors import DataError
from templm.data.templama import (
    SPLITS,
    TEMPLATES,
    Fact,
    queries_for_subject,
    queries_from_facts,
    split_by_subject,
    write_queries,
)

D = datetime.date


# ----------------------------------------------------------------------------------------------------------------------
# helpers


def write_lines(path, lines) -> str:
    """Writes `lines` (str or bytes, each gets a trailing newline) to `path`, compressed by its suffix."""
    path = str(path)
    data = b"".join((l if isinstance(l, bytes) else l.encode("utf-8")) + b"\n" for l in lines)
    if path.endswith(".gz"):
        with gzip.open(path, "wb") as f:
            f.write(data)
    elif path.endswith(".bz2"):
        with bz2.open(path, "wb") as f:
            f.write(data)
    else:
        with open(path, "wb") as f:
            f.write(data)
    return path


def jdoc(doc_id="a", date="2014-01-01", text="some text", **extra) -> str:
    obj = {"id": doc_id, "date": date, "text": text}
    obj.update(extra)
    return json.dumps(obj)


def b64(text_or_bytes) -> str:
    data = text_or_bytes.encode("utf-8") if isinstance(text_or_bytes, str) else text_or_bytes
    return base64.b64encode(data).decode("ascii")


def wmt_line(date: str, sentences, unsplit: str):
    """A WMT news-docs line and the expected (text, id) computed independently."""
    split_field = b64("\n".join(sentences))
    raw_field = b64(unsplit)
    expected_id = hashlib.sha256(raw_field.encode("ascii")).hexdigest()
    return f"{date}\t{split_field}\t{raw_field}", "\n".join(sentences), expected_id


def arxiv_line(arxiv_id="0704.0001", abstract="An abstract.", created="Mon, 2 Apr 2007 19:18:42 GMT", **extra):
    obj = {
        "id": arxiv_id,
        "submitter": "A. Author",
        "title": "A title",
        "abstract": abstract,
        "versions": [{"version": "v1", "created": created},
                     {"version": "v2", "created": "Tue, 24 Jul 2007 20:10:27 GMT"}],
    }
    obj.update(extra)
    return json.dumps(obj)


def tl_obj(**overrides) -> dict:
    obj = {
        "query": "Lionel Messi plays for _X_.",
        "answer": [{"wikidata_id": "Q7156", "name": "FC Barcelona"}],
        "date": "2010",
        "id": "Q615_P54_2010",
        "most_frequent_answer": {"wikidata_id": "Q7156", "name": "FC Barcelona"},
        "most_recent_answer": {"wikidata_id": "Q483020", "name": "Paris Saint-Germain"},
        "relation": "P54",
    }
    obj.update(overrides)
    return obj


def tl_line(**overrides) -> str:
    return json.dumps(tl_obj(**overrides))


def truncate(path: str, keep: int) -> None:
    with open(path, "rb") as f:
        data = f.read()
    assert 0 < keep < len(data)
    with open(path, "wb") as f:
        f.write(data[:keep])


def assert_line_error(excinfo, path: str, lineno: int, *words: str) -> None:
    err = excinfo.value
    message = str(err)
    assert isinstance(err, DataError)
    assert message.startswith(f"{path}:{lineno}: "), message
    assert err.path == path
    assert err.line == lineno
    for word in words:
        assert word in message, (word, message)


# ----------------------------------------------------------------------------------------------------------------------
# records: parse_date, DataError, Query


@pytest.mark.parametrize("text, expected", [
    ("2014-03-05", D(2014, 3, 5)),
    ("20140305", D(2014, 3, 5)),
    ("2014-03", D(2014, 3, 1)),
    ("2016-02-29", D(2016, 2, 29)),
    ("  2014-03-05\n", D(2014, 3, 5)),
    ("2014-03-05T10:20:30", D(2014, 3, 5)),
    ("2014-03-05T10:20:30.250", D(2014, 3, 5)),
    ("2014-03-05T10:20:30Z", D(2014, 3, 5)),
    ("2014-03-05T23:59:59Z", D(2014, 3, 5)),
    # With an offset the date is the local date as written, not converted to UTC.
    ("2014-12-31T23:00:00-05:00", D(2014, 12, 31)),
    ("2015-01-01T01:30:00+02:00", D(2015, 1, 1)),
    ("2014-03-05 10:20:30", D(2014, 3, 5)),
    ("1900-01-01", D(1900, 1, 1)),
    ("2100-12-31", D(2100, 12, 31)),
])
def test_parse_date_valid(text, expected):
    assert parse_date(text) == expected


@pytest.mark.parametrize("value, word", [
    ("yesterday", "unparsable date"),
    ("", "unparsable date"),
    ("2014/03/05", "unparsable date"),
    ("2014-3-5", "unparsable date"),
    ("05-03-2014", "unparsable date"),
    ("2014", "unparsable date"),
    ("Tuesday", "unparsable date"),
    ("2014-03-05Tnonsense", "unparsable date"),
    ("2014-02-30", "invalid date"),
    ("20140230", "invalid date"),
    ("2015-02-29", "invalid date"),
    ("2014-13", "invalid date"),
    ("2014-00-10", "invalid date"),
    ("1850-06-01", "out of range"),
    ("2150-06-01", "out of range"),
    ("18991231", "out of range"),
    ("2101-01", "out of range"),
    ("2101-01-01T00:00:00Z", "out of range"),
])
def test_parse_date_errors(value, word):
    with pytest.raises(ValueError) as excinfo:
        parse_date(value)
    assert word in str(excinfo.value)
    assert repr(value) in str(excinfo.value)


def test_parse_date_range_message_names_bounds():
    with pytest.raises(ValueError, match=r"out of range 1900-01-01\.\.2100-12-31"):
        parse_date("1850-01-01")


@pytest.mark.parametrize("value, type_name", [
    (20140305, "int"),
    (None, "NoneType"),
    (D(2014, 3, 5), "date"),
    (2014.0, "float"),
    (b"2014-03-05", "bytes"),
])
def test_parse_date_non_string(value, type_name):
    with pytest.raises(ValueError) as excinfo:
        parse_date(value)
    assert str(excinfo.value) == f"date must be a string, got {type_name} {value!r}"


def test_parse_date_custom_range():
    assert parse_date("1850-01-01", min_date=D(1800, 1, 1)) == D(1850, 1, 1)
    with pytest.raises(ValueError, match="out of range 2015-01-01..2020-12-31"):
        parse_date("2014-12-31", min_date=D(2015, 1, 1), max_date=D(2020, 12, 31))
    assert parse_date("2015-01-01", min_date=D(2015, 1, 1), max_date=D(2015, 1, 1)) == D(2015, 1, 1)


def test_date_bounds():
    assert MIN_DATE == D(1900, 1, 1)
    assert MAX_DATE == D(2100, 12, 31)


def test_data_error_formats():
    e = DataError("bad thing", "/x/y.jsonl", 7)
    assert str(e) == "/x/y.jsonl:7: bad thing"
    assert (e.path, e.line, e.reason) == ("/x/y.jsonl", 7, "bad thing")
    assert str(DataError("no such file", "/x/y.jsonl")) == "/x/y.jsonl: no such file"
    assert str(DataError("plain")) == "plain"
    assert isinstance(e, ValueError)


def test_query_to_json_and_answer_names():
    q = Query(id="Q1_P54_2012", relation="P54", subject_id="Q1", year=2012, query="X plays for _X_.",
              answers=(Answer("Q10", "Club A"), Answer("Q11", "Club B")),
              most_frequent=Answer("Q10", "Club A"), most_recent=None)
    assert q.answer_names == ("Club A", "Club B")
    assert q.to_json() == {
        "query": "X plays for _X_.",
        "answer": [{"wikidata_id": "Q10", "name": "Club A"}, {"wikidata_id": "Q11", "name": "Club B"}],
        "date": "2012",
        "id": "Q1_P54_2012",
        "most_frequent_answer": {"wikidata_id": "Q10", "name": "Club A"},
        "most_recent_answer": None,
        "relation": "P54",
    }


# ----------------------------------------------------------------------------------------------------------------------
# JsonlReader


DOCS = [
    Document("doc-1", D(2014, 1, 2), "First article.\nWith two lines."),
    Document("doc-2", D(2015, 6, 30), "Zweiter Artikel: Grüße, 東京, emoji \U0001F600."),
    Document("doc-3", D(1999, 12, 31), "  leading and trailing spaces are kept  "),
]


@pytest.mark.parametrize("suffix", ["", ".gz", ".bz2"])
def test_jsonl_round_trip(tmp_path, suffix):
    path = write_lines(tmp_path / f"docs.jsonl{suffix}",
                       [json.dumps({"id": d.id, "date": d.date.isoformat(), "text": d.text}) for d in DOCS])
    reader = JsonlReader(path)
    got = list(reader)
    assert got == [dataclasses.replace(d, source="jsonl") for d in DOCS]
    assert all(d.source == "jsonl" for d in got)
    assert (reader.read, reader.skipped, reader.first_errors) == (3, 0, [])


def test_jsonl_blank_lines_ignored_but_counted(tmp_path):
    path = write_lines(tmp_path / "docs.jsonl", ["", jdoc("a"), "   ", "\t", jdoc("b"), "", "{bad"])
    reader = JsonlReader(path, on_error="skip")
    assert [d.id for d in reader] == ["a", "b"]
    assert (reader.read, reader.skipped) == (2, 1)
    # the bad line is the 7th physical line: blank lines still count
    assert reader.first_errors[0].startswith(f"{path}:7: malformed JSON")


def test_jsonl_crlf_and_extra_fields(tmp_path):
    path = str(tmp_path / "docs.jsonl")
    with open(path, "wb") as f:
        f.write(jdoc("a", text="x y", url="http://example.com", lang="en").encode() + b"\r\n")
        f.write(jdoc("b", date="20140305").encode() + b"\r\n")
    assert list(JsonlReader(path)) == [
        Document("a", D(2014, 1, 1), "x y", "jsonl"),
        Document("b", D(2014, 3, 5), "some text", "jsonl"),
    ]


def test_jsonl_integer_ids(tmp_path):
    path = write_lines(tmp_path / "docs.jsonl", [
        json.dumps({"id": 42, "date": "2014-01-01", "text": "a"}),
        json.dumps({"id": 0, "date": "2014-01", "text": "b"}),
    ])
    assert list(JsonlReader(path)) == [
        Document("42", D(2014, 1, 1), "a", "jsonl"),
        Document("0", D(2014, 1, 1), "b", "jsonl"),
    ]


def test_jsonl_date_range_from_reader_arguments(tmp_path):
    path = write_lines(tmp_path / "docs.jsonl", [jdoc("a", date="1850-05-01"), jdoc("b", date="2014-01-01")])
    reader = JsonlReader(path, min_date=D(1800, 1, 1), max_date=D(1900, 1, 1))
    with pytest.raises(DataError) as excinfo:
        list(reader)
    assert_line_error(excinfo, path, 2, "out of range 1800-01-01..1900-01-01")
    reader = JsonlReader(path, on_error="skip", min_date=D(1800, 1, 1), max_date=D(1900, 1, 1))
    assert list(reader) == [Document("a", D(1850, 5, 1), "some text", "jsonl")]


def test_iterating_twice_resets_counters(tmp_path):
    path = write_lines(tmp_path / "docs.jsonl", [jdoc("a"), "[]", jdoc("b")])
    reader = JsonlReader(path, on_error="skip")
    first = list(reader)
    second = list(reader)
    assert first == second
    assert [d.id for d in second] == ["a", "b"]
    assert (reader.read, reader.skipped, len(reader.first_errors)) == (2, 1, 1)


def test_on_error_must_be_known(tmp_path):
    with pytest.raises(ValueError, match="on_error must be one of"):
        JsonlReader(str(tmp_path / "x.jsonl"), on_error="ignore")


INVALID_UTF8_LINE = b'{"id": "a", "date": "2014-01-01", "text": "caf\xe9"}'
INVALID_UTF8_AT = INVALID_UTF8_LINE.index(bytes([0xE9]))

JSONL_BAD = [
    pytest.param('{"id": "a", "date": "2014-01-01", "text": "x"', ("malformed JSON",), id="truncated-json"),
    pytest.param("not json at all", ("malformed JSON", "column 1"), id="not-json"),
    # A crafted line nested past Python's parser (a RecursionError traceback before, even with on_error=skip).
    pytest.param("[" * 100_000 + "]" * 100_000, ("malformed JSON", "nested deeper than templm reads"), id="deep-json"),
    pytest.param('{"id": "a", "date": "2014-01-01", "text": ' + '{"x": ' * 50_000 + "1" + "}" * 50_000 + "}",
                 ("malformed JSON", "nested deeper"), id="deep-object"),
    pytest.param("[1, 2, 3]", ("expected a JSON object", "got list"), id="array"),
    pytest.param('"a string"', ("expected a JSON object", "got str"), id="string"),
    pytest.param("42", ("expected a JSON object", "got int"), id="number"),
    pytest.param(json.dumps({"date": "2014-01-01", "text": "x"}), ("missing field 'id'",), id="no-id"),
    pytest.param(jdoc(""), ("missing field 'id'",), id="empty-id"),
    pytest.param(jdoc(None), ("missing field 'id'",), id="null-id"),
    pytest.param(json.dumps({"id": "a", "text": "x"}), ("missing field 'date'",), id="no-date"),
    pytest.param(jdoc(date=None), ("missing field 'date'",), id="null-date"),
    pytest.param(jdoc(date=20140101), ("field 'date' must be str, got int",), id="int-date"),
    pytest.param(json.dumps({"id": "a", "date": "2014-01-01"}), ("missing field 'text'",), id="no-text"),
    pytest.param(jdoc(text=["x"]), ("field 'text' must be str, got list",), id="list-text"),
    pytest.param(jdoc(text=" \t\n "), ("empty text",), id="empty-text"),
    pytest.param(jdoc(text=""), ("empty text",), id="empty-text-2"),
    pytest.param(jdoc(date="last week"), ("unparsable date", "'last week'"), id="bad-date"),
    pytest.param(jdoc(date="2014-02-30"), ("invalid date", "'2014-02-30'"), id="invalid-date"),
    pytest.param(jdoc(date="1850-01-01"), ("out of range",), id="early-date"),
    pytest.param(jdoc(date="2150-01-01"), ("out of range",), id="late-date"),
    pytest.param(b"\xff\xfe", ("invalid UTF-8 at byte 0",), id="raw-bytes"),
    pytest.param(INVALID_UTF8_LINE, (f"invalid UTF-8 at byte {INVALID_UTF8_AT}",),
                 id="latin1-in-json"),
]


@pytest.mark.parametrize("bad, words", JSONL_BAD)
def test_jsonl_bad_line_raises_with_path_and_line(tmp_path, bad, words):
    path = write_lines(tmp_path / "docs.jsonl", [jdoc("a"), jdoc("b"), bad, jdoc("c")])
    with pytest.raises(DataError) as excinfo:
        list(JsonlReader(path))
    assert_line_error(excinfo, path, 3, *words)


@pytest.mark.parametrize("bad, words", JSONL_BAD)
def test_jsonl_bad_line_skipped(tmp_path, bad, words):
    path = write_lines(tmp_path / "docs.jsonl.gz", [jdoc("a"), bad, "", jdoc("c")])
    reader = JsonlReader(path, on_error="skip")
    assert [d.id for d in reader] == ["a", "c"]
    assert (reader.read, reader.skipped) == (2, 1)
    assert len(reader.first_errors) == 1
    assert reader.first_errors[0].startswith(f"{path}:2: ")
    for word in words:
        assert word in reader.first_errors[0]


def test_skip_mode_counts_and_keeps_first_five_errors(tmp_path, capsys):
    lines = [
        jdoc("g1"),            # 1
        "{oops",               # 2 bad
        jdoc("g2"),            # 3
        "[]",                  # 4 bad
        jdoc(date="never"),    # 5 bad
        "",                    # 6 blank
        jdoc("g3"),            # 7
        jdoc(text="  "),       # 8 bad
        b"\xff\xfe",           # 9 bad
        jdoc(date="1850-01-01"),  # 10 bad
        json.dumps({"id": "x", "date": "2014-01-01"}),  # 11 bad
        jdoc("g4"),            # 12
    ]
    path = write_lines(tmp_path / "docs.jsonl", lines)
    reader = JsonlReader(path, on_error="skip")
    docs = list(reader)
    assert [d.id for d in docs] == ["g1", "g2", "g3", "g4"]
    assert reader.read == 4
    assert reader.skipped == 7
    assert len(reader.first_errors) == 5
    expected = [(2, "malformed JSON"), (4, "expected a JSON object"), (5, "unparsable date"), (8, "empty text"),
                (9, "invalid UTF-8")]
    for message, (lineno, word) in zip(reader.first_errors, expected):
        assert message.startswith(f"{path}:{lineno}: "), message
        assert word in message
    assert f"warning: {path}: skipped 7 bad line(s) of 11" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------------------------------------
# WmtDocsReader


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_wmt_reader(tmp_path, suffix):
    l1, text1, id1 = wmt_line("20140305", ["First sentence.", "Second sentence."], "First sentence. Second sentence.")
    l2, text2, id2 = wmt_line("20151231", ["Grüße aus Köln.", "東京."], "Grüße aus Köln. 東京.")
    l3, text3, id3 = wmt_line("19990101", ["Only one."], "Only one.")
    path = write_lines(tmp_path / f"news-docs.2014.en.filtered{suffix}", [l1, l2, "", l3])
    reader = WmtDocsReader(path)
    docs = list(reader)
    assert docs == [
        Document(id1, D(2014, 3, 5), "First sentence.\nSecond sentence.", "wmt"),
        Document(id2, D(2015, 12, 31), "Grüße aus Köln.\n東京.", "wmt"),
        Document(id3, D(1999, 1, 1), "Only one.", "wmt"),
    ]
    assert [d.text for d in docs] == [text1, text2, text3]
    assert len(id1) == 64 and len({id1, id2, id3}) == 3
    assert (reader.read, reader.skipped) == (3, 0)


def test_wmt_id_is_digest_of_raw_third_field_not_of_text(tmp_path):
    # Same split text, different unsplit field: ids differ; the id is sha256 of the base64 ASCII, not of the text.
    third_a = b64("Doc one.")
    third_b = b64("Doc one!")
    split = b64("Doc one.")
    path = write_lines(tmp_path / "wmt.tsv", [f"20140101\t{split}\t{third_a}", f"20140101\t{split}\t{third_b}"])
    a, b = list(WmtDocsReader(path))
    assert a.id == hashlib.sha256(third_a.encode("ascii")).hexdigest()
    assert b.id == hashlib.sha256(third_b.encode("ascii")).hexdigest()
    assert a.id != hashlib.sha256(b"Doc one.").hexdigest()
    assert a.text == b.text == "Doc one."


def test_wmt_trailing_newlines_stripped_from_text(tmp_path):
    line = f"20140101\t{b64('A.' + chr(10) + 'B.' + chr(10) + chr(10))}\t{b64('A. B.')}"
    path = write_lines(tmp_path / "wmt.tsv", [line])
    assert [d.text for d in WmtDocsReader(path)] == ["A.\nB."]


GOOD_WMT = wmt_line("20140101", ["Good."], "Good.")[0]

WMT_BAD = [
    pytest.param(f"20140101\t{b64('x')}", ("expected 3 tab-separated fields", "got 2"), id="two-fields"),
    pytest.param(f"20140101\t{b64('x')}\t{b64('x')}\textra", ("expected 3 tab-separated fields", "got 4"),
                 id="four-fields"),
    pytest.param("just some text", ("expected 3 tab-separated fields", "got 1"), id="one-field"),
    pytest.param(f"20140101\tnot*base64!\t{b64('x')}", ("not base64",), id="bad-base64"),
    pytest.param(f"20140101\t{b64('x')[:-1]}\t{b64('x')}", ("not base64",), id="bad-base64-padding"),
    pytest.param(f"20140101\t{b64(b'caf' + bytes([0xe9]))}\t{b64('x')}", ("not base64 of UTF-8",), id="not-utf8"),
    pytest.param(f"2014-01-01\t{b64('x')}\t{b64('x')}", ("unparsable date", "expected YYYYMMDD"), id="iso-date"),
    pytest.param(f"201401\t{b64('x')}\t{b64('x')}", ("unparsable date",), id="short-date"),
    pytest.param(f"20140230\t{b64('x')}\t{b64('x')}", ("invalid date",), id="invalid-date"),
    pytest.param(f"18500101\t{b64('x')}\t{b64('x')}", ("out of range",), id="early-date"),
    pytest.param(f"21500101\t{b64('x')}\t{b64('x')}", ("out of range",), id="late-date"),
    pytest.param(f"20140101\t{b64(chr(10) + chr(10))}\t{b64('x')}", ("empty text",), id="empty-text"),
    pytest.param(f"20140101\t\t{b64('x')}", ("empty text",), id="empty-field"),
    pytest.param(b"20140101\t\xff\xfe\tabc", ("invalid UTF-8 at byte 9",), id="raw-bytes"),
]


@pytest.mark.parametrize("bad, words", WMT_BAD)
def test_wmt_bad_line_raises(tmp_path, bad, words):
    path = write_lines(tmp_path / "news-docs.2014.en.filtered.gz", [GOOD_WMT, GOOD_WMT, bad])
    with pytest.raises(DataError) as excinfo:
        list(WmtDocsReader(path))
    assert_line_error(excinfo, path, 3, *words)


def test_wmt_skip_mode(tmp_path):
    bads = [p.values[0] for p in WMT_BAD]
    path = write_lines(tmp_path / "wmt.tsv", [GOOD_WMT] + bads + [GOOD_WMT])
    reader = WmtDocsReader(path, on_error="skip")
    docs = list(reader)
    assert len(docs) == 2 and docs[0] == docs[1]
    assert (reader.read, reader.skipped) == (2, len(bads))
    assert [m.split(": ", 1)[0] for m in reader.first_errors] == [f"{path}:{n}" for n in range(2, 7)]


# ----------------------------------------------------------------------------------------------------------------------
# ArxivReader


def test_arxiv_reader(tmp_path):
    path = write_lines(tmp_path / "arxiv-metadata-oai-snapshot.json", [
        arxiv_line("0704.0001", "  A fully differential calculation\n  in perturbative QCD   is presented.\n",
                   "Mon, 2 Apr 2007 19:18:42 GMT"),
        arxiv_line("2101.00001", "Line one.\n\tLine two.", "Fri, 1 Jan 2021 00:00:01 GMT"),
    ])
    assert list(ArxivReader(path)) == [
        Document("0704.0001", D(2007, 4, 2), "A fully differential calculation in perturbative QCD is presented.",
                 "arxiv"),
        Document("2101.00001", D(2021, 1, 1), "Line one. Line two.", "arxiv"),
    ]


ARXIV_BAD = [
    pytest.param(json.dumps({"id": "1", "versions": [{"created": "Mon, 2 Apr 2007 19:18:42 GMT"}]}),
                 ("missing field 'abstract'",), id="no-abstract"),
    pytest.param(json.dumps({"abstract": "x", "versions": [{"created": "Mon, 2 Apr 2007 19:18:42 GMT"}]}),
                 ("missing field 'id'",), id="no-id"),
    pytest.param(arxiv_line(arxiv_id=704.0001), ("field 'id' must be str",), id="float-id"),
    pytest.param(json.dumps({"id": "1", "abstract": "x"}), ("missing field 'versions'",), id="no-versions"),
    pytest.param(arxiv_line(versions=[]), ("versions[0].created",), id="empty-versions"),
    pytest.param(arxiv_line(versions=[{"version": "v1"}]), ("versions[0].created",), id="no-created"),
    pytest.param(arxiv_line(versions="v1"), ("field 'versions' must be list",), id="versions-str"),
    pytest.param(arxiv_line(created="yesterday"), ("unparsable date", "'yesterday'"), id="bad-created"),
    pytest.param(arxiv_line(created="Mon, 2 Apr 1850 19:18:42 GMT"), ("out of range",), id="early-created"),
    pytest.param(arxiv_line(abstract=" \n\t "), ("empty abstract",), id="empty-abstract"),
    pytest.param("{not json", ("malformed JSON",), id="bad-json"),
    pytest.param("[]", ("expected a JSON object",), id="array"),
    pytest.param(b"\xff\xfe", ("invalid UTF-8",), id="raw-bytes"),
]


@pytest.mark.parametrize("bad, words", ARXIV_BAD)
def test_arxiv_bad_line_raises(tmp_path, bad, words):
    path = write_lines(tmp_path / "arxiv.json", [arxiv_line(), arxiv_line(), bad])
    with pytest.raises(DataError) as excinfo:
        list(ArxivReader(path))
    assert_line_error(excinfo, path, 3, *words)


@pytest.mark.parametrize("created", [123, ["Mon, 2 Apr 2007 19:18:42 GMT"]])
def test_arxiv_non_string_created_is_data_error(tmp_path, created):
    path = write_lines(tmp_path / "arxiv.json", [arxiv_line(), arxiv_line(created=created)])
    with pytest.raises(DataError) as excinfo:
        list(ArxivReader(path))
    assert_line_error(excinfo, path, 2, "created")


# ----------------------------------------------------------------------------------------------------------------------
# TemplamaReader


def test_templama_answer_list(tmp_path):
    path = write_lines(tmp_path / "templama.jsonl", [tl_line(answer=[
        {"wikidata_id": "Q7156", "name": "FC Barcelona"}, {"wikidata_id": "Q483020", "name": "Paris Saint-Germain"}])])
    (q,) = list(TemplamaReader(path))
    assert q == Query(
        id="Q615_P54_2010", relation="P54", subject_id="Q615", year=2010, query="Lionel Messi plays for _X_.",
        answers=(Answer("Q7156", "FC Barcelona"), Answer("Q483020", "Paris Saint-Germain")),
        most_frequent=Answer("Q7156", "FC Barcelona"), most_recent=Answer("Q483020", "Paris Saint-Germain"))
    assert q.answer_names == ("FC Barcelona", "Paris Saint-Germain")


def test_templama_answer_as_a_list_of_one_entitys_alias_objects(tmp_path):
    """An answer given as the list of its aliases' objects was refused with "must be an object with 'wikidata_id' and
    'name'" although each object has both; aliases naming two entities are refused naming them."""
    path = write_lines(tmp_path / "templama.jsonl", [
        tl_line(answer=[[{"wikidata_id": "Q7156", "name": "FC Barcelona"}, {"wikidata_id": "Q7156", "name": "Barça"}],
                        {"wikidata_id": "Q483020", "name": "Paris Saint-Germain"}]),
        tl_line(answer=[[{"wikidata_id": "Q7156", "name": "FC Barcelona"}, {"wikidata_id": "Q9", "name": "Chelsea"}]],
                id="Q615_P54_2011", date="2011")])
    reader = TemplamaReader(path, on_error="skip")
    (q,) = list(reader)
    assert q.answers == (Answer("Q7156", "FC Barcelona", ("Barça",)), Answer("Q483020", "Paris Saint-Germain"))
    assert reader.skipped == 1 and "name different entities ['Q7156', 'Q9']" in reader.first_errors[0]


def test_templama_answer_single_dict_and_int_year(tmp_path):
    path = write_lines(tmp_path / "templama.jsonl", [
        tl_line(answer={"wikidata_id": "Q9", "name": "Chelsea"}, date=2012, id="Q123_P54_2012",
                most_frequent_answer=None, most_recent_answer=None),
        json.dumps({k: v for k, v in tl_obj(id="Q5_P39_2018", date=" 2018 ").items()
                    if k not in ("relation", "most_frequent_answer", "most_recent_answer")}),
    ])
    q1, q2 = list(TemplamaReader(path))
    assert q1.answers == (Answer("Q9", "Chelsea"),)
    assert (q1.year, q1.subject_id, q1.relation) == (2012, "Q123", "P54")
    assert q1.most_frequent is None and q1.most_recent is None
    # relation taken from the id when the field is absent
    assert (q2.id, q2.relation, q2.subject_id, q2.year) == ("Q5_P39_2018", "P39", "Q5", 2018)
    assert q2.most_frequent is None and q2.most_recent is None


def test_templama_write_and_read_back_round_trip(tmp_path):
    queries = [
        Query(id="Q615_P54_2012", relation="P54", subject_id="Q615", year=2012, query="Lionel Messi plays for _X_.",
              answers=(Answer("Q7156", "FC Barcelona"),), most_frequent=Answer("Q7156", "FC Barcelona"),
              most_recent=Answer("Q7156", "FC Barcelona")),
        Query(id="Q1_P6_2019", relation="P6", subject_id="Q1", year=2019,
              query="_X_ is the head of the government of Köln.",
              answers=(Answer("Q10", "Henriette Reker"), Answer("Q11", "東京 Person")),
              most_frequent=Answer("Q10", "Henriette Reker"), most_recent=None),
        Query(id="Q2_P108_2005", relation="P108", subject_id="Q2", year=2005, query="Ann works for _X_.",
              answers=(Answer("Q3", "Acme"),)),
    ]
    path = str(tmp_path / "out.jsonl")
    n = write_queries(path, queries, extra={"Q2_P108_2005": {"split": "test"}})
    assert n == 3
    assert not os.path.exists(path + ".tmp")
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    assert len(lines) == 3
    assert json.loads(lines[0]) == queries[0].to_json()
    assert json.loads(lines[2]) == dict(queries[2].to_json(), split="test")
    assert "東京" in lines[1]  # written as UTF-8, not \u escapes
    reader = TemplamaReader(path)
    assert list(reader) == queries
    assert (reader.read, reader.skipped) == (3, 0)


def test_templama_round_trip_of_generated_queries(tmp_path):
    queries = queries_from_facts(TRANSITION_FACTS, NAMES, 2010, 2018)
    path = str(tmp_path / "gen.jsonl.gz")
    with open_text(path, "wb") as f:
        for q in queries:
            f.write((json.dumps(q.to_json()) + "\n").encode("utf-8"))
    assert list(TemplamaReader(path)) == queries


TL_BAD = [
    pytest.param(tl_line(query="Lionel Messi plays for ___."), ("no _X_ placeholder",), id="no-placeholder"),
    pytest.param(tl_line(answer=[]), ("empty answer list",), id="empty-answers"),
    pytest.param(tl_line(answer="FC Barcelona"), ("field 'answer' must be list or dict",), id="answer-str"),
    pytest.param(tl_line(answer=[{"wikidata_id": "Q1"}]), ("answer must be an object with 'wikidata_id' and 'name'",),
                 id="answer-no-name"),
    pytest.param(tl_line(answer=["FC Barcelona"]), ("answer must be an object",), id="answer-item-str"),
    pytest.param(tl_line(answer=[{"wikidata_id": "Q1", "name": "  "}]), ("empty name in answer",), id="blank-name"),
    pytest.param(tl_line(most_frequent_answer="x"), ("most_frequent_answer must be an object",), id="bad-mf"),
    pytest.param(tl_line(most_recent_answer={"wikidata_id": "Q1", "name": ""}), ("empty name in most_recent_answer",),
                 id="bad-mr"),
    pytest.param(tl_line(date="20x0"), ("unparsable date", "expected a year"), id="bad-year"),
    pytest.param(tl_line(date="2010-01-01"), ("unparsable date",), id="full-date"),
    pytest.param(tl_line(date="1850"), ("year 1850 out of range 1900..2100",), id="early-year"),
    pytest.param(tl_line(date="2150"), ("year 2150 out of range",), id="late-year"),
    pytest.param(tl_line(date=None), ("missing field 'date'",), id="null-date"),
    pytest.param(tl_line(date=[2010]), ("field 'date' must be str or int",), id="list-date"),
    pytest.param(json.dumps({k: v for k, v in tl_obj().items() if k != "id"}), ("missing field 'id'",), id="no-id"),
    pytest.param(json.dumps({k: v for k, v in tl_obj().items() if k != "query"}), ("missing field 'query'",),
                 id="no-query"),
    pytest.param(json.dumps({k: v for k, v in tl_obj().items() if k != "answer"}), ("missing field 'answer'",),
                 id="no-answer"),
    pytest.param(json.dumps({k: v for k, v in tl_obj(id="Q615").items() if k != "relation"}),
                 ("missing field 'relation'",), id="no-relation"),
    pytest.param("{", ("malformed JSON",), id="bad-json"),
    pytest.param("[]", ("expected a JSON object",), id="array"),
    pytest.param(b"\xff\xfe", ("invalid UTF-8",), id="raw-bytes"),
]


@pytest.mark.parametrize("bad, words", TL_BAD)
def test_templama_bad_line_raises(tmp_path, bad, words):
    path = write_lines(tmp_path / "templama.jsonl", [tl_line(), tl_line(), bad, tl_line()])
    with pytest.raises(DataError) as excinfo:
        list(TemplamaReader(path))
    assert_line_error(excinfo, path, 3, *words)


def test_templama_skip_mode(tmp_path):
    path = write_lines(tmp_path / "templama.jsonl", [
        tl_line(id="Q1_P54_2010"), tl_line(answer=[]), tl_line(query="no slot"),
        tl_line(id="Q2_P54_2011", date="2011")])
    reader = TemplamaReader(path, on_error="skip")
    assert [(q.id, q.year) for q in reader] == [("Q1_P54_2010", 2010), ("Q2_P54_2011", 2011)]
    assert (reader.read, reader.skipped) == (2, 2)
    assert reader.first_errors == [f"{path}:2: empty answer list", f"{path}:3: query has no _X_ placeholder"]


# ----------------------------------------------------------------------------------------------------------------------
# files: missing, truncated, corrupt


@pytest.mark.parametrize("reader_cls", [JsonlReader, WmtDocsReader, ArxivReader, TemplamaReader])
@pytest.mark.parametrize("name", ["missing.jsonl", "missing.jsonl.gz", "missing.bz2"])
def test_missing_file(tmp_path, reader_cls, name):
    path = str(tmp_path / name)
    with pytest.raises(DataError) as excinfo:
        list(reader_cls(path, on_error="skip"))
    assert str(excinfo.value) == f"{path}: no such file"
    assert (excinfo.value.path, excinfo.value.line) == (path, None)


def test_missing_file_auto_format(tmp_path):
    path = str(tmp_path / "nothing.jsonl")
    with pytest.raises(DataError, match=f"^{path}: no such file$"):
        read_documents(path)


def _many_docs(n=300):
    return [jdoc(f"d{i}", text=f"document number {i} " * 5) for i in range(n)]


@pytest.mark.parametrize("on_error", ["raise", "skip"])
@pytest.mark.parametrize("suffix", [".gz", ".bz2"])
def test_truncated_compressed_file(tmp_path, suffix, on_error):
    path = write_lines(tmp_path / f"docs.jsonl{suffix}", _many_docs())
    truncate(path, os.path.getsize(path) - 6)
    reader = JsonlReader(path, on_error=on_error)
    seen = []
    with pytest.raises(DataError) as excinfo:
        for doc in reader:
            seen.append(doc)
    err = excinfo.value
    assert str(err).startswith(f"{path}: corrupt or truncated file after line ")
    assert (err.path, err.line) == (path, None)
    # every line decoded before the damage was a whole, correct document
    assert [d.id for d in seen] == [f"d{i}" for i in range(len(seen))]
    assert str(err).startswith(f"{path}: corrupt or truncated file after line {len(seen)}:")


def test_truncated_gzip_mid_stream(tmp_path):
    path = write_lines(tmp_path / "docs.jsonl.gz", _many_docs())
    truncate(path, os.path.getsize(path) // 2)
    with pytest.raises(DataError, match="corrupt or truncated file") as excinfo:
        list(JsonlReader(path))
    assert excinfo.value.path == path


@pytest.mark.parametrize("reader_cls", [WmtDocsReader, TemplamaReader])
def test_truncated_gzip_other_readers(tmp_path, reader_cls):
    line = GOOD_WMT if reader_cls is WmtDocsReader else tl_line()
    path = write_lines(tmp_path / "data.gz", [line] * 200)
    truncate(path, os.path.getsize(path) - 3)
    with pytest.raises(DataError) as excinfo:
        list(reader_cls(path))
    assert str(excinfo.value).startswith(f"{path}: corrupt or truncated file")


def test_not_actually_gzip(tmp_path):
    path = str(tmp_path / "docs.jsonl.gz")
    with open(path, "wb") as f:
        f.write(jdoc("a").encode() + b"\n")
    with pytest.raises(DataError) as excinfo:
        list(JsonlReader(path))
    assert str(excinfo.value).startswith(f"{path}: corrupt or truncated file after line 0:")


def _long_first_line_gz(tmp_path) -> str:
    rnd = random.Random(0)
    text = "".join(rnd.choice(string.ascii_letters) for _ in range(100_000))  # poorly compressible
    path = write_lines(tmp_path / "big.jsonl.gz", [jdoc("a", text=text)])
    truncate(path, os.path.getsize(path) // 2)  # the first line is itself cut
    return path


# Format detection on a damaged gzip: a DataError naming the file, as the readers give.
@pytest.mark.parametrize("kind", ["truncated", "not-gzip"])
def test_auto_format_on_corrupt_gzip_is_data_error(tmp_path, kind):
    if kind == "truncated":
        path = _long_first_line_gz(tmp_path)
    else:
        path = str(tmp_path / "docs.jsonl.gz")
        with open(path, "wb") as f:
            f.write(jdoc("a").encode() + b"\n")
    with pytest.raises(DataError) as excinfo:
        list(read_documents(path))
    assert excinfo.value.path == path


def test_explicit_format_on_long_truncated_gzip_is_data_error(tmp_path):
    path = _long_first_line_gz(tmp_path)
    with pytest.raises(DataError) as excinfo:
        list(read_documents(path, format="jsonl"))
    assert str(excinfo.value).startswith(f"{path}: corrupt or truncated file after line 0:")


# ----------------------------------------------------------------------------------------------------------------------
# read_documents / detect_format


def test_read_documents_auto_detects_formats(tmp_path):
    wmt, wmt_text, wmt_id = wmt_line("20140305", ["Hello.", "World."], "Hello. World.")
    wmt_path = write_lines(tmp_path / "news-docs.2014.en.filtered.gz", [wmt])
    arxiv_path = write_lines(tmp_path / "snapshot.json", ["", arxiv_line("0704.0002", "Abs  tract.")])
    jsonl_path = write_lines(tmp_path / "corpus.jsonl.bz2", [jdoc("j1")])

    reader = read_documents(wmt_path)
    assert type(reader) is WmtDocsReader
    assert list(reader) == [Document(wmt_id, D(2014, 3, 5), wmt_text, "wmt")]

    reader = read_documents(arxiv_path)
    assert type(reader) is ArxivReader
    assert list(reader) == [Document("0704.0002", D(2007, 4, 2), "Abs tract.", "arxiv")]

    reader = read_documents(jsonl_path)
    assert type(reader) is JsonlReader
    assert list(reader) == [Document("j1", D(2014, 1, 1), "some text", "jsonl")]


def test_detect_format_rules(tmp_path):
    # the name wins: even JSON content in a news-docs file is read as WMT
    assert detect_format(write_lines(tmp_path / "news-docs.2019.de.filtered", [jdoc("a")])) == "wmt"
    # without the name, a first line with two tabs that is not JSON is WMT
    assert detect_format(write_lines(tmp_path / "wmt.tsv", [GOOD_WMT])) == "wmt"
    # arxiv needs both fields
    assert detect_format(write_lines(tmp_path / "a.json", [json.dumps({"abstract": "x", "versions": []})])) == "arxiv"
    assert detect_format(write_lines(tmp_path / "b.json", [json.dumps({"abstract": "x", "text": "y"})])) == "jsonl"
    assert detect_format(write_lines(tmp_path / "c.json", ["not json either"])) == "jsonl"
    assert detect_format(write_lines(tmp_path / "d.jsonl", [b"\xff\xfe"])) == "jsonl"
    assert detect_format(write_lines(tmp_path / "e.jsonl", [])) == "jsonl"


def test_read_documents_explicit_format_and_kwargs(tmp_path):
    path = write_lines(tmp_path / "news-docs.jsonl", [jdoc("a", date="1850-01-01"), "{bad"])
    reader = read_documents(path, format="jsonl", on_error="skip", min_date=D(1800, 1, 1))
    assert type(reader) is JsonlReader
    assert list(reader) == [Document("a", D(1850, 1, 1), "some text", "jsonl")]
    assert (reader.read, reader.skipped) == (1, 1)
    with pytest.raises(ValueError, match="unknown corpus format 'xml'"):
        read_documents(path, format="xml")
    assert set(readers.FORMATS) == {"jsonl", "wmt", "arxiv", "csv", "tsv", "text"}


def test_a_csv_or_tsv_table_as_spreadsheets_write_it(tmp_path):
    """A header naming id, date and text in any order and case (other columns ignored); quoted fields with commas,
    quotes and line breaks; a byte-order mark; found by the header or by the name, gzipped too."""
    path = tmp_path / "news.csv"
    path.write_bytes("\ufeffTitle,Date,ID,Text\r\n"
                     '"Storm, again",2014-03-07,n1,"Heavy rain fell.\nRoads closed, ""officials"" said."\r\n'
                     "Markets,20150102,n2,Stocks rose.\r\n"
                     "\r\n".encode("utf-8"))
    assert detect_format(str(path)) == "csv"
    docs = list(read_documents(str(path)))
    assert docs == [Document("n1", D(2014, 3, 7), 'Heavy rain fell.\nRoads closed, "officials" said.', "csv"),
                    Document("n2", D(2015, 1, 2), "Stocks rose.", "csv")]
    tsv = tmp_path / "news.tsv.gz"
    with gzip.open(tsv, "wt", encoding="utf-8") as f:
        f.write("id\tdate\ttext\nt1\t2016-05-01\tA storm hit.\n")
    assert detect_format(str(tsv)) == "tsv"
    assert list(read_documents(str(tsv))) == [Document("t1", D(2016, 5, 1), "A storm hit.", "tsv")]
    # Found by its header alone, whatever the name.
    plain = tmp_path / "export.txt"
    plain.write_text("id,date,text\na,2014-01-01,x\n")
    assert detect_format(str(plain)) == "csv"


def test_bad_csv_rows_name_the_file_and_line(tmp_path, capsys):
    path = tmp_path / "news.csv"
    path.write_text("id,date,text\n"
                    "a,2014-01-01,fine\n"
                    'b,2014-01-02,"two\nlines"\n'
                    "c,not a date,x\n"
                    "d,2014-01-04\n"
                    ",2014-01-05,no id\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"news.csv:5: unparsable date 'not a date'"):
        list(read_documents(str(path)))
    reader = read_documents(str(path), on_error="skip")
    assert [d.id for d in reader] == ["a", "b"] and (reader.read, reader.skipped) == (2, 3)
    err = capsys.readouterr().err
    assert "news.csv: skipped 3 bad row(s) of 5" in err
    assert "news.csv:6: expected 3 fields as the header, got 2" in err and "news.csv:7: empty id" in err
    headless = tmp_path / "headless.csv"
    headless.write_text("doc,published,body\na,2014-01-01,x\n")
    with pytest.raises(DataError, match=r"headless.csv:1: the header names no 'id', 'date', 'text' column: a CSV "
                                        r"corpus has a header row with columns id, date and text \(found 'doc', "
                                        r"'published', 'body'\)"):
        list(read_documents(str(headless)))


def test_a_folder_of_text_files_dated_by_name_or_by_its_sidecar(tmp_path):
    folder = tmp_path / "articles"
    os.makedirs(folder / "2015")
    (folder / "2014-03-07-storm.txt").write_text("A storm hit the coast.\n", encoding="utf-8")
    (folder / "2015" / "20150102_markets.txt").write_text("Stocks rose.", encoding="utf-8")
    (folder / "budget.txt").write_text("\ufeffThe budget passed.", encoding="utf-8")
    (folder / "notes.md").write_text("not an article")
    (folder / "dates.tsv").write_text("budget.txt\t2016-06-30\n")
    assert detect_format(str(folder)) == "text"
    assert list(read_documents(str(folder))) == [
        Document("2014-03-07-storm", D(2014, 3, 7), "A storm hit the coast.", "text"),
        Document("2015/20150102_markets", D(2015, 1, 2), "Stocks rose.", "text"),
        Document("budget", D(2016, 6, 30), "The budget passed.", "text")]
    (folder / "dates.tsv").unlink()
    with pytest.raises(DataError, match=r"budget.txt: no date: its name has none .* dates.tsv does not list it"):
        list(read_documents(str(folder)))
    os.makedirs(tmp_path / "empty")
    with pytest.raises(DataError, match=r"empty: a folder of text files holds no .txt file"):
        list(read_documents(str(tmp_path / "empty")))


def test_a_file_in_no_format_templm_reads_says_so_and_lists_the_formats(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("Heavy rain fell over the city.\nRoads closed.\n")
    with pytest.raises(DataError, match=r"notes.txt: not a corpus format templm reads: its first line is "
                                        r"b'Heavy rain fell.*CSV or TSV with a header row naming id, date and text"):
        list(read_documents(str(path)))


def test_read_documents_accepts_pathlike(tmp_path):
    path = pathlib.Path(write_lines(tmp_path / "docs.jsonl", [jdoc("a")]))
    assert list(read_documents(path)) == [Document("a", D(2014, 1, 1), "some text", "jsonl")]


def test_reader_accepts_pathlike(tmp_path):
    path = pathlib.Path(write_lines(tmp_path / "docs.jsonl.gz", [jdoc("a")]))
    assert list(JsonlReader(path)) == [Document("a", D(2014, 1, 1), "some text", "jsonl")]


# ----------------------------------------------------------------------------------------------------------------------
# templama: queries from facts


NAMES = {
    "Q1": "Lionel", "Q2": "Ann", "Q3": "Chelsea",
    "QA": "Club A", "QB": "Club B", "QC": "Club C", "QD": "Club D",
}

# Q1 plays for A (mid-2008 .. Jan 2012), B (Feb 2012 .. Jun 2015), then C (Jul 2015 .. open).
TRANSITION_FACTS = [
    Fact("Q1", "P54", "QA", D(2008, 7, 1), D(2012, 1, 31)),
    Fact("Q1", "P54", "QB", D(2012, 2, 1), D(2015, 6, 30)),
    Fact("Q1", "P54", "QC", D(2015, 7, 1), None),
]


def ans(*ids):
    return tuple(Answer(i, NAMES[i]) for i in ids)


def test_fact_covers_and_valid_on():
    f = Fact("Q1", "P54", "QA", D(2005, 3, 1), D(2012, 6, 30))
    assert list(f.covers(2010, 2020)) == [2010, 2011, 2012]
    assert list(f.covers(2000, 2008)) == [2005, 2006, 2007, 2008]
    assert list(f.covers(2013, 2020)) == []
    open_both = Fact("Q1", "P54", "QA", None, None)
    assert list(open_both.covers(2010, 2013)) == [2010, 2011, 2012, 2013]
    assert f.valid_on(D(2005, 3, 1)) and f.valid_on(D(2012, 6, 30))
    assert not f.valid_on(D(2005, 2, 28)) and not f.valid_on(D(2012, 7, 1))
    assert open_both.valid_on(D(1, 1, 1))


def test_transitions_give_multi_answer_years():
    queries = queries_for_subject(TRANSITION_FACTS, NAMES, 2010, 2018)
    assert [(q.year, q.answers) for q in queries] == [
        (2010, ans("QA")),
        (2011, ans("QA")),
        (2012, ans("QA", "QB")),
        (2013, ans("QB")),
        (2014, ans("QB")),
        (2015, ans("QB", "QC")),
        (2016, ans("QC")),
        (2017, ans("QC")),
        (2018, ans("QC")),
    ]
    assert [q.id for q in queries] == [f"Q1_P54_{y}" for y in range(2010, 2019)]
    assert {q.query for q in queries} == {"Lionel plays for _X_."}
    assert {(q.relation, q.subject_id) for q in queries} == {("P54", "Q1")}
    # A covers 3 years, B 4 (2012-2015), C 4 (2015-2018): B and C tie, B's fact is earlier.
    assert {q.most_frequent for q in queries} == {Answer("QB", "Club B")}
    # C is the object valid in the last covered year.
    assert {q.most_recent for q in queries} == {Answer("QC", "Club C")}


def test_fact_order_does_not_matter():
    expected = queries_for_subject(TRANSITION_FACTS, NAMES, 2010, 2018)
    for seed in range(5):
        shuffled = list(TRANSITION_FACTS)
        random.Random(seed).shuffle(shuffled)
        assert queries_for_subject(shuffled, NAMES, 2010, 2018) == expected


def test_open_start_and_end_are_clipped():
    facts = [Fact("Q1", "P54", "QA", None, D(2011, 5, 1)), Fact("Q1", "P54", "QB", D(2013, 1, 1), None)]
    queries = queries_for_subject(facts, NAMES, 2009, 2014)
    assert [(q.year, q.answer_names) for q in queries] == [
        (2009, ("Club A",)), (2010, ("Club A",)), (2011, ("Club A",)), (2013, ("Club B",)), (2014, ("Club B",))]
    # A: 3 years, B: 2 years
    assert queries[0].most_frequent == Answer("QA", "Club A")
    assert queries[0].most_recent == Answer("QB", "Club B")


def test_window_clips_both_sides():
    facts = [Fact("Q1", "P54", "QA", D(1990, 1, 1), D(2030, 1, 1))]
    queries = queries_for_subject(facts, NAMES, 2010, 2012)
    assert [q.id for q in queries] == ["Q1_P54_2010", "Q1_P54_2011", "Q1_P54_2012"]
    assert all(q.answers == ans("QA") and q.most_frequent == q.most_recent == Answer("QA", "Club A") for q in queries)


def test_facts_outside_window_give_nothing():
    assert queries_for_subject([], NAMES, 2010, 2020) == []
    facts = [Fact("Q1", "P54", "QA", D(2001, 1, 1), D(2005, 1, 1))]
    assert queries_for_subject(facts, NAMES, 2010, 2020) == []


def test_most_frequent_tie_goes_to_earliest_fact():
    # A (2010-2012) and B (2013-2015) both cover 3 years; B is listed first but A's fact starts earlier.
    facts = [Fact("Q1", "P54", "QB", D(2013, 1, 1), D(2015, 12, 31)),
             Fact("Q1", "P54", "QA", D(2010, 1, 1), D(2012, 12, 31))]
    queries = queries_for_subject(facts, NAMES, 2010, 2015)
    assert {q.most_frequent for q in queries} == {Answer("QA", "Club A")}
    assert {q.most_recent for q in queries} == {Answer("QB", "Club B")}


def test_most_frequent_counts_years_not_facts():
    # A has two stints (2010-2011, 2015-2016: 4 years), B one long one (2012-2014: 3 years) that overlaps nothing.
    facts = [Fact("Q1", "P54", "QA", D(2010, 1, 1), D(2011, 12, 31)),
             Fact("Q1", "P54", "QB", D(2012, 1, 1), D(2014, 12, 31)),
             Fact("Q1", "P54", "QA", D(2015, 1, 1), D(2016, 12, 31)),
             Fact("Q1", "P54", "QA", D(2016, 3, 1), D(2016, 9, 1))]  # duplicate cover of 2016
    queries = queries_for_subject(facts, NAMES, 2010, 2016)
    assert [(q.year, q.answer_names) for q in queries] == [
        (2010, ("Club A",)), (2011, ("Club A",)), (2012, ("Club B",)), (2013, ("Club B",)), (2014, ("Club B",)),
        (2015, ("Club A",)), (2016, ("Club A",))]
    assert queries[0].most_frequent == Answer("QA", "Club A")
    assert queries[0].most_recent == Answer("QA", "Club A")


def test_most_recent_is_latest_starting_object_of_last_year():
    # Both A and B are valid through the last year; B started later.
    facts = [Fact("Q1", "P54", "QB", D(2015, 1, 1), None), Fact("Q1", "P54", "QA", D(2010, 1, 1), None)]
    queries = queries_for_subject(facts, NAMES, 2010, 2016)
    assert queries[-1].answers == ans("QA", "QB")
    assert queries[0].most_recent == Answer("QB", "Club B")
    assert queries[0].most_frequent == Answer("QA", "Club A")


def test_template_override_and_head_coach_template():
    facts = [Fact("Q3", "P286", "QD", D(2016, 7, 1), D(2018, 7, 13))]
    queries = queries_for_subject(facts, NAMES, 2010, 2020)
    assert [q.id for q in queries] == ["Q3_P286_2016", "Q3_P286_2017", "Q3_P286_2018"]
    assert queries[0].query == "_X_ is the head coach of Chelsea."
    custom = queries_for_subject(facts, NAMES, 2010, 2020, template="Coach of <subject>: _X_")
    assert custom[0].query == "Coach of Chelsea: _X_"


def test_queries_for_subject_rejects_mixed_groups():
    with pytest.raises(ValueError, match="one subject and one relation"):
        queries_for_subject([Fact("Q1", "P54", "QA", None, None), Fact("Q2", "P54", "QA", None, None)], NAMES, 2010,
                            2011)
    with pytest.raises(ValueError, match="one subject and one relation"):
        queries_for_subject([Fact("Q1", "P54", "QA", None, None), Fact("Q1", "P108", "QA", None, None)], NAMES, 2010,
                            2011)


def test_templates_table():
    assert set(TEMPLATES) == {"P54", "P39", "P108", "P102", "P286", "P69", "P488", "P6", "P127"}
    assert all(t.count("_X_") == 1 and t.count("<subject>") == 1 for t in TEMPLATES.values())


def test_queries_from_facts_groups_and_orders():
    facts = [
        Fact("Q2", "P54", "QC", D(2011, 1, 1), D(2011, 12, 31)),
        Fact("Q1", "P108", "QD", D(2010, 6, 1), D(2011, 6, 1)),
        *TRANSITION_FACTS,
        Fact("Q2", "P108", "QA", None, D(2010, 2, 1)),
    ]
    queries = queries_from_facts(facts, NAMES, 2010, 2012)
    # sorted by relation ("P108" < "P54" as strings), then subject, then year
    assert [q.id for q in queries] == [
        "Q1_P108_2010", "Q1_P108_2011", "Q2_P108_2010",
        "Q1_P54_2010", "Q1_P54_2011", "Q1_P54_2012", "Q2_P54_2011",
    ]
    by_id = {q.id: q for q in queries}
    assert by_id["Q1_P108_2010"].query == "Lionel works for _X_."
    assert by_id["Q2_P54_2011"].query == "Ann plays for _X_."
    assert by_id["Q1_P54_2012"].answers == ans("QA", "QB")
    # most_frequent / most_recent are per (subject, relation) and clipped to the window
    assert by_id["Q1_P54_2012"].most_frequent == Answer("QA", "Club A")  # A: 2010-2012, B: 2012 only
    assert by_id["Q1_P54_2012"].most_recent == Answer("QB", "Club B")
    assert by_id["Q2_P108_2010"].most_recent == Answer("QA", "Club A")
    assert queries_from_facts([], NAMES, 2010, 2012) == []


def test_queries_from_facts_custom_templates():
    facts = [Fact("Q1", "P99", "QA", D(2010, 1, 1), D(2010, 12, 31))]
    (q,) = queries_from_facts(facts, NAMES, 2010, 2012, templates={"P99": "<subject> likes _X_."})
    assert (q.id, q.query, q.relation) == ("Q1_P99_2010", "Lionel likes _X_.", "P99")


# ----------------------------------------------------------------------------------------------------------------------
# templama: splits


def _queries_for_subjects(n_subjects: int, per_subject: int = 2):
    return [
        Query(id=f"S{s}_P54_{2010 + k}", relation="P54", subject_id=f"S{s}", year=2010 + k, query="x plays for _X_.",
              answers=(Answer("Q1", "A"),))
        for s in range(n_subjects) for k in range(per_subject)
    ]


@pytest.mark.parametrize("n", [0, 1, 7, 10, 25, 40])
def test_split_by_subject_sizes_and_disjoint(n):
    queries = _queries_for_subjects(n)
    splits = split_by_subject(queries, seed=3)
    assert list(splits) == list(SPLITS) == ["train", "val", "test"]
    subjects = {name: {q.subject_id for q in qs} for name, qs in splits.items()}
    n_train, n_val = round(n * 0.2), round(n * 0.1)
    assert len(subjects["train"]) == n_train
    assert len(subjects["val"]) == n_val
    assert len(subjects["test"]) == n - n_train - n_val
    assert not subjects["train"] & subjects["val"]
    assert not subjects["train"] & subjects["test"]
    assert not subjects["val"] & subjects["test"]
    # every query lands in exactly one split, input order kept within a split
    assert sorted(q.id for qs in splits.values() for q in qs) == sorted(q.id for q in queries)
    for qs in splits.values():
        assert qs == [q for q in queries if q.subject_id in {x.subject_id for x in qs}]


def test_split_by_subject_deterministic_and_seeded():
    queries = _queries_for_subjects(30)
    a = split_by_subject(queries, seed=7)
    b = split_by_subject(list(reversed(queries)), seed=7)
    subj = lambda s: {name: sorted({q.subject_id for q in qs}) for name, qs in s.items()}  # noqa: E731
    assert subj(a) == subj(b)  # depends on the subject set and the seed, not on input order
    assert subj(split_by_subject(queries, seed=7)) == subj(a)
    others = [subj(split_by_subject(queries, seed=s)) for s in range(8, 12)]
    assert any(o != subj(a) for o in others)


def test_split_by_subject_custom_fractions():
    queries = _queries_for_subjects(10, per_subject=1)
    splits = split_by_subject(queries, seed=0, fractions=(0.5, 0.3, 0.2))
    assert [len(splits[name]) for name in SPLITS] == [5, 3, 2]


# ----------------------------------------------------------------------------------------------------------------------
# templama: write_queries


def test_write_queries_replaces_atomically(tmp_path):
    path = str(tmp_path / "q.jsonl")
    with open(path, "w") as f:
        f.write("old content\n")
    assert write_queries(path, []) == 0
    assert open(path).read() == ""
    assert os.listdir(tmp_path) == ["q.jsonl"]


def test_write_queries_leaves_nothing_on_failure(tmp_path):
    path = str(tmp_path / "q.jsonl")
    good = queries_for_subject(TRANSITION_FACTS, NAMES, 2010, 2012)

    def gen():
        yield from good
        raise RuntimeError("source failed")

    with pytest.raises(RuntimeError):
        write_queries(path, gen())
    assert not os.path.exists(path)
    assert os.listdir(tmp_path) == []


def test_a_file_the_system_cannot_read_is_its_error_not_corrupt_data():
    """A read the system refuses (here an I/O error: /proc/self/mem at offset 0) was called "corrupt or truncated";
    it is the OSError it is, naming the file, so the command line exits with the system's status (4 for EIO)."""
    import errno

    for read in (detect_format, lambda p: list(JsonlReader(p))):
        with pytest.raises(OSError) as excinfo:
            read("/proc/self/mem")
        assert not isinstance(excinfo.value, DataError)
        assert excinfo.value.errno == errno.EIO and excinfo.value.filename == "/proc/self/mem"


def test_a_line_longer_than_the_limit_is_dropped_without_being_held(tmp_path):
    """A gzip whose one "line" decompresses to gigabytes was read whole into memory. A line over the reader's limit
    (MAX_LINE_BYTES, 256 MiB; here 1,000 bytes) is read through in pieces and dropped: with on_error=skip the lines
    around it are read, by default it is refused naming its line."""
    path = tmp_path / "bomb.jsonl.gz"
    with gzip.open(path, "wb") as f:
        f.write((jdoc("a") + "\n").encode())
        f.write(b"x" * 50_000 + b"\n")  # 50 KB on one line, a few dozen bytes compressed
        f.write((jdoc("b") + "\n").encode())
    reader = JsonlReader(str(path), on_error="skip", max_line_bytes=1000)
    assert [d.id for d in reader] == ["a", "b"] and reader.skipped == 1
    assert reader.first_errors[0].startswith(f"{path}:2: a line longer than 1,000 bytes: not read")
    with pytest.raises(DataError, match=r":2: a line longer than 1,000 bytes"):
        list(JsonlReader(str(path), max_line_bytes=1000))
    default = JsonlReader(str(path), on_error="skip")  # 50 KB is within the default limit: read, then bad JSON
    assert [d.id for d in default] == ["a", "b"] and "malformed JSON" in default.first_errors[0]


@pytest.mark.parametrize("opener", [gzip.open, bz2.open], ids=["gz", "bz2"])
def test_a_compression_bomb_is_refused_naming_the_file_before_it_is_read_through(tmp_path, monkeypatch, opener):
    """A small compressed file that decompresses to gigabytes of short lines passes the line limit and was read
    through (hours, and the verb's output as large). Past readers.MIN_BOMB_BYTES decompressed (here 1 MiB instead
    of 64), a file giving more than MAX_RATIO (200) bytes for each byte read of it is refused, naming it; the
    world's own news, compressed, is read whole under the same limits."""
    monkeypatch.setattr(readers, "MIN_BOMB_BYTES", 1 << 20)
    suffix = ".gz" if opener is gzip.open else ".bz2"
    bomb = tmp_path / f"bomb.jsonl{suffix}"
    with opener(bomb, "wb") as f:
        for i in range(40):  # 40 documents of 100 KB of one letter: 4 MB from a few kilobytes
            f.write((json.dumps({"id": f"d{i}", "date": "2014-01-01", "text": "a" * 100_000}) + "\n").encode())
    reader = JsonlReader(str(bomb), on_error="skip")
    with pytest.raises(DataError, match=r"decompresses to more than 200 times its size .*compression bomb") as e:
        list(reader)
    assert e.value.path == str(bomb) and 10 <= reader.read < 40  # stopped after the first MiB, not at the end
    news = tmp_path / f"news.jsonl{suffix}"
    words = ["the", "court", "ruled", "on", "Monday", "that", "minister", "Alba", "resigned", "in", "March"]
    rng = random.Random(0)
    lines = [json.dumps({"id": f"n{i}", "date": f"2014-01-{1 + i % 28:02d}",
                         "text": " ".join(rng.choice(words) for _ in range(400))}) for i in range(1000)]
    with opener(news, "wb") as f:
        f.write(("\n".join(lines) + "\n").encode())
    assert os.path.getsize(news) * 200 > len("\n".join(lines))  # ordinary text: compressed a few times
    assert [d.id for d in JsonlReader(str(news))] == [f"n{i}" for i in range(1000)]


def test_a_first_line_over_the_limit_is_refused_when_the_format_is_detected(tmp_path, monkeypatch):
    """Detecting a corpus's format read its first line whole, however long (a gzip of a 3 GB "line" held in
    memory before any reader's limit applied). Iterating a file opened by readers.open_text holds each line to
    MAX_LINE_BYTES (here 1,000) and names the line that is over it."""
    monkeypatch.setattr(readers, "MAX_LINE_BYTES", 1000)
    path = tmp_path / "news.jsonl.gz"
    with gzip.open(path, "wb") as f:
        f.write(b"\n" + b"x" * 50_000 + b"\n" + (jdoc("a") + "\n").encode())
    with pytest.raises(DataError) as e:
        detect_format(str(path))
    assert str(e.value) == f"{path}:2: a line longer than 1,000 bytes: not read"
