"""What a run prints for people: templm's own progress lines, warnings and summaries.

Progress and warnings go to standard error, so that standard output holds only a verb's result (JSON lines that
scripts read); library logs (absl, orbax, clu, TensorFlow) stay off unless the command line asks for them
(`--verbosity=1`). In a multi-process run only process 0 speaks (`set_enabled`).

Long work (training steps, evaluation batches, task records, stream segments) reports through a `Ticker`, as the
command line's `--progress` asks (`set_progress`): "lines" (the default) prints one line with the rate and the ETA
every LONG_WORK_SECONDS at most, and none for work shorter than that, so a log or a pipe gets a few lines a minute;
"bar" draws a tqdm bar on the terminal instead; "none" prints no progress (stage lines, warnings and summaries
stay).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from typing import Any, Callable, Dict, Iterator, Optional

from templm.io import format_duration

_state = {"enabled": True, "progress": "lines"}
PROGRESS_MODES = ("none", "lines", "bar")
LONG_WORK_SECONDS = 45.0  # the longest a piece of long work goes without a progress line


def set_enabled(enabled: bool) -> None:
    _state["enabled"] = bool(enabled)


def set_progress(mode: str) -> None:
    if mode not in PROGRESS_MODES:
        raise ValueError(f"progress must be one of {PROGRESS_MODES}, got {mode!r}")
    _state["progress"] = mode


def settings() -> Dict[str, object]:
    """The console's settings (enabled, progress mode), for `restore_settings`."""
    return dict(_state)


def restore_settings(saved: Dict[str, object]) -> None:
    _state.update(saved)


def progress_mode() -> str:
    return _state["progress"]


def say(message: str) -> None:
    """One line for the person running the command."""
    if _state["enabled"]:
        print(message, file=sys.stderr, flush=True)


def warn(message: str) -> None:
    say(f"warning: {message}")


@contextlib.contextmanager
def silenced_stderr() -> Iterator[None]:
    """Standard error, the file descriptor, on /dev/null for the block: what native libraries and their threads
    write there (TensorFlow's start-up lines, orbax's and tensorstore's tracebacks) is not shown. Python's own
    sys.stderr is flushed first, so nothing of ours written before is lost. Blocks of several threads overlap: the
    first to enter silences it, the last to leave gives it back."""
    with _SILENCED["lock"]:
        if _SILENCED["depth"] == 0:
            sys.stderr.flush()
            _SILENCED["saved"] = os.dup(2)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 2)
            os.close(devnull)
        _SILENCED["depth"] += 1
    try:
        yield
    finally:
        with _SILENCED["lock"]:
            _SILENCED["depth"] -= 1
            if _SILENCED["depth"] == 0:
                os.dup2(_SILENCED["saved"], 2)
                os.close(_SILENCED["saved"])


_SILENCED: Dict[str, Any] = {"lock": threading.Lock(), "depth": 0, "saved": None}


def silenced_unless_verbose():
    """`silenced_stderr()` while library logs are off (absl's verbosity at ERROR or below, as the command line leaves
    it without --verbosity), else a block that changes nothing."""
    from absl import logging

    return silenced_stderr() if logging.get_verbosity() <= logging.ERROR else contextlib.nullcontext()


class Rate:
    """Steps/s, tokens/s and the ETA over the steps since the last report."""

    def __init__(self, total_steps: int, tokens_per_step: int = 0, start_step: int = 0):
        self.total_steps = total_steps
        self.tokens_per_step = tokens_per_step
        self.t_last = time.time()
        self.step_last = start_step

    def report(self, step: int) -> Dict[str, float]:
        now = time.time()
        rate = (step - self.step_last) / max(now - self.t_last, 1e-9)
        self.t_last, self.step_last = now, step
        eta = (self.total_steps - step) / rate if rate > 0 else float("inf")
        return {"steps_per_sec": rate, "tokens_per_sec": rate * self.tokens_per_step, "eta_sec": eta}


def step_line(prefix: str, step: int, total: int, timing: Dict[str, float], **values: Optional[float]) -> str:
    """`prefix step 120/600  loss 2.314  ppl 10.12  14.20 steps/s  29082 tokens/s  ETA 0m34s`."""
    parts = [f"{prefix} step {step}/{total}"]
    parts += [f"{name} {value:.4g}" for name, value in values.items() if value is not None]
    parts.append(f"{timing['steps_per_sec']:.2f} steps/s")
    if timing.get("tokens_per_sec"):
        parts.append(f"{timing['tokens_per_sec']:.0f} tokens/s")
    parts.append(f"ETA {format_duration(timing['eta_sec'])}")
    return "  ".join(parts)


class Ticker:
    """The progress of one piece of work counted in units (steps, batches, documents) towards `total` (None: not
    known): `update(done)` after each unit or group of them. With --progress=lines a line every `period` seconds at
    most (0: at every update; `force` prints one now), the first one only once a period has passed; `line(done,
    timing)` makes it (default `NAME done/total UNIT  RATE UNIT/s  ETA`). With "bar", a tqdm
    bar; with "none", nothing."""

    def __init__(self, name: str, total: Optional[int] = None, unit: str = "steps", start: int = 0,
                 period: float = LONG_WORK_SECONDS,
                 line: Optional[Callable[[int, Dict[str, float]], str]] = None):
        self.name, self.total, self.unit, self.period = name, total, unit, period
        self.line = line or self._line
        self.rate = Rate(total or 0, 0, start)
        self.started = self.last_said = time.time()
        self.done, self.said = start, False
        self.bar = None
        if progress_mode() == "bar" and _state["enabled"]:
            from tqdm import tqdm  # a terminal bar only when asked for

            self.bar = tqdm(total=total, initial=start, desc=name, unit=f" {unit}", file=sys.stderr, leave=False,
                            dynamic_ncols=True)

    def _line(self, done: int, timing: Dict[str, float]) -> str:
        of = f"/{self.total}" if self.total else ""
        eta = f"  ETA {format_duration(timing['eta_sec'])}" if self.total else ""
        return f"{self.name} {done}{of} {self.unit}  {timing['steps_per_sec']:.2f} {self.unit}/s{eta}"

    def update(self, done: int, text: Optional[Callable[[], str]] = None, force: bool = False) -> None:
        """`done` units so far; `text()` makes the line where it is due (default: `line`)."""
        if self.bar is not None:
            self.bar.update(done - self.done)
        self.done = done
        if progress_mode() != "lines" or self.bar is not None:
            return
        now = time.time()
        if force or now - self.last_said >= self.period:
            say(text() if text is not None else self.line(done, self.rate.report(done)))
            self.last_said, self.said = now, True

    def close(self) -> None:
        """Clears the bar (the caller's own summary line follows)."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None
