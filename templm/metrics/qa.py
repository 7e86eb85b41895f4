"""Question-answering metrics (SQuAD-style EM and token F1) by year and slice, and masked-LM perplexity by year.

Also the SeqIO glue: postprocessors and metric functions in the shapes `seqio.Task(postprocess_fn=...,
metric_fns=[...])` expects.

Metric key scheme (flat, so every key is a valid SeqIO / TensorBoard metric name):

- QA, overall:       ``em``, ``f1`` (means x100, in [0, 100]), ``count`` (number of examples)
- QA, per year Y:    ``em_Y``, ``f1_Y``, ``count_Y``           e.g. ``em_2014``
- QA, per slice S:   ``S_em``, ``S_f1``, ``S_count``           S is ``seen`` or ``future``, e.g. ``future_f1``
- perplexity:        ``ppl``, ``ppl_Y`` and the token counts behind them, ``tokens``, ``tokens_Y``

A group with no examples reports only its count (0): a mean over nothing is not reported as a number. The QA and
perplexity key sets are disjoint, so both kinds of metric can sit on one task (SeqIO rejects duplicate keys).
"""

from __future__ import annotations

import collections
import math
import re
import string
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Union

import numpy as np

SLICES = ("seen", "future")

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(?:a|an|the)\b")
_SENTINEL = re.compile(r"<extra_id_(\d+)>")

Answers = Union[str, bytes, Sequence[Any], np.ndarray]


# --------------------------------------------------------------------------------------------------------------------
# Answer normalisation and per-example scores.


def normalize_answer(s: str) -> str:
    """SQuAD normalisation: lowercase, drop ASCII punctuation, drop the articles a/an/the, collapse whitespace.

    Punctuation is deleted (not replaced by a space), so "U.S." becomes "us"; articles are whole words only, so
    "Theresa" keeps its "the". The steps run in that order, as in the official SQuAD v1.1 script.
    """
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCTUATION)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def _as_text(x: Any) -> str:
    if isinstance(x, np.ndarray) and x.ndim == 0:
        x = x.item()
    if isinstance(x, (bytes, np.bytes_)):
        return bytes(x).decode("utf-8")
    if isinstance(x, str):
        return str(x)
    raise TypeError(f"expected a str or bytes answer, got {type(x).__name__}: {x!r}")


def _answer_list(answers: Answers) -> List[str]:
    """Gold answers as a list of str: one str/bytes, or a list/tuple/array of them (as SeqIO hands them over)."""
    if isinstance(answers, (str, bytes, np.bytes_)):
        return [_as_text(answers)]
    if isinstance(answers, np.ndarray):
        if answers.ndim == 0:
            return [_as_text(answers)]
        answers = answers.reshape(-1).tolist()
    out = [_as_text(a) for a in answers]
    if not out:
        raise ValueError("no gold answers given: at least one answer (possibly the empty string) is needed")
    return out


def _em_one(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def _f1_one(prediction: str, gold: str) -> float:
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(gold).split()
    if not pred_tokens or not gold_tokens:
        # An empty normalised prediction or answer (both empty too) has no token to overlap: 0, as SQuAD v1.1's
        # evaluation script and T5's qa_utils score it. Exact match still counts "" against "" as a match.
        return 0.0
    overlap = sum((collections.Counter(pred_tokens) & collections.Counter(gold_tokens)).values())
    if overlap == 0:
        return 0.0
    precision = overlap / len(pred_tokens)
    recall = overlap / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def exact_match(prediction: str, answers: Answers) -> float:
    """1.0 if the normalised prediction equals any normalised gold answer, else 0.0."""
    prediction = _as_text(prediction)
    return max(_em_one(prediction, gold) for gold in _answer_list(answers))


def token_f1(prediction: str, answers: Answers) -> float:
    """Best token F1 over the gold answers, in [0, 1].

    F1 of one pair is computed from the multiset overlap of the normalised tokens: P = overlap / |prediction|,
    R = overlap / |gold|, F1 = 2PR / (P + R). An empty normalised prediction or answer scores 0.0 (SQuAD v1.1).
    """
    prediction = _as_text(prediction)
    return max(_f1_one(prediction, gold) for gold in _answer_list(answers))


def strip_sentinels(text: Union[str, bytes]) -> str:
    """The answer text of a T5 span-prediction output, without sentinel tokens or surrounding whitespace.

    The model writes ``<extra_id_0> answer <extra_id_1> ...``; only the first span is kept: the text after
    ``<extra_id_0>`` up to the next sentinel (any ``<extra_id_N>``) or the end. Without ``<extra_id_0>`` but with
    other sentinels, the first non-empty piece between sentinels is kept (the empty string if there is none).
    Without any sentinel, the whole text, stripped.
    """
    text = _as_text(text)
    pieces = _SENTINEL.split(text)
    # re.split with one group: [text, id, text, id, text, ...]; texts at even positions, sentinel ids at odd ones.
    if len(pieces) == 1:
        return text.strip()
    for i in range(1, len(pieces), 2):
        if int(pieces[i]) == 0:
            return pieces[i + 1].strip()
    for piece in pieces[0::2]:
        if piece.strip():
            return piece.strip()
    return ""


# --------------------------------------------------------------------------------------------------------------------
# Aggregation.


def _group_scores(prefix: str, suffix: str, em: Sequence[float], f1: Sequence[float]) -> Dict[str, float]:
    out = {f"{prefix}count{suffix}": float(len(em))}
    if em:
        out[f"{prefix}em{suffix}"] = 100.0 * math.fsum(em) / len(em)
        out[f"{prefix}f1{suffix}"] = 100.0 * math.fsum(f1) / len(f1)
    return out


def _year_or_none(year: Any) -> Optional[int]:
    if year is None:
        return None
    if isinstance(year, np.ndarray):
        year = year.item()
    return int(year)


def qa_scores(predictions: Sequence[str], answers: Sequence[Answers], years: Optional[Sequence[Any]] = None,
              seen_years: Optional[Iterable[int]] = None,
              future_years: Optional[Iterable[int]] = None) -> Dict[str, float]:
    """Mean exact match and token F1 (x100) overall, per year and per slice of years.

    Args:
      predictions: one predicted answer (str or bytes) per example.
      answers: the gold answers of each example (a str, or a list/tuple/array of str or bytes; scored by the max).
      years: the year of each example (int-like; None for an example without one), or None for no per-year keys.
      seen_years, future_years: years forming the ``seen`` and ``future`` slices (e.g. the training years and the
        years after the training cut-off). An example whose year is in neither counts only overall and per year.
        A slice given without ``years`` is an error.

    Returns:
      A flat dict of floats: ``em``, ``f1``, ``count``; ``em_Y``, ``f1_Y``, ``count_Y`` for every year Y present;
      ``seen_em``, ``seen_f1``, ``seen_count`` and ``future_...`` for each slice given. A group without examples has
      only its count (0.0).
    """
    predictions = list(predictions)
    answers = list(answers)
    if len(predictions) != len(answers):
        raise ValueError(f"{len(predictions)} predictions but {len(answers)} answer lists: expected one per example")
    if years is not None:
        years = [_year_or_none(y) for y in years]
        if len(years) != len(predictions):
            raise ValueError(f"{len(predictions)} predictions but {len(years)} years: expected one per example")
    elif seen_years is not None or future_years is not None:
        raise ValueError("seen_years / future_years need the year of every example (years=...)")

    em = [exact_match(p, a) for p, a in zip(predictions, answers)]
    f1 = [token_f1(p, a) for p, a in zip(predictions, answers)]
    out = _group_scores("", "", em, f1)
    if years is None:
        return out

    by_year: Dict[int, List[int]] = collections.defaultdict(list)
    for i, year in enumerate(years):
        if year is not None:
            by_year[year].append(i)
    for year in sorted(by_year):
        idx = by_year[year]
        out.update(_group_scores("", f"_{year}", [em[i] for i in idx], [f1[i] for i in idx]))

    for name, slice_years in zip(SLICES, (seen_years, future_years)):
        if slice_years is None:
            continue
        members = {int(y) for y in slice_years}
        idx = [i for i, year in enumerate(years) if year is not None and year in members]
        out.update(_group_scores(f"{name}_", "", [em[i] for i in idx], [f1[i] for i in idx]))
    return out


# --------------------------------------------------------------------------------------------------------------------
# Perplexity.


def _safe_exp(x: float) -> float:
    try:
        return math.exp(x)
    except OverflowError:
        return math.inf


def perplexity_by_year(nll_sums: Sequence[float], token_counts: Sequence[float],
                       years: Optional[Sequence[Any]] = None) -> Dict[str, float]:
    """Token-level perplexity exp(sum NLL / sum tokens), overall and per year.

    Each example contributes its summed negative log-likelihood (nats) and its number of scored tokens, so long
    examples weigh more, as in corpus perplexity (not a mean of per-example perplexities).

    Returns ``ppl`` and ``tokens`` overall, and ``ppl_Y``, ``tokens_Y`` for each year Y present (examples whose year is
    None count only overall). A year whose examples have no tokens reports ``tokens_Y`` = 0 and no ``ppl_Y``. No
    tokens at all, a negative token count or mismatched lengths is an error.
    """
    nll = np.asarray(nll_sums, dtype=np.float64).reshape(-1)
    counts = np.asarray(token_counts, dtype=np.float64).reshape(-1)
    if nll.shape != counts.shape:
        raise ValueError(f"{nll.size} NLL sums but {counts.size} token counts: expected one per example")
    if np.any(counts < 0) or not np.all(np.isfinite(counts)):
        raise ValueError("token counts must be finite and non-negative")
    total = float(counts.sum())
    if total <= 0:
        raise ValueError("perplexity over zero tokens is undefined: no example has a scored token")
    out = {"ppl": _safe_exp(math.fsum(nll.tolist()) / total), "tokens": total}
    if years is None:
        return out
    years = [_year_or_none(y) for y in years]
    if len(years) != nll.size:
        raise ValueError(f"{nll.size} NLL sums but {len(years)} years: expected one per example")
    by_year: Dict[int, List[int]] = collections.defaultdict(list)
    for i, year in enumerate(years):
        if year is not None:
            by_year[year].append(i)
    for year in sorted(by_year):
        idx = by_year[year]
        year_tokens = float(counts[idx].sum())
        out[f"tokens_{year}"] = year_tokens
        if year_tokens > 0:
            out[f"ppl_{year}"] = _safe_exp(math.fsum(nll[idx].tolist()) / year_tokens)
    return out


# --------------------------------------------------------------------------------------------------------------------
# SeqIO glue.
#
# SeqIO (0.0.20, seqio.metrics.LegacyMetric) calls a task's postprocess_fn once per example with
#   postprocess_fn(decoded_target_text, example=<numpy dict of the task features>, is_target=True)
# and, for predict metrics, postprocess_fn(decoded_prediction_text, example=..., is_target=False). It then calls a
# metric fn whose required positional arguments are exactly (targets, predictions) with the two lists, or, for a
# score metric, exactly (targets, scores) with the postprocessed targets and the array the model's score_fn returned.


def qa_postprocessor(output: Union[str, bytes], example: Optional[Mapping[str, Any]] = None,
                     is_target: bool = False) -> Any:
    """SeqIO postprocess_fn for TempLAMA-style cloze QA.

    Targets (``is_target=True``): ``{"answers": [str, ...], "year": int or None}`` from ``example["answers"]`` (a
    numpy array of bytes, as SeqIO provides it, or any list of str/bytes) and ``example["year"]``. Without an
    ``answers`` feature the decoded target itself (sentinels stripped) is the one answer; without ``year`` the year
    is None (the example then counts only in the overall scores).

    Predictions: the decoded output with sentinels stripped (`strip_sentinels`).
    """
    if not is_target:
        return strip_sentinels(output)
    example = example or {}
    if "answers" in example:
        answers = _answer_list(example["answers"])
    else:
        answers = [strip_sentinels(output)]
    return {"answers": answers, "year": _year_or_none(example.get("year"))}


def make_qa_metric_fn(seen_years: Optional[Iterable[int]] = None,
                      future_years: Optional[Iterable[int]] = None) -> Callable[..., Dict[str, float]]:
    """A SeqIO predict metric ``fn(targets, predictions) -> dict`` of `qa_scores` keys.

    ``targets`` are `qa_postprocessor` target dicts, ``predictions`` its prediction strings. Per-year keys appear
    when any target has a year; the ``seen`` / ``future`` slices when their years are given.
    """
    seen = None if seen_years is None else frozenset(int(y) for y in seen_years)
    future = None if future_years is None else frozenset(int(y) for y in future_years)

    def qa_metric(targets, predictions):
        answers = [t["answers"] for t in targets]
        years = [t.get("year") for t in targets]
        if all(y is None for y in years):
            if seen or future:
                raise ValueError("seen/future slices were requested but no target carries a year")
            return qa_scores(predictions, answers)
        return qa_scores(predictions, answers, years, seen_years=seen, future_years=future)

    return qa_metric


def ppl_postprocessor(output: Any, example: Optional[Mapping[str, Any]] = None, is_target: bool = False) -> Any:
    """SeqIO postprocess_fn for perplexity scoring tasks.

    Targets: ``{"year": int or None, "num_tokens": int}``, where num_tokens counts the non-padding (id != 0) ids in
    ``example["targets"]``, EOS included: the same positions a T5X-style score_fn sums the log-likelihood over. The
    task dataset SeqIO keeps for evaluation is already trimmed to the evaluation sequence length, so a truncated
    target is counted as truncated. Predictions are returned unchanged (score metrics never see them).
    """
    if not is_target:
        return output
    if example is None or "targets" not in example:
        raise ValueError("ppl_postprocessor needs the example's token ids in example['targets']")
    ids = np.asarray(example["targets"]).reshape(-1)
    return {"year": _year_or_none(example.get("year")), "num_tokens": int(np.count_nonzero(ids))}


def make_perplexity_metric_fn() -> Callable[..., Dict[str, float]]:
    """A SeqIO score metric ``fn(targets, scores) -> dict`` of `perplexity_by_year` keys.

    SeqIO hands a score metric the `ppl_postprocessor` target dicts and the model's scores in example order: one
    summed target log-likelihood per example (T5X's score_batch). The NLL of an example is minus its score; an
    example given per-token scores instead (a 1-d array) is summed first. The token counts come from the targets,
    since the scores alone do not say how many tokens they cover.
    """

    def perplexity_metric(targets, scores):
        targets = list(targets)
        if len(targets) != len(scores):
            raise ValueError(f"{len(targets)} targets but {len(scores)} scores: expected one per example")
        nll = [-float(np.sum(np.asarray(s, dtype=np.float64))) for s in scores]
        counts = [t["num_tokens"] for t in targets]
        years = [t.get("year") for t in targets]
        if all(y is None for y in years):
            return perplexity_by_year(nll, counts)
        return perplexity_by_year(nll, counts, years)

    return perplexity_metric
