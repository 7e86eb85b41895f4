"""The reports of the importance-sampling experiments (`templm.experiments.importance_sampling`): is_eval.md and
is_eval.png. For the HMM (`run_is_eval`): a Markdown table of estimated against exact perplexity per latent unit,
level, proposal and K, and perplexity against K, one panel per (latent unit, level). For the knowledge-graph LM
(`run_latent_is_eval`): the four effects as findings, the table per proposal, level and K, the exact check on short
prefixes, and perplexity against K, one panel per aggregation level plus the exact check."""

from __future__ import annotations

from typing import Any, Dict, List, Sequence

from templm import paths as storage  # `paths` names the files the report writes
from templm.io import atomic_write
from templm.metrics.importance_sampling import LEVELS
from templm.reports.figures import pyplot, save_figure
from templm.reports.tables import finding_line, fmt_number, markdown_table

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


LATENT_HEADER = ("proposal", "level", "K", "ppl", "se", "mc se", "ESS %", "runs")


def latent_markdown(results: Dict[str, Any]) -> str:
    """The knowledge-graph LM's report: set-up, findings, the estimates and the exact check."""
    config, rows, check = results["config"], results["rows"], results.get("exact_check") or {}
    table = [[r["proposal"], r["level"], r["K"], fmt_number(r["ppl"]), fmt_number(r.get("ppl_se")),
              fmt_number(r.get("ppl_mc_se")), fmt_number(100.0 * r["mean_ess_fraction"], 1), r["runs"]]
             for r in rows]
    train = config.get("train") or {}
    lines = [
        "# Importance-sampled perplexity of a knowledge-graph LM",
        "",
        f"The knowledge-graph LM (latent entity mentions: each name read as words, or as a mention of an entity new to "
        f"the document or reached through the graph from one it mentioned) with {config['parameters']['model']} "
        f"parameters and its proposal ({config['parameters']['proposal']}, a bidirectional tagger), both trained "
        f"{config['train_steps']} steps on the gold annotations of {config['train_docs']} documents (final losses: "
        f"model {fmt_number((train.get('model') or {}).get('loss'))} nats/token, proposal "
        f"{fmt_number((train.get('proposal') or {}).get('loss'), 4)} nats/decision); evaluated on the world's latest "
        f"{config['test_docs']} documents ({config['num_tokens']} tokens), {config['samples_per_proposal']} samples a "
        f"document and proposal; seed {config['seed']}. `ppl` is exp(-mean L / N) over `runs` independent runs of K "
        "samples (a stochastic upper bound); `se` its standard error across runs; `mc se` what one run's weights "
        "say (delta method); `ESS %` the effective sample size as a share of K. The model's latent unit is the "
        "document: the token and sentence levels aggregate finer than it and estimate no marginal at all.",
        "",
        "## The effects",
        "",
        *[finding_line(f) for f in (results.get("findings") or {}).values()],
        "",
        "## Estimates",
        "",
        markdown_table(LATENT_HEADER, table, align="llrrrrrr"),
        "",
    ]
    if check.get("rows"):
        lines += [
            "## Exact check",
            "",
            f"The first {check['sentences']} sentence(s) of {check['documents']} test documents ({check['tokens']} "
            f"tokens), whose readings can be listed (at most {check['limit']}): exact perplexity "
            f"{check['exact_ppl']:.4f}; the trained proposal's document-level estimate at each K:",
            "",
            markdown_table(("K", "ppl", "se", "above exact %", "runs"),
                           [[r["K"], fmt_number(r["ppl"], 4), fmt_number(r.get("ppl_se"), 4),
                             fmt_number(100.0 * (r["ppl"] / check["exact_ppl"] - 1.0), 2), r["runs"]]
                            for r in check["rows"]], align="rrrrr"),
            "",
        ]
    return "\n".join(lines)


def plot_latent_is_eval(results: Dict[str, Any], path: str) -> None:
    """Perplexity against K (log scale) with +-2 se bars, one line per proposal: a panel per aggregation level,
    then the exact check (the estimate on short prefixes against their exact perplexity, dashed). The legend sits
    under the panels, outside the data."""
    plt = pyplot()
    rows = results["rows"]
    check = results.get("exact_check") or {}
    proposals = proposal_labels(rows)
    panels = list(LEVELS) + (["exact"] if check.get("rows") else [])
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4.4), squeeze=False)
    colors = {p: plt.get_cmap("tab10")(i) for i, p in enumerate(proposals)}
    n_docs = results["config"]["test_docs"]
    for ax, panel in zip(axes[0], panels):
        if panel == "exact":
            pts = check["rows"]
            ax.errorbar([r["K"] for r in pts], [r["ppl"] for r in pts],
                        yerr=[2.0 * (r["ppl_se"] or 0.0) for r in pts], marker="o", ms=3, capsize=2,
                        color=colors[proposals[0]])
            ax.axhline(check["exact_ppl"], color="k", ls="--", lw=1.2, label="exact (every reading summed)")
            ax.set_title(f"exact check, the trained proposal\n{check['documents']} prefixes of "
                         f"{check['sentences']} sentence(s)", fontsize=9)
        else:
            for p in proposals:
                pts = [r for r in rows if r["level"] == panel and r["proposal"] == p]
                ax.errorbar([r["K"] for r in pts], [r["ppl"] for r in pts],
                            yerr=[2.0 * (r["ppl_se"] or 0.0) for r in pts], marker="o", ms=3, capsize=2,
                            color=colors[p], label=f"proposal: {p}")
            finer = "" if panel == "document" else ", finer than the latent unit"
            ax.set_title(f"aggregated per {panel}{finer}\n{n_docs} documents", fontsize=9)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("K (samples per estimate)")
        ax.set_ylabel("perplexity per token (+-2 se over runs)")
        ax.grid(True, which="both", alpha=0.3)
    handles, labels = [], []
    for ax in axes[0]:
        for h, label in zip(*ax.get_legend_handles_labels()):
            if label not in labels:
                handles.append(h)
                labels.append(label)
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 5), fontsize=8, frameon=False)
    fig.suptitle("Importance-sampled perplexity of the knowledge-graph LM against K (a stochastic upper bound)")
    fig.tight_layout(rect=(0, 0.08, 1, 0.95))
    save_figure(fig, path, dpi=90)


def write_is_report(results: Dict[str, Any], out_dir: str) -> Dict[str, str]:
    """Writes out_dir/is_eval.md and out_dir/is_eval.png from the results of `run_is_eval` or, when
    results["config"]["model"] is "kglm", of `run_latent_is_eval` (each through a temporary file renamed into
    place). Returns {"md": path, "png": path}."""
    storage.makedirs(out_dir)
    rows = results["rows"]
    paths = {name: storage.join(out_dir, f"is_eval.{name}") for name in ("md", "png")}
    if results["config"].get("model") == "kglm":
        atomic_write(paths["md"], latent_markdown(results))
        plot_latent_is_eval(results, paths["png"])
    else:
        atomic_write(paths["md"], is_markdown(rows, results["config"]))
        plot_is_eval(rows, paths["png"], proposal_labels(rows))
    return paths
