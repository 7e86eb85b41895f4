"""An online learner and a static baseline through a CALM stream, with a Transformer-XL.

Both models run through the stream (`templm.data.calm_stream.CALM`), one batch at a time, each with its own
Transformer-XL memory carried from batch to batch (across class switches too, as the stream's rows run on):

- the LEARNER applies the dynamic-evaluation step: `score_then_update(params, opt_state, memory, batch)` -- one
  jitted function -- computes the batch's mean next-token loss with the current parameters and memory (that loss is
  the score, so no token is predicted after training on it), then takes one gradient step on that same loss with
  `rule` ("adam": optax Adam; "sgd" and "rms": the update rules of `dynamic_eval`, "rms" with the mean squared
  gradients collected on training data and a decay back to the starting parameters), on the parameters selected by
  a mask (`dynamic_eval.adapt_mask`);
- the BASELINE scores every batch with its fixed parameters (`score(params, memory, batch)`, jitted).

`pretrain` trains the starting parameters with Adam on a prefix of the stream, through the learner's own step.
`run_online` runs both models and logs each loss (`templm.data.calm_log.LossLogger`) as soon as it is known. Losses
are mean cross-entropies in nats per token over the batch's `batch_size x window_size` targets.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from typing import Any, Callable, Iterable, List, NamedTuple, Optional, Sequence, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import logging

from templm import console
from templm.data.calm_log import LossLogger
from templm.data.calm_stream import CalmBatch
from templm.evaluation.dynamic_eval import adapt_mask, rms_decay_rate, rms_update, sgd_update
from templm.models.transformer_xl import TransformerXL, TransformerXLConfig, lm_loss, next_mem_valid

Array = jax.Array

RULES = ("adam", "sgd", "rms")


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


def run_online(stream: Iterable[CalmBatch], model: TransformerXL, mem_len: int, learner: Learner,
               learner_params: Any, opt_state: Any, baseline_params: Any,
               learner_log: Optional[LossLogger] = None, baseline_log: Optional[LossLogger] = None,
               total: Optional[int] = None, progress_every: int = 100) -> Tuple[StreamLosses, Any]:
    """Both models through the stream: the baseline scores each batch; the learner scores it, then steps on it
    (`opt_state` from `learner.init`). Each model has its own memory, carried from batch to batch. Each loss is
    logged (when a logger is given) as soon as it is known. Every `progress_every` batches a progress line gives
    both models' mean loss over those batches (with the rate, and the ETA when `total` batches are known). Returns
    (losses, the learner's final params); the arguments are never donated."""
    score = make_scorer(model, mem_len)
    params, opt_state = _copy(learner_params), _copy(opt_state)
    learner_memory = baseline_memory = None
    out = {"learner": [], "baseline": [], "domain": [], "sequence": []}
    start = time.time()
    rate = console.Rate(total or 0)
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
            timing = rate.report(i + 1)
            recent = {name: float(np.mean(out[name][-progress_every:])) for name in ("learner", "baseline")}
            if total:
                console.say(console.step_line("CALM: stream", i + 1, total, timing, **recent))
            else:
                console.say(f"CALM: stream step {i + 1}  learner {recent['learner']:.4g}  baseline "
                            f"{recent['baseline']:.4g}  {timing['steps_per_sec']:.2f} steps/s")
            logging.info("CALM: mean loss of batches %d-%d: learner %.4f, baseline %.4f", i + 2 - progress_every,
                         i + 1, recent["learner"], recent["baseline"])
    losses = StreamLosses(np.asarray(out["learner"]), np.asarray(out["baseline"]),
                          np.asarray(out["domain"], np.int64), np.asarray(out["sequence"], np.int64),
                          time.time() - start)
    return losses, params

