#!/usr/bin/env python
"""Benchmark the T5 train step: throughput, model FLOPs, MFU, host memory, a PyTorch peer, sharded parameter bytes.

    python tools/bench_t5.py                    # tiny and small, peer when torch is installed, sharded run
    python tools/bench_t5.py --quick            # tiny only, few steps, no peer, no sharded run (a smoke run)
    python tools/bench_t5.py --configs small --rounds 5 --steps 4    # longer, steadier figures

Every figure is one JSON line on stdout: {"name", "value", "unit", "config", "devices", "jax", ...extras}; logs go
to stderr. Each config runs in its own child process, so its peak host memory (getrusage ru_maxrss, taken after the
compile and the warm-up steps, before the peer is built) is its own.

What is timed. The train step exactly as the trainer builds it (`make_train_step`, Adafactor with T5 defaults from
`make_optimizer`, jitted with shardings over a data-parallel mesh of all devices, the state donated), on a fixed
batch of random tokens: batch 8, 64 input and 16 target tokens, float32 (flags change them). Compile time is
reported on its own; the timed steps come after two warm-up steps, each one ended with `block_until_ready`.
tokens/s counts input plus target tokens, batch * (input_len + target_len) per step, as the trainer's progress line
does.

Noise. The machine may be shared. Measurements run in rounds; each round times the reference matmul, then the
templm steps, then the peer's steps, so that all three see the same load; figures are medians over all timed
steps (ratios are ratios of medians), and every line carries the load average when it was printed.

Model FLOPs of one train step (forward + backward = 3 x forward; a multiply-add is 2 FLOPs; B batch, Li input and
Lt target length, d = emb_dim, i = num_heads * head_dim, f = mlp_dim, a = number of MLP input matrices (2 for the
gated GELU of v1.1), V = vocab, Le / Ld encoder / decoder layers):

    encoder dense        6 * B * Li * Le * (4 d i + (a + 1) d f)              q, k, v, out and the MLP
    decoder dense        6 * B * Lt * Ld * (6 d i + (a + 1) d f)              self q, k, v, out; cross q, out; MLP
    cross-attention k, v 6 * B * Li * Ld * 2 d i                              applied to the encoder's tokens
    logits               6 * B * Lt * d * V
    encoder attention    12 * B * Le * Li * Li * i                            q.k and p.v, bidirectional
    decoder attention    12 * B * Ld * i * Lt (Lt + 1) / 2                    causal: only the lower triangle
    cross-attention      12 * B * Ld * Lt * Li * i

i.e. 6 x (matmul parameters) x (tokens they are applied to), per stack, plus the attention terms. The embedding
lookup, norms, softmax and the optimizer are not counted (no matmul). For T5 v1.1 small at batch 8, 64 + 16
tokens this is 98.7 GFLOP per step (`t5_train_flops`).

Peak. On CPU the peak is measured in the same run: a jitted square matmul of the compute dtype (2048 by default),
best of a few repeats in each round, median over rounds. On GPU / TPU it is the chip's published dense peak
(`PUBLISHED_PEAK_TFLOPS`; float32 matmuls run as TF32 on GPU and as bf16 passes on TPU at JAX's default precision).
MFU = model FLOPs per step / step time / peak. On a shared CPU the lines also carry CPU-time figures
(`cpu_s_per_step`, `mfu_by_cpu_time` = model FLOPs per CPU-second of the step / matmul FLOPs per CPU-second):
they do not count the time the process waited for a core while other jobs ran, but they also hide poor scaling
over the cores, so the wall-clock figures are the ones the targets are judged by.

Peer. Hugging Face transformers' PyTorch T5ForConditionalGeneration (the `[bench]` extra: torch, transformers<5) on
the CPU with the same sizes (config_to_hf of ours; dropout 0, decoder_start_token_id 0), the same tokens, and
transformers' Adafactor set as our optax.adafactor: lr 1e-3, relative_step=False, scale_parameter=True (RMS of
the parameter, floor 1e-3), decay_rate -0.8 (beta2 = 1 - t^-0.8), clip_threshold 1.0, eps (1e-30, 1e-3), no
momentum, no weight decay. Differences that remain: transformers factors the second moment of every matrix,
optax only of those whose two largest dims are both >= 128 (the relative-position tables of small and every
matrix of tiny stay unfactored); our loss adds T5X's z-loss (1e-4) and an accuracy count. torch runs with denormals
flushed to zero (`torch.set_flush_denormal(True)`), as XLA's CPU runtime does: left on, denormal gradients make
its backward pass several times slower on this hardware and the comparison would flatter us
(`--peer_keep_denormals` measures that).

Sharded run. A child process with XLA_FLAGS=--xla_force_host_platform_device_count=8 lays the parameters of each
config out on 8 CPU devices with the standard logical-axis rules, for meshes data x model = 8x1, 4x2, 2x4, 1x8,
and reports the largest per-device parameter bytes (from the arrays' addressable shards), against the ideal
bytes / model. Where num_heads does not divide by the model axis (small has 6 heads) the standard rules cannot
shard the relative-position tables, and a vocabulary that does not divide (tiny's 868 at 8) the embedding; the run
then replicates that logical axis and says so in the figure.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time

# transformers (the peer) would otherwise import TensorFlow and Flax as well: slow, unused.
os.environ.setdefault("USE_TF", "0")
os.environ.setdefault("USE_FLAX", "0")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from templm.errors import cpu_model  # noqa: E402  (the bench tools' machine line)

# Published dense peak TFLOP/s per chip (bf16, and what a float32 matmul runs at with JAX's default precision).
PUBLISHED_PEAK_TFLOPS = {
    # device_kind substring: (bfloat16, float32 at default precision)
    "TPU v6": (918.0, 918.0),
    "TPU v5p": (459.0, 459.0),
    "TPU v5 lite": (197.0, 197.0),
    "TPU v5e": (197.0, 197.0),
    "TPU v4": (275.0, 275.0),
    "TPU v3": (123.0, 123.0),
    "H200": (989.0, 494.0),
    "H100": (989.0, 494.0),
    "A100": (312.0, 156.0),
    "L4": (121.0, 60.0),
}


# ----------------------------------------------------------------------------------------------------------------
# Shared by the bench tools: JSON lines, the machine, the measured matmul peak.


def log(*parts) -> None:
    print(*parts, file=sys.stderr, flush=True)


def load_average():
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def devices_label(suffix: str = "") -> str:
    import jax

    devices = jax.devices()
    kind = devices[0].device_kind
    return f"{len(devices)}x {devices[0].platform}" + (f" ({kind})" if kind.lower() != "cpu" else "") + suffix


def _rounded(value):
    if isinstance(value, float) and math.isfinite(value) and value != 0:
        return float(f"{value:.4g}")
    return value


def emit(name: str, value, unit: str, config: str, devices: str = None, **extra) -> dict:
    """Print one figure as a JSON line on stdout."""
    import jax

    record = {"name": name, "value": _rounded(value), "unit": unit, "config": config,
              "devices": devices or devices_label(), "jax": jax.__version__}
    record.update({k: _rounded(v) for k, v in extra.items()})
    record["load"] = load_average()
    print(json.dumps(record), flush=True)
    return record


class MatmulPeak:
    """A jitted n x n matmul of `dtype`: `measure(repeats)` returns the best GFLOP/s of `repeats` runs."""

    def __init__(self, n: int = 2048, dtype: str = "float32"):
        import jax
        import jax.numpy as jnp

        self.n = n
        key_a, key_b = jax.random.split(jax.random.key(0))
        self.a = jax.random.normal(key_a, (n, n), jnp.float32).astype(dtype)
        self.b = jax.random.normal(key_b, (n, n), jnp.float32).astype(dtype)
        self.fn = jax.jit(lambda a, b: a @ b)
        self.fn(self.a, self.b).block_until_ready()

    def measure(self, repeats: int = 3) -> float:
        best = float("inf")
        cpu = cpu_seconds()
        for _ in range(repeats):
            t = time.perf_counter()
            self.fn(self.a, self.b).block_until_ready()
            best = min(best, time.perf_counter() - t)
        self.last_cpu_gflops = 2.0 * self.n ** 3 * repeats / max(cpu_seconds() - cpu, 1e-9) / 1e9
        return 2.0 * self.n ** 3 / best / 1e9


def published_peak_gflops(dtype: str):
    """(GFLOP/s, chip) of the first device when it is a known GPU/TPU, else None."""
    import jax

    device = jax.devices()[0]
    if device.platform == "cpu":
        return None
    for kind, (bf16, f32) in PUBLISHED_PEAK_TFLOPS.items():
        if kind.lower() in device.device_kind.lower():
            per_chip = bf16 if dtype == "bfloat16" else f32
            return per_chip * 1e3 * len(jax.devices()), device.device_kind
    return None


def peak_host_memory_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # ru_maxrss is in KiB on Linux


def cpu_seconds() -> float:
    """User + system CPU time of this process (all threads): a load-robust measure of the work done."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def median(values):
    return statistics.median(values) if values else float("nan")


# ----------------------------------------------------------------------------------------------------------------
# Model FLOPs.


def t5_train_flops(config, batch: int, input_len: int, target_len: int) -> dict:
    """Model FLOPs of one train step by term (see the module docstring) and their "total"."""
    d, i, f, v = config.emb_dim, config.num_heads * config.head_dim, config.mlp_dim, config.vocab_size
    a = len(config.mlp_activations)
    le, ld = config.num_encoder_layers, config.num_decoder_layers
    b, li, lt = batch, input_len, target_len
    terms = {
        "encoder_dense": 6 * b * li * le * (4 * d * i + (a + 1) * d * f),
        "decoder_dense": 6 * b * lt * ld * (6 * d * i + (a + 1) * d * f),
        "cross_kv_dense": 6 * b * li * ld * 2 * d * i,
        "logits": 6 * b * lt * d * v,
        "encoder_attention": 12 * b * le * li * li * i,
        "decoder_attention": 12 * b * ld * i * lt * (lt + 1) // 2,
        "cross_attention": 12 * b * ld * lt * li * i,
    }
    terms["total"] = sum(terms.values())
    return terms


def dense_parameter_count(config) -> int:
    """Parameters that enter a matmul (everything but the embedding table, norms and relative-position tables)."""
    d, i, f, v = config.emb_dim, config.num_heads * config.head_dim, config.mlp_dim, config.vocab_size
    a = len(config.mlp_activations)
    encoder = config.num_encoder_layers * (4 * d * i + (a + 1) * d * f)
    decoder = config.num_decoder_layers * (8 * d * i + (a + 1) * d * f)
    return encoder + decoder + d * v


# ----------------------------------------------------------------------------------------------------------------
# The templm train step and the peer.


def make_batch(vocab_size: int, batch: int, input_len: int, target_len: int, seed: int = 0) -> dict:
    """Random tokens in [2, vocab) (no padding, no EOS); decoder inputs are the targets shifted right after 0."""
    import numpy as np

    rng = np.random.default_rng(seed)
    inputs = rng.integers(2, vocab_size, (batch, input_len), dtype=np.int32)
    targets = rng.integers(2, vocab_size, (batch, target_len), dtype=np.int32)
    decoder_inputs = np.concatenate([np.zeros((batch, 1), np.int32), targets[:, :-1]], axis=1)
    return {"encoder_input_tokens": inputs, "decoder_input_tokens": decoder_inputs, "decoder_target_tokens": targets}


class TemplmStep:
    """The trainer's train step on a data-parallel mesh of all devices, state donated."""

    def __init__(self, config, batch: dict, seed: int = 0):
        import jax

        from templm.models.t5 import EncoderDecoderModel
        from templm.training import partitioning, state, trainer
        from templm.training.optimizers import make_optimizer

        model = EncoderDecoderModel(config)
        tx = make_optimizer()
        self.mesh = partitioning.make_mesh()
        self.rules = partitioning.logical_axis_rules()
        lengths = {"inputs": batch["encoder_input_tokens"].shape[1], "targets": batch["decoder_target_tokens"].shape[1]}
        with state.mesh_rules(self.mesh, self.rules):
            self.state, shardings = trainer.init_state(model, tx, lengths, seed, self.mesh, self.rules)
            data = partitioning.data_sharding(self.mesh)
            self.batch = {k: jax.device_put(v, data) for k, v in batch.items()}
            self.rng = jax.device_put(jax.random.key(seed + 1), partitioning.replicated(self.mesh))
            self.fn = state.compile_step(trainer.make_train_step(model, tx), shardings, data, self.mesh)
        self.metrics = None

    def __call__(self) -> float:
        import jax

        from templm.training import state

        t = time.perf_counter()
        with state.mesh_rules(self.mesh, self.rules):
            self.state, self.metrics = self.fn(self.state, self.batch, self.rng)
        jax.block_until_ready(self.state)
        return time.perf_counter() - t

    def loss(self) -> float:
        return float(self.metrics["loss"])


def torch_available() -> bool:
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


class PeerStep:
    """Hugging Face PyTorch T5ForConditionalGeneration: forward, backward and Adafactor step (see the docstring)."""

    def __init__(self, config, batch: dict, seed: int = 0, flush_denormals: bool = True, threads: int = 0):
        import torch
        import transformers
        from transformers.optimization import Adafactor

        from templm.models.t5 import config_to_hf

        torch.manual_seed(seed)
        torch.set_flush_denormal(flush_denormals)
        if threads:
            torch.set_num_threads(threads)
        hf = dict(config_to_hf(config), dropout_rate=0.0, decoder_start_token_id=0)
        hf.pop("architectures", None)
        self.model = transformers.T5ForConditionalGeneration(transformers.T5Config(**hf))
        self.model.train()
        self.optimizer = Adafactor(self.model.parameters(), lr=1e-3, eps=(1e-30, 1e-3), clip_threshold=1.0,
                                   decay_rate=-0.8, beta1=None, weight_decay=0.0, scale_parameter=True,
                                   relative_step=False, warmup_init=False)
        self.input_ids = torch.as_tensor(batch["encoder_input_tokens"], dtype=torch.long)
        self.labels = torch.as_tensor(batch["decoder_target_tokens"], dtype=torch.long)
        self.threads = torch.get_num_threads()
        self.versions = f"torch {torch.__version__}, transformers {transformers.__version__}"
        self.last_loss = None

    def __call__(self) -> float:
        t = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        out = self.model(input_ids=self.input_ids, labels=self.labels)
        out.loss.backward()
        self.optimizer.step()
        self.last_loss = float(out.loss.detach())
        return time.perf_counter() - t


# ----------------------------------------------------------------------------------------------------------------
# Children: one config; the sharded run.


def run_config(name: str, args) -> None:
    import jax

    from templm.models.t5 import T5_1_1_CONFIGS, count_parameters

    config = T5_1_1_CONFIGS[name].replace(dtype=args.dtype)
    b, li, lt = args.batch, args.input_len, args.target_len
    label = f"t5_1_1 {name}, batch {b}, {li}+{lt} tokens, {args.dtype}, adafactor"
    tokens_per_step = b * (li + lt)
    batch = make_batch(config.vocab_size, b, li, lt, args.seed)
    steps = args.steps if args.steps else (20 if name == "tiny" else 3)
    peer_steps = args.peer_steps if args.peer_steps else (5 if name == "tiny" else 3)

    log(f"[{name}] compiling the train step ...")
    t = time.perf_counter()
    step = TemplmStep(config, batch, args.seed)
    step()
    compile_s = time.perf_counter() - t
    for _ in range(args.warmup):
        step()
    memory_mib = peak_host_memory_mib()

    published = published_peak_gflops(args.dtype)
    peak = None if published else MatmulPeak(args.matmul_n, args.dtype)
    peer = None
    peer_note = None
    if args.peer and jax.devices()[0].platform == "cpu":
        if torch_available():
            log(f"[{name}] building the PyTorch peer ...")
            peer = PeerStep(config, batch, args.seed, flush_denormals=not args.peer_keep_denormals,
                            threads=args.peer_threads)
            for _ in range(args.warmup):
                peer()
        else:
            peer_note = "peer skipped: torch / transformers not installed (pip install -e '.[bench]')"
            log(peer_note)
    elif args.peer:
        peer_note = "peer skipped: it runs on the CPU only and the devices here are accelerators"

    step_times, peer_times, peaks, cpu_peaks = [], [], [], []
    step_cpu = peer_cpu = 0.0
    for r in range(args.rounds):
        if peak is not None:
            peaks.append(peak.measure(args.matmul_repeats))
            cpu_peaks.append(peak.last_cpu_gflops)
        cpu = cpu_seconds()
        step_times += [step() for _ in range(steps)]
        step_cpu += cpu_seconds() - cpu
        if peer is not None:
            cpu = cpu_seconds()
            peer_times += [peer() for _ in range(peer_steps)]
            peer_cpu += cpu_seconds() - cpu
        log(f"[{name}] round {r + 1}/{args.rounds}: step median {median(step_times):.3f} s"
            + (f", peer {median(peer_times):.3f} s" if peer_times else "")
            + (f", matmul peak {peaks[-1]:.1f} GFLOP/s" if peaks else ""))

    step_s = median(step_times)
    flops = t5_train_flops(config, b, li, lt)
    step_cpu /= len(step_times)
    common = {"steps_timed": len(step_times), "step_s_median": step_s, "step_s_min": min(step_times),
              "cpu_s_per_step": step_cpu}
    emit("t5_train_tokens_per_s", tokens_per_step / step_s, "tokens/s", label, steps_per_s=1.0 / step_s,
         **common)
    emit("t5_train_examples_per_s", b / step_s, "examples/s", label, **common)
    emit("t5_compile_s", compile_s, "s", label, note="first call: trace, compile and one step")
    emit("t5_model_flops_per_step", flops["total"] / 1e9, "GFLOP", label, parameters=count_parameters(config),
         dense_parameters=dense_parameter_count(config),
         **{f"gflop_{k}": v / 1e9 for k, v in flops.items() if k != "total"})
    achieved = flops["total"] / step_s / 1e9
    if published:
        peak_gflops, chip = published
        emit("t5_mfu", 100.0 * achieved / peak_gflops, "%", label, achieved_gflops=achieved,
             reference=f"published dense peak of {chip}", reference_gflops=peak_gflops)
    else:
        peak_gflops = median(peaks)
        cpu_peak = median(cpu_peaks)
        emit("matmul_peak", peak_gflops, "GFLOP/s", f"{args.matmul_n}x{args.matmul_n} {args.dtype} matmul, jit",
             rounds=len(peaks), best=max(peaks), gflops_per_cpu_second=cpu_peak)
        emit("t5_mfu", 100.0 * achieved / peak_gflops, "%", label, achieved_gflops=achieved,
             reference="matmul_peak measured in this run", reference_gflops=peak_gflops,
             mfu_vs_best_peak=100.0 * achieved / max(peaks),
             mfu_by_cpu_time=100.0 * (flops["total"] / step_cpu / 1e9) / cpu_peak)
    emit("t5_peak_host_memory", memory_mib, "MiB", label,
         note="getrusage ru_maxrss of this config's process after compile and warm-up (before any peer)")
    if peer is not None:
        peer_s = median(peer_times)
        peer_cpu /= len(peer_times)
        peer_label = f"{label}; peer: HF T5ForConditionalGeneration, {peer.versions}, {peer.threads} threads" + \
            ("" if not args.peer_keep_denormals else ", denormals kept")
        emit("peer_train_tokens_per_s", tokens_per_step / peer_s, "tokens/s", peer_label,
             steps_per_s=1.0 / peer_s, step_s_median=peer_s, step_s_min=min(peer_times), cpu_s_per_step=peer_cpu,
             mfu=100.0 * flops["total"] / peer_s / 1e9 / peak_gflops, devices="cpu (torch)")
        emit("t5_vs_peer_tokens_per_s", peer_s / step_s, "x", peer_label,
             reference="peer_train_tokens_per_s, same run, interleaved rounds", templm_step_s=step_s,
             peer_step_s=peer_s, ratio_by_cpu_time=peer_cpu / step_cpu, templm_loss=step.loss(),
             peer_loss=peer.last_loss)
    elif peer_note:
        emit("t5_vs_peer_tokens_per_s", None, "x", label, note=peer_note)


def indivisible_axes(specs, abstract, rules, model: int) -> dict:
    """{logical axis: size} for the axes mapped to the model axis whose parameter dims do not divide by `model`."""
    import jax

    on_model = {name for name, axis in rules if axis == "model"}
    uneven = {}
    for spec, leaf in zip(jax.tree.leaves(specs, is_leaf=lambda x: x is None or hasattr(x, "index")),
                          jax.tree.leaves(abstract)):
        for name, size in zip(spec or (), leaf.shape):
            if name in on_model and size % model:
                uneven[name] = size
    return uneven


def run_sharded(names, args) -> None:
    import jax
    import numpy as np

    from templm.models.t5 import T5_1_1_CONFIGS, EncoderDecoderModel
    from templm.training import partitioning

    n = len(jax.devices())
    label_devices = devices_label(" (fake: --xla_force_host_platform_device_count)")
    for name in names:
        config = T5_1_1_CONFIGS[name].replace(dtype=args.dtype)
        model = EncoderDecoderModel(config)
        specs = model.logical_partition_specs()
        abstract = model.abstract_init()
        total = sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(abstract))
        base = None
        for m in (1, 2, 4, 8):
            if n % m:
                continue
            mesh = partitioning.make_mesh(num_partitions=m)
            rules = partitioning.logical_axis_rules()
            uneven = indivisible_axes(specs, abstract, rules, m)
            note = "standard rules"
            if uneven:
                rules = tuple((k, None if k in uneven else v) for k, v in rules)
                note = ("the standard rules fail (" + ", ".join(f"{k} {v} does not divide by {m}"
                                                              for k, v in sorted(uneven.items()))
                        + "): " + ", ".join(sorted(uneven)) + " replicated")
            shardings = partitioning.logical_shardings(specs, mesh, rules)
            params = jax.tree.map(lambda x, s: jax.device_put(np.zeros(x.shape, x.dtype), s), abstract, shardings)
            per_device = {}
            for leaf in jax.tree.leaves(params):
                for shard in leaf.addressable_shards:
                    per_device[shard.device.id] = per_device.get(shard.device.id, 0) + shard.data.nbytes
            worst = max(per_device.values())
            base = base or worst
            emit("t5_param_bytes_per_device", worst / 2 ** 20, "MiB",
                 f"t5_1_1 {name}, mesh data={n // m} x model={m}, {args.dtype} params", devices=label_devices,
                 model_axis=m, total_param_mib=total / 2 ** 20, ideal_mib=total / m / 2 ** 20,
                 reduction_vs_model_1=base / worst, rules=note)
            del params


# ----------------------------------------------------------------------------------------------------------------
# Entry point.


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--configs", default="tiny,small", help="comma-separated T5_1_1_CONFIGS names")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--input_len", type=int, default=64)
    p.add_argument("--target_len", type=int, default=16)
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--rounds", type=int, default=3, help="interleaved measurement rounds")
    p.add_argument("--steps", type=int, default=0, help="timed steps per round (0: 20 for tiny, 3 otherwise)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--matmul_n", type=int, default=2048)
    p.add_argument("--matmul_repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no_peer", dest="peer", action="store_false", help="skip the PyTorch peer")
    p.add_argument("--peer_keep_denormals", action="store_true", help="leave torch's denormal handling at default")
    p.add_argument("--peer_threads", type=int, default=0, help="torch threads (0: torch's default, one per core)")
    p.add_argument("--peer_steps", type=int, default=0, help="timed peer steps per round (0: 5 for tiny, else 3)")
    p.add_argument("--no_sharded", dest="sharded", action="store_false", help="skip the 8-device sharded run")
    p.add_argument("--sharded_configs", default="tiny,small")
    p.add_argument("--quick", action="store_true", help="tiny only, 1 round of 3 steps, no peer, no sharded run")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.configs, args.rounds, args.steps, args.warmup, args.peer, args.sharded = "tiny", 1, 3, 1, False, False
        args.matmul_n = min(args.matmul_n, 1024)
    return args


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.child == "sharded":
        run_sharded([c for c in args.sharded_configs.split(",") if c], args)
        return 0
    if args.child:
        run_config(args.child, args)
        return 0
    log(f"machine: {os.cpu_count()} cores, {cpu_model()}, load {load_average()}")
    failed = []
    children = [(c, {}) for c in args.configs.split(",") if c]
    if args.sharded:
        flags = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
        children.append(("sharded", {"XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu"}))
    for child, env in children:
        cmd = [sys.executable, os.path.abspath(__file__), *argv, "--child", child]
        code = subprocess.call(cmd, env={**os.environ, **env})
        if code:
            failed.append(child)
            log(f"{child}: failed with exit status {code}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
