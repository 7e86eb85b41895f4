"""The tables of docs/results.md (what the presets show, linked from README.md), written from the runs' own
results.json, so that no number in them is typed by hand and none can drift from what the code does.

    python tools/readme_tables.py runs/smoke_seeds/results.json [runs/small_seeds/results.json ...]
    python tools/readme_tables.py --check ...   # exit 1 where the page's table is not the one these results give
    python tools/readme_tables.py --block NAME ...   # the page's table between the marker lines named NAME
    python tools/readme_tables.py --signs ...   # each cell over seeds also: on how many the effect has the claim's sign
    python tools/readme_tables.py --readme PAGE.md ...   # another Markdown page than docs/results.md

Each file is the results.json of `templm reproduce --preset P --seeds S,S,... --out DIR` (a run over several
seeds; one seed's results.json works too), or the is_eval.json of `templm is-eval --model=kglm --seed S --out
DIR` (one column per seed: Logan et al.'s effects on the knowledge-graph LM, then the estimates behind them), or
the results.json of `templm appendices --seed S --out DIR` (one column per seed: Mind the Gap's appendices). The
table goes between the page's two marker lines, one column per file: for each finding of the registry
(templm.metrics.findings) the verdict over the seeds, the mean effect with its 95 % interval and p, and each seed's
verdict; then the wall time and, under the table, the command, machine and package versions of each column (a
column's name and command carry the settings its run had that the preset's gin file does not, and its --only and
--skip). Below it, the streaming half's relative increase, its monthly slope and the gain from dynamic evaluation,
each seed's and their mean, beside "Mind the Gap"'s values.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import shlex
import sys
from typing import Any, Dict, List, Mapping, Sequence

from templm.errors import ConfigError
from templm.experiments.studies import load_study
from templm.io import atomic_write, format_duration
from templm.metrics import statistics
from templm.metrics.findings import APPENDICES, BY_NAME, IMPORTANCE_SAMPLING, STUDY, of_half
from templm.reports.reproduction import software_text

BEGIN = "<!-- readme_tables: begin (written by tools/readme_tables.py from the runs' results.json) -->"
END = "<!-- readme_tables: end -->"
RESULTS_PAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "results.md")


def markers(block: str = "") -> tuple:
    """The begin and end lines of the page's table `block` ("" the first table; a name for each further one)."""
    if not block:
        return BEGIN, END
    return (f"<!-- readme_tables: begin {block} (written by tools/readme_tables.py from the runs' results.json) -->",
            f"<!-- readme_tables: end {block} -->")


def _number(x: Any) -> str:
    if x is None:
        return "n/a"
    return f"{x:+.3f}" if abs(x) < 0.1 else f"{x:+.2f}"


def _p(p: Any) -> str:
    return "n/a" if p is None else f"{p:.2g}"


def cell(finding: Mapping[str, Any], direction: int = 0) -> str:
    """`**appears**: -5.03 [-5.16, -4.91], p=3e-05; all seeds appear` for a finding combined over seeds (or one
    seed's finding, which has no per-seed list of more than one). With the claim's `direction` (+1 or -1; 0: not
    said) a cell over seeds ends with how many seeds' effects have the claim's sign, verdict aside: `; the paper's
    sign on 9 of 10`."""
    verdict = finding.get("verdict") or "not tested"
    shown = f"**{verdict}**" if verdict == "appears" else verdict
    if finding.get("effect") is None:
        reason = finding.get("evidence") or ""
        return f"{shown}{(': ' + reason) if reason else ''}"
    low, high = (list(finding.get("interval") or []) + [None, None])[:2]
    text = f"{shown}: {_number(finding['effect'])} [{_number(low)}, {_number(high)}], p={_p(finding.get('p_value'))}"
    per_seed = finding.get("per_seed") or []
    seeds = [s.get("verdict") for s in per_seed]
    if len(seeds) > 1:
        every = {"appears": "appear"}.get(seeds[0], seeds[0])  # "all seeds appear", "all seeds inconclusive"
        text += f"; all seeds {every}" if len(set(seeds)) == 1 else f"; seeds {', '.join(map(str, seeds))}"
        effects = [s["effect"] for s in per_seed if s.get("effect") is not None]
        if direction and effects:
            text += f"; the paper's sign on {sum(e * direction > 0 for e in effects)} of {len(effects)}"
    return text


def overrides(results: Mapping[str, Any]) -> Dict[str, Any]:
    """The time-aware settings a run had that its preset's gin file (gin_configs/study/PRESET.gin as it is now)
    does not: {field: the run's value}, what `--gin.Study.FIELD=VALUE` gave it (or what the preset has changed since
    the run). {} for a run of the preset as it stands, or of a preset this templm does not ship."""
    config = _seeds(results)[0].get("config")
    try:
        preset = dataclasses.asdict(load_study(str(results.get("preset"))).preset)
    except ConfigError:
        return {}
    if not isinstance(config, dict):
        return {}
    as_json = functools.partial(json.dumps, sort_keys=True)
    return {key: config[key] for key in sorted(preset)
            if key not in _NOT_NUMBERS and key in config and as_json(config[key]) != as_json(preset[key])}


# Settings that leave every number as it is: the preset's name, the ETA's first guess, trainings run side by side.
_NOT_NUMBERS = ("name", "estimated_steps_per_s", "trainings_at_once")


def _gin_value(value: Any) -> str:
    """A setting as gin reads it: a tuple for a JSON list, a dict for a list of (name, value) pairs (Study.model)."""
    if isinstance(value, list) and value and all(isinstance(v, list) and len(v) == 2 and isinstance(v[0], str)
                                                 for v in value):
        return repr({k: v for k, v in value})
    return repr(tuple(value) if isinstance(value, list) else value)


def _column(results: Mapping[str, Any], changed: Mapping[str, Any]) -> str:
    """A column's name: the preset, the seeds and the settings `changed` from the preset (`overrides`)."""
    seeds = results.get("seeds") or [results.get("seed")]
    settings = ", ".join(f"{key}={_gin_value(value)}" for key, value in changed.items())
    return (f"{results.get('preset')}, seed{'s' if len(seeds) > 1 else ''} {','.join(str(s) for s in seeds)}"
            + (f" ({settings})" if settings else ""))


def _wall(results: Mapping[str, Any]) -> str:
    timing = results.get("timing") or {}
    per_seed = timing.get("per_seed_s") or {}
    total = format_duration(timing["total_s"]) if timing.get("total_s") is not None else "n/a"
    if len(per_seed) > 1:
        total += f" ({', '.join(format_duration(s) for s in per_seed.values())} per seed)"
    return total


# Mind the Gap's values (Table 2, WMT; CustomNews and arXiv in parentheses; section 5 for dynamic evaluation).
PAPER_STREAMING = {
    "relative_increase": "+6.3 % (CustomNews +16.0 %, arXiv +8.4 %)",
    "slope": "upward on every dataset (Figure 1)",
    "dynamic_gain": "-1.2 % (WMT 22.45 to 22.17)",
    "gap_closed": "21 % (WMT: 0.28 of the 1.34 between the models)",
    "detectable_slope": "the paper's slopes were detected over 24 months of WMT's test stream",
    "larger_ppl": "lower (448M against 287M parameters, Figure 5)",
    "size_slope": "no significant effect (t-test, p > 0.05; section 4)",
}
STREAMING_ROWS = (
    ("relative_increase", "streaming: relative increase of TIME-STRATIFIED over CONTROL, overall word perplexity"),
    ("slope", "streaming: slope of the monthly relative increase (static), percentage points per month"),
    ("dynamic_gain", "streaming: dynamic evaluation (SGD), TIME-STRATIFIED word perplexity change"),
    ("gap_closed", "streaming: share of the gap to CONTROL that dynamic evaluation closes (pooled over the seeds: "
                   "their gains over their gaps, summed)"),
    ("detectable_slope", "streaming: the smallest slope the monthly t-test detects, 80 % power (2.8 standard errors "
                         "of the fitted slope), percentage points per month"),
    ("larger_ppl", "streaming: a larger TIME-STRATIFIED model (StreamStudy.larger_model), its word perplexity change "
                   "against the smaller's"),
    ("size_slope", "streaming: the larger model's slope of the monthly relative increase minus the smaller's, "
                   "percentage points per month"),
)


def _seeds(results: Mapping[str, Any]) -> List[Mapping[str, Any]]:
    """Each seed's own results (a run over seeds keeps them whole under per_seed; one seed's is itself)."""
    per_seed = results.get("per_seed")
    return list(per_seed.values()) if isinstance(per_seed, dict) else [results]


def _detectable_slope(per_month: Mapping[str, float]) -> Any:
    """2.8 standard errors of the least-squares slope through a monthly series (months in order, one apart; the
    growth finding's slope test, statistics.slope): the slope a two-sided t-test at 0.05 finds with 80 % power
    (normal approximation); None under four months."""
    y = list(per_month.values())
    if len(y) < 4:
        return None
    stderr = statistics.slope(range(len(y)), y, direction=+1)["stderr"]
    return None if stderr is None else 2.8 * stderr


def _seed_folders(results: Mapping[str, Any], source: str) -> List[str]:
    """The run folder of each seed: OUT/seed_S for a run over seeds, OUT itself for one seed's run."""
    root = os.path.dirname(os.path.abspath(source))
    per_seed = results.get("per_seed")
    if isinstance(per_seed, dict):
        return [os.path.join(root, f"seed_{seed}") for seed in per_seed]
    return [root]


def streaming_numbers(results: Mapping[str, Any], source: str = "") -> dict:
    """{row: [value of each seed]} of STREAMING_ROWS from each seed's streaming stage (none where it did not run);
    the detectable slope reads each seed's stream results.json (under the run folder of `source`) for its months."""
    out: dict = {name: [] for name, _ in STREAMING_ROWS}
    out["gap_parts"] = []  # (dynamic gain, gap) in perplexity of each seed: the pooled share of the gap closed
    folders = _seed_folders(results, source) if source else [None] * len(_seeds(results))
    for seed, folder in zip(_seeds(results), folders):
        stream = (seed.get("extra") or {}).get("streaming") or {}
        stream_file = os.path.join(folder, stream["results"]) if folder and stream.get("results") else None
        if stream_file and os.path.exists(stream_file):
            with open(stream_file, encoding="utf-8") as f:
                per_month = ((json.load(f).get("relative") or {}).get("static") or {}).get("per_month") or {}
            detectable = _detectable_slope(per_month)
            if detectable is not None:
                out["detectable_slope"].append(detectable)
        ppl = stream.get("overall_word_ppl") or {}
        ts, ctl, dyn = (ppl.get(k) for k in ("time_stratified/static", "control/static", "time_stratified/dynamic"))
        if ts is None or ctl is None:
            continue
        large = ppl.get("time_stratified_large/static")
        if large is not None:
            out["larger_ppl"].append(large / ts - 1)
        size = (seed.get("findings") or {}).get("streaming_size_slope") or {}
        if size.get("slope_large") is not None and size.get("slope_small") is not None:
            out["size_slope"].append(size["slope_large"] - size["slope_small"])
        out["relative_increase"].append(ts / ctl - 1)
        slope = ((stream.get("relative") or {}).get("static") or {}).get("slope_per_month")
        if slope is not None:
            out["slope"].append(slope)
        if dyn is not None:
            out["dynamic_gain"].append(dyn / ts - 1)
            if ts != ctl:
                out["gap_parts"].append((ts - dyn, ts - ctl))
    out["gap_closed"] = [gain / gap for gain, gap in out["gap_parts"]]
    return out


def _pooled(numbers: Mapping[str, Any]) -> Any:
    """The share of the gap closed over every seed at once: the seeds' dynamic gains over their gaps, summed (a mean
    of the seeds' ratios is ruled by a seed whose gap is near 0)."""
    parts = numbers.get("gap_parts") or []
    gap = sum(g for _, g in parts)
    return None if not parts or gap == 0 else sum(d for d, _ in parts) / gap


def _percent(values: Sequence[float], digits: int = 1, mean: Any = None) -> str:
    """The mean of `values` (or the `mean` given) in per cent, then each seed's value."""
    if not values:
        return "not run"
    mean = sum(values) / len(values) if mean is None else mean
    each = ", ".join(f"{100 * v:+.{digits}f}" for v in values)
    return f"{100 * mean:+.{digits}f} %" + (f" (seeds {each})" if len(values) > 1 else "")


def table(runs: Sequence[Mapping[str, Any]], sources: Sequence[str], signs: bool = False) -> str:
    """The Markdown between the page's markers: the table, then the streaming numbers beside the paper's, then how
    each column was made. `signs`: each finding's cell says on how many seeds its effect has the claim's sign."""
    names = [f.name for f in STUDY if all(f.name in (r.get("findings") or {}) for r in runs)]
    changed = [overrides(r) for r in runs]  # each reads the preset's gin file: once a run
    columns = [_column(r, c) for r, c in zip(runs, changed)]
    lines = ["| finding | " + " | ".join(columns) + " |",
             "|---|" + "---|" * len(runs)]
    for name in names:
        lines.append(f"| `{name}`: {BY_NAME[name].claim} | "
                     + " | ".join(cell(r["findings"][name], BY_NAME[name].direction if signs else 0)
                                  for r in runs) + " |")
    lines.append("| wall time | " + " | ".join(_wall(r) for r in runs) + " |")
    lines.append("")
    numbers = [streaming_numbers(r, source) for r, source in zip(runs, sources)]
    lines.append("| the streaming half beside the paper | " + " | ".join(columns)
                 + " | Mind the Gap |")
    lines.append("|---|" + "---|" * (len(runs) + 1))
    for name, label in STREAMING_ROWS:
        digits = 2 if name in ("slope", "detectable_slope", "size_slope") else 1
        cells = [_percent(n[name], digits, _pooled(n) if name == "gap_closed" else None) for n in numbers]
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {PAPER_STREAMING[name]} |")
    lines.append("")
    for r, source, column, settings in zip(runs, sources, columns, changed):
        seeds = r.get("seeds") or [r.get("seed")]
        flag = f"--seeds {','.join(str(s) for s in seeds)}" if len(seeds) > 1 else f"--seed {seeds[0]}"
        timing = r.get("timing") or {}
        machine = (timing.get("machine") or "machine not recorded") + software_text(timing.get("software"), ", with ")
        # --only and --skip, as the run recorded them (the reason of each stage they left out), then the settings
        left_out = {why for seed in _seeds(r) for why in (seed.get("skipped") or {}).values()
                    if isinstance(why, str) and why.startswith(("--only ", "--skip "))}
        bindings = "".join(f" {choice}" for choice in sorted(left_out)) + "".join(
            " " + shlex.quote(f"--gin.Study.{key}={_gin_value(value)}") for key, value in settings.items())
        lines.append(f"- {column}: `templm reproduce --preset {r.get('preset')} {flag}{bindings} --out "
                     f"{os.path.dirname(source) or '.'}` on {machine}.")
    return "\n".join(lines)


def _is_estimate(run: Mapping[str, Any], proposal: str, level: str, k: int) -> str:
    row = next((r for r in run["rows"] if r["proposal"] == proposal and r["level"] == level and r["K"] == k), None)
    if row is None:
        return "n/a"
    se = row.get("ppl_se")
    return f"{row['ppl']:.3f}" + ("" if se is None else f" +- {se:.3f}")


def is_table(runs: Sequence[Mapping[str, Any]], sources: Sequence[str]) -> str:
    """The Markdown between the page's markers for `templm is-eval --model=kglm` runs, one column per run: each
    effect's verdict, then the estimated perplexities behind them and the exact check, then how each was made."""
    columns = [f"seed {r['config']['seed']}" for r in runs]
    lines = ["| effect | " + " | ".join(columns) + " |", "|---|" + "---|" * len(runs)]
    for finding in of_half(IMPORTANCE_SAMPLING):
        lines.append(f"| `{finding.name}`: {finding.claim} | "
                     + " | ".join(cell(r["findings"][finding.name]) for r in runs) + " |")
    lines += ["", "| perplexity (+- standard error over the runs) | " + " | ".join(columns) + " |",
              "|---|" + "---|" * len(runs)]
    ks = [(min(r["config"]["ks"]), max(r["config"]["ks"])) for r in runs]
    labels = [p["label"] for p in runs[0]["per_document"]["proposals"]]
    for label in labels:
        for level, which in (("document", 0), ("document", 1), ("token", 1)):
            lines.append(f"| proposal {label}, aggregated per {level}, K = "
                         f"{'/'.join(sorted({str(k[which]) for k in ks}))} | "
                         + " | ".join(_is_estimate(r, label, level, k[which]) for r, k in zip(runs, ks)) + " |")
    cells = []
    for r, (_, k_max) in zip(runs, ks):
        check = r.get("exact_check") or {}
        row = next((x for x in check.get("rows") or [] if x["K"] == k_max), None)
        cells.append("n/a" if row is None else f"{row['ppl']:.3f} vs exact {check['exact_ppl']:.3f} "
                                               f"({check['documents']} prefixes)")
    lines.append("| exact check: the trained proposal at the largest K on prefixes of the test documents | "
                 + " | ".join(cells) + " |")
    lines.append("| wall time | " + " | ".join(format_duration(r["config"].get("seconds", 0.0)) for r in runs)
                 + " |")
    lines.append("")
    for r, source in zip(runs, sources):
        lines.append(f"- seed {r['config']['seed']}: `templm is-eval --model=kglm --seed {r['config']['seed']} "
                     f"--out {os.path.dirname(source) or '.'}` ({r['config']['test_docs']} test documents, "
                     f"{r['config']['samples_per_proposal']} samples a document and proposal).")
    return "\n".join(lines)


def appendix_table(runs: Sequence[Mapping[str, Any]], sources: Sequence[str]) -> str:
    """The Markdown between the page's markers for `templm appendices` runs, one column per run: each appendix's
    finding, then each shifted test period's relative increase and each distance's word perplexity."""
    columns = [f"seed {r['config']['seed']}" for r in runs]
    lines = ["| finding | " + " | ".join(columns) + " |", "|---|" + "---|" * len(runs)]
    for finding in of_half(APPENDICES):
        lines.append(f"| `{finding.name}`: {finding.claim} | "
                     + " | ".join(cell(r["findings"][finding.name]) for r in runs) + " |")
    lines += ["", "| measured | " + " | ".join(columns) + " |", "|---|" + "---|" * len(runs)]
    shifts = sorted({p["shift_years"] for r in runs for p in r.get("periods") or []})
    for k in shifts:
        cells = []
        for r in runs:
            p = next((p for p in r.get("periods") or [] if p["shift_years"] == k), None)
            cells.append("n/a" if p is None else f"{100 * p['relative_increase']:+.1f} % "
                                                 f"({p['findings']['streaming_gap']['verdict']})")
        months = next(p["months"] for r in runs for p in r.get("periods") or [] if p["shift_years"] == k)
        lines.append(f"| Appendix B: relative increase, test {months[0]}..{months[-1]} (cut-off {k} year(s) "
                     "back) | " + " | ".join(cells) + " |")
    gaps = sorted({int(g) for r in runs for g in (r.get("distance") or {}).get("word_ppl", {})})
    for g in gaps:
        lines.append(f"| Appendix C: word perplexity, training ends {g} months before the cut-off | "
                     + " | ".join(f"{(r.get('distance') or {}).get('word_ppl', {}).get(str(g), float('nan')):.2f}"
                                  for r in runs) + " |")
    lines.append("| Appendix C: CONTROL's word perplexity | "
                 + " | ".join(f"{(r.get('distance') or {}).get('control_word_ppl', float('nan')):.2f}" for r in runs)
                 + " |")
    lines.append("| wall time | " + " | ".join(format_duration(r["config"].get("seconds", 0.0)) for r in runs)
                 + " |")
    lines.append("")
    for r, source in zip(runs, sources):
        c = r["config"]
        lines.append(f"- seed {c['seed']}: `templm appendices --preset {c['preset']} --seed {c['seed']} --out "
                     f"{os.path.dirname(source) or '.'}` (shifts {','.join(map(str, c['shifts']))}, gaps "
                     f"{','.join(map(str, c['gaps']))} months).")
    return "\n".join(lines)


def replace(readme: str, body: str, block: str = "") -> str:
    """The page's text (`readme`) with `body` between the markers of `block` (a ValueError when they are not there
    once each, in order)."""
    return replace_between(readme, *markers(block), body)


def replace_between(page: str, begin: str, end: str, body: str) -> str:
    """`page` with `body` between its marker lines `begin` and `end` (a ValueError when they are not there once
    each, in order); tools/failures_table.py writes its table the same way."""
    if page.count(begin) != 1 or page.count(end) != 1 or page.index(begin) > page.index(end):
        raise ValueError(f"the page needs the two marker lines once each, in order:\n{begin}\n{end}")
    head, rest = page.split(begin)
    _, tail = rest.split(end)
    return f"{head}{begin}\n{body}\n{end}{tail}"


def settle(path: str, page: str, new: str, check: bool, differs: str, written: str) -> int:
    """With `check`, exit status 1 (saying `differs`) where the page's text `page` is not `new`, else 0; without it,
    `new` written to `path` where it differs, and `written` said."""
    if check:
        if new != page:
            print(f"{path}: {differs}", file=sys.stderr)
            return 1
        return 0
    if new != page:
        atomic_write(path, new)
    print(f"{path}: {written}")
    return 0


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", help="results.json of `templm reproduce --seeds ...`, one per column")
    parser.add_argument("--readme", default=RESULTS_PAGE, metavar="PAGE",
                        help="the Markdown page that holds the marker lines (default: docs/results.md)")
    parser.add_argument("--check", action="store_true", help="change nothing: exit 1 where the page differs")
    parser.add_argument("--block", default="", help="which of the page's tables: '' the first, or the name in its "
                                                   "marker lines")
    parser.add_argument("--signs", action="store_true", help="a findings table over seeds also says on how many "
                                                                 "seeds each effect has the claim's sign")
    args = parser.parse_args(argv)
    runs = []
    for path in args.results:
        with open(path, encoding="utf-8") as f:
            runs.append(json.load(f))
    with open(args.readme, encoding="utf-8") as f:
        readme = f.read()
    kinds = {"kglm" if (r.get("config") or {}).get("model") == "kglm" else
             "appendices" if ("periods" in r or "distance" in r) else "reproduce" for r in runs}
    if len(kinds) > 1:
        print("the results are not all of one kind: reproduce results.json, is-eval --model=kglm is_eval.json or "
              "appendices results.json", file=sys.stderr)
        return 2
    make = {"kglm": is_table, "appendices": appendix_table,
            "reproduce": functools.partial(table, signs=args.signs)}[kinds.pop()]
    new = replace(readme, make(runs, args.results), args.block)
    return settle(args.readme, readme, new, args.check, f"the table differs from what {', '.join(args.results)} give",
                  f"table from {', '.join(args.results)}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
