"""`templm <verb>`: the command line. An absl app per verb, with T5X-style gin flags for verbs that take a config.

    templm data world --out runs/world
    templm data stats --corpus news.jsonl
    templm train --gin_file=gin_configs/temporal.gin --gin.MODEL_DIR="'runs/temporal'"

`templm.cli.main(["data", "world", "--out", "w"])` runs a verb in this process and returns its exit status, as
`templm data world --out w` would end with; it can be called again in the same process.

`templm --help` lists the verbs; `templm VERB --help` lists a verb's flags. Verbs are words joined by hyphens
(`train-lm`, `is-eval`; earlier spellings such as `train_lm` still work). Exit status (templm.errors): 0 done; 1 bad
input (a malformed line, a missing file, a misspelled gin binding: one message naming the file, line or binding);
2 usage; 3 training cannot go on (a non-finite loss); 75 preempted by SIGTERM (checkpoint saved, nothing reported:
run the same command again to resume).

Output: a verb's result goes to standard output; templm's progress lines and warnings to standard error; library
logs (absl, orbax, clu, TensorFlow, JAX) only with `--verbosity=1` (or `-v`).

Each verb imports its modules when it runs (inside its `_define_*` / `_main_*` functions): they pull in JAX,
TensorFlow and SeqIO, several seconds of start-up that `templm --help` and the light data verbs should not pay.
The package's names are loaded when first asked for: the console script (templm.cli.start) sets its signal notes
before anything else of templm.cli is imported (importing the verbs' table takes a tenth of a second, a SIGTERM in
which ended the process with the signal's default, exit 143, without a word).
"""

_NAMES = {"ALIASES": "dispatch", "VERBS": "dispatch", "main": "dispatch", "run": "dispatch",
          "REPO_ROOT": "options", "parse_gin": "options", "rewrite_gin_args": "options"}

__all__ = sorted(_NAMES)


def __getattr__(name):
    if name not in _NAMES:
        raise AttributeError(f"module 'templm.cli' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"templm.cli.{_NAMES[name]}"), name)
