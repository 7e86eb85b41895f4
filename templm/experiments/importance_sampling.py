"""The importance-sampling experiment: estimated perplexity against K, per proposal and aggregation level, with the
exact value, on a seeded HMM language model and a corpus drawn from it.

The estimate (`templm.metrics.importance_sampling`) is a stochastic upper bound on perplexity; the bound itself is an
expectation: `run_is_eval` reports exp(-mean_r L_r / N) over independent runs r (disjoint groups of K samples), with
the standard error of that mean from the spread across runs. The model and its proposals are `templm.models.hmm`.

`run_is_eval` writes is_eval.json and returns the results dict; the Markdown table and the figure are
`templm.reports.importance_sampling.write_is_report`.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import jax
import numpy as np

from templm import console
from templm.io import format_duration, write_json
from templm.metrics.importance_sampling import (LEVELS, level_rank, np_logsumexp, unit_log_weights, unit_starts,
                                                unit_statistics)
from templm.models.hmm import forward_log_likelihood, random_hmm, sample_proposal, sample_sequences


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
    for name, value, least in (("num_states", num_states, 1), ("vocab_size", vocab_size, 1), ("num_docs", num_docs, 1),
                               ("doc_length", doc_length, 2)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
            raise ValueError(f"{name} must be a whole number of at least {least}, got {value!r}")
    if not mean_sentence_length >= 1.0:
        raise ValueError(f"mean_sentence_length must be at least 1 token, got {mean_sentence_length!r}")
    if not 0 < peakedness < float("inf"):
        raise ValueError(f"peakedness must be a finite number above 0, got {peakedness!r}")
    rng = np.random.default_rng(seed)
    hmm = random_hmm(rng, num_states, vocab_size, peakedness)
    tokens, _ = sample_sequences(rng, hmm, num_docs, doc_length)
    counts = rng.integers(max(1, doc_length // 2), doc_length + 1, size=num_docs).astype(np.int32)
    boundary = rng.random((num_docs, doc_length)) < 1.0 / mean_sentence_length
    boundary[:, 0] = False
    segment_ids = np.cumsum(boundary, axis=1).astype(np.int32)
    return {"hmm": hmm, "tokens": tokens, "token_counts": counts, "segment_ids": segment_ids}


def run_is_eval(out_dir: str, seed: int = 0, *, ks: Sequence[int] = tuple(2 ** i for i in range(9)),
                temperatures: Sequence[float] = (0.5, 2.0), repeats: int = 8, num_states: int = 6,
                vocab_size: int = 12, num_docs: int = 12, doc_length: int = 24, mean_sentence_length: float = 6.0,
                peakedness: float = 1.5) -> Dict[str, Any]:
    """Estimated perplexity against K for every proposal and aggregation level, with the exact value.

    For each latent unit m (token, sentence, document: the HMM of `make_is_eval_problem` with its chain restarting at
    every unit of m), the exact perplexity comes from the forward algorithm. For each proposal (prior, tempered
    posterior at each of `temperatures`, exact posterior) max(ks) * repeats samples per document are drawn once and
    cut into disjoint groups of K: each group is one independent run. Each valid level (as coarse as m or coarser)
    aggregates them. Rows (dicts): latent, level, proposal, temperature, K, ppl, ppl_se, ppl_mc_se, ppl_unit_se,
    log_likelihood, exact_ppl, exact_log_likelihood, mean_ess_fraction, runs; plus one row per latent unit with
    proposal "exact" (level "-", K None) holding the forward-algorithm value.

    Writes out_dir/is_eval.json ({"config", "rows"}, atomically) and says one progress line per latent unit and
    proposal. Returns {"config", "rows", "files": {"json": path}}.
    """
    ks = sorted({int(k) for k in ks})
    if not ks or ks[0] < 1:
        raise ValueError(f"ks must be positive sample counts, got {ks}")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    for tau in temperatures:
        if not tau > 0:
            raise ValueError(f"temperatures must be > 0, got {tau}")
    start = time.time()
    prob = make_is_eval_problem(seed, num_states, vocab_size, num_docs, doc_length, mean_sentence_length,
                                peakedness)  # checks its sizes before anything is written
    os.makedirs(out_dir, exist_ok=True)
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
    num_blocks = len(LEVELS) * len(proposals)
    rate = console.Rate(num_blocks)
    console.say(f"is-eval: {num_blocks} blocks (latent unit x proposal) of {total_samples} samples per document, "
                f"{num_docs} documents, K up to {ks[-1]}")

    rows: List[Dict[str, Any]] = []
    key = jax.random.PRNGKey(seed + 1)
    block = 0
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
            for level in LEVELS[level_rank(latent):]:
                unit_lw, unit_counts = unit_log_weights(token_lw, counts, level, seg)
                unit_lw = np.asarray(unit_lw, np.float64)
                unit_counts = np.asarray(unit_counts)
                occupied = unit_counts > 0
                for k in ks:
                    runs = total_samples // k
                    grouped = unit_lw[: runs * k].reshape(runs, k, -1)
                    st = unit_statistics(grouped, unit_counts, np, np_logsumexp)
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
            block += 1
            timing = rate.report(block)
            console.say(f"is-eval: [{block}/{num_blocks}] latent={latent} proposal={label} done  "
                        f"ETA {format_duration(timing['eta_sec'])}")

    config["seconds"] = round(time.time() - start, 3)
    path = write_json(os.path.join(out_dir, "is_eval.json"), {"config": config, "rows": rows})
    console.say(f"is-eval: wrote {path} in {format_duration(time.time() - start)}")
    return {"config": config, "rows": rows, "files": {"json": path}}
