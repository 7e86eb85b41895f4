#!/usr/bin/env python
"""Benchmark `templm plan`'s layer extrapolation against compiling the whole model's step (BENCHMARKS.md, "Plans").

    python tools/bench_plan.py                 # T5 v1.1 small and base on the tpu_v4_32 mesh, about 4 minutes
    python tools/bench_plan.py --configs small

Each configuration is planned twice, each time in a process of its own (tools/workspace_plan.py's `run_plan`): by
default (the step compiled for one and two layers a stack, its temporaries extended to the model's layers) and with
`--exact` (the whole step compiled). Reported per configuration: both step-temporary figures, the relative error of
the extrapolation, both plans' seconds and their ratio, measured in the same run. One JSON line per figure on stdout
(tools/bench_t5.py's `emit`); logs go to stderr. `--write` puts each configuration's row into BENCHMARKS.md's
"Plans" table (rows of other configurations kept); `--results FILE` takes the lines of an earlier run instead of
planning.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_t5 import emit, log  # noqa: E402
from readme_tables import replace_between, settle  # noqa: E402
from workspace_plan import REPO, run_plan  # noqa: E402

BEGIN, END = "<!-- bench_plan: begin -->", "<!-- bench_plan: end -->"
HEADER = ("| T5 v1.1 (tpu_v4_32 mesh) | temporaries, extrapolated | compiled whole | error | plan, extrapolated | "
          "plan, whole | faster | measured |\n|---|---|---|---|---|---|---|---|")

CONFIGS = {
    "small": ("--gin_file=gin_configs/temporal.gin", "--gin_file=gin_configs/mesh/tpu_v4_32.gin"),
    "base": ("--gin_file=gin_configs/temporal.gin", "--gin_file=gin_configs/models/t5_1_1_base.gin",
             "--gin_file=gin_configs/mesh/tpu_v4_32.gin"),
    "large": ("--gin_file=gin_configs/temporal.gin", "--gin_file=gin_configs/models/t5_1_1_large.gin",
              "--gin_file=gin_configs/mesh/tpu_v4_32.gin"),
}


def measure(name: str) -> list:
    """Both plans of one configuration: its two JSON lines."""
    plans = {}
    for mode, extra in (("extrapolated", ()), ("exact", ("--exact",))):
        record, seconds, _ = run_plan((*CONFIGS[name], *extra))
        plans[mode] = (record["plans"][0]["result"], seconds)
    (fast, fast_s), (exact, exact_s) = plans["extrapolated"], plans["exact"]
    assert fast["temp_from"] == "extrapolated" and exact["temp_from"] == "compiled", (fast, exact)
    error = fast["bytes"]["temp"] / exact["bytes"]["temp"] - 1
    log(f"{name}: temporaries {fast['bytes']['temp'] / 2**30:.3f} GiB extrapolated, "
        f"{exact['bytes']['temp'] / 2**30:.3f} GiB compiled ({100 * error:+.2f} %); plan {fast_s:.0f} s against "
        f"{exact_s:.0f} s ({exact_s / fast_s:.1f}x faster)")
    return [emit("plan_temp_error", error, "fraction", name, extrapolated_bytes=fast["bytes"]["temp"],
                 compiled_bytes=exact["bytes"]["temp"]),
            emit("plan_seconds", fast_s, "s", name, exact_seconds=exact_s, speedup=exact_s / fast_s)]


def table_row(lines: list, when: str) -> str:
    error = next(r for r in lines if r["name"] == "plan_temp_error")
    seconds = next(r for r in lines if r["name"] == "plan_seconds")
    return (f"| {error['config']} | {error['extrapolated_bytes'] / 2**30:.3f} GiB | "
            f"{error['compiled_bytes'] / 2**30:.3f} GiB | {100 * error['value']:+.2f} % | {seconds['value']:.0f} s | "
            f"{seconds['exact_seconds']:.0f} s | {seconds['speedup']:.1f}x | {when} |")


def write_rows(rows: dict) -> int:
    """BENCHMARKS.md's table with `rows` ({config: row}) in place of those configurations' rows."""
    path = os.path.join(REPO, "BENCHMARKS.md")
    with open(path, encoding="utf-8") as f:
        page = f.read()
    current = page.split(BEGIN)[1].split(END)[0].strip().splitlines()[2:]
    kept = {line.split("|")[1].strip(): line for line in current if line.startswith("| ")}
    kept.update(rows)
    body = HEADER + "".join(f"\n{kept[name]}" for name in CONFIGS if name in kept)
    return settle(path, page, replace_between(page, BEGIN, END, body), False, "", "the Plans table written")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--configs", default="small,base", help=f"comma-separated, of {', '.join(CONFIGS)}")
    p.add_argument("--write", action="store_true", help="write the rows into BENCHMARKS.md")
    p.add_argument("--results", help="the JSON lines of an earlier run, instead of planning")
    args = p.parse_args(argv)
    when = f"{datetime.date.today().isoformat()}, {platform.machine()} with {os.cpu_count()} CPUs"
    by_config: dict = {}
    if args.results:
        with open(args.results, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    record = json.loads(line)
                    by_config.setdefault(record["config"], []).append(record)
    else:
        by_config = {name: measure(name) for name in args.configs.split(",")}
    if args.write:
        return write_rows({name: table_row(lines, when) for name, lines in by_config.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
