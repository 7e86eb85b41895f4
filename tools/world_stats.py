"""The embedded world's measured statistics beside the papers' figures: `python tools/world_stats.py` draws each
preset's two worlds (the time-aware half's and the streaming half's, as `templm reproduce` draws them) for a few
seeds, measures them and prints a Markdown table; `--readme` writes it into README.md between its world_stats markers.

Measured, each a mean over the seeds with the range:
- year mentions: the share of sentences that name a year, and of those naming their document's year (Dhingra et al.,
  "Discussion & Limitations": 3.9 % and 2.1 % of CustomNews sentences);
- novel words in the streaming half's test months: the share of test tokens, and of test word types, never seen in
  the training period, and the share of those types used again in at least four later months (Lazaridou et al.,
  section 3.4: 0.1-0.3 % of WMT's and CustomNews's tokens; up to 27 % of CustomNews's types; 14-35 % reappear);
- change rates: the share of TempLAMA's (subject, relation) pairs whose answers differ from the year before, and the
  share of queries with several answers (neither paper gives a figure for its data);
- coverage: the share of TempLAMA queries whose answer (any of them) no news sentence of the query's year states.
  A Yearly expert reads its year's news alone, so it cannot know those; a model of every year can carry them over
  from the years around (Dhingra et al.: "the Temporal model is better on TempLAMA, where the facts typically span
  multiple years"; no figure for their data).

Words are runs of letters (`[A-Za-z]+`); sentences are the spans the world's mentions.jsonl records.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import re
import sys
import tempfile
from typing import Dict, Iterable, List, Mapping, Sequence, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from templm.data import JsonlReader  # noqa: E402
from templm.data.world import generate_world, load_world  # noqa: E402

VALIDATION_MONTHS = 3  # between the cut-off and the test months, as the streaming half splits them
YEAR = re.compile(r"\b(?:19|20)\d\d\b")
WORD = re.compile(r"[A-Za-z]+")
BEGIN = "<!-- world_stats: begin (written by tools/world_stats.py) -->"
END = "<!-- world_stats: end -->"

# (key, what is measured, the papers' figure)
ROWS = (
    ("year_mentions", "sentences that name a year (time-aware world)",
     "3.9 % of CustomNews sentences (Dhingra et al.)"),
    ("publication_year_mentions", "sentences that name their document's year (time-aware world)",
     "2.1 % (Dhingra et al.)"),
    ("novel_tokens", "test tokens never seen in the training period (streaming world)",
     "0.1-0.3 % in WMT and CustomNews (Lazaridou et al., section 3.4)"),
    ("novel_types", "test word types never seen in the training period (streaming world)",
     "up to 27 % in CustomNews (Lazaridou et al.)"),
    ("novel_reappear", "of those types, used again in at least four later test months",
     "14-35 % (Lazaridou et al.)"),
    ("answer_changes", "TempLAMA (subject, relation) pairs whose answers differ from the year before",
     "no figure in either paper"),
    ("multi_answer", "TempLAMA queries with several answers", "no figure in either paper"),
    ("unstated_answers", "TempLAMA queries whose answer no news sentence of their year states",
     "no figure in either paper"),
    ("event_sentences", "sentences about a named event in its first 90 days in the news (time-aware world)",
     "no figure; CustomNews is \"far more likely to describe short-lived facts\" (Dhingra et al.)"),
)


def sentences(world_dir: str) -> List[Tuple[datetime.date, str, str]]:
    """(document date, sentence, source) of every sentence of a world, from news.jsonl and mentions.jsonl's spans (the
    source as mentions.jsonl names it: a relation, "topic:...", "burst" or "rising")."""
    with open(os.path.join(world_dir, "mentions.jsonl"), encoding="utf-8") as f:
        spans = [json.loads(line)["sentences"] for line in f]
    out = []
    for doc, doc_spans in zip(JsonlReader(os.path.join(world_dir, "news.jsonl")), spans):
        out.extend((doc.date, doc.text[start:end], source) for start, end, source in doc_spans)
    return out


def year_mentions(sents: Sequence[Tuple[datetime.date, str]]) -> Dict[str, float]:
    """The share of sentences naming a year, and of sentences naming their own document's year."""
    named = [(date, YEAR.findall(text)) for date, text in sents]
    n = max(1, len(named))
    return {"year_mentions": sum(bool(years) for _, years in named) / n,
            "publication_year_mentions": sum(str(date.year) in years for date, years in named) / n}


def _month(date: datetime.date) -> Tuple[int, int]:
    return date.year, date.month


def novel_words(documents: Iterable[Tuple[datetime.date, str]], cutoff: datetime.date, test_start: datetime.date,
                test_end: datetime.date) -> Dict[str, float]:
    """Over the documents from `test_start` to `test_end` (the test months): the share of their word tokens and of
    their word types never seen in the documents up to `cutoff` (the training period), and the share of those novel
    types used in at least four test months besides the first one they appear in."""
    seen = set()
    test: List[Tuple[datetime.date, List[str]]] = []
    for date, text in documents:
        words = WORD.findall(text)
        if date <= cutoff:
            seen.update(words)
        elif test_start <= date <= test_end:
            test.append((date, words))
    tokens = [w for _, words in test for w in words]
    novel_tokens = [w for w in tokens if w not in seen]
    months = collections.defaultdict(set)
    for date, words in test:
        for w in words:
            if w not in seen:
                months[w].add(_month(date))
    types = set(tokens)
    reappear = sum(len(m) - 1 >= 4 for m in months.values())
    return {"novel_tokens": len(novel_tokens) / max(1, len(tokens)),
            "novel_types": len(months) / max(1, len(types)),
            "novel_reappear": reappear / max(1, len(months))}


def answer_changes(queries: Iterable[Mapping]) -> Dict[str, float]:
    """TempLAMA rows ({"id": SUBJECT_RELATION_YEAR, "answer": [{"wikidata_id"}...]}): the share of (subject,
    relation) pairs' consecutive years whose answer sets differ, and the share of rows with several answers."""
    by_pair: Dict[Tuple[str, str], Dict[int, frozenset]] = collections.defaultdict(dict)
    rows = multi = 0
    for row in queries:
        subject, relation, year = row["id"].rsplit("_", 2)
        answers = frozenset(a["wikidata_id"] for a in row["answer"])
        by_pair[(subject, relation)][int(year)] = answers
        rows += 1
        multi += len(answers) > 1
    changes = pairs = 0
    for years in by_pair.values():
        for year, answers in years.items():
            if year - 1 in years:
                pairs += 1
                changes += answers != years[year - 1]
    return {"answer_changes": changes / max(1, pairs), "multi_answer": multi / max(1, rows)}


def stated_facts(world_dir: str) -> set:
    """{(subject id, relation, object id, year)} of every fact a news sentence of a world states (mentions.jsonl's
    fact indices into load_world's facts; the year is the document's, from news.jsonl)."""
    facts = load_world(world_dir)["facts"]
    with open(os.path.join(world_dir, "mentions.jsonl"), encoding="utf-8") as f:
        stated = [json.loads(line)["facts"] for line in f]
    out = set()
    for doc, indices in zip(JsonlReader(os.path.join(world_dir, "news.jsonl")), stated):
        out.update((facts[i].subject, facts[i].relation, facts[i].object, doc.date.year) for i in indices)
    return out


def unstated_answers(queries: Iterable[Mapping], stated: set) -> Dict[str, float]:
    """The share of TempLAMA rows ({"id": SUBJECT_RELATION_YEAR, "answer": [{"wikidata_id"}...]}) none of whose
    answers is in `stated` (stated_facts) for the row's subject, relation and year."""
    rows = unstated = 0
    for row in queries:
        subject, relation, year = row["id"].rsplit("_", 2)
        rows += 1
        unstated += not any((subject, relation, a["wikidata_id"], int(year)) in stated for a in row["answer"])
    return {"unstated_answers": unstated / max(1, rows)}


def measure(preset: str, seed: int, scratch: str) -> Dict[str, float]:
    """Every statistic of ROWS for one preset and seed, on the worlds `templm reproduce` would draw."""
    from templm.experiments.studies import load_study, world_config

    study = load_study(preset)
    p, s = study.preset, study.stream
    t5_dir, stream_dir = (os.path.join(scratch, f"{preset}_{seed}_{half}") for half in ("t5", "stream"))
    generate_world(world_config(p, seed), t5_dir, lock=False)
    generate_world(world_config(s, seed), stream_dir, lock=False)
    sents = sentences(t5_dir)
    out = year_mentions([(date, text) for date, text, _ in sents])
    out["event_sentences"] = sum(source == "burst" for _, _, source in sents) / max(1, len(sents))
    cutoff = datetime.date.fromisoformat(str(s.cutoff))

    def month_start(months_after_cutoff: int) -> datetime.date:
        k = cutoff.year * 12 + cutoff.month - 1 + months_after_cutoff
        return datetime.date(k // 12, k % 12 + 1, 1)

    # The test months follow VALIDATION_MONTHS months of validation (templm.data.splits).
    test_start = month_start(1 + VALIDATION_MONTHS)
    test_end = month_start(1 + VALIDATION_MONTHS + s.test_months) - datetime.timedelta(days=1)
    out.update(novel_words(((d.date, d.text) for d in JsonlReader(os.path.join(stream_dir, "news.jsonl"))), cutoff,
                           test_start, test_end))
    rows = []
    for split in ("train", "val", "test"):
        with open(os.path.join(t5_dir, "templama", f"{split}.jsonl"), encoding="utf-8") as f:
            rows.extend(json.loads(line) for line in f)
    out.update(answer_changes(rows))
    out.update(unstated_answers(rows, stated_facts(t5_dir)))
    return out


def table(measured: Mapping[str, Sequence[Mapping[str, float]]], seeds: Sequence[int]) -> str:
    """The Markdown table: one row per statistic, one column per preset (mean over the seeds, and the range)."""
    def cell(values):
        return f"{100 * sum(values) / len(values):.2f} % ({100 * min(values):.2f}-{100 * max(values):.2f})"

    header = ["statistic", *[f"{preset}, seeds {','.join(map(str, seeds))}" for preset in measured], "the papers"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for key, what, paper in ROWS:
        lines.append("| " + " | ".join([what, *[cell([m[key] for m in runs]) for runs in measured.values()],
                                        paper]) + " |")
    return "\n".join(lines)


def write_block(path: str, text: str) -> None:
    with open(path, encoding="utf-8") as f:
        readme = f.read()
    if BEGIN not in readme or END not in readme:
        raise SystemExit(f"{path} has no world_stats markers ({BEGIN} ... {END})")
    head, rest = readme.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"{head}{BEGIN}\n{text}\n{END}{tail}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", default="smoke,small")
    parser.add_argument("--seeds", default="2301,2302,2303",
                        help="the worlds' seeds (never a seed a choice was made on)")
    parser.add_argument("--readme", action="store_true", help="write the table into README.md between its markers")
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    measured = {}
    with tempfile.TemporaryDirectory(prefix="world-stats-") as scratch:
        for preset in args.presets.split(","):
            measured[preset] = [measure(preset, seed, scratch) for seed in seeds]
            print(f"world_stats: {preset} measured on seeds {args.seeds}", file=sys.stderr)
    text = table(measured, seeds) + f"\n\n`python tools/world_stats.py --presets {args.presets} --seeds {args.seeds}`"
    print(text)
    if args.readme:
        write_block(os.path.join(REPO, "README.md"), text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
