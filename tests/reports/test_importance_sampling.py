"""Tests of templm.reports.importance_sampling: is_eval.md and is_eval.png from a results dict of the shape
`run_is_eval` or `run_latent_is_eval` returns (built here by hand, so the expected table lines are known), written
atomically."""

from templm.metrics.importance_sampling import LEVELS
from templm.reports.importance_sampling import is_markdown, latent_markdown, proposal_labels, write_is_report

PROPOSALS = {"prior": 1.5, "tempered(tau=2)": 1.2, "posterior": 1.0}  # ppl at K = 1 as a multiple of the exact one
KS = (1, 16, 256)


def _results():
    rows = []
    for i, latent in enumerate(LEVELS):
        exact = 10.0 + i
        rows.append({"latent": latent, "level": "-", "proposal": "exact", "temperature": None, "K": None,
                     "ppl": exact, "ppl_se": None, "ppl_mc_se": None, "ppl_unit_se": None, "log_likelihood": -20.0,
                     "exact_ppl": exact, "exact_log_likelihood": -20.0, "mean_ess_fraction": None, "runs": None})
        for label, factor in PROPOSALS.items():
            for level in LEVELS[i:]:
                for k in KS:
                    # The posterior one ulp-ish below the exact value: float noise, shown as a 0.00 % gap.
                    ppl = exact * (1.0 - 1e-9) if label == "posterior" else exact * (1.0 + (factor - 1.0) / k)
                    rows.append({"latent": latent, "level": level, "proposal": label,
                                 "temperature": 2.0 if label.startswith("tempered") else None, "K": k, "ppl": ppl,
                                 "ppl_se": 0.01 / k, "ppl_mc_se": None if k == 1 else 0.02,
                                 "ppl_unit_se": 0.3, "log_likelihood": -21.0, "exact_ppl": exact,
                                 "exact_log_likelihood": -20.0, "mean_ess_fraction": 0.5, "runs": 4096 // k})
    config = {"seed": 0, "ks": list(KS), "temperatures": [2.0], "repeats": 16, "num_states": 4, "vocab_size": 6,
              "num_docs": 4, "doc_length": 8, "mean_sentence_length": 6.0, "peakedness": 1.5, "num_tokens": 26,
              "samples_per_proposal": 4096, "seconds": 1.0}
    return {"config": config, "rows": rows, "files": {"json": "is_eval.json"}}


def test_write_is_report_writes_the_table_and_the_figure(tmp_path):
    results = _results()
    paths = write_is_report(results, str(tmp_path))
    assert paths == {"md": str(tmp_path / "is_eval.md"), "png": str(tmp_path / "is_eval.png")}
    for name in ("is_eval.md", "is_eval.png"):
        assert (tmp_path / name).stat().st_size > 0
    assert (tmp_path / "is_eval.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["is_eval.md", "is_eval.png"]  # no temp files
    md = (tmp_path / "is_eval.md").read_text()
    assert md == is_markdown(results["rows"], results["config"])
    assert "| latent | level | proposal | K |" in md and "| document | - | exact |" in md


def test_markdown_lines():
    results = _results()
    md = is_markdown(results["rows"], results["config"])
    lines = md.splitlines()
    assert lines[0] == "# Importance-sampled perplexity"
    assert "HMM with 4 states, vocabulary 6; 4 documents, 26 tokens; seed 0." in lines[2]
    assert lines[4] == "| latent | level | proposal | K | ppl | se | mc se | unit se | exact | gap % | runs |"
    assert lines[5] == "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    assert lines[6] == "| token | - | exact |  | 10.000 |  |  |  | 10.000 |  |  |"
    # K = 1: no Monte Carlo s.e. (one sample), a 50 % gap for the prior.
    assert "| token | token | prior | 1 | 15.000 | 0.010 |  | 0.300 | 10.000 | 50.00 | 4096 |" in lines
    assert "| sentence | document | tempered(tau=2) | 256 | 11.009 | 0.000 | 0.020 | 0.300 | 11.000 | 0.08 | 16 |" \
        in lines
    # Float noise below the exact value is a 0.00 gap, never -0.00.
    assert "| document | document | posterior | 256 | 12.000 | 0.000 | 0.020 | 0.300 | 12.000 | 0.00 | 16 |" in lines
    assert "-0.00" not in md
    assert len(lines) == 6 + len(results["rows"]) and md.endswith(" |\n")


def test_proposal_labels_in_order_of_appearance():
    assert proposal_labels(_results()["rows"]) == ["prior", "tempered(tau=2)", "posterior"]


def _latent_results():
    rows = [{"level": level, "proposal": p, "temperature": 1.0, "gold_weight": 0.0, "K": k, "ppl": 10.0 + 1.0 / k,
             "ppl_se": 0.05, "ppl_mc_se": None if k == 1 else 0.02, "ppl_unit_se": 0.3, "log_likelihood": -100.0,
             "mean_ess_fraction": 0.25, "runs": 8 // k}
            for p in ("text", "gold") for level in LEVELS for k in (1, 8)]
    finding = {"claim": "more samples tighten the estimate", "verdict": "appears", "test": "paired bootstrap",
               "evidence": "perplexity 10.125 vs 11.000"}
    check = {"sentences": 2, "limit": 4096, "documents": 3, "tokens": 40, "exact_ppl": 9.5,
             "rows": [{"K": 1, "ppl": 9.975, "ppl_se": 0.01, "runs": 8}, {"K": 8, "ppl": 9.5, "ppl_se": None,
                                                                         "runs": 1}]}
    config = {"model": "kglm", "seed": 3, "test_docs": 5, "train_docs": 20, "train_steps": 40, "num_tokens": 300,
              "samples_per_proposal": 8, "parameters": {"model": 1000, "proposal": 900},
              "train": {"model": {"loss": 2.5}, "proposal": {"loss": 0.01}}, "ks": [1, 8]}
    return {"config": config, "rows": rows, "exact_check": check, "findings": {"is_tightens_with_k": finding}}


def test_the_knowledge_graph_lm_report(tmp_path):
    results = _latent_results()
    paths = write_is_report(results, str(tmp_path))
    md = (tmp_path / "is_eval.md").read_text()
    assert md == latent_markdown(results) and (tmp_path / "is_eval.png").read_bytes()[:4] == b"\x89PNG"
    lines = md.splitlines()
    assert lines[0] == "# Importance-sampled perplexity of a knowledge-graph LM"
    assert "with 1000 parameters and its proposal (900, a bidirectional tagger), both trained 40 steps" in lines[2]
    assert "- More samples tighten the estimate: **appears** (paired bootstrap). perplexity 10.125 vs 11.000." \
        in lines
    assert "| proposal | level | K | ppl | se | mc se | ESS % | runs |" in lines
    assert "| gold | sentence | 8 | 10.125 | 0.050 | 0.020 | 25.0 | 1 |" in lines
    assert "| 1 | 9.9750 | 0.0100 | 5.00 | 8 |" in lines and "| 8 | 9.5000 |  | 0.00 | 1 |" in lines
    assert sorted(p.name for p in tmp_path.iterdir()) == ["is_eval.md", "is_eval.png"] and paths["md"].endswith(".md")
