"""The streaming-perplexity report ("Mind the Gap"): Markdown tables and PNG figures from a stream's results dict.

Two writers, both from numbers the experiment already computed (templm.experiments.streaming):

  * `write_stream_report(results, out_dir)`: the report of one `templm stream` run, beside its results.json:
    report.md (the expected findings with their verdicts, perplexity overall and per month, subword and word level,
    the relative increase over CONTROL and its slope, emerging words, first and later occurrences, topics, parts of
    speech), relative_perplexity.png and emerging_words.png;
  * `streaming_section(summary, figures_dir)`: the section of the reproduction's report on the Transformer-XL half:
    the headline numbers and the two figures drawn into figures_dir from the stream's results.json (the findings
    are listed with the time-aware half's, in the report's findings section).
"""

from __future__ import annotations

import io
import json
import math
import os
from typing import Any, Dict, Mapping, Optional

import numpy as np

from templm import console, paths
from templm.data.token_stream import month_number
from templm.io import atomic_write, jsonable
from templm.metrics.stream import LARGER_MODEL_RUN, OCCURRENCE_CATEGORIES, relative_increase
from templm.reports.tables import finding_line, fmt_number, fmt_percent, markdown_table

# The figures of one run: file name in a stream report, file name among the reproduction's figures, title.
_FIGURES = (("relative_perplexity.png", "stream_relative_perplexity.png", "Relative perplexity by month"),
            ("emerging_words.png", "stream_emerging_words.png", "Emerging words"))


def _fmt(value: Any) -> str:
    return fmt_number(value, 2, missing="-")


# ----------------------------------------------------------------------------------------------------------------
# report.md of one run.


def stream_markdown(results: Mapping[str, Any]) -> str:
    """report.md of one stream run, from its JSON-able results (as results.json holds them)."""
    primary, baseline = results.get("primary", "time_stratified"), results.get("baseline", "control")
    runs = results.get("runs", {})
    out = ["# Streaming perplexity", ""]
    settings = results.get("settings", {})
    if settings:
        out += ["Settings: " + ", ".join(f"{k}={v}" for k, v in settings.items()), ""]

    findings = results.get("findings") or {}
    if findings:
        out += ["## Expected findings", ""] + [finding_line({"name": name, **f}) for name, f in findings.items()] + [""]
    out += ["## Overall", ""]
    rows = [[name, mode, _fmt(a["overall"]["subword_ppl"]), _fmt(a["overall"]["word_ppl"]),
             a["overall"]["n_tokens"], a["overall"]["n_words"]]
            for name, by_mode in runs.items() for mode, a in by_mode.items()]
    out += [markdown_table(["run", "mode", "subword ppl", "word ppl", "tokens", "words"], rows), ""]
    if results.get("inputs", {}).get("shared_tokenizer") is False:
        out += ["Each run reads the stream with its own SentencePiece model (trained on its own training split, as "
                "in the paper): subword perplexities are each tokenizer's own, so the runs are compared by word "
                "perplexity.", ""]
    if results.get("tokenizer_comparison"):
        out += ["## Outdated tokenizer (the paper's Appendix E)", "",
                f"TIME-STRATIFIED with its own tokenizer against the same setup trained with CONTROL's tokenizer "
                f"(run `{results['tokenizer_comparison'].get('run')}`):", "",
                finding_line(results["tokenizer_comparison"]), ""]

    relative = results.get("relative", {})
    for level in ("word", "subword"):
        out += [f"## Perplexity per month ({level} level)", ""]
        header = ["month"]
        cols = []
        for name, by_mode in runs.items():
            for mode in by_mode:
                header.append(f"{name} {mode}")
                cols.append((name, mode))
        if level == "word":
            header += [f"relative {mode}" for mode in relative]
        rows = []
        for m in results.get("months", []):
            row = [m] + [_fmt(runs[n][md]["by_month"].get(m, {}).get(f"{level}_ppl")) for n, md in cols]
            if level == "word":
                row += [fmt_percent(relative[mode]["per_month"].get(m)) for mode in relative]
            rows.append(row)
        out += [markdown_table(header, rows), ""]
    if relative:
        out += [f"Relative increase = (ppl {primary} - ppl {baseline} static) / ppl {baseline} static, word level; "
                "least-squares line over months:", ""]
        out += [markdown_table(["mode", "slope per month", "intercept"],
                               [[mode, fmt_percent(r["slope"]), fmt_percent(r["intercept"])]
                                for mode, r in relative.items()]), ""]

    emerging = results.get("emerging")
    if emerging is not None:
        out += [f"## Emerging words (>= {emerging['min_test_count']} test occurrences, unseen in training or "
                f">= {emerging['ratio']}x rarer there)", ""]
        perp = emerging["perplexity"]
        out += ["Pooled word perplexity: " + ", ".join(
            f"{mode} {_fmt(p['overall']['ppl'])} over {p['overall']['n']} occurrences" for mode, p in perp.items()),
            ""]
        rows = [[w["word"], w["train_count"], w["test_count"]] +
                [_fmt(perp[mode]["per_word"].get(w["word"], {}).get("ppl")) for mode in perp]
                for w in emerging["words"]]
        out += [markdown_table(["word", "train count", "test count"] + [f"ppl {mode}" for mode in perp], rows), ""]

    for key, title in (("occurrences_emerging", "## First and later occurrences of an emerging word in a document "
                                                "(the paper's Table 4)"),
                       ("occurrences", "## First and later occurrences of any word in a document")):
        occ = results.get(key)
        if not occ:
            continue
        out += [title, ""]
        occ_modes = list(occ)
        rows = [[c, occ[occ_modes[0]][c]["n"]] + [_fmt(occ[mode][c]["ppl"]) for mode in occ_modes]
                for c in OCCURRENCE_CATEGORIES]
        out += [markdown_table(["occurrence", "words"] + [f"ppl {mode}" for mode in occ_modes], rows), ""]

    topics = results.get("topics")
    if topics:
        out += ["## Perplexity per topic (LDA, word level)", ""]
        perp = topics["perplexity"]
        relative = topics.get("relative") or {}
        t_modes = list(perp)

        def topic(table, k):
            return table.get(k, table.get(str(k)))

        rows = []
        for k, words in enumerate(topics["top_words"]):
            first = topic(perp[t_modes[0]], k)
            if not first:
                continue
            rows.append([k, " ".join(words), first["n_docs"], first["n_words"]] +
                        [_fmt(topic(perp[mode], k)["word_ppl"]) for mode in t_modes] +
                        [fmt_percent(topic(relative[mode], k), 1) for mode in relative])
        out += [markdown_table(["topic", "top words", "docs", "words"] + [f"ppl {mode}" for mode in t_modes]
                               + [f"relative {mode}" for mode in relative], rows), ""]
        if relative:
            out += ["relative: the increase of the TIME-STRATIFIED word perplexity over CONTROL's (static) on the "
                    "topic's documents (the paper's Figures 3-4).", ""]

    pos = results.get("pos")
    if pos is not None:
        out += ["## Perplexity per part of speech", ""]
        if "skipped" in pos:
            out += [f"Skipped: {pos['skipped']}.", ""]
        else:
            perp = pos["perplexity"]
            relative = pos.get("relative") or {}
            p_modes = list(perp)
            tags = sorted(perp[p_modes[0]])
            out += [markdown_table(["POS", "words"] + [f"ppl {mode}" for mode in p_modes]
                                   + [f"relative {mode}" for mode in relative],
                                   [[t, perp[p_modes[0]][t]["n"]] + [_fmt(perp[mode][t]["ppl"]) for mode in p_modes]
                                    + [fmt_percent(relative[mode].get(t), 1) for mode in relative]
                                    for t in tags]), ""]
    return "\n".join(out)


# ----------------------------------------------------------------------------------------------------------------
# Figures (PNG bytes, None when the results hold nothing to draw).


def _png(fig: Any) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    return buffer.getvalue()


def relative_perplexity_png(results: Mapping[str, Any]) -> Optional[bytes]:
    """The relative increase over CONTROL per test month, one line per mode with its least-squares fit."""
    relative = dict(results.get("relative") or {})
    if not relative:
        return None
    runs, baseline = results.get("runs") or {}, results.get("baseline", "control")
    if LARGER_MODEL_RUN in runs and baseline in runs:  # the model-size comparison (Mind the Gap, Figure 5)
        per_month, slope, intercept = relative_increase(
            *({m: v["word_ppl"] for m, v in runs[k]["static"]["by_month"].items()} for k in (LARGER_MODEL_RUN,
                                                                                              baseline)))
        relative["larger model, static"] = {"per_month": per_month, "slope": slope, "intercept": intercept}
    # matplotlib: heavy, loaded only when a figure is drawn.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for mode, r in relative.items():
        months = sorted(r["per_month"], key=month_number)
        if not months:
            continue
        x = np.array([month_number(m) - month_number(months[0]) for m in months], np.float64)
        y = np.array([100 * (r["per_month"][m] if r["per_month"][m] is not None else np.nan) for m in months])
        line, = ax.plot(x, y, marker="o", label=f"{mode}")
        if r.get("slope") is not None and math.isfinite(r["slope"]):
            ax.plot(x, 100 * (r["intercept"] + r["slope"] * x), linestyle="--", color=line.get_color(),
                    label=f"{mode} fit ({100 * r['slope']:+.2f}%/month)")
        ax.set_xticks(x)
        ax.set_xticklabels(months, rotation=45, ha="right", fontsize=7)
    ax.axhline(0.0, color="grey", linewidth=0.5)
    ax.set_ylabel("word perplexity over CONTROL's (%)")
    n = (results.get("settings") or {}).get("n_documents")
    ax.set_title("TIME-STRATIFIED vs CONTROL, per test month" + (f" ({n} test documents)" if n else ""))
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)  # outside the data
    fig.tight_layout()
    return _png(fig)


def emerging_words_png(results: Mapping[str, Any], max_words: int = 20) -> Optional[bytes]:
    """Word perplexity of the (at most `max_words` most frequent) emerging words, one bar per mode."""
    emerging = results.get("emerging")
    if not emerging or not emerging["words"]:
        return None
    # matplotlib: heavy, loaded only when a figure is drawn.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    words = [w["word"] for w in emerging["words"][:max_words]]
    perp = emerging["perplexity"]
    fig = Figure(figsize=(max(5, 0.45 * len(words) + 2), 4))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    width = 0.8 / max(len(perp), 1)
    x = np.arange(len(words))
    highest = 1.0
    for j, (mode, p) in enumerate(perp.items()):
        vals = [p["per_word"].get(w, {}).get("ppl") for w in words]
        vals = [np.nan if v is None else v for v in vals]
        highest = max([highest] + [v for v in vals if np.isfinite(v)])
        ax.bar(x + j * width, vals, width, label=mode)
    ax.set_xticks(x + width * (len(perp) - 1) / 2)
    ax.set_xticklabels(words, rotation=45, ha="right", fontsize=7)
    ax.set_yscale("log")
    ax.set_ylim(1.0, highest * 3.0)  # perplexity >= 1: bars rise from 1, their heights on a log scale
    ax.set_ylabel("word perplexity")
    ax.set_title("Emerging words")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)  # outside the bars
    fig.tight_layout()
    return _png(fig)


_DRAW = {"relative_perplexity.png": relative_perplexity_png, "emerging_words.png": emerging_words_png}


# ----------------------------------------------------------------------------------------------------------------
# The writers.


def write_stream_report(results: Mapping[str, Any], out_dir: str) -> Dict[str, str]:
    """Writes report.md, relative_perplexity.png and (with emerging words) emerging_words.png into out_dir, beside
    the results.json the experiment wrote. Everything is rendered first and each file written atomically, so an
    error leaves nothing new behind. Returns {name: path} of the files written."""
    out_dir = os.fspath(out_dir)
    clean = jsonable(results)  # what results.json holds: the report reads the same numbers
    files = {"report.md": stream_markdown(clean) + "\n"}
    for name, draw in _DRAW.items():
        png = draw(clean)
        if png is not None:
            files[name] = png
    paths.makedirs(out_dir)  # a URL (gs://): each object uploaded whole (templm.io.atomic_write)
    return {name: atomic_write(paths.join(out_dir, name), content) for name, content in files.items()}


def streaming_section(summary: Mapping[str, Any], figures_dir: str) -> str:
    """The reproduction report's section on the streaming half, from `run_stream_experiment`'s summary: overall word
    perplexities, the relative increase over CONTROL per mode (slope per month and mean), what each
    dynamic-evaluation variant changes, and the figures, drawn into figures_dir as stream_relative_perplexity.png and
    stream_emerging_words.png from the stream results.json the summary names (summary["results"])
    and linked as `<figures_dir's name>/<file>` (report.md sits beside figures_dir)."""
    figures = _draw_summary_figures(summary, figures_dir)
    lines = ["## Streaming perplexity and dynamic evaluation (Transformer-XL)", "",
             "Transformer-XL trained on TIME-STRATIFIED (up to the cut-off) and CONTROL (same size, overlapping the "
             "test period) splits, evaluated on one stream of the test months in date order."
             + (f" `{LARGER_MODEL_RUN}` is a larger TIME-STRATIFIED model (the preset's `larger_model`), scored "
                "against the same CONTROL model for the model-size comparison (`streaming_size_slope`)."
                if f"{LARGER_MODEL_RUN}/static" in summary["overall_word_ppl"] else ""), ""]
    lines += [markdown_table(["run / mode", "word ppl"],
                             [[k, _fmt(v)] for k, v in summary["overall_word_ppl"].items()])]
    lines += ["", markdown_table(
        ["mode", "relative increase over CONTROL (mean)", "slope per month", "first month", "last month"],
        [[mode, fmt_percent(r["mean"], 1), fmt_percent(r["slope_per_month"], 1), fmt_percent(r["first_month"], 1),
          fmt_percent(r["last_month"], 1)] for mode, r in summary["relative"].items()])]
    if summary.get("dynamic_gain"):
        lines += ["", "Dynamic evaluation against static TIME-STRATIFIED (word perplexity): " + ", ".join(
            f"{mode} {fmt_percent(g, 1)}" for mode, g in summary["dynamic_gain"].items()) + "."]
    if summary.get("tokenizer_comparison"):
        lines += ["", "Outdated tokenizer (the paper's Appendix E), TIME-STRATIFIED with its own tokenizer against "
                  "CONTROL's:", "", finding_line(summary["tokenizer_comparison"])]
    for name, _, title in _FIGURES:
        if name in figures:
            lines += ["", f"![{title}]({figures[name]})"]
    return "\n".join(lines)


def _draw_summary_figures(summary: Mapping[str, Any], figures_dir: str) -> Dict[str, str]:
    """{figure name: link} of the figures drawn into figures_dir from the results.json that summary names."""
    path = summary.get("results")
    if not path:
        return {}
    if not paths.exists(path):
        console.warn(f"the streaming results {path} are missing: the report's streaming section has no figures")
        return {}
    with paths.open(path, encoding="utf-8") as f:
        results = json.load(f)
    link_dir = (paths.basename(figures_dir) if paths.is_url(figures_dir)
                else os.path.basename(os.path.normpath(figures_dir)))
    links = {}
    for name, target, _ in _FIGURES:
        png = _DRAW[name](results)
        if png is not None:
            paths.makedirs(figures_dir)
            atomic_write(paths.join(figures_dir, target), png)
            links[name] = f"{link_dir}/{target}"
    return links
