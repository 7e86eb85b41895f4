"""A hidden Markov model language model whose exact marginal is computable, and proposals to sample its latent path.

The toy latent-variable LM behind importance-sampled perplexity (`templm.metrics.importance_sampling`): p(x) =
sum_z p(x, z) is exact here by the forward algorithm (`forward_log_likelihood`, `lax.scan`, log space), so an estimate
can be checked against the truth. Samplers draw z from proposals q(z | x) of several qualities, each with its exact
log q and log p(x, z) per token: the prior (ancestral sampling of the chain), the exact posterior
(forward-filtering backward-sampling, FFBS) and a tempered posterior (`sample_proposal`). A mixture LM (one latent
class per document, per sentence or per token) is the HMM whose transition matrix is the identity (`mixture_lm`).

The chain can RESTART at given positions (`restarts` [B, T], e.g. `unit_starts(level, ...)` of the metrics module):
an HMM restarting at every sentence start has one latent chain per sentence, one restarting at every token an
independent latent per token. Restarts apply to the model and to the proposals alike.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.scipy.special import logsumexp

from templm.metrics.importance_sampling import unit_starts, valid_mask

PROPOSALS = ("prior", "tempered", "posterior")

Array = jax.Array


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


def prepare_inputs(tokens: Any, token_counts: Optional[Any], restarts: Optional[Any]):
    """(single, tokens [B, T] int32, mask [B, T], restarts [B, T]) from tokens [T] or [B, T]: `single` says a lone
    sequence was given (it becomes a batch of one); mask from `token_counts` (None: all real); restarts None: t = 0."""
    tokens = jnp.asarray(tokens, jnp.int32)
    single = tokens.ndim == 1
    tok = tokens[None] if single else tokens
    if tok.ndim != 2:
        raise ValueError(f"tokens must be [T] or [B, T], got shape {tokens.shape}")
    batch, length = tok.shape
    mask = valid_mask(token_counts, batch, length)
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
    single, tok, mask, rs = prepare_inputs(tokens, token_counts, restarts)
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
    single, tok, mask, rs = prepare_inputs(tokens, token_counts, restarts)
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

