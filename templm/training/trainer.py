"""The gin trainer: `templm train --gin_file=gin_configs/temporal.gin --gin.MODEL_DIR="'runs/temporal'"`.

One readable `train()` in sections, as big_vision's: data, model and mesh, sharded init, the update step, checkpoint
and resume, the loop with evaluation, metrics and progress.

Determinism: examples come from a seeded SeqIO pipeline; the data position (batches consumed) and the seeds are in
every checkpoint, and a resumed run skips exactly the batches it had seen, so a run killed at any step and restarted
ends with the same parameters as one that was never stopped. Dropout keys are `fold_in(seed, step)`.

Multi-host: every process runs this same function (after `jax.distributed.initialize`), reads the same example
stream and keeps every `process_count`-th example, so the global batch is the same examples whatever the number of
processes; each process puts only its rows on its own devices.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
import signal
import time
from typing import Any, Dict, Mapping, Optional

import gin
import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import logging

from templm.data.records import DataError
from templm.models.t5 import EncoderDecoderModel, T5Config
from templm.training import partitioning
from templm.training.checkpoints import Checkpointer, abstract_like, load_params
from templm.training.optimizers import make_optimizer


# The model and its sizes are bound in gin (gin_configs/models/*.gin): `MODEL = @templm.EncoderDecoderModel()`.
gin.external_configurable(T5Config, module="templm")
gin.external_configurable(EncoderDecoderModel, module="templm")


class TrainingError(RuntimeError):
    """The run cannot go on (a NaN loss): the message says why and which checkpoint is the last good one."""


def check_finite(metrics: Mapping[str, Any], step: int, checkpointer) -> None:
    """Raises TrainingError when the loss or the parameter norm is not finite, naming the last good checkpoint.
    Called before every save, so no checkpoint ever holds non-finite parameters."""
    if not (np.isfinite(metrics["loss"]) and np.isfinite(metrics["param_norm"])):
        good = checkpointer.latest_step()
        raise TrainingError(f"loss {metrics['loss']}, parameter norm {metrics['param_norm']} at step {step}: "
                            f"stopping; the last good checkpoint is step {good} in {checkpointer.directory}")


@dataclasses.dataclass
class Chrono:
    """Steps/s, tokens/s and ETA over the steps since the last report."""

    total_steps: int
    tokens_per_step: int
    start_step: int = 0

    def __post_init__(self):
        self.t0 = self.t_last = time.time()
        self.step_last = self.start_step

    def report(self, step: int) -> Dict[str, float]:
        now = time.time()
        dt = max(now - self.t_last, 1e-9)
        rate = (step - self.step_last) / dt
        self.t_last, self.step_last = now, step
        eta = (self.total_steps - step) / rate if rate > 0 else float("inf")
        return {"steps_per_sec": rate, "tokens_per_sec": rate * self.tokens_per_step, "eta_sec": eta}


def _eta(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    minutes, sec = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{sec:02d}s"


class MetricsLog:
    """TensorBoard summaries through clu's writers plus `metrics.jsonl`, written by process 0 only."""

    def __init__(self, model_dir: str):
        from clu import metric_writers

        self.enabled = jax.process_index() == 0
        self.path = os.path.join(model_dir, "metrics.jsonl")
        self.writer = metric_writers.create_default_writer(model_dir, just_logging=not self.enabled,
                                                           asynchronous=False)

    def write(self, step: int, split: str, scalars: Mapping[str, float]) -> None:
        scalars = {k: float(v) for k, v in scalars.items()}
        self.writer.write_scalars(step, {f"{split}/{k}": v for k, v in scalars.items()})
        if self.enabled:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps({"step": step, "split": split, **scalars}) + "\n")

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()


def training_features(ds, task_feature_lengths: Mapping[str, int], pack: bool):
    """A task's or mixture's examples as the model's features: seqio's EncDecFeatureConverter as the trainer applies
    it. Two settings make it faster without changing a single row (tests/test_trainer.py compares the batches with
    seqio's defaults): the converter's per-example length assertions are off (`apply_length_check=False`; seqio
    trims the task features to these lengths and the converter pads or packs to them, so both checks hold by
    construction), and tf.data fuses consecutive per-example maps. Together they lift packed rows/s by ~50 % for a
    task and ~15 % for a mixture (BENCHMARKS.md, input pipeline; `tools/bench_data.py --stages` times both)."""
    import seqio
    import tensorflow as tf

    ds = seqio.EncDecFeatureConverter(pack=pack, apply_length_check=False)(ds, task_feature_lengths)
    options = tf.data.Options()
    options.experimental_optimization.map_fusion = True
    return ds.with_options(options)


def _dataset(mixture_or_task_name, task_feature_lengths, local_batch, seed, pack, start_batch, split="train"):
    """The training batches: the task's or mixture's examples (shuffled, repeated), `training_features`, batched,
    skipped to `start_batch`."""
    import seqio

    ds = seqio.get_mixture_or_task(mixture_or_task_name).get_dataset(
        task_feature_lengths, split=split, shuffle=True, num_epochs=None, seed=seed)
    ds = training_features(ds, task_feature_lengths, pack)
    if jax.process_count() > 1:
        ds = ds.shard(jax.process_count(), jax.process_index())
    ds = ds.batch(local_batch, drop_remainder=True)
    if start_batch:
        ds = ds.skip(start_batch)  # resume: the exact batches an uninterrupted run would see next
    return ds.prefetch(2)


def make_train_step(model, tx, microbatches: int = 1):
    """train_step(state, batch, rng) -> (state, metrics).

    The loss is the summed cross-entropy (+ z-loss) over the global batch divided by its number of target tokens
    (T5X's NUM_REAL_TARGET_TOKENS), whatever the model's own normalisation, so the same batch gives the same update
    for any number of microbatches or devices.
    """
    summing = copy.copy(model)
    summing.loss_normalizing_factor = 1.0

    def loss_and_grads(params, batch, rng):
        (loss_sum, aux), grads = jax.value_and_grad(summing.loss_fn, has_aux=True)(params, batch, rng)
        return loss_sum, aux, grads

    def train_step(state, batch, rng):
        rng = jax.random.fold_in(rng, state["step"])
        params = state["params"]
        if microbatches == 1:
            loss_sum, aux, grads = loss_and_grads(params, batch, rng)
            weight_sum, z_loss, correct = aux["weight_sum"], aux["z_loss"], aux["num_correct"]
        else:
            split = jax.tree.map(lambda x: x.reshape((microbatches, -1) + x.shape[1:]), batch)

            def body(carry, micro):
                i, micro_batch = micro
                loss_i, aux_i, grads_i = loss_and_grads(params, micro_batch, jax.random.fold_in(rng, i))
                acc = jax.tree.map(jnp.add, carry, (loss_i, aux_i["weight_sum"], aux_i["z_loss"],
                                                    aux_i["num_correct"], grads_i))
                return acc, None

            zeros = (0.0, 0.0, 0.0, 0.0, jax.tree.map(jnp.zeros_like, params))
            (loss_sum, weight_sum, z_loss, correct, grads), _ = jax.lax.scan(
                body, jax.tree.map(jnp.asarray, zeros), (jnp.arange(microbatches), split))
        denom = jnp.maximum(weight_sum, 1.0)
        grads = jax.tree.map(lambda g: g / denom, grads)
        updates, opt_state = tx.update(grads, state["opt_state"], params)
        new_state = {"step": state["step"] + 1, "params": optax.apply_updates(params, updates),
                     "opt_state": opt_state}
        new_params_norm = optax.tree.norm(new_state["params"])
        metrics = {"loss": loss_sum / denom, "z_loss": z_loss / denom, "accuracy": correct / denom,
                   "target_tokens": weight_sum, "grad_norm": optax.tree.norm(grads),
                   "param_norm": new_params_norm}
        return new_state, metrics

    return train_step


def _initial_params(path: str):
    """Parameters from a templm (orbax) checkpoint folder or a Hugging Face T5 checkpoint (config.json)."""
    if os.path.exists(os.path.join(path, "config.json")):
        from templm.models.t5 import load_hf_checkpoint

        return load_hf_checkpoint(path)[1]
    return load_params(path)[0]


@gin.configurable(module="templm", denylist=["mesh"])
def train(model_dir: str = gin.REQUIRED, mixture_or_task_name: str = gin.REQUIRED,
          task_feature_lengths: Mapping[str, int] = gin.REQUIRED, train_steps: int = gin.REQUIRED,
          batch_size: int = gin.REQUIRED, model: Any = gin.REQUIRED, optimizer: Optional[optax.GradientTransformation] = None,
          microbatches: int = 1, seed: int = 0, data_seed: Optional[int] = None, pack: bool = True,
          save_period: int = 1000, keep_checkpoints: Optional[int] = 3, eval_period: int = 0,
          eval_split: str = "validation", eval_num_examples: Optional[int] = None, eval_batch_size: int = 32,
          eval_mixture_or_task_name: Optional[str] = None, initial_checkpoint_path: Optional[str] = None,
          log_period: int = 10, mesh=None) -> Dict[str, Any]:
    """Trains `model` on a SeqIO task or mixture; returns the last train metrics and evaluation results."""
    import tasks  # noqa: F401  (registers the SeqIO tasks; its gin configurable may set the data folder)

    _check_required(model_dir=model_dir, mixture_or_task_name=mixture_or_task_name,
                    task_feature_lengths=task_feature_lengths, train_steps=train_steps, batch_size=batch_size,
                    model=model)
    os.makedirs(model_dir, exist_ok=True)
    mesh = mesh or partitioning.make_mesh()
    rules = partitioning.logical_axis_rules()
    tx = optimizer or make_optimizer()
    n_data = mesh.shape["data"]
    if batch_size % (n_data * microbatches) or batch_size % jax.process_count():
        raise ValueError(f"batch_size {batch_size} must divide by the data axis ({n_data}) x microbatches "
                         f"({microbatches}) and by the number of processes ({jax.process_count()})")
    lengths = dict(task_feature_lengths)

    # --- Model and sharded init: parameters are created already laid out on the mesh. -------------------------
    param_shardings = partitioning.logical_shardings(model.logical_partition_specs(), mesh, rules)
    checkpointer = Checkpointer(os.path.join(model_dir, "checkpoints"), save_period, keep_checkpoints)
    with jax.set_mesh(mesh), nn_rules(rules):
        init = jax.jit(lambda rng: model.init(rng, lengths["inputs"], lengths["targets"]),
                       out_shardings=param_shardings)
        params = init(jax.random.key(seed))
        if initial_checkpoint_path and checkpointer.latest_step() is None:
            loaded = _initial_params(initial_checkpoint_path)
            params = jax.device_put(jax.tree.map(np.asarray, loaded), param_shardings)
            logging.info("initialised from %s", initial_checkpoint_path)
        # Optimizer statistics take the layout XLA propagates from the parameters; scalars (counts) are replicated.
        opt_state = jax.jit(tx.init)(params)
        opt_state = jax.tree.map(
            lambda x: x if len(x.sharding.device_set) == mesh.size else jax.device_put(x, partitioning.replicated(mesh)),
            opt_state)
        state = {"step": jax.device_put(jnp.zeros((), jnp.int32), partitioning.replicated(mesh)), "params": params,
                 "opt_state": opt_state}
        state_shardings = jax.tree.map(lambda x: x.sharding, state)

        # --- Resume. ------------------------------------------------------------------------------------------------
        start_step = 0
        if checkpointer.latest_step() is not None:
            state, meta = checkpointer.restore(abstract_like(state))
            start_step = int(meta["data_position"])
            if meta.get("seed") != seed or meta.get("data_seed") != data_seed:
                raise DataError(f"checkpoint was written with seed {meta.get('seed')}/data_seed "
                                f"{meta.get('data_seed')}, this run has {seed}/{data_seed}", checkpointer.directory)
            logging.info("resumed from step %d", start_step)

        # --- The update step: one pure function, jitted once, the state donated. ----------------------------------
        batch_sharding = partitioning.data_sharding(mesh)
        step_fn = jax.jit(make_train_step(model, tx, microbatches),
                          in_shardings=(state_shardings, batch_sharding, partitioning.replicated(mesh)),
                          out_shardings=(state_shardings, partitioning.replicated(mesh)), donate_argnums=0)

        # --- Data. -------------------------------------------------------------------------------------------------
        local_batch = batch_size // jax.process_count()
        dataset = _dataset(mixture_or_task_name, lengths, local_batch, data_seed if data_seed is not None else seed,
                           pack, start_step)
        iterator = dataset.as_numpy_iterator()

        log = MetricsLog(model_dir)
        chrono = Chrono(train_steps, batch_size * (lengths["inputs"] + lengths["targets"]), start_step)
        meta = {"seed": seed, "data_seed": data_seed, "mixture_or_task_name": mixture_or_task_name,
                "batch_size": batch_size, "task_feature_lengths": lengths}
        stop = {"signal": None}
        previous = signal.signal(signal.SIGTERM, lambda signum, frame: stop.update(signal=signum))
        rng = jax.random.key(seed + 1)
        result: Dict[str, Any] = {"start_step": start_step}
        step = start_step
        try:
            while step < train_steps:
                local = next(iterator)
                batch = {k: jax.make_array_from_process_local_data(batch_sharding, v) for k, v in local.items()}
                state, metrics = step_fn(state, batch, rng)
                step += 1
                last = step == train_steps
                if step % log_period == 0 or last or checkpointer.should_save(step) or stop["signal"]:
                    metrics = jax.device_get(metrics)
                    check_finite(metrics, step, checkpointer)
                    timing = chrono.report(step)
                    log.write(step, "train", {**metrics, **timing})
                    logging.info("step %d/%d  loss %.4f  %.2f steps/s  %.0f tokens/s  ETA %s", step, train_steps,
                                 metrics["loss"], timing["steps_per_sec"], timing["tokens_per_sec"],
                                 _eta(timing["eta_sec"]))
                    result["train"] = {k: float(v) for k, v in metrics.items()}
                if checkpointer.should_save(step) or last or stop["signal"]:
                    checkpointer.save(step, state, {**meta, "step": step, "data_position": step})
                if eval_period and (step % eval_period == 0 or last):
                    result["eval"] = evaluate_state(model, state["params"], eval_mixture_or_task_name or
                                                    mixture_or_task_name, lengths, eval_split, eval_num_examples,
                                                    eval_batch_size, step, log)
                if stop["signal"]:
                    logging.warning("SIGTERM at step %d: checkpoint saved, exiting", step)
                    result["preempted_at"] = step
                    break
        finally:
            signal.signal(signal.SIGTERM, previous)
            del iterator  # an iterator left alive at exit can hang the process (tf.data)
            log.close()
            checkpointer.close()
    result["step"] = step
    result["params"] = state["params"]
    return result


_MACROS = {"model_dir": "MODEL_DIR", "mixture_or_task_name": "MIXTURE_OR_TASK_NAME",
           "task_feature_lengths": "TASK_FEATURE_LENGTHS", "train_steps": "TRAIN_STEPS", "batch_size": "BATCH_SIZE",
           "model": "MODEL"}


def _check_required(**values) -> None:
    """A macro left at %gin.REQUIRED arrives as gin's sentinel: name the macro to set instead of failing later."""
    from templm.cli import ConfigError

    for name, value in values.items():
        if value is gin.REQUIRED:
            macro = _MACROS.get(name, name)
            raise ConfigError(f"templm.train.{name} is required: set the gin macro {macro}, e.g. "
                              f"--gin.{macro}=...")


def nn_rules(rules):
    import flax.linen as nn

    return nn.logical_axis_rules(list(rules))


def evaluate_state(model, params, mixture_or_task_name, lengths, split, num_examples, batch_size, step, log=None):
    """Runs every task's metrics on `split` and logs them under `split/<task>/<metric>`."""
    from templm.training.inference import ModelFns, evaluate

    fns = ModelFns(model, params, batch_size=batch_size, max_decode_length=lengths["targets"])
    results = evaluate(fns, mixture_or_task_name, lengths, split=split, num_examples=num_examples, step=step)
    if log is not None:
        for task, metrics in results.items():
            log.write(step, f"{split}/{task}", metrics)
    return results


def restore_params(model, checkpoint_dir: str, task_feature_lengths: Mapping[str, int], step: Optional[int] = None,
                   mesh=None):
    """Parameters of a templm checkpoint, laid out on `mesh` by the logical-axis rules."""
    mesh = mesh or partitioning.make_mesh()
    rules = partitioning.logical_axis_rules()
    shardings = partitioning.logical_shardings(model.logical_partition_specs(), mesh, rules)
    params, meta = load_params(checkpoint_dir, step)
    return jax.device_put(jax.tree.map(np.asarray, params), shardings), meta


@gin.configurable(module="templm")
def evaluate_checkpoint(model_dir: str = gin.REQUIRED, mixture_or_task_name: str = gin.REQUIRED,
                        task_feature_lengths: Mapping[str, int] = gin.REQUIRED, model: Any = gin.REQUIRED,
                        split: str = "test", step: Optional[int] = None, num_examples: Optional[int] = None,
                        batch_size: int = 32, eval_mixture_or_task_name: Optional[str] = None) -> Dict[str, Any]:
    """Every task's metrics for the checkpoint in `model_dir` (latest unless `step`) on `split`."""
    import tasks  # noqa: F401

    lengths = dict(task_feature_lengths)
    mesh = partitioning.make_mesh()
    with jax.set_mesh(mesh), nn_rules(partitioning.logical_axis_rules()):
        params, meta = restore_params(model, os.path.join(model_dir, "checkpoints"), lengths, step, mesh)
        results = evaluate_state(model, params, eval_mixture_or_task_name or mixture_or_task_name, lengths, split,
                                 num_examples, batch_size, meta["step"])
    return {"model_dir": model_dir, "step": meta["step"], "split": split, "metrics": results}


@gin.configurable(module="templm")
def infer_checkpoint(inputs, model_dir: str = gin.REQUIRED, task_feature_lengths: Mapping[str, int] = gin.REQUIRED,
                     model: Any = gin.REQUIRED, step: Optional[int] = None, batch_size: int = 32,
                     method: str = "greedy", num_beams: int = 4):
    """Predictions (text, sentinels stripped) of the checkpoint in `model_dir` for raw input strings."""
    import tasks

    from templm.evaluation.qa_metrics import strip_sentinels
    from templm.training.inference import ModelFns, infer_texts

    lengths = dict(task_feature_lengths)
    mesh = partitioning.make_mesh()
    with jax.set_mesh(mesh), nn_rules(partitioning.logical_axis_rules()):
        params, meta = restore_params(model, os.path.join(model_dir, "checkpoints"), lengths, step, mesh)
        fns = ModelFns(model, params, batch_size=batch_size, method=method, num_beams=num_beams,
                       max_decode_length=lengths["targets"])
        return infer_texts(fns, tasks.current()["vocabulary"], list(inputs), lengths["inputs"], strip_sentinels)
