"""The one training loop (templm/training/loop.py), driven by a trivial step: it logs, saves and evaluates on its
periods, saves and raises Preempted on SIGTERM (and a resumed run goes on from there), stops on a non-finite loss
before saving it, and saves the caller's input states with its checkpoints."""

import json
import os
import signal

import jax.numpy as jnp
import numpy as np
import pytest

from templm import console
from templm.errors import Preempted, TrainingError, sigterm_received, watch_sigterm
from templm.training.checkpoints import Checkpointer, abstract_like
from templm_testing import event_tags, toy_run as run, toy_state as zero_state


def steps(checkpoints):
    """The saved steps in a checkpoint folder, and the same steps' digest records (integrity/<step>.json)."""
    saved = sorted((name for name in os.listdir(checkpoints) if name.isdigit()), key=int)
    assert sorted(os.listdir(os.path.join(checkpoints, "integrity")), key=lambda n: int(n.split(".")[0])) == [
        f"{s}.json" for s in saved]
    return saved


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
    assert steps(tmp_path / "checkpoints") == ["2", "4", "5"]
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


def test_sigterm_during_the_last_save_is_not_dropped(tmp_path):
    """SIGTERM that arrived while the last step was being saved was dropped: the loop ended normally and the caller
    went on (is-eval trained its proposal and wrote results 43 s later, exit 0). The run is complete and saved, and
    the command stops there with Preempted (a rerun finds the finished run)."""
    def input_state():  # called while the last step's checkpoint is being saved
        os.kill(os.getpid(), signal.SIGTERM)
        return None

    with pytest.raises(Preempted, match=r"stopped by SIGTERM after its last step 4 \(checkpoint saved in "):
        run(tmp_path, zero_state(), 4, input_state=input_state)
    assert steps(tmp_path / "checkpoints") == ["4"]
    checkpointer = Checkpointer(str(tmp_path / "checkpoints"))
    state, meta = checkpointer.restore(abstract_like(zero_state()))
    checkpointer.close()
    assert meta["data_position"] == 4 and float(state["params"]) == 1 + 2 + 3 + 4  # the whole run, saved


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
    assert steps(tmp_path / "second" / "checkpoints") == ["1"]


def test_jobs_at_once_give_their_results_in_order_and_a_failure_stops_the_others(tmp_path):
    """loop.at_once: two toy trainings two at once end as one at a time does, their results in the jobs' order; a job
    that fails stops the training beside it after its step, with a checkpoint, and the job queued after them never
    starts."""
    from templm.training.loop import at_once

    def training(name, steps):
        return lambda stop: float(run(tmp_path / name, zero_state(), steps, stop=stop)[0]["params"])

    both = at_once([("a", training("a", 4)), ("b", training("b", 5))], 2)
    assert list(both.items()) == [("a", 10.0), ("b", 15.0)]
    assert at_once([("a", training("a1", 4)), ("b", training("b1", 5))], 1) == both

    started = []

    def failing(stop):
        raise ValueError("a bad binding")

    def queued(stop):
        started.append("queued")

    with pytest.raises(ValueError, match="a bad binding"):
        at_once([("long", training("long", 100_000)), ("failing", failing), ("queued", queued)], 2)
    assert started == []
    saved = steps(tmp_path / "long" / "checkpoints")
    assert len(saved) == 1 and 1 <= int(saved[0]) < 100_000


def test_a_nan_loss_stops_before_it_is_saved(tmp_path):
    def batches(position):
        return {"x": jnp.float32(np.nan if position == 3 else 1.0)}

    with pytest.raises(TrainingError, match="at step 4: stopping; the last good checkpoint is step 2"):
        run(tmp_path, zero_state(), 10, batches, save_period=2)
    assert steps(tmp_path / "checkpoints") == ["2"]


def test_input_states_go_with_each_save_and_with_the_last_only_when_asked(tmp_path):
    """The caller's input state at each save is the one after the batches of the steps saved (positions 0..step-1);
    `final_input_state=False` leaves it out of the last step's checkpoint."""
    drawn = []

    def batch_at(position):
        drawn.append(position)
        return {"x": jnp.float32(position + 1)}

    def state():
        return {"shard-00000-of-00001": str(len(drawn)).encode()}

    run(tmp_path / "keep", zero_state(), 5, batches=batch_at, save_period=2, input_state=state)
    drawn.clear()
    run(tmp_path / "drop", zero_state(), 5, batches=batch_at, save_period=2, input_state=state,
        final_input_state=False)
    names = ("shard-00000-of-00001",)
    for folder, last in (("keep", {"shard-00000-of-00001": b"5"}), ("drop", {})):
        checkpointer = Checkpointer(str(tmp_path / folder / "checkpoints"))
        try:
            assert checkpointer.restore_inputs(2, names) == {"shard-00000-of-00001": b"2"}
            assert checkpointer.restore_inputs(4, names) == {"shard-00000-of-00001": b"4"}
            assert checkpointer.restore_inputs(5, names) == last
        finally:
            checkpointer.close()


def test_summaries_are_laid_out_as_t5x_lays_out_a_run_folder(tmp_path):
    """T5X users look for MODEL_DIR/train (with `learning_rate` and `timing/steps_per_second`) and one folder per
    evaluation; every scalar shared one event file of 141 tags, the ETA and per-year counts among them."""
    from templm.training import loop

    run(tmp_path, zero_state(), 4, extra_scalars=lambda step: {"learning_rate": 0.01 * step})
    log = loop.MetricsLog(str(tmp_path))
    log.write(4, "validation/templama_temporal", {"f1": 40.0, "f1_2014": 50.0, "count_2014": 3.0, "seen_f1": 45.0})
    log.close()
    assert not [n for n in os.listdir(tmp_path) if n.startswith("events.out")]  # nothing at the top
    train = event_tags(tmp_path / "train")
    assert train["loss"] == [(2, 3.0), (4, 10.0)]
    assert train["learning_rate"] == [(2, pytest.approx(0.02)), (4, pytest.approx(0.04))]  # float32 summaries
    assert {"timing/steps_per_second", "timing/tokens_per_second"} <= set(train) and "eta_sec" not in train
    evaluation = event_tags(tmp_path / "validation_eval")
    assert evaluation == {"templama_temporal/f1": [(4, 40.0)], "templama_temporal/seen_f1": [(4, 45.0)],
                          "templama_temporal_by_year/f1_2014": [(4, 50.0)],
                          "templama_temporal_by_year/count_2014": [(4, 3.0)]}
    # metrics.jsonl keeps every scalar as written, the ETA included.
    assert "eta_sec" in rows(tmp_path / "metrics.jsonl")[0] and rows(tmp_path / "metrics.jsonl")[-1]["f1_2014"] == 50


def test_progress_every_log_step_once_in_a_period_or_not_at_all(tmp_path, capsys):
    """`progress=True` prints every log step (templm train's lines); a number of seconds at most once in that many,
    none for a run shorter than one period (a study's models say their own line when done); --progress=none no
    step line at all."""
    run(tmp_path / "every", zero_state(), 6, name="toy", progress=True)
    assert [line.split("  ")[0] for line in capsys.readouterr().err.splitlines()] == ["toy step 2/6", "toy step 4/6",
                                                                                      "toy step 6/6"]
    run(tmp_path / "throttled", zero_state(), 6, name="toy", progress=3600.0)
    assert capsys.readouterr().err == ""
    console.set_progress("none")
    try:
        run(tmp_path / "none", zero_state(), 6, name="toy", progress=True)
    finally:
        console.set_progress("lines")
    assert capsys.readouterr().err == ""


def test_a_ticker_says_a_line_once_a_period_has_passed_with_the_rate_and_eta(capsys, monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(console.time, "time", lambda: now[0])
    ticker = console.Ticker("task data", 100, "documents", period=45.0)
    for done in range(1, 101):
        now[0] += 1.0  # a document a second
        ticker.update(done)
    ticker.close()
    lines = capsys.readouterr().err.splitlines()
    assert lines == ["task data 45/100 documents  1.00 documents/s  ETA 0m55s",
                     "task data 90/100 documents  1.00 documents/s  ETA 0m10s"]
    unknown = console.Ticker("eval: scoring", None, "examples", period=0.0)
    now[0] += 4.0
    unknown.update(8)
    assert capsys.readouterr().err == "eval: scoring 8 examples  2.00 examples/s\n"
    with pytest.raises(ValueError, match="progress must be one of"):
        console.set_progress("loud")
