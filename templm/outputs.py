"""Output folders: what templm may write over, and locks that keep two runs out of one folder.

* Every folder templm builds carries a marker (`.templm.json`, its kind). A run replaces a folder only when it is
  absent, empty or a templm output of the same kind (folders written before the markers are known by their files);
  anything else is refused, naming what is there, unless the caller passes `overwrite` (`--overwrite`).
* A run that writes a folder holds a lock file while it does: `<folder>.lock` beside a folder that is rebuilt whole,
  `<folder>/.templm.lock` inside one a run keeps adding to (a MODEL_DIR, a reproduction). The lock is an advisory
  `flock` that the system releases when its holder ends, kill -9 included, so a lock left by a dead run never blocks
  the next one; the file names its holder (command, pid, host, start) for the message a second run gets, and is
  removed when the run ends (a killed run leaves it behind, harmless).
* The names beside an output are templm's own only when templm made them: a `<folder>.partial` without its
  PARTIAL_MARKER, or a `<folder>.lock` that is not a lock, is a user's and is refused, never removed.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import shutil
import socket
import sys
from typing import Any, Callable, Dict, Iterator, Sequence, Tuple

from templm import paths, remote
from templm.errors import ConfigError, DataError, check_interrupted, read_json
from templm.io import NamedWrites, atomic_write, write_failure_named

MARKER = ".templm.json"
LOCK = ".templm.lock"
PARTIAL_MARKER = ".templm.partial"  # inside `<folder>.partial` while templm builds it: a folder of ours to remove
# What marks a folder of each kind written before the markers existed: its files, each with what it must hold (None:
# present; a suffix: a folder of such files; key sets: a JSON object with every key of one of them), so that a
# user's folder holding a file that merely has one of these names (an is_eval.json of their own) is not templm's.
_SIGNATURES: Dict[str, Sequence[Tuple[str, Any]]] = {
    "world": (("news.jsonl", None), ("stats.json", (("config", "documents", "by_year"),))),
    "task data": (("manifest.json", (("version", "years", "counts"),)),),
    "CALM corpus": (("vocab", ".vocab"),),
    "reproduction": (("run.json", (("halves",), ("preset", "seed"))),),
    "importance-sampling evaluation": (("is_eval.json", (("config", "rows"),)),),
    "CALM run": (("learner.jsonl", None), ("baseline.jsonl", None)),
}
_HELD: Dict[str, int] = {}  # lock path -> depth: a process may take its own lock again (nested stages)


def kind_of(folder: str) -> str:
    """The kind of templm output `folder` is ("" when none: absent, empty, or something else)."""
    try:
        with paths.open(paths.join(folder, MARKER), encoding="utf-8") as f:
            return str(json.load(f).get("kind", ""))
    except ValueError:  # not JSON: not a marker of ours
        pass
    except Exception as e:  # absent (OSError locally, TensorFlow's NotFoundError on a URL); a URL's other errors raise
        if paths.is_url(folder) and not _not_found(e) or not isinstance(e, OSError) and not _not_found(e):
            raise
    for kind, files in _SIGNATURES.items():
        if all(_holds(paths.join(folder, name), what) for name, what in files):
            return kind
    return ""


def _holds(path: str, what: Any) -> bool:
    """Whether `path` is a file of an older templm output as _SIGNATURES describes it."""
    if what is None:
        return paths.exists(path)
    if isinstance(what, str):
        return paths.isdir(path) and bool(paths.listdir(path)) and all(n.endswith(what) for n in paths.listdir(path))
    try:
        value = read_json(path, "absent")
    except DataError:  # absent, unreadable, not JSON, past read_json's size limit: not a file of ours
        return False
    return isinstance(value, dict) and any(all(key in value for key in keys) for keys in what)


def check_output_folder(folder: str, kind: str, overwrite: bool = False,
                        how: str = "pass --overwrite to replace it") -> None:
    """Raises DataError unless templm may write a `kind` output at `folder`: it is absent, empty, a templm output of
    the same kind, or `overwrite` is set. The message names what is there and `how` to go on anyway. An output path
    that names no folder of its own ('', '.', '..') or is too long is refused first (_require_named)."""
    _require_named(folder)
    if not paths.lexists(folder):
        return
    if not paths.isdir(folder):
        raise DataError(f"is a file, not a folder: choose another output folder for the {kind}", folder)
    entries = sorted(name for name in paths.listdir(folder) if name != LOCK)  # a lock alone: a run starting here
    if not entries or overwrite:
        return
    found = kind_of(folder)
    if found == kind:
        return
    what = f"{_a(found)} templm {found}" if found else "not a templm output"
    shown = ", ".join(entries[:6]) + (f", ... ({len(entries)} entries)" if len(entries) > 6 else "")
    raise DataError(f"the output folder is not empty and is {what}, not {_a(kind)} {kind} ({shown}); nothing was "
                    f"changed: choose another folder, or {how}", folder)


def _a(kind: str) -> str:
    return "an" if kind[:1].lower() in "aeiou" else "a"


def mark(folder: str, kind: str) -> None:
    """Writes the marker that says `folder` is a templm output of `kind`."""
    atomic_write(paths.join(folder, MARKER), json.dumps({"kind": kind, "written_by": "templm"}) + "\n")


def _holder() -> Dict[str, Any]:
    return {"pid": os.getpid(), "host": socket.gethostname(), "command": " ".join(sys.argv[:3]) or "python",
            "since": datetime.datetime.now().isoformat(timespec="seconds")}


def _acquire(lock_path: str, what: str, wait: bool):
    """The open lock file, flock-ed. A file unlinked by its last holder between our open and our flock is not the
    lock any more: open the path again."""
    while True:
        f = open(lock_path, "a+", encoding="utf-8")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            f.seek(0)
            try:
                holder = json.loads(f.read() or "{}")
            except ValueError:
                holder = {}
            f.close()
            by = (f"`{holder.get('command', 'templm')}` (pid {holder.get('pid', '?')} on {holder.get('host', '?')}, "
                  f"since {holder.get('since', '?')})")
            raise DataError(f"{what} is in use by {by}; wait for it to end, or stop it (the lock of a run that was "
                            "killed is released by the system)", lock_path) from None
        try:
            if os.fstat(f.fileno()).st_ino == os.stat(lock_path).st_ino:
                return f
        except FileNotFoundError:
            pass
        f.close()


@contextlib.contextmanager
def locked(lock_path: str, what: str, wait: bool = False) -> Iterator[None]:
    """Holds the lock file `lock_path` for the block: a second holder is refused with a DataError naming the first
    (or, with `wait`, waits for it). Taking a lock this process already holds is allowed (nested stages). The file
    is removed when the lock is released (still holding it, so that no one else can take a stale copy)."""
    lock_path = os.path.abspath(lock_path)
    _check_own_lock(lock_path)
    with _nested(lock_path, lambda path: _flocked(path, what, wait)):
        yield


@contextlib.contextmanager
def _flocked(lock_path: str, what: str, wait: bool) -> Iterator[None]:
    os.makedirs(os.path.dirname(lock_path), exist_ok=True)
    f = _acquire(lock_path, what, wait)
    try:
        try:
            _write_holder(f, lock_path)
            yield
        finally:
            try:
                os.unlink(lock_path)
            except FileNotFoundError:
                pass
            fcntl.flock(f, fcntl.LOCK_UN)
    finally:
        try:
            f.close()
        except OSError:  # the holder's line that failed to be written (named above) fails again on closing
            pass


def _write_holder(f, lock_path: str) -> None:
    """The holder's line in the lock file `f` (what a refused second run names); a failed write (a full disk) names
    the lock file, and the lock is released and its file removed on the way out."""
    try:
        f.seek(0)
        f.truncate()
        f.write(json.dumps(_holder()) + "\n")
        f.flush()
    except OSError as e:
        raise write_failure_named(e, lock_path) from None


def _check_own_lock(lock_path: str) -> None:
    """Refuses a file at `lock_path` that is not a templm lock (empty, or naming its holder): a user's file of that
    name is never truncated or removed."""
    if not os.path.lexists(lock_path):
        return
    if not os.path.isfile(lock_path) or os.path.islink(lock_path):
        raise DataError("is not a templm lock file (templm takes this name for its lock): move it away", lock_path)
    try:
        with open(lock_path, encoding="utf-8") as f:
            text = f.read()
        ours = not text.strip() or "pid" in json.loads(text)
    except (OSError, ValueError, TypeError, UnicodeDecodeError):
        ours = False
    if not ours:
        raise DataError("is not a templm lock file (templm takes this name for its lock): move it away; nothing "
                        "was changed", lock_path)


def lock_inside(folder: str, what: str) -> contextlib.AbstractContextManager:
    """The lock of a folder a run keeps adding to (MODEL_DIR, a reproduction): `<folder>/.templm.lock`, a flock on
    a local (or NFS) path, a create-only object with a heartbeat in a bucket (remote.object_lock)."""
    if paths.is_url(folder):
        return _nested(paths.join(folder, LOCK), lambda path: remote.object_lock(path, what))
    return locked(os.path.join(folder, LOCK), what)


@contextlib.contextmanager
def _nested(lock: str, take: Callable[[str], Any]) -> Iterator[None]:
    """`take(lock)` for the block, unless this process holds that lock already (nested stages)."""
    if lock in _HELD:
        _HELD[lock] += 1
        try:
            yield
        finally:
            _HELD[lock] -= 1
        return
    with take(lock):
        _HELD[lock] = 1
        try:
            yield
        finally:
            del _HELD[lock]


def _not_found(error: BaseException) -> bool:
    return isinstance(error, FileNotFoundError) or type(error).__name__ == "NotFoundError"


@contextlib.contextmanager
def writing_into(folder: str, kind: str, overwrite: bool = False) -> Iterator[str]:
    """For a run that keeps adding to `folder` (a reproduction): refuses it unless check_output_folder allows it,
    creates it, holds its lock (lock_inside) and marks it as a `kind` output for the block; yields its absolute
    path. A process may enter it again for the same folder (nested stages)."""
    _require_named(folder)
    folder = paths.absolute(folder)
    remote.check_location(folder, f"the {kind} folder")
    check_output_folder(folder, kind, overwrite)
    paths.makedirs(folder)
    with lock_inside(folder, f"the {kind} folder {folder}"):
        mark(folder, kind)
        yield folder


@contextlib.contextmanager
def holding(folder: Any, kind: str) -> Iterator[None]:
    """The lock beside a folder a verb writes into as it goes (`<folder>.lock`, as build_output_folder's): a second
    run on the same folder is refused, naming the first, for the whole verb (its work and its report); nothing is
    created inside the folder, so input refused later leaves no folder. A bucket's folder, or none, is not locked."""
    if folder is None or not isinstance(folder, (str, os.PathLike)) or paths.is_url(os.fspath(folder)):
        yield
        return
    _require_named(folder)
    out = os.path.abspath(os.fspath(folder).rstrip("/\\"))
    with locked(out + ".lock", f"the {kind} folder {out}"):
        yield


def claim_output_folder(folder: str, kind: str, overwrite: bool = False,
                        how: str = "pass --overwrite to write into it", create: bool = True) -> str:
    """For a function that writes its results into `folder` as it goes (is-eval, appendices, a CALM run, a stream
    evaluation): refuses it before any work unless check_output_folder allows it (absent, empty or a templm `kind`
    output; a user's folder or another verb's output only with `overwrite`, which the message says `how` to set),
    creates it and marks it as a `kind` output (with `create`; without, the caller claims it again when it writes,
    so that input refused after the check leaves no folder); returns the folder (absolute where it is a URL)."""
    _require_named(folder)
    folder = paths.absolute(folder) if paths.is_url(folder) else os.fspath(folder)
    remote.check_location(folder, f"the {kind} folder")
    check_output_folder(folder, kind, overwrite, how)
    if not create:
        return folder
    paths.makedirs(folder)
    if not paths.exists(paths.join(folder, MARKER)):
        mark(folder, kind)
    return folder


def build_output_folder(out_dir: str, kind: str, build: Callable[[str], Any], overwrite: bool = False,
                        lock: bool = True) -> Any:
    """Runs build(tmp) in a fresh folder beside `out_dir` (`out_dir` + ".partial"), marks it as a `kind` output and
    puts it in the place of `out_dir`, all under the lock `out_dir` + ".lock": nothing half-built is ever at
    `out_dir`, a failure removes the partial folder and leaves `out_dir` as it was, and a folder that is not a
    templm `kind` output is never replaced unless `overwrite` (check_output_folder). An `out_dir` that is a symlink
    is followed: its target is built and replaced, the link stays. The names beside `out_dir` are templm's own: a
    partial folder is removed only when templm made it (its PARTIAL_MARKER), a lock file only when it is a lock, and
    the old output is moved aside under a name of this process's; anything else there is refused before the build.
    `lock` = False inside a folder that is itself being built under a lock (its partial folder is this run's alone).
    Returns what build returned."""
    _require_named(out_dir)
    if paths.is_url(out_dir):
        return _build_in_bucket(paths.absolute(out_dir), kind, build, overwrite, lock)
    out_dir = os.fspath(out_dir).rstrip("/\\") or os.fspath(out_dir)
    if os.path.islink(out_dir):
        out_dir = os.path.realpath(out_dir)
    check_output_folder(out_dir, kind, overwrite)
    tmp = out_dir + ".partial"
    _check_own_partial(tmp)
    with locked(out_dir + ".lock", f"the {kind} folder {out_dir}") if lock else contextlib.nullcontext():
        _check_own_partial(tmp)  # again, under the lock
        shutil.rmtree(tmp, ignore_errors=True)  # a partial folder of a run that died: ours, under our lock
        try:
            os.makedirs(tmp)
            # Written in place, not renamed into it: a run refused by the lock may look at the folder at any moment,
            # and must see it empty or marked, never holding a temporary file alone.
            with NamedWrites(os.path.join(tmp, PARTIAL_MARKER), "x", encoding="utf-8") as f:
                f.write(json.dumps(_holder()) + "\n")
            result = build(tmp)
            os.remove(os.path.join(tmp, PARTIAL_MARKER))
            mark(tmp, kind)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        check_interrupted()  # Ctrl-C during the build, even one whose exception was lost, leaves no output
        check_output_folder(out_dir, kind, overwrite)  # still ours to replace after the build
        old = f"{out_dir}.templm-old-{os.getpid()}"  # a name of this run's: no user's folder is touched
        if os.path.lexists(out_dir):
            if os.path.lexists(old):
                raise DataError("is in the way of the output's swap (templm moves the old output there): move it "
                                "away", old)
            os.replace(out_dir, old)
        os.replace(tmp, out_dir)
        shutil.rmtree(old, ignore_errors=True)
    return result


# Copied last into a bucket's output (and removed first from the old one): the files by which a reader knows an
# output is there and complete.
_INDEX_FILES = (MARKER, "manifest.json", "stats.json", "run.json", "results.json")


def _build_in_bucket(out_dir: str, kind: str, build: Callable[[str], Any], overwrite: bool, lock: bool) -> Any:
    """build_output_folder for an `out_dir` in a bucket, where nothing can be renamed: build(tmp) runs in a local
    temporary folder (so every builder writes files as it does locally), the finished folder is uploaded whole to
    `<out_dir>.partial` (marked as partial while it is uploaded), and only then swapped in: the old output's index
    files (_INDEX_FILES, the marker first) removed, then the rest of it; the new objects copied in with the index files
    last; the partial folder removed. A reader never finds a marker or manifest beside files of another build, and a
    run killed during the swap leaves a complete `<out_dir>.partial` that the next run may replace `out_dir` from
    (check_output_folder allows an unmarked `out_dir` then)."""
    remote.check_location(paths.dirname(out_dir), f"the {kind} folder's place")
    partial = out_dir + ".partial"
    if not _swap_was_cut(out_dir, partial, kind):
        check_output_folder(out_dir, kind, overwrite)
    with (_nested(out_dir + ".lock", lambda path: remote.object_lock(path, f"the {kind} folder {out_dir}"))
          if lock else contextlib.nullcontext()):
        _check_own_partial(partial)
        import tempfile

        with tempfile.TemporaryDirectory(prefix="templm-build-") as local:
            tmp = os.path.join(local, paths.basename(out_dir))
            os.makedirs(tmp)
            result = build(tmp)
            mark(tmp, kind)
            check_interrupted()
            files = sorted((os.path.relpath(os.path.join(parent, name), tmp).replace(os.sep, "/")
                            for parent, _, names in os.walk(tmp) for name in names), key=_index_last)
            paths.rmtree(partial)
            paths.makedirs(partial)
            with paths.open(paths.join(partial, PARTIAL_MARKER), "w") as f:
                f.write(json.dumps(_holder()) + "\n")
            for name in files:
                paths.copy(os.path.join(tmp, name), paths.join(partial, name), overwrite=True)
            paths.remove(paths.join(partial, PARTIAL_MARKER))  # complete: the swap may begin
        check_interrupted()
        if not _swap_was_cut(out_dir, partial, kind):
            check_output_folder(out_dir, kind, overwrite)  # still ours to replace after the build
        _swap_in(partial, out_dir, files)
    return result


def _index_last(name: str):
    return (paths.basename(name) in _INDEX_FILES, paths.basename(name) == MARKER, name)


def _swap_was_cut(out_dir: str, partial: str, kind: str) -> bool:
    """True when a run died while swapping `partial` into `out_dir`: `partial` is complete and of `kind`, and
    `out_dir` has lost its marker (the swap removes it first)."""
    return (paths.exists(paths.join(partial, MARKER)) and not paths.exists(paths.join(partial, PARTIAL_MARKER))
            and kind_of(partial) == kind and not paths.exists(paths.join(out_dir, MARKER)))


def _swap_in(partial: str, out_dir: str, files: Sequence[str]) -> None:
    if paths.isdir(out_dir):
        old = []
        for parent, _, names in paths.gfile().walk(out_dir):
            old += [paths.join(parent, name) for name in names]
        for path in sorted(old, key=lambda p: (not paths.basename(p) == MARKER,
                                               paths.basename(p) not in _INDEX_FILES, p)):
            paths.remove(path)
        paths.rmtree(out_dir)
    for name in files:
        paths.copy(paths.join(partial, name), paths.join(out_dir, name), overwrite=True)
    paths.rmtree(partial)


# The longest suffix templm adds to an output folder's name (build_output_folder's ".templm-old-<pid>").
_SUFFIX = len(".templm-old-") + 10


def _require_named(folder: str) -> None:
    """Refused before any work, the cause named: an empty output path (it would build into the working folder's
    hidden `.partial`), one ending in '.' or '..' (a folder that cannot be built beside and swapped in: name it), and
    a last name too long for the names templm builds beside it."""
    text = os.fspath(folder)
    if not text.strip():
        raise ConfigError("the output folder is an empty path (--out ''): name the folder to write")
    last = text.rstrip("/\\").replace("\\", "/").rsplit("/", 1)[-1] if text.rstrip("/\\") else text
    if last in (".", ".."):
        raise ConfigError(f"the output folder {text!r} names the current or parent folder: name the folder to write "
                          "(e.g. --out runs/NAME)")
    if paths.is_url(text):  # an object name may be 1,024 bytes long, its parts any length
        return
    limit = _name_max(text)
    if len(last.encode("utf-8")) + _SUFFIX > limit:
        raise ConfigError(f"the output folder {text}: its name is {len(last.encode('utf-8'))} bytes long, templm "
                          f"builds it beside itself under a name {_SUFFIX} bytes longer, and names on this file "
                          f"system hold at most {limit} bytes: choose a shorter name")


def _name_max(folder: str) -> int:
    """The longest file name the file system of `folder` (or of its nearest existing parent) allows."""
    place = os.path.abspath(folder)
    while not os.path.exists(place) and os.path.dirname(place) != place:
        place = os.path.dirname(place)
    try:
        return int(os.pathconf(place, "PC_NAME_MAX"))
    except (OSError, ValueError):
        return 255


def _check_own_partial(tmp: str) -> None:
    """Refuses a `<folder>.partial` that templm did not make (a user's folder or file of that name). In a bucket a
    complete partial folder (marked, a swap that was cut) is templm's too."""
    if paths.is_url(tmp):
        if not paths.exists(tmp) or paths.isdir(tmp) and (
                not paths.listdir(tmp) or any(paths.exists(paths.join(tmp, m)) for m in (PARTIAL_MARKER, MARKER))):
            return
        raise DataError("is not a partial folder of templm's (templm builds its output under this name beside it): "
                        "move it away; nothing was changed", tmp)
    if not os.path.lexists(tmp):
        return
    if os.path.isdir(tmp) and not os.path.islink(tmp) and (
            os.path.exists(os.path.join(tmp, PARTIAL_MARKER)) or not os.listdir(tmp)):
        return
    raise DataError("is not a partial folder of templm's (templm builds its output under this name beside it): move "
                    "it away; nothing was changed", tmp)
