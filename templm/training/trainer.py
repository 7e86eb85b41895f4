"""The T5 trainer: `templm train --gin_file=gin_configs/temporal.gin --gin.MODEL_DIR="'runs/temporal'"`.

`train()` reads in sections, as big_vision's: mesh and checks, model and sharded init, resume, the update step, data,
then the shared loop (templm/training/loop.py: metrics, progress, checkpoints, SIGTERM, the non-finite stop).

Determinism: examples come from seeded SeqIO pipelines, one per data shard (input_pipeline.py); the data position
(batches consumed), the seeds, the number of data shards and each pipeline's iterator state are in every checkpoint,
and a resumed run restores the pipelines where they were (in constant time: nothing is replayed), so a run killed at
any step and restarted ends with the same parameters as one that was never stopped. Dropout keys are
`fold_in(seed, step)`.

Multi-host: every process runs this same function (after `jax.distributed.initialize`), reads and preprocesses only
its data shards' examples and puts only its rows of each batch on its own devices. The global batch depends on the
seed and `data_shards` (by default the number of processes; a checkpoint's own count when resuming), not on the
number of processes: a run can resume on any number of processes that divides its data_shards.

Evaluation during training (`eval_period`) runs the `evaluator` the caller passes (the command line passes
templm.evaluation.checkpoint_eval.evaluate_params): evaluation sits above training in the layering.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import os
import tempfile
from typing import Any, Callable, Dict, Iterator, Mapping, Optional, Tuple

import gin
import jax
import jax.numpy as jnp
import numpy as np
import optax
import seqio
from absl import logging

from templm import console, paths
from templm.errors import ConfigError, DataError, require_folder, require_macros, require_numbers, watch_sigterm
from templm.io import file_sha256
from templm.models.t5 import T5_1_1_CONFIGS, EncoderDecoderModel, T5Config, load_hf_checkpoint
import templm.tasks  # noqa: F401  (registers the SeqIO tasks the configs name)
from templm.training import loop, partitioning, state as train_state
from templm.training.configs import CheckpointConfig, DatasetConfig, require_config
from templm.training.checkpoints import load_params
from templm.training.input_pipeline import TrainingInput
from templm.training.optimizers import bound_optimizer, bound_optimizer_name, logged_learning_rate, make_optimizer

# The model and its sizes are bound in gin (gin_configs/models/*.gin): `MODEL = @templm.EncoderDecoderModel()`.
gin.external_configurable(T5Config, module="templm")
gin.external_configurable(EncoderDecoderModel, module="templm")

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
        metrics = {"loss": loss_sum / denom, "cross_ent_loss": (loss_sum - z_loss) / denom, "z_loss": z_loss / denom,
                   "accuracy": correct / denom,
                   "target_tokens": weight_sum, "grad_norm": optax.tree.norm(grads),
                   "param_norm": new_params_norm}
        return new_state, metrics

    return train_step


def init_state(model, tx, lengths: Mapping[str, int], seed: int, mesh, rules, initial_params: Any = None):
    """(state, shardings): the model's parameters created on the mesh (or `initial_params` placed there), the
    optimizer beside them. Call inside `state.mesh_rules(mesh, rules)`."""
    param_shardings = partitioning.logical_shardings(model.logical_partition_specs(), mesh, rules)
    params = train_state.sharded_params(lambda rng: model.init(rng, lengths["inputs"], lengths["targets"]),
                                        param_shardings, seed)
    if initial_params is not None:
        params = jax.device_put(jax.tree.map(np.asarray, initial_params), param_shardings)
    return train_state.train_state(params, tx, mesh)


def initial_params(path: str, model: Any = None, vocabulary: Any = None):
    """Parameters from a templm (orbax) checkpoint folder or a Hugging Face T5 checkpoint folder (config.json +
    model.safetensors, e.g. the public T5 v1.1 and closed-book QA checkpoints the paper starts from).

    With `model`, every parameter must be the model's, of its shape: a DataError names the checkpoint, the first
    parameters that differ and, for a Hugging Face folder, its sizes (bind the model gin of that size). With the
    tasks' `vocabulary` and a Hugging Face folder that holds its spiece.model, the tasks must read text with that
    SentencePiece model (TEMPLM_VOCABULARY=<folder>/spiece.model): a ConfigError otherwise, since the weights only
    mean something with the ids they were trained on.
    """
    hf_config = None
    if paths.exists(paths.join(path, "config.json")):
        with _local_folder(path) as local:  # safetensors reads local files: a bucket's folder is copied first
            hf_config, params = load_hf_checkpoint(local)
        spiece = paths.join(path, "spiece.model")
        if vocabulary is not None and paths.exists(spiece):
            vocabulary.sp_model  # noqa: B018  (a prepared vocabulary builds its file on first use)
            used = getattr(vocabulary, "sentencepiece_model_file", None)
            if used is None or file_sha256(used) != file_sha256(spiece):
                raise ConfigError(f"INITIAL_CHECKPOINT_PATH {path} was trained with {spiece}, but the tasks read "
                                  f"text with {used}: set TEMPLM_VOCABULARY={spiece} (templm.tasks.configure("
                                  "vocabulary_path=...)) so that the ids mean what the weights learnt")
    else:
        params = load_params(path)[0]
    if model is not None:
        sizes = "" if hf_config is None else (
            f" (the checkpoint: emb_dim {hf_config.emb_dim}, {hf_config.num_encoder_layers}+"
            f"{hf_config.num_decoder_layers} layers, {hf_config.num_heads} heads, mlp_dim {hf_config.mlp_dim}, "
            f"vocab_size {hf_config.vocab_size})")
        check_fits(params, model, path, sizes)
    return params


@contextlib.contextmanager
def _local_folder(path: str):
    """`path` itself when local; else a temporary local copy of the files directly in it (a Hugging Face folder)."""
    if not paths.is_url(path):
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="templm-checkpoint-") as tmp:
        for name in paths.listdir(path):
            if not paths.isdir(paths.join(path, name)):
                paths.copy(paths.join(path, name), os.path.join(tmp, name), overwrite=True)
        yield tmp


def _shapes(tree: Any) -> Dict[str, Tuple[int, ...]]:
    return {jax.tree_util.keystr(k): tuple(np.shape(v)) for k, v in jax.tree_util.tree_leaves_with_path(tree)}


def _named_size(got: Mapping[str, Tuple[int, ...]]) -> Optional[str]:
    """The T5_1_1_CONFIGS name whose parameters have the shapes `got` (at the checkpoint's vocabulary size), or None."""
    embedding = next((shape for name, shape in got.items() if "token_embedder" in name), None)
    if embedding is None:
        return None
    for name, config in T5_1_1_CONFIGS.items():
        sized = dataclasses.replace(config, vocab_size=embedding[0])
        if _shapes(EncoderDecoderModel(sized).abstract_init()) == dict(got):
            return name
    return None


def check_fits(params: Any, model: Any, path: str, sizes: str = "", run_config: Optional[str] = None) -> None:
    """A DataError naming the checkpoint at `path`, the first parameters whose shapes differ from `model`'s and the
    model gin of the checkpoint's size (when it is one of T5_1_1_CONFIGS') or the run's own `run_config` (its
    config.gin), unless every parameter fits."""
    want, got = _shapes(model.abstract_init()), _shapes(params)
    differ = [f"{name}: checkpoint {got.get(name, 'missing')}, model {want.get(name, 'missing')}"
              for name in sorted(set(want) | set(got)) if got.get(name) != want.get(name)]
    if differ:
        named = _named_size(got)
        hint = (f"the checkpoint is T5 v1.1 {named}: add --gin_file=gin_configs/models/t5_1_1_{named}.gin" if named
                else "bind the model of the checkpoint's size (gin_configs/models/t5_1_1_*.gin)")
        if run_config:
            hint += f" (the run's own config: --gin_file={run_config})"
        raise DataError(f"the checkpoint does not fit the model{sizes}: {len(differ)} parameter(s) differ, e.g. "
                        + "; ".join(differ[:3]) + f"; {hint}", path)


CONFIG_GIN = loop.CONFIG_GIN


@gin.configurable(module="templm", denylist=["options"])
def train(model_dir: str = gin.REQUIRED, model: Any = gin.REQUIRED, train_dataset_cfg: DatasetConfig = gin.REQUIRED,
          total_steps: int = gin.REQUIRED, checkpoint_cfg: CheckpointConfig = CheckpointConfig(),
          train_eval_dataset_cfg: Optional[DatasetConfig] = None, eval_period: int = 0, random_seed: int = 0,
          stats_period: int = 10, optimizer: Optional[optax.GradientTransformation] = None, microbatches: int = 1,
          options: loop.RunOptions = loop.RunOptions()) -> loop.TrainResult:
    """Trains `model` on a SeqIO task or mixture; resumes from `model_dir` if it holds a run of the same seeds.

    The parameters are T5X's `train` (gin_configs/base.gin binds them to its macros): train_dataset_cfg the
    training data (`train/templm.DatasetConfig`), checkpoint_cfg how checkpoints are saved and what a new run
    starts from, train_eval_dataset_cfg (`train_eval/templm.DatasetConfig`; default: the training task's
    validation split, batches of 32) what is evaluated every `eval_period` steps (0: never) with the options'
    evaluator, metrics logged every `stats_period` steps. optimizer: an optax transformation (default:
    `templm.make_optimizer()` as gin binds it). microbatches: the global batch's gradient in that many parts (the
    same update, less memory). options: the mesh, progress lines, the gin config written to MODEL_DIR/config.gin
    once the run holds the folder (a resumed run writes its own) and the evaluator.

    Returns a loop.TrainResult. Raises Preempted on SIGTERM (after saving), TrainingError on a non-finite loss.
    """
    # --- Mesh and checks. ----------------------------------------------------------------------------------------
    require_macros("templm.train", {
        "model_dir": ("MODEL_DIR", model_dir), "total_steps": ("TRAIN_STEPS", total_steps), "model": ("MODEL", model)})
    require_config("templm.train.train_dataset_cfg", train_dataset_cfg, DatasetConfig, "@train/templm.DatasetConfig()")
    data_cfg = train_dataset_cfg
    data_cfg.check("train/templm.DatasetConfig")
    checkpoint_cfg.check("templm.CheckpointConfig")
    eval_cfg = train_eval_dataset_cfg or DatasetConfig(data_cfg.mixture_or_task_name, data_cfg.task_feature_lengths,
                                                       32, split="validation")
    eval_cfg.check("train_eval/templm.DatasetConfig")
    require_numbers("templm.train", {
        "total_steps": (total_steps, int, 1, "TRAIN_STEPS"), "microbatches": (microbatches, int, 1, None),
        "random_seed": (random_seed, int, 0, "SEED"), "eval_period": (eval_period, int, 0, "EVAL_PERIOD"),
        "stats_period": (stats_period, int, 1, None)})
    require_folder("templm.train", "model_dir", "MODEL_DIR", os.fspath(model_dir))
    evaluator = options.evaluator
    if eval_period and evaluator is None:
        raise ConfigError("templm.train.eval_period needs an evaluator (templm train passes one; from Python pass "
                          "options=RunOptions(evaluator=templm.evaluation.checkpoint_eval.evaluate_params), or set "
                          "eval_period=0)")
    mesh = options.mesh or partitioning.make_mesh()
    rules = partitioning.logical_axis_rules()
    tx = optimizer or make_optimizer()
    learning_rate = None if optimizer is not None else logged_learning_rate()
    batch_size, seed, save = data_cfg.batch_size, random_seed, checkpoint_cfg.save
    n_data = mesh.shape["data"]
    if batch_size % (n_data * microbatches) or batch_size % jax.process_count():
        raise ValueError(f"batch_size {batch_size} must divide by the data axis ({n_data}) x microbatches "
                         f"({microbatches}) and by the number of processes ({jax.process_count()})")
    lengths = dict(data_cfg.task_feature_lengths)
    inputs = None
    with loop.RunFolder(model_dir, save.period, save.keep, save.async_save,
                        options.config_gin if partitioning.is_lead() else None) as folder, \
            train_state.mesh_rules(mesh, rules), _closing(lambda: inputs):
        checkpointer, log = folder.checkpointer, folder.log
        # --- Model and sharded init: parameters are created already laid out on the mesh. -------------------
        loaded = None
        start_from = checkpoint_cfg.restore.path
        if start_from and checkpointer.latest_step() is None:
            vocabulary = seqio.get_mixture_or_task(data_cfg.mixture_or_task_name).output_features["inputs"].vocabulary
            loaded = initial_params(start_from, model, vocabulary)
            logging.info("initialised from %s", start_from)
        state, state_shardings = init_state(model, tx, lengths, seed, mesh, rules, loaded)

        # --- Resume: what shapes the state or the data checked against the checkpoint's record first. ----------
        meta = {"seed": seed, "data_seed": data_cfg.seed, "mixture_or_task_name": data_cfg.mixture_or_task_name,
                "batch_size": batch_size, "task_feature_lengths": lengths, "pack": data_cfg.pack,
                "split": data_cfg.split, "use_cached": data_cfg.use_cached,
                "vocabulary": _vocabulary_digest(data_cfg.mixture_or_task_name),
                "model_config": describe_model(model),
                "optimizer": bound_optimizer_name() if optimizer is None else None}
        keys = tuple(k for k in _RESUME_BINDINGS if k != "data_shards") + (("data_shards",) if data_cfg.shards else ())
        state, start_step, last, saved = folder.resume(state, {**meta, "data_shards": data_cfg.shards}, keys,
                                                       _RESUME_BINDINGS)
        if start_step:
            logging.info("resumed from step %d", start_step)

        # --- The loop. ----------------------------------------------------------------------------------------
        evaluated: Dict[str, Any] = {}

        def evaluate(step, current):
            evaluated["eval"] = evaluator(model, current["params"], eval_cfg.mixture_or_task_name,
                                          dict(eval_cfg.task_feature_lengths), eval_cfg.split, eval_cfg.num_examples,
                                          eval_cfg.batch_size, step)
            for task, metrics in evaluated["eval"].items():
                log.write(step, f"{eval_cfg.split}/{task}", metrics)

        logged = None
        if start_step < total_steps:  # a finished run is kept as it is: nothing to train, its input untouched
            # --- The update step: one pure function, jitted once per distinct model, optimizer and mesh. -------
            batch_sharding = partitioning.data_sharding(mesh)
            key = (_model_key(model), bound_optimizer() if optimizer is None else id(tx), microbatches, mesh,
                   tuple(rules))
            step_fn = loop.STEPS.get(key, lambda: train_state.compile_step(
                make_train_step(model, tx, microbatches), state_shardings, batch_sharding, mesh), held=tx)

            # --- Data: this process's shards' rows of each global batch, where the checkpoint left them. -----
            inputs = TrainingInput(data_cfg.mixture_or_task_name, lengths, batch_size,
                                   data_cfg.seed if data_cfg.seed is not None else seed, data_cfg.pack,
                                   data_cfg.shards or saved.get("data_shards", 0), split=data_cfg.split,
                                   use_cached=data_cfg.use_cached)
            if start_step:
                names = tuple(inputs.shard_name(s) for s in inputs.shards)
                states = checkpointer.restore_inputs(saved["step"], names)
                why = ("holds no input state (written before templm saved it, as the end of a run of fixed "
                       "length, or by a pipeline tf.data cannot save)")
                if states:
                    try:
                        inputs.restore(states, checkpointer.directory)
                        why = None
                    except DataError as e:  # e.g. written by another TensorFlow: the data position still holds
                        why = f"has an input state this TensorFlow cannot read ({e.reason})"
                if why is not None:
                    console.warn(f"checkpoint {saved['step']} in {checkpointer.directory} {why}: reading the "
                                 f"{start_step} batches it had consumed again to get back to its data position")
                    inputs.replay(start_step)

            meta = {**meta, "data_shards": inputs.data_shards}
            hooks = loop.Hooks(
                evaluate=evaluate, eval_period=eval_period, input_state=inputs.state,
                final_input_state=save.input_state_at_end, progress=options.progress,
                name=os.path.basename(os.path.normpath(model_dir)), stop=options.stop,
                # the rate of the update that made `step` (optax counts updates from 0)
                extra_scalars=None if learning_rate is None else (
                    lambda step: {"learning_rate": learning_rate(step - 1)}))
            context = loop.RunContext(checkpointer, log, meta, jax.random.key(seed + 1), start_step, total_steps,
                                      stats_period, batch_size * (lengths["inputs"] + lengths["targets"]), hooks)
            state, logged = loop.run(
                step_fn, state, lambda position: train_state.global_batch(inputs.next(), batch_sharding), context)
        elif eval_period and evaluator is not None and not log.has_evaluation(start_step):
            # A run stopped during its last evaluation (SIGTERM): its checkpoint is final, its result was never
            # reported; the rerun evaluates that step now.
            console.say(f"{os.path.basename(os.path.normpath(model_dir))}: step {start_step} was saved but its "
                        "evaluation did not finish: evaluating it now")
            with watch_sigterm():
                loop.evaluate_or_stop(evaluate, start_step, state, checkpointer.directory)
    return loop.finish(start_step, total_steps, state, logged, last, eval=evaluated.get("eval"))


# What a resumed run must share with its checkpoint (the state's shapes are checked besides), and the gin binding
# that sets each: a difference is refused before anything is restored (loop.RunFolder.resume).
_RESUME_BINDINGS = {
    "seed": "templm.train.random_seed, SEED", "data_seed": "train/templm.DatasetConfig.seed",
    "mixture_or_task_name": "train/templm.DatasetConfig.mixture_or_task_name, MIXTURE_OR_TASK_NAME",
    "batch_size": "train/templm.DatasetConfig.batch_size, BATCH_SIZE",
    "task_feature_lengths": "train/templm.DatasetConfig.task_feature_lengths, TASK_FEATURE_LENGTHS",
    "pack": "train/templm.DatasetConfig.pack", "split": "train/templm.DatasetConfig.split",
    "use_cached": "train/templm.DatasetConfig.use_cached, USE_CACHED_TASKS",
    "vocabulary": "the task's vocabulary, TEMPLM_VOCABULARY",
    "data_shards": "train/templm.DatasetConfig.shards (0: the checkpoint's)"}


def _vocabulary_digest(mixture_or_task_name: str) -> Optional[str]:
    """The SHA-256 of the task's SentencePiece model (None for a vocabulary that is not one)."""
    vocabulary = seqio.get_mixture_or_task(mixture_or_task_name).output_features["targets"].vocabulary
    model = getattr(vocabulary, "sp_model", None)
    return hashlib.sha256(model).hexdigest() if isinstance(model, bytes) else None


def describe_model(model: Any) -> Dict[str, Any]:
    """A model's class and config as a JSON record (what a checkpoint's record says of the model that wrote it)."""
    config = getattr(model, "config", None)
    fields = dataclasses.asdict(config) if dataclasses.is_dataclass(config) else {}
    return {"class": type(model).__qualname__, **loop.as_record(fields)}


def _model_key(model: Any) -> Any:
    """What a model's compiled step depends on: its class and settings (its config and loss options)."""
    return (type(model).__qualname__,) + tuple(sorted((name, value) for name, value in vars(model).items()
                                                      if name != "module"))


@contextlib.contextmanager
def _closing(get: Callable[[], Any]) -> Iterator[None]:
    """Closes what get() returns (when not None) on leaving: an input iterator left alive at exit can hang the
    process (tf.data)."""
    try:
        yield
    finally:
        held = get()
        if held is not None:
            held.close()


def place_params(model, params: Any, mesh=None):
    """`params` (host arrays) laid out on `mesh` by the logical-axis rules of `model`."""
    mesh = mesh or partitioning.make_mesh()
    shardings = partitioning.logical_shardings(model.logical_partition_specs(), mesh,
                                               partitioning.logical_axis_rules())
    return jax.device_put(jax.tree.map(np.asarray, params), shardings)


def restore_params(model, checkpoint_dir: str, step: Optional[int] = None, mesh=None):
    """(parameters, the checkpoint's record) of a templm checkpoint, laid out on `mesh` by the logical-axis rules."""
    params, meta = load_params(checkpoint_dir, step)
    run_config = paths.join(paths.dirname(paths.absolute(checkpoint_dir)), CONFIG_GIN)
    check_fits(params, model, checkpoint_dir, run_config=run_config if paths.exists(run_config) else None)
    return place_params(model, params, mesh), meta
