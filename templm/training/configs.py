"""What a training run reads, as T5X passes it: one object per concern instead of a flat list of parameters.

* `DatasetConfig`: T5X's `utils.DatasetConfig` (a SeqIO task or mixture, its feature lengths, split, batch size,
  seed, packing) for the T5 trainer's training and evaluation data; `CorpusConfig`: its counterpart for the
  Transformer-XL language model, a corpus and a split file read as one token stream.
* `CheckpointConfig` of `SaveCheckpointConfig` (how often, how many kept, asynchronous) and `RestoreCheckpointConfig`
  (the checkpoint a new run starts from), as T5X's.
* `OptimizerConfig`: Adam or AdamW with a schedule, the Transformer-XL and knowledge-graph LM recipes; frozen and
  hashable, so a compiled step can be cached by it (the T5 trainer's Adafactor stays `templm.make_optimizer`, bound
  in gin as before).

Each is a frozen dataclass registered with gin under `templm.`; the configs bind them to T5X's macro names
(gin_configs/base.gin: `train/templm.DatasetConfig.batch_size = %BATCH_SIZE`), so a user's overrides of MODEL_DIR,
TRAIN_STEPS, BATCH_SIZE, ... are unchanged. `check()` on each names the binding and the macro of a missing or bad
value before any work (templm.errors).
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Optional, Sequence, Union

import gin
import optax

from templm.errors import ConfigError, require_field_types, require_macros, require_numbers
from templm.training.optimizers import learning_rate_schedule, make_optimizer


def require_config(binding: str, value: object, kind: type, reference: str) -> None:
    """A ConfigError naming `binding` (e.g. "templm.train.train_dataset_cfg") and the gin reference to bind it to,
    unless `value` is a `kind`: a config object missing (gin's REQUIRED, None) or of another kind."""
    if not isinstance(value, kind):
        got = "nothing" if value is None or value is gin.REQUIRED else f"{value!r}"
        raise ConfigError(f"{binding} takes a {kind.__name__}, got {got}: bind {binding} = {reference}")


@gin.configurable(module="templm")
@dataclasses.dataclass(frozen=True)
class DatasetConfig:
    """A SeqIO task or mixture as a trainer reads it (T5X's DatasetConfig; the `train/` and `train_eval/` gin scopes
    tell the two apart).

    batch_size: the global batch (training) or the evaluation batch. seed: the data order's seed (None: the run's
    random_seed). shards: input pipelines the global batch is drawn from (0: one per process, or the checkpoint's
    when resuming; fix it at a multiple of every host count a run will see, WORKSPACE.md "Several GPU hosts").
    num_examples: how many examples an evaluation reads (None: all). use_cached: training reads the task's examples
    from seqio's offline cache (made by seqio's `cache_tasks_main`, as T5X's `DatasetConfig.use_cached`), found in
    the folders `templm train --seqio_additional_cache_dirs=DIR` names."""

    mixture_or_task_name: str = gin.REQUIRED
    task_feature_lengths: Mapping[str, int] = gin.REQUIRED
    batch_size: int = gin.REQUIRED
    split: str = "train"
    seed: Optional[int] = None
    pack: bool = True
    shards: int = 0
    num_examples: Optional[int] = None
    use_cached: bool = False

    def __post_init__(self):
        require_field_types(self, "templm.DatasetConfig", {"batch_size": "BATCH_SIZE"})  # from gin, named

    def check(self, binding: str) -> None:
        """A ConfigError naming `binding.field` (e.g. "train/templm.DatasetConfig.batch_size") and its macro."""
        require_macros(binding, {"mixture_or_task_name": ("MIXTURE_OR_TASK_NAME", self.mixture_or_task_name),
                                 "task_feature_lengths": ("TASK_FEATURE_LENGTHS", self.task_feature_lengths),
                                 "batch_size": ("BATCH_SIZE", self.batch_size)})
        require_numbers(binding, {
            "batch_size": (self.batch_size, int, 1, "BATCH_SIZE"), "seed": (self.seed, int, 0, None),
            "shards": (self.shards, int, 0, None), "num_examples": (self.num_examples, int, 1, None),
            **{f"task_feature_lengths[{key!r}]": (value, int, 1, "TASK_FEATURE_LENGTHS")
               for key, value in dict(self.task_feature_lengths).items()}},
            optional=("seed", "num_examples"))


@gin.configurable(module="templm")
@dataclasses.dataclass(frozen=True)
class CorpusConfig:
    """One split of a corpus read as a language model's token stream (templm.data.lm_data).

    corpus: one file in any format templm.data reads, a glob pattern or a list; split_file: its split file
    (`YYYYMMDD<TAB>id` lines), or split_dir + split (`split_dir/split.gz`, or `split_dir/split` where a release
    folder was gunzipped; e.g. split="control_train"). spm_model: the SentencePiece model (T5 ids; EOS separates
    documents). batch_size: parallel rows. data_order: "date" (split order) or "shuffle" (documents permuted per
    epoch, by `seed`, default the run's random_seed). corpus_format, on_error, allow_missing_ids: as
    templm.data.readers reads a corpus. token_streams: a folder of `templm data streams` to read the split's tokens
    from instead of tokenising the corpus (the same tokens; corpus and split_dir then unused)."""

    corpus: Union[str, Sequence[str], None] = gin.REQUIRED
    spm_model: str = gin.REQUIRED
    batch_size: int = gin.REQUIRED
    split_file: Optional[str] = None
    split_dir: Optional[str] = None
    split: str = "time_stratified_train"
    data_order: str = "date"
    seed: Optional[int] = None
    corpus_format: str = "auto"
    on_error: str = "raise"
    allow_missing_ids: bool = False
    token_streams: Optional[str] = None

    def __post_init__(self):
        require_field_types(self, "templm.CorpusConfig", {"batch_size": "BATCH_SIZE"})  # from gin, named

    def check(self, binding: str) -> None:
        require_macros(binding, {"spm_model": ("SPM_MODEL", self.spm_model),
                                 "batch_size": ("BATCH_SIZE", self.batch_size)})
        if not self.token_streams:
            require_macros(binding, {"corpus": ("CORPUS", self.corpus)})
        elif self.split_file:
            raise ConfigError(f"{binding}.split_file is bound with token_streams, whose split is chosen by "
                              f"{binding}.split (SPLIT): unset split_file")
        require_numbers(binding, {"batch_size": (self.batch_size, int, 1, "BATCH_SIZE"),
                                  "seed": (self.seed, int, 0, None)}, optional=("seed",))


@gin.configurable(module="templm")
@dataclasses.dataclass(frozen=True)
class SaveCheckpointConfig:
    """period: save every N steps (0: only at the end and on SIGTERM); keep: the last K checkpoints (None: all);
    async_save: write while training goes on; input_state_at_end: the last step's checkpoint holds the input
    pipelines' states too (False for a run of fixed length: extending it later replays its batches; the states are
    as large as the shuffle buffers)."""

    period: int = 1000
    keep: Optional[int] = 3
    async_save: bool = True
    input_state_at_end: bool = True

    def __post_init__(self):
        require_field_types(self, "templm.SaveCheckpointConfig", {"period": "SAVE_PERIOD"})  # from gin, named

    def check(self, binding: str) -> None:
        require_numbers(binding, {"period": (self.period, int, 0, "SAVE_PERIOD"), "keep": (self.keep, int, 1, None)},
                        optional=("keep",))


@gin.configurable(module="templm")
@dataclasses.dataclass(frozen=True)
class RestoreCheckpointConfig:
    """path: the checkpoint a new run starts from (a templm checkpoint folder or a Hugging Face T5 folder); a run
    that already has checkpoints of its own resumes from its latest instead. None: random initialisation."""

    path: Optional[str] = None

    def __post_init__(self):
        require_field_types(self, "templm.RestoreCheckpointConfig")  # a quoted number or an infinity from gin, named


@gin.configurable(module="templm")
@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    save: SaveCheckpointConfig = SaveCheckpointConfig()
    restore: RestoreCheckpointConfig = RestoreCheckpointConfig()

    def __post_init__(self):
        require_field_types(self, "templm.CheckpointConfig")  # a quoted number or an infinity from gin, named

    def check(self, binding: str) -> None:
        self.save.check(f"{binding}.save")


@gin.configurable(module="templm")
@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """Adam (AdamW with weight_decay) at `learning_rate` on a `schedule` (templm.training.optimizers: "constant",
    "rsqrt", "cosine" decaying to 0 at the run's last step) after `warmup_steps` of linear warm-up, gradients clipped
    at `max_grad_norm` (0: not clipped)."""

    learning_rate: float = 2.5e-4
    schedule: str = "cosine"
    warmup_steps: int = 0
    max_grad_norm: float = 0.25
    name: str = "adam"
    weight_decay: float = 0.0

    def __post_init__(self):
        require_field_types(self, "templm.OptimizerConfig", {"learning_rate": "LEARNING_RATE"})  # from gin

    def check(self, binding: str) -> None:
        require_numbers(binding, {
            "learning_rate": (self.learning_rate, float, 0, "LEARNING_RATE"),
            "warmup_steps": (self.warmup_steps, int, 0, None), "max_grad_norm": (self.max_grad_norm, float, 0, None),
            "weight_decay": (self.weight_decay, float, 0, None)})

    def build(self, total_steps: int) -> optax.GradientTransformation:
        """The optax optimizer of a run of `total_steps` (where a cosine schedule reaches 0)."""
        schedule = learning_rate_schedule(self.schedule, self.learning_rate, self.warmup_steps, total_steps)
        return make_optimizer(self.name, schedule, weight_decay=self.weight_decay, max_grad_norm=self.max_grad_norm)
