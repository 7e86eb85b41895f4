"""What every verb shares: the flags object, the repository root, the Verb record, T5X-style gin (--gin_file,
--gin.NAME=VALUE, with bad bindings named), numeric bounds checked when flags are parsed, the corpus flags, the
distributed flags, and TensorFlow loaded quietly."""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import difflib
import math
import os
import re
import tempfile
import tokenize
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from absl import flags

from templm import config_search_paths, console, paths, remote
from templm.errors import ConfigError


FLAGS = flags.FLAGS


REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclasses.dataclass(frozen=True)
class Verb:
    name: str
    help: str
    define: Callable[[], None]  # defines the verb's flags on FLAGS
    main: Callable[[], Optional[int]]  # runs with FLAGS parsed
    takes_gin: bool = False
    tensorflow: bool = False  # it loads TensorFlow (through SeqIO or the record writers)
    gin_first: Optional[Callable[[], List[str]]] = None  # gin files parsed before --gin_file (a verb's defaults)


def define_gin_flags() -> None:
    flags.DEFINE_multi_string("gin_file", [], "gin config files, applied in order (T5X style).")
    flags.DEFINE_multi_string("gin_bindings", [], "gin bindings; `--gin.NAME=VALUE` is the short form.")
    flags.DEFINE_list("gin_search_paths", [], "Folders searched for --gin_file and gin `include`s.")


def rewrite_gin_args(argv: Sequence[str]) -> List[str]:
    """Turns T5X's `--gin.NAME=VALUE` into `--gin_bindings=NAME = VALUE`."""
    out = []
    for arg in argv:
        if arg.startswith("--gin."):
            name, sep, value = arg[len("--gin."):].partition("=")
            if not sep:
                raise ConfigError(f"{arg}: expected --gin.NAME=VALUE")
            out.append(f"--gin_bindings={name} = {value}")
        else:
            out.append(arg)
    return out


def parse_gin(files: Sequence[str], bindings: Sequence[str], search_paths: Sequence[str] = ()) -> None:
    """Applies gin files and bindings; a missing file or an unknown configurable is a ConfigError naming it."""
    import gin  # deferred: only verbs with configs pay for it

    paths = config_search_paths(search_paths)
    for path in paths:
        gin.add_config_file_search_path(path)
    resolved = []
    for name in files:
        found = next((os.path.join(p, name) for p in [""] + paths if os.path.isfile(os.path.join(p, name))), None)
        if found is None:
            raise ConfigError(f"{name}: gin file not found (searched {', '.join(paths)})")
        with open(found, "rb") as f:
            head = f.read()
        try:
            head.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ConfigError(f"{found}: not a gin file: byte {e.start} is not UTF-8 text (a gin file is text: "
                              "bindings such as `NAME = VALUE`)") from None
        resolved.append(found)
    try:
        with _package_reader_guarded(gin):
            gin.parse_config_files_and_bindings(resolved, list(bindings), finalize_config=False)
    except (ValueError, KeyError, SyntaxError, TypeError) as e:  # gin names the file/binding and line
        unquoted = _unquoted_string(bindings)
        if unquoted is not None:
            name, value = unquoted
            raise ConfigError(f"gin binding {name}={value}: {value} is not a gin value; a string needs quotes "
                              f"inside the flag: --gin.{name}=\"'{value}'\"") from None
        raise ConfigError(f"gin: {e}{_moved_hint(str(e))}") from None
    except OSError as e:  # an `include` of a file that is not there (gin names the including file)
        raise ConfigError(f"gin: {e}") from None
    except tokenize.TokenError as e:  # an unclosed bracket: the tokenizer gives up before gin can name the line
        raise ConfigError(f"gin: {e.args[0]} (an unclosed bracket or quote?) in the config files {resolved} or "
                          f"the bindings {list(bindings)}") from None
    _check_macros_are_used(bindings)


@contextlib.contextmanager
def _package_reader_guarded(gin: Any):
    """gin's second way of finding an `include` (a gin file inside an importable Python package) for the parse: one
    that says "not there" where a folder on sys.path is a namespace package of the include's first name. gin's own
    raised a TypeError there, so that `python -m templm.cli train --gin_file=temporal.gin` in a project with a
    `models/` (or `runs/`, `study/`) folder of its own could not include `models/t5_1_1_small.gin`. gin's readers
    are as they were after the parse."""
    readers = getattr(gin.config, "_FILE_READERS", None)
    if not isinstance(readers, list):
        yield
        return
    saved = list(readers)

    def guarded(check):
        def exists(path):
            try:
                return check(path)
            except TypeError:  # a namespace package has no file of its own (spec.origin is None)
                return False
        return exists

    readers[:] = [(read, guarded(check)) for read, check in saved]
    try:
        yield
    finally:
        readers[:] = saved


# The trainers' parameters that moved into T5X-shaped config objects (templm/training/configs.py), by the binding a
# config written before names: a run config that still binds one is told where it went.
MOVED_BINDINGS = {
    **{f"templm.train.{old}": new for old, new in (
        ("mixture_or_task_name", "train/templm.DatasetConfig.mixture_or_task_name"),
        ("task_feature_lengths", "train/templm.DatasetConfig.task_feature_lengths"),
        ("batch_size", "train/templm.DatasetConfig.batch_size"), ("data_seed", "train/templm.DatasetConfig.seed"),
        ("pack", "train/templm.DatasetConfig.pack"), ("data_shards", "train/templm.DatasetConfig.shards"),
        ("eval_split", "train_eval/templm.DatasetConfig.split"),
        ("eval_num_examples", "train_eval/templm.DatasetConfig.num_examples"),
        ("eval_batch_size", "train_eval/templm.DatasetConfig.batch_size"),
        ("eval_mixture_or_task_name", "train_eval/templm.DatasetConfig.mixture_or_task_name"),
        ("train_steps", "templm.train.total_steps"), ("seed", "templm.train.random_seed"),
        ("log_period", "templm.train.stats_period"), ("save_period", "templm.SaveCheckpointConfig.period"),
        ("keep_checkpoints", "templm.SaveCheckpointConfig.keep"),
        ("async_checkpoints", "templm.SaveCheckpointConfig.async_save"),
        ("final_input_state", "templm.SaveCheckpointConfig.input_state_at_end"),
        ("initial_checkpoint_path", "templm.RestoreCheckpointConfig.path"))},
    **{f"templm.train_lm.{old}": new for old, new in (
        ("corpus", "templm.CorpusConfig.corpus"), ("split_file", "templm.CorpusConfig.split_file"),
        ("split_dir", "templm.CorpusConfig.split_dir"), ("split", "templm.CorpusConfig.split"),
        ("spm_model", "templm.CorpusConfig.spm_model"), ("batch_size", "templm.CorpusConfig.batch_size"),
        ("data_order", "templm.CorpusConfig.data_order"), ("data_seed", "templm.CorpusConfig.seed"),
        ("corpus_format", "templm.CorpusConfig.corpus_format"), ("on_error", "templm.CorpusConfig.on_error"),
        ("allow_missing_ids", "templm.CorpusConfig.allow_missing_ids"),
        ("learning_rate", "templm.OptimizerConfig.learning_rate"),
        ("warmup_steps", "templm.OptimizerConfig.warmup_steps"), ("schedule", "templm.OptimizerConfig.schedule"),
        ("max_grad_norm", "templm.OptimizerConfig.max_grad_norm"), ("train_steps", "templm.train_lm.total_steps"),
        ("seed", "templm.train_lm.random_seed"), ("log_period", "templm.train_lm.stats_period"),
        ("save_period", "templm.SaveCheckpointConfig.period"),
        ("keep_checkpoints", "templm.SaveCheckpointConfig.keep"))},
    **{f"templm.stream_evaluation.{old}": f"templm.{kind}.{new or old}" for old, kind, new in (
        ("corpus", "StreamData", None), ("split_dir", "StreamData", None), ("test_split_file", "StreamData", None),
        ("train_split_file", "StreamData", None), ("validation_split_file", "StreamData", None),
        ("spm_model", "StreamData", None), ("corpus_format", "StreamData", None), ("batch_size", "StreamData", None),
        ("seg_len", "StreamData", None), ("mem_len", "StreamData", None),
        ("dynamic_on_control", "DynamicEvalConfig", "on_control"), ("ms_segments", "DynamicEvalConfig", None),
        ("train_count_documents", "StreamAnalyses", None), ("min_test_count", "StreamAnalyses", None),
        ("emerging_ratio", "StreamAnalyses", None), ("n_topics", "StreamAnalyses", None),
        ("topics", "StreamAnalyses", None), ("pos", "StreamAnalyses", None))},
    **{f"templm.run_calm.{name}": f"templm.{kind}.{name}" for kind, names in (
        ("CalmStreamConfig", ("corpus_dir", "world_dir", "world", "domains", "model_level", "switch_frequency",
                              "nswitches", "window_size", "batch_size", "segment_lengths")),
        ("CalmModelConfig", ("d_model", "n_head", "d_head", "d_inner", "n_layer", "mem_len")),
        ("OnlineLearnerConfig", ("rule", "lr", "which", "rms_decay", "rms_eps")),
        ("CalmBaselineConfig", ("pretrain_batches", "pretrain_passes", "pretrain_lr"))) for name in names},
}
_NO_PARAMETER = re.compile(r"Configurable '([\w.]+)' doesn't have a parameter named '(\w+)'")


def _moved_hint(message: str) -> str:
    """Where a binding that gin does not know went, when it is one of MOVED_BINDINGS."""
    match = _NO_PARAMETER.search(message)
    moved = MOVED_BINDINGS.get(f"{match.group(1)}.{match.group(2)}") if match else None
    return f"\n  (that setting moved: bind {moved} instead; docs/training.md, \"Configs\")" if moved else ""


_MACRO_BINDING = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*=")


_BINDING = re.compile(r"^\s*([A-Za-z_][\w./]*)\s*=\s*(.*?)\s*$", re.S)


def _unquoted_string(bindings: Sequence[str]) -> Optional[Tuple[str, str]]:
    """(name, value) of the first binding whose value reads as a string written without quotes (`MODEL_DIR=runs/y`:
    gin takes runs/y for an expression), or None. Gin's own values pass: literals, references (@f(), %MACRO) and
    containers."""
    for binding in bindings:
        m = _BINDING.match(binding)
        if not m or not m.group(2):
            continue
        value = m.group(2)
        if value[0] in "'\"@%([{" or value in ("True", "False", "None"):
            continue
        try:
            ast.literal_eval(value)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return m.group(1), value
    return None


def _check_macros_are_used(bindings: Sequence[str]) -> None:
    """A macro bound on the command line (`--gin.TRAIN_STEP=3`) that no config uses would be silently ignored: it is a
    ConfigError naming it, with the closest macro the configs do use."""
    from gin import config as gin_config

    bound = [m.group(1) for m in map(_MACRO_BINDING.match, bindings) if m]
    if not bound:
        return
    used, defined = set(), set()

    def walk(value):
        if isinstance(value, gin_config.ConfigurableReference):
            text = repr(value)
            if text.startswith("%"):
                used.add(text[1:])
        elif isinstance(value, (list, tuple, set)):
            for item in value:
                walk(item)
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)

    for (scope, selector), parameters in gin_config._CONFIG.items():  # gin keeps no public index of references
        if selector == "gin.macro":
            defined.add(scope)
        for value in parameters.values():
            walk(value)
    for name in bound:
        if name not in used:
            near = difflib.get_close_matches(name, sorted(used | (defined - set(bound))), n=1)
            hint = f" (did you mean {near[0]}?)" if near else ""
            raise ConfigError(f"gin macro {name} is bound on the command line but no config uses it{hint}")


def bounds(**ranges: Tuple[Optional[float], Optional[float]]) -> None:
    """Checks numeric flags when absl parses them (before any work): each name maps to its (least, most) value, None
    for no bound; a float flag must also be finite. The message names the flag and the range."""
    for name, (least, most) in ranges.items():
        if least is not None and most is not None:
            what = f"from {least:g} to {most:g}"
        else:
            what = f"at least {least:g}" if least is not None else f"at most {most:g}"
        if isinstance(FLAGS[name].default, float):
            what = f"a finite number {what}"

        def ok(value, least=least, most=most):
            return value is None or (math.isfinite(value) and (least is None or value >= least)
                                     and (most is None or value <= most))

        flags.register_validator(name, ok, message=f"--{name} must be {what}")


def define_overwrite(into: bool = False):
    """--overwrite: a verb that builds --out whole replaces it (what is in it is deleted); one that writes into it as
    it goes (`into`) writes beside what is there."""
    flags.DEFINE_boolean("overwrite", False, (
        "Write into --out even when it is not empty and not a templm output of this kind (its files of the same "
        "names are replaced, the others kept)" if into else "Replace --out even when it is not empty and not a "
        "templm output of this kind (what is in it is deleted)") + "; without it such a folder is refused.")


CORPUS_HELP = ("Corpus file (.gz and .bz2 are read transparently); repeat it, or give a quoted glob pattern "
               "('news-docs.20*.en.filtered.gz'), for a corpus of several files (the format is detected per file).")


def define_corpus_flags(split: bool = True):
    flags.DEFINE_multi_string("corpus", None, CORPUS_HELP, required=True)
    flags.DEFINE_enum("format", "auto", ["auto", "jsonl", "wmt", "arxiv", "csv", "tsv", "text"],
                      "Corpus format (auto: from the name and the first line; docs/data.md).")
    flags.DEFINE_enum("on_error", "raise", ["raise", "skip"], "On a bad line: stop, or skip and count it.")
    if split:
        flags.DEFINE_string("split_dir", None, "Apply a split file from this folder (published or `templm data "
                            "splits` output) to the corpus by document id.")
        flags.DEFINE_string("split", "time_stratified_train", "Which split of --split_dir: the file stem, e.g. "
                            "control_train, test, yearly/2014_train.")


def corpus_value(value):
    """A repeatable corpus flag as the library takes it: one entry as a str, several as their list (each may be a
    glob pattern), none as None."""
    if not value or isinstance(value, str):
        return value or None
    return value[0] if len(value) == 1 else list(value)


def corpus_flag():
    return corpus_value(FLAGS.corpus)


def corpus_documents():
    """The documents of --corpus, or of its --split; returns (iterable, report) where report() -> dict."""
    from templm.data.lm_data import split_path
    from templm.data.readers import read_documents
    from templm.data.splits import apply_split

    if FLAGS.split_dir:
        path = split_path(None, FLAGS.split_dir, FLAGS.split)
        docs, report = apply_split(corpus_flag(), path, FLAGS.format, FLAGS.on_error)
        return docs, report.as_dict
    reader = read_documents(corpus_flag(), FLAGS.format, FLAGS.on_error)
    return reader, lambda: {"read": reader.read, "skipped": reader.skipped}


def writable_folder(folder: str, what: str) -> None:
    """Checks that `folder` can be made and written in, so a bad output path fails before the work (ConfigError
    naming it), without making it: a run that then fails (a bad binding found when the model is built) leaves no
    empty folder behind; the verb makes it when it writes its result. A URL (gs://) is checked by a probe
    object (templm.remote.check_location)."""
    if paths.is_url(folder):
        remote.check_location(folder, what)
        return
    existing = os.path.abspath(folder)
    while not os.path.lexists(existing) and os.path.dirname(existing) != existing:
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise ConfigError(f"{what} {folder}: {existing} is a file; expected a folder")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as e:
        raise ConfigError(f"{what} {folder}: cannot write there: {e.strerror or e}") from None


# The paths each verb reads or writes at a URL (gs://, or another scheme of TensorFlow's file system) so far: flags by
# their name, gin macros and environment variables by theirs. Any other path given as a URL is refused before any work
# (`refuse_unserved_urls`), so that no verb ever makes a local folder named after a URL.
TASK_VARIABLES = ("TEMPLM_DATA_DIR", "TEMPLM_VOCABULARY", "TEMPLM_CRONQUESTIONS_DIR")  # the tasks read them
URL_SERVED: Dict[str, frozenset] = {
    "train": frozenset({"MODEL_DIR", "INITIAL_CHECKPOINT_PATH", *TASK_VARIABLES}),
    "eval": frozenset({"MODEL_DIR", "--out", *TASK_VARIABLES}),
    "infer": frozenset({"MODEL_DIR", "--input", "--output", *TASK_VARIABLES}),
    "plan": frozenset({"MODEL_DIR"}),
    "data world": frozenset({"--out"}),
    "data stats": frozenset({"--corpus", "--split_dir"}),
    "data splits": frozenset({"--corpus", "--out"}),
    "data spm": frozenset({"--corpus", "--split_dir", "--out"}),
    "data streams": frozenset({"--corpus", "--split_dir", "--spm_model", "--out"}),
    "data tasks": frozenset({"--corpus", "--templama_dir", "--out"}),
    "data templama": frozenset({"--dump", "--out"}),
    "data cronquestions": frozenset({"--release", "--out"}),
    "is-eval": frozenset({"--out", "--world_dir"}),
    "reproduce": frozenset({"--out", "--corpus", "--templama_dir", "--split_dir", "--task_data", "--stream_corpus",
                            "--calibration"}),
    "train-lm": frozenset({"MODEL_DIR", "CORPUS", "SPLIT_DIR", "SPM_MODEL", "TOKEN_STREAMS"}),
    "stream": frozenset({"OUT_DIR", "TIME_STRATIFIED_DIR", "CONTROL_DIR"}),
    "appendices": frozenset({"--out", "--corpus"}),
    "data calm": frozenset({"--world_dir", "--texts", "--out"}),
    "calm": frozenset({"OUT_DIR"}),
}
PATH_FLAGS = ("out", "output", "input", "corpus", "stream_corpus", "world_dir", "templama_dir", "split_dir", "texts",
              "task_data", "release", "dump", "calibration", "spm_model")
PATH_MACROS = ("MODEL_DIR", "INITIAL_CHECKPOINT_PATH", "OUT_DIR", "SPLIT_DIR", "TIME_STRATIFIED_DIR", "CONTROL_DIR",
               "CRONQUESTIONS_DIR", "CORPUS", "SPM_MODEL", "TOKEN_STREAMS")
PATH_VARIABLES = {"data_dir": "TEMPLM_DATA_DIR", "vocabulary": "TEMPLM_VOCABULARY",
                  "cronquestions_dir": "TEMPLM_CRONQUESTIONS_DIR", "cache_dir": "TEMPLM_CACHE"}


def given_urls() -> List[Tuple[str, str]]:
    """(name, value) of every path of this call given as a URL: flags, the gin macros that name paths, and the
    environment's settings."""
    import gin

    found = []
    for flag in PATH_FLAGS:
        if flag in FLAGS:
            value = FLAGS[flag].value
            for entry in ([value] if isinstance(value, str) else value or []):
                if paths.is_url(entry):
                    found.append((f"--{flag}", entry))
    for macro in PATH_MACROS:
        try:
            value = gin.query_parameter(f"%{macro}")
        except (ValueError, KeyError):
            continue
        if isinstance(value, str) and paths.is_url(value):
            found.append((macro, value))
    settings = STATE.get("settings")
    for field, variable in PATH_VARIABLES.items():
        value = getattr(settings, field, None)
        if isinstance(value, str) and paths.is_url(value):
            found.append((variable, value))
    return found


def refuse_unserved_urls(verb: str) -> None:
    """ConfigError, before any work, for a path given as a URL that `verb` does not serve yet (URL_SERVED)."""
    served = URL_SERVED.get(verb, frozenset())
    for name, value in given_urls():
        if name not in served:
            can = ", ".join(sorted(served)) or "none of its paths"
            raise ConfigError(f"{name} {value}: `templm {verb}` does not read or write URLs there yet (at a URL it "
                              f"takes {can}); nothing was done: use a local path, and copy to or from the bucket "
                              "with `gcloud storage cp -r`")


def configure_tasks():
    """Registers the tasks again now that the configs are parsed: `templm.tasks.configure.*` bindings apply (at
    `import templm.tasks` they were not parsed yet), over the settings this call read from the environment."""
    from templm import tasks

    data_dir = STATE["settings"].data_dir
    if data_dir and paths.is_url(data_dir):
        remote.check_location(data_dir, "TEMPLM_DATA_DIR", write=False)
    tasks.configure(settings=STATE["settings"])


def define_distributed():
    flags.DEFINE_string("coordinator_address", None, "Multi-host: host:port of process 0 for jax.distributed.")
    flags.DEFINE_integer("num_processes", None, "Multi-host: number of processes.")
    flags.DEFINE_integer("process_id", None, "Multi-host: this process's index.")


def join_processes():
    """Multi-host: joins the run's processes (--coordinator_address ...); only process 0 prints progress."""
    import jax

    from templm.training.partitioning import initialize_distributed

    initialize_distributed(FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id)
    console.set_enabled(jax.process_index() == 0)


STATE: Dict[str, Any] = {"verbosity": 0}  # the run's --verbosity, for a verb that loads TensorFlow only sometimes


def load_tensorflow(quiet: bool) -> None:
    """Loads TensorFlow for a verb that uses it (for tf.data and record files only) and hides the GPUs from it, as
    T5X does, so that it never takes accelerator memory from JAX. TensorFlow's native libraries write start-up and
    CUDA-probe lines straight to the process's standard error, before any log setting applies; when `quiet`, that
    descriptor points at /dev/null while it loads and looks for devices."""
    with console.silenced_stderr() if quiet else contextlib.nullcontext():
        import tensorflow as tf

        tf.config.set_visible_devices([], "GPU")


def bound_value(selector: str) -> Any:
    """What gin binds to `selector` ("templm.run_calm.out_dir"), a macro's value followed (`%OUT_DIR`); None where it
    binds nothing."""
    import gin

    try:
        value = gin.query_parameter(selector)
    except ValueError:
        return None
    scoped = getattr(value, "scoped_selector", "")
    if isinstance(scoped, str) and scoped.endswith("/gin.macro"):
        try:
            return gin.query_parameter("%" + scoped.split("/")[0])
        except ValueError:
            return None
    return value
