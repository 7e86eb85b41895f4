"""Language-model training of the Transformer-XL on one split: `templm train-lm --gin_file=txl/time_stratified.gin`.

The streaming-perplexity experiments' trainer ("Mind the Gap"). It shares with the T5 trainer the mesh and the
logical-axis rules, the sharded state and compiled step (state.py), orbax checkpoints holding the data position,
and the one loop (loop.py: metrics, progress, checkpoints, SIGTERM, the non-finite stop). `train_lm()` is one
readable function in sections.

Data: the documents of one split, tokenised and laid out as `batch_size` parallel streams read in segments of
`tgt_len` tokens (templm/data/lm_data.py; ``data_order`` "date" or "shuffle").

Memory. Segment-level recurrence runs across consecutive steps: the train state carries the memories (n_layer + 1
arrays [batch, mem_len, d_model], fixed shapes) and `mem_valid` ([batch], how many memory rows hold real history).
The first segment of every epoch resets `mem_valid` to 0, so a row never attends to the end of the previous epoch.

Resume is exact. The data position is the number of segments consumed (= the step); the memories and `mem_valid`
are part of the checkpointed state, so a run stopped after k steps and resumed to n ends with the same parameters,
optimizer state and memories, bit for bit, as a run of n steps that never stopped. A checkpoint also records the
seeds, the data order, the batch layout and a fingerprint of the token stream; resuming with other data is an error.

(The default cosine learning-rate schedule spans `train_steps`: resuming with another `train_steps` changes the
rates of the remaining steps, as it would in any trainer.)

A checkpoint records the model configuration, the corpus, the split and the SentencePiece model (with its SHA-256),
so `load_lm(model_dir)` rebuilds the model without any configuration and `templm stream` can check that the models
it compares share one vocabulary.

Multi-host: every process tokenises the same documents and puts its own rows of each batch on its own devices.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Dict, Mapping, Optional, Tuple, Union

import flax.linen as nn
import gin
import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import logging
from jax.sharding import PartitionSpec

from templm.data.lm_data import (DATA_ORDERS, LMData, load_processor, read_split_documents, split_path,
                                 tokenize_documents)
from templm.data.readers import resolve_corpus
from templm.errors import DataError, require_folder, require_macros, require_numbers
from templm.io import file_sha256
from templm.models.transformer_xl import TXL_CONFIGS, TransformerXL, TransformerXLConfig, lm_loss, next_mem_valid
from templm.training import loop, partitioning, state as train_state
from templm.training.checkpoints import load_params
from templm.training.optimizers import learning_rate_schedule, make_optimizer

gin.external_configurable(TransformerXLConfig, module="templm")

_MEM_AXES = ("batch", "length", "embed")


# ----------------------------------------------------------------------------------------------------------------
# Model configuration in checkpoints.


def resolve_config(config: Union[str, TransformerXLConfig]) -> TransformerXLConfig:
    """A TransformerXLConfig (a TXL_CONFIGS name is accepted); dtype normalised to a numpy dtype ('bfloat16' ok)."""
    if isinstance(config, str):
        if config not in TXL_CONFIGS:
            raise ValueError(f"unknown Transformer-XL config {config!r}; known: {sorted(TXL_CONFIGS)}")
        config = TXL_CONFIGS[config]
    if not isinstance(config, TransformerXLConfig):
        raise ValueError(f"config must be a TransformerXLConfig or one of {sorted(TXL_CONFIGS)}, got {config!r}")
    try:
        dtype = jnp.dtype(config.dtype)
    except TypeError as e:
        raise ValueError(f"TransformerXLConfig.dtype {config.dtype!r} is not a dtype: {e}") from None
    return dataclasses.replace(config, dtype=dtype)


def config_to_json(config: TransformerXLConfig) -> Dict[str, Any]:
    out = dataclasses.asdict(config)
    out["dtype"] = jnp.dtype(config.dtype).name
    return out


def config_from_json(values: Dict[str, Any], where: str = "") -> TransformerXLConfig:
    names = {f.name for f in dataclasses.fields(TransformerXLConfig)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise DataError(f"checkpoint model_config has unknown fields {unknown}", where)
    try:
        return resolve_config(TransformerXLConfig(**values))
    except (TypeError, ValueError) as e:
        raise DataError(f"checkpoint model_config is not valid: {e}", where) from None


def load_lm(model_dir: str, step: Optional[int] = None) -> Tuple[TransformerXL, Any, Dict[str, Any]]:
    """(model, params as host arrays, checkpoint record) of a `train_lm` run folder (latest step unless `step`)."""
    directory = os.path.join(os.fspath(model_dir), "checkpoints")
    if not os.path.isdir(directory):
        raise DataError("no checkpoints folder: not a trained Transformer-XL run (templm train_lm)", model_dir)
    params, meta = load_params(directory, step)
    if "model_config" not in meta:
        raise DataError("the checkpoint records no model_config: not a Transformer-XL run (templm train_lm)",
                        directory)
    model = TransformerXL(config_from_json(meta["model_config"], directory))
    return model, jax.tree.map(np.asarray, params), _paths_here(meta, os.path.abspath(os.fspath(model_dir)))


# The files a run's record names: each relative to the run's folder where it lies in the folder that holds the run
# (a study's vocabulary, splits and world beside its models), so the whole folder can be moved or renamed; absolute
# otherwise (a corpus of the user's, elsewhere).
_RECORDED_PATHS = ("corpus", "split_file", "spm_model")


def _portable(path: str, model_dir: str) -> str:
    path = os.path.abspath(path)
    return os.path.relpath(path, model_dir) if path.startswith(os.path.dirname(model_dir) + os.sep) else path


def _paths_here(meta: Mapping[str, Any], model_dir: str) -> Dict[str, Any]:
    """The record with its paths as paths here (relative ones are the run folder's, wherever it now is)."""
    def here(value):
        if isinstance(value, (list, tuple)):
            return [here(v) for v in value]
        return value if os.path.isabs(value) else os.path.normpath(os.path.join(model_dir, value))

    return {**meta, **{key: here(meta[key]) for key in _RECORDED_PATHS if isinstance(meta.get(key), (str, list))}}


# ----------------------------------------------------------------------------------------------------------------
# The update step.


def make_lm_train_step(model: TransformerXL, tx: optax.GradientTransformation, mem_len: int):
    """train_step(state, batch, rng) -> (state, metrics): one segment per row, memory carried in the state.

    state: {"step", "params", "opt_state", "mems" (n_layer + 1 arrays [B, mem_len, d]), "mem_valid" [B]};
    batch: {"inputs", "targets" [B, T], "reset" [B]} (reset rows start with an empty memory). The loss is the mean
    next-token cross-entropy over the B x T targets of the global batch.
    """

    def train_step(state, batch, rng):
        rng = jax.random.fold_in(rng, state["step"])
        valid = jnp.where(batch["reset"] > 0, 0, state["mem_valid"])

        def loss_fn(params):
            loss, _, new_mems = lm_loss(params, batch["inputs"], batch["targets"], state["mems"], mem_len, False,
                                        {"dropout": rng}, model=model, mem_valid=valid)
            return loss, new_mems

        (loss, new_mems), grads = jax.value_and_grad(loss_fn, has_aux=True)(state["params"])
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        new_mems = [m.astype(old.dtype) for m, old in zip(new_mems, state["mems"])]
        new_state = {"step": state["step"] + 1, "params": params, "opt_state": opt_state, "mems": new_mems,
                     "mem_valid": next_mem_valid(valid, batch["inputs"].shape[1], mem_len).astype(jnp.int32)}
        metrics = {"loss": loss, "ppl": jnp.exp(loss), "grad_norm": optax.tree.norm(grads),
                   "param_norm": optax.tree.norm(params)}
        return new_state, metrics

    return train_step


def init_state(model: TransformerXL, tx, batch_size: int, mem_len: int, seed: int, mesh, rules):
    """(state, shardings): parameters, optimizer state and empty memories, created already laid out on the mesh.
    Call inside `state.mesh_rules(mesh, rules)`."""
    tokens = jnp.zeros((batch_size, model.config.tgt_len), jnp.int32)

    def init_params(rng):
        return model.init(rng, tokens, None, True, mem_len=0)["params"]

    boxed = jax.eval_shape(init_params, jax.random.key(seed))
    param_shardings = partitioning.logical_shardings(nn.get_partition_spec(boxed), mesh, rules)
    params = train_state.sharded_params(lambda rng: nn.unbox(init_params(rng)), param_shardings, seed)
    mem_sharding = partitioning.logical_shardings(PartitionSpec(*_MEM_AXES), mesh, rules)
    row_sharding = partitioning.logical_shardings(PartitionSpec("batch"), mesh, rules)
    mems = [jax.device_put(m, mem_sharding) for m in model.init_mems(batch_size, mem_len)]
    return train_state.train_state(params, tx, mesh, mems=mems,
                                   mem_valid=jax.device_put(jnp.zeros((batch_size,), jnp.int32), row_sharding))


# ----------------------------------------------------------------------------------------------------------------
# The training run.


# Runs with the same model, mesh and optimizer settings (TIME-STRATIFIED and CONTROL) share one compiled step.
_STEP_CACHE: Dict[Any, Any] = {}
# What a resumed run must share with the checkpoint it resumes.
_RESUME_KEYS = ("seed", "data_seed", "data_order", "batch_size", "tgt_len", "mem_len", "data_fingerprint",
                "model_config")


@gin.configurable(module="templm", denylist=["mesh", "progress", "config_gin"])
def train_lm(model_dir: str = gin.REQUIRED, corpus: str = gin.REQUIRED, split_file: Optional[str] = None,
             spm_model: str = gin.REQUIRED, config: Union[str, TransformerXLConfig] = gin.REQUIRED,
             train_steps: int = gin.REQUIRED, batch_size: int = gin.REQUIRED, learning_rate: float = 2.5e-4, *,
             split_dir: Optional[str] = None, split: str = "time_stratified_train",
             optimizer: Optional[optax.GradientTransformation] = None, warmup_steps: int = 0,
             schedule: str = "cosine", max_grad_norm: float = 0.25, seed: int = 0, data_seed: Optional[int] = None,
             data_order: str = "date", corpus_format: str = "auto", on_error: str = "raise",
             allow_missing_ids: bool = False, save_period: int = 1000, keep_checkpoints: Optional[int] = 3,
             log_period: int = 10, mesh=None, progress: Union[bool, float] = True,
             config_gin: Optional[str] = None) -> Dict[str, Any]:
    """Trains a Transformer-XL language model on one split of a corpus; resumes from `model_dir` if it holds a run.

    Args:
      model_dir: run folder: `checkpoints/` (orbax), `metrics.jsonl`, TensorBoard events.
      corpus: the corpus (one file in any format templm.data reads, a glob pattern or a list); split_file: its split
        file (`YYYYMMDD<TAB>id` lines), or split_dir + split (`split_dir/split.gz`, or `split_dir/split` where a
        release folder was gunzipped; e.g. split="control_train").
      spm_model: the SentencePiece model (T5 ids; EOS separates documents). config.vocab_size must hold its pieces.
      config: a TransformerXLConfig or a TXL_CONFIGS name; tgt_len is the segment length, mem_len the training
        memory.
      train_steps, batch_size: segments per row and parallel rows (the global batch is batch_size x tgt_len tokens).
      learning_rate, warmup_steps, schedule, max_grad_norm: Adam with this schedule (templm.training.optimizers);
        `optimizer` replaces it.
      seed: parameter init and dropout; data_seed (default seed): the document shuffle of data_order="shuffle".
      data_order: "date" (split order) or "shuffle" (documents permuted per epoch); see templm/data/lm_data.py.
      save_period / keep_checkpoints / log_period: checkpoint every N steps (and at the end, and on SIGTERM), keep
        the last K; log metrics every N steps.
      mesh: a ("data", "model") mesh (default `partitioning.make_mesh()`, bindable in gin).
      progress: print a progress line every log_period steps (True), at most once in that many seconds (a number),
        or none (False).
      config_gin: the gin config that made the run (`gin.config_str()`, as `templm train-lm` passes it), written to
        MODEL_DIR/config.gin as T5X does.

    Returns {"step", "start_step", "train": last logged metrics, "data": data statistics, "params", "mems"}.
    Raises Preempted on SIGTERM (after saving), TrainingError on a non-finite loss (naming the last good
    checkpoint), DataError on bad input (naming the file).
    """
    require_macros("templm.train_lm", {
        "model_dir": ("MODEL_DIR", model_dir), "corpus": ("CORPUS", corpus), "spm_model": ("SPM_MODEL", spm_model),
        "config": ("MODEL_CONFIG", config), "train_steps": ("TRAIN_STEPS", train_steps),
        "batch_size": ("BATCH_SIZE", batch_size)})
    require_numbers("templm.train_lm", {
        "train_steps": (train_steps, int, 1, "TRAIN_STEPS"), "batch_size": (batch_size, int, 1, "BATCH_SIZE"),
        "learning_rate": (learning_rate, float, 0, "LEARNING_RATE"), "warmup_steps": (warmup_steps, int, 0, None),
        "max_grad_norm": (max_grad_norm, float, 0, None), "seed": (seed, int, 0, "SEED"),
        "data_seed": (data_seed, int, 0, None), "save_period": (save_period, int, 0, "SAVE_PERIOD"),
        "keep_checkpoints": (keep_checkpoints, int, 1, None), "log_period": (log_period, int, 1, None)},
        optional=("data_seed", "keep_checkpoints"))
    require_folder("templm.train_lm", "model_dir", "MODEL_DIR", os.fspath(model_dir))
    config = resolve_config(config)
    data_seed = seed if data_seed is None else data_seed
    if data_order not in DATA_ORDERS:
        raise ValueError(f"data_order must be one of {DATA_ORDERS}, got {data_order!r}")
    model_dir = os.path.abspath(os.fspath(model_dir))
    split_file = os.path.abspath(split_path(split_file, split_dir, split))
    corpus = resolve_corpus(corpus)
    spm_model = os.path.abspath(os.fspath(spm_model))
    mesh = mesh or partitioning.make_mesh()
    rules = partitioning.logical_axis_rules()
    n_data = mesh.shape["data"]
    if batch_size % n_data or batch_size % jax.process_count():
        raise ValueError(f"batch_size {batch_size} must divide by the mesh's data axis ({n_data}) and by the number "
                         f"of processes ({jax.process_count()})")

    # --- Data: the split's documents, tokenised, laid out as batch_size streams. ---------------------------------
    documents = read_split_documents(corpus, split_file, corpus_format, on_error, allow_missing_ids)
    processor = load_processor(spm_model)
    if processor.get_piece_size() > config.vocab_size:
        raise ValueError(f"TransformerXLConfig.vocab_size={config.vocab_size} cannot hold the "
                         f"{processor.get_piece_size()} pieces of {spm_model}")
    tokens, offsets = tokenize_documents(documents, processor)
    data = LMData(tokens, offsets, int(processor.eos_id()), batch_size, config.tgt_len, data_order, data_seed)
    if data.segments_per_epoch < 1:
        raise DataError(f"the split's {len(tokens)} tokens do not fill one segment of {config.tgt_len} + 1 tokens "
                        f"on each of {batch_size} rows", split_file)
    data_stats = {"documents": data.n_documents, "tokens": int(len(tokens)),
                  "segments_per_epoch": data.segments_per_epoch, "tokens_per_epoch": data.tokens_per_epoch,
                  "first_date": documents[0].date.isoformat(), "last_date": documents[-1].date.isoformat()}
    del documents
    logging.info("train_lm: %d documents, %d tokens from %s; %d segments of %dx%d per epoch", data.n_documents,
                 len(tokens), split_file, data.segments_per_epoch, batch_size, config.tgt_len)

    model = TransformerXL(config)
    mem_len = config.mem_len
    tx = optimizer or make_optimizer(
        "adam", learning_rate_schedule(schedule, learning_rate, warmup_steps, train_steps), max_grad_norm=max_grad_norm)
    meta = {"kind": "transformer_xl_lm", "model_config": config_to_json(config),
            "corpus": _portable(corpus, model_dir) if isinstance(corpus, str) else
                      [_portable(path, model_dir) for path in corpus], "split_file": _portable(split_file, model_dir),
            "spm_model": _portable(spm_model, model_dir), "spm_sha256": file_sha256(spm_model),
            "seed": seed, "data_seed": data_seed, "data_order": data_order, "batch_size": batch_size,
            "tgt_len": config.tgt_len, "mem_len": mem_len, "data_fingerprint": data.fingerprint(), "data": data_stats}
    with loop.RunFolder(model_dir, save_period, keep_checkpoints, config_gin=config_gin) as folder, \
            train_state.mesh_rules(mesh, rules):
        # --- Model and sharded init: parameters, optimizer state and memories laid out on the mesh. -------------
        state, state_shardings = init_state(model, tx, batch_size, mem_len, seed, mesh, rules)

        # --- Resume: the state (memories included) and the data position. -------------------------------------
        state, start_step, last, _ = folder.resume(state, meta, _RESUME_KEYS)
        if start_step:
            logging.info("resumed from step %d", start_step)

        # --- The update step: one pure function, jitted once, the state donated. --------------------------------
        batch_shardings = {key: partitioning.data_sharding(mesh) for key in ("inputs", "targets", "reset")}
        step_key = None if optimizer is not None else (
            model, mem_len, mesh, tuple(rules), learning_rate, train_steps if schedule == "cosine" else None,
            warmup_steps, schedule, max_grad_norm)
        step_fn = _STEP_CACHE.get(step_key) if step_key is not None else None
        if step_fn is None:
            step_fn = train_state.compile_step(make_lm_train_step(model, tx, mem_len), state_shardings,
                                               batch_shardings, mesh)
            if step_key is not None:
                _STEP_CACHE.clear()  # keep one: a compiled step holds on to its executable
                _STEP_CACHE[step_key] = step_fn

        # --- The loop: this process's rows of the segment at each data position. ------------------------------
        local = batch_size // jax.process_count()
        rows = slice(jax.process_index() * local, (jax.process_index() + 1) * local)
        hooks = loop.Hooks(extra_scalars=lambda step: {"epoch": step / data.segments_per_epoch}, progress=progress,
                           name=os.path.basename(model_dir), shown=("epoch", "loss", "ppl"))
        context = loop.RunContext(folder.checkpointer, folder.log, meta, jax.random.key(seed + 1), start_step,
                                  train_steps, log_period, batch_size * config.tgt_len, hooks)
        state, logged = loop.run(
            step_fn, state, lambda position: train_state.global_batch(data.batch(position, rows), batch_shardings),
            context)
    result: Dict[str, Any] = {"start_step": start_step, "data": data_stats}
    train = logged if logged is not None else last  # a resumed run with nothing left reports its checkpoint's
    if train is not None:
        result["train"] = train
    result["step"] = max(train_steps, start_step)
    result["params"] = state["params"]
    result["mems"] = state["mems"]
    return result
