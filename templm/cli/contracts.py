"""What every verb promises under each fault: the table of docs/failures.md ("Verb by verb"), kept here beside the
verbs' table so that the promise, the page and the suite's fault matrix (tests/test_fault_matrix.py) are one list.
The page's table is written from it by tools/failures_table.py, and the suite fails where the page differs from it,
where a verb of templm.cli.VERBS has no row, or where a cell has no test that checks it.

    from templm.cli.contracts import FAULTS, ROWS, markdown_table
"""

from typing import Dict, List, Tuple

# The fault classes, the table's columns (the exit status each ends with in brackets).
FAULTS: Tuple[str, ...] = (
    "bad input",
    "a bad output folder",
    "full disk (4)",
    "Ctrl-C (130) / SIGTERM (75)",
    "a second run at once",
    "run again",
)

# A cell that is not a promise but the reason the fault cannot happen to the verb is in brackets.
NOT_APPLICABLE = "("

_BAD_FOLDER = ("refused before any work (exit 1): a folder of a user's files or another verb's output (listed, left "
               "alone; `--overwrite` replaces it), '.' or '..', a name too long, a file")

# (verbs, {fault: promise}) in the page's order; each verb in exactly one row.
ROWS: List[Tuple[Tuple[str, ...], Dict[str, str]]] = [
    (("data world", "data tasks", "data calm", "data splits", "data streams", "data templama", "data cronquestions"), {
        "bad input": "exit 1 (file:line, the binding, a missing file named) or 2 (a flag's kind or range), before "
                     "the build where it can be checked; partial removed",
        "a bad output folder": _BAD_FOLDER,
        "full disk (4)": "the file being written named; partial removed, an earlier output whole",
        "Ctrl-C (130) / SIGTERM (75)": "one line, also while starting; partial removed, lock released",
        "a second run at once": "refused, naming the first run (`DIR.lock`)",
        "run again": "builds afresh; replaces a templm output of its kind, refuses other folders unless "
                     "`--overwrite`",
    }),
    (("data spm",), {
        "bad input": "exit 1 or 2, nothing written",
        "a bad output folder": "(writes a file pair at a prefix, no folder)",
        "full disk (4)": "the file named; the earlier `.model`/`.vocab` pair kept",
        "Ctrl-C (130) / SIGTERM (75)": "one line; no temporary file left",
        "a second run at once": "(writes two files atomically; no lock)",
        "run again": "replaces the pair",
    }),
    (("data stats",), {
        "bad input": "exit 1 naming the line (`--on_error skip` counts and lists them)",
        "a bad output folder": "(reads only)",
        "full disk (4)": "(reads only)",
        "Ctrl-C (130) / SIGTERM (75)": "one line",
        "a second run at once": "(reads only)",
        "run again": "the same answer",
    }),
    (("train", "train-lm"), {
        "bad input": "exit 1 naming the binding (its kind or range), before MODEL_DIR is touched",
        "a bad output folder": "MODEL_DIR '.', '..' or a file refused before any work (a user's files beside a "
                               "run are allowed, as in T5X)",
        "full disk (4)": "the file named (a checkpoint's, config.gin); the last good step kept",
        "Ctrl-C (130) / SIGTERM (75)": "a checkpoint saved at the step (SIGTERM, 75, also during the last save or "
                                       "evaluation); Ctrl-C 130; no result reported",
        "a second run at once": "refused (`MODEL_DIR/.templm.lock`)",
        "run again": "resumes bitwise from the newest intact step (damaged ones set aside); other settings than "
                     "the checkpoint's refused, each named; a finished run is kept as it is (its last evaluation run "
                     "if it never finished)",
    }),
    (("eval", "infer"), {
        "bad input": "exit 1 (a step that is not there names the steps there are; a missing input file named)",
        "a bad output folder": "(writes files into MODEL_DIR or `--out`, each whole)",
        "full disk (4)": "the output file named, none left half-written",
        "Ctrl-C (130) / SIGTERM (75)": "one line, no result file",
        "a second run at once": "(reads the run only)",
        "run again": "the same result",
    }),
    (("reproduce",), {
        "bad input": "exit 1 or 2 before any work",
        "a bad output folder": _BAD_FOLDER,
        "full disk (4)": "the file named; earlier results kept",
        "Ctrl-C (130) / SIGTERM (75)": "stops between stages or models (75/130), no result from unfinished work; "
                                       "results.json, report.md and figures put in place together",
        "a second run at once": "refused (`OUT/.templm.lock`)",
        "run again": "keeps every finished model and stage of the same settings, replaces results and report only "
                     "when it has finished; what other settings remove is said first",
    }),
    (("stream", "calm", "is-eval", "appendices"), {
        "bad input": "exit 1 or 2 before any work",
        "a bad output folder": _BAD_FOLDER + " (`--overwrite`, or the gin binding `overwrite` for `stream` and "
                               "`calm`, writes into it)",
        "full disk (4)": "the file named; each result file whole or absent",
        "Ctrl-C (130) / SIGTERM (75)": "one line, no result from unfinished work (dynamic evaluation included); "
                                       "once results.json is written a signal waits for the report and the summary, "
                                       "and the line says the result is complete",
        "a second run at once": "refused (`OUT.lock` beside the folder, for the whole verb), naming the first",
        "run again": "runs again into its own folder",
    }),
    (("plan",), {
        "bad input": "exit 1 naming the binding",
        "a bad output folder": "(writes nothing)",
        "full disk (4)": "(writes nothing)",
        "Ctrl-C (130) / SIGTERM (75)": "one line",
        "a second run at once": "(writes nothing)",
        "run again": "the same plan",
    }),
]


# The cells no test checks yet (tests/test_fault_matrix.py fails where one here has a test, or one with none is
# missing): the page marks each with a dagger.
UNCHECKED: frozenset = frozenset()


def promise(verb: str, fault: str) -> str:
    """What `verb` promises under `fault` (a cell of the table)."""
    for verbs, cells in ROWS:
        if verb in verbs:
            return cells[fault]
    raise KeyError(f"{verb!r} has no row in templm.cli.contracts.ROWS")


def applies(verb: str, fault: str) -> bool:
    """Whether the fault can happen to the verb (its cell is a promise, not the reason it cannot)."""
    return not promise(verb, fault).startswith(NOT_APPLICABLE)


def markdown_table() -> str:
    """The table of docs/failures.md: one row per group of verbs, one column per fault class; a cell that no test
    checks yet for some of its verbs names them after a dagger."""
    lines = ["| verb | " + " | ".join(FAULTS) + " |", "|---" * (len(FAULTS) + 1) + "|"]
    for verbs, cells in ROWS:
        names = ", ".join(f"`{v}`" for v in verbs)
        shown = []
        for fault in FAULTS:
            untested = [v for v in verbs if (v, fault) in UNCHECKED]
            mark = "" if not untested else (" (&dagger; no test yet" + (
                "" if len(untested) == len(verbs) else ": " + ", ".join(f"`{v}`" for v in untested)) + ")")
            shown.append(cells[fault] + mark)
        lines.append(f"| {names} | " + " | ".join(shown) + " |")
    return "\n".join(lines) + "\n"
