"""Language-model training of the Transformer-XL on one split: `templm train_lm --gin_file=txl/time_stratified.gin`.

The other half of the T5 trainer (training/trainer.py), for the streaming-perplexity experiments ("Mind the Gap"):
the same mesh and logical-axis rules, a pure train step jitted once with explicit shardings and the state donated,
orbax checkpoints holding the data position, clu + JSON-lines metrics, a progress line with a rate and an ETA,
a checkpoint on SIGTERM and a stop on a non-finite loss. `train_lm()` is one readable function in sections.

Data. The documents a split file names (`templm data splits`: TIME-STRATIFIED or CONTROL train) are read from the
corpus and ordered

  * ``data_order="date"`` (default): by date, then id -- the order of the split file, the paper's setting; every
    epoch reads the same stream;
  * ``data_order="shuffle"``: by a permutation of whole documents drawn for each epoch e from
    ``numpy.random.default_rng([data_seed, e])``; documents stay intact, only their order changes. A short run then
    sees documents from the whole training period rather than its first weeks (the smoke experiment uses this).

Each document is tokenised with the SentencePiece model and followed by EOS; the epoch's stream starts with an EOS
too (exactly the layout of the test stream in evaluation/streaming.py). The stream is cut into `batch_size`
contiguous rows of equal length (the classic `batchify`: row b holds tokens [b*n, (b+1)*n)) and the rows are read
side by side in segments of `tgt_len` tokens: step k of an epoch takes inputs ``rows[:, kT:(k+1)T]`` and targets
``rows[:, kT+1:(k+1)T+1]``. The few tokens that do not fill a segment at the end of a row are dropped.

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
so `load_lm(model_dir)` rebuilds the model without any configuration and the `templm stream` verb can check that the
models it compares share one vocabulary.

Multi-host: every process tokenises the same documents and puts its own rows of each batch on its own devices.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import signal
from typing import Any, Dict, Iterable, List, Optional, Tuple, Union

import flax.linen as nn
import gin
import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import logging
from jax.sharding import PartitionSpec

from templm.data.records import DataError, Document
from templm.models.transformer_xl import TXL_CONFIGS, TransformerXL, TransformerXLConfig, lm_loss, next_mem_valid
from templm.training import partitioning
from templm.training.checkpoints import Checkpointer, abstract_like, load_params
# TrainingError is what train_lm raises (through check_finite); callers catch it as lm_trainer.TrainingError.
from templm.training.trainer import Chrono, MetricsLog, TrainingError, _eta, check_finite, nn_rules  # noqa: F401

gin.external_configurable(TransformerXLConfig, module="templm")

DATA_ORDERS = ("date", "shuffle")
_MEM_AXES = ("batch", "length", "embed")


# ----------------------------------------------------------------------------------------------------------------
# Documents and tokens.


def split_path(split_file: Optional[str], split_dir: Optional[str], split: str) -> str:
    """The split file: `split_file` if given, else `split_dir/split.gz`."""
    if split_file:
        return os.fspath(split_file)
    if not split_dir:
        raise ValueError("give a split file (split_file) or a split folder (split_dir) and a split name")
    return os.path.join(os.fspath(split_dir), f"{split}.gz")


def read_split_documents(corpus: str, split_file: str, format: str = "auto", on_error: str = "raise",
                         allow_missing: bool = False) -> List[Document]:
    """The documents of `corpus` that `split_file` names, sorted by date then id.

    Raises DataError naming the split file when it does not exist, names no document, or names ids the corpus does
    not hold (unless allow_missing: then a warning).
    """
    from templm.data.splits import apply_split

    corpus, split_file = os.fspath(corpus), os.fspath(split_file)
    if not os.path.exists(split_file):
        raise DataError("no such split file (write one with `templm data splits`)", split_file)
    if not os.path.exists(corpus):
        raise DataError("no such corpus file", corpus)
    docs_iter, report = apply_split(corpus, split_file, format, on_error)
    docs = sorted(docs_iter, key=lambda d: (d.date, d.id))
    if report.missing and not allow_missing:
        raise DataError(f"{report.missing} of the {report.expected} document ids of this split are not in the "
                        f"corpus {corpus} (first: {', '.join(report.missing_ids)}); is it the split of another "
                        "corpus?", split_file)
    if not docs:
        raise DataError(f"none of the split's {report.expected} ids is in the corpus {corpus}", split_file)
    return docs


def load_processor(spm_model: str):
    """The sentencepiece processor of a T5-style SentencePiece model (checked by templm.data.vocab), without seqio's
    sentinel ids: a language model needs only the trained pieces (ids 0 .. get_piece_size() - 1)."""
    from templm.data.vocab import load_vocabulary

    return load_vocabulary(os.fspath(spm_model), extra_ids=0).tokenizer


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def tokenize_documents(documents: Iterable[Document], processor: Any) -> Tuple[np.ndarray, np.ndarray]:
    """(tokens, offsets): every document's pieces followed by EOS, concatenated (int32), and the start of each
    document in it [D + 1] (document d is tokens[offsets[d]:offsets[d+1]], its EOS last)."""
    texts = [d.text for d in documents]
    eos = int(processor.eos_id())
    pieces = processor.encode(texts) if texts else []
    lengths = np.array([len(p) + 1 for p in pieces], np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    tokens = np.empty(int(offsets[-1]), np.int32)
    for d, p in enumerate(pieces):
        tokens[offsets[d]:offsets[d + 1] - 1] = p
        tokens[offsets[d + 1] - 1] = eos
    return tokens, offsets


@dataclasses.dataclass
class LMData:
    """Tokenised documents laid out as `batch_size` parallel streams in segments of `seg_len` (module docstring).

    `batch(position)` is the segment at a data position (a global step): epoch = position // segments_per_epoch,
    segment k = position % segments_per_epoch; `reset` is 1 on every row at k = 0 (start the memory afresh).
    """

    tokens: np.ndarray
    offsets: np.ndarray
    eos_id: int
    batch_size: int
    seg_len: int
    order: str = "date"
    seed: int = 0

    def __post_init__(self):
        if self.order not in DATA_ORDERS:
            raise ValueError(f"data_order must be one of {DATA_ORDERS}, got {self.order!r}")
        if self.batch_size < 1 or self.seg_len < 1:
            raise ValueError(f"batch_size and tgt_len must be >= 1, got {self.batch_size} and {self.seg_len}")
        self._epoch = None
        self._rows = None

    @property
    def n_documents(self) -> int:
        return len(self.offsets) - 1

    @property
    def row_len(self) -> int:
        return (len(self.tokens) + 1) // self.batch_size

    @property
    def segments_per_epoch(self) -> int:
        return max(0, (self.row_len - 1) // self.seg_len)

    @property
    def tokens_per_epoch(self) -> int:
        return self.segments_per_epoch * self.batch_size * self.seg_len

    def fingerprint(self) -> str:
        digest = hashlib.sha256()
        digest.update(self.tokens.astype("<i4").tobytes())
        digest.update(self.offsets.astype("<i8").tobytes())
        return digest.hexdigest()

    def document_order(self, epoch: int) -> np.ndarray:
        if self.order == "date":
            return np.arange(self.n_documents)
        return np.random.default_rng([int(self.seed), int(epoch)]).permutation(self.n_documents)

    def epoch_stream(self, epoch: int) -> np.ndarray:
        """[EOS] + the documents (each with its EOS) in the epoch's order."""
        order = self.document_order(epoch)
        parts = [np.array([self.eos_id], np.int32)]
        if self.order == "date":
            parts.append(self.tokens)
        else:
            parts += [self.tokens[self.offsets[d]:self.offsets[d + 1]] for d in order]
        return np.concatenate(parts)

    def rows(self, epoch: int) -> np.ndarray:
        """The epoch's stream as [batch_size, row_len] (batchify)."""
        if self._epoch != epoch:
            stream = self.epoch_stream(epoch)
            n = self.row_len
            self._rows = stream[:self.batch_size * n].reshape(self.batch_size, n)
            self._epoch = epoch
        return self._rows

    def batch(self, position: int, rows: Optional[slice] = None) -> Dict[str, np.ndarray]:
        """{"inputs", "targets": [B, T] int32, "reset": [B] int32} at a data position (only `rows`, if given)."""
        per_epoch = self.segments_per_epoch
        if per_epoch < 1:
            raise ValueError("the data holds no complete segment")
        epoch, k = divmod(int(position), per_epoch)
        data = self.rows(epoch)
        if rows is not None:
            data = data[rows]
        t = self.seg_len
        return {"inputs": np.ascontiguousarray(data[:, k * t:(k + 1) * t]),
                "targets": np.ascontiguousarray(data[:, k * t + 1:(k + 1) * t + 1]),
                "reset": np.full(data.shape[0], int(k == 0), np.int32)}


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
    return model, jax.tree.map(np.asarray, params), meta


# ----------------------------------------------------------------------------------------------------------------
# Optimizer and the update step.


@gin.configurable(module="templm")
def lm_optimizer(learning_rate: float = 2.5e-4, train_steps: int = 1, warmup_steps: int = 0,
                 schedule: str = "cosine", max_grad_norm: float = 0.25, b1: float = 0.9, b2: float = 0.999,
                 weight_decay: float = 0.0) -> optax.GradientTransformation:
    """Transformer-XL's recipe: Adam, linear warm-up then cosine decay to 0 at `train_steps` ("cosine") or a
    constant rate ("constant"), gradients clipped to global norm `max_grad_norm` (0: no clipping)."""
    if schedule == "cosine":
        main = optax.cosine_decay_schedule(learning_rate, max(1, train_steps - warmup_steps))
    elif schedule == "constant":
        main = optax.constant_schedule(learning_rate)
    else:
        raise ValueError(f"lm_optimizer.schedule must be 'cosine' or 'constant', got {schedule!r}")
    if warmup_steps > 0:
        lr = optax.join_schedules([optax.linear_schedule(0.0, learning_rate, warmup_steps), main], [warmup_steps])
    else:
        lr = main
    tx = optax.adamw(lr, b1=b1, b2=b2, weight_decay=weight_decay) if weight_decay else optax.adam(lr, b1=b1, b2=b2)
    return optax.chain(optax.clip_by_global_norm(max_grad_norm), tx) if max_grad_norm > 0 else tx


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


def _init_state(model: TransformerXL, tx, batch_size: int, mem_len: int, seed: int, mesh, rules):
    """The train state, created already laid out on the mesh; and its shardings."""
    cfg = model.config
    tokens = jnp.zeros((batch_size, cfg.tgt_len), jnp.int32)

    def init_params(rng):
        return model.init(rng, tokens, None, True, mem_len=0)["params"]

    boxed = jax.eval_shape(init_params, jax.random.key(seed))
    param_shardings = partitioning.logical_shardings(nn.get_partition_spec(boxed), mesh, rules)
    params = jax.jit(lambda rng: nn.unbox(init_params(rng)), out_shardings=param_shardings)(jax.random.key(seed))
    opt_state = jax.jit(tx.init)(params)
    # Optimizer statistics take the layout XLA propagates from the parameters; scalars (counts) are replicated.
    opt_state = jax.tree.map(
        lambda x: x if len(x.sharding.device_set) == mesh.size else jax.device_put(x, partitioning.replicated(mesh)),
        opt_state)
    mem_sharding = partitioning.logical_shardings(PartitionSpec(*_MEM_AXES), mesh, rules)
    row_sharding = partitioning.logical_shardings(PartitionSpec("batch"), mesh, rules)
    mems = [jax.device_put(m, mem_sharding) for m in model.init_mems(batch_size, mem_len)]
    state = {"step": jax.device_put(jnp.zeros((), jnp.int32), partitioning.replicated(mesh)), "params": params,
             "opt_state": opt_state, "mems": mems,
             "mem_valid": jax.device_put(jnp.zeros((batch_size,), jnp.int32), row_sharding)}
    return state, jax.tree.map(lambda x: x.sharding, state)


# ----------------------------------------------------------------------------------------------------------------
# The training run.


_STEP_CACHE: Dict[Any, Any] = {}

_REQUIRED = {"model_dir": "MODEL_DIR", "corpus": "CORPUS", "spm_model": "SPM_MODEL", "config": "MODEL_CONFIG",
             "train_steps": "TRAIN_STEPS", "batch_size": "BATCH_SIZE"}


def _check_required(values: Dict[str, Any]) -> None:
    from templm.cli import ConfigError

    for name, value in values.items():
        if value is gin.REQUIRED or value is None:
            macro = _REQUIRED.get(name, name)
            raise ConfigError(f"templm.train_lm.{name} is required: set the gin macro {macro}, e.g. "
                              f"--gin.{macro}=...")


@gin.configurable(module="templm", denylist=["mesh"])
def train_lm(model_dir: str = gin.REQUIRED, corpus: str = gin.REQUIRED, split_file: Optional[str] = None,
             spm_model: str = gin.REQUIRED, config: Union[str, TransformerXLConfig] = gin.REQUIRED,
             train_steps: int = gin.REQUIRED, batch_size: int = gin.REQUIRED, learning_rate: float = 2.5e-4, *,
             split_dir: Optional[str] = None, split: str = "time_stratified_train",
             optimizer: Optional[optax.GradientTransformation] = None, warmup_steps: int = 0,
             schedule: str = "cosine", max_grad_norm: float = 0.25, seed: int = 0, data_seed: Optional[int] = None,
             data_order: str = "date", corpus_format: str = "auto", on_error: str = "raise",
             allow_missing_ids: bool = False, save_period: int = 1000, keep_checkpoints: Optional[int] = 3,
             log_period: int = 10, mesh=None) -> Dict[str, Any]:
    """Trains a Transformer-XL language model on one split of a corpus; resumes from `model_dir` if it holds a run.

    Args:
      model_dir: run folder: `checkpoints/` (orbax), `metrics.jsonl`, TensorBoard events.
      corpus: the corpus file (any format templm.data reads); split_file: its split file (`YYYYMMDD<TAB>id` lines),
        or split_dir + split (`split_dir/split.gz`, e.g. split="control_train").
      spm_model: the SentencePiece model (T5 ids; EOS separates documents). config.vocab_size must hold its pieces.
      config: a TransformerXLConfig or a TXL_CONFIGS name; tgt_len is the segment length, mem_len the training
        memory.
      train_steps, batch_size: segments per row and parallel rows (the global batch is batch_size x tgt_len tokens).
      learning_rate, warmup_steps, schedule, max_grad_norm: `lm_optimizer` (Adam); `optimizer` replaces it.
      seed: parameter init and dropout; data_seed (default seed): the document shuffle of data_order="shuffle".
      data_order: "date" (split order) or "shuffle" (documents permuted per epoch); see the module docstring.
      save_period / keep_checkpoints / log_period: checkpoint every N steps (and at the end, and on SIGTERM), keep
        the last K; log metrics every N steps.
      mesh: a ("data", "model") mesh (default `partitioning.make_mesh()`, bindable in gin).

    Returns {"step", "start_step", "train": last logged metrics, "data": data statistics, "params"} and, when
    stopped by SIGTERM, "preempted_at". Raises TrainingError on a non-finite loss (naming the last good
    checkpoint), DataError on bad input (naming the file).
    """
    _check_required({"model_dir": model_dir, "corpus": corpus, "spm_model": spm_model, "config": config,
                     "train_steps": train_steps, "batch_size": batch_size})
    config = resolve_config(config)
    data_seed = seed if data_seed is None else data_seed
    if data_order not in DATA_ORDERS:
        raise ValueError(f"data_order must be one of {DATA_ORDERS}, got {data_order!r}")
    model_dir = os.path.abspath(os.fspath(model_dir))
    split_file = os.path.abspath(split_path(split_file, split_dir, split))
    corpus = os.path.abspath(os.fspath(corpus))
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
    tx = optimizer or lm_optimizer(learning_rate=learning_rate, train_steps=train_steps, warmup_steps=warmup_steps,
                                   schedule=schedule, max_grad_norm=max_grad_norm)
    os.makedirs(model_dir, exist_ok=True)
    checkpointer = Checkpointer(os.path.join(model_dir, "checkpoints"), save_period, keep_checkpoints)
    meta = {"kind": "transformer_xl_lm", "model_config": config_to_json(config), "corpus": corpus,
            "split_file": split_file, "spm_model": spm_model, "spm_sha256": file_sha256(spm_model),
            "seed": seed, "data_seed": data_seed, "data_order": data_order, "batch_size": batch_size,
            "tgt_len": config.tgt_len, "mem_len": mem_len, "data_fingerprint": data.fingerprint(), "data": data_stats}

    with jax.set_mesh(mesh), nn_rules(rules):
        # --- Model and sharded init: parameters, optimizer state and memories laid out on the mesh. -------------
        state, state_shardings = _init_state(model, tx, batch_size, mem_len, seed, mesh, rules)

        # --- Resume: the state (memories included) and the data position. -------------------------------------
        start_step = 0
        if checkpointer.latest_step() is not None:
            state, saved = checkpointer.restore(abstract_like(state))
            for key in ("seed", "data_seed", "data_order", "batch_size", "tgt_len", "mem_len", "data_fingerprint",
                        "model_config"):
                if saved.get(key) != meta[key]:
                    checkpointer.close()
                    raise DataError(f"the checkpoint was written with {key}={saved.get(key)!r}, this run has "
                                    f"{meta[key]!r}: use another model_dir or the same settings and data",
                                    checkpointer.directory)
            start_step = int(saved["data_position"])
            logging.info("resumed from step %d", start_step)

        # --- The update step: one pure function, jitted once, the state donated. --------------------------------
        batch_shardings = {"inputs": partitioning.data_sharding(mesh), "targets": partitioning.data_sharding(mesh),
                           "reset": partitioning.data_sharding(mesh)}
        # Runs with the same model, mesh and optimizer settings (TIME-STRATIFIED and CONTROL) share one compiled step.
        step_key = None if optimizer is not None else (
            model, mem_len, mesh, tuple(rules), learning_rate, train_steps if schedule == "cosine" else None,
            warmup_steps, schedule, max_grad_norm)
        step_fn = _STEP_CACHE.get(step_key) if step_key is not None else None
        if step_fn is None:
            step_fn = jax.jit(make_lm_train_step(model, tx, mem_len),
                              in_shardings=(state_shardings, batch_shardings, partitioning.replicated(mesh)),
                              out_shardings=(state_shardings, partitioning.replicated(mesh)), donate_argnums=0)
            if step_key is not None:
                _STEP_CACHE.clear()  # keep one: a compiled step holds on to its executable
                _STEP_CACHE[step_key] = step_fn

        # --- The loop: metrics, progress, checkpoints, SIGTERM, NaN stop. ---------------------------------------
        local = batch_size // jax.process_count()
        rows = slice(jax.process_index() * local, (jax.process_index() + 1) * local)
        log = MetricsLog(model_dir)
        chrono = Chrono(train_steps, batch_size * config.tgt_len, start_step)
        stop = {"signal": None}
        previous = signal.signal(signal.SIGTERM, lambda signum, frame: stop.update(signal=signum))
        rng = jax.random.key(seed + 1)
        result: Dict[str, Any] = {"start_step": start_step, "data": data_stats}
        step = start_step
        try:
            while step < train_steps:
                host = data.batch(step, rows)
                batch = {k: jax.make_array_from_process_local_data(batch_shardings[k], v) for k, v in host.items()}
                state, metrics = step_fn(state, batch, rng)
                step += 1
                last = step == train_steps
                if step % log_period == 0 or last or checkpointer.should_save(step) or stop["signal"]:
                    metrics = jax.device_get(metrics)
                    check_finite(metrics, step, checkpointer)
                    timing = chrono.report(step)
                    epoch = step / data.segments_per_epoch
                    log.write(step, "train", {**metrics, **timing, "epoch": epoch})
                    logging.info("step %d/%d  epoch %.2f  loss %.4f  ppl %.1f  %.2f steps/s  %.0f tokens/s  ETA %s",
                                 step, train_steps, epoch, metrics["loss"], metrics["ppl"], timing["steps_per_sec"],
                                 timing["tokens_per_sec"], _eta(timing["eta_sec"]))
                    result["train"] = {k: float(v) for k, v in metrics.items()}
                if checkpointer.should_save(step) or last or stop["signal"]:
                    checkpointer.save(step, state, {**meta, "step": step, "data_position": step})
                if stop["signal"]:
                    logging.warning("SIGTERM at step %d: checkpoint saved, exiting", step)
                    result["preempted_at"] = step
                    break
        finally:
            signal.signal(signal.SIGTERM, previous)
            log.close()
            checkpointer.close()
    result["step"] = step
    result["params"] = state["params"]
    result["mems"] = state["mems"]
    return result
