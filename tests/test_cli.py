"""The `templm` command line end to end: verbs (and their earlier spellings), help, gin flags, quiet output unless
--verbosity asks, and bad input answered with file:line and exit 1."""

import filecmp
import json
import os
import re

import pytest

pytestmark = pytest.mark.e2e

from templm.cli import parse_gin, rewrite_gin_args
from templm.errors import ConfigError
from templm_testing import run_templm as templm, run_templm_process, wait_for_path


WORLD_FLAGS = ("--start_year=2014", "--end_year=2016", "--subjects_per_relation=6", "--docs_per_month=3")


def test_help_lists_verbs_and_flags():
    top = templm("--help")
    assert top.returncode == 0
    assert "data world" in top.stdout and "data stats" in top.stdout
    world = templm("data", "world", "--help")
    assert world.returncode == 0
    for flag in ("--out", "--seed", "--docs_per_month", "--subjects_per_relation", "--gin_file", "--gin.NAME=VALUE"):
        assert flag in world.stdout
    unknown = templm("frobnicate")
    assert unknown.returncode == 2 and "unknown verb 'frobnicate'" in unknown.stderr
    assert "train-lm" in top.stdout and "train_lm" not in top.stdout
    alias = templm("train_lm", "--help")  # the earlier spelling still works
    assert alias.returncode == 0 and alias.stdout.startswith("usage: templm train-lm")


def test_library_logs_only_with_verbosity(tmp_path):
    """A verb that loads TensorFlow and trains a vocabulary: by default standard error holds templm's own lines only;
    --verbosity=1 brings back the libraries' log lines (absl-formatted, e.g. "I1130 12:00:00.000 file.py:12] ...")."""
    flags = ["data", "tasks", "--vocab_size=300", "--future_years=1", "--gin.WorldConfig.start_year=2016",
             "--gin.WorldConfig.end_year=2017", "--gin.WorldConfig.subjects_per_relation=4",
             "--gin.WorldConfig.docs_per_month=2"]
    quiet = run_templm_process(*flags, f"--out={tmp_path / 'quiet'}")  # what reaches the process's descriptors
    assert quiet.returncode == 0, quiet.stderr
    library = [line for line in quiet.stderr.splitlines() if line[:1] in "IWEF" and line[1:5].isdigit()
               or "absl::InitializeLog" in line]
    assert library == [], quiet.stderr
    loud = run_templm_process(*flags, f"--out={tmp_path / 'loud'}", "--verbosity=1")
    assert loud.returncode == 0, loud.stderr
    assert any(line[:1] == "I" and line[1:5].isdigit() for line in loud.stderr.splitlines()), loud.stderr
    assert json.loads(quiet.stdout)["examples"] == json.loads(loud.stdout)["examples"]


def test_data_world_writes_the_world_and_prints_a_summary(tmp_path):
    out = tmp_path / "w"
    result = templm("data", "world", f"--out={out}", *WORLD_FLAGS)
    assert result.returncode == 0, result.stderr
    assert f"templm world written to {out}" in result.stdout
    stats = json.loads((out / "stats.json").read_text())
    assert stats["documents"] == 3 * 12 * 3
    assert f"{stats['documents']} documents" in result.stdout
    assert sorted(os.listdir(out / "templama")) == ["test.jsonl", "train.jsonl", "val.jsonl"]


def test_gin_binding_equals_flag_and_misspelling_names_it(tmp_path):
    by_flag, by_gin = tmp_path / "flag", tmp_path / "gin"
    assert templm("data", "world", f"--out={by_flag}", "--seed=5", *WORLD_FLAGS).returncode == 0
    assert templm("data", "world", f"--out={by_gin}", "--gin.WorldConfig.seed=5", *WORLD_FLAGS).returncode == 0
    assert filecmp.cmp(by_flag / "news.jsonl", by_gin / "news.jsonl", shallow=False)
    gin_file = tmp_path / "world.gin"
    gin_file.write_text("WorldConfig.docs_per_month = 2\nWorldConfig.seed = 5\n")
    from_file = tmp_path / "file"
    result = templm("data", "world", f"--out={from_file}", f"--gin_file={gin_file}", "--start_year=2014",
                    "--end_year=2014", "--subjects_per_relation=6")
    assert result.returncode == 0, result.stderr
    assert json.loads((from_file / "stats.json").read_text())["documents"] == 24

    wrong = templm("data", "world", f"--out={tmp_path / 'x'}", "--gin.WorldConfig.docs_per_mnth=2")
    assert wrong.returncode == 1
    assert "docs_per_mnth" in wrong.stderr
    assert not (tmp_path / "x").exists()
    missing = templm("data", "world", f"--out={tmp_path / 'y'}", "--gin_file=no_such.gin")
    assert missing.returncode == 1 and "no_such.gin" in missing.stderr


def test_data_stats_counts_and_reports_bad_lines(tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"id": "a", "date": "2014-01-02", "text": "one two"}\n'
                      '{"id": "b", "date": "2015-05", "text": "three"}\n'
                      '{"id": "c", "date": "2015-02-30", "text": "bad date"}\n')
    bad = templm("data", "stats", f"--corpus={corpus}")
    assert bad.returncode == 1
    assert f"{corpus}:3:" in bad.stderr and "2015-02-30" in bad.stderr
    skipped = templm("data", "stats", f"--corpus={corpus}", "--on_error=skip")
    assert skipped.returncode == 0
    report = json.loads(skipped.stdout)
    assert report["documents"] == 2 and report["skipped"] == 1
    assert report["by_year"] == {"2014": {"documents": 1, "words": 2}, "2015": {"documents": 1, "words": 1}}
    missing = templm("data", "stats", f"--corpus={tmp_path / 'none.jsonl'}")
    assert missing.returncode == 1 and "none.jsonl: no such file" in missing.stderr
    unknown_flag = templm("data", "stats", f"--corpus={corpus}", "--bogus=1")
    assert unknown_flag.returncode != 0 and "bogus" in unknown_flag.stderr


def test_rewrite_gin_args():
    assert rewrite_gin_args(["--gin.MODEL_DIR='runs/x'", "--seed=1"]) == ["--gin_bindings=MODEL_DIR = 'runs/x'",
                                                                        "--seed=1"]
    with pytest.raises(ConfigError, match="--gin.NAME=VALUE"):
        rewrite_gin_args(["--gin.MODEL_DIR"])


@pytest.fixture(scope="module")
def small_world(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "world"
    result = templm("data", "world", f"--out={out}", "--start_year=2015", "--end_year=2019",
                    "--subjects_per_relation=6", "--docs_per_month=20")
    assert result.returncode == 0, result.stderr
    return out


def test_data_splits_then_stats_and_spm_on_a_split(small_world, tmp_path):
    news = small_world / "news.jsonl"
    result = templm("data", "splits", f"--corpus={news}", f"--out={tmp_path / 's'}", "--cutoff=2016-12-31",
                    "--test_docs_per_month=5", "--test_months=12", "--heldout_per_year=10")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["splits"]["time_stratified_train"] == 2 * 12 * 20  # 2015 and 2016
    assert summary["splits"]["control_train"] == summary["splits"]["time_stratified_train"]
    assert summary["splits"]["test"] == 12 * 5
    assert summary["yearly"]["2017"]["validation"] + summary["yearly"]["2017"]["test"] == 10

    stats = templm("data", "stats", f"--corpus={news}", f"--split_dir={tmp_path / 's'}", "--split=test")
    assert stats.returncode == 0, stats.stderr
    report = json.loads(stats.stdout)
    assert report["documents"] == 60 and report["missing"] == 0
    assert set(report["by_year"]) == {"2017"} or set(report["by_year"]) == {"2017", "2018"}

    spm = templm("data", "spm", f"--corpus={news}", f"--split_dir={tmp_path / 's'}",
                 "--split=time_stratified_train", f"--out={tmp_path / 'spm'}", "--vocab_size=300")
    assert spm.returncode == 0, spm.stderr
    assert json.loads(spm.stdout)["found"] == 480
    assert (tmp_path / "spm.model").exists()
    too_big = templm("data", "spm", f"--corpus={news}", f"--out={tmp_path / 'big'}", "--vocab_size=100000")
    assert too_big.returncode == 1 and "vocab_size=100000 is too large" in too_big.stderr
    assert not (tmp_path / "big.model").exists()
    # A full disk while the new pair is written (a limit above the .vocab, below the .model): both stay as they were.
    pair = {name: (tmp_path / name).read_bytes() for name in ("spm.model", "spm.vocab")}
    limit = 100_000
    assert len(pair["spm.vocab"]) < limit < len(pair["spm.model"])
    full = _with_file_size_limit(limit, "data", "spm", f"--corpus={news}", f"--out={tmp_path / 'spm'}",
                                 "--vocab_size=280")
    assert full.returncode == 4 and f"{tmp_path / 'spm.model'}: File too large while writing it" in full.stderr
    assert {name: (tmp_path / name).read_bytes() for name in pair} == pair
    assert sorted(n for n in os.listdir(tmp_path) if n.startswith(".spm")) == []


def _files(folder):
    return {os.path.relpath(os.path.join(root, name), folder): open(os.path.join(root, name), "rb").read()
            for root, _, names in os.walk(folder) for name in names}


def test_data_splits_and_templama_leave_a_users_folder_alone_and_change_theirs_all_at_once(small_world, tmp_path):
    """`data splits` and `data templama` wrote into any --out: a user's test.gz and stats.json, or train.jsonl, were
    replaced without a word; and a failure in the yearly pass left the new cut-off's split files beside the old
    yearly buckets. Now a folder that is not their output is refused (its files as they were) unless --overwrite,
    and the output is built beside --out and put in its place whole, or not at all."""
    news = small_world / "news.jsonl"
    split_flags = [f"--corpus={news}", "--test_docs_per_month=5", "--test_months=12", "--heldout_per_year=10"]
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "test.gz").write_bytes(b"a user's file")
    (mine / "stats.json").write_text("{}")
    refused = templm("data", "splits", f"--out={mine}", "--cutoff=2016-12-31", *split_flags)
    assert refused.returncode == 1 and "test.gz" in refused.stderr and "--overwrite" in refused.stderr
    assert _files(mine) == {"test.gz": b"a user's file", "stats.json": b"{}"}
    replaced = templm("data", "splits", f"--out={mine}", "--cutoff=2016-12-31", "--overwrite", *split_flags)
    assert replaced.returncode == 0, replaced.stderr[-2000:]
    assert (mine / "test.gz").read_bytes()[:2] == b"\x1f\x8b" and (mine / "yearly").is_dir()

    # A full disk part-way through a new cut-off's output (a file-size limit stands in for it: the limit lets the
    # files written first through and stops at the first larger one, as measured on a scratch build).
    new_cutoff = ["--cutoff=2017-06-30", *split_flags]
    scratch = tmp_path / "scratch"
    assert templm("data", "splits", f"--out={scratch}", *new_cutoff).returncode == 0
    written = sorted((os.stat(os.path.join(root, n)).st_mtime_ns, os.path.getsize(os.path.join(root, n)))
                     for root, _, names in os.walk(scratch) for n in names if not n.startswith("."))
    sizes = [size for _, size in written]
    later = next(i for i in range(1, len(sizes)) if sizes[i] > max(sizes[:i]))  # files before it fit, it does not
    before = _files(mine)
    failed = _with_file_size_limit(sizes[later] - 1, "data", "splits", f"--out={mine}", *new_cutoff)
    assert failed.returncode == 4 and "File too large" in failed.stderr, failed.stderr[-2000:]
    assert "Traceback" not in failed.stderr
    assert _files(mine) == before and not os.path.exists(f"{mine}.partial")
    refused = templm("data", "splits", f"--out={mine}", *new_cutoff, "--heldout_fraction=1.5")
    assert refused.returncode == 2 and "--heldout_fraction must be a finite number from 0 to 1" in refused.stderr
    assert _files(mine) == before and not os.path.exists(f"{mine}.partial")

    release = tmp_path / "release"
    release.mkdir()
    (release / "train.jsonl").write_text('{"a user": "line"}\n')
    dump = os.path.join(os.path.dirname(__file__), "fixtures", "wikidata_dump.json")
    result = templm("data", "templama", "--norequire_enwiki", f"--dump={dump}", f"--out={release}", "--max_subjects=4")
    assert result.returncode == 1 and "train.jsonl" in result.stderr and "--overwrite" in result.stderr
    assert _files(release) == {"train.jsonl": b'{"a user": "line"}\n'}


def test_data_templama_from_the_test_dump(tmp_path):
    dump = os.path.join(os.path.dirname(__file__), "fixtures", "wikidata_dump.json")
    result = templm("data", "templama", "--norequire_enwiki", f"--dump={dump}", f"--out={tmp_path}", "--max_subjects=4")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    lines = sum(1 for split in ("train", "val", "test") for _ in open(tmp_path / f"{split}.jsonl"))
    assert summary["queries"] == lines > 0
    bad = tmp_path / "bad.json"
    bad.write_text('[\n{"id": "Q1", "labels": {}},\n{not json\n]\n')
    broken = templm("data", "templama", "--norequire_enwiki", f"--dump={bad}", f"--out={tmp_path / 'b'}")
    assert broken.returncode == 1 and f"{bad}:3" in broken.stderr


def test_queries_in_years_the_readers_refuse_are_refused_before_the_dump_is_read(tmp_path):
    """`data templama --start_year 1850` wrote queries dated 1890-1905 that templm's own reader then refused."""
    dump = os.path.join(os.path.dirname(__file__), "fixtures", "wikidata_dump.json")
    result = templm("data", "templama", "--norequire_enwiki", f"--dump={dump}", f"--out={tmp_path / 't'}",
                    "--start_year=1850")
    assert result.returncode == 1 and "years 1850-2020: templm's readers accept dates from 1900 to 2100" in \
        result.stderr
    assert not os.path.exists(tmp_path / "t") and not os.path.exists(tmp_path / "t.partial")


@pytest.mark.parametrize("binding", ["OUT_DIR=runs/y", "OUT_DIR = runs/y", "WorldConfig.seed=/tmp/x"])
def test_a_string_binding_without_quotes_says_how_to_quote_it(tmp_path, binding):
    """`--gin.MODEL_DIR=runs/y` was gin's "malformed node or string ... <ast.Name object>", naming neither the binding
    nor the quotes it needs."""
    import gin

    from templm.cli.data_verbs import world_configurable

    world_configurable()  # WorldConfig, as `templm data world` registers it before parsing
    config = tmp_path / "run.gin"
    config.write_text("OUT_DIR = 'runs/x'\nWorldConfig.docs_per_month = 2\n")
    name, value = (part.strip() for part in binding.split("=", 1))
    try:
        with pytest.raises(ConfigError) as e:
            parse_gin([str(config)], [binding])
        assert str(e.value) == (f"gin binding {name}={value}: {value} is not a gin value; a string needs quotes "
                                f"inside the flag: --gin.{name}=\"'{value}'\"")
        gin.clear_config()
        quoted = [f"{name}='{value}'"] if "." in name else []  # (a macro the config does not use is refused)
        parse_gin([str(config)], quoted + ["WorldConfig.docs_per_month = 3"])
        assert gin.query_parameter("WorldConfig.docs_per_month") == 3
    finally:
        gin.clear_config()


def test_the_configs_include_their_files_beside_a_namespace_package_of_the_same_name(tmp_path, monkeypatch):
    """`python -m templm.cli train --gin_file=temporal.gin` in a project with a `models/` folder of its own (the
    working folder is on sys.path) stopped with "gin: expected str, bytes or os.PathLike object, not NoneType": gin's
    package reader looked for `models/t5_1_1_small.gin` in the namespace package `models`."""
    for name in ("models", "runs"):
        (tmp_path / name).mkdir()
    monkeypatch.syspath_prepend(str(tmp_path))
    result = templm("plan", "--gin_file=temporal.gin", "--gin_file=runs/cpu_demo.gin")
    # The configs parsed: the plan goes on to ask for the mesh the configs leave to the user.
    assert result.returncode == 1 and "sets no templm.make_mesh.mesh_shape" in result.stderr, result.stderr[-2000:]


def test_a_gin_file_that_is_not_text_is_named(tmp_path):
    """A binary file given as --gin_file was a UTF-8 decoding error naming no file."""
    binary = tmp_path / "model.gin"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff")
    result = templm("data", "world", f"--out={tmp_path / 'w'}", f"--gin_file={binary}")
    assert result.returncode == 1 and f"{binary}: not a gin file: byte 0 is not UTF-8 text" in result.stderr
    assert not (tmp_path / "w").exists()


def _catches_sigterm(pid):
    """Whether the process has a handler for SIGTERM (its SigCgt mask in /proc)."""
    with open(f"/proc/{pid}/status") as f:
        caught = next(line for line in f if line.startswith("SigCgt:")).split()[1]
    return bool(int(caught, 16) >> (15 - 1) & 1)


@pytest.mark.parametrize("verb", ["train", "data stats"])
@pytest.mark.parametrize("stop", ["SIGINT", "SIGTERM"])
def test_ctrl_c_or_sigterm_while_the_command_starts_is_one_line(tmp_path, stop, verb):
    """Ctrl-C while TensorFlow was still loading printed 72 lines of traceback; SIGTERM then ended the process by its
    default (exit 143) without a word, and so did a SIGTERM in the tenth of a second a verb without TensorFlow takes
    to import its table. The signal is sent once TensorFlow's library is mapped into the process (its load under
    way; `train`) or as soon as the process catches SIGTERM (`data stats`, templm.cli.start's first instructions);
    wherever it lands, the answer is one line: 130 for Ctrl-C, 75 for SIGTERM."""
    import signal
    import subprocess
    import sys
    import time

    args = (["train", "--gin_file=gin_configs/temporal.gin", f"--gin.MODEL_DIR='{tmp_path / 'm'}'"] if verb == "train"
            else ["data", "stats", f"--corpus={tmp_path / 'm'}"])
    proc = subprocess.Popen([sys.executable, "-m", "templm.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=os.path.dirname(os.path.dirname(__file__)))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if verb == "train":
            with open(f"/proc/{proc.pid}/maps") as f:
                if "libtensorflow" in f.read():
                    break
        elif _catches_sigterm(proc.pid):
            break
        time.sleep(0.05 if verb == "train" else 0.001)
    proc.send_signal(getattr(signal, stop))
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == (130 if stop == "SIGINT" else 75), err[-3000:]
    said = "interrupted" if stop == "SIGINT" else "stopped by SIGTERM"
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1 and said in err, err[-3000:]
    assert not (tmp_path / "m").exists()


def test_the_command_line_notes_signals_before_it_imports_anything_of_its_own():
    """The console script's module (templm.cli.start) sets the signal notes before any other module of templm is
    imported: only the two package files above it are loaded by then."""
    import subprocess
    import sys

    script = ("import signal, sys; import templm.cli.start; "
              "print(signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None), "
              "sorted(m for m in sys.modules if m.startswith('templm')))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "True ['templm', 'templm.cli', 'templm.cli.start']", out


def test_a_macro_no_config_uses_and_a_missing_include_are_named(tmp_path):
    """`--gin.TRAIN_STEP=3` (for TRAIN_STEPS) used to be accepted and the default used."""
    misspelt = templm("train", "--gin_file=gin_configs/temporal.gin", "--gin_file=gin_configs/runs/cpu_demo.gin",
                      f"--gin.MODEL_DIR='{tmp_path / 'm'}'", "--gin.TRAIN_STEP=3")
    assert misspelt.returncode == 1
    assert "gin macro TRAIN_STEP is bound on the command line but no config uses it (did you mean TRAIN_STEPS?)" \
        in misspelt.stderr and "Traceback" not in misspelt.stderr
    assert not (tmp_path / "m").exists()
    config = tmp_path / "includes.gin"
    config.write_text("include 'no_such_file.gin'\n")
    missing = templm("train", f"--gin_file={config}")
    assert missing.returncode == 1 and "no_such_file.gin" in missing.stderr and str(config) in missing.stderr
    assert "Traceback" not in missing.stderr


def _no_leftovers(folder):
    parent, name = os.path.dirname(str(folder)), os.path.basename(str(folder))
    return [n for n in os.listdir(parent) if n.startswith(name)] == []


def test_paths_of_the_wrong_kind_are_one_message(tmp_path):
    a_dir = tmp_path / "a_dir"
    a_dir.mkdir()
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    cases = [
        # A folder is a corpus of text files (--format text): one without any says so.
        (("data", "stats", f"--corpus={a_dir}"), f"{a_dir}: a folder of text files holds no .txt file"),
        (("data", "templama", f"--dump={a_dir}", f"--out={tmp_path / 'tl'}"), f"{a_dir}: is a folder"),
        (("data", "world", f"--out={a_file}", *WORLD_FLAGS), f"{a_file}: is a file, not a folder"),
    ]
    for args, message in cases:
        result = templm(*args)
        assert result.returncode == 1 and message in result.stderr, (args, result.stderr[-1500:])
        assert "Traceback" not in result.stderr
    assert a_file.read_text() == "x" and not (tmp_path / "tl").exists()


def _with_file_size_limit(size, *args):
    """`templm ARGS` with files limited to `size` bytes: a write past it fails with EFBIG, as one on a full disk."""
    import subprocess
    import sys

    from exec_with import launcher

    return subprocess.run([*launcher(f"--file_size={size}"), sys.executable, "-m", "templm.cli", *args],
                          capture_output=True, text=True, timeout=600)


def test_a_full_disk_is_one_message_and_leaves_nothing_half_written(tmp_path):
    """A file-size limit stands in for a full disk: the write fails the same way, in the middle of the output."""
    out = tmp_path / "world"
    result = _with_file_size_limit(20_000, "data", "world", f"--out={out}", *WORLD_FLAGS)
    assert result.returncode == 4, result.stderr[-2000:]
    # The file being written is named (io.NamedWrites; the line named none before): the world writes its news and
    # their mentions side by side, and the first to cross the limit is named.
    assert re.search(rf"{re.escape(str(out))}\.partial/(news|mentions)\.jsonl: File too large while writing it",
                     result.stderr), result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert _no_leftovers(out)  # no world, no world.partial, no lock


def test_a_full_disk_while_data_tasks_writes_records_or_the_vocabulary_is_exit_4_naming_the_file(tmp_path):
    """TensorFlow's record writer reported a full disk as its own error (exit 1, a traceback) and SentencePiece's
    trainer wrote a truncated model unseen ("Wire format was corrupt"). Each limit is taken from a build of the
    same data: just under the first record file, and under the vocabulary, that is larger than every file before it,
    so the files written before it fit."""
    flags = ["--vocab_size=200", "--gin.WorldConfig.start_year=2014", "--gin.WorldConfig.end_year=2016",
             "--gin.WorldConfig.subjects_per_relation=6", "--gin.WorldConfig.docs_per_month=6"]
    scratch = tmp_path / "scratch"
    assert templm("data", "tasks", f"--out={scratch}", *flags).returncode == 0
    written = sorted((os.stat(os.path.join(root, n)).st_mtime_ns, os.path.getsize(os.path.join(root, n)),
                      os.path.relpath(os.path.join(root, n), scratch))
                     for root, _, names in os.walk(scratch) for n in names if not n.startswith("."))
    # Files closed in the same clock tick (the record writers close together) count as written together: the limit
    # must be under the file's size and over every file written before or with it, so that only this one crosses.
    first = {}
    for mtime, size, name in written:
        kind = "record" if name.endswith(".tfrecord") else "vocabulary" if name.endswith(".model") else None
        others = [other for t, other, n in written if t <= mtime and n != name]
        if kind and kind not in first and others and size > max(others):
            first[kind] = (size, name)
    assert set(first) == {"record", "vocabulary"}, written
    for kind, (size, name) in first.items():
        out = tmp_path / kind
        result = _with_file_size_limit(size - 1, "data", "tasks", f"--out={out}", *flags)
        assert result.returncode == 4, (kind, result.stderr[-2000:])
        assert f"{out}.partial/{name}: File too large while writing" in result.stderr, result.stderr[-2000:]
        assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
        assert _no_leftovers(out)


IS_EVAL = ("is-eval", "--seed=1", "--ks=1,4", "--temperatures=0.5", "--repeats=2", "--num_docs=3", "--doc_length=8")


@pytest.mark.parametrize("stop,when", [("SIGTERM", "work"), ("SIGINT", "work"), ("SIGTERM", "result")])
def test_a_signal_whose_exception_was_dropped_writes_no_result_or_says_the_result_is_complete(tmp_path, stop, when):
    """A signal that lands in a finaliser raises its exception there, and Python drops it: the work goes on. stream
    (seen in the suite), is-eval, calm, appendices and infer then wrote their result and printed their summary, and
    the command ended with "no result was written: run the same command again". The verbs now look for such a
    signal before they write their result: none is written. One dropped while the result is being put in place (the
    rename of is_eval.json) is answered as a signal after it: the result is complete, and the line says so."""
    import signal

    from templm_testing import signal_at

    out = tmp_path / "is"
    where = {"made": out} if when == "work" else {"renamed": out / "is_eval.json"}
    with signal_at(getattr(signal, stop), dropped=True, **where) as dropped:
        result = templm(*IS_EVAL, f"--out={out}")
    assert dropped.fired
    stopped = "interrupted" if stop == "SIGINT" else "stopped by SIGTERM"
    last = result.stderr.strip().splitlines()[-1]
    assert result.returncode == (130 if stop == "SIGINT" else 75), result.stderr[-2000:]
    if when == "work":
        assert last.startswith(f"templm is-eval: {stopped}; nothing half-written was left"), last
        assert result.stdout == "" and not (out / "is_eval.json").exists()
    else:
        assert last == f"templm is-eval: {stopped} after its results were written; they are complete"
        assert result.stdout == (out / "is_eval.md").read_text(encoding="utf-8") + "\n"  # the whole summary
        assert sorted(os.listdir(out)) == [".templm.json", "is_eval.json", "is_eval.md", "is_eval.png"]


@pytest.mark.parametrize("verb", ["tasks", "world"])
@pytest.mark.parametrize("stop", ["SIGINT", "SIGTERM"])
def test_ctrl_c_or_sigterm_stops_a_data_verb_with_its_status_and_removes_the_partial_folder(tmp_path, stop, verb):
    """Ctrl-C exits 130, SIGTERM 75 (it used to kill the process by the signal's default, exit 143 with no message,
    leaving D.partial and D.lock); either way with one line, and nothing of the output left."""
    import signal
    import subprocess
    import sys

    out = tmp_path / "data"  # seconds of work inside data.partial (the world; SSM examples, SentencePiece)
    flags = (["--vocab_size=200", "--gin.WorldConfig.start_year=2014", "--gin.WorldConfig.end_year=2016",
              "--gin.WorldConfig.subjects_per_relation=6", "--gin.WorldConfig.docs_per_month=6"] if verb == "tasks"
             else ["--start_year=2010", "--end_year=2020", "--subjects_per_relation=30", "--docs_per_month=60"])
    proc = subprocess.Popen([sys.executable, "-m", "templm.cli", "data", verb, f"--out={out}", *flags],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_path(str(out) + ".partial", proc, timeout=120)
    proc.send_signal(signal.SIGSTOP)  # held mid-build, so the signal lands in the build whatever the machine's load
    proc.send_signal(getattr(signal, stop))
    proc.send_signal(signal.SIGCONT)
    _, err = proc.communicate(timeout=300)
    if stop == "SIGINT":
        assert proc.returncode == 130, err[-2000:]
        assert "interrupted; nothing half-written was left" in err
    else:
        assert proc.returncode == 75, err[-2000:]
        assert f"templm data {verb}: stopped by SIGTERM; nothing half-written was left" in err
    assert "Traceback" not in err
    assert _no_leftovers(out)


def test_a_task_data_folder_that_is_not_one_is_one_line_in_a_fresh_process(tmp_path):
    """A TEMPLM_DATA_DIR without task data ended in a traceback: the tasks are registered when their module is
    imported, while the verb starts, outside the verb's own error handling. It is one line and exit 1."""
    result = run_templm_process("train", "--gin_file=gin_configs/temporal.gin",
                                f"--gin.MODEL_DIR='{tmp_path / 'm'}'", env={"TEMPLM_DATA_DIR": str(tmp_path)})
    assert result.returncode == 1, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1] == (
        f"templm train: error: {tmp_path}: TEMPLM_DATA_DIR names a folder without task data (no manifest.json): "
        "build task data with `templm data tasks --out DIR`") and "Traceback" not in result.stderr
    for what, path in (("a file, not a task-data folder", tmp_path / "a_file"), ("no folder", tmp_path / "none")):
        if what.startswith("a file"):
            path.write_text("x")
        result = templm("train", "--gin_file=gin_configs/temporal.gin", f"--gin.MODEL_DIR='{tmp_path / 'm'}'",
                        env={"TEMPLM_DATA_DIR": str(path)})
        assert result.returncode == 1 and result.stderr.strip().splitlines()[-1].startswith(
            f"templm train: error: {path}: TEMPLM_DATA_DIR names {what}: build task data"), result.stderr[-2000:]
    assert not (tmp_path / "m").exists()
