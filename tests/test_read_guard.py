"""The suite's guard against tests that touch what a run of the product left on the machine (tests/support/
read_guard.py, installed by tests/conftest.py): a process a test starts logs its touches of the guarded folders and
nothing else; paths are judged after resolving them against the working directory."""

import os
import subprocess
import sys
import textwrap

import read_guard

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_a_started_process_logs_each_touch_of_a_guarded_folder_and_nothing_else(tmp_path):
    guarded = tmp_path / "runs"
    (guarded / "demo").mkdir(parents=True)
    (guarded / "demo" / "results.json").write_text("{}")
    (tmp_path / "fixture.json").write_text("{}")
    (tmp_path / "runs_elsewhere").mkdir()
    log = tmp_path / "touched.log"
    script = textwrap.dedent("""
        import glob, json, os
        json.load(open("fixture.json"))                      # outside: not logged
        os.listdir("runs_elsewhere")                         # a sibling whose name starts alike: not logged
        json.load(open(os.path.join("runs", "demo", "results.json")))
        glob.glob("runs/*/results.json")
        with open("runs/demo/new.md", "w") as f:
            f.write("x")
        os.rename("runs/demo/new.md", "runs/demo/report.md")
    """)
    env = {**os.environ, read_guard.ROOTS_ENV: str(guarded), read_guard.LOG_ENV: str(log)}
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    lines, size = read_guard.read_log(str(log))
    touches = [tuple(line.split("\t")[1:]) for line in lines]
    assert touches == [("open", str(guarded / "demo" / "results.json")),
                       ("os.scandir", str(guarded)),
                       ("open", str(guarded / "demo" / "new.md")),
                       ("os.rename", str(guarded / "demo" / "new.md")),
                       ("os.rename", str(guarded / "demo" / "report.md"))]
    assert str(os.getpid()) not in {line.split("\t")[0] for line in lines}  # the child logged them, not the suite
    assert size == log.stat().st_size
    assert read_guard.read_log(str(log), size) == ([], size)  # nothing after the offset


def test_paths_are_judged_where_they_lead(tmp_path, monkeypatch):
    roots = [str(tmp_path / "runs")]
    monkeypatch.chdir(tmp_path)
    assert read_guard.touched_root("runs", roots) == roots[0]
    assert read_guard.touched_root("runs/demo/stream/results.json", roots) == roots[0]
    assert read_guard.touched_root(b"runs/x", roots) == roots[0]
    assert read_guard.touched_root("other/../runs/x", roots) == roots[0]
    assert read_guard.touched_root("runs2/x", roots) is None
    assert read_guard.touched_root("tests/fixtures/x.json", roots) is None
    assert read_guard.touched_root(3, roots) is None  # a file descriptor


def test_the_suite_guards_runs_and_the_user_cache_and_keeps_its_own_cache():
    roots = os.environ[read_guard.ROOTS_ENV].split(os.pathsep)
    assert os.path.join(REPO, "runs") in roots
    assert os.path.join(os.path.expanduser("~"), ".cache") in roots
    assert read_guard.touched_root(os.environ["TEMPLM_CACHE"], roots) is None
    assert os.environ["PYTHONPATH"].split(os.pathsep)[0] == os.path.join(REPO, "tests", "support", "read_guard_site")
