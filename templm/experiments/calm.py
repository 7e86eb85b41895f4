"""The CALM experiment: a Transformer-XL online learner (dynamic evaluation) against a static baseline on a stream
that switches between classes.

`templm calm --gin_file=gin_configs/calm/txl_online.gin` runs `run_calm` (gin: ``templm.run_calm``), which

1. gets a CALM corpus (layout: `templm.data.calm_corpus`): an existing one (`corpus_dir`), or one built from the
   embedded world (`world_dir`, default `<out_dir>/world`; the world is generated there first when that folder does
   not exist, from `world`, a `WorldConfig`; an existing folder is used as it is and must hold news.jsonl); classes
   are news domains (`domains`, default all of `calm_corpus.WORLD_DOMAINS`) and the corpus is rebuilt into
   `<out_dir>/corpus` each run (which keeps the run a function of its config);
2. draws the stream `CALM(corpus, model_level, switch_frequency, nswitches, window_size, batch_size, seed)`
   (`templm.data.calm_stream`; segment lengths by the original's law unless `segment_lengths="exact_mean"`); the
   vocabulary (char or word ids) comes from the corpus and sizes a small Transformer-XL (`txl_config_for`);
3. initialises one set of parameters from `seed` and, with `baseline="pretrained"` (the default), trains them with
   Adam on the first `pretrain_batches` batches of the stream (`pretrain_passes` passes, memory carried and reset
   at each pass). Those batches lie inside the metrics' burn-in (the first 50 segments; a longer prefix is refused)
   and every class resumes after them, so the scored part of the stream is text neither model has trained on (unless
   a class's data wraps around). With `baseline="init"` nothing is pre-trained and the baseline is the untrained,
   frozen initialisation (a weak reference: near-uniform predictions). Either way the learner starts from exactly
   the baseline's parameters, so the gap between them is what online adaptation buys;
4. runs both models through the whole stream (`templm.evaluation.calm_online.run_online`), one batch at a time,
   each with its own Transformer-XL memory carried from batch to batch:

   - the LEARNER scores each batch, then takes one gradient step on it with `rule` ("adam": optax Adam, the default;
     "sgd" and "rms": the update rules of `dynamic_eval`, "rms" with the mean squared gradients collected on the
     pre-training prefix and a decay back to the pre-trained parameters), on the parameters selected by `which`
     (`dynamic_eval.adapt_mask`). The RMS rule divides by sqrt(ms) + `rms_eps`, and ms is 0 for the embedding rows of
     tokens the prefix never had: hence a default `rms_eps` of 1e-3, not dynamic_eval's 1e-5, which blows those rows
     up on their first use;
   - the BASELINE scores every batch with its fixed parameters;

5. logs each model's per-batch loss with `calm_log.LossLogger` (`learner.jsonl`, `baseline.jsonl`: the original
   CALM fields), computes the metrics with `templm.metrics.calm.compute_metrics` on the logs and writes
   `results.json`. The report (`report.md`: learner vs baseline, loss, total_pp, ppl@sw, rec, overall and per class;
   `loss.png`: loss over batches, switches marked with vertical lines, the burn-in shaded) is
   `templm.reports.calm.write_calm_report`, which reads the results and the two logs.

Losses are mean cross-entropies in nats per token over the batch's `batch_size x window_size` targets. The stream
must have at least 100 segments (classes x nswitches), since `compute_metrics` scores nothing below that.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Dict, List, Optional, Sequence

import gin
import jax
import jax.numpy as jnp

from templm import console
from templm import paths as storage  # `paths` names the run's files
from templm.data.calm_corpus import build_world_corpus, check_corpus
from templm.data.calm_log import LossLogger, read_loss_log
from templm.data.calm_stream import CALM, check_segment_law, class_wraps, switch_points
from templm.evaluation.calm_online import RULES, init_params, make_learner, pretrain, run_online, txl_config_for
from templm.evaluation.dynamic_eval import adapt_mask, collect_ms
from templm.errors import ConfigError, check_interrupted, require_field_types
from templm.io import format_duration, write_json
from templm.metrics.calm import BURN_IN_SEGMENTS, MIN_SEGMENTS, compute_metrics
from templm.models.transformer_xl import TransformerXL
from templm.outputs import claim_output_folder

CALM_RUN = "CALM run"  # the kind of output folder (templm.outputs)

BASELINES = ("pretrained", "init")


def log_metrics(log_file: str) -> Dict[str, float]:
    """The CALM metrics of a loss log file: `compute_metrics(read_loss_log(log_file))`."""
    return compute_metrics(read_loss_log(log_file))


@gin.configurable(module="templm")
@dataclasses.dataclass(frozen=True)
class CalmStreamConfig:
    """The CALM stream: the corpus (`corpus_dir`, an existing CALM corpus, or, when it is None, one built from the
    world at `world_dir` (default `<out_dir>/world`; generated from `world` when missing) into `<out_dir>/corpus`, of
    the classes `domains` at `model_level` "word" or "char"), then `nswitches` segments per class of about
    `switch_frequency` tokens each (their lengths drawn by `segment_lengths`: "original" or "exact_mean"), read in
    batches of `batch_size` windows of `window_size` tokens (templm.data.calm_stream)."""

    corpus_dir: Optional[str] = None
    world_dir: Optional[str] = None
    world: Any = None
    domains: Optional[Sequence[str]] = None
    model_level: str = "word"
    switch_frequency: float = 384
    nswitches: int = 30
    window_size: int = 32
    batch_size: int = 4
    segment_lengths: str = "original"

    def __post_init__(self):
        require_field_types(self, "templm.CalmStreamConfig")  # a quoted number or an infinity from gin, named


@gin.configurable(module="templm")
@dataclasses.dataclass(frozen=True)
class CalmModelConfig:
    """The Transformer-XL both the learner and the baseline are: its sizes and memory (default: the window)."""

    d_model: int = 64
    n_head: int = 2
    d_head: int = 32
    d_inner: int = 128
    n_layer: int = 2
    mem_len: Optional[int] = None

    def __post_init__(self):
        require_field_types(self, "templm.CalmModelConfig")  # a quoted number or an infinity from gin, named


@gin.configurable(module="templm")
@dataclasses.dataclass(frozen=True)
class OnlineLearnerConfig:
    """The online learner's update after each batch: `rule` ("sgd", "adam" or "rms") at rate `lr` on the parameters
    `which` names (templm.evaluation.dynamic_eval.adapt_mask), RMS with `rms_decay` back to the start and `rms_eps`."""

    rule: str = "adam"
    lr: float = 1e-3
    which: Any = "all"
    rms_decay: float = 0.0
    rms_eps: float = 1e-3

    def __post_init__(self):
        require_field_types(self, "templm.OnlineLearnerConfig")  # a quoted number or an infinity from gin, named


@gin.configurable(module="templm")
@dataclasses.dataclass(frozen=True)
class CalmBaselineConfig:
    """The static baseline the learner is compared with: "pretrained" (trained on the first `pretrain_batches` of the
    burn-in, never scored, for `pretrain_passes` passes at `pretrain_lr`; both models start from it) or "init" (the
    random initialisation)."""

    baseline: str = "pretrained"
    pretrain_batches: int = 100
    pretrain_passes: int = 2
    pretrain_lr: float = 3e-3

    def __post_init__(self):
        require_field_types(self, "templm.CalmBaselineConfig")  # a quoted number or an infinity from gin, named


@gin.configurable(module="templm")
def run_calm(out_dir: Optional[str] = None, stream: CalmStreamConfig = CalmStreamConfig(),
             model: CalmModelConfig = CalmModelConfig(), learner: OnlineLearnerConfig = OnlineLearnerConfig(),
             baseline: CalmBaselineConfig = CalmBaselineConfig(), seed: int = 0,
             progress_every: int = 100, overwrite: bool = False) -> Dict[str, Any]:
    """Runs the CALM evaluation of a Transformer-XL online learner against a static baseline (module docstring).

    Writes into `out_dir`: learner.jsonl, baseline.jsonl and results.json (report.md and loss.png are
    `templm.reports.calm.write_calm_report`'s); the corpus and the world too where `stream` builds them there.
    Returns the results dict (as results.json, where a non-finite number reads null).
    """
    t0 = time.time()
    if not out_dir:
        raise ValueError("run_calm needs out_dir: bind templm.run_calm.out_dir (or the OUT_DIR macro of the config)")
    if not isinstance(baseline, CalmBaselineConfig):  # a config written when the baseline's name was bound here
        raise ConfigError("templm.run_calm.baseline takes @templm.CalmBaselineConfig(): bind its name as "
                          f"templm.CalmBaselineConfig.baseline = {baseline!r}")
    corpus_dir, world_dir, world, domains = stream.corpus_dir, stream.world_dir, stream.world, stream.domains
    model_level, switch_frequency, nswitches = stream.model_level, stream.switch_frequency, stream.nswitches
    window_size, batch_size, segment_lengths = stream.window_size, stream.batch_size, stream.segment_lengths
    rule, lr, which, rms_decay, rms_eps = learner.rule, learner.lr, learner.which, learner.rms_decay, learner.rms_eps
    pretrain_batches, pretrain_passes, pretrain_lr = (baseline.pretrain_batches, baseline.pretrain_passes,
                                                      baseline.pretrain_lr)
    sizes, baseline = model, baseline.baseline
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
    check_segment_law(segment_lengths)
    if baseline not in BASELINES:
        raise ValueError(f"baseline must be one of {BASELINES}, got {baseline!r}")
    if rule == "rms" and baseline != "pretrained":
        raise ValueError("rule='rms' needs baseline='pretrained': its mean squared gradients come from the "
                         "pre-training prefix")

    # -- corpus and stream ------------------------------------------------------------------------------------------
    corpus_info: Dict[str, Any] = {}
    if corpus_dir is not None:
        check_corpus(corpus_dir)  # before anything is written
    # A bucket that cannot be written, a user's folder: refused before the work.
    out_dir = claim_output_folder(out_dir, CALM_RUN, overwrite,
                                  "bind templm.run_calm.overwrite = True to write into it")
    if corpus_dir is None:
        world_dir = world_dir or storage.join(out_dir, "world")
        corpus_dir = storage.join(out_dir, "corpus")
        built = build_world_corpus(world_dir, corpus_dir, model_level, domains, world)
        corpus_info = {"world_dir": world_dir, "world_generated": built["world_generated"]}
        check_corpus(corpus_dir)
    stream = CALM(corpus_dir, model_level, switch_frequency, nswitches, window_size, batch_size, seed,
                  segment_lengths=segment_lengths)  # from here `stream` is the stream itself
    names = list(stream.class_names)
    n_segments = len(stream.segments)
    if n_segments < MIN_SEGMENTS:
        raise ValueError(f"the stream has {n_segments} segments ({len(names)} classes x nswitches {nswitches}); "
                         f"CALM metrics need at least {MIN_SEGMENTS}: raise nswitches to "
                         f"{math.ceil(MIN_SEGMENTS / len(names))} or more")
    burn_in_batches = sum(n for _, n in stream.segments[:BURN_IN_SEGMENTS])
    n_batches = len(stream)
    if baseline == "pretrained":
        if not 1 <= pretrain_batches <= burn_in_batches:
            raise ValueError(f"pretrain_batches must be between 1 and the {burn_in_batches} batches of the burn-in "
                             f"(the first {BURN_IN_SEGMENTS} segments, never scored), got {pretrain_batches}")
    else:
        pretrain_batches = 0
    wraps = class_wraps(stream)
    corpus_info.update({"dir": corpus_dir, "classes": names, "vocab_size": len(stream.vocab),
                        "tokens": {n: int(stream.class_stream(d).size) for d, n in enumerate(names)}})
    if any(wraps.values()):
        console.warn(f"CALM: classes run out of text and start again ({wraps}): the learner meets text it has "
                     f"trained on; more text or fewer batches avoid it")
    console.say(f"CALM: corpus {corpus_dir}: classes {', '.join(names)}, vocabulary {len(stream.vocab)}; "
                f"{n_batches} batches in {n_segments} segments")

    # -- model, pre-training -----------------------------------------------------------------------------------------
    config = txl_config_for(len(stream.vocab), window_size, sizes.mem_len, d_model=sizes.d_model,
                            n_head=sizes.n_head, d_head=sizes.d_head, d_inner=sizes.d_inner, n_layer=sizes.n_layer)
    model = TransformerXL(config)
    params = init_params(model, seed, batch_size)
    n_params = int(sum(x.size for x in jax.tree_util.tree_leaves(params)))
    mask = adapt_mask(params, which)
    t_pre = time.time()
    pretrain_losses: List[float] = []
    ms = None
    if baseline == "pretrained":
        prefix = []
        for item in stream:
            if len(prefix) == pretrain_batches:
                break
            prefix.append((jnp.asarray(item.inputs), jnp.asarray(item.targets)))
        params, pretrain_losses = pretrain(model, params, prefix, config.mem_len, pretrain_lr, pretrain_passes)
        console.say(f"CALM: pre-trained on {len(prefix)} batches ({pretrain_passes} pass(es)), mean loss per pass "
                    f"{', '.join(f'{x:.3f}' for x in pretrain_losses)} "
                    f"({format_duration(time.time() - t_pre)})")
        if rule == "rms":
            inputs = jnp.stack([b[0] for b in prefix])
            targets = jnp.stack([b[1] for b in prefix])
            ms = collect_ms(params, (inputs, targets), model=model, mem_len=config.mem_len, which=mask)
    pretrain_s = time.time() - t_pre
    learner = make_learner(model, config.mem_len, rule, mask)
    opt_state = learner.init(params, lr, ms=ms, decay=rms_decay, eps=rms_eps)

    # -- the stream --------------------------------------------------------------------------------------------------
    paths = {name: storage.join(out_dir, name) for name in ("learner.jsonl", "baseline.jsonl", "results.json")}
    with LossLogger(paths["learner.jsonl"]) as learner_log, LossLogger(paths["baseline.jsonl"]) as baseline_log:
        losses, _ = run_online(stream, model, config.mem_len, learner, params, opt_state, params, learner_log,
                               baseline_log, total=n_batches, progress_every=progress_every)

    metrics = {"learner": log_metrics(paths["learner.jsonl"]), "baseline": log_metrics(paths["baseline.jsonl"])}
    results = {
        "config": {"out_dir": out_dir, "model_level": model_level, "switch_frequency": switch_frequency,
                   "nswitches": nswitches, "window_size": window_size, "batch_size": batch_size, "seed": seed,
                   "segment_lengths": segment_lengths, "rule": rule, "lr": lr,
                   "which": which if isinstance(which, str) else "custom",
                   "rms_decay": rms_decay, "rms_eps": rms_eps, "baseline": baseline,
                   "pretrain_batches": pretrain_batches,
                   "pretrain_passes": pretrain_passes if baseline == "pretrained" else 0,
                   "pretrain_lr": pretrain_lr, "domains": list(domains) if domains is not None else None,
                   "model": {k: getattr(config, k) for k in ("vocab_size", "d_model", "n_head", "d_head", "d_inner",
                                                             "n_layer", "tgt_len", "mem_len")}},
        "corpus": corpus_info,
        "stream": {"batches": n_batches, "segments": n_segments, "switches": len(switch_points(losses.sequence)),
                   "mean_segment_length": n_batches / n_segments, "burn_in_batches": burn_in_batches,
                   "wraps": wraps},
        "parameters": n_params,
        "pretrain_losses": pretrain_losses,
        "metrics": metrics,
        "timing": {"pretrain_s": pretrain_s, "stream_s": losses.seconds,
                   "batches_per_s": n_batches / max(losses.seconds, 1e-9), "total_s": 0.0},
        "files": paths,
    }
    results["timing"]["total_s"] = time.time() - t0
    check_interrupted()  # a signal whose exception was dropped during the work: no result is written
    write_json(paths["results.json"], results)
    console.say(f"CALM: wrote {', '.join(paths.values())} in {format_duration(results['timing']['total_s'])}")
    return results
