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
"""

from templm.cli.dispatch import ALIASES, VERBS, main, run
from templm.cli.options import REPO_ROOT, parse_gin, rewrite_gin_args

__all__ = ["ALIASES", "VERBS", "REPO_ROOT", "main", "parse_gin", "rewrite_gin_args", "run"]
