"""The reproduction's report: Markdown tables and PNG figures from one results dict (as `templm reproduce` builds it).

`write_report(results, out_dir)` writes

    report.md          the run (seed, world size, models with parameter counts and steps), the paper's tables in the
                       same shape, the expected findings each marked as appearing or not in these numbers, timing
    figures/*.png      F1 by year gap for yearly experts, F1 by answer duration, log-likelihood change into the
                       future, entropy by change class and year, adaptation curves
    results.json       every number (keys sorted; wall-clock times only under "timing")

Every file is written to a temporary name and renamed, so a report is never half-written. The findings are judged
from the numbers alone (`findings(results)`); where one does not appear the report says so.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

REGIME_ORDER = ("uniform", "yearly", "temporal")
CHANGE_CLASSES = ("frequent", "rare", "never")
DURATION_BUCKETS = ("1", "2", "3-4", "5+")
OLD_F1_KEPT = 0.8  # "keeps most of its old-year F1": at least this share of the un-adapted model's
FIGURES = ("yearly_gap", "answer_duration", "future_loglik", "future_entropy", "adaptation")


# --------------------------------------------------------------------------------------------------------------------
# Small helpers.


def _jsonable(results: Mapping[str, Any]) -> Dict[str, Any]:
    """A deep copy with JSON types only (int keys become strings, numpy scalars floats), as results.json holds it."""
    def default(value):
        if hasattr(value, "item"):
            return value.item()
        if hasattr(value, "tolist"):
            return value.tolist()
        raise TypeError(f"not JSON serialisable: {type(value).__name__}")

    return json.loads(json.dumps(results, default=default))


def _get(d: Any, *path, default=None):
    for key in path:
        if not isinstance(d, Mapping) or key not in d:
            return default
        d = d[key]
    return d


def _num(value: Optional[float], digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:.{digits}f}"


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _regimes(results) -> List[str]:
    present = _get(results, "regimes", default={}) or {}
    return [r for r in REGIME_ORDER if r in present] + sorted(set(present) - set(REGIME_ORDER))


def _years_text(years: Sequence[Any]) -> str:
    years = [int(y) for y in years]
    if not years:
        return "none"
    return f"{years[0]}-{years[-1]}" if len(years) > 1 else str(years[0])


def _write_atomic(path: str, text: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


# --------------------------------------------------------------------------------------------------------------------
# Findings: each judged from the numbers, True (appears), False (does not) or None (cannot be judged here).

VERDICTS = {True: "appears", False: "does not appear", None: "cannot be judged"}


def _finding_temporal_beats_uniform(results) -> Tuple[Optional[bool], str]:
    t = _get(results, "regimes", "temporal", "templama", "seen_f1")
    u = _get(results, "regimes", "uniform", "templama", "seen_f1")
    if t is None or u is None:
        return None, "no seen-year TempLAMA F1 for both Temporal and Uniform"
    return t > u, f"seen-year TempLAMA F1: Temporal {t:.2f}, Uniform {u:.2f}"


def _finding_yearly_falloff(results) -> Tuple[Optional[bool], str]:
    f = _get(results, "yearly", "falloff", default={}) or {}
    zero, other, slope = f.get("f1_gap0"), f.get("f1_other_gaps"), f.get("slope_per_year")
    if zero is None or other is None or slope is None:
        return None, "fewer than two year gaps measured"
    return zero > other and slope < 0, (f"F1 at gap 0 {zero:.2f}, at other gaps {other:.2f}; slope "
                                        f"{slope:+.2f} F1 per year of distance")


def _mean_delta(group: Mapping[str, Any]) -> Optional[float]:
    means = list((group or {}).get("mean", {}).values())
    return sum(means) / len(means) if means else None


def _finding_multi_answer_falls_faster(results) -> Tuple[Optional[bool], str]:
    groups = _get(results, "degradation", "temporal", "groups", default={}) or {}
    single, multiple = _mean_delta(groups.get("single")), _mean_delta(groups.get("multiple"))
    ns, nm = _get(groups, "single", "count", default=0), _get(groups, "multiple", "count", default=0)
    if single is None or multiple is None:
        return None, (f"Temporal model answered {ns} single-answer and {nm} multi-answer queries correctly at the "
                      "last seen year: both groups are needed")
    return multiple < single, (f"Temporal model, mean change over the gaps: multi-answer {multiple:+.3f} nats "
                               f"(n={nm}), single-answer {single:+.3f} nats (n={ns})")


def _class_means(results, regime: str, key: str = "normalized_entropy") -> Dict[str, float]:
    table = _get(results, "calibration", regime, key, default={}) or {}
    return {c: sum(v.values()) / len(v) for c, v in table.items() if v}


def _finding_entropy_order(results) -> Tuple[Optional[bool], str]:
    means = _class_means(results, "temporal")
    if not all(c in means for c in CHANGE_CLASSES):
        return None, "the Temporal model's calibration entropies lack a change class"
    f, r, n = (means[c] for c in CHANGE_CLASSES)
    return f > r > n, (f"Temporal model, normalized entropy over future years: frequent {f:.3f}, rare {r:.3f}, "
                       f"never {n:.3f}")


def _finding_adaptation(results) -> Tuple[Optional[bool], str]:
    summary = _get(results, "adaptation", "summary", default={}) or {}
    base, alphas = summary.get("base"), summary.get("alphas") or {}
    if not base or not alphas or base.get("new_f1") is None:
        return None, "no adaptation runs"
    good, parts = [], []
    for alpha, row in sorted(alphas.items(), key=lambda kv: float(kv[0])):
        gain = row.get("new_gain")
        kept = row.get("old_kept")
        kept_ok = (kept >= OLD_F1_KEPT) if kept is not None else (row.get("old_f1") or 0) >= (base.get("old_f1") or 0)
        if gain is not None and gain > 0 and kept_ok:
            good.append(alpha)
        parts.append(f"alpha {alpha}: new-year {_num(gain, 2) if gain is None else f'{gain:+.2f}'} F1, old years "
                     f"{'n/a' if kept is None else f'{100 * kept:.0f}%'} kept")
    return bool(good), (f"base new-year F1 {_num(base['new_f1'])}, old-years F1 {_num(base.get('old_f1'))}; "
                        + "; ".join(parts) + (f" (holds for alpha {', '.join(good)})" if good else ""))


FINDINGS: Tuple[Tuple[str, str, Callable], ...] = (
    ("temporal_beats_uniform", "Temporal beats Uniform on seen-year TempLAMA F1", _finding_temporal_beats_uniform),
    ("yearly_falloff", "Yearly experts fall off with the year gap", _finding_yearly_falloff),
    ("multi_answer_falls_faster", "The log-likelihood of multi-answer facts falls faster into the future than that "
     "of single-answer facts", _finding_multi_answer_falls_faster),
    ("entropy_order", "Entropy over candidates orders frequent > rare > never changing relations",
     _finding_entropy_order),
    ("adaptation", f"Alpha-mixture adaptation gains on the new year while keeping most (>= {OLD_F1_KEPT:.0%}) of "
     "the old-years F1", _finding_adaptation),
)


def findings(results: Mapping[str, Any]) -> List[Dict[str, Any]]:
    """[{name, statement, holds, evidence}] for each expected finding, judged from `results`."""
    results = _jsonable(results)
    out = []
    for name, statement, judge in FINDINGS:
        holds, evidence = judge(results)
        out.append({"name": name, "statement": statement, "holds": holds, "evidence": evidence})
    return out


# --------------------------------------------------------------------------------------------------------------------
# Markdown.


def _section_run(results) -> str:
    world = results.get("world", {})
    lines = ["## The run", "",
             f"- preset `{results.get('preset')}`, seed {results.get('seed')}",
             f"- world: {world.get('documents', 'n/a')} news documents, {world.get('entities', 'n/a')} entities, "
             f"{world.get('facts', 'n/a')} facts, {world.get('templama_queries', 'n/a')} TempLAMA queries "
             f"({_get(world, 'templama_splits', 'test', default='n/a')} test); "
             f"{world.get('subjects_per_relation', 'n/a')} subjects per relation, "
             f"{world.get('docs_per_month', 'n/a')} documents a month",
             f"- years {_years_text(world.get('years', []))}: seen (training) "
             f"{_years_text(world.get('seen_years', []))}, future {_years_text(world.get('future_years', []))}",
             f"- training examples: {world.get('customnews_train_examples', 'n/a')} CustomNews SSM, "
             f"{world.get('templama_train_examples', 'n/a')} TempLAMA (mixed 1000:1)"]
    mc, config = results.get("model_config") or {}, results.get("config") or {}
    if mc:
        lines.append(f"- model: T5 v1.1, {mc['num_encoder_layers']} encoder + {mc['num_decoder_layers']} decoder "
                     f"layers, width {mc['emb_dim']}, {mc['num_heads']} heads of {mc['head_dim']}, MLP "
                     f"{mc['mlp_dim']}, vocabulary {mc['vocab_size']}; Adafactor, learning rate "
                     f"{config.get('learning_rate')}, batch {config.get('batch_size')}, inputs/targets "
                     f"{config.get('inputs_length')}/{config.get('targets_length')} tokens")
    lines.append("")
    models = results.get("models", {})
    rows = [[name, m.get("regime", ""), f"{m.get('params', 0):,}", m.get("steps", ""), m.get("batch_size", ""),
             m.get("init", ""), _num(m.get("train_loss"), 3)] for name, m in models.items()]
    lines += ["Models (T5 v1.1 architecture):", "",
              _table(["model", "regime", "parameters", "steps", "batch", "initialised from", "final train loss"], rows)]
    return "\n".join(lines)


def _section_main_table(results) -> str:
    world = results.get("world", {})
    seen, future = _years_text(world.get("seen_years", [])), _years_text(world.get("future_years", []))
    rows = []
    for regime in _regimes(results):
        r = results["regimes"][regime]
        s = _get(results, "summary", regime, default={}) or {}
        rows.append([regime.capitalize(), f"{s.get('params', 0):,}", s.get("steps", ""),
                     _num(s.get("seen_ppl")), _num(s.get("future_ppl")),
                     _num(_get(r, "templama", "seen_f1")), _num(_get(r, "templama", "future_f1")),
                     _num(_get(r, "templama", "seen_em")), _num(_get(r, "templama", "future_em"))])
    header = ["model", "parameters", "train steps", f"CustomNews ppl {seen}", f"CustomNews ppl {future}",
              f"TempLAMA F1 {seen}", f"TempLAMA F1 {future}", f"EM {seen}", f"EM {future}"]
    text = ["## TempLAMA F1 and CustomNews perplexity (the paper's Table 2)", "",
            "Seen years are the training years, future years come after them; perplexity is the masked-LM (salient "
            "span) perplexity on held-out CustomNews documents. Yearly is the ensemble of one expert per seen year, "
            "each example routed to its year's expert (the closest one for future years); its parameters and steps "
            "are summed over the experts.", "", _table(header, rows), ""]
    years = [int(y) for y in world.get("years", [])]
    by_year = [[regime.capitalize()] + [_num(_get(results, "regimes", regime, "templama", f"f1_{y}")) for y in years]
               for regime in _regimes(results)]
    text += ["TempLAMA F1 by year:", "", _table(["model"] + [str(y) for y in years], by_year)]
    return "\n".join(text)


def _section_yearly(results) -> str:
    by_gap = _get(results, "yearly", "by_gap", default={}) or {}
    rows = [[g, _num(v["f1"]), int(v["count"])] for g, v in sorted(by_gap.items(), key=lambda kv: int(kv[0]))]
    f = _get(results, "yearly", "falloff", default={}) or {}
    return "\n".join(["## Yearly experts by year gap", "",
                      "Each expert (trained on one year) on the TempLAMA test queries of every year; gap = test year "
                      "- expert year.", "", _table(["gap", "F1", "queries"], rows), "",
                      f"F1 at gap 0: {_num(f.get('f1_gap0'))}; at other gaps: {_num(f.get('f1_other_gaps'))}; "
                      f"least-squares slope against |gap|: {_num(f.get('slope_per_year'))} F1 per year.",
                      "", "![F1 by year gap](figures/yearly_gap.png)"])


def _section_duration(results) -> str:
    rows = []
    for regime in _regimes(results):
        d = _get(results, "duration", regime, default={}) or {}
        rows.append([regime.capitalize()] + [f"{_num(_get(d, b, 'f1'))} ({int(_get(d, b, 'count', default=0))})"
                                             for b in DURATION_BUCKETS])
    return "\n".join(["## F1 by how long the answer stays valid (the paper's Figure 2)", "",
                      "Seen-year test queries grouped by the number of years their answer set holds for the subject "
                      "and relation; F1 (queries).", "",
                      _table(["model"] + [f"{b} year{'s' if b != '1' else ''}" for b in DURATION_BUCKETS], rows),
                      "", "![F1 by answer duration](figures/answer_duration.png)"])


def _section_degradation(results) -> str:
    deg = results.get("degradation", {})
    rows, gaps = [], []
    for regime in _regimes(results):
        d = deg.get(regime)
        if not d:
            continue
        gaps = d.get("gaps", gaps)
        for group in ("single", "multiple"):
            g = _get(d, "groups", group, default={}) or {}
            rows.append([regime.capitalize(), group, g.get("count", 0)] +
                        [_num(_get(g, "mean", str(k)), 3) for k in gaps])
    ref = next((d.get("reference_year") for d in deg.values() if d), None)
    answered = ", ".join(f"{r.capitalize()} {d.get('answered', 0)}/{d.get('queries', 0)}"
                         for r, d in deg.items() if d)
    return "\n".join(["## Degradation into the future", "",
                      f"Test queries of the last seen year ({ref}) that the model answers exactly ({answered}); the "
                      "mean change in the log-likelihood (nats) of that answer as the input year moves past it. "
                      "Temporal gets the year as its prefix (`year: Y`), Uniform as text (`In Y, `). single: one "
                      "answer over the whole span of the subject and relation; multiple: several.", "",
                      _table(["model", "answers", "queries"] + [f"+{k}" for k in gaps], rows), "",
                      "![Log-likelihood change into the future](figures/future_loglik.png)"])


def _section_calibration(results) -> str:
    cal = results.get("calibration", {})
    rows, years = [], []
    for regime in _regimes(results):
        c = cal.get(regime)
        if not c:
            continue
        years = [str(y) for y in c.get("years", [])]
        for cls in CHANGE_CLASSES:
            raw = _get(c, "entropy", cls, default={}) or {}
            norm = _get(c, "normalized_entropy", cls, default={}) or {}
            rows.append([regime.capitalize(), cls, _get(c, "count", cls, default=0)] +
                        [f"{_num(raw.get(y), 3)} ({_num(norm.get(y), 2)})" for y in years])
    return "\n".join(["## Calibration on future relations", "",
                      "Entropy (nats) of the model's distribution over a fixed candidate set (every candidate scored, "
                      "softmax over the candidates) for relations whose value changes every year (an event's host "
                      "city), rarely (a company's home country) or never (a landmark's city); in brackets normalized "
                      "by log(candidates).", "",
                      _table(["model", "change class", "queries"] + years, rows), "",
                      "![Entropy by change class and year](figures/future_entropy.png)"])


def _section_adaptation(results) -> str:
    a = results.get("adaptation", {})
    s = a.get("summary", {})
    if not s:
        return "## Adaptation to a new year\n\nNo adaptation runs."
    base, scratch = s["base"], s["retrained"]
    rows = [["Temporal (no adaptation)", "-", 0, base["steps"], _num(base["new_f1"]), _num(base["old_f1"]), "", ""]]
    for alpha, row in sorted(s.get("alphas", {}).items(), key=lambda kv: float(kv[0])):
        rows.append([f"Temporal + fine-tuning", alpha, row["steps"], row["total_steps"], _num(row["new_f1"]),
                     _num(row["old_f1"]), _num(row["new_gain"]),
                     "n/a" if row["old_kept"] is None else f"{100 * row['old_kept']:.0f}%"])
    kept = (None if not base["old_f1"] or scratch["old_f1"] is None else scratch["old_f1"] / base["old_f1"])
    rows.append(["Retrained from scratch on every year", "-", scratch["steps"], scratch["steps"],
                 _num(scratch["new_f1"]), _num(scratch["old_f1"]),
                 _num(None if scratch["new_f1"] is None or base["new_f1"] is None
                      else scratch["new_f1"] - base["new_f1"]),
                 "n/a" if kept is None else f"{100 * kept:.0f}%"])
    return "\n".join([f"## Adaptation to a new year ({a.get('new_year')})", "",
                      f"The Temporal model (trained on {_years_text(a.get('old_years', []))}) fine-tuned on mixtures "
                      f"that sample {a.get('new_year')}'s news with probability alpha and the older years' with "
                      "1 - alpha, against a Temporal model retrained from scratch on every year up to "
                      f"{a.get('new_year')}. TempLAMA F1 on the new year and on the old years.", "",
                      _table(["model", "alpha", "steps", "total steps", "new-year F1", "old-years F1", "new-year gain",
                              "old-years F1 kept"], rows), "",
                      "![Adaptation curves](figures/adaptation.png)"])


def _section_findings(items: Sequence[Mapping[str, Any]]) -> str:
    lines = ["## Expected findings: do they appear in these numbers?", ""]
    for item in items:
        lines.append(f"- {item['statement']}: **{VERDICTS[item['holds']]}**. {item['evidence']}.")
    lines += ["", "The numbers are the numbers: a finding that does not appear here is reported as such, not tuned "
              "away. Toy models on a small world are noisy; the `small` preset is the one sized to show them."]
    return "\n".join(lines)


def _section_extra(results) -> str:
    extra = results.get("extra", {})
    parts = []
    for name, value in extra.items():
        if isinstance(value, Mapping) and isinstance(value.get("markdown"), str):
            text = value["markdown"].strip()
            parts.append(text if text.startswith("#") else f"## {name}\n\n{text}")
        else:
            parts.append(f"## {name}\n\n```json\n{json.dumps(value, indent=1, sort_keys=True)}\n```")
    return "\n\n".join(parts)


def _section_timing(results) -> str:
    t = results.get("timing", {})
    def pairs(value):  # [[name, seconds], ...] in run order (a dict is accepted too)
        return list(value.items()) if isinstance(value, Mapping) else [tuple(p) for p in value or []]

    rows = [[name, f"{s:.1f}"] for name, s in pairs(t.get("stages"))]
    rows += [[f"  train {name}", f"{s:.1f}"] for name, s in pairs(t.get("models"))]
    for stage, parts in (t.get("extra") or {}).items():  # what extra stages timed themselves
        if isinstance(parts, Mapping):
            rows += [[f"  {stage}: {name}", f"{s:.1f}"] for name, s in parts.items() if isinstance(s, (int, float))]
    total = t.get("total_s")
    return "\n".join(["## Timing", "",
                      "Wall-clock seconds, stage by stage and per model trained (the only numbers that change "
                      "between runs with the same seed; the report itself is written after them).", "",
                      _table(["stage", "seconds"], rows), "",
                      f"Total: {_num(total, 1)} s ({_num(None if total is None else total / 60, 1)} min) on "
                      f"{t.get('machine', 'this machine')}."])


def markdown(results: Mapping[str, Any], items: Optional[Sequence[Mapping[str, Any]]] = None) -> str:
    """The whole report.md text for `results` (and its findings, judged here when not given)."""
    results = _jsonable(results)
    items = findings(results) if items is None else items
    sections = [f"# templm reproduction: time-aware language models ({results.get('preset')} preset)",
                _section_run(results), _section_findings(items), _section_main_table(results),
                _section_yearly(results), _section_duration(results), _section_degradation(results),
                _section_calibration(results), _section_adaptation(results)]
    extra = _section_extra(results)
    if extra:
        sections.append(extra)
    sections.append(_section_timing(results))
    return "\n\n".join(sections) + "\n"


# --------------------------------------------------------------------------------------------------------------------
# Figures.


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _empty(ax, text: str = "no data") -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes)


def _integer_x(ax) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _figure_yearly_gap(results, ax) -> None:
    by_gap = _get(results, "yearly", "by_gap", default={}) or {}
    if not by_gap:
        return _empty(ax)
    gaps = sorted(by_gap, key=int)
    ax.plot([int(g) for g in gaps], [by_gap[g]["f1"] for g in gaps], "o-")
    ax.axvline(0, color="grey", lw=0.5)
    _integer_x(ax)
    ax.set_xlabel("test year - expert year")
    ax.set_ylabel("TempLAMA F1")
    ax.set_title("Yearly experts by year gap")


def _figure_duration(results, ax) -> None:
    regimes = [r for r in _regimes(results) if _get(results, "duration", r)]
    if not regimes:
        return _empty(ax)
    width = 0.8 / len(regimes)
    for i, regime in enumerate(regimes):
        d = results["duration"][regime]
        values = [_get(d, b, "f1", default=0.0) or 0.0 for b in DURATION_BUCKETS]
        ax.bar([j + i * width for j in range(len(DURATION_BUCKETS))], values, width, label=regime.capitalize())
    ax.set_xticks([j + width * (len(regimes) - 1) / 2 for j in range(len(DURATION_BUCKETS))])
    ax.set_xticklabels([f"{b} yr" for b in DURATION_BUCKETS])
    ax.set_xlabel("years the answer stays valid")
    ax.set_ylabel("TempLAMA F1")
    ax.set_title("F1 by answer duration")
    ax.legend()


def _figure_loglik(results, ax) -> None:
    drawn = False
    for regime, style in (("temporal", "-"), ("uniform", "--")):
        d = _get(results, "degradation", regime)
        if not d:
            continue
        for group, marker in (("single", "o"), ("multiple", "s")):
            mean = _get(d, "groups", group, "mean", default={}) or {}
            if mean:
                gaps = sorted(mean, key=int)
                ax.plot([int(g) for g in gaps], [mean[g] for g in gaps], style, marker=marker,
                        label=f"{regime.capitalize()}, {group} answer")
                drawn = True
    if not drawn:
        return _empty(ax, "no correctly answered queries")
    ax.axhline(0, color="grey", lw=0.5)
    _integer_x(ax)
    ax.set_xlabel("years past the last seen year")
    ax.set_ylabel("change in log-likelihood (nats)")
    ax.set_title("Degradation into the future")
    ax.legend(fontsize=8)


def _figure_entropy(results, ax) -> None:
    drawn = False
    colors = dict(zip(CHANGE_CLASSES, ("tab:red", "tab:orange", "tab:blue")))
    for regime, style in (("temporal", "-"), ("uniform", "--")):
        table = _get(results, "calibration", regime, "normalized_entropy", default={}) or {}
        for cls in CHANGE_CLASSES:
            values = table.get(cls) or {}
            if values:
                years = sorted(values, key=int)
                ax.plot([int(y) for y in years], [values[y] for y in years], style, marker="o",
                        color=colors[cls], label=f"{regime.capitalize()}, {cls}")
                drawn = True
    if not drawn:
        return _empty(ax)
    _integer_x(ax)
    ax.set_xlabel("future year")
    ax.set_ylabel("entropy / log(candidates)")
    ax.set_title("Entropy over candidates by change class")
    ax.legend(fontsize=8)


def _figure_adaptation(results, axes) -> None:
    a = results.get("adaptation", {})
    runs, retrain = a.get("runs", {}), a.get("retrained", {})
    base = _get(a, "summary", "base", default={}) or {}
    if not runs and not retrain:
        for ax in axes:
            _empty(ax)
        return
    for ax, key, title in ((axes[0], "new_f1", f"new year ({a.get('new_year')})"), (axes[1], "old_f1", "old years")):
        for alpha, run in sorted(runs.items(), key=lambda kv: float(kv[0])):
            points = [(0, base.get(key))] + [(p["step"], p.get(key)) for p in run.get("curve", [])]
            points = [(s, v) for s, v in points if v is not None]
            if points:
                ax.plot(*zip(*points), "o-", label=f"fine-tune, alpha {alpha}")
        curve = [(p["step"], p.get(key)) for p in retrain.get("curve", []) if p.get(key) is not None]
        if curve:
            ax.plot(*zip(*curve), "k^--", label="retrained from scratch")
        ax.set_xlabel("training steps (fine-tuning steps for the adapted models)")
        ax.set_ylabel("TempLAMA F1")
        ax.set_title(title)
        ax.legend(fontsize=8)


def write_figures(results: Mapping[str, Any], fig_dir: str) -> Dict[str, str]:
    """Draws every figure into `fig_dir` (PNG, written atomically); returns {name: path}."""
    results = _jsonable(results)
    plt = _plt()
    os.makedirs(fig_dir, exist_ok=True)
    out = {}
    for name in FIGURES:
        if name == "adaptation":
            fig, axes = plt.subplots(1, 2, figsize=(11, 4))
            _figure_adaptation(results, axes)
        else:
            fig, ax = plt.subplots(figsize=(6, 4))
            {"yearly_gap": _figure_yearly_gap, "answer_duration": _figure_duration, "future_loglik": _figure_loglik,
             "future_entropy": _figure_entropy}[name](results, ax)
        fig.tight_layout()
        path = os.path.join(fig_dir, f"{name}.png")
        tmp = path + ".tmp"
        fig.savefig(tmp, format="png", dpi=100)
        plt.close(fig)
        os.replace(tmp, path)
        out[name] = path
    return out


def write_report(results: Mapping[str, Any], out_dir: str) -> Dict[str, str]:
    """Writes report.md, figures/*.png and results.json (with the findings) into `out_dir`; returns their paths."""
    results = _jsonable(results)
    items = findings(results)
    results["findings"] = {item["name"]: {"holds": item["holds"], "evidence": item["evidence"]} for item in items}
    os.makedirs(out_dir, exist_ok=True)
    paths = {"figures": write_figures(results, os.path.join(out_dir, "figures"))}
    paths["results"] = os.path.join(out_dir, "results.json")
    _write_atomic(paths["results"], json.dumps(results, indent=1, sort_keys=True) + "\n")
    paths["report"] = os.path.join(out_dir, "report.md")
    _write_atomic(paths["report"], markdown(results, items))
    return paths
