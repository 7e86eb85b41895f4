"""The errors templm raises on purpose, and the exit status the command line gives each.

Every layer raises these and nothing above them needs to be imported to catch them: bad input is a `DataError`
(naming the file and line) or a `ConfigError` (naming the gin binding or flag), a run that cannot go on is a
`TrainingError`, and a run stopped by SIGTERM after saving its checkpoint is `Preempted`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import json
import math
import numbers
import os
import platform
import re
import signal
import sys
import threading
import typing
from typing import Any, Iterator, Mapping, Optional, Tuple, Union

import gin

# Exit statuses of `templm VERB` (README.md, "The command line").
EXIT_OK = 0
EXIT_BAD_INPUT = 1  # DataError, ConfigError, a missing file or a bad value: the message names it
EXIT_USAGE = 2  # an unknown verb or a malformed flag
EXIT_TRAINING = 3  # TrainingError: a non-finite loss; the message names the last good checkpoint
EXIT_SYSTEM = 4  # the machine refused: a full disk, a read-only file system, an I/O error; the message names the path
EXIT_INTERRUPTED = 130  # Ctrl-C (SIGINT): nothing half-written is left; a training run resumes from its last save
EXIT_PREEMPTED = 75  # Preempted: SIGTERM, checkpoint saved, nothing reported; rerun the command to resume (EX_TEMPFAIL)


class DataError(ValueError):
    """Bad input: names the file, the line (or record) and what was expected."""

    def __init__(self, message: str, path: Optional[str] = None, line: Optional[int] = None):
        self.path = path
        self.line = line
        self.reason = message
        where = ""
        if path is not None:
            where = f"{path}:{line}: " if line is not None else f"{path}: "
        super().__init__(where + message)


class ConfigError(ValueError):
    """A gin file, binding or flag that cannot be applied; the message names it."""


class TrainingError(RuntimeError):
    """The run cannot go on (a NaN loss): the message says why and which checkpoint is the last good one."""


class StageSkipped(Exception):
    """A stage of a study that the data cannot support (no TempLAMA queries, no future year, no test months after
    the cut-off): the study goes on without it, and its results and report say which findings went untested and why.
    Not an error of the input; the message is the reason."""


class Preempted(Exception):
    """SIGTERM arrived: the work stopped at a safe point (a training loop saves its checkpoint first).

    It is not an error of the input, so it is no ValueError: every caller lets it propagate, nothing is reported
    from the unfinished work, and the command exits with EXIT_PREEMPTED. Running the same command again resumes.
    `where` says where it stopped, e.g. "at step 120 (checkpoint saved in runs/t/checkpoints)"."""

    def __init__(self, where: str, step: Optional[int] = None):
        self.where = where
        self.step = step
        super().__init__(f"stopped by SIGTERM {where}: run the same command again to resume")


# SIGTERM while work is watched: noted, so that the work stops at its next safe point. One note for all nested watches.
_SIGTERM: dict = {"depth": 0, "received": False}


@contextlib.contextmanager
def watch_sigterm() -> Iterator[None]:
    """Within it, SIGTERM does not kill the process but is noted: `sigterm_received()` says whether it arrived since
    the outermost watch began. Watches nest (a study's stages around each model's training loop) and share that note,
    so a signal that arrives between two trainings stops the next one at its first step. The previous handler is
    back when the outermost watch ends. Outside the main thread (where no handler can be set) nothing is watched."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    outermost = _SIGTERM["depth"] == 0
    previous = None
    if outermost:
        _SIGTERM["received"] = False
        previous = signal.signal(signal.SIGTERM, lambda signum, frame: _SIGTERM.update(received=True))
    _SIGTERM["depth"] += 1
    try:
        yield
    finally:
        _SIGTERM["depth"] -= 1
        if outermost:
            signal.signal(signal.SIGTERM, previous)


def sigterm_received() -> bool:
    """Whether SIGTERM arrived since the outermost `watch_sigterm` began (False outside any)."""
    return _SIGTERM["depth"] > 0 and bool(_SIGTERM["received"])


# Ctrl-C (SIGINT), noted as well as raised: Python raises KeyboardInterrupt wherever the main thread is, and where
# that is a garbage-collection callback the exception is only printed and dropped. The note outlives it.
_SIGINT: dict = {"received": False}


def note_sigint() -> None:
    """Installs the SIGINT handler of the command line: note the signal, then raise KeyboardInterrupt as usual."""
    def handler(signum, frame):
        _SIGINT["received"] = True
        raise KeyboardInterrupt

    previous_hook = sys.unraisablehook

    def unraisable(report):  # a dropped KeyboardInterrupt (or Terminated) is noted: no traceback for it
        if not isinstance(report.exc_value, (KeyboardInterrupt, Terminated)):
            previous_hook(report)

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, handler)
        sys.unraisablehook = unraisable


class Terminated(BaseException):
    """SIGTERM outside a training loop (where watch_sigterm saves a checkpoint first): raised wherever the program
    is, as KeyboardInterrupt is for Ctrl-C, so the work under way unwinds (partial folders removed, locks released)
    and the command line exits with EXIT_PREEMPTED. A BaseException, so that no `except Exception` swallows it."""


def note_sigterm() -> None:
    """Installs the SIGTERM handler of the command line: note the signal, then raise Terminated (a watch_sigterm
    block puts its own in place for its duration)."""
    def handler(signum, frame):
        _SIGINT["terminated"] = True
        raise Terminated()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, handler)


@contextlib.contextmanager
def deferred_signals(final: bool = True) -> Iterator[None]:
    """Within it, SIGTERM and Ctrl-C are noted instead of answered, and answered when it ends (the signal sent again
    to the process, so that the handlers outside raise as usual): for the renames that put a result's files in
    place together (results.json, report.md, figures), which must not stop halfway. With `final` (the command's
    result, not a part of it such as one seed's folder of a run over seeds) `signal_during_commit()` then says the
    result was complete when the signal was answered. Outside the main thread it defers nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    check_interrupted()  # a signal whose exception was dropped earlier: the result is not put in place
    noted: list = []
    previous = {s: signal.signal(s, lambda received, _: noted.append(received))
                for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if noted:
            _SIGINT["during_commit"] = final
            os.kill(os.getpid(), noted[0])


def result_in_place() -> None:
    """Says that the command's result is whole where it goes (a verb calls it once it has written it, before printing
    its summary): a SIGTERM or Ctrl-C that arrives from here on is noted, not raised, so that nothing stops the
    summary halfway or calls the finished result unwritten; the command line answers it when the verb returns
    (`signal_after_result`). Outside the main thread it changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        return
    _SIGINT["in_place"] = True

    def note(received, _):
        _SIGINT.setdefault("after_result", received)

    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, note)


def signal_after_result() -> Optional[int]:
    """The first signal noted after `result_in_place`, or None; or, once the result is in place, a signal whose
    exception was dropped (raised in a finaliser, where Python prints and drops it) after the verb's last
    `check_interrupted` before it wrote the result: the work went on and the result is complete."""
    if _SIGINT.get("after_result") is not None or not _SIGINT.get("in_place"):
        return _SIGINT.get("after_result")
    if _SIGINT["received"]:
        return signal.SIGINT
    return signal.SIGTERM if _SIGINT.get("terminated") else None


def signal_during_commit() -> bool:
    """Whether the signal that stopped the command arrived while a result was being put in place (deferred_signals):
    the result is complete and written."""
    return bool(_SIGINT.get("during_commit"))


def reset_signal_notes() -> None:
    """Forgets a Ctrl-C or SIGTERM noted by an earlier command of this process (templm.cli.main, at each call)."""
    _SIGINT.clear()
    _SIGINT["received"] = False
    _SIGTERM["received"] = False


def check_interrupted() -> None:
    """Raises KeyboardInterrupt if Ctrl-C arrived, Terminated if SIGTERM did (even if the exception was dropped):
    called before a result is put in place, so an interrupted command never leaves one."""
    if _SIGINT["received"]:
        raise KeyboardInterrupt
    if _SIGINT.get("terminated"):
        raise Terminated()


def require_macros(function: str, values: Mapping[str, Tuple[str, Any]], allow_none: bool = False) -> None:
    """Raises a ConfigError naming the gin macro to set for the first parameter of `function` (e.g. "templm.train")
    that arrived as gin's REQUIRED sentinel (or as None / empty, unless allow_none). `values`: {parameter: (macro,
    value)}."""
    for name, (macro, value) in values.items():
        if value is gin.REQUIRED or (not allow_none and (value is None or value == "")):
            raise ConfigError(f"{function}.{name} is required: set the gin macro {macro}, e.g. --gin.{macro}=...")


# A numeric setting to check: (value, int or float, the least value allowed or None, the gin macro it is usually
# bound through or None), and optionally the most allowed.
Number = Union[Tuple[Any, type, Optional[float], Optional[str]],
               Tuple[Any, type, Optional[float], Optional[str], Optional[float]]]


def require_numbers(function: str, values: Mapping[str, Number], optional: Tuple[str, ...] = ()) -> None:
    """Raises a ConfigError naming `function.parameter` (and its macro) for the first setting that is not a number
    of its kind or is out of its range, before any work: an int setting takes integers only (20.5 or '32' is
    refused, not rounded or parsed), a float one any finite real number. A bound of None is none. Parameters in
    `optional` may be None."""
    for name, (value, kind, least, macro, *rest) in values.items():
        most = rest[0] if rest else None
        if value is None and name in optional:
            continue
        is_number = isinstance(value, numbers.Real) and not isinstance(value, bool)
        if kind is int:
            expected, ok = "a whole number", is_number and isinstance(value, numbers.Integral)
        else:
            expected, ok = "a finite number", is_number and math.isfinite(float(value))
        if not ok:
            quoted = " (quotes make it a string in gin: write the number bare)" if isinstance(value, str) else ""
            raise ConfigError(f"{_binding(function, name, macro)}: expected {expected}, got {value!r}{quoted}")
        if least is not None and value < least:
            raise ConfigError(f"{_binding(function, name, macro)}: must be at least {least:g}, got {value!r}")
        if most is not None and value > most:
            raise ConfigError(f"{_binding(function, name, macro)}: must be at most {most:g}, got {value!r}")


def _plain_kind(hint: Any) -> Tuple[Optional[type], bool]:
    """(int, float, bool or str; whether None is allowed) of a field's annotation; (None, _) for any other."""
    optional = False
    if typing.get_origin(hint) is typing.Union:
        members = [m for m in typing.get_args(hint) if m is not type(None)]
        optional = len(members) < len(typing.get_args(hint))
        if len(members) != 1:
            return None, optional
        hint = members[0]
    return (hint if hint in (int, float, bool, str) else None), optional


@functools.lru_cache(maxsize=None)
def field_kinds(cls: type) -> Tuple[Tuple[str, Optional[type], bool], ...]:
    """(field, int/float/bool/str or None, whether None is allowed) for each field of the dataclass `cls`, from its
    annotations (resolved once per class)."""
    hints = typing.get_type_hints(cls)
    return tuple((field.name, *_plain_kind(hints.get(field.name))) for field in dataclasses.fields(cls))


def require_field_types(config: Any, name: str, macros: Optional[Mapping[str, str]] = None) -> None:
    """Raises a ConfigError naming `name.field` for the first field of the dataclass `config` whose value is not of
    its annotated kind: int a whole number (not 20.5, not '32', not True), float a finite number, bool True or False,
    str a string; each may be None where the annotation is Optional. Other annotations are the config's own to
    check. Every gin-configurable config calls it first in __post_init__, so that a quoted number or an infinity
    bound in gin is named before anything compares or uses it (the range checks follow, the config's own).
    `macros`: {field: the gin macro the shipped configs bind it to}, named with the field."""
    macros = macros or {}
    for field, kind, optional in field_kinds(type(config)):
        value = getattr(config, field)
        if kind is None or value is gin.REQUIRED or (value is None and optional):
            continue
        if kind in (int, float):
            require_numbers(name, {field: (value, kind, None, macros.get(field))})
        elif not isinstance(value, kind):
            quoted = " (quotes make it a string in gin: write True or False bare)" if kind is bool and isinstance(
                value, str) else ""
            expected = {bool: "True or False", str: "a string"}[kind]
            raise ConfigError(f"{_binding(name, field, macros.get(field))}: expected {expected}, got {value!r}{quoted}")


def machine_memory() -> int:
    """This machine's physical memory in bytes (0 where the system does not say)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0


def cpu_model() -> str:
    """This machine's processor as the system names it ("AMD EPYC", "Intel(R) Xeon(R) Processor"): the numbers of a
    run on the CPU depend on it (XLA compiles for the processor's instructions, which order a sum's terms)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def require_memory(needed: float, what: str) -> None:
    """Raises a ConfigError, before any allocation, when settings that are each in range together need more than
    half of this machine's memory: `needed` bytes, computed from them by the caller, `what` naming the settings
    (e.g. "--ks (largest 2^40) x --repeats 8 x ... 4-byte floats")."""
    total = machine_memory()
    if total and needed > total / 2:
        raise ConfigError(f"{what}: about {_bytes(needed)}, more than half of this machine's {_bytes(total)} of "
                          "memory; choose smaller values")


def _bytes(n: float) -> str:
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20)):
        if n >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{n:,.0f} bytes"


def require_folder(function: str, name: str, macro: Optional[str], path: str) -> None:
    """Raises a ConfigError naming `function.name` (and its macro) when `path` exists and is not a folder, or names
    the current or parent folder ('.', '..': a run's files would land among whatever is there)."""
    last = os.path.basename(os.path.normpath(path)) if path.strip() else path
    if last in (".", "..") or os.path.normpath(path) in (".", ".."):
        raise ConfigError(f"{_binding(function, name, macro)}: {path!r} names the current or parent folder: name the "
                          "run's own folder")
    if os.path.lexists(path) and not os.path.isdir(path):
        raise ConfigError(f"{_binding(function, name, macro)}: {path} is a file; it must be a folder (absent, or one "
                          "a run writes into)")


def _binding(function: str, name: str, macro: Optional[str]) -> str:
    """How a message names a setting: `templm.train.total_steps (the gin macro TRAIN_STEPS)`."""
    return f"{function}.{name}" + (f" (the gin macro {macro})" if macro else "")


# errno values that are the machine's, not the input's: a full disk, a quota or file-size limit, an I/O error, a
# read-only file system (exit EXIT_SYSTEM).
SYSTEM_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.EROFS})
_OS_ERROR_CODE = re.compile(r"os_error_code='(\d+)'")


def as_os_error(error: BaseException, path: str, doing: str) -> Optional[OSError]:
    """The OSError that a library's error of another type reports as text (TensorFlow's file writers, tensorstore):
    an errno in it (`os_error_code='28'`) or the system's words for one of SYSTEM_ERRNOS ("File too large"), as an
    OSError naming `path` and what was being done; None where the text holds neither."""
    if isinstance(error, OSError) and error.errno:
        code = error.errno
    else:
        text = str(error)
        match = _OS_ERROR_CODE.search(text)
        code = int(match.group(1)) if match else next(
            (c for c in sorted(SYSTEM_ERRNOS) if os.strerror(c) in text), None)
        if code is None:
            return None
    return OSError(code, f"{os.strerror(code)} while {doing}", path)


def loads_json(text: "str | bytes") -> Any:
    """json.loads for what a user's file holds: a value nested too deeply for Python's parser (a crafted line of
    thousands of brackets) is a json.JSONDecodeError like any other malformed JSON (a ValueError every reader already
    names with its file and line, or skips with on_error=skip), not a RecursionError."""
    try:
        return json.loads(text)
    except RecursionError:
        raise json.JSONDecodeError("nested deeper than templm reads (about a thousand levels of brackets)", "",
                                   0) from None


MAX_JSON_CHARS = 256 << 20  # a JSON file read whole (a config, a run's record): those templm reads are kilobytes


def read_json(path: str, missing: str) -> Any:
    """The JSON value of the file `path`; a DataError naming it where it is absent (`missing`: what that means), is
    not JSON (ValueError covers a decoding error of either kind) or is longer than MAX_JSON_CHARS (read no further:
    a config.json of gigabytes would fill the memory before it could be refused)."""
    from templm import paths

    try:
        with paths.open(path, encoding="utf-8") as f:
            text = f.read(MAX_JSON_CHARS + 1)
        if len(text) > MAX_JSON_CHARS:
            raise DataError(f"longer than {MAX_JSON_CHARS >> 20} MiB: not a JSON file of the kind templm reads "
                            "whole (they are kilobytes); not read further", path)
        return loads_json(text)
    except DataError:  # (a ValueError too) the size refused above, said once
        raise
    except FileNotFoundError:
        raise DataError(missing, path) from None
    except (OSError, ValueError) as e:
        raise DataError(f"cannot read it as JSON: {e}", path) from None
