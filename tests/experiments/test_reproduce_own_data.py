"""`templm reproduce` on a researcher's own data, end to end through the CLI: WMT News Crawl's one file per year
(a glob), the TempLAMA release's `{train,val,test}.json` (with the alias-list variant of `answer`) and the paper's
published TIME-STRATIFIED / CONTROL split files, all written here in the published formats (not by templm's
writers); the study's years come from the data, the stage the data cannot support (calibration) is skipped with
its reason, and a corpus without TempLAMA skips the time-aware half."""

import glob
import gzip
import json
import os
import random
import shutil

import pytest

from published_material import YEARS, documents, write_news_crawl, write_published_splits, write_templama_release
from templm_testing import run_templm as templm

pytestmark = pytest.mark.e2e

@pytest.fixture(scope="module")
def own_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("own_data")
    rng = random.Random(7)
    ids = write_news_crawl(root / "wmt", documents(rng))
    release = write_templama_release(root / "templama", repeat_test_row=True)
    split_dir, sizes = write_published_splits(root / "splits", ids, rng)
    # Real splits and corpora drift apart: the test split and TIME-STRATIFIED's training split each name an id this
    # corpus lacks (appended as another gzip member, which gzip readers take as one stream).
    for name, line in (("test", "20180615\tgone-2018-06-15\n"), ("time_stratified_train", "20170301\tgone-2017\n")):
        with gzip.open(os.path.join(split_dir, f"{name}.gz"), "at", encoding="utf-8") as f:
            f.write(line)
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


def test_split_ids_the_corpus_lacks_are_counted_before_any_training_and_the_study_ends(own_data, study):
    """One id of the published test split and one of TIME-STRATIFIED's training split are not in the corpus: the
    data stage says so, before the first model trains, and the study runs to its results without them."""
    out, results, result = study
    for name in ("test", "time_stratified_train"):
        warning = (f"1 of {own_data['sizes']['test' if name == 'test' else 'ts_train'] + 1} id(s) in "
                   f"{os.path.join(own_data['split_dir'], name + '.gz')} are not in the corpus (first: gone-")
        assert warning in result.stderr
        assert result.stderr.index(warning) < result.stderr.index("reproduce [2/7]")
    splits = results["extra"]["streaming"]["published_splits"]
    assert (splits["test"]["missing"], splits["test"]["missing_ids"]) == (1, ["gone-2018-06-15"])
    assert splits["time_stratified_train"]["missing"] == 1 and splits["control_train"]["missing"] == 0
    with open(out / results["extra"]["streaming"]["results"], encoding="utf-8") as f:
        stream = json.load(f)
    assert stream["settings"]["n_documents"] == own_data["sizes"]["test"]  # the 36 documents the corpus holds


def test_a_mirror_s_release_trains_on_original_names_and_counts_a_repeated_id_once(own_data, study):
    """The mirror's answers (an alias list whose first name carries its asterisk, and `original_name`): the models
    train on the original name, never on an alias; a row repeating the id of an earlier one (a mirror's row after the
    release's) is one warning naming the id, and the same 24 test queries in the task data and the study's
    evaluation."""
    import tensorflow as tf

    out, results, result = study
    targets = {}
    for path in glob.glob(str(out / "data" / "templama" / "train-*.tfrecord")):
        for record in tf.data.TFRecordDataset(path).as_numpy_iterator():
            features = tf.train.Example.FromString(record).features.feature
            answers = [v.decode() for v in features["answers"].bytes_list.value]
            targets[features["id"].bytes_list.value[0].decode()] = (features["targets"].bytes_list.value[0].decode(),
                                                                    answers)
    mirrored = {i: t for i, (t, answers) in targets.items() if "Red Lions FC*" in answers or "The Stars*" in answers}
    assert mirrored and set(mirrored.values()) <= {"Red Lions", "Northern Stars"}, mirrored
    assert not any("*" in t for t, _ in targets.values())
    test_file = os.path.join(own_data["templama"], "test.json")
    assert result.stderr.count(f"{test_file}: 1 row(s) repeat the id of an earlier row (Q106_P54_2015)") == 1
    assert results["world"]["templama_splits"]["test"] == own_data["release"]["test"] == 24
    assert len(set(results["per_query"]["id"])) == len(results["per_query"]["id"]) == 24


def test_a_split_that_names_none_of_the_corpus_is_refused_before_any_work(own_data, tmp_path):
    split = tmp_path / "other" / "split_2017-09-30"
    os.makedirs(split)
    for name in ("time_stratified_train", "time_stratified_validation", "control_train", "control_validation",
                 "test"):
        with gzip.open(split / f"{name}.gz", "wt", encoding="utf-8") as f:
            f.write("20170101\tsomeone-else-1\n20170102\tsomeone-else-2\n")
    result = templm("reproduce", "--preset=tiny_test", f"--out={tmp_path / 'run'}", f"--corpus={own_data['corpus']}",
                    f"--templama_dir={own_data['templama']}", f"--split_dir={split}")
    assert result.returncode == 1
    assert f"{split / 'time_stratified_train.gz'}: none of the split's 2 document ids is in the corpus" in result.stderr
    assert "reproduce [2/7]" not in result.stderr and not os.path.exists(tmp_path / "run" / "models")


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


def test_mending_the_streaming_split_redoes_that_half_alone(own_data, study, tmp_path):
    """The split folder mended (the ids the corpus lacks taken out) and the study rerun: the time-aware half's
    models are reused as they are (their checkpoints untouched, the same F1), the streaming half starts afresh and
    says why; --only streaming then runs that half alone, its findings tested and the time-aware half's not."""
    out, results, _ = study
    rerun = tmp_path / "run"
    shutil.copytree(out, rerun)
    mended = tmp_path / "mended"
    os.makedirs(mended)
    for name in os.listdir(own_data["split_dir"]):
        with gzip.open(os.path.join(own_data["split_dir"], name), "rt", encoding="utf-8") as f:
            kept = [line for line in f if "\tgone-" not in line]
        with gzip.open(mended / name, "wt", encoding="utf-8") as f:
            f.writelines(kept)
    # The checkpoints' own files (a resumed trainer writes its config.gin again, as any run does).
    checkpoints = {p: os.stat(p).st_mtime_ns for p in glob.glob(str(rerun / "models" / "**"), recursive=True)
                   if os.path.isfile(p) and os.path.basename(p) != "config.gin" and "events.out" not in p}
    assert len(checkpoints) > 50
    result = templm("reproduce", "--preset=tiny_test", f"--out={rerun}", f"--corpus={own_data['corpus']}",
                    f"--templama_dir={own_data['templama']}", f"--split_dir={mended}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"reproduce: resuming the time-aware half's models in {rerun}" in result.stderr
    assert "reproduce: the streaming half starts afresh (changed since the earlier run: data.split_dir)" in \
        result.stderr
    assert "not in the corpus" not in result.stderr
    assert {p: os.stat(p).st_mtime_ns for p in checkpoints} == checkpoints
    with open(rerun / "results.json", encoding="utf-8") as f:
        again = json.load(f)
    assert again["findings"]["temporal_beats_uniform"]["effect"] == \
        results["findings"]["temporal_beats_uniform"]["effect"]
    assert again["extra"]["streaming"]["published_splits"]["test"]["missing"] == 0

    alone = templm("reproduce", "--preset=tiny_test", f"--out={rerun}", f"--corpus={own_data['corpus']}",
                   f"--templama_dir={own_data['templama']}", f"--split_dir={mended}", "--only=streaming")
    assert alone.returncode == 0, alone.stderr[-3000:]
    assert "train uniform and temporal: skipped: --only streaming" in alone.stderr
    with open(rerun / "results.json", encoding="utf-8") as f:
        found = json.load(f)["findings"]
    assert found["temporal_beats_uniform"]["evidence"].startswith("not tested: the ")
    assert found["temporal_beats_uniform"]["evidence"].endswith(" stage was skipped (--only streaming)")
    assert found["streaming_gap"]["n"] == again["findings"]["streaming_gap"]["n"] > 0
    assert {p: os.stat(p).st_mtime_ns for p in checkpoints} == checkpoints  # the other half's models are kept
