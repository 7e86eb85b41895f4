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

(The default cosine learning-rate schedule spans `total_steps`: resuming with another `total_steps` changes the
rates of the remaining steps, as it would in any trainer.)

A checkpoint records the model configuration, the corpus, the split and the SentencePiece model (with its SHA-256),
so `load_lm(model_dir)` rebuilds the model without any configuration and `templm stream` can check that the models
it compares share one vocabulary.

Multi-host: every process tokenises the same documents (or reads the same token streams, `templm data streams`, bound
with txl/streams.gin) and puts its own rows of each batch on its own devices.
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

from templm import paths, remote
from templm.data.lm_data import (DATA_ORDERS, LMData, load_processor, read_split_documents, split_path,
                                 tokenize_documents)
from templm.data.lm_streams import open_split_stream, read_split_tokens
from templm.data.readers import resolve_corpus
from templm.errors import ConfigError, DataError, require_folder, require_macros, require_numbers
from templm.io import file_sha256
from templm.models.transformer_xl import TXL_CONFIGS, TransformerXL, TransformerXLConfig, lm_loss, next_mem_valid
from templm.training import loop, partitioning, state as train_state
from templm.training.checkpoints import load_params
from templm.training.configs import CheckpointConfig, CorpusConfig, OptimizerConfig, require_config

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
    """(model, params as host arrays, checkpoint record) of a `train_lm` run folder (latest step unless `step`);
    a local folder or a URL (gs://)."""
    model_dir = paths.absolute(model_dir)
    directory = paths.join(model_dir, "checkpoints")
    if not paths.isdir(directory):
        remote.check_location(model_dir, "the Transformer-XL run", write=False)  # a bucket's cause, if any
        raise DataError("no checkpoints folder: not a trained Transformer-XL run (templm train_lm)", model_dir)
    params, meta = load_params(directory, step)
    if "model_config" not in meta:
        raise DataError("the checkpoint records no model_config: not a Transformer-XL run (templm train_lm)",
                        directory)
    model = TransformerXL(config_from_json(meta["model_config"], directory))
    return model, jax.tree.map(np.asarray, params), _paths_here(meta, model_dir)


# The files a run's record names: each relative to the run's folder where it lies in the folder that holds the run
# (a study's vocabulary, splits and world beside its models), so the whole folder can be moved or renamed; absolute
# otherwise (a corpus of the user's, elsewhere). In a bucket the same holds within the bucket: a run at
# gs://b/runs/ts records gs://b/runs/spm.model as ../spm.model, and a local file (or another bucket's) as it is.
_RECORDED_PATHS = ("corpus", "split_file", "spm_model")


def _portable(path: str, model_dir: str) -> str:
    path = paths.absolute(path)
    parent = paths.dirname(model_dir)
    if paths.is_url(path) != paths.is_url(model_dir) or (paths.is_url(path) and (
            paths.scheme(path), paths.bucket(path)) != (paths.scheme(model_dir), paths.bucket(model_dir))):
        return path
    inside = path.startswith(parent.rstrip("/") + "/") if paths.is_url(path) else path.startswith(parent + os.sep)
    return paths.relpath(path, model_dir) if inside else path


def _paths_here(meta: Mapping[str, Any], model_dir: str) -> Dict[str, Any]:
    """The record with its paths as paths here (relative ones are the run folder's, wherever it now is)."""
    def here(value):
        if isinstance(value, (list, tuple)):
            return [here(v) for v in value]
        return paths.resolve(model_dir, value)

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


# What a resumed run must share with the checkpoint it resumes.
_RESUME_KEYS = ("seed", "data_seed", "data_order", "batch_size", "tgt_len", "mem_len", "data_fingerprint",
                "model_config")
# The gin binding that sets each (named in the message of a resume refused).
_RESUME_BINDINGS = {
    "seed": "templm.train_lm.random_seed, SEED", "data_seed": "templm.CorpusConfig.seed",
    "data_order": "templm.CorpusConfig.data_order", "batch_size": "templm.CorpusConfig.batch_size, BATCH_SIZE",
    "tgt_len": "templm.train_lm.config, MODEL_CONFIG", "mem_len": "templm.train_lm.config, MODEL_CONFIG",
    "data_fingerprint": "the corpus, its split and SentencePiece model: CORPUS, SPLIT_DIR, SPLIT, SPM_MODEL (or "
                        "TOKEN_STREAMS)",
    "model_config": "templm.train_lm.config, MODEL_CONFIG"}


@gin.configurable(module="templm", denylist=["options"])
def train_lm(model_dir: str = gin.REQUIRED, config: Union[str, TransformerXLConfig] = gin.REQUIRED,
             train_dataset_cfg: CorpusConfig = gin.REQUIRED, total_steps: int = gin.REQUIRED,
             optimizer_cfg: OptimizerConfig = OptimizerConfig(), checkpoint_cfg: CheckpointConfig = CheckpointConfig(),
             random_seed: int = 0, stats_period: int = 10, optimizer: Optional[optax.GradientTransformation] = None,
             options: loop.RunOptions = loop.RunOptions()) -> loop.TrainResult:
    """Trains a Transformer-XL language model on one split of a corpus; resumes from `model_dir` if it holds a run.

    Args:
      model_dir: run folder: `checkpoints/` (orbax), `metrics.jsonl`, TensorBoard events; a local folder or a URL
        (gs://, checked before the data is read). The corpus, split files and SentencePiece model may be URLs too.
      config: a TransformerXLConfig or a TXL_CONFIGS name; tgt_len is the segment length, mem_len the training
        memory. config.vocab_size must hold the pieces of the data's SentencePiece model.
      train_dataset_cfg: the corpus, its split and SentencePiece model, the batch (parallel rows; the global batch
        is batch_size x tgt_len tokens) and the data order (templm.training.configs.CorpusConfig).
      total_steps: segments per row.
      optimizer_cfg: Adam with a schedule spanning total_steps (templm.training.configs.OptimizerConfig); an optax
        `optimizer` replaces it.
      checkpoint_cfg: checkpoint every save.period steps (and at the end, and on SIGTERM), keep the last save.keep.
      random_seed: parameter init and dropout (and the document shuffle, unless the data's own seed is set).
      stats_period: log metrics every N steps.
      options: the mesh, progress lines, the gin config written to MODEL_DIR/config.gin (loop.RunOptions).

    Returns a loop.TrainResult (with the data's statistics and the final memories). Raises Preempted on SIGTERM
    (after saving), TrainingError on a non-finite loss (naming the last good checkpoint), DataError on bad input
    (naming the file).
    """
    require_macros("templm.train_lm", {
        "model_dir": ("MODEL_DIR", model_dir), "config": ("MODEL_CONFIG", config),
        "total_steps": ("TRAIN_STEPS", total_steps)})
    require_config("templm.train_lm.train_dataset_cfg", train_dataset_cfg, CorpusConfig, "@templm.CorpusConfig()")
    data_cfg = train_dataset_cfg
    data_cfg.check("templm.CorpusConfig")
    optimizer_cfg.check("templm.OptimizerConfig")
    checkpoint_cfg.check("templm.CheckpointConfig")
    require_numbers("templm.train_lm", {
        "total_steps": (total_steps, int, 1, "TRAIN_STEPS"), "random_seed": (random_seed, int, 0, "SEED"),
        "stats_period": (stats_period, int, 1, None)})
    if not paths.is_url(model_dir):
        require_folder("templm.train_lm", "model_dir", "MODEL_DIR", os.fspath(model_dir))
    if checkpoint_cfg.restore.path:
        raise ConfigError("templm.train_lm starts from a random initialisation: unset "
                          "templm.RestoreCheckpointConfig.path (to go on with a run, train into its MODEL_DIR)")
    config = resolve_config(config)
    seed, batch_size = random_seed, data_cfg.batch_size
    data_seed = seed if data_cfg.seed is None else data_cfg.seed
    if data_cfg.data_order not in DATA_ORDERS:
        raise ValueError(f"data_order must be one of {DATA_ORDERS}, got {data_cfg.data_order!r}")
    model_dir = paths.absolute(model_dir)
    if jax.process_index() == 0:  # a bucket that cannot be written is said before the data is read
        remote.check_location(model_dir, "MODEL_DIR")
    spm_model = paths.absolute(data_cfg.spm_model)
    if data_cfg.token_streams:  # tokenised beforehand (`templm data streams`): the corpus and split as recorded there
        entry, manifest = open_split_stream(data_cfg.token_streams, data_cfg.split, spm_model,
                                            data_cfg.allow_missing_ids)
        split_file, corpus = entry["split_file"], manifest["corpus"]
    else:
        split_file = paths.absolute(split_path(data_cfg.split_file, data_cfg.split_dir, data_cfg.split))
        corpus = resolve_corpus(data_cfg.corpus)
    mesh = options.mesh or partitioning.make_mesh()
    rules = partitioning.logical_axis_rules()
    n_data = mesh.shape["data"]
    if batch_size % n_data or batch_size % jax.process_count():
        raise ValueError(f"batch_size {batch_size} must divide by the mesh's data axis ({n_data}) and by the number "
                         f"of processes ({jax.process_count()})")

    # --- Data: the split's documents, tokenised, laid out as batch_size streams. ---------------------------------
    processor = load_processor(spm_model)
    if processor.get_piece_size() > config.vocab_size:
        raise ValueError(f"TransformerXLConfig.vocab_size={config.vocab_size} cannot hold the "
                         f"{processor.get_piece_size()} pieces of {spm_model}")
    if data_cfg.token_streams:
        tokens, offsets = read_split_tokens(data_cfg.token_streams, data_cfg.split, entry)
        dates = (entry["first_date"], entry["last_date"])
    else:
        documents = read_split_documents(corpus, split_file, data_cfg.corpus_format, data_cfg.on_error,
                                         data_cfg.allow_missing_ids)
        tokens, offsets = tokenize_documents(documents, processor)
        dates = (documents[0].date.isoformat(), documents[-1].date.isoformat())
        del documents
    data = LMData(tokens, offsets, int(processor.eos_id()), batch_size, config.tgt_len, data_cfg.data_order,
                  data_seed)
    if data.segments_per_epoch < 1:
        raise DataError(f"the split's {len(tokens)} tokens do not fill one segment of {config.tgt_len} + 1 tokens "
                        f"on each of {batch_size} rows", split_file)
    data_stats = {"documents": data.n_documents, "tokens": int(len(tokens)),
                  "segments_per_epoch": data.segments_per_epoch, "tokens_per_epoch": data.tokens_per_epoch,
                  "first_date": dates[0], "last_date": dates[1]}
    logging.info("train_lm: %d documents, %d tokens from %s; %d segments of %dx%d per epoch", data.n_documents,
                 len(tokens), split_file, data.segments_per_epoch, batch_size, config.tgt_len)

    model = TransformerXL(config)
    mem_len = config.mem_len
    tx = optimizer or optimizer_cfg.build(total_steps)
    meta = {"kind": "transformer_xl_lm", "model_config": config_to_json(config),
            "corpus": _portable(corpus, model_dir) if isinstance(corpus, str) else
                      [_portable(path, model_dir) for path in corpus], "split_file": _portable(split_file, model_dir),
            "spm_model": _portable(spm_model, model_dir), "spm_sha256": file_sha256(spm_model),
            "seed": seed, "data_seed": data_seed, "data_order": data_cfg.data_order, "batch_size": batch_size,
            "tgt_len": config.tgt_len, "mem_len": mem_len, "data_fingerprint": data.fingerprint(), "data": data_stats}
    save = checkpoint_cfg.save
    with loop.RunFolder(model_dir, save.period, save.keep, save.async_save, config_gin=options.config_gin) as folder, \
            train_state.mesh_rules(mesh, rules):
        # --- Model and sharded init: parameters, optimizer state and memories laid out on the mesh. -------------
        state, state_shardings = init_state(model, tx, batch_size, mem_len, seed, mesh, rules)

        # --- Resume: the state (memories included) and the data position. -------------------------------------
        state, start_step, last, _ = folder.resume(state, meta, _RESUME_KEYS, _RESUME_BINDINGS)
        if start_step:
            logging.info("resumed from step %d", start_step)

        # --- The update step: one pure function, jitted once per distinct model, optimizer and mesh. ------------
        batch_shardings = {key: partitioning.data_sharding(mesh) for key in ("inputs", "targets", "reset")}
        schedule_steps = total_steps if optimizer_cfg.schedule == "cosine" else None
        key = (model, mem_len, mesh, tuple(rules),
               (optimizer_cfg, schedule_steps) if optimizer is None else id(tx))
        step_fn = loop.STEPS.get(key, lambda: train_state.compile_step(
            make_lm_train_step(model, tx, mem_len), state_shardings, batch_shardings, mesh), held=tx)

        # --- The loop: this process's rows of the segment at each data position. ------------------------------
        local = batch_size // jax.process_count()
        rows = slice(jax.process_index() * local, (jax.process_index() + 1) * local)
        hooks = loop.Hooks(extra_scalars=lambda step: {"epoch": step / data.segments_per_epoch},
                           progress=options.progress, name=paths.basename(model_dir), shown=("epoch", "loss", "ppl"))
        context = loop.RunContext(folder.checkpointer, folder.log, meta, jax.random.key(seed + 1), start_step,
                                  total_steps, stats_period, batch_size * config.tgt_len, hooks)
        state, logged = loop.run(
            step_fn, state, lambda position: train_state.global_batch(data.batch(position, rows), batch_shardings),
            context)
    return loop.finish(start_step, total_steps, state, logged, last, data=data_stats, mems=state["mems"])
