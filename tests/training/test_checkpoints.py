"""Checkpoint integrity: every save records the SHA-256 of its files; a restore checks them, names a damaged file,
and falls back to the newest intact step (or stops with a message when a given step, or every step, is damaged)."""

import os

import jax.numpy as jnp
import numpy as np
import pytest

from templm.errors import DataError
from templm.training.checkpoints import Checkpointer, abstract_like, load_params

from templm_testing import toy_run as run, toy_state as zero_state


@pytest.fixture
def saved(tmp_path):
    """Steps 2, 4 and 5 of the toy run (params 3, 10 and 15)."""
    run(tmp_path, zero_state(), 5, save_period=2)
    return tmp_path / "checkpoints"


def _largest_file(step_dir):
    files = [os.path.join(root, name) for root, _, names in os.walk(step_dir) for name in names]
    return max(files, key=os.path.getsize)


def _restore(checkpoints, step=None):
    checkpointer = Checkpointer(str(checkpoints))
    try:
        return checkpointer.restore(abstract_like(zero_state()), step)
    finally:
        checkpointer.close()


def _flip(path, offset=None):
    with open(path, "r+b") as f:
        data = bytearray(f.read())
        at = len(data) // 2 if offset is None else offset
        data[at] ^= 0xFF
        f.seek(0)
        f.write(data)


def test_overwritten_bytes_in_the_newest_checkpoint_fall_back_to_the_one_before(saved, tmp_path, capsys):
    bad = _largest_file(saved / "5")
    _flip(bad)
    with pytest.raises(DataError, match="checkpoint 5: .*does not match the digest"):
        _restore(saved, step=5)  # the step asked for is damaged: no silent substitute
    params, meta = load_params(str(saved))  # evaluation and adaptation read checkpoints the same way
    assert meta["step"] == 4 and float(params) == 10.0
    assert "using checkpoint 4" in capsys.readouterr().err and (saved / "5").is_dir()  # evaluation moves nothing
    state, meta = _restore(saved)
    assert meta["step"] == 4 and float(state["params"]) == 10.0
    err = capsys.readouterr().err
    assert "checkpoint 5" in err and bad in err and "does not match the digest" in err
    # The damaged step is set aside with its digest record, named, and its bytes kept.
    aside = saved / "damaged" / "5"
    assert str(aside) in err and aside.is_dir() and (saved / "damaged" / "5.json").is_file()
    assert not (saved / "5").exists() and not (saved / "integrity" / "5.json").exists()
    # The resumed run ends where the uninterrupted one did, and its step 5 is saved in the damaged one's place:
    # evaluation and a later resume read the retrained step, not the older one.
    resumed, _ = run(tmp_path, state, 5, start_step=4)
    assert float(resumed["params"]) == 15.0
    params, meta = load_params(str(saved))
    assert meta["step"] == 5 and float(params) == 15.0
    state, meta = _restore(saved, step=5)
    assert float(state["params"]) == 15.0
    # Damaged again: the second one is set aside beside the first, which stays as it was.
    _flip(_largest_file(saved / "5"))
    _restore(saved)
    assert (saved / "damaged" / "5.1").is_dir() and aside.is_dir() and not (saved / "5").exists()


def test_a_deleted_input_state_is_a_damaged_step_set_aside(tmp_path, capsys):
    checkpointer = Checkpointer(str(tmp_path / "checkpoints"), async_save=False)
    try:
        for step in (1, 2):
            checkpointer.save(step, {"step": jnp.int32(step), "params": jnp.float32(step)}, {"step": step},
                              inputs={"shard-00000-of-00001": b"position %d" % step})
        checkpointer.wait(digests=True)
    finally:
        checkpointer.close()
    (tmp_path / "checkpoints" / "2" / "input" / "shard-00000-of-00001.state").unlink()
    state, meta = _restore(tmp_path / "checkpoints")
    assert meta["step"] == 1 and "input/shard-00000-of-00001.state is missing" in capsys.readouterr().err
    assert (tmp_path / "checkpoints" / "damaged" / "2").is_dir()
    assert sorted(os.listdir(tmp_path / "checkpoints" / "integrity")) == ["1.json"]


@pytest.mark.parametrize("damage", ["truncate", "delete_metadata", "add"])
def test_truncated_missing_or_added_files_are_named(saved, damage):
    step_dir = saved / "5"
    if damage == "truncate":
        target = _largest_file(step_dir)
        with open(target, "r+b") as f:
            f.truncate(os.path.getsize(target) // 2)
        expected = "does not match the digest"
    elif damage == "delete_metadata":
        target = str(step_dir / "_CHECKPOINT_METADATA")
        os.remove(target)
        expected = "is missing"
    else:
        target = str(step_dir / "state" / "stray.bin")
        with open(target, "wb") as f:
            f.write(b"x")
        expected = "was not part of the checkpoint"
    with pytest.raises(DataError) as e:
        _restore(saved, step=5)
    assert target in str(e.value) and expected in str(e.value)
    _, meta = _restore(saved)
    assert meta["step"] == 4


def test_every_checkpoint_damaged_is_one_clear_error(saved):
    for step in ("2", "4", "5"):
        _flip(_largest_file(saved / step))
    with pytest.raises(DataError, match=r"no intact checkpoint to restore: checkpoint 5: .*; checkpoint 4: .*; "
                                        r"checkpoint 2: .*") as e:
        _restore(saved)
    assert str(saved) in str(e.value)


def test_digest_records_follow_the_kept_steps(tmp_path):
    checkpointer = Checkpointer(str(tmp_path / "ck"), save_period=1, keep=2)
    try:
        for step in (1, 2, 3):
            checkpointer.save(step, {"step": jnp.int32(step), "params": jnp.float32(step)}, {"step": step})
    finally:
        checkpointer.close()
    assert sorted(os.listdir(tmp_path / "ck")) == ["2", "3", "integrity"]
    assert sorted(os.listdir(tmp_path / "ck" / "integrity")) == ["2.json", "3.json"]


@pytest.mark.parametrize("async_save", [True, False])
def test_saves_finish_in_order_and_restore_what_was_saved(tmp_path, async_save):
    """Each save starts once the one before it is on disk; after close every step has its digests, and restores
    to the state and input states it was given (asynchronous or not)."""
    checkpointer = Checkpointer(str(tmp_path / "ck"), save_period=1, keep=None, async_save=async_save)
    big = jnp.arange(200_000, dtype=jnp.float32)
    try:
        for step in (1, 2, 3):
            checkpointer.save(step, {"step": jnp.int32(step), "params": big * step}, {"step": step},
                              inputs={"shard-00000-of-00002": bytes([step]) * 100})
            assert sorted(os.listdir(tmp_path / "ck"))[:step - 1] == [str(s) for s in range(1, step)]
        checkpointer.save(3, {}, {}, wait=True)  # a step saved already: only waited for
        assert (tmp_path / "ck" / "integrity" / "3.json").is_file()
    finally:
        checkpointer.close()
    assert sorted(os.listdir(tmp_path / "ck" / "integrity")) == ["1.json", "2.json", "3.json"]
    reader = Checkpointer(str(tmp_path / "ck"))
    try:
        for step in (1, 2, 3):
            state, meta = reader.restore(abstract_like({"step": jnp.int32(0), "params": big}), step)
            assert meta == {"step": step} and int(state["step"]) == step
            np.testing.assert_array_equal(np.asarray(state["params"]), np.asarray(big * step))
            assert reader.restore_inputs(step, ("shard-00000-of-00002", "shard-00001-of-00002")) == {
                "shard-00000-of-00002": bytes([step]) * 100}
    finally:
        reader.close()


def test_a_step_that_is_not_there_names_the_steps_that_are(saved):
    """`templm eval --step 999` ended in "'NoneType' object has no attribute 'tree'"."""
    for read in (lambda: load_params(str(saved), step=999), lambda: _restore(saved, step=999)):
        with pytest.raises(DataError, match="no checkpoint at step 999: the steps here are 2, 4, 5"):
            read()
