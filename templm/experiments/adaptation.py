"""Cheap adaptation to a new year (Dhingra et al., Section 6): fine-tune a trained Temporal model for a few steps on
mixtures that sample the new year's news with probability alpha and the older years' with 1 - alpha, and compare
with a model retrained from scratch on every year, counting the steps each took.

`fine_tune_alphas` runs the fine-tuning (one run per alpha, each evaluated on TempLAMA during training, so every run
also gives a curve of new-year and old-years F1 against steps); `train_with_curve` trains any model the same way (the
retrained reference); `summarize` turns the scores into the comparison the report tabulates. The new-year and
old-years F1 are pooled from the per-year keys (`f1_Y`, `count_Y`) of the task's metrics.
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from templm import paths, tasks
from templm.metrics import time_analysis
from templm.training import trainer
from templm.training.configs import CheckpointConfig, DatasetConfig, RestoreCheckpointConfig


def new_and_old_f1(metrics: Mapping[str, float], new_year: int, old_years: Sequence[int]) -> Dict[str, Optional[float]]:
    """F1 on the new year and pooled F1 (weighted by examples) on the old years, from per-year QA metrics."""
    return {"new_f1": time_analysis.pooled_qa(metrics, [new_year]),
            "old_f1": time_analysis.pooled_qa(metrics, old_years)}


def curve_from_log(metrics_log: str, eval_task: str, eval_split: str, new_year: int,
                   old_years: Sequence[int]) -> List[Dict[str, Any]]:
    """[{step, new_f1, old_f1}] from the trainer's metrics.jsonl rows of `eval_split/eval_task`."""
    curve = []
    if not paths.exists(metrics_log):
        return curve
    with paths.open(metrics_log, encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            if row.get("split") == f"{eval_split}/{eval_task}":
                curve.append({"step": int(row["step"]), **new_and_old_f1(row, new_year, old_years)})
    return curve


def train_with_curve(model_dir: str, data: DatasetConfig, total_steps: int, eval_data: DatasetConfig, new_year: int,
                     old_years: Sequence[int], eval_period: Optional[int] = None,
                     evaluate: Optional[Callable[[Any], Mapping[str, float]]] = None, **train_kwargs) -> Dict[str, Any]:
    """Trains with `templm.training.trainer.train` on `data` and scores new-year and old-years F1 on `eval_data` (a
    TempLAMA task and split).

    With `eval_period` the trainer evaluates every `eval_period` steps and at the end (the curve); without it, the
    final parameters are scored once by `evaluate(params) -> metrics` when given (e.g. with already compiled
    functions), else by the trainer at the last step. Returns the steps, final new/old F1, the curve, the last
    training loss, the parameters and the wall time (seconds, kept apart from the scores). `train_kwargs` go to the
    trainer and its options must hold an `evaluator` when the trainer evaluates."""
    start = time.time()
    in_trainer = bool(eval_period) or evaluate is None
    result = trainer.train(model_dir=model_dir, train_dataset_cfg=data, total_steps=total_steps,
                           train_eval_dataset_cfg=eval_data,
                           eval_period=(eval_period or total_steps) if in_trainer else 0, **train_kwargs)
    if in_trainer:
        curve = curve_from_log(paths.join(model_dir, "metrics.jsonl"), eval_data.mixture_or_task_name,
                               eval_data.split, new_year, old_years)
    else:
        curve = [{"step": int(result.step), **new_and_old_f1(evaluate(result.params), new_year, old_years)}]
    final = curve[-1] if curve else {"new_f1": None, "old_f1": None}
    return {"mixture": data.mixture_or_task_name, "steps": int(result.step), "new_f1": final["new_f1"],
            "old_f1": final["old_f1"], "curve": curve, "train_loss": (result.train or {}).get("loss"),
            "params": result.params, "wall_s": time.time() - start}


def fine_tune_alphas(base_checkpoint: str, new_year: int, old_years: Sequence[int], alphas: Sequence[float],
                     total_steps: int, out_dir: str, data: DatasetConfig, eval_data: DatasetConfig,
                     eval_period: Optional[int] = None, evaluate: Optional[Callable[[Any], Mapping[str, float]]] = None,
                     regime: str = "temporal", checkpoint_cfg: CheckpointConfig = CheckpointConfig(),
                     **train_kwargs) -> Dict[str, Dict[str, Any]]:
    """One fine-tuning run per alpha from `base_checkpoint` on `tasks.adapt_mixture(new_year, alpha, regime)` (read
    as `data` reads its mixture); results keyed by the alpha as text ("0.5"). The SeqIO tasks must be configured
    over data holding `new_year` and older years."""
    runs = {}
    start_from = dataclasses.replace(checkpoint_cfg, restore=RestoreCheckpointConfig(base_checkpoint))
    for alpha in alphas:
        name = tasks.adapt_mixture(new_year, alpha, regime)
        runs[f"{alpha:g}"] = train_with_curve(paths.join(out_dir, name),
                                              dataclasses.replace(data, mixture_or_task_name=name), total_steps,
                                              eval_data, new_year, old_years, eval_period, evaluate=evaluate,
                                              checkpoint_cfg=start_from, **train_kwargs)
    return runs


def summarize(base: Mapping[str, Any], adapted: Mapping[str, Mapping[str, Any]], retrained: Mapping[str, Any],
              base_steps: int) -> Dict[str, Any]:
    """The comparison the report tabulates.

    `base` holds the un-adapted model's new_f1 and old_f1; `adapted` maps alpha to a run's new_f1, old_f1 and steps;
    `retrained` the from-scratch model's. Per alpha: the new-year gain over the base, the share of the base's
    old-years F1 kept, and the total steps (base + fine-tuning) against the retrained model's.
    """
    def ratio(a, b):
        return None if a is None or b in (None, 0) else a / b

    def diff(a, b):
        return None if a is None or b is None else a - b

    rows = {}
    for alpha, run in adapted.items():
        rows[alpha] = {"new_f1": run["new_f1"], "old_f1": run["old_f1"], "steps": int(run["steps"]),
                       "total_steps": int(base_steps) + int(run["steps"]),
                       "new_gain": diff(run["new_f1"], base["new_f1"]),
                       "old_kept": ratio(run["old_f1"], base["old_f1"]),
                       "new_vs_retrained": diff(run["new_f1"], retrained["new_f1"])}
    return {"base": {"new_f1": base["new_f1"], "old_f1": base["old_f1"], "steps": int(base_steps)},
            "retrained": {"new_f1": retrained["new_f1"], "old_f1": retrained["old_f1"],
                          "steps": int(retrained["steps"])},
            "alphas": rows}
