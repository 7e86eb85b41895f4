"""The one training loop (templm/training/loop.py), driven by a trivial step: it logs, saves and evaluates on its
periods, saves and raises Preempted on SIGTERM (and a resumed run goes on from there), and stops on a non-finite
loss before saving it."""

import json
import os
import signal

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from templm.errors import Preempted, TrainingError, sigterm_received, watch_sigterm
from templm.training import loop
from templm.training.checkpoints import Checkpointer, abstract_like


def step_fn(state, batch, rng):
    """Adds the batch to the parameter; the loss is the new parameter (NaN when the batch is NaN)."""
    params = state["params"] + batch["x"]
    return {"step": state["step"] + 1, "params": params}, {"loss": params, "param_norm": jnp.abs(params)}


def run(tmp_path, start_state, train_steps, batches=None, start_step=0, **kwargs):
    checkpointer = Checkpointer(str(tmp_path / "checkpoints"), kwargs.pop("save_period", 0), None)
    log = loop.MetricsLog(str(tmp_path))
    try:
        return loop.run(step_fn, start_state, batches or (lambda position: {"x": jnp.float32(position + 1)}),
                        rng=jax.random.key(0), start_step=start_step, train_steps=train_steps,
                        checkpointer=checkpointer, log=log, meta={"run": "test"}, log_period=2, tokens_per_step=8,
                        **kwargs)
    finally:
        log.close()
        checkpointer.close()


def zero_state():
    return {"step": jnp.zeros((), jnp.int32), "params": jnp.zeros((), jnp.float32)}


def rows(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def test_logs_saves_and_evaluates_on_their_periods(tmp_path, capsys):
    evaluated = []
    state, last = run(tmp_path, zero_state(), 5, save_period=2, evaluate=lambda step, s: evaluated.append(
        (step, float(s["params"]))), eval_period=2, name="toy", shown=("loss",))
    assert float(state["params"]) == 1 + 2 + 3 + 4 + 5 and last["loss"] == 15.0
    assert [r["step"] for r in rows(tmp_path / "metrics.jsonl")] == [2, 4, 5]  # every 2 steps and the last
    assert evaluated == [(2, 3.0), (4, 10.0), (5, 15.0)]
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["2", "4", "5"]
    err = capsys.readouterr().err
    assert "toy step 4/5  loss 10  " in err and "tokens/s" in err and "ETA" in err


def test_sigterm_saves_then_raises_and_a_rerun_resumes(tmp_path):
    def batches(position):
        if position == 2:  # SIGTERM arrives while the third step is being prepared
            os.kill(os.getpid(), signal.SIGTERM)
        return {"x": jnp.float32(position + 1)}

    previous = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Preempted, match=r"stopped by SIGTERM at step 3 \(checkpoint saved in .*checkpoints\)"):
        run(tmp_path, zero_state(), 100, batches)
    assert signal.getsignal(signal.SIGTERM) is previous  # the loop's handler is gone again
    checkpointer = Checkpointer(str(tmp_path / "checkpoints"))
    state, meta = checkpointer.restore(abstract_like(zero_state()))
    checkpointer.close()
    assert meta["data_position"] == meta["step"] == 3 and meta["run"] == "test"
    assert meta["train"]["loss"] == 6.0 and float(state["params"]) == 6.0
    resumed, _ = run(tmp_path, state, 5, start_step=3)
    assert float(resumed["params"]) == 15.0  # the same as a run that never stopped


def test_sigterm_between_two_trainings_stops_the_next_one_at_its_first_step(tmp_path):
    """A study watching SIGTERM around its stages (templm reproduce): a signal that arrives after one model's loop has
    ended, before the next one starts, stops the next loop at its first step, not after all of its steps."""
    previous = signal.getsignal(signal.SIGTERM)
    with watch_sigterm():
        state, _ = run(tmp_path / "first", zero_state(), 3)
        assert float(state["params"]) == 6.0 and not sigterm_received()
        os.kill(os.getpid(), signal.SIGTERM)  # between the two trainings: noted, not fatal
        assert sigterm_received()
        with pytest.raises(Preempted, match=r"at step 1 \("):
            run(tmp_path / "second", zero_state(), 100)
    assert signal.getsignal(signal.SIGTERM) is previous and not sigterm_received()
    assert sorted(os.listdir(tmp_path / "second" / "checkpoints")) == ["1"]


def test_a_nan_loss_stops_before_it_is_saved(tmp_path):
    def batches(position):
        return {"x": jnp.float32(np.nan if position == 3 else 1.0)}

    with pytest.raises(TrainingError, match="at step 4: stopping; the last good checkpoint is step 2"):
        run(tmp_path, zero_state(), 10, batches, save_period=2)
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["2"]
