"""The verbs that train and run one model: `templm train | plan | eval | infer | train-lm | stream`."""

from __future__ import annotations

import json
import os
import sys

from absl import flags

from templm import console, paths
from templm.cli.options import (FLAGS, STATE, bound_value, bounds, configure_tasks, define_distributed,
                                join_processes, writable_folder)
from templm.errors import ConfigError, check_interrupted, loads_json, require_numbers, result_in_place
from templm.outputs import holding


def define_train():
    define_distributed()
    flags.DEFINE_list("seqio_additional_cache_dirs", [], "Folders (gs:// too) searched for seqio's offline caches "
                      "of the tasks (seqio's cache_tasks_main --output_cache_dir), read where "
                      "--gin.USE_CACHED_TASKS=True (train/templm.DatasetConfig.use_cached; T5X's flag and macro).")
    import templm.evaluation.checkpoint_eval  # noqa: F401  (registers every configurable the T5 configs bind)


def main_train():
    import jax

    from templm.evaluation.checkpoint_eval import evaluate_params
    from templm.io import jsonable
    from templm.training import trainer
    from templm.training.loop import RunOptions

    import gin

    from templm import tasks

    join_processes()
    with tasks.seqio_cache_dirs(FLAGS.seqio_additional_cache_dirs):  # the tasks registered inside: they find it
        configure_tasks()
        result = trainer.train(options=RunOptions(evaluator=evaluate_params, config_gin=gin.config_str()))
    result_in_place()
    if jax.process_index() == 0:
        print(json.dumps(jsonable(result.summary())))


def define_plan():
    from templm.training.plan import DEVICE_MEMORY_GIB

    flags.DEFINE_enum("device_kind", None, list(DEVICE_MEMORY_GIB), "The accelerator, for its memory per device "
                      "(default: from the mesh config's name: tpu_v3, tpu_v4, gpu -> a100_80).")
    flags.DEFINE_integer("devices", None, "Devices in the mesh, where the mesh config sets only num_partitions.")
    bounds(devices=(1, None))
    flags.DEFINE_boolean("compile", True, "Compile the step for its temporary memory (slow for XL/XXL on a laptop); "
                         "without it, only parameters, optimizer state and batch.")
    flags.DEFINE_boolean("exact", False, "Compile the whole model's step; by default the step is compiled for one and "
                         "two layers a stack and its temporaries extended to the model's layers (seconds, not minutes: "
                         "BENCHMARKS.md, \"Plans\").")
    flags.DEFINE_string("json", None, "Also write the plan (bytes per device, verdicts, remedies) to this JSON file "
                        "(tools/workspace_plan.py writes WORKSPACE.md's tables from it).")
    import templm.evaluation.checkpoint_eval  # noqa: F401  (registers every configurable the T5 configs bind)
    from templm.experiments.studies import register_gin

    register_gin()  # a study config (study/paper.gin) is planned training by training


def main_plan():
    import gin
    import numpy as np

    bindings = gin.get_bindings("templm.train")
    study = None
    if gin.get_bindings("templm.Study"):
        from templm.experiments.studies import study_from_gin

        study = study_from_gin()
    elif not bindings.get("model"):
        raise ConfigError("nothing to plan: give a training config (gin_configs/temporal.gin ...) or a study "
                          "(gin_configs/study/paper.gin), and a mesh config")
    mesh_bindings = gin.get_bindings("templm.make_mesh")
    if mesh_bindings.get("mesh_shape"):
        shape = mesh_bindings["mesh_shape"]
        if (not isinstance(shape, (tuple, list)) or len(shape) != 2
                or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in shape)):
            raise ConfigError(f"templm.make_mesh.mesh_shape: expected (data, model), two whole numbers of at least 1, "
                              f"got {shape!r}")
        shape = tuple(shape)
    elif FLAGS.devices:
        partitions = mesh_bindings.get("num_partitions", 1)
        require_numbers("templm.make_mesh", {"num_partitions": (partitions, int, 1, None)})  # as make_mesh does
        if FLAGS.devices % partitions:
            raise ConfigError(f"--devices {FLAGS.devices} does not divide into num_partitions {partitions}")
        shape = (FLAGS.devices // partitions, partitions)
    else:
        raise ConfigError("the mesh config sets no templm.make_mesh.mesh_shape: give --devices N (e.g. 8 for "
                          "gin_configs/mesh/gpu_8.gin)")
    kind = FLAGS.device_kind
    if kind is None:
        names = " ".join(FLAGS.gin_file)
        kind = next((k for key, k in (("tpu_v3", "tpu_v3"), ("tpu_v4", "tpu_v4"), ("gpu", "a100_80")) if key in names),
                    None)
        if kind is None:
            raise ConfigError("give --device_kind (no tpu_v3, tpu_v4 or gpu in the mesh config's name)")
    # Fake CPU devices laid out as the mesh: set before JAX starts its backend (nothing has used it yet).
    n = int(np.prod(shape))
    flags_now = [f for f in os.environ.get("XLA_FLAGS", "").split() if "host_platform_device_count" not in f]
    os.environ["XLA_FLAGS"] = " ".join(flags_now + [f"--xla_force_host_platform_device_count={n}"])
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax

    from templm.training import partitioning
    from templm.training.optimizers import make_optimizer
    from templm.training.plan import describe, describe_remedy, find_remedy, plan

    devices = jax.devices("cpu")
    if len(devices) < n:  # JAX had started already (a library touched it while the configs were read): start again
        if os.environ.get("TEMPLM_PLAN_DEVICES") == str(n) or not STATE.get("own_process"):
            raise ConfigError(f"the mesh needs {n} devices and JAX started with {len(devices)} in this process: run "
                              f"`templm plan` in a process of its own, or start this one with XLA_FLAGS="
                              f"--xla_force_host_platform_device_count={n}")
        os.environ["TEMPLM_PLAN_DEVICES"] = str(n)
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(sys.executable, [sys.executable, "-m", "templm.cli", *sys.argv[1:]])
    mesh = partitioning.make_mesh(mesh_shape=shape, devices=devices[:n])
    if study is not None:
        plan_study(study, mesh, kind)
        return
    optimizer = bindings.get("optimizer") or make_optimizer()
    data = training_data()
    rules = partitioning.logical_axis_rules()

    def attempt(microbatches, mesh_shape):
        return plan(bindings["model"], optimizer, data.task_feature_lengths, int(data.batch_size),
                    partitioning.make_mesh(mesh_shape=mesh_shape, devices=devices[:n]), rules, microbatches, kind,
                    FLAGS.compile, FLAGS.exact)

    microbatches = int(bindings.get("microbatches", 1))
    result = attempt(microbatches, shape)
    print(describe(result, " + ".join(os.path.basename(f) for f in FLAGS.gin_file)))
    remedy = None
    if result["fits"] is False:
        remedy = find_remedy(attempt, shape, int(data.batch_size), microbatches)
        print(describe_remedy(result, remedy))
    _write_plan({"plans": [{"name": "training", "result": result, "remedy": remedy}]})


def training_data():
    """The training data `templm.train` would read, as the configs bind it (train/templm.DatasetConfig)."""
    import gin

    from templm.training.configs import DatasetConfig

    with gin.config_scope("train"):
        data = DatasetConfig()
    data.check("train/templm.DatasetConfig")
    return data


def plan_study(study, mesh, kind):
    """`templm plan` of a study: every training of it, with its verdict. The T5 trainings share one step (the same
    model, batch and lengths), the two Transformer-XL trainings another; each is compiled once."""
    from templm.experiments.reproduce import t5_config
    from templm.models.t5 import EncoderDecoderModel
    from templm.models.transformer_xl import TransformerXLConfig
    from templm.training import partitioning
    from templm.training.optimizers import learning_rate_schedule, make_optimizer
    from templm.training.plan import describe, describe_remedy, find_remedy, plan, plan_lm

    p, sp = study.preset, study.stream
    rules = partitioning.logical_axis_rules()
    shape = tuple(mesh.shape.values())
    devices = list(mesh.devices.flat)

    def on(mesh_shape):
        return mesh if tuple(mesh_shape) == shape else partitioning.make_mesh(mesh_shape=mesh_shape, devices=devices)

    def t5_attempt(microbatches, mesh_shape):
        return plan(EncoderDecoderModel(t5_config(p)), make_optimizer(name="adafactor", learning_rate=p.learning_rate),
                    {"inputs": p.inputs_length, "targets": p.targets_length}, p.batch_size, on(mesh_shape), rules,
                    microbatches, kind, FLAGS.compile, FLAGS.exact)

    txl_config = TransformerXLConfig(vocab_size=sp.model_vocab_size, **sp.model)

    def txl_attempt(_, mesh_shape):  # the Transformer-XL step has no microbatches
        return plan_lm(txl_config, make_optimizer("adam", learning_rate_schedule("cosine", sp.learning_rate,
                                                                                 sp.warmup, sp.train_steps),
                                                  max_grad_norm=0.25),
                       sp.batch_size, on(mesh_shape), rules, kind, FLAGS.compile, FLAGS.exact)

    t5 = t5_attempt(1, shape)
    print(describe(t5, f"{p.name} study, T5 v1.1 {p.base_model}, batch {p.batch_size}"))
    remedies = {"t5": None, "txl": None}
    if t5["fits"] is False:
        remedies["t5"] = find_remedy(t5_attempt, shape, p.batch_size, 1)
        print(describe_remedy(t5, remedies["t5"]))
    txl = txl_attempt(None, shape)
    print(describe(txl, f"{p.name} study, Transformer-XL {sp.model.get('n_layer')} layers, batch {sp.batch_size}"))
    if txl["fits"] is False:
        remedies["txl"] = find_remedy(txl_attempt, shape, sp.batch_size, None)
        print(describe_remedy(txl, remedies["txl"]))
    _write_plan({"plans": [{"name": "t5", "result": t5, "remedy": remedies["t5"]},
                           {"name": "txl", "result": txl, "remedy": remedies["txl"]}]})

    def verdict(result):
        if result["uneven"]:
            return "does not shard"
        if result["fits"] is None:
            return "not compiled (--nocompile)"
        return ("fits" if result["fits"] else "does not fit") + \
            f" ({100 * result['bytes']['total'] / result['device_memory']:.1f}%)"

    trainings = [("uniform", p.steps, t5), ("temporal", p.steps, t5), ("each yearly expert", p.yearly_steps, t5),
                 ("retrain (Temporal from scratch)", p.retrain_steps, t5)]
    trainings += [(f"adapt_{regime}alpha{a}", p.adapt_steps, t5) for regime in ("", "uniform_") for a in p.alphas]
    trainings += [("time_stratified (Transformer-XL)", sp.train_steps, txl), ("control (Transformer-XL)",
                                                                                sp.train_steps, txl)]
    print(f"every training of the {p.name} study on {mesh.size} {kind} devices:")
    for name, steps, result in trainings:
        print(f"  {name:34s} {steps:>7,} steps  {verdict(result)}")


def _write_plan(record):
    """--json: the plan as data, written whole (a temporary file renamed)."""
    if FLAGS.json:
        from templm.io import write_json

        write_json(FLAGS.json, record)


def define_eval():
    flags.DEFINE_string("split", "test", "Which split to evaluate.")
    flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest).")
    flags.DEFINE_string("eval_task", None, "Evaluate this task or mixture instead of the config's.")
    flags.DEFINE_integer("num_examples", None, "At most this many examples per task: the first N of the split, which "
                         "come in year order (the command names the years left out).")
    bounds(step=(0, None), num_examples=(1, None))
    flags.DEFINE_string("out", None, "Write eval_<split>.json and .md here (default: MODEL_DIR).")
    import templm.evaluation.checkpoint_eval  # noqa: F401  (registers templm.evaluate_checkpoint for the configs)


def main_eval():
    from templm.evaluation.checkpoint_eval import evaluate_checkpoint
    from templm.io import write_json
    from templm import tasks
    from templm.reports.evaluation import metrics_table, subset_notes, write_eval_report

    configure_tasks()
    if FLAGS.out:
        writable_folder(FLAGS.out, "--out")  # before the evaluation, not after it
    result = evaluate_checkpoint(split=FLAGS.split, step=FLAGS.step, num_examples=FLAGS.num_examples,
                                 eval_mixture_or_task_name=FLAGS.eval_task)
    base = paths.join(FLAGS.out or result["model_dir"], f"eval_{FLAGS.split}")
    paths.makedirs(paths.dirname(base))
    write_json(base + ".json", result)
    write_eval_report(result, base + ".md")
    years = (tasks.current().get("manifest") or {}).get("years", ())
    for note in subset_notes(result["metrics"], FLAGS.num_examples, years):
        console.warn(note)
    print(metrics_table(result["metrics"]))


def define_infer():
    flags.DEFINE_string("input", None, "JSON lines with `inputs` (model input text), or TempLAMA lines (`query` with "
                        "_X_ and `date`), to answer.", required=True)
    flags.DEFINE_string("output", None, "JSON lines written here: the input fields plus `prediction`.",
                        required=True)
    flags.DEFINE_enum("regime", "temporal", ["temporal", "uniform"], "For TempLAMA lines: as the regime's model "
                      "reads them (temporal: prefixed `year: YYYY `; uniform: as they are).")
    flags.DEFINE_enum("method", "greedy", ["greedy", "beam"], "Decoding.")
    import templm.evaluation.checkpoint_eval  # noqa: F401  (registers templm.infer_checkpoint for the configs)


def read_inference_inputs(path: str, regime: str):
    from templm.data import regimes
    from templm.data.readers import open_text
    from templm.data.salient_spans import cloze_to_ssm
    from templm.errors import DataError

    rows, texts = [], []
    with open_text(path) as f:
        for lineno, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                row = loads_json(raw)
                if "inputs" in row:
                    text = str(row["inputs"])
                else:
                    text = regimes.regime(regime).model_input(int(row["date"]), cloze_to_ssm(row["query"]))
            except (ValueError, KeyError, TypeError) as e:
                raise DataError(f"expected a JSON object with `inputs`, or `query` and `date`: {e}", path,
                                lineno) from None
            rows.append(row)
            texts.append(text)
    return rows, texts


def main_infer():
    from templm.evaluation.checkpoint_eval import infer_checkpoint
    from templm.io import atomic_write

    if paths.isdir(FLAGS.output):
        raise ConfigError(f"--output {FLAGS.output} is a folder; expected the path of a JSON lines file")
    writable_folder(paths.dirname(paths.absolute(FLAGS.output)), "--output's folder")  # before the inference
    rows, texts = read_inference_inputs(FLAGS.input, FLAGS.regime)
    configure_tasks()
    predictions = infer_checkpoint(texts, method=FLAGS.method)
    check_interrupted()  # a signal whose exception was dropped during the work: no result is written
    paths.makedirs(paths.dirname(paths.absolute(FLAGS.output)))
    atomic_write(FLAGS.output, "".join(
        json.dumps({**row, "model_inputs": text, "prediction": prediction}, ensure_ascii=False) + "\n"
        for row, text, prediction in zip(rows, texts, predictions)))
    result_in_place()
    print(json.dumps({"output": FLAGS.output, "predictions": len(predictions)}))


def define_train_lm():
    import templm.training.lm_trainer  # noqa: F401  (registers train_lm and TransformerXLConfig for the configs)


def main_train_lm():
    import gin

    from templm.io import jsonable
    from templm.training import lm_trainer
    from templm.training.loop import RunOptions

    result = lm_trainer.train_lm(options=RunOptions(config_gin=gin.config_str()))
    result_in_place()
    print(json.dumps(jsonable(result.summary())))


def define_stream():
    import templm.experiments.streaming  # noqa: F401  (registers stream_evaluation and the LM configurables)


def main_stream():
    from templm.experiments.streaming import STREAM_EVALUATION

    with holding(bound_value("templm.stream_evaluation.out_dir"), STREAM_EVALUATION):  # a second run refused
        return _main_stream()


def _main_stream():
    from templm.experiments.streaming import stream_evaluation
    from templm.metrics.stream import summarize
    from templm.reports.stream import write_stream_report

    results = stream_evaluation()
    result_in_place()  # results.json is written: the report and figures follow it whatever signal comes
    out_dir = paths.dirname(results["files"]["results.json"])
    files = {**results["files"], **write_stream_report(results, out_dir)}
    print(json.dumps({**summarize(results), "files": files}, indent=1))
    return 0
