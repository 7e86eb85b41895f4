"""The environment templm reads, in one place: `Settings.from_environment()` reads every `TEMPLM_*` variable once,
checks it and names the variable of a bad value; callers pass the object down (the command line reads it once per
call of `templm.cli.main` and hands it to `templm.tasks.configure`), so nothing below reads `os.environ` itself.

| variable | setting | what it does |
|---|---|---|
| TEMPLM_DATA_DIR | data_dir | the task data the SeqIO tasks read (`templm data tasks --out`) |
| TEMPLM_VOCABULARY | vocabulary | a SentencePiece model replacing the task data's own (e.g. T5's public one) |
| TEMPLM_EXTRA_IDS | extra_ids | the sentinels seqio appends to it (100, or 0 for a file that holds its own) |
| TEMPLM_TRAIN_YEARS | train_years | the years the training splits hold ("2010-2018" or "2010,2012") |
| TEMPLM_CRONQUESTIONS_DIR | cronquestions_dir | CronQuestions records (`templm data cronquestions --out`) |
| TEMPLM_CACHE | cache_dir | templm's cache: the embedded world's task data, compiled steps, langid's unpacked model |
"""

from __future__ import annotations

import dataclasses
import os
from typing import List, Mapping, Optional, Tuple

from templm.errors import ConfigError

VARIABLES = {"data_dir": "TEMPLM_DATA_DIR", "vocabulary": "TEMPLM_VOCABULARY", "extra_ids": "TEMPLM_EXTRA_IDS",
             "train_years": "TEMPLM_TRAIN_YEARS", "cronquestions_dir": "TEMPLM_CRONQUESTIONS_DIR",
             "cache_dir": "TEMPLM_CACHE"}


def parse_years(text, where: str = "years") -> List[int]:
    """Years written as "2010-2018", "2010,2012" or a mix ("2010-2012,2015")."""
    years = []
    try:
        for part in str(text).split(","):
            first, _, last = part.strip().partition("-")
            years += list(range(int(first), int(last or first) + 1))
    except ValueError:
        raise ValueError(f"{where}: expected years such as 2010-2018 or 2010,2012, got {text!r}") from None
    return years


def default_cache_dir() -> str:
    return os.path.join(os.path.expanduser("~"), ".cache", "templm")


@dataclasses.dataclass(frozen=True)
class Settings:
    """What the environment configures (module docstring); None where it says nothing."""

    data_dir: Optional[str] = None
    vocabulary: Optional[str] = None
    extra_ids: Optional[int] = None
    train_years: Optional[Tuple[int, ...]] = None
    cronquestions_dir: Optional[str] = None
    cache_dir: str = dataclasses.field(default_factory=default_cache_dir)

    @classmethod
    def from_environment(cls, environ: Optional[Mapping[str, str]] = None) -> "Settings":
        """The settings of `environ` (default os.environ); an empty variable is unset. A ConfigError names the
        variable of a value that cannot be read."""
        environ = os.environ if environ is None else environ
        raw = {name: environ.get(variable) or None for name, variable in VARIABLES.items()}
        extra_ids = None
        if raw["extra_ids"] is not None:
            try:
                extra_ids = int(raw["extra_ids"])
            except ValueError:
                raise ConfigError(f"TEMPLM_EXTRA_IDS: expected a number of sentinels such as 100 or 0, got "
                                  f"{raw['extra_ids']!r}") from None
            if extra_ids < 0:
                raise ConfigError(f"TEMPLM_EXTRA_IDS: expected a number of sentinels such as 100 or 0, got "
                                  f"{raw['extra_ids']!r}")
        train_years = None
        if raw["train_years"] is not None:
            try:
                train_years = tuple(parse_years(raw["train_years"], "TEMPLM_TRAIN_YEARS"))
            except ValueError as e:
                raise ConfigError(str(e)) from None
        return cls(data_dir=raw["data_dir"], vocabulary=raw["vocabulary"], extra_ids=extra_ids,
                   train_years=train_years, cronquestions_dir=raw["cronquestions_dir"],
                   cache_dir=raw["cache_dir"] or default_cache_dir())
