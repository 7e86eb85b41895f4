#!/usr/bin/env python
"""Benchmark templm's Beam pipelines against the single process (issue 45's scaling figures): TempLAMA from a
Wikidata dump, the corpus clean-up of `data splits`, the task data of `data tasks` and the language model's token
streams of `data streams`.

    python tools/bench_beam.py                  # all: 2,000 copies of the test dump, 2,000 documents; then 10x
    python tools/bench_beam.py --pipeline splits --docs 1000 --scale 4
    python tools/bench_beam.py --pipeline tasks --docs 2000 --scale 10
    python tools/bench_beam.py --pipeline streams --docs 2000 --scale 10

The dump is tests/fixtures/wikidata_dump.json's 25 entity lines (every rule of the reader) repeated `--copies`
times with fresh ids (each copy's ids, and the statements' references to them, renumbered), written as the
published dump is (one JSON array, one entity a line). Each configuration runs in its own process on it:
`single` (wikidata.build_templama), `beam-1` (Beam's local runner, one worker in the process) and `beam-2` (two worker
processes; `beam-N`, N worker processes), and reports entity lines per second, per second per worker, the ratio to
the single process measured in the same run, and the peak resident memory of the process and of its largest worker
process. The same at `--scale` times the copies gives memory against the corpus size (the issue's target: a worker
within 1.5x at 10x the lines). Every figure is one JSON line on stdout (tools/bench_t5.py's `emit`); logs go to stderr.

The clean-up (`--pipeline splits`): a corpus of `--docs` news articles of about 1,600 characters over four years,
written as WMT's document-level News Crawl ships it (one gzipped file a year), 4 % of them near-copies of an earlier
article and 2 % in French; `single` is splits.index_corpus, `beam-N` splits_beam.index_corpus_beam, both with the
paper's clean-up (langid, MinHash LSH at 0.8), reported as documents per second, per worker, and the same memory
figures; at `--scale` times the documents also `beam-2xscale` (as many documents per worker as beam-2 at 1x).

The task data (`--pipeline tasks`): the same corpus with people's names in its English articles (the salient spans),
built whole by task_data.prepare_task_data (`single`) and with task_data_beam.OnBeam (`beam-N`): the clean-up, the
yearly buckets, the records and a 500-piece vocabulary; documents per second of the whole build. The launching
process still fits the entity detector on the first training documents and reads the corpus once for the
vocabulary's sample. No `beam-2xscale` here: each worker loads TensorFlow to write records (about 0.6 GiB).

The token streams (`--pipeline streams`): the clean-up's corpus (no near-copies left out: every document), a split
file naming all its documents and one id the corpus lacks, and a SentencePiece model of at most 500 pieces trained
on the first corpus's documents (used for both sizes); `single` is lm_streams.write_streams, `beam-N`
lm_streams_beam's pipeline, timed from after their imports; documents per second, per worker, and the memory
figures.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import gzip
import json
import os
import random
import re
import resource
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_t5 import REPO, emit, log  # noqa: E402

DUMP = os.path.join(REPO, "tests", "fixtures", "wikidata_dump.json")
CONFIGS = ("single", "beam-1", "beam-2")


def options(config: str) -> list:
    """Beam's options of a configuration `beam-N`: the local runner, N workers (processes where N > 1). FnApiRunner,
    not DirectRunner: Beam's DirectRunner first tries Prism, whose binary it downloads from GitHub."""
    workers = int(config.split("-")[1])
    return ["--runner=FnApiRunner", f"--direct_num_workers={workers}"] + \
        (["--direct_running_mode=multi_processing"] if workers > 1 else [])
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


_ENGLISH = ("the council said on monday that a new rail line would open next year after a long public debate about its "
            "cost and noise while local shops hope for more visitors from nearby towns as the mayor promised quick "
            "work on the old station roads bridges parks schools and homes near the river where many families live "
            "today because prices have risen sharply during recent months across the region").split()
_FRENCH = ("le conseil municipal a voté mardi le prolongement de la ligne vers les quartiers du nord après deux années "
           "de consultations publiques au cours desquelles les habitants ont discuté du bruit et du coût").split()


def write_corpus(folder: str, docs: int, seed: int = 0, names: bool = False) -> list:
    """`docs` articles over 2016-2019 as WMT document-level News Crawl files (one gzipped file a year): 4 % near-copies
    of an earlier article (a few words changed), 2 % French; with `names`, an English article's sentences of 15 words
    each hold two of 400 people's and places' names (the salient spans of the task records). Returns the files."""
    rng = random.Random(seed)
    years = {year: [] for year in range(2016, 2020)}
    written = []
    syllables = ["al", "ba", "cor", "di", "ven", "lo", "mar", "ti", "sa", "ron", "ka", "bel"]
    people = [" ".join("".join(rng.choice(syllables) for _ in range(2)).capitalize() for _ in range(2))
              for _ in range(400)]
    for i in range(docs):
        day = datetime.date(2016, 1, 1) + datetime.timedelta(days=i * (4 * 365) // docs)  # 2016-2019, evenly
        roll = rng.random()
        if roll < 0.04 and written:
            words = rng.choice(written).split()
            for place in rng.sample(range(len(words)), 3):
                words[place] = rng.choice(_ENGLISH)
            text = " ".join(words)
        elif names and roll <= 0.98:
            text = " ".join(f"{rng.choice(people)} met {rng.choice(people)} as "
                            + " ".join(rng.choice(_ENGLISH) for _ in range(11)) + "." for _ in range(20))
            written.append(text)
        else:
            text = " ".join(rng.choice(_FRENCH if roll > 0.98 else _ENGLISH) for _ in range(300))
            written.append(text)
        date = day.strftime("%Y%m%d")
        split = base64.b64encode(text.encode()).decode()
        raw = base64.b64encode(f"{i} {text}".encode()).decode()
        years[int(date[:4])].append(f"{date}\t{split}\t{raw}\n")
    files = []
    for year, lines in years.items():
        path = os.path.join(folder, f"news-docs.{year}.en.filtered.gz")
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.writelines(lines)
        files.append(path)
    return files


def run_one(config: str, data: str, out: str) -> dict:
    """One configuration in this process: seconds and peak memory (this process's, its largest child's). `data`: a
    dump, a folder of news files (the clean-up) or a folder `tasks-*` of them (the task data)."""
    if os.path.basename(data).startswith("streams-"):
        from templm.data.lm_streams import write_streams
        from templm.data.lm_streams_beam import write_streams_beam

        import apache_beam  # noqa: F401  (imports are not the pipeline's time)
        import tensorflow  # noqa: F401

        started = time.perf_counter()
        corpus = sorted(os.path.join(data, "corpus", name) for name in os.listdir(os.path.join(data, "corpus")))
        splits, spm = {"train": os.path.join(data, "train.gz")}, os.path.join(data, "spm.model")
        os.makedirs(out)
        if config == "single":
            manifest = write_streams(corpus, splits, spm, out)
        else:
            manifest = write_streams_beam(corpus, splits, spm, out, options(config))
        result = {"items": manifest["splits"]["train"]["documents"], "kept": manifest["splits"]["train"]["tokens"]}
    elif os.path.basename(data).startswith("tasks-"):
        started = time.perf_counter()
        from absl import logging

        from templm.data.task_data import TaskDataConfig, prepare_task_data

        logging.set_verbosity(logging.INFO)  # the build's line of its records stage, read by `measure`
        from templm.data.task_data_beam import OnBeam

        corpus = sorted(os.path.join(data, name) for name in os.listdir(data))
        config_ = TaskDataConfig(corpus=corpus, vocab_size=500, exact_vocab_size=False, future_years=1)
        manifest = prepare_task_data(config_, out, via=None if config == "single" else OnBeam(options(config)))
        result = {"items": sum(1 for _ in corpus_documents(corpus)),
                  "kept": sum(n for by_year in manifest["counts"]["customnews"].values() for n in by_year.values())}
    elif os.path.isdir(data):
        started = time.perf_counter()
        from templm.data.splits import index_corpus
        from templm.data.splits_beam import index_corpus_beam

        corpus = sorted(os.path.join(data, name) for name in os.listdir(data))
        index = index_corpus(corpus) if config == "single" else index_corpus_beam(corpus, options(config))
        result = {"items": index.read, "kept": len(index), "near_duplicates": index.filtered["near_duplicates_removed"]}
    else:
        started = time.perf_counter()
        from templm.data.wikidata import build_templama
        from templm.data.wikidata_beam import build_templama_beam

        if config == "single":
            stats = build_templama(data, out, require_enwiki=False)
        else:
            stats = build_templama_beam(data, out, options(config), require_enwiki=False)
        result = {"items": stats["entities"], "kept": stats["queries"]}
    return {"seconds": time.perf_counter() - started, **result,
            "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "worker_rss_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}


def corpus_documents(corpus: list):
    from templm.data.readers import read_documents

    return read_documents(corpus)


def measure(config: str, data: str, root: str) -> dict:
    out = os.path.join(root, f"out-{config}-{os.path.basename(data)}")
    result = subprocess.run([sys.executable, os.path.abspath(__file__), "--run", config, "--data", data, "--out", out],
                            capture_output=True, text=True, cwd=REPO)
    if result.returncode != 0:
        raise SystemExit(f"{config} failed:\n{result.stderr[-3000:]}")
    measured = json.loads(result.stdout.strip().splitlines()[-1])
    records = re.search(r"salient-span records of (\d+) documents in ([\d.]+)s", result.stderr)
    if records:  # the task data's records stage, as the build reports it
        measured.update(records_docs=int(records.group(1)), records_seconds=float(records.group(2)))
    return measured


def report(metric: str, unit: str, results: dict, items: int) -> None:
    """The configurations' figures against the single process's, measured in the same run."""
    single = results["single"]
    for config, r in results.items():
        workers = 1 if config == "single" else int(config.split("-")[1])
        rate = r["items"] / r["seconds"]
        log(f"{config}: {r['seconds']:.1f} s, {rate:,.0f} {unit}, kept {r['kept']}, "
            f"peak {r['rss_mib']:.0f} MiB (largest worker process {r['worker_rss_mib']:.0f} MiB)")
        emit(metric, rate, unit, config, items=items, workers=workers, per_worker=rate / workers,
             ratio_to_single=rate / (single["items"] / single["seconds"]), seconds=r["seconds"],
             rss_mib=r["rss_mib"], worker_rss_mib=r["worker_rss_mib"])
        if "records_seconds" in r:  # the records stage alone (the kept documents' salient-span records)
            stage = r["records_docs"] / r["records_seconds"]
            log(f"{config}: records stage {r['records_seconds']:.1f} s, {stage:,.0f} docs/s")
            emit("task_records_docs_per_sec", stage, "docs/s", config, items=r["records_docs"], workers=workers,
                 per_worker=stage / workers, seconds=r["records_seconds"],
                 ratio_to_single=stage / (single["records_docs"] / single["records_seconds"]))
    if len({(r["items"], r["kept"]) for r in results.values()}) != 1:
        raise SystemExit(f"the configurations disagree: {results}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--pipeline", choices=["all", "templama", "splits", "tasks", "streams"], default="all")
    p.add_argument("--copies", type=int, default=2000, help="TempLAMA: copies of the test dump's entities")
    p.add_argument("--docs", type=int, default=2000, help="the clean-up: documents")
    p.add_argument("--scale", type=int, default=10, help="the second run's size, as a multiple of the first")
    p.add_argument("--run", help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.run:
        print(json.dumps(run_one(args.run, args.data, args.out)))
        return 0
    with tempfile.TemporaryDirectory(prefix="bench-beam-") as root:
        if args.pipeline in ("all", "templama"):
            for copies in (args.copies, args.copies * args.scale):
                dump = os.path.join(root, f"dump-{copies}.json")
                lines = write_dump(dump, copies)
                log(f"dump of {lines:,} entity lines ({os.path.getsize(dump) / 2 ** 20:.1f} MiB)")
                report("templama_lines_per_sec", "lines/s", {config: measure(config, dump, root)
                                                             for config in CONFIGS}, lines)
        if args.pipeline in ("all", "splits"):
            for docs in (args.docs, args.docs * args.scale):
                folder = os.path.join(root, f"news-{docs}")
                os.makedirs(folder)
                files = write_corpus(folder, docs)
                log(f"corpus of {docs:,} documents in {len(files)} WMT files "
                    f"({sum(os.path.getsize(f) for f in files) / 2 ** 20:.1f} MiB gzipped)")
                # The local runner gives each worker one bundle of 1/N of a stage's input, so a worker's memory
                # follows the corpus at a fixed N; with N grown with the corpus (as Dataflow bounds its bundles)
                # it shows what the pipeline itself holds per worker.
                configs = CONFIGS + ((f"beam-{2 * args.scale}",) if docs > args.docs else ())
                report("cleanup_docs_per_sec", "docs/s", {config: measure(config, folder, root)
                                                          for config in configs}, docs)
        if args.pipeline in ("all", "tasks"):
            for docs in (args.docs, args.docs * args.scale):
                folder = os.path.join(root, f"tasks-{docs}")
                os.makedirs(folder)
                files = write_corpus(folder, docs, names=True)
                log(f"corpus of {docs:,} documents with names in {len(files)} WMT files "
                    f"({sum(os.path.getsize(f) for f in files) / 2 ** 20:.1f} MiB gzipped)")
                configs = CONFIGS  # (a worker holds TensorFlow, about 0.6 GiB: no 2 x scale workers here)
                report("task_data_docs_per_sec", "docs/s", {config: measure(config, folder, root)
                                                            for config in configs}, docs)
        if args.pipeline in ("all", "streams"):
            spm = None
            for docs in (args.docs, args.docs * args.scale):
                folder = os.path.join(root, f"streams-{docs}")
                os.makedirs(os.path.join(folder, "corpus"))
                files = write_corpus(os.path.join(folder, "corpus"), docs)
                spm = write_split_and_spm(folder, files, spm)
                log(f"corpus of {docs:,} documents in {len(files)} WMT files "
                    f"({sum(os.path.getsize(f) for f in files) / 2 ** 20:.1f} MiB gzipped)")
                report("token_streams_docs_per_sec", "docs/s", {config: measure(config, folder, root)
                                                                for config in CONFIGS}, docs)
    return 0


def write_split_and_spm(folder: str, files: list, spm: str = None) -> str:
    """The split file of every document of `files` (and an id the corpus lacks) as `folder`/train.gz, and
    `folder`/spm.model: a copy of `spm`, else one trained on the documents. Returns the model's path."""
    import shutil

    from templm.data.vocab import train_spm

    docs = list(corpus_documents(files))
    with gzip.open(os.path.join(folder, "train.gz"), "wt") as f:
        f.writelines(f"{d.date:%Y%m%d}\t{d.id}\n" for d in docs[:len(docs) // 2])
        f.write("20170101\tnot-in-the-corpus\n")
        f.writelines(f"{d.date:%Y%m%d}\t{d.id}\n" for d in docs[len(docs) // 2:])
    target = os.path.join(folder, "spm.model")
    if spm:
        shutil.copyfile(spm, target)
        return target
    return train_spm(docs, target[:-len(".model")], vocab_size=500, exact_size=False)


if __name__ == "__main__":
    sys.exit(main())
