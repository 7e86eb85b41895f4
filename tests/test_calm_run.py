"""CALM with a Transformer-XL learner: the jitted score-then-update step, `templm calm`, `templm data calm`,
`templm is-eval`, and bad input answered with a message and a non-zero exit."""

import itertools
import json
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

from templm.evaluation import calm
from templm.evaluation.calm_run import (class_wraps, init_params, make_learner, pretrain, run_online, switch_points,
                                        txl_config_for)
from templm.evaluation.dynamic_eval import adapt_mask
from templm.models.transformer_xl import TransformerXL

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GIN = "gin_configs/calm/txl_online.gin"


def templm(*args, cwd=REPO):
    return subprocess.run([sys.executable, "-m", "templm.cli", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300)


def write_texts(folder, texts):
    os.makedirs(folder, exist_ok=True)
    for name, text in texts.items():
        with open(os.path.join(folder, f"{name}.txt"), "w", encoding="utf-8") as f:
            f.write(text)
    return str(folder)


def farm_and_market():
    animals = itertools.cycle(["cat", "dog", "cow", "hen"])
    return {"farm": "".join(f"the {next(animals)} sat on the mat.\n" for _ in range(120)),
            "market": "".join(f"stocks rose {i % 7} points and bonds fell.\n" for i in range(60))}


# -- the learner, in process ------------------------------------------------------------------------------------------

W, B = 16, 2


@pytest.fixture(scope="module")
def farm_stream(tmp_path_factory):
    """The batches of one class ("farm", a few sentences repeated) of a two-class char-level CALM stream, a tiny
    Transformer-XL for its vocabulary, and parameters pre-trained on its first 8 batches."""
    root = tmp_path_factory.mktemp("calm_run")
    calm.build_calm_corpus_from_texts(write_texts(root / "texts", farm_and_market()), str(root / "corpus"), "char")
    stream = calm.CALM(str(root / "corpus"), "char", switch_frequency=W * B * 4, nswitches=10, window_size=W,
                       batch_size=B, seed=0)
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


def test_switch_points_and_wraps(farm_stream):
    assert switch_points([0, 0, 1, 1, 1, 2, 3, 3]) == [2, 5, 6]
    assert switch_points([4]) == []
    stream = farm_stream["stream"]
    wraps = class_wraps(stream)
    assert set(wraps) == {"farm", "market"}
    used = {name: sum(n for d, n in stream.segments if stream.class_names[d] == name) for name in wraps}
    for d, name in enumerate(stream.class_names):
        per_pass = (stream.class_stream(d).shape[1] - 1) // W
        assert wraps[name] == (used[name] - 1) // per_pass


# -- verbs, end to end ----------------------------------------------------------------------------------------------

TINY_RUN = ("--gin.templm.run_calm.domains=['sports', 'politics']", "--gin.templm.run_calm.nswitches=50",
            "--gin.templm.run_calm.switch_frequency=16", "--gin.templm.run_calm.window_size=8",
            "--gin.templm.run_calm.batch_size=2", "--gin.templm.run_calm.d_model=32",
            "--gin.templm.run_calm.d_head=16", "--gin.templm.run_calm.d_inner=64",
            "--gin.templm.run_calm.n_layer=1", "--gin.templm.run_calm.mem_len=8",
            "--gin.templm.run_calm.pretrain_batches=20", "--gin.templm.run_calm.pretrain_passes=1",
            "--gin.WorldConfig.end_year=2014", "--gin.WorldConfig.docs_per_month=10")


def test_templm_calm_end_to_end(tmp_path):
    out = tmp_path / "run"
    result = templm("calm", f"--gin_file={GIN}", f"--gin.OUT_DIR='{out}'", *TINY_RUN)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "| learner |" in result.stdout and "| baseline |" in result.stdout
    for name in ("results.json", "report.md", "loss.png", "learner.jsonl", "baseline.jsonl"):
        assert (out / name).stat().st_size > 0, name
    assert (out / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not [f for f in os.listdir(out) if f.endswith(".tmp")]

    results = json.loads((out / "results.json").read_text())
    assert results["corpus"]["classes"] == ["politics", "sports"]
    assert results["stream"]["segments"] == 100 and results["stream"]["batches"] == 100  # mean length 16/8/2 = 1
    for model in ("learner", "baseline"):
        metrics = results["metrics"][model]
        for key in ("loss", "total_pp", "ppl@sw", "rec"):
            assert np.isfinite(metrics[key]), (model, key)
            for c in ("politics", "sports"):
                assert f"{key}_{c}" in metrics
        assert metrics["total_pp"] == pytest.approx(np.exp(metrics["loss"]))
        # The log: the original's field names, one line per batch, and metrics recomputable from it.
        lines = [json.loads(line) for line in (out / f"{model}.jsonl").read_text().splitlines()]
        assert len(lines) == results["stream"]["batches"]
        assert all(list(row) == ["loss", "domain", "domain_name", "sequence"] for row in lines)
        assert [row["sequence"] for row in lines] == list(range(100))
        assert calm.compute_metrics(str(out / f"{model}.jsonl")) == metrics
    learner = [json.loads(x)["loss"] for x in (out / "learner.jsonl").read_text().splitlines()]
    baseline = [json.loads(x)["loss"] for x in (out / "baseline.jsonl").read_text().splitlines()]
    assert learner[0] == pytest.approx(baseline[0], rel=1e-5)  # same start, scored before the first step
    assert results["metrics"]["learner"]["loss"] < results["metrics"]["baseline"]["loss"]
    report = (out / "report.md").read_text()
    assert "| sports | learner |" in report and "ppl@sw" in report


def test_data_calm_from_texts_and_from_world(tmp_path):
    texts = write_texts(tmp_path / "texts", farm_and_market())
    result = templm("data", "calm", f"--out={tmp_path / 'from_texts'}", f"--texts={texts}", "--level=char")
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads(result.stdout)
    assert sorted(summary["classes"]) == ["farm", "market"]
    assert sorted(os.listdir(tmp_path / "from_texts" / "vocab")) == ["farm.vocab", "market.vocab"]
    stream = calm.CALM(str(tmp_path / "from_texts"), "char", 64, 2, 8, 2, 0)
    assert "t" in stream.vocab and stream.vocab.decode(stream.class_stream(0)[0, :8]) == "the cat "

    world = tmp_path / "world"  # does not exist: generated first
    result = templm("data", "calm", f"--out={tmp_path / 'from_world'}", f"--world_dir={world}",
                    "--domains=sports,weather", "--seed=3", "--gin.WorldConfig.start_year=2014",
                    "--gin.WorldConfig.end_year=2014", "--gin.WorldConfig.docs_per_month=5")
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads(result.stdout)
    assert summary["world_generated"] is True and sorted(summary["classes"]) == ["sports", "weather"]
    assert json.loads((world / "stats.json").read_text())["documents"] == 12 * 5
    assert sorted(f for f in os.listdir(tmp_path / "from_world") if f.endswith(".txt")) == ["sports.txt",
                                                                                           "weather.txt"]
    # An existing world is used as it is (not regenerated).
    again = templm("data", "calm", f"--out={tmp_path / 'again'}", f"--world_dir={world}", "--domains=sports,weather")
    assert again.returncode == 0, again.stderr[-2000:]
    assert json.loads(again.stdout)["world_generated"] is False
    assert (tmp_path / "again" / "sports.txt").read_text() == (tmp_path / "from_world" / "sports.txt").read_text()


def test_is_eval_end_to_end(tmp_path):
    out = tmp_path / "is"
    result = templm("is-eval", f"--out={out}", "--seed=1", "--ks=1,4", "--temperatures=0.5", "--repeats=2",
                    "--num_docs=3", "--doc_length=8")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "| posterior |" in result.stdout
    data = json.loads((out / "is_eval.json").read_text())
    assert data["config"]["ks"] == [1, 4] and data["config"]["seed"] == 1
    rows = data["rows"]
    assert {r["K"] for r in rows if r["proposal"] != "exact"} == {1, 4}
    assert {r["proposal"] for r in rows} == {"exact", "prior", "tempered(tau=0.5)", "posterior"}
    for r in rows:
        if r["proposal"] == "posterior" and r["level"] == r["latent"]:
            assert r["ppl"] == pytest.approx(r["exact_ppl"], rel=1e-4)  # the exact posterior is exact
    assert (out / "is_eval.png").read_bytes()[:4] == b"\x89PNG" and (out / "is_eval.md").stat().st_size > 0


# -- bad input --------------------------------------------------------------------------------------------------------


def test_bad_input_is_a_message_and_a_non_zero_exit(tmp_path):
    missing = templm("calm", f"--gin_file={GIN}", f"--gin.OUT_DIR='{tmp_path / 'a'}'",
                     f"--gin.templm.run_calm.corpus_dir='{tmp_path / 'no_such_corpus'}'")
    assert missing.returncode == 1
    assert f"{tmp_path / 'no_such_corpus'}: not a directory; expected a CALM corpus" in missing.stderr
    assert "Traceback" not in missing.stderr

    corpus = tmp_path / "corpus"
    calm.build_calm_corpus_from_texts(write_texts(tmp_path / "texts", farm_and_market()), str(corpus), "char")
    os.remove(corpus / "vocab" / "market.vocab")
    no_vocab = templm("calm", f"--gin_file={GIN}", f"--gin.OUT_DIR='{tmp_path / 'b'}'",
                      f"--gin.templm.run_calm.corpus_dir='{corpus}'")
    assert no_vocab.returncode == 1
    assert "market.vocab" in no_vocab.stderr and "class 'market'" in no_vocab.stderr
    assert "Traceback" not in no_vocab.stderr

    misspelt = templm("calm", f"--gin_file={GIN}", f"--gin.OUT_DIR='{tmp_path / 'c'}'",
                      "--gin.templm.run_calm.widow_size=8")
    assert misspelt.returncode == 1 and "widow_size" in misspelt.stderr
    unclosed = templm("calm", f"--gin_file={GIN}", f"--gin.OUT_DIR='{tmp_path / 'c'}'",
                      "--gin.templm.run_calm.domains=['sports'")
    assert unclosed.returncode == 1 and "templm calm: error: gin:" in unclosed.stderr
    assert "Traceback" not in unclosed.stderr
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists() and not (tmp_path / "c").exists()

    neither = templm("data", "calm", f"--out={tmp_path / 'x'}")
    assert neither.returncode == 1 and "exactly one of --world_dir" in neither.stderr
    shutil.rmtree(corpus)
    bad_ks = templm("is-eval", f"--out={tmp_path / 'y'}", "--ks=1,two")
    assert bad_ks.returncode == 1 and "--ks" in bad_ks.stderr
