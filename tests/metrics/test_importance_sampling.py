"""Tests of templm.metrics.importance_sampling: the estimators on log-weights (any batch shape and axis, under jit; K
split over batches, folded in a scan, merged), the aggregation levels and the standard errors on hand-made
log-weights.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from templm.metrics.importance_sampling import (LEVELS, StreamingEstimator, bootstrap_standard_error,
                                                combine_sample_batches, log_marginal_estimate, perplexity_estimate,
                                                perplexity_from_unit_log_weights, unit_starts)
from templm.models.hmm import sample_prior

S, V, B, T = 4, 6, 4, 8  # the shape of the is_problem fixture (tests/conftest.py)
POOL = 4096


def _restarts(is_problem, latent):
    return unit_starts(latent, (B, T), is_problem["segment_ids"])


def _logsumexp(a):
    m = np.max(a)
    return m + np.log(np.sum(np.exp(a - m)))


# ---------------------------------------------------------------------------------------------------------------------
# Estimators on log-weights.


def test_log_marginal_estimate_any_batch_shape_any_axis_under_jit():
    rng = np.random.default_rng(0)
    lj, lq = rng.normal(size=(2, 5, 3)) * 3, rng.normal(size=(2, 5, 3))
    expected = np.log(np.mean(np.exp(lj - lq), axis=1))
    got = jax.jit(log_marginal_estimate, static_argnames="axis")(lj, lq, axis=1)
    assert got.shape == (2, 3)
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    np.testing.assert_allclose(log_marginal_estimate(np.moveaxis(lj, 1, -1), np.moveaxis(lq, 1, -1)), expected,
                               rtol=1e-5)
    # A zero-weight sample just contributes nothing.
    assert float(log_marginal_estimate(np.array([0.0, -np.inf]), 0.0)) == pytest.approx(math.log(0.5))


def _reference_defect(batches):
    """The defect of the reference implementation: log of the per-batch sample count instead of log K."""
    all_lw = np.concatenate(batches, axis=-1)
    return _logsumexp(all_lw) - math.log(batches[-1].shape[-1])


def test_k_split_over_batches_equals_one_batch(is_problem):
    hmm, x, counts = is_problem["hmm"], is_problem["tokens"], is_problem["token_counts"]
    s = sample_prior(jax.random.PRNGKey(9), hmm, x, POOL, counts, _restarts(is_problem, "document"))
    lw = np.asarray(s.log_weights[:12]).T  # [B, 12]: widely spread prior weights, samples on the last axis
    one = np.asarray(log_marginal_estimate(lw, 0.0))
    for sizes in ([4, 4, 4], [5, 3, 4], [1] * 12, [11, 1]):
        batches = np.split(lw, np.cumsum(sizes)[:-1], axis=-1)
        np.testing.assert_allclose(combine_sample_batches(batches), one, atol=1e-5)
    # Under jit, folding the batches in a scan, and merging two partial estimators (e.g. from two devices).
    @jax.jit
    def fold(chunks):  # chunks [3, B, 4]
        def step(est, c):
            return est.update(c), None
        est, _ = jax.lax.scan(step, StreamingEstimator.init((B,)), chunks)
        return est
    est = fold(jnp.stack(np.split(lw, 3, axis=-1)))
    assert int(est.num_samples) == 12
    np.testing.assert_allclose(est.log_marginal(), one, atol=1e-5)
    a = StreamingEstimator.init((B,)).update(lw[:, :7])
    b = StreamingEstimator.init((B,)).update_from(lw[:, 7:], np.zeros_like(lw[:, 7:]))
    np.testing.assert_allclose(b.merge(a).log_marginal(), one, atol=1e-5)
    ess = np.exp(2 * _logsumexp_rows(lw) - _logsumexp_rows(2 * lw))
    np.testing.assert_allclose(a.merge(b).effective_sample_size(), ess, rtol=1e-4)
    # The reference defect fails this test: with 12 samples in 3 batches of 4 it returns
    # logsumexp(all 12) - log 4 = (logsumexp(all 12) - log 12) + log 3, i.e. every log p^ too high by log 3 ~ 1.10
    # (a perplexity too low by a factor 3^(1/N)), far outside the 1e-5 tolerance used above.
    defective = np.array([_reference_defect(np.split(row, 3)) for row in lw])
    np.testing.assert_allclose(defective - one, math.log(3), atol=1e-5)
    assert np.all(np.abs(defective - one) > 1.0)


def _logsumexp_rows(a):
    return np.array([_logsumexp(r) for r in a])


# ---------------------------------------------------------------------------------------------------------------------
# Aggregation levels and standard errors, on hand-made log-weights.


def test_aggregation_levels_on_hand_made_weights():
    # Document 0: 4 tokens, sentences [0, 0 | 1, 1], K = 2 samples with weights (not logs)
    #   sample 0: 1 2 | 4 1      sample 1: 3 1 | 1 2
    #   token level:    means per token 2, 1.5, 2.5, 1.5        -> log(2 * 1.5 * 2.5 * 1.5) = log 11.25
    #   sentence level: products 2, 4 and 3, 2; means 2.5, 3    -> log 7.5
    #   document level: products 8 and 6; mean 7                 -> log 7
    # Document 1: 2 real tokens, sentences [0 | 1], then 2 padding positions holding garbage (log-weight 50, NaN)
    #   sample 0: 2 1    sample 1: 4 1   -> log 3 at every level (token means 3, 1; product means (2 + 4) / 2 = 3)
    w = np.array([[[1, 2, 4, 1], [2, 1, 1, 1]],
                  [[3, 1, 1, 2], [4, 1, 1, 1]]], dtype=np.float64)
    lw = np.log(w)
    lw[:, 1, 2] = 50.0
    lw[:, 1, 3] = np.nan
    counts = np.array([4, 2])
    seg = np.array([[0, 0, 1, 1], [7, 3, 3, 3]])  # ids are labels: only changes between neighbours matter
    expected = {"token": math.log(11.25), "sentence": math.log(7.5), "document": math.log(7.0)}
    units = {"token": 6, "sentence": 4, "document": 2}
    for level, l0 in expected.items():
        est = perplexity_estimate(lw, counts, level, seg)
        total = l0 + math.log(3.0)
        assert float(est.log_likelihood) == pytest.approx(total, abs=1e-5), level
        assert float(est.perplexity) == pytest.approx(math.exp(-total / 6), rel=1e-5), level
        assert float(est.num_tokens) == 6 and int(est.num_units) == units[level] and int(est.num_samples) == 2
    # K = 1: the levels coincide (no averaging happens anywhere).
    ones = [float(perplexity_estimate(lw[:1], counts, level, seg).log_likelihood) for level in LEVELS]
    assert ones == pytest.approx([math.log(1 * 2 * 4 * 1 * 2 * 1)] * 3, abs=1e-5)
    with pytest.raises(ValueError, match="sentence level needs segment_ids"):
        perplexity_estimate(lw, counts, "sentence")
    with pytest.raises(ValueError, match="unknown aggregation level 'paragraph'"):
        perplexity_estimate(lw, counts, "paragraph")


def test_standard_errors_on_a_hand_made_case():
    # Two units, K = 2. Unit 0 (1 token): weights 1, 3. Unit 1 (3 tokens): weights 2, 2.
    #   log p^ = log 2 for both; L = 2 log 2; N = 4; ppl = 2^(-1/2).
    #   MC (delta method): unit 0 normalised weights 0.5, 1.5, unbiased variance 0.5, / K = 0.25 -> se 0.5; unit 1: 0.
    #     ESS: (1 + 3)^2 / (1 + 9) = 1.6 and 2; (K / ESS - 1) / (K - 1) = 0.25 and 0.
    #     se(L) = 0.5, se(ppl) = ppl * 0.5 / 4.
    #   Units (ratio estimator): r = L / N = log 2 / 2; residuals l_u - r n_u = +log 2 / 2, -log 2 / 2;
    #     se(r)^2 = U / (U - 1) * sum(res^2) / N^2 = 2 * (log 2)^2 / 2 / 16 -> se(r) = log 2 / 4; se(ppl) = ppl * se(r).
    unit_lw = np.log(np.array([[1.0, 2.0], [3.0, 2.0]]))
    counts = np.array([1, 3])
    est = perplexity_from_unit_log_weights(unit_lw, counts)
    ppl = 2 ** -0.5
    assert float(est.perplexity) == pytest.approx(ppl, rel=1e-6)
    np.testing.assert_allclose(est.unit_ess, [1.6, 2.0], rtol=1e-6)
    assert float(est.se_log_likelihood_mc) == pytest.approx(0.5, rel=1e-5)
    assert float(est.se_perplexity_mc) == pytest.approx(ppl * 0.5 / 4, rel=1e-5)
    assert float(est.se_perplexity_units) == pytest.approx(ppl * math.log(2) / 4, rel=1e-5)
    # Equal token counts: the across-unit s.e. is the standard error of the mean of the per-unit estimates.
    est2 = perplexity_from_unit_log_weights(np.log([[1.0, 8.0], [3.0, 8.0]]), np.array([1, 1]))
    l_units = np.array([math.log(2), math.log(8)])
    se_mean = l_units.std(ddof=1) / math.sqrt(2)
    assert float(est2.se_perplexity_units) == pytest.approx(float(est2.perplexity) * se_mean, rel=1e-5)
    # A single unit: no across-unit s.e.
    assert math.isnan(float(perplexity_from_unit_log_weights(unit_lw[:, :1], counts[:1]).se_perplexity_units))
    # Bootstrap over the samples of unit 0: the replicate log-means are log 1, log 3 (each 1/4), log 2 (1/2); unit 1 is
    # constant. Its exact standard deviation, against 4000 replicates (relative s.e. of an s.d. ~ 1 / sqrt(2 * 4000)).
    vals, probs = np.log([1.0, 3.0, 2.0]), np.array([0.25, 0.25, 0.5])
    sd = math.sqrt(probs @ vals ** 2 - (probs @ vals) ** 2)
    boot = bootstrap_standard_error(jax.random.PRNGKey(0), unit_lw, counts, num_bootstrap=4000)
    assert float(boot["se_log_likelihood"]) == pytest.approx(sd, rel=0.06)
    assert float(boot["se_perplexity"]) > 0
