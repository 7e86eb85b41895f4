"""Yearly ensembles: one expert model per year, each example sent to the expert of its year.

An example of a year without an expert goes to the closest expert year (a tie to the later, more recent expert);
years after the last expert go to the last one and years before the first to the first. The ensemble is evaluated
like any model: `evaluate_router` runs the task's own metrics (EM/F1 and perplexity by year and slice), routing each
example by its `year` feature and running each expert on its examples in full batches.

In gin (the experts as a dict of checkpoint folders):

    templm.make_year_router.experts = {2014: 'runs/yearly_2014', 2015: 'runs/yearly_2015'}
"""

from __future__ import annotations

import collections
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence

import gin

from templm.evaluation.task_eval import TaskEvaluation, evaluate_task, with_params
from templm.training.checkpoints import load_params


class YearRouter:
    """Experts by year: `experts` maps a year to parameters, or to a checkpoint folder loaded on first use (a model
    folder with `checkpoints/` inside, or the checkpoints folder itself; the latest step)."""

    def __init__(self, experts: Mapping[int, Any]):
        if not experts:
            raise ValueError("YearRouter needs at least one expert")
        self._experts: Dict[int, Any] = {int(year): value for year, value in experts.items()}
        self.years: List[int] = sorted(self._experts)

    def route(self, year: int) -> int:
        """The expert year for an example of `year`."""
        year = int(year)
        if year in self._experts:
            return year
        if year <= self.years[0]:
            return self.years[0]
        if year >= self.years[-1]:
            return self.years[-1]
        return min(self.years, key=lambda y: (abs(y - year), -y))

    def params(self, expert_year: int):
        """The expert's parameters (loaded from its checkpoint the first time when given as a path)."""
        value = self._experts[int(expert_year)]
        if isinstance(value, (str, os.PathLike)):
            path = os.fspath(value)
            if os.path.isdir(os.path.join(path, "checkpoints")):
                path = os.path.join(path, "checkpoints")
            value = load_params(path)[0]
            self._experts[int(expert_year)] = value
        return value


@gin.configurable(module="templm")
def make_year_router(experts: Mapping[int, Any] = gin.REQUIRED) -> YearRouter:
    """A `YearRouter` from gin: `templm.make_year_router.experts = {2014: 'runs/yearly_2014', ...}`."""
    return YearRouter(experts)


class _Rows:
    """A list of (index, features) rows with the one method `ModelFns` reads datasets through."""

    def __init__(self, rows):
        self.rows = rows

    def as_numpy_iterator(self):
        return iter(self.rows)


class RoutedFns:
    """`predict_fn` / `score_fn` that run each example through its year's expert.

    `fns` is a `ModelFns` of the experts' architecture (its jitted functions are shared by every expert);
    `years[i]` is the year of the example with index i.
    """

    def __init__(self, router: YearRouter, fns, years: Sequence[Optional[int]]):
        self.router = router
        self.fns = fns
        self.years = list(years)

    def _by_expert(self, dataset):
        groups = collections.defaultdict(list)
        for index, features in dataset.as_numpy_iterator():
            year = self.years[int(index)]
            if year is None:
                raise ValueError(f"example {int(index)} has no year to route it by")
            groups[self.router.route(year)].append((index, features))
        return groups

    def _run(self, dataset, method: str):
        out = []
        for expert_year, rows in sorted(self._by_expert(dataset).items()):
            expert = with_params(self.fns, self.router.params(expert_year))
            out.extend(getattr(expert, method)(_Rows(rows)))
        return out

    def predict_fn(self, dataset):
        return self._run(dataset, "predict_fn")

    def score_fn(self, dataset):
        return self._run(dataset, "score_fn")


def evaluate_router(router: YearRouter, fns, task: str, feature_lengths: Mapping[str, int], split: str = "test",
                    num_examples: Optional[int] = None, step: Optional[int] = None) -> TaskEvaluation:
    """The router's metrics and per-example outputs on a task split, as `evaluate_task` gives them for one model.

    Each example also records the `expert` year it was sent to."""
    result = evaluate_task(lambda examples: RoutedFns(router, fns, [ex.get("year") for ex in examples]), task,
                           feature_lengths, split, num_examples, step)
    for ex in result.examples:
        if ex.get("year") is not None:
            ex["expert"] = router.route(ex["year"])
    return result
