"""The online learner and the static baseline through a CALM stream: the jitted score-then-update step, the scorer,
pre-training, and run_online."""


import jax
import numpy as np
import pytest

from templm.data.calm_corpus import build_calm_corpus_from_texts
from templm.data.calm_log import LossLogger, read_loss_log
from templm.data.calm_stream import CALM
from templm.evaluation.calm_online import init_params, make_learner, pretrain, run_online, txl_config_for
from templm.evaluation.dynamic_eval import adapt_mask
from templm.models.transformer_xl import TransformerXL
from templm_testing import farm_and_market, write_texts


W, B = 16, 2


@pytest.fixture(scope="module")
def farm_stream(tmp_path_factory):
    """The batches of one class ("farm", a few sentences repeated) of a two-class char-level CALM stream, a tiny
    Transformer-XL for its vocabulary, and parameters pre-trained on its first 8 batches."""
    root = tmp_path_factory.mktemp("calm_online")
    build_calm_corpus_from_texts(write_texts(root / "texts", farm_and_market()), str(root / "corpus"), "char")
    stream = CALM(str(root / "corpus"), "char", switch_frequency=W * B * 4, nswitches=10, window_size=W, batch_size=B,
                  seed=0)
    items = [it for it in stream if it.domain_name == "farm"]
    model = TransformerXL(txl_config_for(len(stream.vocab), W, W, d_model=32, n_head=2, d_head=16, d_inner=64,
                                         n_layer=1))
    params = init_params(model, 0, B)
    pretrained, pass_losses = pretrain(model, params, [(it.inputs, it.targets) for it in items[:8]], W, 3e-3, 1)
    return {"stream": stream, "items": items[8:], "model": model, "init": params, "params": pretrained,
            "pass_losses": pass_losses}


def test_online_learner_falls_below_the_static_baseline_on_a_repeated_class(farm_stream):
    model, params, items = farm_stream["model"], farm_stream["params"], farm_stream["items"]
    assert len(items) >= 30
    learner = make_learner(model, W, "adam", adapt_mask(params, "all"))
    losses, final = run_online(items, model, W, learner, params, learner.init(params, 3e-3), params)
    assert losses.learner.shape == losses.baseline.shape == (len(items),)
    # Score first: on the first batch both models hold the same parameters and an empty memory.
    assert losses.learner[0] == pytest.approx(losses.baseline[0], rel=1e-5)
    late = slice(len(items) // 2, None)
    assert losses.learner[late].mean() < losses.baseline[late].mean() - 0.3
    assert losses.learner[late].mean() < losses.learner[:4].mean() - 0.3  # it learns as it goes
    # The arguments are not consumed (nothing donated from the caller) and the learner did move.
    moved = [not np.array_equal(a, b) for a, b in zip(jax.tree_util.tree_leaves(final),
                                                       jax.tree_util.tree_leaves(params))]
    assert all(moved)


def test_sgd_with_zero_learning_rate_is_the_static_model(farm_stream):
    model, params, items = farm_stream["model"], farm_stream["params"], farm_stream["items"][:12]
    learner = make_learner(model, W, "sgd", adapt_mask(params, "all"))
    losses, final = run_online(items, model, W, learner, params, learner.init(params, 0.0), params)
    np.testing.assert_allclose(losses.learner, losses.baseline, rtol=1e-5)  # same memory handling, no update
    for a, b in zip(jax.tree_util.tree_leaves(final), jax.tree_util.tree_leaves(params)):
        np.testing.assert_array_equal(a, b)
    assert farm_stream["pass_losses"][0] < np.log(len(farm_stream["stream"].vocab))  # pre-training learned


def test_run_online_logs_every_loss_and_reports_progress(farm_stream, tmp_path, capsys):
    model, params, items = farm_stream["model"], farm_stream["params"], farm_stream["items"][:10]
    learner = make_learner(model, W, "sgd", adapt_mask(params, "all"))
    paths = [str(tmp_path / "learner.jsonl"), str(tmp_path / "baseline.jsonl")]
    with LossLogger(paths[0]) as learner_log, LossLogger(paths[1]) as baseline_log:
        losses, _ = run_online(items, model, W, learner, params, learner.init(params, 1e-3), params, learner_log,
                               baseline_log, total=len(items), progress_every=5)
    for path, values in zip(paths, (losses.learner, losses.baseline)):
        rows = read_loss_log(path)
        assert [r[0] for r in rows] == values.tolist()  # logged as computed, in stream order
        assert [(r[1], r[2], r[3]) for r in rows] == [(i.domain, i.domain_name, i.sequence) for i in items]
    assert losses.sequence.tolist() == [i.sequence for i in items]
    err = capsys.readouterr().err
    assert "CALM: stream step 5/10" in err and "CALM: stream step 10/10" in err and "ETA" in err
