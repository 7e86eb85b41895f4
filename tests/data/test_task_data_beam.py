"""`templm data tasks` on Apache Beam (templm.data.task_data_beam): the same task-data folder, byte for byte (record
files, yearly buckets, vocabulary, manifest), as the single process, on a corpus the test writes in the published
formats (WMT document-level News Crawl, one gzipped file a year, and a JSON-lines file) holding what the clean-up
removes (a near-copy in a later file, an article in another language, a repeated id), with Beam's local runner in
this process and with two worker processes, records dealt into two files a year, and through the command line."""

import base64
import datetime
import gzip
import hashlib
import json
import random

import pytest

from sentencepiece import sentencepiece_model_pb2

from templm.data.task_data import TaskDataConfig, prepare_task_data
from templm.data.task_data_beam import OnBeam
from templm_testing import folder_contents, run_templm, wmt_line, write_wmt_years

IN_PROCESS = ["--runner=FnApiRunner", "--direct_num_workers=1"]
TWO_WORKERS = ["--runner=FnApiRunner", "--direct_num_workers=2", "--direct_running_mode=multi_processing"]
NAMES = ["Ana Lopes", "Red Lions", "Port Alba", "Tom Reyes", "Blue Harbour", "Mira Stone", "Green Vale", "Ivo Marr"]
WORDS = ("the council said on monday that new plans for roads schools and parks would be ready before summer while "
         "local people asked for more time to read them and to meet officials about cost noise and old bridges").split()
FRENCH = ("Le conseil municipal a annoncé lundi que les nouveaux projets pour les routes, les écoles et les parcs "
          "seraient prêts avant l'été, tandis que les habitants ont demandé plus de temps pour les lire et rencontrer "
          "les responsables de la ville au sujet du bruit et des vieux ponts du quartier.")


def _article(rng):
    return " ".join(f"Reports say {rng.choice(NAMES)} met {rng.choice(NAMES)} as "
                    + " ".join(rng.choice(WORDS) for _ in range(10)) + "." for _ in range(6))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """WMT files of 2015 and 2016 and a JSON-lines file of 2017: articles every few days, a near-copy in 2016 of a
    2015 article, a French article, and an English text published again in 2016 under the French article's id."""
    rng = random.Random(11)
    folder = tmp_path_factory.mktemp("news")
    lines = {2015: [], 2016: []}
    jsonl = []
    day, i = datetime.date(2015, 1, 1), 0
    while day <= datetime.date(2017, 12, 31):
        text = _article(rng)
        if day.year < 2017:
            lines[day.year].append(wmt_line(day, text))
        else:
            jsonl.append(json.dumps({"id": f"n{i}", "date": day.isoformat(), "text": text}) + "\n")
        day += datetime.timedelta(days=6)
        i += 1
    original = base64.b64decode(lines[2015][3].split("\t")[2]).decode()
    french_raw = base64.b64encode(b"a french article").decode()
    lines[2015].append(wmt_line(datetime.date(2015, 9, 9), FRENCH, french_raw))
    lines[2016] += [wmt_line(datetime.date(2016, 2, 2), original.replace(" met ", " saw ", 1)),
                    wmt_line(datetime.date(2016, 3, 3), _article(rng), french_raw)]
    files = write_wmt_years(folder, lines)
    (folder / "news-2017.jsonl").write_text("".join(jsonl), encoding="utf-8")
    return files + [str(folder / "news-2017.jsonl")]


def _config(files, files_per_year):
    """With one file a year, what the command line below asks for; with two, a vocabulary sample of 200 of the
    training lines (591), so that the sample's draw replaces lines."""
    return TaskDataConfig(corpus=files, vocab_size=90, future_years=1, heldout_fraction=0.2,
                          files_per_year=files_per_year, max_spm_sentences=1_000_000 if files_per_year == 1 else 200)


@pytest.fixture(scope="module")
def single(corpus, tmp_path_factory):
    """The single process's folders, with one and with two record files a year."""
    built = {}
    for files_per_year in (1, 2):
        out = tmp_path_factory.mktemp("single") / "tasks"
        prepare_task_data(_config(corpus, files_per_year), str(out))
        built[files_per_year] = folder_contents(out, bytes_only=True)
    return built


def test_the_corpus_holds_what_the_clean_up_removes(single):
    stats = json.loads(single[1]["splits/stats.json"])["yearly"]
    assert stats["cleaned"]["near_duplicates_removed"] == 1 and stats["cleaned"]["other_language_removed"] == 1
    assert stats["duplicates_dropped"] == 1
    records = [name for name in single[2] if name.startswith("customnews/")]
    assert "customnews/train-2015-00001-of-00002.tfrecord" in records and len(records) == 3 * 3 * 2
    lines = {}
    for files_per_year in (1, 2):
        model = sentencepiece_model_pb2.ModelProto()
        model.ParseFromString(single[files_per_year]["spm/vocab.model"])
        lines[files_per_year] = model.trainer_spec.input_sentence_size
    assert lines[2] == 200 and lines[1] > 2 * 200  # drawn from more than twice as many lines


@pytest.mark.parametrize("options, files_per_year", [(IN_PROCESS, 2), (TWO_WORKERS, 1)],
                         ids=["in-process-two-files-a-year", "two-workers"])
def test_beam_writes_the_single_process_s_folder(corpus, single, tmp_path, options, files_per_year):
    prepare_task_data(_config(corpus, files_per_year), str(tmp_path / "tasks"), via=OnBeam(options))
    built = folder_contents(tmp_path / "tasks", bytes_only=True)
    assert sorted(built) == sorted(single[files_per_year])
    assert [name for name in built if built[name] != single[files_per_year][name]] == []


def test_the_command_line_runs_the_pipelines_and_refuses_what_they_cannot_make(corpus, single, tmp_path):
    common = ["data", "tasks", *(f"--corpus={path}" for path in corpus), "--vocab_size=90", "--future_years=1",
              "--heldout_fraction=0.2"]
    result = run_templm(*common, f"--out={tmp_path / 'beam'}", "--runner=FnApiRunner")
    assert result.returncode == 0, result.stderr[-2000:]
    assert folder_contents(tmp_path / "beam", bytes_only=True) == single[1]
    result = run_templm(*common, f"--out={tmp_path / 'spans'}", "--one_span_per_sentence", "--runner=FnApiRunner")
    assert result.returncode == 1 and "--one_span_per_sentence draws one span a sentence" in \
        result.stderr.strip().splitlines()[-1], result.stderr[-2000:]
    assert not (tmp_path / "spans").exists() and not (tmp_path / "spans.partial").exists()


def test_ids_are_wmt_s(corpus, single):
    """The WMT reader's ids (the sha256 of the unsplit field): the examples name their documents by them."""
    raw = gzip.open(corpus[0], "rt").readline().split("\t")[2].strip()
    assert hashlib.sha256(raw.encode()).hexdigest().encode() in single[1]["customnews/train-2015.tfrecord"] + \
        single[1].get("customnews/validation-2015.tfrecord", b"") + single[1].get("customnews/test-2015.tfrecord", b"")
