"""Evaluate a model, or anything with the same `predict_fn` / `score_fn`, on one SeqIO task split, keeping every
example's output next to the task's own metrics.

`templm.training.inference.evaluate` returns a task's metrics only; the time analyses also need per-example
predictions (F1 by answer duration, which queries a model got right) and per-example features before the model sees
them (a router sends each example to the expert of its `year`). Both come from one `seqio.Evaluator`: its cached task
dataset holds the task features (`id`, `year`, `answers`) in the same order as the enumerated model dataset that
`predict_fn` and `score_fn` receive, so index i of one is index i of the other.

Evaluators are kept (a few, most recently used) and reused for the same task split and lengths, as long as the task
registered under that name is the same object: a study that evaluates many models of one task pays once for reading
and tokenising its examples.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import numpy as np
import seqio

from templm.metrics import qa


@dataclasses.dataclass
class TaskEvaluation:
    """A task's metrics (the keys of its metric fns) and one dict per example: id, year, answers (QA tasks),
    prediction (when the task has a predict metric) and score (when it has a score metric)."""

    task: str
    metrics: Dict[str, float]
    examples: List[Dict[str, Any]]

    def predictions(self) -> Dict[str, str]:
        return {ex["id"]: ex["prediction"] for ex in self.examples if "prediction" in ex}

    def answers(self) -> Dict[str, List[str]]:
        return {ex["id"]: ex["answers"] for ex in self.examples if "answers" in ex}


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, (bytes, np.bytes_)) else str(value)


def _task_features(cached_task_dataset) -> List[Dict[str, Any]]:
    rows = []
    for ex in cached_task_dataset.as_numpy_iterator():
        row: Dict[str, Any] = {}
        if "id" in ex:
            row["id"] = _text(ex["id"])
        if "year" in ex:
            row["year"] = int(np.asarray(ex["year"]).item())
        if "answers" in ex:
            row["answers"] = [_text(a) for a in np.asarray(ex["answers"]).reshape(-1)]
        rows.append(row)
    return rows


_EVALUATORS: "collections.OrderedDict" = collections.OrderedDict()
_MAX_EVALUATORS = 8


def _evaluator(task: str, split: str, feature_lengths: Mapping[str, int], num_examples: Optional[int]):
    """(seqio.Evaluator, task features of its examples) for a task split, reused while the task is unchanged."""
    task_obj = seqio.get_mixture_or_task(task)
    key = (task, split, tuple(sorted(feature_lengths.items())), num_examples)
    hit = _EVALUATORS.get(key)
    if hit is not None and hit[0] is task_obj:
        _EVALUATORS.move_to_end(key)
        return hit[1], hit[2]
    evaluator = seqio.Evaluator(task, seqio.EncDecFeatureConverter(pack=False), eval_split=split,
                                sequence_length=dict(feature_lengths), num_examples=num_examples,
                                async_compute_metrics=False)
    examples = _task_features(evaluator.cached_task_datasets[task])
    _EVALUATORS[key] = (task_obj, evaluator, examples)
    while len(_EVALUATORS) > _MAX_EVALUATORS:
        _EVALUATORS.popitem(last=False)
    return evaluator, examples


def evaluate_task(fns_for: Callable[[Sequence[Dict[str, Any]]], Any], task: str, feature_lengths: Mapping[str, int],
                  split: str = "test", num_examples: Optional[int] = None,
                  step: Optional[int] = None) -> TaskEvaluation:
    """Metrics and per-example outputs of one task split.

    `fns_for(examples)` gets the task features of every example (dicts with id, year, answers, in evaluation order,
    so example i is index i of the datasets that the functions receive) and returns an object with `predict_fn` and
    `score_fn` in `seqio.Evaluator`'s conventions: a `templm.training.inference.ModelFns`, or a `RoutedFns` that
    sends each example to its year's expert.
    """
    evaluator, template = _evaluator(task, split, feature_lengths, num_examples)
    examples = copy.deepcopy(template)
    fns = fns_for(examples)
    metrics, outputs = evaluator.evaluate(compute_metrics=True, step=step, predict_fn=fns.predict_fn,
                                          score_fn=fns.score_fn)
    result = {name: float(getattr(value, "value", value)) for name, value in metrics.result()[task].items()}
    task_obj = seqio.get_mixture_or_task(task)
    vocabulary = task_obj.output_features["targets"].vocabulary
    for output_type, values in outputs.get(task, {}).items():
        kind = getattr(output_type, "name", str(output_type))
        if kind == "PREDICTION":
            for row, tokens in zip(examples, values):
                row["prediction"] = qa.strip_sentinels(vocabulary.decode([int(t) for t in tokens]))
        elif kind == "SCORE":
            for row, score in zip(examples, values):
                row["score"] = float(np.sum(score))
    return TaskEvaluation(task, result, examples)


def evaluate_model(fns, task: str, feature_lengths: Mapping[str, int], split: str = "test",
                   num_examples: Optional[int] = None, step: Optional[int] = None) -> TaskEvaluation:
    """`evaluate_task` for one model's functions (a `ModelFns`)."""
    return evaluate_task(lambda examples: fns, task, feature_lengths, split, num_examples, step)


def with_params(fns, params):
    """A shallow copy of a `ModelFns` with other parameters: the jitted functions (and their compilations) are
    shared, so evaluating many models of one architecture compiles once."""
    other = copy.copy(fns)
    other.params = params
    return other
