"""Files as their publishers ship them, each written here in the published shape (not by templm's own writers):
the TempLAMA release (`{train,val,test}.json`, JSON lines, and the alias-list variant of `answer`), WMT News Crawl's
one file per year (several files and glob patterns as one corpus, the format detected per file), the arXiv snapshot
with a byte-order mark, a corpus too small for SentencePiece's sampling, a Wikidata dump cut to the subjects' lines
and a Hugging Face folder holding only PyTorch's pickled weights."""

import base64
import datetime
import gzip
import hashlib
import json
import os

import pytest
from sentencepiece import sentencepiece_model_pb2

from templm.data.readers import (TemplamaReader, corpus_files, detect_format, read_documents, resolve_corpus,
                                 templama_split_files)
from templm.data.records import Document
from templm.data.vocab import train_spm
from templm.data.wikidata import build_templama
from templm.errors import DataError
from templm.metrics.qa import exact_match, token_f1
from templm_testing import run_templm


def release_line(subject, relation, year, answers, query="<s> plays for _X_."):
    """One line of Google's TempLAMA release: `answer` a list of {wikidata_id, name}, the year a string."""
    first = answers[0]
    return json.dumps({"query": query.replace("<s>", subject), "answer": answers, "date": str(year),
                       "id": f"{subject}_{relation}_{year}", "most_frequent_answer": first,
                       "most_recent_answer": answers[-1], "relation": relation})


def write_release(folder, suffix=".json"):
    os.makedirs(folder, exist_ok=True)
    club = {"wikidata_id": "Q100", "name": "Red Lions FC"}
    for stem, subject in (("train", "Q1"), ("val", "Q2"), ("test", "Q3")):
        with open(os.path.join(folder, stem + suffix), "w", encoding="utf-8") as f:
            for year in (2015, 2016):
                f.write(release_line(subject, "P54", year, [club]) + "\n")
    return str(folder)


def test_the_release_file_names_are_found_and_ambiguity_is_refused(tmp_path):
    shipped = write_release(tmp_path / "release")
    files = templama_split_files(shipped)
    assert files == {"train": os.path.join(shipped, "train.json"), "validation": os.path.join(shipped, "val.json"),
                     "test": os.path.join(shipped, "test.json")}
    assert [q.id for q in TemplamaReader(files["validation"])] == ["Q2_P54_2015", "Q2_P54_2016"]
    built = write_release(tmp_path / "built", ".jsonl")  # templm's own builder writes .jsonl
    assert templama_split_files(built)["test"].endswith("test.jsonl")

    write_release(tmp_path / "release", ".jsonl")
    with pytest.raises(DataError, match=r"two TempLAMA train splits \(train.json, train.jsonl\)"):
        templama_split_files(shipped)
    os.makedirs(tmp_path / "half")
    (tmp_path / "half" / "train.json").write_text(release_line("Q1", "P54", 2015, [{"wikidata_id": "Q1",
                                                                                     "name": "A"}]) + "\n")
    with pytest.raises(DataError, match=r"no TempLAMA val split: expected val.json .* or val.jsonl") as info:
        templama_split_files(tmp_path / "half")
    assert str(tmp_path / "half") in str(info.value)


def test_alias_lists_are_answers_and_a_prediction_scores_its_best_alias(tmp_path):
    """A mirror's `answer`: `name` a list of aliases and `original_name` the release's name; the original name is
    the answer's (what a model trains on), every other one an alias; F1 and EM take the best over every name of every
    answer. Without `original_name` the first of `name`'s list is the answer's."""
    path = tmp_path / "test.json"
    answers = [{"wikidata_id": "Q5", "name": ["Manchester United F.C.", "Man Utd", "Manchester United"],
                "original_name": ["Manchester United Football Club"]},
               {"wikidata_id": "Q6", "name": "Real Madrid"}]
    path.write_text(release_line("Q9", "P54", 2012, answers) + "\n", encoding="utf-8")
    (query,) = list(TemplamaReader(str(path)))
    first = query.answers[0]
    assert (first.wikidata_id, first.name) == ("Q5", "Manchester United Football Club")
    assert first.aliases == ("Manchester United F.C.", "Man Utd", "Manchester United")
    assert query.answer_names == ("Manchester United Football Club", "Real Madrid")
    assert query.gold_names == ("Manchester United Football Club", "Manchester United F.C.", "Man Utd",
                                "Manchester United", "Real Madrid")
    assert exact_match("man utd", query.gold_names) == 1.0 and exact_match("man utd", query.answer_names) == 0.0
    assert token_f1("Manchester United", query.gold_names) == 1.0
    assert token_f1("Manchester United", query.answer_names) == pytest.approx(2 / 3)
    # Written back in the alias-list shape, it reads the same.
    again = tmp_path / "again.json"
    again.write_text(json.dumps(query.to_json()) + "\n", encoding="utf-8")
    assert list(TemplamaReader(str(again))) == [query]

    bad = tmp_path / "bad.json"
    bad.write_text(release_line("Q9", "P54", 2012, [{"wikidata_id": "Q5", "name": []}]) + "\n")
    with pytest.raises(DataError, match="'name' must be a string or a non-empty list of strings"):
        list(TemplamaReader(str(bad)))


def test_rows_that_repeat_an_id_are_read_once_with_one_warning(tmp_path, capsys):
    """Two rows with one id (a release and a mirror's row concatenated, say): the first is the query, the later is
    left out, and one warning names the id, so task data, evaluation and a study all count the same queries."""
    path = tmp_path / "test.json"
    rows = [release_line("Q1", "P54", 2015, [{"wikidata_id": "Q7", "name": "Red Lions"}]),
            release_line("Q1", "P54", 2016, [{"wikidata_id": "Q7", "name": "Red Lions"}]),
            release_line("Q1", "P54", 2015, [{"wikidata_id": "Q8", "name": "Blue Bears"}]),
            release_line("Q2", "P54", 2015, [{"wikidata_id": "Q8", "name": "Blue Bears"}]),
            release_line("Q2", "P54", 2015, [{"wikidata_id": "Q8", "name": "Blue Bears"}])]
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    reader = TemplamaReader(str(path))
    queries = list(reader)
    assert [q.id for q in queries] == ["Q1_P54_2015", "Q1_P54_2016", "Q2_P54_2015"]
    assert queries[0].answer_names == ("Red Lions",)  # the first row of the id, not the later one
    assert reader.duplicates == 2
    err = capsys.readouterr().err
    assert err.count("warning:") == 1
    assert f"{path}: 2 row(s) repeat the id of an earlier row (Q1_P54_2015, Q2_P54_2015)" in err
    assert "(3 queries)" in err


def b64(text):
    return base64.b64encode(text.encode("utf-8")).decode("ascii")


def write_news_docs(path, docs):
    """A WMT document-level News Crawl file: YYYYMMDD, base64 of the sentence-split text, base64 of the text."""
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for date, sentences in docs:
            f.write(f"{date}\t{b64(chr(10).join(sentences))}\t{b64(' '.join(sentences))}\n")


def test_a_corpus_of_one_file_per_year_by_glob_or_list_with_formats_detected_per_file(tmp_path):
    write_news_docs(tmp_path / "news-docs.2008.en.filtered.gz", [("20080102", ["Stocks fell.", "Bonds rose."])])
    write_news_docs(tmp_path / "news-docs.2007.en.filtered.gz", [("20070301", ["A storm hit.", "Trains stopped."]),
                                                                  ("20071231", ["The year ended."])])
    extra = tmp_path / "extra.jsonl"
    extra.write_text(json.dumps({"id": "x1", "date": "2009-05-05", "text": "A JSON lines document."}) + "\n")
    pattern = str(tmp_path / "news-docs.20*.en.filtered.gz")

    assert corpus_files(pattern) == [str(tmp_path / "news-docs.2007.en.filtered.gz"),
                                     str(tmp_path / "news-docs.2008.en.filtered.gz")]  # years in order
    docs = list(read_documents([pattern, str(extra)]))
    assert [d.date for d in docs] == [datetime.date(2007, 3, 1), datetime.date(2007, 12, 31),
                                      datetime.date(2008, 1, 2), datetime.date(2009, 5, 5)]
    assert [d.source for d in docs] == ["wmt", "wmt", "wmt", "jsonl"]
    # The published split files' ids: sha256 of the base64 unsplit text.
    assert docs[0].id == hashlib.sha256(b64("A storm hit. Trains stopped.").encode("ascii")).hexdigest()
    assert docs[1].text == "The year ended."
    assert resolve_corpus(pattern) == corpus_files(pattern)

    with pytest.raises(DataError, match="no file matches this pattern") as info:
        corpus_files(str(tmp_path / "news-docs.19*.gz"))
    assert "news-docs.19*.gz" in str(info.value)
    with pytest.raises(DataError, match="names this file twice"):
        corpus_files([pattern, str(tmp_path / "news-docs.2008.en.filtered.gz")])

    result = run_templm("data", "stats", f"--corpus={pattern}", f"--corpus={extra}")
    assert result.returncode == 0, result.stderr
    stats = json.loads(result.stdout)
    assert stats["documents"] == 4 and stats["read"] == 4
    assert {year: row["documents"] for year, row in stats["by_year"].items()} == {"2007": 2, "2008": 1, "2009": 1}


def test_an_arxiv_snapshot_with_a_byte_order_mark_is_detected_as_arxiv(tmp_path):
    path = tmp_path / "arxiv-metadata-oai-snapshot.json"
    record = {"id": "0704.0001", "submitter": "A. Author", "authors": "A. Author", "title": "A title",
              "abstract": "  We study\n  things.  ", "versions": [{"version": "v1",
                                                                     "created": "Mon, 2 Apr 2007 19:18:42 GMT"}]}
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(record).encode("utf-8") + b"\n")
    assert detect_format(str(path)) == "arxiv"
    (doc,) = list(read_documents(str(path)))
    assert (doc.id, doc.date, doc.text) == ("0704.0001", datetime.date(2007, 4, 2), "We study things.")


def test_gunzipped_arxiv_split_files_without_a_suffix_are_read_as_they_are(tmp_path):
    """The Mind the Gap release gzips its split files; a copy gunzipped in place (as arXiv users keep them: plain
    files named `time_stratified_train`, `test`, ..., one `YYYYMMDD<TAB>arXiv id` per line, ids such as
    `solv-int/9812025` included) is read as it is, the .gz preferred where both exist."""
    from templm.data.lm_data import read_split_documents, split_path
    from templm.experiments.streaming import STREAM_SPLIT_FILES, published_split_stats

    snapshot = tmp_path / "arxiv-metadata-oai-snapshot.json"
    months = {"time_stratified_train": ["2017-06", "2017-07"], "time_stratified_validation": ["2017-11"],
              "control_train": ["2017-07", "2018-03"], "control_validation": ["2017-12"], "test": ["2018-02"]}
    records, listed = [], {}
    for name, dates in months.items():
        listed[name] = []
        for k, month in enumerate(dates):
            year, mon = month.split("-")
            n = len(records)
            paper = f"solv-int/98{n:05d}" if name == "test" else f"{year[2:]}{mon}.{n:05d}"  # old-style ids too
            day = datetime.date(int(year), int(mon), 3 + k)
            records.append({"id": paper, "abstract": f"  Abstract {len(records)} of\n a paper. ", "versions": [
                {"version": "v1", "created": day.strftime("%a, %d %b %Y 10:00:00 GMT")}]})
            listed[name].append((day.strftime("%Y%m%d"), paper))
    snapshot.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    release = tmp_path / "arxiv" / "split_2017-09-30"
    release.mkdir(parents=True)
    for name, rows in listed.items():
        (release / name).write_text("".join(f"{d}\t{i}\n" for d, i in rows), encoding="utf-8")

    stats = published_split_stats(str(release))
    assert {name: s["documents"] for name, s in stats["splits"].items()} == {n: len(listed[n]) for n in listed}
    assert stats["splits"]["test"]["file"] == "test" and stats["cutoff"] == "2017-07-04"
    test_docs = read_split_documents(str(snapshot), split_path(None, str(release), "test"))
    assert [d.id for d in test_docs] == [listed["test"][0][1]] and test_docs[0].text == "Abstract 6 of a paper."
    (release / "test.gz").write_bytes(gzip.compress(b"20180210\t1802.00006\n"))  # both: the .gz is the one read
    assert split_path(None, str(release), "test") == str(release / "test.gz")
    (release / "control_train").unlink()
    with pytest.raises(DataError, match="control_train.gz missing .* or the same names gunzipped, without .gz"):
        published_split_stats(str(release))
    assert len(STREAM_SPLIT_FILES) == 5


def test_sentencepiece_trains_on_a_corpus_of_a_hundred_lines_or_fewer(tmp_path):
    docs = [Document(str(i), datetime.date(2019, 1, 1), f"The cat number {i} sat on the mat with a hat.")
            for i in range(40)]
    path = train_spm(docs, str(tmp_path / "small"), vocab_size=32)
    model = sentencepiece_model_pb2.ModelProto()
    model.ParseFromString(open(path, "rb").read())
    assert len(model.pieces) == 32 and model.trainer_spec.input_sentence_size == 40
    with pytest.raises(ValueError, match=r"vocab_size=500 is too large for this text: 40 sentence\(s\) support at "
                                         r"most \d+ pieces"):
        train_spm(docs, str(tmp_path / "big"), vocab_size=500)


def entity(entity_id, label=None, claims=None, sitelinks=None):
    value = {"type": "item", "id": entity_id, "labels": {"en": {"language": "en", "value": label}} if label else {},
             "claims": claims or {}, "sitelinks": sitelinks or {}}
    return json.dumps(value)


def member_of(obj, start, end):
    def when(year):
        return {"snaktype": "value", "datavalue": {"type": "time", "value": {
            "time": f"+{year}-01-01T00:00:00Z", "precision": 11, "calendarmodel": ""}}}
    return {"mainsnak": {"snaktype": "value", "property": "P54", "datavalue": {
        "type": "wikibase-entityid", "value": {"entity-type": "item", "id": obj}}}, "rank": "normal",
        "qualifiers": {"P580": [when(start)], "P582": [when(end)]}}


def test_a_dump_without_the_objects_lines_names_the_missing_objects(tmp_path):
    """A dump cut to the subjects' lines: every object is unnamed, and the message says so, naming them."""
    dump = tmp_path / "latest-all.json"
    subjects = [entity(f"Q{i}", f"Player {i}", {"P54": [member_of("Q900", 2010, 2013), member_of("Q901", 2014, 2018)]},
                       {"enwiki": {"site": "enwiki", "title": f"Player {i}"}}) for i in (1, 2)]
    dump.write_text("[\n" + ",\n".join(subjects) + "\n]\n", encoding="utf-8")
    with pytest.raises(DataError) as info:
        build_templama(str(dump), str(tmp_path / "out"), start_year=2010, end_year=2020, require_enwiki=False)
    message = str(info.value)
    assert "2 object(s) of the kept statements could not be named: 2 have no entity line in the dump (first: " \
           "Q900, Q901" in message
    assert not os.path.exists(tmp_path / "out" / "train.jsonl")


def test_a_hugging_face_folder_with_only_pickled_weights_names_the_conversion(tmp_path):
    from templm.models.t5 import load_hf_checkpoint

    folder = tmp_path / "t5-small"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "t5", "d_model": 8, "d_kv": 4, "d_ff": 16,
                                                    "num_layers": 1, "num_heads": 2, "vocab_size": 32}))
    (folder / "pytorch_model.bin").write_bytes(b"PK\x03\x04 not read")
    with pytest.raises(DataError) as info:
        load_hf_checkpoint(str(folder))
    message = str(info.value)
    assert "missing safetensors file" in message and "pytorch_model.bin, which templm does not read" in message
    assert "save_pretrained" in message and "safe_serialization=True" in message
