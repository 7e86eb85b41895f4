"""seqio's offline cache of templm's tasks, made as T5X users make it: seqio's own `cache_tasks_main` (the program
they run on Dataflow) with Beam's local runner, importing templm.tasks as its module (in the program's process:
worker processes would add their start, about ten seconds, to the suite; templm's own pipelines are tested with two
worker processes in tests/data). The cached task must read back the examples of the uncached one, split by split,
and `templm train` reads it as T5X does."""

import os
import subprocess
import sys

import pytest
import seqio

from templm import tasks

# The training task (CustomNews salient-span examples): one task, as the workers' start dominates the time.
CACHED = ("customnews_ssm_temporal",)


@pytest.fixture(scope="module")
def cache(verb_inputs, tmp_path_factory):
    """The cache folder `cache_tasks_main` wrote for CACHED over the suite's task data."""
    folder = tmp_path_factory.mktemp("seqio_cache") / "cache"
    env = {**os.environ, "TEMPLM_DATA_DIR": str(verb_inputs["data"])}
    result = subprocess.run([sys.executable, "-m", "seqio.scripts.cache_tasks_main", "--module_import=templm.tasks",
                             f"--tasks={','.join(CACHED)}", f"--output_cache_dir={folder}",
                             "--pipeline_options=--runner=FnApiRunner,--direct_num_workers=1"],
                            env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    return folder


def _examples(dataset):
    return sorted((ex["id"].decode(), tuple(ex["inputs"].tolist()), tuple(ex["targets"].tolist()))
                  for ex in dataset.as_numpy_iterator())


@pytest.mark.parametrize("name", CACHED)
def test_the_cached_task_reads_back_the_uncached_task_s_examples(verb_inputs, cache, name):
    assert (cache / name / "COMPLETED").exists(), sorted(os.listdir(cache))
    tasks.configure(data_dir=str(verb_inputs["data"]))
    before = list(seqio.get_global_cache_dirs())
    seqio.add_global_cache_dirs([str(cache)])
    try:
        task = seqio.get_mixture_or_task(name)
        assert task.cache_dir == str(cache / name)
        for split in task.splits:
            cached = _examples(task.get_dataset(None, split=split, use_cached=True, shuffle=False))
            plain = _examples(task.get_dataset(None, split=split, use_cached=False, shuffle=False))
            assert cached == plain and plain, (split, len(cached), len(plain))
    finally:
        seqio.set_global_cache_dirs(before)
        tasks.configure()


def test_templm_train_reads_the_cache_as_t5x_does_and_leaves_seqio_as_it_was(verb_inputs, cache, tmp_path):
    """T5X reads a cached task with `--seqio_additional_cache_dirs=DIR` and `USE_CACHED_TASKS = True`; so does
    `templm train`: its batches are those of seqio's cached dataset of the task (not of the uncached one), the
    checkpoint records it and a resume without it is refused naming the binding, a task the cache lacks is one line
    naming it and the folders searched, and seqio's cache folders are as they were after the command."""
    import json

    import numpy as np

    from templm.training.input_pipeline import TrainingInput, training_features
    from templm_testing import VERB_T5, run_templm

    name, lengths, seed = CACHED[0], {"inputs": 32, "targets": 8}, 7
    before = list(seqio.get_global_cache_dirs())
    tasks.configure(data_dir=str(verb_inputs["data"]))
    seqio.add_global_cache_dirs([str(cache)])
    try:
        first = TrainingInput(name, lengths, 8, seed, pack=True, use_cached=True).next()
        plain = TrainingInput(name, lengths, 8, seed, pack=True).next()
        expected = next(training_features(seqio.get_mixture_or_task(name).get_dataset(
            lengths, split="train", shuffle=True, num_epochs=None, seed=seed, use_cached=True), lengths, True)
            .batch(8).as_numpy_iterator())
    finally:
        seqio.set_global_cache_dirs(before)
        tasks.configure()
    assert first.keys() == expected.keys() and all(np.array_equal(first[k], expected[k]) for k in first)
    assert not np.array_equal(first["encoder_input_tokens"], plain["encoder_input_tokens"])

    env = {"TEMPLM_DATA_DIR": str(verb_inputs["data"])}
    model_dir = tmp_path / "model"
    args = (*VERB_T5, f"--gin.MODEL_DIR='{model_dir}'", f"--gin.MIXTURE_OR_TASK_NAME='{name}'")
    result = run_templm("train", *args, "--gin.TRAIN_STEPS=2", "--gin.USE_CACHED_TASKS=True",
                        f"--seqio_additional_cache_dirs={cache}", env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1])["step"] == 2
    assert seqio.get_global_cache_dirs() == before
    again = run_templm("train", *args, "--gin.TRAIN_STEPS=4", env=env)  # the same run, but not from the cache
    refused = again.stderr.strip().splitlines()[-1]
    assert again.returncode == 1 and "use_cached true there, false in this run " \
        "(train/templm.DatasetConfig.use_cached, USE_CACHED_TASKS)" in refused, again.stderr[-2000:]
    missing = run_templm("train", *VERB_T5, f"--gin.MODEL_DIR='{tmp_path / 'other'}'", "--gin.TRAIN_STEPS=2",
                         "--gin.USE_CACHED_TASKS=True", f"--seqio_additional_cache_dirs={cache}",
                         env=env)
    line = missing.stderr.strip().splitlines()[-1]
    assert missing.returncode == 1 and "USE_CACHED_TASKS (train/templm.DatasetConfig.use_cached): " in line and \
        "not in seqio's cache (folders searched: " in line and str(cache) in line, missing.stderr[-2000:]
