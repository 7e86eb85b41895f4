"""The language model's token streams (templm.data.lm_streams, `templm data streams`): the tokens and offsets
train-lm would make from the corpus, month by month; on Apache Beam (templm.data.lm_streams_beam) the same folder
byte for byte, in this process and with two worker processes, and through the command line. The corpus is written by
the test in the published formats (WMT document-level News Crawl, one gzipped file a year, and a JSON-lines file),
the split files as `templm data splits` and the WMT release write them (gzipped `YYYYMMDD<TAB>id` lines), with what
real splits and corpora do to each other: an id the corpus lacks, an id published twice (its first document is the
one), a date that differs from the split file's, and a document in both splits."""

import datetime
import gzip
import json
import random

import numpy as np
import pytest

from templm.data.lm_data import load_processor, read_split_documents, tokenize_documents
from templm.data.lm_streams import read_split_stream, write_streams
from templm.data.lm_streams_beam import write_streams_beam
from templm.data.readers import read_documents
from templm.data.vocab import train_spm
from templm.errors import DataError
from templm_testing import folder_contents, run_templm, wmt_line, write_wmt_years

IN_PROCESS = ["--runner=FnApiRunner", "--direct_num_workers=1"]
TWO_WORKERS = ["--runner=FnApiRunner", "--direct_num_workers=2", "--direct_running_mode=multi_processing"]
WORDS = ("the council said on monday that new plans for roads schools and parks would be ready before summer while "
         "local people asked for more time to read them").split()


def _article(rng):
    return " ".join(" ".join(rng.choice(WORDS) for _ in range(12)).capitalize() + "." for _ in range(3))


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """Two WMT files (2015, 2016) and a JSON-lines file (2017, holding an id twice), a SentencePiece model, and two
    split files: `early_train` (2015 to mid-2016, with an id the corpus lacks and a date off by one day) and
    `late_train` (2016 on, sharing documents with it)."""
    rng = random.Random(5)
    folder = tmp_path_factory.mktemp("streams")
    lines, jsonl = {2015: [], 2016: []}, []
    day, i = datetime.date(2015, 1, 3), 0
    while day <= datetime.date(2017, 6, 30):
        if day.year < 2017:
            lines[day.year].append(wmt_line(day, _article(rng)))
        else:
            jsonl.append(json.dumps({"id": f"n{i}", "date": day.isoformat(), "text": _article(rng)}) + "\n")
        day += datetime.timedelta(days=9)
        i += 1
    # The same id again later in the file, another text: the split takes the first.
    first = json.loads(jsonl[2])
    jsonl.append(json.dumps({**first, "text": "A later copy under the same id."}) + "\n")
    files = write_wmt_years(folder, lines)
    (folder / "news-2017.jsonl").write_text("".join(jsonl), encoding="utf-8")
    corpus = files + [str(folder / "news-2017.jsonl")]
    docs = list(read_documents(corpus))
    spm = train_spm(docs, str(folder / "spm"), vocab_size=90)
    early = [d for d in docs if d.date <= datetime.date(2016, 6, 30)]
    late = [d for d in docs if d.date >= datetime.date(2016, 1, 1)][:-1]  # not the repeated id's later copy
    shifted = early[4]

    def write(name, pairs):
        with gzip.open(folder / f"{name}.gz", "wt") as f:
            f.writelines(f"{date:%Y%m%d}\t{doc_id}\n" for date, doc_id in pairs)
        return str(folder / f"{name}.gz")

    early_pairs = [(d.date + datetime.timedelta(days=d is shifted), d.id) for d in early]
    early_pairs.insert(7, (datetime.date(2015, 4, 1), "not-in-the-corpus"))
    splits = {"early_train": write("early_train", early_pairs), "late_train": write("late_train", [
        (d.date, d.id) for d in reversed(late)])}  # a split file in any order: the stream is in date order
    return {"folder": folder, "corpus": corpus, "spm": spm, "splits": splits, "repeated": first}


@pytest.fixture(scope="module")
def single(inputs, tmp_path_factory):
    folder = tmp_path_factory.mktemp("single") / "streams"
    folder.mkdir()
    write_streams(inputs["corpus"], inputs["splits"], inputs["spm"], str(folder))
    return folder


def test_the_streams_are_the_tokens_train_lm_makes_from_the_corpus(inputs, single):
    processor = load_processor(inputs["spm"])
    for name, split_file in inputs["splits"].items():
        tokens, offsets, entry, manifest = read_split_stream(str(single), name, inputs["spm"], allow_missing=True)
        docs = read_split_documents(inputs["corpus"], split_file, allow_missing=True)
        expected_tokens, expected_offsets = tokenize_documents(docs, processor)
        np.testing.assert_array_equal(tokens, expected_tokens)
        np.testing.assert_array_equal(offsets, expected_offsets)
        assert entry["documents"] == len(docs) and entry["tokens"] == len(expected_tokens)
        assert (entry["first_date"], entry["last_date"]) == (docs[0].date.isoformat(), docs[-1].date.isoformat())
        months = sorted({f"{d.date:%Y-%m}" for d in docs})
        assert list(entry["months"]) == months and sum(m["documents"] for m in entry["months"].values()) == len(docs)
    early = json.loads((single / "manifest.json").read_text())["splits"]["early_train"]
    assert (early["missing"], early["missing_ids"], early["date_mismatches"]) == (1, ["not-in-the-corpus"], 1)
    late = manifest["splits"]["late_train"]
    assert (late["missing"], late["date_mismatches"]) == (0, 0)
    # The repeated id's first document is the one streamed (its text's pieces are in the stream, the copy's not).
    repeated = processor.encode(inputs["repeated"]["text"]) + [processor.eos_id()]
    month = inputs["repeated"]["date"][:7]
    lengths = np.load(single / "late_train" / f"{month}.lengths.npy")
    stream = np.load(single / "late_train" / f"{month}.tokens.npy")
    pieces = [stream[a:b].tolist() for a, b in zip(np.concatenate([[0], np.cumsum(lengths)[:-1]]), np.cumsum(lengths))]
    assert repeated in pieces
    assert processor.encode("A later copy under the same id.") + [processor.eos_id()] not in pieces


def test_ids_the_corpus_lacks_and_another_vocabulary_are_refused_naming_the_file(inputs, single, tmp_path):
    with pytest.raises(DataError, match=r"early_train.gz: 1 of the document ids of split early_train were not in "
                                        r"the corpus \(first: not-in-the-corpus\)"):
        read_split_stream(str(single), "early_train", inputs["spm"])
    other = train_spm(read_documents(inputs["corpus"]), str(tmp_path / "other"), vocab_size=80)
    with pytest.raises(DataError, match=r"manifest.json: was tokenised with .*spm.model, not with the SentencePiece "
                                        r"model .*other.model"):
        read_split_stream(str(single), "late_train", other)
    with pytest.raises(DataError, match=r"holds no split 'test' \(it holds early_train, late_train\)"):
        read_split_stream(str(single), "test", inputs["spm"])


@pytest.mark.parametrize("options", [IN_PROCESS, TWO_WORKERS], ids=["one worker", "two worker processes"])
def test_on_beam_the_same_folder_byte_for_byte(inputs, single, tmp_path, options):
    write_streams_beam(inputs["corpus"], inputs["splits"], inputs["spm"], str(tmp_path), options)
    assert folder_contents(tmp_path, bytes_only=True) == folder_contents(single, bytes_only=True)


def test_the_command_line_on_beam_writes_the_same_streams(inputs, single, tmp_path):
    split_dir = tmp_path / "splits"
    split_dir.mkdir()
    for name, path in inputs["splits"].items():
        (split_dir / f"{name}.gz").write_bytes(open(path, "rb").read())
    corpus = [f"--corpus={path}" for path in inputs["corpus"]]
    out = tmp_path / "out"
    result = run_templm("data", "streams", *corpus, f"--split_dir={split_dir}", "--splits=early_train,late_train",
                        f"--spm_model={inputs['spm']}", f"--out={out}", "--runner=FnApiRunner")
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["splits"]["early_train"]["missing"] == 1
    assert "1 of 62 id(s)" in result.stderr and "not-in-the-corpus" in result.stderr  # said as for any split
    contents = folder_contents(out, bytes_only=True)
    assert json.loads(contents.pop(".templm.json"))["kind"] == "token streams"
    manifest = json.loads(contents.pop("manifest.json"))
    assert manifest["splits"]["late_train"]["split_file"] == str(split_dir / "late_train.gz")
    assert contents == {k: v for k, v in folder_contents(single, bytes_only=True).items() if k != "manifest.json"}
