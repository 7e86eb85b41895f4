"""Transformer-XL LM training (templm/training/lm_trainer.py, through the shared loop): the loss falls on a tiny world
split, resume is bitwise exact (memories included, across an epoch boundary, on a 2x2 mesh), a NaN stops
the run, the checkpoint rebuilds the model, and bad input is named."""

import dataclasses
import gzip
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from templm.data.lm_data import load_processor, read_split_documents, tokenize_documents
from templm.data.lm_streams import write_streams
from templm.data.splits import read_split_file
from templm.errors import ConfigError, DataError, TrainingError
from templm.experiments.streaming import prepare_preset_data
from templm.models.transformer_xl import TransformerXLConfig
from templm.training import lm_trainer, partitioning
from templm.training.checkpoints import load_params
from templm.training.configs import CheckpointConfig, CorpusConfig, OptimizerConfig, SaveCheckpointConfig
from templm.training.loop import RunOptions

# Dropout on: resume must also replay the dropout masks (keys fold in the step).
TINY = TransformerXLConfig(vocab_size=256, d_model=32, n_head=2, d_head=16, d_inner=64, n_layer=2, tgt_len=16,
                           mem_len=16, eval_mem_len=32, dropout=0.1, dropatt=0.1)
# Settings shared by the runs of several tests, so they share one compiled train step. A constant rate: a cosine
# schedule spans train_steps, so stopping a run early by asking for fewer steps would change it.
SHARED = dict(optimizer_cfg=OptimizerConfig(learning_rate=1e-2, schedule="constant"), data_order="shuffle",
              mesh_shape=(2, 2))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A 2015-2019 world, TIME-STRATIFIED / CONTROL splits (cut-off 2017-12-31, 12 test months), one vocabulary of
    256 pieces: the tiny_test preset's data, shared with test_stream_cli.py."""
    return prepare_preset_data(str(tmp_path_factory.mktemp("lm") / "data"), "tiny_test", seed=3)


def _mesh(shape):
    return partitioning.make_mesh(mesh_shape=shape, devices=jax.devices()[:int(np.prod(shape))])


def _train(data, model_dir, steps, mesh_shape=(1, 1), save_period=1000, seed=0, optimizer_cfg=OptimizerConfig(),
           optimizer=None, config=TINY, config_gin=None, **corpus):
    corpus.setdefault("split_dir", data["split_dir"])
    corpus.setdefault("batch_size", 8)
    return lm_trainer.train_lm(str(model_dir), config, CorpusConfig(data["corpus"], data["spm_model"], **corpus),
                               steps, optimizer_cfg, CheckpointConfig(SaveCheckpointConfig(period=save_period)),
                               random_seed=seed, stats_period=1, optimizer=optimizer,
                               options=RunOptions(mesh=_mesh(mesh_shape), config_gin=config_gin))


def _losses(model_dir):
    with open(os.path.join(model_dir, "metrics.jsonl")) as f:
        return [row["loss"] for row in map(json.loads, f) if row["split"] == "train"]


def test_loss_falls_on_a_world_split(data, tmp_path):
    config = "TRAIN_STEPS = 120\n"  # the run's gin config, as `templm train-lm` passes gin.config_str()
    result = _train(data, tmp_path, 120, save_period=0, config_gin=config, **SHARED)
    assert (tmp_path / "config.gin").read_text() == config  # MODEL_DIR/config.gin, as T5X writes it
    losses = _losses(tmp_path)
    assert len(losses) == 120 and result.step == 120
    # Below the unigram entropy of the split's tokens: the model uses its context, not only token frequencies.
    docs = read_split_documents(data["corpus"], os.path.join(data["split_dir"], "time_stratified_train.gz"))
    counts = np.bincount(tokenize_documents(docs, load_processor(data["spm_model"]))[0])
    freq = counts[counts > 0] / counts.sum()
    unigram_entropy = float(-(freq * np.log(freq)).sum())
    assert losses[0] > unigram_entropy + 0.5
    assert np.mean(losses[-5:]) < unigram_entropy - 0.5
    assert result.data["documents"] == len(read_split_file(os.path.join(data["split_dir"],
                                                                           "time_stratified_train.gz")))
    assert any(name.startswith("events.out.tfevents") for name in os.listdir(tmp_path / "train"))
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["120", "integrity"]  # the end is always saved

    model, params, meta = lm_trainer.load_lm(str(tmp_path))
    assert model.config == lm_trainer.resolve_config(TINY) and meta["step"] == 120
    assert meta["split_file"].endswith("time_stratified_train.gz") and meta["data_order"] == "shuffle"
    assert meta["mem_len"] == 16 and meta["data_position"] == 120
    same = jax.tree.map(lambda a, b: np.array_equal(np.asarray(a), b), result.params, params)
    assert all(jax.tree.leaves(same))


def test_resume_is_bitwise_exact_with_memories_across_an_epoch(data, tmp_path):
    # A split of 8 documents: about 1K tokens, 8 or so segments of 8 x 16 per epoch, so 14 steps cross an epoch.
    pairs = read_split_file(os.path.join(data["split_dir"], "time_stratified_train.gz"))[:8]
    small = tmp_path / "small_train.gz"
    with gzip.open(small, "wt") as f:
        f.writelines(f"{d:%Y%m%d}\t{i}\n" for d, i in pairs)
    common = dict(split_file=str(small), seed=4, **SHARED)
    straight = _train(data, tmp_path / "straight", 14, save_period=0, **common)
    assert 6 < straight.data["segments_per_epoch"] < 14
    first = _train(data, tmp_path / "resumed", 6, save_period=3, **common)
    assert first.step == 6
    resumed = _train(data, tmp_path / "resumed", 14, save_period=3, **common)
    assert resumed.start_step == 6 and resumed.step == 14
    np.testing.assert_array_equal(_losses(tmp_path / "resumed"), _losses(tmp_path / "straight"))
    for key in ("params", "mems"):
        same = jax.tree.map(lambda a, b: np.array_equal(np.asarray(a), np.asarray(b)), getattr(straight, key), getattr(resumed, key))
        assert all(jax.tree.leaves(same)), key
    a, _ = load_params(str(tmp_path / "straight" / "checkpoints"))
    b, meta = load_params(str(tmp_path / "resumed" / "checkpoints"))
    assert meta["data_position"] == 14
    assert all(jax.tree.leaves(jax.tree.map(lambda x, y: np.array_equal(np.asarray(x), np.asarray(y)), a, b)))
    # Laid out by the logical-axis rules: (vocab, embed) over "model", memories (batch, length, embed) over "data".
    assert resumed.params["embedding"].sharding.spec == P("model", None)
    assert resumed.params["layer_0"]["mlp"]["wi"]["kernel"].sharding.spec == P(None, "model")
    assert resumed.mems[0].sharding.spec == P("data", None, None)

    # Other data, batch or model in the same run folder: refused before any step, naming the binding and both values,
    # the folder left byte for byte as it was (the one resume contract of every trainer: loop.RunFolder.resume).
    (tmp_path / "resumed" / "config.gin").write_text("# the run's own config\n")
    before = _snapshot(tmp_path / "resumed")
    for match, changed in ((r"data_order 'shuffle' there, 'date' in this run \(templm.CorpusConfig.data_order\)",
                            {"data_order": "date"}),
                           (r"batch_size 8 there, 4 in this run \(templm.CorpusConfig.batch_size, BATCH_SIZE\)",
                            {"batch_size": 4}),
                           (r'model_config \{"d_inner": 64\} there, \{"d_inner": 128\} in this run',
                            {"config": dataclasses.replace(TINY, d_inner=128)})):
        with pytest.raises(DataError, match=match):
            _train(data, tmp_path / "resumed", 16, save_period=3, config_gin="# another config\n",
                   **{**common, **changed})
        assert _snapshot(tmp_path / "resumed") == before


def test_a_run_from_token_streams_is_the_run_from_the_corpus(data, tmp_path):
    """`templm data streams` tokenises a split once: a run reading its folder gets the same data (the same
    fingerprint), so it resumes a run started from the corpus and ends with the same losses as one that never left it;
    the streams of another split or vocabulary are refused naming it."""
    pairs = read_split_file(os.path.join(data["split_dir"], "time_stratified_train.gz"))[:8]
    splits = tmp_path / "splits"
    splits.mkdir()
    with gzip.open(splits / "small_train.gz", "wt") as f:
        f.writelines(f"{d:%Y%m%d}\t{i}\n" for d, i in pairs)
    write_streams(data["corpus"], {"small_train": str(splits / "small_train.gz")}, data["spm_model"],
                  str(tmp_path / "streams"))
    common = dict(split="small_train", seed=4, **SHARED)
    straight = _train(data, tmp_path / "straight", 10, save_period=0, split_dir=str(splits), **common)
    _train(data, tmp_path / "resumed", 5, save_period=5, split_dir=str(splits), **common)
    resumed = _train(data, tmp_path / "resumed", 10, save_period=5, token_streams=str(tmp_path / "streams"), **common)
    assert resumed.start_step == 5 and resumed.data == straight.data
    np.testing.assert_array_equal(_losses(tmp_path / "resumed"), _losses(tmp_path / "straight"))
    _, _, meta = lm_trainer.load_lm(str(tmp_path / "resumed"))
    assert meta["split_file"] == str(splits / "small_train.gz")  # for `templm stream`, as from the corpus
    with pytest.raises(DataError, match=r"manifest.json: holds no split 'time_stratified_train' \(it holds "
                                        r"small_train\)"):
        _train(data, tmp_path / "other", 2, token_streams=str(tmp_path / "streams"))
    with pytest.raises(ConfigError, match="split_file is bound with token_streams"):
        _train(data, tmp_path / "other", 2, token_streams=str(tmp_path / "streams"), split_file=str(splits))


def _snapshot(folder):
    return {os.path.relpath(os.path.join(root, name), folder): open(os.path.join(root, name), "rb").read()
            for root, _, names in os.walk(folder) for name in names}


def test_nan_stops_and_keeps_the_last_good_checkpoint(data, tmp_path):
    blow_up = optax.chain(optax.sgd(0.01), optax.scale_by_schedule(lambda step: jnp.where(step >= 2, 1e38, 1.0)))
    with pytest.raises(TrainingError, match="last good checkpoint is step 2"):
        _train(data, tmp_path, 8, optimizer=blow_up, save_period=1)
    params, meta = load_params(str(tmp_path / "checkpoints"))
    assert meta["step"] == 2 and all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(params))


def test_bad_input_is_named(data, tmp_path):
    missing = tmp_path / "nope" / "time_stratified_train.gz"
    with pytest.raises(DataError, match=f"{missing}.*no such split file"):
        _train(data, tmp_path / "run", 2, split_file=str(missing))
    foreign = tmp_path / "foreign.gz"
    with gzip.open(foreign, "wt") as f:
        f.write("20150101\tnot-in-the-world\n20150102\talso-missing\n")
    with pytest.raises(DataError, match=f"{foreign}: 2 of the 2 document ids .* not in the corpus"):
        _train(data, tmp_path / "run", 2, split_file=str(foreign))
    with pytest.raises(ValueError, match="vocab_size=100 cannot hold the 256 pieces"):
        _train(data, tmp_path / "run", 2, config=dataclasses.replace(TINY, vocab_size=100))
    with pytest.raises(DataError, match="not a trained Transformer-XL run"):
        lm_trainer.load_lm(str(tmp_path))
    assert not os.path.exists(tmp_path / "run" / "checkpoints")
