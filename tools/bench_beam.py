#!/usr/bin/env python
"""Benchmark TempLAMA from a Wikidata dump on Apache Beam against the single process (issue 45's scaling figures).

    python tools/bench_beam.py                  # 2,000 copies of the test dump's entities, then 20,000
    python tools/bench_beam.py --copies 500 --scale 4

The dump is tests/fixtures/wikidata_dump.json's 25 entity lines (every rule of the reader) repeated `--copies`
times with fresh ids (each copy's ids, and the statements' references to them, renumbered), written as the
published dump is (one JSON array, one entity a line). Each configuration runs in its own process on it:
`single` (wikidata.build_templama), `beam-1` (Beam's local runner, one worker in the process) and `beam-2` (two worker
processes), and reports entity lines per second, per second per worker, the ratio to the single process measured in
the same run, and the peak resident memory of the process and of its largest worker process. The same at
`--scale` times the copies gives memory against the corpus size (the issue's target: a worker within 1.5x at 10x
the lines). Every figure is one JSON line on stdout (tools/bench_t5.py's `emit`); logs go to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_t5 import REPO, emit, log  # noqa: E402

DUMP = os.path.join(REPO, "tests", "fixtures", "wikidata_dump.json")
CONFIGS = {"single": None, "beam-1": ["--runner=DirectRunner", "--direct_num_workers=1"],
           "beam-2": ["--runner=DirectRunner", "--direct_num_workers=2", "--direct_running_mode=multi_processing"]}
_ID = re.compile(r'"(id)":\s*"Q(\d+)"|"(numeric-id)":\s*(\d+)')  # an item's id; not a statement's ("Q7$...")


def write_dump(path: str, copies: int) -> int:
    """The test dump's entity lines `copies` times, each copy's ids renumbered; returns the entity lines written."""
    with open(DUMP, encoding="utf-8") as f:
        lines = [line.rstrip("\n").rstrip(",") for line in f][1:-1]
    entities = [line for line in lines if line.strip()]
    written = 0
    with open(path, "w", encoding="utf-8") as out:
        out.write("[\n")
        for copy in range(copies):
            def renumber(match):
                number = (copy + 1) * 1_000_000 + int(match.group(2) or match.group(4))
                return f'"id":"Q{number}"' if match.group(1) else f'"numeric-id":{number}'

            for line in entities:
                out.write(("" if written == 0 else ",\n") + _ID.sub(renumber, line))
                written += 1
        out.write("\n]\n")
    return written


def run_one(config: str, dump: str, out: str) -> dict:
    """One configuration in this process: seconds and peak memory (this process's, its largest child's)."""
    from templm.data.wikidata import build_templama
    from templm.data.wikidata_beam import build_templama_beam

    started = time.perf_counter()
    if CONFIGS[config] is None:
        stats = build_templama(dump, out, require_enwiki=False)
    else:
        stats = build_templama_beam(dump, out, CONFIGS[config], require_enwiki=False)
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "queries": stats["queries"], "entities": stats["entities"],
            "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "worker_rss_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}


def measure(config: str, dump: str, root: str) -> dict:
    out = os.path.join(root, f"out-{config}-{os.path.getsize(dump)}")
    result = subprocess.run([sys.executable, os.path.abspath(__file__), "--run", config, "--dump", dump, "--out", out],
                            capture_output=True, text=True, cwd=REPO)
    if result.returncode != 0:
        raise SystemExit(f"{config} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--copies", type=int, default=2000)
    p.add_argument("--scale", type=int, default=10, help="the second dump's copies, as a multiple of --copies")
    p.add_argument("--run", choices=sorted(CONFIGS), help=argparse.SUPPRESS)
    p.add_argument("--dump", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.run:
        print(json.dumps(run_one(args.run, args.dump, args.out)))
        return 0
    with tempfile.TemporaryDirectory(prefix="bench-beam-") as root:
        for copies in (args.copies, args.copies * args.scale):
            dump = os.path.join(root, f"dump-{copies}.json")
            lines = write_dump(dump, copies)
            log(f"dump of {lines:,} entity lines ({os.path.getsize(dump) / 2 ** 20:.1f} MiB)")
            results = {config: measure(config, dump, root) for config in CONFIGS}
            single = results["single"]
            for config, r in results.items():
                workers = 2 if config == "beam-2" else 1
                rate = r["entities"] / r["seconds"]
                log(f"{config}: {r['seconds']:.1f} s, {rate:,.0f} lines/s, {r['queries']} queries, "
                    f"peak {r['rss_mib']:.0f} MiB (largest worker process {r['worker_rss_mib']:.0f} MiB)")
                emit("templama_lines_per_sec", rate, "lines/s", config, lines=lines, workers=workers,
                     per_worker=rate / workers, ratio_to_single=rate / (single["entities"] / single["seconds"]),
                     seconds=r["seconds"], rss_mib=r["rss_mib"], worker_rss_mib=r["worker_rss_mib"])
            if len({r["queries"] for r in results.values()}) != 1:
                raise SystemExit(f"the configurations disagree on the queries: {results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
