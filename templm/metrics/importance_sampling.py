"""Importance-sampled perplexity for language models with latent structure (a stochastic upper bound): the estimators.

A latent-variable LM defines p(x) = sum_z p(x, z), which is usually intractable. With K samples z_1..z_K drawn from a
proposal q(z | x) the importance-sampling estimate of the log-marginal is

    log p^(x) = logsumexp_k [log p(x, z_k) - log q(z_k | x)] - log K                                          (1)

and the perplexity estimate over a corpus is exp(-sum_units log p^ / sum_units tokens). p^(x) is unbiased for p(x), so
by Jensen E[log p^(x)] <= log p(x): the estimated perplexity is, in expectation, an UPPER bound on the true perplexity.
The gap E[log p] - E[log p^] shrinks monotonically as K grows (Burda et al. 2016, Theorem 1), is KL(q || p(z|x)) at
K = 1, and is exactly zero for every K when q is the exact posterior p(z | x): every log-weight then equals log p(x).

This module holds the numbers only, on arrays of log-weights (no model): a toy LM whose exact marginal is computable,
with proposals of several qualities, is `templm.models.hmm`; running the estimators with it on a corpus is
`templm.evaluation.hmm_perplexity`; the estimate against K for every proposal and level is the experiment
`templm.experiments.importance_sampling`.

Contents, in order:

1. Estimators on arrays of log-weights (jit-compatible, any batch shape): `log_mean_exp`, `log_marginal_estimate`
   (K on one axis) and `StreamingEstimator`, which takes the K samples split across any number of batches and
   combines them with a running logsumexp and the TOTAL sample count. (A reference implementation subtracted the log of
   the per-batch sample count instead of log K, which inflates log p^ by log(number of batches); see the tests.)
2. Aggregation levels (`unit_starts`, `unit_log_weights`), `perplexity_estimate` and standard errors (below).

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
model's latent unit is not an estimate of p(x) at all (`templm.evaluation.hmm_perplexity.estimate_hmm_perplexity`
refuses it; `level_rank` orders the levels).

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

`unit_statistics` computes the estimate and both errors once for jax (jit, float32) and numpy (float64, many
independent runs at once, as the experiment does).
"""

from __future__ import annotations

import functools
import math
from typing import Any, Dict, Iterable, Mapping, NamedTuple, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.scipy.special import logsumexp

from templm.metrics import statistics

LEVELS = ("token", "sentence", "document")

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
    """log p^ from samples given as several batches (each with its sample axis at `axis`): a `StreamingEstimator`
    fold."""
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


def level_rank(level: str) -> int:
    """0 for token, 1 for sentence, 2 for document: a level is valid for a model whose latent unit ranks no higher."""
    _check_level(level)
    return LEVELS.index(level)


def valid_mask(token_counts: Optional[Any], batch: int, length: int) -> Array:
    """Boolean [B, T]: True at the real tokens, the first token_counts[b] positions of each row (None: all)."""
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
    mask = valid_mask(token_counts, batch, length)
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


def np_logsumexp(a: np.ndarray, axis: int, keepdims: bool = False) -> np.ndarray:
    """logsumexp in numpy (any float dtype, float64 kept); an axis of all -inf gives -inf."""
    m = np.max(a, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore"):
        out = np.log(np.sum(np.exp(a - m), axis=axis, keepdims=True)) + m
    return out if keepdims else np.squeeze(out, axis=axis)


def unit_statistics(lw, counts, xp, lse) -> Dict[str, Any]:
    """The estimate and its standard errors from unit log-weights [..., K, U] (leading axes: independent runs).

    Written once for both array libraries: `xp` is jax.numpy (jit, float32) or numpy (the float64 analysis of many runs
    at once in `templm.experiments.importance_sampling.run_is_eval`), `lse` the matching logsumexp (`np_logsumexp`).
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
    st = unit_statistics(lw, counts, jnp, logsumexp)
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
    `templm.evaluation.hmm_perplexity.estimate_hmm_perplexity` for the end-to-end version with K and the temperature
    as arguments.
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
# The effects Logan, Gardner and Singh measure, as findings on one is-eval run of a latent LM
# (templm.experiments.importance_sampling.run_latent_is_eval). Each is a paired test over the evaluated documents of
# their estimated log-likelihood (the mean over the run's independent estimates), in nats per document; they are
# registered, with their claims and directions, in templm.metrics.findings.REGISTRY.


def _estimates(results: Mapping[str, Any], proposal: str, level: str, k: Any) -> Optional[np.ndarray]:
    per_doc = (((results.get("per_document") or {}).get("estimates") or {}).get(proposal) or {}).get(level) or {}
    values = per_doc.get(str(k))
    return None if values is None else np.asarray(values, np.float64)


def _ppl(results: Mapping[str, Any], log_likelihoods: np.ndarray) -> float:
    tokens = float(np.sum((results.get("per_document") or {}).get("tokens") or [1]))
    return math.exp(-float(np.sum(log_likelihoods)) / tokens)


def _paired_estimates(results, name: str, a: Tuple[str, str, Any], b: Tuple[str, str, Any], what: str, alpha: float
                      ) -> Dict[str, Any]:
    x, y = _estimates(results, *a), _estimates(results, *b)
    if x is None or y is None:
        return statistics.untested(name, f"no per-document estimates of {what} in this run")
    if len(x) < 2:
        return statistics.untested(name, "fewer than two documents")
    out = statistics.paired_difference(x, y, direction=+1, alpha=alpha)
    out["test"] = name
    out["evidence"] = (f"{what}: perplexity {_ppl(results, x):.3f} vs {_ppl(results, y):.3f}; log-likelihood "
                       f"difference {statistics.describe(out, 'nats/document', 3)}")
    out["ppl_a"], out["ppl_b"] = _ppl(results, x), _ppl(results, y)
    return out


def _largest_k(results: Mapping[str, Any]) -> Optional[int]:
    ks = (results.get("config") or {}).get("ks") or []
    return max(ks) if ks else None


PAIRED_DOCUMENTS = "paired bootstrap of the per-document estimated log-likelihood difference"


def judge_tightens_with_k(results: Mapping[str, Any], alpha: float = statistics.ALPHA) -> Dict[str, Any]:
    """The trained proposal's document-level estimate with the largest K minus with K = 1 (claim > 0: more samples
    give a higher estimated likelihood, a tighter bound; Burda et al.'s monotonicity, the paper's Figure 1)."""
    k = _largest_k(results)
    ks = (results.get("config") or {}).get("ks") or []
    return _paired_estimates(results, PAIRED_DOCUMENTS, ("text", "document", k), ("text", "document", min(ks or [1])),
                             f"document level, the trained proposal, K={k} vs K={min(ks or [1])}", alpha)


def judge_token_level_optimistic(results: Mapping[str, Any], alpha: float = statistics.ALPHA) -> Dict[str, Any]:
    """Token-level aggregation minus the document-level estimate, both at the largest K with the trained proposal
    (claim > 0: aggregating per token, finer than the model's latent unit, reports a higher likelihood, a lower
    perplexity, than the valid estimate); the sentence level as a detail."""
    k = _largest_k(results)
    out = _paired_estimates(results, PAIRED_DOCUMENTS, ("text", "token", k), ("text", "document", k),
                            f"K={k}, the trained proposal, token level vs document level", alpha)
    sentence = _estimates(results, "text", "sentence", k)
    if sentence is not None:
        out["ppl_sentence"] = _ppl(results, sentence)
    return out


def judge_flatter_proposal_tighter(results: Mapping[str, Any], alpha: float = statistics.ALPHA) -> Dict[str, Any]:
    """The proposal at the largest temperature minus the trained one (temperature 1), document level at the largest
    K (claim > 0: a flatter proposal, with heavier tails than the posterior, gives the tighter estimate); every
    temperature's perplexity at the smallest and largest K as details."""
    k = _largest_k(results)
    proposals = (results.get("per_document") or {}).get("proposals") or []
    tempered = [p for p in proposals if p.get("gold_weight", 0) == 0 and p.get("temperature", 1.0) > 1.0]
    if not tempered:
        return statistics.untested(PAIRED_DOCUMENTS, "no proposal at a temperature above 1 in this run")
    flattest = max(tempered, key=lambda p: p["temperature"])
    out = _paired_estimates(results, PAIRED_DOCUMENTS, (flattest["label"], "document", k), ("text", "document", k),
                            f"document level, K={k}, temperature {flattest['temperature']:g} vs 1", alpha)
    ks = (results.get("config") or {}).get("ks") or []
    out["by_temperature"] = {
        p["label"]: {str(kk): _ppl(results, _estimates(results, p["label"], "document", kk))
                     for kk in (min(ks), k) if _estimates(results, p["label"], "document", kk) is not None}
        for p in proposals if p.get("gold_weight", 0) == 0}
    return out


def judge_gold_proposal_tighter(results: Mapping[str, Any], alpha: float = statistics.ALPHA) -> Dict[str, Any]:
    """The proposal that sees the gold annotations minus the text-only one, document level at the largest K (claim
    > 0: seeing the annotations tightens the estimate, the promise of the practice the paper measures)."""
    k = _largest_k(results)
    return _paired_estimates(results, PAIRED_DOCUMENTS, ("gold", "document", k), ("text", "document", k),
                             f"document level, K={k}, the proposal seeing the gold annotations vs the text only",
                             alpha)
