"""The sharded gin trainer (templm/training/trainer.py, through the shared loop): loss falls; one device, a 4x2 mesh
and two processes agree; shardings follow the rules; kill -9 and resume is bitwise exact; SIGTERM saves, exits with
the preemption status and a rerun resumes; a NaN stops with the last good checkpoint intact."""

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys

import gin
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from templm import tasks
from templm.cli import parse_gin
from templm.data.task_data import TaskDataConfig, read_manifest
from templm.data.world import WorldConfig
from templm.errors import EXIT_PREEMPTED, ConfigError, DataError, Preempted, TrainingError
from templm.evaluation.checkpoint_eval import evaluate_checkpoint, evaluate_params  # (registers base.gin's)
from templm.models.t5 import T5_1_1_CONFIGS, EncoderDecoderModel, save_hf_checkpoint
from templm.training import partitioning, trainer
from templm.training.checkpoints import load_params
from templm.training.configs import CheckpointConfig, DatasetConfig, RestoreCheckpointConfig, SaveCheckpointConfig
from templm.training.input_pipeline import TrainingInput
from templm.training.loop import RunOptions
from exec_with import launcher as limited
from templm_testing import event_tags, lock_holder, run_templm, run_templm_stopped, xla_flags

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LENGTHS = {"inputs": 32, "targets": 8}
CLI_CONFIG = ["--gin_file=gin_configs/temporal.gin", "--gin_file=gin_configs/runs/cpu_demo.gin",
              "--gin.TASK_FEATURE_LENGTHS={'inputs': 32, 'targets': 8}", "--gin.BATCH_SIZE=16",
              "--gin.EVAL_PERIOD=0", "--gin.templm.train.stats_period=1"]


@pytest.fixture(scope="module")
def data_dir(task_data_for):
    return task_data_for("trainer", TaskDataConfig(world=WorldConfig(seed=2, start_year=2013, end_year=2016,
                                                                     subjects_per_relation=6, docs_per_month=10),
                                                   vocab_size=300, future_years=1))


def _model():
    return EncoderDecoderModel(T5_1_1_CONFIGS["tiny"])


# One optimizer object for the module's runs: their compiled steps are shared (loop.STEPS keys a caller's optimizer
# by the object).
ADAFACTOR = optax.adafactor(0.01)


def _train(model_dir, steps, mesh_shape=(4, 2), optimizer=None, save_period=1000, data_shards=0,
           initial_checkpoint_path=None, evaluator=None, **kwargs):
    devices = jax.devices()[:int(np.prod(mesh_shape))]
    mesh = partitioning.make_mesh(mesh_shape=mesh_shape, devices=devices)
    return trainer.train(model_dir=str(model_dir), model=_model(),
                         train_dataset_cfg=DatasetConfig("temporal_mixture", LENGTHS, 16, shards=data_shards),
                         total_steps=steps, optimizer=optimizer or ADAFACTOR, stats_period=1,
                         checkpoint_cfg=CheckpointConfig(SaveCheckpointConfig(period=save_period),
                                                         RestoreCheckpointConfig(initial_checkpoint_path)),
                         options=RunOptions(mesh=mesh, evaluator=evaluator), **kwargs)


def _losses(model_dir):
    with open(os.path.join(model_dir, "metrics.jsonl")) as f:
        return [row["loss"] for row in map(json.loads, f) if row["split"] == "train"]


def _cli(*args, env=None, launcher=(), **popen):
    """`templm train` in a fresh process; `launcher`: a command prefix (tests/support/exec_with.py's, to set limits)."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.Popen([*launcher, sys.executable, "-m", "templm.cli", "train", *CLI_CONFIG, *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full_env,
                            cwd=REPO, **popen)


@pytest.fixture(scope="module")
def trained(data_dir, tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("trained")
    return model_dir, _train(model_dir, 40, save_period=20)


def test_loss_falls_and_metrics_are_written(trained):
    tmp_path, result = trained
    losses = _losses(tmp_path)
    assert len(losses) == 40
    assert np.mean(losses[-5:]) < 0.6 * losses[0]
    assert result.step == 40 and result.train["loss"] == pytest.approx(losses[-1])
    assert any(name.startswith("events.out.tfevents") for name in os.listdir(tmp_path / "train"))  # TensorBoard
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["20", "40", "integrity"]


@pytest.mark.parametrize("input_state", ["absent", "unreadable"])
def test_a_checkpoint_without_input_state_is_resumed_by_replaying_its_batches(trained, tmp_path, capsys,
                                                                              input_state):
    """Checkpoints hold each data shard's pipeline state; one written before they did (no `input` item), or one this
    TensorFlow cannot parse, is resumed by reading its batches again, with a warning, and ends with the same
    parameters. A run asking for another number of data shards than its checkpoint's is refused."""
    model_dir, result = trained
    old = tmp_path / "old"
    shutil.copytree(model_dir, old)
    checkpoints = old / "checkpoints"
    states = [name for name in os.listdir(checkpoints / "40" / "input") if name.endswith(".state")]
    assert states == ["shard-00000-of-00001.state"]
    with pytest.raises(DataError, match=r"data_shards 1 there, 2 in this run \(train/templm.DatasetConfig.shards"):
        _train(old, 41, data_shards=2)
    for step in ("20", "40"):
        (checkpoints / "integrity" / f"{step}.json").unlink()
    shutil.rmtree(checkpoints / "40")
    if input_state == "absent":
        shutil.rmtree(checkpoints / "20" / "input")
    else:
        (checkpoints / "20" / "input" / states[0]).write_bytes(b"\x08\x15not a serialized tensor")
    resumed = _train(old, 40, save_period=20)
    assert resumed.start_step == 20
    err = capsys.readouterr().err
    assert ("holds no input state" if input_state == "absent" else
            "has an input state this TensorFlow cannot read (the input state shard-00000-of-00001") in err
    assert "reading the 20 batches it had consumed again" in err
    same = jax.tree.map(lambda a, b: np.array_equal(np.asarray(a), np.asarray(b)), result.params,
                        resumed.params)
    assert all(jax.tree.leaves(same))


def _snapshot(folder):
    """{relative path: bytes} of every file under `folder`."""
    return {os.path.relpath(os.path.join(root, name), folder): open(os.path.join(root, name), "rb").read()
            for root, _, names in os.walk(folder) for name in names}


def test_resuming_with_other_settings_is_refused_naming_the_binding_before_any_step(trained, tmp_path):
    """The one resume contract (loop.RunFolder.resume): a run resumed with another task, batch, model width or
    optimizer than its checkpoint's is refused with one message naming the binding and both values, before any step;
    MODEL_DIR (checkpoints, metrics, config.gin) is left byte for byte as it was. Before, the T5 trainer compared the
    seeds only: another task trained on and overwrote config.gin, another batch ended in a TensorFlow traceback,
    another width called both intact steps damaged."""
    model_dir, _ = trained
    old = tmp_path / "old"
    shutil.copytree(model_dir, old)
    (old / "config.gin").write_text("# the run's own config\n")
    before = _snapshot(old)
    changed = RunOptions(mesh=partitioning.make_mesh(mesh_shape=(4, 2), devices=jax.devices()[:8]),
                         config_gin="# another config\n")

    def refused(match, model=None, **dataset):
        config = {"mixture_or_task_name": "temporal_mixture", "task_feature_lengths": LENGTHS, "batch_size": 16,
                  **dataset}
        with pytest.raises(DataError, match=match) as e:
            trainer.train(model_dir=str(old), model=model or _model(), train_dataset_cfg=DatasetConfig(**config),
                          total_steps=50, optimizer=ADAFACTOR, options=changed)
        assert _snapshot(old) == before
        return str(e.value)

    message = refused(r"mixture_or_task_name 'temporal_mixture' there, 'uniform_mixture' in this run "
                      r"\(train/templm.DatasetConfig.mixture_or_task_name, MIXTURE_OR_TASK_NAME\)",
                      mixture_or_task_name="uniform_mixture")
    assert message.startswith(f"{old}/checkpoints: MODEL_DIR holds a run trained with other settings: ")
    assert (f"nothing was trained or overwritten; resume the run with its own settings (--gin_file={old}/config.gin) "
            "or train into another MODEL_DIR") in message
    refused(r"batch_size 16 there, 32 in this run \(train/templm.DatasetConfig.batch_size, BATCH_SIZE\)",
            batch_size=32)
    refused(r'task_feature_lengths \{"targets": 8\} there, \{"targets": 16\} in this run',
            task_feature_lengths={"inputs": 32, "targets": 16})
    wider = EncoderDecoderModel(dataclasses.replace(T5_1_1_CONFIGS["tiny"], mlp_dim=T5_1_1_CONFIGS["tiny"].mlp_dim * 2))
    message = refused(r"checkpoint 40 does not fit this run's model \(the checkpoint's mlp_dim "
                      rf"{T5_1_1_CONFIGS['tiny'].mlp_dim}; this run's mlp_dim {2 * T5_1_1_CONFIGS['tiny'].mlp_dim}\)",
                      model=wider)
    assert "damaged" not in message and "wi_0/kernel: checkpoint (" in message
    with pytest.raises(DataError, match=r"checkpoint 40 does not fit this run's optimizer: \d+ array\(s\) differ"):
        trainer.train(model_dir=str(old), model=_model(), total_steps=50, optimizer=optax.adam(1e-3), options=changed,
                      train_dataset_cfg=DatasetConfig("temporal_mixture", LENGTHS, 16))
    assert _snapshot(old) == before


def test_sigterm_during_the_last_evaluation_stops_it_and_the_rerun_evaluates_that_step(trained, tmp_path, capsys):
    """SIGTERM during a run's last evaluation was answered only once the evaluation had ended, and the rerun, finding
    the final checkpoint, exited 0 without ever evaluating it. The evaluation now stops at its next batch (Preempted
    naming the step and its checkpoint, no result), and the rerun of the finished run evaluates that step."""
    model_dir, _ = trained
    run = tmp_path / "run"
    shutil.copytree(model_dir, run)
    batches = []

    def stopped_while_evaluating(*args):  # the real evaluator, with SIGTERM arriving as it starts
        os.kill(os.getpid(), signal.SIGTERM)
        batches.append(args)
        return evaluate_params(*args)

    with pytest.raises(Preempted, match=r"at step 41, during its evaluation \(checkpoint saved in "):
        _train(run, 41, eval_period=1000, evaluator=stopped_while_evaluating)
    assert batches and load_params(str(run / "checkpoints"))[1]["step"] == 41
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert not [row for row in rows if "/" in row["split"]]  # nothing of the unfinished evaluation
    rerun = _train(run, 41, eval_period=1000, evaluator=evaluate_params)
    assert rerun.start_step == rerun.step == 41 and rerun.eval and all(m["count"] > 0 for m in rerun.eval.values())
    assert "step 41 was saved but its evaluation did not finish: evaluating it now" in capsys.readouterr().err
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows if "/" in row["split"]] and all(
        row["step"] == 41 for row in rows if "/" in row["split"])
    again = _train(run, 41, eval_period=1000, evaluator=evaluate_params)  # evaluated once: not again
    assert again.eval is None


def test_a_finished_run_is_kept_without_touching_its_input(trained, tmp_path, capsys):
    """Asked for the steps it already has, a run returns its checkpoint's parameters and metrics without building
    its input pipeline (no replay warning even when its last checkpoint holds no input state)."""
    model_dir, result = trained
    done = tmp_path / "done"
    shutil.copytree(model_dir, done)
    shutil.rmtree(done / "checkpoints" / "40" / "input")
    (done / "checkpoints" / "integrity" / "40.json").unlink()
    again = _train(done, 40)
    assert again.start_step == again.step == 40 and again.train == result.train
    assert "holds no input state" not in capsys.readouterr().err
    same = jax.tree.map(lambda a, b: np.array_equal(np.asarray(a), np.asarray(b)), result.params, again.params)
    assert all(jax.tree.leaves(same))


def test_one_device_and_a_4x2_mesh_agree_and_shardings_follow_the_rules(data_dir, tmp_path):
    single = _train(tmp_path / "one", 5, mesh_shape=(1, 1))
    sharded = _train(tmp_path / "mesh", 5, mesh_shape=(4, 2))
    np.testing.assert_allclose(_losses(tmp_path / "one"), _losses(tmp_path / "mesh"), rtol=2e-5)
    params = sharded.params
    assert params["token_embedder"]["embedding"].sharding.spec == P("model", None)  # (vocab, embed)
    layer = params["encoder"]["layers_0"]
    assert layer["mlp"]["wi_0"]["kernel"].sharding.spec == P(None, "model")  # (embed, mlp)
    assert layer["attention"]["query"]["kernel"].sharding.spec == P(None, "model")  # (embed, joined_kv)
    assert layer["attention"]["out"]["kernel"].sharding.spec == P("model", None)  # (joined_kv, embed)
    assert params["decoder"]["logits_dense"]["kernel"].sharding.spec == P(None, "model")  # (embed, vocab)
    # Each device holds half of a model-sharded matrix.
    shard = params["token_embedder"]["embedding"].addressable_shards[0]
    assert shard.data.shape[0] * 2 == params["token_embedder"]["embedding"].shape[0]
    assert single.params["token_embedder"]["embedding"].sharding.spec in (P("model", None), P())


def test_training_starts_from_a_hugging_face_checkpoint_of_its_size_and_vocabulary(trained, data_dir, tmp_path):
    """INITIAL_CHECKPOINT_PATH on a Hugging Face folder (as the public T5 checkpoints): a run starts from exactly its
    weights; a checkpoint of another size, or one whose spiece.model is not the tasks' vocabulary, is refused."""
    model_dir, _ = trained
    exported = load_params(os.path.join(model_dir, "checkpoints"))[0]
    hf = tmp_path / "hf"
    save_hf_checkpoint(exported, T5_1_1_CONFIGS["tiny"], str(hf))
    shutil.copy(os.path.join(data_dir, "spm", "vocab.model"), hf / "spiece.model")
    result = _train(tmp_path / "from_hf", 1, optimizer=optax.sgd(0.0), initial_checkpoint_path=str(hf))
    for got, want in zip(jax.tree.leaves(result.params), jax.tree.leaves(exported)):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))

    wider = dataclasses.replace(T5_1_1_CONFIGS["tiny"], emb_dim=96)
    zeros = jax.tree.map(lambda x: np.zeros(x.shape, np.float32), EncoderDecoderModel(wider).abstract_init())
    save_hf_checkpoint(zeros, wider, str(tmp_path / "wider"))
    with pytest.raises(DataError, match=r"wider: the checkpoint does not fit the model \(the checkpoint: emb_dim 96"):
        trainer.initial_params(str(tmp_path / "wider"), _model())
    vocabulary = tasks.current()["vocabulary"]
    with open(hf / "spiece.model", "ab") as f:
        f.write(b"\n")  # another SentencePiece file than the tasks'
    with pytest.raises(ConfigError, match=f"set TEMPLM_VOCABULARY={hf / 'spiece.model'}"):
        trainer.initial_params(str(hf), _model(), vocabulary)


def test_the_cbqa_row_evaluates_a_hugging_face_checkpoint_as_it_is(trained, data_dir, tmp_path):
    """Dhingra et al.'s T5-CBQA row: a public checkpoint evaluated before any news training (gin_configs/cbqa.gin
    binds `checkpoint_path`). The same weights as a Hugging Face folder give the metrics of the templm checkpoint
    they came from; a folder of another size is refused with its sizes."""
    model_dir, _ = trained
    exported = load_params(os.path.join(model_dir, "checkpoints"))[0]
    hf = tmp_path / "hf"
    save_hf_checkpoint(exported, T5_1_1_CONFIGS["tiny"], str(hf))
    shutil.copy(os.path.join(data_dir, "spm", "vocab.model"), hf / "spiece.model")
    validation = sum(read_manifest(data_dir)["counts"]["templama"]["validation"].values())
    common = dict(mixture_or_task_name="templama_uniform", task_feature_lengths=LENGTHS, model=_model(),
                  split="validation", num_examples=24)
    from_hf = evaluate_checkpoint(model_dir=str(tmp_path / "cbqa"), checkpoint_path=str(hf), **common)
    from_run = evaluate_checkpoint(model_dir=str(model_dir), **common)
    assert from_hf["checkpoint"] == str(hf) and from_hf["step"] == 0 and from_run["step"] == 40
    assert from_hf["metrics"] == from_run["metrics"] and from_hf["metrics"]["templama_uniform"]["count"] == min(24, validation)
    wider = dataclasses.replace(T5_1_1_CONFIGS["tiny"], emb_dim=96)
    zeros = jax.tree.map(lambda x: np.zeros(x.shape, np.float32), EncoderDecoderModel(wider).abstract_init())
    save_hf_checkpoint(zeros, wider, str(tmp_path / "wider"))
    with pytest.raises(DataError, match=r"the checkpoint does not fit the model \(the checkpoint: emb_dim 96"):
        evaluate_checkpoint(model_dir=str(tmp_path / "cbqa"), checkpoint_path=str(tmp_path / "wider"), **common)
    try:  # the rows' configs: CBQA evaluates INITIAL_CHECKPOINT_PATH, CBQA-ft fine-tunes it 5K steps
        parse_gin(["gin_configs/cbqa.gin"], ["MODEL_DIR = '/tmp/m'", f"INITIAL_CHECKPOINT_PATH = '{hf}'"])
        assert gin.query_parameter("templm.evaluate_checkpoint.checkpoint_path").scoped_selector == \
            "INITIAL_CHECKPOINT_PATH/gin.macro"
        assert gin.query_parameter("%MIXTURE_OR_TASK_NAME") == "templama_uniform"
        gin.clear_config()
        parse_gin(["gin_configs/cbqa_ft.gin", "gin_configs/models/t5_1_1_large.gin"],
                  ["MODEL_DIR = '/tmp/m'", f"INITIAL_CHECKPOINT_PATH = '{hf}'"])
        assert gin.query_parameter("%TRAIN_STEPS") == 5000 and gin.query_parameter("templm.T5Config.emb_dim") == 1024
    finally:
        gin.clear_config()


def test_evaluating_with_a_model_of_another_size_names_the_size_of_the_checkpoint(trained):
    """`templm eval` with a model gin that does not fit the checkpoint ended in a raw JAX pytree error; it is one
    message naming the checkpoint, the parameters that differ and the model gin of the checkpoint's size."""
    model_dir, _ = trained
    small = EncoderDecoderModel(dataclasses.replace(T5_1_1_CONFIGS["small"], vocab_size=868))
    with pytest.raises(DataError) as e:
        evaluate_checkpoint(model_dir=str(model_dir), mixture_or_task_name="templama_uniform",
                            task_feature_lengths=LENGTHS, model=small, split="validation", num_examples=4)
    message = str(e.value)
    assert message.startswith(f"{model_dir}/checkpoints: the checkpoint does not fit the model: ")
    assert "['decoder']['decoder_norm']['scale']: checkpoint (64,), model (512,)" in message
    assert "; the checkpoint is T5 v1.1 tiny: add --gin_file=gin_configs/models/t5_1_1_tiny.gin" in message
    assert "the run's own config" not in message  # trained in process: no config.gin
    (model_dir / "config.gin").write_text("# the run's config\n")
    try:
        with pytest.raises(DataError, match=f"\\(the run's own config: --gin_file={model_dir}/config.gin\\)"):
            evaluate_checkpoint(model_dir=str(model_dir), mixture_or_task_name="templama_uniform",
                                task_feature_lengths=LENGTHS, model=small, split="validation", num_examples=4)
    finally:
        (model_dir / "config.gin").unlink()


def test_microbatches_give_the_same_updates(data_dir, tmp_path):
    _train(tmp_path / "whole", 4)
    _train(tmp_path / "micro", 4, microbatches=2)
    np.testing.assert_allclose(_losses(tmp_path / "whole"), _losses(tmp_path / "micro"), rtol=2e-5)


def test_nan_stops_and_keeps_the_last_good_checkpoint(data_dir, tmp_path):
    # Updates become 1e38 times larger from the fourth step on: parameters overflow after step 4.
    blow_up = optax.chain(optax.sgd(0.01), optax.scale_by_schedule(lambda step: jnp.where(step >= 3, 1e38, 1.0)))
    with pytest.raises(TrainingError, match="last good checkpoint is step 3"):
        _train(tmp_path, 10, optimizer=blow_up, save_period=1)
    assert sorted(int(s) for s in os.listdir(tmp_path / "checkpoints") if s.isdigit()) == [1, 2, 3]
    params, meta = load_params(str(tmp_path / "checkpoints"))
    assert meta["step"] == 3
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(params))


# A process killed with SIGKILL and the same command run again, resuming bitwise: tests/cloud/test_train.py (its
# run folder in a bucket, killed, stopped by SIGTERM and run again, against an unbroken local run).


@pytest.mark.e2e
def test_sigterm_saves_exits_as_preempted_and_a_rerun_resumes(data_dir, tmp_path):
    """SIGTERM once the run has written its first metrics, sent to this process, which runs the verb (what the
    process as a whole does with it, its status and last line, is tests/cloud/test_train.py's and the fault
    matrix's): a checkpoint at the step, exit 75, no result; the same command again resumes there."""
    env = {"TEMPLM_DATA_DIR": data_dir}
    stopped_run = run_templm_stopped(lambda: (tmp_path / "metrics.jsonl").exists(), "train", *CLI_CONFIG,
                                     f"--gin.MODEL_DIR='{tmp_path}'", "--gin.TRAIN_STEPS=100000",
                                     "--gin.SAVE_PERIOD=1000", env=env)
    out, err = stopped_run.stdout, stopped_run.stderr
    assert stopped_run.returncode == EXIT_PREEMPTED, err[-3000:]
    assert out == ""  # no result from unfinished work
    params, meta = load_params(str(tmp_path / "checkpoints"))
    stopped = meta["step"]
    assert stopped == meta["data_position"] > 0
    assert f"stopped by SIGTERM at step {stopped}" in err and "run the same command again" in err
    rerun = run_templm("train", *CLI_CONFIG, f"--gin.MODEL_DIR='{tmp_path}'", f"--gin.TRAIN_STEPS={stopped + 2}",
                       "--gin.SAVE_PERIOD=1000", env=env)  # the same command again (in this process)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    summary = json.loads(rerun.stdout.strip().splitlines()[-1])
    assert summary["start_step"] == stopped and summary["step"] == stopped + 2
    # TensorBoard as T5X's: MODEL_DIR/train with the rate the gin config sets (cpu_demo.gin: 0.01) and T5X's tags.
    train = event_tags(tmp_path / "train")
    assert train["learning_rate"] and all(value == pytest.approx(0.01) for _, value in train["learning_rate"])
    assert {"loss", "cross_ent_loss", "z_loss", "accuracy", "timing/steps_per_second"} <= set(train)
    loss, cross_ent, z = (dict(train[k])[stopped + 2] for k in ("loss", "cross_ent_loss", "z_loss"))
    assert loss == pytest.approx(cross_ent + z, rel=1e-5)
    # MODEL_DIR/config.gin, as T5X writes it: the gin config of the run (the rerun's), which parses back to it.
    try:
        parse_gin([str(tmp_path / "config.gin")], [])
        assert gin.query_parameter("%TRAIN_STEPS") == stopped + 2 and gin.query_parameter("%MODEL_DIR") == str(
            tmp_path)
        assert gin.query_parameter("%MIXTURE_OR_TASK_NAME") == "temporal_mixture"
        assert gin.query_parameter("templm.T5Config.emb_dim") == 64  # cpu_demo.gin's tiny model
    finally:
        gin.clear_config()


@pytest.mark.e2e
def test_two_processes_of_four_devices_match_one_process(data_dir, tmp_path):
    """Two processes, each reading one of two data shards, and one process reading both (this one, its 8 devices
    data-parallel), train alike; the first run resumes in one process and goes on as the other, which ran on without a
    stop."""
    gin_mesh = "--gin.templm.make_mesh.mesh_shape=(4, 2)"
    env = {"TEMPLM_DATA_DIR": data_dir, "XLA_FLAGS": xla_flags(4)}
    port = 20000 + os.getpid() % 20000
    procs = [_cli(f"--gin.MODEL_DIR='{tmp_path / 'multi'}'", "--gin.TRAIN_STEPS=5", gin_mesh,
                  f"--coordinator_address=localhost:{port}", "--num_processes=2", f"--process_id={i}", env=env)
             for i in range(2)]
    # The one-process reference, in this process (its 8 devices data-parallel) while the two run.
    single = run_templm("train", *CLI_CONFIG, f"--gin.MODEL_DIR='{tmp_path / 'single'}'", "--gin.TRAIN_STEPS=7",
                        "--gin.SAVE_PERIOD=5", "--gin.templm.make_mesh.mesh_shape=(8, 1)",
                        "--gin.train/templm.DatasetConfig.shards=2", env={"TEMPLM_DATA_DIR": data_dir})
    assert single.returncode == 0, single.stderr[-3000:]
    for proc in procs:
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
    np.testing.assert_allclose(_losses(tmp_path / "multi"), _losses(tmp_path / "single")[:5], rtol=2e-5)
    # Each process ran only its own shard's pipeline and saved its state; restored, the states give the batches the
    # one-process run would have drawn next.
    next_batches = {}
    for run in ("multi", "single"):
        folder = tmp_path / run / "checkpoints" / "5" / "input"
        states = {name[:-len(".state")]: (folder / name).read_bytes() for name in os.listdir(folder)
                  if name.endswith(".state")}
        assert sorted(states) == ["shard-00000-of-00002", "shard-00001-of-00002"]
        meta = json.loads((tmp_path / run / "checkpoints" / "5" / "meta" / "metadata").read_text())
        inputs = TrainingInput(meta["mixture_or_task_name"], meta["task_feature_lengths"], meta["batch_size"],
                               meta["seed"], True, data_shards=2, process=(0, 1))
        inputs.restore(states, run)
        next_batches[run] = [inputs.next() for _ in range(2)]
        inputs.close()
    for multi, single in zip(next_batches["multi"], next_batches["single"]):
        for key in single:
            np.testing.assert_array_equal(multi[key], single[key], err_msg=key)
    # The two processes' checkpoint, written over 8 devices, reads in this one process as the one-process run's does:
    # the same parameters but for the order of the gradients' sums. Adam divides each update by its gradient's
    # scale, so a parameter whose gradient is near 0 moves by that noise relatively more (seen: 1.7e-6 on a value
    # of 0.003 after 5 steps); 1e-5 absolute is still a five-thousandth of what 5 steps at rate 0.01 may move one.
    for a, b in zip(jax.tree.leaves(load_params(str(tmp_path / "multi" / "checkpoints"))[0]),
                    jax.tree.leaves(load_params(str(tmp_path / "single" / "checkpoints"), step=5)[0])):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
    # The two processes' run resumes in one process (on its checkpoint's two data shards) and goes on as the
    # one-process run did past its checkpoint 5.
    going_on = run_templm("train", *CLI_CONFIG, f"--gin.MODEL_DIR='{tmp_path / 'multi'}'", "--gin.TRAIN_STEPS=7",
                          "--gin.templm.make_mesh.mesh_shape=(8, 1)", env={"TEMPLM_DATA_DIR": data_dir})
    assert going_on.returncode == 0, going_on.stderr[-3000:]
    assert json.loads(going_on.stdout.strip().splitlines()[-1])["start_step"] == 5
    np.testing.assert_allclose(_losses(tmp_path / "multi")[5:], _losses(tmp_path / "single")[5:], rtol=2e-5)


@pytest.mark.e2e
def test_a_fractional_or_negative_step_count_is_refused_before_any_work(data_dir, tmp_path):
    """TRAIN_STEPS=20.5 used to train 21 steps and save no checkpoint, TRAIN_STEPS=-5 to exit 0 having trained
    nothing: both are one message naming the binding, exit 1, and MODEL_DIR is never made."""
    for value, message in [("20.5", "expected a whole number, got 20.5"), ("-5", "must be at least 1, got -5")]:
        model_dir = tmp_path / f"steps_{value}"
        result = run_templm("train", *CLI_CONFIG, f"--gin.MODEL_DIR='{model_dir}'", f"--gin.TRAIN_STEPS={value}",
                            env={"TEMPLM_DATA_DIR": data_dir})
        out, err = result.stdout, result.stderr
        assert result.returncode == 1 and out == "", err[-2000:]
        assert f"templm.train.total_steps (the gin macro TRAIN_STEPS): {message}" in err
        assert not model_dir.exists()


@pytest.mark.e2e
def test_misspelled_binding_and_missing_macro_are_named():
    wrong = run_templm("train", "--gin_file=gin_configs/temporal.gin", "--gin.templm.train.trian_steps=3",
                       "--gin.MODEL_DIR='/tmp/x'")
    assert wrong.returncode == 1 and "trian_steps" in wrong.stderr
    missing = run_templm("train", "--gin_file=gin_configs/temporal.gin")
    assert missing.returncode == 1 and "MODEL_DIR" in missing.stderr


def test_gin_configs_bind_the_t5x_macros(data_dir):
    try:
        parse_gin(["gin_configs/yearly.gin"], ["MODEL_DIR = '/tmp/m'", "YEAR = 2015"])
        assert gin.query_parameter("train/templm.DatasetConfig.batch_size").scoped_selector == "BATCH_SIZE/gin.macro"
        assert gin.query_parameter("%BATCH_SIZE") == 2048 and gin.query_parameter("%TRAIN_STEPS") == 300000
        assert gin.query_parameter("%DROPOUT_RATE") == 0.1
        assert gin.query_parameter("templm.T5Config.emb_dim") == 512
        assert tasks.yearly_mixture(year=2015) == "yearly_2015_mixture"
        with pytest.raises(ValueError, match="no yearly mixture for 2030"):
            tasks.yearly_mixture(year=2030)
    finally:
        gin.clear_config()


@pytest.mark.e2e
def test_eval_and_infer_verbs_on_the_trained_checkpoint(trained, data_dir, tmp_path):
    model_dir, _ = trained
    env = {"TEMPLM_DATA_DIR": data_dir}
    common = [*CLI_CONFIG, f"--gin.MODEL_DIR='{model_dir}'"]
    # The data folder given as a gin binding, not in the environment: the verb applies it after parsing the configs.
    result = run_templm("eval", *common, "--split=validation", "--eval_task=templama_temporal", f"--out={tmp_path}",
                        f"--gin.templm.tasks.configure.data_dir='{data_dir}'", env={"TEMPLM_DATA_DIR": None})
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "eval_validation.json").read_text())
    metrics = report["metrics"]["templama_temporal"]
    expected = sum(read_manifest(data_dir)["counts"]["templama"]["validation"].values())
    assert report["step"] == 40 and metrics["count"] == expected > 0 and 0 <= metrics["f1"] <= 100
    assert metrics["seen_count"] + metrics["future_count"] == metrics["count"]
    assert "| templama_temporal |" in (tmp_path / "eval_validation.md").read_text()

    queries = tmp_path / "queries.jsonl"
    queries.write_text('{"query": "Ann Lee plays for _X_.", "date": "2014"}\n{"inputs": "year: 2015 <extra_id_0> '
                       'is the head coach of Kora United."}\n')
    out = tmp_path / "predictions.jsonl"
    result = run_templm("infer", *common, f"--input={queries}", f"--output={out}", env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["model_inputs"] for r in rows] == ["year: 2014 Ann Lee plays for <extra_id_0>.",
                                                 "year: 2015 <extra_id_0> is the head coach of Kora United."]
    assert all(isinstance(r["prediction"], str) and "<extra_id" not in r["prediction"] for r in rows)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"query": "no date here _X_"}\n')
    result = run_templm("infer", *common, f"--input={bad}", f"--output={tmp_path / 'x.jsonl'}", env=env)
    assert result.returncode == 1 and f"{bad}:1" in result.stderr
    assert not (tmp_path / "x.jsonl").exists()


def test_a_second_run_on_a_model_dir_in_use_is_refused(data_dir, tmp_path):
    """Two runs on one MODEL_DIR used to write over each other's checkpoints until one crashed."""
    model_dir = tmp_path / "shared"
    holder = lock_holder(str(model_dir / ".templm.lock"), f"MODEL_DIR {model_dir}")
    try:
        with pytest.raises(DataError, match=rf"MODEL_DIR .*shared is in use by .*\(pid {holder.pid} on "):
            _train(model_dir, 2)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    assert not (model_dir / "checkpoints").exists()
    assert _train(model_dir, 2).step == 2  # the holder was killed: its lock went with it



@pytest.mark.e2e
def test_a_full_disk_during_a_save_is_one_message_and_no_half_written_checkpoint(data_dir, tmp_path):
    """It used to print some 180 lines of tracebacks from orbax's threads before the last line, and leave the
    step's temporary folder. A file-size limit stands in for a full disk: the checkpoint's write fails the same way."""
    model_dir = tmp_path / "m"
    proc = _cli(f"--gin.MODEL_DIR='{model_dir}'", "--gin.TRAIN_STEPS=2", env={"TEMPLM_DATA_DIR": data_dir},
                launcher=limited("--file_size=200000"))
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 4, err[-3000:]
    lines = err.strip().splitlines()
    assert "File too large while saving checkpoint 2" in lines[-1] and str(model_dir) in lines[-1]
    assert "Traceback" not in err, err[-3000:]
    others = [line for line in lines if " step " not in line]  # besides the progress lines: the error alone
    assert len(others) == 1, err[-3000:]
    assert sorted(os.listdir(model_dir / "checkpoints")) == []  # no step, no temporary folder


def test_a_damaged_record_file_of_the_task_data_is_named(data_dir, tmp_path):
    """A damaged task-data record file ended training in a 40-line TensorFlow traceback (DataLossError, "corrupted
    record at 12", naming no file). The record files are read one by one and the damaged one is named."""
    copy = tmp_path / "data"
    shutil.copytree(data_dir, copy)
    damaged = sorted((copy / "customnews").glob("train-*.tfrecord"))[0]
    raw = bytearray(damaged.read_bytes())
    raw[100:140] = bytes(40)
    damaged.write_bytes(bytes(raw))
    result = run_templm("train", *CLI_CONFIG, f"--gin.MODEL_DIR='{tmp_path / 'm'}'", "--gin.TRAIN_STEPS=3",
                        env={"TEMPLM_DATA_DIR": str(copy)})
    assert result.returncode == 1, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1].startswith(
        f"templm train: error: {damaged}: a task-data record file is damaged (corrupted record at ") \
        and "Traceback" not in result.stderr
