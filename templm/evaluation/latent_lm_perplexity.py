"""The knowledge-graph LM (templm.models.kglm) on documents: importance-sampled log-weights per token, and the exact
marginal of documents short enough to enumerate.

`sample_token_log_weights` draws the decisions of every document from the proposal and scores them under the model:
the token log-weight of sample k at position t is log p(decision_t, emission_t | everything before) - log
q(decision_t | ...), whose sum over a document is its full log-weight log p(x, z_k) - log q(z_k | x); summed over the
tokens of a sentence (or taken per token) it is what an estimate aggregated at that level uses
(templm.metrics.importance_sampling). A mention's tokens after its first carry 0 (its decision and all its tokens
are charged to its first). `exact_log_marginals` sums p(x, z) over every reading (`enumerate_options`).
"""

from __future__ import annotations

import functools
from typing import Any, Dict, List, Optional

import jax
import jax.numpy as jnp
import numpy as np

from templm.metrics.importance_sampling import np_logsumexp
from templm.models.kglm import (KGLMConfig, KnowledgeGraphLM, MentionProposal, enumerate_options, log_joint_terms,
                                proposal_scan)


@functools.lru_cache(maxsize=8)
def _sampler(config: KGLMConfig, temperature: float, gold_weight: float):
    model, proposal = KnowledgeGraphLM(config), MentionProposal(config)

    def per_doc(p_params, q_params, doc, keys):
        scores = proposal.apply({"params": q_params}, doc, method=MentionProposal.option_scores)

        def one(key):
            draw = proposal_scan(scores, doc, key, temperature=temperature, gold_weight=gold_weight)
            terms = log_joint_terms(model, p_params, doc, draw.options)
            return terms - draw.log_q
        return jax.vmap(one)(keys)  # [S, T]

    # documents [B, ...], keys [B, S] -> [S, B, T]
    return jax.jit(lambda p, q, docs, keys: jnp.swapaxes(jax.vmap(per_doc, in_axes=(None, None, 0, 0))(
        p, q, docs, keys), 0, 1))


def sample_token_log_weights(config: KGLMConfig, p_params: Any, q_params: Any, docs: Dict[str, np.ndarray],
                             num_samples: int, rng: jax.Array, *, temperature: float = 1.0, gold_weight: float = 0.0,
                             doc_chunk: int = 8, sample_chunk: int = 64) -> np.ndarray:
    """[num_samples, B, T] token log-weights (float64) of the documents `docs` (arrays of `document_batch`), drawn in
    chunks of `doc_chunk` documents x `sample_chunk` samples (fixed shapes: one compilation). The samples of document
    b are a function of (rng, b) only."""
    sampler = _sampler(config, float(temperature), float(gold_weight))
    b_total, t_len = docs["tokens"].shape
    out = np.zeros((num_samples, b_total, t_len), np.float64)
    doc_keys = jax.random.split(rng, b_total)
    for start in range(0, b_total, doc_chunk):
        rows = list(range(start, min(start + doc_chunk, b_total)))
        pad = np.array(rows + [rows[-1]] * (doc_chunk - len(rows)))
        chunk = {k: jnp.asarray(v[pad]) for k, v in docs.items()}
        for s in range(0, num_samples, sample_chunk):
            keys = jax.vmap(lambda key: jax.random.split(jax.random.fold_in(key, s), sample_chunk))(doc_keys[pad])
            lw = np.asarray(sampler(p_params, q_params, chunk, keys), np.float64)  # [S, B, T]
            take = min(sample_chunk, num_samples - s)
            out[s:s + take, start:start + len(rows)] = lw[:take, :len(rows)]
    return out


@functools.lru_cache(maxsize=4)
def _scorer(config: KGLMConfig):
    model = KnowledgeGraphLM(config)
    return jax.jit(lambda params, doc, options: jax.vmap(
        lambda o: log_joint_terms(model, params, doc, o).sum())(options))


def exact_log_marginals(config: KGLMConfig, p_params: Any, docs: Dict[str, np.ndarray], limit: int = 4096,
                        chunk: int = 256) -> List[Optional[float]]:
    """log p(x) of each document, summed over every reading (None for a document with more than `limit`)."""
    scorer = _scorer(config)
    out: List[Optional[float]] = []
    for b in range(docs["tokens"].shape[0]):
        doc = {k: v[b] for k, v in docs.items()}
        paths = enumerate_options(doc, limit)
        if paths is None:
            out.append(None)
            continue
        jdoc = {k: jnp.asarray(v) for k, v in doc.items()}
        n = len(paths)
        padded = np.concatenate([paths, np.repeat(paths[:1], (-n) % chunk, 0)]) if n % chunk else paths
        scores = np.concatenate([np.asarray(scorer(p_params, jdoc, jnp.asarray(padded[i:i + chunk])), np.float64)
                                 for i in range(0, len(padded), chunk)])[:n]
        out.append(float(np_logsumexp(scores, axis=0)))
    return out


def truncate_documents(docs: Dict[str, np.ndarray], sentences: int) -> Dict[str, np.ndarray]:
    """The same batch with each document cut after its first `sentences` sentences (a shorter prefix whose readings
    can be enumerated); candidates whose name runs past the cut are dropped, the gold decisions kept."""
    out = {k: v.copy() for k, v in docs.items()}
    t_len = docs["tokens"].shape[1]
    positions = np.arange(t_len)[None]
    keep = (positions < docs["length"][:, None]) & (docs["sentence"] < sentences)
    length = keep.sum(1).astype(np.int32)
    out["length"] = length
    past = positions >= length[:, None]
    out["tokens"][past] = 0
    ends = positions[..., None] + docs["cand_length"]
    drop = (ends > length[:, None, None]) | past[..., None]
    out["cand_entity"][drop] = -1
    out["cand_length"][drop] = 0
    out["pair_parent"][drop] = -1
    out["pair_label"][drop] = -1
    # a gold mention that no longer fits is read as words
    for b, t in zip(*np.nonzero((docs["gold_kind"] >= 1) & (docs["gold_kind"] <= 2))):
        c = docs["gold_cand"][b, t]
        if drop[b, t, c]:
            span = slice(t, t + docs["cand_length"][b, t, c])
            out["gold_kind"][b, span], out["gold_cand"][b, span], out["gold_pair"][b, span] = 0, -1, -1
    out["gold_kind"][past] = -1
    return out
