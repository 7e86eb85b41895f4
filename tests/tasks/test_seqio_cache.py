"""seqio's offline cache of templm's tasks, made as T5X users make it: seqio's own `cache_tasks_main` (the program
they run on Dataflow) with Beam's local runner and two worker processes, importing templm.tasks as its module. The
cached task must read back the examples of the uncached one, split by split."""

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
    """The cache folder `cache_tasks_main` wrote for CACHED over the suite's task data (2 workers)."""
    folder = tmp_path_factory.mktemp("seqio_cache") / "cache"
    env = {**os.environ, "TEMPLM_DATA_DIR": str(verb_inputs["data"])}
    result = subprocess.run([sys.executable, "-m", "seqio.scripts.cache_tasks_main", "--module_import=templm.tasks",
                             f"--tasks={','.join(CACHED)}", f"--output_cache_dir={folder}",
                             "--pipeline_options=--runner=DirectRunner,--direct_num_workers=2,"
                             "--direct_running_mode=multi_processing"],
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
