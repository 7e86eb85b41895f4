"""The verbs that build data: `templm data world | stats | splits | spm | streams | templama | cronquestions | tasks |
calm`."""

from __future__ import annotations

import collections
import functools
import json

from absl import flags

from templm import paths, remote
from templm.cli.options import (CORPUS_HELP, FLAGS, bounds, corpus_documents, corpus_flag, define_corpus_flags,
                                define_overwrite)
from templm.errors import ConfigError, result_in_place


def define_data_world():
    flags.DEFINE_string("out", None, "Output folder.", required=True)
    define_overwrite()
    flags.DEFINE_integer("seed", None, "Random seed (default 0, or the gin binding WorldConfig.seed).")
    flags.DEFINE_integer("start_year", None, "First year (default 2010).")
    flags.DEFINE_integer("end_year", None, "Last year (default 2020).")
    flags.DEFINE_integer("subjects_per_relation", None, "Subjects per TempLAMA relation (default 40).")
    flags.DEFINE_integer("docs_per_month", None, "News documents per month (default 60).")
    bounds(seed=(0, None), subjects_per_relation=(4, None), docs_per_month=(1, None))
    world_configurable()  # registered before gin parses, so `--gin.WorldConfig.seed=3` binds


@functools.lru_cache(maxsize=None)
def world_configurable():
    import gin
    from templm.data.world import WorldConfig

    return gin.external_configurable(WorldConfig, name="WorldConfig", module="templm")


def world_config(**flags_given):
    """The WorldConfig of gin's bindings with the flags given in their place (the flags win before it is checked)."""
    try:
        return world_configurable()(**flags_given)
    except ValueError as e:
        raise ConfigError(f"WorldConfig: {e}") from None


def main_data_world():
    from templm.data.world import generate_world

    config = world_config(**{name: FLAGS[name].value for name in
                              ("seed", "start_year", "end_year", "subjects_per_relation", "docs_per_month")
                              if FLAGS[name].value is not None})
    stats = generate_world(config, FLAGS.out, overwrite=FLAGS.overwrite)
    result_in_place()
    print(format_world_summary(stats, FLAGS.out))


def format_world_summary(stats: dict, out: str) -> str:
    lines = [f"templm world written to {out}",
             f"  {stats['documents']} documents, {stats['entities']} entities ({stats['emerging_entities']} emerging),"
             f" {stats['facts']} facts",
             f"  TempLAMA: {stats['templama_queries']} queries, "
             + ", ".join(f"{k} {v}" for k, v in stats["templama_splits"].items())
             + f"; {100 * stats['multi_answer_share']:.1f}% with several answers",
             "  year  documents  sentences  background  queries  multi-answer  emerging names  new words"]
    for year, row in stats["by_year"].items():
        lines.append(f"  {year}  {row['documents']:9d}  {row['sentences']:9d}  {row['background_sentences']:10d}"
                     f"  {row['queries']:7d}  {row['multi_answer_queries']:12d}  {row['emerging_names']:14d}"
                     f"  {row['new_words']:9d}")
    return "\n".join(lines)


def define_data_stats():
    define_corpus_flags()


def main_data_stats():
    docs_iter, report = corpus_documents()
    docs, words = collections.Counter(), collections.Counter()
    for doc in docs_iter:
        docs[doc.date.year] += 1
        words[doc.date.year] += len(doc.text.split())
    print(json.dumps({"corpus": corpus_flag(), "documents": sum(docs.values()), **report(),
                      "by_year": {str(y): {"documents": docs[y], "words": words[y]} for y in sorted(docs)}}))


# The kinds of output folder of `data splits`, `data templama` and `data cronquestions`.
SPLITS_KIND, TEMPLAMA_KIND, CRONQUESTIONS_KIND = "splits", "TempLAMA", "CronQuestions"
STREAMS_KIND = "token streams"


def define_data_splits():
    define_corpus_flags(split=False)
    flags.DEFINE_string("out", None, "Output folder for the split files and stats.json (built whole beside it, then "
                        "put in its place).", required=True)
    define_overwrite()
    flags.DEFINE_string("cutoff", "2017-09-30", "TIME-STRATIFIED cut-off date; 'auto': the latest whose validation "
                        "and test months end with the corpus; empty for yearly buckets only.")
    flags.DEFINE_integer("test_docs_per_month", 1000, "Test documents sampled per month (all if fewer).")
    flags.DEFINE_integer("validation_docs", None, "Validation size (default 3 x --test_docs_per_month).")
    flags.DEFINE_integer("test_months", 24, "Months in the test period.")
    flags.DEFINE_integer("validation_months", 3, "Months in the validation period after the cut-off.")
    flags.DEFINE_boolean("yearly", True, "Also write yearly buckets with held-out documents (time-aware T5).")
    flags.DEFINE_integer("heldout_per_year", 2000, "Yearly buckets: at most this many held-out documents a year.")
    flags.DEFINE_float("heldout_fraction", 0.1, "Yearly buckets: at most this share of a year held out.")
    flags.DEFINE_integer("seed", 0, "Sampling seed.")
    flags.DEFINE_string("language", "en", "Leave out documents langid identifies as another language (ISO 639-1); "
                        "empty: keep every language.")
    flags.DEFINE_float("near_duplicate_threshold", 0.8, "Leave out a document whose word 5-gram Jaccard similarity "
                       "with an earlier one reaches this (MinHash LSH); 0: keep near-duplicates.")
    flags.DEFINE_boolean("allow_degenerate", False, "Write splits with empty test months or a CONTROL train nearly "
                         "all outside the test period (warned and listed in stats.json) instead of refusing them.")
    bounds(test_docs_per_month=(1, None), validation_docs=(1, None), test_months=(1, None),
            validation_months=(1, None), heldout_per_year=(0, None), heldout_fraction=(0, 1), seed=(0, None),
            near_duplicate_threshold=(0, 1))
    define_beam_flags()


def main_data_splits():
    from templm.data.filters import FilterConfig
    from templm.data.records import parse_date
    from templm.data.splits import index_corpus, make_splits, yearly_buckets
    from templm.outputs import build_output_folder

    try:
        clean = FilterConfig(language=FLAGS.language or None,
                             near_duplicate_threshold=FLAGS.near_duplicate_threshold or None)
    except ValueError as e:
        flag = "--language" if "language" in str(e).split(" must")[0] else "--near_duplicate_threshold"
        raise ConfigError(f"{flag}: {e}") from None
    cutoff = None
    if FLAGS.cutoff:
        try:
            cutoff = None if FLAGS.cutoff == "auto" else parse_date(FLAGS.cutoff)
        except ValueError as e:
            raise ConfigError(f"--cutoff: {e} (or 'auto')") from None

    if FLAGS.runner:
        from templm.data.splits_beam import index_corpus_beam

        options = beam_options()
        indexed = lambda: index_corpus_beam(corpus_flag(), options, FLAGS.format, FLAGS.on_error, clean)  # noqa
    else:
        indexed = lambda: index_corpus(corpus_flag(), FLAGS.format, FLAGS.on_error, clean)  # noqa: E731

    def build(folder):  # every file of the output, in a folder beside --out that replaces it only when whole
        summary = {}
        index = indexed()  # the corpus read and cleaned once for both
        if FLAGS.cutoff:
            stats = make_splits(corpus_flag(), folder, cutoff=cutoff, test_months=FLAGS.test_months,
                                validation_months=FLAGS.validation_months,
                                test_docs_per_month=FLAGS.test_docs_per_month, validation_docs=FLAGS.validation_docs,
                                seed=FLAGS.seed, format=FLAGS.format, on_error=FLAGS.on_error, clean=clean,
                                allow_degenerate=FLAGS.allow_degenerate, index=index)
            summary["splits"] = {k: v["documents"] for k, v in stats["splits"].items()}
            summary["control_train_test_period_share"] = stats["control_train_test_period_share"]
        if FLAGS.yearly:
            yearly = yearly_buckets(corpus_flag(), folder, heldout_per_year=FLAGS.heldout_per_year,
                                    heldout_fraction=FLAGS.heldout_fraction, seed=FLAGS.seed, format=FLAGS.format,
                                    on_error=FLAGS.on_error, clean=clean, index=index)
            summary["yearly"] = yearly["years"]
        return summary

    summary = build_output_folder(FLAGS.out, SPLITS_KIND, build, FLAGS.overwrite)
    result_in_place()
    print(json.dumps(summary))


def define_data_streams():
    define_corpus_flags(split=False)
    flags.DEFINE_string("split_dir", None, "The splits folder (`templm data splits` output, or a published one).",
                        required=True)
    flags.DEFINE_list("splits", ["time_stratified_train"], "The splits to tokenise with --spm_model (file stems in "
                      "--split_dir): as in the paper, CONTROL (control_train) has a SentencePiece model of its own, "
                      "so its streams are another command.")
    flags.DEFINE_string("spm_model", None, "The SentencePiece model the language model is trained with.",
                        required=True)
    flags.DEFINE_string("out", None, "Output folder: each split's token stream by month and manifest.json (built "
                        "whole beside it, then put in its place); train-lm reads it with txl/streams.gin.",
                        required=True)
    define_overwrite()
    define_beam_flags()


def main_data_streams():
    from templm.data.lm_streams import split_files_of, write_streams
    from templm.outputs import build_output_folder

    if not FLAGS.splits:
        raise ConfigError("--splits names no split")
    split_files = split_files_of(FLAGS.split_dir, FLAGS.splits)
    if FLAGS.runner:
        from templm.data.lm_streams_beam import write_streams_beam

        options = beam_options()
        build = lambda folder: write_streams_beam(corpus_flag(), split_files, FLAGS.spm_model, folder,  # noqa
                                                  options, FLAGS.format, FLAGS.on_error)
    else:
        build = lambda folder: write_streams(corpus_flag(), split_files, FLAGS.spm_model, folder,  # noqa: E731
                                             FLAGS.format, FLAGS.on_error)
    manifest = build_output_folder(FLAGS.out, STREAMS_KIND, build, FLAGS.overwrite)
    result_in_place()
    print(json.dumps({"out": FLAGS.out, "splits": {name: {k: entry[k] for k in ("documents", "tokens", "missing")}
                                                   for name, entry in manifest["splits"].items()}}))


def define_data_spm():
    define_corpus_flags()
    flags.DEFINE_string("out", None, "Model prefix: writes PREFIX.model and PREFIX.vocab.", required=True)
    flags.DEFINE_integer("vocab_size", 32000, "Pieces in the model; seqio adds 100 sentinel ids on top.")
    flags.DEFINE_integer("max_sentences", 1_000_000, "Train on at most this many sampled lines.")
    flags.DEFINE_integer("seed", 0, "Sampling and training seed.")
    bounds(vocab_size=(4, None), max_sentences=(1, None), seed=(0, None))


def main_data_spm():
    from templm.data.vocab import train_spm

    if paths.is_url(FLAGS.out):
        remote.check_location(paths.dirname(paths.absolute(FLAGS.out)), "--out's folder")  # before the training
    docs, report = corpus_documents()
    path = train_spm(docs, FLAGS.out, vocab_size=FLAGS.vocab_size, max_sentences=FLAGS.max_sentences,
                     seed=FLAGS.seed)
    result_in_place()
    print(json.dumps({"model": path, **report()}))


def define_data_templama():
    flags.DEFINE_string("dump", None, "Wikidata JSON dump (latest-all.json.gz or .bz2).", required=True)
    flags.DEFINE_string("out", None, "Output folder for train/val/test.jsonl and stats.json (built whole beside it, "
                        "then put in its place).", required=True)
    define_overwrite()
    flags.DEFINE_integer("start_year", 2010, "First year of the queries.")
    flags.DEFINE_integer("end_year", 2020, "Last year of the queries.")
    flags.DEFINE_integer("max_subjects", 1000, "Most popular subjects kept per relation.")
    flags.DEFINE_boolean("require_enwiki", True, "Subjects and objects need an English Wikipedia article, as the "
                         "paper's facts (--norequire_enwiki keeps every subject with an English label).")
    flags.DEFINE_integer("seed", 0, "Seed of the subject split (20/10/70).")
    bounds(max_subjects=(1, None), seed=(0, None))
    define_beam_flags()


def define_beam_flags() -> None:
    flags.DEFINE_string("runner", None, "Run as an Apache Beam pipeline on this runner (FnApiRunner: worker processes "
                        "on this machine; DataflowRunner, FlinkRunner, SparkRunner, PrismRunner; DirectRunner tries "
                        "Prism first, downloading its binary; the `beam` extra); default: one process here.")
    flags.DEFINE_list("pipeline_options", [], "Beam's own pipeline options, as seqio's cache_tasks_main takes them: "
                      "--pipeline_options=--direct_num_workers=2,--direct_running_mode=multi_processing (with "
                      "--runner=FnApiRunner; Dataflow's --project, --region, --temp_location, "
                      "--setup_file=./setup.py).")


def beam_options() -> list:
    """Beam's options of the command line: --runner, then --pipeline_options; a ConfigError where Beam is missing."""
    import importlib.util

    if importlib.util.find_spec("apache_beam") is None:
        raise ConfigError("--runner needs Apache Beam: pip install 'templm[beam]'")
    return [f"--runner={FLAGS.runner}", *FLAGS.pipeline_options]


def main_data_templama():
    from templm.data.wikidata import build_templama
    from templm.outputs import build_output_folder

    settings = dict(start_year=FLAGS.start_year, end_year=FLAGS.end_year, max_subjects=FLAGS.max_subjects,
                    require_enwiki=FLAGS.require_enwiki, seed=FLAGS.seed)
    if FLAGS.runner:
        from templm.data.wikidata_beam import build_templama_beam

        options = beam_options()
        build = lambda folder: build_templama_beam(FLAGS.dump, folder, options, **settings)  # noqa: E731
    else:
        build = lambda folder: build_templama(FLAGS.dump, folder, **settings)  # noqa: E731
    stats = build_output_folder(FLAGS.out, TEMPLAMA_KIND, build, FLAGS.overwrite)
    result_in_place()
    print(json.dumps({k: stats[k] for k in ("subjects", "queries", "splits")}))


def define_data_cronquestions():
    flags.DEFINE_string("release", None, "CronQuestions release folder (its root, or data/wikidata_big/ with "
                        "questions/{train,valid,test}.pickle and kg/wd_id2entity_text.txt).", required=True)
    flags.DEFINE_string("out", None, "Output folder for {train,validation,test}.tfrecord and manifest.json (built "
                        "whole beside it, then put in its place); point templm.tasks.configure.cronquestions_dir "
                        "or TEMPLM_CRONQUESTIONS_DIR at it.", required=True)
    define_overwrite()
    flags.DEFINE_integer("max_questions", None, "Keep the first N questions of each split (default: all).")
    bounds(max_questions=(1, None))


def main_data_cronquestions():
    from templm.data.cronquestions import convert_release
    from templm.outputs import build_output_folder

    manifest = build_output_folder(FLAGS.out, CRONQUESTIONS_KIND, lambda folder: convert_release(
        FLAGS.release, folder, max_questions=FLAGS.max_questions), FLAGS.overwrite)
    result_in_place()
    print(json.dumps({"out": FLAGS.out, "splits": manifest["splits"]}))


def define_data_tasks():
    flags.DEFINE_string("out", None, "Output folder: point TEMPLM_DATA_DIR (or templm.tasks.configure.data_dir) at it.",
                        required=True)
    define_overwrite()
    flags.DEFINE_multi_string("corpus", None, "News corpus; default: the embedded world (drawn with --seed and the "
                              "WorldConfig gin bindings). " + CORPUS_HELP)
    flags.DEFINE_enum("format", "auto", ["auto", "jsonl", "wmt", "arxiv", "csv", "tsv", "text"],
                      "Corpus format (auto: from the name and the first line; docs/data.md).")
    flags.DEFINE_string("templama_dir", None, "TempLAMA release folder ({train,val,test}.json as released, or "
                        ".jsonl); default: the "
                        "world's, or none for a corpus.")
    flags.DEFINE_integer("vocab_size", 768, "SentencePiece pieces (768 suits the world; 32000 for real news).")
    flags.DEFINE_integer("max_spm_sentences", 1_000_000, "SentencePiece training lines, at most.")
    flags.DEFINE_string("detector", "builtin", "Entity detector: builtin, or an installed spaCy pipeline name.")
    flags.DEFINE_boolean("one_span_per_sentence", False, "One sampled salient span per sentence instead of all.")
    flags.DEFINE_integer("heldout_per_year", 2000, "Held-out (validation + test) documents per year, at most.")
    flags.DEFINE_float("heldout_fraction", 0.1, "Held-out share of each year, at most.")
    flags.DEFINE_integer("future_years", 2, "The last N years form the 'future' evaluation slice.")
    flags.DEFINE_integer("files_per_year", 1, "Record files per split and year: at least the data shards (hosts) of "
                         "a multi-host training run, so that each host reads files of its own.")
    flags.DEFINE_integer("seed", 0, "Seed of the world, the held-out draw and the training answers.")
    bounds(vocab_size=(4, None), max_spm_sentences=(1, None), heldout_per_year=(0, None), heldout_fraction=(0, 1),
            future_years=(0, None), files_per_year=(1, None), seed=(0, None))
    world_configurable()
    define_beam_flags()


def main_data_tasks():
    from templm.data.task_data import TaskDataConfig, prepare_task_data

    world = world_config(seed=FLAGS.seed)
    config = TaskDataConfig(
        corpus=corpus_flag(), corpus_format=FLAGS.format, templama_dir=FLAGS.templama_dir, world=world,
        vocab_size=FLAGS.vocab_size, max_spm_sentences=FLAGS.max_spm_sentences, detector=FLAGS.detector,
        one_span_per_sentence=FLAGS.one_span_per_sentence, heldout_per_year=FLAGS.heldout_per_year,
        heldout_fraction=FLAGS.heldout_fraction, future_years=FLAGS.future_years,
        files_per_year=FLAGS.files_per_year, seed=FLAGS.seed)
    via = None
    if FLAGS.runner:
        from templm.data.task_data_beam import OnBeam

        via = OnBeam(beam_options())
    manifest = prepare_task_data(config, FLAGS.out, overwrite=FLAGS.overwrite, via=via)
    result_in_place()
    totals = {folder: {split: sum(by_year.values()) for split, by_year in splits.items()}
              for folder, splits in manifest["counts"].items()}
    print(json.dumps({"out": FLAGS.out, "years": manifest["years"], "future_years": manifest["future_years"],
                      "examples": totals}))


def define_data_calm():
    flags.DEFINE_string("out", None, "Output folder: the CALM corpus (<class>.txt and vocab/<class>.vocab).",
                        required=True)
    define_overwrite()
    flags.DEFINE_string("world_dir", None, "Build from the embedded world in this folder (one class per news "
                        "domain); a folder that does not exist gets a world generated first (--seed, WorldConfig "
                        "gin bindings).")
    flags.DEFINE_string("texts", None, "Build from the *.txt files of this folder (one class per file).")
    flags.DEFINE_enum("level", "word", ["word", "char"], "Token level of the vocabulary files.")
    flags.DEFINE_list("domains", None, "World domains to keep (default all: sports, politics, business, education, "
                      "technology, weather, health).")
    flags.DEFINE_integer("seed", None, "Seed of a generated world (default 0, or the gin binding WorldConfig.seed).")
    bounds(seed=(0, None))
    world_configurable()


def main_data_calm():
    from templm.data.calm_corpus import build_calm_corpus_from_texts, build_world_corpus

    if bool(FLAGS.world_dir) == bool(FLAGS.texts):
        raise ConfigError("give exactly one of --world_dir DIR (the embedded world) and --texts DIR (*.txt files)")
    remote.check_location(paths.dirname(paths.absolute(FLAGS.out)), "--out's folder")  # a bucket, before the world
    if FLAGS.texts:
        if FLAGS.domains or FLAGS.seed is not None:
            raise ConfigError("--domains and --seed apply to --world_dir only")
        summary = {"classes": build_calm_corpus_from_texts(FLAGS.texts, FLAGS.out, FLAGS.level,
                                                           overwrite=FLAGS.overwrite)}
    else:
        world = world_config(**({} if FLAGS.seed is None else {"seed": FLAGS.seed}))
        summary = build_world_corpus(FLAGS.world_dir, FLAGS.out, FLAGS.level, FLAGS.domains, world,
                                     overwrite=FLAGS.overwrite)
    result_in_place()
    print(json.dumps({"out": FLAGS.out, "level": FLAGS.level, **summary}))
