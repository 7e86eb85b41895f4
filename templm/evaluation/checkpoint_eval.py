"""A trained T5 checkpoint (or parameters in memory) on SeqIO tasks: `templm eval` and `templm infer`, and the
evaluator the trainer calls every `eval_period` steps.

`evaluate_checkpoint` and `infer_checkpoint` are gin configurables that read the same macros as training
(`MODEL_DIR`, `TASK_FEATURE_LENGTHS`, `MODEL`, ...; gin_configs/base.gin binds them).
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional

import gin
import seqio

from templm import paths, tasks
from templm.errors import ConfigError
from templm.evaluation.inference import ModelFns, evaluate, infer_texts
from templm.metrics.qa import strip_sentinels
from templm.training import partitioning
from templm.training.state import mesh_rules
from templm.training.trainer import initial_params, place_params, restore_params


def evaluate_params(model, params, mixture_or_task_name: str, task_feature_lengths: Mapping[str, int], split: str,
                    num_examples: Optional[int], batch_size: int, step: int) -> Dict[str, Dict[str, float]]:
    """Every task's metrics (EM/F1, perplexity, by year and slice) for `params` on `split`: {task: {metric: value}}.
    This is the `evaluator` templm.training.trainer.train takes; in a run of several processes each evaluates the
    whole parameters on its own device (partitioning.host_local)."""
    fns = ModelFns(model, partitioning.host_local(params), batch_size=batch_size,
                   max_decode_length=task_feature_lengths["targets"])
    return evaluate(fns, mixture_or_task_name, task_feature_lengths, split=split, num_examples=num_examples,
                    step=step)


@gin.configurable(module="templm")
def evaluate_checkpoint(model_dir: str = gin.REQUIRED, mixture_or_task_name: str = gin.REQUIRED,
                        task_feature_lengths: Mapping[str, int] = gin.REQUIRED, model: Any = gin.REQUIRED,
                        split: str = "test", step: Optional[int] = None, num_examples: Optional[int] = None,
                        batch_size: int = 32, eval_mixture_or_task_name: Optional[str] = None,
                        checkpoint_path: Optional[str] = None) -> Dict[str, Any]:
    """Every task's metrics for the checkpoint in `model_dir` (latest unless `step`) on `split`.

    `checkpoint_path`: evaluate this templm checkpoint folder or Hugging Face T5 folder (config.json +
    model.safetensors) instead, as it is, e.g. Dhingra et al.'s T5-CBQA row (the public closed-book QA checkpoint
    before any news; gin_configs/cbqa.gin); it must fit `model` and read the tasks' vocabulary, as an
    INITIAL_CHECKPOINT_PATH must. `model_dir` then only receives the evaluation's files."""
    name = eval_mixture_or_task_name or mixture_or_task_name
    try:
        provider = seqio.get_mixture_or_task(name)
    except ValueError:
        raise ConfigError(f"no task or mixture named {name!r} is registered (see templm/tasks/registry.py)") from None
    if split not in provider.splits:
        raise ConfigError(f"split {split!r}: {name} has the splits {', '.join(sorted(provider.splits))}")
    if num_examples is not None and num_examples < 1:
        raise ConfigError(f"num_examples must be at least 1, got {num_examples} (leave it unset for every example)")
    lengths = dict(task_feature_lengths)
    mesh = partitioning.make_mesh()
    with mesh_rules(mesh, partitioning.logical_axis_rules()):
        if checkpoint_path:
            params = place_params(model, initial_params(checkpoint_path, model, tasks.current()["vocabulary"]), mesh)
            meta = {"step": 0}
        else:
            params, meta = restore_params(model, paths.join(model_dir, "checkpoints"), step, mesh)
        results = evaluate_params(model, params, name, lengths, split, num_examples, batch_size, meta["step"])
    out = {"model_dir": model_dir, "step": meta["step"], "split": split, "metrics": results}
    if checkpoint_path:
        out["checkpoint"] = checkpoint_path
    return out


@gin.configurable(module="templm")
def infer_checkpoint(inputs, model_dir: str = gin.REQUIRED, task_feature_lengths: Mapping[str, int] = gin.REQUIRED,
                     model: Any = gin.REQUIRED, step: Optional[int] = None, batch_size: int = 32,
                     method: str = "greedy", num_beams: int = 4):
    """Predictions (text, sentinels stripped) of the checkpoint in `model_dir` for raw input strings."""
    lengths = dict(task_feature_lengths)
    mesh = partitioning.make_mesh()
    with mesh_rules(mesh, partitioning.logical_axis_rules()):
        params, _ = restore_params(model, paths.join(model_dir, "checkpoints"), step, mesh)
        fns = ModelFns(model, params, batch_size=batch_size, method=method, num_beams=num_beams,
                       max_decode_length=lengths["targets"])
        return infer_texts(fns, tasks.current()["vocabulary"], list(inputs), lengths["inputs"], strip_sentinels)
