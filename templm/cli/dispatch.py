"""The verbs' table and the dispatch: which verb runs, its flags, logging, and the exit status of every failure."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
import threading
import warnings
from typing import Dict, Iterator, List, Optional, Sequence, TextIO, Tuple

from absl import flags, logging

from templm import console
from templm.cli import data_verbs, model_verbs, options, study_verbs
from templm.cli.options import (FLAGS, STATE, Verb, define_gin_flags, load_tensorflow, parse_gin, refuse_unserved_urls,
                                rewrite_gin_args)
from templm.settings import Settings
from templm.errors import (EXIT_BAD_INPUT, EXIT_INTERRUPTED, EXIT_PREEMPTED, EXIT_SYSTEM, EXIT_TRAINING, EXIT_USAGE,
                           SYSTEM_ERRNOS, ConfigError, Preempted, Terminated, TrainingError, check_interrupted,
                           note_sigint, note_sigterm, reset_signal_notes, signal_after_result,
                           signal_during_commit)


VERBS: Dict[str, Verb] = {v.name: v for v in [
    Verb("data world", "Generate the embedded temporal world: news, TempLAMA queries, calibration queries, facts.",
         data_verbs.define_data_world, data_verbs.main_data_world, takes_gin=True),
    Verb("data stats", "Read a corpus (JSONL, WMT news-docs, arXiv OAI) and print documents and words per year.",
         data_verbs.define_data_stats, data_verbs.main_data_stats),
    Verb("data splits", "TIME-STRATIFIED / CONTROL splits (Mind the Gap) and yearly buckets of a corpus.",
         data_verbs.define_data_splits, data_verbs.main_data_splits),
    Verb("data spm", "Train a SentencePiece vocabulary on a corpus or one of its splits.",
         data_verbs.define_data_spm, data_verbs.main_data_spm),
    Verb("data streams", "Tokenise a language model's training splits once, as token streams by month that "
         "train-lm reads instead of the corpus (on Beam with --runner).", data_verbs.define_data_streams,
         data_verbs.main_data_streams, tensorflow=True),
    Verb("data templama", "Build TempLAMA from a Wikidata JSON dump (nine relations, any years).",
         data_verbs.define_data_templama, data_verbs.main_data_templama),
    Verb("data cronquestions", "Convert a CronQuestions release (its pickles read as plain data only) into the "
         "record files of the `cronquestions` SeqIO task.", data_verbs.define_data_cronquestions,
         data_verbs.main_data_cronquestions, tensorflow=True),
    Verb("train", "Train a T5 model from gin configs (T5X style), sharded over the device mesh, resumable.",
         model_verbs.define_train, model_verbs.main_train, takes_gin=True, tensorflow=True),
    Verb("plan", "Per-device memory of a T5 training config on a mesh (parameters, optimizer, compiled step) and "
         "whether it fits, without allocating it.", model_verbs.define_plan, model_verbs.main_plan, takes_gin=True,
         tensorflow=True),
    Verb("eval", "Evaluate a trained checkpoint on a task's split: EM/F1 and perplexity by year and slice.",
         model_verbs.define_eval, model_verbs.main_eval, takes_gin=True, tensorflow=True),
    Verb("reproduce", "The time-aware T5 study end to end on the embedded world or your data: Uniform/Temporal/Yearly "
         "models, evaluation, future probes, adaptation, Transformer-XL streaming, findings, report.",
         study_verbs.define_reproduce, study_verbs.main_reproduce, takes_gin=True, tensorflow=True,
         gin_first=lambda: [f"study/{FLAGS.preset}.gin"]),
    Verb("infer", "Predictions of a trained checkpoint for a JSON-lines file of inputs or TempLAMA queries.",
         model_verbs.define_infer, model_verbs.main_infer, takes_gin=True, tensorflow=True),
    Verb("data tasks", "Build the record files behind the SeqIO tasks (SSM examples, TempLAMA, vocabulary).",
         data_verbs.define_data_tasks, data_verbs.main_data_tasks, takes_gin=True, tensorflow=True),
    Verb("data calm", "Build a CALM corpus (one class per file) from the embedded world's news domains or text files.",
         data_verbs.define_data_calm, data_verbs.main_data_calm, takes_gin=True),
    Verb("calm", "CALM: a Transformer-XL online learner (dynamic evaluation) vs a static baseline, switching stream.",
         study_verbs.define_calm, study_verbs.main_calm, takes_gin=True),
    Verb("is-eval", "Importance-sampled perplexity against K per proposal and level: an HMM LM with its exact value, "
         "or the knowledge-graph LM (--model=kglm) with Logan et al.'s effects.",
         study_verbs.define_is_eval, study_verbs.main_is_eval),
    Verb("train-lm", "Train a Transformer-XL LM on a TIME-STRATIFIED or CONTROL split (gin: txl/*.gin), resumable.",
         model_verbs.define_train_lm, model_verbs.main_train_lm, takes_gin=True, tensorflow=True),
    Verb("stream", "Perplexity per test month, TIME-STRATIFIED vs CONTROL, static and dynamic (txl/dynamic_eval.gin).",
         model_verbs.define_stream, model_verbs.main_stream, takes_gin=True, tensorflow=True),
    Verb("appendices", "Mind the Gap's appendices: the gap in shifted test periods (B) and against the distance "
         "between training and test (C), with their figures.", study_verbs.define_appendices,
         study_verbs.main_appendices, tensorflow=True),
]}


# Earlier spellings, still accepted but not listed.
ALIASES = {"train_lm": "train-lm", "is_eval": "is-eval"}


def _usage(prefix: str = "") -> str:
    names = [n for n in VERBS if n.startswith(prefix)]
    width = max(len(n) for n in names)
    lines = ["usage: templm VERB [--flags]   (templm VERB --help for a verb's flags)", "", "verbs:"]
    lines += [f"  {n.ljust(width)}  {VERBS[n].help}" for n in names]
    return "\n".join(lines)


def _split_verb(args: Sequence[str]) -> Tuple[Optional[str], List[str]]:
    words = []
    for arg in args:
        if arg.startswith("-"):
            break
        words.append(ALIASES.get(arg, arg))
        if " ".join(words) in VERBS:
            return " ".join(words), list(args[len(words):])
    return None, list(args)


def _verbosity(args: Sequence[str]) -> Tuple[int, List[str]]:
    """absl's verbosity asked for on the command line (0 when not), with a bare `-v` spelled `--verbosity=1`."""
    out, level = [], 0
    for i, arg in enumerate(args):
        following = args[i + 1] if i + 1 < len(args) else "-"
        if arg == "-v" and not following.lstrip("-").isdigit():
            arg = "--verbosity=1"
        out.append(arg)
        for prefix in ("--verbosity=", "-v="):
            if arg.startswith(prefix) and arg[len(prefix):].lstrip("-").isdigit():
                level = int(arg[len(prefix):])
        if arg in ("--verbosity", "-v") and following.lstrip("-").isdigit():
            level = int(following)
    return level, out


def _quiet_libraries() -> None:
    """Library logs off: TensorFlow's native log lines, Python warnings of libraries, and (in `main`, once absl has
    parsed its flags) every Python log line below FATAL (gin, for one, logs an ERROR for each search path an
    `include` is not found in)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    warnings.filterwarnings("ignore")
    warnings.filterwarnings("default", module="templm")


def _verb_help(v: Verb) -> str:
    own = [f for module in (options, data_verbs, model_verbs, study_verbs, sys.modules[__name__])
           for f in FLAGS.get_flags_for_module(module.__name__)]
    lines = [f"usage: templm {v.name} [--flags]", "", v.help, "", "flags:"]
    for flag in sorted(own, key=lambda f: f.name):
        default = "" if flag.default in (None, []) else f" (default: {flag.default!r})"
        lines.append(f"  --{flag.name}: {flag.help}{default}")
    if v.takes_gin:
        lines.append("  --gin.NAME=VALUE: a gin binding, as in T5X (same as --gin_bindings='NAME = VALUE')")
    return "\n".join(lines)


def _message(error: BaseException) -> str:
    """The error's message without the lines gin adds on the way out of a configurable ("In call to configurable
    'train' (<function ...>)"): the command line already names the verb."""
    return "\n".join(line for line in str(error).split("\n") if not line.startswith("  In call to configurable"))


def main(argv: Sequence[str], *, own_process: bool = False, noted: Optional[List[int]] = None) -> int:
    """`templm ARGV` in this process (ARGV without the program's name): the verb's output on sys.stdout, our lines on
    sys.stderr, and the exit status returned (templm.errors' EXIT_* codes). Callable again in the same process with
    the same result: what a call changes in the process (flags, gin, the SeqIO registry, signal handlers, log levels,
    warning filters, console settings) is put back when it returns. `own_process` (the console script's): the
    process is the command's alone, so a verb may start it again (`templm plan` on more devices than JAX started
    with); otherwise such a verb says what to do instead. `noted`: the list the process's first signal handlers
    append to (run's), answered as a signal while the command starts."""
    with _call_scope():
        STATE["own_process"] = own_process
        try:
            return _main(list(argv), [] if noted is None else noted)
        except SystemExit as e:  # a library's sys.exit inside a verb
            return e.code if isinstance(e.code, int) else (0 if e.code is None else EXIT_USAGE)


def run(argv: Optional[Sequence[str]] = None, noted: Optional[List[int]] = None) -> None:
    """Console entry point (`templm ...`, `python -m templm.cli ...`, through templm.cli.start): `main` on the
    process's arguments, then exit with its status. `noted`: the list the process's first handlers append the signals
    they receive to (templm.cli.start), answered once the verb's modules are loaded."""
    args = list(sys.argv[1:] if argv is None else argv[1:])
    status = main(args, own_process=True, noted=noted)
    if status and _verbosity(args)[0] < 1:
        # After the error line the process ends: library threads that fail on the way out (orbax's writes after a
        # failed save print a traceback each) are not shown, unless --verbosity asks for library output.
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
    if status in (EXIT_PREEMPTED, EXIT_INTERRUPTED):
        # A signal's exception can leave work running on XLA's threads: JAX waits for a compilation in a way Python's
        # signal handlers interrupt, and the compilation goes on in XLA's thread pool. The interpreter's teardown
        # then freed the devices it was using and the process died of a segmentation fault after its one line (the
        # stream verb, stopped during dynamic evaluation: 5 of 5). What the verb writes is closed and on disk by
        # now (its with-blocks and the checkpointer's waits have run), so the process ends here, without the
        # teardown, with the status it said.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    sys.exit(status)


@contextlib.contextmanager
def _call_scope() -> Iterator[None]:
    """What one call of `main` changes in the process, put back when it ends: the flags it defined (absl's own stay,
    unparsed again), gin's config, the SeqIO tasks it registered, the signal handlers and notes, absl's log level,
    warning filters, the console's settings and the environment variables it set."""
    import gin  # light; the SeqIO registry is scoped only where a verb loads it (it loads TensorFlow)

    flag_names = set(FLAGS)
    was_parsed = FLAGS.is_parsed()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    unraisable = sys.unraisablehook
    environ = dict(os.environ)
    verbosity = logging.get_verbosity()
    console_settings = console.settings()
    state = dict(STATE)
    reset_signal_notes()
    gin.clear_config()
    tasks = sys.modules.get("templm.tasks")
    with warnings.catch_warnings(), tasks.registration_scope() if tasks else contextlib.nullcontext():
        try:
            yield
        finally:
            if tasks is None and "templm.tasks" in sys.modules:  # first loaded by this call: as its import left it
                _registered_as_imported()
            gin.clear_config()
            for name in set(FLAGS) - flag_names:
                delattr(FLAGS, name)
            if not was_parsed:
                FLAGS.unparse_flags()
            for signum, handler in handlers.items():
                signal.signal(signum, handler)
            sys.unraisablehook = unraisable
            for name in set(os.environ) - set(environ):
                del os.environ[name]
            os.environ.update(environ)
            logging.set_verbosity(verbosity)
            console.restore_settings(console_settings)
            STATE.clear()
            STATE.update(state)
            reset_signal_notes()


def _registered_as_imported() -> None:
    """The SeqIO registry as `import templm.tasks` leaves it (the default task data), after a command that loaded it
    and registered its own; a default that cannot be registered (a TEMPLM_DATA_DIR without task data) is left out,
    as the next `configure` says why."""
    from templm import tasks

    try:
        tasks.configure()
    except (ValueError, OSError):
        pass


def _error_stream() -> Tuple[TextIO, bool]:
    """Where error lines go, and whether it is ours to close: a copy of standard error's descriptor when sys.stderr
    has one (after a failed checkpoint save the library's threads are silenced on the descriptor itself:
    templm.training.checkpoints), else sys.stderr as it is (a caller's buffer)."""
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return sys.stderr, False
    sys.stderr.flush()
    return os.fdopen(os.dup(fd), "w", buffering=1, encoding="utf-8", errors="replace"), True


def _main(argv: List[str], stopped: List[int]) -> int:
    name, rest = _split_verb(argv)
    if name is None:
        words = [a for a in argv if not a.startswith("-")]
        prefix = " ".join(words)
        if words and not any(n.startswith(prefix + " ") for n in VERBS):
            print(f"templm: unknown verb {prefix!r}\n\n{_usage()}", file=sys.stderr)
            return EXIT_USAGE
        print(_usage(prefix + " " if words else ""))
        return 0 if any(a in ("-h", "--help", "--helpfull") for a in argv) or not words else EXIT_USAGE
    verbosity, rest = _verbosity(rest)
    STATE["verbosity"] = verbosity
    v = VERBS[name]
    if verbosity < 1:
        _quiet_libraries()
    # Loading TensorFlow and the verb's modules takes seconds. A Ctrl-C or a SIGTERM meanwhile is noted and answered
    # once they are loaded: raised inside TensorFlow's import it aborts the process (SIGABRT) or prints a long
    # traceback, and SIGTERM's default ended the process (exit 143) without a word.
    main_thread = threading.current_thread() is threading.main_thread()
    if main_thread:
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda received, _: stopped.append(received))
    # The notes stay until the verb runs (_run_verb puts the command line's handlers in their place).
    try:
        if v.tensorflow:
            load_tensorflow(quiet=verbosity < 1)
        v.define()
    except (ValueError, FileNotFoundError) as e:  # what the environment names (a TEMPLM_DATA_DIR without task data)
        print(f"templm {name}: error: {_message(e)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if stopped:
        return _stopped_while_starting(name, stopped[0])
    if v.takes_gin:
        define_gin_flags()
    flags.DEFINE_enum("progress", "lines", console.PROGRESS_MODES, "How long work shows its progress: lines (lines "
                      "with the rate and the ETA; inside a study or an evaluation one at most every "
                      f"{console.LONG_WORK_SECONDS:.0f} s), bar (a bar on the terminal) or none.")
    if any(a in ("-h", "--help", "--helpshort", "--helpfull") for a in rest):
        print(_verb_help(v))
        return 0
    try:
        rest = rewrite_gin_args(rest)
    except ConfigError as e:
        print(f"templm {name}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    try:
        FLAGS([f"templm {name}"] + rest)
    except flags.Error as e:
        print(f"templm {name}: error: {e} (templm {name} --help lists the flags)", file=sys.stderr)
        return EXIT_USAGE
    logging.use_absl_handler()
    if verbosity < 1:  # absl would log at INFO; --verbosity=1 keeps its own setting (INFO and debug lines)
        logging.set_verbosity(logging.FATAL)  # libraries' errors surface as exceptions, which we print
    err, own = _error_stream()
    try:
        if stopped:
            return _stopped_while_starting(name, stopped[0])
        return _run_verb(name, v, err)
    finally:
        if own:
            err.close()


_OUT_OF_MEMORY = re.compile(r"RESOURCE_EXHAUSTED|Out of memory", re.I)
_ALLOCATING = re.compile(r"allocating (\d+) bytes")


def _out_of_device_memory(name: str, error: BaseException) -> Optional[str]:
    """The one line for XLA's refusal to allocate what a compiled step asks for (a JaxRuntimeError: settings too large
    for the device, e.g. the paper's batch on a laptop), or None for any other error. XLA refuses before it
    allocates: nothing was trained, and the run's folder holds no checkpoint of it."""
    if type(error).__name__ not in ("JaxRuntimeError", "XlaRuntimeError"):
        return None
    if _OUT_OF_MEMORY.search(str(error)) is None:
        return None
    size = _ALLOCATING.search(str(error))
    asked = f" ({int(size.group(1)) / 2 ** 30:,.1f} GiB in one allocation)" if size else ""
    remedy = ("lower BATCH_SIZE or TASK_FEATURE_LENGTHS, train a smaller model or on more devices, or split each "
              "batch (--gin.templm.train.microbatches=N); `templm plan` gives the step's memory before a run"
              if name in ("train", "reproduce") else "lower the batch size, the lengths or the model size")
    return f"the device has too little memory for the compiled step{asked}: {remedy}"


def _stopped_while_starting(name: str, signum: int) -> int:
    if signum == signal.SIGTERM:
        print(f"templm {name}: stopped by SIGTERM while starting; nothing was written", file=sys.stderr)
        return EXIT_PREEMPTED
    print(f"templm {name}: interrupted while starting; nothing was written", file=sys.stderr)
    return EXIT_INTERRUPTED


def _run_verb(name: str, v: Verb, err: TextIO) -> int:
    """The verb with its flags parsed: its status, or the status and one line of every failure it ends with."""
    console.set_progress(FLAGS.progress)
    try:
        note_sigint()
        note_sigterm()
        STATE["settings"] = Settings.from_environment()  # the environment, read once for the whole call
        if v.takes_gin:
            first = v.gin_first() if v.gin_first else []
            parse_gin(first + list(FLAGS.gin_file), FLAGS.gin_bindings, FLAGS.gin_search_paths)
        refuse_unserved_urls(name)
        status = v.main() or 0
        late = signal_after_result()
        if late is not None and status == 0:  # the verb had written its result (errors.result_in_place)
            stopped = "interrupted" if late == signal.SIGINT else "stopped by SIGTERM"
            print(f"templm {name}: {stopped} after its results were written; they are complete", file=err)
            return EXIT_INTERRUPTED if late == signal.SIGINT else EXIT_PREEMPTED
        check_interrupted()  # a Ctrl-C whose KeyboardInterrupt was dropped on the way
        return status
    except Preempted as e:
        print(f"templm {name}: {_message(e)}", file=err)
        return EXIT_PREEMPTED
    except TrainingError as e:
        print(f"templm {name}: error: {_message(e)}", file=err)
        return EXIT_TRAINING
    except (ValueError, FileNotFoundError) as e:  # DataError, ConfigError and bad values: the input's fault
        logging.debug("templm %s failed", name, exc_info=True)  # the traceback, with --verbosity=1
        print(f"templm {name}: error: {_message(e)}", file=err)
        return EXIT_BAD_INPUT
    except OSError as e:  # the file system: a path of the wrong kind, no permission, a full disk
        logging.debug("templm %s failed", name, exc_info=True)
        where = f"{e.filename}: " if getattr(e, "filename", None) else ""
        said = e.strerror or _message(e)
        code = e.errno
        # gin re-raises an error from inside a configurable as a copy without its errno and file: their text
        # ("[Errno 27] File too large while writing it: '/run/config.gin'") says both.
        copied = re.match(r"\[Errno (\d+)\] (.*?)(?:: '(.*)')?$", _message(e).split("\n")[0])
        if copied and (code is None or not where):
            code = int(copied.group(1)) if code is None else code
            if copied.group(3):
                where, said = f"{copied.group(3)}: ", copied.group(2)
        print(f"templm {name}: error: {where}{said} (nothing half-written was left)", file=err)
        return EXIT_SYSTEM if code in SYSTEM_ERRNOS else EXIT_BAD_INPUT
    except RuntimeError as e:
        said = _out_of_device_memory(name, e)
        if said is None:
            raise
        logging.debug("templm %s failed", name, exc_info=True)
        print(f"templm {name}: error: {said}", file=err)
        return EXIT_BAD_INPUT
    except (KeyboardInterrupt, Terminated) as e:
        stopped = "interrupted" if isinstance(e, KeyboardInterrupt) else "stopped by SIGTERM"
        if signal_during_commit():
            print(f"templm {name}: {stopped} as its results were being put in place; they were complete and are "
                  "written whole", file=err)
        elif isinstance(e, KeyboardInterrupt):
            print(f"templm {name}: interrupted; nothing half-written was left (a training run resumes from its "
                  "last checkpoint when run again)", file=err)
        else:
            print(f"templm {name}: stopped by SIGTERM; nothing half-written was left and no result was written: "
                  "run the same command again", file=err)
        return EXIT_INTERRUPTED if isinstance(e, KeyboardInterrupt) else EXIT_PREEMPTED
