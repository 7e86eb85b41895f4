"""The importance-sampling experiments: estimated perplexity against K, per proposal and aggregation level.

Two models. `run_is_eval`: a seeded HMM language model and a corpus drawn from it, whose exact perplexity the forward
algorithm gives (the estimator's check; `templm.models.hmm`). `run_latent_is_eval`: the knowledge-graph LM of
`templm.models.kglm`, a neural latent-variable LM whose marginal has no dynamic programme, trained on the world's
annotated news with its learned proposal, and Logan, Gardner and Singh's measurements on it (the number of samples,
the aggregation level, the proposal's temperature, a proposal that sees the gold annotations) as findings.

The estimate (`templm.metrics.importance_sampling`) is a stochastic upper bound on perplexity; the bound itself is an
expectation: both report exp(-mean_r L_r / N) over independent runs r (disjoint groups of K samples), with the
standard error of that mean from the spread across runs. Both write is_eval.json and return the results dict; the
Markdown report and the figure are `templm.reports.importance_sampling`.
"""

from __future__ import annotations

import math
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import jax
import numpy as np

from templm import console, paths
from templm.errors import check_interrupted, require_memory
from templm.data import linked_mentions as lm
from templm.data.world import WorldConfig, generate_world
from templm.evaluation.latent_lm_perplexity import exact_log_marginals, sample_token_log_weights, truncate_documents
from templm.io import format_duration, write_json
from templm.metrics.findings import IMPORTANCE_SAMPLING, judge
from templm.metrics.importance_sampling import (LEVELS, level_rank, np_logsumexp, unit_log_weights, unit_starts,
                                                unit_statistics)
from templm.models.hmm import forward_log_likelihood, random_hmm, sample_proposal, sample_sequences
from templm.models.kglm import KGLMConfig, parameter_count
from templm.outputs import claim_output_folder

IS_EVAL = "importance-sampling evaluation"  # the kind of output folder (templm.outputs)


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
                peakedness: float = 1.5, overwrite: bool = False) -> Dict[str, Any]:
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
    # The proposals' samples: one Gumbel draw of documents x samples x tokens x states 4-byte floats, and as much
    # again for the paths and weights, checked before anything is allocated.
    require_memory(2.0 * 4 * num_docs * ks[-1] * repeats * doc_length * num_states,
                   f"--ks (largest {ks[-1]:,}) x --repeats {repeats} samples of --num_docs {num_docs} documents of "
                   f"--doc_length {doc_length} tokens over --num_states {num_states} states")
    prob = make_is_eval_problem(seed, num_states, vocab_size, num_docs, doc_length, mean_sentence_length,
                                peakedness)  # checks its sizes before anything is written
    out_dir = claim_output_folder(out_dir, IS_EVAL, overwrite)  # a user's folder refused (outputs.py)
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
    check_interrupted()  # a signal whose exception was dropped during the work: no result is written
    path = write_json(paths.join(out_dir, "is_eval.json"), {"config": config, "rows": rows})
    console.say(f"is-eval: wrote {path} in {format_duration(time.time() - start)}")
    return {"config": config, "rows": rows, "files": {"json": path}}


# --------------------------------------------------------------------------------------------------------------------
# The neural latent-variable LM: the knowledge-graph LM on the embedded world (or a world folder), Logan, Gardner and
# Singh's experiments on it.


def _proposals(temperatures: Sequence[float], gold_weight: float) -> List[Dict[str, Any]]:
    """The trained proposal, each other temperature of it, and the proposal that sees the gold annotations."""
    out = [{"label": "text", "temperature": 1.0, "gold_weight": 0.0}]
    out += [{"label": f"text, tau={t:g}", "temperature": float(t), "gold_weight": 0.0}
            for t in sorted({float(t) for t in temperatures}) if t != 1.0]
    if gold_weight > 0:
        out.append({"label": "gold", "temperature": 1.0, "gold_weight": float(gold_weight)})
    return out


def _per_document(unit_marginals: np.ndarray, level: str, num_docs: int, length: int) -> np.ndarray:
    """[runs, U] unit log-marginals -> [runs, num_docs]: each document's estimate (the sum over its units)."""
    if level == "document":
        return unit_marginals
    return unit_marginals.reshape(unit_marginals.shape[0], num_docs, length).sum(-1)


def run_latent_is_eval(out_dir: str, seed: int = 0, *, world_dir: Optional[str] = None,
                       ks: Sequence[int] = tuple(2 ** i for i in range(8)), repeats: int = 4,
                       temperatures: Sequence[float] = (0.5, 2.0), gold_weight: float = 0.9, test_docs: int = 40,
                       train_steps: int = 400, batch_size: int = 16, learning_rate: float = 3e-3, hidden: int = 64,
                       exact_sentences: int = 2, exact_limit: int = 4096, world: Optional[Any] = None,
                       progress: bool = True, overwrite: bool = False) -> Dict[str, Any]:
    """Logan, Gardner and Singh's measurements on the knowledge-graph LM (templm.models.kglm): the estimate against
    K, aggregated per token, sentence and document side by side, for the trained proposal, the same at each of
    `temperatures`, and a proposal that sees the gold annotations (`gold_weight`); with an exact check on short
    prefixes and the four effects as findings.

    The world: `world_dir` (a `templm data world` folder), else the embedded world drawn from `seed` (`world`: a
    WorldConfig, default the smoke study's size) into out_dir/world. Its last `test_docs` documents are evaluated (the
    latest news: names that appear after the training documents included); the model and the proposal are trained on
    the others, into out_dir/model and out_dir/proposal (resumed when there). Each document gets max(ks) * repeats
    samples of each proposal, cut into disjoint groups of K: each group is one independent estimate, `ppl` is
    exp(-mean over runs of the estimated log-likelihood / tokens) with the standard error from the spread across runs.

    Writes out_dir/is_eval.json ({"config", "rows", "exact_check", "per_document", "findings"}, atomically) and
    returns it with "files".
    """
    # imported here: the trainer brings in TensorFlow (clu's summary writers), which the HMM's experiment never needs
    from templm.training.configs import OptimizerConfig
    from templm.training.kglm_trainer import LinkedDataset, train_latent_lm
    from templm.training.loop import RunOptions

    ks = sorted({int(k) for k in ks})
    if not ks or ks[0] < 1:
        raise ValueError(f"ks must be positive sample counts, got {ks}")
    for name, value, least in (("repeats", repeats, 1), ("test_docs", test_docs, 2), ("train_steps", train_steps, 1),
                               ("batch_size", batch_size, 1), ("exact_sentences", exact_sentences, 0)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
            raise ValueError(f"{name} must be a whole number of at least {least}, got {value!r}")
    if not 0.0 <= gold_weight < 1.0:
        raise ValueError(f"gold_weight must be from 0 to below 1, got {gold_weight!r}")
    for tau in temperatures:
        if not tau > 0:
            raise ValueError(f"temperatures must be > 0, got {tau}")
    start = time.time()
    # Each proposal's token log-weights: samples x test documents x tokens float64 (at least a token a document
    # here; the documents' length is checked once they are read).
    require_memory(8.0 * max(ks) * repeats * test_docs, f"--ks (largest {max(ks):,}) x --repeats {repeats} samples "
                   f"of --test_docs {test_docs} documents")
    out_dir = claim_output_folder(out_dir, IS_EVAL, overwrite)  # a user's folder refused (outputs.py)
    say = console.say if progress else (lambda message: None)

    # --- The world: its graph, its documents linked to it; the latest documents evaluated. -----------------------
    if world_dir is None:
        world = world or WorldConfig(seed=seed, start_year=2014, end_year=2018, subjects_per_relation=8,
                                     docs_per_month=10)
        world_dir = paths.join(out_dir, "world")
        generate_world(world, world_dir)
    graph = lm.read_graph(world_dir)
    news, mentions = lm.read_linked_documents(world_dir)
    if len(news) < test_docs + batch_size:
        raise ValueError(f"{world_dir} holds {len(news)} documents: not enough for {test_docs} test documents and a "
                         f"training batch of {batch_size}")
    vocab = lm.build_vocabulary(news[:-test_docs])
    docs = lm.link_documents(news, mentions, graph, vocab, paths.join(world_dir, "mentions.jsonl"))
    train, test = docs[:-test_docs], docs[-test_docs:]
    shapes = lm.Shapes.covering(docs)
    length = lm.document_batch(test[:1], shapes, graph)["tokens"].shape[1]
    require_memory(8.0 * 2 * max(ks) * repeats * len(test) * length,
                   f"--ks (largest {max(ks):,}) x --repeats {repeats} samples of --test_docs {len(test)} documents of "
                   f"{length} tokens, twice (the weights and their sums by level)")
    config = KGLMConfig(len(vocab), graph.num_entities, graph.num_labels, hidden, hidden, hidden)
    say(f"is-eval: knowledge-graph LM on {world_dir}: {len(train)} training and {len(test)} test documents, "
        f"{graph.num_entities} entities, {len(graph.facts)} facts, vocabulary {len(vocab)}")

    # --- The model and its proposal, each trained on the gold annotations. ------------------------------------
    trained = {}
    for which in ("model", "proposal"):
        trained[which] = train_latent_lm(
            paths.join(out_dir, which), which, config, LinkedDataset(train, graph, shapes, batch_size), train_steps,
            OptimizerConfig(learning_rate=learning_rate, max_grad_norm=1.0), random_seed=seed,
            stats_period=max(1, train_steps // 4), options=RunOptions(progress=progress))
    p_params, q_params = trained["model"].params, trained["proposal"].params

    # --- Samples of each proposal, aggregated at each level, cut into runs of K. ------------------------------
    batch = lm.document_batch(test, shapes, graph)
    counts, seg = batch["length"], batch["sentence"]
    n_tokens = int(counts.sum())
    n_docs, length = batch["tokens"].shape
    proposals = _proposals(temperatures, gold_weight)
    total = ks[-1] * repeats
    rows: List[Dict[str, Any]] = []
    estimates: Dict[str, Dict[str, Dict[str, List[float]]]] = {}
    rate = console.Rate(len(proposals) + 1)
    key = jax.random.PRNGKey(seed + 1)
    for i, proposal in enumerate(proposals):
        lw = sample_token_log_weights(config, p_params, q_params, batch, total, jax.random.fold_in(key, i),
                                      temperature=proposal["temperature"], gold_weight=proposal["gold_weight"])
        estimates[proposal["label"]] = {}
        for level in LEVELS:
            unit_lw, unit_counts = unit_log_weights(lw, counts, level, seg)
            unit_lw, unit_counts = np.asarray(unit_lw, np.float64), np.asarray(unit_counts)
            occupied = unit_counts > 0
            estimates[proposal["label"]][level] = {}
            for k in ks:
                runs = total // k
                st = unit_statistics(unit_lw[: runs * k].reshape(runs, k, -1), unit_counts, np, np_logsumexp)
                lls = st["log_likelihood"]
                mean_ll = float(lls.mean())
                ppl = math.exp(-mean_ll / n_tokens)
                se_ll = float(lls.std(ddof=1) / math.sqrt(runs)) if runs > 1 else float("nan")
                per_doc = _per_document(st["unit_log_marginals"], level, n_docs, length).mean(0)
                estimates[proposal["label"]][level][str(k)] = [float(x) for x in per_doc]
                rows.append({"level": level, "proposal": proposal["label"], "temperature": proposal["temperature"],
                             "gold_weight": proposal["gold_weight"], "K": k, "ppl": ppl,
                             "ppl_se": _finite_or_none(ppl * se_ll / n_tokens),
                             "ppl_mc_se": _finite_or_none(np.mean(st["se_perplexity_mc"])),
                             "ppl_unit_se": _finite_or_none(np.mean(st["se_perplexity_units"])),
                             "log_likelihood": mean_ll,
                             "mean_ess_fraction": float(st["unit_ess"][:, occupied].mean() / k), "runs": runs})
        timing = rate.report(i + 1)
        say(f"is-eval: [{i + 1}/{len(proposals) + 1}] proposal {proposal['label']}: {total} samples a document, "
            f"document-level ppl {rows[-1]['ppl']:.3f} at K={ks[-1]}  ETA {format_duration(timing['eta_sec'])}")

    # --- The exact check: prefixes short enough to sum over every reading. ------------------------------------
    exact_check: Dict[str, Any] = {"sentences": exact_sentences, "limit": exact_limit, "documents": 0, "rows": []}
    if exact_sentences:
        prefixes = truncate_documents(batch, exact_sentences)
        exact = exact_log_marginals(config, p_params, prefixes, exact_limit)
        keep = np.array([x is not None for x in exact])
        if keep.sum() >= 2:
            lw = sample_token_log_weights(config, p_params, q_params, prefixes, total,
                                          jax.random.fold_in(key, len(proposals)))
            doc_lw = lw.sum(-1)[:, keep]  # [S, D]
            tokens = int(prefixes["length"][keep].sum())
            exact_ll = float(np.sum([x for x in exact if x is not None]))
            exact_check.update(documents=int(keep.sum()), tokens=tokens, exact_log_likelihood=exact_ll,
                               exact_ppl=math.exp(-exact_ll / tokens))
            for k in ks:
                runs = total // k
                lls = (np_logsumexp(doc_lw[: runs * k].reshape(runs, k, -1), axis=1) - math.log(k)).sum(-1)
                ppl = math.exp(-float(lls.mean()) / tokens)
                se = float(lls.std(ddof=1) / math.sqrt(runs)) if runs > 1 else float("nan")
                exact_check["rows"].append({"K": k, "ppl": ppl, "ppl_se": _finite_or_none(ppl * se / tokens),
                                            "log_likelihood": float(lls.mean()), "runs": runs})
        timing = rate.report(len(proposals) + 1)
        say(f"is-eval: [{len(proposals) + 1}/{len(proposals) + 1}] exact check on {exact_check['documents']} of "
            f"{n_docs} prefixes of {exact_sentences} sentence(s)")

    results = {
        "config": {"model": "kglm", "seed": seed, "world_dir": paths.absolute(world_dir), "ks": ks,
                   "repeats": repeats, "temperatures": [float(t) for t in temperatures], "gold_weight": gold_weight,
                   "test_docs": test_docs, "train_docs": len(train), "train_steps": train_steps,
                   "batch_size": batch_size, "learning_rate": learning_rate, "hidden": hidden,
                   "num_tokens": n_tokens, "samples_per_proposal": total, "vocab_size": len(vocab),
                   "entities": graph.num_entities, "facts": len(graph.facts), "relation_labels": graph.num_labels,
                   "parameters": {"model": parameter_count(p_params), "proposal": parameter_count(q_params)},
                   "train": {which: trained[which].train for which in trained},
                   "exact_sentences": exact_sentences, "exact_limit": exact_limit},
        "rows": rows, "exact_check": exact_check,
        "per_document": {"ids": [d.id for d in test], "tokens": [len(d) for d in test], "proposals": proposals,
                         "estimates": estimates},
    }
    results["findings"] = judge(results, IMPORTANCE_SAMPLING)
    results["config"]["seconds"] = round(time.time() - start, 3)
    check_interrupted()
    path = write_json(paths.join(out_dir, "is_eval.json"), results)
    say(f"is-eval: wrote {path} in {format_duration(time.time() - start)}")
    return {**results, "files": {"json": path}}
