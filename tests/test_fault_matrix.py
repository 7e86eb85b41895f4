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
from templm_testing import run_templm

# verb -> how its output folder is named on the command line (a function of the folder), or why it has none.
OUTPUTS = {
    "data world": lambda out, i: ["data", "world", f"--out={out}", "--start_year=2014", "--end_year=2015",
                                  "--subjects_per_relation=4", "--docs_per_month=2"],
    "data splits": lambda out, i: ["data", "splits", f"--corpus={i['corpus']}", f"--out={out}"],
    "data templama": lambda out, i: ["data", "templama", f"--dump={i['corpus']}", f"--out={out}"],
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


def _users_folder(path):
    path.mkdir()
    (path / "notes.md").write_text("mine")
    (path / "sub").mkdir()
    return {"notes.md": "mine"}


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
        assert sorted(os.listdir(out)) == ["notes.md", "sub"] and (out / "notes.md").read_text() == "mine"
    if kind == "a file":
        assert out.read_text() == "a user's file"


# The verbs that write into their folder as they go, and the lock they hold beside it for the whole verb.
WRITE_INTO = ("is-eval", "appendices", "calm", "stream")


@pytest.mark.parametrize("verb", WRITE_INTO)
def test_a_second_run_on_the_same_folder_is_refused_naming_the_first(inputs, tmp_path, verb):
    """is-eval, appendices, calm and stream took no lock: two runs on one folder wrote into it at once. Each holds
    `<folder>.lock` for the whole verb, its report included; a second run is refused, naming the first, before any
    work."""
    from templm_testing import lock_holder

    out = tmp_path / "out"
    holder = lock_holder(f"{out}.lock", "the first run")
    try:
        result = run_templm(*OUTPUTS[verb](out, inputs))
    finally:
        holder.kill()
        holder.wait()
    assert result.returncode == 1, result.stderr[-2000:]
    assert f"folder {out} is in use by `" in result.stderr.strip().splitlines()[-1], result.stderr[-2000:]
    assert not out.exists()
