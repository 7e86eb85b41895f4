"""Checkpoints with orbax: the train state (sharded arrays) and a JSON record of the data position and seeds.

Orbax writes each step into a temporary folder and renames it when complete, so a run killed mid-save leaves the
previous step as the latest: a half-written checkpoint is never the one restored.

Bytes changed after the save (a disk error, a partial copy, a file overwritten or deleted) are caught by a digest:
every save writes `integrity/<step>.json` beside the steps, the SHA-256 of each file of the step, and every restore
checks the step against it first. A damaged step is named with its first bad file; restoring "the latest" then falls
back to the newest intact step (with a warning), restoring a given step stops with a DataError. A training run that
falls back sets the damaged steps aside (`damaged/<step>`, with their digest records, named in a warning) so that the
steps it trains again are saved in their place; evaluation only reads, and says which step it used. With asynchronous
saves a step's digests are written once its write has finished (at the next save, or when the run waits for it or
closes); a step killed in between has none and is taken as it is, as a step saved before templm wrote digests.

Saves are asynchronous by default (orbax's AsyncCheckpointer): `save` returns once the arrays are copied off the
devices and the files are written by background threads while training goes on; a save starts only after the
previous one has finished, and `save(..., wait=True)` (the last step, SIGTERM) and `close` block until everything is
on disk. Beside the state and its JSON record, a step can hold the input pipelines' states (`input`, one record per
data shard, templm/training/input_pipeline.py), written by every process for its own shards.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import threading
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import jax
import orbax.checkpoint as ocp
from absl import logging
from etils import epath

from templm import console, remote
from templm.errors import DataError, as_os_error
from templm.training import partitioning

INTEGRITY = "integrity"
INPUT = "input"  # the item holding the input pipelines' states
DAMAGED = "damaged"  # where a training run sets aside the damaged steps it fell back from


def _as_os_error(error: Exception, step: int, directory: str) -> Exception:
    """A failed save as the OSError it is (tensorstore reports a full disk as text with the errno in it), so the
    command names the folder and exits with the file system's status; other errors as they are."""
    return as_os_error(error, directory, f"saving checkpoint {step}") or error


def _path(directory: str) -> epath.Path:
    """The checkpoint folder as an absolute path (local) or as it is (gs://, other file systems)."""
    path = epath.Path(directory)
    return path if "://" in str(directory) else path.absolute()


class InputStateHandler(ocp.CheckpointHandler):
    """The input pipelines' states of a step: one `<shard>.state` file of bytes per data shard; each process writes
    and reads only its own shards."""

    def save(self, directory: epath.Path, args: "InputStateSave") -> None:
        for name, data in args.states.items():
            (directory / f"{name}.state").write_bytes(data)

    def restore(self, directory: epath.Path, args: "InputStateRestore" = None) -> Dict[str, bytes]:
        return {name: (directory / f"{name}.state").read_bytes() for name in args.names
                if (directory / f"{name}.state").exists()}

    def metadata(self, directory: epath.Path) -> None:
        return None


@ocp.args.register_with_handler(InputStateHandler, for_save=True)
@dataclasses.dataclass
class InputStateSave(ocp.args.CheckpointArgs):
    states: Mapping[str, bytes]


@ocp.args.register_with_handler(InputStateHandler, for_restore=True)
@dataclasses.dataclass
class InputStateRestore(ocp.args.CheckpointArgs):
    names: Tuple[str, ...]


def _digest(path: epath.Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _files(step_dir: epath.Path) -> Dict[str, epath.Path]:
    """Every file under `step_dir`, by its path relative to it."""
    found, folders = {}, [step_dir]
    while folders:
        for entry in sorted(folders.pop().iterdir()):
            if entry.is_dir():
                folders.append(entry)
            else:
                found[str(entry.relative_to(step_dir))] = entry
    return found


def write_digests(directory: epath.Path, step: int) -> None:
    """Records the SHA-256 of every file of `step` in directory/integrity/<step>.json (written whole or not at all)."""
    digests = {name: _digest(p) for name, p in _files(directory / str(step)).items()}
    folder = directory / INTEGRITY
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{step}.json.tmp"
    tmp.write_text(json.dumps({"step": step, "sha256": digests}, indent=1, sort_keys=True))
    tmp.rename(folder / f"{step}.json")


def damage(directory: epath.Path, step: int) -> Optional[str]:
    """None where `step` matches its digests; otherwise what is wrong, naming the first bad file. A step saved before
    templm wrote digests has none: it is taken as it is."""
    record = directory / INTEGRITY / f"{step}.json"
    if not record.exists():
        return None
    try:
        expected = json.loads(record.read_text())["sha256"]
    except (ValueError, KeyError) as e:
        return f"its digest record {record} is unreadable ({e})"
    step_dir = directory / str(step)
    found = _files(step_dir)
    for name, digest in sorted(expected.items()):
        if name not in found:
            return f"{step_dir / name} is missing"
        if _digest(found[name]) != digest:
            return f"{step_dir / name} does not match the digest written when it was saved"
    extra = sorted(set(found) - set(expected))
    if extra:
        return f"{step_dir / extra[0]} was not part of the checkpoint when it was saved"
    return None


def _restore_intact(directory: epath.Path, steps: List[int], step: Optional[int],
                    restore: Callable[[int], Any]) -> Any:
    """restore(s) for the requested step, or for the newest intact one of `steps` (newest first) when `step` is None;
    damaged steps are named and skipped (a requested one is an error)."""
    if step is not None:
        if step not in steps:
            there = ", ".join(str(s) for s in sorted(steps)) or "none"
            raise DataError(f"no checkpoint at step {step}: the steps here are {there}", str(directory))
        steps = [step]
    if not steps:
        raise DataError("no checkpoint to restore", str(directory))
    problems = []
    for s in steps:
        problem = damage(directory, s)
        if problem is None:
            try:
                return s, restore(s)
            except Exception as e:  # noqa: BLE001  (orbax and tensorstore raise many kinds for unreadable bytes)
                problem = f"it cannot be read: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        problems.append(f"checkpoint {s}: {problem}")
        if step is not None:
            break
        console.warn(f"checkpoint {s} in {directory} is damaged ({problem}); trying the one before it")
    raise DataError("no intact checkpoint to restore: " + "; ".join(problems), str(directory))


# Two of orbax's saves at once in one process fail (one's files vanish or its folder is found not empty), so the
# checkpointers of trainings in threads (templm.experiments.reproduce.train_models) take turns: a manager is made and
# closed holding this, and a save holds it from its start until it is on disk.
_ORBAX_WRITES = threading.Lock()


class Checkpointer:
    """Saves every `save_period` steps (and on demand), keeps the last `keep`, restores the latest intact one."""

    def __init__(self, directory: str, save_period: int = 1000, keep: Optional[int] = 3, async_save: bool = True):
        self.path = _path(directory)
        self.directory = str(self.path)
        self.save_period = save_period
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=async_save, create=True,
                                               cleanup_tmp_directories=True)
        with _ORBAX_WRITES:
            self.manager = ocp.CheckpointManager(self.directory, options=options,
                                                 item_names=("state", "meta", INPUT))
        self._writing = False  # this checkpointer's save holds _ORBAX_WRITES
        self.failed = False
        self._quiet = None
        self._unrecorded: Optional[int] = None  # a step whose write may still run; its digests are not yet written
        self._recorder: Optional[threading.Thread] = None  # writes the digests of a finished step
        self._record_error: Optional[BaseException] = None

    def latest_step(self) -> Optional[int]:
        return self.manager.latest_step()

    def should_save(self, step: int) -> bool:
        return self.save_period > 0 and step % self.save_period == 0

    def _silenced(self):
        # With library logs off, orbax runs with standard error silenced: a failing write makes its threads print a
        # traceback each, until the process ends, so after a failed save it stays silenced (`templm` prints its error
        # line through its own copy of standard error); the error raised here says it once.
        # (After a failed save, closing the manager makes each pending write print a traceback of its event loop.)
        return console.silenced_unless_verbose()

    def _orbax(self, call: Callable[[], Any], step: int) -> None:
        """Runs a save or a wait of orbax's, raising its failure (as an OSError where it is one)."""
        quiet = self._silenced()
        quiet.__enter__()
        try:
            call()
        except Exception as e:  # noqa: BLE001  (re-raised, as an OSError where it is one)
            self.failed = True
            self._quiet = quiet
            raise _as_os_error(e, step, self.directory) from None
        quiet.__exit__(None, None, None)

    def _record(self) -> None:
        """Once the last save has finished: its digests, written by a thread (reading the files does not hold up
        training), and the records of steps orbax removed (keep) deleted."""
        self._join()
        step, self._unrecorded = self._unrecorded, None
        if step is None or jax.process_index() != 0:
            return

        def record():
            try:
                write_digests(self.path, step)
            except FileNotFoundError:  # the step was removed meanwhile (keep): nothing to record
                pass
            except BaseException as e:  # noqa: BLE001  (raised in the main thread by `_join`)
                self._record_error = e

        kept = {f"{s}.json" for s in self.manager.all_steps()} | {f"{step}.json"}
        for old in (self.path / INTEGRITY).glob("*.json") if (self.path / INTEGRITY).exists() else []:
            if old.name not in kept:  # the step itself was removed (keep)
                old.unlink(missing_ok=True)
        self._recorder = threading.Thread(target=record, name=f"digests-{step}", daemon=True)
        self._recorder.start()

    def _join(self) -> None:
        """Waits for the digest writer; raises its error, if any."""
        if self._recorder is not None:
            self._recorder.join()
            self._recorder = None
        if self._record_error is not None:
            error, self._record_error = self._record_error, None
            raise error

    def save(self, step: int, state: Any, meta: dict, inputs: Optional[Mapping[str, bytes]] = None,
             wait: bool = False) -> None:
        """Saves `step` (the state, its JSON record and, with `inputs`, this process's input pipeline states; a step
        saved already is not saved again); returns once the arrays are copied, unless `wait`: then once the step is
        on disk with its digests."""
        if step not in self.manager.all_steps():
            self.wait()  # the previous save, finished before this one starts (and its digests recorded)
            items = {"state": ocp.args.StandardSave(state), "meta": ocp.args.JsonSave(meta)}
            if inputs is not None:
                items[INPUT] = InputStateSave(dict(inputs))
            _ORBAX_WRITES.acquire()
            self._writing = True
            try:
                self._orbax(lambda: self.manager.save(step, args=ocp.args.Composite(**items), force=True), step)
            except BaseException:
                self._end_writing()
                raise
            self._unrecorded = step
            logging.info("saving checkpoint %d in %s", step, self.directory)
        if wait:
            self.wait(digests=True)

    def wait(self, digests: bool = False) -> None:
        """Blocks until the last save is on disk and starts writing its digests; with `digests`, until they are
        written too."""
        if self._unrecorded is not None:
            try:
                self._orbax(self.manager.wait_until_finished, self._unrecorded)
            finally:
                self._end_writing()
            self._record()
        if digests:
            self._join()

    def _end_writing(self) -> None:
        if self._writing:
            self._writing = False
            _ORBAX_WRITES.release()

    def restore(self, abstract_state: Any, step: Optional[int] = None) -> Tuple[Any, dict]:
        """The state laid out as `abstract_state` (ShapeDtypeStructs with shardings) and the JSON record of `step`,
        by default of the newest intact checkpoint (the record's "step" says which)."""
        self.wait()

        def restore(s):
            return self.manager.restore(s, args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore()))

        steps = sorted(self.manager.all_steps(), reverse=True)
        used, restored = _restore_intact(self.path, steps, step, restore)
        newer = [s for s in steps if s > used]
        if step is None and newer:
            self._set_aside(newer)
        return restored["state"], restored["meta"]

    def record(self, step: int) -> Optional[dict]:
        """The JSON record saved with `step` (seeds, data, model), without its arrays; None where it cannot be read
        (a damaged step: `restore` then names it and falls back)."""
        self.wait()
        try:
            return dict(self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"])
        except Exception:  # noqa: BLE001  (orbax raises many kinds for unreadable bytes; restore reports them)
            return None

    def saved_shapes(self, step: int) -> Optional[Dict[str, Tuple[int, ...]]]:
        """{array name: shape} of the state saved at `step`, read from its metadata (no array is read); None where
        the metadata cannot be read."""
        try:
            with ocp.StandardCheckpointer() as reader:
                tree = reader.metadata(self.path / str(step) / "state").item_metadata.tree
        except Exception:  # noqa: BLE001  (as in `record`)
            return None
        return leaf_shapes(tree)

    def _set_aside(self, steps: List[int]) -> None:
        """Moves the damaged `steps` (and their digest records) into damaged/, so that the run's own saves of those
        step numbers take their place (orbax saves no step it already has) and later restores find the new ones."""
        self._join()
        if jax.process_index() == 0:
            moved = []
            for s in steps:
                target = self.path / DAMAGED / str(s)
                n = 1
                while target.exists() or target.with_name(f"{target.name}.json").exists():
                    target, n = self.path / DAMAGED / f"{s}.{n}", n + 1
                target.parent.mkdir(parents=True, exist_ok=True)
                record = self.path / INTEGRITY / f"{s}.json"
                if record.exists():
                    record.rename(target.with_name(f"{target.name}.json"))
                (self.path / str(s)).rename(target)
                moved.append(str(target))
            console.warn(f"set aside the damaged checkpoint{'s' if len(moved) > 1 else ''} {', '.join(moved)}: "
                         "this run trains those steps again and saves them in their place (remove the folder once "
                         "you have looked at it)")
        partitioning.barrier("templm-checkpoints-set-aside")
        self.manager.reload()

    def restore_inputs(self, step: int, names: Tuple[str, ...]) -> Dict[str, bytes]:
        """The input states of the named shards that `step` holds ({} for a step saved without input states)."""
        if not (self.path / str(step) / INPUT).exists():
            return {}
        return dict(self.manager.restore(step, args=ocp.args.Composite(
            **{INPUT: InputStateRestore(tuple(names))}))[INPUT])

    def close(self) -> None:
        """Waits for the last save (its digests included) and closes the manager."""
        try:
            if not self.failed:
                self.wait(digests=True)
        finally:
            self._end_writing()
            with _ORBAX_WRITES:
                self.manager.close()
            if self.failed:  # the half-written step of the failed save, now that no thread writes to it
                for partial in self.path.glob("*.orbax-checkpoint-tmp*"):
                    shutil.rmtree(partial, ignore_errors=True) if partial.is_dir() else partial.unlink(missing_ok=True)
        # After a failed save standard error stays silenced: orbax's threads report their closed event loop until
        # the process ends (the command line prints its error through its own copy of standard error).


def _key_name(key: Any) -> str:
    for attribute in ("key", "name", "idx"):
        if hasattr(key, attribute):
            return str(getattr(key, attribute))
    return str(key)


def leaf_shapes(tree: Any) -> Dict[str, Tuple[int, ...]]:
    """{"params/encoder/.../kernel": shape} of a state's arrays (or of their abstract descriptions, or of orbax's
    metadata of a saved state: the names are the same whether a level is a dict, a tuple or a named tuple)."""
    leaves = jax.tree_util.tree_leaves_with_path(tree, is_leaf=lambda x: hasattr(x, "shape") and hasattr(x, "dtype"))
    return {"/".join(_key_name(k) for k in path): tuple(leaf.shape) for path, leaf in leaves}


def fit_problems(saved: Mapping[str, Tuple[int, ...]], wanted: Mapping[str, Tuple[int, ...]]) -> List[str]:
    """What differs between a checkpoint's arrays and a run's state, one line per array (names sorted: the
    parameters before the optimizer state)."""
    order = sorted(set(saved) | set(wanted), key=lambda name: (not name.startswith("params/"), name))
    return [f"{name}: checkpoint {saved.get(name, 'missing')}, this run {wanted.get(name, 'missing')}"
            for name in order if saved.get(name) != wanted.get(name)]


def abstract_like(tree: Any) -> Any:
    """ShapeDtypeStructs (with shardings) describing a pytree of arrays, for `Checkpointer.restore`."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


def load_params(directory: str, step: Optional[int] = None) -> Tuple[Any, dict]:
    """Parameters of a templm checkpoint folder (the newest intact step unless `step`) on this process's first
    device, e.g. to evaluate it or to initialise an adaptation run; whatever mesh and number of processes wrote it (a
    pod's checkpoint reads on a laptop)."""
    path = _path(directory)
    if not path.is_dir():
        remote.check_location(str(directory), "the checkpoint folder", write=False)  # a bucket's cause, if any
        raise DataError("no checkpoint folder here", str(directory))
    manager = ocp.CheckpointManager(str(path), item_names=("state", "meta", INPUT))
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    try:
        def restore(s):
            # Without a target orbax lays the arrays out as they were saved, which fails on other devices.
            with ocp.StandardCheckpointer() as reader:
                saved = reader.metadata(path / str(s) / "state").item_metadata.tree
            target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device), saved,
                                  is_leaf=lambda x: hasattr(x, "shape") and hasattr(x, "dtype"))
            return manager.restore(s, args=ocp.args.Composite(state=ocp.args.StandardRestore(target),
                                                              meta=ocp.args.JsonRestore()))

        steps = sorted(manager.all_steps(), reverse=True)
        used, restored = _restore_intact(path, steps, step, restore)
    finally:
        manager.close()
    if step is None and used != steps[0]:
        console.warn(f"using checkpoint {used} of {directory}, not its newest step {steps[0]}, which is damaged")
    return restored["state"]["params"], restored["meta"]
