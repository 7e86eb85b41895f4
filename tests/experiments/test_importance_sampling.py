"""Tests of templm.experiments.importance_sampling: run_is_eval's rows against the exact values and the claims they
show (the prior is poor, a finer valid level is tighter), its JSON; and `templm is-eval` end to end (the experiment,
then the report), with bad input answered by a message and a non-zero exit; `templm is-eval --model=kglm` on a world
folder of the knowledge-graph LM.
"""

import json
import math
import os

import numpy as np
import pytest

from templm.experiments.importance_sampling import run_is_eval, run_latent_is_eval
from templm.metrics.importance_sampling import LEVELS, unit_starts
from templm.models.hmm import forward_log_likelihood
from templm_testing import MINI_DOCS, write_mini_world
from templm_testing import run_templm as templm

S, V, B, T = 4, 6, 4, 8  # the shape of the is_problem fixture (tests/conftest.py)


def _restarts(is_problem, latent):
    return unit_starts(latent, (B, T), is_problem["segment_ids"])


def test_run_is_eval_writes_its_json_and_the_exact_line(tmp_path, is_problem):
    # POOL = 256 * 16 samples per proposal: the same compiled samplers as the other importance-sampling tests.
    result = run_is_eval(str(tmp_path), seed=0, ks=(1, 16, 256), temperatures=(2.0,), repeats=16, num_states=S,
                             vocab_size=V, num_docs=B, doc_length=T)
    assert (tmp_path / "is_eval.json").stat().st_size > 0
    # The JSON only (no temporary files): the Markdown and the figure are the report's (tests/reports).
    assert sorted(p.name for p in tmp_path.iterdir()) == [".templm.json", "is_eval.json"]  # the folder's marker
    assert result["files"] == {"json": str(tmp_path / "is_eval.json")}
    saved = json.loads((tmp_path / "is_eval.json").read_text())
    assert saved["rows"] == result["rows"]
    assert saved["config"] == result["config"]
    assert saved["config"]["num_tokens"] == int(np.sum(is_problem["token_counts"]))

    rows = result["rows"]
    n = int(np.asarray(is_problem["token_counts"]).sum())
    for latent in LEVELS:
        exact_rows = [r for r in rows if r["latent"] == latent and r["proposal"] == "exact"]
        assert len(exact_rows) == 1
        log_p = float(forward_log_likelihood(is_problem["hmm"], is_problem["tokens"], is_problem["token_counts"],
                                                 _restarts(is_problem, latent)).sum())
        assert exact_rows[0]["log_likelihood"] == pytest.approx(log_p, abs=1e-4)
        assert exact_rows[0]["ppl"] == pytest.approx(math.exp(-log_p / n), rel=1e-6)
        # Rows for the valid levels only (as coarse as the latent unit or coarser), every proposal, every K.
        levels = {r["level"] for r in rows if r["latent"] == latent and r["proposal"] != "exact"}
        assert levels == set(LEVELS[LEVELS.index(latent):])
        for r in rows:
            if r["latent"] == latent and r["proposal"] == "posterior":
                assert r["ppl"] == pytest.approx(exact_rows[0]["ppl"], rel=1e-4)
    assert {r["K"] for r in rows if r["K"] is not None} == {1, 16, 256}
    assert {r["proposal"] for r in rows} == {"exact", "prior", "tempered(tau=2)", "posterior"}
    by = {(r["latent"], r["level"], r["proposal"], r["K"]): r for r in rows}
    # The prior is a poor proposal for 4-8 token documents: clearly above the exact perplexity at K = 1.
    r = by[("document", "document", "prior", 1)]
    assert r["ppl"] > r["exact_ppl"] + 3 * r["ppl_se"]
    # Same samples, finer valid level: per-sentence estimates average before multiplying, a tighter bound.
    sent, doc = by[("sentence", "sentence", "prior", 16)], by[("sentence", "document", "prior", 16)]
    assert sent["ppl"] < doc["ppl"]


@pytest.mark.e2e
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
    # The verb prints the report it wrote; progress goes to standard error, one line per latent unit and proposal.
    assert result.stdout == (out / "is_eval.md").read_text() + "\n"
    assert "is-eval: [9/9] latent=document proposal=posterior done" in result.stderr
    assert sorted(p.name for p in out.iterdir()) == [".templm.json", "is_eval.json", "is_eval.md", "is_eval.png"]


@pytest.mark.e2e
def test_is_eval_bad_input_is_a_message_and_a_non_zero_exit(tmp_path):
    """Each flag is checked when it is parsed, before any work: one line naming it, the usage status (2). The
    number of states was a 74.5 GiB allocation error from numpy at 100000, an infinite peakedness 'Probabilities
    contain NaN', 0 states 'zero-size array ...'."""
    cases = [("--ks=1,two", "--ks must be a comma-separated list of whole numbers of at least 1"),
             ("--temperatures=0.5,-1", "--temperatures must be a comma-separated list of finite numbers above 0"),
             ("--num_states=0", "--num_states must be from 1 to 4096"),
             ("--num_states=100000", "--num_states must be from 1 to 4096"),
             ("--peakedness=inf", "--peakedness must be a finite number at least 0"),
             ("--doc_length=1", "--doc_length must be at least 2")]
    for flag, message in cases:
        result = templm("is-eval", f"--out={tmp_path / 'z'}", flag)
        assert result.returncode == 2 and message in result.stderr, (flag, result.stderr[-1000:])
        assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "z").exists()


@pytest.mark.e2e
def test_is_eval_of_the_knowledge_graph_lm_end_to_end(tmp_path):
    """`templm is-eval --model=kglm` on a world folder: both networks trained, every proposal, level and K estimated,
    the per-document estimates adding up to each row's estimate, the exact check on the prefixes, the four effects
    as findings, the report printed."""
    docs = [(f"{doc_id}-{i}", *rest) for i in range(8) for doc_id, *rest in MINI_DOCS]
    world = write_mini_world(tmp_path / "world", docs=docs)
    out = tmp_path / "is"
    result = templm("is-eval", "--model=kglm", f"--out={out}", f"--world_dir={world}", "--ks=1,2", "--repeats=2",
                    "--test_docs=4", "--train_steps=8", "--exact_sentences=1")
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads((out / "is_eval.json").read_text())
    assert data["config"]["model"] == "kglm" and data["config"]["train_docs"] == 20
    assert data["per_document"]["ids"] == ["d3-6", "d1-7", "d2-7", "d3-7"]
    labels = ["text", "text, tau=0.5", "text, tau=2", "gold"]
    assert [p["label"] for p in data["per_document"]["proposals"]] == labels
    assert len(data["rows"]) == len(labels) * len(LEVELS) * 2
    for row in data["rows"]:
        per_doc = data["per_document"]["estimates"][row["proposal"]][row["level"]][str(row["K"])]
        assert sum(per_doc) == pytest.approx(row["log_likelihood"], rel=1e-9)
        assert row["runs"] == 4 // row["K"]
    check = data["exact_check"]
    assert check["documents"] == 4 and [r["K"] for r in check["rows"]] == [1, 2]
    assert check["exact_ppl"] > 1 and all(r["ppl"] > 1 for r in check["rows"])
    assert list(data["findings"]) == ["is_tightens_with_k", "is_token_level_optimistic",
                                      "is_flatter_proposal_tighter", "is_gold_proposal_tighter"]
    for finding in data["findings"].values():
        assert finding["n"] == 4 and finding["verdict"] in ("appears", "opposite", "inconclusive")
    assert sorted(p.name for p in out.iterdir()) == [".templm.json", "is_eval.json", "is_eval.md", "is_eval.png",
                                                     "model", "proposal"]
    assert result.stdout == (out / "is_eval.md").read_text() + "\n"
    assert "## The effects" in result.stdout and "| gold | document | 2 |" in result.stdout
    assert "is-eval: [5/5] exact check on 4 of 4 prefixes of 1 sentence(s)" in result.stderr
    missing = templm("is-eval", "--model=kglm", f"--out={tmp_path / 'z'}", f"--world_dir={tmp_path / 'nowhere'}")
    assert missing.returncode == 1 and "no world.json" in missing.stderr and "nowhere" in missing.stderr
    assert "Traceback" not in missing.stderr
    weight = templm("is-eval", "--model=kglm", f"--out={tmp_path / 'z'}", "--gold_weight=1")
    assert weight.returncode == 2 and "--gold_weight must be a finite number from 0 to 0.999" in weight.stderr


def test_settings_that_together_exceed_the_memory_are_refused_before_any_work(tmp_path):
    """`is-eval --ks 9999999999999` aborted after 51 s with a C++ stack (exit 134), and flag values each in range
    exhausted memory together: the memory they imply is computed from them and refused, naming them, before anything
    is allocated or written."""
    from templm.errors import ConfigError

    with pytest.raises(ConfigError, match=r"--ks \(largest 9,999,999,999,999\) x --repeats 8 samples of --num_docs "
                                          r"12 documents .* TiB, more than half of this machine's"):
        run_is_eval(str(tmp_path / "hmm"), ks=[9_999_999_999_999])
    with pytest.raises(ConfigError, match=r"--repeats 4 samples of --test_docs 40 documents: about .* more than half"):
        run_latent_is_eval(str(tmp_path / "kglm"), ks=[2 ** 40])
    assert not os.listdir(tmp_path)
