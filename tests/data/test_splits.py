"""TIME-STRATIFIED / CONTROL splits, yearly buckets, split files and apply_split, on a synthetic JSONL corpus."""

import collections
import datetime
import gzip
import hashlib
import json
import os

import pytest

from templm.data.splits import (SPLIT_NAMES, apply_split, distance_splits, make_splits, read_split_file,
                                 yearly_buckets)
from templm.errors import DataError

D = datetime.date
CUTOFF = D(2017, 9, 30)
VAL_FIRST, VAL_LAST = D(2017, 10, 1), D(2017, 12, 31)
TEST_FIRST, TEST_LAST = D(2018, 1, 1), D(2019, 12, 31)
PER_MONTH = 50
VAL_DOCS = 40
SPARSE_MONTH = (2018, 6)  # only 10 documents: fewer than PER_MONTH, so all are taken


def _docs():
    """(date, id) of every document: 1-3 per day from 2015 to 2020, ids in an order unrelated to dates."""
    docs = []
    day, i = D(2015, 1, 1), 0
    while day <= D(2020, 12, 31):
        if (day.year, day.month) == SPARSE_MONTH:
            count = 1 if day.day <= 10 else 0
        else:
            count = 1 + day.toordinal() % 3
        for _ in range(count):
            docs.append((day, hashlib.sha1(f"doc{i}".encode()).hexdigest()[:16]))
            i += 1
        day += datetime.timedelta(days=1)
    return docs


DOCS = _docs()
DATE_OF = {doc_id: date for date, doc_id in DOCS}


def _write_corpus(path, docs):
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "wt", encoding="utf-8") as f:
        for date, doc_id in docs:
            f.write(json.dumps({"id": doc_id, "date": date.isoformat(), "text": f"text of {doc_id}"}) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return _write_corpus(tmp_path_factory.mktemp("corpus") / "news.jsonl", DOCS)


@pytest.fixture(scope="module")
def splits(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("splits")
    stats = make_splits(corpus, str(out), cutoff=CUTOFF, test_docs_per_month=PER_MONTH, validation_docs=VAL_DOCS,
                        seed=0)
    files = {name: read_split_file(os.path.join(out, f"{name}.gz")) for name in SPLIT_NAMES}
    return str(out), stats, files


def _ids(pairs):
    return {doc_id for _, doc_id in pairs}


def _month(date):
    return (date.year, date.month)


def test_files_and_stats_written_without_temporaries(splits):
    out, stats, _ = splits
    assert sorted(os.listdir(out)) == sorted([f"{n}.gz" for n in SPLIT_NAMES] + ["stats.json"])
    with open(os.path.join(out, "stats.json")) as f:
        assert json.load(f) == json.loads(json.dumps(stats))


def test_split_files_are_in_date_then_id_order_and_match_the_corpus(splits):
    _, _, files = splits
    for name, pairs in files.items():
        assert pairs == sorted(pairs), name
        assert len(_ids(pairs)) == len(pairs), name
        assert all(DATE_OF[doc_id] == date for date, doc_id in pairs), name


def test_time_stratified_train_is_everything_up_to_the_cutoff(splits):
    _, stats, files = splits
    expected = {doc_id for date, doc_id in DOCS if date <= CUTOFF}
    assert _ids(files["time_stratified_train"]) == expected
    assert max(d for d, _ in files["time_stratified_train"]) == CUTOFF
    assert stats["splits"]["time_stratified_train"] == {
        "documents": len(expected), "first_date": "2015-01-01", "last_date": "2017-09-30"}


def test_validation_is_sampled_from_the_three_months_after_the_cutoff(splits):
    _, stats, files = splits
    validation = files["time_stratified_validation"]
    assert len(validation) == VAL_DOCS
    assert all(VAL_FIRST <= d <= VAL_LAST for d, _ in validation)
    assert stats["periods"]["validation"] == {"first_date": "2017-10-01", "last_date": "2017-12-31"}


def test_test_is_sampled_per_month_over_the_24_months_after(splits):
    _, stats, files = splits
    test = files["test"]
    assert all(TEST_FIRST <= d <= TEST_LAST for d, _ in test)
    available = collections.Counter(_month(d) for d, _ in DOCS if TEST_FIRST <= d <= TEST_LAST)
    got = collections.Counter(_month(d) for d, _ in test)
    assert len(available) == 24
    assert got == {m: min(PER_MONTH, n) for m, n in available.items()}
    assert got[SPARSE_MONTH] == 10
    assert sum(got.values()) == 23 * PER_MONTH + 10 == len(test)
    assert stats["test_per_month"]["2018-06"] == 10 and stats["test_per_month"]["2019-12"] == PER_MONTH
    assert len(stats["test_per_month"]) == 24


def test_control_train_is_the_most_recent_documents_of_the_same_size(splits):
    _, stats, files = splits
    test, control_val = _ids(files["test"]), _ids(files["control_validation"])
    control_train = files["control_train"]
    assert len(control_train) == len(files["time_stratified_train"])
    assert not _ids(control_train) & test
    assert not _ids(control_train) & control_val
    # Independently: walk back from the end of the test period, skipping test and CONTROL validation documents.
    candidates = sorted((d, i) for d, i in DOCS if d <= TEST_LAST and i not in test and i not in control_val)
    assert control_train == candidates[-len(control_train):]
    assert stats["splits"]["control_train"]["last_date"] == "2019-12-31"


def test_control_validation_comes_from_the_test_period(splits):
    _, _, files = splits
    control_val = files["control_validation"]
    assert len(control_val) == len(files["time_stratified_validation"]) == VAL_DOCS
    assert all(TEST_FIRST <= d <= TEST_LAST for d, _ in control_val)
    assert not _ids(control_val) & _ids(files["test"])


def test_stats_share_of_control_train_in_the_test_period(splits):
    _, stats, files = splits
    control_train = files["control_train"]
    in_test = sum(1 for d, _ in control_train if TEST_FIRST <= d <= TEST_LAST)
    assert 0 < in_test < len(control_train)
    assert stats["control_train_test_period_documents"] == in_test
    assert stats["control_train_test_period_share"] == pytest.approx(in_test / len(control_train))
    for name, pairs in files.items():
        assert stats["splits"][name]["documents"] == len(pairs)
        assert stats["splits"][name]["first_date"] == min(d for d, _ in pairs).isoformat()
        assert stats["splits"][name]["last_date"] == max(d for d, _ in pairs).isoformat()
    assert stats["corpus_documents"] == len(DOCS) and stats["duplicates_dropped"] == 0


def test_same_seed_same_bytes_other_seed_other_sample(corpus, splits, tmp_path):
    out, _, files = splits
    kwargs = dict(cutoff=CUTOFF, test_docs_per_month=PER_MONTH, validation_docs=VAL_DOCS)
    make_splits(corpus, str(tmp_path / "again"), seed=0, **kwargs)
    for name in SPLIT_NAMES:
        with open(os.path.join(out, f"{name}.gz"), "rb") as a, open(tmp_path / "again" / f"{name}.gz", "rb") as b:
            assert a.read() == b.read(), name
    make_splits(corpus, str(tmp_path / "other"), seed=1, **kwargs)
    other = {name: read_split_file(str(tmp_path / "other" / f"{name}.gz")) for name in SPLIT_NAMES}
    assert other["test"] != files["test"]
    assert other["time_stratified_validation"] != files["time_stratified_validation"]
    assert other["time_stratified_train"] == files["time_stratified_train"]  # not sampled
    assert len(other["control_train"]) == len(files["control_train"])


def test_no_documents_before_cutoff_is_an_error_and_writes_nothing(corpus, tmp_path):
    with pytest.raises(DataError, match="cut-off 2010-01-31") as e:
        make_splits(corpus, str(tmp_path / "out"), cutoff=D(2010, 1, 31))
    assert e.value.path == corpus
    assert not (tmp_path / "out").exists() or not os.listdir(tmp_path / "out")


def test_apply_split_reports_missing_ids(splits, tmp_path, capsys):
    out, _, files = splits
    test_ids = [i for _, i in files["test"]]
    removed = set(test_ids[5:200:15])  # 13 ids
    reduced = _write_corpus(tmp_path / "reduced.jsonl.gz", [(d, i) for d, i in DOCS if i not in removed])
    documents, report = apply_split(reduced, os.path.join(out, "test.gz"))
    with pytest.raises(RuntimeError):
        report.missing  # not final before iteration
    got = [doc.id for doc in documents]
    assert set(got) == set(test_ids) - removed and len(got) == len(set(got))
    assert report.expected == len(test_ids)
    assert report.found == len(test_ids) - 13
    assert report.missing == 13
    assert report.missing_ids == [i for i in test_ids if i in removed][:10]
    assert report.date_mismatches == 0
    err = capsys.readouterr().err
    assert "warning: " in err and "13 of" in err

    documents, report = apply_split(reduced, os.path.join(out, "time_stratified_validation.gz"))
    assert sum(1 for _ in documents) == VAL_DOCS
    assert report.missing == 0 and report.missing_ids == []


def test_yearly_buckets(corpus, tmp_path):
    out = str(tmp_path)
    with open(os.path.join(out, "stats.json"), "w") as f:
        json.dump({"kept": 1}, f)
    capped = yearly_buckets(corpus, out, heldout_per_year=30, heldout_fraction=0.1, seed=3)
    by_year = collections.defaultdict(set)
    for d, i in DOCS:
        by_year[d.year].add(i)
    assert sorted(capped["years"]) == [str(y) for y in range(2015, 2021)]
    for year, ids in by_year.items():
        parts = {p: read_split_file(os.path.join(out, "yearly", f"{year}_{p}.gz")) for p in ("train", "validation",
                                                                                              "test")}
        assert len(parts["validation"]) == 15 and len(parts["test"]) == 15
        assert len(parts["train"]) == len(ids) - 30
        assert set().union(*(_ids(p) for p in parts.values())) == ids
        assert all(d.year == year for p in parts.values() for d, _ in p)
        assert capped["years"][str(year)]["train"] == len(ids) - 30
    with open(os.path.join(out, "stats.json")) as f:
        stats = json.load(f)
    assert stats["kept"] == 1 and stats["yearly"]["years"]["2016"]["test"] == 15

    fraction = yearly_buckets(corpus, str(tmp_path / "f"), seed=3)  # defaults: min(2000, 10% of the year)
    for year, ids in by_year.items():
        heldout = min(2000, int(0.1 * len(ids)))
        assert fraction["years"][str(year)] == {
            "train": len(ids) - heldout, "validation": heldout // 2, "test": heldout - heldout // 2,
            "first_date": f"{year}-01-01", "last_date": f"{year}-12-31"}


def test_read_split_file_errors_name_the_line(tmp_path):
    path = tmp_path / "bad.gz"
    with gzip.open(path, "wt") as f:
        f.write("20180101\taaa\n\n20180132\tbbb\n")
    with pytest.raises(DataError, match="invalid date") as e:
        read_split_file(str(path))
    assert e.value.line == 3 and e.value.path == str(path) and f"{path}:3:" in str(e.value)

    plain = tmp_path / "bad.txt"
    plain.write_text("20180101\taaa\n20180102 bbb\n")
    with pytest.raises(DataError, match="2 tab-separated fields") as e:
        read_split_file(str(plain))
    assert e.value.line == 2

    plain.write_text("20180101\taaa\n20180102\tbbb\n20180103\taaa\n")
    with pytest.raises(DataError, match="already listed on line 1") as e:
        read_split_file(str(plain))
    assert e.value.line == 3

    plain.write_text("20180101\taaa\r\n20180102\tbbb\n")
    assert read_split_file(str(plain)) == [(D(2018, 1, 1), "aaa"), (D(2018, 1, 2), "bbb")]


def test_duplicate_ids_keep_the_first_document(tmp_path):
    docs = [(D(2017, 9, 1), "a"), (D(2017, 9, 2), "b"), (D(2017, 10, 5), "c"), (D(2018, 1, 3), "d"),
            (D(2018, 2, 3), "a"), (D(2018, 2, 4), "e")]
    corpus = _write_corpus(tmp_path / "dup.jsonl", docs)
    stats = make_splits(corpus, str(tmp_path / "out"), test_months=2, validation_months=3,
                        allow_degenerate=True)  # a tiny corpus: every test-period document is a test document
    assert stats["duplicates_dropped"] == 1
    read = {n: read_split_file(str(tmp_path / "out" / f"{n}.gz")) for n in SPLIT_NAMES}
    assert read["time_stratified_train"] == [(D(2017, 9, 1), "a"), (D(2017, 9, 2), "b")]
    assert read["test"] == [(D(2018, 1, 3), "d"), (D(2018, 2, 4), "e")]
    # 2 train documents; test takes all of the test period, so CONTROL walks back into the validation window.
    assert read["control_validation"] == []
    assert read["control_train"] == [(D(2017, 9, 2), "b"), (D(2017, 10, 5), "c")]
    assert stats["control_train_test_period_share"] == 0.0


def test_degenerate_splits_are_refused_unless_allowed_and_then_recorded(corpus, tmp_path, capsys):
    """A cut-off near the end of the corpus used to give most test months empty and two near-identical training
    sets, with exit 0."""
    with pytest.raises(DataError, match=r"degenerate splits with the cut-off 2020-03-31: 18 of 24 test months have "
                                        r"no documents \(2021-01, .*choose an earlier cut-off") as e:
        make_splits(corpus, str(tmp_path / "late"), cutoff=D(2020, 3, 31), test_docs_per_month=PER_MONTH)
    assert e.value.path == corpus and not (tmp_path / "late").exists()
    # Every document of the one test month is a test document: CONTROL train has none from the test period.
    with pytest.raises(DataError, match=r"only 0 documents \(0.0%\) of CONTROL train lie in the test period"):
        make_splits(corpus, str(tmp_path / "same"), cutoff=D(2020, 6, 30), test_months=1, test_docs_per_month=1000)
    assert not (tmp_path / "same").exists()
    stats = make_splits(corpus, str(tmp_path / "allowed"), cutoff=D(2020, 3, 31), test_docs_per_month=PER_MONTH,
                        allow_degenerate=True)
    assert len(stats["degenerate"]) == 2 and stats["degenerate"][0].startswith("18 of 24 test months")
    with open(tmp_path / "allowed" / "stats.json") as f:
        assert json.load(f)["degenerate"] == stats["degenerate"]
    assert "degenerate splits: 18 of 24 test months" in capsys.readouterr().err


def test_sound_splits_record_no_problem(splits):
    assert splits[1]["degenerate"] == [] and splits[1]["min_control_test_share"] == 0.02


def test_a_cutoff_from_the_corpus_ends_the_test_period_with_its_last_month(tmp_path):
    """cutoff=None: the latest cut-off whose validation and test months end with the corpus (here 2020-12, so the
    test period is 2019-01..2020-12 and the cut-off 2018-09-30); the same splits as that cut-off given."""
    short = [d for d in DOCS if d[0] <= D(2020, 12, 20)]
    corpus = _write_corpus(tmp_path / "news.jsonl", short)
    derived = make_splits(corpus, str(tmp_path / "derived"), cutoff=None, test_docs_per_month=5, validation_docs=9,
                          clean=None)
    assert derived["cutoff"] == "2018-09-30" and derived["cutoff_from_corpus"] is True
    assert derived["periods"]["test"] == {"first_date": "2019-01-01", "last_date": "2020-12-31"}
    given = make_splits(corpus, str(tmp_path / "given"), cutoff=D(2018, 9, 30), test_docs_per_month=5,
                        validation_docs=9, clean=None)
    assert given["cutoff_from_corpus"] is False
    for name in SPLIT_NAMES:
        assert read_split_file(tmp_path / "derived" / f"{name}.gz") == read_split_file(tmp_path / "given" / f"{name}.gz")


def test_training_sets_at_increasing_distance_have_one_size_and_the_published_layout(corpus, tmp_path):
    """Appendix C: sets ending 0, 6 and 12 months before the cut-off (2017-09-30), each the most recent documents up
    to its end, as many as the furthest leaves; written as increasing_distance/split_<end>/train.gz."""
    split_dir = tmp_path / "splits"
    make_splits(corpus, str(split_dir), cutoff=CUTOFF, test_docs_per_month=PER_MONTH, validation_docs=VAL_DOCS)
    section = distance_splits(corpus, str(split_dir), [12, 0, 6])
    ends = {"0": D(2017, 9, 30), "6": D(2017, 3, 31), "12": D(2016, 9, 30)}
    size = sum(1 for date, _ in DOCS if date <= ends["12"])
    assert section["size"] == size and list(section["gaps"]) == ["0", "6", "12"]
    for gap, end in ends.items():
        folder = split_dir / "increasing_distance" / f"split_{end.isoformat()}"
        assert section["gaps"][gap]["split_dir"] == str(folder)
        pairs = read_split_file(str(folder / "train.gz"))
        expected = sorted((d, i) for d, i in DOCS if d <= end)[-size:]
        assert sorted(pairs) == expected and section["gaps"][gap]["last_date"] == max(d for d, _ in expected
                                                                                      ).isoformat()
    stats = json.loads((split_dir / "stats.json").read_text())
    assert stats["increasing_distance"]["size"] == size and stats["cutoff"] == "2017-09-30"
    with pytest.raises(DataError, match="fewer than 100000"):
        distance_splits(corpus, str(split_dir), [0, 6], size=100000)
    with pytest.raises(DataError, match="not a folder of `templm data splits`"):
        distance_splits(corpus, str(tmp_path / "elsewhere"), [0])
