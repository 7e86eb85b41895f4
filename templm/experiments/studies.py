"""The study's sizes, as gin: `gin_configs/study/<name>.gin` binds `templm.Study` (a `Preset`: the time-aware half)
and `templm.StreamStudy` (a `StreamPreset`: the streaming half). Those files are the one definition of every study:

  * `templm reproduce --preset NAME` has gin parse study/NAME.gin first, then any `--gin_file` and `--gin.Study.x=...`
    binding on top (`study_from_gin` builds the study from what gin holds), so a study of any size is a gin file
    (study/paper.gin is the papers' settings);
  * `load_study(NAME)` reads the same file without touching gin's global configuration, for the library and the
    tests (`reproduce("smoke", ...)`, `PRESETS`). `read_study_file` takes the subset of gin these files are written
    in: `templm.Study.FIELD = <Python literal>` (a statement may span lines inside brackets), `include '...'`,
    comments. A test checks that gin and it read every study file alike.
"""

from __future__ import annotations

import ast
import dataclasses
import datetime
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from templm import CONFIG_DIR, config_search_paths
from templm.data.world import BURST_NAMES, SHARES as WORLD_SHARES, WorldConfig
from templm.errors import ConfigError, field_kinds, require_field_types, require_numbers

GIN_DIR = CONFIG_DIR  # the package's gin configs (templm/gin_configs, shipped in the wheel)
STUDY_DIR = os.path.join(GIN_DIR, "study")

# Dhingra et al. probe the future from the year after training (2018) to 2029 (Figures 3 and 4): 11 years.
PAPER_HORIZON = 11


# Numeric fields of a study that must be at least 1 (the others at least 0).
_AT_LEAST_ONE = frozenset({"vocab_size", "steps", "yearly_steps", "adapt_steps", "retrain_steps", "adapt_eval_points",
                           "retrain_eval_points", "inputs_length", "targets_length", "batch_size", "eval_batch_size",
                           "max_gap", "calibration_years", "docs_per_month", "subjects_per_relation",
                           "test_docs_per_month", "train_steps", "test_months", "min_test_count", "n_topics",
                           "train_count_documents", "ms_segments", "pad_vocab_to", "trainings_at_once",
                           "change_news_weight"})
# Numeric fields that are shares, from 0 to 1: the world's settings a half binds, and the study's own.
_SHARES = frozenset({"heldout_fraction", "dropout_rate", *WORLD_SHARES})


def _check_numbers(kind: str, study: Any) -> None:
    """Every int and float field of a study (by its annotation) a number of its kind in range (a share from 0 to 1),
    named as the gin binding templm.KIND.FIELD, before any work (a study of 20.5 steps is refused, not rounded)."""
    checks, optional = {}, []
    for field, number, may_be_none in field_kinds(type(study)):
        if number not in (int, float):
            continue
        if may_be_none:
            optional.append(field)
        checks[field] = (getattr(study, field), number, 1 if field in _AT_LEAST_ONE else 0, None,
                         1 if field in _SHARES else None)
    require_numbers(f"templm.{kind}", checks, optional=tuple(optional))


# A starting model's objective (Study.pretrain_objective) -> the task it trains on: the seen years' news, no year prefix.
PRETRAIN_TASKS = {"salient_spans": "customnews_ssm_uniform", "random_spans": "customnews_random_spans"}


@dataclasses.dataclass(frozen=True)
class Preset:
    """Everything the time-aware half's size depends on (gin: templm.Study)."""

    name: str
    start_year: int  # the embedded world's years (a user's data brings its own)
    end_year: int
    future_years: int  # the last N years are never trained on (but the adaptation's new year is the first of them)
    subjects_per_relation: int
    docs_per_month: int
    vocab_size: int
    steps: int  # Uniform and Temporal
    yearly_steps: int  # each Yearly expert
    adapt_steps: int  # each alpha's fine-tuning
    retrain_steps: int  # each regime (Uniform, Temporal) retrained from scratch on every year up to the new one
    alphas: Tuple[float, ...]
    adapt_eval_points: int = 1  # evaluations during each fine-tuning (the adaptation curve)
    retrain_eval_points: int = 1
    model: Tuple[Tuple[str, Any], ...] = ()  # T5Config changes on top of T5 v1.1 `base_model` (a dict in gin)
    inputs_length: int = 64
    targets_length: int = 16
    batch_size: int = 32
    learning_rate: float = 0.01
    eval_batch_size: int = 32
    max_gap: int = PAPER_HORIZON  # degradation: years past the last seen year
    calibration_years: int = PAPER_HORIZON  # calibration: future years probed, from the first year after the seen ones
    heldout_fraction: float = 0.1
    estimated_steps_per_s: float = 8.0  # for the ETA before the first measurement (2 CPU cores, tiny model)
    base_model: str = "tiny"  # a T5_1_1_CONFIGS name
    dropout_rate: float = 0.0
    initial_checkpoint: Optional[str] = None  # a templm or Hugging Face T5 folder every model starts from
    # Steps of a starting model trained first on the seen years' news (salient-span masking, no year prefix, no
    # TempLAMA), from `initial_checkpoint` if any; every model of the study then starts from it, as the paper's all
    # start from the public T5-CBQA checkpoint (SSM on text of every year up to its snapshot). 0: no such model.
    pretrain_steps: int = 0
    # Its objective: "salient_spans" (the paper's SSM, the news's masked entities and dates) or "random_spans" (T5's
    # own span corruption of the same sentences, which teaches the language with fewer of the facts).
    pretrain_objective: str = "salient_spans"
    # True: it reads only the last seen year's news, the world as it stands at the end of the seen years (as T5-CBQA
    # knows the facts of its Wikipedia snapshot, not of each year before it); False: every seen year's.
    pretrain_snapshot: bool = False
    # The input pipelines each training's global batch is drawn from (train/templm.DatasetConfig.shards): 0, one per process.
    # The batches depend on it, not on the number of processes: any process count that divides it trains alike.
    data_shards: int = 0
    # Models of one stage trained at the same time, each in a thread of this process (the Uniform and Temporal models,
    # the Yearly experts, adaptation's retrained models and fine-tunes, the streaming half's Transformer-XLs): the
    # tiny steps of the CPU presets leave the cores idle between kernels, and two trainings fill them (BENCHMARKS.md,
    # "More work per compiled call"). Each model's parameters are those of its training alone; a run of several
    # processes trains one at a time.
    trainings_at_once: int = 1
    # The time-aware world's short-lived news (WorldConfig's fields of the same names): named events a year, and the
    # share of the background sentences about one while it is in the news.
    bursts_per_year: int = 2
    burst_background_share: float = 0.0
    later_year_share: float = 0.0  # the world's year phrases that name a later year (WorldConfig's field)
    change_news_weight: float = 8.0  # how much more often a fact is told in its first days than later (WorldConfig's)

    def __post_init__(self):
        require_field_types(self, "templm.Study")
        _check_numbers("Study", self)
        if self.pretrain_objective not in PRETRAIN_TASKS:
            raise ConfigError(f"templm.Study.pretrain_objective must be one of {', '.join(map(repr, PRETRAIN_TASKS))}, "
                             f"got {self.pretrain_objective!r}")
        if isinstance(self.model, Mapping):  # gin writes the changes as a dict; kept as pairs (hashable)
            object.__setattr__(self, "model", tuple(self.model.items()))
        object.__setattr__(self, "model", tuple(tuple(pair) for pair in self.model))
        object.__setattr__(self, "alphas", tuple(self.alphas))


@dataclasses.dataclass(frozen=True)
class StreamPreset:
    """Sizes of the streaming half (gin: templm.StreamStudy). The world spans start_year..end_year; TIME-STRATIFIED
    ends at `cutoff`, then 3 validation months and `test_months` test months of `test_docs_per_month` documents
    each."""

    docs_per_month: int
    subjects_per_relation: int
    test_docs_per_month: int
    vocab_size: int
    model: Dict[str, Any]
    train_steps: int
    batch_size: int
    learning_rate: float
    dynamic: Sequence[Mapping[str, Any]]
    start_year: int = 2010
    end_year: int = 2020
    cutoff: datetime.date = datetime.date(2017, 12, 31)
    test_months: int = 24
    min_test_count: int = 50
    n_topics: int = 10
    train_count_documents: Optional[int] = None
    ms_segments: int = 64
    pad_vocab_to: int = 1  # the model's vocabulary rounded up to a multiple of this (a model axis must divide it)
    warmup_steps: Optional[int] = None  # the learning rate's linear warm-up (None: min(100, train_steps // 10))
    # The streaming world's novel words (WorldConfig's fields of the same names): the share of entities that appear
    # only from a date after the first year, and of the sentences that are not background, the share about a named
    # event while it is in the news (each event's name is a word never seen before it broke).
    emerging_share: float = 0.25
    burst_sentence_share: float = 0.2
    rising_share: float = 0.0  # of the background sentences, names in passing before their entity emerges
    burst_names: str = "coined"  # an event's name: a word never seen before ('coined') or a place's ('places')
    given_names: int = 0  # persons' given names from a stock of this many (0: each person's a word of its own)
    # A larger TIME-STRATIFIED model for Mind the Gap's model-size comparison (section 4): keys of `model` with
    # other values, trained like the others and scored against the same CONTROL model; None: no such model.
    larger_model: Optional[Dict[str, Any]] = None

    @property
    def warmup(self) -> int:
        return min(100, self.train_steps // 10) if self.warmup_steps is None else int(self.warmup_steps)

    @property
    def model_vocab_size(self) -> int:
        """The Transformer-XL's vocabulary: the SentencePiece pieces (vocab_size) rounded up to pad_vocab_to; the
        rows past the pieces are never a target."""
        return -(-self.vocab_size // self.pad_vocab_to) * self.pad_vocab_to

    def __post_init__(self):
        _check_numbers("StreamStudy", self)
        if isinstance(self.cutoff, str):  # gin writes the date as 'YYYY-MM-DD'
            try:
                object.__setattr__(self, "cutoff", datetime.date.fromisoformat(self.cutoff))
            except ValueError:
                raise ConfigError(f"StreamStudy.cutoff: expected a date 'YYYY-MM-DD', got {self.cutoff!r}") from None
        if self.burst_names not in BURST_NAMES:
            raise ConfigError(f"templm.StreamStudy.burst_names: expected one of {', '.join(map(repr, BURST_NAMES))}, "
                              f"got {self.burst_names!r}")
        object.__setattr__(self, "model", dict(self.model))
        object.__setattr__(self, "dynamic", tuple(dict(v) for v in self.dynamic))
        if self.larger_model is not None:
            larger = dict(self.larger_model)
            unknown = sorted(set(larger) - set(self.model))
            if not larger or unknown:
                raise ConfigError("templm.StreamStudy.larger_model: give the sizes of `model` that the larger model "
                                  "changes, as {'n_layer': 4}" + (f"; not keys of model: {', '.join(unknown)}"
                                                                  if unknown else ""))
            object.__setattr__(self, "larger_model", larger)

    @property
    def larger_model_config(self) -> Optional[Dict[str, Any]]:
        """The larger TIME-STRATIFIED model's sizes: `model` with `larger_model` on top (None without one)."""
        return None if self.larger_model is None else {**self.model, **self.larger_model}


def world_config(preset: Union["Preset", "StreamPreset"], seed: int) -> WorldConfig:
    """The embedded world one half of a study draws, from `seed`: each field of the half's preset named as a
    WorldConfig field is that setting (its years, entity pools, news volume and the mechanisms it binds); the others
    keep WorldConfig's defaults."""
    return WorldConfig(seed=seed, **{name: getattr(preset, name) for name in _WORLD_FIELDS if hasattr(preset, name)})


_WORLD_FIELDS = tuple(field.name for field in dataclasses.fields(WorldConfig) if field.name != "seed")


@dataclasses.dataclass(frozen=True)
class Study:
    preset: Preset
    stream: StreamPreset


CONFIGURABLES = {"Study": Preset, "StreamStudy": StreamPreset}


def study_names() -> List[str]:
    """The studies of gin_configs/study/, by name."""
    if not os.path.isdir(STUDY_DIR):
        return []
    return sorted(f[:-len(".gin")] for f in os.listdir(STUDY_DIR) if f.endswith(".gin"))


def study_file(name_or_path: str) -> str:
    """The gin file of a study: a name in gin_configs/study/, or a path."""
    if os.path.sep not in name_or_path and not name_or_path.endswith(".gin"):
        path = os.path.join(STUDY_DIR, f"{name_or_path}.gin")
        if not os.path.isfile(path):
            raise ConfigError(f"unknown study {name_or_path!r}: expected one of {', '.join(study_names())} (the files "
                              f"of {STUDY_DIR}) or a gin file")
        return path
    if not os.path.isfile(name_or_path):
        raise ConfigError(f"{name_or_path}: no such study gin file")
    return name_or_path


def _statements(path: str) -> List[Tuple[int, str]]:
    """(line number, text) of each statement of a gin file: comments dropped, a statement continued over the lines
    its brackets span."""
    out, pending, start, depth = [], "", 0, 0
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            code, quote = [], None
            for ch in line.rstrip("\n"):
                if quote:
                    quote = None if ch == quote else quote
                elif ch in "'\"":
                    quote = ch
                elif ch == "#":
                    break
                elif ch in "([{":
                    depth += 1
                elif ch in ")]}":
                    depth -= 1
                code.append(ch)
            text = "".join(code).strip()
            if not text and not pending:
                continue
            if not pending:
                start = number
            pending = f"{pending} {text}".strip()
            if depth <= 0:
                out.append((start, pending))
                pending, depth = "", 0
    if pending:
        raise ConfigError(f"{path}:{start}: an unclosed bracket")
    return out


def read_study_file(path: str, _seen: Tuple[str, ...] = ()) -> Dict[str, Dict[str, Any]]:
    """{"Study": {field: value}, "StreamStudy": {field: value}} that a study gin file (and what it includes) binds,
    later bindings over earlier ones, as gin applies them."""
    path = os.path.abspath(path)
    if path in _seen:
        raise ConfigError(f"{path}: includes itself")
    bound: Dict[str, Dict[str, Any]] = {name: {} for name in CONFIGURABLES}
    for number, text in _statements(path):
        where = f"{path}:{number}"
        if text.startswith("include "):
            target = ast.literal_eval(text[len("include "):].strip())
            for folder in config_search_paths([os.path.dirname(path)]):
                if os.path.isfile(os.path.join(folder, target)):
                    break
            else:
                raise ConfigError(f"{where}: included file {target!r} not found")
            for name, values in read_study_file(os.path.join(folder, target), _seen + (path,)).items():
                bound[name].update(values)
            continue
        selector, sep, value = text.partition("=")
        parts = selector.strip().split(".")
        if not sep or len(parts) != 3 or parts[0] != "templm" or parts[1] not in CONFIGURABLES:
            raise ConfigError(f"{where}: a study file binds templm.Study.FIELD or templm.StreamStudy.FIELD, got "
                              f"{text[:60]!r}")
        try:
            bound[parts[1]][parts[2]] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            raise ConfigError(f"{where}: {parts[1]}.{parts[2]}: not a literal value: {value.strip()[:60]!r}") from None
    return bound


def _build(kind: str, values: Mapping[str, Any], where: str) -> Any:
    cls = CONFIGURABLES[kind]
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - fields)
    if unknown:
        raise ConfigError(f"{where}: {kind} has no field {unknown[0]!r} (its fields: {', '.join(sorted(fields))})")
    try:
        return cls(**values)
    except TypeError as e:  # a field without a value
        raise ConfigError(f"{where}: {kind}: {e}") from None


def load_study(name_or_path: str, bindings: Optional[Mapping[str, Mapping[str, Any]]] = None) -> Study:
    """The study a gin file defines (a name in gin_configs/study/ or a path), with `bindings` ({"Study": {field:
    value}, ...}) on top."""
    path = study_file(name_or_path)
    bound = read_study_file(path)
    for kind, values in (bindings or {}).items():
        bound[kind].update(values)
    return Study(_build("Study", bound["Study"], path), _build("StreamStudy", bound["StreamStudy"], path))


def study_from_gin() -> Study:
    """The study gin holds now (after `templm reproduce` parsed its files and bindings)."""
    import gin

    register_gin()
    values = {kind: dict(gin.get_bindings(f"templm.{kind}")) for kind in CONFIGURABLES}
    return Study(_build("Study", values["Study"], "the gin configuration"),
                 _build("StreamStudy", values["StreamStudy"], "the gin configuration"))


_REGISTERED: Dict[str, Any] = {}


def register_gin() -> None:
    """Makes templm.Study and templm.StreamStudy known to gin (before it parses a study file)."""
    import gin

    for kind, cls in CONFIGURABLES.items():
        if kind not in _REGISTERED:
            _REGISTERED[kind] = gin.external_configurable(cls, name=kind, module="templm")
