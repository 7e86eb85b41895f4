"""The streaming-perplexity experiment ("Mind the Gap", Lazaridou et al.): `templm stream` and its end-to-end run.

Two entry points:

* `stream_evaluation(...)` (gin: ``templm.stream_evaluation``; the `templm stream` verb): reads the test documents
  of a split in date order as one token stream (templm.data.token_stream), scores it with a TIME-STRATIFIED and a
  CONTROL checkpoint of `templm train_lm` (templm.evaluation.stream_eval) -- statically, and with dynamic evaluation
  of the TIME-STRATIFIED model in every configured variant (SGD or RMS; all parameters, embeddings only, biases only,
  or a regex) -- and computes every analysis (templm.metrics.stream.stream_results): perplexity per month and overall
  (subword and word level), the relative increase of TIME-STRATIFIED over CONTROL per month with and without dynamic
  evaluation and its slope, emerging words, first versus later occurrences, topics, and parts of speech when spaCy is
  installed. It writes them as OUT_DIR/results.json; the verb then writes report.md and the figures
  (templm.reports.stream.write_stream_report). Anything not given is read from the TIME-STRATIFIED checkpoint's
  record: the corpus, the SentencePiece model, the split folder (test = `<split folder>/test.gz`) and the training
  split (for the word counts of the emerging-word analysis and the gradient statistics of the RMS rule).

* `run_stream_experiment(out_dir, ...)`: the whole experiment as one call (a stage of `templm reproduce`,
  `reproduce_stage`): the embedded world (or a given corpus), TIME-STRATIFIED / CONTROL splits, one SentencePiece
  vocabulary, two tiny Transformer-XL models, and `stream_evaluation`; returns a summary of the monthly degradation
  and of what dynamic evaluation recovers (templm.metrics.stream.summarize), which the reproduction's report renders
  (templm.reports.stream.streaming_section).

One vocabulary for both models. The comparison is per token and per word of ONE test stream: both models must
predict the same targets, so they must share the SentencePiece model (a checkpoint records its SHA-256; two
checkpoints that disagree are refused). The experiment trains it on the union of the two training splits -- the
documents either model may see, never a test or validation document -- so that neither model's words are cut into
more pieces than the other's by construction.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import gin
import jax
import numpy as np
from absl import logging

from templm import console, paths
from templm.data.lm_data import load_processor, read_split_documents, split_path, tokenize_documents
from templm.data.readers import Corpus, read_documents, resolve_corpus
from templm.data.splits import UnsplittableCorpus, check_split_ids, make_splits, read_split_file
from templm.data.token_stream import TokenStream, build_stream, word_counts
from templm.data.vocab import train_spm
from templm.data.world import WorldConfig, generate_world
from templm.errors import (ConfigError, DataError, StageSkipped, check_interrupted, require_field_types, require_macros,
                           require_numbers)
from templm.evaluation import dynamic_eval
from templm.evaluation.stream_eval import evaluate_stream
from templm.experiments.studies import StreamPreset, load_study, study_names, world_config
from templm.io import file_sha256, write_json
from templm.metrics.findings import STREAMING, judge
from templm.metrics.stream import (CONTROL_TOKENIZER_RUN, LARGER_MODEL_RUN, moses_word_log_probs, moses_words,
                                   perplexity, stream_results, summarize, tokenizer_comparison)
from templm.models.transformer_xl import TransformerXLConfig
from templm.outputs import build_output_folder, claim_output_folder
from templm.training import loop, partitioning
from templm.training.configs import CheckpointConfig, CorpusConfig, OptimizerConfig, SaveCheckpointConfig
from templm.training.lm_trainer import load_lm, train_lm
from templm.training.loop import RunOptions

STREAM_EVALUATION = "stream evaluation"  # the kind of output folder (templm.outputs)

# Dynamic evaluation variants of the TIME-STRATIFIED model (names become the report's modes). Each variant's rate
# is chosen among its "lrs" on the TIME-STRATIFIED validation stream (the months after the cut-off, before the test
# period), never on the test stream; "lr" is the rate used when there is no validation split. RMS with eps 1e-3, as
# lr / (sqrt(ms) + 1e-5) overshoots on parameters with no training gradient.
DEFAULT_DYNAMIC = (
    {"name": "dynamic", "rule": "sgd", "which": "all", "lr": 0.03, "lrs": (0.01, 0.03, 0.1)},
    {"name": "dynamic_embeddings", "rule": "sgd", "which": "embeddings", "lr": 0.03, "lrs": (0.01, 0.03, 0.1)},
    {"name": "dynamic_biases", "rule": "sgd", "which": "biases", "lr": 0.3, "lrs": (0.1, 0.3, 1.0)},
    {"name": "dynamic_rms", "rule": "rms", "which": "all", "lr": 1e-4, "lrs": (3e-5, 1e-4, 3e-4), "eps": 1e-3,
     "decay": 0.0},
    {"name": "dynamic_rms_decay", "rule": "rms", "which": "all", "lr": 1e-4, "lrs": (3e-5, 1e-4, 3e-4), "eps": 1e-3,
     "decay": 0.02},
)
_VARIANT_KEYS = {"name", "rule", "which", "lr", "lrs", "decay", "eps", "normalise_decay"}


def _check_variants(variants: Sequence[Mapping[str, Any]]) -> List[Dict[str, Any]]:
    out, names = [], set()
    for k, v in enumerate(variants):
        if not isinstance(v, Mapping):
            raise ValueError(f"stream_evaluation.dynamic[{k}] must be a dict, got {v!r}")
        unknown = sorted(set(v) - _VARIANT_KEYS)
        if unknown or "name" not in v or "rule" not in v:
            raise ValueError(f"stream_evaluation.dynamic[{k}] = {dict(v)!r}: needs 'name' and 'rule'; allowed keys "
                             f"{sorted(_VARIANT_KEYS)}" + (f"; unknown {unknown}" if unknown else ""))
        if v["name"] == "static" or v["name"] in names:
            raise ValueError(f"stream_evaluation.dynamic[{k}]: name {v['name']!r} is 'static' or used twice")
        if v["rule"] not in ("sgd", "rms"):
            raise ValueError(f"stream_evaluation.dynamic[{k}]: rule must be 'sgd' or 'rms', got {v['rule']!r}")
        lrs = v.get("lrs")
        if lrs is not None and (isinstance(lrs, (str, bytes)) or not list(lrs)
                                or not all(isinstance(x, (int, float)) and x > 0 for x in lrs)):
            raise ValueError(f"stream_evaluation.dynamic[{k}]: lrs must be a list of positive rates, got {lrs!r}")
        names.add(v["name"])
        out.append(dict(v, lrs=None if lrs is None else [float(x) for x in lrs]))
    return out


def choose_rate(evaluate: Callable[[float], float], lrs: Sequence[float], max_widen: int = 3
                ) -> Tuple[float, Dict[float, float]]:
    """The rate among `lrs` with the lowest `evaluate(rate)` (a validation perplexity; not finite counts as worst,
    ties go to the smaller rate), with the grid widened while the best lies at its edge: one more rate beyond that
    edge, at the grid's own ratio between neighbours (3 for a one-rate grid), at most `max_widen` times.
    Returns (rate, {rate: value} of every rate tried, in increasing order)."""
    grid = sorted(float(x) for x in lrs)
    ratio = grid[1] / grid[0] if len(grid) > 1 else 3.0
    ratio = ratio if ratio > 1 else 3.0
    values = {x: float(evaluate(x)) for x in grid}

    def best() -> float:
        return min(values, key=lambda x: (values[x] if np.isfinite(values[x]) else np.inf, x))

    for _ in range(max_widen):
        rate = best()
        if len(values) > 1 and min(values) < rate < max(values):
            break
        if not np.isfinite(values[rate]):
            break  # nothing finite: widening is no help
        # A one-rate grid, or a best rate at an edge: try one more beyond it (on both sides for one rate).
        low, high = min(values), max(values)
        for x in ([low / ratio] if rate == low else []) + ([high * ratio] if rate == high else []):
            values[x] = float(evaluate(x))
    return best(), dict(sorted(values.items()))


def _sample_documents(documents: list, limit: Optional[int], seed: int) -> list:
    if limit is None or len(documents) <= limit:
        return documents
    keep = np.sort(np.random.default_rng([seed, 7]).choice(len(documents), size=limit, replace=False))
    return [documents[i] for i in keep]


def _training_segments(documents: list, processor: Any, seg_len: int, n_segments: int) -> np.ndarray:
    """[K, 1, seg_len + 1] segments of the most recent training text (the stream's layout), K <= n_segments."""
    tokens, _ = tokenize_documents(documents, processor)
    stream = np.concatenate([[int(processor.eos_id())], tokens]).astype(np.int32)
    k = max(1, min(n_segments, (len(stream) - 1) // seg_len))
    tail = stream[-(k * seg_len + 1):]
    if len(tail) < k * seg_len + 1:
        raise DataError(f"the training split holds {len(stream)} tokens, too few for one segment of {seg_len}")
    return np.stack([tail[i * seg_len:(i + 1) * seg_len + 1] for i in range(k)])[:, None, :]


def _run_tokenizers(loaded: Mapping[str, Any], runs_dirs: Mapping[str, str],
                    spm_model: Optional[str]) -> Dict[str, str]:
    """{run: its SentencePiece model file}. Default: each run's own (its record's), checked unchanged since training
    (SHA-256); with `spm_model`, that one file for every run, which must be the one each was trained with."""
    files = {}
    for name, (_, _, meta) in loaded.items():
        path = spm_model or meta["spm_model"]
        if not paths.exists(path):
            raise DataError("no such SentencePiece model file" + ("" if spm_model else
                            f" (the {name} model's, {runs_dirs[name]})"), path)
        if meta.get("spm_sha256") != file_sha256(path):
            if spm_model:
                raise DataError(f"the {name} model was trained with the SentencePiece model {meta.get('spm_model')}, "
                                f"which differs from {spm_model}: one test stream must serve every model, so they "
                                "must share one vocabulary (leave spm_model unset to read each with its own)",
                                runs_dirs[name])
            raise DataError(f"the {name} model's SentencePiece model has changed since it was trained "
                            f"(SHA-256 differs from the one recorded in {runs_dirs[name]})", path)
        files[name] = paths.absolute(path)
    return files


@gin.configurable(module="templm")
@dataclasses.dataclass(frozen=True)
class StreamData:
    """The test stream and how it is read; what is None is read from the TIME-STRATIFIED checkpoint's record.

    corpus, split_dir: those of the TIME-STRATIFIED run; test_split_file: `split_dir/test.gz`; train_split_file
    (word counts for emerging words, gradient statistics for the RMS rule): the TIME-STRATIFIED training split;
    validation_split_file (where the dynamic variants' rates are chosen): `split_dir/time_stratified_validation.gz`,
    the months between the cut-off and the test period. spm_model: None, each run reads the test stream with the
    SentencePiece model it was trained with (the paper's per-setup tokenizers; runs are then compared by word
    perplexity); a file: every run must have been trained with it (one shared stream). batch_size: parallel streams
    (1: the paper's single stream, memory carried across every segment and document); seg_len / mem_len: segment
    and memory length (default: the TIME-STRATIFIED model's tgt_len and evaluation memory length).
    allow_missing_ids: split ids the corpus lacks are left out with a warning instead of stopping the evaluation
    (a published split beside a corpus that drifted from it; `templm reproduce` checks them before any training)."""

    corpus: Optional[Union[str, Sequence[str]]] = None
    split_dir: Optional[str] = None
    test_split_file: Optional[str] = None
    train_split_file: Optional[str] = None
    validation_split_file: Optional[str] = None
    spm_model: Optional[str] = None
    corpus_format: str = "auto"
    batch_size: int = 1
    seg_len: Optional[int] = None
    mem_len: Optional[int] = None
    allow_missing_ids: bool = False

    def __post_init__(self):
        require_field_types(self, "templm.StreamData")  # a quoted number or an infinity from gin, named


@gin.configurable(module="templm")
@dataclasses.dataclass(frozen=True)
class DynamicEvalConfig:
    """Dynamic evaluation: `variants`, dicts {"name", "rule": "sgd"|"rms", "which": "all"|"embeddings"|"biases"|regex,
    "lr", "lrs", "decay", "eps", "normalise_decay"}, run on TIME-STRATIFIED (and on CONTROL too with `on_control`). A
    variant with "lrs" takes the rate among them that gives the lowest perplexity on the validation stream, then runs
    the test stream with it (results["dynamic"]["chosen"]). RMS variants use the mean squared gradients of the last
    `ms_segments` training segments (collect_ms)."""

    variants: Sequence[Mapping[str, Any]] = DEFAULT_DYNAMIC
    on_control: bool = False
    ms_segments: int = 64

    def __post_init__(self):
        require_field_types(self, "templm.DynamicEvalConfig")  # a quoted number or an infinity from gin, named


@gin.configurable(module="templm")
@dataclasses.dataclass(frozen=True)
class StreamAnalyses:
    """The analyses' settings (templm.metrics.stream.stream_results): training words counted (Moses) on a seeded
    sample of `train_count_documents` training documents (None: all); emerging words seen at least `min_test_count`
    times in the test stream and unseen or `emerging_ratio` times rarer in training; `n_topics` LDA topics; topics and
    parts of speech (spaCy, when installed) on or off."""

    train_count_documents: Optional[int] = None
    min_test_count: int = 50
    emerging_ratio: float = 5.0
    n_topics: int = 10
    topics: bool = True
    pos: bool = True

    def __post_init__(self):
        require_field_types(self, "templm.StreamAnalyses")  # a quoted number or an infinity from gin, named


@gin.configurable(module="templm")
def stream_evaluation(out_dir: str = gin.REQUIRED, time_stratified_dir: str = gin.REQUIRED,
                      control_dir: Optional[str] = None, data: StreamData = StreamData(),
                      dynamic: DynamicEvalConfig = DynamicEvalConfig(), analyses: StreamAnalyses = StreamAnalyses(),
                      seed: int = 0, step: Optional[int] = None,
                      extra_dirs: Optional[Mapping[str, str]] = None, overwrite: bool = False) -> Dict[str, Any]:
    """Streaming evaluation of a TIME-STRATIFIED (and a CONTROL) checkpoint; writes out_dir/results.json.

    Args:
      out_dir: where results.json goes (and, from the `templm stream` verb, report.md and the figures); a folder
        or a URL (gs://), checked before any work.
      time_stratified_dir / control_dir: `templm train_lm` run folders (latest checkpoint unless `step`), local or
        URLs; the files their records name may be URLs too. Without a CONTROL run there is no relative increase.
      data: the test stream, its neighbouring splits and how they are read (StreamData; gin `templm.StreamData`).
      dynamic: the dynamic-evaluation variants (DynamicEvalConfig; gin `templm.DynamicEvalConfig`).
      analyses: the analyses' settings (StreamAnalyses; gin `templm.StreamAnalyses`).
      seed: the training-word sample and the topic model.
      extra_dirs: {name: run folder} of more runs scored statically on the same stream, each with its own tokenizer;
        one named "time_stratified_control_tokenizer" (TIME-STRATIFIED trained with CONTROL's tokenizer) adds the
        paper's outdated-tokenizer comparison (Appendix E) as results["tokenizer_comparison"].

    Returns the results dict (as results.json) with "files": {"results.json": its path}.
    Raises DataError naming the file for a missing split file, ids missing from the corpus, a SentencePiece model
    changed since training (or, with `spm_model`, a run trained with another), and so on.
    """
    require_macros("templm.stream_evaluation", {"out_dir": ("OUT_DIR", out_dir),
                                                "time_stratified_dir": ("TIME_STRATIFIED_DIR", time_stratified_dir)})
    try:
        require_macros("templm.stream_evaluation", {"control_dir": ("CONTROL_DIR", control_dir)}, allow_none=True)
    except ConfigError as e:
        raise ConfigError(f"{e} (None for a TIME-STRATIFIED run alone)") from None
    started = time.time()
    if not isinstance(dynamic, DynamicEvalConfig):  # a config written when the variants were bound here
        raise ConfigError("templm.stream_evaluation.dynamic takes @templm.DynamicEvalConfig(): bind the variants as "
                          "templm.DynamicEvalConfig.variants = [...]")
    variants = _check_variants(dynamic.variants)
    require_numbers("templm.StreamData", {"batch_size": (data.batch_size, int, 1, "BATCH_SIZE"),
                                          "seg_len": (data.seg_len, int, 1, None),
                                          "mem_len": (data.mem_len, int, 0, None)}, optional=("seg_len", "mem_len"))
    require_numbers("templm.DynamicEvalConfig", {"ms_segments": (dynamic.ms_segments, int, 1, None)})
    require_numbers("templm.StreamAnalyses", {
        "train_count_documents": (analyses.train_count_documents, int, 1, None),
        "min_test_count": (analyses.min_test_count, int, 1, None),
        "emerging_ratio": (analyses.emerging_ratio, float, 1, None), "n_topics": (analyses.n_topics, int, 1, None)},
        optional=("train_count_documents",))
    batch_size, corpus_format, dynamic_on_control = data.batch_size, data.corpus_format, dynamic.on_control
    allow_missing = bool(data.allow_missing_ids)
    out_dir = paths.absolute(out_dir) if paths.is_url(out_dir) else os.fspath(out_dir)
    if partitioning.is_lead():  # a bucket that cannot be written, a user's folder: refused before the models are read
        out_dir = claim_output_folder(out_dir, STREAM_EVALUATION, overwrite,
                                      "bind templm.stream_evaluation.overwrite = True to write into it", create=False)

    # --- Checkpoints and the files they name. -----------------------------------------------------------------
    runs_dirs = {"time_stratified": time_stratified_dir}
    if control_dir:
        runs_dirs["control"] = control_dir
    for name, path in (extra_dirs or {}).items():
        if name in runs_dirs:
            raise ConfigError(f"stream_evaluation.extra_dirs: {name!r} is taken by the TIME-STRATIFIED or CONTROL run")
        runs_dirs[name] = path
    loaded = {name: load_lm(path, step) for name, path in runs_dirs.items()}
    ts_meta = loaded["time_stratified"][2]
    corpus = data.corpus or ts_meta["corpus"]
    split_dir = data.split_dir or paths.dirname(ts_meta["split_file"])
    test_split_file = split_path(data.test_split_file, split_dir, "test")
    train_split_file = data.train_split_file or ts_meta["split_file"]
    spm_models = _run_tokenizers(loaded, runs_dirs, data.spm_model)

    # --- The test stream, read by each run's tokenizer (one stream for runs that share one). ------------------------
    test_docs = read_split_documents(corpus, test_split_file, corpus_format, allow_missing=allow_missing)
    processors = {name: load_processor(path) for name, path in spm_models.items()}
    by_file: Dict[str, TokenStream] = {}
    for name, path in spm_models.items():
        if path not in by_file:
            by_file[path] = build_stream(test_docs, processors[name])
    streams = {name: by_file[path] for name, path in spm_models.items()}
    stream = streams["time_stratified"]
    ts_model = loaded["time_stratified"][0]
    seg_len = ts_model.config.tgt_len if data.seg_len is None else int(data.seg_len)
    mem_len = ts_model.config.test_mem_len if data.mem_len is None else int(data.mem_len)
    shared = len(set(spm_models.values())) == 1
    console.say(f"stream: {len(test_docs)} test documents ({stream.months[0]} .. {stream.months[-1]}), "
                f"{len(moses_words(stream))} words, "
                + (f"{stream.n_targets} tokens" if shared else "tokens " + ", ".join(
                    f"{name} {s.n_targets}" for name, s in streams.items()) + " (each run's own tokenizer)")
                + f"; segments of {seg_len}, memory {mem_len}, {batch_size} stream(s)")
    logging.info("stream: test split %s, corpus %s, SentencePiece models %s", test_split_file, corpus, spm_models)

    # The training split: word counts for the emerging-word analysis, gradient statistics for the RMS rule.
    train_docs = read_split_documents(corpus, train_split_file, corpus_format, allow_missing=allow_missing)

    # The validation stream (the months between the cut-off and the test period): where the variants' rates are
    # chosen, so that nothing is tuned on the test stream.
    validation_split_file = split_path(data.validation_split_file, split_dir, "time_stratified_validation")
    validation_docs = None
    if any(v.get("lrs") for v in variants):
        if paths.exists(validation_split_file):
            validation_docs = read_split_documents(corpus, validation_split_file, corpus_format,
                                                   allow_missing=allow_missing)
        else:
            console.warn(f"no validation split {validation_split_file}: the dynamic-evaluation variants keep their "
                         "configured rates (lr) instead of choosing them on validation data")
    chosen: Dict[str, Any] = {}

    # --- Static and dynamic evaluation. ----------------------------------------------------------------------------
    lps: Dict[str, Dict[str, np.ndarray]] = {}
    timings: Dict[str, float] = {}

    def done(name: str, mode: str) -> None:
        lp = lps[name][mode]
        word_lp, _ = moses_word_log_probs(streams[name], lp)
        word_ppl = perplexity(float(word_lp.sum()), len(word_lp))
        console.say(f"stream: {name} {mode}: word perplexity {word_ppl:.2f}, subword perplexity "
                    f"{float(np.exp(-np.mean(lp))):.3f} ({timings[f'{name}/{mode}']:.1f}s)")

    for name, (model, params, meta) in loaded.items():
        t0 = time.time()
        lps[name] = {"static": evaluate_stream(model, params, streams[name], batch_size=batch_size,
                                               seg_len=seg_len, mem_len=mem_len)}
        timings[f"{name}/static"] = time.time() - t0
        done(name, "static")
        if not (name == "time_stratified" or (name == "control" and dynamic_on_control)):
            continue
        ms = None
        validation = None if validation_docs is None else build_stream(validation_docs, processors[name])
        for v in variants:
            t0 = time.time()
            if v["rule"] == "rms" and ms is None:
                run_train = train_docs if name == "time_stratified" else \
                    read_split_documents(corpus, meta["split_file"], corpus_format, allow_missing=allow_missing)
                segments = _training_segments(run_train, processors[name], seg_len, dynamic.ms_segments)
                ms = dynamic_eval.collect_ms(params, segments, model=model, mem_len=mem_len)

            passes = console.Ticker(f"stream: {name} {v['name']}: dynamic evaluation", None, "passes")

            def run(tokens, lr):
                out = evaluate_stream(
                    model, params, tokens, batch_size=batch_size, seg_len=seg_len, mem_len=mem_len, rule=v["rule"],
                    lr=lr, which=v.get("which", "all"), decay=float(v.get("decay", 0.0)), eps=v.get("eps"),
                    ms=ms if v["rule"] == "rms" else None, normalise_decay=bool(v.get("normalise_decay", True)))
                passes.update(passes.done + 1)  # a line when the rate search and the test pass run for minutes
                return out

            lr = float(v.get("lr", 0.0))
            if validation is not None and v.get("lrs"):
                lr, ppl = choose_rate(lambda x: float(np.exp(-np.mean(run(validation, x)))), v["lrs"])
                chosen[f"{name}/{v['name']}"] = {"lr": lr, "validation_subword_ppl": {str(x): p for x, p in
                                                                                      ppl.items()}}
                console.say(f"stream: {name} {v['name']}: rate {lr:g} chosen on the validation stream ("
                            + ", ".join(f"{x:g}: {p:.3f}" for x, p in ppl.items()) + ")")
            lps[name][v["name"]] = run(streams[name], lr)
            timings[f"{name}/{v['name']}"] = time.time() - t0
            done(name, v["name"])

    # --- Analyses and results.json. -------------------------------------------------------------------------
    train_counts = word_counts(_sample_documents(train_docs, analyses.train_count_documents, seed))
    settings = {"test_split": paths.basename(test_split_file),
                "steps": "/".join(f"{name} {meta['step']}" for name, (_, _, meta) in loaded.items()),
                "vocab_size_by_run": {name: int(processors[name].get_piece_size()) for name in loaded}}
    results = stream_results(stream, lps, seg_len=seg_len, mem_len=mem_len, batch_size=batch_size,
                             train_counts=train_counts, min_test_count=analyses.min_test_count,
                             ratio=analyses.emerging_ratio, n_topics=analyses.n_topics, seed=seed,
                             topics=analyses.topics, pos=analyses.pos, settings=settings,
                             baseline="control", streams=None if shared else streams)
    results["inputs"] = {"corpus": resolve_corpus(corpus), "test_split_file": paths.absolute(test_split_file),
                         "train_split_file": paths.absolute(train_split_file),
                         "spm_models": {name: paths.absolute(path) for name, path in spm_models.items()},
                         "shared_tokenizer": shared,
                         "checkpoints": {name: {"dir": paths.absolute(runs_dirs[name]), "step": meta["step"],
                                                "split_file": meta["split_file"]}
                                         for name, (_, _, meta) in loaded.items()}}
    results["dynamic"] = {"variants": variants, "on_control": dynamic_on_control, "ms_segments": dynamic.ms_segments,
                          "validation_split_file": (paths.absolute(validation_split_file) if validation_docs
                                                    else None),
                          "chosen": chosen}
    results["findings"] = judge(results, STREAMING)
    comparison = tokenizer_comparison(results)
    if comparison is not None:
        results["tokenizer_comparison"] = comparison
    results["timings_sec"] = {**timings, "total": time.time() - started}
    path = paths.join(out_dir, "results.json")
    check_interrupted()  # a signal whose exception was dropped during the work: no result is written
    if partitioning.is_lead():  # a multi-host run: every process evaluated alike, process 0 writes
        claim_output_folder(out_dir, STREAM_EVALUATION, overwrite)  # created and marked now that there are results
        write_json(path, results)
    results["files"] = {"results.json": path}
    return results


# ----------------------------------------------------------------------------------------------------------------
# The end-to-end experiment.


# The streaming halves of the studies of gin_configs/study/ by name (templm/experiments/studies.py).
PRESETS: Dict[str, StreamPreset] = {name: load_study(name).stream for name in study_names()}


# The files of a TIME-STRATIFIED / CONTROL split folder, as `templm data splits` writes them and as the paper's
# release ships them (`<dataset>/time_stratified_control/split_<cut-off>/`).
STREAM_SPLIT_FILES = ("time_stratified_train", "time_stratified_validation", "control_train", "control_validation",
                      "test")


def published_split_stats(split_dir: str, corpus: Optional[Corpus] = None) -> Dict[str, Any]:
    """The sizes and date ranges of the split files in `split_dir` (a published release's or `templm data splits`'
    folder: NAME.gz as the release ships them, or NAME where a copy was gunzipped), read from the files themselves;
    DataError naming the folder for a missing file. With `corpus`, each split's ids are checked against it
    (`check_split_ids`: the ids it lacks counted in each split's "missing", a warning per file; a split naming none
    of it refused)."""
    split_dir = paths.absolute(split_dir)
    files = {name: split_path(None, split_dir, name) for name in STREAM_SPLIT_FILES}
    missing = [f"{name}.gz" for name, path in files.items() if not paths.isfile(path)]
    if missing:
        raise DataError(f"not a TIME-STRATIFIED / CONTROL split folder: {', '.join(missing)} missing (expected "
                        f"{', '.join(n + '.gz' for n in STREAM_SPLIT_FILES)}, as the paper's release and `templm data "
                        "splits` write them, or the same names gunzipped, without .gz)", split_dir)
    splits = {}
    for name, path in files.items():
        dates = [date for date, _ in read_split_file(path)]
        if not dates:
            raise DataError("names no document", path)
        splits[name] = {"documents": len(dates), "first_date": min(dates).isoformat(),
                        "last_date": max(dates).isoformat(), "file": paths.basename(path)}
    if corpus is not None:
        for name, found in check_split_ids(corpus, files).items():
            splits[name].update(missing=found["missing"], missing_ids=found["missing_ids"])
    return {"split_dir": split_dir, "published": True, "cutoff": splits["time_stratified_train"]["last_date"],
            "splits": splits}


def prepare_stream_data(out_dir: str, *, corpus: Optional[Corpus] = None, world: Any = None,
                        cutoff: Optional[datetime.date] = datetime.date(2017, 12, 31), test_months: int = 24,
                        test_docs_per_month: int = 4, vocab_size: int = 512, seed: int = 0,
                        max_spm_sentences: int = 200_000, exact_vocab_size: bool = True,
                        shared_tokenizer: bool = False, split_dir: Optional[str] = None) -> Dict[str, Any]:
    """The data stage: the corpus (`corpus`, or the embedded world drawn with WorldConfig `world` into
    out_dir/world), TIME-STRATIFIED / CONTROL splits in out_dir/splits (`cutoff` None: from the corpus, the latest
    whose 3 validation and `test_months` test months end with it), or the split files of `split_dir` (the paper's
    published splits, or an earlier `templm data splits`) as they are, and the SentencePiece models (`vocab_size`
    pieces; at most that many without `exact_vocab_size`): one per setup trained on that setup's training split,
    out_dir/spm_time_stratified.model and out_dir/spm_control.model (the paper's), or with `shared_tokenizer` one,
    out_dir/spm.model, trained on the union of both training splits (which holds test-period text).

    Returns {"corpus", "split_dir", "spm_models": {"time_stratified": file, "control": file}, "spm_model": the
    TIME-STRATIFIED one, "shared_tokenizer", "splits": stats}."""
    out_dir = paths.absolute(out_dir)
    paths.makedirs(out_dir)
    if corpus is None:
        if split_dir is not None:
            raise ValueError("split files need the corpus they split (corpus)")
        world = world if world is not None else WorldConfig(seed=seed)
        generate_world(world, paths.join(out_dir, "world"))
        corpus = paths.join(out_dir, "world", "news.jsonl")
    if split_dir is not None:
        stats = published_split_stats(split_dir, corpus)
        split_dir = stats["split_dir"]
    else:
        split_dir = paths.join(out_dir, "splits")

        def split(folder):
            return make_splits(corpus, folder, cutoff=cutoff, test_months=test_months,
                               test_docs_per_month=test_docs_per_month, seed=seed)

        # In a bucket the split files are written locally and put in place whole (they name no folder).
        stats = build_output_folder(split_dir, "splits", split) if paths.is_url(split_dir) else split(split_dir)
    groups = {"shared": ("time_stratified_train", "control_train")} if shared_tokenizer else \
        {"time_stratified": ("time_stratified_train",), "control": ("control_train",)}
    files = {}
    for group, splits in groups.items():
        ids = {doc_id for name in splits for _, doc_id in read_split_file(split_path(None, split_dir, name))}
        docs = (d for d in read_documents(corpus) if d.id in ids)
        prefix = paths.join(out_dir, "spm" if shared_tokenizer else f"spm_{group}")
        files[group] = train_spm(docs, prefix, vocab_size=vocab_size, max_sentences=max_spm_sentences, seed=seed,
                                 exact_size=exact_vocab_size)
    spm_models = {name: files["shared" if shared_tokenizer else name] for name in ("time_stratified", "control")}
    return {"corpus": corpus, "split_dir": split_dir, "spm_models": spm_models,
            "spm_model": spm_models["time_stratified"], "shared_tokenizer": shared_tokenizer, "splits": stats}


def prepare_preset_data(out_dir: str, preset: Union[str, StreamPreset] = "tiny_test", seed: int = 0,
                        corpus: Optional[Corpus] = None, shared_tokenizer: bool = False,
                        split_dir: Optional[str] = None,
                        cutoff: Union[datetime.date, None, str] = "preset") -> Dict[str, Any]:
    """`prepare_stream_data` with a preset's world, cut-off ("preset", or a date, or None: from the corpus), test
    period and vocabulary size (at most: the world of any seed must fit it); tests share it."""
    p = stream_preset(preset)
    world = world_config(p, seed)
    return prepare_stream_data(out_dir, corpus=corpus, world=world,
                               cutoff=p.cutoff if cutoff == "preset" else cutoff, test_months=p.test_months,
                               test_docs_per_month=p.test_docs_per_month, vocab_size=p.vocab_size, seed=seed,
                               exact_vocab_size=False, shared_tokenizer=shared_tokenizer, split_dir=split_dir)


def stream_preset(preset: Union[str, StreamPreset]) -> StreamPreset:
    if isinstance(preset, StreamPreset):
        return preset
    if preset not in PRESETS:
        raise ValueError(f"preset must be one of {sorted(PRESETS)} or a StreamPreset, got {preset!r}")
    return PRESETS[preset]


def train_preset_lm(model_dir: str, config: TransformerXLConfig, p: StreamPreset, seed: int, mesh=None,
                    stop: Optional[Callable[[], bool]] = None, **data: Any) -> Any:
    """A Transformer-XL of a streaming preset: its steps, batch, rate and warm-up, documents shuffled, one checkpoint
    kept (at the end), a progress line for minutes of work; `data` the CorpusConfig's corpus, split and
    SentencePiece model; `stop`: RunOptions.stop."""
    return train_lm(model_dir, config, CorpusConfig(batch_size=p.batch_size, data_order="shuffle", **data),
                    p.train_steps, OptimizerConfig(learning_rate=p.learning_rate, warmup_steps=p.warmup),
                    CheckpointConfig(SaveCheckpointConfig(period=0, keep=1)), random_seed=seed,
                    stats_period=max(1, min(50, p.train_steps // 10)),
                    options=RunOptions(mesh=mesh, progress=console.LONG_WORK_SECONDS, stop=stop))


def run_stream_experiment(out_dir: str, world_dir: Optional[str] = None, corpus: Optional[Corpus] = None,
                          preset: Union[str, StreamPreset] = "smoke", seed: int = 0, mesh=None,
                          shared_tokenizer: bool = False,
                          compare_tokenizers: bool = False, split_dir: Optional[str] = None,
                          cutoff: Union[datetime.date, None, str] = "preset",
                          preset_name: str = "custom", trainings_at_once: int = 1) -> Dict[str, Any]:
    """The streaming-perplexity experiment end to end; a stage of `templm reproduce`.

    Args:
      out_dir: receives world/ (unless a corpus is given), splits/, spm_time_stratified.model and
        spm_control.model (spm.model with `shared_tokenizer`), time_stratified/ and control/ (the two `train_lm`
        runs; time_stratified_large/ too when the preset has a `larger_model`), stream/results.json
        (stream_evaluation's results) and summary.json (what this returns).
      world_dir: an embedded world already generated (`templm data world`); its news.jsonl is the corpus.
      corpus: any corpus templm reads instead (dated documents spanning the cut-off and the test period; one file,
        a glob pattern or a list). Default (neither): the world is generated here from `seed` with the preset's
        size, 2010-2020.
      split_dir: with a corpus, its TIME-STRATIFIED / CONTROL split files (the paper's published folder
        `split_<cut-off>/`, or `templm data splits`), used as they are instead of splitting here.
      cutoff: where the splits are made here: "preset" (the preset's, 2017-12-31), a date, or None (from the
        corpus: the latest cut-off whose validation and test months end with it).
      preset: a study's name (PRESETS: the streaming halves of gin_configs/study/*.gin) or a StreamPreset.
      seed: world, splits, vocabulary, initialisation and data order.
      mesh: device mesh for training (default: all devices along the data axis).
      shared_tokenizer: one SentencePiece model for both setups, trained on both training splits, instead of the
        paper's one per setup (see prepare_stream_data).
      compare_tokenizers: also train TIME-STRATIFIED with CONTROL's tokenizer (time_stratified_control_tokenizer/)
        and score it, for the paper's outdated-tokenizer comparison (Appendix E; per-setup tokenizers only).
      trainings_at_once: how many of the models train at once, each in a thread (templm.training.loop.at_once;
        the study's `Study.trainings_at_once`); each model's parameters are those of its training alone.

    Several processes (a multi-host run) call it alike: process 0 prepares the data (the others read its record,
    out_dir/data.json) and writes the files; both trainings span every process; each process evaluates the stream
    on its own device.

    The cut-off is 2017-12-31: TIME-STRATIFIED trains on 2010-2017, validation is 2018-01..03 and the test stream is
    the 24 months 2018-04..2020-03; CONTROL trains on as many documents, the most recent ones up to 2020-03
    (test documents excluded). Both models train on shuffled documents with the same seed, steps and sizes. A
    preset's `larger_model` adds a third, larger TIME-STRATIFIED model (same split, tokenizer, seed and steps),
    scored statically against the same CONTROL model for the model-size comparison (`streaming_size_slope`).

    Returns `metrics.stream.summarize` of the results ({"overall_word_ppl": {run/mode: word ppl}, "relative": {mode:
    {"slope_per_month", "mean", "first_month", "last_month"}}, "dynamic_gain": {mode: relative word-ppl change of
    TIME-STRATIFIED vs its static evaluation}, "months"}) plus "out_dir", "results" (the path of stream/results.json),
    "preset" and "timings_sec".
    """
    p = stream_preset(preset)
    out_dir = paths.absolute(out_dir)
    timings: Dict[str, float] = {}
    t0 = time.time()
    if world_dir is not None and corpus is None:
        corpus = paths.join(world_dir, "news.jsonl")
        if not paths.exists(corpus):
            raise DataError("no news.jsonl here: not an embedded world (templm data world)", world_dir)
    data = _prepared_once(out_dir, lambda: prepare_preset_data(out_dir, preset, seed, corpus=corpus,
                                                               shared_tokenizer=shared_tokenizer, split_dir=split_dir,
                                                               cutoff=cutoff))
    timings["data"] = time.time() - t0
    console.say(f"stream experiment: data ready in {data['split_dir']} ({timings['data']:.1f}s)")

    if compare_tokenizers and shared_tokenizer:
        raise ValueError("compare_tokenizers needs the per-setup tokenizers (shared_tokenizer=False)")
    config = TransformerXLConfig(vocab_size=p.model_vocab_size, **p.model)
    setups = [("time_stratified", "time_stratified_train", "time_stratified", config),
              ("control", "control_train", "control", config)]
    if compare_tokenizers:
        setups.append((CONTROL_TOKENIZER_RUN, "time_stratified_train", "control", config))
    if p.larger_model_config is not None:  # Mind the Gap, section 4: a larger TIME-STRATIFIED model
        setups.append((LARGER_MODEL_RUN, "time_stratified_train", "time_stratified",
                       TransformerXLConfig(vocab_size=p.model_vocab_size, **p.larger_model_config)))
    # Published split files were checked against the corpus in the data step (the ids it lacks counted and said):
    # training and evaluation read them without those ids instead of stopping.
    published = split_dir is not None

    def training(name, split, tokenizer, run_config):
        def job(stop):
            t0 = time.time()
            train_preset_lm(paths.join(out_dir, name), run_config, p, seed, mesh, stop, corpus=data["corpus"],
                            split_dir=data["split_dir"], split=split, spm_model=data["spm_models"][tokenizer],
                            allow_missing_ids=published)
            took = time.time() - t0
            console.say(f"stream experiment: {name} model trained ({took:.1f}s)")
            return took
        return job

    # The extra models (the larger one trains longest) first, so that trainings at once end together.
    seconds = loop.at_once([(setup[0], training(*setup)) for setup in setups[2:] + setups[:2]], trainings_at_once)
    timings.update({f"train_{name}": seconds[name] for name, *_ in setups})

    t0 = time.time()
    results = stream_evaluation(paths.join(out_dir, "stream"), paths.join(out_dir, "time_stratified"),
                                paths.join(out_dir, "control"), data=StreamData(allow_missing_ids=published),
                                dynamic=DynamicEvalConfig(p.dynamic, ms_segments=p.ms_segments),
                                analyses=StreamAnalyses(train_count_documents=p.train_count_documents,
                                                        min_test_count=p.min_test_count, n_topics=p.n_topics),
                                seed=seed, overwrite=True,  # its own folder, inside the one it claimed
                                extra_dirs={name: paths.join(out_dir, name) for name, *_ in setups[2:]} or None)
    timings["evaluate"] = time.time() - t0
    summary = summarize(results)
    summary.update(out_dir=out_dir, results=results["files"]["results.json"],
                   preset=preset if isinstance(preset, str) else preset_name, timings_sec=timings,
                   findings=results["findings"])
    if published:  # each published split file: its documents, and the ids the corpus lacks (counted, not fatal)
        summary["published_splits"] = data["splits"]["splits"]
    if "tokenizer_comparison" in results:
        summary["tokenizer_comparison"] = results["tokenizer_comparison"]
    if partitioning.is_lead():
        write_json(paths.join(out_dir, "summary.json"), summary)
    return summary


DATA_RECORD = "data.json"  # a multi-host run's data step, as process 0 found it, for the other processes


def _prepared_once(out_dir: str, prepare: Callable[[], Dict[str, Any]]) -> Dict[str, Any]:
    """`prepare()` (the data step) once: in one process, that; in a multi-host run, process 0 runs it and records
    its outcome in out_dir/data.json (what it returned, or the reason the corpus cannot be split), and the other
    processes read that once process 0 is done."""
    if jax.process_count() == 1:
        return prepare()
    path = paths.join(out_dir, DATA_RECORD)

    def record():
        try:
            outcome = {"data": prepare()}
        except UnsplittableCorpus as e:
            outcome = {"unsplittable": e.reason, "path": e.path}
        write_json(path, outcome)

    partitioning.on_lead(record, lambda: DataError("process 0 could not prepare the streaming half's data (its "
                                                   "messages say why)", out_dir))
    with paths.open(path, encoding="utf-8") as f:
        outcome = json.load(f)
    if "unsplittable" in outcome:
        raise UnsplittableCorpus(outcome["unsplittable"], outcome.get("path"))
    return outcome["data"]


# ----------------------------------------------------------------------------------------------------------------
# The `templm reproduce` stage.


def _stream_data(context: Any) -> Tuple[Optional[Corpus], Optional[str], Union[datetime.date, None, str]]:
    """(corpus, split folder, cut-off) of the streaming half from the study's data (context.data): the embedded
    world's own (None, None, "preset"); or the stream corpus (by default the study's corpus, or the corpus its task
    data was built from) with its split files, or a cut-off (None: from the corpus)."""
    data = getattr(context, "data", None)
    if data is None or data.embedded:
        return None, None, "preset"
    corpus = data.stream_corpus or data.corpus or (context.manifest.get("config") or {}).get("corpus")
    if corpus is None:
        raise StageSkipped("no corpus for the streaming half: the task data was built from the embedded world; "
                           "give --stream_corpus")
    cutoff = datetime.date.fromisoformat(data.cutoff) if data.cutoff else None
    return corpus, data.split_dir, cutoff

# Expected seconds of each preset's run_stream_experiment, for reproduce's ETA.
ESTIMATED_SECONDS = {"tiny_test": 40.0, "smoke": 130.0, "small": 800.0}


def reproduce_stage(context: Any) -> Dict[str, Any]:
    """The streaming half as a `templm reproduce` extra stage: ``ExtraStage("streaming", reproduce_stage,
    estimated_s=ESTIMATED_SECONDS[preset])``.

    context: reproduce's StageContext (uses .preset.name, .stream_preset, .seed, .out_dir, .data). On the embedded
    world the study's T5 world ends before the streaming half's test months, so this stage draws its own world (same
    seed, the StreamPreset's years) under out_dir/stream_experiment; the StreamPreset is context.stream_preset, or
    the study's of the preset's name ("smoke" for an unknown one). On a user's data it reads their corpus
    (`_stream_data`).
    Returns the `run_stream_experiment` summary (with its "findings"), its "out_dir" and "results" relative to
    context.out_dir (the reproduction's results.json then names no path outside its own folder); the report's section
    and figures come from templm.reports.stream.streaming_section(summary, figures_dir).
    """
    name = getattr(context.preset, "name", "smoke")
    preset = getattr(context, "stream_preset", None) or (name if name in PRESETS else "smoke")
    corpus, split_dir, cutoff = _stream_data(context)
    try:
        summary = run_stream_experiment(paths.join(context.out_dir, "stream_experiment"), preset=preset,
                                        seed=int(context.seed), corpus=corpus, split_dir=split_dir, cutoff=cutoff,
                                        preset_name=name,
                                        trainings_at_once=getattr(context.preset, "trainings_at_once", 1))
    except UnsplittableCorpus as e:
        raise StageSkipped(f"the corpus cannot be split: {e.reason}") from None
    base = paths.absolute(context.out_dir)
    return {**summary, "out_dir": paths.relpath(summary["out_dir"], base),
            "results": paths.relpath(summary["results"], base)}
