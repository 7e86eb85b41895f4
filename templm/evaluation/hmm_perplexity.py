"""The perplexity of the toy HMM language model on a corpus: exact (forward algorithm) and importance-sampled.

`exact_hmm_perplexity` is the truth an estimate is checked against; `estimate_hmm_perplexity` draws K samples of a
proposal from the model (`templm.models.hmm`) and forms the estimate at an aggregation level with the estimators of
`templm.metrics.importance_sampling` (whose docstring explains the levels, the upper bound and the standard errors).
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import jax
import jax.numpy as jnp

from templm.metrics.importance_sampling import PerplexityEstimate, level_rank, perplexity_estimate, unit_starts
from templm.models.hmm import HMM, forward_log_likelihood, prepare_inputs, sample_proposal

Array = jax.Array


def exact_hmm_perplexity(hmm: HMM, tokens: Any, token_counts: Optional[Any] = None, latent_level: str = "document",
                         segment_ids: Optional[Any] = None) -> Tuple[Array, Array]:
    """(perplexity, total log p(x)) of the HMM whose chain restarts at every unit of `latent_level`, exactly."""
    _, tok, mask, _ = prepare_inputs(tokens, token_counts, None)
    restarts = unit_starts(latent_level, tok.shape, segment_ids)
    total = forward_log_likelihood(hmm, tok, mask.sum(1), restarts).sum()
    return jnp.exp(-total / mask.sum()), total


def estimate_hmm_perplexity(key: Array, hmm: HMM, tokens: Any, token_counts: Optional[Any] = None, *,
                            num_samples: int, proposal: str = "tempered", temperature: float = 1.0,
                            level: str = "document", segment_ids: Optional[Any] = None,
                            latent_level: Optional[str] = None) -> PerplexityEstimate:
    """End to end: K = `num_samples` samples of `proposal` (at `temperature`), aggregated at `level`.

    The model is the HMM with one latent chain per unit of `latent_level` (default: `level`). `level` must be as
    coarse as `latent_level` or coarser (see `templm.metrics.importance_sampling`); a finer level raises ValueError.
    """
    latent_level = level if latent_level is None else latent_level
    if level_rank(level) < level_rank(latent_level):
        raise ValueError(f"aggregation level {level!r} is finer than the model's latent unit {latent_level!r}: "
                         f"per-{level} estimates do not estimate p(x) for this model")
    _, tok, mask, _ = prepare_inputs(tokens, token_counts, None)
    restarts = unit_starts(latent_level, tok.shape, segment_ids)
    counts = mask.sum(1)
    samples = sample_proposal(key, hmm, tok, num_samples, proposal, temperature, counts, restarts)
    return perplexity_estimate(samples.token_log_weights, counts, level, segment_ids)
