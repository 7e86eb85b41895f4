"""The analyses of a streaming-perplexity run ("Mind the Gap", Lazaridou et al.) as pure numbers.

Every function here takes a test stream (templm.data.token_stream.TokenStream) and the log-probabilities a model gave
its targets (templm.evaluation.stream_eval.evaluate_stream), and returns numbers; nothing here runs a model or writes
a file (the topic and part-of-speech labels come from templm.data.stream_annotations):

  * `month_perplexities`: perplexity per test month and overall, subword and word level;
  * `relative_increase`: (ppl_TS - ppl_CTL) / ppl_CTL per month and its least-squares slope per month (Figure 1);
  * `emerging_words`: frequent test words unseen or much rarer in training, and `word_group_perplexity` over them;
  * `occurrence_table`: first versus later occurrences of a word in a document, split by whether the earlier
    occurrence is still in the model's context (segment + memory);
  * `topic_perplexity`: perplexity per LDA topic of the documents (templm.data.stream_annotations.assign_topics);
  * `pos_perplexity`: perplexity per part of speech (stream_annotations.pos_tags), only when spaCy and an English
    model are installed.

`stream_results` gathers all of them into one JSON-able dict (what `templm stream` writes as results.json and
templm.reports.stream turns into report.md and figures); `summarize` keeps its headline numbers and
`judge_gap`, `judge_growth`, `judge_dynamic`, `judge_dynamic_slope` and `judge_size_slope` (with a larger
TIME-STRATIFIED run, LARGER_MODEL_RUN) test the study's expected streaming findings on them (registered in
templm.metrics.findings). The usual recipe:

    stream = build_stream(test_docs, processor)
    lp = {"time_stratified": {"static": evaluate_stream(model, ts_params, stream),
                              "dynamic": evaluate_stream(model, ts_params, stream, rule="sgd", lr=...)},
          "control": {"static": evaluate_stream(model, ctl_params, stream)}}
    results = stream_results(stream, lp, seg_len=T, mem_len=M, train_counts=word_counts(train_docs))

Both models must share the vocabulary (one stream serves both); the relative increase is computed at word level.
"""

from __future__ import annotations

import collections
import math
from typing import Any, Collection, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from templm.data.stream_annotations import assign_topics, pos_tags
from templm.data.token_stream import TokenStream, month_number, part_length, stream_word_counts
from templm.io import jsonable
from templm.metrics import statistics

# ----------------------------------------------------------------------------------------------------------------
# Aggregation.


def perplexity(log_prob_sum: float, count: int) -> float:
    """exp(-sum / count); nan for count 0."""
    return float(math.exp(-log_prob_sum / count)) if count else float("nan")


def word_log_probs(stream: TokenStream, token_log_probs: Any) -> np.ndarray:
    """Per-word log-probabilities [W]: the sum of each word's pieces (0 for a word without pieces)."""
    lp = np.asarray(token_log_probs, np.float64).reshape(-1)
    if lp.shape != (stream.n_targets,):
        raise ValueError(f"expected {stream.n_targets} token log-probs, got {lp.shape}")
    return np.bincount(stream.token_word, weights=lp, minlength=stream.n_words)


def moses_words(stream: TokenStream) -> np.ndarray:
    """The indices of the stream's Moses words: every word but the EOS words."""
    return np.flatnonzero(~np.asarray(stream.word_is_eos, bool))


def moses_word_log_probs(stream: TokenStream, token_log_probs: Any) -> Tuple[np.ndarray, np.ndarray]:
    """(log-probabilities of the stream's Moses words, their word indices): `word_log_probs` without the EOS words,
    as "Mind the Gap" computes word perplexity over the test's Moses tokens only (an EOS piece counts in subword
    perplexity, not in word perplexity)."""
    keep = moses_words(stream)
    return word_log_probs(stream, token_log_probs)[keep], keep


def group_perplexity(log_probs: Any, groups: Sequence[Any]) -> Dict[Any, Dict[str, float]]:
    """{group: {"ppl", "n"}} of log-probs by group label (labels sorted)."""
    lp = np.asarray(log_probs, np.float64).reshape(-1)
    groups = np.asarray(groups)
    out = {}
    for g in sorted(set(groups.tolist())):
        sel = groups == g
        out[g] = {"ppl": perplexity(float(lp[sel].sum()), int(sel.sum())), "n": int(sel.sum())}
    return out


def month_perplexities(stream: TokenStream, token_log_probs: Any) -> Dict[str, Any]:
    """Perplexity overall and per month, subword level (every target, EOS included) and word level (Moses words
    only, `moses_word_log_probs`): {"overall": {...}, "by_month": {month: {...}}}, each {"subword_ppl", "word_ppl",
    "n_tokens", "n_words"}."""
    tok = np.asarray(token_log_probs, np.float64).reshape(-1)
    wlp, words = moses_word_log_probs(stream, tok)
    months = np.asarray(stream.doc_months, dtype=object)
    by_token = group_perplexity(tok, months[stream.token_doc])
    by_word = group_perplexity(wlp, months[stream.word_doc[words]])
    by_month = {}
    for m in stream.months:
        t = by_token.get(m, {"ppl": float("nan"), "n": 0})
        w = by_word.get(m, {"ppl": float("nan"), "n": 0})
        by_month[m] = {"subword_ppl": t["ppl"], "word_ppl": w["ppl"], "n_tokens": t["n"], "n_words": w["n"]}
    overall = {"subword_ppl": perplexity(float(tok.sum()), len(tok)),
               "word_ppl": perplexity(float(wlp.sum()), len(wlp)), "n_tokens": len(tok), "n_words": len(wlp)}
    return {"overall": overall, "by_month": by_month}


def relative_increase(ts_by_month: Mapping[str, float], ctl_by_month: Mapping[str, float]
                      ) -> Tuple[Dict[str, float], float, float]:
    """Relative perplexity increase of TIME-STRATIFIED over CONTROL per month, (ts - ctl) / ctl, over the months
    both have, and the least-squares line through it: (per_month, slope per month, intercept at the first month).

    x is the number of months since the first common month (gaps count). With one month the slope is nan and the
    intercept that month's value; with none both are nan.
    """
    months = sorted(set(ts_by_month) & set(ctl_by_month), key=month_number)
    per_month = {m: (float(ts_by_month[m]) - float(ctl_by_month[m])) / float(ctl_by_month[m]) for m in months}
    if not months:
        return per_month, float("nan"), float("nan")
    if len(months) == 1:
        return per_month, float("nan"), per_month[months[0]]
    x = np.array([month_number(m) - month_number(months[0]) for m in months], np.float64)
    y = np.array([per_month[m] for m in months], np.float64)
    slope, intercept = np.polyfit(x, y, 1)
    return per_month, float(slope), float(intercept)


# ----------------------------------------------------------------------------------------------------------------
# Analyses.


def emerging_words(train_counts: Mapping[str, int], test_counts: Mapping[str, int], min_test_count: int = 50,
                   ratio: float = 5.0) -> List[str]:
    """Words with at least `min_test_count` test occurrences that are unseen in training or whose relative
    frequency in training is at least `ratio` times lower than in the test data; most frequent first (ties by word).
    """
    train_total = sum(train_counts.values())
    test_total = sum(test_counts.values())
    out = []
    for word, n in test_counts.items():
        if n < min_test_count:
            continue
        m = train_counts.get(word, 0)
        if m == 0 or (n / test_total) >= ratio * (m / train_total):
            out.append(word)
    return sorted(out, key=lambda w: (-test_counts[w], w))


def word_group_perplexity(stream: TokenStream, word_lp: Any, words: Collection[str]) -> Dict[str, Any]:
    """Word-level perplexity over every occurrence of `words` together and per word: {"overall": {"ppl", "n"},
    "per_word": {word: {"ppl", "n"}}}."""
    wanted = set(words)
    wlp = np.asarray(word_lp, np.float64)
    sel = np.fromiter((w in wanted for w in stream.word_text), dtype=bool, count=stream.n_words)
    sel &= ~stream.word_is_eos
    texts = np.asarray(stream.word_text, dtype=object)
    per_word = group_perplexity(wlp[sel], texts[sel]) if sel.any() else {}
    return {"overall": {"ppl": perplexity(float(wlp[sel].sum()), int(sel.sum())), "n": int(sel.sum())},
            "per_word": {w: per_word.get(w, {"ppl": float("nan"), "n": 0}) for w in words}}


def context_start(target: Any, *, seg_len: int, mem_len: int, part_len: int) -> np.ndarray:
    """The earliest target index whose token the model sees when it predicts `target` (vectorised).

    Target i of part b (i in [b*part_len, (b+1)*part_len)), at offset t = (i - b*part_len) % seg_len in its segment,
    attends to the inputs from max(b*part_len, i - t - mem_len) to i; input k is the token of target k - 1.
    """
    i = np.asarray(target, np.int64)
    part_start = (i // part_len) * part_len
    t = (i - part_start) % seg_len
    return np.maximum(part_start, i - t - mem_len) - 1


OCCURRENCE_CATEGORIES = ("first", "later_in_context", "later_out_of_context")


def occurrence_table(stream: TokenStream, word_lp: Any, *, seg_len: int, mem_len: int, batch_size: int = 1,
                     only: Optional[Collection[str]] = None) -> Dict[str, Dict[str, float]]:
    """Word-level perplexity of first versus later occurrences of a word within its document.

    A later occurrence is "in context" when every piece of the word's previous occurrence in the document is still
    visible to the model when it predicts the later occurrence's first piece (segment + memory, see `context_start`,
    for the layout `templm.evaluation.stream_eval.layout_stream(stream, batch_size, seg_len)`), "out of context"
    otherwise. EOS words and words without pieces are left out; `only` restricts the table to some words.
    Returns {category: {"ppl", "n"}}.
    """
    wlp = np.asarray(word_lp, np.float64)
    first_tok = stream.word_first_token()
    part_len = part_length(stream.n_targets, batch_size, seg_len)
    starts = context_start(np.maximum(first_tok, 0), seg_len=seg_len, mem_len=mem_len, part_len=part_len)
    wanted = None if only is None else set(only)
    sums = dict.fromkeys(OCCURRENCE_CATEGORIES, 0.0)
    counts = dict.fromkeys(OCCURRENCE_CATEGORIES, 0)
    last_seen: Dict[str, int] = {}
    current_doc = -1
    for k, word in enumerate(stream.word_text):
        if stream.word_is_eos[k] or first_tok[k] < 0 or (wanted is not None and word not in wanted):
            continue
        if stream.word_doc[k] != current_doc:
            current_doc = int(stream.word_doc[k])
            last_seen = {}
        previous = last_seen.get(word)
        if previous is None:
            category = "first"
        else:
            category = "later_in_context" if first_tok[previous] >= starts[k] else "later_out_of_context"
        sums[category] += float(wlp[k])
        counts[category] += 1
        last_seen[word] = k
    return {c: {"ppl": perplexity(sums[c], counts[c]), "n": counts[c]} for c in OCCURRENCE_CATEGORIES}

def topic_perplexity(stream: TokenStream, token_log_probs: Any, doc_topic: Any) -> Dict[int, Dict[str, float]]:
    """{topic: {"subword_ppl", "word_ppl", "n_tokens", "n_words", "n_docs"}} for documents assigned to topics."""
    doc_topic = np.asarray(doc_topic, np.int64)
    tok = np.asarray(token_log_probs, np.float64)
    by_token = group_perplexity(tok, doc_topic[stream.token_doc])
    wlp, words = moses_word_log_probs(stream, tok)
    by_word = group_perplexity(wlp, doc_topic[stream.word_doc[words]])
    n_docs = collections.Counter(doc_topic.tolist())
    return {int(k): {"subword_ppl": by_token[k]["ppl"], "word_ppl": by_word[k]["ppl"], "n_tokens": by_token[k]["n"],
                     "n_words": by_word[k]["n"], "n_docs": n_docs[k]} for k in by_token}


def pos_perplexity(stream: TokenStream, word_lp: Any, tags: Sequence[str]) -> Dict[str, Dict[str, float]]:
    """{POS tag: {"ppl", "n"}} over words (EOS words left out)."""
    keep = ~stream.word_is_eos
    return group_perplexity(np.asarray(word_lp)[keep], np.asarray(tags, dtype=object)[keep])


# ----------------------------------------------------------------------------------------------------------------
# All results.


def document_word_nll(stream: TokenStream, runs: Mapping[str, Mapping[str, Any]],
                      streams: Optional[Mapping[str, TokenStream]] = None) -> Dict[str, Any]:
    """Per test document (in stream order): its month, its number of Moses words (as the word perplexities count
    them) and, for every run and mode ("time_stratified/static", ...), its summed word negative log-likelihood
    (nats), each run's token log-probs read with its own stream when `streams` gives one (its own tokenizer). The
    paired tests of the findings compare models document by document."""
    n_docs = len(stream.doc_ids)
    word_doc = stream.word_doc[moses_words(stream)]
    words = np.bincount(word_doc, minlength=n_docs)
    streams = streams or {}
    nll = {f"{name}/{mode}": (-np.bincount(word_doc, weights=moses_word_log_probs(streams.get(name, stream), lp)[0],
                                           minlength=n_docs)).tolist()
           for name, modes in runs.items() for mode, lp in modes.items()}
    return {"month": list(stream.doc_months), "words": words.tolist(), "word_nll": nll}


def stream_results(stream: TokenStream, runs: Mapping[str, Mapping[str, Any]], *, seg_len: int, mem_len: int,
                   batch_size: int = 1, train_counts: Optional[Mapping[str, int]] = None, min_test_count: int = 50,
                   ratio: float = 5.0, n_topics: int = 10, seed: int = 0, primary: str = "time_stratified",
                   baseline: str = "control", topics: bool = True, pos: bool = True,
                   settings: Optional[Mapping[str, Any]] = None,
                   streams: Optional[Mapping[str, TokenStream]] = None) -> Dict[str, Any]:
    """Every analysis of a stream as one JSON-able dict.

    runs: {run name: {mode: token log-probs [n_targets]}}, modes "static" and any dynamic variants ("dynamic",
    "dynamic_biases", ...), e.g. {"time_stratified": {"static": lp, "dynamic": lp}, "control": {"static": lp}}.
    streams: {run name: its TokenStream} where the runs have their own tokenizers (the paper's per-setup
    SentencePiece models): the same documents and words, other pieces; a run without one uses `stream`. Subword
    perplexities are then each tokenizer's own, and every comparison between runs is at the word level.
    relative[mode]: `primary` in that mode against `baseline` STATIC (the paper: a dynamically evaluated
    TIME-STRATIFIED model against the static CONTROL), word level. The per-word analyses (emerging words, occurrences,
    topics, POS) use every mode of `primary`; emerging words need `train_counts`.
    """
    if primary not in runs:
        raise ValueError(f"runs must hold the primary run {primary!r}; got {sorted(runs)}")
    streams = dict(streams or {})
    stream = streams.get(primary, stream)
    for name, other in streams.items():
        if other.word_text != stream.word_text or not np.array_equal(other.word_doc, stream.word_doc):
            raise ValueError(f"the stream of {name!r} holds other words than the primary run's: the runs must read "
                             "the same documents")

    def stream_of(name: str) -> TokenStream:
        return streams.get(name, stream)

    results: Dict[str, Any] = {
        "settings": dict(settings or {}, seg_len=seg_len, mem_len=mem_len, batch_size=batch_size,
                         n_documents=len(stream.doc_ids), n_tokens=stream.n_targets,
                         n_words=len(moses_words(stream))),
        "months": stream.months,
        "primary": primary,
        "baseline": baseline,
        "runs": {name: {mode: month_perplexities(stream_of(name), lp) for mode, lp in modes.items()}
                 for name, modes in runs.items()},
    }
    if streams:
        results["settings"]["n_tokens_by_run"] = {name: stream_of(name).n_targets for name in runs}
    modes = list(runs[primary])
    word_lps = {mode: word_log_probs(stream, lp) for mode, lp in runs[primary].items()}

    relative = {}
    if baseline in runs and "static" in runs[baseline]:
        ctl = {m: v["word_ppl"] for m, v in results["runs"][baseline]["static"]["by_month"].items()}
        for mode in modes:
            ts = {m: v["word_ppl"] for m, v in results["runs"][primary][mode]["by_month"].items()}
            per_month, slope, intercept = relative_increase(ts, ctl)
            relative[mode] = {"per_month": per_month, "slope": slope, "intercept": intercept}
    results["relative"] = relative
    results["documents"] = document_word_nll(stream, runs, streams)

    words = None
    if train_counts is not None:
        test_counts = stream_word_counts(stream)
        words = emerging_words(train_counts, test_counts, min_test_count, ratio)
        results["emerging"] = {
            "min_test_count": min_test_count, "ratio": ratio,
            "words": [{"word": w, "train_count": int(train_counts.get(w, 0)), "test_count": int(test_counts[w])}
                      for w in words],
            "perplexity": {mode: word_group_perplexity(stream, word_lps[mode], words) for mode in modes},
        }

    results["occurrences"] = {mode: occurrence_table(stream, word_lps[mode], seg_len=seg_len, mem_len=mem_len,
                                                     batch_size=batch_size) for mode in modes}
    if words:  # the paper's Table 4: first and later occurrences of the emerging words
        results["occurrences_emerging"] = {
            mode: occurrence_table(stream, word_lps[mode], seg_len=seg_len, mem_len=mem_len, batch_size=batch_size,
                                   only=words) for mode in modes}

    # Topics and parts of speech: each group's perplexity, and (the paper's Figures 2-4) the relative increase of
    # the primary model in each mode over the baseline's static perplexity of the same group.
    has_baseline = baseline in runs and "static" in runs[baseline]
    if topics and stream.documents is not None:
        doc_topic, top_words = assign_topics([d.text for d in stream.documents], n_topics, seed)
        perp = {mode: topic_perplexity(stream, lp, doc_topic) for mode, lp in runs[primary].items()}
        results["topics"] = {"n_topics": n_topics, "top_words": top_words, "perplexity": perp}
        if has_baseline:
            base = topic_perplexity(stream_of(baseline), runs[baseline]["static"], doc_topic)
            results["topics"]["baseline_perplexity"] = base
            results["topics"]["relative"] = {mode: _group_relative(p, base, "word_ppl") for mode, p in perp.items()}

    if pos:
        tags, reason = pos_tags(stream)
        if tags is None:
            results["pos"] = {"skipped": reason}
        else:
            perp = {mode: pos_perplexity(stream, word_lps[mode], tags) for mode in modes}
            results["pos"] = {"perplexity": perp}
            if has_baseline:
                base = pos_perplexity(stream, word_log_probs(stream_of(baseline), runs[baseline]["static"]), tags)
                results["pos"]["baseline_perplexity"] = base
                results["pos"]["relative"] = {mode: _group_relative(p, base, "ppl") for mode, p in perp.items()}
    return results


def _group_relative(groups: Mapping[Any, Mapping[str, float]], baseline: Mapping[Any, Mapping[str, float]],
                    key: str) -> Dict[Any, Optional[float]]:
    """{group: perplexity / baseline perplexity - 1} for the groups both hold."""
    return {g: (v[key] / baseline[g][key] - 1.0 if baseline[g][key] else None)
            for g, v in groups.items() if g in baseline}


# ----------------------------------------------------------------------------------------------------------------
# Headline numbers and the expected findings.


def summarize(results: Mapping[str, Any]) -> Dict[str, Any]:
    """The headline numbers of a stream_evaluation result: word perplexity of every run and mode, the relative
    increase over CONTROL (slope per month, mean, first and last month) per mode, and each dynamic mode's change of
    TIME-STRATIFIED word perplexity against its static evaluation (negative: dynamic evaluation helps)."""
    def num(x):  # JSON-safe: None for a missing or non-finite value
        return float(x) if x is not None and np.isfinite(x) else None

    runs = results["runs"]
    overall = {f"{name}/{mode}": num(r["overall"]["word_ppl"]) for name, modes in runs.items()
               for mode, r in modes.items()}
    relative = {}
    for mode, r in results.get("relative", {}).items():
        months = sorted(r["per_month"])
        values = [r["per_month"][m] for m in months]
        relative[mode] = {"slope_per_month": num(r["slope"]), "mean": num(np.mean(values)) if values else None,
                          "first_month": num(values[0]) if values else None,
                          "last_month": num(values[-1]) if values else None}
    ts = runs.get(results.get("primary", "time_stratified"), {})
    gain = {}
    base = num(ts["static"]["overall"]["word_ppl"]) if "static" in ts else None
    if base:
        gain = {mode: None if num(r["overall"]["word_ppl"]) is None else num((r["overall"]["word_ppl"] - base) / base)
                for mode, r in ts.items() if mode != "static"}
    return {"overall_word_ppl": overall, "relative": relative, "dynamic_gain": gain,
            "months": list(results.get("months", []))}


# The TIME-STRATIFIED setup trained with CONTROL's tokenizer, for the paper's outdated-tokenizer comparison.
CONTROL_TOKENIZER_RUN = "time_stratified_control_tokenizer"
# A larger TIME-STRATIFIED model (same split, tokenizer, steps and seed), for the paper's model-size comparison.
LARGER_MODEL_RUN = "time_stratified_large"
# "Model size has no significant effect on the slope" (Mind the Gap, section 4) as a non-inferiority claim: the
# larger model's slope of the relative increase is at least this share of the smaller model's (templm's margin).
SLOPE_KEPT = 0.5


def tokenizer_comparison(results: Mapping[str, Any], other: str = CONTROL_TOKENIZER_RUN,
                         alpha: float = statistics.ALPHA) -> Optional[Dict[str, Any]]:
    """The paper's Appendix E question: how much of TIME-STRATIFIED's gap is its outdated tokenizer? `other` is the
    TIME-STRATIFIED setup (same split, steps, seed) trained with CONTROL's tokenizer, whose training text reaches into
    the test period. A paired test over the test documents of the log word perplexity, TIME-STRATIFIED with its own
    tokenizer minus with CONTROL's (claim > 0: the outdated tokenizer costs perplexity), and the share of the gap to
    CONTROL that this difference is. None when the run lacks `other`."""
    documents = results.get("documents") or {}
    primary, baseline = results.get("primary", "time_stratified"), results.get("baseline", "control")
    own, up_to_date = (document_log_ppl(documents, f"{name}/static") for name in (primary, other))
    if own is None or up_to_date is None or len(own) < 2:
        return None
    r = statistics.paired_difference(own, up_to_date, direction=+1, alpha=alpha)
    out = {"claim": "TIME-STRATIFIED's own (outdated) tokenizer raises its perplexity over CONTROL's tokenizer",
           "test": "paired bootstrap of the per-document log word perplexity difference, own tokenizer minus "
                   "CONTROL's", **r, "run": other,
           "evidence": f"log word perplexity, own tokenizer minus CONTROL's {statistics.describe(r, 'nats/word', 3)}"
                       f" (x{np.exp(r['effect']):.2f} perplexity)"}
    ctl = document_log_ppl(documents, f"{baseline}/static")
    if ctl is not None:
        gap = float(np.mean(own - ctl))
        out["gap_to_control"] = gap
        out["share_of_gap"] = float(r["effect"] / gap) if gap else None
        if out["share_of_gap"] is not None:
            out["evidence"] += f"; {out['share_of_gap']:.0%} of the gap to CONTROL ({gap:+.3f} nats/word)"
    return jsonable(out)


def document_log_ppl(documents: Mapping[str, Any], key: str) -> Optional[np.ndarray]:
    """Each test document's log word perplexity (nats per word) under run/mode `key`, or None."""
    nll = (documents.get("word_nll") or {}).get(key)
    if nll is None:
        return None
    return np.asarray(nll, np.float64) / np.maximum(np.asarray(documents["words"], np.float64), 1.0)


# The streaming half's findings ("Mind the Gap"), each a statistical test on one stream run's results; they are
# registered, with their claims and directions, in templm.metrics.findings.REGISTRY.


def judge_gap(results: Mapping[str, Any], alpha: float = statistics.ALPHA) -> Dict[str, Any]:
    """Paired bootstrap / sign-flip test over the test documents of the log word perplexity, TIME-STRATIFIED minus
    CONTROL (static; claim > 0)."""
    documents = results.get("documents") or {}
    primary, baseline = results.get("primary", "time_stratified"), results.get("baseline", "control")
    ts, ctl = document_log_ppl(documents, f"{primary}/static"), document_log_ppl(documents, f"{baseline}/static")
    name = "paired bootstrap of the per-document log word perplexity difference"
    if ts is None or ctl is None or len(ts) < 2:
        return statistics.untested(name, "no per-document perplexities of both models")
    r = statistics.paired_difference(ts, ctl, direction=+1, alpha=alpha)
    return {**r, "test": name, "evidence": "log word perplexity TIME-STRATIFIED minus CONTROL "
                                           f"{statistics.describe(r, 'nats/word', 3)} (x{np.exp(r['effect']):.2f} "
                                           "perplexity)"}


def _monthly_increase(results: Mapping[str, Any], mode: str) -> Dict[str, float]:
    per_month = (((results.get("relative") or {}).get(mode) or {}).get("per_month") or {})
    return {m: v for m, v in per_month.items() if v is not None}


def judge_growth(results: Mapping[str, Any], alpha: float = statistics.ALPHA) -> Dict[str, Any]:
    """Least-squares slope of the monthly relative increase of TIME-STRATIFIED over CONTROL (static) against the
    month, with its t-test (claim > 0)."""
    per_month = _monthly_increase(results, "static")
    months = sorted(per_month, key=month_number)
    name = "least-squares slope of the monthly relative increase, t-test"
    if len(months) < 3:
        return statistics.untested(name, "fewer than three test months with a relative increase")
    x = np.array([month_number(m) - month_number(months[0]) for m in months], np.float64)
    r = statistics.slope(x, np.array([per_month[m] for m in months], np.float64), direction=+1, alpha=alpha)
    return {**r, "test": name, "evidence": f"slope {statistics.describe(r, 'per month', 4)} of the relative increase"}


def _upward_static_slope(results: Mapping[str, Any], alpha: float) -> Optional[str]:
    """None when the static TIME-STRATIFIED model's relative increase over CONTROL rises month by month
    (`judge_growth` appears), else what its slope is: the claims about flattening or keeping that slope presume it."""
    growth = judge_growth(results, alpha)
    if growth["verdict"] == "appears":
        return None
    return f"slope {statistics.describe(growth, 'per month', 4)}, {growth['verdict']}"


def judge_dynamic_slope(results: Mapping[str, Any], alpha: float = statistics.ALPHA) -> Dict[str, Any]:
    """Whether SGD dynamic evaluation flattens the growth of the gap ("Mind the Gap", section 5, compares the slopes
    with a t-test): the least-squares slope of the monthly relative increase with dynamic evaluation minus that of
    the static model, as the slope of their monthly difference (the same months), with its t-test (claim < 0). The
    claim presumes an upward static slope: where `judge_growth` does not find one, it is "not applicable"."""
    static, dynamic = _monthly_increase(results, "static"), _monthly_increase(results, "dynamic")
    months = sorted(set(static) & set(dynamic), key=month_number)
    name = "least-squares slope of the monthly relative increase, dynamic minus static, t-test"
    if len(months) < 3:
        return statistics.untested(name, "fewer than three test months with both a static and a dynamic relative "
                                         "increase")
    upward = _upward_static_slope(results, alpha)
    if upward is not None:
        return statistics.not_applicable(name, f"the claim is that dynamic evaluation flattens an upward slope, and "
                                               f"the static model's is not upward ({upward})")
    x = np.array([month_number(m) - month_number(months[0]) for m in months], np.float64)
    r = statistics.slope(x, np.array([dynamic[m] - static[m] for m in months], np.float64), direction=-1,
                         alpha=alpha)
    return {**r, "test": name, "evidence": f"slope of the relative increase, dynamic minus static "
                                           f"{statistics.describe(r, 'per month', 4)}"}


def judge_dynamic(results: Mapping[str, Any], alpha: float = statistics.ALPHA) -> Dict[str, Any]:
    """Paired test over the test documents of the log word perplexity, TIME-STRATIFIED with SGD dynamic evaluation
    minus static (claim < 0); whether it also narrows the monthly gap, paired over months, as a detail."""
    documents = results.get("documents") or {}
    primary = results.get("primary", "time_stratified")
    ts, dyn = (document_log_ppl(documents, f"{primary}/{mode}") for mode in ("static", "dynamic"))
    name = "paired bootstrap of the per-document log word perplexity difference, dynamic minus static"
    if dyn is None or ts is None or len(ts) < 2:
        return statistics.untested(name, "no SGD dynamic evaluation in this run")
    r = statistics.paired_difference(dyn, ts, direction=-1, alpha=alpha)
    out = {**r, "test": name, "evidence": f"log word perplexity dynamic minus static "
                                          f"{statistics.describe(r, 'nats/word', 3)} (x{np.exp(r['effect']):.2f} "
                                          "perplexity)"}
    static, dynamic = _monthly_increase(results, "static"), _monthly_increase(results, "dynamic")
    paired = sorted(set(static) & set(dynamic), key=month_number)
    if len(paired) >= 2:
        narrows = statistics.paired_difference(np.array([dynamic[m] for m in paired]),
                                               np.array([static[m] for m in paired]), direction=-1, alpha=alpha)
        out["gap_narrows"] = {k: narrows[k] for k in ("effect", "interval", "p_value", "n", "verdict")}
        out["evidence"] += f"; monthly gap, dynamic minus static {statistics.describe(narrows, '', 3)}"
    return out


def judge_size_slope(results: Mapping[str, Any], alpha: float = statistics.ALPHA) -> Dict[str, Any]:
    """Mind the Gap, section 4: a larger TIME-STRATIFIED model (LARGER_MODEL_RUN) has a lower perplexity, but model
    size leaves the upward slope of its relative increase over the same CONTROL model unchanged. Tested as
    non-inferiority of the larger model's slope: the least-squares slope of the monthly series (larger model's
    relative increase) - SLOPE_KEPT x (the smaller's), i.e. slope_large - SLOPE_KEPT x slope_small, with its t-test
    (claim > 0: the larger model keeps at least that share of the growth). Both slopes, both models' word
    perplexities and a paired per-document test of the larger minus the smaller model are details. The margin is a
    share of a slope the test first requires to be upward (`judge_growth` appears; else "not applicable"), so that
    it cannot turn into "the larger model's gap grows" when the smaller model's does not."""
    name = (f"least-squares slope of the monthly relative increase, larger TIME-STRATIFIED model minus "
            f"{SLOPE_KEPT:g} x the smaller's, t-test (non-inferiority)")
    runs = results.get("runs") or {}
    primary, baseline = results.get("primary", "time_stratified"), results.get("baseline", "control")
    large = ((runs.get(LARGER_MODEL_RUN) or {}).get("static") or {}).get("by_month")
    ctl = ((runs.get(baseline) or {}).get("static") or {}).get("by_month")
    if not large or not ctl:
        return statistics.untested(name, "no larger TIME-STRATIFIED model in this run "
                                         "(templm.StreamStudy.larger_model)")
    large_increase, large_slope, _ = relative_increase({m: v["word_ppl"] for m, v in large.items()},
                                                       {m: v["word_ppl"] for m, v in ctl.items()})
    small = _monthly_increase(results, "static")
    months = sorted((m for m in set(small) & set(large_increase) if np.isfinite(large_increase[m])), key=month_number)
    if len(months) < 3:
        return statistics.untested(name, "fewer than three test months with both models' relative increase")
    x = np.array([month_number(m) - month_number(months[0]) for m in months], np.float64)
    small_slope = statistics.slope(x, np.array([small[m] for m in months]), direction=+1, alpha=alpha)["effect"]
    upward = _upward_static_slope(results, alpha)
    if upward is not None:  # the slopes stay as details
        return {**statistics.not_applicable(name, f"the claim is that the larger model keeps the smaller one's "
                                                  f"upward slope, and the smaller model's is not upward ({upward})"),
                "slope_large": large_slope, "slope_small": small_slope}
    y = np.array([large_increase[m] - SLOPE_KEPT * small[m] for m in months], np.float64)
    r = statistics.slope(x, y, direction=+1, alpha=alpha)
    word_ppl = {k: (((runs.get(k) or {}).get("static") or {}).get("overall") or {}).get("word_ppl")
                for k in (primary, LARGER_MODEL_RUN)}
    out = {**r, "test": name, "slope_large": large_slope, "slope_small": small_slope, "margin": SLOPE_KEPT,
           "word_ppl": {"small": word_ppl[primary], "large": word_ppl[LARGER_MODEL_RUN]},
           "relative_large": {m: large_increase[m] for m in months}}
    documents = results.get("documents") or {}
    own, bigger = (document_log_ppl(documents, f"{k}/static") for k in (primary, LARGER_MODEL_RUN))
    if own is not None and bigger is not None and len(own) >= 2:
        lower = statistics.paired_difference(bigger, own, direction=-1, alpha=alpha)
        out["larger_is_lower"] = {k: lower[k] for k in ("effect", "interval", "p_value", "n", "verdict")}
    out["evidence"] = (f"slope of the relative increase per month: larger model {large_slope:+.4f}, smaller "
                       f"{small_slope:+.4f}; larger - {SLOPE_KEPT:g} x smaller "
                       f"{statistics.describe(r, 'per month', 4)}")
    if out.get("larger_is_lower"):
        out["evidence"] += (f"; log word perplexity larger minus smaller "
                            f"{statistics.describe(out['larger_is_lower'], 'nats/word', 3)}")
    return out


# "Mind the Gap"'s appendices B and C, on the results of templm.experiments.appendices (registered, with their
# claims, in templm.metrics.findings.REGISTRY, apart from the study's).


def judge_every_period_gap(results: Mapping[str, Any], alpha: float = statistics.ALPHA) -> Dict[str, Any]:
    """Appendix B: the gap holds whichever two years are the test period. Each shifted test period's own
    `streaming_gap` test (TIME-STRATIFIED minus CONTROL, paired over its test documents) joined as an
    intersection-union test (templm.metrics.statistics.all_of): it appears when every period's does, is the opposite
    when a period's is reversed at alpha / the number of periods; the effect, interval and n are the smallest
    period's, the p-value the largest."""
    name = "every shifted test period's paired test of the log word perplexity, intersection-union"
    periods = [p for p in results.get("periods") or [] if (p.get("findings") or {}).get("streaming_gap")]
    if not periods:
        return statistics.untested(name, "no shifted test period in this run")
    gaps = [p["findings"]["streaming_gap"] for p in periods]
    if any(g.get("effect") is None for g in gaps):
        return statistics.untested(name, "a shifted test period has no per-document gap")
    tests = [f"{p['months'][0]}..{p['months'][-1]}" for p in periods]  # each period's test months
    out = statistics.all_of(dict(zip(tests, gaps)), name, alpha)
    per_period = [{"shift_years": p["shift_years"], "test": test, "effect": g["effect"], "p_value": g["p_value"],
                   "verdict": g["verdict"], "relative_increase": p.get("relative_increase")}
                  for p, test, g in zip(periods, tests, gaps)]
    evidence = "; ".join(f"test {r['test']}: {r['effect']:+.3f} nats/word, p={r['p_value']:.2g} ({r['verdict']})"
                         for r in per_period)
    return {**out, "per_period": per_period,
            "evidence": f"the smallest period's gap {out['effect']:+.3f} nats/word, largest p {out['p_value']:.2g}, "
                        f"over {len(periods)} test periods: {evidence}"}


def judge_distance_growth(results: Mapping[str, Any], alpha: float = statistics.ALPHA) -> Dict[str, Any]:
    """Appendix C: the further a model's training period ends before the test period, the higher its perplexity.
    Each distance (months between the end of the training set and the cut-off) has one model, so the model is the
    unit: the least-squares slope of each model's log word perplexity on the same test documents (the mean of the
    per-document values) on its distance, with its t-test, n = the models (claim > 0). Resampling the documents
    instead would test these particular models' differences, not the distance's effect (with one model per distance,
    two seeds can be "significant" in opposite directions); that slope is kept as a detail, "documents"."""
    name = "least-squares slope of each model's log word perplexity on its distance, t-test over the models"
    distance = results.get("distance") or {}
    per_gap = distance.get("documents") or {}
    if len(per_gap) < 3:
        return statistics.untested(name, f"{len(per_gap)} training distance(s) in this run: a slope over models "
                                         "needs at least three")
    gaps = sorted(per_gap, key=float)
    means = np.array([np.mean(np.asarray(per_gap[g], np.float64)) for g in gaps])
    r = statistics.slope(np.array([float(g) for g in gaps]), means, direction=+1, alpha=alpha)
    x, y, clusters = [], [], []
    for gap in gaps:
        values = np.asarray(per_gap[gap], np.float64)
        x.append(np.full(len(values), float(gap)))
        y.append(values)
        clusters.append(np.arange(len(values)))
    docs = statistics.clustered_slope(np.concatenate(x), np.concatenate(y), np.concatenate(clusters), direction=+1,
                                      alpha=alpha)
    ppl = {str(g): v for g, v in (distance.get("word_ppl") or {}).items()}
    shown = ", ".join(f"{g} months {v:.2f}" for g, v in ppl.items())
    return {**r, "test": name, "word_ppl": ppl,
            "documents": {k: docs[k] for k in ("effect", "interval", "p_value", "n", "verdict")},
            "evidence": f"log word perplexity per month of distance, over the {len(gaps)} models "
                        f"{statistics.describe(r, 'nats/word', 4)}; word perplexity by distance: {shown}; over the "
                        f"documents (these models only) {statistics.describe(docs, 'nats/word', 4)}"}
