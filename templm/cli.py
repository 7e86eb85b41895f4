"""`templm <verb>`: the command line. An absl app per verb, with T5X-style gin flags for verbs that take a config.

    templm data world --out runs/world
    templm data stats --corpus news.jsonl
    templm train --gin_file=gin_configs/temporal.gin --gin.MODEL_DIR="'runs/temporal'"

`templm --help` lists the verbs; `templm VERB --help` lists a verb's flags. Bad input (a malformed line, a missing
file, a misspelled gin binding) is printed as one message naming the file and line, and the exit status is 1.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import os
import sys
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from absl import app, flags, logging

from templm.data.records import DataError

FLAGS = flags.FLAGS
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class ConfigError(ValueError):
    """A gin file or binding that cannot be applied; the message names the file or binding."""


@dataclasses.dataclass(frozen=True)
class Verb:
    name: str
    help: str
    define: Callable[[], None]  # defines the verb's flags on FLAGS
    main: Callable[[], Optional[int]]  # runs with FLAGS parsed
    takes_gin: bool = False


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

    paths = list(search_paths) + [os.getcwd(), REPO_ROOT]
    for path in paths:
        gin.add_config_file_search_path(path)
    resolved = []
    for name in files:
        found = next((os.path.join(p, name) for p in [""] + paths if os.path.isfile(os.path.join(p, name))), None)
        if found is None:
            raise ConfigError(f"{name}: gin file not found (searched {', '.join(paths)})")
        resolved.append(found)
    try:
        gin.parse_config_files_and_bindings(resolved, list(bindings), finalize_config=False)
    except (ValueError, KeyError, SyntaxError, TypeError) as e:  # gin names the file/binding and line
        raise ConfigError(f"gin: {e}") from None


# -- data verbs ---------------------------------------------------------------------------------------------------

def _define_data_world():
    flags.DEFINE_string("out", None, "Output folder.", required=True)
    flags.DEFINE_integer("seed", None, "Random seed (default 0, or the gin binding WorldConfig.seed).")
    flags.DEFINE_integer("start_year", None, "First year (default 2010).")
    flags.DEFINE_integer("end_year", None, "Last year (default 2020).")
    flags.DEFINE_integer("subjects_per_relation", None, "Subjects per TempLAMA relation (default 40).")
    flags.DEFINE_integer("docs_per_month", None, "News documents per month (default 60).")
    _world_configurable()  # registered before gin parses, so `--gin.WorldConfig.seed=3` binds


@functools.lru_cache(maxsize=None)
def _world_configurable():
    import gin
    from templm.data.world import WorldConfig

    return gin.external_configurable(WorldConfig, name="WorldConfig", module="templm")


def _main_data_world():
    from templm.data.world import generate_world

    make_config = _world_configurable()
    overrides = {name: FLAGS[name].value for name in
                 ("seed", "start_year", "end_year", "subjects_per_relation", "docs_per_month")
                 if FLAGS[name].value is not None}
    try:
        config = dataclasses.replace(make_config(), **overrides)
    except ValueError as e:
        raise ConfigError(f"WorldConfig: {e}") from None
    stats = generate_world(config, FLAGS.out)
    print(format_world_summary(stats, FLAGS.out))


def format_world_summary(stats: dict, out: str) -> str:
    lines = [f"templm world written to {out}",
             f"  {stats['documents']} documents, {stats['entities']} entities ({stats['emerging_entities']} emerging),"
             f" {stats['facts']} facts",
             f"  TempLAMA: {stats['templama_queries']} queries, "
             + ", ".join(f"{k} {v}" for k, v in stats["templama_splits"].items())
             + f"; {100 * stats['multi_answer_share']:.1f}% with several answers",
             "  year  documents  queries  multi-answer  emerging names"]
    for year, row in stats["by_year"].items():
        lines.append(f"  {year}  {row['documents']:9d}  {row['queries']:7d}  {row['multi_answer_queries']:12d}"
                     f"  {row['emerging_names']:14d}")
    return "\n".join(lines)


def _define_data_stats():
    flags.DEFINE_string("corpus", None, "Corpus file (.gz and .bz2 are read transparently).", required=True)
    flags.DEFINE_enum("format", "auto", ["auto", "jsonl", "wmt", "arxiv"], "Corpus format.")
    flags.DEFINE_enum("on_error", "raise", ["raise", "skip"], "On a bad line: stop, or skip and count it.")


def _main_data_stats():
    from templm.data.readers import read_documents

    reader = read_documents(FLAGS.corpus, FLAGS.format, FLAGS.on_error)
    docs, words = collections.Counter(), collections.Counter()
    for doc in reader:
        docs[doc.date.year] += 1
        words[doc.date.year] += len(doc.text.split())
    print(json.dumps({"corpus": FLAGS.corpus, "documents": sum(docs.values()), "skipped": reader.skipped,
                      "by_year": {str(y): {"documents": docs[y], "words": words[y]} for y in sorted(docs)}}))


VERBS: Dict[str, Verb] = {v.name: v for v in [
    Verb("data world", "Generate the embedded temporal world: news, TempLAMA queries, calibration queries, facts.",
         _define_data_world, _main_data_world, takes_gin=True),
    Verb("data stats", "Read a corpus (JSONL, WMT news-docs, arXiv OAI) and print documents and words per year.",
         _define_data_stats, _main_data_stats),
]}


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
        words.append(arg)
        if " ".join(words) in VERBS:
            return " ".join(words), list(args[len(words):])
    return None, list(args)


def _verb_help(v: Verb) -> str:
    own = [f for f in FLAGS.get_flags_for_module(sys.modules[__name__])]
    lines = [f"usage: templm {v.name} [--flags]", "", v.help, "", "flags:"]
    for flag in sorted(own, key=lambda f: f.name):
        default = "" if flag.default in (None, []) else f" (default: {flag.default!r})"
        lines.append(f"  --{flag.name}: {flag.help}{default}")
    if v.takes_gin:
        lines.append("  --gin.NAME=VALUE: a gin binding, as in T5X (same as --gin_bindings='NAME = VALUE')")
    return "\n".join(lines)


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
    v = VERBS[name]
    v.define()
    if v.takes_gin:
        define_gin_flags()
    if any(a in ("-h", "--help", "--helpshort", "--helpfull") for a in rest):
        print(_verb_help(v))
        sys.exit(0)
    try:
        rest = rewrite_gin_args(rest)
    except ConfigError as e:
        print(f"templm {name}: error: {e}", file=sys.stderr)
        sys.exit(2)

    def main(_):
        try:
            if v.takes_gin:
                parse_gin(FLAGS.gin_file, FLAGS.gin_bindings, FLAGS.gin_search_paths)
            return v.main() or 0
        except (DataError, ConfigError, FileNotFoundError) as e:
            print(f"templm {name}: error: {e}", file=sys.stderr)
            return 1

    logging.set_verbosity(logging.INFO)
    app.run(main, argv=[f"templm {name}"] + rest)


if __name__ == "__main__":
    run()
