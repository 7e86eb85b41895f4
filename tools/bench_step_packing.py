#!/usr/bin/env python
"""Benchmark: what the smoke study's T5 training would gain from more work per compiled call, on this machine.

    python tools/bench_step_packing.py              # the smoke study's model and batch, 3 rounds, 2 processes
    python tools/bench_step_packing.py --quick      # batch 4, 1 round, no processes (a smoke run)

The smoke study (`templm reproduce --preset smoke`, what `make demo` runs) trains thirteen T5 v1.1 "tiny" models of
batch 32, 64 + 16 tokens, at a vocabulary of 612 (512 pieces + 100 sentinels), two at a time. Issue 42 asked
whether those steps are bound by dispatch (the host's cost of starting each call) and would run faster packed:

    one_step      the trainer's compiled step (trainer.make_train_step, Adafactor at the study's constant rate 0.01,
                  the state donated), one call per step; metrics fetched every 10 steps, as the loop logs them
    scan_steps    K steps in one call: lax.scan of the same step over K stacked batches
    models        K models in one call: K independent states and batches, one jitted function of all K steps
    threads       P Python threads in this process, each running one_step on its own state and batch
    threads_scan  P threads, each running scan_steps on its own state (the two packings together)
    processes     P processes side by side, each running one_step alone (the machine's cores shared between them)

Each figure is model steps per second and its ratio to one_step measured in the same run (same rounds, same load;
the processes' ratio is to a one_step child timed alone just before them). scan_steps also reports the largest
difference between its parameters and K single steps' from the same start on the same batches (`max_abs_diff`):
packing changes where the work runs, not the training. One JSON line per figure on stdout, as tools/bench_t5.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import threading
import time

TOOLS = os.path.dirname(os.path.abspath(__file__))
if TOOLS not in sys.path:
    sys.path.insert(0, TOOLS)

from bench_t5 import REPO, cpu_model, emit, load_average, log, make_batch, median  # noqa: E402

if REPO not in sys.path:
    sys.path.insert(0, REPO)

VOCAB = 612  # the smoke study's: Study.vocab_size 512 SentencePiece pieces + 100 sentinels


class Packed:
    """The smoke study's model and optimizer with one_step, scan_steps and models compiled for `k` batches."""

    def __init__(self, batch: int, k: int, seed: int = 0):
        import jax
        import jax.numpy as jnp
        import optax

        from templm.models.t5 import T5_1_1_CONFIGS, EncoderDecoderModel
        from templm.training import partitioning, state, trainer

        self.jax, self.k = jax, k
        model = EncoderDecoderModel(dataclasses.replace(T5_1_1_CONFIGS["tiny"], vocab_size=VOCAB))
        tx = optax.adafactor(0.01)
        self.mesh, self.rules = partitioning.make_mesh(), partitioning.logical_axis_rules()
        self._scope = lambda: state.mesh_rules(self.mesh, self.rules)
        with self._scope():
            lengths = {"inputs": 64, "targets": 16}
            made = [trainer.init_state(model, tx, lengths, seed + i, self.mesh, self.rules) for i in range(k)]
            self.states, shardings = [state_ for state_, _ in made], made[0][1]
            data = partitioning.data_sharding(self.mesh)
            batches = [make_batch(VOCAB, batch, 64, 16, seed=seed + i) for i in range(k)]
            self.batches = [{name: jax.device_put(v, data) for name, v in b.items()} for b in batches]
            self.stacked = {name: jnp.stack([b[name] for b in batches]) for name in batches[0]}
            self.rng = jax.random.key(seed + 1)
            step = trainer.make_train_step(model, tx)
            self.one = state.compile_step(step, shardings, data, self.mesh)

            def scanned(s, stacked, rng):
                s, metrics = jax.lax.scan(lambda c, b: step(c, b, rng), s, stacked)
                return s, jax.tree.map(lambda m: m[-1], metrics)

            self.scan = jax.jit(scanned, donate_argnums=0)
            self.models = jax.jit(lambda ss, bs, rng: tuple(step(s, b, rng) for s, b in zip(ss, bs)),
                                  donate_argnums=0)

    def copy_state(self, i: int = 0):
        return self.jax.tree.map(lambda x: x.copy(), self.states[i])

    def max_abs_diff(self) -> float:
        """Largest |difference| of the parameters after K single steps and after one K-step scan, same start."""
        jax = self.jax
        with self._scope():
            one = self.copy_state()
            for b in self.batches:
                one, _ = self.one(one, b, self.rng)
            packed, _ = self.scan(self.copy_state(), self.stacked, self.rng)
        diffs = jax.tree.map(lambda a, b: float(jax.numpy.max(jax.numpy.abs(a - b))), one["params"],
                             packed["params"])
        return max(jax.tree.leaves(diffs))

    def _one_steps(self, s, steps: int, batch_at):
        """`steps` calls of one_step from state `s` on batch_at(i), metrics fetched every 10 steps as the loop logs
        them; returns the state once ready."""
        for i in range(steps):
            s, m = self.one(s, batch_at(i), self.rng)
            if i % 10 == 9:
                self.jax.device_get(m)
        return self.jax.block_until_ready(s)

    def time_one(self, steps: int) -> float:
        """Seconds per model step, one step per call."""
        with self._scope():
            s = self._one_steps(self.copy_state(), 1, lambda i: self.batches[0])
            t = time.perf_counter()
            self._one_steps(s, steps, lambda i: self.batches[i % self.k])
            return (time.perf_counter() - t) / steps

    def _scan_calls(self, s, calls: int):
        """`calls` calls of scan_steps (K steps each) from state `s`, metrics fetched after each; returns the state
        once ready."""
        for _ in range(calls):
            s, m = self.scan(s, self.stacked, self.rng)
            self.jax.device_get(m)
        return self.jax.block_until_ready(s)

    def time_scan(self, calls: int) -> float:
        with self._scope():
            s = self._scan_calls(self.copy_state(), 1)
            t = time.perf_counter()
            self._scan_calls(s, calls)
            return (time.perf_counter() - t) / (calls * self.k)

    @staticmethod
    def _seconds_in_threads(count: int, run) -> float:
        """Wall seconds of `count` threads running run(i) side by side."""
        threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
        t = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return time.perf_counter() - t

    def time_threads(self, count: int, steps: int) -> float:
        """Seconds per model step with `count` threads each running one_step on its own state (count <= k)."""
        def run(i):
            with self._scope():
                self._one_steps(self.copy_state(i), steps, lambda _: self.batches[i])

        return self._seconds_in_threads(count, run) / (count * steps)

    def time_threads_scan(self, count: int, calls: int) -> float:
        """Seconds per model step with `count` threads each scanning K steps per call on its own state."""
        def run(i):
            with self._scope():
                self._scan_calls(self.copy_state(i), calls)

        return self._seconds_in_threads(count, run) / (count * calls * self.k)

    def time_models(self, calls: int) -> float:
        jax = self.jax
        with self._scope():
            states = [self.copy_state(i) for i in range(self.k)]
            out = self.models(states, self.batches, self.rng)
            jax.block_until_ready(out)
            states = [o[0] for o in out]
            t = time.perf_counter()
            for _ in range(calls):
                out = self.models(states, self.batches, self.rng)
                states = [o[0] for o in out]
                jax.device_get(out[-1][1])
            jax.block_until_ready(states)
            return (time.perf_counter() - t) / (calls * self.k)


def run_child(args) -> None:
    """One process's one_step rate, as one JSON line {"seconds_per_step": ...} (for the processes figure)."""
    packed = Packed(args.batch, 1, args.seed)
    packed.time_one(5)
    print(json.dumps({"seconds_per_step": packed.time_one(args.steps)}), flush=True)


def processes_rate(args, count: int) -> float:
    """Model steps per second of `count` children run side by side (each its own one_step)."""
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--batch", str(args.batch), "--steps",
           str(args.steps), "--seed", str(args.seed)]
    children = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) for _ in range(count)]
    rates = []
    for child in children:
        out, _ = child.communicate()
        if child.returncode:
            raise RuntimeError(f"a child process failed with exit status {child.returncode}")
        rates.append(1.0 / json.loads(out.strip().splitlines()[-1])["seconds_per_step"])
    return sum(rates)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--k", type=int, default=5, help="steps per scan call, models per call")
    p.add_argument("--steps", type=int, default=100, help="timed model steps per figure and round")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (figures are medians)")
    p.add_argument("--processes", type=int, default=2, help="processes (and threads) side by side (0: no processes)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="batch 4, k 2, 10 steps, 1 round, no processes")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.batch, args.k, args.steps, args.rounds, args.processes = 4, 2, 10, 1, 0
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child:
        run_child(args)
        return 0
    log(f"machine: {os.cpu_count()} cores, {cpu_model()}, load {load_average()}")
    config = f"tiny, vocab {VOCAB}, batch {args.batch}, 64+16 tokens, k {args.k}"
    packed = Packed(args.batch, args.k, args.seed)
    diff = packed.max_abs_diff()
    calls = max(1, args.steps // args.k)
    times = {"one_step": [], "scan_steps": [], "models": [], "threads": [], "threads_scan": []}
    workers = min(args.processes or 2, args.k)
    for _ in range(args.rounds):
        times["one_step"].append(packed.time_one(args.steps))
        times["scan_steps"].append(packed.time_scan(calls))
        times["models"].append(packed.time_models(calls))
        times["threads"].append(packed.time_threads(workers, args.steps))
        times["threads_scan"].append(packed.time_threads_scan(workers, calls))
    base = median(times["one_step"])
    emit("one_step", 1.0 / base, "steps/s", config)
    emit("scan_steps", 1.0 / median(times["scan_steps"]), "steps/s", config,
         ratio=base / median(times["scan_steps"]), max_abs_diff=diff)
    emit("models", 1.0 / median(times["models"]), "model steps/s", config, ratio=base / median(times["models"]))
    emit("threads", 1.0 / median(times["threads"]), "model steps/s", config + f", {workers} threads",
         ratio=base / median(times["threads"]))
    emit("threads_scan", 1.0 / median(times["threads_scan"]), "model steps/s",
         config + f", {workers} threads each scanning k steps a call", ratio=base / median(times["threads_scan"]))
    if args.processes:
        del packed  # the children have the cores to themselves
        alone = processes_rate(args, 1)
        together = processes_rate(args, args.processes)
        emit("processes", together, "model steps/s", config + f", {args.processes} processes",
             ratio=together / alone, alone=alone)
    return 0


if __name__ == "__main__":
    sys.exit(main())
