"""The report of the importance-sampling experiment (`templm.experiments.importance_sampling.run_is_eval`): a
Markdown table of estimated against exact perplexity per latent unit, level, proposal and K, and a PNG figure of
perplexity against K, one panel per (latent unit, level)."""

from __future__ import annotations

import os
from typing import Any, Dict, List, Sequence

from templm.io import atomic_write
from templm.metrics.importance_sampling import LEVELS
from templm.reports.figures import pyplot, save_figure
from templm.reports.tables import fmt_number, markdown_table

TABLE_HEADER = ("latent", "level", "proposal", "K", "ppl", "se", "mc se", "unit se", "exact", "gap %", "runs")


def proposal_labels(rows: List[Dict[str, Any]]) -> List[str]:
    """The proposals of the rows in their order of appearance (the exact value left out)."""
    labels: List[str] = []
    for r in rows:
        if r["proposal"] != "exact" and r["proposal"] not in labels:
            labels.append(r["proposal"])
    return labels


def is_markdown(rows: List[Dict[str, Any]], config: Dict[str, Any]) -> str:
    """The Markdown report: the set-up in a paragraph, then one table line per row."""
    table = []
    for r in rows:
        k = "" if r["K"] is None else str(r["K"])
        gap = None if r["proposal"] == "exact" else 100.0 * (r["ppl"] / r["exact_ppl"] - 1.0)
        gap = 0.0 if gap is not None and abs(gap) < 5e-3 else gap  # no "-0.00" for float noise
        table.append([r["latent"], r["level"], r["proposal"], k, fmt_number(r["ppl"]), fmt_number(r.get("ppl_se")),
                      fmt_number(r.get("ppl_mc_se")), fmt_number(r.get("ppl_unit_se")), fmt_number(r["exact_ppl"]),
                      fmt_number(gap, 2), r.get("runs") or ""])
    lines = [
        "# Importance-sampled perplexity",
        "",
        f"HMM with {config['num_states']} states, vocabulary {config['vocab_size']}; {config['num_docs']} documents, "
        f"{config['num_tokens']} tokens; seed {config['seed']}. `ppl` is exp(-mean L / N) over `runs` independent "
        "runs of K samples (an upper bound on the exact perplexity in expectation); `se` its standard error from the "
        "spread across runs; `mc se` the Monte Carlo standard error one run reports (delta method); `unit se` the "
        "across-unit standard error. `latent` is the model's latent unit (the chain restarts at each), `level` where "
        "the estimate is formed before pooling.",
        "",
        markdown_table(TABLE_HEADER, table, align="lllrrrrrrrr"),
    ]
    return "\n".join(lines) + "\n"


def plot_is_eval(rows: List[Dict[str, Any]], path: str, proposals: Sequence[str]) -> None:
    """Perplexity against K (log scale) with +-2 se bars per proposal, the exact value dashed: a grid of latent unit
    (rows) by aggregation level (columns); panels with a level finer than the latent unit say why they are empty."""
    plt = pyplot()

    fig, axes = plt.subplots(len(LEVELS), len(LEVELS), figsize=(13, 11), squeeze=False)
    colors = {p: plt.get_cmap("tab10")(i) for i, p in enumerate(proposals)}
    for i, latent in enumerate(LEVELS):
        exact = next(r["ppl"] for r in rows if r["latent"] == latent and r["proposal"] == "exact")
        for j, level in enumerate(LEVELS):
            ax = axes[i][j]
            if j < i:
                ax.axis("off")
                ax.text(0.5, 0.5, f"{level} level is finer than\nthe {latent} latent: not an estimate",
                        ha="center", va="center", transform=ax.transAxes, color="0.5")
                continue
            for p in proposals:
                pts = [r for r in rows if r["latent"] == latent and r["level"] == level and r["proposal"] == p]
                ks = [r["K"] for r in pts]
                ppl = [r["ppl"] for r in pts]
                err = [2.0 * (r["ppl_se"] or 0.0) for r in pts]
                ax.errorbar(ks, ppl, yerr=err, marker="o", ms=3, capsize=2, color=colors[p], label=p)
            ax.axhline(exact, color="k", ls="--", lw=1.2, zorder=5, label=f"exact {exact:.3f}")
            ax.set_xscale("log", base=2)
            ax.set_title(f"latent per {latent}, aggregated per {level}", fontsize=9)
            ax.set_xlabel("K (samples)")
            ax.set_ylabel("perplexity (+-2 se)")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
    fig.suptitle("Importance-sampled perplexity against K (stochastic upper bound; dashed: exact, forward algorithm)")
    fig.tight_layout()
    save_figure(fig, path, dpi=90)


def write_is_report(results: Dict[str, Any], out_dir: str) -> Dict[str, str]:
    """Writes out_dir/is_eval.md and out_dir/is_eval.png from `run_is_eval`'s results (each through a temporary file
    renamed into place). Returns {"md": path, "png": path}."""
    os.makedirs(out_dir, exist_ok=True)
    rows = results["rows"]
    paths = {name: os.path.join(out_dir, f"is_eval.{name}") for name in ("md", "png")}
    atomic_write(paths["md"], is_markdown(rows, results["config"]))
    plot_is_eval(rows, paths["png"], proposal_labels(rows))
    return paths
