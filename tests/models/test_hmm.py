"""Tests of templm.models.hmm: the forward algorithm against enumeration, the mixture LM against its closed form, and
the proposals (their samples against the distributions they claim, with the exact log q).

Every sampling call uses the same shapes ([POOL, 4, 8] samples of a 4-state, 6-word HMM) as the other
importance-sampling tests, so that the samplers compile once per kind; smaller K are slices of a pool.
"""

import itertools
import math

import jax
import numpy as np
import pytest

from templm.metrics.importance_sampling import unit_starts
from templm.models.hmm import (forward_log_likelihood, mixture_lm, sample_proposal, sample_tempered_posterior,
                               tempered)

S, V, B, T = 4, 6, 4, 8  # the shape of the is_problem fixture (tests/conftest.py)
POOL = 4096


def _restarts(is_problem, latent):
    return unit_starts(latent, (B, T), is_problem["segment_ids"])


def _enumerate(hmm, tokens, length, restarts):
    """All S**length paths of one sequence with log p(x, z) and log p(z), by enumeration in float64."""
    li, lt, le = (np.asarray(a, np.float64) for a in hmm)
    paths = np.array(list(itertools.product(range(S), repeat=length)), dtype=np.int64)  # lexicographic order
    log_prior = li[paths[:, 0]].copy()
    log_emit = le[paths[:, 0], tokens[0]].copy()
    for t in range(1, length):
        log_prior += li[paths[:, t]] if restarts[t] else lt[paths[:, t - 1], paths[:, t]]
        log_emit += le[paths[:, t], tokens[t]]
    return paths, log_prior + log_emit, log_prior


def _logsumexp(a):
    m = np.max(a)
    return m + np.log(np.sum(np.exp(a - m)))


# ---------------------------------------------------------------------------------------------------------------------
# The HMM LM: forward algorithm.


@pytest.mark.parametrize("latent", ["document", "sentence", "token"])
def test_forward_matches_enumeration(is_problem, latent):
    hmm, tokens, counts = is_problem["hmm"], np.asarray(is_problem["tokens"]), np.asarray(is_problem["token_counts"])
    restarts = np.asarray(_restarts(is_problem, latent))
    got = np.asarray(forward_log_likelihood(hmm, tokens, counts, restarts))
    for b in range(B):
        _, lj, _ = _enumerate(hmm, tokens[b], counts[b], restarts[b])
        assert got[b] == pytest.approx(_logsumexp(lj), abs=1e-4)
    # One sequence [T] without counts: the full length, one chain.
    _, lj, _ = _enumerate(hmm, tokens[0], T, np.zeros(T, bool))
    assert float(forward_log_likelihood(hmm, tokens[0])) == pytest.approx(_logsumexp(lj), abs=1e-4)


def test_mixture_lm_is_a_closed_form():
    # One class per document: p(x) = sum_c prior_c prod_t emit[c, x_t]; one class per sentence: the product over
    # sentences of that sum.
    prior = np.log(np.array([0.2, 0.5, 0.3]))
    emit = np.log(np.array([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8], [1 / 3, 1 / 3, 1 / 3]]))
    hmm = mixture_lm(prior, emit)
    x = np.array([[0, 2, 2, 1, 0]])
    per_class = lambda xs: np.exp(prior) * np.prod(np.exp(emit[:, xs]), axis=1)
    doc = math.log(per_class(x[0]).sum())
    assert float(forward_log_likelihood(hmm, x)[0]) == pytest.approx(doc, abs=1e-5)
    seg = np.array([[0, 0, 1, 1, 1]])
    sent = math.log(per_class(x[0, :2]).sum()) + math.log(per_class(x[0, 2:]).sum())
    restarts = unit_starts("sentence", (1, 5), seg)
    assert float(forward_log_likelihood(hmm, x, None, restarts)[0]) == pytest.approx(sent, abs=1e-5)


# ---------------------------------------------------------------------------------------------------------------------
# The proposals: samples from the distribution they claim, with the exact log q.


@pytest.mark.parametrize("proposal,tau", [("prior", 1.0), ("posterior", 1.0), ("tempered", 2.0), ("tempered", 0.4)])
def test_samplers_match_their_claimed_distribution(is_problem, proposal, tau):
    # One 3-token sequence (document 0's first tokens) copied into all 4 rows, chain restart at position 2: the
    # 64 paths are enumerable, and 4 * POOL = 16384 samples give frequencies to compare with q.
    hmm = is_problem["hmm"]
    x = np.tile(np.asarray(is_problem["tokens"])[:1], (B, 1))
    counts = np.full(B, 3)
    restarts = np.zeros((B, T), bool)
    restarts[:, 2] = True
    paths, lj, lprior = _enumerate(hmm, x[0], 3, restarts[0])
    if proposal == "prior":
        log_q = lprior
    else:
        log_q = lj / tau - _logsumexp(lj / tau)  # the tempered posterior; tau = 1: the posterior
    s = sample_proposal(jax.random.PRNGKey(7), hmm, x, POOL, proposal, tau, counts, restarts)
    z = np.asarray(s.z)
    assert z.shape == (POOL, B, T) and np.all(z[:, :, 3:] == 0)  # padding
    idx = (z[:, :, 0] * S * S + z[:, :, 1] * S + z[:, :, 2]).reshape(-1)
    np.testing.assert_allclose(np.asarray(s.log_q).reshape(-1), log_q[idx], atol=2e-4)
    np.testing.assert_allclose(np.asarray(s.log_joint).reshape(-1), lj[idx], atol=2e-4)
    n = idx.size
    freq = np.bincount(idx, minlength=S ** 3) / n
    q = np.exp(log_q)
    assert q.sum() == pytest.approx(1.0, abs=1e-6)
    # 5 binomial standard errors per path (plus a floor for paths of probability ~0): 64 paths, no false alarm.
    assert np.all(np.abs(freq - q) <= 5 * np.sqrt(q * (1 - q) / n) + 2e-4)


def test_tempered_log_q_is_the_scaled_joint_minus_its_normaliser(is_problem):
    hmm, x, counts = is_problem["hmm"], is_problem["tokens"], is_problem["token_counts"]
    tau = 2.0
    s = sample_tempered_posterior(jax.random.PRNGKey(3), hmm, x, POOL, tau, counts, _restarts(is_problem, "document"))
    log_z_tau = forward_log_likelihood(tempered(hmm, tau), x, counts)
    np.testing.assert_allclose(s.log_q[:64], s.log_joint[:64] / tau - log_z_tau[None], atol=2e-4)
