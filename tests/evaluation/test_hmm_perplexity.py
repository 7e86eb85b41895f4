"""Tests of templm.evaluation.hmm_perplexity and of the estimators run with the HMM LM: exact with the exact posterior
for every K and sample, an upper bound on perplexity that tightens with K otherwise, and the level checks of
`estimate_hmm_perplexity`.

Every sampling call uses the same shapes ([POOL, 4, 8] samples of a 4-state, 6-word HMM) as the other
importance-sampling tests, so that the samplers compile once per kind; smaller K are slices of a pool.
"""

import math

import jax
import numpy as np
import pytest

from templm.evaluation.hmm_perplexity import estimate_hmm_perplexity, exact_hmm_perplexity
from templm.metrics.importance_sampling import log_marginal_estimate, perplexity_estimate, unit_starts
from templm.models.hmm import forward_log_likelihood, sample_posterior, sample_proposal

S, V, B, T = 4, 6, 4, 8  # the shape of the is_problem fixture (tests/conftest.py)
POOL = 4096


def _restarts(is_problem, latent):
    return unit_starts(latent, (B, T), is_problem["segment_ids"])


# ---------------------------------------------------------------------------------------------------------------------
# The estimator: exact with the exact posterior; an upper bound on perplexity that tightens with K otherwise.


@pytest.mark.parametrize("latent", ["document", "sentence", "token"])
def test_exact_posterior_gives_exact_estimate_for_every_k_and_sample(is_problem, latent):
    hmm, x, counts, seg = is_problem["hmm"], is_problem["tokens"], is_problem["token_counts"], is_problem["segment_ids"]
    restarts = _restarts(is_problem, latent)
    log_p = np.asarray(forward_log_likelihood(hmm, x, counts, restarts))
    s = sample_posterior(jax.random.PRNGKey(11), hmm, x, POOL, counts, restarts)
    # Zero variance: every single weight is p(x).
    np.testing.assert_allclose(np.asarray(s.log_weights), np.broadcast_to(log_p, (POOL, B)), atol=2e-4)
    n_tokens = int(np.asarray(counts).sum())
    for k in (1, 2, 5, 64):
        np.testing.assert_allclose(log_marginal_estimate(s.log_joint[:k], s.log_q[:k], axis=0), log_p, atol=2e-4)
    for k in (1, 64):
        est = perplexity_estimate(s.token_log_weights[:k], counts, latent, seg)
        assert float(est.log_likelihood) == pytest.approx(log_p.sum(), abs=1e-3)
        assert float(est.perplexity) == pytest.approx(math.exp(-log_p.sum() / n_tokens), rel=1e-4)
        if k == 1:
            assert math.isnan(float(est.se_perplexity_mc))  # one sample: no variance estimate
        else:
            assert float(est.se_perplexity_mc) < 1e-3 * float(est.perplexity)
            np.testing.assert_allclose(np.asarray(est.unit_ess)[np.asarray(est.unit_token_counts) > 0], k, rtol=1e-3)


@pytest.mark.parametrize("proposal,tau", [("prior", 1.0), ("tempered", 2.0), ("tempered", 0.5)])
def test_estimate_is_a_lower_bound_on_log_likelihood_that_tightens_with_k(is_problem, proposal, tau):
    hmm, x, counts = is_problem["hmm"], is_problem["tokens"], is_problem["token_counts"]
    log_p = float(forward_log_likelihood(hmm, x, counts).sum())
    s = sample_proposal(jax.random.PRNGKey(5), hmm, x, POOL, proposal, tau, counts, _restarts(is_problem, "document"))
    lw = np.asarray(s.log_weights, np.float64)  # [POOL, B]
    gaps, ses = {}, {}
    for k in (1, 4, 16, 64):
        # POOL / k independent runs of K samples each (disjoint groups of the pool).
        groups = lw.reshape(POOL // k, k, B)
        runs = np.asarray(log_marginal_estimate(groups, 0.0, axis=1), np.float64).sum(-1)
        gaps[k] = log_p - runs.mean()
        ses[k] = runs.std(ddof=1) / math.sqrt(runs.size)
    # Gaps seen here (K = 1, 4, 16, 64): prior 3.77, 1.18, 0.32, 0.10; tempered(2) 2.76, 0.84, 0.22, 0.06;
    # tempered(0.5) 3.40, 1.89, 0.93, 0.40 (sharper than the posterior: worse than the prior at large K), with
    # standard errors 0.03-0.09. Tolerances are 3 standard errors (5 where the claim is "clearly").
    # E[log p^] <= log p: never significantly above the truth; clearly below it at K = 1 (the gap is KL(q || p(z|x))).
    for k in gaps:
        assert gaps[k] > -3 * ses[k], (k, gaps[k], ses[k])
    assert gaps[1] > 5 * ses[1]
    # Monotone in expectation. The K use the same pool, so their estimates are positively correlated and
    # sqrt(se_a^2 + se_b^2) overstates the s.e. of a difference: conservative in both checks below.
    ks = sorted(gaps)
    for a, b in zip(ks, ks[1:]):
        assert gaps[a] - gaps[b] > -3 * math.hypot(ses[a], ses[b]), (a, b, gaps, ses)
    assert gaps[1] - gaps[64] > 5 * math.hypot(ses[1], ses[64])
    # In perplexity: the mean estimate at K = 1 is above the exact perplexity.
    n = int(np.asarray(counts).sum())
    assert math.exp(-(log_p - gaps[1]) / n) > math.exp(-log_p / n)



def test_estimate_hmm_perplexity_levels(is_problem):
    hmm, x, counts, seg = is_problem["hmm"], is_problem["tokens"], is_problem["token_counts"], is_problem["segment_ids"]
    exact, _ = exact_hmm_perplexity(hmm, x, counts, "sentence", seg)
    est = estimate_hmm_perplexity(jax.random.PRNGKey(1), hmm, x, counts, num_samples=POOL, proposal="posterior",
                                      level="document", segment_ids=seg, latent_level="sentence")
    assert float(est.perplexity) == pytest.approx(float(exact), rel=1e-4)
    with pytest.raises(ValueError, match="finer than the model's latent unit"):
        estimate_hmm_perplexity(jax.random.PRNGKey(1), hmm, x, counts, num_samples=POOL, level="token",
                                    latent_level="sentence", segment_ids=seg)
