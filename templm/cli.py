"""`templm <verb>`: the command line. An absl app per verb, with T5X-style gin flags for verbs that take a config.

    templm data world --out runs/world
    templm data stats --corpus news.jsonl
    templm train --gin_file=gin_configs/temporal.gin --gin.MODEL_DIR="'runs/temporal'"

`templm --help` lists the verbs; `templm VERB --help` lists a verb's flags. Verbs are words joined by hyphens
(`train-lm`, `is-eval`; earlier spellings such as `train_lm` still work). Exit status (templm.errors): 0 done; 1 bad
input (a malformed line, a missing file, a misspelled gin binding: one message naming the file, line or binding);
2 usage; 3 training cannot go on (a non-finite loss); 75 preempted by SIGTERM (checkpoint saved, nothing reported:
run the same command again to resume).

Output: a verb's result goes to standard output; templm's progress lines and warnings to standard error; library
logs (absl, orbax, clu, TensorFlow, JAX) only with `--verbosity=1` (or `-v`).

Each verb imports its modules when it runs (inside its `_define_*` / `_main_*` functions): they pull in JAX,
TensorFlow and SeqIO, several seconds of start-up that `templm --help` and the light data verbs should not pay.
"""

from __future__ import annotations

import ast
import collections
import contextlib
import dataclasses
import difflib
import functools
import json
import math
import os
import re
import signal
import sys
import tempfile
import tokenize
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from absl import app, flags, logging

from templm import console
from templm.errors import (EXIT_BAD_INPUT, EXIT_INTERRUPTED, EXIT_PREEMPTED, EXIT_SYSTEM, EXIT_TRAINING, EXIT_USAGE,
                           SYSTEM_ERRNOS, ConfigError, Preempted, Terminated, TrainingError, check_interrupted,
                           note_sigint, note_sigterm)


FLAGS = flags.FLAGS
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclasses.dataclass(frozen=True)
class Verb:
    name: str
    help: str
    define: Callable[[], None]  # defines the verb's flags on FLAGS
    main: Callable[[], Optional[int]]  # runs with FLAGS parsed
    takes_gin: bool = False
    tensorflow: bool = False  # it loads TensorFlow (through SeqIO or the record writers)
    gin_first: Optional[Callable[[], List[str]]] = None  # gin files parsed before --gin_file (a verb's defaults)


# -- gin, the T5X way -------------------------------------------------------------------------------------------------

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

    paths = list(search_paths) + [os.getcwd(), os.path.join(REPO_ROOT, "gin_configs"), REPO_ROOT]
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
        gin.parse_config_files_and_bindings(resolved, list(bindings), finalize_config=False)
    except (ValueError, KeyError, SyntaxError, TypeError) as e:  # gin names the file/binding and line
        unquoted = _unquoted_string(bindings)
        if unquoted is not None:
            name, value = unquoted
            raise ConfigError(f"gin binding {name}={value}: {value} is not a gin value; a string needs quotes "
                              f"inside the flag: --gin.{name}=\"'{value}'\"") from None
        raise ConfigError(f"gin: {e}") from None
    except OSError as e:  # an `include` of a file that is not there (gin names the including file)
        raise ConfigError(f"gin: {e}") from None
    except tokenize.TokenError as e:  # an unclosed bracket: the tokenizer gives up before gin can name the line
        raise ConfigError(f"gin: {e.args[0]} (an unclosed bracket or quote?) in the config files {resolved} or "
                          f"the bindings {list(bindings)}") from None
    _check_macros_are_used(bindings)


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


# -- data verbs ---------------------------------------------------------------------------------------------------

def _bounds(**ranges: Tuple[Optional[float], Optional[float]]) -> None:
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


def _define_overwrite():
    flags.DEFINE_boolean("overwrite", False, "Replace --out even when it is not empty and not a templm output of "
                         "this kind (what is in it is deleted); without it such a folder is refused.")


def _define_data_world():
    flags.DEFINE_string("out", None, "Output folder.", required=True)
    _define_overwrite()
    flags.DEFINE_integer("seed", None, "Random seed (default 0, or the gin binding WorldConfig.seed).")
    flags.DEFINE_integer("start_year", None, "First year (default 2010).")
    flags.DEFINE_integer("end_year", None, "Last year (default 2020).")
    flags.DEFINE_integer("subjects_per_relation", None, "Subjects per TempLAMA relation (default 40).")
    flags.DEFINE_integer("docs_per_month", None, "News documents per month (default 60).")
    _bounds(seed=(0, None), subjects_per_relation=(4, None), docs_per_month=(1, None))
    _world_configurable()  # registered before gin parses, so `--gin.WorldConfig.seed=3` binds


@functools.lru_cache(maxsize=None)
def _world_configurable():
    import gin
    from templm.data.world import WorldConfig

    return gin.external_configurable(WorldConfig, name="WorldConfig", module="templm")


def _world_config(**flags_given):
    """The WorldConfig of gin's bindings with the flags given in their place (the flags win before it is checked)."""
    try:
        return _world_configurable()(**flags_given)
    except ValueError as e:
        raise ConfigError(f"WorldConfig: {e}") from None


def _main_data_world():
    from templm.data.world import generate_world

    config = _world_config(**{name: FLAGS[name].value for name in
                              ("seed", "start_year", "end_year", "subjects_per_relation", "docs_per_month")
                              if FLAGS[name].value is not None})
    stats = generate_world(config, FLAGS.out, overwrite=FLAGS.overwrite)
    print(format_world_summary(stats, FLAGS.out))


def format_world_summary(stats: dict, out: str) -> str:
    lines = [f"templm world written to {out}",
             f"  {stats['documents']} documents, {stats['entities']} entities ({stats['emerging_entities']} emerging),"
             f" {stats['facts']} facts",
             f"  TempLAMA: {stats['templama_queries']} queries, "
             + ", ".join(f"{k} {v}" for k, v in stats["templama_splits"].items())
             + f"; {100 * stats['multi_answer_share']:.1f}% with several answers",
             "  year  documents  sentences  background  queries  multi-answer  emerging names  new words"]
    for year, row in stats["by_year"].items():
        lines.append(f"  {year}  {row['documents']:9d}  {row['sentences']:9d}  {row['background_sentences']:10d}"
                     f"  {row['queries']:7d}  {row['multi_answer_queries']:12d}  {row['emerging_names']:14d}"
                     f"  {row['new_words']:9d}")
    return "\n".join(lines)


CORPUS_HELP = ("Corpus file (.gz and .bz2 are read transparently); repeat it, or give a quoted glob pattern "
               "('news-docs.20*.en.filtered.gz'), for a corpus of several files (the format is detected per file).")


def _define_corpus_flags(split: bool = True):
    flags.DEFINE_multi_string("corpus", None, CORPUS_HELP, required=True)
    flags.DEFINE_enum("format", "auto", ["auto", "jsonl", "wmt", "arxiv"], "Corpus format.")
    flags.DEFINE_enum("on_error", "raise", ["raise", "skip"], "On a bad line: stop, or skip and count it.")
    if split:
        flags.DEFINE_string("split_dir", None, "Apply a split file from this folder (published or `templm data "
                            "splits` output) to the corpus by document id.")
        flags.DEFINE_string("split", "time_stratified_train", "Which split of --split_dir: the file stem, e.g. "
                            "control_train, test, yearly/2014_train.")


def _corpus_value(value):
    """A repeatable corpus flag as the library takes it: one entry as a str, several as their list (each may be a
    glob pattern), none as None."""
    if not value or isinstance(value, str):
        return value or None
    return value[0] if len(value) == 1 else list(value)


def _corpus_flag():
    return _corpus_value(FLAGS.corpus)


def _corpus_documents():
    """The documents of --corpus, or of its --split; returns (iterable, report) where report() -> dict."""
    from templm.data.lm_data import split_path
    from templm.data.readers import read_documents
    from templm.data.splits import apply_split

    if FLAGS.split_dir:
        path = split_path(None, FLAGS.split_dir, FLAGS.split)
        docs, report = apply_split(_corpus_flag(), path, FLAGS.format, FLAGS.on_error)
        return docs, report.as_dict
    reader = read_documents(_corpus_flag(), FLAGS.format, FLAGS.on_error)
    return reader, lambda: {"read": reader.read, "skipped": reader.skipped}


def _define_data_stats():
    _define_corpus_flags()


def _main_data_stats():
    docs_iter, report = _corpus_documents()
    docs, words = collections.Counter(), collections.Counter()
    for doc in docs_iter:
        docs[doc.date.year] += 1
        words[doc.date.year] += len(doc.text.split())
    print(json.dumps({"corpus": _corpus_flag(), "documents": sum(docs.values()), **report(),
                      "by_year": {str(y): {"documents": docs[y], "words": words[y]} for y in sorted(docs)}}))


# The kinds of output folder of `data splits`, `data templama` and `data cronquestions`.
SPLITS_KIND, TEMPLAMA_KIND, CRONQUESTIONS_KIND = "splits", "TempLAMA", "CronQuestions"


def _define_data_splits():
    _define_corpus_flags(split=False)
    flags.DEFINE_string("out", None, "Output folder for the split files and stats.json (built whole beside it, then "
                        "put in its place).", required=True)
    _define_overwrite()
    flags.DEFINE_string("cutoff", "2017-09-30", "TIME-STRATIFIED cut-off date; 'auto': the latest whose validation "
                        "and test months end with the corpus; empty for yearly buckets only.")
    flags.DEFINE_integer("test_docs_per_month", 1000, "Test documents sampled per month (all if fewer).")
    flags.DEFINE_integer("validation_docs", None, "Validation size (default 3 x --test_docs_per_month).")
    flags.DEFINE_integer("test_months", 24, "Months in the test period.")
    flags.DEFINE_integer("validation_months", 3, "Months in the validation period after the cut-off.")
    flags.DEFINE_boolean("yearly", True, "Also write yearly buckets with held-out documents (time-aware T5).")
    flags.DEFINE_integer("heldout_per_year", 2000, "Yearly buckets: at most this many held-out documents a year.")
    flags.DEFINE_float("heldout_fraction", 0.1, "Yearly buckets: at most this share of a year held out.")
    flags.DEFINE_integer("seed", 0, "Sampling seed.")
    flags.DEFINE_string("language", "en", "Leave out documents langid identifies as another language (ISO 639-1); "
                        "empty: keep every language.")
    flags.DEFINE_float("near_duplicate_threshold", 0.8, "Leave out a document whose word 5-gram Jaccard similarity "
                       "with an earlier one reaches this (MinHash LSH); 0: keep near-duplicates.")
    flags.DEFINE_boolean("allow_degenerate", False, "Write splits with empty test months or a CONTROL train nearly "
                         "all outside the test period (warned and listed in stats.json) instead of refusing them.")
    _bounds(test_docs_per_month=(1, None), validation_docs=(1, None), test_months=(1, None),
            validation_months=(1, None), heldout_per_year=(0, None), heldout_fraction=(0, 1), seed=(0, None),
            near_duplicate_threshold=(0, 1))


def _main_data_splits():
    from templm.data.filters import FilterConfig
    from templm.data.records import parse_date
    from templm.data.splits import make_splits, yearly_buckets
    from templm.outputs import build_output_folder

    try:
        clean = FilterConfig(language=FLAGS.language or None,
                             near_duplicate_threshold=FLAGS.near_duplicate_threshold or None)
    except ValueError as e:
        flag = "--language" if "language" in str(e).split(" must")[0] else "--near_duplicate_threshold"
        raise ConfigError(f"{flag}: {e}") from None
    cutoff = None
    if FLAGS.cutoff:
        try:
            cutoff = None if FLAGS.cutoff == "auto" else parse_date(FLAGS.cutoff)
        except ValueError as e:
            raise ConfigError(f"--cutoff: {e} (or 'auto')") from None

    def build(folder):  # every file of the output, in a folder beside --out that replaces it only when whole
        summary = {}
        if FLAGS.cutoff:
            stats = make_splits(_corpus_flag(), folder, cutoff=cutoff, test_months=FLAGS.test_months,
                                validation_months=FLAGS.validation_months,
                                test_docs_per_month=FLAGS.test_docs_per_month, validation_docs=FLAGS.validation_docs,
                                seed=FLAGS.seed, format=FLAGS.format, on_error=FLAGS.on_error, clean=clean,
                                allow_degenerate=FLAGS.allow_degenerate)
            summary["splits"] = {k: v["documents"] for k, v in stats["splits"].items()}
            summary["control_train_test_period_share"] = stats["control_train_test_period_share"]
        if FLAGS.yearly:
            yearly = yearly_buckets(_corpus_flag(), folder, heldout_per_year=FLAGS.heldout_per_year,
                                    heldout_fraction=FLAGS.heldout_fraction, seed=FLAGS.seed, format=FLAGS.format,
                                    on_error=FLAGS.on_error, clean=clean)
            summary["yearly"] = yearly["years"]
        return summary

    print(json.dumps(build_output_folder(FLAGS.out, SPLITS_KIND, build, FLAGS.overwrite)))


def _define_data_spm():
    _define_corpus_flags()
    flags.DEFINE_string("out", None, "Model prefix: writes PREFIX.model and PREFIX.vocab.", required=True)
    flags.DEFINE_integer("vocab_size", 32000, "Pieces in the model; seqio adds 100 sentinel ids on top.")
    flags.DEFINE_integer("max_sentences", 1_000_000, "Train on at most this many sampled lines.")
    flags.DEFINE_integer("seed", 0, "Sampling and training seed.")
    _bounds(vocab_size=(4, None), max_sentences=(1, None), seed=(0, None))


def _main_data_spm():
    from templm.data.vocab import train_spm

    docs, report = _corpus_documents()
    path = train_spm(docs, FLAGS.out, vocab_size=FLAGS.vocab_size, max_sentences=FLAGS.max_sentences,
                     seed=FLAGS.seed)
    print(json.dumps({"model": path, **report()}))


def _define_data_templama():
    flags.DEFINE_string("dump", None, "Wikidata JSON dump (latest-all.json.gz or .bz2).", required=True)
    flags.DEFINE_string("out", None, "Output folder for train/val/test.jsonl and stats.json (built whole beside it, "
                        "then put in its place).", required=True)
    _define_overwrite()
    flags.DEFINE_integer("start_year", 2010, "First year of the queries.")
    flags.DEFINE_integer("end_year", 2020, "Last year of the queries.")
    flags.DEFINE_integer("max_subjects", 1000, "Most popular subjects kept per relation.")
    flags.DEFINE_boolean("require_enwiki", True, "Subjects and objects need an English Wikipedia article, as the "
                         "paper's facts (--norequire_enwiki keeps every subject with an English label).")
    flags.DEFINE_integer("seed", 0, "Seed of the subject split (20/10/70).")
    _bounds(max_subjects=(1, None), seed=(0, None))


def _main_data_templama():
    from templm.data.wikidata import build_templama
    from templm.outputs import build_output_folder

    stats = build_output_folder(FLAGS.out, TEMPLAMA_KIND, lambda folder: build_templama(
        FLAGS.dump, folder, start_year=FLAGS.start_year, end_year=FLAGS.end_year, max_subjects=FLAGS.max_subjects,
        require_enwiki=FLAGS.require_enwiki, seed=FLAGS.seed), FLAGS.overwrite)
    print(json.dumps({k: stats[k] for k in ("subjects", "queries", "splits")}))


def _define_data_cronquestions():
    flags.DEFINE_string("release", None, "CronQuestions release folder (its root, or data/wikidata_big/ with "
                        "questions/{train,valid,test}.pickle and kg/wd_id2entity_text.txt).", required=True)
    flags.DEFINE_string("out", None, "Output folder for {train,validation,test}.tfrecord and manifest.json (built "
                        "whole beside it, then put in its place); point templm.tasks.configure.cronquestions_dir "
                        "or TEMPLM_CRONQUESTIONS_DIR at it.", required=True)
    _define_overwrite()
    flags.DEFINE_integer("max_questions", None, "Keep the first N questions of each split (default: all).")
    _bounds(max_questions=(1, None))


def _main_data_cronquestions():
    from templm.data.cronquestions import convert_release
    from templm.outputs import build_output_folder

    manifest = build_output_folder(FLAGS.out, CRONQUESTIONS_KIND, lambda folder: convert_release(
        FLAGS.release, folder, max_questions=FLAGS.max_questions), FLAGS.overwrite)
    print(json.dumps({"out": FLAGS.out, "splits": manifest["splits"]}))


def _define_data_tasks():
    flags.DEFINE_string("out", None, "Output folder: point TEMPLM_DATA_DIR (or templm.tasks.configure.data_dir) at it.",
                        required=True)
    _define_overwrite()
    flags.DEFINE_multi_string("corpus", None, "News corpus; default: the embedded world (drawn with --seed and the "
                              "WorldConfig gin bindings). " + CORPUS_HELP)
    flags.DEFINE_enum("format", "auto", ["auto", "jsonl", "wmt", "arxiv"], "Corpus format.")
    flags.DEFINE_string("templama_dir", None, "TempLAMA release folder ({train,val,test}.json as released, or "
                        ".jsonl); default: the "
                        "world's, or none for a corpus.")
    flags.DEFINE_integer("vocab_size", 768, "SentencePiece pieces (768 suits the world; 32000 for real news).")
    flags.DEFINE_integer("max_spm_sentences", 1_000_000, "SentencePiece training lines, at most.")
    flags.DEFINE_string("detector", "builtin", "Entity detector: builtin, or an installed spaCy pipeline name.")
    flags.DEFINE_boolean("one_span_per_sentence", False, "One sampled salient span per sentence instead of all.")
    flags.DEFINE_integer("heldout_per_year", 2000, "Held-out (validation + test) documents per year, at most.")
    flags.DEFINE_float("heldout_fraction", 0.1, "Held-out share of each year, at most.")
    flags.DEFINE_integer("future_years", 2, "The last N years form the 'future' evaluation slice.")
    flags.DEFINE_integer("files_per_year", 1, "Record files per split and year: at least the data shards (hosts) of "
                         "a multi-host training run, so that each host reads files of its own.")
    flags.DEFINE_integer("seed", 0, "Seed of the world, the held-out draw and the training answers.")
    _bounds(vocab_size=(4, None), max_spm_sentences=(1, None), heldout_per_year=(0, None), heldout_fraction=(0, 1),
            future_years=(0, None), files_per_year=(1, None), seed=(0, None))
    _world_configurable()


def _main_data_tasks():
    from templm.data.task_data import TaskDataConfig, prepare_task_data

    world = _world_config(seed=FLAGS.seed)
    config = TaskDataConfig(
        corpus=_corpus_flag(), corpus_format=FLAGS.format, templama_dir=FLAGS.templama_dir, world=world,
        vocab_size=FLAGS.vocab_size, max_spm_sentences=FLAGS.max_spm_sentences, detector=FLAGS.detector,
        one_span_per_sentence=FLAGS.one_span_per_sentence, heldout_per_year=FLAGS.heldout_per_year,
        heldout_fraction=FLAGS.heldout_fraction, future_years=FLAGS.future_years,
        files_per_year=FLAGS.files_per_year, seed=FLAGS.seed)
    manifest = prepare_task_data(config, FLAGS.out, overwrite=FLAGS.overwrite)
    totals = {folder: {split: sum(by_year.values()) for split, by_year in splits.items()}
              for folder, splits in manifest["counts"].items()}
    print(json.dumps({"out": FLAGS.out, "years": manifest["years"], "future_years": manifest["future_years"],
                      "examples": totals}))


def _writable_folder(folder: str, what: str) -> None:
    """Creates `folder` if needed and checks a file can be written there, so a bad output path fails before the work
    (ConfigError naming it)."""
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise ConfigError(f"{what} {folder} is a file; expected a folder")
    try:
        os.makedirs(folder, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise ConfigError(f"{what} {folder}: cannot write there: {e.strerror or e}") from None


def _configure_tasks():
    """Registers the tasks again now that the configs are parsed: `templm.tasks.configure.*` bindings apply (at
    `import templm.tasks` they were not parsed yet)."""
    from templm import tasks

    tasks.configure()


def _define_distributed():
    flags.DEFINE_string("coordinator_address", None, "Multi-host: host:port of process 0 for jax.distributed.")
    flags.DEFINE_integer("num_processes", None, "Multi-host: number of processes.")
    flags.DEFINE_integer("process_id", None, "Multi-host: this process's index.")


def _join_processes():
    """Multi-host: joins the run's processes (--coordinator_address ...); only process 0 prints progress."""
    import jax

    from templm.training.partitioning import initialize_distributed

    initialize_distributed(FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id)
    console.set_enabled(jax.process_index() == 0)


def _define_train():
    _define_distributed()
    import templm.evaluation.checkpoint_eval  # noqa: F401  (registers every configurable the T5 configs bind)


def _main_train():
    import jax

    from templm.evaluation.checkpoint_eval import evaluate_params
    from templm.io import jsonable
    from templm.training import trainer

    import gin

    _join_processes()
    _configure_tasks()
    result = trainer.train(evaluator=evaluate_params, config_gin=gin.config_str())
    if jax.process_index() == 0:
        print(json.dumps(jsonable({k: v for k, v in result.items() if k != "params"})))


def _define_plan():
    from templm.training.plan import DEVICE_MEMORY_GIB

    flags.DEFINE_enum("device_kind", None, list(DEVICE_MEMORY_GIB), "The accelerator, for its memory per device "
                      "(default: from the mesh config's name: tpu_v3, tpu_v4, gpu -> a100_80).")
    flags.DEFINE_integer("devices", None, "Devices in the mesh, where the mesh config sets only num_partitions.")
    _bounds(devices=(1, None))
    flags.DEFINE_boolean("compile", True, "Compile the step for its temporary memory (slow for XL/XXL on a laptop); "
                         "without it, only parameters, optimizer state and batch.")
    import templm.evaluation.checkpoint_eval  # noqa: F401  (registers every configurable the T5 configs bind)
    from templm.experiments.studies import register_gin

    register_gin()  # a study config (study/paper.gin) is planned training by training


def _main_plan():
    import gin
    import numpy as np

    bindings = gin.get_bindings("templm.train")
    study = None
    if gin.get_bindings("templm.Study"):
        from templm.experiments.studies import study_from_gin

        study = study_from_gin()
    elif not bindings.get("model"):
        raise ConfigError("nothing to plan: give a training config (gin_configs/temporal.gin ...) or a study "
                          "(gin_configs/study/paper.gin), and a mesh config")
    mesh_bindings = gin.get_bindings("templm.make_mesh")
    if mesh_bindings.get("mesh_shape"):
        shape = mesh_bindings["mesh_shape"]
        if (not isinstance(shape, (tuple, list)) or len(shape) != 2
                or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in shape)):
            raise ConfigError(f"templm.make_mesh.mesh_shape: expected (data, model), two whole numbers of at least 1, "
                              f"got {shape!r}")
        shape = tuple(shape)
    elif FLAGS.devices:
        partitions = int(mesh_bindings.get("num_partitions", 1))
        if FLAGS.devices % partitions:
            raise ConfigError(f"--devices {FLAGS.devices} does not divide into num_partitions {partitions}")
        shape = (FLAGS.devices // partitions, partitions)
    else:
        raise ConfigError("the mesh config sets no templm.make_mesh.mesh_shape: give --devices N (e.g. 8 for "
                          "gin_configs/mesh/gpu_8.gin)")
    kind = FLAGS.device_kind
    if kind is None:
        names = " ".join(FLAGS.gin_file)
        kind = next((k for key, k in (("tpu_v3", "tpu_v3"), ("tpu_v4", "tpu_v4"), ("gpu", "a100_80")) if key in names),
                    None)
        if kind is None:
            raise ConfigError("give --device_kind (no tpu_v3, tpu_v4 or gpu in the mesh config's name)")
    # Fake CPU devices laid out as the mesh: set before JAX starts its backend (nothing has used it yet).
    n = int(np.prod(shape))
    flags_now = [f for f in os.environ.get("XLA_FLAGS", "").split() if "host_platform_device_count" not in f]
    os.environ["XLA_FLAGS"] = " ".join(flags_now + [f"--xla_force_host_platform_device_count={n}"])
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax

    from templm.training import partitioning
    from templm.training.optimizers import make_optimizer
    from templm.training.plan import describe, plan

    devices = jax.devices("cpu")
    if len(devices) < n:  # JAX had started already (a library touched it while the configs were read): start again
        if os.environ.get("TEMPLM_PLAN_DEVICES") == str(n):
            raise ConfigError(f"the mesh needs {n} devices and JAX started with {len(devices)}")
        os.environ["TEMPLM_PLAN_DEVICES"] = str(n)
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(sys.executable, [sys.executable, "-m", "templm.cli", *sys.argv[1:]])
    mesh = partitioning.make_mesh(mesh_shape=shape, devices=devices[:n])
    if study is not None:
        _plan_study(study, mesh, kind)
        return
    optimizer = bindings.get("optimizer") or make_optimizer()
    result = plan(bindings["model"], optimizer, bindings["task_feature_lengths"], int(bindings["batch_size"]), mesh,
                  partitioning.logical_axis_rules(), int(bindings.get("microbatches", 1)), kind, FLAGS.compile)
    print(describe(result, " + ".join(os.path.basename(f) for f in FLAGS.gin_file)))


def _plan_study(study, mesh, kind):
    """`templm plan` of a study: every training of it, with its verdict. The T5 trainings share one step (the same
    model, batch and lengths), the two Transformer-XL trainings another; each is compiled once."""
    from templm.experiments.reproduce import t5_config
    from templm.models.t5 import EncoderDecoderModel
    from templm.models.transformer_xl import TransformerXLConfig
    from templm.training import partitioning
    from templm.training.optimizers import learning_rate_schedule, make_optimizer
    from templm.training.plan import describe, plan, plan_lm

    p, sp = study.preset, study.stream
    rules = partitioning.logical_axis_rules()
    t5 = plan(EncoderDecoderModel(t5_config(p)), make_optimizer(name="adafactor", learning_rate=p.learning_rate),
              {"inputs": p.inputs_length, "targets": p.targets_length}, p.batch_size, mesh, rules, 1, kind,
              FLAGS.compile)
    print(describe(t5, f"{p.name} study, T5 v1.1 {p.base_model}, batch {p.batch_size}"))
    txl_config = TransformerXLConfig(vocab_size=sp.model_vocab_size, **sp.model)
    txl = plan_lm(txl_config, make_optimizer("adam", learning_rate_schedule("cosine", sp.learning_rate, sp.warmup,
                                                                            sp.train_steps), max_grad_norm=0.25),
                  sp.batch_size, mesh, rules, kind, FLAGS.compile)
    print(describe(txl, f"{p.name} study, Transformer-XL {sp.model.get('n_layer')} layers, batch {sp.batch_size}"))

    def verdict(result):
        if result["uneven"]:
            return "does not shard"
        if result["fits"] is None:
            return "not compiled (--nocompile)"
        return ("fits" if result["fits"] else "does not fit") + \
            f" ({100 * result['bytes']['total'] / result['device_memory']:.1f}%)"

    trainings = [("uniform", p.steps, t5), ("temporal", p.steps, t5), ("each yearly expert", p.yearly_steps, t5),
                 ("retrain (Temporal from scratch)", p.retrain_steps, t5)]
    trainings += [(f"adapt_{regime}alpha{a}", p.adapt_steps, t5) for regime in ("", "uniform_") for a in p.alphas]
    trainings += [("time_stratified (Transformer-XL)", sp.train_steps, txl), ("control (Transformer-XL)",
                                                                                sp.train_steps, txl)]
    print(f"every training of the {p.name} study on {mesh.size} {kind} devices:")
    for name, steps, result in trainings:
        print(f"  {name:34s} {steps:>7,} steps  {verdict(result)}")


def _define_eval():
    flags.DEFINE_string("split", "test", "Which split to evaluate.")
    flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest).")
    flags.DEFINE_string("eval_task", None, "Evaluate this task or mixture instead of the config's.")
    flags.DEFINE_integer("num_examples", None, "At most this many examples per task: the first N of the split, which "
                         "come in year order (the command names the years left out).")
    _bounds(step=(0, None), num_examples=(1, None))
    flags.DEFINE_string("out", None, "Write eval_<split>.json and .md here (default: MODEL_DIR).")
    import templm.evaluation.checkpoint_eval  # noqa: F401  (registers templm.evaluate_checkpoint for the configs)


def _main_eval():
    from templm.evaluation.checkpoint_eval import evaluate_checkpoint
    from templm.io import write_json
    from templm import tasks
    from templm.reports.evaluation import metrics_table, subset_notes, write_eval_report

    _configure_tasks()
    if FLAGS.out:
        _writable_folder(FLAGS.out, "--out")  # before the evaluation, not after it
    result = evaluate_checkpoint(split=FLAGS.split, step=FLAGS.step, num_examples=FLAGS.num_examples,
                                 eval_mixture_or_task_name=FLAGS.eval_task)
    base = os.path.join(FLAGS.out or result["model_dir"], f"eval_{FLAGS.split}")
    os.makedirs(os.path.dirname(base), exist_ok=True)
    write_json(base + ".json", result)
    write_eval_report(result, base + ".md")
    years = (tasks.current().get("manifest") or {}).get("years", ())
    for note in subset_notes(result["metrics"], FLAGS.num_examples, years):
        console.warn(note)
    print(metrics_table(result["metrics"]))


def _define_infer():
    flags.DEFINE_string("input", None, "JSON lines with `inputs` (model input text), or TempLAMA lines (`query` with "
                        "_X_ and `date`), to answer.", required=True)
    flags.DEFINE_string("output", None, "JSON lines written here: the input fields plus `prediction`.",
                        required=True)
    flags.DEFINE_enum("regime", "temporal", ["temporal", "uniform"], "For TempLAMA lines: as the regime's model "
                      "reads them (temporal: prefixed `year: YYYY `; uniform: as they are).")
    flags.DEFINE_enum("method", "greedy", ["greedy", "beam"], "Decoding.")
    import templm.evaluation.checkpoint_eval  # noqa: F401  (registers templm.infer_checkpoint for the configs)


def _read_inference_inputs(path: str, regime: str):
    from templm.data import regimes
    from templm.data.readers import open_text
    from templm.data.salient_spans import cloze_to_ssm
    from templm.errors import DataError

    rows, texts = [], []
    with open_text(path) as f:
        for lineno, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                row = json.loads(raw)
                if "inputs" in row:
                    text = str(row["inputs"])
                else:
                    text = regimes.regime(regime).model_input(int(row["date"]), cloze_to_ssm(row["query"]))
            except (ValueError, KeyError, TypeError) as e:
                raise DataError(f"expected a JSON object with `inputs`, or `query` and `date`: {e}", path,
                                lineno) from None
            rows.append(row)
            texts.append(text)
    return rows, texts


def _main_infer():
    from templm.evaluation.checkpoint_eval import infer_checkpoint
    from templm.io import atomic_write

    if os.path.isdir(FLAGS.output):
        raise ConfigError(f"--output {FLAGS.output} is a folder; expected the path of a JSON lines file")
    _writable_folder(os.path.dirname(os.path.abspath(FLAGS.output)), "--output's folder")  # before the inference
    rows, texts = _read_inference_inputs(FLAGS.input, FLAGS.regime)
    _configure_tasks()
    predictions = infer_checkpoint(texts, method=FLAGS.method)
    atomic_write(FLAGS.output, "".join(
        json.dumps({**row, "model_inputs": text, "prediction": prediction}, ensure_ascii=False) + "\n"
        for row, text, prediction in zip(rows, texts, predictions)))
    print(json.dumps({"output": FLAGS.output, "predictions": len(predictions)}))


def _define_data_calm():
    flags.DEFINE_string("out", None, "Output folder: the CALM corpus (<class>.txt and vocab/<class>.vocab).",
                        required=True)
    _define_overwrite()
    flags.DEFINE_string("world_dir", None, "Build from the embedded world in this folder (one class per news "
                        "domain); a folder that does not exist gets a world generated first (--seed, WorldConfig "
                        "gin bindings).")
    flags.DEFINE_string("texts", None, "Build from the *.txt files of this folder (one class per file).")
    flags.DEFINE_enum("level", "word", ["word", "char"], "Token level of the vocabulary files.")
    flags.DEFINE_list("domains", None, "World domains to keep (default all: sports, politics, business, education, "
                      "technology, weather, health).")
    flags.DEFINE_integer("seed", None, "Seed of a generated world (default 0, or the gin binding WorldConfig.seed).")
    _bounds(seed=(0, None))
    _world_configurable()


def _main_data_calm():
    from templm.data.calm_corpus import build_calm_corpus_from_texts, build_world_corpus

    if bool(FLAGS.world_dir) == bool(FLAGS.texts):
        raise ConfigError("give exactly one of --world_dir DIR (the embedded world) and --texts DIR (*.txt files)")
    if FLAGS.texts:
        if FLAGS.domains or FLAGS.seed is not None:
            raise ConfigError("--domains and --seed apply to --world_dir only")
        summary = {"classes": build_calm_corpus_from_texts(FLAGS.texts, FLAGS.out, FLAGS.level,
                                                           overwrite=FLAGS.overwrite)}
    else:
        world = _world_config(**({} if FLAGS.seed is None else {"seed": FLAGS.seed}))
        summary = build_world_corpus(FLAGS.world_dir, FLAGS.out, FLAGS.level, FLAGS.domains, world,
                                     overwrite=FLAGS.overwrite)
    print(json.dumps({"out": FLAGS.out, "level": FLAGS.level, **summary}))


def _define_calm():
    import templm.experiments.calm  # noqa: F401  (registers templm.run_calm for the configs)

    _world_configurable()


def _main_calm():
    from templm.experiments.calm import run_calm
    from templm.reports.calm import write_calm_report

    results = run_calm()
    paths = write_calm_report(results, results["config"]["out_dir"])
    with open(paths["report.md"], encoding="utf-8") as f:
        print(f.read())


def _define_is_eval():
    flags.DEFINE_string("out", None, "Output folder for is_eval.json, is_eval.md and is_eval.png.", required=True)
    flags.DEFINE_enum("model", "hmm", ["hmm", "kglm"], "hmm: a hidden Markov LM whose exact perplexity the forward "
                      "algorithm gives (the estimator's check); kglm: the knowledge-graph LM with latent entity "
                      "mentions, trained on the world's annotated news with its proposal (Logan et al.'s "
                      "experiments).")
    flags.DEFINE_integer("seed", 0, "Seed of the model, its data and the proposal samples.")
    flags.DEFINE_list("ks", None, "Sample counts K (default 1, 2, 4, ..., 256 for hmm; up to 128 for kglm).")
    flags.DEFINE_list("temperatures", ["0.5", "2.0"], "Temperatures of the tempered proposals.")
    flags.DEFINE_integer("repeats", None, "Independent runs at the largest K, more at smaller K (default 8 for hmm, "
                         "4 for kglm).")
    flags.DEFINE_integer("num_states", 6, "hmm: hidden states.")
    flags.DEFINE_integer("vocab_size", 12, "hmm: vocabulary.")
    flags.DEFINE_integer("num_docs", 12, "hmm: documents drawn from the HMM.")
    flags.DEFINE_integer("doc_length", 24, "hmm: longest document, in tokens.")
    flags.DEFINE_float("mean_sentence_length", 6.0, "hmm: mean sentence length, in tokens.")
    flags.DEFINE_float("peakedness", 1.5, "hmm: how peaked the HMM's random distributions are.")
    flags.DEFINE_string("world_dir", None, "kglm: a world folder (templm data world); default: the embedded world "
                        "drawn from --seed at the smoke study's size, into OUT/world.")
    flags.DEFINE_integer("test_docs", 40, "kglm: the world's latest documents evaluated; the model and its proposal "
                         "train on the others.")
    flags.DEFINE_integer("train_steps", 400, "kglm: training steps of the model and of the proposal.")
    flags.DEFINE_float("gold_weight", 0.9, "kglm: the share of each decision's probability the proposal that sees "
                       "the gold annotations gives the annotated option (0: no such proposal).")
    flags.DEFINE_integer("exact_sentences", 2, "kglm: the exact check sums every reading of the test documents' "
                         "first N sentences (0: no check).")
    _bounds(seed=(0, None), repeats=(1, None), num_states=(1, 4096), vocab_size=(1, 1 << 20), num_docs=(1, None),
            doc_length=(2, None), mean_sentence_length=(1, None), peakedness=(0, None), test_docs=(2, None),
            train_steps=(1, None), gold_weight=(0, 0.999), exact_sentences=(0, None))

    def numbers_above_0(kind):
        def ok(values):
            if values is None:
                return True
            try:
                return all(kind(v) > 0 and math.isfinite(kind(v)) for v in values)
            except ValueError:
                return False
        return ok

    flags.register_validator("ks", numbers_above_0(int), message="--ks must be a comma-separated list of whole "
                             "numbers of at least 1")
    flags.register_validator("temperatures", numbers_above_0(float), message="--temperatures must be a "
                             "comma-separated list of finite numbers above 0")


def _main_is_eval():
    from templm.experiments.importance_sampling import run_is_eval, run_latent_is_eval
    from templm.reports.importance_sampling import write_is_report

    ks = None if FLAGS.ks is None else [int(k) for k in FLAGS.ks]
    temperatures = [float(t) for t in FLAGS.temperatures]
    if FLAGS.model == "kglm":
        _load_tensorflow(quiet=_STATE["verbosity"] < 1)  # the trainer's summary writers load it
        result = run_latent_is_eval(FLAGS.out, FLAGS.seed, world_dir=FLAGS.world_dir,
                                    ks=ks or [2 ** i for i in range(8)], repeats=FLAGS.repeats or 4,
                                    temperatures=temperatures, gold_weight=FLAGS.gold_weight,
                                    test_docs=FLAGS.test_docs, train_steps=FLAGS.train_steps,
                                    exact_sentences=FLAGS.exact_sentences)
    else:
        result = run_is_eval(FLAGS.out, FLAGS.seed, ks=ks or [2 ** i for i in range(9)],
                             temperatures=temperatures, repeats=FLAGS.repeats or 8, num_states=FLAGS.num_states,
                             vocab_size=FLAGS.vocab_size, num_docs=FLAGS.num_docs, doc_length=FLAGS.doc_length,
                             mean_sentence_length=FLAGS.mean_sentence_length, peakedness=FLAGS.peakedness)
    paths = write_is_report(result, FLAGS.out)
    with open(paths["md"], encoding="utf-8") as f:
        print(f.read())


def _define_reproduce():
    from templm.experiments.studies import register_gin, study_names

    register_gin()  # templm.Study and templm.StreamStudy, before gin parses the study files
    flags.DEFINE_enum("preset", "smoke", study_names(), "The study, gin_configs/study/PRESET.gin, parsed before any "
                      "--gin_file (which may bind templm.Study / templm.StreamStudy on top, or be a whole study: "
                      "study/paper.gin). smoke: every stage in minutes on 2 CPU cores (the demo); small: sized to show "
                      "the findings; tiny_test: the test suite's; paper: the papers' settings (an accelerator slice).")
    flags.DEFINE_string("out", None, "Output folder: report.md, figures/, results.json, data/, models/.",
                        required=True)
    flags.DEFINE_integer("seed", 0, "Seed of the world, the splits, the initialisation and the data order.")
    flags.DEFINE_list("seeds", None, "Several seeds (e.g. 0,1,2): the study once per seed into OUT/seed_<S>, then "
                      "every finding tested over the seeds and every number as mean and 95% interval in OUT.")
    flags.DEFINE_integer("num_seeds", None, "The same as --seeds 0,1,...,N-1.")
    _bounds(seed=(0, None), num_seeds=(1, None))
    flags.DEFINE_boolean("streaming", True, "Also run the Transformer-XL half (TIME-STRATIFIED vs CONTROL streaming "
                         "perplexity, dynamic evaluation) after the T5 stages.")
    _define_overwrite()
    # Your own data instead of the embedded world (README, "The study on your own data").
    flags.DEFINE_multi_string("corpus", None, "A dated news corpus for the study instead of the embedded world. "
                              + CORPUS_HELP)
    flags.DEFINE_string("templama_dir", None, "The TempLAMA release the time-aware half asks ({train,val,test}.json "
                        "as released, or .jsonl); without it that half is skipped.")
    flags.DEFINE_string("task_data", None, "Task data prepared by `templm data tasks` (what TEMPLM_DATA_DIR names) "
                        "instead of --corpus and --templama_dir.")
    flags.DEFINE_string("calibration", None, "Calibration relations (JSON lines, as the world's calibration.jsonl); "
                        "without them the calibration probe is skipped on your data.")
    flags.DEFINE_multi_string("stream_corpus", None, "The streaming half's corpus (default: --corpus, or the corpus "
                              "the task data was built from).")
    flags.DEFINE_string("split_dir", None, "TIME-STRATIFIED / CONTROL split files for the streaming half: the paper's "
                        "published split_<cut-off>/ folder, or `templm data splits` output.")
    flags.DEFINE_string("cutoff", None, "The streaming half's cut-off (YYYY-MM-DD) when no --split_dir; default: the "
                        "latest whose 3 validation and the preset's test months end with the corpus.")
    _define_distributed()  # the same command on every host of a slice (WORKSPACE.md)


def _study_data():
    """The --corpus ... flags of `templm reproduce` as a StudyData (the embedded world without any)."""
    from templm.experiments.reproduce import StudyData

    return StudyData(corpus=_corpus_flag(), templama_dir=FLAGS.templama_dir, task_data=FLAGS.task_data,
                     calibration=FLAGS.calibration, stream_corpus=_corpus_value(FLAGS.stream_corpus),
                     split_dir=FLAGS.split_dir, cutoff=FLAGS.cutoff)


def _reproduce_seeds() -> Optional[List[int]]:
    """The seeds of --seeds / --num_seeds, or None for a single-seed run (--seed)."""
    if FLAGS.seeds is not None and FLAGS.num_seeds is not None:
        raise ConfigError("give --seeds or --num_seeds, not both")
    if FLAGS.num_seeds is not None:
        if FLAGS.num_seeds < 1:
            raise ConfigError(f"--num_seeds must be at least 1, got {FLAGS.num_seeds}")
        return list(range(FLAGS.num_seeds))
    if FLAGS.seeds is None:
        return None
    try:
        seeds = [int(s) for s in FLAGS.seeds]
    except ValueError:
        raise ConfigError("--seeds: expected a comma-separated list of integers, got "
                          f"{','.join(FLAGS.seeds)!r}") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise ConfigError(f"--seeds: expected distinct seeds, got {','.join(FLAGS.seeds)!r}")
    return seeds


def _main_reproduce():
    from templm.experiments.reproduce import reproduce, reproduce_seeds, reproduction_folder
    from templm.experiments.studies import study_from_gin
    from templm.reports.reproduction import write_report, write_seeds_report
    from templm.training.partitioning import is_lead

    _join_processes()  # multi-host: every host runs this command; process 0 writes the results and the report
    extra = None if FLAGS.streaming else []
    seeds = _reproduce_seeds()
    data = _study_data()
    study = study_from_gin()  # study/PRESET.gin, then --gin_file and --gin bindings
    name = study.preset.name
    with reproduction_folder(FLAGS.out, FLAGS.overwrite) as out:  # before any work; the report under the lock
        if seeds is None:
            results = reproduce(study.preset, out, FLAGS.seed, extra_stages=extra, overwrite=FLAGS.overwrite,
                                data=data, stream_preset=study.stream)
        else:
            results = reproduce_seeds(study.preset, out, seeds, extra_stages=extra, overwrite=FLAGS.overwrite,
                                      data=data, stream_preset=study.stream)
        if not is_lead():
            return
        paths = write_report(results, out) if seeds is None else write_seeds_report(results, out)
    if seeds is None:
        print(f"templm reproduce: {name} preset, seed {FLAGS.seed}: {paths['report']}")
    else:
        print(f"templm reproduce: {name} preset, seeds {','.join(map(str, seeds))}: {paths['report']}")
    for finding, item in results["findings"].items():  # both halves, one shape (templm.metrics.findings)
        print(f"  {finding}: {item['verdict']} ({item['evidence']})")


def _define_train_lm():
    import templm.training.lm_trainer  # noqa: F401  (registers train_lm and TransformerXLConfig for the configs)


def _main_train_lm():
    from templm.io import jsonable
    from templm.training import lm_trainer

    result = lm_trainer.train_lm()
    print(json.dumps(jsonable({k: v for k, v in result.items() if k not in ("params", "mems")})))


def _define_stream():
    import templm.experiments.streaming  # noqa: F401  (registers stream_evaluation and the LM configurables)


def _main_stream():
    from templm.experiments.streaming import stream_evaluation
    from templm.metrics.stream import summarize
    from templm.reports.stream import write_stream_report

    results = stream_evaluation()
    out_dir = os.path.dirname(results["files"]["results.json"])
    files = {**results["files"], **write_stream_report(results, out_dir)}
    print(json.dumps({**summarize(results), "files": files}, indent=1))
    return 0


def _define_appendices():
    from templm.experiments.studies import study_names

    flags.DEFINE_string("out", None, "Output folder: shifted/ and distance/ (the runs), results.json, report.md, "
                        "figures/.", required=True)
    flags.DEFINE_enum("preset", "smoke", study_names(), "The study whose streaming sizes (templm.StreamStudy) the "
                      "models, the world and the test period take.")
    flags.DEFINE_integer("seed", 0, "Seed of the world, the splits, the tokenizers and the models.")
    flags.DEFINE_list("which", ["shifted", "distance"], "The appendices: shifted (B, other test periods), distance "
                      "(C, training sets further and further before the test period).")
    flags.DEFINE_list("shifts", ["0", "1", "2"], "Appendix B: years the cut-off moves back, one test period each.")
    flags.DEFINE_list("gaps", ["0", "6", "12", "18", "24"], "Appendix C: months between the end of each training set "
                      "and the cut-off.")
    flags.DEFINE_multi_string("corpus", None, "A dated corpus (any format templm reads; a file or a quoted glob) "
                              "instead of the embedded world.")
    _bounds(seed=(0, None))

    def whole_numbers(values):
        try:
            return all(int(v) >= 0 for v in values) and len(values) > 0
        except ValueError:
            return False

    flags.register_validator("which", lambda v: bool(v) and set(v) <= {"shifted", "distance"},
                             message="--which must be shifted, distance or both, comma-separated")
    flags.register_validator("shifts", whole_numbers, message="--shifts must be whole numbers of years (0 or more)")
    flags.register_validator("gaps", whole_numbers, message="--gaps must be whole numbers of months (0 or more)")


def _main_appendices():
    from templm.experiments.appendices import run_appendices
    from templm.reports.appendices import write_appendices_report

    results = run_appendices(FLAGS.out, FLAGS.which, FLAGS.preset, FLAGS.seed, [int(s) for s in FLAGS.shifts],
                             [int(g) for g in FLAGS.gaps], _corpus_flag())
    paths = write_appendices_report(results, os.path.abspath(FLAGS.out))
    with open(paths["report.md"], encoding="utf-8") as f:
        print(f.read())
    return 0


VERBS: Dict[str, Verb] = {v.name: v for v in [
    Verb("data world", "Generate the embedded temporal world: news, TempLAMA queries, calibration queries, facts.",
         _define_data_world, _main_data_world, takes_gin=True),
    Verb("data stats", "Read a corpus (JSONL, WMT news-docs, arXiv OAI) and print documents and words per year.",
         _define_data_stats, _main_data_stats),
    Verb("data splits", "TIME-STRATIFIED / CONTROL splits (Mind the Gap) and yearly buckets of a corpus.",
         _define_data_splits, _main_data_splits),
    Verb("data spm", "Train a SentencePiece vocabulary on a corpus or one of its splits.",
         _define_data_spm, _main_data_spm),
    Verb("data templama", "Build TempLAMA from a Wikidata JSON dump (nine relations, any years).",
         _define_data_templama, _main_data_templama),
    Verb("data cronquestions", "Convert a CronQuestions release (its pickles read as plain data only) into the "
         "record files of the `cronquestions` SeqIO task.", _define_data_cronquestions, _main_data_cronquestions,
         tensorflow=True),
    Verb("train", "Train a T5 model from gin configs (T5X style), sharded over the device mesh, resumable.",
         _define_train, _main_train, takes_gin=True, tensorflow=True),
    Verb("plan", "Per-device memory of a T5 training config on a mesh (parameters, optimizer, compiled step) and "
         "whether it fits, without allocating it.", _define_plan, _main_plan, takes_gin=True, tensorflow=True),
    Verb("eval", "Evaluate a trained checkpoint on a task's split: EM/F1 and perplexity by year and slice.",
         _define_eval, _main_eval, takes_gin=True, tensorflow=True),
    Verb("reproduce", "The time-aware T5 study end to end on the embedded world or your data: Uniform/Temporal/Yearly "
         "models, evaluation, future probes, adaptation, Transformer-XL streaming, findings, report.",
         _define_reproduce, _main_reproduce, takes_gin=True, tensorflow=True,
         gin_first=lambda: [f"study/{FLAGS.preset}.gin"]),
    Verb("infer", "Predictions of a trained checkpoint for a JSON-lines file of inputs or TempLAMA queries.",
         _define_infer, _main_infer, takes_gin=True, tensorflow=True),
    Verb("data tasks", "Build the record files behind the SeqIO tasks (SSM examples, TempLAMA, vocabulary).",
         _define_data_tasks, _main_data_tasks, takes_gin=True, tensorflow=True),
    Verb("data calm", "Build a CALM corpus (one class per file) from the embedded world's news domains or text files.",
         _define_data_calm, _main_data_calm, takes_gin=True),
    Verb("calm", "CALM: a Transformer-XL online learner (dynamic evaluation) vs a static baseline, switching stream.",
         _define_calm, _main_calm, takes_gin=True),
    Verb("is-eval", "Importance-sampled perplexity against K per proposal and level: an HMM LM with its exact value, "
         "or the knowledge-graph LM (--model=kglm) with Logan et al.'s effects.",
         _define_is_eval, _main_is_eval),
    Verb("train-lm", "Train a Transformer-XL LM on a TIME-STRATIFIED or CONTROL split (gin: txl/*.gin), resumable.",
         _define_train_lm, _main_train_lm, takes_gin=True, tensorflow=True),
    Verb("stream", "Perplexity per test month, TIME-STRATIFIED vs CONTROL, static and dynamic (txl/dynamic_eval.gin).",
         _define_stream, _main_stream, takes_gin=True, tensorflow=True),
    Verb("appendices", "Mind the Gap's appendices: the gap in shifted test periods (B) and against the distance "
         "between training and test (C), with their figures.", _define_appendices, _main_appendices,
         tensorflow=True),
]}


# Earlier spellings, still accepted but not listed.
ALIASES = {"train_lm": "train-lm", "is_eval": "is-eval"}


# -- dispatch -------------------------------------------------------------------------------------------------------

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


_STATE: Dict[str, Any] = {"verbosity": 0}  # the run's --verbosity, for a verb that loads TensorFlow only sometimes


def _load_tensorflow(quiet: bool) -> None:
    """Loads TensorFlow for a verb that uses it (for tf.data and record files only) and hides the GPUs from it, as
    T5X does, so that it never takes accelerator memory from JAX. TensorFlow's native libraries write start-up and
    CUDA-probe lines straight to the process's standard error, before any log setting applies; when `quiet`, that
    descriptor points at /dev/null while it loads and looks for devices."""
    with console.silenced_stderr() if quiet else contextlib.nullcontext():
        import tensorflow as tf

        tf.config.set_visible_devices([], "GPU")


def _verb_help(v: Verb) -> str:
    own = [f for f in FLAGS.get_flags_for_module(sys.modules[__name__])]
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


def run(argv: Optional[Sequence[str]] = None) -> None:
    """Console entry point: picks the verb, defines its flags, and runs it as an absl app."""
    argv = list(sys.argv if argv is None else argv)
    name, rest = _split_verb(argv[1:])
    if name is None:
        words = [a for a in argv[1:] if not a.startswith("-")]
        prefix = " ".join(words)
        if words and not any(n.startswith(prefix + " ") for n in VERBS):
            print(f"templm: unknown verb {prefix!r}\n\n{_usage()}", file=sys.stderr)
            sys.exit(2)
        print(_usage(prefix + " " if words else ""))
        sys.exit(0 if any(a in ("-h", "--help", "--helpfull") for a in argv[1:]) or not words else 2)
    verbosity, rest = _verbosity(rest)
    _STATE["verbosity"] = verbosity
    v = VERBS[name]
    if verbosity < 1:
        _quiet_libraries()
    # Loading TensorFlow and the verb's modules takes seconds. A Ctrl-C meanwhile is noted and answered once they
    # are loaded: raised inside TensorFlow's import it aborts the process (SIGABRT) or prints a long traceback.
    started = signal.getsignal(signal.SIGINT)
    stopped = []
    signal.signal(signal.SIGINT, lambda *_: stopped.append(True))
    try:
        if v.tensorflow:
            _load_tensorflow(quiet=verbosity < 1)
        v.define()
    finally:
        signal.signal(signal.SIGINT, started)
    if stopped:
        print(f"templm {name}: interrupted while starting; nothing was written", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)
    if v.takes_gin:
        define_gin_flags()
    flags.DEFINE_enum("progress", "lines", console.PROGRESS_MODES, "How long work shows its progress: lines (lines "
                      "with the rate and the ETA; inside a study or an evaluation one at most every "
                      f"{console.LONG_WORK_SECONDS:.0f} s), bar (a bar on the terminal) or none.")
    if any(a in ("-h", "--help", "--helpshort", "--helpfull") for a in rest):
        print(_verb_help(v))
        sys.exit(0)
    try:
        rest = rewrite_gin_args(rest)
    except ConfigError as e:
        print(f"templm {name}: error: {e}", file=sys.stderr)
        sys.exit(EXIT_USAGE)

    # Error lines go through a copy of standard error taken now: after a failed checkpoint save the library's
    # threads are silenced on standard error itself (templm.training.checkpoints).
    err = os.fdopen(os.dup(sys.stderr.fileno()), "w", buffering=1, encoding="utf-8", errors="replace")

    def last_words(status):
        """After the error line, the process ends: library threads that fail on the way out (orbax's writes after
        a failed save print a traceback each) are not shown, unless --verbosity asks for library output."""
        if status and verbosity < 1:
            err.flush()
            sys.stderr.flush()
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 2)
        return status

    def main(_):
        if verbosity < 1:  # absl would log at INFO; --verbosity=1 keeps its own setting (INFO and debug lines)
            logging.set_verbosity(logging.FATAL)  # libraries' errors surface as exceptions, which we print
        console.set_progress(FLAGS.progress)
        try:
            note_sigint()
            note_sigterm()
            if v.takes_gin:
                first = v.gin_first() if v.gin_first else []
                parse_gin(first + list(FLAGS.gin_file), FLAGS.gin_bindings, FLAGS.gin_search_paths)
            status = v.main() or 0
            check_interrupted()  # a Ctrl-C whose KeyboardInterrupt was dropped on the way
            return status
        except Preempted as e:
            print(f"templm {name}: {_message(e)}", file=err)
            return last_words(EXIT_PREEMPTED)
        except TrainingError as e:
            print(f"templm {name}: error: {_message(e)}", file=err)
            return last_words(EXIT_TRAINING)
        except (ValueError, FileNotFoundError) as e:  # DataError, ConfigError and bad values: the input's fault
            logging.debug("templm %s failed", name, exc_info=True)  # the traceback, with --verbosity=1
            print(f"templm {name}: error: {_message(e)}", file=err)
            return last_words(EXIT_BAD_INPUT)
        except OSError as e:  # the file system: a path of the wrong kind, no permission, a full disk
            logging.debug("templm %s failed", name, exc_info=True)
            where = f"{e.filename}: " if getattr(e, "filename", None) else ""
            print(f"templm {name}: error: {where}{e.strerror or _message(e)} (nothing half-written was left)",
                  file=err)
            code = e.errno
            if code is None:  # gin re-raises an error from inside a configurable as a copy without its errno
                match = re.match(r"\[Errno (\d+)\]", str(e))
                code = int(match.group(1)) if match else None
            return last_words(EXIT_SYSTEM if code in SYSTEM_ERRNOS else EXIT_BAD_INPUT)
        except KeyboardInterrupt:
            print(f"templm {name}: interrupted; nothing half-written was left (a training run resumes from its last "
                  "checkpoint when run again)", file=err)
            return last_words(EXIT_INTERRUPTED)
        except Terminated:
            print(f"templm {name}: stopped by SIGTERM; nothing half-written was left and no result was written: run "
                  "the same command again", file=err)
            return last_words(EXIT_PREEMPTED)

    def parse_flags(args):
        """absl's parse, with a bad or missing flag as one line of ours and the usage status."""
        try:
            return FLAGS(args)
        except flags.Error as e:
            print(f"templm {name}: error: {e} (templm {name} --help lists the flags)", file=sys.stderr)
            sys.exit(EXIT_USAGE)

    app.run(main, argv=[f"templm {name}"] + rest, flags_parser=parse_flags)


if __name__ == "__main__":
    run()
