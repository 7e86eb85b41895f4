"""The `templm` command line end to end: verbs, help, gin flags, and bad input answered with file:line and exit 1."""

import filecmp
import json
import os
import subprocess
import sys

import pytest

from templm.cli import ConfigError, rewrite_gin_args


def templm(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "templm.cli", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300)


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
