#!/usr/bin/env python
"""Benchmark resume and checkpoint saves: resume time against the step resumed from, and the stall of a save.

    python tools/bench_checkpoint.py                  # both parts (about 5 minutes on 2 cores)
    python tools/bench_checkpoint.py --part resume --steps 100,1000,10000
    python tools/bench_checkpoint.py --part save --config small

Every figure is one JSON line on stdout ({"name", "value", "unit", "config", "devices", "jax", ...}); logs go to
stderr.

Resume (`--part resume`): T5 tiny on the trainer's input (`templm.training.input_pipeline.TrainingInput`: the small
world of tools/bench_data.py, temporal_mixture, batch 16, 64 input and 16 target tokens, packed, one data shard).
For each step N a checkpoint at data position N is written: the input pipeline is run for N batches and saved with
the initial train state (the parameters do not matter to how long a resume takes, and training N steps first would
only make the benchmark slower). Then `templm.training.trainer.train(total_steps=N+1)` resumes it, timed from the call
to its return: restore of the state, of the input pipeline's state, one step and the final (waited-for) save, with
the step compiled beforehand (the trainer's step cache). The same checkpoint without its input state is then
resumed by replaying the N batches (what templm did before it saved the input state). Figures per N: the resume
seconds (median of --rounds), the replay resume seconds (one round), and `resume_vs_first_ratio`, the resume time at
N over the one at the first N, which stays near 1 when the resume does not grow with the step.

Save (`--part save`): a T5 train step (tiny or small, batch 8, 64 + 16 tokens, Adafactor) on one device, saving its
state with `templm.training.checkpoints.Checkpointer` (the trainer's, with the input state of the pipeline above)
asynchronously and synchronously. A window of --window steps with one save at its first step is timed against a
window without a save; the stall is the difference (median over --saves saves), so it counts the blocking part of
the save and whatever the background write takes from the steps that follow it (on 2 cores the write competes with
the step). Also reported: the time `save()` itself blocks, and the checkpoint's size.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_t5 import REPO, emit, log, median  # noqa: E402

if REPO not in sys.path:
    sys.path.insert(0, REPO)

NAME, LENGTHS, BATCH = "temporal_mixture", {"inputs": 64, "targets": 16}, 16


def build_data(root: str, seed: int) -> str:
    from templm import tasks
    from templm.data.task_data import TaskDataConfig, prepare_task_data
    from templm.data.world import WorldConfig

    out = os.path.join(root, "data")
    log(f"building task data in {out} ...")
    prepare_task_data(TaskDataConfig(world=WorldConfig(seed=seed, start_year=2013, end_year=2016,
                                                       subjects_per_relation=40, docs_per_month=30),
                                     vocab_size=768, future_years=1), out)
    tasks.configure(data_dir=out)
    return out


def folder_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(root, name)) for root, _, names in os.walk(path) for name in names)


def write_checkpoint_at(model_dir: str, position: int, model, tx, seed: int) -> None:
    """A templm checkpoint at data position `position`: the input run for that many batches, the initial state."""
    from templm.training import partitioning, state as train_state, trainer
    from templm.training.checkpoints import Checkpointer
    from templm.training.input_pipeline import TrainingInput

    mesh = partitioning.make_mesh(mesh_shape=(1, 1))
    rules = partitioning.logical_axis_rules()
    inputs = TrainingInput(NAME, LENGTHS, BATCH, seed, True, data_shards=1)
    t = time.perf_counter()
    for _ in range(position):
        inputs.next()
    log(f"  input at position {position}: {time.perf_counter() - t:.1f} s")
    with train_state.mesh_rules(mesh, rules):
        state, _ = trainer.init_state(model, tx, LENGTHS, seed, mesh, rules)
    meta = {"seed": seed, "data_seed": None, "mixture_or_task_name": NAME, "batch_size": BATCH,
            "task_feature_lengths": LENGTHS, "data_shards": 1, "step": position, "data_position": position,
            "train": None}
    checkpointer = Checkpointer(os.path.join(model_dir, "checkpoints"), 0, None)
    try:
        checkpointer.save(position, state, meta, inputs=inputs.state(), wait=True)
    finally:
        checkpointer.close()
        inputs.close()


def timed_resume(model_dir: str, position: int, model, tx, seed: int) -> float:
    """Seconds of trainer.train resuming `position` for one step; the step it saves is removed afterwards."""
    from templm.training import partitioning, trainer
    from templm.training.configs import CheckpointConfig, DatasetConfig, SaveCheckpointConfig
    from templm.training.loop import RunOptions

    t = time.perf_counter()
    result = trainer.train(model_dir=model_dir, model=model, train_dataset_cfg=DatasetConfig(NAME, LENGTHS, BATCH),
                           total_steps=position + 1, optimizer=tx, random_seed=seed, stats_period=1000,
                           checkpoint_cfg=CheckpointConfig(SaveCheckpointConfig(period=0, keep=None)),
                           options=RunOptions(mesh=partitioning.make_mesh(mesh_shape=(1, 1)), progress=False))
    seconds = time.perf_counter() - t
    assert result.start_step == position, result.start_step
    checkpoints = os.path.join(model_dir, "checkpoints")
    shutil.rmtree(os.path.join(checkpoints, str(position + 1)))
    os.unlink(os.path.join(checkpoints, "integrity", f"{position + 1}.json"))
    return seconds


def drop_input_state(model_dir: str, position: int) -> None:
    """The checkpoint as templm wrote it before it saved input states (no `input` item, no digest record)."""
    checkpoints = os.path.join(model_dir, "checkpoints")
    shutil.rmtree(os.path.join(checkpoints, str(position), "input"))
    os.unlink(os.path.join(checkpoints, "integrity", f"{position}.json"))


def run_resume(args, root: str) -> None:
    import optax

    from templm.models.t5 import T5_1_1_CONFIGS, EncoderDecoderModel

    model, tx = EncoderDecoderModel(T5_1_1_CONFIGS["tiny"]), optax.adafactor(0.01)
    steps = [int(s) for s in args.steps.split(",")]
    dirs = {}
    for n in steps:
        dirs[n] = os.path.join(root, f"resume_{n}")
        write_checkpoint_at(dirs[n], n, model, tx, args.seed)
    log("compiling the step (a resume not timed) ...")
    warm = os.path.join(root, "warm")
    shutil.copytree(dirs[steps[0]], warm)
    timed_resume(warm, steps[0], model, tx, args.seed)
    times = {n: [] for n in steps}
    for r in range(args.rounds):
        for n in steps:
            times[n].append(timed_resume(dirs[n], n, model, tx, args.seed))
            log(f"  round {r + 1}: resume from step {n}: {times[n][-1]:.2f} s")
    first = median(times[steps[0]])
    config = f"t5_tiny batch {BATCH} {LENGTHS['inputs']}+{LENGTHS['targets']} packed, 1 data shard"
    for n in steps:
        checkpoint = os.path.join(dirs[n], "checkpoints", str(n))
        emit("resume_s", median(times[n]), "s", config, step=n, rounds=args.rounds, runs=times[n],
             checkpoint_bytes=folder_bytes(checkpoint),
             input_state_bytes=folder_bytes(os.path.join(checkpoint, "input")))
        emit("resume_vs_first_ratio", median(times[n]) / first, "x", config, step=n, reference_step=steps[0])
    if args.no_replay:
        return
    for n in steps:
        drop_input_state(dirs[n], n)
        seconds = timed_resume(dirs[n], n, model, tx, args.seed)
        log(f"  replay resume from step {n}: {seconds:.2f} s")
        emit("replay_resume_s", seconds, "s", config, step=n, vs_resume=seconds / median(times[n]))


def run_save(args, root: str) -> None:
    import jax
    import optax

    from templm.models.t5 import T5_1_1_CONFIGS, EncoderDecoderModel
    from templm.training import partitioning, state as train_state, trainer
    from templm.training.checkpoints import Checkpointer
    from templm.training.input_pipeline import TrainingInput

    model = EncoderDecoderModel(T5_1_1_CONFIGS[args.config])
    lengths, batch = dict(LENGTHS), 8
    mesh = partitioning.make_mesh(mesh_shape=(1, 1))
    rules = partitioning.logical_axis_rules()
    tx = optax.adafactor(0.01)
    with train_state.mesh_rules(mesh, rules):
        state, shardings = trainer.init_state(model, tx, lengths, args.seed, mesh, rules)
        step_fn = train_state.compile_step(trainer.make_train_step(model, tx), shardings,
                                           partitioning.data_sharding(mesh), mesh)
        inputs = TrainingInput(NAME, lengths, batch, args.seed, True, data_shards=1)
        batches = [train_state.global_batch(inputs.next(), partitioning.data_sharding(mesh)) for _ in range(4)]
        rng = jax.random.key(0)
        log(f"compiling the {args.config} step ...")
        state, metrics = step_fn(state, batches[0], rng)
        jax.block_until_ready(metrics)

        def window(checkpointer, step0):
            """Seconds of --window steps, saving at the first when a checkpointer is given; the save's block."""
            nonlocal state
            blocked = 0.0
            t = time.perf_counter()
            for i in range(args.window):
                state, metrics = step_fn(state, batches[i % len(batches)], rng)
                jax.block_until_ready(metrics)
                if checkpointer is not None and i == 0:
                    b = time.perf_counter()
                    checkpointer.save(step0, state, {"step": step0}, inputs=inputs.state())
                    blocked = time.perf_counter() - b
            if checkpointer is not None:
                checkpointer.wait(digests=True)
            return time.perf_counter() - t, blocked

        results = {}
        for mode in ("async", "sync"):
            folder = os.path.join(root, f"save_{mode}")
            checkpointer = Checkpointer(folder, 0, 2, async_save=(mode == "async"))
            stalls, blocks = [], []
            try:
                for k in range(args.saves):
                    base, _ = window(None, 0)
                    with_save, blocked = window(checkpointer, k + 1)
                    stalls.append(with_save - base)
                    blocks.append(blocked)
                    log(f"  {mode} save {k + 1}: window {with_save:.2f} s vs {base:.2f} s without a save; "
                        f"save() blocked {blocked:.2f} s")
            finally:
                checkpointer.close()
            results[mode] = (stalls, blocks, base / args.window, folder_bytes(os.path.join(folder, str(args.saves))))
        inputs.close()
    config = f"t5_{args.config} batch {batch} {lengths['inputs']}+{lengths['targets']}, window {args.window} steps"
    for mode, (stalls, blocks, step_s, size) in results.items():
        emit(f"save_stall_{mode}_s", median(stalls), "s", config, runs=stalls, step_s=step_s,
             stall_in_steps=median(stalls) / step_s, checkpoint_bytes=size)
        emit(f"save_blocking_{mode}_s", median(blocks), "s", config, runs=blocks)
    emit("save_stall_async_vs_sync_ratio", median(results["async"][0]) / max(median(results["sync"][0]), 1e-9), "x",
         config)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--part", choices=("resume", "save", "both"), default="both")
    parser.add_argument("--steps", default="100,1000,10000", help="steps to resume from (resume part)")
    parser.add_argument("--rounds", type=int, default=3, help="timed resumes per step")
    parser.add_argument("--no_replay", action="store_true", help="skip the replay resumes")
    parser.add_argument("--config", default="small", choices=("tiny", "small"), help="model of the save part")
    parser.add_argument("--window", type=int, default=8, help="steps per timed window (save part)")
    parser.add_argument("--saves", type=int, default=3, help="saves per mode (save part)")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    from absl import logging

    logging.set_verbosity(logging.ERROR)
    import tensorflow as tf

    tf.config.set_visible_devices([], "GPU")  # tf.data only: the accelerator's memory stays JAX's, as in the CLI
    root = tempfile.mkdtemp(prefix="bench_checkpoint_")
    try:
        build_data(root, args.seed)
        if args.part in ("resume", "both"):
            run_resume(args, root)
        if args.part in ("save", "both"):
            run_save(args, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
