"""The studies' sizes as gin (templm/experiments/studies.py, gin_configs/study/*.gin): gin and templm's own reader
of the study files give the same study for every file; bindings on the command line go on top; a study file with
an unknown field or a missing one is one message naming it."""

import gin
import pytest

from templm.cli import parse_gin
from templm.errors import ConfigError
from templm.experiments.studies import (PAPER_HORIZON, Preset, StreamPreset, load_study, read_study_file,
                                        register_gin, study_from_gin, study_names)


@pytest.fixture
def clean_gin():
    register_gin()
    gin.clear_config()
    yield
    gin.clear_config()


def test_every_study_file_reads_the_same_through_gin_and_without_it(clean_gin):
    assert {"tiny_test", "smoke", "small", "paper"} <= set(study_names())
    for name in study_names():
        gin.clear_config()
        parse_gin([f"study/{name}.gin"], [])
        assert study_from_gin() == load_study(name), name


def test_bindings_go_on_top_and_included_files_come_first(clean_gin):
    parse_gin(["study/small.gin"], ["Study.steps = 7", "StreamStudy.cutoff = '2016-06-30'"])
    study = study_from_gin()
    assert study.preset.steps == 7 and study.stream.cutoff.isoformat() == "2016-06-30"
    assert study.preset.name == "small" and study.preset.adapt_steps == 400  # small's own, over smoke's
    assert study.preset.inputs_length == load_study("smoke").preset.inputs_length  # what small takes from smoke
    paper = load_study("paper", {"Study": {"initial_checkpoint": "t5-small-ssm"}})
    assert (paper.preset.base_model, paper.preset.batch_size, paper.preset.steps, paper.preset.adapt_steps) == \
        ("small", 2048, 300000, 50000)
    assert paper.preset.initial_checkpoint == "t5-small-ssm" and paper.stream.model["n_layer"] == 18
    assert isinstance(paper.preset, Preset) and isinstance(paper.stream, StreamPreset)


def test_the_presets_probe_the_future_as_far_as_the_paper():
    # Dhingra et al. move the input year from 2019 to 2029 after training through 2018 (Figures 3 and 4): the
    # log-likelihood change and the calibration entropy over 11 future years, in every preset a user runs.
    assert PAPER_HORIZON == 2029 - 2018
    for name in ("smoke", "small", "paper"):
        preset = load_study(name).preset
        assert (preset.max_gap, preset.calibration_years) == (PAPER_HORIZON, PAPER_HORIZON), name


def test_a_study_file_with_an_unknown_or_missing_field_is_one_message(tmp_path):
    bad = tmp_path / "bad.gin"
    bad.write_text("include 'study/smoke.gin'\ntemplm.Study.stepz = 3\n")
    with pytest.raises(ConfigError, match=r"bad.gin: Study has no field 'stepz'"):
        load_study(str(bad))
    half = tmp_path / "half.gin"
    half.write_text("templm.Study.name = 'half'  # nothing else\n"
                    "templm.StreamStudy.model = {'d_model': 8,\n    'n_layer': 1}\n")
    assert read_study_file(str(half))["StreamStudy"] == {"model": {"d_model": 8, "n_layer": 1}}
    with pytest.raises(ConfigError, match=r"half.gin: Study: .*missing .*required"):
        load_study(str(half))
    with pytest.raises(ConfigError, match="unknown study 'huge'"):
        load_study("huge")
    objective = tmp_path / "objective.gin"
    shares = ("Study.burst_background_share", "Study.heldout_fraction", "Study.dropout_rate",
              "StreamStudy.emerging_share", "StreamStudy.burst_sentence_share")  # shares: at most 1
    refused = [("Study.pretrain_objective = 'random'",
                r"templm.Study.pretrain_objective must be one of 'salient_spans', 'random_spans', got 'random'"),
               ("Study.pretrain_snapshot = 'True'", r"templm.Study.pretrain_snapshot: expected True or False"),
               *((f"{share} = 1.5", rf"templm.{share}: must be at most 1, got 1.5") for share in shares),
               ("Study.bursts_per_year = -2", r"templm.Study.bursts_per_year"),
               ("Study.change_news_weight = 0.5", r"templm.Study.change_news_weight: must be at least 1, got 0.5"),
               ("StreamStudy.burst_names = 'cities'",
                r"templm.StreamStudy.burst_names: expected one of 'coined', 'places', got 'cities'"),
               ("StreamStudy.given_names = -3", r"templm.StreamStudy.given_names")]
    for binding, message in refused:
        objective.write_text(f"include 'study/smoke.gin'\ntemplm.{binding}\n")
        with pytest.raises(ConfigError, match=message):
            load_study(str(objective))


def test_each_half_draws_its_world_with_its_own_mechanisms():
    from templm.data.world import WorldConfig
    from templm.experiments.studies import world_config

    study = load_study("smoke", {"Study": {"bursts_per_year": 3, "change_news_weight": 20.0},
                                 "StreamStudy": {"emerging_share": 0.1, "burst_sentence_share": 0.05,
                                                 "burst_names": "places", "given_names": 12}})
    t5, stream = world_config(study.preset, 7), world_config(study.stream, 7)
    default = WorldConfig()
    assert (t5.seed, t5.bursts_per_year, t5.emerging_share, t5.burst_sentence_share) == \
        (7, 3, default.emerging_share, default.burst_sentence_share)
    assert (stream.seed, stream.bursts_per_year, stream.emerging_share, stream.burst_sentence_share) == \
        (7, default.bursts_per_year, 0.1, 0.05)
    assert (t5.burst_names, t5.given_names, stream.burst_names, stream.given_names) == \
        (default.burst_names, default.given_names, "places", 12)
    assert (t5.change_news_weight, stream.change_news_weight) == (20.0, default.change_news_weight)


def test_the_larger_model_changes_sizes_of_the_model_and_nothing_else(tmp_path):
    # Mind the Gap's model-size comparison: the larger TIME-STRATIFIED model is `model` with some sizes changed.
    smoke = load_study("smoke").stream
    assert smoke.larger_model_config == {**smoke.model, "n_layer": 3} and smoke.model["n_layer"] == 2
    bad = tmp_path / "bad.gin"
    bad.write_text("include 'study/smoke.gin'\ntemplm.StreamStudy.larger_model = {'n_layers': 3}\n")
    with pytest.raises(ConfigError, match=r"StreamStudy.larger_model: .*not keys of model: n_layers"):
        load_study(str(bad))
    assert load_study("tiny_test").stream.larger_model == {"n_layer": 2}


def test_a_run_of_an_older_world_generator_starts_its_models_afresh(tmp_path):
    """A run folder of the embedded world records the generator's version: the same seed drew other text before,
    so `make demo` rerun after an upgrade must not resume (and report) models trained on the old world. A preset
    field added since, at its default, is what the earlier run did: that keeps the models."""
    import json

    from templm.data.world import WORLD_VERSION
    from templm.experiments.reproduce import PRESETS, _start_or_resume

    out = tmp_path / "run"
    (out / "models" / "uniform").mkdir(parents=True)
    assert _start_or_resume(str(out), PRESETS["tiny_test"], 0, ()) == {"time_aware": False}
    record = json.loads((out / "run.json").read_text())
    assert record["halves"]["time_aware"]["world_version"] == WORLD_VERSION and not (out / "models").exists()
    (out / "models" / "uniform").mkdir(parents=True)
    # the same record: resumed, models kept
    assert _start_or_resume(str(out), PRESETS["tiny_test"], 0, ()) == {"time_aware": True}
    assert (out / "models" / "uniform").is_dir()
    # A run recorded before the preset had some of its fields (here the world's short-lived news) ran with their
    # defaults: its models are kept. Recorded with another value, they are not.
    later = ("bursts_per_year", "burst_background_share")
    older = json.loads(json.dumps(record))
    for name in later:
        del older["halves"]["time_aware"]["preset"][name]
    (out / "run.json").write_text(json.dumps(older))
    assert _start_or_resume(str(out), PRESETS["tiny_test"], 0, ()) == {"time_aware": True}
    assert (out / "models" / "uniform").is_dir()
    assert json.loads((out / "run.json").read_text()) == record
    older["halves"]["time_aware"]["preset"]["bursts_per_year"] = 3
    (out / "run.json").write_text(json.dumps(older))
    assert _start_or_resume(str(out), PRESETS["tiny_test"], 0, ()) == {"time_aware": False}
    assert not (out / "models").exists()
    (out / "models" / "uniform").mkdir(parents=True)
    del record["halves"]["time_aware"]["world_version"]  # as a run of the generator before version 2 wrote it
    (out / "run.json").write_text(json.dumps(record))
    assert _start_or_resume(str(out), PRESETS["tiny_test"], 0, ()) == {"time_aware": False}
    assert not (out / "models").exists()


def test_a_corrupt_run_record_is_named(tmp_path):
    """A run.json that is not JSON ended in a JSONDecodeError traceback naming no file."""
    from templm.errors import DataError
    from templm.experiments.reproduce import PRESETS, _start_or_resume

    (tmp_path / "run.json").write_text('{"halves": ')
    with pytest.raises(DataError, match=f"^{tmp_path / 'run.json'}: cannot read it as JSON"):
        _start_or_resume(str(tmp_path), PRESETS["tiny_test"], 0, ())
    (tmp_path / "run.json").write_text("[1, 2]")
    with pytest.raises(DataError, match="a run record must hold a JSON object: remove it"):
        _start_or_resume(str(tmp_path), PRESETS["tiny_test"], 0, ())


def test_each_half_keeps_its_models_unless_its_own_inputs_changed(tmp_path, capsys):
    """run.json holds one record per half: a change to what only the streaming half reads (its preset here) starts
    that half afresh and keeps the time-aware half's models, and the run says what changed; --only leaves the
    other half's models and record alone."""
    import dataclasses

    from templm.experiments.reproduce import EXTRA_STAGES, PRESETS, _start_or_resume
    from templm.experiments.studies import load_study

    out = tmp_path / "run"
    out.mkdir()
    stream = load_study("tiny_test").stream
    assert _start_or_resume(str(out), PRESETS["tiny_test"], 0, EXTRA_STAGES, stream_preset=stream) == \
        {"time_aware": False, "streaming": False}
    for folder in ("models/uniform", "stream_experiment/control"):
        (out / folder).mkdir(parents=True)
    longer = dataclasses.replace(stream, train_steps=stream.train_steps + 1)
    capsys.readouterr()
    assert _start_or_resume(str(out), PRESETS["tiny_test"], 0, EXTRA_STAGES, stream_preset=longer) == \
        {"time_aware": True, "streaming": False}
    assert (out / "models" / "uniform").is_dir() and not (out / "stream_experiment").exists()
    err = capsys.readouterr().err
    assert f"resuming the time-aware half's models in {out}" in err
    assert "the streaming half starts afresh (changed since the earlier run: stream_preset.train_steps)" in err
    # Only the time-aware half, with another seed: its models go; the streaming half's stay with its record. The
    # earlier results described the models removed: they go with them, and the run says so before (a seed-0 report
    # stayed beside a seed-1 run's models).
    (out / "stream_experiment" / "control").mkdir(parents=True)
    for name in ("results.json", "report.md", "figures/yearly_gap.png"):
        (out / name).parent.mkdir(exist_ok=True)
        (out / name).write_text("seed 0's")
    assert _start_or_resume(str(out), PRESETS["tiny_test"], 1, EXTRA_STAGES, stream_preset=longer,
                            running=["time_aware"]) == {"time_aware": False}
    assert not (out / "models").exists() and (out / "stream_experiment" / "control").is_dir()
    assert not [name for name in ("results.json", "report.md", "figures") if (out / name).exists()]
    assert (f"the time-aware half starts afresh (changed since the earlier run: seed): removing its models in "
            f"{out / 'models'} and the earlier results that describe them (results.json, report.md, figures)"
            in capsys.readouterr().err)
    assert _start_or_resume(str(out), PRESETS["tiny_test"], 0, EXTRA_STAGES, stream_preset=longer,
                            running=["streaming"]) == {"streaming": True}
    # What no model depends on (the first ETA's rate, the probes' horizon) keeps the models.
    _start_or_resume(str(out), PRESETS["tiny_test"], 0, EXTRA_STAGES, stream_preset=longer)
    (out / "models" / "uniform").mkdir(parents=True)
    probed = dataclasses.replace(PRESETS["tiny_test"], estimated_steps_per_s=99.0, max_gap=3)
    assert _start_or_resume(str(out), probed, 0, EXTRA_STAGES, stream_preset=longer)["time_aware"]
    assert (out / "models" / "uniform").is_dir()


def test_only_and_skip_name_their_choices():
    from templm.errors import ConfigError
    from templm.experiments.reproduce import T5_STAGES, stage_selection

    assert stage_selection() == {}
    assert stage_selection(only=["streaming"]) == {stage: "--only streaming" for stage in T5_STAGES}
    assert stage_selection(skip=["future_probes"]) == {"future probes": "--skip future_probes",
                                                       "adaptation": "--skip future_probes"}
    assert stage_selection(skip=["streaming"]) == {"extra: streaming": "--skip streaming"}
    with pytest.raises(ConfigError, match=r"--skip 'evaluate': expected one of time_aware, streaming, "
                                          r"future_probes, adaptation"):
        stage_selection(skip=["evaluate"])
    with pytest.raises(ConfigError, match=r"--only 'adaptation': expected one of time_aware, streaming"):
        stage_selection(only=["adaptation"])
