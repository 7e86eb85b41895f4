"""The fault matrix of the output-folder contract, generated from the verbs' table (templm.cli.VERBS): every verb
that writes a folder is run against each kind of bad output folder (a user's folder of other files, '.', a file
where the folder goes) and must refuse it before any work, with exit 1, one line naming the cause, and the user's
files as they were. Every verb must appear in OUTPUTS: a verb added later that does not say how it names its output
(or why it writes none) fails `test_every_verb_joins_the_matrix`. docs/failures.md's table states the same contract.

The runs are in this process (templm.cli.main); each refusal comes before any model, world or corpus is touched, so
the matrix costs seconds."""

import os

import pytest

from templm.cli import VERBS
from templm_testing import (REPO, VERB_T5, VERB_TASK_FLAGS, VERB_WORLD_FLAGS, folder_contents, run_templm,
                            signal_at)

# verb -> how its output folder is named on the command line (a function of the folder), or why it has none.
OUTPUTS = {
    "data world": lambda out, i: ["data", "world", f"--out={out}", "--start_year=2014", "--end_year=2015",
                                  "--subjects_per_relation=4", "--docs_per_month=2"],
    "data splits": lambda out, i: ["data", "splits", f"--corpus={i['corpus']}", f"--out={out}"],
    "data templama": lambda out, i: ["data", "templama", f"--dump={i['corpus']}", f"--out={out}"],
    "data streams": lambda out, i: ["data", "streams", f"--corpus={i['corpus']}", f"--split_dir={i['root']}",
                                    f"--spm_model={i['root'] / 'no.model'}", f"--out={out}"],
    "data cronquestions": lambda out, i: ["data", "cronquestions", f"--release={i['root']}", f"--out={out}"],
    "data tasks": lambda out, i: ["data", "tasks", f"--out={out}", "--vocab_size=100"],
    "data calm": lambda out, i: ["data", "calm", f"--out={out}", f"--texts={i['texts']}"],
    "reproduce": lambda out, i: ["reproduce", "--preset=tiny_test", f"--out={out}"],
    "is-eval": lambda out, i: ["is-eval", f"--out={out}"],
    "appendices": lambda out, i: ["appendices", f"--out={out}", "--preset=tiny_test"],
    "calm": lambda out, i: ["calm", "--gin_file=calm/txl_online.gin", f"--gin.OUT_DIR='{out}'"],
    "stream": lambda out, i: ["stream", "--gin_file=txl/dynamic_eval.gin", f"--gin.OUT_DIR='{out}'",
                              f"--gin.TIME_STRATIFIED_DIR='{i['root'] / 'no_run'}'",
                              f"--gin.CONTROL_DIR='{i['root'] / 'no_run'}'"],
    # A run folder (MODEL_DIR) may hold a user's files beside the run (T5X's does): '.' and a file are refused.
    "train": lambda out, i: ["train", "--gin_file=gin_configs/temporal.gin", "--gin_file=gin_configs/runs/cpu_demo.gin",
                             f"--gin.MODEL_DIR='{out}'"],
    "train-lm": lambda out, i: ["train-lm", "--gin_file=txl/time_stratified.gin", "--gin_file=txl/tiny.gin",
                                f"--gin.MODEL_DIR='{out}'", f"--gin.CORPUS='{i['corpus']}'",
                                f"--gin.SPLIT_DIR='{i['root']}'", f"--gin.SPM_MODEL='{i['root'] / 'no.model'}'"],
    "data stats": "reads only",
    "data spm": "writes a file pair at a prefix, replaced together (tests/data/test_vocab.py)",
    "plan": "writes nothing",
    "eval": "writes files into MODEL_DIR or --out, each whole (tests/training/test_trainer.py)",
    "infer": "writes one file, whole (tests/test_cli.py)",
}
RUN_FOLDERS = ("train", "train-lm")  # a user's files beside the run are allowed


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("matrix")
    (root / "corpus.jsonl").write_text('{"id": "a", "date": "2014-01-01", "text": "one two three"}\n')
    (root / "texts").mkdir()
    (root / "texts" / "news.txt").write_text("one two three\n")
    return {"root": root, "corpus": root / "corpus.jsonl", "texts": root / "texts"}


# A user's files named as templm's own outputs name theirs (is-eval replaced a user's is_eval.json: the names alone
# had marked an older output): each verb meets a file named like its own.
USERS_FILES = {"notes.md": "mine", **{name: '{"mine": true}' for name in
                                      ("is_eval.json", "manifest.json", "run.json", "stats.json", "results.json")}}


def _users_folder(path):
    path.mkdir()
    for name, text in USERS_FILES.items():
        (path / name).write_text(text)
    (path / "sub").mkdir()
    return USERS_FILES


def test_every_verb_joins_the_matrix():
    assert set(OUTPUTS) == set(VERBS), "a verb must say how it names its output folder, or why it has none"


CASES = [(verb, kind) for verb, how in OUTPUTS.items() if callable(how)
         for kind in ("a user's folder", "'.'", "a file") if not (verb in RUN_FOLDERS and kind == "a user's folder")]


@pytest.mark.parametrize("verb, kind", CASES)
def test_a_bad_output_folder_is_refused_before_any_work(inputs, tmp_path, verb, kind):
    if kind == "a user's folder":
        out = tmp_path / "mine"
        kept = _users_folder(out)
        cause = "the output folder is not empty and is not a templm output"
    elif kind == "'.'":
        out, kept, cause = ".", None, "names the current or parent folder"
    else:
        out = tmp_path / "a_file"
        out.write_text("a user's file")
        kept, cause = None, "is a file"
    before = sorted(os.listdir(tmp_path))
    result = run_templm(*OUTPUTS[verb](out, inputs), **({"cwd": tmp_path} if kind == "'.'" else {}))
    assert result.returncode == 1, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith(f"templm {verb}: error: ") and cause in lines[-1], result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert sorted(os.listdir(tmp_path)) == before  # nothing beside it (no .partial, no .lock)
    if kept:
        assert sorted(os.listdir(out)) == sorted([*kept, "sub"])
        assert all((out / name).read_text() == text for name, text in kept.items())
    if kind == "a file":
        assert out.read_text() == "a user's file"


# The verbs that write into their folder as they go, and the lock they hold beside it for the whole verb.
WRITE_INTO = ("is-eval", "appendices", "calm", "stream")
# The verbs that build their folder in `<folder>.partial` under the same lock beside it, and the one that keeps
# adding to its folder under a lock inside it.
BUILDERS = ("data world", "data splits", "data streams", "data templama", "data cronquestions", "data tasks",
            "data calm")
SECOND_RUN = {**{verb: lambda out: f"{out}.lock" for verb in WRITE_INTO + BUILDERS},
              **{verb: lambda out: f"{out}/.templm.lock" for verb in ("reproduce", "train-lm")}}


@pytest.mark.parametrize("verb", sorted(SECOND_RUN))
def test_a_second_run_on_the_same_folder_is_refused_naming_the_first(inputs, verb_inputs, tmp_path, verb):
    """is-eval, appendices, calm and stream took no lock: two runs on one folder wrote into it at once. Each holds
    `<folder>.lock` for the whole verb, its report included, as the data verbs hold it while they build; a second run
    is refused, naming the first, before any work."""
    from templm_testing import lock_holder

    out = tmp_path / "out"
    holder = lock_holder(SECOND_RUN[verb](out), "the first run")
    # train-lm reads its splits and vocabulary before it takes its folder: it is given real ones.
    args = ([a.replace("{out}", str(out)) for a in _full_disk_cases(verb_inputs)[verb][0]] if verb == "train-lm"
            else OUTPUTS[verb](out, inputs))
    try:
        result = run_templm(*args)
    finally:
        holder.kill()
        holder.wait()
    assert result.returncode == 1, result.stderr[-2000:]
    assert f"{out} is in use by `" in result.stderr.strip().splitlines()[-1], result.stderr[-2000:]
    if verb in ("reproduce", "train-lm"):  # the first run's folder (made by it): nothing of the second in it
        assert os.listdir(out) in ([], [".templm.lock"]), os.listdir(out)
    else:
        assert not out.exists()


# Full disk: each verb that writes runs in this process with its files limited to a few bytes (a write past the limit
# fails with EFBIG, "File too large", as one on a full disk fails with ENOSPC; SIGXFSZ ignored for the call), the
# limit chosen to fall inside the verb's own output (a lock's line, a world's first file, a result file). The verb
# must end with exit 4, one line naming the file it was writing, no traceback, and nothing half-written: a folder it
# builds absent with no `.partial` or `.lock` beside it, no temporary file in a folder it writes into.
def _full_disk_cases(i):
    """verb -> (arguments with `{out}`, environment, file-size limit in bytes, whether the verb builds `{out}`)."""
    news = i["world"] / "news.jsonl"
    data_env = {"TEMPLM_DATA_DIR": str(i["data"])}
    dump = os.path.join(REPO, "tests", "fixtures", "wikidata_dump.json")
    return {
        "data world": (("data", "world", "--out={out}", *VERB_WORLD_FLAGS), None, 300, True),
        "data splits": (("data", "splits", f"--corpus={news}", "--out={out}", "--cutoff=2016-06-30",
                         "--test_docs_per_month=2", "--test_months=6", "--heldout_per_year=4", "--allow_degenerate"),
                        None, 300, True),
        "data spm": (("data", "spm", f"--corpus={news}", "--out={out}/spm", "--vocab_size=150"), None, 300, False),
        "data streams": (("data", "streams", f"--corpus={news}", f"--split_dir={i['splits']}",
                          f"--spm_model={i['spm']}", "--out={out}"), None, 300, True),
        "data templama": (("data", "templama", "--norequire_enwiki", f"--dump={dump}", "--out={out}",
                           "--max_subjects=4"), None, 300, True),
        "data cronquestions": (("data", "cronquestions", f"--release={i['release']}", "--out={out}"), None, 300, True),
        "data tasks": (("data", "tasks", "--out={out}", *VERB_TASK_FLAGS), None, 300, True),
        "data calm": (("data", "calm", "--out={out}", f"--texts={i['texts']}", "--level=char"), None, 300, True),
        "train": (("train", *VERB_T5, "--gin.MODEL_DIR='{out}'", "--gin.TRAIN_STEPS=3"), data_env, 300, False),
        "eval": (("eval", *VERB_T5, f"--gin.MODEL_DIR='{i['model']}'", "--split=validation",
                  "--eval_task=templama_temporal", "--num_examples=8", "--out={out}"), data_env, 300, False),
        "infer": (("infer", *VERB_T5, f"--gin.MODEL_DIR='{i['model']}'", f"--input={i['queries']}",
                   "--output={out}/predictions.jsonl"), data_env, 20, False),
        "reproduce": (("reproduce", "--preset=tiny_test", "--out={out}"), None, 300, False),
        "is-eval": (("is-eval", "--out={out}", "--seed=1", "--ks=1,4", "--temperatures=0.5", "--repeats=2",
                     "--num_docs=3", "--doc_length=8"), None, 300, False),
        "appendices": (("appendices", "--out={out}", "--preset=tiny_test", "--shifts=0,1"), None, 300, False),
        "calm": (("calm", "--gin_file=calm/txl_online.gin", "--gin.OUT_DIR='{out}'"), None, 300, False),
        "train-lm": (("train-lm", "--gin_file=txl/time_stratified.gin", "--gin_file=txl/tiny.gin",
                      "--gin.MODEL_DIR='{out}'", f"--gin.CORPUS='{news}'", f"--gin.SPLIT_DIR='{i['splits']}'",
                      f"--gin.SPM_MODEL='{i['spm']}'"), None, 300, False),
        # stream reads trained runs before it writes more than its lock: the limit falls on the lock's line.
        "stream": (("stream", "--gin_file=txl/dynamic_eval.gin", "--gin.OUT_DIR='{out}'",
                    f"--gin.TIME_STRATIFIED_DIR='{i['root'] / 'no_run'}'",
                    f"--gin.CONTROL_DIR='{i['root'] / 'no_run'}'"), None, 10, False),
    }


FULL_DISK = ["data world", "data splits", "data spm", "data streams", "data templama", "data cronquestions",
             "data tasks", "data calm", "train", "train-lm", "eval", "infer", "reproduce", "is-eval", "appendices",
             "calm", "stream"]


def _with_files_limited(limit, args, env):
    import resource
    import signal

    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        return run_templm(*args, env=env)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)


@pytest.mark.parametrize("verb", FULL_DISK)
def test_a_full_disk_is_exit_4_naming_the_file_with_nothing_half_written(verb_inputs, tmp_path, verb):
    args, env, limit, builds = _full_disk_cases(verb_inputs)[verb]
    out = tmp_path / "out"
    if verb == "infer":
        out.mkdir()
    result = _with_files_limited(limit, [a.replace("{out}", str(out)) for a in args], env)
    assert result.returncode == 4, result.stderr[-2000:]
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith(f"templm {verb}: error: {out}") and "File too large" in line, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    beside = sorted(os.listdir(tmp_path))  # no `out.partial`, no `out.lock`; a built folder not there at all
    assert beside == ([] if builds else ["out"] if out.exists() else []), beside
    left = [os.path.relpath(os.path.join(folder, name), out) for folder, dirs, names in os.walk(out)
            for name in names + dirs]
    assert not [p for p in left if p.endswith((".tmp", ".partial", ".lock"))], left


# A value of the wrong kind: a string where a number goes, as a gin binding (exit 1, the binding named: checked where
# its config is made, templm.errors.require_field_types) or as a flag (exit 2, the flag named: absl's parser). Each
# verb is given one that it reads, and must refuse it before any work: nothing in the folder it would have written.
def _wrong_kind_cases(i):
    """verb -> (arguments with `{out}`, exit status, what the message names)."""
    news = i["world"] / "news.jsonl"
    no_run = i["root"] / "no_run"
    model = f"--gin.MODEL_DIR='{i['model']}'"
    return {
        "data world": (("data", "world", "--out={out}", "--gin.WorldConfig.docs_per_month='six'"), 1,
                       "templm.WorldConfig.docs_per_month"),
        "data stats": (("data", "stats", f"--corpus={news}", "--on_error=maybe"), 2, "--on_error"),
        "data splits": (("data", "splits", f"--corpus={news}", "--out={out}", "--test_months=six"), 2, "--test_months"),
        "data spm": (("data", "spm", f"--corpus={news}", "--out={out}/spm", "--vocab_size=big"), 2, "--vocab_size"),
        "data streams": (("data", "streams", f"--corpus={news}", f"--split_dir={i['splits']}",
                          f"--spm_model={i['spm']}", "--out={out}", "--on_error=maybe"), 2, "--on_error"),
        "data templama": (("data", "templama", "--dump=tests/fixtures/wikidata_dump.json", "--out={out}",
                           "--max_subjects=four"), 2, "--max_subjects"),
        "data cronquestions": (("data", "cronquestions", f"--release={i['release']}", "--out={out}",
                                "--max_questions=one"), 2, "--max_questions"),
        "data tasks": (("data", "tasks", "--out={out}", "--gin.WorldConfig.docs_per_month='six'"), 1,
                       "templm.WorldConfig.docs_per_month"),
        "data calm": (("data", "calm", "--out={out}", f"--texts={i['texts']}", "--seed=zero"), 2, "--seed"),
        "train": (("train", *VERB_T5, "--gin.MODEL_DIR='{out}'", "--gin.TRAIN_STEPS='ten'"), 1, "TRAIN_STEPS"),
        "plan": (("plan", *VERB_T5, "--gin.templm.T5Config.num_heads='four'", "--devices=1"), 1,
                 "templm.T5Config.num_heads"),
        "eval": (("eval", *VERB_T5, model, "--gin.templm.T5Config.num_heads='four'", "--out={out}"), 1,
                 "templm.T5Config.num_heads"),
        "infer": (("infer", *VERB_T5, model, "--gin.templm.T5Config.num_heads='four'", f"--input={i['queries']}",
                   "--output={out}/predictions.jsonl"), 1, "templm.T5Config.num_heads"),
        "reproduce": (("reproduce", "--preset=tiny_test", "--out={out}", "--gin.templm.Study.data_shards='two'"), 1,
                      "templm.Study.data_shards"),
        "is-eval": (("is-eval", "--out={out}", "--num_docs=three"), 2, "--num_docs"),
        "appendices": (("appendices", "--out={out}", "--preset=tiny_test", "--seed=zero"), 2, "--seed"),
        "calm": (("calm", "--gin_file=calm/txl_online.gin", "--gin.OUT_DIR='{out}'", "--gin.SEED='zero'"), 1,
                 "templm.WorldConfig.seed"),
        "train-lm": (("train-lm", "--gin_file=txl/time_stratified.gin", "--gin_file=txl/tiny.gin",
                      "--gin.MODEL_DIR='{out}'", f"--gin.CORPUS='{news}'", f"--gin.SPLIT_DIR='{no_run}'",
                      f"--gin.SPM_MODEL='{no_run}.model'", "--gin.SEED='zero'"), 1, "SEED"),
        "stream": (("stream", "--gin_file=txl/dynamic_eval.gin", "--gin.OUT_DIR='{out}'",
                    f"--gin.TIME_STRATIFIED_DIR='{no_run}'", f"--gin.CONTROL_DIR='{no_run}'",
                    "--gin.BATCH_SIZE='one'"), 1, "templm.StreamData.batch_size"),
    }


def test_every_verb_is_given_a_value_of_the_wrong_kind(verb_inputs):
    assert set(_wrong_kind_cases(verb_inputs)) == set(VERBS)


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_a_value_of_the_wrong_kind_is_refused_naming_it_before_any_work(verb_inputs, tmp_path, verb):
    args, status, named = _wrong_kind_cases(verb_inputs)[verb]
    out = tmp_path / "out"
    result = run_templm(*(a.replace("{out}", str(out)) for a in args),
                        env={"TEMPLM_DATA_DIR": str(verb_inputs["data"])})
    assert result.returncode == status, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith(f"templm {verb}: error: ") and named in lines[-1], result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert os.listdir(tmp_path) == []  # nothing made: no output folder, no lock, no partial folder


# Every cell of the contract (templm.cli.contracts, docs/failures.md's table) and the tests that check it: the
# generated tests of this file for the verbs they run, and tests elsewhere, by `file::name`. A cell with none must be
# in contracts.UNCHECKED (the page marks it), and a cell there must have none: the list only shrinks.
_START = "tests/test_cli.py::test_ctrl_c_or_sigterm_while_the_command_starts_is_one_line"  # the start every verb shares
_DATA_SIGNAL = "tests/test_cli.py::test_ctrl_c_or_sigterm_stops_a_data_verb_with_its_status_and_removes_the_partial_folder"
_TWICE = "tests/test_reentrant_cli.py::test_a_verb_twice_in_one_process_equals_a_fresh_process"
ELSEWHERE = {
    ("data world", "Ctrl-C (130) / SIGTERM (75)"): [_DATA_SIGNAL],
    ("data tasks", "Ctrl-C (130) / SIGTERM (75)"): [_DATA_SIGNAL],
    ("train", "Ctrl-C (130) / SIGTERM (75)"): [
        "tests/training/test_trainer.py::test_sigterm_saves_exits_as_preempted_and_a_rerun_resumes",
        "tests/training/test_trainer.py::test_sigterm_during_the_last_evaluation_stops_it_and_the_rerun_evaluates_that_step",
        "tests/training/test_loop.py::test_sigterm_during_the_last_save_is_not_dropped"],
    ("train-lm", "Ctrl-C (130) / SIGTERM (75)"): ["tests/training/test_loop.py::test_sigterm_saves_then_raises_and_a_rerun_resumes"],
    ("reproduce", "Ctrl-C (130) / SIGTERM (75)"): [
        "tests/cloud/test_study.py::test_a_study_of_two_seeds_into_a_bucket_stopped_and_resumed_gives_each_seed_s_numbers"],
    ("stream", "Ctrl-C (130) / SIGTERM (75)"): [
        "tests/experiments/test_streaming.py::test_a_signal_during_dynamic_evaluation_is_one_line_and_no_crash"],
    ("train", "a second run at once"): ["tests/training/test_trainer.py::test_a_second_run_on_a_model_dir_in_use_is_refused"],
    ("data tasks", "a second run at once"): [
        "tests/test_outputs.py::test_two_task_data_builds_on_one_folder_at_once_one_is_refused_and_the_folder_is_whole"],
    ("data world", "a second run at once"): [
        "tests/test_outputs.py::test_a_second_writer_is_refused_naming_the_first_and_a_killed_holder_frees_the_lock"],
    ("train", "run again"): ["tests/cloud/test_train.py::test_train_into_a_bucket_resumes_bitwise_after_kill_9_and_sigterm",
                             "tests/training/test_trainer.py::test_resuming_with_other_settings_is_refused_naming_the_binding_before_any_step"],
    ("train-lm", "run again"): ["tests/training/test_lm_trainer.py::test_resume_is_bitwise_exact_with_memories_across_an_epoch"],
    ("reproduce", "run again"): [
        "tests/experiments/test_reproduce.py::test_a_rerun_that_fails_on_a_damaged_model_keeps_the_results_and_says_what_to_do"],
    ("data world", "run again"): ["tests/test_outputs.py::test_data_world_refuses_then_overwrites_when_asked"],
    ("data splits", "run again"): [
        "tests/test_cli.py::test_data_splits_and_templama_leave_a_users_folder_alone_and_change_theirs_all_at_once"],
    ("data templama", "run again"): [
        "tests/test_cli.py::test_data_splits_and_templama_leave_a_users_folder_alone_and_change_theirs_all_at_once"],
    ("data spm", "run again"): ["tests/data/test_vocab.py::test_same_seed_same_bytes"],
    ("calm", "run again"): ["tests/experiments/test_calm.py::test_templm_calm_end_to_end"],
    ("stream", "run again"): [
        "tests/experiments/test_streaming.py::test_stream_again_into_its_own_folder_gives_the_same_output"],
    ("appendices", "run again"): [
        "tests/experiments/test_appendices.py::test_the_appendices_again_into_their_own_folder_give_the_same_output"],
    **{(verb, "run again"): [_TWICE] for verb in ("data stats", "eval", "infer", "plan")},
}


def _generated(verb, fault):
    """This file's generated tests that check the cell."""
    return {
        "bad input": ["test_a_value_of_the_wrong_kind_is_refused_naming_it_before_any_work"],
        "a bad output folder": (["test_a_bad_output_folder_is_refused_before_any_work"]
                                if callable(OUTPUTS.get(verb)) else []),
        "full disk (4)": ["test_a_full_disk_is_exit_4_naming_the_file_with_nothing_half_written"]
        if verb in FULL_DISK else [],
        "Ctrl-C (130) / SIGTERM (75)": (["test_sigterm_while_the_verb_works_is_exit_75_one_line_and_no_result"]
                                        if verb in SIGNALLED else []),
        "a second run at once": (["test_a_second_run_on_the_same_folder_is_refused_naming_the_first"]
                                 if verb in SECOND_RUN else []),
        "run again": ["test_the_same_command_again_on_its_own_folder_gives_the_same_output"] if verb in RUN_AGAIN else [],
    }[fault]


def _test_exists(test_id):
    import ast

    path, name = test_id.split("::")
    with open(os.path.join(REPO, path), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    return any(isinstance(node, ast.FunctionDef) and node.name == name for node in tree.body)


def test_every_cell_of_the_contract_names_the_tests_that_check_it():
    from templm.cli import contracts

    assert {v for verbs, _ in contracts.ROWS for v in verbs} == set(VERBS)
    assert sum(len(verbs) for verbs, _ in contracts.ROWS) == len(VERBS)  # each verb in one row
    unchecked = set()
    for verb in VERBS:
        for fault in contracts.FAULTS:
            elsewhere = ELSEWHERE.get((verb, fault), [])
            assert all(_test_exists(t) for t in elsewhere), [t for t in elsewhere if not _test_exists(t)]
            if contracts.applies(verb, fault) and not (_generated(verb, fault) or elsewhere):
                unchecked.add((verb, fault))
    # A signal while starting is checked for every verb at once (the start they share; a verb that loads TensorFlow
    # and one that does not): the column's cells need a test of the moment the verb works.
    assert _test_exists(_START)
    assert unchecked == set(contracts.UNCHECKED), {"unchecked, not listed": unchecked - set(contracts.UNCHECKED),
                                                   "listed, now checked": set(contracts.UNCHECKED) - unchecked}


def test_the_failures_page_holds_the_contract_table():
    import subprocess
    import sys

    result = subprocess.run([sys.executable, os.path.join(REPO, "tools", "failures_table.py"), "--check"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


# Run again: the same command into the folder of its finished run replaces that run's output with the same output
# (a builder's folder is rebuilt and swapped in whole; a verb that writes into its folder writes it again), exit 0.
RUN_AGAIN = ("data tasks", "data streams", "data cronquestions", "data calm", "is-eval")


@pytest.mark.parametrize("verb", RUN_AGAIN)
def test_the_same_command_again_on_its_own_folder_gives_the_same_output(verb_inputs, tmp_path, verb):
    args, env, _, _ = _full_disk_cases(verb_inputs)[verb]
    out = tmp_path / "out"
    seen = []
    for _ in range(2):
        result = run_templm(*(a.replace("{out}", str(out)) for a in args), env=env)
        assert result.returncode == 0, result.stderr[-2000:]
        seen.append(folder_contents(out))
    assert seen[0] == seen[1] and seen[0]
    assert sorted(os.listdir(tmp_path)) == ["out"]  # no old copy, partial folder or lock beside it


# SIGTERM while the verb works: the signal is sent by this process to itself at a moment the verb itself makes, the
# first time it opens a file of its own work (found by Python's audit hook on `open`: a file it writes under its
# output folder, or the input it reads where it writes none), so that it lands mid-work whatever the machine's speed.
# The verb must end with exit 75 and one line, and leave no result from unfinished work: a folder it builds absent
# with nothing beside it, no result file in a folder it writes into unless the line says the result was complete
# (a signal during the result's commit waits for its last rename).
_AUDIT = {"prefix": None, "write": True, "fired": False}


def _on_open(event, args):
    if event != "open" or _AUDIT["prefix"] is None or _AUDIT["fired"]:
        return
    path, mode, flags = args
    if not isinstance(path, str) or not path.startswith(_AUDIT["prefix"]) or "/." in path[len(_AUDIT["prefix"]):]:
        return  # not the verb's own work (a lock, a marker, a temporary name beside a file is its own dot-name)
    writes = (mode is not None and any(c in mode for c in "wax+")) or (
        mode is None and isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR))
    if writes or not _AUDIT["write"]:
        import signal

        _AUDIT["fired"] = True
        os.kill(os.getpid(), signal.SIGTERM)


def _signal_cases(i, out):
    """verb -> (arguments, the path whose first opening sends the signal, whether that opening is a write)."""
    news = i["world"] / "news.jsonl"
    cases = _full_disk_cases(i)
    run = lambda verb: [a.replace("{out}", str(out)) for a in cases[verb][0]]  # noqa: E731
    return {
        "data stats": (["data", "stats", f"--corpus={news}"], str(news), False),
        "data splits": (run("data splits"), f"{out}.partial/", True),
        "data spm": (run("data spm"), f"{out}/", True),
        "data streams": (run("data streams"), f"{out}.partial/", True),
        "data templama": (run("data templama"), f"{out}.partial/", True),
        "data cronquestions": (run("data cronquestions"), f"{out}.partial/", True),
        "data calm": (run("data calm"), f"{out}.partial/", True),
        "plan": (["plan", *VERB_T5, "--devices=1", "--device_kind=a100_80"],
                 os.path.join(REPO, "templm", "gin_configs", "models"), False),
        "eval": (run("eval"), f"{i['model']}/checkpoints/", False),
        "infer": (run("infer"), f"{i['model']}/checkpoints/", False),
        "is-eval": (run("is-eval"), f"{out}/", True),
        # Their first work is the world (or the shifted periods' data) they build inside their folder.
        "calm": (run("calm"), f"{out}/", True),
        "appendices": (run("appendices"), f"{out}/", True),
    }


SIGNALLED = ["data stats", "data splits", "data spm", "data streams", "data templama", "data cronquestions",
             "data calm", "plan", "eval", "infer", "is-eval", "calm", "appendices"]


@pytest.mark.parametrize("verb", SIGNALLED)
def test_sigterm_while_the_verb_works_is_exit_75_one_line_and_no_result(verb_inputs, tmp_path, verb):
    import sys

    out = tmp_path / "out"
    args, prefix, write = _signal_cases(verb_inputs, out)[verb]
    if not getattr(sys, "_templm_fault_matrix_hook", False):
        sys.addaudithook(_on_open)  # for the rest of the process; idle unless a prefix is set
        sys._templm_fault_matrix_hook = True
    if verb == "infer":
        out.mkdir()
    _AUDIT.update(prefix=prefix, write=write, fired=False)
    try:
        result = run_templm(*args, env={"TEMPLM_DATA_DIR": str(verb_inputs["data"])})
    finally:
        fired = _AUDIT["fired"]
        _AUDIT.update(prefix=None, fired=False)
    assert fired, f"the verb never opened {prefix}"
    assert result.returncode == 75, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith(f"templm {verb}: stopped by SIGTERM"), result.stderr[-2000:]
    assert "Traceback" not in result.stderr and not result.stdout.strip(), (result.stdout, result.stderr)
    whole = "written whole" in lines[-1]
    beside = sorted(os.listdir(tmp_path))
    left = sorted(os.path.relpath(os.path.join(folder, name), out) for folder, _, names in os.walk(out)
                  for name in names) if out.exists() else []
    if verb.startswith("data ") and verb != "data spm":
        assert beside == [] or (whole and beside == ["out"]), beside
    else:
        assert not [p for p in beside if p.endswith((".lock", ".partial"))], beside
        assert whole or not [p for p in left if not os.path.basename(p).startswith(".")], left


def test_sigterm_once_the_result_is_written_lets_the_report_finish_and_says_the_result_is_complete(verb_inputs,
                                                                                                     tmp_path):
    """SIGTERM as is-eval's report went into place (its results already written) stopped the verb before its figure
    and said that no result was written; `templm stream` under load printed its whole summary and then said the same
    (tests/experiments/test_streaming.py). Once a verb has written its result (errors.result_in_place) a signal waits
    for the report and the summary: exit 75 as for any stop, the line saying the result is complete."""
    import signal

    out = tmp_path / "out"
    with signal_at(signal.SIGTERM, renamed=out / "is_eval.md") as hook:
        result = run_templm(*[a.replace("{out}", str(out)) for a in _full_disk_cases(verb_inputs)["is-eval"][0]])
    assert hook.fired, "is-eval never put is_eval.md in place"
    assert result.returncode == 75, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1] == (
        "templm is-eval: stopped by SIGTERM after its results were written; they are complete"), result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert result.stdout == (out / "is_eval.md").read_text(encoding="utf-8") + "\n"  # the summary, whole
    assert (out / "is_eval.png").read_bytes().startswith(b"\x89PNG")  # the report's figure, after the signal


def test_a_model_too_large_for_the_machine_is_refused_before_anything_is_allocated(verb_inputs, tmp_path):
    """An emb_dim of 2^26 (1.2 TiB of parameters) grew `templm train` until the system killed it; the parameters'
    size is computed from their shapes first (templm.training.state.require_params_fit)."""
    result = run_templm("train", *VERB_T5, f"--gin.MODEL_DIR='{tmp_path / 'm'}'", "--gin.TRAIN_STEPS=2",
                        "--gin.templm.T5Config.emb_dim=67108864", env={"TEMPLM_DATA_DIR": str(verb_inputs["data"])})
    assert result.returncode == 1, result.stderr[-2000:]
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("templm train: error: the model's ") and "TiB, more than half of this machine" in line, line
    assert not (tmp_path / "m" / "checkpoints").exists() or not os.listdir(tmp_path / "m" / "checkpoints")


def test_xla_refusing_a_step_s_memory_is_one_line_with_the_remedies():
    """The paper's config on a laptop compiled its step, then XLA refused its 179 GiB: a 61-line traceback. The
    same refusal, made by XLA here, becomes one line (templm.cli.dispatch) naming the size and what to lower."""
    import jax
    import jax.numpy as jnp

    from templm.cli.dispatch import _out_of_device_memory

    try:
        jax.jit(lambda x: jnp.zeros((2 ** 40,)) + x)(1.0).block_until_ready()
    except Exception as e:  # noqa: BLE001  (XLA's own error type, whatever jax calls it)
        refused = e
    said = _out_of_device_memory("train", refused)
    assert said is not None and said.startswith("the device has too little memory for the compiled step (4,096.0 GiB")
    assert "microbatches" in said and "templm plan" in said
    assert _out_of_device_memory("train", RuntimeError("Out of memory")) is None  # only XLA's refusal
