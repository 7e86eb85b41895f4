"""Output folders and locks (templm/outputs.py): a folder that is not templm's output of the same kind is never
replaced without --overwrite (its files stay), two runs never write one folder at once, and the lock of a run killed
with kill -9 does not block the next one."""

import json
import os
import signal
import subprocess
import sys

import pytest

from templm.data.task_data import TaskDataConfig, prepare_task_data
from templm.data.world import WorldConfig, generate_world
from templm.errors import ConfigError, DataError
from templm.outputs import MARKER, build_output_folder, check_output_folder, kind_of, locked
from templm_testing import lock_holder, run_templm as templm, wait_for_path

TINY_WORLD = WorldConfig(start_year=2014, end_year=2015, subjects_per_relation=4, docs_per_month=3)
WORLD_FLAGS = ("--start_year=2014", "--end_year=2015", "--subjects_per_relation=4", "--docs_per_month=3")


def _mine(folder):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "notes.md").write_text("my notes")
    (folder / "sub").mkdir(exist_ok=True)
    (folder / "sub" / "data.csv").write_text("1,2\n")
    return folder


def test_a_folder_of_someone_elses_files_is_refused_and_left_as_it_was(tmp_path):
    mine = _mine(tmp_path / "mine")
    with pytest.raises(DataError, match=r"not empty and is not a templm output, not a world \(notes.md, sub\)") as e:
        generate_world(TINY_WORLD, str(mine))
    assert e.value.path == str(mine) and "--overwrite" in str(e.value)
    assert sorted(os.listdir(mine)) == ["notes.md", "sub"] and (mine / "notes.md").read_text() == "my notes"
    assert not os.path.exists(str(mine) + ".partial")
    # Another kind of templm output is refused too; the same kind is rebuilt in place.
    world = tmp_path / "world"
    generate_world(TINY_WORLD, str(world))
    assert kind_of(str(world)) == "world" and json.loads((world / MARKER).read_text())["kind"] == "world"
    with pytest.raises(DataError, match="is a templm world, not a task data"):
        prepare_task_data(TaskDataConfig(world=TINY_WORLD, vocab_size=200), str(world))
    stats = generate_world(WorldConfig(seed=1, start_year=2014, end_year=2015, subjects_per_relation=4,
                                       docs_per_month=3), str(world))
    assert json.loads((world / "stats.json").read_text()) == stats and stats["config"]["seed"] == 1
    # --overwrite: the caller asked for it.
    generate_world(TINY_WORLD, str(mine), overwrite=True)
    assert kind_of(str(mine)) == "world" and not (mine / "notes.md").exists()


def test_folders_written_before_the_markers_are_known_by_their_files(tmp_path):
    old = tmp_path / "old_world"
    generate_world(TINY_WORLD, str(old))
    os.remove(old / MARKER)
    assert kind_of(str(old)) == "world"
    check_output_folder(str(old), "world")
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(DataError, match="is a file, not a folder"):
        check_output_folder(str(a_file), "world")
    # A user's file that merely has the name of one of those files is not templm's (the fault campaign: `is-eval`
    # replaced a user's is_eval.json): what the file holds decides.
    older = {"is_eval.json": ("importance-sampling evaluation", {"config": {}, "rows": []}),
             "manifest.json": ("task data", {"version": 1, "years": [2015], "counts": {}}),
             "run.json": ("reproduction", {"halves": {}})}
    for name, (kind, held) in older.items():
        folder = tmp_path / name.replace(".", "_")
        folder.mkdir()
        (folder / name).write_text(json.dumps(held))
        assert kind_of(str(folder)) == kind
        check_output_folder(str(folder), kind)
        for users in ('{"mine": true}', "[1, 2]", "not json", "[" * 100_000):
            (folder / name).write_text(users)
            assert kind_of(str(folder)) == "", users[:10]
            with pytest.raises(DataError, match=rf"is not a templm output, not an? {kind} \({name}\)"):
                check_output_folder(str(folder), kind)
            assert (folder / name).read_text() == users
    vocab = tmp_path / "calm" / "vocab"
    vocab.mkdir(parents=True)
    assert kind_of(str(vocab.parent)) == ""  # an empty folder named vocab
    (vocab / "a.vocab").write_text("a\t1\n")
    assert kind_of(str(vocab.parent)) == "CALM corpus"
    (vocab / "notes.md").write_text("mine")
    assert kind_of(str(vocab.parent)) == ""


def test_a_failed_build_leaves_the_earlier_output_and_no_partial_folder(tmp_path):
    out = tmp_path / "out"
    build_output_folder(str(out), "thing", lambda tmp: open(os.path.join(tmp, "a.txt"), "w").write("first"))

    def fail(tmp):
        open(os.path.join(tmp, "a.txt"), "w").write("second")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        build_output_folder(str(out), "thing", fail)
    assert (out / "a.txt").read_text() == "first" and not os.path.exists(str(out) + ".partial")
    assert sorted(os.listdir(tmp_path)) == ["out"]  # no partial folder, no lock file left


def _write(name, text):
    def build(tmp):
        with open(os.path.join(tmp, name), "w") as f:
            f.write(text)
    return build


def _tree(folder):
    return {os.path.relpath(os.path.join(root, n), folder): open(os.path.join(root, n)).read()
            for root, _, names in os.walk(folder) for n in names}


def test_the_names_beside_an_output_are_never_a_users(tmp_path):
    """W.partial, W.lock and W.old beside W: what templm did not make there is left alone. A user's partial folder
    or lock-named file is refused before any work; a file named W.old is in nobody's way (the old output moves
    aside under a name of the run's own)."""
    out = tmp_path / "W"
    build_output_folder(str(out), "thing", _write("a.txt", "first"))
    _mine(tmp_path / "W.partial")
    with pytest.raises(DataError, match=r"W\.partial: is not a partial folder of templm's"):
        build_output_folder(str(out), "thing", _write("a.txt", "second"))
    assert _tree(tmp_path / "W.partial") == {"notes.md": "my notes", os.path.join("sub", "data.csv"): "1,2\n"}
    (tmp_path / "W.partial" / "notes.md").unlink()
    (tmp_path / "W.partial" / "sub" / "data.csv").unlink()
    (tmp_path / "W.partial" / "sub").rmdir()
    (tmp_path / "W.partial").rmdir()
    (tmp_path / "W.lock").write_text("a user's notes, not a lock")
    with pytest.raises(DataError, match=r"W\.lock: is not a templm lock file"):
        build_output_folder(str(out), "thing", _write("a.txt", "second"))
    assert (tmp_path / "W.lock").read_text() == "a user's notes, not a lock"
    (tmp_path / "W.lock").unlink()
    (tmp_path / "W.old").write_text("a user's file")
    build_output_folder(str(out), "thing", _write("a.txt", "second"))
    assert (out / "a.txt").read_text() == "second" and (tmp_path / "W.old").read_text() == "a user's file"
    assert sorted(os.listdir(tmp_path)) == ["W", "W.old"]
    # What a run that died left (its partial folder, its lock file) is templm's, and is cleared by the next run.
    os.makedirs(tmp_path / "W.partial")
    (tmp_path / "W.partial" / ".templm.partial").write_text("{}")
    (tmp_path / "W.lock").write_text(json.dumps({"pid": 1, "host": "h", "command": "templm", "since": "t"}))
    build_output_folder(str(out), "thing", _write("a.txt", "third"))
    assert (out / "a.txt").read_text() == "third" and sorted(os.listdir(tmp_path)) == ["W", "W.old"]


def test_an_output_behind_a_symlink_is_built_where_the_link_points(tmp_path):
    target = tmp_path / "disk" / "world"
    build_output_folder(str(target), "thing", _write("a.txt", "first"))
    link = tmp_path / "link"
    link.symlink_to(target, target_is_directory=True)
    build_output_folder(str(link), "thing", _write("a.txt", "second"))
    assert link.is_symlink() and (link / "a.txt").read_text() == "second" == (target / "a.txt").read_text()
    assert sorted(os.listdir(tmp_path)) == ["disk", "link"] and sorted(os.listdir(tmp_path / "disk")) == ["world"]


def test_a_second_writer_is_refused_naming_the_first_and_a_killed_holder_frees_the_lock(tmp_path):
    lock = str(tmp_path / "out.lock")
    proc = lock_holder(lock, "the thing")
    try:
        with pytest.raises(DataError, match=rf"the thing is in use by `.*` \(pid {proc.pid} on "):
            with locked(lock, "the thing"):
                pass
        with pytest.raises(DataError, match="in use by"):  # the same for a whole build
            build_output_folder(str(tmp_path / "out"), "thing", lambda tmp: None)
        assert not (tmp_path / "out").exists()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert os.path.exists(lock)  # kill -9 left the file, not the lock
    with locked(lock, "the thing"):
        with open(lock) as f:
            assert json.loads(f.read())["pid"] == os.getpid()
    assert not os.path.exists(lock)  # released: the file goes with it
    with locked(lock, "the thing"):
        with locked(lock, "the thing"):  # the holder may take its own lock again (nested stages)
            pass


def test_two_task_data_builds_on_one_folder_at_once_one_is_refused_and_the_folder_is_whole(tmp_path):
    """Two `templm data tasks --out S` a moment apart could leave S with record files missing and exit 0."""
    out = tmp_path / "data"
    args = ("data", "tasks", f"--out={out}", "--vocab_size=200", "--gin.WorldConfig.start_year=2014",
            "--gin.WorldConfig.end_year=2015", "--gin.WorldConfig.subjects_per_relation=4",
            "--gin.WorldConfig.docs_per_month=3")
    first = subprocess.Popen([sys.executable, "-m", "templm.cli", *args], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    wait_for_path(str(out) + ".partial", first, timeout=120)
    first.send_signal(signal.SIGSTOP)  # held mid-build (with its lock) while the second one runs
    try:
        second = templm(*args)
    finally:
        first.send_signal(signal.SIGCONT)
    out1, err1 = first.communicate(timeout=600)
    assert first.returncode == 0, err1[-2000:]
    assert second.returncode == 1 and "is in use by" in second.stderr and f"pid {first.pid}" in second.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    for folder, splits in manifest["counts"].items():
        for split, years in splits.items():
            for year in years:
                assert (out / folder / f"{split}-{year}.tfrecord").exists()


def test_reproduce_refuses_a_folder_of_other_files_before_any_work(tmp_path):
    mine = _mine(tmp_path / "mine")
    result = templm("reproduce", "--preset=tiny_test", f"--out={mine}", "--nostreaming")
    assert result.returncode == 1, result.stderr[-2000:]
    assert "not a templm output, not a reproduction (notes.md, sub)" in result.stderr
    assert sorted(os.listdir(mine)) == ["notes.md", "sub"]


@pytest.mark.e2e
def test_data_world_refuses_then_overwrites_when_asked(tmp_path):
    mine = _mine(tmp_path / "mine")
    refused = templm("data", "world", f"--out={mine}", *WORLD_FLAGS)
    assert refused.returncode == 1 and "--overwrite" in refused.stderr and "Traceback" not in refused.stderr
    assert (mine / "notes.md").read_text() == "my notes"
    done = templm("data", "world", f"--out={mine}", "--overwrite", *WORLD_FLAGS)
    assert done.returncode == 0, done.stderr[-2000:]
    assert kind_of(str(mine)) == "world" and not (mine / "notes.md").exists()


def test_every_verb_that_writes_into_its_folder_refuses_a_users_folder_before_any_work(tmp_path):
    """is-eval (both models), appendices, a CALM run and a stream evaluation wrote into any folder they were given,
    replacing a user's results.json or is_eval.json without a word; each now claims its folder as reproduce does
    (templm.outputs.claim_output_folder): a user's folder or another verb's output is refused before any work and left
    as it was. An output path of '.' or '..', or a name too long for the names templm builds beside it, is refused
    with its cause for every verb (outputs._require_named)."""
    from templm.experiments.appendices import run_appendices
    from templm.experiments.calm import run_calm
    from templm.experiments.importance_sampling import run_is_eval, run_latent_is_eval
    from templm.experiments.streaming import stream_evaluation

    calls = {"importance-sampling evaluation": [run_is_eval, lambda out: run_latent_is_eval(out, progress=False)],
             "appendices study": [run_appendices], "CALM run": [lambda out: run_calm(out_dir=out)],
             "stream evaluation": [lambda out: stream_evaluation(out, str(tmp_path / "no_run"))]}
    for kind, functions in calls.items():
        for call in functions:
            mine = _mine(tmp_path / "mine")
            (mine / "results.json").write_text('{"mine": 1}')
            with pytest.raises(DataError, match=f"is not a templm output, not an? {kind} "
                                                r"\(notes.md, results.json, sub\)"):
                call(str(mine))
            assert sorted(os.listdir(mine)) == ["notes.md", "results.json", "sub"]
            assert (mine / "results.json").read_text() == '{"mine": 1}'
    world = tmp_path / "world"
    generate_world(TINY_WORLD, str(world))
    with pytest.raises(DataError, match="is a templm world, not an appendices study"):
        run_appendices(str(world))
    for bad, cause in ((".", "names the current or parent folder"), (str(tmp_path / ".."), "current or parent"),
                       (str(tmp_path / ("x" * 250)), "bytes long, templm builds it beside itself")):
        for call in (run_is_eval, run_appendices, lambda out: generate_world(TINY_WORLD, out)):
            with pytest.raises(ConfigError, match=cause):
                call(bad)
    assert not os.path.exists(tmp_path / ("x" * 250))
