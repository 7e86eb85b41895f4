"""`templm data splits` on Apache Beam (templm.data.splits_beam): the same split files and stats.json bytes as the
single process, with the paper's clean-up, on a corpus the test writes in the published formats (WMT document-level
News Crawl, one gzipped file a year, and a JSON-lines file), with Beam's local runner in this process and with two
worker processes, and through the command line. The corpus holds every case the clean-up decides: another
language, copies with equal signatures, a chain of near-duplicates where only the first link goes (the single
process's order-dependent rule), and a repeated id whose first document was removed."""

import base64
import datetime
import hashlib
import json
import random

import pytest

from templm.data.filters import FilterConfig, Signer, similarity
from templm.data.splits import SPLIT_NAMES, index_corpus, make_splits, yearly_buckets
from templm.data.splits_beam import index_corpus_beam
from templm.errors import DataError
from templm_testing import folder_contents, run_templm, wmt_line, write_wmt_years

D = datetime.date
IN_PROCESS = ["--runner=FnApiRunner", "--direct_num_workers=1"]
TWO_WORKERS = ["--runner=FnApiRunner", "--direct_num_workers=2", "--direct_running_mode=multi_processing"]

WORDS = ("the city council said on monday that new rail line would open next year after long public debate about "
         "cost and noise while local shops hope for more visitors from nearby towns as the mayor promised quick "
         "work on old station roads bridges parks schools and homes near river where many families live today "
         "because prices have risen sharply during recent months across region").split()
FRENCH = ("Le conseil municipal a voté mardi le prolongement de la ligne de tramway vers les quartiers du nord, après "
          "deux années de consultations publiques au cours desquelles les habitants ont discuté du bruit, du "
          "stationnement et du coût du déménagement de l'ancienne halle du marché.")


def _article(rng, words=300):
    return " ".join(rng.choice(WORDS) for _ in range(words)) + "."


def _edited(text, rng, edits):
    """`text` with `edits` words at scattered places replaced by a word it does not hold."""
    words = text.rstrip(".").split()
    for place in rng.sample(range(len(words)), edits):
        words[place] = f"changed{place}word"
    return " ".join(words) + "."


def _wmt_id(text, raw=None):
    """The id WMT's split files give a document: the sha256 of its unsplit field."""
    return hashlib.sha256((raw or base64.b64encode(text.encode()).decode()).encode()).hexdigest()


def _raw(text, copy):
    """The unsplit field of a copy published again: the same text, another id (the id hashes this field)."""
    return base64.b64encode(f"{text} (copy {copy})".encode()).decode()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Three WMT files (2016-2018) and a JSON-lines file (2019): fillers every few days (short: no language check)
    and long articles, with the cases of the module docstring. Returns (files, the cases' ids by WMT raw field)."""
    rng = random.Random(7)
    folder = tmp_path_factory.mktemp("news")
    chain = _article(rng)
    second = _edited(chain, rng, 5)             # about 0.84 like the first: a near-duplicate of it
    third = _edited(second, rng, 5)             # about 0.84 like the second, 0.71 like the first: kept
    copied = _article(rng)
    french_raw = base64.b64encode(b"a french article").decode()
    lines = {2016: [], 2017: [], 2018: []}
    jsonl = []
    day, i = D(2016, 1, 1), 0
    while day <= D(2019, 12, 31):
        text = f"Short note {i} of the day." if i % 4 else _article(rng, 60)
        if day.year < 2019:
            lines[day.year].append(wmt_line(day, text))
        else:
            jsonl.append(json.dumps({"id": f"note-{i}", "date": day.isoformat(), "text": text}) + "\n")
        day += datetime.timedelta(days=5)
        i += 1
    lines[2016] += [wmt_line(D(2016, 3, 1), chain), wmt_line(D(2016, 4, 1), copied),
                    wmt_line(D(2016, 5, 1), FRENCH, french_raw)]
    lines[2017] += [wmt_line(D(2017, 2, 1), second), wmt_line(D(2017, 6, 1), copied, _raw(copied, 2)),
                    wmt_line(D(2017, 7, 1), "An English text under the French article's id, later.", french_raw)]
    lines[2018] += [wmt_line(D(2018, 2, 1), third), wmt_line(D(2018, 3, 1), copied, _raw(copied, 3))]
    files = write_wmt_years(folder, lines)
    (folder / "news-2019.jsonl").write_text("".join(jsonl), encoding="utf-8")
    files.append(str(folder / "news-2019.jsonl"))
    return files, {"chain": _wmt_id(chain), "second": _wmt_id(second), "third": _wmt_id(third),
                   "copied": _wmt_id(copied), "copies": {_wmt_id(copied, _raw(copied, k)) for k in (2, 3)},
                   "french": _wmt_id(FRENCH, french_raw), "similarities": _similarities(chain, second, third)}


def _similarities(*texts):
    signer = Signer(FilterConfig())
    signatures = [signer(text) for text in texts]
    return [similarity(signatures[i], signatures[j]) for i, j in ((0, 1), (1, 2), (0, 2))]


def _split(corpus_files, out, index):
    make_splits(corpus_files, str(out), cutoff=D(2017, 9, 30), test_months=12, test_docs_per_month=4,
                allow_degenerate=True, index=index)
    yearly_buckets(corpus_files, str(out), heldout_fraction=0.2, index=index)
    return folder_contents(out, bytes_only=True)


@pytest.fixture(scope="module")
def single(corpus, tmp_path_factory):
    index = index_corpus(corpus[0])
    return index, _split(corpus[0], tmp_path_factory.mktemp("single"), index)


def test_the_corpus_holds_each_case_of_the_clean_up(corpus, single):
    index, _ = single
    case = corpus[1]
    cleaned = index.filtered
    # The French article; the copies of `copied` (equal signatures) and the chain's second link.
    assert cleaned["other_language_removed"] == 1 and cleaned["near_duplicates_removed"] == 3
    assert index.duplicates == 1  # the English text under the French article's id stays out with it
    first_second, second_third, first_third = case["similarities"]
    assert first_second >= 0.8 and second_third >= 0.8 > first_third  # a chain: the order decides the third link
    ids = set(index.ids)
    assert {case["chain"], case["third"], case["copied"]} <= ids  # the third link kept: only the second went
    assert not ({case["second"], case["french"]} | case["copies"]) & ids


@pytest.mark.parametrize("options", [IN_PROCESS, TWO_WORKERS], ids=["one worker", "two worker processes"])
def test_beam_gives_the_single_process_files(corpus, single, tmp_path, options):
    index, files = single
    beam_index = index_corpus_beam(corpus[0], options)
    assert beam_index.filtered == index.filtered
    assert (beam_index.read, beam_index.duplicates) == (index.read, index.duplicates)
    assert _split(corpus[0], tmp_path / "beam", beam_index) == files
    assert len(files) == len(SPLIT_NAMES) + 1 + 3 * 4  # five splits, stats.json, three parts of four years


def test_without_a_clean_up_beam_keeps_every_first_document(corpus, tmp_path):
    index = index_corpus(corpus[0], clean=None)
    beam_index = index_corpus_beam(corpus[0], IN_PROCESS, clean=None)
    assert beam_index.filtered is None and list(beam_index.ids) == list(index.ids)
    assert index.read - index.duplicates == len(index) and index.duplicates == 1


def test_an_index_of_another_corpus_or_clean_up_is_refused(corpus, single, tmp_path):
    index, _ = single
    with pytest.raises(ValueError, match="the index was made with the clean-up"):
        make_splits(corpus[0], str(tmp_path / "other"), clean=None, index=index)
    with pytest.raises(ValueError, match="the index is of the corpus"):
        yearly_buckets(corpus[0][:2], str(tmp_path / "other"), index=index)


def test_the_command_line_runs_the_pipeline_and_names_a_malformed_line(corpus, tmp_path):
    files, _ = corpus
    common = ["data", "splits", *(f"--corpus={path}" for path in files), "--cutoff=2017-09-30", "--test_months=12",
              "--test_docs_per_month=4", "--allow_degenerate"]
    assert run_templm(*common, f"--out={tmp_path / 'single'}").returncode == 0
    result = run_templm(*common, f"--out={tmp_path / 'beam'}", "--runner=FnApiRunner")
    assert result.returncode == 0, result.stderr[-2000:]
    assert folder_contents(tmp_path / "beam", bytes_only=True) == \
        folder_contents(tmp_path / "single", bytes_only=True)

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "date": "2016-01-01", "text": "fine"}\n{"id": "b", "date": "2016-13-01", '
                   '"text": "bad month"}\n')
    result = run_templm("data", "splits", f"--corpus={bad}", f"--out={tmp_path / 'bad'}", "--runner=FnApiRunner")
    assert result.returncode == 1, result.stderr[-2000:]
    line = result.stderr.strip().splitlines()[-1]
    assert f"{bad}:2" in line and "Traceback" not in result.stderr, line
    assert not (tmp_path / "bad").exists() and not (tmp_path / "bad.partial").exists()


def test_a_malformed_line_in_the_pipeline_is_a_data_error_naming_the_file_and_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "date": "2016-01-01", "text": "fine"}\n{"id": "b", "text": "no date"}\n')
    with pytest.raises(DataError, match="missing field 'date'") as raised:
        index_corpus_beam(str(bad), IN_PROCESS)
    assert str(raised.value).startswith(f"{bad}:2")
