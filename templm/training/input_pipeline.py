"""The T5 trainer's input: a SeqIO task's or mixture's training examples as batches of the model's features.

The examples come from a seeded SeqIO pipeline (shuffled, repeated); every process reads the same example stream and
keeps every `process_count`-th example, so the global batch is the same examples whatever the number of processes.
A resumed run skips exactly the batches it had consumed (the data position in the checkpoint), so it sees the same
examples as a run that never stopped.
"""

from __future__ import annotations

from typing import Mapping

import jax
import seqio
import tensorflow as tf


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


def training_batches(mixture_or_task_name: str, task_feature_lengths: Mapping[str, int], local_batch: int,
                     seed: int, pack: bool, start_batch: int = 0, split: str = "train") -> tf.data.Dataset:
    """This process's rows of the training batches: the examples (shuffled, repeated), `training_features`, this
    process's share, batched by `local_batch`, skipped to `start_batch`."""
    ds = seqio.get_mixture_or_task(mixture_or_task_name).get_dataset(
        task_feature_lengths, split=split, shuffle=True, num_epochs=None, seed=seed)
    ds = training_features(ds, task_feature_lengths, pack)
    if jax.process_count() > 1:
        ds = ds.shard(jax.process_count(), jax.process_index())
    ds = ds.batch(local_batch, drop_remainder=True)
    if start_batch:
        ds = ds.skip(start_batch)  # resume: the exact batches an uninterrupted run would see next
    return ds.prefetch(2)
