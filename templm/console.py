"""What a run prints for people: templm's own progress lines, warnings and summaries.

Progress and warnings go to standard error, so that standard output holds only a verb's result (JSON lines that
scripts read); library logs (absl, orbax, clu, TensorFlow) stay off unless the command line asks for them
(`--verbosity=1`). In a multi-process run only process 0 speaks (`set_enabled`).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from typing import Dict, Iterator, Optional

from templm.io import format_duration

_state = {"enabled": True}


def set_enabled(enabled: bool) -> None:
    _state["enabled"] = bool(enabled)


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
    sys.stderr is flushed first, so nothing of ours written before is lost."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


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
