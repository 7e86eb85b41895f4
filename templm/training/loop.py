"""The one training loop. Both trainers (T5 in trainer.py, the Transformer-XL in lm_trainer.py) build their state, a
compiled step and a way to get the batch of any data position, and hand them to `run`.

Each step takes the batch of its data position and applies the step; then

* every `log_period` steps (and at a save, at the last step, on a signal): the metrics are fetched and checked
  (a non-finite loss or parameter norm raises TrainingError naming the last good checkpoint, before anything is
  saved), written to TensorBoard and `metrics.jsonl` with the rate, and shown as a progress line;
* every `save_period` steps and at the last step: a checkpoint of the state with the data position, the run's
  record (`meta`), the last train metrics (so a resumed run that has nothing left to do still reports them) and the
  input pipelines' states where the caller has them. Saves are asynchronous (checkpoints.py): training goes on while
  the files are written; the last step's save and a SIGTERM's save are waited for;
* every `eval_period` steps and at the last step: the caller's `evaluate(step, state)`;
* on SIGTERM (the usual preemption notice): a checkpoint at the current step, on disk, then `Preempted` is raised.
  Callers let it propagate, so nothing is evaluated or reported from the unfinished run and the command exits with
  templm.errors.EXIT_PREEMPTED; the same command run again resumes from that checkpoint.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import json
import re
import threading
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import jax
import numpy as np
from clu import metric_writers

from templm import console, paths, remote
from templm.errors import DataError, Preempted, TrainingError, sigterm_received, watch_sigterm
from templm.io import atomic_write
from templm.outputs import lock_inside
from templm.training.checkpoints import Checkpointer, abstract_like, fit_problems, leaf_shapes

CONFIG_GIN = "config.gin"  # the run's operative gin config in MODEL_DIR, as T5X names it


# TensorBoard tags of the progress timings, as T5X names them; the ETA goes to metrics.jsonl only.
_TIMING_TAGS = {"steps_per_sec": "timing/steps_per_second", "tokens_per_sec": "timing/tokens_per_second"}
_BY_YEAR = re.compile(r"_\d{4}$")  # a per-year metric: f1_2014, count_2014


def summary_tags(split: str, scalars: Mapping[str, float]) -> Tuple[str, Dict[str, float]]:
    """(summary folder, {tag: value}) of a `MetricsLog.write`, laid out as T5X lays out its run folders: "train"
    goes to MODEL_DIR/train with T5X's tag names (`loss`, `cross_ent_loss`, `z_loss`, `accuracy`, `learning_rate`,
    `timing/steps_per_second`, ...); an evaluation "SPLIT/TASK" to MODEL_DIR/SPLIT_eval as "TASK/METRIC", its per-year
    metrics (`f1_2014`, `count_2014`, ...) apart as "TASK_by_year/METRIC", so that TensorBoard's groups stay short."""
    if "/" not in split:  # "train"
        tags = {}
        for name, value in scalars.items():
            if name == "eta_sec":
                continue
            tags[_TIMING_TAGS.get(name, name)] = value
        return split, tags
    head, task = split.split("/", 1)
    tags = {}
    for name, value in scalars.items():
        group = f"{task}_by_year" if _BY_YEAR.search(name) else task
        tags[f"{group}/{name}"] = value
    return f"{head}_eval", tags


class MetricsLog:
    """TensorBoard summaries through clu's writers, one folder per split (`summary_tags`), plus `metrics.jsonl` (one
    row per write, the scalars as given), written by process 0 only.

    In a bucket, where an object cannot be appended to, metrics.jsonl is put whole again (its earlier rows and the
    new ones) at most once every `put_period` seconds, at `flush` (each checkpoint save) and at `close`."""

    def __init__(self, model_dir: str, put_period: float = 30.0):
        self.enabled = jax.process_index() == 0
        self.model_dir = model_dir
        self.path = paths.join(model_dir, "metrics.jsonl")
        self.writers: Dict[str, Any] = {}
        self._remote = paths.is_url(model_dir)
        self._rows: list = []  # in a bucket: the rows not yet put
        self._put: Optional[str] = None  # in a bucket: the object's text as last put
        self._put_period = put_period
        self._last_put = 0.0

    def _writer(self, folder: str):
        if folder not in self.writers:
            self.writers[folder] = metric_writers.create_default_writer(
                paths.join(self.model_dir, folder), just_logging=not self.enabled, asynchronous=False)
        return self.writers[folder]

    def write(self, step: int, split: str, scalars: Mapping[str, float]) -> None:
        scalars = {k: float(v) for k, v in scalars.items()}
        folder, tags = summary_tags(split, scalars)
        self._writer(folder).write_scalars(step, tags)
        if not self.enabled:
            return
        row = json.dumps({"step": step, "split": split, **scalars}) + "\n"
        if not self._remote:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(row)
            return
        self._rows.append(row)
        if time.monotonic() - self._last_put >= self._put_period:
            self.flush()

    def has_evaluation(self, step: int) -> bool:
        """Whether metrics.jsonl holds an evaluation's row ("SPLIT/TASK") at `step`: a run stopped during its last
        evaluation has none, and its rerun evaluates again."""
        if self._rows and any(json.loads(row)["step"] == step and "/" in json.loads(row)["split"]
                              for row in self._rows):
            return True
        if not paths.exists(self.path):
            return False
        with paths.open(self.path, encoding="utf-8") as f:
            for line in f:
                try:
                    row = json.loads(line)
                except ValueError:  # a line cut by a kill: not an evaluation's
                    continue
                if row.get("step") == step and "/" in str(row.get("split", "")):
                    return True
        return False

    def flush(self) -> None:
        """In a bucket: puts metrics.jsonl with the rows written since the last put."""
        if not (self._remote and self.enabled and self._rows):
            return
        if self._put is None:  # the object a resumed run found (read once; later puts extend what this one put)
            self._put = ""
            if paths.exists(self.path):
                with paths.open(self.path) as f:
                    self._put = f.read()
        self._put += "".join(self._rows)
        atomic_write(self.path, self._put)
        self._rows = []
        self._last_put = time.monotonic()

    def close(self) -> None:
        self.flush()
        for writer in self.writers.values():
            writer.flush()
            writer.close()


def model_dir_lock(model_dir: str) -> contextlib.AbstractContextManager:
    """One run at a time per MODEL_DIR: process 0 holds MODEL_DIR/.templm.lock while it trains (a second run on the
    same folder is refused with the first one's pid and host; the system releases the lock of a killed run)."""
    if jax.process_index() != 0:
        return contextlib.nullcontext()
    return lock_inside(model_dir, f"MODEL_DIR {model_dir}")


class RunFolder:
    """What every trainer sets up around `run`, as one object: MODEL_DIR made and held (one run at a time,
    `model_dir_lock`), the checkpointer (MODEL_DIR/checkpoints) and the metrics log opened; all closed again, in
    reverse, on leaving the `with` block, however it is left. `resume` checks that the latest checkpoint was written
    by a run of the same settings, restores it and then writes the operative gin config to MODEL_DIR/config.gin (by
    process 0, where given)."""

    def __init__(self, model_dir: str, save_period: int, keep_checkpoints: Optional[int],
                 async_checkpoints: bool = True, config_gin: Optional[str] = None):
        self.model_dir = paths.absolute(model_dir) if paths.is_url(model_dir) else model_dir
        self._args = (save_period, keep_checkpoints, async_checkpoints)
        self._config_gin = config_gin
        self._held = contextlib.ExitStack()
        self.checkpointer: Optional[Checkpointer] = None
        self.log: Optional[MetricsLog] = None

    def __enter__(self) -> "RunFolder":
        if jax.process_index() == 0:
            remote.check_location(self.model_dir, "MODEL_DIR")
        paths.makedirs(self.model_dir)
        with contextlib.ExitStack() as held:
            held.enter_context(model_dir_lock(self.model_dir))
            self.checkpointer = Checkpointer(paths.join(self.model_dir, "checkpoints"), *self._args)
            held.callback(self.checkpointer.close)
            self.log = MetricsLog(self.model_dir)
            held.callback(self.log.close)
            self._held = held.pop_all()
        return self

    def __exit__(self, *exc_info) -> None:
        self._held.close()

    def resume(self, state: Any, meta: Mapping[str, Any], keys: Tuple[str, ...] = (),
               bindings: Optional[Mapping[str, str]] = None
               ) -> Tuple[Any, int, Optional[Dict[str, float]], Dict[str, Any]]:
        """(state, start step, the last logged train metrics, the checkpoint's record) from the latest checkpoint,
        or (state, 0, None, {}) when there is none; then the run's config.gin is written (T5X's operative config).

        Before anything is restored or written, the run is checked against the checkpoint (the one resume contract
        of every trainer): each of `keys` (what shapes the run's state or its data) must be the same in the
        checkpoint's record as in `meta` (a key the record lacks, written before templm recorded it, is not
        checked), and the saved arrays must have the names and shapes of `state`'s. Otherwise one DataError names
        each difference with its old and new value and the gin binding that sets it (`bindings`: key -> binding),
        and MODEL_DIR is left as it was: nothing trained, config.gin not overwritten."""
        latest = self.checkpointer.latest_step()
        if latest is not None:
            self._check_resumable(latest, state, meta, keys, bindings or {})
        if self._config_gin and jax.process_index() == 0:
            atomic_write(paths.join(self.model_dir, CONFIG_GIN), self._config_gin)
        if latest is None:
            return state, 0, None, {}
        state, saved = self.checkpointer.restore(abstract_like(state))
        return state, int(saved["data_position"]), saved.get("train"), saved

    def _check_resumable(self, step: int, state: Any, meta: Mapping[str, Any], keys: Tuple[str, ...],
                         bindings: Mapping[str, str]) -> None:
        record = self.checkpointer.record(step) or {}
        own = paths.join(self.model_dir, CONFIG_GIN)
        advice = ("nothing was trained or overwritten; resume the run with its own settings"
                  + (f" (--gin_file={own})" if paths.exists(own) else "") + " or train into another MODEL_DIR")
        differ = []
        for key in keys:
            old, new = record.get(key), as_record(meta.get(key))
            if key in record and old != new:
                where = f" ({bindings[key]})" if key in bindings else ""
                if isinstance(old, dict) and isinstance(new, dict):  # a config: the fields that differ
                    fields = _differing(old, new)
                    old = {name: old.get(name) for name in fields}
                    new = {name: new.get(name) for name in fields}
                differ.append(f"{key} {_shown(old)} there, {_shown(new)} in this run{where}")
        if differ:
            raise DataError(f"MODEL_DIR holds a run trained with other settings: {'; '.join(differ)}: {advice}",
                            self.checkpointer.directory)
        saved = self.checkpointer.saved_shapes(step)
        problems = fit_problems(saved, leaf_shapes(state)) if saved is not None else []
        if problems:
            what = "model" if any(p.startswith("params/") for p in problems) else "optimizer"
            sizes = _config_difference(record.get("model_config"), as_record(meta.get("model_config")))
            if what == "optimizer" and record.get("optimizer") and meta.get("optimizer"):
                sizes = f" (the checkpoint's optimizer: {record['optimizer']}, this run's: {meta['optimizer']})"
            raise DataError(f"checkpoint {step} does not fit this run's {what}{sizes}: {len(problems)} array(s) "
                            f"differ, e.g. {'; '.join(problems[:3])}: {advice}", self.checkpointer.directory)


def as_record(value: Any) -> Any:
    """`value` as it reads back from a checkpoint's JSON record (tuples as lists, objects JSON does not hold as
    their str)."""
    return json.loads(json.dumps(value, default=str))


def _shown(value: Any) -> str:
    text = repr(value) if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= 120 else text[:117] + "..."


def _differing(a: Mapping[str, Any], b: Mapping[str, Any]) -> List[str]:
    """The keys whose values differ between two records (sorted)."""
    return [name for name in sorted(set(a) | set(b)) if a.get(name) != b.get(name)]


def _config_difference(saved: Any, wanted: Any) -> str:
    """" (the checkpoint's mlp_dim 128, this run's 256)" for two recorded model configs, or "" where either is
    missing or none of their fields differ."""
    if not isinstance(saved, dict) or not isinstance(wanted, dict):
        return ""
    fields = _differing(saved, wanted)
    if not fields:
        return ""
    return (" (the checkpoint's " + ", ".join(f"{name} {_shown(saved.get(name))}" for name in fields)
            + "; this run's " + ", ".join(f"{name} {_shown(wanted.get(name))}" for name in fields) + ")")


def check_finite(metrics: Mapping[str, Any], step: int, checkpointer: Checkpointer) -> None:
    """Raises TrainingError when the loss or the parameter norm is not finite, naming the last good checkpoint.
    Called before every save, so no checkpoint ever holds non-finite parameters."""
    if not (np.isfinite(metrics["loss"]) and np.isfinite(metrics["param_norm"])):
        good = checkpointer.latest_step()
        raise TrainingError(f"loss {metrics['loss']}, parameter norm {metrics['param_norm']} at step {step}: "
                            f"stopping; the last good checkpoint is step {good} in {checkpointer.directory}")


@dataclasses.dataclass(frozen=True)
class Hooks:
    """What a trainer adds to the loop.

    evaluate(step, state), every `eval_period` steps (0: never) and at the last step. extra_scalars(step) -> more
    scalars logged beside the step's metrics (e.g. the epoch). input_state() -> this process's input pipeline states
    (or None when they cannot be saved), saved with each checkpoint (where the data position alone cannot restore the
    input in constant time), the last step's only with `final_input_state` (a run of fixed length that will not be
    extended can leave it out: it is as large as the pipelines' shuffle buffers). `progress`: True a line at every
    log step, a number of seconds at most once in that many (console.Ticker; the command line's --progress=bar draws
    a bar, none prints nothing), False never; the lines are named `name` and show the metrics and extra scalars
    `shown`. stop() -> True stops the run after its step as SIGTERM does (a checkpoint, then Preempted): a training
    in a thread, whose process is stopping for another reason (templm.experiments.reproduce)."""

    evaluate: Optional[Callable[[int, Any], None]] = None
    eval_period: int = 0
    extra_scalars: Optional[Callable[[int], Dict[str, float]]] = None
    input_state: Optional[Callable[[], Optional[Mapping[str, bytes]]]] = None
    final_input_state: bool = True
    progress: Union[bool, float] = True
    name: str = "train"
    shown: Tuple[str, ...] = ("loss",)
    stop: Optional[Callable[[], bool]] = None


@dataclasses.dataclass(frozen=True)
class RunContext:
    """Where and how long a run goes: its checkpointer and metrics log (a RunFolder's), its record `meta` (saved with
    every checkpoint), the step's rng, steps start_step+1 .. train_steps with metrics every `log_period` steps
    (`tokens_per_step` for the rate), and the trainer's hooks."""

    checkpointer: Checkpointer
    log: MetricsLog
    meta: Mapping[str, Any]
    rng: jax.Array
    start_step: int
    train_steps: int
    log_period: int
    tokens_per_step: int = 0
    hooks: Hooks = Hooks()


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """What the caller of a trainer hands it besides the run's config: the ("data", "model") device mesh (None:
    `partitioning.make_mesh()`, bindable in gin), progress lines (True, a number of seconds between lines, or False:
    see Hooks), the gin config that made the run (`gin.config_str()`, written to MODEL_DIR/config.gin as T5X does),
    and the T5 trainer's evaluator (evaluation sits above training: `templm train` passes
    templm.evaluation.checkpoint_eval.evaluate_params); `stop`: Hooks.stop."""

    mesh: Any = None
    progress: Union[bool, float] = True
    config_gin: Optional[str] = None
    evaluator: Optional[Callable[..., Dict[str, Dict[str, float]]]] = None
    stop: Optional[Callable[[], bool]] = None


@dataclasses.dataclass
class TrainResult:
    """What every trainer returns: the steps it started from and ended at, the parameters, the last logged train
    metrics (a resumed run with nothing left to do reports its checkpoint's), the last evaluation (the T5 trainer
    with eval_period: {task: {metric: value}}), the data's statistics and the final memories (Transformer-XL)."""

    start_step: int
    step: int
    params: Any
    train: Optional[Dict[str, float]] = None
    eval: Optional[Dict[str, Dict[str, float]]] = None
    data: Optional[Dict[str, Any]] = None
    mems: Any = None

    def summary(self) -> Dict[str, Any]:
        """What the command line prints of it: the steps, the metrics and the data's statistics (no arrays)."""
        return {name: value for name, value in (("start_step", self.start_step), ("step", self.step),
                                                ("train", self.train), ("eval", self.eval), ("data", self.data))
                if value is not None}


class StepCache:
    """Compiled update steps by what they compile: a key made of the model's and optimizer's settings, the mesh and
    the rules (and, for an optimizer object the caller built, that object, held so that its id stays its own), so
    that every run of the same step in a process (the models of a reproduction, the tests of a session) compiles it
    once. The `size` most recently used are kept: a compiled step holds on to its executables."""

    def __init__(self, size: int = 4):
        self.size = size
        self._entries: "collections.OrderedDict[Any, Tuple[Any, Callable]]" = collections.OrderedDict()
        self._lock = threading.Lock()  # trainings in threads (Hooks.stop) share one step

    def get(self, key: Any, build: Callable[[], Callable], held: Any = None) -> Callable:
        """The step cached under `key`, or build() cached there (None: never cached)."""
        if key is None:
            return build()
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return self._entries[key][1]
            step = build()
            self._entries[key] = (held, step)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)
            return step


STEPS = StepCache()


def finish(start_step: int, total_steps: int, state: Any, logged: Optional[Dict[str, float]],
           last: Optional[Dict[str, float]], **fields: Any) -> TrainResult:
    """The TrainResult of a run that went from start_step to total_steps (or was already past it)."""
    return TrainResult(start_step=start_step, step=max(total_steps, start_step), params=state["params"],
                       train=logged if logged is not None else last, **fields)


def evaluate_or_stop(evaluate: Callable[[int, Any], None], step: int, state: Any, directory: str,
                     last: bool = True) -> None:
    """evaluate(step, state) inside a training run (under watch_sigterm): SIGTERM stops it at its next batch (the
    evaluator raises Preempted) or, for the last evaluation, once it returns; either way Preempted names the step and
    its saved checkpoint, and no result of the unfinished evaluation is reported. A rerun of the finished run
    evaluates its last step again (the trainer asks MetricsLog.has_evaluation)."""
    try:
        evaluate(step, state)
    except Preempted:
        raise Preempted(f"at step {step}, during its evaluation (checkpoint saved in {directory})", step) from None
    if last and sigterm_received():
        raise Preempted(f"at step {step}, during its evaluation (checkpoint saved in {directory})", step)


def run(step_fn: Callable, state: Any, batch_at: Callable[[int], Mapping[str, jax.Array]],
        context: RunContext) -> Tuple[Any, Optional[Dict[str, float]]]:
    """Runs steps start_step+1 .. train_steps (module docstring); returns (state, the last logged train metrics).

    batch_at(position) -> the global batch of a data position (position = the number of steps done before it).
    The caller closes the context's log and checkpointer (a RunFolder does).
    """
    c, hooks = context, context.hooks
    rate = console.Rate(c.train_steps, c.tokens_per_step, c.start_step)
    period = 0.0 if hooks.progress is True else float(hooks.progress)
    ticker = console.Ticker(hooks.name, c.train_steps, "steps", c.start_step, period) if hooks.progress else None
    last_metrics: Optional[Dict[str, float]] = None
    step = c.start_step
    try:
        with watch_sigterm():
            while step < c.train_steps:
                state, metrics = step_fn(state, batch_at(step), c.rng)
                step += 1
                last = step == c.train_steps
                # read once: a signal arriving later is seen after the next step
                stopping = sigterm_received() or (hooks.stop is not None and hooks.stop())
                save = c.checkpointer.should_save(step) or last or stopping
                if step % c.log_period == 0 or save:
                    metrics = jax.device_get(metrics)
                    check_finite(metrics, step, c.checkpointer)
                    timing = rate.report(step)
                    extra = hooks.extra_scalars(step) if hooks.extra_scalars else {}
                    c.log.write(step, "train", {**metrics, **timing, **extra})
                    last_metrics = {k: float(v) for k, v in metrics.items()}
                    if ticker is not None:
                        values = {**last_metrics, **extra}
                        ticker.update(step, lambda: console.step_line(hooks.name, step, c.train_steps, timing,
                                                                      **{k: values.get(k) for k in hooks.shown}))
                if save:
                    keep_inputs = hooks.input_state and (hooks.final_input_state or stopping or not last)
                    c.checkpointer.save(step, state, {**c.meta, "step": step, "data_position": step,
                                                      "train": last_metrics},
                                        inputs=hooks.input_state() if keep_inputs else None, wait=last or stopping)
                    c.log.flush()
                if stopping:
                    raise Preempted(f"at step {step} (checkpoint saved in {c.checkpointer.directory})", step)
                if hooks.evaluate is not None and hooks.eval_period and (step % hooks.eval_period == 0 or last):
                    evaluate_or_stop(hooks.evaluate, step, state, c.checkpointer.directory, last)
            if sigterm_received():  # during the last step's save: the run is complete and on disk, the command stops
                raise Preempted(f"after its last step {step} (checkpoint saved in {c.checkpointer.directory})", step)
    finally:
        if ticker is not None:
            ticker.close()
    return state, last_metrics


def at_once(jobs: Sequence[Tuple[str, Callable[[Optional[Callable[[], bool]]], Any]]], limit: int) -> Dict[str, Any]:
    """{name: job(stop)} of each (name, job), in the jobs' order, `limit` of them at a time, each in a thread of this
    process (one at a time, `stop` None, in a run of several processes, whose steps and saves must come in one order).
    A job trains with RunOptions.stop=stop and may evaluate what it trained; a model's parameters do not depend on
    what trains beside it. When one job fails, or Ctrl-C or SIGTERM arrives, the others stop after their step with a
    checkpoint (as SIGTERM stops a training), the ones not started do not start, and the first failure is raised: a
    rerun resumes each model."""
    limit = min(limit, len(jobs))
    if limit <= 1 or jax.process_count() > 1:
        return {name: job(None) for name, job in jobs}
    stopping = threading.Event()

    def one(job):
        if stopping.is_set():  # a job before it failed, or the command is stopping: never started
            return None
        try:
            return job(stopping.is_set)
        except BaseException:
            stopping.set()
            raise

    with concurrent.futures.ThreadPoolExecutor(limit, thread_name_prefix="templm-train") as pool:
        futures = [pool.submit(one, job) for _, job in jobs]
        try:
            concurrent.futures.wait(futures, return_when=concurrent.futures.FIRST_EXCEPTION)
            failed = next((f for f in futures if f.done() and not f.cancelled() and f.exception()), None)
            if failed is not None:
                raise failed.exception()
            return {name: future.result() for (name, _), future in zip(jobs, futures)}
        except BaseException:
            stopping.set()
            for future in futures:
                future.cancel()
            raise
