"""Probing a trained model about years it has not seen, with `score_batch` on inputs whose year we choose.

- `future_degradation`: for test queries the model answers correctly (exact match) at the last seen year, the
  change in log-likelihood of that answer as the input year moves 1..G years past it, split by queries whose subject
  and relation keep one answer over the whole span versus several (Dhingra et al., Section 5: facts that changed
  before should lose confidence faster).
- `future_calibration`: the entropy of the model's distribution over a fixed candidate set (every candidate scored,
  softmax over the candidates; nothing sampled) for queries whose answer changes frequently, rarely or never, per
  future year.

The year reaches the model as the Temporal prefix ("year: 2019 ...") for the Temporal regime and as text ("In 2019,
...") for every other model (Uniform, Yearly experts, baselines), which were never given a prefix. The arithmetic
(log-likelihood change, entropy, means by group) is in `templm.evaluation.time_analysis`.
"""

from __future__ import annotations

import copy
import functools
import json
from typing import Any, Dict, List, Mapping, Optional, Sequence

import jax
import numpy as np

from templm import paths
from templm.data import regimes
from templm.data.salient_spans import cloze_to_ssm
from templm.errors import DataError, loads_json
from templm.metrics import qa, time_analysis

EOS_ID = 1


def year_input(regime: str, year: int, query: str) -> str:
    """A cloze query (with `_X_`, or already in SSM form) as the regime's model is asked about `year`
    (templm.data.regimes: the prefix, or the year in words)."""
    cloze = cloze_to_ssm(query) if "_X_" in query else query
    return regimes.regime(regime).probe_input(year, cloze)


class TextScorer:
    """Jitted `score_batch` and greedy `predict_batch` of one model on raw strings, at a fixed batch size and
    feature lengths (one compilation each, shared by every parameter set passed in).

    Strings are tokenised as the SeqIO tasks do it: the vocabulary's ids, trimmed to length - 1, then EOS.
    """

    def __init__(self, model, vocabulary, feature_lengths: Mapping[str, int], batch_size: int = 32):
        self.vocabulary = vocabulary
        self.lengths = dict(feature_lengths)
        self.batch_size = batch_size
        self._score = jax.jit(model.score_batch)
        self._predict = jax.jit(functools.partial(model.predict_batch, max_decode_length=self.lengths["targets"]))

    def with_vocabulary(self, vocabulary) -> "TextScorer":
        """A copy that tokenises with another vocabulary and shares the compiled functions (the same model)."""
        other = copy.copy(self)
        other.vocabulary = vocabulary
        return other

    def _ids(self, text: str, length: int) -> List[int]:
        return list(self.vocabulary.encode(text))[:length - 1] + [EOS_ID]

    def encode(self, inputs: Sequence[str], targets: Optional[Sequence[str]] = None) -> Dict[str, np.ndarray]:
        """EncDecFeatureConverter features (unpacked) of `inputs` and, when given, `targets`."""
        n = len(inputs)
        batch = {"encoder_input_tokens": np.zeros((n, self.lengths["inputs"]), np.int32)}
        for i, text in enumerate(inputs):
            ids = self._ids(text, self.lengths["inputs"])
            batch["encoder_input_tokens"][i, :len(ids)] = ids
        if targets is not None:
            if len(targets) != n:
                raise ValueError(f"{n} inputs but {len(targets)} targets")
            t = np.zeros((n, self.lengths["targets"]), np.int32)
            for i, text in enumerate(targets):
                ids = self._ids(text, self.lengths["targets"])
                t[i, :len(ids)] = ids
            batch["decoder_target_tokens"] = t
            batch["decoder_input_tokens"] = np.concatenate([np.zeros((n, 1), np.int32), t[:, :-1]], axis=1)
            batch["decoder_loss_weights"] = (t > 0).astype(np.int32)
        return batch

    def _chunks(self, batch: Dict[str, np.ndarray]):
        n = next(iter(batch.values())).shape[0]
        for start in range(0, n, self.batch_size):
            chunk = {k: v[start:start + self.batch_size] for k, v in batch.items()}
            rows = next(iter(chunk.values())).shape[0]
            if rows < self.batch_size:  # pad with copies of the first row; their outputs are dropped
                chunk = {k: np.concatenate([v, np.repeat(v[:1], self.batch_size - rows, axis=0)])
                         for k, v in chunk.items()}
            yield chunk, rows

    def score(self, params, inputs: Sequence[str], targets: Sequence[str]) -> np.ndarray:
        """Summed log-likelihood (nats) of each target given its input: [N] float64."""
        if not inputs:
            return np.zeros((0,), np.float64)
        out = [np.asarray(self._score(params, chunk), np.float64)[:rows]
               for chunk, rows in self._chunks(self.encode(inputs, targets))]
        return np.concatenate(out)

    def predict(self, params, inputs: Sequence[str]) -> List[str]:
        """Greedy answers, decoded, with sentinels stripped (the answer span)."""
        out: List[str] = []
        for chunk, rows in self._chunks(self.encode(inputs)):
            tokens = np.asarray(self._predict(params, chunk))[:rows]
            out.extend(qa.strip_sentinels(self.vocabulary.decode(row.tolist())) for row in tokens)
        return out


def future_degradation(scorer: TextScorer, params, regime: str, queries: Sequence[Any], reference_year: int,
                       max_gap: int = 10) -> Dict[str, Any]:
    """Log-likelihood change of correctly answered queries of `reference_year` as the input year moves 1..max_gap.

    `queries` are the test queries (`records.Query`) of every year: the answer group of a subject and relation (one
    answer, or several) is taken from its queries up to `reference_year`, the years the model could have seen it
    change (the paper groups over 2010-20, where its release's one-object-per-year resolution leaves single-answer
    subjects; a TempLAMA that keeps only subjects with several objects and lists every valid one, as templm's world
    and Wikidata builder do, has none over the whole span). Returns the number of queries of the
    reference year, how many were answered correctly, per group the count and the mean change per gap, and per
    answered query ("items") its group and its change averaged over the gaps (what the finding's test compares).
    """
    gaps = list(range(1, max_gap + 1))
    groups = time_analysis.answer_groups([q for q in queries if int(q.year) <= int(reference_year)])
    selected = [q for q in queries if int(q.year) == int(reference_year)]
    predictions = scorer.predict(params, [year_input(regime, reference_year, q.query) for q in selected])
    kept, answers = [], []
    for q, prediction in zip(selected, predictions):
        matched = [a for a in q.gold_names if qa.exact_match(prediction, a)]
        if matched:
            kept.append(q)
            answers.append(matched[0])
    result: Dict[str, Any] = {"regime": regime, "reference_year": int(reference_year), "gaps": gaps,
                              "queries": len(selected), "answered": len(kept)}
    # One scoring pass over every (query, year) pair: the reference year first, then each gap.
    years = [int(reference_year)] + [int(reference_year) + g for g in gaps]
    inputs = [year_input(regime, y, q.query) for y in years for q in kept]
    scores = scorer.score(params, inputs, answers * len(years)).reshape(len(years), len(kept))
    deltas = time_analysis.loglik_change(scores[0], scores[1:].T)
    group_of = [groups[(q.subject_id, q.relation)] for q in kept]
    result["groups"] = time_analysis.mean_change_by_gap(deltas, group_of, gaps)
    result["items"] = {"id": [q.id for q in kept], "group": group_of,
                       "mean_change": deltas.mean(axis=1).tolist() if len(kept) else []}
    return result


def future_as_of(scorer: TextScorer, params, queries: Sequence[Any], as_of: int) -> Dict[str, Any]:
    """The Temporal model on the test queries of the years after `as_of` (its last seen year), asked once with each
    query's own year in the prefix (the paper's protocol) and once as of `as_of`: how much of its future-year F1 is
    lost to a year prefix it never trained on, against what it knew at its last seen year (Dhingra et al., section
    4: the Temporal model "persists the unchanged facts"). Per query: id, year, both F1s (x100, the best over the
    gold names) and the prediction as of `as_of`."""
    future = [q for q in queries if int(q.year) > int(as_of)]
    own = scorer.predict(params, [year_input("temporal", int(q.year), q.query) for q in future])
    then = scorer.predict(params, [year_input("temporal", int(as_of), q.query) for q in future])
    return {"as_of": int(as_of), "id": [q.id for q in future], "year": [int(q.year) for q in future],
            "f1_own_year": [100.0 * qa.token_f1(p, q.gold_names) for p, q in zip(own, future)],
            "f1_as_of": [100.0 * qa.token_f1(p, q.gold_names) for p, q in zip(then, future)],
            "prediction_as_of": list(then)}


def read_calibration(path: str) -> List[Dict[str, Any]]:
    """Calibration queries of `calibration.jsonl`, one per subject and relation: query, change_class, candidates."""
    seen, out = set(), []
    with paths.open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = loads_json(line)
                key = (obj["id"].split("_")[0], obj["relation"])
                row = {"subject": key[0], "relation": key[1], "query": obj["query"],
                       "change_class": obj["change_class"], "candidates": list(obj["candidates"])}
            except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
                raise DataError(f"bad calibration query ({type(e).__name__}: {e}); expected id, relation, query, "
                                "change_class and candidates", path, number) from None
            if not row["candidates"]:
                raise DataError("calibration query without candidates", path, number)
            if key not in seen:
                seen.add(key)
                out.append(row)
    return out


def future_calibration(scorer: TextScorer, params, regime: str, calibration: Sequence[Mapping[str, Any]],
                       years: Sequence[int]) -> Dict[str, Any]:
    """Entropy over each calibration query's candidates in each of `years`, averaged per change class and year.

    Returns `entropy` (nats) and `normalized_entropy` (divided by log of the number of candidates, so that classes
    with candidate sets of different sizes compare) as {class: {year: mean}}, the number of queries per class, and
    per query and year ("items") its query ("SUBJECT/RELATION"), class, year and both entropies.
    """
    inputs, targets, spans, queries = [], [], [], []
    for q in calibration:
        for year in years:
            start = len(inputs)
            for candidate in q["candidates"]:
                inputs.append(year_input(regime, year, q["query"]))
                targets.append(candidate)
            spans.append((q["change_class"], int(year), start, len(inputs)))
            queries.append(f"{q['subject']}/{q['relation']}")
    scores = scorer.score(params, inputs, targets)
    classes = [c for c, _, _, _ in spans]
    span_years = [y for _, y, _, _ in spans]
    raw = [time_analysis.entropy(scores[a:b]) for _, _, a, b in spans]
    normalized = [time_analysis.entropy(scores[a:b], normalize=True) for _, _, a, b in spans]
    counts: Dict[str, int] = {}
    for q in calibration:
        counts[q["change_class"]] = counts.get(q["change_class"], 0) + 1
    return {"regime": regime, "years": [int(y) for y in years],
            "entropy": time_analysis.mean_by_class_and_year(raw, classes, span_years),
            "normalized_entropy": time_analysis.mean_by_class_and_year(normalized, classes, span_years),
            "count": counts,
            "items": {"query": queries, "class": classes, "year": span_years, "entropy": raw,
                      "normalized_entropy": normalized}}
