"""CALM with a Transformer-XL: an online learner (dynamic evaluation) against a static baseline on a switching stream.

`templm calm --gin_file=gin_configs/calm/txl_online.gin` runs `run_calm`, which

1. gets a CALM corpus (see calm.py for the layout): an existing one (`corpus_dir`), or one built from the embedded
   world (`world_dir`, default `<out_dir>/world`; the world is generated there first when that folder does not
   exist, from `world`, a `WorldConfig`; an existing folder is used as it is and must hold news.jsonl); classes are
   news domains
   (`domains`, default all of `calm.WORLD_DOMAINS`) and the corpus is rebuilt into `<out_dir>/corpus` each run (it
   takes well under a second at demo size and keeps the run a function of its config);
2. draws the stream `CALM(corpus, model_level, switch_frequency, nswitches, window_size, batch_size, seed)`; the
   vocabulary (char or word ids) comes from the corpus and sizes a small Transformer-XL (`txl_config_for`);
3. initialises one set of parameters from `seed` and, with `baseline="pretrained"` (the default), trains them with
   Adam on the first `pretrain_batches` batches of the stream (`pretrain_passes` passes, memory carried and reset
   at each pass). Those batches lie inside the metrics' burn-in (the first 50 segments; a longer prefix is refused)
   and every class resumes after them, so the scored part of the stream is text neither model has trained on (unless
   a class's data wraps around). With `baseline="init"` nothing is pre-trained and the baseline is the untrained,
   frozen initialisation (a weak reference: near-uniform predictions). Either way the learner starts from exactly
   the baseline's parameters, so the gap between them is what online adaptation buys;
4. runs both models through the whole stream, one batch at a time, each with its own Transformer-XL memory carried
   from batch to batch (across class switches too, as the stream's rows run on):

   - the LEARNER starts from those parameters and applies the dynamic-evaluation step: `score_then_update(params,
     opt_state, memory, batch)` -- one jitted function -- computes the batch's mean next-token loss with the current
     parameters and memory (that loss is the score, so no token is predicted after training on it), then takes one
     gradient step on that same loss with `rule` ("adam": optax Adam, the default; "sgd" and "rms": the update
     rules of `dynamic_eval`, "rms" with the mean squared gradients collected on the pre-training prefix and a decay
     back to the pre-trained parameters), on the parameters selected by `which` (`dynamic_eval.adapt_mask`). The
     RMS rule divides by sqrt(ms) + `rms_eps`, and ms is 0 for the embedding rows of tokens the prefix never had:
     hence a default `rms_eps` of 1e-3, not dynamic_eval's 1e-5, which blows those rows up on their first use;
   - the BASELINE scores every batch with its fixed parameters (`score(params, memory, batch)`, jitted);

5. logs each model's per-batch loss with `calm.LossLogger` (`learner.jsonl`, `baseline.jsonl`: the original CALM
   fields), computes the metrics with `calm.compute_metrics` and writes `results.json`, `report.md` (learner vs
   baseline: loss, total_pp, ppl@sw, rec, overall and per class) and `loss.png` (loss over batches, switches
   marked with vertical lines, the burn-in shaded).

Losses are mean cross-entropies in nats per token over the batch's `batch_size x window_size` targets. The stream
must have at least 100 segments (classes x nswitches), since `compute_metrics` scores nothing below that.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
import os
import tempfile
import time
from typing import Any, Callable, Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple

import gin
import jax
import jax.numpy as jnp
import numpy as np
import flax.linen as nn
import optax

from templm.data.records import DataError
from templm.evaluation import calm
from templm.evaluation.dynamic_eval import adapt_mask, collect_ms, rms_decay_rate, rms_update, sgd_update
from templm.models.transformer_xl import TransformerXL, TransformerXLConfig, lm_loss, next_mem_valid

Array = jax.Array
logger = logging.getLogger(__name__)

RULES = ("adam", "sgd", "rms")
BASELINES = ("pretrained", "init")
REPORT_METRICS = ("loss", "total_pp", "ppl@sw", "rec")


# --------------------------------------------------------------------------------------------------------------------
# Corpus.


def world_domains(names: Optional[Sequence[str]] = None) -> Dict[str, Tuple[str, ...]]:
    """The `calm.WORLD_DOMAINS` entries named in `names` (all when None); an unknown name is a ValueError."""
    if names is None:
        return dict(calm.WORLD_DOMAINS)
    unknown = [n for n in names if n not in calm.WORLD_DOMAINS]
    if unknown:
        raise ValueError(f"unknown world domain(s) {unknown}; known: {sorted(calm.WORLD_DOMAINS)}")
    if len(set(names)) < 2:
        raise ValueError(f"CALM needs at least two classes, got domains {list(names)}")
    return {n: calm.WORLD_DOMAINS[n] for n in names}


def build_world_corpus(world_dir: str, out_dir: str, level: str = "word", domains: Optional[Sequence[str]] = None,
                       world: Any = None) -> Dict[str, Any]:
    """A CALM corpus at `out_dir` from the embedded world at `world_dir`, one class per domain.

    When `world_dir` does not exist the world is generated there first from `world` (a `WorldConfig`; default
    `WorldConfig()`); an existing folder is never written to and must hold news.jsonl. Returns the corpus builder's
    stats plus "world_generated" (bool)."""
    from templm.data.world import WorldConfig, generate_world

    generated = False
    if not os.path.exists(world_dir):
        config = WorldConfig() if world is None else world
        if not isinstance(config, WorldConfig):
            raise ValueError(f"world must be a WorldConfig, got {type(config).__name__}")
        logger.info("CALM: generating the embedded world (%s) into %s", config, world_dir)
        generate_world(config, world_dir)
        generated = True
    elif not os.path.isfile(os.path.join(world_dir, "news.jsonl")):
        raise DataError("exists but holds no news.jsonl; expected a world folder (`templm data world`), or a path "
                        "that does not exist yet (the world is then generated there)", world_dir)
    stats = calm.build_calm_corpus_from_world(world_dir, out_dir, level, world_domains(domains))
    if len(stats["classes"]) < 2:
        raise DataError(f"the world's news fill only {sorted(stats['classes'])}; CALM needs two or more classes",
                        world_dir)
    return {**stats, "world_generated": generated}


def check_corpus(corpus_dir: str) -> List[str]:
    """Checks the CALM layout beyond what the iterator needs; returns the class names.

    When the vocab files are per class (some `vocab/<stem>.vocab` is named after a class, as both builders write
    them), every class must have its own: a missing one would silently turn that class into `<unk>`s."""
    names = [os.path.splitext(os.path.basename(p))[0] for p in calm.class_files(corpus_dir)]
    vocab_dir = os.path.join(corpus_dir, "vocab")
    stems = {os.path.splitext(f)[0] for f in os.listdir(vocab_dir) if f.endswith(".vocab")} \
        if os.path.isdir(vocab_dir) else set()
    if not stems:
        raise DataError("no vocabulary: expected one or more vocab/*.vocab files", vocab_dir)
    if stems & set(names):
        missing = [n for n in names if n not in stems]
        if missing:
            raise DataError(f"class {missing[0]!r} ({missing[0]}.txt) has no vocabulary file; expected "
                            f"vocab/{missing[0]}.vocab beside the other classes' "
                            f"({', '.join(sorted(stems & set(names)))})",
                            os.path.join(vocab_dir, f"{missing[0]}.vocab"))
    return names


# --------------------------------------------------------------------------------------------------------------------
# Model and the two jitted steps.


def txl_config_for(vocab_size: int, window_size: int, mem_len: Optional[int] = None, *, d_model: int = 64,
                   n_head: int = 2, d_head: int = 32, d_inner: int = 128, n_layer: int = 2) -> TransformerXLConfig:
    """A small Transformer-XL for a CALM vocabulary: segments of `window_size`, memory `mem_len` (default the
    window), no dropout (the online learner sees every batch once)."""
    mem_len = window_size if mem_len is None else int(mem_len)
    return TransformerXLConfig(vocab_size=vocab_size, d_model=d_model, n_head=n_head, d_head=d_head,
                               d_inner=d_inner, n_layer=n_layer, tgt_len=window_size, mem_len=mem_len,
                               dropout=0.0, dropatt=0.0)


def init_params(model: TransformerXL, seed: int, batch_size: int) -> Any:
    """Plain (unboxed) parameters from PRNGKey(seed)."""
    tokens = jnp.zeros((batch_size, model.config.tgt_len), jnp.int32)
    init = jax.jit(lambda key: nn.unbox(model.init(key, tokens, mem_len=0)["params"]))  # eager init is slow
    return init(jax.random.PRNGKey(seed))


class Memory(NamedTuple):
    """A Transformer-XL's recurrent state: n_layer + 1 fixed-shape memories and how many rows hold history."""

    mems: Tuple[Array, ...]
    valid: Array


def init_memory(model: TransformerXL, batch_size: int, mem_len: int) -> Memory:
    return Memory(tuple(model.init_mems(batch_size, mem_len)), jnp.zeros((), jnp.int32))


def _partition(params: Any, mask_leaves: Sequence[bool]) -> Tuple[List[Array], List[Array], Any]:
    leaves, treedef = jax.tree_util.tree_flatten(params)
    return ([x for x, m in zip(leaves, mask_leaves) if m], [x for x, m in zip(leaves, mask_leaves) if not m],
            treedef)


def _combine(adapted: Sequence[Array], frozen: Sequence[Array], mask_leaves: Sequence[bool], treedef: Any) -> Any:
    a, f = iter(adapted), iter(frozen)
    return treedef.unflatten([next(a) if m else next(f) for m in mask_leaves])


# Update rules on the list of adapted leaves: (adapted, grads, state) -> (adapted, state). Hyper-parameters live in
# the state as arrays, so one compiled step serves every learning rate (pre-training and the online learner share it).

def _adam_update(adapted, grads, state):
    updates, adam = optax.scale_by_adam().update(grads, state["adam"], adapted)
    return [a - (state["lr"] * u).astype(a.dtype) for a, u in zip(adapted, updates)], {**state, "adam": adam}


def _sgd_update(adapted, grads, state):
    return sgd_update(adapted, grads, state["lr"]), state


def _rms_update(adapted, grads, state):
    return rms_update(adapted, grads, state["ms"], state["theta0"], state["lr"], state["decay"], state["eps"],
                      rate=state["rate"]), state


_UPDATES = {"adam": _adam_update, "sgd": _sgd_update, "rms": _rms_update}


@functools.lru_cache(maxsize=32)
def _score_then_update_fn(model: TransformerXL, mem_len: int, rule: str, mask_leaves: Tuple[bool, ...]):
    update = _UPDATES[rule]

    def score_then_update(params, opt_state, memory, batch):
        inputs, targets = batch
        adapted, frozen, treedef = _partition(params, mask_leaves)

        def loss_fn(a):
            p = _combine(a, frozen, mask_leaves, treedef)
            loss, _, new_mems = lm_loss(p, inputs, targets, list(memory.mems), mem_len, True, model=model,
                                        mem_valid=memory.valid)
            return loss, new_mems

        # The loss is taken with the parameters as they are BEFORE the step: it is the batch's score.
        (loss, new_mems), grads = jax.value_and_grad(loss_fn, has_aux=True)(adapted)
        adapted, opt_state = update(adapted, grads, opt_state)
        new_memory = Memory(tuple(new_mems), next_mem_valid(memory.valid, inputs.shape[1], mem_len))
        return _combine(adapted, frozen, mask_leaves, treedef), opt_state, new_memory, loss

    return jax.jit(score_then_update, donate_argnums=(0, 1, 2))


class Learner(NamedTuple):
    """The online learner. `score_then_update(params, opt_state, memory, batch) -> (params, opt_state, memory,
    loss)` is one jitted function (params, opt_state and memory donated; batch = (inputs, targets) int32 [B, W]);
    `init` builds its opt_state."""

    rule: str
    mask_leaves: Tuple[bool, ...]
    score_then_update: Callable[..., Tuple[Any, Any, Memory, Array]]

    def init(self, params: Any, lr: float, *, ms: Any = None, decay: float = 0.0, eps: float = 1e-5) -> Any:
        """The rule's state for a learner starting at `params`: {"lr"} (sgd); plus Adam's moments (adam); plus
        `ms` (a pytree like params: mean squared training gradients, `collect_ms`), theta0 = params, the decay rate,
        decay and eps (rms)."""
        if not lr >= 0:
            raise ValueError(f"lr must be >= 0, got {lr}")
        adapted = _partition(params, self.mask_leaves)[0]
        state = {"lr": jnp.float32(lr)}
        if self.rule == "adam":
            state["adam"] = optax.scale_by_adam().init(adapted)
        elif self.rule == "rms":
            if ms is None:
                raise ValueError("rule='rms' needs ms, the mean squared gradients on training data (collect_ms)")
            ms_adapted = [jnp.asarray(m, jnp.float32) for m in _partition(ms, self.mask_leaves)[0]]
            state.update(ms=ms_adapted, theta0=[jnp.array(a) for a in adapted],
                         rate=rms_decay_rate(ms_adapted, jnp.float32(decay)), decay=jnp.float32(decay),
                         eps=jnp.float32(eps))
        return state


def make_learner(model: TransformerXL, mem_len: int, rule: str, mask: Any) -> Learner:
    """The dynamic-evaluation step, one segment at a time: score the batch, then one step of `rule` on it.

    rule: "adam" (optax's Adam moments, lr from the state), "sgd" (`dynamic_eval.sgd_update`) or "rms"
    (`dynamic_eval.rms_update`, Krause et al.'s rule with a decay back to the starting parameters). `mask`: a pytree
    of bools like the parameters (`dynamic_eval.adapt_mask`); unselected leaves pass through unchanged and get no
    gradient. Compiled once per (model, memory length, rule, mask)."""
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
    mask_leaves = tuple(bool(m) for m in jax.tree_util.tree_leaves(mask))
    return Learner(rule, mask_leaves, _score_then_update_fn(model, int(mem_len), rule, mask_leaves))


@functools.lru_cache(maxsize=32)
def make_scorer(model: TransformerXL, mem_len: int) -> Callable[[Any, Memory, Tuple[Array, Array]], Tuple[Memory,
                                                                                                         Array]]:
    """The static model's jitted step: `score(params, memory, batch) -> (memory, loss)`, no update."""

    def score(params, memory, batch):
        inputs, targets = batch
        loss, _, new_mems = lm_loss(params, inputs, targets, list(memory.mems), mem_len, True, model=model,
                                    mem_valid=memory.valid)
        return Memory(tuple(new_mems), next_mem_valid(memory.valid, inputs.shape[1], mem_len)), loss

    return jax.jit(score, donate_argnums=(1,))


def _copy(tree: Any) -> Any:
    return jax.tree_util.tree_map(jnp.array, tree)  # fresh buffers: donating one tree never frees the other


def pretrain(model: TransformerXL, params: Any, batches: Sequence[Tuple[Array, Array]], mem_len: int,
             lr: float, passes: int = 1) -> Tuple[Any, List[float]]:
    """Adam on `batches` in order, `passes` times (memory carried, reset at each pass): (params, mean loss of each
    pass). The step is the learner's own (`make_learner(..., "adam", all)`): one code path, one compile."""
    if passes < 1:
        raise ValueError(f"pretrain_passes must be >= 1, got {passes}")
    if not batches:
        raise ValueError("pretrain needs at least one batch")
    learner = make_learner(model, mem_len, "adam", adapt_mask(params, "all"))
    params = _copy(params)
    opt_state = learner.init(params, lr)
    means = []
    for _ in range(passes):
        memory = init_memory(model, batches[0][0].shape[0], mem_len)
        losses = []
        for batch in batches:
            params, opt_state, memory, loss = learner.score_then_update(params, opt_state, memory, batch)
            losses.append(loss)
        means.append(float(np.mean(jax.device_get(losses))))
    return params, means


# --------------------------------------------------------------------------------------------------------------------
# The stream.


@dataclasses.dataclass
class StreamLosses:
    """Per-batch losses of both models with the batch's class and segment."""

    learner: np.ndarray
    baseline: np.ndarray
    domain: np.ndarray
    sequence: np.ndarray
    seconds: float


def run_online(stream: Iterable[calm.CalmBatch], model: TransformerXL, mem_len: int, learner: Learner,
               learner_params: Any, opt_state: Any, baseline_params: Any,
               learner_log: Optional[calm.LossLogger] = None, baseline_log: Optional[calm.LossLogger] = None,
               total: Optional[int] = None, progress_every: int = 100) -> Tuple[StreamLosses, Any]:
    """Both models through the stream: the baseline scores each batch; the learner scores it, then steps on it
    (`opt_state` from `learner.init`). Each model has its own memory, carried from batch to batch. Each loss is
    logged (when a logger is given) as soon as it is known. Returns (losses, the learner's final params); the
    arguments are never donated."""
    score = make_scorer(model, mem_len)
    params, opt_state = _copy(learner_params), _copy(opt_state)
    learner_memory = baseline_memory = None
    out = {"learner": [], "baseline": [], "domain": [], "sequence": []}
    start = time.time()
    for i, item in enumerate(stream):
        if learner_memory is None:
            learner_memory = init_memory(model, item.inputs.shape[0], mem_len)
            baseline_memory = init_memory(model, item.inputs.shape[0], mem_len)
        batch = (jnp.asarray(item.inputs), jnp.asarray(item.targets))
        baseline_memory, base_loss = score(baseline_params, baseline_memory, batch)
        params, opt_state, learner_memory, learn_loss = learner.score_then_update(params, opt_state,
                                                                                  learner_memory, batch)
        learn_loss, base_loss = float(learn_loss), float(base_loss)
        if not (math.isfinite(learn_loss) and math.isfinite(base_loss)):
            raise ValueError(f"non-finite loss at batch {i} (segment {item.sequence}, class "
                                     f"{item.domain_name!r}): learner {learn_loss}, baseline {base_loss}; lower the "
                                     f"learning rate")
        if learner_log is not None:
            learner_log.log(item, learn_loss)
        if baseline_log is not None:
            baseline_log.log(item, base_loss)
        out["learner"].append(learn_loss)
        out["baseline"].append(base_loss)
        out["domain"].append(item.domain)
        out["sequence"].append(item.sequence)
        if progress_every and (i + 1) % progress_every == 0:
            rate = (i + 1) / max(time.time() - start, 1e-9)
            eta = f", ETA {(total - i - 1) / rate:.0f}s" if total else ""
            logger.info("CALM: batch %d%s, %.1f batches/s%s; last %d batches: learner %.3f, baseline %.3f",
                        i + 1, f"/{total}" if total else "", rate, eta, progress_every,
                        np.mean(out["learner"][-progress_every:]), np.mean(out["baseline"][-progress_every:]))
    losses = StreamLosses(np.asarray(out["learner"]), np.asarray(out["baseline"]),
                          np.asarray(out["domain"], np.int64), np.asarray(out["sequence"], np.int64),
                          time.time() - start)
    return losses, params


def class_wraps(stream: calm.CALM) -> Dict[str, int]:
    """How many times each class of the stream runs out of text and restarts from its beginning."""
    used = [0] * len(stream.class_names)
    for domain, length in stream.segments:
        used[domain] += length
    out = {}
    for d, name in enumerate(stream.class_names):
        per_pass = (stream.class_stream(d).shape[1] - 1) // stream.window_size
        out[name] = max(0, used[d] - 1) // per_pass
    return out


def switch_points(sequence: Sequence[int]) -> List[int]:
    """Batch indices where a new segment starts (the first batch excluded)."""
    s = np.asarray(sequence)
    return [int(i) for i in np.flatnonzero(s[1:] != s[:-1]) + 1]


# --------------------------------------------------------------------------------------------------------------------
# Report.


def _fmt(x: Optional[float]) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    return f"{x:.3f}"


def format_report(results: Dict[str, Any]) -> str:
    """Markdown: the run in a paragraph, then learner vs baseline overall and per class."""
    cfg, corpus, stream = results["config"], results["corpus"], results["stream"]
    metrics = results["metrics"]
    model = cfg["model"]
    if cfg["baseline"] == "pretrained":
        base = (f"the same architecture and initialisation, pre-trained with Adam (lr {cfg['pretrain_lr']}) on the "
                f"first {cfg['pretrain_batches']} batches of the stream ({cfg['pretrain_passes']} pass(es)), then "
                f"frozen; the learner starts from the same pre-trained parameters")
    else:
        base = "the same architecture and initialisation, untrained and frozen"
    lines = [
        "# CALM: Transformer-XL online learner vs static baseline",
        "",
        f"Corpus `{corpus['dir']}`: {len(corpus['classes'])} classes ({', '.join(corpus['classes'])}), "
        f"{cfg['model_level']} level, vocabulary {corpus['vocab_size']}. Stream: {stream['batches']} batches of "
        f"{cfg['batch_size']} x {cfg['window_size']} tokens in {stream['segments']} segments (mean "
        f"{stream['mean_segment_length']:.2f} batches; switch_frequency {cfg['switch_frequency']}, nswitches "
        f"{cfg['nswitches']}, seed {cfg['seed']}).",
        "",
        f"Learner: Transformer-XL ({model['n_layer']} layers, d_model {model['d_model']}, {model['n_head']} heads, "
        f"memory {model['mem_len']}; {results['parameters']:,} parameters) with the dynamic-evaluation step: each "
        f"batch is scored, then one `{cfg['rule']}` step (lr {cfg['lr']}) on it updates the `{cfg['which']}` "
        f"parameters. Baseline: {base}.",
        "",
        "Metrics (calm.compute_metrics) drop the first 50 segments; loss is nats per token, total_pp = exp(loss), "
        "ppl@sw = exp of the mean loss over the first 10 batches after a switch, rec = batches until the loss falls "
        "below the class's previous segment mean.",
        "",
    ]
    if not metrics["learner"]:
        lines.append("The log has fewer than 100 segments: CALM reports no metrics.")
        return "\n".join(lines) + "\n"
    lines += ["| model | " + " | ".join(REPORT_METRICS) + " |", "|---|" + "---:|" * len(REPORT_METRICS)]
    for name in ("learner", "baseline"):
        m = metrics[name]
        lines.append(f"| {name} | " + " | ".join(_fmt(m.get(k)) for k in REPORT_METRICS) + " |")
    lines += ["", "## Per class", "", "| class | model | " + " | ".join(REPORT_METRICS) + " |",
              "|---|---|" + "---:|" * len(REPORT_METRICS)]
    for c in corpus["classes"]:
        for name in ("learner", "baseline"):
            m = metrics[name]
            lines.append(f"| {c} | {name} | " + " | ".join(_fmt(m.get(f"{k}_{c}")) for k in REPORT_METRICS) + " |")
    wrapped = {c: n for c, n in stream.get("wraps", {}).items() if n}
    if wrapped:
        lines += ["", "Note: some classes ran out of text and started again ("
                  + ", ".join(f"{c} {n}x" for c, n in wrapped.items())
                  + "), so the learner met text it had trained on."]
    lines += ["", f"Time: pre-training {results['timing']['pretrain_s']:.1f}s, stream "
                  f"{results['timing']['stream_s']:.1f}s ({results['timing']['batches_per_s']:.1f} batches/s, both "
                  f"models), total {results['timing']['total_s']:.1f}s."]
    return "\n".join(lines) + "\n"


def plot_losses(losses: StreamLosses, class_names: Sequence[str], path: str, burn_in_batches: int = 0,
                pretrain_batches: int = 0, smooth: int = 10) -> None:
    """loss.png: both models' per-batch losses (thin) and their running means over `smooth` batches, a vertical
    line at every switch, the burn-in (not scored) shaded and the pre-training prefix marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = np.arange(len(losses.learner))
    fig, ax = plt.subplots(figsize=(13, 5))
    if burn_in_batches:
        ax.axvspan(-0.5, burn_in_batches - 0.5, color="0.92", zorder=-2, label="burn-in (not scored)")
    for i in switch_points(losses.sequence):
        ax.axvline(i - 0.5, color="0.55", lw=0.5, alpha=0.6, zorder=-1)
    if pretrain_batches:
        ax.axvline(pretrain_batches - 0.5, color="k", ls=":", lw=1.2, label="end of the pre-training prefix")
    for name, values, color in (("learner (dynamic eval)", losses.learner, "tab:blue"),
                                ("baseline (static)", losses.baseline, "tab:orange")):
        ax.plot(x, values, color=color, lw=0.6, alpha=0.35)
        k = max(1, min(smooth, len(values)))
        running = np.convolve(values, np.ones(k) / k, mode="valid")
        ax.plot(x[k - 1:], running, color=color, lw=1.6, label=f"{name}, mean of {k}")
    # Class of each batch as a coloured strip along the bottom.
    colors = plt.get_cmap("tab10")
    lo = min(losses.learner.min(), losses.baseline.min())
    hi = max(losses.learner.max(), losses.baseline.max())
    strip = lo - 0.04 * (hi - lo + 1e-9)
    for d, name in enumerate(class_names):
        sel = losses.domain == d
        ax.scatter(x[sel], np.full(sel.sum(), strip), marker="|", s=40, color=colors(d % 10), label=f"class {name}")
    ax.set_xlabel("batch (grey lines: class switches)")
    ax.set_ylabel("loss (nats / token)")
    ax.set_title("CALM: loss over the stream, each batch scored before the learner trains on it")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8, ncol=2, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=90, format="png")
    plt.close(fig)


def _atomic_write(path: str, write: Callable[[str], None]) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=os.path.splitext(path)[1],
                               dir=directory)
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def _write_text(text: str) -> Callable[[str], None]:
    def write(tmp):
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
    return write


# --------------------------------------------------------------------------------------------------------------------
# The gin entry point.


@gin.configurable(module="templm")
def run_calm(out_dir: Optional[str] = None, corpus_dir: Optional[str] = None, world_dir: Optional[str] = None,
             world: Any = None, domains: Optional[Sequence[str]] = None, model_level: str = "word",
             switch_frequency: float = 384, nswitches: int = 30, window_size: int = 32, batch_size: int = 4,
             seed: int = 0, d_model: int = 64, n_head: int = 2, d_head: int = 32, d_inner: int = 128,
             n_layer: int = 2, mem_len: Optional[int] = None, rule: str = "adam", lr: float = 1e-3,
             which: str = "all", rms_decay: float = 0.0, rms_eps: float = 1e-3, baseline: str = "pretrained",
             pretrain_batches: int = 100, pretrain_passes: int = 2, pretrain_lr: float = 3e-3,
             progress_every: int = 100) -> Dict[str, Any]:
    """Runs the CALM evaluation of a Transformer-XL online learner against a static baseline (module docstring).

    Corpus: `corpus_dir` (an existing CALM corpus) or, when it is None, one built from the world at `world_dir`
    (default `<out_dir>/world`; generated from `world` when missing) into `<out_dir>/corpus`; `world_dir`, `world`
    and `domains` apply only to that case. Writes into `out_dir`:
    learner.jsonl, baseline.jsonl, results.json, report.md, loss.png. Returns the results dict (as results.json).
    """
    t0 = time.time()
    if not out_dir:
        raise ValueError("run_calm needs out_dir: bind templm.run_calm.out_dir (or the OUT_DIR macro of the config)")
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
    if baseline not in BASELINES:
        raise ValueError(f"baseline must be one of {BASELINES}, got {baseline!r}")
    if rule == "rms" and baseline != "pretrained":
        raise ValueError("rule='rms' needs baseline='pretrained': its mean squared gradients come from the "
                         "pre-training prefix")

    # -- corpus and stream ------------------------------------------------------------------------------------------
    corpus_info: Dict[str, Any] = {}
    if corpus_dir is not None:
        check_corpus(corpus_dir)  # before anything is written
    os.makedirs(out_dir, exist_ok=True)
    if corpus_dir is None:
        world_dir = world_dir or os.path.join(out_dir, "world")
        corpus_dir = os.path.join(out_dir, "corpus")
        built = build_world_corpus(world_dir, corpus_dir, model_level, domains, world)
        corpus_info = {"world_dir": world_dir, "world_generated": built["world_generated"]}
        check_corpus(corpus_dir)
    stream = calm.CALM(corpus_dir, model_level, switch_frequency, nswitches, window_size, batch_size, seed)
    names = list(stream.class_names)
    n_segments = len(stream.segments)
    if n_segments < calm.MIN_SEGMENTS:
        raise ValueError(f"the stream has {n_segments} segments ({len(names)} classes x nswitches {nswitches}); "
                         f"CALM metrics need at least {calm.MIN_SEGMENTS}: raise nswitches to "
                         f"{math.ceil(calm.MIN_SEGMENTS / len(names))} or more")
    burn_in_batches = sum(n for _, n in stream.segments[:calm.BURN_IN_SEGMENTS])
    n_batches = len(stream)
    if baseline == "pretrained":
        if not 1 <= pretrain_batches <= burn_in_batches:
            raise ValueError(f"pretrain_batches must be between 1 and the {burn_in_batches} batches of the burn-in "
                             f"(the first {calm.BURN_IN_SEGMENTS} segments, never scored), got {pretrain_batches}")
    else:
        pretrain_batches = 0
    wraps = class_wraps(stream)
    corpus_info.update({"dir": corpus_dir, "classes": names, "vocab_size": len(stream.vocab),
                        "tokens": {n: int(stream.class_stream(d).size) for d, n in enumerate(names)}})
    if any(wraps.values()):
        logger.warning("CALM: classes run out of text and start again (%s): the learner meets text it has "
                       "trained on; more text or fewer batches avoid it", wraps)
    logger.info("CALM: corpus %s: classes %s, vocabulary %d; %d batches in %d segments", corpus_dir, names,
                len(stream.vocab), n_batches, n_segments)

    # -- model, pre-training -----------------------------------------------------------------------------------------
    config = txl_config_for(len(stream.vocab), window_size, mem_len, d_model=d_model, n_head=n_head, d_head=d_head,
                            d_inner=d_inner, n_layer=n_layer)
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
        logger.info("CALM: pre-trained on %d batches, mean loss per pass %s (%.1fs)", len(prefix),
                    [round(x, 3) for x in pretrain_losses], time.time() - t_pre)
        if rule == "rms":
            inputs = jnp.stack([b[0] for b in prefix])
            targets = jnp.stack([b[1] for b in prefix])
            ms = collect_ms(params, (inputs, targets), model=model, mem_len=config.mem_len, which=mask)
    pretrain_s = time.time() - t_pre
    learner = make_learner(model, config.mem_len, rule, mask)
    opt_state = learner.init(params, lr, ms=ms, decay=rms_decay, eps=rms_eps)

    # -- the stream --------------------------------------------------------------------------------------------------
    paths = {name: os.path.join(out_dir, name) for name in
             ("learner.jsonl", "baseline.jsonl", "results.json", "report.md", "loss.png")}
    with calm.LossLogger(paths["learner.jsonl"]) as learner_log, \
            calm.LossLogger(paths["baseline.jsonl"]) as baseline_log:
        losses, _ = run_online(stream, model, config.mem_len, learner, params, opt_state, params, learner_log,
                               baseline_log, total=n_batches, progress_every=progress_every)

    metrics = {"learner": calm.compute_metrics(paths["learner.jsonl"]),
               "baseline": calm.compute_metrics(paths["baseline.jsonl"])}
    results = {
        "config": {"out_dir": out_dir, "model_level": model_level, "switch_frequency": switch_frequency,
                   "nswitches": nswitches, "window_size": window_size, "batch_size": batch_size, "seed": seed,
                   "rule": rule, "lr": lr, "which": which if isinstance(which, str) else "custom",
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
    _atomic_write(paths["loss.png"], lambda tmp: plot_losses(losses, names, tmp, burn_in_batches, pretrain_batches))
    results["timing"]["total_s"] = time.time() - t0
    _atomic_write(paths["report.md"], _write_text(format_report(results)))
    _atomic_write(paths["results.json"], _write_text(json.dumps(results, indent=1) + "\n"))
    logger.info("CALM: wrote %s in %.1fs", ", ".join(paths.values()), results["timing"]["total_s"])
    return results
