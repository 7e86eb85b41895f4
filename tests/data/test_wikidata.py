"""TempLAMA rebuilt from a Wikidata JSON dump: every rule, checked on the hand-made dump tests/data/wikidata_dump.json.

The dump (one entity a line, as `latest-all.json` writes it) holds, per line:
  2 Q104 Northern Stars    object, listed BEFORE the subject naming it (found by the label-only second pass)
  3 Q100 Red Lions FC      a club (object of P54) that is also a subject: P286 head coaches Q300 -> Q301
  4 Q1   Alice Archer      P54 Q100, Q101, Q100 again, Q102, Q105 (no enwiki); one statement ends in 2005
  5 Q2   Bruno Bianchi     P54 Q101 x3 (two overlap: merged; then a gap in 2013), Q104, Q103 (no English label),
                           Q106 (not in the dump)
  6 Q4   Dana Dorsey       P54 Q100 with a decade-precision start (ignored: starts at start_year), Q101
  7 Q12  Emil Eriksen      P54 Q100, Q102; same popularity as Dana, higher id: cut by max_subjects=4
  8 Q16  Nils Norden       P54 Q102, Q104; sitelinks but no enwiki
  9 Q6   (fr label only)   no English label
 10 Q9   Oscar Only        one distinct object (Q100 twice)
 11 Q10  Petra Plain       no start/end (none, a somevalue start, an invalid month 13)
 12 Q11  Quentin Outside   ends before 2010 (x2), starts after 2020, ends before it starts
 13 Q13  Rita Rough        only dates of precision 8 and 7
 14 Q14  Sam Future        one valid statement; others only dated in 2105..2199 (treated as missing)
 15 Q15  Tara Thing        one item statement; somevalue, string, property and novalue objects
 16 Q7   Hana Hart         P39, a line in the full real-dump format; no sitelinks, 3 statements
 17 Q8   Ivan Ionescu      P39; no sitelinks, 4 statements (ranks above Hana, though its id is higher)
 18-25 objects Q101 Q102 Q103(de label) Q105(svwiki only) Q200 Q201 Q300 Q301; 26 property P54
"""

import gzip
import json
import os
import shutil

import pytest

from templm.data import DataError, TemplamaReader
from templm.data import wikidata
from templm.data.wikidata import build_templama, merge_statements, parse_time

DUMP = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "wikidata_dump.json")

NAMES = {
    "Q100": "Red Lions FC", "Q101": "Blue Harbour FC", "Q102": "Green Valley United", "Q104": "Northern Stars",
    "Q105": "Lakeside Rovers", "Q200": "Mayor of Eastport", "Q201": "Governor of Westland", "Q300": "Coach Kim",
    "Q301": "Coach Lee",
}
QUERY_TEXT = {
    "Q1": "Alice Archer plays for _X_.", "Q2": "Bruno Bianchi plays for _X_.", "Q4": "Dana Dorsey plays for _X_.",
    "Q12": "Emil Eriksen plays for _X_.", "Q16": "Nils Norden plays for _X_.",
    "Q7": "Hana Hart holds the position of _X_.", "Q8": "Ivan Ionescu holds the position of _X_.",
    "Q100": "_X_ is the head coach of Red Lions FC.",
}


def span(subject, relation, first, last, answers):
    return [(f"{subject}_{relation}_{year}", answers) for year in range(first, last + 1)]


# The whole output for max_subjects=4, seed=0 (years 2010..2020), in file order.
EXPECTED = {
    "train": span("Q4", "P54", 2010, 2016, ["Q100"]) + span("Q4", "P54", 2017, 2020, ["Q101"]),
    "val": span("Q16", "P54", 2010, 2013, ["Q102"]) + span("Q16", "P54", 2014, 2020, ["Q104"]),
    "test": (
        span("Q100", "P286", 2011, 2013, ["Q300"]) + span("Q100", "P286", 2014, 2014, ["Q300", "Q301"])
        + span("Q100", "P286", 2015, 2020, ["Q301"])
        + span("Q7", "P39", 2010, 2014, ["Q200"]) + span("Q7", "P39", 2015, 2020, ["Q201"])
        + span("Q8", "P39", 2015, 2018, ["Q200"]) + span("Q8", "P39", 2019, 2019, ["Q200", "Q201"])
        + span("Q8", "P39", 2020, 2020, ["Q201"])
        + span("Q1", "P54", 2010, 2011, ["Q100"]) + span("Q1", "P54", 2012, 2012, ["Q100", "Q101"])
        + span("Q1", "P54", 2013, 2015, ["Q101"]) + span("Q1", "P54", 2016, 2018, ["Q100"])
        + span("Q1", "P54", 2019, 2019, ["Q102"]) + span("Q1", "P54", 2020, 2020, ["Q102", "Q105"])
        # Bruno: no 2013 (a gap between two Q101 spells, and Q103 has no English label)
        + span("Q2", "P54", 2010, 2012, ["Q101"]) + span("Q2", "P54", 2014, 2015, ["Q101"])
        + span("Q2", "P54", 2016, 2020, ["Q104"])
    ),
}
# (most_frequent, most_recent) per subject.
MOST = {"Q4": ("Q100", "Q101"), "Q16": ("Q104", "Q104"), "Q100": ("Q301", "Q301"), "Q7": ("Q201", "Q201"),
        "Q8": ("Q200", "Q201"), "Q1": ("Q100", "Q105"), "Q2": ("Q101", "Q104")}


def read_out(out_dir):
    return {split: list(TemplamaReader(os.path.join(out_dir, f"{split}.jsonl"))) for split in ("train", "val", "test")}


def ids_and_answers(queries):
    return [(q.id, [a.wikidata_id for a in q.answers]) for q in queries]


def entity_lines():
    with open(DUMP, encoding="utf-8") as f:
        return [line.rstrip("\n").rstrip(",") for line in f][1:-1]


def write_dump(path, lines):
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "wt", encoding="utf-8") as f:
        f.write("[\n" + ",\n".join(lines) + "\n]\n")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("wd") / "templama")
    stats = build_templama(DUMP, out, max_subjects=4, seed=0, require_enwiki=False)
    return out, stats


def test_exact_queries_answers_and_splits(built):
    out, stats = built
    assert sorted(os.listdir(out)) == ["stats.json", "test.jsonl", "train.jsonl", "val.jsonl"]
    got = read_out(out)
    for split in ("train", "val", "test"):
        assert ids_and_answers(got[split]) == EXPECTED[split], split
    for q in sum(got.values(), []):
        assert q.query == QUERY_TEXT[q.subject_id]
        assert q.relation == q.id.split("_")[1] and q.year == int(q.id.split("_")[2])
        assert [a.name for a in q.answers] == [NAMES[a.wikidata_id] for a in q.answers]
        assert (q.most_frequent.wikidata_id, q.most_recent.wikidata_id) == MOST[q.subject_id], q.id
        assert q.most_frequent.name == NAMES[q.most_frequent.wikidata_id]
    with open(os.path.join(out, "test.jsonl"), encoding="utf-8") as f:
        lines = [json.loads(line) for line in f]
    assert lines[-11] == {  # the release format, byte for byte as json
        "query": "Alice Archer plays for _X_.",
        "answer": [{"wikidata_id": "Q102", "name": "Green Valley United"},
                   {"wikidata_id": "Q105", "name": "Lakeside Rovers"}],
        "date": "2020", "id": "Q1_P54_2020",
        "most_frequent_answer": {"wikidata_id": "Q100", "name": "Red Lions FC"},
        "most_recent_answer": {"wikidata_id": "Q105", "name": "Lakeside Rovers"},
        "relation": "P54"}


def test_dropped_subjects_and_why(built):
    out, stats = built
    subjects = {q.subject_id for q in sum(read_out(out).values(), [])}
    assert subjects == {"Q1", "Q2", "Q4", "Q7", "Q8", "Q16", "Q100"}
    # Q6 no English label, Q9 one object, Q10 no start/end, Q11 outside the years, Q13 low precision,
    # Q14 years > 2100, Q15 non-item objects, Q12 cut by max_subjects; no object is a subject unless it has facts.
    for dropped in ("Q6", "Q9", "Q10", "Q11", "Q13", "Q14", "Q15", "Q12"):
        assert dropped not in subjects
    counts = {key: stats[key] for key in (
        "entities", "statements", "dropped_subject_no_label", "dropped_subject_no_enwiki", "dropped_not_item",
        "dropped_no_dates", "dropped_ends_before_start_year", "dropped_starts_after_end_year",
        "dropped_end_before_start", "statements_kept", "dropped_object_unresolved", "statements_merged",
        "dates_low_precision", "dates_after_2100", "dates_invalid", "passes", "objects_looked_up",
        "objects_found_late", "subject_relations", "subject_relations_one_object", "subject_relations_cut",
        "subjects", "queries")}
    assert counts == {
        "entities": 25, "statements": 45,
        "dropped_subject_no_label": 2,         # Q6's two statements
        "dropped_subject_no_enwiki": 0,
        "dropped_not_item": 4,                 # Q15: somevalue, string, property, novalue
        "dropped_no_dates": 7,                 # Q10 x3, Q13 x2, Q14 x2
        "dropped_ends_before_start_year": 3,   # Q1 (2001-2005), Q11 x2
        "dropped_starts_after_end_year": 1,    # Q11 (2023)
        "dropped_end_before_start": 1,         # Q11 (2015-2012)
        "statements_kept": 27,
        "dropped_object_unresolved": 2,        # Q2 -> Q103 (German label only), Q2 -> Q106 (not in the dump)
        "statements_merged": 1,                # Q2's overlapping Q101 spells
        "dates_low_precision": 4,              # Q4 x1, Q13 x3
        "dates_after_2100": 3,                 # Q14: 2150, 2105, 2199
        "dates_invalid": 1,                    # Q10: month 13
        "passes": 2, "objects_looked_up": 2, "objects_found_late": 1,  # Q104 (before Q2), Q106 (never)
        "subject_relations": 11,
        "subject_relations_one_object": 3,     # Q9, Q14, Q15
        "subject_relations_cut": 1,            # Q12
        "subjects": 7, "queries": 70,
    }
    assert stats["per_relation"]["P54"] == {"subjects": 4, "queries": 43}
    assert stats["per_relation"]["P39"] == {"subjects": 2, "queries": 17}
    assert stats["per_relation"]["P286"] == {"subjects": 1, "queries": 10}
    assert stats["splits"] == {"train": 11, "val": 11, "test": 48}
    assert stats["split_subjects"] == {"train": 1, "val": 1, "test": 5}
    with open(os.path.join(out, "stats.json"), encoding="utf-8") as f:
        assert json.load(f) == json.loads(json.dumps(stats))


def test_gz_copy_gives_the_same_files(built, tmp_path):
    out, stats = built
    gz = str(tmp_path / "latest-all.json.gz")
    with open(DUMP, "rb") as src, gzip.open(gz, "wb") as dst:
        shutil.copyfileobj(src, dst)
    out_gz = str(tmp_path / "from_gz")
    stats_gz = build_templama(gz, out_gz, max_subjects=4, seed=0, require_enwiki=False)
    for name in ("train.jsonl", "val.jsonl", "test.jsonl"):
        with open(os.path.join(out, name), "rb") as a, open(os.path.join(out_gz, name), "rb") as b:
            assert a.read() == b.read(), name
    ignore = ("dump", "seconds")
    assert {k: v for k, v in stats_gz.items() if k not in ignore} == {k: v for k, v in stats.items() if k not in ignore}


def test_objects_before_or_after_their_subjects_give_the_same_output(built, tmp_path):
    out, _ = built
    reversed_dump = str(tmp_path / "reversed.json")
    write_dump(reversed_dump, entity_lines()[::-1])  # every object now comes before the subjects naming it
    stats = build_templama(reversed_dump, str(tmp_path / "rev"), max_subjects=4, seed=0,
                           require_enwiki=False)
    assert stats["passes"] == 2 and stats["objects_found_late"] > 1
    assert read_out(str(tmp_path / "rev")) == read_out(out)


def test_one_pass_when_every_object_follows(tmp_path):
    lines = [line for line in entity_lines() if any(f'"id":"{q}"' in line[:40] for q in ("Q7", "Q8", "Q200", "Q201"))]
    assert len(lines) == 4
    dump = str(tmp_path / "politicians.json")
    write_dump(dump, lines)
    stats = build_templama(dump, str(tmp_path / "out"), relations=["P39"], require_enwiki=False)
    assert (stats["passes"], stats["objects_looked_up"], stats["queries"]) == (1, 0, 17)


def test_require_enwiki_is_the_default(tmp_path):
    """The paper keeps facts "whose subjects and objects are both entities with Wikipedia pages": so does the
    builder unless told otherwise (require_enwiki=False, `--norequire_enwiki`)."""
    out = str(tmp_path / "enwiki")
    stats = build_templama(DUMP, out, max_subjects=4, seed=0)
    queries = {q.id: q for q in sum(read_out(out).values(), [])}
    # Q16, Q7, Q8 lack an enwiki sitelink; so Q12 is no longer cut. Q105 (svwiki only) stops being an answer.
    assert {q.subject_id for q in queries.values()} == {"Q1", "Q2", "Q4", "Q12", "Q100"}
    assert stats["dropped_subject_no_enwiki"] == 6
    assert stats["dropped_object_unresolved"] == 3
    assert stats["subject_relations_cut"] == 0
    alice_2020 = queries["Q1_P54_2020"]
    assert [a.wikidata_id for a in alice_2020.answers] == ["Q102"]
    assert (alice_2020.most_frequent.wikidata_id, alice_2020.most_recent.wikidata_id) == ("Q100", "Q102")
    emil = sorted((q for q in queries.values() if q.subject_id == "Q12"), key=lambda q: q.year)
    assert ids_and_answers(emil) == (span("Q12", "P54", 2015, 2015, ["Q100"])
                                     + span("Q12", "P54", 2016, 2020, ["Q100", "Q102"]))
    assert (emil[0].most_frequent.wikidata_id, emil[0].most_recent.wikidata_id) == ("Q100", "Q102")


def test_max_subjects_ranks_by_sitelinks_then_statements_then_id(tmp_path):
    out = str(tmp_path / "top1")
    stats = build_templama(DUMP, out, max_subjects=1, require_enwiki=False)
    by_relation = {}
    for q in sum(read_out(out).values(), []):
        by_relation.setdefault(q.relation, set()).add(q.subject_id)
    # P54: Alice (3 sitelinks); P39: Hana and Ivan have none; Ivan has 4 statements to Hana's 3 (ids only break ties).
    assert by_relation == {"P54": {"Q1"}, "P39": {"Q8"}, "P286": {"Q100"}}
    assert stats["subject_relations_cut"] == 4 + 1


def test_years_and_relations(tmp_path):
    out = str(tmp_path / "p39")
    stats = build_templama(DUMP, out, start_year=2014, end_year=2016, relations=["P39"], seed=3,
                           require_enwiki=False)
    queries = sorted(sum(read_out(out).values(), []), key=lambda q: q.id)
    # Ivan's Q201 starts in 2019 (> 2016): dropped, leaving him one object.
    assert ids_and_answers(queries) == [("Q7_P39_2014", ["Q200"]), ("Q7_P39_2015", ["Q201"]),
                                        ("Q7_P39_2016", ["Q201"])]
    assert (queries[0].most_frequent.wikidata_id, queries[0].most_recent.wikidata_id) == ("Q201", "Q201")
    assert (stats["statements"], stats["dropped_starts_after_end_year"], stats["subject_relations_one_object"]) \
        == (4, 1, 1)


def test_bad_json_line_names_file_and_line_and_writes_nothing(tmp_path):
    lines = entity_lines()
    lines[1] = lines[1][:-5]  # truncated: line 3 of the file
    dump = str(tmp_path / "bad.json.gz")
    write_dump(dump, lines)
    out = tmp_path / "out"
    with pytest.raises(DataError) as e:
        build_templama(dump, str(out), require_enwiki=False)
    assert (e.value.path, e.value.line) == (dump, 3)
    assert f"{dump}:3: malformed JSON" in str(e.value)
    assert not out.exists()
    lines[1] = '{"id": "Q9", "claims": ' + "[" * 100_000 + "]" * 100_000 + "}"  # nested past Python's parser
    write_dump(dump, lines)
    with pytest.raises(DataError, match=r":3: malformed JSON: nested deeper than templm reads"):
        build_templama(dump, str(out), require_enwiki=False)
    assert not out.exists()
    # A failed rebuild leaves an earlier build as it was.
    build_templama(DUMP, str(out), max_subjects=4, require_enwiki=False)
    before = {name: (out / name).read_bytes() for name in os.listdir(out)}
    with pytest.raises(DataError):
        build_templama(dump, str(out), require_enwiki=False)
    assert {name: (out / name).read_bytes() for name in os.listdir(out)} == before


def test_other_bad_input(tmp_path):
    not_object = str(tmp_path / "list.json")
    write_dump(not_object, [entity_lines()[0], "[1, 2]"])
    with pytest.raises(DataError, match=r"list.json:3: expected an entity object"):
        build_templama(not_object, str(tmp_path / "o1"), require_enwiki=False)
    truncated = str(tmp_path / "cut.json.gz")
    with open(DUMP, "rb") as src:
        data = gzip.compress(src.read())
    with open(truncated, "wb") as f:
        f.write(data[: len(data) // 2])
    with pytest.raises(DataError, match="corrupt or truncated"):
        build_templama(truncated, str(tmp_path / "o2"), require_enwiki=False)
    with pytest.raises(DataError, match="no such file"):
        build_templama(str(tmp_path / "missing.json.bz2"), str(tmp_path / "o3"), require_enwiki=False)
    with pytest.raises(ValueError, match="P999"):
        build_templama(DUMP, str(tmp_path / "o4"), relations=["P999"], require_enwiki=False)
    with pytest.raises(ValueError, match="start_year"):
        build_templama(DUMP, str(tmp_path / "o5"), start_year=2021, end_year=2020, require_enwiki=False)
    assert not any((tmp_path / f"o{i}").exists() for i in range(1, 6))


def test_progress_is_shown_with_a_rate(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(wikidata, "PROGRESS_EVERY", 10)
    build_templama(DUMP, str(tmp_path / "out"), require_enwiki=False)
    progress = [line for line in capsys.readouterr().err.splitlines() if "lines/s" in line]
    assert any("pass 1" in m and ": 20 lines," in m for m in progress), progress


def test_parse_time():
    def both(time, precision):
        value = {"time": time, "precision": precision}
        start, s1 = parse_time(value, is_end=False)
        end, s2 = parse_time(value, is_end=True)
        assert s1 == s2
        return (start and start.isoformat(), end and end.isoformat(), s1)

    assert both("+2014-03-00T00:00:00Z", 10) == ("2014-03-01", "2014-03-31", "ok")
    assert both("+2014-03-17T00:00:00Z", 9) == ("2014-01-01", "2014-12-31", "ok")   # year precision: month ignored
    assert both("+2016-02-00T00:00:00Z", 11) == ("2016-02-01", "2016-02-29", "ok")  # day 00 unknown
    assert both("+2016-00-00T00:00:00Z", 11) == ("2016-01-01", "2016-12-31", "ok")
    assert both("+2016-07-04T00:00:00Z", 11) == ("2016-07-04", "2016-07-04", "ok")
    assert both("+2100-00-00T00:00:00Z", 9) == ("2100-01-01", "2100-12-31", "ok")
    assert both("+2101-00-00T00:00:00Z", 9) == (None, None, "after_2100")
    assert both("+2010-00-00T00:00:00Z", 8) == (None, None, "low_precision")
    assert both("+2014-02-30T00:00:00Z", 11) == (None, None, "invalid")
    assert both("2014", 9) == (None, None, "invalid")
    assert both("-0044-03-15T00:00:00Z", 11) == ("0001-01-01", "0001-12-31", "ok")


def test_merge_statements():
    import datetime as dt

    d = dt.date
    merged, merges = merge_statements([
        ("A", d(2014, 1, 1), d(2015, 12, 31)),   # gap after the first A: kept apart
        ("A", d(2010, 1, 1), d(2011, 12, 31)),
        ("A", d(2011, 6, 1), d(2012, 3, 31)),    # overlaps the second: merged
        ("B", d(2016, 1, 1), None),
        ("B", d(2017, 1, 1), d(2018, 1, 1)),     # inside an open interval: merged, end stays open
        ("A", d(2019, 1, 1), None),              # same object as before B: not consecutive, kept
    ])
    assert merged == [("A", d(2010, 1, 1), d(2012, 3, 31)), ("A", d(2014, 1, 1), d(2015, 12, 31)),
                      ("B", d(2016, 1, 1), None), ("A", d(2019, 1, 1), None)]
    assert merges == 2


@pytest.mark.parametrize("lines", [[], ["{\"type\": \"item\", \"id\": \"Q1\", \"labels\": {}, \"claims\": {}}"]])
def test_a_dump_with_no_queries_is_an_error_and_writes_nothing(tmp_path, lines):
    """An empty release used to be written (and exit 0), which looks like a result."""
    dump = str(tmp_path / "empty.json")
    write_dump(dump, lines)
    out = tmp_path / "out"
    with pytest.raises(DataError, match=r"no TempLAMA queries for 2010..2020: \d+ entities read, 0 statements") as e:
        build_templama(dump, str(out), require_enwiki=False)
    assert e.value.path == dump and "nothing was written" in str(e.value)
    assert not out.exists()
