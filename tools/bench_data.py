#!/usr/bin/env python
"""Benchmark the SSM input pipeline against what the train step consumes: the input must never be the bottleneck.

    python tools/bench_data.py                      # a small world, temporal task and mixture, tiny + small steps
    python tools/bench_data.py --world full         # the default embedded world (TaskDataConfig(); slow to build)
    python tools/bench_data.py --quick              # fewer batches, tiny step only
    python tools/bench_data.py --stages             # where each row's time goes, stage by stage

Every figure is one JSON line on stdout ({"name", "value", "unit", "config", "devices", "jax", ...}); logs go to
stderr.

The pipeline is the trainer's own (`templm.training.input_pipeline.training_batches`): the task's or mixture's
examples over the task data (TFRecords of the embedded world, built with `prepare_task_data` into a temporary
folder), shuffled and repeated, the year prefix, SentencePiece tokenization, EOS, then
`input_pipeline.training_features` (seqio's EncDecFeatureConverter, packed) at 64 input and 16 target tokens,
batched by 8, prefetch 2. After `--warmup` batches (the first fills the 10,000-example shuffle
buffer; its time is reported as startup), `--batches` batches are timed on their own, with nothing else running.

Figures: packed rows/s (what a train step takes), examples/s (source examples packed into them, counted from the
segment ids), tokens/s (non-padding input + target tokens) and slot tokens/s (rows x 80); then for the train step of
each T5 config (`bench_t5.TemplmStep`, run on a batch from this very pipeline) the rows/s it consumes, and the
ratio pipeline / consumption, whose target is >= 5x.

`--stages` times the pipeline stage by stage past the first epoch instead (elements/s, counted in batches of 500 so
that Python does not limit the rate): a task's examples, then seqio's EncDecFeatureConverter unpacked and packed with
its defaults, without its per-example length checks, with tf.data's map fusion, and as the trainer sets it up; a
mixture with seqio's own sampling and with `templm.tasks.registry.sample_with_prefetch`. It shows where each row's
time goes.

Caveat: while training, the pipeline's threads share the CPU with the step (tf.data works in the background while
XLA computes); on 2 cores the ratio measured here, each running alone, is the upper bound of the headroom.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_t5 import REPO, TemplmStep, cpu_model, emit, load_average, log, median  # noqa: E402

if REPO not in sys.path:
    sys.path.insert(0, REPO)

TARGET_RATIO = 5.0


def build_data(args, root: str) -> str:
    from templm.data.task_data import TaskDataConfig, prepare_task_data
    from templm.data.world import WorldConfig

    out = os.path.join(root, "data")
    if args.world == "full":
        config = TaskDataConfig()
    else:
        config = TaskDataConfig(world=WorldConfig(seed=args.seed, start_year=2013, end_year=2016,
                                                  subjects_per_relation=40, docs_per_month=30),
                                vocab_size=768, future_years=1)
    log(f"building task data ({args.world} world) in {out} ...")
    t = time.perf_counter()
    manifest = prepare_task_data(config, out)
    train = sum(manifest["counts"]["customnews"]["train"].values())
    log(f"  {time.perf_counter() - t:.1f} s, {train} CustomNews training examples")
    return out


def _window(iterator, batches: int, lengths: dict) -> dict:
    import numpy as np

    rows = examples = tokens = 0
    t = time.perf_counter()
    for _ in range(batches):
        batch = next(iterator)
        rows += batch["encoder_input_tokens"].shape[0]
        examples += int(np.sum(np.max(batch["encoder_segment_ids"], axis=1)))
        tokens += int(np.sum(batch["encoder_input_tokens"] > 0) + np.sum(batch["decoder_target_tokens"] > 0))
    seconds = time.perf_counter() - t
    return {"rows_per_s": rows / seconds, "examples_per_s": examples / seconds, "tokens_per_s": tokens / seconds,
            "slot_tokens_per_s": rows * (lengths["inputs"] + lengths["targets"]) / seconds, "seconds": seconds}


def time_pipeline(name: str, lengths: dict, args, train_examples: int) -> dict:
    """Times `args.batches` batches of the first pass over the data (every example parsed and tokenized) and, unless
    --no_later_epochs, as many again once the pipeline is past its first epoch (tokenized examples of a world-sized
    task come from the in-memory cache then: templm.tasks.registry.MEMORY_CACHE_MAX_EXAMPLES)."""
    from templm.training.input_pipeline import training_batches

    t = time.perf_counter()
    iterator = training_batches(name, lengths, args.batch, args.seed, True, 0).as_numpy_iterator()
    first = next(iterator)
    startup_s = time.perf_counter() - t
    for _ in range(args.warmup):
        next(iterator)
    result = _window(iterator, args.batches, lengths)
    result.update(startup_s=startup_s, batch=first)
    if not args.no_later_epochs:
        per_batch = result["examples_per_s"] / result["rows_per_s"] * args.batch
        done = (1 + args.warmup + args.batches) * per_batch
        skip = max(0, int((1.1 * train_examples - done) / per_batch) + 1)
        t = time.perf_counter()
        for _ in range(skip):
            next(iterator)
        log(f"  {skip} batches to pass the first epoch ({train_examples} examples): {time.perf_counter() - t:.1f} s")
        result["later"] = _window(iterator, args.batches, lengths)
    del iterator
    return result


def _stage_rate(ds, skip: int, count: int) -> float:
    """Elements per second of `ds` after its first `skip` elements, over `count` elements."""
    import tensorflow as tf

    iterator = iter(ds.map(lambda _: tf.constant(1)).batch(500).prefetch(1))
    for _ in range(skip // 500):
        next(iterator)
    batches = max(1, count // 500)
    t = time.perf_counter()
    for _ in range(batches):
        next(iterator)
    seconds = time.perf_counter() - t
    del iterator
    return batches * 500 / seconds


def time_stages(task_name: str, mixture_name: str, lengths: dict, args, train_examples: int) -> None:
    """One line per stage (see the module docstring, --stages)."""
    import seqio
    import tensorflow as tf

    from templm.training.input_pipeline import training_features

    skip = int(1.1 * train_examples)
    fusion = tf.data.Options()
    fusion.experimental_optimization.map_fusion = True

    def examples(name):
        return seqio.get_mixture_or_task(name).get_dataset(lengths, split="train", shuffle=True, seed=args.seed,
                                                         num_epochs=None)

    def converted(ds, pack, check=True, fuse=False):  # one of the trainer's two settings, or neither
        ds = seqio.EncDecFeatureConverter(pack=pack, apply_length_check=check)(ds, lengths)
        return ds.with_options(fusion) if fuse else ds

    mixture = seqio.get_mixture_or_task(mixture_name)
    if not isinstance(mixture, seqio.Mixture):
        raise SystemExit(f"--stages needs a mixture last in --tasks, got the task {mixture_name!r}")
    plain = seqio.Mixture(f"plain_{mixture_name}", [(t.name, mixture.get_rate(t)) for t in mixture.tasks])

    def plain_examples():
        return plain.get_dataset(lengths, split="train", shuffle=True, seed=args.seed, num_epochs=None)

    stages = [
        (task_name, "examples (Task.get_dataset, no converter)", lambda: examples(task_name)),
        (task_name, "unpacked, seqio defaults", lambda: converted(examples(task_name), False)),
        (task_name, "unpacked, no length checks", lambda: converted(examples(task_name), False, check=False)),
        (task_name, "unpacked, map fusion", lambda: converted(examples(task_name), False, fuse=True)),
        (task_name, "unpacked, both (the trainer's)", lambda: training_features(examples(task_name), lengths, False)),
        (task_name, "packed rows, seqio defaults", lambda: converted(examples(task_name), True)),
        (task_name, "packed rows, the trainer's", lambda: training_features(examples(task_name), lengths, True)),
        (mixture_name, "examples, seqio's sampling", plain_examples),
        (mixture_name, "examples, sample_with_prefetch", lambda: examples(mixture_name)),
        (mixture_name, "packed rows, seqio defaults and sampling", lambda: converted(plain_examples(), True)),
        (mixture_name, "packed rows, the trainer's converter, seqio's sampling",
         lambda: training_features(plain_examples(), lengths, True)),
        (mixture_name, "packed rows, the trainer's (sample_with_prefetch)",
         lambda: training_features(examples(mixture_name), lengths, True)),
    ]
    for name, stage, build in stages:
        log(f"  {name}: {stage} ...")
        rate = _stage_rate(build(), skip, args.batches * 20)
        emit("data_stage_elements_per_s", rate, "elements/s", f"{name}: {stage}, {args.input_len}+{args.target_len} "
             f"tokens, {args.world} world, after the first epoch", devices="host (tf.data)")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--world", default="small", choices=("small", "full"))
    p.add_argument("--data_dir", default=None, help="use this task-data folder instead of building one")
    p.add_argument("--tasks", default="customnews_ssm_temporal,temporal_mixture")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--input_len", type=int, default=64)
    p.add_argument("--target_len", type=int, default=16)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--batches", type=int, default=300)
    p.add_argument("--step_configs", default="tiny,small", help="T5 configs whose train step consumption is measured")
    p.add_argument("--steps", type=int, default=0, help="timed train steps (0: 20 for tiny, 5 otherwise)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="100 batches, the temporal task, tiny step only")
    p.add_argument("--no_later_epochs", action="store_true", help="time the first pass over the data only")
    p.add_argument("--stages", action="store_true",
                   help="time the pipeline stage by stage (first task, then the mixture of --tasks) instead")
    args = p.parse_args(argv)
    if args.quick:
        args.batches, args.warmup, args.step_configs, args.no_later_epochs = 100, 5, "tiny", True
        args.tasks = args.tasks.split(",")[0]
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    log(f"machine: {os.cpu_count()} cores, {cpu_model()}, load {load_average()}")
    from templm import tasks
    from templm.models.t5 import T5_1_1_CONFIGS

    root = tempfile.mkdtemp(prefix="bench_data_")
    try:
        data_dir = args.data_dir or build_data(args, root)
        tasks.configure(data_dir=data_dir)
        from templm.data.task_data import read_manifest

        counts = read_manifest(data_dir)["counts"]
        train_examples = sum(sum(counts[folder]["train"].values()) for folder in counts)
        lengths = {"inputs": args.input_len, "targets": args.target_len}
        per_row = args.input_len + args.target_len
        if args.stages:
            names = [t for t in args.tasks.split(",") if t]
            time_stages(names[0], names[-1], lengths, args, train_examples)
            return 0
        pipelines = {}
        for name in [t for t in args.tasks.split(",") if t]:
            log(f"timing the pipeline of {name} ...")
            result = pipelines[name] = time_pipeline(name, lengths, args, train_examples)
            for suffix, window in (("", result), ("_later_epochs", result.get("later"))):
                if window is None:
                    continue
                label = (f"{name}: seqio EncDecFeatureConverter(pack=True), {args.input_len}+{args.target_len} "
                         f"tokens, batch {args.batch}, {args.world} world, "
                         + ("first pass" if not suffix else "after the first epoch"))
                common = {"batches_timed": args.batches, "startup_s": result["startup_s"]}
                emit(f"data_rows_per_s{suffix}", window["rows_per_s"], "rows/s", label, devices="host (tf.data)",
                     **common)
                emit(f"data_examples_per_s{suffix}", window["examples_per_s"], "examples/s", label,
                     devices="host (tf.data)", examples_per_row=window["examples_per_s"] / window["rows_per_s"],
                     **common)
                emit(f"data_tokens_per_s{suffix}", window["tokens_per_s"], "tokens/s", label,
                     devices="host (tf.data)", slot_tokens_per_s=window["slot_tokens_per_s"],
                     fill=window["tokens_per_s"] / window["slot_tokens_per_s"], **common)

        batch = next(iter(pipelines.values()))["batch"]
        for config_name in [c for c in args.step_configs.split(",") if c]:
            config = T5_1_1_CONFIGS[config_name]
            log(f"timing the {config_name} train step on a pipeline batch ...")
            step = TemplmStep(config, batch, args.seed)
            for _ in range(3):  # compile + warm-up
                step()
            n = args.steps or (20 if config_name == "tiny" else 5)
            step_s = median([step() for _ in range(n)])
            consumed = args.batch / step_s
            label = f"t5_1_1 {config_name} train step, batch {args.batch}, {args.input_len}+{args.target_len} " \
                    f"tokens, packed, float32, adafactor"
            emit("train_step_consumption_rows_per_s", consumed, "rows/s", label, step_s_median=step_s,
                 tokens_per_s=consumed * per_row, steps_timed=n)
            for name, result in pipelines.items():
                for suffix, window in (("", result), ("_later_epochs", result.get("later"))):
                    if window is None:
                        continue
                    ratio = window["rows_per_s"] / consumed
                    emit(f"data_vs_train_step{suffix}", ratio, "x", f"{name} pipeline / {label}",
                         target_min=TARGET_RATIO, met=ratio >= TARGET_RATIO, pipeline_rows_per_s=window["rows_per_s"],
                         consumed_rows_per_s=consumed)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
