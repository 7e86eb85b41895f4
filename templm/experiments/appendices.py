""""Mind the Gap"'s appendices B and C (`templm appendices`): does the gap hold for other test periods, and does it
keep growing as the training period ends further before the test period?

* Appendix B, shifted test periods (`run_shifted_periods`): the streaming experiment again with the cut-off moved
  back by whole years (`shifts`), each shift with its own TIME-STRATIFIED and CONTROL splits, tokenizers and models
  (the same preset sizes, seed and steps) and its own test period of the preset's months; each period's relative
  increase by month (the paper's Figure 8) and its `streaming_gap` test.
* Appendix C, increasing distance (`run_increasing_distance`): at the preset's cut-off, training sets of one size
  ending `gaps` months before it (templm.data.splits.distance_splits, the published increasing_distance/ layout),
  one model each (its own tokenizer), all scored on the same test stream with the CONTROL model as the reference;
  each model's word perplexity against its distance (the paper's Figure 9).

Both run on the embedded world of the preset's size (drawn from `seed`), or on a corpus (`corpus`; any format
templm reads) when given. Dynamic evaluation and the larger model are left out: the appendices compare static
models. `run_appendices` runs the ones asked for into one folder and writes results.json with the appendices'
findings (templm.metrics.findings: appendix_every_period_gap, appendix_distance_growth); the report and figures are
templm.reports.appendices.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import time
from typing import Any, Dict, List, Optional, Sequence, Union

from templm import console, paths
from templm.data.lm_data import split_path
from templm.data.readers import Corpus, read_documents
from templm.data.splits import distance_splits, read_split_file
from templm.data.vocab import train_spm
from templm.data.world import generate_world
from templm.errors import check_interrupted
from templm.experiments.streaming import (DynamicEvalConfig, StreamAnalyses, StreamData, prepare_preset_data,
                                         run_stream_experiment, stream_evaluation, stream_preset, train_preset_lm)
from templm.experiments.studies import StreamPreset, world_config
from templm.io import format_duration, write_json
from templm.metrics.findings import APPENDICES, judge
from templm.metrics.stream import document_log_ppl
from templm.models.transformer_xl import TransformerXLConfig
from templm.outputs import claim_output_folder

APPENDICES_KIND = "appendices study"  # the kind of output folder (templm.outputs)

WHICH = ("shifted", "distance")


def _static(preset: Union[str, StreamPreset]) -> StreamPreset:
    """The preset without dynamic evaluation or a larger model: the appendices compare static models."""
    return dataclasses.replace(stream_preset(preset), dynamic=(), larger_model=None)


def shift_years(date: datetime.date, years: int) -> datetime.date:
    """`date` moved `years` back, 29 February becoming the 28th."""
    try:
        return date.replace(year=date.year - years)
    except ValueError:
        return date.replace(year=date.year - years, day=28)


def _world_corpus(out_dir: str, preset: StreamPreset, seed: int, corpus: Optional[Corpus]) -> Corpus:
    if corpus is not None:
        return corpus
    folder = paths.join(out_dir, "world")
    generate_world(world_config(preset, seed), folder)
    return paths.join(folder, "news.jsonl")


def run_shifted_periods(out_dir: str, preset: Union[str, StreamPreset] = "smoke", seed: int = 0,
                        shifts: Sequence[int] = (0, 1, 2), corpus: Optional[Corpus] = None, mesh=None
                        ) -> List[Dict[str, Any]]:
    """Appendix B: one streaming experiment per shift (years before the preset's cut-off) in out_dir/shift_<k>.
    Returns per shift {"shift_years", "cutoff", "months", "word_ppl" {run: overall}, "relative_increase" (overall),
    "relative_per_month", "slope" (per month), "findings" (the period's streaming_gap and streaming_growth)}."""
    p = _static(preset)
    corpus = _world_corpus(out_dir, p, seed, corpus)
    periods = []
    for k in sorted({int(s) for s in shifts}):
        if k < 0:
            raise ValueError(f"shifts must be whole years of at least 0, got {k}")
        cutoff = shift_years(p.cutoff, k)
        started = time.time()
        summary = run_stream_experiment(paths.join(out_dir, f"shift_{k}"), corpus=corpus, preset=p, seed=seed,
                                        cutoff=cutoff, mesh=mesh)
        with paths.open(summary["results"], encoding="utf-8") as f:
            results = json.load(f)
        word = {run: results["runs"][run]["static"]["overall"]["word_ppl"] for run in ("time_stratified", "control")}
        relative = results["relative"]["static"]
        periods.append({"shift_years": k, "cutoff": cutoff.isoformat(), "months": results["months"],
                        "word_ppl": word, "relative_increase": word["time_stratified"] / word["control"] - 1.0,
                        "relative_per_month": relative["per_month"], "slope": relative["slope"],
                        "findings": {n: results["findings"][n] for n in ("streaming_gap", "streaming_growth")},
                        "seconds": round(time.time() - started, 1)})
        console.say(f"appendices: test period {results['months'][0]}..{results['months'][-1]} (cut-off "
                    f"{cutoff.isoformat()}): relative increase {100 * periods[-1]['relative_increase']:+.1f} % "
                    f"({format_duration(time.time() - started)})")
    return periods


def run_increasing_distance(out_dir: str, preset: Union[str, StreamPreset] = "smoke", seed: int = 0,
                            gaps: Sequence[int] = (0, 6, 12, 18, 24), corpus: Optional[Corpus] = None, mesh=None
                            ) -> Dict[str, Any]:
    """Appendix C in out_dir: the preset's splits, a training set of one size `gaps` months before the cut-off
    each, a model per set (out_dir/gap_<g>, its own tokenizer) and the CONTROL model, scored on the one test stream
    (out_dir/stream/results.json). Returns {"cutoff", "size", "gaps", "ends", "word_ppl" {gap: overall},
    "control_word_ppl", "relative_per_month" {gap: {month: relative increase over CONTROL}}, "documents" {gap:
    per-document log word perplexity}}."""
    p = _static(preset)
    corpus = _world_corpus(out_dir, p, seed, corpus)
    data = prepare_preset_data(out_dir, p, seed, corpus=corpus)
    split_dir = data["split_dir"]
    section = distance_splits(data["corpus"], split_dir, gaps)
    config = TransformerXLConfig(vocab_size=p.model_vocab_size, **p.model)

    def train(name: str, split_file: str, spm_model: str) -> str:
        started = time.time()
        folder = paths.join(out_dir, name)
        train_preset_lm(folder, config, p, seed, mesh, corpus=data["corpus"], split_file=split_file,
                        spm_model=spm_model)
        console.say(f"appendices: {name} trained ({format_duration(time.time() - started)})")
        return folder

    runs = {}
    for g, info in section["gaps"].items():
        split_file = paths.join(info["split_dir"], "train.gz")
        ids = {doc_id for _, doc_id in read_split_file(split_file)}
        spm = train_spm((d for d in read_documents(data["corpus"]) if d.id in ids),
                        paths.join(out_dir, f"spm_gap_{g}"), vocab_size=p.vocab_size, seed=seed, exact_size=False)
        runs[f"gap_{g}"] = train(f"gap_{g}", split_file, spm)
    control = train("control", split_path(None, split_dir, "control_train"), data["spm_models"]["control"])
    names = list(runs)
    results = stream_evaluation(paths.join(out_dir, "stream"), runs[names[0]], control,
                                StreamData(corpus=data["corpus"], split_dir=split_dir), DynamicEvalConfig(()),
                                StreamAnalyses(topics=False, pos=False), seed=seed,
                                extra_dirs={name: runs[name] for name in names[1:]}, overwrite=True)
    months_ctl = {m: v["word_ppl"] for m, v in results["runs"]["control"]["static"]["by_month"].items()}
    stored = {name: "time_stratified" if name == names[0] else name for name in names}
    out: Dict[str, Any] = {"cutoff": section["cutoff"], "size": section["size"],
                           "gaps": [int(g) for g in section["gaps"]],
                           "ends": {g: info["end"] for g, info in section["gaps"].items()},
                           "control_word_ppl": results["runs"]["control"]["static"]["overall"]["word_ppl"],
                           "word_ppl": {}, "relative_per_month": {}, "documents": {},
                           "results": paths.join(out_dir, "stream", "results.json")}
    for name in names:
        g = name[len("gap_"):]
        run = results["runs"][stored[name]]["static"]
        out["word_ppl"][g] = run["overall"]["word_ppl"]
        out["relative_per_month"][g] = {m: v["word_ppl"] / months_ctl[m] - 1.0 for m, v in run["by_month"].items()
                                        if m in months_ctl}
        out["documents"][g] = document_log_ppl(results["documents"], f"{stored[name]}/static").tolist()
    return out


def run_appendices(out_dir: str, which: Sequence[str] = WHICH, preset: Union[str, StreamPreset] = "smoke",
                   seed: int = 0, shifts: Sequence[int] = (0, 1, 2), gaps: Sequence[int] = (0, 6, 12, 18, 24),
                   corpus: Optional[Corpus] = None, mesh=None, overwrite: bool = False) -> Dict[str, Any]:
    """The appendices asked for (`which`: "shifted", "distance") into out_dir (shifted/, distance/), then
    out_dir/results.json with both and their findings; returns it."""
    unknown = sorted(set(which) - set(WHICH))
    if unknown or not which:
        raise ValueError(f"which must name some of {WHICH}, got {list(which)}")
    started = time.time()
    out_dir = paths.absolute(claim_output_folder(out_dir, APPENDICES_KIND, overwrite))  # a user's folder refused
    p = _static(preset)
    results: Dict[str, Any] = {"config": {"preset": preset if isinstance(preset, str) else "custom", "seed": seed,
                                          "which": list(which), "shifts": sorted({int(s) for s in shifts}),
                                          "gaps": sorted({int(g) for g in gaps}), "corpus": corpus,
                                          "cutoff": p.cutoff.isoformat(), "test_months": p.test_months,
                                          "train_steps": p.train_steps}}
    if "shifted" in which:
        results["periods"] = run_shifted_periods(paths.join(out_dir, "shifted"), p, seed, shifts, corpus, mesh)
    if "distance" in which:
        results["distance"] = run_increasing_distance(paths.join(out_dir, "distance"), p, seed, gaps, corpus, mesh)
    results["findings"] = judge(results, APPENDICES)
    results["config"]["seconds"] = round(time.time() - started, 1)
    check_interrupted()  # a signal whose exception was dropped during the work: no result is written
    write_json(paths.join(out_dir, "results.json"), results)
    return results
