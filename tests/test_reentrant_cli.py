"""`templm.cli.main(argv)` runs every verb in this process with the behaviour of `templm ...` in a fresh process: each
verb runs twice in the suite's process and once as `python -m templm.cli`, and the three runs agree on the exit
status, standard output, templm's own error and warning lines and the files written (their names, and their bytes
where the verb writes them deterministically). Training verbs are compared on their losses; the verbs whose work
takes minutes (reproduce, appendices, train-lm, stream, calm) are compared on their checks of bad input, which parse
their flags and gin configs as a run does."""

import json
import os
import re

import pytest

from templm_testing import (REPO, VERB_T5, VERB_TASK_FLAGS, VERB_WORLD_FLAGS, run_templm, run_templm_process,
                            without_times)

pytestmark = pytest.mark.e2e

WORLD_FLAGS, TASK_FLAGS, T5 = VERB_WORLD_FLAGS, VERB_TASK_FLAGS, VERB_T5
# Files whose bytes hold a time or the machine's state (orbax's metadata, timing, TensorBoard events, locks).
UNSTABLE = re.compile(r"(checkpoints/|events\.out|metrics\.jsonl$|\.lock$|_CHECKPOINT_METADATA|timing)")


@pytest.fixture(scope="module")
def inputs(verb_inputs):
    """A world, task data and a T5 checkpoint of two steps, made once through main (tests/conftest.py); the verbs
    read them."""
    return verb_inputs


def _cases(i):
    """(verb, args, env) of each case; `{out}` is the run's own output folder."""
    dump = os.path.join(REPO, "tests", "fixtures", "wikidata_dump.json")
    news = i["world"] / "news.jsonl"
    data_env = {"TEMPLM_DATA_DIR": str(i["data"])}
    return {
        "data world": (("data", "world", "--out={out}", *WORLD_FLAGS), None),
        "data stats": (("data", "stats", f"--corpus={news}"), None),
        "data splits": (("data", "splits", f"--corpus={news}", "--out={out}", "--cutoff=2016-06-30",
                         "--test_docs_per_month=2", "--test_months=6", "--heldout_per_year=4",
                         "--allow_degenerate"), None),
        "data spm": (("data", "spm", f"--corpus={news}", "--out={out}/spm", "--vocab_size=150"), None),
        "data streams": (("data", "streams", f"--corpus={news}", f"--split_dir={i['splits']}",
                          f"--spm_model={i['spm']}", "--out={out}"), None),
        "data templama": (("data", "templama", "--norequire_enwiki", f"--dump={dump}", "--out={out}",
                           "--max_subjects=4"), None),
        "data cronquestions": (("data", "cronquestions", f"--release={i['root'] / 'no_release'}", "--out={out}"),
                               None),
        "data tasks": (("data", "tasks", "--out={out}", *TASK_FLAGS), None),
        "data calm": (("data", "calm", "--out={out}", f"--texts={i['texts']}", "--level=char"), None),
        "train": (("train", *T5, "--gin.MODEL_DIR='{out}'", "--gin.TRAIN_STEPS=3"), data_env),
        "eval": (("eval", *T5, f"--gin.MODEL_DIR='{i['model']}'", "--split=validation",
                  "--eval_task=templama_temporal", "--num_examples=8", "--out={out}"), data_env),
        "infer": (("infer", *T5, f"--gin.MODEL_DIR='{i['model']}'", f"--input={i['queries']}",
                   "--output={out}/predictions.jsonl"), data_env),
        "plan": (("plan", *T5, "--gin.templm.make_mesh.mesh_shape=(2, 2)", "--device_kind=a100_80"), None),
        "reproduce": (("reproduce", "--preset=huge", "--out={out}"), None),
        "calm": (("calm", "--gin_file=calm/txl_online.gin", "--gin.OUT_DIR='{out}'",
                  f"--gin.templm.run_calm.corpus_dir='{i['root'] / 'no_corpus'}'"), None),
        "is-eval": (("is-eval", "--out={out}", "--seed=1", "--ks=1,4", "--temperatures=0.5", "--repeats=2",
                     "--num_docs=3", "--doc_length=8"), None),
        "train-lm": (("train-lm", "--gin_file=txl/time_stratified.gin", "--gin_file=txl/tiny.gin",
                      "--gin.MODEL_DIR='{out}'", f"--gin.CORPUS='{news}'",
                      f"--gin.SPLIT_DIR='{i['root'] / 'no_splits'}'", f"--gin.SPM_MODEL='{i['root'] / 'no.model'}'"),
                     None),
        "stream": (("stream", "--gin_file=txl/dynamic_eval.gin", "--gin.OUT_DIR='{out}'",
                    f"--gin.TIME_STRATIFIED_DIR='{i['root'] / 'no_ts'}'", f"--gin.CONTROL_DIR='{i['root'] / 'no_c'}'"),
                   None),
        "appendices": (("appendices", "--out={out}", "--preset=tiny_test", "--shifts=0,-1"), None),
    }


def _normal_output(text, out, root):
    """Standard output with the run's folders named alike and what holds a time dropped."""
    lines = []
    for line in text.replace(str(out), "<OUT>").replace(str(root), "<IN>").splitlines():
        try:
            value = json.loads(line)
        except ValueError:
            lines.append(re.sub(r"\b\d+(\.\d+)?\s?(s|ms|m\d+s)\b", "<T>", line))
            continue
        lines.append(json.dumps(without_times(value), sort_keys=True))
    return lines


def _our_lines(text, out, root):
    """templm's own error and warning lines (progress lines hold rates and times)."""
    text = text.replace(str(out), "<OUT>").replace(str(root), "<IN>")
    return [line for line in text.splitlines() if line.startswith(("templm ", "warning:"))]


def _files(out):
    found = {}
    for folder, _, names in os.walk(out):
        for name in names:
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, out)
            if UNSTABLE.search(rel):  # named by what it is: a checkpoint's step, a summary's folder
                rel = re.sub(r"^(.*checkpoints/\d+)/.*$", r"\1", rel)
                found[re.sub(r"events\.out\.tfevents\..*$", "events", rel)] = None
                continue
            with open(path, "rb") as f:
                content = f.read().replace(str(out).encode(), b"<OUT>")
            if rel.endswith(".json"):  # a summary may say how long its work took
                content = json.dumps(without_times(json.loads(content)), sort_keys=True).encode()
            found[rel] = content
    return found


def _losses(out):
    path = os.path.join(out, "metrics.jsonl")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return [row["loss"] for row in map(json.loads, f) if row.get("split") == "train"]


VERBS = ["data world", "data stats", "data splits", "data spm", "data streams", "data templama", "data cronquestions",
         "data tasks", "data calm", "train", "eval", "infer", "plan", "reproduce", "calm", "is-eval", "train-lm",
         "stream", "appendices"]


def test_the_cases_cover_every_verb():
    from templm.cli import VERBS as TABLE

    assert sorted(VERBS) == sorted(TABLE)


@pytest.mark.parametrize("verb", VERBS)
def test_a_verb_twice_in_one_process_equals_a_fresh_process(verb, inputs, tmp_path):
    args, env = _cases(inputs)[verb]
    seen = []
    for k, how in enumerate((run_templm, run_templm, run_templm_process)):
        out = tmp_path / f"run{k}"
        result = how(*(a.replace("{out}", str(out)) for a in args), env=env)
        seen.append({"status": result.returncode,
                     "stdout": _normal_output(result.stdout, out, inputs["root"]),
                     "ours": _our_lines(result.stderr, out, inputs["root"]),
                     "files": _files(out) if out.exists() else None,
                     "losses": _losses(out)})
        if k == 0:
            first_error = result.stderr[-3000:]
    assert seen[0] == seen[1], f"{verb}: the second call in this process differs from the first\n{first_error}"
    assert seen[0] == seen[2], f"{verb}: the fresh process differs from the call in this process\n{first_error}"
    good = verb not in ("data cronquestions", "reproduce", "calm", "train-lm", "stream", "appendices")
    assert (seen[0]["status"] == 0) == good, first_error  # the bad-input cases fail for the reason they give
    if not good:
        assert len(seen[0]["ours"]) == 1 and seen[0]["files"] is None, seen[0]
