"""The report of `templm appendices` (templm.experiments.appendices): report.md with the findings and a table per
appendix, and the paper's figures: appendix_b.png (the relative increase by test month for each shifted test
period, Figure 8) and appendix_c.png (word perplexity against the distance between the training set and the test
period, with the CONTROL model's, Figure 9)."""

from __future__ import annotations

import math
from typing import Any, Dict, Mapping

import numpy as np

from templm import paths as storage  # `paths` names the files the report writes
from templm.io import atomic_write
from templm.reports.figures import pyplot, save_figure
from templm.reports.tables import finding_line, fmt_number, fmt_percent, markdown_table


def _document_interval(values) -> tuple:
    """exp of the mean per-document log word perplexity and its 95 % interval (t over the documents)."""
    x = np.asarray(values, np.float64)
    mean = float(x.mean())
    half = 1.96 * float(x.std(ddof=1)) / math.sqrt(len(x)) if len(x) > 1 else float("nan")
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def appendices_markdown(results: Mapping[str, Any]) -> str:
    config = results["config"]
    lines = ["# Mind the Gap's appendices", "",
             f"Preset `{config['preset']}`, seed {config['seed']}"
             + (f", corpus {config['corpus']}" if config.get("corpus") else ", the embedded world")
             + f"; static Transformer-XL models of {config['train_steps']} steps each.", "",
             "## Findings", "", *[finding_line(f) for f in (results.get("findings") or {}).values()], ""]
    if results.get("periods"):
        rows = [[p["shift_years"], p["cutoff"], f"{p['months'][0]}..{p['months'][-1]}",
                 fmt_number(p["word_ppl"]["time_stratified"], 2), fmt_number(p["word_ppl"]["control"], 2),
                 fmt_percent(p["relative_increase"], 1), fmt_number(100 * p["slope"], 2),
                 p["findings"]["streaming_gap"]["verdict"]] for p in results["periods"]]
        lines += ["## Appendix B: shifted test periods (Figure 8)", "",
                  "Each test period with its own TIME-STRATIFIED and CONTROL splits, tokenizers and models.", "",
                  markdown_table(("shift (years)", "cut-off", "test months", "TIME-STRATIFIED word ppl",
                                  "CONTROL word ppl", "relative increase", "slope (points/month)", "gap"),
                                 rows, align="rllrrrrl"),
                  "", "![relative increase by month](figures/appendix_b.png)", ""]
    distance = results.get("distance")
    if distance:
        rows = []
        for g in distance["gaps"]:
            ppl, low, high = _document_interval(distance["documents"][str(g)])
            rows.append([g, distance["ends"][str(g)], fmt_number(distance["word_ppl"][str(g)], 2),
                         f"{fmt_number(ppl, 2)} [{fmt_number(low, 2)}, {fmt_number(high, 2)}]",
                         fmt_percent(distance["word_ppl"][str(g)] / distance["control_word_ppl"] - 1.0, 1)])
        lines += ["## Appendix C: increasing distance from the test period (Figure 9)", "",
                  f"Training sets of {distance['size']} documents each, ending the given months before the cut-off "
                  f"{distance['cutoff']}; every model scored on the same test stream, CONTROL word perplexity "
                  f"{fmt_number(distance['control_word_ppl'], 2)}. The per-document column is exp of the mean "
                  f"per-document log word perplexity with its 95 % interval over the "
                  f"{len(distance['documents'][str(distance['gaps'][0])])} test documents.", "",
                  markdown_table(("distance (months)", "training ends", "word ppl", "per-document (95 % interval)",
                                  "over CONTROL"), rows, align="rlrrr"),
                  "", "![perplexity against distance](figures/appendix_c.png)", ""]
    return "\n".join(lines)


def appendix_b_png(results: Mapping[str, Any], path: str) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for p in results["periods"]:
        months = sorted(p["relative_per_month"])
        ax.plot(range(1, len(months) + 1), [100 * p["relative_per_month"][m] for m in months], marker="o", ms=3,
                label=f"test {months[0]}..{months[-1]} (cut-off {p['cutoff']}), overall "
                      f"{100 * p['relative_increase']:+.1f} %")
    ax.axhline(0.0, color="k", lw=0.8)
    ax.set_xlabel("test month (1 = the first month after validation)")
    ax.set_ylabel("word perplexity over CONTROL's (%)")
    ax.set_title("Appendix B: relative increase by month, each shifted test period")
    ax.grid(True, alpha=0.3)
    fig.legend(loc="lower center", ncol=1, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.06 + 0.05 * len(results["periods"]), 1, 1))
    save_figure(fig, path, dpi=90)


def appendix_c_png(results: Mapping[str, Any], path: str) -> None:
    plt = pyplot()
    distance = results["distance"]
    gaps = distance["gaps"]
    points = [_document_interval(distance["documents"][str(g)]) for g in gaps]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.errorbar(gaps, [p[0] for p in points], yerr=[[p[0] - p[1] for p in points], [p[2] - p[0] for p in points]],
                marker="o", capsize=3, label=f"TIME-STRATIFIED models, {distance['size']} training documents each")
    ax.axhline(distance["control_word_ppl"], color="k", ls="--", lw=1.0, label="CONTROL (overall word perplexity)")
    n = len(distance["documents"][str(gaps[0])])
    ax.set_xlabel("months between the end of the training set and the cut-off")
    ax.set_ylabel("word perplexity (95 % interval)")
    ax.set_title(f"Appendix C: perplexity against the distance from the test period\n(exp of the mean per-document "
                 f"log word perplexity over n={n} test documents)", fontsize=10)
    ax.grid(True, alpha=0.3)
    fig.legend(loc="lower center", ncol=2, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    save_figure(fig, path, dpi=90)


def write_appendices_report(results: Mapping[str, Any], out_dir: str) -> Dict[str, str]:
    """out_dir/report.md and out_dir/figures/appendix_{b,c}.png (those the results hold), each written through a
    temporary file. Returns {name: path}."""
    figures = storage.join(out_dir, "figures")
    storage.makedirs(figures)
    paths = {"report.md": storage.join(out_dir, "report.md")}
    if results.get("periods"):
        paths["appendix_b.png"] = storage.join(figures, "appendix_b.png")
        appendix_b_png(results, paths["appendix_b.png"])
    if results.get("distance"):
        paths["appendix_c.png"] = storage.join(figures, "appendix_c.png")
        appendix_c_png(results, paths["appendix_c.png"])
    atomic_write(paths["report.md"], appendices_markdown(results))
    return paths
