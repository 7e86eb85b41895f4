"""The verbs that run a study or an experiment end to end: `templm reproduce | calm | is-eval | appendices`."""

from __future__ import annotations

import math
from typing import List, Optional

from absl import flags

from templm import paths as storage, remote
from templm.cli.data_verbs import world_configurable
from templm.cli.options import (CORPUS_HELP, FLAGS, STATE, bound_value, bounds, corpus_flag, corpus_value,
                                define_distributed, define_overwrite, join_processes, load_tensorflow)
from templm.errors import ConfigError, result_in_place
from templm.outputs import holding


def define_calm():
    import templm.experiments.calm  # noqa: F401  (registers templm.run_calm for the configs)

    world_configurable()


def main_calm():
    from templm.experiments.calm import CALM_RUN

    with holding(bound_value("templm.run_calm.out_dir"), CALM_RUN):  # a second run on its folder refused
        return _main_calm()


def _main_calm():
    from templm.experiments.calm import run_calm
    from templm.reports.calm import write_calm_report

    results = run_calm()
    result_in_place()  # results.json is written: the report follows it whatever signal comes
    written = write_calm_report(results, results["config"]["out_dir"])
    with storage.open(written["report.md"], encoding="utf-8") as f:
        print(f.read())


def define_is_eval():
    flags.DEFINE_string("out", None, "Output folder for is_eval.json, is_eval.md and is_eval.png.", required=True)
    flags.DEFINE_enum("model", "hmm", ["hmm", "kglm"], "hmm: a hidden Markov LM whose exact perplexity the forward "
                      "algorithm gives (the estimator's check); kglm: the knowledge-graph LM with latent entity "
                      "mentions, trained on the world's annotated news with its proposal (Logan et al.'s "
                      "experiments).")
    flags.DEFINE_integer("seed", 0, "Seed of the model, its data and the proposal samples.")
    flags.DEFINE_list("ks", None, "Sample counts K (default 1, 2, 4, ..., 256 for hmm; up to 128 for kglm).")
    flags.DEFINE_list("temperatures", ["0.5", "2.0"], "Temperatures of the tempered proposals.")
    flags.DEFINE_integer("repeats", None, "Independent runs at the largest K, more at smaller K (default 8 for hmm, "
                         "4 for kglm).")
    flags.DEFINE_integer("num_states", 6, "hmm: hidden states.")
    flags.DEFINE_integer("vocab_size", 12, "hmm: vocabulary.")
    flags.DEFINE_integer("num_docs", 12, "hmm: documents drawn from the HMM.")
    flags.DEFINE_integer("doc_length", 24, "hmm: longest document, in tokens.")
    flags.DEFINE_float("mean_sentence_length", 6.0, "hmm: mean sentence length, in tokens.")
    flags.DEFINE_float("peakedness", 1.5, "hmm: how peaked the HMM's random distributions are.")
    flags.DEFINE_string("world_dir", None, "kglm: a world folder (templm data world); default: the embedded world "
                        "drawn from --seed at the smoke study's size, into OUT/world.")
    flags.DEFINE_integer("test_docs", 40, "kglm: the world's latest documents evaluated; the model and its proposal "
                         "train on the others.")
    flags.DEFINE_integer("train_steps", 400, "kglm: training steps of the model and of the proposal.")
    flags.DEFINE_float("gold_weight", 0.9, "kglm: the share of each decision's probability the proposal that sees "
                       "the gold annotations gives the annotated option (0: no such proposal).")
    flags.DEFINE_integer("exact_sentences", 2, "kglm: the exact check sums every reading of the test documents' "
                         "first N sentences (0: no check).")
    define_overwrite(into=True)
    bounds(seed=(0, None), repeats=(1, None), num_states=(1, 4096), vocab_size=(1, 1 << 20), num_docs=(1, None),
            doc_length=(2, None), mean_sentence_length=(1, None), peakedness=(0, None), test_docs=(2, None),
            train_steps=(1, None), gold_weight=(0, 0.999), exact_sentences=(0, None))

    def numbers_above_0(kind):
        def ok(values):
            if values is None:
                return True
            try:
                return all(kind(v) > 0 and math.isfinite(kind(v)) for v in values)
            except ValueError:
                return False
        return ok

    flags.register_validator("ks", numbers_above_0(int), message="--ks must be a comma-separated list of whole "
                             "numbers of at least 1")
    flags.register_validator("temperatures", numbers_above_0(float), message="--temperatures must be a "
                             "comma-separated list of finite numbers above 0")


def main_is_eval():
    from templm.experiments.importance_sampling import IS_EVAL

    with holding(FLAGS.out, IS_EVAL):  # a second run on its folder refused
        return _main_is_eval()


def _main_is_eval():
    from templm.experiments.importance_sampling import run_is_eval, run_latent_is_eval
    from templm.reports.importance_sampling import write_is_report

    ks = None if FLAGS.ks is None else [int(k) for k in FLAGS.ks]
    temperatures = [float(t) for t in FLAGS.temperatures]
    remote.check_location(FLAGS.out, "--out")  # a bucket, before the work (nothing for a local folder)
    if FLAGS.world_dir:
        remote.check_location(FLAGS.world_dir, "--world_dir", write=False)
    if FLAGS.model == "kglm":
        load_tensorflow(quiet=STATE["verbosity"] < 1)  # the trainer's summary writers load it
        result = run_latent_is_eval(FLAGS.out, FLAGS.seed, world_dir=FLAGS.world_dir,
                                    ks=ks or [2 ** i for i in range(8)], repeats=FLAGS.repeats or 4,
                                    temperatures=temperatures, gold_weight=FLAGS.gold_weight,
                                    test_docs=FLAGS.test_docs, train_steps=FLAGS.train_steps,
                                    exact_sentences=FLAGS.exact_sentences, overwrite=FLAGS.overwrite)
    else:
        result = run_is_eval(FLAGS.out, FLAGS.seed, ks=ks or [2 ** i for i in range(9)],
                             temperatures=temperatures, repeats=FLAGS.repeats or 8, num_states=FLAGS.num_states,
                             vocab_size=FLAGS.vocab_size, num_docs=FLAGS.num_docs, doc_length=FLAGS.doc_length,
                             mean_sentence_length=FLAGS.mean_sentence_length, peakedness=FLAGS.peakedness,
                             overwrite=FLAGS.overwrite)
    result_in_place()
    written = write_is_report(result, FLAGS.out)
    with storage.open(written["md"], encoding="utf-8") as f:
        print(f.read())


def define_reproduce():
    from templm.experiments.studies import register_gin, study_names

    register_gin()  # templm.Study and templm.StreamStudy, before gin parses the study files
    flags.DEFINE_enum("preset", "smoke", study_names(), "The study, gin_configs/study/PRESET.gin, parsed before any "
                      "--gin_file (which may bind templm.Study / templm.StreamStudy on top, or be a whole study: "
                      "study/paper.gin). smoke: every stage in minutes on 2 CPU cores (the demo); small: sized to show "
                      "the findings; tiny_test: the test suite's; paper: the papers' settings (an accelerator slice).")
    flags.DEFINE_string("out", None, "Output folder: report.md, figures/, results.json, data/, models/.",
                        required=True)
    flags.DEFINE_integer("seed", 0, "Seed of the world, the splits, the initialisation and the data order.")
    flags.DEFINE_list("seeds", None, "Several seeds (e.g. 0,1,2): the study once per seed into OUT/seed_<S>, then "
                      "every finding tested over the seeds and every number as mean and 95% interval in OUT.")
    flags.DEFINE_integer("num_seeds", None, "The same as --seeds 0,1,...,N-1.")
    bounds(seed=(0, None), num_seeds=(1, None))
    flags.DEFINE_boolean("streaming", True, "Also run the Transformer-XL half (TIME-STRATIFIED vs CONTROL streaming "
                         "perplexity, dynamic evaluation) after the T5 stages.")
    flags.DEFINE_list("only", None, "Run only these halves: time_aware, streaming (the other's models are kept).")
    flags.DEFINE_list("skip", [], "Leave out halves (time_aware, streaming) or trailing stages of the time-aware half "
                      "(future_probes, which adaptation needs, or adaptation); their findings say so.")
    define_overwrite()
    # Your own data instead of the embedded world (docs/study.md, "The study on your own data").
    flags.DEFINE_multi_string("corpus", None, "A dated news corpus for the study instead of the embedded world. "
                              + CORPUS_HELP)
    flags.DEFINE_string("templama_dir", None, "The TempLAMA release the time-aware half asks ({train,val,test}.json "
                        "as released, or .jsonl); without it that half is skipped.")
    flags.DEFINE_string("task_data", None, "Task data prepared by `templm data tasks` (what TEMPLM_DATA_DIR names) "
                        "instead of --corpus and --templama_dir.")
    flags.DEFINE_string("calibration", None, "Calibration relations (JSON lines, as the world's calibration.jsonl); "
                        "without them the calibration probe is skipped on your data.")
    flags.DEFINE_multi_string("stream_corpus", None, "The streaming half's corpus (default: --corpus, or the corpus "
                              "the task data was built from).")
    flags.DEFINE_string("split_dir", None, "TIME-STRATIFIED / CONTROL split files for the streaming half: the paper's "
                        "published split_<cut-off>/ folder, or `templm data splits` output.")
    flags.DEFINE_string("cutoff", None, "The streaming half's cut-off (YYYY-MM-DD) when no --split_dir; default: the "
                        "latest whose 3 validation and the preset's test months end with the corpus.")
    define_distributed()  # the same command on every host of a slice (WORKSPACE.md)


def study_data():
    """The --corpus ... flags of `templm reproduce` as a StudyData (the embedded world without any)."""
    from templm.experiments.reproduce import StudyData

    return StudyData(corpus=corpus_flag(), templama_dir=FLAGS.templama_dir, task_data=FLAGS.task_data,
                     calibration=FLAGS.calibration, stream_corpus=corpus_value(FLAGS.stream_corpus),
                     split_dir=FLAGS.split_dir, cutoff=FLAGS.cutoff)


def seeds_to_run() -> Optional[List[int]]:
    """The seeds of --seeds / --num_seeds, or None for a single-seed run (--seed)."""
    if FLAGS.seeds is not None and FLAGS.num_seeds is not None:
        raise ConfigError("give --seeds or --num_seeds, not both")
    if FLAGS.num_seeds is not None:
        if FLAGS.num_seeds < 1:
            raise ConfigError(f"--num_seeds must be at least 1, got {FLAGS.num_seeds}")
        return list(range(FLAGS.num_seeds))
    if FLAGS.seeds is None:
        return None
    try:
        seeds = [int(s) for s in FLAGS.seeds]
    except ValueError:
        raise ConfigError("--seeds: expected a comma-separated list of integers, got "
                          f"{','.join(FLAGS.seeds)!r}") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise ConfigError(f"--seeds: expected distinct seeds, got {','.join(FLAGS.seeds)!r}")
    return seeds


def main_reproduce():
    from templm.experiments.reproduce import reproduce, reproduce_seeds, reproduction_folder, stage_selection
    from templm.experiments.studies import study_from_gin
    from templm.reports.reproduction import write_report, write_seeds_report
    from templm.training.partitioning import is_lead

    join_processes()  # multi-host: every host runs this command; process 0 writes the results and the report
    extra = None if FLAGS.streaming else []
    seeds = seeds_to_run()
    stage_selection(FLAGS.only, FLAGS.skip)  # a misspelt --only or --skip before any work
    data = study_data()
    study = study_from_gin()  # study/PRESET.gin, then --gin_file and --gin bindings
    name = study.preset.name
    with reproduction_folder(FLAGS.out, FLAGS.overwrite) as out:  # before any work; the report under the lock
        if seeds is None:
            results = reproduce(study.preset, out, FLAGS.seed, extra_stages=extra, overwrite=FLAGS.overwrite,
                                data=data, stream_preset=study.stream, settings=STATE["settings"], only=FLAGS.only,
                                skip=FLAGS.skip, write_results=False)
        else:
            results = reproduce_seeds(study.preset, out, seeds, extra_stages=extra, overwrite=FLAGS.overwrite,
                                      data=data, stream_preset=study.stream, settings=STATE["settings"],
                                      only=FLAGS.only, skip=FLAGS.skip, write_results=False)
        if not is_lead():
            return
        # results.json, report.md and the figures as one commit: a stop or a full disk leaves the earlier run's
        # files as they were, never a mix of two runs
        paths = write_report(results, out, results_json=True) if seeds is None else write_seeds_report(
            results, out, results_json=True)
        result_in_place()
    if seeds is None:
        print(f"templm reproduce: {name} preset, seed {FLAGS.seed}: {paths['report']}")
    else:
        print(f"templm reproduce: {name} preset, seeds {','.join(map(str, seeds))}: {paths['report']}")
    floors = list(dict.fromkeys(item["floor"] for item in results["findings"].values() if item.get("floor")))
    for floor in floors:  # above the findings: their verdicts compare scores where an untrained model would be
        print(f"  at the floor: {floor}; the verdicts marked so compare noise")
    for finding, item in results["findings"].items():  # both halves, one shape (templm.metrics.findings)
        marked = " (at the floor)" if item.get("floor") else ""
        print(f"  {finding}: {item['verdict']}{marked} ({item['evidence']})")


def define_appendices():
    from templm.experiments.studies import study_names

    flags.DEFINE_string("out", None, "Output folder: shifted/ and distance/ (the runs), results.json, report.md, "
                        "figures/.", required=True)
    flags.DEFINE_enum("preset", "smoke", study_names(), "The study whose streaming sizes (templm.StreamStudy) the "
                      "models, the world and the test period take.")
    flags.DEFINE_integer("seed", 0, "Seed of the world, the splits, the tokenizers and the models.")
    flags.DEFINE_list("which", ["shifted", "distance"], "The appendices: shifted (B, other test periods), distance "
                      "(C, training sets further and further before the test period).")
    flags.DEFINE_list("shifts", ["0", "1", "2"], "Appendix B: years the cut-off moves back, one test period each.")
    flags.DEFINE_list("gaps", ["0", "6", "12", "18", "24"], "Appendix C: months between the end of each training set "
                      "and the cut-off.")
    flags.DEFINE_multi_string("corpus", None, "A dated corpus (any format templm reads; a file or a quoted glob) "
                              "instead of the embedded world.")
    define_overwrite(into=True)
    bounds(seed=(0, None))

    def whole_numbers(values):
        try:
            return all(int(v) >= 0 for v in values) and len(values) > 0
        except ValueError:
            return False

    flags.register_validator("which", lambda v: bool(v) and set(v) <= {"shifted", "distance"},
                             message="--which must be shifted, distance or both, comma-separated")
    flags.register_validator("shifts", whole_numbers, message="--shifts must be whole numbers of years (0 or more)")
    flags.register_validator("gaps", whole_numbers, message="--gaps must be whole numbers of months (0 or more)")


def main_appendices():
    from templm.experiments.appendices import APPENDICES_KIND

    with holding(FLAGS.out, APPENDICES_KIND):  # a second run on its folder refused
        return _main_appendices()


def _main_appendices():
    from templm.experiments.appendices import run_appendices
    from templm.reports.appendices import write_appendices_report

    results = run_appendices(FLAGS.out, FLAGS.which, FLAGS.preset, FLAGS.seed, [int(s) for s in FLAGS.shifts],
                             [int(g) for g in FLAGS.gaps], corpus_flag(), overwrite=FLAGS.overwrite)
    result_in_place()
    written = write_appendices_report(results, storage.absolute(FLAGS.out))
    with storage.open(written["report.md"], encoding="utf-8") as f:
        print(f.read())
    return 0
