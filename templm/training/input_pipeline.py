"""The T5 trainer's input: a SeqIO task's or mixture's training examples as batches of the model's features.

The global batch is assembled from `data_shards` independent pipelines (by default one per process). Shard s reads
its own part of the task's files (seqio's `ShardInfo`; at the example level, reading everything, where a split has
fewer files than shards), shuffles them with its own seed and contributes batch_size / data_shards consecutive rows
of each global batch. A process runs only the pipelines of its shards (data_shards / process_count of them), so no
process reads or preprocesses another's examples, and the global batch depends on (seed, data_shards) only: the same
examples in the same order for any number of processes that divides data_shards. One shard is exactly one seqio
pipeline with the run's seed (the stream of a single-process run).

Resume is constant in the step: each pipeline's tf.data iterator state (its position, shuffle buffer and
prefetched elements) is saved with every checkpoint, one record per shard, and restored without reading a single
consumed example. A checkpoint written without it (before templm saved the input state) is resumed by replaying the
consumed batches, with a warning.
"""

from __future__ import annotations

import threading
from typing import Dict, List, Mapping, Optional, Tuple

import jax
import numpy as np
import seqio
import tensorflow as tf

from templm import console, tasks
from templm.errors import ConfigError, DataError


def training_features(ds: tf.data.Dataset, task_feature_lengths: Mapping[str, int], pack: bool) -> tf.data.Dataset:
    """A task's or mixture's examples as the model's features: seqio's EncDecFeatureConverter as the trainer applies
    it. Two settings make it faster without changing a single row (tests/training/test_input_pipeline.py compares the
    batches with seqio's defaults): the converter's per-example length assertions are off
    (`apply_length_check=False`; seqio trims the task features to these lengths and the converter pads or packs to
    them, so both checks hold by construction), and tf.data fuses consecutive per-example maps (BENCHMARKS.md,
    input pipeline; `tools/bench_data.py --stages` times both)."""
    ds = seqio.EncDecFeatureConverter(pack=pack, apply_length_check=False)(ds, task_feature_lengths)
    options = tf.data.Options()
    options.experimental_optimization.map_fusion = True
    return ds.with_options(options)


def shard_seed(seed: int, shard: int, data_shards: int) -> int:
    """The seed of one shard's pipeline: the run's seed for a single shard, a distinct one derived from (seed, shard)
    otherwise, so that the shards do not shuffle in step."""
    if data_shards == 1:
        return seed
    return int(np.random.SeedSequence([seed, shard]).generate_state(1)[0] & 0x7FFFFFFF)


def training_batches(mixture_or_task_name: str, task_feature_lengths: Mapping[str, int], rows: int, seed: int,
                     pack: bool, start_batch: int = 0, split: str = "train",
                     shard: Optional[seqio.ShardInfo] = None, use_cached: bool = False) -> tf.data.Dataset:
    """One pipeline's batches of `rows` rows: the examples of `shard` (all with None; shuffled, repeated; from
    seqio's offline cache with `use_cached`), `training_features`, batched, skipped to `start_batch` (the replay of a
    resume without an input state)."""
    ds = seqio.get_mixture_or_task(mixture_or_task_name).get_dataset(
        task_feature_lengths, split=split, shuffle=True, num_epochs=None, seed=seed, shard_info=shard,
        use_cached=use_cached)
    ds = training_features(ds, task_feature_lengths, pack)
    ds = ds.batch(rows, drop_remainder=True)
    if start_batch:
        ds = ds.skip(start_batch)
    return ds.prefetch(2)


def _tasks(mixture_or_task_name: str) -> List[seqio.Task]:
    provider = seqio.get_mixture_or_task(mixture_or_task_name)
    return list(provider.tasks) if isinstance(provider, seqio.Mixture) else [provider]


def tasks_with_fewer_files(mixture_or_task_name: str, data_shards: int, split: str = "train",
                           use_cached: bool = False) -> Dict[str, int]:
    """The tasks of a mixture (or the task) whose `split` has fewer files than `data_shards` (in seqio's cache with
    `use_cached`), with their number of files: each of their shards reads every file and keeps its share of the
    examples."""
    few = {}
    for task in _tasks(mixture_or_task_name):
        if use_cached and split in task.splits and task.cache_dir:
            count = len(tf.io.gfile.glob(seqio.utils.get_cached_tfrecord_prefix(task.cache_dir, split) + "-*"))
        elif split in task.splits and not task.source.supports_arbitrary_sharding:
            count = len(task.source.list_shards(split))
        else:
            count = None
        if count is not None and count < data_shards:
            few[task.name] = count
    return few


def require_cached(mixture_or_task_name: str, split: str) -> None:
    """A ConfigError unless every task of the mixture (or the task) is in seqio's offline cache for `split`, naming
    the tasks that are not and the folders searched."""
    missing = [t.name for t in _tasks(mixture_or_task_name) if split in t.splits and not t.cache_dir]
    if missing:
        searched = ", ".join(seqio.get_global_cache_dirs()) or "none"
        raise ConfigError(f"USE_CACHED_TASKS (train/templm.DatasetConfig.use_cached): {', '.join(missing)} not in "
                          f"seqio's cache (folders searched: {searched}): make the cache with seqio's "
                          "cache_tasks_main (--module_import=templm.tasks) and name its folder with "
                          "--seqio_additional_cache_dirs")


class TrainingInput:
    """This process's rows of each global batch, from the pipelines of its shards (module docstring)."""

    def __init__(self, mixture_or_task_name: str, task_feature_lengths: Mapping[str, int], batch_size: int,
                 seed: int, pack: bool, data_shards: int = 0, split: str = "train",
                 process: Optional[Tuple[int, int]] = None, use_cached: bool = False):
        """process: (index, count), by default this process's (jax.process_index(), jax.process_count());
        use_cached: the examples from seqio's offline cache (a ConfigError naming the tasks it lacks)."""
        index, processes = process or (jax.process_index(), jax.process_count())
        self.data_shards = data_shards or processes
        if self.data_shards % processes or batch_size % self.data_shards:
            raise ConfigError(f"train/templm.DatasetConfig.shards {self.data_shards} must be a multiple of the number of "
                              f"processes ({processes}) and divide batch_size ({batch_size})")
        per_process = self.data_shards // processes
        self.shards = list(range(index * per_process, (index + 1) * per_process))
        self.rows = batch_size // self.data_shards
        self._args = (mixture_or_task_name, dict(task_feature_lengths), self.rows, seed, pack)
        self._split = split
        self._use_cached = use_cached
        if use_cached:
            require_cached(mixture_or_task_name, split)
        if self.data_shards > 1:
            few = tasks_with_fewer_files(mixture_or_task_name, self.data_shards, split, use_cached)
            if few and index == 0:
                console.warn(f"{', '.join(f'{t} ({n})' for t, n in sorted(few.items()))}: fewer {split} files than "
                             f"the {self.data_shards} data shards, so each shard reads all of those files and keeps "
                             "its share of the examples")
        self._unsavable = False
        self._iterators: List = [self._pipeline(s, 0) for s in self.shards]

    def _pipeline(self, shard: int, start_batch: int):
        name, lengths, rows, seed, pack = self._args
        info = seqio.ShardInfo(shard, self.data_shards) if self.data_shards > 1 else None
        return iter(training_batches(name, lengths, rows, shard_seed(seed, shard, self.data_shards), pack,
                                     start_batch, self._split, info, self._use_cached))

    def next(self) -> Dict[str, np.ndarray]:
        """This process's rows of the next global batch (its shards' rows, in shard order)."""
        try:
            parts = [next(it) for it in self._iterators]
        except tf.errors.DataLossError as e:  # a damaged record file: named, not a TensorFlow traceback
            raise tasks.corrupt_records(e) from None
        return {key: np.concatenate([p[key].numpy() for p in parts]) for key in parts[0]}

    def replay(self, batches: int) -> None:
        """Positions every pipeline after `batches` batches by reading them (a checkpoint without input state)."""
        self._iterators = [self._pipeline(s, batches) for s in self.shards]

    def state(self) -> Optional[Dict[str, bytes]]:
        """Each of this process's pipelines' iterator state, by shard name (`restore` reads it back); None, with a
        warning the first time, for a pipeline tf.data cannot save (a Python function in a preprocessor, a generator
        source): its checkpoints then hold the data position only, and a resume replays the consumed batches.

        The state is taken through the iterator's Trackable methods, the ones tf.train.Checkpoint calls, so that it
        is bytes taken here, in the training loop's thread, and orbax's background save only writes them."""
        if self._unsavable:
            return None
        try:
            return {self.shard_name(s): tf.io.serialize_tensor(it._serialize_to_tensors()["_STATE"]).numpy()
                    for s, it in zip(self.shards, self._iterators)}
        except tf.errors.OpError as e:
            self._unsavable = True
            console.warn(f"the input pipeline of {self._args[0]} cannot save its position ("
                         f"{str(e).splitlines()[0].split('}}')[-1].split('[Op:')[0].strip()}): checkpoints hold the "
                         "data position only, and a resume reads the consumed batches again")
            return None

    def restore(self, states: Mapping[str, bytes], where: str) -> None:
        """Puts each pipeline where `state()` found it; a DataError names what is missing or unreadable."""
        for s, it in zip(self.shards, self._iterators):
            name = self.shard_name(s)
            if name not in states:
                raise DataError(f"the checkpoint holds no input state for {name} (it has {sorted(states)})", where)
            try:
                it._restore_from_tensors({"_STATE": tf.io.parse_tensor(states[name], tf.variant)})
            except (tf.errors.OpError, ValueError) as e:
                raise DataError(f"the input state {name} cannot be restored: {str(e).splitlines()[0]}", where) from None

    def shard_name(self, shard: int) -> str:
        return f"shard-{shard:05d}-of-{self.data_shards:05d}"

    def close(self) -> None:
        """Lets go of the pipelines: an iterator left alive at exit can hang the process (tf.data). Deleting one can
        wait, idle, for seconds while its pipeline is still filling (7-9 s after a smoke study's training,
        docs/results.md), so the deletion runs in a thread of its own and the next model need not wait; Python
        joins that thread (not a daemon) before the process exits, so no iterator outlives the process."""
        iterators, self._iterators = self._iterators, []
        if iterators:
            threading.Thread(target=iterators.clear, name="templm-input-close").start()
