"""Numeric settings are checked before any work (templm.errors.require_numbers): a whole number where one is asked
(20.5 is refused, not rounded; '32' is refused, not parsed), a finite number where a rate is, each in its range, one
message naming the binding. The trainers, the studies and the command line."""

import dataclasses
import os
import re

import numpy as np
import pytest

from templm.errors import ConfigError, require_numbers
from templm.experiments.studies import load_study
from templm.training import lm_trainer, trainer
from templm.training.configs import CheckpointConfig, CorpusConfig, DatasetConfig, OptimizerConfig, SaveCheckpointConfig
from templm_testing import run_templm


def test_whole_numbers_finite_numbers_and_ranges():
    require_numbers("f", {"steps": (np.int64(3), int, 1, "TRAIN_STEPS"), "rate": (2, float, 0, None),
                          "seed": (None, int, 0, None)}, optional=("seed",))
    refused = [(20.5, "expected a whole number, got 20.5"),
               ("32", "expected a whole number, got '32' (quotes make it a string in gin: write the number bare)"),
               (True, "expected a whole number, got True"), (None, "expected a whole number, got None"),
               (-5, "must be at least 1, got -5"), (0, "must be at least 1, got 0")]
    for value, message in refused:
        with pytest.raises(ConfigError, match=re.escape(f"f.steps (the gin macro TRAIN_STEPS): {message}")):
            require_numbers("f", {"steps": (value, int, 1, "TRAIN_STEPS")})
    for value in (float("nan"), float("inf"), "0.1", -0.5):
        with pytest.raises(ConfigError, match=r"^f\.rate: "):
            require_numbers("f", {"rate": (value, float, 0, None)})
    require_numbers("f", {"share": (1.0, float, 0, None, 1)})  # a most value: the bound itself is allowed
    with pytest.raises(ConfigError, match=re.escape("f.share: must be at most 1, got 1.5")):
        require_numbers("f", {"share": (1.5, float, 0, None, 1)})


def test_the_trainers_refuse_a_bad_number_before_touching_their_folder(tmp_path):
    folder = tmp_path / "never"
    data = DatasetConfig("temporal_mixture", {"inputs": 8, "targets": 4}, 2)
    t5 = dict(model_dir=str(folder), train_dataset_cfg=data, total_steps=2, model=object())
    for change, binding in [({"total_steps": 20.5}, "templm.train.total_steps (the gin macro TRAIN_STEPS)"),
                            ({"total_steps": -5}, "templm.train.total_steps"),
                            ({"random_seed": -1}, "templm.train.random_seed (the gin macro SEED)"),
                            ({"checkpoint_cfg": CheckpointConfig(SaveCheckpointConfig(period=-2))},
                             "templm.CheckpointConfig.save.period (the gin macro SAVE_PERIOD)"),
                            ({"train_dataset_cfg": dataclasses.replace(data, task_feature_lengths={"inputs": 8,
                                                                                                    "targets": 0})},
                             "train/templm.DatasetConfig.task_feature_lengths['targets']"),
                            ({"train_eval_dataset_cfg": dataclasses.replace(data, num_examples=0)},
                             "train_eval/templm.DatasetConfig.num_examples")]:
        with pytest.raises(ConfigError, match=re.escape(binding)):
            trainer.train(**{**t5, **change})
    # A number of the wrong kind is refused where the config is made (gin builds it before any verb runs).
    for make, binding in [(lambda: dataclasses.replace(data, batch_size="32"),
                           "templm.DatasetConfig.batch_size (the gin macro BATCH_SIZE)"),
                          (lambda: SaveCheckpointConfig(period=2.5),
                           "templm.SaveCheckpointConfig.period (the gin macro SAVE_PERIOD)"),
                          (lambda: OptimizerConfig(learning_rate=float("nan")),
                           "templm.OptimizerConfig.learning_rate (the gin macro LEARNING_RATE)"),
                          (lambda: CorpusConfig("corpus.jsonl", "spm.model", 2.5),
                           "templm.CorpusConfig.batch_size (the gin macro BATCH_SIZE)")]:
        with pytest.raises(ConfigError, match=re.escape(binding)):
            make()
    corpus = CorpusConfig("corpus.jsonl", "spm.model", 2, split_file="train.gz")
    txl = dict(model_dir=str(folder), config="tiny", train_dataset_cfg=corpus, total_steps=2)
    for change, binding in [({"total_steps": 0}, "templm.train_lm.total_steps"),
                            ({"optimizer_cfg": OptimizerConfig(learning_rate=-1.0)},
                             "templm.OptimizerConfig.learning_rate (the gin macro LEARNING_RATE)"),
                            ({"optimizer_cfg": OptimizerConfig(warmup_steps=-1)}, "templm.OptimizerConfig.warmup_steps"),
                            ({"train_dataset_cfg": dataclasses.replace(corpus, batch_size=0)},
                             "templm.CorpusConfig.batch_size (the gin macro BATCH_SIZE)")]:
        with pytest.raises(ConfigError, match=re.escape(binding)):
            lm_trainer.train_lm(**{**txl, **change})
    for call, binding in [(lambda: trainer.train(**{**t5, "train_dataset_cfg": None}),
                           "templm.train.train_dataset_cfg takes a DatasetConfig, got nothing: bind "
                           "templm.train.train_dataset_cfg = @train/templm.DatasetConfig()"),
                          (lambda: lm_trainer.train_lm(**{**txl, "train_dataset_cfg": "corpus.jsonl"}),
                           "templm.train_lm.train_dataset_cfg takes a CorpusConfig, got 'corpus.jsonl': bind "
                           "templm.train_lm.train_dataset_cfg = @templm.CorpusConfig()")]:
        with pytest.raises(ConfigError, match=f"^{re.escape(binding)}"):  # gin adds the configurable after it
            call()
    assert not folder.exists()
    a_file = tmp_path / "a_file"
    a_file.write_text("not a run")
    with pytest.raises(ConfigError, match=re.escape(f"templm.train.model_dir (the gin macro MODEL_DIR): {a_file} is "
                                                    "a file; it must be a folder")):
        trainer.train(**{**t5, "model_dir": str(a_file)})
    with pytest.raises(ConfigError, match=re.escape("templm.train_lm.model_dir (the gin macro MODEL_DIR)")):
        lm_trainer.train_lm(**{**txl, "model_dir": str(a_file)})
    assert a_file.read_text() == "not a run"


def test_a_binding_of_a_setting_that_moved_into_a_config_object_says_where_it_went():
    """Run configs written before the T5X-shaped config objects bind `templm.train.data_shards` and the like: gin's
    "no parameter" error gains the binding to use instead; each new binding exists."""
    import gin

    from templm.cli.options import MOVED_BINDINGS, parse_gin

    import templm.experiments.calm  # noqa: F401  (registers run_calm and its configs)
    from templm.experiments.calm import run_calm
    from templm.experiments.streaming import stream_evaluation

    for old, new in [("templm.train.data_shards", "train/templm.DatasetConfig.shards"),
                     ("templm.train_lm.learning_rate", "templm.OptimizerConfig.learning_rate"),
                     ("templm.stream_evaluation.ms_segments", "templm.DynamicEvalConfig.ms_segments"),
                     ("templm.run_calm.pretrain_lr", "templm.CalmBaselineConfig.pretrain_lr")]:
        try:
            with pytest.raises(ConfigError, match=re.escape(f"(that setting moved: bind {new} instead")):
                parse_gin([], [f"{old} = 2"])
        finally:
            gin.clear_config()
    try:
        for new in set(MOVED_BINDINGS.values()):  # every target is a parameter gin knows
            parse_gin([], [f"{new} = None"])
    finally:
        gin.clear_config()
    # The two parameters that kept their names but now take a config object: a value of the old kind is named.
    with pytest.raises(ConfigError, match=re.escape("bind the variants as templm.DynamicEvalConfig.variants")):
        stream_evaluation("out", "ts", dynamic=[{"name": "d", "rule": "sgd"}])
    with pytest.raises(ConfigError, match=re.escape("templm.CalmBaselineConfig.baseline = 'init'")):
        run_calm("out", baseline="init")


def test_a_study_of_fractional_or_negative_sizes_is_one_message():
    for kind, field, value, message in [("Study", "steps", 20.5, "expected a whole number, got 20.5"),
                                        ("Study", "batch_size", 0, "must be at least 1, got 0"),
                                        ("Study", "learning_rate", "0.01", "expected a finite number, got '0.01'"),
                                        ("StreamStudy", "train_steps", -5, "must be at least 1, got -5"),
                                        ("StreamStudy", "pad_vocab_to", 0, "must be at least 1, got 0")]:
        with pytest.raises(ConfigError, match=re.escape(f"templm.{kind}.{field}: {message}")):
            load_study("tiny_test", {kind: {field: value}})


@pytest.mark.e2e
def test_the_command_line_names_the_binding_and_writes_nothing(tmp_path):
    out = tmp_path / "study"
    result = run_templm("reproduce", "--preset=tiny_test", f"--out={out}", "--gin.templm.Study.steps=20.5")
    assert result.returncode == 1 and "templm.Study.steps: expected a whole number, got 20.5" in result.stderr
    assert not out.exists()
    model_dir = tmp_path / "lm"
    result = run_templm("train-lm", "--gin_file=txl/time_stratified.gin", f"--gin.MODEL_DIR='{model_dir}'",
                        "--gin.CORPUS='corpus.jsonl'", "--gin.SPLIT_DIR='splits'", "--gin.SPM_MODEL='spm.model'",
                        "--gin.TRAIN_STEPS=-5")
    assert result.returncode == 1, result.stderr[-2000:]
    assert "templm.train_lm.total_steps (the gin macro TRAIN_STEPS): must be at least 1, got -5" in result.stderr
    assert not model_dir.exists()


def test_future_years_the_data_cannot_honour_are_said_not_silently_changed(tmp_path, capsys):
    from templm.data.task_data import TaskDataConfig, prepare_task_data
    from templm.data.world import WorldConfig

    with pytest.raises(ConfigError, match=re.escape("TaskDataConfig.future_years: must be at least 0, got -1")):
        TaskDataConfig(future_years=-1)
    world = WorldConfig(start_year=2014, end_year=2016, subjects_per_relation=4, docs_per_month=3)
    manifest = prepare_task_data(TaskDataConfig(world=world, vocab_size=200, future_years=5), str(tmp_path / "d"))
    assert (manifest["seen_years"], manifest["future_years"]) == ([2014], [2015, 2016])
    assert ("future_years=5 asks for more than the data's 3 year(s) 2014-2016 can give with one seen year left: "
            "the last 2 are the future years") in capsys.readouterr().err


def test_an_output_path_that_names_no_folder_or_no_file_is_refused_before_any_work(tmp_path):
    """`data world --out ''` built the whole world into a hidden ./.partial before failing; `data spm --out DIR/`
    wrote the hidden DIR/.model and DIR/.vocab and exited 0."""
    result = run_templm("data", "world", "--out=", "--start_year=2014", "--end_year=2015", cwd=str(tmp_path))
    assert result.returncode == 1 and "the output folder is an empty path (--out '')" in result.stderr
    assert sorted(os.listdir(tmp_path)) == []
    corpus = tmp_path / "news.jsonl"
    corpus.write_text('{"id": "a", "date": "2015-01-01", "text": "Some words here."}\n')
    folder = tmp_path / "spm"
    folder.mkdir()
    result = run_templm("data", "spm", f"--corpus={corpus}", f"--out={folder}{os.sep}", "--vocab_size=20")
    assert result.returncode == 1 and "names a folder, not a file prefix" in result.stderr
    assert os.listdir(folder) == []


@pytest.mark.e2e
def test_every_verbs_numeric_flags_are_checked_when_parsed(tmp_path):
    """A flag out of its range is one line naming it and the range, the usage status, before any work (an HMM of
    100000 states was numpy's 74.5 GiB allocation error; --future_years -1 became 0 without a word)."""
    out = str(tmp_path / "out")
    cases = [
        (("data", "world", f"--out={out}", "--docs_per_month=0"), "--docs_per_month must be at least 1"),
        (("data", "splits", "--corpus=c.jsonl", f"--out={out}", "--test_months=0"), "--test_months must be at least 1"),
        (("data", "spm", "--corpus=c.jsonl", f"--out={out}/v", "--vocab_size=2"), "--vocab_size must be at least 4"),
        (("data", "tasks", f"--out={out}", "--future_years=-1"), "--future_years must be at least 0"),
        (("data", "templama", "--dump=d.json", f"--out={out}", "--max_subjects=0"), "--max_subjects must be at least 1"),
        (("eval", "--num_examples=0"), "--num_examples must be at least 1"),
        (("reproduce", f"--out={out}", "--num_seeds=0"), "--num_seeds must be at least 1"),
    ]
    for args, message in cases:
        result = run_templm(*args)
        assert result.returncode == 2 and message in result.stderr, (args, result.stderr[-1500:])
        assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not os.path.exists(out)


@pytest.mark.e2e
def test_flags_win_over_gin_bindings_before_the_world_is_checked(tmp_path):
    """`data world --gin.WorldConfig.start_year=2099 --start_year 2014` was refused for years 2099-2020, which the
    user did not ask for: the gin default was checked before the flag applied."""
    out = tmp_path / "w"
    result = run_templm("data", "world", f"--out={out}", "--gin.WorldConfig.start_year=2099", "--start_year=2014",
                        "--end_year=2015", "--subjects_per_relation=4", "--docs_per_month=2")
    assert result.returncode == 0, result.stderr[-2000:]
    stats = __import__("json").loads((out / "stats.json").read_text())
    assert (stats["config"]["start_year"], stats["config"]["end_year"]) == (2014, 2015)
    refused = run_templm("data", "world", f"--out={tmp_path / 'x'}", "--gin.WorldConfig.end_year=2150",
                         "--start_year=2014")
    assert refused.returncode == 1 and "years 2014-2150: templm's readers accept dates from 1900 to 2100" in \
        refused.stderr
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("name, steps, bindings", [
    ("uniform.gin", 300_000, []), ("temporal.gin", 300_000, []), ("yearly.gin", 300_000, ["YEAR = 2014"]),
    ("adapt.gin", 10_000, ["YEAR = 2014", "INITIAL_CHECKPOINT_PATH = '/c'"])])
def test_the_training_configs_carry_the_papers_settings(name, steps, bindings):
    """Dhingra et al. (section 3.1): batch 2048, a constant learning rate of 0.001, dropout 0.1, 300K steps for every
    model; section 3.3: alpha 0.5 with 10K steps of fine-tuning matches the model retrained from scratch."""
    import gin

    import templm.evaluation.checkpoint_eval  # noqa: F401  (the configs bind its configurables, as `templm train`)
    import templm.tasks  # noqa: F401
    from templm.cli import parse_gin

    gin.clear_config()
    try:
        parse_gin([name], bindings + ["MODEL_DIR = '/m'"])
        assert gin.query_parameter("%TRAIN_STEPS") == steps
        assert gin.query_parameter("%BATCH_SIZE") == 2048 and gin.query_parameter("%DROPOUT_RATE") == 0.1
        assert gin.query_parameter("templm.learning_rate_schedule.kind") == "constant"
        assert gin.query_parameter("templm.learning_rate_schedule.base_learning_rate") == 0.001
    finally:
        gin.clear_config()
