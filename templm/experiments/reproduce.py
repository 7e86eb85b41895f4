"""`templm reproduce --preset smoke|small --out DIR [--seed S]`: the time-aware T5 study end to end, in one command.

    world -> yearly splits -> vocabulary and task records -> [a starting model, Study.pretrain_steps] -> Uniform,
    Temporal and Yearly T5 models (trained on the seen years) -> evaluation (TempLAMA F1 by year and slice,
    CustomNews perplexity, yearly router, F1 by year gap and by answer duration) -> future probes (log-likelihood
    degradation, calibration entropy, the Temporal model as of its last seen year) -> adaptation (alpha mixtures of
    a new year against retraining from scratch) -> streaming (Transformer-XL) -> report

`reproduce(preset, out_dir, seed)` writes under `out_dir`

    data/                 the task data (world, splits, SentencePiece model, TFRecords, manifest)
    models/<name>/        each model's checkpoints and metrics.jsonl
    stream_experiment/    the Transformer-XL half: its own world, TIME-STRATIFIED/CONTROL splits, models, results
    run.json              per half, the preset, seed and data its models belong to
    results.json          every number, with the findings judged from them (keys sorted; times only under "timing")

and returns the results dict, whose "findings" hold both halves' findings in the one shape of
templm.metrics.findings ({name: finding}, as over several seeds); the command line then writes report.md and
figures/ (templm.reports.reproduction).

A run stopped by SIGTERM saves the model it was training and raises Preempted (nothing is reported); the same command
run again finds run.json unchanged, keeps the models and resumes each from its checkpoint, so it ends with the numbers
of a run that never stopped. Each half keeps its own record: another preset, seed or data of one half starts that
half's models afresh and keeps the other's (a mended split folder retrains the Transformer-XL models only), and the
run says which; `only` / `skip` (--only, --skip) run a half alone or leave one out.

Models never see the future years: Uniform and Temporal train on the mixtures whose training splits hold only the
seen years (the SeqIO tasks' default), the starting model on the seen years' news, the Yearly experts on one seen
year each, and the retrained references (and the adaptation mixtures) on the seen years plus the new year. The same
preset and seed give the same numbers (seeded world, seeded and ordered tf.data pipelines, deterministic CPU
arithmetic); wall-clock times are kept apart, under "timing".

Studies (gin_configs/study/*.gin, templm/experiments/studies.py; docs/results.md has their measured times): `smoke` (the
demo: every stage, small and noisy), `small` (sized so that the paper's findings show), `tiny_test` (the test
suite's) and `paper` (the papers' settings, for an accelerator slice). A run prints one line as each stage starts and
ends (elapsed time and an ETA) and one per model trained.

Several processes (a multi-host slice, jax.distributed) run the same call: process 0 checks and locks the folder,
writes run.json, builds the task data (and the streaming half's data) and writes results.json; every training spans
all processes (the one loop of templm.training, the T5 batches fixed by `Study.data_shards`); each process evaluates
on its own device with the parameters gathered from all (partitioning.host_local).

The stages are functions of a `Reproduction` (what they all read and none changes) and of what the earlier stages
returned: `prepare_data` gives TaskData, `pretrain` (where the study has one), `train_main` and `train_yearly` the
TrainedModels, `evaluate` an Evaluation, `future_probes` and `adapt` a StageOutput; `_reproduce` runs them in order
and puts results.json together.

The Transformer-XL streaming half ("Mind the Gap": TIME-STRATIFIED and CONTROL models, monthly degradation, dynamic
evaluation) is the extra stage "streaming", registered in `EXTRA_STAGES` below; `extra_stages=[]` (the CLI's
--nostreaming) leaves it out. An extra stage gets a `StageContext` and returns a JSON-able dict that lands in
`results["extra"][name]`, its findings (an ExtraStage with a `half`) in results["findings"]; the report renders it
(templm.reports.reproduction.STAGE_SECTIONS).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import importlib.metadata
import json
import os
import platform
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import gin
import jax
import seqio

from templm import console, paths, tasks
from templm.data.regimes import SHARED_MODEL
from templm.data.readers import Corpus, TemplamaReader, resolve_corpus, templama_split_files
from templm.data.task_data import TaskDataConfig, prepare_task_data, read_manifest
from templm.data.world import WORLD_VERSION, load_world
from templm.errors import (ConfigError, DataError, Preempted, StageSkipped, cpu_model, read_json,
                           sigterm_received, watch_sigterm)
from templm.evaluation.checkpoint_eval import evaluate_params
from templm.evaluation.future_probes import (TextScorer, future_as_of, future_calibration, future_degradation,
                                             read_calibration)
from templm.evaluation.inference import ModelFns
from templm.evaluation.routing import YearRouter, evaluate_router
from templm.evaluation.task_eval import evaluate_model, with_params
from templm.experiments import adaptation, streaming
from templm.experiments.studies import PRETRAIN_TASKS, Preset, StreamPreset, load_study, study_names, world_config
from templm.io import format_duration, jsonable, write_json
from templm.metrics import qa, time_analysis
from templm.metrics.findings import STREAMING, TIME_AWARE, combine_findings, judge
from templm.metrics.statistics import mean_interval
from templm.models.t5 import T5_1_1_CONFIGS, EncoderDecoderModel, count_parameters
from templm.outputs import writing_into
from templm.settings import Settings
from templm.training import loop, partitioning, trainer
from templm.training.configs import CheckpointConfig, DatasetConfig, RestoreCheckpointConfig, SaveCheckpointConfig
from templm.training.loop import RunOptions
from templm.training.optimizers import make_optimizer


# The studies of gin_configs/study/ by name (their sizes: templm/experiments/studies.py).
PRESETS: Dict[str, Preset] = {name: load_study(name).preset for name in study_names()}


def t5_config(preset: Preset) -> Any:
    """The T5Config of a study's models: T5 v1.1 `base_model` with its dropout and `model`'s changes."""
    if preset.base_model not in T5_1_1_CONFIGS:
        raise ConfigError(f"Study.base_model: {preset.base_model!r} is not one of {', '.join(T5_1_1_CONFIGS)}")
    return T5_1_1_CONFIGS[preset.base_model].replace(dropout_rate=preset.dropout_rate, **dict(preset.model))


@dataclasses.dataclass(frozen=True)
class StudyData:
    """Where a reproduction's data comes from. The default (every field None) is the embedded world, drawn from the
    seed at the preset's size; otherwise the time-aware half reads a user's news `corpus` (one file, a glob pattern
    or a list) with the TempLAMA release in `templama_dir`, or task data prepared by `templm data tasks`
    (`task_data`, what TEMPLM_DATA_DIR names), and the streaming half reads `stream_corpus` (default: the corpus,
    or the corpus the task data was built from) split at `cutoff` (an ISO date; None: the latest cut-off whose
    validation and test months end with the corpus) or by the split files in `split_dir` (the paper's published
    `split_<cut-off>/` folder, or `templm data splits`). Years, seen and future years, the new year of adaptation and
    the cut-off then come from the data; the sizes from the preset. `calibration` names a calibration file
    (JSON lines as the world's calibration.jsonl); without one the calibration probe is skipped."""

    corpus: Optional[Corpus] = None
    templama_dir: Optional[str] = None
    task_data: Optional[str] = None
    calibration: Optional[str] = None
    stream_corpus: Optional[Corpus] = None
    split_dir: Optional[str] = None
    cutoff: Optional[str] = None

    def __post_init__(self):
        for name in ("corpus", "stream_corpus"):
            if isinstance(getattr(self, name), list):
                object.__setattr__(self, name, tuple(getattr(self, name)))
        if self.corpus is not None and self.task_data is not None:
            raise ConfigError("give a corpus or prepared task data, not both (the streaming half reads "
                              "--stream_corpus, by default the corpus the task data was built from)")
        if self.templama_dir is not None and self.corpus is None:
            raise ConfigError("a TempLAMA folder (--templama_dir) goes with the news corpus it is asked about "
                              "(--corpus)")
        if (self.split_dir is not None or self.cutoff is not None) and self.embedded:
            raise ConfigError("split files (--split_dir) and a cut-off (--cutoff) go with a corpus (--corpus or "
                              "--stream_corpus)")
        if self.split_dir is not None and self.cutoff is not None:
            raise ConfigError("give split files (--split_dir) or a cut-off (--cutoff), not both: the split files "
                              "fix the cut-off")
        if self.cutoff is not None:
            try:
                datetime.date.fromisoformat(self.cutoff)
            except (TypeError, ValueError):
                raise ConfigError(f"--cutoff: expected a date YYYY-MM-DD, got {self.cutoff!r}") from None

    @property
    def embedded(self) -> bool:
        return self.corpus is None and self.task_data is None and self.stream_corpus is None

    def record(self) -> Dict[str, Any]:
        """What run.json keeps of the data (absolute paths, patterns expanded): another source starts afresh."""
        def path(value):
            return None if value is None else paths.absolute(value)

        return {"corpus": None if self.corpus is None else resolve_corpus(self.corpus),
                "templama_dir": path(self.templama_dir), "task_data": path(self.task_data),
                "calibration": path(self.calibration),
                "stream_corpus": None if self.stream_corpus is None else resolve_corpus(self.stream_corpus),
                "split_dir": path(self.split_dir), "cutoff": self.cutoff}


EMBEDDED = StudyData()


# --------------------------------------------------------------------------------------------------------------------
# HOOK: extra stages. Each runs after adaptation, gets a StageContext, and returns a JSON-able dict stored as
# results["extra"][name]; wall-clock seconds returned under "timings_sec" move to results["timing"] (results outside
# "timing" must repeat exactly with the same seed), and the findings a stage with a `half` returns under "findings"
# join results["findings"]. The report renders a stage named in templm.reports.reproduction.STAGE_SECTIONS with its
# own section and figures, any other as JSON. The Transformer-XL streaming half ("Mind the Gap",
# templm/experiments/streaming.py) is registered this way at the bottom of this section.
# --------------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class StageContext:
    preset: Preset
    seed: int
    out_dir: str
    data_dir: str  # the task data (its world under data_dir/world, news in world/news.jsonl)
    manifest: Mapping[str, Any]
    figures_dir: str
    results: Mapping[str, Any]  # what the earlier stages found (read only)
    data: StudyData = EMBEDDED  # where the study's data comes from
    stream_preset: Optional[StreamPreset] = None  # the streaming half's sizes (None: the study of preset.name's)


@dataclasses.dataclass(frozen=True)
class ExtraStage:
    name: str
    run: Callable[[StageContext], Dict[str, Any]]
    estimated_s: Union[float, Callable[[Preset], float]] = 60.0  # for the ETA: seconds, or seconds by preset
    # The half of the study (templm.metrics.findings.HALVES) whose findings the stage returns under "findings"
    # ({name: finding}, as findings.judge gives them): they join the study's findings; None: it returns none.
    half: Optional[str] = None

    def estimate(self, preset: Preset) -> float:
        return float(self.estimated_s(preset) if callable(self.estimated_s) else self.estimated_s)


def _streaming_estimate(preset: Preset) -> float:
    return streaming.ESTIMATED_SECONDS.get(preset.name, streaming.ESTIMATED_SECONDS["smoke"])


EXTRA_STAGES: List[ExtraStage] = [ExtraStage("streaming", streaming.reproduce_stage, _streaming_estimate,
                                              half=STREAMING)]


# --------------------------------------------------------------------------------------------------------------------
# Progress.


class Progress:
    """Prints each stage's start and end with the elapsed time and an ETA from the planned cost of what is left
    (estimates at first, rescaled by how long the finished stages actually took)."""

    def __init__(self, plan: Sequence[Tuple[str, float]]):
        self.plan = list(plan)
        self.t0 = time.time()
        self.done_estimate = 0.0
        self.times: Dict[str, float] = {}
        self._current: Optional[Tuple[str, float, float]] = None

    def _eta(self, remaining_estimate: float) -> str:
        # How much slower (or faster) than planned the finished stages ran, damped so one short stage does not
        # swing the estimate: a minute of the plan counts as if it had run on time.
        elapsed = time.time() - self.t0
        scale = (elapsed + 60.0) / (self.done_estimate + 60.0)
        return format_duration(remaining_estimate * scale)

    def start(self, name: str) -> None:
        estimate = dict(self.plan)[name]
        index = [n for n, _ in self.plan].index(name) + 1
        remaining = sum(e for n, e in self.plan[index - 1:])
        console.say(f"reproduce [{index}/{len(self.plan)}] {name}: starting (elapsed "
                    f"{format_duration(time.time() - self.t0)}, ETA {self._eta(remaining)})")
        self._current = (name, estimate, time.time())

    def skip(self, name: str, reason: str) -> None:
        """A stage the data cannot support: one line saying why; its planned time leaves the ETA."""
        index = [n for n, _ in self.plan].index(name) + 1
        console.say(f"reproduce [{index}/{len(self.plan)}] {name}: skipped: {reason}")
        self.plan[index - 1] = (name, 0.0)
        self._current = None

    def end(self) -> None:
        name, estimate, started = self._current
        self.times[name] = time.time() - started
        self.done_estimate += estimate
        index = [n for n, _ in self.plan].index(name) + 1
        remaining = sum(e for n, e in self.plan[index:])
        console.say(f"reproduce [{index}/{len(self.plan)}] {name}: done in {format_duration(self.times[name])} "
                    f"(elapsed {format_duration(time.time() - self.t0)}, ETA {self._eta(remaining)})")
        self._current = None


def _plan(preset: Preset, n_experts: int, extra: Sequence[ExtraStage]) -> List[Tuple[str, float]]:
    # Seconds outside the steps, as the smoke study measured them on 2 CPU cores (docs/results.md): a training's
    # pipeline start and checkpoints, one evaluation of a model. The first ETA; later ones rescale by what ran.
    rate = preset.estimated_steps_per_s
    per_training, per_evaluation = 5.0, 2.0
    plan = [("data", 5.0)]
    if preset.pretrain_steps:
        plan.append(("pretrain", per_training + preset.pretrain_steps / rate))
    plan += [("train uniform and temporal", 2 * per_training + 2 * preset.steps / rate),
             ("train yearly experts", n_experts * (per_training + preset.yearly_steps / rate)),
             ("evaluate", per_evaluation * (n_experts + 6)),
             ("future probes", 5.0),
             ("adaptation", (2 * len(preset.alphas) + 2) * per_training
              + (2 * len(preset.alphas) * preset.adapt_steps + 2 * preset.retrain_steps) / rate
              + per_evaluation * (2 * len(preset.alphas) * (preset.adapt_eval_points + 1)
                                  + 2 * (preset.retrain_eval_points + 1)))]
    plan += [(f"extra: {stage.name}", stage.estimate(preset)) for stage in extra]
    return plan


# --------------------------------------------------------------------------------------------------------------------
# Data.


def _world_summary(stats: Mapping[str, Any], manifest: Mapping[str, Any]) -> Dict[str, Any]:
    counts = manifest["counts"]
    seen = set(manifest["seen_years"])
    return {"documents": stats["documents"], "entities": stats["entities"], "facts": stats["facts"],
            "templama_queries": stats["templama_queries"], "templama_splits": stats["templama_splits"],
            "multi_answer_share": stats["multi_answer_share"],
            "subjects_per_relation": stats["config"]["subjects_per_relation"],
            "docs_per_month": stats["config"]["docs_per_month"],
            "years": manifest["years"], "seen_years": manifest["seen_years"], "future_years": manifest["future_years"],
            "customnews_train_examples": sum(n for y, n in counts["customnews"]["train"].items() if int(y) in seen),
            "templama_train_examples": sum(n for y, n in counts["templama"]["train"].items() if int(y) in seen),
            "customnews_test_examples": sum(counts["customnews"]["test"].values()),
            "templama_test_examples": sum(counts["templama"]["test"].values())}


def _data_summary(source: str, data_dir: str, manifest: Mapping[str, Any]) -> Dict[str, Any]:
    """What results["world"] says of a user's data: where it came from, its documents and queries, its years."""
    counts = manifest["counts"]
    seen = set(manifest["seen_years"])
    config = manifest.get("config") or {}
    documents = None
    stats_path = paths.join(data_dir, "splits", "stats.json")
    if paths.exists(stats_path):
        with paths.open(stats_path, encoding="utf-8") as f:
            documents = (json.load(f).get("yearly") or {}).get("corpus_documents")
    templama = counts.get("templama") or {}
    splits = {name: sum((templama.get(split) or {}).values())
              for name, split in (("train", "train"), ("val", "validation"), ("test", "test"))}
    return {"source": source, "corpus": config.get("corpus"), "templama_dir": config.get("templama_dir"),
            "task_data": data_dir if source == "task data" else None, "documents": documents,
            "templama_queries": sum(splits.values()), "templama_splits": splits,
            "years": manifest["years"], "seen_years": manifest["seen_years"], "future_years": manifest["future_years"],
            "customnews_train_examples": sum(n for y, n in counts["customnews"]["train"].items() if int(y) in seen),
            "templama_train_examples": sum(n for y, n in (templama.get("train") or {}).items() if int(y) in seen),
            "customnews_test_examples": sum(counts["customnews"]["test"].values()),
            "templama_test_examples": splits["test"]}


# --------------------------------------------------------------------------------------------------------------------
# The pipeline.


class Reproduction:
    """What every stage of one reproduction reads and none changes: the preset, the seed, where the data and the
    models live, the data's source, the model, its optimizer and the device mesh (shared by every run of the preset
    in one process). Each stage is a function of it and of what the earlier stages returned (TaskData, trained
    parameters, an Evaluation), and returns what it found; `_reproduce` puts the results together. `prepare_data`
    and `train` are also what a test re-runs to check that a stage repeats exactly."""

    def __init__(self, preset: Preset, out_dir: str, seed: int, data: StudyData = EMBEDDED,
                 stream_preset: Optional[StreamPreset] = None, settings: Optional[Settings] = None):
        self.preset, self.out_dir, self.seed, self.data = preset, out_dir, seed, data
        self.settings = settings or Settings.from_environment()
        self.stream_preset = stream_preset
        config = t5_config(preset)
        shared = _shared(preset, config)
        self.model, self.optimizer, self.mesh = shared["model"], shared["optimizer"], shared["mesh"]
        self.shared = shared
        self.params_count = count_parameters(config)
        self.model_config = {k: getattr(config, k) for k in ("vocab_size", "emb_dim", "num_heads", "head_dim",
                                                             "mlp_dim", "num_encoder_layers", "num_decoder_layers")}
        self.lengths = {"inputs": preset.inputs_length, "targets": preset.targets_length}
        self.data_dir = paths.absolute(data.task_data) if data.task_data else paths.join(out_dir, "data")
        self.models_dir = paths.join(out_dir, "models")

    def header(self) -> Dict[str, Any]:
        """The results every run starts from, before any stage: the preset, the seed and the model's shape."""
        return {"preset": self.preset.name, "seed": self.seed, "config": dataclasses.asdict(self.preset),
                "model_config": dict(self.model_config), "models": {}, "regimes": {}, "summary": {}}

    # -- helpers ------------------------------------------------------------------------------------------------
    def train_data(self, mixture: str) -> DatasetConfig:
        """The training data of a model of the study: `mixture` in the preset's batches and lengths."""
        return DatasetConfig(mixture, self.lengths, self.preset.batch_size, shards=self.preset.data_shards)

    def eval_data(self, task: str, split: str = "test") -> DatasetConfig:
        """What a model of the study is evaluated on during training."""
        return DatasetConfig(task, self.lengths, self.preset.eval_batch_size, split=split)

    def start_of(self, name: Optional[str] = None) -> Tuple[Optional[str], str]:
        """(checkpoint folder or None, what results["models"] calls it) where the model `name` of the study starts
        when trained from the start (not fine-tuned): the study's starting model (Study.pretrain_steps) for every
        other model, else (and for the starting model itself) the study's initial checkpoint, else random
        initialisation."""
        p = self.preset
        if p.pretrain_steps and name != PRETRAINED:
            return paths.join(self.models_dir, PRETRAINED, "checkpoints"), PRETRAINED
        return p.initial_checkpoint, p.initial_checkpoint or "scratch"

    def train_kwargs(self, name: Optional[str] = None, stop: Optional[Callable[[], bool]] = None) -> Dict[str, Any]:
        """The trainer's arguments every model of the study shares; the model `name`, trained from the start (not
        fine-tuned), starts where `start_of` says; `stop`: RunOptions.stop."""
        p = self.preset
        save = SaveCheckpointConfig(period=0, keep=1,
                                    input_state_at_end=False)  # models of fixed length (a SIGTERM's save keeps it)
        return dict(model=self.model, optimizer=self.optimizer, random_seed=self.seed,
                    checkpoint_cfg=CheckpointConfig(save, RestoreCheckpointConfig(self.start_of(name)[0])),
                    stats_period=max(1, min(20, p.steps // 10)),
                    options=RunOptions(mesh=self.mesh, evaluator=evaluate_params,
                                       progress=console.LONG_WORK_SECONDS,  # a line for minutes of work
                                       # MODEL_DIR/config.gin: the study's bindings, as T5X's
                                       config_gin=gin.config_str() or None, stop=stop))

    def train(self, name: str, regime: str, mixture: str, steps: int, init: str = "scratch",
              stop: Optional[Callable[[], bool]] = None) -> "TrainedModel":
        start = time.time()
        result = trainer.train(model_dir=paths.join(self.models_dir, name), train_dataset_cfg=self.train_data(mixture),
                               total_steps=steps, eval_period=0, **self.train_kwargs(name, stop))
        params = partitioning.host_local(result.params)  # each process evaluates on its own device
        return self.trained(name, regime, mixture, int(result.step), (result.train or {}).get("loss"), init,
                            time.time() - start, params)

    def trained(self, name, regime, mixture, steps, loss, init, seconds, params=None) -> "TrainedModel":
        """A model a stage trained, as results["models"] records it (one line on the terminal)."""
        if init == "scratch":
            init = self.start_of(name)[1]
        record = {"regime": regime, "mixture": mixture, "params": self.params_count, "steps": steps,
                  "batch_size": self.preset.batch_size, "train_loss": None if loss is None else float(loss),
                  "init": init}
        console.say(f"  trained {name}: {steps} steps, final loss "
                    f"{'n/a' if loss is None else f'{float(loss):.3f}'}, {format_duration(seconds)}")
        return TrainedModel(params, record, seconds)

    def configure(self, data_dir: str, train_years: Optional[Sequence[int]] = None) -> None:
        """The SeqIO tasks over `data_dir`, training on `train_years` (default: the seen years)."""
        tasks.configure(data_dir=data_dir, train_years=train_years, settings=self.settings)

    def prepare_data(self) -> "TaskData":
        """The task data and what the study reads of it: the embedded world's (world, yearly splits, vocabulary and
        task records under data/), the user's corpus and TempLAMA release turned into task data under data/, or the
        prepared task data the run was given. Raises StageSkipped when there is no TempLAMA release to build from;
        TaskData.check says whether the time-aware half can run on what was built."""
        source, config = self._task_data_config()
        # Several processes: process 0 builds the task data, the others read it once it is there.
        manifest = partitioning.on_lead(
            lambda: None if config is None else prepare_task_data(config, self.data_dir),
            lambda: DataError("process 0 could not build the task data (its messages say why)", self.data_dir))
        if manifest is None:
            manifest = read_manifest(self.data_dir)
            if manifest is None:
                raise DataError("not task data (no manifest.json): build it with `templm data tasks`", self.data_dir)
        if source == "embedded world":
            with paths.open(paths.join(self.data_dir, "world", "stats.json"), encoding="utf-8") as f:
                summary = _world_summary(json.load(f), manifest)
        else:
            summary = _data_summary(source, self.data_dir, manifest)
        return TaskData(self.data_dir, manifest, list(manifest["seen_years"]), list(manifest["future_years"]),
                        source, summary, self.preset.future_years)

    def _task_data_config(self) -> Tuple[str, Optional[TaskDataConfig]]:
        """(source, the TaskDataConfig to build; None for prepared task data), or StageSkipped when the data has no
        time-aware half: decided from the study's data alone, the same in every process, before any work."""
        p = self.preset
        d = self.data
        if d.task_data:
            return "task data", None
        if d.corpus is not None:
            if d.templama_dir is None:
                raise StageSkipped("no TempLAMA release (--templama_dir): the time-aware half asks its queries")
            return "corpus", TaskDataConfig(corpus=resolve_corpus(d.corpus),
                                            templama_dir=paths.absolute(d.templama_dir), vocab_size=p.vocab_size,
                                            exact_vocab_size=False, future_years=p.future_years, seed=self.seed,
                                            heldout_fraction=p.heldout_fraction)
        if d.stream_corpus is not None:
            raise StageSkipped("no news corpus and TempLAMA release (--corpus, --templama_dir) for the time-aware "
                               "half; the streaming half reads --stream_corpus")
        return "embedded world", TaskDataConfig(
            world=world_config(p, self.seed),
            vocab_size=p.vocab_size, exact_vocab_size=False, future_years=p.future_years, seed=self.seed,
            heldout_fraction=p.heldout_fraction)

    def calibration_file(self) -> Optional[str]:
        """The calibration relations: the given file, or the embedded world's; None without either."""
        if self.data.calibration:
            return self.data.calibration
        world = paths.join(self.data_dir, "world", "calibration.jsonl")
        return world if paths.exists(world) else None


@dataclasses.dataclass(frozen=True)
class TaskData:
    """What the data stage found: the task data's folder and manifest, its seen and future years, its source
    ("embedded world", "corpus", "task data") and what results["world"] says of it."""

    data_dir: str
    manifest: Mapping[str, Any]
    seen: List[int]
    future: List[int]
    source: str
    summary: Dict[str, Any]
    future_years: int  # how many of the last years the study keeps as future years

    @property
    def new_year(self) -> Optional[int]:
        """The year adaptation adapts to: the first future year."""
        return self.future[0] if self.future else None

    def check(self) -> None:
        """Raises StageSkipped when the time-aware half cannot run on this data: no TempLAMA test queries, no seen
        year."""
        if self.source != "embedded world" and not self.summary["templama_test_examples"]:
            raise StageSkipped(f"the task data in {self.data_dir} holds no TempLAMA test queries: the time-aware "
                               "half asks them")
        if not self.seen:
            raise StageSkipped(f"no seen year: the data spans {_years(self.manifest['years'])} and the last "
                               f"{self.future_years} are kept as future years")

    def templama_test_file(self) -> str:
        """The TempLAMA test split the task data was built from."""
        folder = (self.manifest.get("config") or {}).get("templama_dir")
        if folder:
            return templama_split_files(folder)["test"]
        return paths.join(self.data_dir, "world", "templama", "test.jsonl")


@dataclasses.dataclass(frozen=True)
class TrainedModel:
    """A model a stage trained: its parameters (None once a stage has no more use for them), what results["models"]
    records of it, and its wall-clock seconds (results["timing"])."""

    params: Any
    record: Dict[str, Any]
    seconds: float


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """What the evaluation stage found: the sections it adds to results.json ("regimes", "summary", "yearly",
    "per_query", "duration"), the un-adapted Uniform and Temporal models' evaluations (regime -> {"templama",
    "customnews"}; adaptation compares with them query by query) and the TempLAMA test queries (the future probes
    ask them)."""

    results: Dict[str, Any]
    base: Dict[str, Dict[str, Any]]
    test_queries: List[Any]


@dataclasses.dataclass(frozen=True)
class StageOutput:
    """What a later stage adds to the results: sections of results.json, the models it trained (in order) and the
    parts of it the data could not support ({part: why})."""

    results: Dict[str, Any]
    models: Dict[str, TrainedModel] = dataclasses.field(default_factory=dict)
    skipped: Dict[str, str] = dataclasses.field(default_factory=dict)


def run_extra_stage(run: Reproduction, stage: ExtraStage, data: Optional[TaskData],
                    results: Mapping[str, Any]) -> Dict[str, Any]:
    """Runs an extra stage (see the HOOK above) on what the earlier stages found (`results`, read only) and returns
    what it returned, for results["extra"][name]."""
    context = StageContext(run.preset, run.seed, run.out_dir, run.data_dir,
                           dict(data.manifest) if data is not None else {}, paths.join(run.out_dir, "figures"),
                           dict(results), run.data, run.stream_preset)
    paths.makedirs(context.figures_dir)
    return dict(stage.run(context))


_SHARED: Dict[Any, Dict[str, Any]] = {}


def _shared(preset: Preset, config: Any) -> Dict[str, Any]:
    """What every run of a preset shares in one process (several seeds run one after another): the model and
    optimizer objects, the mesh, and the compiled evaluation functions made from them, so each is compiled once."""
    if preset not in _SHARED:
        _SHARED.clear()
        model = EncoderDecoderModel(config)
        _SHARED[preset] = {
            "model": model, "optimizer": make_optimizer(name="adafactor", learning_rate=preset.learning_rate),
            "mesh": partitioning.make_mesh(devices=partitioning.run_devices()),
            "fns": ModelFns(model, None, batch_size=preset.eval_batch_size, max_decode_length=preset.targets_length),
            "scorer": TextScorer(model, None, {"inputs": preset.inputs_length, "targets": preset.targets_length},
                                 preset.eval_batch_size)}
    return _SHARED[preset]


PRETRAINED = "pretrained"  # the study's starting model (Preset.pretrain_steps)


def pretrain(run: Reproduction, data: TaskData) -> Dict[str, TrainedModel]:
    """The starting model every other model of the study starts from: the seen years' news alone (salient-span
    masking or T5's random spans, Study.pretrain_objective; no year prefix, no TempLAMA queries), as the paper's
    models all start from T5-CBQA, trained with SSM on text of every year before its snapshot. Its parameters are not
    kept: the others read its checkpoint. With Study.pretrain_snapshot it reads the last seen year's news alone."""
    years = [max(data.seen)] if run.preset.pretrain_snapshot else sorted(data.seen)
    run.configure(data.data_dir, train_years=years)
    try:
        model = run.train(PRETRAINED, "pretrain", PRETRAIN_TASKS[run.preset.pretrain_objective],
                          run.preset.pretrain_steps)
    finally:
        run.configure(data.data_dir)
    return {PRETRAINED: TrainedModel(None, {**model.record, "years": years}, model.seconds)}


def at_once(run: Reproduction, jobs: Sequence[Tuple[str, Callable[[Any], Any]]]) -> Dict[str, Any]:
    """The jobs, `Study.trainings_at_once` at a time (templm.training.loop.at_once)."""
    return loop.at_once(jobs, run.preset.trainings_at_once)


def train_models(run: Reproduction, jobs: Sequence[Tuple[str, str, str, int]]) -> Dict[str, TrainedModel]:
    """run.train(name, regime, mixture, steps) of each job, by name in the jobs' order, `at_once`."""
    def training(job):
        return lambda stop: run.train(*job, stop=stop)

    return at_once(run, [(job[0], training(job)) for job in jobs])


def train_main(run: Reproduction, data: TaskData) -> Dict[str, TrainedModel]:
    """The Uniform and Temporal models, on the seen years (the mixtures' training splits hold only those)."""
    run.configure(data.data_dir)
    return train_models(run, [(regime, regime, f"{regime}_mixture", run.preset.steps) for regime in SHARED_MODEL])


def train_yearly(run: Reproduction, data: TaskData) -> Dict[str, TrainedModel]:
    """One expert per seen year, on that year's data."""
    run.configure(data.data_dir)
    return train_models(run, [(f"yearly_{year}", "yearly", f"yearly_{year}_mixture", run.preset.yearly_steps)
                              for year in data.seen])


def _qa_summary(data: TaskData, templama, customnews, params: int, steps: int) -> Tuple[Dict, Dict]:
    """(results["regimes"][regime], results["summary"][regime]) of one model's evaluations."""
    return ({"templama": templama.metrics, "customnews": customnews.metrics},
            {"params": params, "steps": steps,
             "seen_ppl": time_analysis.pooled_perplexity(customnews.metrics, data.seen),
             "future_ppl": time_analysis.pooled_perplexity(customnews.metrics, data.future)})


def _stop_if_asked(where: str) -> None:
    """Raises Preempted when SIGTERM arrived: long evaluation stages stop between two models, not at their end."""
    if sigterm_received():
        raise Preempted(f"while evaluating {where} (the models trained so far are saved; nothing is reported)")


def evaluate(run: Reproduction, data: TaskData, params: Mapping[str, Any]) -> Evaluation:
    """TempLAMA and CustomNews of the Uniform and Temporal models and of the yearly router, each expert on every
    year (the fall-off with the year gap), and F1 by answer duration. "per_query" holds the three models' per-query
    TempLAMA F1 with each query's answer duration (None where unknown), and their per-example CustomNews span F1
    under "customnews". `params`: {model name: parameters}."""
    run.configure(data.data_dir)
    fns = run.shared["fns"]
    regimes: Dict[str, Any] = {}
    summary: Dict[str, Any] = {}
    evaluations, news_evaluations = {}, {}
    base = {}
    for regime in SHARED_MODEL:
        _stop_if_asked(regime)
        model_fns = with_params(fns, params[regime])
        templama = evaluate_model(model_fns, f"templama_{regime}", run.lengths)
        customnews = evaluate_model(model_fns, f"customnews_ssm_{regime}", run.lengths)
        regimes[regime], summary[regime] = _qa_summary(data, templama, customnews, run.params_count, run.preset.steps)
        evaluations[regime] = templama
        news_evaluations[regime] = customnews
        base[regime] = {"templama": templama, "customnews": customnews}
    _stop_if_asked("the yearly experts")
    router = YearRouter({year: params[f"yearly_{year}"] for year in data.seen})
    templama = evaluate_router(router, fns, "templama_uniform", run.lengths)
    customnews = evaluate_router(router, fns, "customnews_ssm_uniform", run.lengths)
    regimes["yearly"], summary["yearly"] = _qa_summary(data, templama, customnews, run.params_count * len(data.seen),
                                                       run.preset.yearly_steps * len(data.seen))
    regimes["yearly"]["routes"] = {str(y): router.route(y) for y in data.manifest["years"]}
    evaluations["yearly"] = templama
    news_evaluations["yearly"] = customnews

    # Each expert on every year's test examples, TempLAMA and CustomNews: the fall-off with the year gap.
    experts: Dict[str, Dict[int, Any]] = {"templama": {}, "customnews": {}}
    expert_evaluations: Dict[str, Dict[str, Any]] = {"templama": {}, "customnews": {}}
    for year in data.seen:
        _stop_if_asked(f"the {year} expert")
        for folder, task in (("templama", "templama_uniform"), ("customnews", "customnews_ssm_uniform")):
            evaluation = evaluate_model(with_params(fns, params[f"yearly_{year}"]), task, run.lengths)
            experts[folder][year] = {k: v for k, v in evaluation.metrics.items()
                                     if k.split("_")[0] in ("f1", "em", "count")}
            expert_evaluations[folder][str(year)] = evaluation
    by_gap = time_analysis.f1_by_year_gap(experts["templama"])
    news_by_gap = time_analysis.f1_by_year_gap(experts["customnews"])
    yearly = {"experts": experts["templama"], "by_gap": by_gap, "falloff": time_analysis.falloff(by_gap),
              "per_query": per_query_f1(expert_evaluations["templama"]),
              "customnews": {"experts": experts["customnews"], "by_gap": news_by_gap,
                             "falloff": time_analysis.falloff(news_by_gap),
                             "per_query": per_query_f1(expert_evaluations["customnews"])}}

    queries = list(TemplamaReader(data.templama_test_file(), quiet_repeats=True))  # the task data's build said them
    durations = time_analysis.answer_durations(queries, world_fact_spans(data))
    seen = set(data.seen)
    duration = {}
    for regime, evaluation in evaluations.items():
        ids = {ex["id"] for ex in evaluation.examples if ex.get("year") in seen}
        predictions = {i: p for i, p in evaluation.predictions().items() if i in ids}
        duration[regime] = time_analysis.f1_by_duration(predictions, evaluation.answers(), durations)
    per_query = per_query_f1(evaluations)
    per_query["duration"] = [durations.get(i) for i in per_query["id"]]
    per_query["customnews"] = per_query_f1(news_evaluations)
    return Evaluation({"regimes": regimes, "summary": summary, "yearly": yearly, "per_query": per_query,
                       "duration": duration}, base, queries)


def world_fact_spans(data: "TaskData") -> Optional[List[Tuple[str, str, str, Optional[int], Optional[int]]]]:
    """(subject, relation, object name, first year, last year) of every fact of the embedded world the TempLAMA
    test split was drawn from, for answer durations from the facts' own spans (a fact still holding at the world's
    end lasts to its last year); None for a TempLAMA release, whose rows carry no fact spans."""
    world_dir = paths.join(data.data_dir, "world")
    if data.templama_test_file() != paths.join(world_dir, "templama", "test.jsonl") or \
            not paths.exists(paths.join(world_dir, "world.json")):
        return None
    world = load_world(world_dir)
    end = int(world["config"]["end_year"])
    names = {eid: e.name for eid, e in world["entities"].items()}
    return [(f.subject, f.relation, names[f.object], f.start.year if f.start else None, f.end.year if f.end else end)
            for f in world["facts"]]


def per_query_f1(evaluations: Mapping[str, Any]) -> Dict[str, Any]:
    """Per-query token F1 (x100, as the metrics' `f1`) of several models' evaluations of one test set, aligned:
    {"id": [...], "year": [...], "f1": {model: [...]}} over the queries every evaluation holds, sorted by id, and
    where every evaluation scored its examples, "loglik": {model: [...]}, each query's target log-likelihood (nats;
    the same target for every model, so that a paired difference is one of perplexity). The findings' paired tests
    compare models query by query."""
    scored = {name: {ex["id"]: (ex.get("year"), 100.0 * qa.token_f1(ex["prediction"], ex["answers"]),
                                ex.get("score")) for ex in evaluation.examples}
              for name, evaluation in evaluations.items()}
    ids = sorted(set.intersection(*(set(s) for s in scored.values()))) if scored else []
    first = next(iter(scored.values()), {})
    out = {"id": ids, "year": [first[i][0] for i in ids],
           "f1": {name: [s[i][1] for i in ids] for name, s in scored.items()}}
    if ids and all(s[i][2] is not None for s in scored.values() for i in ids):
        out["loglik"] = {name: [s[i][2] for i in ids] for name, s in scored.items()}
    return out


def future_probes(run: Reproduction, data: TaskData, params: Mapping[str, Any],
                  test_queries: Sequence[Any]) -> StageOutput:
    """The Uniform and Temporal models asked about the years after the last seen one: the log-likelihood of the
    test queries' answers by year gap, the entropy over the calibration relations' candidates (skipped, with the
    reason, without calibration relations), and the Temporal model's future-year F1 as of its last seen year."""
    if not data.future:
        raise StageSkipped(f"no future year: the data's years {_years(data.manifest['years'])} are all seen years")
    vocabulary = seqio.get_mixture_or_task("templama_temporal").output_features["targets"].vocabulary
    scorer = run.shared["scorer"].with_vocabulary(vocabulary)
    path = run.calibration_file()
    calibration = read_calibration(path) if path else None
    skipped = {}
    if calibration is None:
        skipped["calibration"] = ("no calibration relations: the embedded world writes calibration.jsonl; give one "
                                  "with --calibration")
        console.say(f"  calibration: skipped: {skipped['calibration']}")
    last_seen = data.seen[-1]
    years = list(range(last_seen + 1, last_seen + 1 + run.preset.calibration_years))
    results: Dict[str, Any] = {"degradation": {}}
    if calibration is not None:
        results["calibration"] = {}
    for regime in SHARED_MODEL:
        _stop_if_asked(f"the {regime} model's future years")
        results["degradation"][regime] = future_degradation(scorer, params[regime], regime, test_queries, last_seen,
                                                            run.preset.max_gap)
        if calibration is not None:
            results["calibration"][regime] = future_calibration(scorer, params[regime], regime, calibration, years)
    _stop_if_asked("the temporal model as of its last seen year")
    results["future_as_of"] = future_as_of(scorer, params["temporal"], test_queries, last_seen)
    return StageOutput(results, skipped=skipped)


RETRAINED_MODEL = {"temporal": "retrain", "uniform": "retrain_uniform"}  # the from-scratch references' model names


def adapt(run: Reproduction, data: TaskData, base: Evaluation) -> StageOutput:
    """Dhingra et al., Section 5: the Uniform and the Temporal model each fine-tuned on alpha mixtures of the new
    year's news (with and without the year prefix), scored on TempLAMA and CustomNews for the new and the old
    years, against the same regime retrained from scratch on every year up to the new one (the paper compares
    with "models retrained from scratch"; results["adaptation"]["retrained"] is Temporal's, each regime's own under
    its "retrained"). `base`: the evaluation stage's Evaluation (the un-adapted models' scores, compared query by
    query)."""
    p = run.preset
    new_year, seen = data.new_year, data.seen
    if new_year is None:
        raise StageSkipped(f"no future year to adapt to: the data's years {_years(data.manifest['years'])} are all "
                           "seen years")
    run.configure(data.data_dir)
    fns = run.shared["fns"]
    evaluated: Dict[Tuple[int, str], Any] = {}  # (id(params), task) -> its evaluation, reused for the per-query scores
    evaluating = threading.RLock()  # one evaluation at a time, beside the trainings

    def evaluate_on(task):
        def evaluate(params):  # the final scores, with the functions the evaluation stage compiled
            key = (id(params), task)
            with evaluating:
                if key not in evaluated:
                    local = partitioning.host_local(params)  # each process evaluates on its own device
                    evaluated[key] = evaluate_model(with_params(fns, local), task, run.lengths)
                return evaluated[key].metrics
        return evaluate

    def evaluations_of(params, regime):
        tasks_of = {"templama": f"templama_{regime}", "customnews": f"customnews_ssm_{regime}"}
        with evaluating:
            for task in tasks_of.values():
                evaluate_on(task)(params)
            return {folder: evaluated.pop((id(params), task)) for folder, task in tasks_of.items()}

    def period(steps, points):  # evaluations during training only where a curve is asked for
        return max(1, steps // points) if points > 1 else None

    def train_kwargs(stop):  # the trainer's evaluations (a curve's points) take their turn with the others
        kwargs = run.train_kwargs(stop=stop)
        evaluator = kwargs["options"].evaluator

        def in_turn(*args, **evaluator_kwargs):
            with evaluating:
                return evaluator(*args, **evaluator_kwargs)
        kwargs["options"] = dataclasses.replace(kwargs["options"], evaluator=in_turn)
        return kwargs

    # The references: each regime retrained from scratch on the seen years and the new one; the fine-tunes of each
    # regime, one alpha after the other. Each job trains, then scores what it trained (the parameters let go); the
    # jobs run `Study.trainings_at_once` at a time. The fine-tunes too take TempLAMA's training queries of those
    # years (their mixtures are shaped like the training mixtures).
    def retrain(regime):
        def job(stop):
            _stop_if_asked(f"the {regime} model retrained from scratch")
            name = RETRAINED_MODEL[regime]
            r = adaptation.train_with_curve(paths.join(run.models_dir, name),
                                            run.train_data(f"{regime}_mixture"), p.retrain_steps,
                                            run.eval_data(f"templama_{regime}"), new_year, seen,
                                            period(p.retrain_steps, p.retrain_eval_points),
                                            evaluate=evaluate_on(f"templama_{regime}"), **train_kwargs(stop))
            seconds, evaluations = r.pop("wall_s"), evaluations_of(r.pop("params"), regime)
            return r, evaluations, run.trained(name, regime, f"{regime}_mixture ({_years(seen + [new_year])})",
                                               r["steps"], r["train_loss"], "scratch", seconds)
        return job

    def fine_tune(regime):
        def job(stop):
            runs = adaptation.fine_tune_alphas(paths.join(run.models_dir, regime, "checkpoints"), new_year, seen,
                                               p.alphas, p.adapt_steps, paths.join(run.models_dir, "adapt"),
                                               run.train_data(f"{regime}_mixture"), run.eval_data(f"templama_{regime}"),
                                               period(p.adapt_steps, p.adapt_eval_points),
                                               evaluate_on(f"templama_{regime}"), regime=regime,
                                               **train_kwargs(stop))
            scored = {}
            for alpha, r in runs.items():
                _stop_if_asked(f"the {regime} model adapted with alpha {alpha}")
                seconds, evaluations = r.pop("wall_s"), evaluations_of(r.pop("params"), regime)
                name = f"adapt_alpha{alpha}" if regime == "temporal" else f"adapt_{regime}_alpha{alpha}"
                scored[alpha] = (name, r, evaluations, run.trained(name, regime, r["mixture"], r["steps"],
                                                                   r["train_loss"], regime, seconds))
            return scored
        return job

    regimes_order = ("temporal", "uniform")
    run.configure(data.data_dir, train_years=seen + [new_year])
    try:
        done = at_once(run, [(f"retrain {regime}", retrain(regime)) for regime in regimes_order]
                       + [(f"fine-tune {regime}", fine_tune(regime)) for regime in regimes_order])
    finally:
        run.configure(data.data_dir)

    models: Dict[str, TrainedModel] = {}
    retrained, retrained_evaluations = {}, {}
    for regime in regimes_order:
        r, retrained_evaluations[regime], models[RETRAINED_MODEL[regime]] = done[f"retrain {regime}"]
        r["customnews"] = adaptation.new_and_old_f1(retrained_evaluations[regime]["customnews"].metrics, new_year,
                                                    seen)
        retrained[regime] = r

    regimes = {}
    for regime in regimes_order:
        base_evaluations = base.base[regime]
        base_f1 = adaptation.new_and_old_f1(base_evaluations["templama"].metrics, new_year, seen)
        per_query = {folder: {"base": evaluation} for folder, evaluation in base_evaluations.items()}
        runs = {}
        for alpha, (name, r, evaluations, model) in done[f"fine-tune {regime}"].items():
            models[name] = model
            for folder, evaluation in evaluations.items():
                per_query[folder][alpha] = evaluation
            r["customnews"] = adaptation.new_and_old_f1(per_query["customnews"][alpha].metrics, new_year, seen)
            runs[alpha] = r
        for folder in ("templama", "customnews"):
            per_query[folder]["retrained"] = retrained_evaluations[regime][folder]
        news_base = adaptation.new_and_old_f1(base_evaluations["customnews"].metrics, new_year, seen)
        own = retrained[regime]
        regimes[regime] = {
            "runs": runs, "retrained": own, "summary": adaptation.summarize(base_f1, runs, own, p.steps),
            "customnews_summary": adaptation.summarize(
                news_base, {a: {**r["customnews"], "steps": r["steps"]} for a, r in runs.items()},
                {**own["customnews"], "steps": own["steps"]}, p.steps),
            "per_query": {folder: per_query_f1(evaluations) for folder, evaluations in per_query.items()}}
    return StageOutput({"adaptation": {"new_year": new_year, "old_years": seen, "retrained": retrained["temporal"],
                                       "regimes": regimes}}, models)


def _name_the_model(error: DataError, models_dir: str) -> None:
    """A model of the study whose checkpoints cannot be restored (every step damaged): raises the error again with
    what to do, naming the model's folder; any other DataError goes on as it is."""
    path = paths.absolute(error.path or ".")
    models_dir = paths.absolute(models_dir)
    sep = "/" if paths.is_url(models_dir) else os.sep
    if not path.startswith(models_dir + sep):
        return
    parts = path[len(models_dir) + 1:].split(sep)
    folder = paths.join(models_dir, *parts[:2 if parts[0] == "adapt" and len(parts) > 1 else 1])
    raise DataError(f"{error.reason}. The study cannot go on from this model: remove {folder} and run the same "
                    "command again to train it afresh (the other models are kept, and the results of the earlier "
                    "run stay until the new ones replace them)", error.path) from None


def _years(years: Sequence[int]) -> str:
    return f"{years[0]}-{years[-1]}" if len(years) > 1 else str(years[0])


RUN_RECORD = "run.json"
REPRODUCTION = "reproduction"  # the kind of output folder (templm.outputs)


# The stages of the time-aware half, in order; when the data stage is skipped (no TempLAMA), all of them are, and
# when the future probes are, adaptation is too (it adapts to the first future year).
T5_STAGES = ("data", "pretrain", "train uniform and temporal", "train yearly experts", "evaluate", "future probes",
             "adaptation")


# The halves of a study, what each trains into (under out_dir) and the stages each runs. A half's models depend on
# its own record alone (`_half_records`): changing what only one half reads retrains that half only.
HALVES: Dict[str, Tuple[str, Tuple[str, ...]]] = {
    "time_aware": ("models", T5_STAGES),
    "streaming": ("stream_experiment", ("extra: streaming",)),
}
# What --skip may leave out besides a half, and the later stages that need it (skipped with it).
SKIPPABLE_STAGES: Dict[str, Tuple[str, ...]] = {"future_probes": ("future probes", "adaptation"),
                                                "adaptation": ("adaptation",)}


def stage_selection(only: Optional[Sequence[str]] = None, skip: Sequence[str] = ()) -> Dict[str, str]:
    """{stage: why it is not run} for --only (halves: time_aware, streaming) and --skip (a half, or future_probes
    or adaptation, whose later stages need them and go with them). A ConfigError names an unknown choice."""
    out: Dict[str, str] = {}
    for flag, names, choices in (("--only", only or (), tuple(HALVES)),
                                 ("--skip", skip, tuple(HALVES) + tuple(SKIPPABLE_STAGES))):
        for name in names:
            if name not in choices:
                raise ConfigError(f"{flag} {name!r}: expected one of {', '.join(choices)}")
    if only:
        for half, (_, stages) in HALVES.items():
            if half not in only:
                out.update({stage: f"--only {','.join(only)}" for stage in stages})
    for name in skip:
        stages = HALVES[name][1] if name in HALVES else SKIPPABLE_STAGES[name]
        out.update({stage: f"--skip {name}" for stage in stages})
    return out


# Preset fields no model depends on (the first ETA, how the probes and evaluation run, how many models train at once):
# changing them keeps the models.
EVALUATION_ONLY = frozenset({"estimated_steps_per_s", "eval_batch_size", "max_gap", "calibration_years",
                             "trainings_at_once"})


def _half_records(preset: Preset, seed: int, extra: Sequence[ExtraStage], data: StudyData,
                  stream_preset: Optional[StreamPreset]) -> Dict[str, Dict[str, Any]]:
    """What each half's models depend on: the time-aware half on its preset, the seed and its data (the world's
    version, or the corpus and TempLAMA release or task data); the streaming half on its preset, the seed and its
    corpus, split files and cut-off. (The calibration file only changes an evaluation, which every run redoes.)"""
    given = data.record()
    source: Dict[str, Any] = {"world_version": WORLD_VERSION} if data.embedded else {}
    shaping = {k: v for k, v in dataclasses.asdict(preset).items() if k not in EVALUATION_ONLY}
    halves = {"time_aware": {"preset": shaping, "seed": seed, **source}}
    if not data.embedded:
        halves["time_aware"]["data"] = {k: given[k] for k in ("corpus", "templama_dir", "task_data")}
    if any(stage.name == "streaming" for stage in extra):
        stream = {"stream_preset": None if stream_preset is None else dataclasses.asdict(stream_preset),
                  "study": preset.name, "seed": seed, **source}
        if not data.embedded:
            stream["data"] = {k: given[k] for k in ("corpus", "task_data", "stream_corpus", "split_dir", "cutoff")}
        halves["streaming"] = stream
    return jsonable(halves)


def _with_later_fields(record: Any) -> Any:
    """An earlier run's record of a half with the preset fields templm gained since at their defaults: a field is
    added with the default that keeps what runs did before it, so a run recorded without it ran with that value (and
    its models are kept, not trained again). The other parts of the record (the seed, the world's version, the data)
    are compared as they are."""
    if not isinstance(record, dict):
        return record
    filled = dict(record)
    for key, kind in (("preset", Preset), ("stream_preset", StreamPreset)):
        if isinstance(filled.get(key), dict):
            defaults = {f.name: f.default for f in dataclasses.fields(kind)
                        if f.default is not dataclasses.MISSING and f.name not in EVALUATION_ONLY}
            filled[key] = {**jsonable(defaults), **filled[key]}
    return filled


def _changed(old: Any, new: Any, prefix: str = "") -> List[str]:
    """The keys (dotted) whose values differ between two records."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [k for key in sorted(set(old) | set(new))
                for k in _changed(old.get(key), new.get(key), f"{prefix}{key}.")]
    return [] if old == new else [prefix.rstrip(".") or "the record"]


def _start_or_resume(out_dir: str, preset: Preset, seed: int, extra: Sequence[ExtraStage],
                     data: StudyData = EMBEDDED, stream_preset: Optional[StreamPreset] = None,
                     running: Sequence[str] = tuple(HALVES)) -> Dict[str, bool]:
    """Records the run in out_dir/run.json, one record per half. A half whose record equals the earlier run's keeps
    its models (each trainer resumes from its checkpoint, a finished one trains nothing); a half whose record differs
    starts afresh (its models are removed, so a run never resumes another's checkpoints), and the run says which of
    its inputs changed. Halves not `running` (--only, --skip) keep their models and their earlier record. The
    results of an earlier run (results.json, report.md, figures/) stay until this run has finished and replaces them
    (one commit: a rerun that fails leaves them as they were), unless a half starts afresh: they describe the models
    it removes, so they are removed with them, and the line that says so comes first. Returns {half: reused}.
    Several processes: process 0 does it, the others wait for it (and take nothing as reused)."""
    halves = _half_records(preset, seed, extra, data, stream_preset)
    if not partitioning.is_lead():
        partitioning.barrier("reproduce: run.json")
        return {half: False for half in halves}
    path = paths.join(out_dir, RUN_RECORD)
    previous: Dict[str, Any] = {}
    if paths.exists(path):
        previous = read_json(path, "no run record")  # a corrupt one is named
        if not isinstance(previous, dict):
            raise DataError("a run record must hold a JSON object: remove it to start the run afresh", path)
    before = previous.get("halves") if isinstance(previous.get("halves"), dict) else {}
    reused = {}
    record = dict(before)
    names = {"time_aware": "time-aware", "streaming": "streaming"}
    for half, rec in halves.items():
        if half not in running:
            continue
        earlier = _with_later_fields(before.get(half))
        reused[half] = earlier == rec
        if reused[half]:
            console.say(f"reproduce: resuming the {names[half]} half's models in {out_dir} (its preset, seed and data "
                        "are the earlier run's)")
        else:
            target = paths.join(out_dir, HALVES[half][0])
            if paths.exists(target):
                changed = _changed(earlier, rec) if earlier else ["an earlier record's form"]
                # Said before anything is removed: the models, and the earlier results that describe them (a
                # results.json and report beside models that are gone would describe models no longer there).
                stale = [name for name in RESULT_FILES if paths.exists(paths.join(out_dir, name))]
                console.say(f"reproduce: the {names[half]} half starts afresh (changed since the earlier run: "
                            f"{', '.join(changed[:4])}{' ...' if len(changed) > 4 else ''}): removing its models "
                            f"in {target}" + (f" and the earlier results that describe them ({', '.join(stale)})"
                                               if stale else ""))
                for name in stale:  # results.json first: without it nothing here claims to be a result
                    stale_path = paths.join(out_dir, name)
                    paths.rmtree(stale_path) if paths.isdir(stale_path) else paths.remove(stale_path)
            if paths.isdir(target):
                paths.rmtree(target)
            elif paths.exists(target):
                paths.remove(target)
        record[half] = rec
    write_json(path, {"halves": record})
    partitioning.barrier("reproduce: run.json")
    return reused


# A finished run's result, as `templm reproduce` commits it (templm.reports.reproduction.write_report).
RESULT_FILES = ("results.json", "report.md", "figures")


@contextlib.contextmanager
def reproduction_folder(out_dir: str, overwrite: bool = False) -> Iterator[str]:
    """The reproduction's folder (absolute), checked, created and locked by process 0 (templm.outputs.writing_into);
    the other processes of a multi-host run use the folder process 0 holds."""
    if not partitioning.is_lead():
        yield paths.absolute(out_dir)
        return
    with writing_into(out_dir, REPRODUCTION, overwrite) as folder:
        yield folder


def reproduce(preset: Union[str, Preset], out_dir: str, seed: int = 0,
              extra_stages: Optional[Sequence[ExtraStage]] = None, overwrite: bool = False,
              data: StudyData = EMBEDDED, stream_preset: Optional[StreamPreset] = None,
              settings: Optional[Settings] = None, only: Optional[Sequence[str]] = None,
              skip: Sequence[str] = (), write_results: bool = True) -> Dict[str, Any]:
    """Runs the whole study for `preset` (a study name, gin_configs/study/NAME.gin, or a Preset; `stream_preset`
    sizes the streaming half, by default the study's of the preset's name) on `data` (StudyData; default: the
    embedded world) into `out_dir`; writes results.json (with the findings) and returns the results dict as it holds
    them.
    A stage the data cannot support is skipped with one line saying why (results["skipped"]: {stage: reason}); the
    findings that needed it say they were not tested, and why. `settings`: what the environment configures
    (templm.settings; default: read from it now): the vocabulary the tasks read, templm's cache.

    `only` (halves: "time_aware", "streaming") and `skip` (a half, "future_probes" or "adaptation") leave stages
    out; they are skipped as a stage the data cannot support is, naming the flag (`stage_selection`).

    `extra_stages` default to the registered `EXTRA_STAGES`. Each half of a rerun whose preset, seed and data are
    the earlier run's resumes its models; a half whose inputs changed starts afresh, the other keeps its models
    (`_start_or_resume`). SIGTERM raises Preempted from
    the stage that was training, after its checkpoint: nothing is written then. `out_dir` must be absent, empty or a
    templm reproduction (unless `overwrite`), and is locked while the run writes it. `write_results` False: results.json
    is left to the caller, which writes it with the report as one commit (templm.reports.reproduction.write_report
    with results_json, as `templm reproduce` does).
    """
    if isinstance(preset, str):
        study = load_study(preset)
        preset, stream_preset = study.preset, stream_preset or study.stream
    extra = list(EXTRA_STAGES if extra_stages is None else extra_stages)
    selection = stage_selection(only, skip)  # a misspelt choice before any work
    with reproduction_folder(out_dir, overwrite) as out_dir:
        return _reproduce(preset, out_dir, seed, extra, data, stream_preset,
                          settings or Settings.from_environment(), selection, write_results)


def check_stream_splits(data: StudyData) -> None:
    """A study's split files (--split_dir) checked against the corpus the streaming half reads, before any model is
    trained: a split naming none of it is refused (DataError naming the file); ids it lacks are counted and said
    now (the streaming half then reads the splits without them) rather than found at the end of the study."""
    if data.split_dir is None:
        return
    corpus = data.stream_corpus or data.corpus
    if corpus is None and data.task_data is not None:
        corpus = ((read_manifest(data.task_data) or {}).get("config") or {}).get("corpus")
    if corpus is not None:  # else the streaming half is skipped, and says why
        streaming.published_split_stats(data.split_dir, corpus)


def _reproduce(preset: Preset, out_dir: str, seed: int, extra: List[ExtraStage], data: StudyData,
               stream_preset: Optional[StreamPreset], settings: Settings,
               selection: Optional[Mapping[str, str]] = None, write_results: bool = True) -> Dict[str, Any]:
    _enable_compilation_cache(settings.cache_dir)
    selection = dict(selection or {})
    running = [half for half, (_, stages) in HALVES.items() if any(s not in selection for s in stages)]
    _start_or_resume(out_dir, preset, seed, extra, data, stream_preset, running)
    previous_data_dir = tasks.current().get("data_dir")
    t0 = time.time()
    run = Reproduction(preset, out_dir, seed, data, stream_preset, settings)
    progress = Progress(_plan(preset, preset.end_year - preset.start_year + 1 - preset.future_years, extra))
    results = run.header()
    skipped: Dict[str, str] = {}  # stage (or part of one) -> why the data could not support it
    model_times: Dict[str, float] = {}
    extra_times: Dict[str, Any] = {}
    found: Dict[str, Dict[str, Any]] = {}  # the extra stages' findings

    def stage(name: str, fn: Callable[[], Any]) -> Any:
        """Runs one stage and returns what it returned; None where it was skipped (or the data stage was, for the
        time-aware half's stages), with one line saying why."""
        if sigterm_received():
            raise Preempted(f"before the stage '{name}' (the models trained so far are saved in {out_dir})")
        if name in selection:
            skipped[name] = selection[name]
            progress.skip(name, selection[name])
            return None
        if "data" in skipped and name in T5_STAGES:
            skipped[name] = skipped["data"]
            progress.skip(name, "the time-aware half has no data (see the data stage)")
            return None
        progress.start(name)
        try:
            value = fn()
        except StageSkipped as e:
            skipped[name] = str(e)
            progress.skip(name, str(e))
            return None
        except DataError as e:
            _name_the_model(e, run.models_dir)
            raise
        progress.end()
        return value

    def keep(models: Optional[Mapping[str, TrainedModel]]) -> Dict[str, Any]:
        """Files the models a stage trained under results["models"]; returns their parameters by name."""
        for name, model in (models or {}).items():
            results["models"][name] = model.record
            model_times[name] = model.seconds
        return {name: model.params for name, model in (models or {}).items()}

    def add(output: Optional[StageOutput]) -> None:
        if output is not None:
            results.update(output.results)
            skipped.update(output.skipped)
            keep(output.models)

    def data_stage() -> TaskData:
        check_stream_splits(data)
        task_data = run.prepare_data()
        results["world"] = task_data.summary
        task_data.check()
        return task_data

    # SIGTERM while a model trains: its loop saves and raises Preempted. Between trainings (evaluation, data): the
    # signal is noted and the run stops before the next stage. Either way nothing is written and a rerun resumes.
    try:
        with watch_sigterm():
            task_data = stage("data", data_stage)
            if preset.pretrain_steps:
                keep(stage("pretrain", lambda: pretrain(run, task_data)))
            params = keep(stage("train uniform and temporal", lambda: train_main(run, task_data)))
            params.update(keep(stage("train yearly experts", lambda: train_yearly(run, task_data))))
            evaluation = stage("evaluate", lambda: evaluate(run, task_data, params))
            if evaluation is not None:
                results.update(evaluation.results)
            add(stage("future probes", lambda: future_probes(run, task_data, params, evaluation.test_queries)))
            add(stage("adaptation", lambda: adapt(run, task_data, evaluation)))
            for extra_stage in extra:
                value = stage(f"extra: {extra_stage.name}",
                              lambda: run_extra_stage(run, extra_stage, task_data, results))
                if value is None:
                    continue
                if "timings_sec" in value:
                    extra_times[extra_stage.name] = value.pop("timings_sec")
                if extra_stage.half is not None:
                    found.update(value.pop("findings", None) or {})
                results.setdefault("extra", {})[extra_stage.name] = value
            if sigterm_received():
                raise Preempted(f"after the last stage (the models are saved in {out_dir})")
    finally:
        _restore_tasks(previous_data_dir, settings)
    results["timing"] = {"stages": [[n, t] for n, t in progress.times.items()],
                         "models": [[n, t] for n, t in model_times.items()], "extra": extra_times,
                         "total_s": time.time() - t0, "machine": _machine(), "software": _software()}
    if skipped:
        results["skipped"] = dict(skipped)
    results = jsonable(results)
    results["findings"] = judge(results, TIME_AWARE)
    for extra_stage in extra:  # a half whose stage the data could not support: its findings say why
        if extra_stage.half is not None and f"extra: {extra_stage.name}" in skipped:
            found.update(judge({}, extra_stage.half, skipped=skipped))
    results["findings"].update(found)
    partitioning.barrier("reproduce: done")  # every process has finished its part before process 0 writes
    if partitioning.is_lead() and write_results:
        write_json(paths.join(out_dir, "results.json"), results, sort_keys=True)
    return results


# --------------------------------------------------------------------------------------------------------------------
# Several seeds.

# Keys of a run's results that hold per-item numbers (queries, documents), not summary numbers to average over seeds.
PER_ITEM_KEYS = frozenset({"per_query", "items", "documents"})


def seed_dir(out_dir: str, seed: int) -> str:
    return paths.join(out_dir, f"seed_{seed}")


def reproduce_seeds(preset: Union[str, Preset], out_dir: str, seeds: Sequence[int],
                    extra_stages: Optional[Sequence[ExtraStage]] = None, overwrite: bool = False,
                    data: StudyData = EMBEDDED, stream_preset: Optional[StreamPreset] = None,
                    settings: Optional[Settings] = None, only: Optional[Sequence[str]] = None,
                    skip: Sequence[str] = (), write_results: bool = True) -> Dict[str, Any]:
    """The whole study once per seed, each into out_dir/seed_<S> (its own results.json, resumable as one run), then
    the seeds combined into out_dir/results.json (`combine_seeds`): every finding tested over the per-seed effects,
    every summary number as its mean and 95 % interval over the seeds, and every seed's results whole (`only`,
    `skip`: as `reproduce`'s). The seeds run
    one after another in this process, so each compiled function is compiled once."""
    seeds = [int(s) for s in seeds]
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must be distinct and at least one, got {seeds}")
    stage_selection(only, skip)  # a misspelt choice before any work
    with reproduction_folder(out_dir, overwrite) as out_dir:
        t0 = time.time()
        per_seed = {}
        for i, seed in enumerate(seeds):
            console.say(f"reproduce: seed {seed} ({i + 1} of {len(seeds)}) into {seed_dir(out_dir, seed)}")
            per_seed[str(seed)] = reproduce(preset, seed_dir(out_dir, seed), seed, extra_stages, overwrite, data,
                                            stream_preset, settings, only, skip, write_results)
        results = combine_seeds(per_seed)
        results["timing"] = {"total_s": time.time() - t0, "machine": _machine(), "software": _software(),
                             "per_seed_s": {s: r["timing"]["total_s"] for s, r in per_seed.items()}}
        if partitioning.is_lead() and write_results:
            write_json(paths.join(out_dir, "results.json"), results, sort_keys=True)
    return results


def combine_seeds(per_seed: Mapping[str, Mapping[str, Any]]) -> Dict[str, Any]:
    """{"preset", "seeds", "findings", "aggregate", "per_seed"} from the results of each seed ({seed: results}, in
    run order): the findings of both halves combined over the seeds (templm.metrics.findings.combine_findings, the
    same {name: finding} shape as one seed's) and `aggregate_numbers` of the summary numbers."""
    seeds = list(per_seed)
    runs = [per_seed[s] for s in seeds]
    return {"preset": runs[0].get("preset"), "seeds": [int(s) for s in seeds],
            "findings": combine_findings([r["findings"] for r in runs]),
            "aggregate": aggregate_numbers(runs, skip=PER_ITEM_KEYS | {"timing", "findings", "config"}),
            "per_seed": dict(per_seed)}


def aggregate_numbers(trees: Sequence[Any], skip: frozenset = frozenset()) -> Any:
    """The numbers of several results dicts of the same shape, each leaf that is a number in every one replaced by
    {"mean", "low", "high", "n"} (the t-interval of the mean over the dicts; low and high None for one dict or equal
    values). Keys in `skip`, lists and other leaves are left out. None where nothing is left."""
    if all(isinstance(t, Mapping) for t in trees):
        out = {}
        for key in trees[0]:
            if key in skip or not all(key in t for t in trees):
                continue
            value = aggregate_numbers([t[key] for t in trees], skip)
            if value is not None:
                out[key] = value
        return out or None
    if all(isinstance(t, (int, float)) and not isinstance(t, bool) for t in trees):
        values = [float(t) for t in trees]
        if len(set(values)) == 1:
            return {"mean": values[0], "low": None, "high": None, "n": len(values)}
        mean, low, high = mean_interval(values)
        return {"mean": mean, "low": low, "high": high, "n": len(values)}
    return None


def _restore_tasks(data_dir: Optional[str], settings: Settings) -> None:
    """Registers the tasks over the folder they were over before the run (the default world's when it had none)."""
    try:
        has_manifest = bool(data_dir) and read_manifest(data_dir) is not None
    except ValueError:
        has_manifest = False
    tasks.configure(data_dir=data_dir if has_manifest else None, settings=settings)


def _machine() -> str:
    """The machine a run's numbers came from: its processor too, since the same seed trains to other numbers on
    another (docs/results.md)."""
    devices = jax.devices()
    return (f"{platform.machine()} {os.cpu_count()} CPU cores ({cpu_model()}), {len(devices)} {devices[0].platform} "
            "device(s)")


# The installed packages whose versions shape a run's numbers, recorded beside the machine: the same commit and seed
# give other numbers under another version (sentencepiece 0.2.3 and 0.2.2 train other vocabularies from the same
# text: docs/results.md).
SOFTWARE = ("jax", "jaxlib", "flax", "optax", "numpy", "sentencepiece", "tensorflow", "tensorflow-text", "seqio")


def _software() -> Dict[str, Optional[str]]:
    """{package: its installed version, None where it is not installed}."""
    versions: Dict[str, Optional[str]] = {}
    for name in SOFTWARE:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def _enable_compilation_cache(cache_dir: str) -> None:
    """Reuse compilations across the many trainings and evaluations of one architecture (a persistent JAX cache in
    $JAX_COMPILATION_CACHE_DIR, or `cache_dir`/jax: $TEMPLM_CACHE/jax, default ~/.cache/templm/jax), unless one is
    already set."""
    if jax.config.jax_compilation_cache_dir:
        return
    jax.config.update("jax_compilation_cache_dir", os.path.join(cache_dir, "jax"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
