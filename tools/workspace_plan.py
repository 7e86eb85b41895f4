"""WORKSPACE.md's tables of `templm plan`, written from the verb itself: each row's configuration is planned in a
process of its own (`templm plan ... --json FILE`, its own fake CPU devices), timed, and the two tables (the
training configs, and the paper study training by training) are written between their markers in WORKSPACE.md, with
the date and the machine, so they cannot go stale.

    python tools/workspace_plan.py            # prints the tables
    python tools/workspace_plan.py --write    # and writes them into WORKSPACE.md

About 5 minutes on 2 CPU cores (a T5-base plan takes under a minute).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GIB = 1 << 30
DEVICE = {"tpu_v4": "v4, 32 GiB", "a100_80": "A100, 80 GiB", "tpu_v3": "v3, 16 GiB"}
CONFIGS = {"begin": "<!-- workspace_plan configs: begin (written by tools/workspace_plan.py) -->",
           "end": "<!-- workspace_plan configs: end -->"}
STUDY = {"begin": "<!-- workspace_plan study: begin (written by tools/workspace_plan.py) -->",
         "end": "<!-- workspace_plan study: end -->"}

# (label, mesh label, templm plan arguments) of the training configs' table.
CONFIG_ROWS: Sequence[Tuple[str, str, Sequence[str]]] = (
    ("T5 v1.1 small (77M)", "tpu_v4_32", ("--gin_file=gin_configs/temporal.gin",
                                          "--gin_file=gin_configs/mesh/tpu_v4_32.gin")),
    ("T5 v1.1 base (248M)", "tpu_v4_32", ("--gin_file=gin_configs/temporal.gin",
                                          "--gin_file=gin_configs/models/t5_1_1_base.gin",
                                          "--gin_file=gin_configs/mesh/tpu_v4_32.gin")),
    ("T5 v1.1 small (77M)", "gpu_8", ("--gin_file=gin_configs/temporal.gin",
                                      "--gin_file=gin_configs/mesh/gpu_8.gin", "--devices=8")),
    ("T5 v1.1 base (248M)", "gpu_8", ("--gin_file=gin_configs/temporal.gin",
                                      "--gin_file=gin_configs/models/t5_1_1_base.gin",
                                      "--gin_file=gin_configs/mesh/gpu_8.gin", "--devices=8")),
    ("T5 v1.1 small (77M)", "tpu_v4_32 as 4 x 4", ("--gin_file=gin_configs/temporal.gin",
                                                   "--gin_file=gin_configs/mesh/tpu_v4_32.gin",
                                                   "--gin.templm.make_mesh.mesh_shape=(4, 4)")),
)
# (mesh label, templm plan arguments) of the paper study's table.
STUDY_ROWS: Sequence[Tuple[str, Sequence[str]]] = (
    ("tpu_v4_32", ("--gin_file=gin_configs/study/paper.gin", "--gin_file=gin_configs/mesh/tpu_v4_32.gin")),
    ("gpu_8", ("--gin_file=gin_configs/study/paper.gin", "--gin_file=gin_configs/mesh/gpu_8.gin", "--devices=8")),
)


def run_plan(args: Sequence[str]) -> Tuple[Dict[str, Any], float, str]:
    """(the plan's JSON record, seconds, the command) of `templm plan ARGS` in a process of its own."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "plan.json")
        command = [sys.executable, "-m", "templm.cli", "plan", *args, f"--json={out}"]
        env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # the verb sets its own device count
        t0 = time.time()
        result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
        seconds = time.time() - t0
        if result.returncode != 0:
            raise SystemExit(f"templm plan {' '.join(args)} failed:\n{result.stderr[-3000:]}")
        with open(out, encoding="utf-8") as f:
            return json.load(f), seconds, "templm plan " + shlex.join(args)


def mesh_label(result: Mapping[str, Any], name: str) -> str:
    mesh = " x ".join(f"{axis} {size}" for axis, size in result["mesh"].items())
    return f"{name}: {mesh} ({DEVICE.get(result['device_kind'], result['device_kind'])})"


def verdict(result: Mapping[str, Any], remedy: Optional[Mapping[str, Any]]) -> str:
    if result["uneven"]:  # a parameter's, rather than its optimizer statistic's
        return "does not shard: " + next((u for u in result["uneven"] if u.startswith("['params']")),
                                         result["uneven"][0])
    share = 100 * result["bytes"]["total"] / result["device_memory"]
    if result["fits"]:
        return f"fits ({share:.1f} %)"
    if remedy is None:
        return f"does not fit ({share:.1f} %); no remedy among more microbatches and a larger model axis"
    found = remedy["result"]
    return (f"does not fit ({share:.1f} %); {remedy['change']} fits "
            f"({100 * found['bytes']['total'] / found['device_memory']:.1f} %)")


def gib(value: Optional[int]) -> str:
    return "-" if value is None else f"{value / GIB:.3f}"


def row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def configs_table() -> List[str]:
    lines = [row(["model", "mesh (device)", "parameters", "optimizer", "step temporaries", "total", "verdict",
                  "plan took"]), row(["---"] * 8)]
    commands = []
    for label, mesh, args in CONFIG_ROWS:
        record, seconds, command = run_plan(args)
        plan = record["plans"][0]
        b = plan["result"]["bytes"]
        lines.append(row([label, mesh_label(plan["result"], mesh), gib(b["params"]), gib(b["opt_state"]),
                          gib(b["temp"]), gib(b["total"]), verdict(plan["result"], plan["remedy"]),
                          f"{seconds:.0f} s"]))
        commands.append(command)
        print(lines[-1], flush=True)
    return lines + ["", "```"] + commands + ["```"]


def study_table() -> List[str]:
    lines = [row(["trainings", "mesh (device)", "parameters", "optimizer", "step temporaries", "total", "verdict"]),
             row(["---"] * 7)]
    commands = []
    names = {"t5": "each T5 training (Uniform, Temporal, each Yearly expert, retrain, the alpha fine-tunes)",
             "txl": "TIME-STRATIFIED and CONTROL (Transformer-XL)"}
    for mesh, args in STUDY_ROWS:
        record, seconds, command = run_plan(args)
        for plan in record["plans"]:
            b = plan["result"]["bytes"]
            lines.append(row([f"{names[plan['name']]}, {plan['result']['parameters'] / 1e6:.0f}M parameters",
                              mesh_label(plan["result"], mesh), gib(b["params"]), gib(b["opt_state"]),
                              gib(b["temp"]), gib(b["total"]), verdict(plan["result"], plan["remedy"])]))
            print(lines[-1], flush=True)
        commands.append(f"{command}   # {seconds:.0f} s here")
    return lines + ["", "```"] + commands + ["```"]


def write_between(path: str, markers: Mapping[str, str], lines: Sequence[str]) -> None:
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if markers["begin"] not in text or markers["end"] not in text:
        raise SystemExit(f"{path} has no {markers['begin']} ... {markers['end']} markers")
    head, rest = text.split(markers["begin"], 1)
    _, tail = rest.split(markers["end"], 1)
    new = head + markers["begin"] + "\n" + "\n".join(lines) + "\n" + markers["end"] + tail
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(new)
    os.replace(tmp, path)


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="write the tables into WORKSPACE.md")
    args = parser.parse_args(argv)
    stamp = (f"Measured by `python tools/workspace_plan.py` on {datetime.date.today().isoformat()}, "
             f"{platform.machine()} with {os.cpu_count()} CPU cores; GiB per device, the temporaries from XLA's CPU "
             "compilation of one- and two-layer steps, extended to the model's layers (BENCHMARKS.md, \"Plans\"):")
    configs = [stamp, ""] + configs_table()
    study = [stamp, ""] + study_table()
    if args.write:
        path = os.path.join(REPO, "WORKSPACE.md")
        write_between(path, CONFIGS, configs)
        write_between(path, STUDY, study)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
