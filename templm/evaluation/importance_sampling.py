"""Importance-sampled perplexity for language models with latent structure (a stochastic upper bound).

A latent-variable LM defines p(x) = sum_z p(x, z), which is usually intractable. With K samples z_1..z_K drawn from a
proposal q(z | x) the importance-sampling estimate of the log-marginal is

    log p^(x) = logsumexp_k [log p(x, z_k) - log q(z_k | x)] - log K                                          (1)

and the perplexity estimate over a corpus is exp(-sum_units log p^ / sum_units tokens). p^(x) is unbiased for p(x), so
by Jensen E[log p^(x)] <= log p(x): the estimated perplexity is, in expectation, an UPPER bound on the true perplexity.
The gap E[log p] - E[log p^] shrinks monotonically as K grows (Burda et al. 2016, Theorem 1), is KL(q || p(z|x)) at
K = 1, and is exactly zero for every K when q is the exact posterior p(z | x): every log-weight then equals log p(x).

Contents, in order:

1. Estimators on arrays of log-weights (jit-compatible, any batch shape): `log_mean_exp`, `log_marginal_estimate`
   (K on one axis) and `StreamingEstimator`, which takes the K samples split across any number of batches and
   combines them with a running logsumexp and the TOTAL sample count. (A reference implementation subtracted the log of
   the per-batch sample count instead of log K, which inflates log p^ by log(number of batches); see the tests.)
2. Aggregation levels, `perplexity_estimate` and standard errors (below).
3. A hidden Markov model LM whose exact marginal is computable (forward algorithm, `lax.scan`, log space) and samplers
   for proposals of several qualities: the prior, the exact posterior (forward-filtering backward-sampling, FFBS) and a
   tempered posterior. A mixture LM (one latent class per document, per sentence or per token) is the HMM whose
   transition matrix is the identity (`mixture_lm`).
4. `run_is_eval`: estimated perplexity against K for every proposal and level, with the exact value, as JSON, a
   Markdown table and a PNG plot.

Aggregation level: where the estimate is formed before it is pooled
--------------------------------------------------------------------
Token log-weights are an array lw[k, b, t] = log p(x_t, z^k_t | ...) - log q(z^k_t | ...): the contribution of token t
of document b to the log-weight of sample k, laid out so that, summed over the tokens of one latent unit, it gives that
unit's full log-weight log p(x_u, z^k_u) - log q(z^k_u | x_u). A level cuts every document into units, sums the
token log-weights over each unit's tokens PER SAMPLE, forms (1) per unit (logsumexp over k, minus log K) and only then
pools, by summing log p^_u over all units of the corpus:

- ``document``: one unit per document: log p^(x_b) = logsumexp_k sum_{t in b} lw[k, b, t] - log K. The latent z covers
  the whole document (e.g. one HMM chain over it). This is always valid.
- ``sentence``: one unit per sentence (maximal run of equal ``segment_ids`` within a document): log p^(x_s) =
  logsumexp_k sum_{t in s} lw[k, b, t] - log K. Valid when the model factorises over sentences, p(x_b) = prod_s
  sum_{z_s} p(x_s, z_s), each sentence with its own latent (an HMM whose chain restarts at every sentence start, a
  mixture with one class per sentence), and the proposal factorises the same way.
- ``token``: one unit per token: log p^(x_t) = logsumexp_k lw[k, b, t] - log K. Valid only when every token has its own
  latent, p(x_b) = prod_t sum_{z_t} p(x_t, z_t) (an HMM that restarts at every token, a per-token mixture).

A level is valid for a model when each of its units is a union of the model's latent units (token within sentence
within document). A valid finer level estimates the same p(x) and is still an upper bound on perplexity in expectation,
with less variance: the product of per-unit means replaces the mean of per-sample products. A level finer than the
model's latent unit is not an estimate of p(x) at all (`estimate_hmm_perplexity` refuses it).

Padding: positions t >= token_counts[b] are padding; their log-weights are ignored (treated as 0) and they count no
token. A unit with no tokens contributes log p^ = 0 and is left out of the unit counts.

Standard errors (choice and justification)
-------------------------------------------
Two questions, two errors; both are returned by `perplexity_estimate`:

- ``se_*_mc``: the Monte Carlo error of ONE run, conditional on the data: how much log p^ would move with fresh samples
  from q. Units have independent samples, so Var(sum_u log p^_u) = sum_u Var(log p^_u), and by the delta method
  Var(log mean_k w_k) ~ Var(w) / (K E[w]^2), estimated from the unit's own K weights with the unbiased sample variance:
  (K / ESS_u - 1) / (K - 1), ESS_u = (sum_k w_k)^2 / sum_k w_k^2 the effective sample size. It is exactly 0 for the
  exact posterior and undefined (NaN) for K = 1. It is cheap, jit-compatible and needs no extra random numbers; like
  every estimate from the weights themselves it is optimistic when the weights are heavy-tailed (when ESS << K), which
  is why ``unit_ess`` is returned too, and why `bootstrap_standard_error` (a bootstrap over the K samples of each
  unit, the same quantity without the delta method's linearisation) is offered as a check.
- ``se_perplexity_units``: the sampling error of the corpus perplexity, treating units as draws from a population
  (data sampling plus Monte Carlo): the linearised standard error of the ratio estimator r = sum_u l_u / sum_u n_u,
  se(r)^2 = U / (U - 1) * sum_u (l_u - r n_u)^2 / (sum_u n_u)^2 over the U units with tokens. With equal n_u it is the
  standard error of the mean of per-unit estimates across units. It is what to quote beside a corpus perplexity.

Perplexity errors follow from log-likelihood errors by the delta method: se(ppl) = ppl * se(L) / N.

The bound itself is an expectation: the table of `run_is_eval` reports exp(-mean_r L_r / N) over independent runs r
(disjoint groups of K samples), with the standard error of that mean from the spread across runs.
"""

from __future__ import annotations

import functools
import json
import math
import os
import tempfile
import time
from typing import Any, Callable, Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.scipy.special import logsumexp

LEVELS = ("token", "sentence", "document")
PROPOSALS = ("prior", "tempered", "posterior")

Array = jax.Array


# --------------------------------------------------------------------------------------------------------------------
# 1. Estimators on log-weights.


def _as_float(x: Any) -> Array:
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        x = x.astype(jnp.float32)
    return x


def log_mean_exp(x: Any, axis: int = -1) -> Array:
    """log(mean(exp(x))) along `axis`, computed stably (logsumexp minus log of the axis length)."""
    x = _as_float(x)
    k = x.shape[axis]
    if k == 0:
        raise ValueError("log_mean_exp: the sample axis is empty (K = 0 samples)")
    return logsumexp(x, axis=axis) - math.log(k)


@functools.partial(jax.jit, static_argnames=("axis",))
def log_marginal_estimate(log_joint: Any, log_proposal: Any, axis: int = -1) -> Array:
    """Importance-sampling estimate of log p(x): logsumexp_k [log p(x, z_k) - log q(z_k | x)] - log K.

    `log_joint` and `log_proposal` have the same shape (or broadcast), with the K samples on `axis`; every other axis is
    a batch axis and survives. jit-compatible. A sample with log_joint = -inf has weight 0; all weights zero gives -inf.
    """
    return log_mean_exp(_as_float(log_joint) - _as_float(log_proposal), axis=axis)


class StreamingEstimator(NamedTuple):
    """The estimate (1) with its K samples split across several batches, in any order and any batch sizes.

    State (a pytree, so it goes through `jax.jit`, `lax.scan` and `jax.lax.fori_loop`):
      log_sum:     logsumexp of every log-weight seen so far, one per batch element (shape = the batch shape)
      log_sum_sq:  logsumexp of 2 * log-weight (for the effective sample size)
      num_samples: the TOTAL number of samples seen so far (int32 scalar; the same for every batch element)

    The estimate is log_sum - log(num_samples): the total K, never the size of the last (or any one) batch.

        est = StreamingEstimator.init(batch_shape)
        for lw in batches:                 # lw: [..., k_i] with k_i samples on the last axis
            est = est.update(lw)
        est.log_marginal()                 # == log_marginal_estimate on all sum_i k_i samples at once

    With no samples seen, log_marginal() is NaN (-inf - log 0).
    """

    log_sum: Array
    log_sum_sq: Array
    num_samples: Array

    @classmethod
    def init(cls, batch_shape: Sequence[int] = (), dtype: Any = jnp.float32) -> "StreamingEstimator":
        empty = jnp.full(tuple(batch_shape), -jnp.inf, dtype)
        return cls(empty, empty, jnp.zeros((), jnp.int32))

    def update(self, log_weights: Any, axis: int = -1) -> "StreamingEstimator":
        """Adds a batch of samples: `log_weights` has the batch shape plus one sample axis, `axis`."""
        lw = jnp.asarray(log_weights, self.log_sum.dtype)
        k = lw.shape[axis]
        return StreamingEstimator(
            jnp.logaddexp(self.log_sum, logsumexp(lw, axis=axis)),
            jnp.logaddexp(self.log_sum_sq, logsumexp(2.0 * lw, axis=axis)),
            self.num_samples + k,
        )

    def update_from(self, log_joint: Any, log_proposal: Any, axis: int = -1) -> "StreamingEstimator":
        """`update` with log-weights log_joint - log_proposal."""
        return self.update(_as_float(log_joint) - _as_float(log_proposal), axis=axis)

    def merge(self, other: "StreamingEstimator") -> "StreamingEstimator":
        """Combines two estimators over disjoint sample sets (e.g. from two devices): counts add."""
        return StreamingEstimator(
            jnp.logaddexp(self.log_sum, other.log_sum),
            jnp.logaddexp(self.log_sum_sq, other.log_sum_sq),
            self.num_samples + other.num_samples,
        )

    def log_marginal(self) -> Array:
        """log p^(x) = logsumexp(all log-weights) - log(total number of samples)."""
        return self.log_sum - jnp.log(self.num_samples.astype(self.log_sum.dtype))

    def effective_sample_size(self) -> Array:
        """(sum w)^2 / sum w^2 over all samples seen: K for equal weights, near 1 when one weight dominates."""
        return jnp.exp(2.0 * self.log_sum - self.log_sum_sq)


def combine_sample_batches(log_weight_batches: Iterable[Any], axis: int = -1) -> Array:
    """log p^ from samples given as several batches (each with its sample axis at `axis`): a `StreamingEstimator` fold."""
    batches = [_as_float(b) for b in log_weight_batches]
    if not batches:
        raise ValueError("combine_sample_batches: no batches of samples")
    shape = list(batches[0].shape)
    del shape[axis]
    est = StreamingEstimator.init(shape, batches[0].dtype)
    for b in batches:
        est = est.update(b, axis=axis)
    return est.log_marginal()


# --------------------------------------------------------------------------------------------------------------------
# 2. Aggregation levels, perplexity and standard errors.


def _check_level(level: str) -> None:
    if level not in LEVELS:
        raise ValueError(f"unknown aggregation level {level!r}; expected one of {', '.join(LEVELS)}")


def _valid_mask(token_counts: Optional[Any], batch: int, length: int) -> Array:
    if token_counts is None:
        return jnp.ones((batch, length), bool)
    counts = jnp.asarray(token_counts)
    return jnp.arange(length)[None, :] < counts.reshape(batch)[:, None]


@functools.partial(jax.jit, static_argnames=("level", "shape"))
def unit_starts(level: str, shape: Tuple[int, int], segment_ids: Optional[Any] = None) -> Array:
    """Boolean [B, T]: True where a unit of `level` begins. Document: t = 0; sentence: t = 0 or where `segment_ids`
    changes from t - 1 to t; token: everywhere. Also the chain restarts of an HMM whose latent unit is `level`."""
    _check_level(level)
    batch, length = shape
    first = jnp.zeros((batch, length), bool).at[:, 0].set(True)
    if level == "document":
        return first
    if level == "token":
        return jnp.ones((batch, length), bool)
    if segment_ids is None:
        raise ValueError("sentence level needs segment_ids: a sentence id per token, shape [B, T]")
    seg = jnp.asarray(segment_ids).reshape(batch, length)
    change = jnp.concatenate([jnp.ones((batch, 1), bool), seg[:, 1:] != seg[:, :-1]], axis=1)
    return first | change


@functools.partial(jax.jit, static_argnames=("level",))
def unit_log_weights(log_weights: Any, token_counts: Optional[Any] = None, level: str = "document",
                     segment_ids: Optional[Any] = None) -> Tuple[Array, Array]:
    """Sums token log-weights [K, B, T] over the units of `level`, per sample.

    Returns (unit log-weights [K, U], unit token counts [U]). Document level: U = B. Sentence and token level: U = B*T,
    unit b*T + j is the j-th unit of document b; slots past a document's last unit hold 0 tokens and log-weight 0.
    """
    _check_level(level)
    lw = _as_float(log_weights)
    if lw.ndim != 3:
        raise ValueError(f"log_weights must be [K, B, T] (samples, documents, tokens), got shape {lw.shape}")
    k, batch, length = lw.shape
    mask = _valid_mask(token_counts, batch, length)
    lw = jnp.where(mask[None], lw, 0.0)
    if level == "document":
        return lw.sum(axis=2), mask.sum(axis=1).astype(jnp.int32)
    if level == "token":
        return lw.reshape(k, batch * length), mask.reshape(-1).astype(jnp.int32)
    starts = unit_starts(level, (batch, length), segment_ids)
    index = jnp.cumsum(starts.astype(jnp.int32), axis=1) - 1  # in [0, T)
    flat = (jnp.arange(batch)[:, None] * length + index).reshape(-1)
    num = batch * length
    unit_lw = jax.ops.segment_sum(lw.reshape(k, num).T, flat, num_segments=num).T
    counts = jax.ops.segment_sum(mask.reshape(-1).astype(jnp.int32), flat, num_segments=num)
    return unit_lw, counts


class PerplexityEstimate(NamedTuple):
    """An importance-sampled perplexity with its standard errors (see the module docstring)."""

    perplexity: Array           # exp(-log_likelihood / num_tokens)
    log_likelihood: Array       # L = sum over units of log p^_u
    num_tokens: Array           # N
    num_units: Array            # units with at least one token
    num_samples: Array          # K
    se_log_likelihood_mc: Array  # Monte Carlo s.e. of L (delta method, per-unit ESS); NaN for K = 1
    se_perplexity_mc: Array      # ... of the perplexity
    se_perplexity_units: Array   # across-unit s.e. of the perplexity (ratio estimator); NaN for fewer than 2 units
    unit_log_marginals: Array    # [U] log p^_u (0 for units without tokens)
    unit_token_counts: Array     # [U]
    unit_ess: Array              # [U] effective sample size of each unit's weights


def _np_logsumexp(a: np.ndarray, axis: int, keepdims: bool = False) -> np.ndarray:
    m = np.max(a, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore"):
        out = np.log(np.sum(np.exp(a - m), axis=axis, keepdims=True)) + m
    return out if keepdims else np.squeeze(out, axis=axis)


def _unit_statistics(lw, counts, xp, lse) -> Dict[str, Any]:
    """The estimate and its standard errors from unit log-weights [..., K, U] (leading axes: independent runs).

    Written once for both array libraries: `xp` is jax.numpy (jit, float32) or numpy (run_is_eval's float64 analysis
    of many runs at once), `lse` the matching logsumexp.
    """
    k = lw.shape[-2]
    dtype = lw.dtype
    occupied = counts > 0
    log_marg = xp.where(occupied, lse(lw, axis=-2) - math.log(k), 0.0)
    total = log_marg.sum(-1)
    n_tokens = counts.sum().astype(dtype)
    ppl = xp.exp(-total / n_tokens)

    log_norm = lw - lse(lw, axis=-2, keepdims=True)
    ess = xp.exp(-lse(2.0 * log_norm, axis=-2))
    if k > 1:
        var_unit = xp.where(occupied, xp.clip(k / ess - 1.0, 0.0, None) / (k - 1), 0.0)
        se_l_mc = xp.sqrt(var_unit.sum(-1))
    else:
        se_l_mc = xp.full(total.shape, xp.nan, dtype)

    n_units = occupied.sum()
    n_u = n_units.astype(dtype)
    resid = xp.where(occupied, log_marg - (total / n_tokens)[..., None] * counts.astype(dtype), 0.0)
    var_rate = xp.where(n_units > 1, n_u / xp.maximum(n_u - 1.0, 1.0) * (resid ** 2).sum(-1) / n_tokens ** 2, xp.nan)
    return {"perplexity": ppl, "log_likelihood": total, "num_tokens": n_tokens, "num_units": n_units,
            "se_log_likelihood_mc": se_l_mc, "se_perplexity_mc": ppl * se_l_mc / n_tokens,
            "se_perplexity_units": ppl * xp.sqrt(var_rate), "unit_log_marginals": log_marg, "unit_ess": ess}


@jax.jit
def perplexity_from_unit_log_weights(unit_log_weights: Any, unit_token_counts: Any) -> PerplexityEstimate:
    """Forms (1) per unit from unit log-weights [K, U] (sample axis first) and pools the units. jit-compatible."""
    lw = _as_float(unit_log_weights)
    if lw.ndim != 2:
        raise ValueError(f"unit_log_weights must be [K, U], got shape {lw.shape}")
    counts = jnp.asarray(unit_token_counts)
    st = _unit_statistics(lw, counts, jnp, logsumexp)
    return PerplexityEstimate(st["perplexity"], st["log_likelihood"], st["num_tokens"], st["num_units"],
                              jnp.asarray(lw.shape[0], jnp.int32), st["se_log_likelihood_mc"],
                              st["se_perplexity_mc"], st["se_perplexity_units"], st["unit_log_marginals"], counts,
                              st["unit_ess"])


@functools.partial(jax.jit, static_argnames=("level",))
def perplexity_estimate(log_weights: Any, token_counts: Optional[Any] = None, level: str = "document",
                        segment_ids: Optional[Any] = None) -> PerplexityEstimate:
    """Importance-sampled perplexity at an aggregation level.

    Args:
      log_weights: [K, B, T] token log-weights: lw[k, b, t] is token t of document b's contribution to sample k's
        log p(x, z_k) - log q(z_k | x) (their sum over a latent unit is that unit's log-weight). K is the number of
        samples: pass a slice lw[:K] to use fewer.
      token_counts: [B] number of real tokens of each document (a prefix; the rest is padding). None: all T.
      level: "document", "sentence" or "token": where (1) is formed before pooling (module docstring).
      segment_ids: [B, T] sentence ids (a sentence is a maximal run of equal ids); needed for level="sentence" only.

    Returns a `PerplexityEstimate`. The proposal (and its temperature) is whatever produced the log-weights; see
    `estimate_hmm_perplexity` for the end-to-end version with K and the temperature as arguments.
    """
    unit_lw, counts = unit_log_weights(log_weights, token_counts, level, segment_ids)
    return perplexity_from_unit_log_weights(unit_lw, counts)


@functools.partial(jax.jit, static_argnames=("num_bootstrap",))
def bootstrap_standard_error(key: Array, unit_log_weights: Any, unit_token_counts: Any,
                             num_bootstrap: int = 1000) -> Dict[str, Array]:
    """Bootstrap over samples: resample each unit's K log-weights with replacement, recompute L and the perplexity.

    Returns {"se_log_likelihood", "se_perplexity"}: the standard deviations over `num_bootstrap` replicates. It
    measures the same Monte Carlo error as ``se_*_mc`` of `perplexity_from_unit_log_weights`, without the delta
    method; replicates run one at a time (`lax.map`), so memory stays at one [K, U] array.
    """
    lw = _as_float(unit_log_weights)
    k, u = lw.shape
    counts = jnp.asarray(unit_token_counts)
    occupied = counts > 0
    n_tokens = counts.sum().astype(lw.dtype)

    def one(rep_key):
        idx = jax.random.randint(rep_key, (k, u), 0, k)
        res = jnp.take_along_axis(lw, idx, axis=0)
        return jnp.where(occupied, log_mean_exp(res, axis=0), 0.0).sum()

    totals = lax.map(one, jax.random.split(key, num_bootstrap))
    return {"se_log_likelihood": jnp.std(totals, ddof=1),
            "se_perplexity": jnp.std(jnp.exp(-totals / n_tokens), ddof=1)}


# --------------------------------------------------------------------------------------------------------------------
# 3. A hidden Markov model LM with an exact marginal, and proposals.


class HMM(NamedTuple):
    """A hidden Markov model LM in log space (a pytree).

    log_init[s] = log p(z_1 = s); log_trans[i, j] = log p(z_t = j | z_{t-1} = i); log_emit[s, v] = log p(x_t = v |
    z_t = s). A chain RESTART at position t (see `unit_starts`) draws z_t from the initial distribution again,
    independent of z_{t-1}: an HMM restarting at every sentence start has one latent chain per sentence, one restarting
    at every token has one independent latent per token. Potentials need not be normalised (`tempered` uses that).
    """

    log_init: Array
    log_trans: Array
    log_emit: Array

    @property
    def num_states(self) -> int:
        return self.log_init.shape[0]

    @property
    def vocab_size(self) -> int:
        return self.log_emit.shape[1]


def random_hmm(seed: Any, num_states: int, vocab_size: int, peakedness: float = 1.5) -> HMM:
    """A seeded random HMM: each row is softmax(peakedness * standard normal) (0: uniform; larger: more peaked), so
    every path has positive probability. `seed`: an int or a numpy Generator."""
    rng = np.random.default_rng(seed)

    def rows(*shape):
        logits = peakedness * rng.standard_normal(shape)
        logits -= logits.max(-1, keepdims=True)
        return jnp.asarray(logits - np.log(np.exp(logits).sum(-1, keepdims=True)), jnp.float32)

    return HMM(rows(num_states), rows(num_states, num_states), rows(num_states, vocab_size))


def mixture_lm(log_class_prior: Any, log_emit: Any) -> HMM:
    """A mixture of unigram LMs: one latent class c ~ prior per latent unit, tokens i.i.d. from emit[c].

    It is the HMM whose transition matrix is the identity: the class never changes within a chain and is redrawn at
    every restart. So with restarts at sentence starts it has one class per sentence; at t = 0 only, per document.
    """
    prior = jnp.asarray(log_class_prior, jnp.float32)
    s = prior.shape[0]
    trans = jnp.where(jnp.eye(s, dtype=bool), 0.0, -jnp.inf)
    return HMM(prior, trans, jnp.asarray(log_emit, jnp.float32))


def tempered(hmm: HMM, temperature: Any) -> HMM:
    """All log-potentials divided by `temperature`: its posterior is p(z | x)^(1/tau), renormalised over paths."""
    tau = jnp.asarray(temperature, jnp.float32)
    return HMM(hmm.log_init / tau, hmm.log_trans / tau, hmm.log_emit / tau)


def _step_log_trans(hmm: HMM, restart: Array) -> Array:
    """[S, S] log-potential into a position: the transition matrix, or rows all equal to log_init at a restart."""
    return jnp.where(restart, hmm.log_init[None, :], hmm.log_trans)


def _forward_one(hmm: HMM, tokens: Array, mask: Array, restarts: Array) -> Tuple[Array, Array]:
    """Forward algorithm for one sequence [T]: (log Z, log alpha [T, S]); alpha_t(s) = p(x_{1:t}, z_t = s)."""
    restarts = restarts.at[0].set(True)
    init = jnp.full((hmm.num_states,), -jnp.inf, hmm.log_init.dtype).at[0].set(0.0)

    def step(prev, inp):
        x, m, r = inp
        alpha = logsumexp(prev[:, None] + _step_log_trans(hmm, r), axis=0) + hmm.log_emit[:, x]
        alpha = jnp.where(m, alpha, prev)
        return alpha, alpha

    last, alphas = lax.scan(step, init, (tokens, mask, restarts))
    return logsumexp(last), alphas


def _joint_terms_one(hmm: HMM, tokens: Array, z: Array, mask: Array, restarts: Array) -> Array:
    """Per-token log p(x_t, z_t | z_{t-1}) for one sequence; 0 at padding. Sums to log p(x, z)."""
    restarts = restarts.at[0].set(True)
    prev = jnp.concatenate([jnp.zeros((1,), z.dtype), z[:-1]])
    trans = jnp.where(restarts, hmm.log_init[z], hmm.log_trans[prev, z])
    return jnp.where(mask, trans + hmm.log_emit[z, tokens], 0.0)


def _prior_sample_one(gumbel: Array, hmm: HMM, mask: Array, restarts: Array) -> Tuple[Array, Array]:
    """Ancestral sample of the Markov chain for one sequence: (z [T], per-token log p(z_t | z_{t-1})).

    `gumbel` [T, S] is standard Gumbel noise: argmax(logits + gumbel) is a categorical sample (drawn outside the scan,
    one random call for all samples, which keeps compilation short)."""
    restarts = restarts.at[0].set(True)

    def step(prev, inp):
        g, m, r = inp
        logits = jax.nn.log_softmax(_step_log_trans(hmm, r)[prev])
        z = jnp.argmax(logits + g).astype(jnp.int32)
        lq = jnp.where(m, logits[z], 0.0)
        z = jnp.where(m, z, 0)
        return z, (z, lq)

    _, (z, lq) = lax.scan(step, jnp.zeros((), jnp.int32), (gumbel, mask, restarts))
    return z, lq


def _backward_sample_one(gumbel: Array, pot: HMM, alphas: Array, mask: Array, restarts: Array) -> Tuple[Array, Array]:
    """Backward sampling given forward messages: z_T ~ alpha_T, z_t ~ alpha_t(z) * trans(z, z_{t+1}).

    Returns (z [T], per-token log q(z_t | z_{t+1}, x_{1:t})), which sum to the exact log q(z | x). Where position t+1
    is padding (or past the end) z_t is unconstrained; where it restarts, the column is constant and cancels.
    `gumbel` [T, S]: standard Gumbel noise, as in `_prior_sample_one`.
    """
    restarts = restarts.at[0].set(True)
    next_restart = jnp.concatenate([restarts[1:], jnp.ones((1,), bool)])
    next_mask = jnp.concatenate([mask[1:], jnp.zeros((1,), bool)])

    def step(z_next, inp):
        g, alpha, m, r_next, m_next = inp
        column = _step_log_trans(pot, r_next)[:, z_next]
        logits = alpha + jnp.where(m_next, column, 0.0)
        log_cond = jax.nn.log_softmax(logits)
        z = jnp.argmax(log_cond + g).astype(jnp.int32)
        lq = jnp.where(m, log_cond[z], 0.0)
        z = jnp.where(m, z, 0)
        return z, (z, lq)

    _, (z, lq) = lax.scan(step, jnp.zeros((), jnp.int32), (gumbel, alphas, mask, next_restart, next_mask),
                               reverse=True)
    return z, lq


class ProposalSamples(NamedTuple):
    """K samples of a proposal for each sequence. Shapes: z and *_terms [K, T] for one sequence [T], [K, B, T] for a
    batch [B, T]; log_q and log_joint drop the T axis. Terms are per token, 0 at padding, and sum to the totals."""

    z: Array
    log_q: Array            # log q(z | x), exact
    log_joint: Array        # log p(x, z) under the model
    log_q_terms: Array
    log_joint_terms: Array

    @property
    def log_weights(self) -> Array:
        return self.log_joint - self.log_q

    @property
    def token_log_weights(self) -> Array:
        return self.log_joint_terms - self.log_q_terms


def _prepare(tokens: Any, token_counts: Optional[Any], restarts: Optional[Any]):
    tokens = jnp.asarray(tokens, jnp.int32)
    single = tokens.ndim == 1
    tok = tokens[None] if single else tokens
    if tok.ndim != 2:
        raise ValueError(f"tokens must be [T] or [B, T], got shape {tokens.shape}")
    batch, length = tok.shape
    mask = _valid_mask(token_counts, batch, length)
    if restarts is None:
        rs = unit_starts("document", (batch, length))
    else:
        rs = jnp.asarray(restarts, bool).reshape(batch, length)
    return single, tok, mask, rs


@jax.jit
def forward_log_likelihood(hmm: HMM, tokens: Any, token_counts: Optional[Any] = None,
                           restarts: Optional[Any] = None) -> Array:
    """Exact log p(x) per sequence by the forward algorithm (lax.scan, log space).

    tokens [T] or [B, T]; token_counts [B] (real tokens, a prefix; None: all); restarts [B, T] bool (chain restarts,
    see `unit_starts`; None: one chain per sequence). Returns a scalar or [B]. Padding contributes nothing.
    """
    single, tok, mask, rs = _prepare(tokens, token_counts, restarts)
    out = jax.vmap(lambda x, m, r: _forward_one(hmm, x, m, r)[0])(tok, mask, rs)
    return out[0] if single else out


def sample_proposal(key: Array, hmm: HMM, tokens: Any, num_samples: int, proposal: str = "posterior",
                    temperature: Any = 1.0, token_counts: Optional[Any] = None,
                    restarts: Optional[Any] = None) -> ProposalSamples:
    """K = `num_samples` samples per sequence from a proposal q(z | x), with exact log q and log p(x, z).

    proposal:
      "prior":     the Markov chain itself, ancestral sampling (ignores x): log q = log p(z).
      "posterior": the exact posterior p(z | x), by forward-filtering backward-sampling. Weights are all p(x).
      "tempered":  the posterior of the HMM with every log-potential divided by `temperature` (FFBS on
                   `tempered(hmm, temperature)`): q(z | x) proportional to p(x, z)^(1/tau). tau = 1 is the posterior,
                   tau > 1 flatter (towards uniform over paths), tau < 1 sharper (towards the Viterbi path).
    Restarts (see `forward_log_likelihood`) apply to the model and to the proposal alike. The random numbers are one
    Gumbel draw of B * K * T * S floats made up front (categorical sampling by argmax inside the scans).
    """
    if proposal not in PROPOSALS:
        raise ValueError(f"unknown proposal {proposal!r}; expected one of {', '.join(PROPOSALS)}")
    kind = "prior" if proposal == "prior" else "ffbs"
    tau = 1.0 if proposal == "posterior" else temperature
    return _sample_proposal(key, hmm, tokens, num_samples, kind, tau, token_counts, restarts)


@functools.partial(jax.jit, static_argnames=("num_samples", "kind"))
def _sample_proposal(key, hmm, tokens, num_samples, kind, temperature, token_counts, restarts) -> ProposalSamples:
    single, tok, mask, rs = _prepare(tokens, token_counts, restarts)
    batch = tok.shape[0]
    noise = jax.random.gumbel(key, (batch, num_samples, tok.shape[1], hmm.num_states), hmm.log_init.dtype)
    # posterior and tempered share one compiled program: the temperature is data (1 for the posterior).
    tau = jnp.asarray(temperature, hmm.log_init.dtype)

    def per_sequence(seq_noise, x, m, r):
        if kind == "prior":
            z, lq = jax.vmap(lambda g: _prior_sample_one(g, hmm, m, r))(seq_noise)
        else:
            pot = tempered(hmm, tau)
            _, alphas = _forward_one(pot, x, m, r)
            z, lq = jax.vmap(lambda g: _backward_sample_one(g, pot, alphas, m, r))(seq_noise)
        lj = jax.vmap(lambda zz: _joint_terms_one(hmm, x, zz, m, r))(z)
        return z, lq, lj

    z, lq, lj = jax.vmap(per_sequence)(noise, tok, mask, rs)  # [B, K, T]
    z, lq, lj = (jnp.swapaxes(a, 0, 1) for a in (z, lq, lj))  # [K, B, T]
    if single:
        z, lq, lj = z[:, 0], lq[:, 0], lj[:, 0]
    return ProposalSamples(z, lq.sum(-1), lj.sum(-1), lq, lj)


def sample_prior(key, hmm, tokens, num_samples, token_counts=None, restarts=None) -> ProposalSamples:
    """Ancestral samples of the chain (see `sample_proposal`)."""
    return sample_proposal(key, hmm, tokens, num_samples, "prior", 1.0, token_counts, restarts)


def sample_posterior(key, hmm, tokens, num_samples, token_counts=None, restarts=None) -> ProposalSamples:
    """Exact posterior samples by FFBS (see `sample_proposal`)."""
    return sample_proposal(key, hmm, tokens, num_samples, "posterior", 1.0, token_counts, restarts)


def sample_tempered_posterior(key, hmm, tokens, num_samples, temperature, token_counts=None,
                              restarts=None) -> ProposalSamples:
    """Tempered-posterior samples by FFBS on the potentials scaled by 1/temperature (see `sample_proposal`)."""
    return sample_proposal(key, hmm, tokens, num_samples, "tempered", temperature, token_counts, restarts)


def sample_sequences(seed: Any, hmm: HMM, num_sequences: int, length: int) -> Tuple[np.ndarray, np.ndarray]:
    """Draws (tokens [B, T], z [B, T]) from the HMM (one chain per sequence) by ancestral sampling, in numpy.
    `seed`: an int or a numpy Generator."""
    rng = np.random.default_rng(seed)
    init, trans, emit = (np.exp(np.asarray(a, np.float64)) for a in hmm)
    init, trans, emit = init / init.sum(), trans / trans.sum(-1, keepdims=True), emit / emit.sum(-1, keepdims=True)
    z = np.zeros((num_sequences, length), np.int32)
    x = np.zeros((num_sequences, length), np.int32)
    for b in range(num_sequences):
        for t in range(length):
            p = init if t == 0 else trans[z[b, t - 1]]
            z[b, t] = rng.choice(len(p), p=p)
            x[b, t] = rng.choice(emit.shape[1], p=emit[z[b, t]])
    return x, z


def _level_rank(level: str) -> int:
    _check_level(level)
    return LEVELS.index(level)


def exact_hmm_perplexity(hmm: HMM, tokens: Any, token_counts: Optional[Any] = None, latent_level: str = "document",
                         segment_ids: Optional[Any] = None) -> Tuple[Array, Array]:
    """(perplexity, total log p(x)) of the HMM whose chain restarts at every unit of `latent_level`, exactly."""
    _, tok, mask, _ = _prepare(tokens, token_counts, None)
    restarts = unit_starts(latent_level, tok.shape, segment_ids)
    total = forward_log_likelihood(hmm, tok, mask.sum(1), restarts).sum()
    return jnp.exp(-total / mask.sum()), total


def estimate_hmm_perplexity(key: Array, hmm: HMM, tokens: Any, token_counts: Optional[Any] = None, *,
                            num_samples: int, proposal: str = "tempered", temperature: float = 1.0,
                            level: str = "document", segment_ids: Optional[Any] = None,
                            latent_level: Optional[str] = None) -> PerplexityEstimate:
    """End to end: K = `num_samples` samples of `proposal` (at `temperature`), aggregated at `level`.

    The model is the HMM with one latent chain per unit of `latent_level` (default: `level`). `level` must be as
    coarse as `latent_level` or coarser (module docstring); a finer level raises ValueError.
    """
    latent_level = level if latent_level is None else latent_level
    if _level_rank(level) < _level_rank(latent_level):
        raise ValueError(f"aggregation level {level!r} is finer than the model's latent unit {latent_level!r}: "
                         f"per-{level} estimates do not estimate p(x) for this model")
    _, tok, mask, _ = _prepare(tokens, token_counts, None)
    restarts = unit_starts(latent_level, tok.shape, segment_ids)
    counts = mask.sum(1)
    samples = sample_proposal(key, hmm, tok, num_samples, proposal, temperature, counts, restarts)
    return perplexity_estimate(samples.token_log_weights, counts, level, segment_ids)


# --------------------------------------------------------------------------------------------------------------------
# 4. The evaluation: perplexity against K, per proposal and level, with the exact value.


def _proposal_label(proposal: str, temperature: Optional[float]) -> str:
    return f"tempered(tau={temperature:g})" if proposal == "tempered" else proposal


def _finite_or_none(x: Any) -> Optional[float]:
    x = float(x)
    return x if math.isfinite(x) else None


def make_is_eval_problem(seed: int = 0, num_states: int = 6, vocab_size: int = 12, num_docs: int = 12,
                         doc_length: int = 24, mean_sentence_length: float = 6.0,
                         peakedness: float = 1.5) -> Dict[str, Any]:
    """The seeded HMM and corpus of `run_is_eval`: hmm, tokens [B, T], token_counts [B], segment_ids [B, T].

    Documents are drawn from the HMM with lengths uniform in [T/2, T]; sentence boundaries fall after each token with
    probability 1 / mean_sentence_length.
    """
    rng = np.random.default_rng(seed)
    hmm = random_hmm(rng, num_states, vocab_size, peakedness)
    tokens, _ = sample_sequences(rng, hmm, num_docs, doc_length)
    counts = rng.integers(max(1, doc_length // 2), doc_length + 1, size=num_docs).astype(np.int32)
    boundary = rng.random((num_docs, doc_length)) < 1.0 / mean_sentence_length
    boundary[:, 0] = False
    segment_ids = np.cumsum(boundary, axis=1).astype(np.int32)
    return {"hmm": hmm, "tokens": tokens, "token_counts": counts, "segment_ids": segment_ids}


def _atomic_write(path: str, write: Callable[[str], None]) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=os.path.splitext(path)[1], dir=directory)
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def _fmt(x: Optional[float], digits: int = 3) -> str:
    return "" if x is None else f"{x:.{digits}f}"


def _markdown(rows: List[Dict[str, Any]], config: Dict[str, Any]) -> str:
    lines = [
        "# Importance-sampled perplexity",
        "",
        f"HMM with {config['num_states']} states, vocabulary {config['vocab_size']}; {config['num_docs']} documents, "
        f"{config['num_tokens']} tokens; seed {config['seed']}. `ppl` is exp(-mean L / N) over `runs` independent "
        "runs of K samples (an upper bound on the exact perplexity in expectation); `se` its standard error from the "
        "spread across runs; `mc se` the Monte Carlo standard error one run reports (delta method); `unit se` the "
        "across-unit standard error. `latent` is the model's latent unit (the chain restarts at each), `level` where "
        "the estimate is formed before pooling.",
        "",
        "| latent | level | proposal | K | ppl | se | mc se | unit se | exact | gap % | runs |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        k = "" if r["K"] is None else str(r["K"])
        gap = None if r["proposal"] == "exact" else 100.0 * (r["ppl"] / r["exact_ppl"] - 1.0)
        gap = 0.0 if gap is not None and abs(gap) < 5e-3 else gap  # no "-0.00" for float noise
        lines.append(f"| {r['latent']} | {r['level']} | {r['proposal']} | {k} | {_fmt(r['ppl'])} | "
                     f"{_fmt(r.get('ppl_se'))} | {_fmt(r.get('ppl_mc_se'))} | {_fmt(r.get('ppl_unit_se'))} | "
                     f"{_fmt(r['exact_ppl'])} | {_fmt(gap, 2)} | {r.get('runs') or ''} |")
    return "\n".join(lines) + "\n"


def _plot(rows: List[Dict[str, Any]], path: str, proposals: Sequence[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(LEVELS), len(LEVELS), figsize=(13, 11), squeeze=False)
    colors = {p: plt.get_cmap("tab10")(i) for i, p in enumerate(proposals)}
    for i, latent in enumerate(LEVELS):
        exact = next(r["ppl"] for r in rows if r["latent"] == latent and r["proposal"] == "exact")
        for j, level in enumerate(LEVELS):
            ax = axes[i][j]
            if j < i:
                ax.axis("off")
                ax.text(0.5, 0.5, f"{level} level is finer than\nthe {latent} latent: not an estimate",
                        ha="center", va="center", transform=ax.transAxes, color="0.5")
                continue
            for p in proposals:
                pts = [r for r in rows if r["latent"] == latent and r["level"] == level and r["proposal"] == p]
                ks = [r["K"] for r in pts]
                ppl = [r["ppl"] for r in pts]
                err = [2.0 * (r["ppl_se"] or 0.0) for r in pts]
                ax.errorbar(ks, ppl, yerr=err, marker="o", ms=3, capsize=2, color=colors[p], label=p)
            ax.axhline(exact, color="k", ls="--", lw=1.2, zorder=5, label=f"exact {exact:.3f}")
            ax.set_xscale("log", base=2)
            ax.set_title(f"latent per {latent}, aggregated per {level}", fontsize=9)
            ax.set_xlabel("K (samples)")
            ax.set_ylabel("perplexity (+-2 se)")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
    fig.suptitle("Importance-sampled perplexity against K (stochastic upper bound; dashed: exact, forward algorithm)")
    fig.tight_layout()
    fig.savefig(path, dpi=90, format="png")
    plt.close(fig)


def run_is_eval(out_dir: str, seed: int = 0, *, ks: Sequence[int] = tuple(2 ** i for i in range(9)),
                temperatures: Sequence[float] = (0.5, 2.0), repeats: int = 8, num_states: int = 6,
                vocab_size: int = 12, num_docs: int = 12, doc_length: int = 24, mean_sentence_length: float = 6.0,
                peakedness: float = 1.5, log: Optional[Callable[[str], None]] = None) -> Dict[str, Any]:
    """Estimated perplexity against K for every proposal and aggregation level, with the exact value.

    For each latent unit m (token, sentence, document: the HMM of `make_is_eval_problem` with its chain restarting at
    every unit of m), the exact perplexity comes from the forward algorithm. For each proposal (prior, tempered
    posterior at each of `temperatures`, exact posterior) max(ks) * repeats samples per document are drawn once and
    cut into disjoint groups of K: each group is one independent run. Each valid level (as coarse as m or coarser)
    aggregates them. Rows (dicts): latent, level, proposal, temperature, K, ppl, ppl_se, ppl_mc_se, ppl_unit_se,
    log_likelihood, exact_ppl, exact_log_likelihood, mean_ess_fraction, runs; plus one row per latent unit with
    proposal "exact" (level "-", K None) holding the forward-algorithm value.

    Writes out_dir/is_eval.json ({"config", "rows"}), out_dir/is_eval.md and out_dir/is_eval.png (each written to a
    temporary file first and renamed). Returns {"config", "rows", "files"}.
    """
    ks = sorted({int(k) for k in ks})
    if not ks or ks[0] < 1:
        raise ValueError(f"ks must be positive sample counts, got {ks}")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    for tau in temperatures:
        if not tau > 0:
            raise ValueError(f"temperatures must be > 0, got {tau}")
    say = log or (lambda msg: None)
    start = time.time()
    os.makedirs(out_dir, exist_ok=True)

    prob = make_is_eval_problem(seed, num_states, vocab_size, num_docs, doc_length, mean_sentence_length,
                                peakedness)
    hmm, tokens, counts, seg = prob["hmm"], prob["tokens"], prob["token_counts"], prob["segment_ids"]
    proposals: List[Tuple[str, float]] = [("prior", 1.0)] + [("tempered", float(t)) for t in temperatures] + \
        [("posterior", 1.0)]
    labels = [_proposal_label(p, t) for p, t in proposals]
    total_samples = ks[-1] * repeats
    n_tokens = int(np.asarray(counts).sum())
    config = {"seed": seed, "ks": ks, "temperatures": [float(t) for t in temperatures], "repeats": repeats,
              "num_states": num_states, "vocab_size": vocab_size, "num_docs": num_docs, "doc_length": doc_length,
              "mean_sentence_length": mean_sentence_length, "peakedness": peakedness,
              "num_tokens": n_tokens, "samples_per_proposal": total_samples}

    rows: List[Dict[str, Any]] = []
    key = jax.random.PRNGKey(seed + 1)
    for latent in LEVELS:
        restarts = unit_starts(latent, tokens.shape, seg)
        exact_ll = float(forward_log_likelihood(hmm, tokens, counts, restarts).sum())
        exact_ppl = math.exp(-exact_ll / n_tokens)
        rows.append({"latent": latent, "level": "-", "proposal": "exact", "temperature": None, "K": None,
                     "ppl": exact_ppl, "ppl_se": None, "ppl_mc_se": None, "ppl_unit_se": None,
                     "log_likelihood": exact_ll, "exact_ppl": exact_ppl, "exact_log_likelihood": exact_ll,
                     "mean_ess_fraction": None, "runs": None})
        for (proposal, tau), label in zip(proposals, labels):
            key, sub = jax.random.split(key)
            samples = sample_proposal(sub, hmm, tokens, total_samples, proposal, tau, counts, restarts)
            token_lw = samples.token_log_weights
            for level in LEVELS[_level_rank(latent):]:
                unit_lw, unit_counts = unit_log_weights(token_lw, counts, level, seg)
                unit_lw = np.asarray(unit_lw, np.float64)
                unit_counts = np.asarray(unit_counts)
                occupied = unit_counts > 0
                for k in ks:
                    runs = total_samples // k
                    grouped = unit_lw[: runs * k].reshape(runs, k, -1)
                    st = _unit_statistics(grouped, unit_counts, np, _np_logsumexp)
                    lls = st["log_likelihood"]
                    mean_ll = float(lls.mean())
                    ppl = math.exp(-mean_ll / n_tokens)
                    se_ll = float(lls.std(ddof=1) / math.sqrt(runs)) if runs > 1 else float("nan")
                    ess_frac = float(st["unit_ess"][:, occupied].mean() / k)
                    rows.append({
                        "latent": latent, "level": level, "proposal": label,
                        "temperature": tau if proposal == "tempered" else None, "K": k,
                        "ppl": ppl, "ppl_se": _finite_or_none(ppl * se_ll / n_tokens),
                        "ppl_mc_se": _finite_or_none(np.mean(st["se_perplexity_mc"])),
                        "ppl_unit_se": _finite_or_none(np.mean(st["se_perplexity_units"])),
                        "log_likelihood": mean_ll, "exact_ppl": exact_ppl, "exact_log_likelihood": exact_ll,
                        "mean_ess_fraction": ess_frac, "runs": runs})
            say(f"is-eval: latent={latent} proposal={label} done ({time.time() - start:.1f}s)")

    config["seconds"] = round(time.time() - start, 3)
    paths = {name: os.path.join(out_dir, f"is_eval.{name}") for name in ("json", "md", "png")}

    def write_json(tmp):
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"config": config, "rows": rows}, f, indent=1)
            f.write("\n")

    def write_md(tmp):
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(_markdown(rows, config))

    _atomic_write(paths["json"], write_json)
    _atomic_write(paths["md"], write_md)
    _atomic_write(paths["png"], lambda tmp: _plot(rows, tmp, labels))
    say(f"is-eval: wrote {', '.join(paths.values())} in {time.time() - start:.1f}s")
    return {"config": config, "rows": rows, "files": paths}
