"""`templm reproduce` on a researcher's own data, end to end through the CLI: WMT News Crawl's one file per year
(a glob), the TempLAMA release's `{train,val,test}.json` (with the alias-list variant of `answer`) and the paper's
published TIME-STRATIFIED / CONTROL split files, all written here in the published formats (not by templm's
writers); the study's years come from the data, the stage the data cannot support (calibration) is skipped with
its reason, and a corpus without TempLAMA skips the time-aware half."""

import base64
import datetime
import gzip
import hashlib
import json
import os
import random

import pytest

from templm_testing import run_templm as templm

pytestmark = pytest.mark.e2e

YEARS = (2015, 2016, 2017, 2018)
PLAYERS = ["Alan Smith", "Bruno Costa", "Carla Mendes", "Dario Rossi", "Elena Petrova", "Farid Haddad",
           "Greta Lindqvist", "Hugo Laurent", "Ines Duarte", "Jonas Weber", "Kenji Sato", "Lucia Moreno"]
CLUBS = [("Q900", "Red Lions"), ("Q901", "Blue Harbour"), ("Q902", "Green Valley"), ("Q903", "Northern Stars"),
         ("Q904", "Lakeside Rovers"), ("Q905", "Eastport Athletic")]
ALIASES = {"Q900": ["Red Lions", "Red Lions FC"], "Q903": ["Northern Stars", "The Stars"]}  # a mirror's name lists
SUBJECTS = {"train": PLAYERS[:4], "val": PLAYERS[4:6], "test": PLAYERS[6:]}
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]


def club_of(player, year):
    """Each player changes club every two years, the players staggered."""
    i = PLAYERS.index(player)
    return CLUBS[(i + (year - 2015 + i % 2) // 2) % len(CLUBS)]


def documents(rng):
    """(date, sentences) of six news documents a month, each about two players and their clubs that month."""
    docs = []
    for year in YEARS:
        for month in range(1, 13):
            for k in range(6):
                day = 1 + (5 * k + month) % 28
                a, b = rng.sample(PLAYERS, 2)
                ca, cb = club_of(a, year)[1], club_of(b, year)[1]
                when = f"{day} {MONTHS[month - 1]} {year}"
                sentences = [
                    rng.choice([f"On {when}, {a} scored {rng.randint(1, 3)} goals for {ca} against {cb}.",
                                f"{a} of {ca} was the best player on the pitch on {when}.",
                                f"Fans of {ca} cheered as {a} opened the scoring on {when}."]),
                    rng.choice([f"{b} answered for {cb} in the {rng.randint(50, 89)}th minute.",
                                f"{cb} relied on {b}, who ran {rng.randint(9, 13)} kilometres.",
                                f"The coach of {cb} praised {b} after the match."]),
                    rng.choice(["The crowd of {n} left happy.", "Tickets for the next game sold out in {n} minutes.",
                                "Rain fell for {n} minutes before kick-off."]).format(n=rng.randint(20, 900)),
                ]
                docs.append((datetime.date(year, month, day), sentences))
    return docs


def b64(text):
    return base64.b64encode(text.encode("utf-8")).decode("ascii")


def write_news_crawl(folder, docs):
    """news-docs.YYYY.en.filtered.gz, one file per year: date, base64 sentence-split text, base64 text; returns
    {(date, first sentence): the document id the published split files use (sha256 of the third field)}."""
    os.makedirs(folder, exist_ok=True)
    ids = []
    for year in YEARS:
        with gzip.open(os.path.join(folder, f"news-docs.{year}.en.filtered.gz"), "wt", encoding="utf-8") as f:
            for date, sentences in docs:
                if date.year == year:
                    unsplit = b64(" ".join(sentences))
                    f.write(f"{date:%Y%m%d}\t{b64(chr(10).join(sentences))}\t{unsplit}\n")
                    ids.append((date, hashlib.sha256(unsplit.encode("ascii")).hexdigest()))
    return ids


def write_templama_release(folder):
    """train.json, val.json, test.json as Google's release: one JSON object a line, answers as lists."""
    os.makedirs(folder, exist_ok=True)
    counts = {}
    for stem, players in SUBJECTS.items():
        with open(os.path.join(folder, f"{stem}.json"), "w", encoding="utf-8") as f:
            for player in players:
                pid = f"Q{100 + PLAYERS.index(player)}"
                held = [club_of(player, y) for y in YEARS]
                frequent = max(held, key=held.count)
                for year in YEARS:
                    qid, name = club_of(player, year)
                    answer = {"wikidata_id": qid, "name": ALIASES.get(qid, name)}
                    f.write(json.dumps({
                        "query": f"{player} plays for _X_.", "answer": [answer], "date": str(year),
                        "id": f"{pid}_P54_{year}", "relation": "P54",
                        "most_frequent_answer": {"wikidata_id": frequent[0], "name": frequent[1]},
                        "most_recent_answer": {"wikidata_id": held[-1][0], "name": held[-1][1]}}) + "\n")
        counts[stem] = len(players) * len(YEARS)
    return counts


def write_published_splits(folder, ids, rng):
    """The paper's release layout, split_2017-09-30/{time_stratified,control}_{train,validation}.gz and test.gz
    (YYYYMMDD<TAB>id lines), drawn here by the protocol: training up to the cut-off, validation from the three months
    after it, test three documents a month of 2018, CONTROL train as many of the latest other documents."""
    cutoff, test_first = datetime.date(2017, 9, 30), datetime.date(2018, 1, 1)
    ordered = sorted(ids)
    ts_train = [d for d in ordered if d[0] <= cutoff]
    ts_validation = [d for d in ordered if cutoff < d[0] < test_first][::2]
    test = []
    for month in range(1, 13):
        test += rng.sample([d for d in ordered if d[0].year == 2018 and d[0].month == month], 3)
    test.sort()
    rest = [d for d in ordered if d[0] >= test_first and d not in test]
    control_validation = rest[::4][:len(ts_validation)]
    others = [d for d in ordered if d not in test and d not in control_validation]
    control_train = others[-len(ts_train):]
    split = os.path.join(folder, "time_stratified_control", "split_2017-09-30")
    os.makedirs(split)
    for name, rows in (("time_stratified_train", ts_train), ("time_stratified_validation", ts_validation),
                       ("control_train", control_train), ("control_validation", control_validation),
                       ("test", test)):
        with gzip.open(os.path.join(split, f"{name}.gz"), "wt", encoding="utf-8") as f:
            f.writelines(f"{date:%Y%m%d}\t{doc_id}\n" for date, doc_id in rows)
    return split, {"ts_train": len(ts_train), "test": len(test)}


@pytest.fixture(scope="module")
def own_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("own_data")
    rng = random.Random(7)
    ids = write_news_crawl(root / "wmt", documents(rng))
    release = write_templama_release(root / "templama")
    split_dir, sizes = write_published_splits(root / "splits", ids, rng)
    return {"root": root, "corpus": str(root / "wmt" / "news-docs.20*.en.filtered.gz"),
            "templama": str(root / "templama"), "split_dir": split_dir, "release": release, "sizes": sizes}


@pytest.fixture(scope="module")
def study(own_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("study") / "run"
    result = templm("reproduce", "--preset=tiny_test", f"--out={out}", f"--corpus={own_data['corpus']}",
                    f"--templama_dir={own_data['templama']}", f"--split_dir={own_data['split_dir']}")
    assert result.returncode == 0, result.stderr[-4000:]
    with open(out / "results.json", encoding="utf-8") as f:
        return out, json.load(f), result


def test_the_years_come_from_the_data_and_every_model_is_trained(own_data, study):
    out, results, result = study
    data = results["world"]
    assert data["source"] == "corpus" and data["templama_dir"] == own_data["templama"]
    assert data["corpus"] == sorted(os.path.join(own_data["root"], "wmt", f"news-docs.{y}.en.filtered.gz")
                                    for y in YEARS)
    assert data["documents"] == 6 * 12 * len(YEARS)
    assert (data["years"], data["seen_years"], data["future_years"]) == ([2015, 2016, 2017, 2018],
                                                                          [2015, 2016, 2017], [2018])
    assert data["templama_splits"] == {"train": 16, "val": 8, "test": 24}
    assert {"uniform", "temporal", "yearly_2015", "yearly_2016", "yearly_2017", "retrain"} <= set(results["models"])
    assert results["adaptation"]["new_year"] == 2018 and results["adaptation"]["old_years"] == [2015, 2016, 2017]
    assert results["regimes"]["yearly"]["routes"] == {"2015": 2015, "2016": 2016, "2017": 2017, "2018": 2017}


def test_findings_are_tested_on_the_data_and_the_unsupported_one_says_why(own_data, study):
    out, results, result = study
    found = results["findings"]
    # The paired test runs over the seen-year test queries: 6 test players x 3 seen years.
    assert found["temporal_beats_uniform"]["n"] == 18
    assert found["temporal_beats_uniform"]["verdict"] in ("appears", "opposite", "inconclusive")
    assert results["skipped"] == {"calibration": "no calibration relations: the embedded world writes "
                                                 "calibration.jsonl; give one with --calibration"}
    assert found["entropy_order"]["evidence"].startswith("not tested: the calibration stage was skipped")
    assert found["entropy_order"]["verdict"] == "inconclusive" and found["entropy_order"]["n"] == 0
    for name in ("temporal_beats_uniform", "yearly_falloff", "adaptation"):
        assert f"  {name}: " in result.stdout
    text = (out / "report.md").read_text()
    assert (f"- data: the corpus `{os.path.join(os.path.dirname(own_data['corpus']), 'news-docs.2015.en.filtered.gz')}`"
            " and 3 more file(s) (288 documents), TempLAMA" in text and "(48 queries, 24 test)" in text)
    assert "- skipped: calibration (no calibration relations: " in text
    assert "years 2015-2018: seen (training) 2015-2017, future 2018" in text


def test_the_streaming_half_reads_the_published_split_files(own_data, study):
    out, results, result = study
    stream = results["extra"]["streaming"]
    assert {"streaming_gap", "streaming_growth", "streaming_dynamic"} <= set(results["findings"])
    assert len(stream["months"]) == 12 and stream["months"][0] == "2018-01"
    with open(out / stream["results"], encoding="utf-8") as f:
        inputs = json.load(f)["inputs"]
    assert inputs["test_split_file"] == os.path.join(own_data["split_dir"], "test.gz")
    assert inputs["train_split_file"] == os.path.join(own_data["split_dir"], "time_stratified_train.gz")
    assert not os.path.exists(out / "stream_experiment" / "splits")  # nothing re-split
    assert "  streaming_gap: " in result.stdout


@pytest.fixture(scope="module")
def unsupported(own_data, tmp_path_factory):
    """A corpus without TempLAMA, and a streaming cut-off after its last month (no test months): neither half can
    run, and each says why."""
    out = tmp_path_factory.mktemp("unsupported") / "run"
    result = templm("reproduce", "--preset=tiny_test", f"--out={out}", f"--corpus={own_data['corpus']}",
                    "--cutoff=2018-12-15")
    assert result.returncode == 0, result.stderr[-3000:]
    with open(out / "results.json", encoding="utf-8") as f:
        return out, json.load(f), result


def test_a_corpus_without_templama_skips_the_time_aware_half_and_says_why(unsupported):
    out, results, result = unsupported
    assert "reproduce [1/7] data: skipped: no TempLAMA release (--templama_dir)" in result.stderr
    assert set(results["skipped"]) == {"data", "train uniform and temporal", "train yearly experts", "evaluate",
                                       "future probes", "adaptation", "extra: streaming"}
    assert all(f["evidence"].startswith("not tested: the data stage was skipped (no TempLAMA release")
               for f in results["findings"].values() if f["half"] == "time-aware")
    assert not results["models"]
    assert "- skipped: data (no TempLAMA release" in (out / "report.md").read_text()


def test_a_corpus_that_cannot_be_split_skips_the_streaming_half_and_its_findings_say_why(unsupported):
    """The cut-off leaves no test months: the streaming stage is skipped with the splitter's reason, and its
    findings (one registry with the time-aware half's) say they were not tested."""
    out, results, result = unsupported
    assert "reproduce [7/7] extra: streaming: skipped: the corpus cannot be split: no document dated" in result.stderr
    reason = results["skipped"]["extra: streaming"]
    assert reason.startswith("the corpus cannot be split: no document dated 2019-")
    streaming = {n: f for n, f in results["findings"].items() if f["half"] == "streaming"}
    assert set(streaming) == {"streaming_gap", "streaming_growth", "streaming_dynamic", "streaming_dynamic_slope",
                              "streaming_size_slope"}
    for name, found in streaming.items():
        assert found["evidence"] == f"not tested: the streaming stage was skipped ({reason})", name
        assert found["verdict"] == "inconclusive" and found["n"] == 0
        assert f"  {name}: inconclusive (not tested: the streaming stage was skipped" in result.stdout
    assert "extra" not in results and not os.path.exists(out / "stream_experiment" / "time_stratified")
    text = (out / "report.md").read_text()
    assert "Streaming perplexity, Transformer-XL (Lazaridou et al.):" in text


def test_data_flags_that_do_not_go_together_are_one_message_before_any_work(own_data, tmp_path):
    cases = [(["--templama_dir", own_data["templama"]], "a TempLAMA folder (--templama_dir) goes with the news corpus"),
             (["--corpus", own_data["corpus"], "--split_dir", own_data["split_dir"], "--cutoff", "2017-09-30"],
              "give split files (--split_dir) or a cut-off (--cutoff), not both")]
    for flags, message in cases:
        result = templm("reproduce", "--preset=tiny_test", f"--out={tmp_path / 'run'}", *flags)
        assert result.returncode == 1 and message in result.stderr, (flags, result.stderr[-2000:])
        assert not os.path.exists(tmp_path / "run")


def test_prepared_task_data_is_read_where_it_is_and_names_its_release(own_data, tmp_path):
    """--task_data: a `templm data tasks` folder is the study's data as it is (no copy); the TempLAMA test split and
    the corpus for the streaming half are the ones it was built from."""
    from templm.data.task_data import TaskDataConfig, prepare_task_data
    from templm.experiments.reproduce import PRESETS, Reproduction, StudyData, StageContext
    from templm.experiments.streaming import _stream_data

    built = str(tmp_path / "task_data")
    prepare_task_data(TaskDataConfig(corpus=own_data["corpus"], templama_dir=own_data["templama"], vocab_size=300,
                                     exact_vocab_size=False, future_years=1), built)
    run = Reproduction(PRESETS["tiny_test"], str(tmp_path / "run"), 0, StudyData(task_data=built))
    data = run.prepare_data()
    data.check()
    manifest = data.manifest
    assert run.data_dir == data.data_dir == built and not os.path.exists(tmp_path / "run" / "data")
    assert (manifest["seen_years"], data.new_year) == ([2015, 2016, 2017], 2018)
    world = data.summary
    assert world["source"] == "task data" and world["task_data"] == built
    assert world["templama_splits"] == {"train": 16, "val": 8, "test": 24}
    assert data.templama_test_file() == os.path.join(own_data["templama"], "test.json")
    assert run.calibration_file() is None
    context = StageContext(run.preset, 0, str(tmp_path / "run"), built, manifest, "", {}, run.data)
    corpus, split_dir, cutoff = _stream_data(context)
    assert corpus == manifest["config"]["corpus"] and len(corpus) == 4 and (split_dir, cutoff) == (None, None)
