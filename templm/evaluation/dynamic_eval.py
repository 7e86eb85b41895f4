"""Dynamic evaluation of a Transformer-XL on a test stream: score each segment, then take a gradient step on it.

Dynamic evaluation (Krause et al. 2018, "Dynamic Evaluation of Neural Sequence Models"; used by Lazaridou et al.,
"Mind the Gap", to keep a model up to date) reads the test stream in order. For every segment the model first
scores the segment with its current parameters and memory -- these log-probabilities are the result, so a token is
always predicted before the model has trained on it -- and then takes one gradient step on the mean next-token loss
of that same segment. The memory is carried forward across segments AND documents: the stream is the concatenation
of the test documents in date order, separated by an end-of-document token, exactly as in static evaluation.

Everything runs inside one `jax.lax.scan` over segments (carry: the adapted parameters, the memories and
`mem_valid`), compiled once per (model, memory length, rule, parameter subset); the learning rate, decay and epsilon
are traced arguments, so a sweep over them does not recompile. `static_eval_stream` is the same scan without the
update. Memories have fixed shapes (`init_mems` + `mem_valid`, see transformer_xl.py), so one compile serves the
whole stream.

Which parameters adapt (`adapt_mask(params, which)`, one bool per leaf; paths are the '/'-joined keys of the
"params" collection, e.g. ``layer_0/mlp/wi/kernel``):

  * ``"all"``: every parameter;
  * ``"embeddings"``: the token embedding (``embedding``) and, when the output layer is untied, ``output_kernel``;
  * ``"biases"``: layer-norm scales and biases, the feed-forward biases, the attention biases u and v
    (``u_bias``, ``v_bias``) and the output bias (``output_bias``), i.e. every leaf named ``scale``, ``bias``,
    ``u_bias``, ``v_bias`` or ``output_bias``;
  * anything else is a regular expression searched (``re.search``) in each path; it must select something;
  * or a pytree of bools with the structure of params.

Parameters outside the mask are never touched: they pass through the scan as they came in (bitwise unchanged), and
no gradient is computed for them.

Update rules (theta: an adapted parameter, g: the gradient of the segment's mean next-token loss, taken over its
weighted tokens in all B streams of the batch):

  * ``"sgd"``:  theta <- theta - lr * g.
  * ``"rms"`` (Krause et al.'s RMS rule with a decay back to the trained parameters theta0):

        d     = lr * g / (sqrt(ss) + eps) + decay * rate * (theta - theta0)
        theta <- theta - d

    where ss is the mean squared gradient on TRAINING data, collected beforehand by `collect_ms` (ss = the mean of
    g_k ** 2 over the training segments k, g_k the gradient of segment k's mean loss, as Krause et al.), and
      - by default Krause et al.'s ``rate = min(sqrt(ss) / mean(sqrt(ss)), 1 / decay)``: the RMS normalised by its
        mean over all adapted parameters (so `decay` is the decay rate of an average parameter), clipped so that
        one step never moves a parameter past theta0: decay * rate <= 1, the decay term is a contraction and a long
        stream stays bounded;
      - with ``normalise_decay=False``, the raw ``rate = sqrt(ss)``, which oscillates and then diverges wherever
        decay * sqrt(ss) > 1 (and > 2) and is kept only to compare with.

    ss and theta0 are constants of the scan; neither rule keeps per-step state.

With ``lr = 0`` (and ``decay = 0``) the update is theta - 0 = theta and the log-probabilities equal those of
`static_eval_stream` (the test suite checks this).
"""

from __future__ import annotations

import functools
import re
from typing import Any, Optional, Sequence, Tuple, Union

import jax
import jax.numpy as jnp
import numpy as np
import flax.linen as nn

from templm.models.transformer_xl import TransformerXL, lm_loss, next_mem_valid, token_log_probs

Array = jax.Array

RULES = ("sgd", "rms")
PRESETS = ("all", "embeddings", "biases")
_EMBEDDING_LEAVES = frozenset({"embedding", "output_kernel"})
_BIAS_LEAVES = frozenset({"scale", "bias", "u_bias", "v_bias", "output_bias"})
DEFAULT_EPS = 1e-5


# ----------------------------------------------------------------------------------------------------------------
# Parameter subsets.


def _unwrap(params: Any) -> Any:
    """The plain "params" collection: boxes (LogicallyPartitioned) removed, a {"params": ...} variables dict opened."""
    params = nn.unbox(params)
    if isinstance(params, dict) and set(params) == {"params"}:
        params = params["params"]
    return params


def _key_name(key: Any) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def param_paths(params: Any) -> Any:
    """The '/'-joined path of every leaf, as a pytree with the structure of params."""
    params = _unwrap(params)
    return jax.tree_util.tree_map_with_path(lambda path, _: "/".join(_key_name(k) for k in path), params)


def adapt_mask(params: Any, which: Union[str, Any] = "all") -> Any:
    """A pytree of Python bools (structure of params): True for the parameters dynamic evaluation updates.

    which: "all", "embeddings", "biases" (see the module docstring), a regular expression searched in each
    '/'-joined path, or a pytree of bools (checked and returned). Raises ValueError when the selection is empty.
    """
    params = _unwrap(params)
    paths = param_paths(params)
    if not isinstance(which, str):
        treedef = jax.tree_util.tree_structure(params)
        try:
            leaves = treedef.flatten_up_to(which)
        except (ValueError, TypeError) as e:
            raise ValueError(f"adapt mask does not have the structure of the parameters: {e}") from None
        if not all(isinstance(b, (bool, np.bool_)) for b in leaves):
            raise ValueError("an adapt mask must hold one Python bool per parameter")
        mask = treedef.unflatten([bool(b) for b in leaves])
    elif which == "all":
        mask = jax.tree_util.tree_map(lambda _: True, paths)
    elif which == "embeddings":
        mask = jax.tree_util.tree_map(lambda p: p.rsplit("/", 1)[-1] in _EMBEDDING_LEAVES, paths)
    elif which == "biases":
        mask = jax.tree_util.tree_map(lambda p: p.rsplit("/", 1)[-1] in _BIAS_LEAVES, paths)
    else:
        try:
            pattern = re.compile(which)
        except re.error as e:
            raise ValueError(f"which={which!r} is neither one of {PRESETS} nor a valid regular expression: {e}") \
                from None
        mask = jax.tree_util.tree_map(lambda p: pattern.search(p) is not None, paths)
    if not any(jax.tree_util.tree_leaves(mask)):
        examples = ", ".join(sorted(jax.tree_util.tree_leaves(paths))[:4])
        raise ValueError(f"which={which!r} selects no parameter (paths look like: {examples}, ...)")
    return mask


def _split(params: Any, mask_leaves: Sequence[bool]) -> Tuple[list, list, Any]:
    leaves, treedef = jax.tree_util.tree_flatten(params)
    if len(leaves) != len(mask_leaves):
        raise ValueError(f"mask has {len(mask_leaves)} leaves, params {len(leaves)}")
    adapted = [leaf for leaf, m in zip(leaves, mask_leaves) if m]
    frozen = [leaf for leaf, m in zip(leaves, mask_leaves) if not m]
    return adapted, frozen, treedef


def _merge(adapted: Sequence[Any], frozen: Sequence[Any], mask_leaves: Sequence[bool], treedef: Any) -> Any:
    adapted_it, frozen_it = iter(adapted), iter(frozen)
    return treedef.unflatten([next(adapted_it) if m else next(frozen_it) for m in mask_leaves])


# ----------------------------------------------------------------------------------------------------------------
# Update rules (pure, on matching pytrees).


def sgd_update(params: Any, grads: Any, lr: Any) -> Any:
    """theta <- theta - lr * g, leaf by leaf."""
    return jax.tree_util.tree_map(lambda p, g: p - lr * g.astype(p.dtype), params, grads)


def rms_decay_rate(ms: Any, decay: Any, normalise_decay: bool = True) -> Any:
    """Per-parameter decay rate of the RMS rule: Krause et al.'s min(sqrt(ms) / mean(sqrt(ms)), 1 / decay) with the
    mean over every entry of every leaf of ms, or (normalise_decay=False) the raw sqrt(ms)."""
    rms = jax.tree_util.tree_map(jnp.sqrt, ms)
    if not normalise_decay:
        return rms
    leaves = jax.tree_util.tree_leaves(rms)
    total = sum(jnp.sum(leaf) for leaf in leaves)
    count = sum(leaf.size for leaf in leaves)
    mean = jnp.maximum(total / count, jnp.finfo(jnp.float32).tiny)
    limit = jnp.where(decay > 0, 1.0 / jnp.maximum(decay, jnp.finfo(jnp.float32).tiny), jnp.inf)
    return jax.tree_util.tree_map(lambda r: jnp.minimum(r / mean, limit), rms)


def rms_update(params: Any, grads: Any, ms: Any, theta0: Any, lr: Any, decay: Any = 0.0, eps: Any = DEFAULT_EPS,
               normalise_decay: bool = True, rate: Any = None) -> Any:
    """Krause et al.'s RMS rule: theta <- theta - (lr * g / (sqrt(ms) + eps) + decay * rate * (theta - theta0)).

    rate = Krause et al.'s normalised and clipped rate (`rms_decay_rate`), or sqrt(ms) with normalise_decay=False;
    pass it precomputed (`rate`) to avoid recomputing it every step.
    """
    if rate is None:
        rate = rms_decay_rate(ms, decay, normalise_decay)

    def one(p, g, s, p0, r):
        d = lr * g / (jnp.sqrt(s) + eps) + decay * r * (p - p0)
        return p - d.astype(p.dtype)

    return jax.tree_util.tree_map(one, params, grads, ms, theta0, rate)


# ----------------------------------------------------------------------------------------------------------------
# Segments.


def _segments(segments: Any) -> Tuple[Array, Array, Array]:
    """(inputs, targets, weights) [N, B, T] from [N, B, T+1] tokens or an (inputs, targets[, weights]) tuple."""
    if isinstance(segments, (tuple, list)):
        if len(segments) not in (2, 3):
            raise ValueError("segments must be [N, B, T+1] tokens or a tuple (inputs, targets[, weights])")
        inputs, targets = jnp.asarray(segments[0]), jnp.asarray(segments[1])
        weights = jnp.ones(targets.shape, jnp.float32) if len(segments) == 2 or segments[2] is None \
            else jnp.asarray(segments[2], jnp.float32)
    else:
        tokens = jnp.asarray(segments)
        if tokens.ndim != 3 or tokens.shape[-1] < 2:
            raise ValueError(f"segments must be [N, B, T+1] tokens, got shape {tokens.shape}")
        inputs, targets = tokens[..., :-1], tokens[..., 1:]
        weights = jnp.ones(targets.shape, jnp.float32)
    if inputs.ndim != 3 or inputs.shape != targets.shape or weights.shape != targets.shape:
        raise ValueError(f"inputs, targets and weights must all be [N, B, T]; got {inputs.shape}, {targets.shape}, "
                         f"{weights.shape}")
    return inputs.astype(jnp.int32), targets.astype(jnp.int32), weights


def _mem_len(model: TransformerXL, mem_len: Optional[int]) -> int:
    mem_len = model.config.test_mem_len if mem_len is None else int(mem_len)
    if mem_len < 0:
        raise ValueError(f"mem_len must be >= 0, got {mem_len}")
    return mem_len


# ----------------------------------------------------------------------------------------------------------------
# Compiled scans (one per model, memory length, rule and subset; cached).


@functools.lru_cache(maxsize=64)
def _static_fn(model: TransformerXL, mem_len: int):
    def run(params, inputs, targets):
        batch = inputs.shape[1]

        def step(carry, segment):
            mems, valid = carry
            inp, tgt = segment
            lp, new_mems = token_log_probs(params, inp, tgt, mems, mem_len, model=model, mem_valid=valid)
            return (new_mems, next_mem_valid(valid, inp.shape[1], mem_len)), lp

        init = (model.init_mems(batch, mem_len), jnp.zeros((), jnp.int32))
        _, log_probs = jax.lax.scan(step, init, (inputs, targets))
        return log_probs

    return jax.jit(run)


@functools.lru_cache(maxsize=64)
def _dynamic_fn(model: TransformerXL, mem_len: int, rule: str, mask_leaves: Tuple[bool, ...],
                normalise_decay: bool):
    def run(params, inputs, targets, weights, lr, decay, eps, ms_adapted):
        adapted0, frozen, treedef = _split(params, mask_leaves)
        batch = inputs.shape[1]
        decay_rate = rms_decay_rate(ms_adapted, decay, normalise_decay) if rule == "rms" else None

        def loss_fn(adapted, inp, tgt, w, mems, valid):
            p = _merge(adapted, frozen, mask_leaves, treedef)
            loss, nll, new_mems = lm_loss(p, inp, tgt, mems, mem_len, True, model=model, weights=w, mem_valid=valid)
            return loss, (nll, new_mems)

        def step(carry, segment):
            adapted, mems, valid = carry
            inp, tgt, w = segment
            (_, (nll, new_mems)), grads = jax.value_and_grad(loss_fn, has_aux=True)(adapted, inp, tgt, w, mems,
                                                                                      valid)
            if rule == "sgd":
                adapted = sgd_update(adapted, grads, lr)
            else:
                adapted = rms_update(adapted, grads, ms_adapted, adapted0, lr, decay, eps, rate=decay_rate)
            return (adapted, new_mems, next_mem_valid(valid, inp.shape[1], mem_len)), -nll

        init = (adapted0, model.init_mems(batch, mem_len), jnp.zeros((), jnp.int32))
        (adapted, _, _), log_probs = jax.lax.scan(step, init, (inputs, targets, weights))
        return log_probs, _merge(adapted, frozen, mask_leaves, treedef)

    return jax.jit(run)


@functools.lru_cache(maxsize=16)
def _ms_fn(model: TransformerXL, mem_len: int, mask_leaves: Tuple[bool, ...]):
    def run(params, inputs, targets, weights):
        adapted, frozen, treedef = _split(params, mask_leaves)
        batch = inputs.shape[1]

        def loss_fn(a, inp, tgt, w, mems, valid):
            p = _merge(a, frozen, mask_leaves, treedef)
            loss, _, new_mems = lm_loss(p, inp, tgt, mems, mem_len, True, model=model, weights=w, mem_valid=valid)
            return loss, new_mems

        def step(carry, segment):
            total, mems, valid = carry
            inp, tgt, w = segment
            (_, new_mems), grads = jax.value_and_grad(loss_fn, has_aux=True)(adapted, inp, tgt, w, mems, valid)
            total = jax.tree_util.tree_map(lambda t, g: t + jnp.square(g.astype(jnp.float32)), total, grads)
            return (total, new_mems, next_mem_valid(valid, inp.shape[1], mem_len)), None

        zeros = jax.tree_util.tree_map(lambda a: jnp.zeros(a.shape, jnp.float32), adapted)
        init = (zeros, model.init_mems(batch, mem_len), jnp.zeros((), jnp.int32))
        (total, _, _), _ = jax.lax.scan(step, init, (inputs, targets, weights))
        n = inputs.shape[0]
        ms = [t / n for t in total]
        return _merge(ms, [jnp.zeros(f.shape, jnp.float32) for f in frozen], mask_leaves, treedef)

    return jax.jit(run)


# ----------------------------------------------------------------------------------------------------------------
# Public entry points.


def static_eval_stream(model: TransformerXL, params: Any, segments: Any, mem_len: Optional[int] = None) -> Array:
    """Per-token log-probabilities [N, B, T] of a stream of segments, memory carried, no parameter update.

    segments: [N, B, T+1] tokens (inputs = [..., :-1], targets = [..., 1:]) or (inputs, targets[, weights]) [N, B, T]
    (weights are not needed to score; padding positions get log-probs like any other and the caller drops them).
    mem_len defaults to the config's evaluation memory length.
    """
    inputs, targets, _ = _segments(segments)
    return _static_fn(model, _mem_len(model, mem_len))(_unwrap(params), inputs, targets)


def dynamic_eval_stream(model: TransformerXL, params: Any, segments: Any, mem_len: Optional[int] = None,
                        rule: str = "sgd", lr: float = 1e-4, which: Union[str, Any] = "all", *, decay: float = 0.0,
                        eps: float = DEFAULT_EPS, ms: Any = None, normalise_decay: bool = True,
                        return_params: bool = False) -> Union[Array, Tuple[Array, Any]]:
    """Dynamic evaluation: per-token log-probabilities [N, B, T], each segment scored before the step on it.

    segments: as `static_eval_stream`; weights (default ones) weight the adaptation loss, so padding (weight 0)
    never trains the model. rule: "sgd" or "rms" (then ms, the mean squared training gradients from `collect_ms`, is
    required; decay, eps and normalise_decay as in the module docstring). which: the adapted subset (`adapt_mask`).
    return_params: also return the parameters after the last step (the frozen ones are the very arrays passed in).
    """
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
    params = _unwrap(params)
    mask_leaves = tuple(jax.tree_util.tree_leaves(adapt_mask(params, which)))
    inputs, targets, weights = _segments(segments)
    if rule == "rms":
        if ms is None:
            raise ValueError("rule='rms' needs ms, the mean squared gradients on training data (collect_ms)")
        ms_leaves, ms_def = jax.tree_util.tree_flatten(_unwrap(ms))
        if ms_def != jax.tree_util.tree_structure(params):
            raise ValueError("ms must have the structure of params (as collect_ms returns it)")
        ms_adapted = [jnp.asarray(s, jnp.float32) for s, m in zip(ms_leaves, mask_leaves) if m]
    else:
        ms_adapted = []
    fn = _dynamic_fn(model, _mem_len(model, mem_len), rule, mask_leaves, bool(normalise_decay))
    log_probs, new_params = fn(params, inputs, targets, weights, jnp.float32(lr), jnp.float32(decay),
                               jnp.float32(eps), ms_adapted)
    return (log_probs, new_params) if return_params else log_probs


def collect_ms(params: Any, train_segments: Any, *, model: TransformerXL, mem_len: Optional[int] = None,
               which: Union[str, Any] = "all") -> Any:
    """Mean squared gradients on training data, for the RMS rule: ss = mean_k (g_k ** 2) (a pytree like params).

    train_segments: [K, B, T+1] tokens or (inputs, targets[, weights]) [K, B, T], read as a stream (memory carried);
    g_k is the gradient of segment k's mean next-token loss with the given (trained, unchanged) parameters, as
    Krause et al. Leaves outside `which` get zeros (their gradients are not computed).
    """
    params = _unwrap(params)
    mask_leaves = tuple(jax.tree_util.tree_leaves(adapt_mask(params, which)))
    inputs, targets, weights = _segments(train_segments)
    if inputs.shape[0] < 1:
        raise ValueError("collect_ms needs at least one training segment")
    return _ms_fn(model, _mem_len(model, mem_len), mask_leaves)(params, inputs, targets, weights)
