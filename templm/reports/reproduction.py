"""The reproduction's report: Markdown tables and PNG figures from one results dict (as `templm reproduce` builds it).

`write_report(results, out_dir)` writes

    report.md          the run (seed, world size, models with parameter counts and steps), the paper's tables in the
                       same shape, the expected findings each marked as appearing or not in these numbers, timing
    figures/*.png      F1 by year gap for yearly experts, F1 by answer duration, log-likelihood change into the
                       future, entropy by change class and year, adaptation curves, and the streaming stage's figures

beside the results.json the experiment wrote, or with it (`results_json`): every file is written to a temporary name
first and all are renamed together, with SIGTERM and Ctrl-C deferred until the last rename, so a report is never
half-written and never beside another run's results. The findings are judged from the numbers alone
(templm.metrics.findings); where one does not appear the report says so.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Mapping, Optional, Sequence

from templm import paths as storage  # `paths` names the files a writer returns
from templm.data.regimes import ORDER as REGIME_TABLE_ORDER, label as regime_label
from templm.errors import deferred_signals
from templm.io import atomic_write_files, json_text, jsonable, lookup
from templm.metrics.findings import CHANGE_CLASSES, STUDY, STUDY_HALVES, TIME_AWARE, judge
from templm.metrics.statistics import ALPHA, mean_interval
from templm.metrics.time_analysis import DURATION_BUCKETS, duration_bucket
from templm.reports import stream
from templm.reports.figures import figure_png, pyplot
from templm.reports.tables import Estimate, finding_line, fmt_number, markdown_table

REGIME_ORDER = REGIME_TABLE_ORDER  # Uniform, Yearly, Temporal (templm.data.regimes)
FIGURES = ("yearly_gap", "answer_duration", "future_loglik", "future_entropy", "adaptation")


def _num(value: Optional[float], digits: int = 2) -> str:
    return fmt_number(value, digits, missing="n/a")


def _streaming_section(summary: Mapping[str, Any], fig_dir: Optional[str]) -> str:
    """The streaming stage's section. With a figures folder, its figures are drawn there and the stage's own report
    (report.md and figures) is written beside the stream results.json it ran with. The summary names that file
    relative to the reproduction's folder (the one beside fig_dir), so a moved run folder still finds it; an absolute
    path (results written before) is taken as it is."""
    if fig_dir is None:
        return stream.streaming_section({**summary, "results": None}, "figures")
    path = summary.get("results")
    if path:
        path = storage.join(storage.dirname(storage.absolute(fig_dir)), path)
        if storage.exists(path):
            with storage.open(path, encoding="utf-8") as f:
                stream.write_stream_report(json.load(f), storage.dirname(path))
    return stream.streaming_section({**summary, "results": path}, fig_dir)


# Extra stages whose results the report renders itself (the others are shown as JSON or their "markdown" text).
STAGE_SECTIONS = {"streaming": _streaming_section}


def _regimes(results) -> List[str]:
    present = lookup(results, "regimes", default={}) or {}
    return [r for r in REGIME_ORDER if r in present] + sorted(set(present) - set(REGIME_ORDER))


def _years_text(years: Sequence[Any]) -> str:
    years = [int(y) for y in years]
    if not years:
        return "none"
    return f"{years[0]}-{years[-1]}" if len(years) > 1 else str(years[0])


# --------------------------------------------------------------------------------------------------------------------
# Markdown.


def _count(value: Any) -> str:
    """A count as text: whole numbers as they are, a mean over seeds to one decimal."""
    if isinstance(value, float) and not value.is_integer():
        return f"{value:,.1f}"
    return f"{int(value):,}" if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)


def _section_run(results) -> str:
    world = results.get("world", {})

    def count(key, *more):
        return _count(lookup(world, key, *more, default="n/a"))

    source = world.get("source", "embedded world")
    if source == "embedded world":
        data_line = (f"- world: {count('documents')} news documents, {count('entities')} entities, "
                     f"{count('facts')} facts, {count('templama_queries')} TempLAMA queries "
                     f"({count('templama_splits', 'test')} test); {count('subjects_per_relation')} subjects per "
                     f"relation, {count('docs_per_month')} documents a month")
    else:
        corpus = world.get("corpus")
        files = corpus if isinstance(corpus, list) else [corpus]
        named = f"`{files[0]}`" + (f" and {len(files) - 1} more file(s)" if len(files) > 1 else "")
        head = (f"task data `{world.get('task_data')}`" + (f" built from the corpus {named}" if corpus else "")
                if source == "task data" else f"the corpus {named}")
        data_line = (f"- data: {head} ({count('documents')} documents), TempLAMA "
                     + (f"`{world.get('templama_dir')}` " if world.get("templama_dir") else "")
                     + f"({count('templama_queries')} queries, {count('templama_splits', 'test')} test)")
    lines = ["## The run", "",
             f"- preset `{results.get('preset')}`, seed {results.get('seed')}",
             data_line,
             f"- years {_years_text(world.get('years', []))}: seen (training) "
             f"{_years_text(world.get('seen_years', []))}, future {_years_text(world.get('future_years', []))}",
             f"- training examples: {count('customnews_train_examples')} CustomNews SSM, "
             f"{count('templama_train_examples')} TempLAMA (mixed 1000:1)"]
    if any(isinstance(v, float) and not v.is_integer() for v in world.values()):
        lines[-3] += " (means over the seeds)"
    mc, config = results.get("model_config") or {}, results.get("config") or {}
    if mc:
        lines.append(f"- model: T5 v1.1, {mc['num_encoder_layers']} encoder + {mc['num_decoder_layers']} decoder "
                     f"layers, width {mc['emb_dim']}, {mc['num_heads']} heads of {mc['head_dim']}, MLP "
                     f"{mc['mlp_dim']}, vocabulary {mc['vocab_size']}; Adafactor, learning rate "
                     f"{config.get('learning_rate')}, batch {config.get('batch_size')}, inputs/targets "
                     f"{config.get('inputs_length')}/{config.get('targets_length')} tokens")
    for stage, reason in (results.get("skipped") or {}).items():
        lines.append(f"- skipped: {stage} ({reason})")
    lines.append("")
    models = results.get("models", {})
    rows = [[name, m.get("regime", ""), f"{m.get('params', 0):,}", m.get("steps", ""), m.get("batch_size", ""),
             m.get("init", ""), _num(m.get("train_loss"), 3)] for name, m in models.items()]
    lines += ["Models (T5 v1.1 architecture):", "",
              markdown_table(["model", "regime", "parameters", "steps", "batch", "initialised from",
                              "final train loss"], rows)]
    return "\n".join(lines)


def _section_main_table(results) -> str:
    world = results.get("world", {})
    seen, future = _years_text(world.get("seen_years", [])), _years_text(world.get("future_years", []))
    rows = []
    for regime in _regimes(results):
        r = results["regimes"][regime]
        s = lookup(results, "summary", regime, default={}) or {}
        rows.append([regime_label(regime), f"{s.get('params', 0):,}", s.get("steps", ""),
                     _num(lookup(r, "customnews", "seen_f1")), _num(lookup(r, "customnews", "future_f1")),
                     _num(s.get("seen_ppl")), _num(s.get("future_ppl")),
                     _num(lookup(r, "templama", "seen_f1")), _num(lookup(r, "templama", "future_f1")),
                     _num(lookup(r, "templama", "seen_em")), _num(lookup(r, "templama", "future_em"))])
    header = ["model", "parameters", "train steps", f"CustomNews F1 {seen}", f"CustomNews F1 {future}",
              f"CustomNews ppl {seen}", f"CustomNews ppl {future}", f"TempLAMA F1 {seen}", f"TempLAMA F1 {future}",
              f"EM {seen}", f"EM {future}"]
    text = ["## TempLAMA F1 and CustomNews F1 and perplexity (the paper's Table 2)", "",
            "Seen years are the training years, future years come after them; CustomNews F1 is the token F1 of the "
            "predicted masked salient span (the paper's CustomNews metric) and perplexity the masked-LM perplexity of "
            "that span, on held-out CustomNews documents. Yearly is the ensemble of one expert per seen year, "
            "each example routed to its year's expert (the closest one for future years); its parameters and steps "
            "are summed over the experts.", "", markdown_table(header, rows), ""]
    years = [int(y) for y in world.get("years", [])]
    by_year = [[regime_label(regime)] + [_num(lookup(results, "regimes", regime, "templama", f"f1_{y}"))
                                          for y in years] for regime in _regimes(results)]
    text += ["TempLAMA F1 by year:", "", markdown_table(["model"] + [str(y) for y in years], by_year)]
    by_year = [[regime_label(regime)] + [_num(lookup(results, "regimes", regime, "customnews", f"f1_{y}"))
                                        for y in years] for regime in _regimes(results)]
    text += ["", "CustomNews F1 by year:", "", markdown_table(["model"] + [str(y) for y in years], by_year)]
    return "\n".join(text)


def _section_yearly(results) -> str:
    yearly = results.get("yearly") or {}
    news = yearly.get("customnews") or {}
    gaps = sorted(set(yearly.get("by_gap") or {}) | set(news.get("by_gap") or {}), key=int)
    rows = []
    for g in gaps:
        t, c = lookup(yearly, "by_gap", g, default={}) or {}, lookup(news, "by_gap", g, default={}) or {}
        rows.append([g, _num(t.get("f1")), int(t.get("count", 0)), _num(c.get("f1")), int(c.get("count", 0))])
    lines = ["## Yearly experts by year gap", "",
             "Each expert (trained on one year) on the test examples of every year, TempLAMA queries and CustomNews "
             "masked spans; gap = test year - expert year.", "",
             markdown_table(["gap", "TempLAMA F1", "queries", "CustomNews F1", "spans"], rows), ""]
    for label, part in (("TempLAMA", yearly), ("CustomNews", news)):
        f = part.get("falloff") or {}
        if f:
            lines.append(f"{label}: F1 at gap 0 {_num(f.get('f1_gap0'))}, at other gaps {_num(f.get('f1_other_gaps'))}"
                         f", least-squares slope against |gap| {_num(f.get('slope_per_year'))} F1 per year.")
    found = lookup(results, "findings", "yearly_falloff", default={}) or {}
    parts = (("TempLAMA", found), ("CustomNews", found.get("customnews") or {}))
    sides = [(label, part.get("sides") or {}) for label, part in parts]
    side_rows = [[label, side, _num(r.get("effect")), f"[{_num((r.get('interval') or [None])[0])}, "
                  f"{_num((r.get('interval') or [None, None])[1])}]", r.get("verdict", "")]
                 for label, parts in sides for side, r in parts.items()]
    if side_rows:
        lines += ["", "The paper's asymmetry: the slope on each side of the expert's year (past: test years before "
                  "it, future: after it), with its 95 % interval (cluster bootstrap over the test examples).", "",
                  markdown_table(["test set", "side", "F1 per year of distance", "interval", "verdict"], side_rows)]
    lines += ["", "![F1 by year gap](figures/yearly_gap.png)"]
    return "\n".join(lines)


def _section_duration(results) -> str:
    rows = []
    for regime in _regimes(results):
        d = lookup(results, "duration", regime, default={}) or {}
        rows.append([regime_label(regime)] + [f"{_num(lookup(d, b, 'f1'))} ({int(lookup(d, b, 'count', default=0))})"
                                             for b in DURATION_BUCKETS])
    return "\n".join(["## F1 by how long the answer stays valid (the paper's Figure 2)", "",
                      "Seen-year test queries grouped by how many years the fact of their (first) answer lasts: "
                      "the run of consecutive years through the query's year in which that answer holds for the "
                      "subject and relation; F1 (queries).", "",
                      markdown_table(["model"] + [f"{b} year{'s' if b != '1' else ''}" for b in DURATION_BUCKETS],
                                     rows),
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
            g = lookup(d, "groups", group, default={}) or {}
            rows.append([regime_label(regime), group, g.get("count", 0)] +
                        [_num(lookup(g, "mean", str(k)), 3) for k in gaps])
    ref = next((d.get("reference_year") for d in deg.values() if d), None)
    answered = ", ".join(f"{regime_label(r)} {d.get('answered', 0)}/{d.get('queries', 0)}"
                         for r, d in deg.items() if d)
    return "\n".join(["## Degradation into the future", "",
                      f"Test queries of the last seen year ({ref}) that the model answers exactly ({answered}); the "
                      "mean change in the log-likelihood (nats) of that answer as the input year moves past it. "
                      "Temporal gets the year as its prefix (`year: Y`), Uniform as text (`In Y, `). single: one "
                      "answer over the whole span of the subject and relation; multiple: several.", "",
                      markdown_table(["model", "answers", "queries"] + [f"+{k}" for k in gaps], rows), "",
                      "![Log-likelihood change into the future](figures/future_loglik.png)"] + _as_of_text(results))


def _as_of_text(results) -> List[str]:
    """The Temporal model's future-year TempLAMA F1 with each query's own year and as of its last seen year."""
    a = results.get("future_as_of")
    if not a or not a.get("id"):
        return []
    own, then = (sum(a[k]) / len(a[k]) for k in ("f1_own_year", "f1_as_of"))
    uniform = lookup(results, "regimes", "uniform", "templama", "future_f1")
    return ["", f"Asked as of {a['as_of']} (templm's diagnostic, not a test of either paper): on the {len(a['id'])} "
            f"future-year TempLAMA test queries the Temporal model scores F1 {_num(own)} with each query's own year "
            f"in its prefix (the paper's protocol, Table 2's future column) and {_num(then)} with `year: "
            f"{a['as_of']}`, the last year it trained on (Uniform, given no year: {_num(uniform)}). The two differ by "
            "what a prefix naming a year the model never trained on does to its answers; the paper's Temporal model, "
            "from a pretrained T5, \"persists the unchanged facts\" into the future years."]


def _section_calibration(results) -> str:
    cal = results.get("calibration", {})
    rows, years = [], []
    for regime in _regimes(results):
        c = cal.get(regime)
        if not c:
            continue
        years = [str(y) for y in c.get("years", [])]
        for cls in CHANGE_CLASSES:
            raw = lookup(c, "entropy", cls, default={}) or {}
            norm = lookup(c, "normalized_entropy", cls, default={}) or {}
            rows.append([regime_label(regime), cls, lookup(c, "count", cls, default=0)] +
                        [f"{_num(raw.get(y), 3)} ({_num(norm.get(y), 2)})" for y in years])
    return "\n".join(["## Calibration on future relations", "",
                      "Entropy (nats) of the model's distribution over a fixed candidate set (every candidate scored, "
                      "softmax over the candidates) for relations whose value changes every year (an event's host "
                      "city), rarely (a company's home country) or never (a landmark's city); in brackets normalized "
                      "by log(candidates).", "",
                      markdown_table(["model", "change class", "queries"] + years, rows), "",
                      _entropy_growth(results),
                      "![Entropy by change class and year](figures/future_entropy.png)"])


def _entropy_growth(results) -> str:
    """The paper's claim that uncertainty grows into the future: each class's slope of normalized entropy per
    future year (the Temporal model), from the entropy_order finding's details."""
    growth = lookup(results, "findings", "entropy_order", "growth_per_year", default={}) or {}
    if not growth:
        return ""
    rows = [[c, _num(g.get("effect"), 4), f"[{_num((g.get('interval') or [None])[0], 4)}, "
             f"{_num((g.get('interval') or [None, None])[1], 4)}]", g.get("verdict", "")]
            for c, g in growth.items()]
    return "\n".join(["Growth over the future years (Temporal model): least-squares slope of the normalized entropy "
                      "per year, by change class, with its t-test (claim: it grows).", "",
                      markdown_table(["change class", "slope per year", "interval", "verdict"], rows), ""])


def _kept(share: Optional[float]) -> str:
    return "n/a" if share is None else f"{100 * share:.0f}%"


def _section_adaptation(results) -> str:
    a = results.get("adaptation", {})
    regimes = a.get("regimes") or {}
    if not regimes:
        return "## Adaptation to a new year\n\nNo adaptation runs."
    rows = []
    for regime in ("temporal", "uniform"):
        r = regimes.get(regime) or {}
        s, news = r.get("summary") or {}, r.get("customnews_summary") or {}
        if not s:
            continue
        base, news_base = s["base"], news.get("base") or {}
        rows.append([f"{regime_label(regime)} (no adaptation)", "-", 0, base["steps"], _num(base["new_f1"]),
                     _num(base["old_f1"]), _num(news_base.get("new_f1")), _num(news_base.get("old_f1")), "", ""])
        for alpha, row in sorted(s.get("alphas", {}).items(), key=lambda kv: float(kv[0])):
            news_row = lookup(news, "alphas", alpha, default={}) or {}
            rows.append([f"{regime_label(regime)} + fine-tuning", alpha, row["steps"], row["total_steps"],
                         _num(row["new_f1"]), _num(row["old_f1"]), _num(news_row.get("new_f1")),
                         _num(news_row.get("old_f1")), _num(row["new_gain"]), _kept(row["old_kept"])])
        # The regime retrained from scratch on every year (a results.json of an older templm: Temporal's only).
        if "retrained" not in r and regime != "temporal":
            continue
        scratch, news_scratch = s["retrained"], news.get("retrained") or {}
        kept = None if not base["old_f1"] or scratch["old_f1"] is None else scratch["old_f1"] / base["old_f1"]
        rows.append([f"{regime_label(regime)} retrained from scratch on every year", "-", scratch["steps"],
                     scratch["steps"], _num(scratch["new_f1"]), _num(scratch["old_f1"]),
                     _num(news_scratch.get("new_f1")), _num(news_scratch.get("old_f1")),
                     _num(None if scratch["new_f1"] is None or base["new_f1"] is None
                          else scratch["new_f1"] - base["new_f1"]), _kept(kept)])
    forgets = lookup(results, "findings", "temporal_forgets_less", default={}) or {}
    return "\n".join([f"## Adaptation to a new year ({a.get('new_year')})", "",
                      f"The Uniform and the Temporal model (trained on {_years_text(a.get('old_years', []))}) each "
                      f"fine-tuned on mixtures that sample {a.get('new_year')}'s news with probability alpha and the "
                      "older years' with 1 - alpha (with the year prefix for Temporal, without it for Uniform), "
                      f"against each model retrained from scratch on every year up to {a.get('new_year')}. "
                      "F1 on the new year and on the old years, TempLAMA and CustomNews; gain and kept share on "
                      "TempLAMA.", "",
                      markdown_table(["model", "alpha", "steps", "total steps", "TempLAMA new-year F1",
                                      "TempLAMA old-years F1", "CustomNews new-year F1", "CustomNews old-years F1",
                                      "new-year gain", "old-years F1 kept"], rows), "",
                      *([f"Forgetting, Temporal against Uniform: {forgets.get('evidence')}.", ""] if forgets else []),
                      "![Adaptation curves](figures/adaptation.png)"])


# How the findings section names each half of the study.
HALF_TITLES = {"time-aware": "The time-aware T5 models (Dhingra et al.)",
               "streaming": "Streaming perplexity, Transformer-XL (Lazaridou et al.)"}


def _section_findings(found: Mapping[str, Mapping[str, Any]], alpha: float) -> str:
    lines = ["## Expected findings: what the tests say", "",
             f"Each finding is a statistical test at the level {alpha:g} (two-sided; effect, 95 % interval, p and n "
             "below): **appears** where the test supports the claim, **opposite** where it supports the reverse, "
             "**inconclusive** where it supports neither, **not applicable** where the claim presumes what the data "
             "does not show.", ""]
    halves = [h for h in STUDY_HALVES if any(f.get("half", TIME_AWARE) == h for f in found.values())]
    for half in halves:
        if len(halves) > 1:
            lines += [f"{HALF_TITLES[half]}:", ""]
        floor = next((f["floor"] for f in found.values() if f.get("half", TIME_AWARE) == half and f.get("floor")),
                     None)
        if floor:
            lines += [f"**At the floor:** {floor}. The verdicts below compare scores near the floor, where a model "
                      "that learnt nothing would be; they are marked so, and say little about the papers' claims.", ""]
        lines += [finding_line(f) for f in found.values() if f.get("half", TIME_AWARE) == half] + [""]
    lines += ["The numbers are the numbers: a finding that does not appear here is reported as such, not tuned "
              "away. Toy models on a small world are noisy; the `small` preset is the one sized to show them."]
    return "\n".join(lines)


def reproduction_findings(results: Mapping[str, Any]) -> Dict[str, Dict[str, Any]]:
    """The findings results.json holds ({name: finding}, both halves), in the registry's order; the time-aware
    half's tested afresh from the numbers when it holds none."""
    stored = results.get("findings")
    if not isinstance(stored, Mapping) or not stored:
        return judge(results, TIME_AWARE)
    return {f.name: {"claim": f.claim, "half": f.half, **stored[f.name]} for f in STUDY if f.name in stored}


def _section_extra(results, fig_dir: Optional[str]) -> str:
    """The extra stages' sections: a stage in STAGE_SECTIONS renders its own (drawing its figures into `fig_dir`
    when given), a stage that returned a "markdown" text gets that text, any other is shown as JSON."""
    parts = []
    for name, value in (results.get("extra") or {}).items():
        text = None
        if name in STAGE_SECTIONS and isinstance(value, Mapping):
            text = STAGE_SECTIONS[name](value, fig_dir)
        elif isinstance(value, Mapping) and isinstance(value.get("markdown"), str):
            text = value["markdown"]
        if text is not None:
            text = text.strip()
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
                      markdown_table(["stage", "seconds"], rows), "",
                      f"Total: {_num(total, 1)} s ({_num(None if total is None else total / 60, 1)} min) on "
                      f"{t.get('machine', 'this machine')}{software_text(t.get('software'), ', with ')}."])


def software_text(versions: Optional[Mapping[str, Optional[str]]], lead: str = "") -> str:
    """`lead` and "jax 0.10.2, sentencepiece 0.2.2, ..." for a run's recorded package versions (results' timing
    "software"); "" where none were recorded (a run made before they were)."""
    named = [f"{name} {version}" for name, version in (versions or {}).items() if version]
    return lead + ", ".join(named) if named else ""


def markdown(results: Mapping[str, Any], fig_dir: Optional[str] = None) -> str:
    """The whole report.md text for `results`; the extra stages' figures are drawn into `fig_dir` when given."""
    results = jsonable(results)
    found = reproduction_findings(results)
    sections = [f"# templm reproduction: time-aware language models ({results.get('preset')} preset)",
                _section_run(results), _section_findings(found, results.get("alpha", ALPHA)),
                _section_main_table(results),
                _section_yearly(results), _section_duration(results), _section_degradation(results),
                _section_calibration(results), _section_adaptation(results)]
    extra = _section_extra(results, fig_dir)
    if extra:
        sections.append(extra)
    sections.append(_section_timing(results))
    return "\n\n".join(sections) + "\n"


# --------------------------------------------------------------------------------------------------------------------
# Figures.


def _empty(ax, text: str = "no data") -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes)


def _errors(values: Sequence[Any]) -> Optional[List[List[float]]]:
    """[[below], [above]] error-bar lengths when some values are Estimates with intervals, else None."""
    if not any(isinstance(v, Estimate) and v.has_interval for v in values):
        return None
    below = [float(v) - v.low if isinstance(v, Estimate) and v.has_interval else 0.0 for v in values]
    above = [v.high - float(v) if isinstance(v, Estimate) and v.has_interval else 0.0 for v in values]
    return [below, above]


def _line(ax, xs: Sequence[Any], ys: Sequence[Any], fmt: str, **kwargs) -> None:
    """A line, with error bars where the values carry intervals (several seeds)."""
    errors = _errors(ys)
    if errors is None:
        ax.plot(xs, [float(y) for y in ys], fmt, **kwargs)
    else:
        ax.errorbar(xs, [float(y) for y in ys], yerr=errors, fmt=fmt, capsize=3, **kwargs)


def _integer_x(ax) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _figure_yearly_gap(results, ax) -> None:
    drawn = False
    for label, part, fmt in (("TempLAMA", lookup(results, "yearly", default={}) or {}, "o-"),
                             ("CustomNews", lookup(results, "yearly", "customnews", default={}) or {}, "s--")):
        by_gap = part.get("by_gap") or {}
        if not by_gap:
            continue
        gaps = sorted(by_gap, key=int)
        values = [by_gap[g]["f1"] for g in gaps]
        per_gap = _per_gap_intervals(part)
        if per_gap and not _errors(values):  # one seed: the interval of the mean per-example F1 at each gap
            values = [Estimate(v, *per_gap.get(int(g), (None, None))) for g, v in zip(gaps, values)]
        _line(ax, [int(g) for g in gaps], values, fmt, label=label)
        drawn = True
    if not drawn:
        return _empty(ax)
    ax.axvline(0, color="grey", lw=0.5)
    _integer_x(ax)
    ax.set_xlabel("test year - expert year")
    ax.set_ylabel("F1")
    ax.set_title("Yearly experts by year gap")
    ax.legend(fontsize=8)


def _per_gap_intervals(part) -> Dict[int, Any]:
    """{gap: (low, high)}: the 95 % t-interval of the mean per-example F1 of the yearly experts at each year gap
    (`part`: results["yearly"] or its "customnews")."""
    pq = part.get("per_query")
    if not pq or not pq.get("f1"):
        return {}
    by_gap: Dict[int, List[float]] = {}
    for expert, scores in pq["f1"].items():
        for year, f1 in zip(pq["year"], scores):
            by_gap.setdefault(int(year) - int(expert), []).append(f1)
    return {gap: mean_interval(values)[1:] for gap, values in by_gap.items() if len(values) > 1}


def _legend_below(ax, ncol: int = 2) -> None:
    """The legend under the axes, outside the data."""
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=ncol, frameon=False)


def _duration_items(results, regime: str) -> Dict[str, List[float]]:
    """{bucket: per-query F1 of `regime`} over the seen-year test queries whose answer duration is known (one
    seed's results; the buckets of DURATION_BUCKETS)."""
    pq = results.get("per_query") or {}
    f1 = (pq.get("f1") or {}).get(regime)
    if not f1 or not pq.get("duration"):
        return {}
    seen = set(lookup(results, "world", "seen_years", default=[]) or [])
    out: Dict[str, List[float]] = {}
    for value, year, years in zip(f1, pq["year"], pq["duration"]):
        if years is not None and year in seen:
            out.setdefault(duration_bucket(int(years)), []).append(float(value))
    return out


def _figure_duration(results, ax) -> None:
    regimes = [r for r in _regimes(results) if lookup(results, "duration", r)]
    if not regimes:
        return _empty(ax)
    width = 0.8 / len(regimes)
    counts = {b: lookup(results, "duration", regimes[0], b, "count", default=None) for b in DURATION_BUCKETS}
    for i, regime in enumerate(regimes):
        d = results["duration"][regime]
        values = [lookup(d, b, "f1", default=0.0) or 0.0 for b in DURATION_BUCKETS]
        items = _duration_items(results, regime)
        if items and not _errors(values):  # one seed: the interval of the mean per-query F1 in each bucket
            values = [Estimate(float(v), *(mean_interval(items[b])[1:] if len(items.get(b, [])) > 1
                                           else (None, None))) for b, v in zip(DURATION_BUCKETS, values)]
        ax.bar([j + i * width for j in range(len(DURATION_BUCKETS))], [float(v) for v in values], width,
               yerr=_errors(values), capsize=3, label=regime_label(regime))
    ax.set_xticks([j + width * (len(regimes) - 1) / 2 for j in range(len(DURATION_BUCKETS))])
    ax.set_xticklabels([f"{b} yr" + ("" if counts[b] is None else f"\nn={float(counts[b]):.0f}")
                        for b in DURATION_BUCKETS])
    ax.set_xlabel("years the answer stays valid (n: seen-year test queries)")
    ax.set_ylabel("TempLAMA F1 (95 % interval)")
    ax.set_title("F1 by answer duration")
    _legend_below(ax, ncol=len(regimes))


def _figure_loglik(results, ax) -> None:
    drawn = False
    for regime, style in (("temporal", "-"), ("uniform", "--")):
        d = lookup(results, "degradation", regime)
        if not d:
            continue
        for group, marker in (("single", "o"), ("multiple", "s")):
            part = lookup(d, "groups", group, default={}) or {}
            mean = part.get("mean") or {}
            if mean:
                gaps = sorted(mean, key=int)
                values = [mean[g] for g in gaps]
                interval = part.get("interval") or {}
                if interval and not _errors(values):  # one seed: the interval over the group's queries
                    values = [Estimate(float(v), *interval.get(g, (None, None))) for g, v in zip(gaps, values)]
                _line(ax, [int(g) for g in gaps], values, style, marker=marker,
                      label=f"{regime_label(regime)}, {group} answer (n={part.get('count')})")
                drawn = True
    if not drawn:
        return _empty(ax, "no correctly answered queries")
    ax.axhline(0, color="grey", lw=0.5)
    _integer_x(ax)
    ax.set_xlabel("years past the last seen year")
    ax.set_ylabel("change in log-likelihood (nats, 95 % interval)")
    ax.set_title("Degradation into the future")
    _legend_below(ax)


def _entropy_items(results, regime: str, cls: str) -> Dict[int, List[float]]:
    """{year: normalized entropies of the class's query-years} from one seed's calibration items."""
    items = lookup(results, "calibration", regime, "items", default={}) or {}
    out: Dict[int, List[float]] = {}
    for value, c, year in zip(items.get("normalized_entropy") or [], items.get("class") or [],
                              items.get("year") or []):
        if c == cls:
            out.setdefault(int(year), []).append(float(value))
    return out


def _figure_entropy(results, ax) -> None:
    drawn = False
    colors = dict(zip(CHANGE_CLASSES, ("tab:red", "tab:orange", "tab:blue")))
    for regime, style in (("temporal", "-"), ("uniform", "--")):
        table = lookup(results, "calibration", regime, "normalized_entropy", default={}) or {}
        counts = lookup(results, "calibration", regime, "count", default={}) or {}
        for cls in CHANGE_CLASSES:
            values = table.get(cls) or {}
            if values:
                years = sorted(values, key=int)
                ys = [values[y] for y in years]
                items = _entropy_items(results, regime, cls)
                if items and not _errors(ys):  # one seed: the interval over the class's queries in each year
                    ys = [Estimate(float(v), *(mean_interval(items[int(y)])[1:] if len(items.get(int(y), [])) > 1
                                               else (None, None))) for y, v in zip(years, ys)]
                n = counts.get(cls)
                label = f"{regime_label(regime)}, {cls}" + ("" if n is None else f" (n={n})")
                errors = _errors(ys)
                xs = [int(y) for y in years]
                if regime == "temporal" or errors is None:
                    _line(ax, xs, [float(v) for v in ys] if regime != "temporal" else ys, style, marker="o",
                          color=colors[cls], label=label)
                else:  # the Uniform model's lines without their intervals, which would hide the others
                    ax.plot(xs, [float(v) for v in ys], style, marker="o", color=colors[cls], label=label, alpha=0.6)
                drawn = True
    if not drawn:
        return _empty(ax)
    _integer_x(ax)
    ax.set_xlabel("future year")
    ax.set_ylabel("entropy / log(candidates)\n(95 % interval: Temporal)")
    ax.set_title("Entropy over candidates by change class")
    _legend_below(ax)


def _figure_adaptation(results, axes) -> None:
    """Each alpha's fine-tuning curve against its fine-tuning steps; each regime's model retrained from scratch on
    every year up to the new one as a horizontal line at its final F1 (its steps are training from scratch, another
    scale, so they are named in the label, not drawn on the axis)."""
    a = results.get("adaptation", {})
    regimes, retrain = a.get("regimes") or {}, a.get("retrained", {})
    if not regimes and not retrain:
        for ax in axes:
            _empty(ax)
        return
    for ax, key, title in ((axes[0], "new_f1", f"new year ({a.get('new_year')})"), (axes[1], "old_f1", "old years")):
        for regime, style in (("temporal", "o-"), ("uniform", "s--")):
            r = regimes.get(regime) or {}
            base = lookup(r, "summary", "base", default={}) or {}
            for alpha, run in sorted((r.get("runs") or {}).items(), key=lambda kv: float(kv[0])):
                points = [(0, base.get(key))] + [(p["step"], p.get(key)) for p in run.get("curve", [])]
                points = [(s, v) for s, v in points if v is not None]
                if points:
                    _line(ax, *zip(*points), style, label=f"{regime_label(regime)}, alpha {alpha}")
        for regime, style in (("temporal", ":"), ("uniform", "-.")):
            own = (regimes.get(regime) or {}).get("retrained") or (retrain if regime == "temporal" else {})
            curve = [(p["step"], p.get(key)) for p in own.get("curve", []) if p.get(key) is not None]
            if curve:
                steps, value = curve[-1]
                ax.axhline(float(value), color="k", ls=style, lw=1.2,
                           label=f"{regime_label(regime)} retrained from scratch ({steps} steps)")
        ax.set_xlabel("fine-tuning steps")
        ax.set_ylabel("TempLAMA F1")
        ax.set_title(title)
    handles, labels = axes[0].get_legend_handles_labels()
    if handles:  # one legend for both panels, under them
        axes[0].figure.legend(handles, labels, fontsize=7, loc="lower center", ncol=4, frameon=False)


def draw_figures(results: Mapping[str, Any]) -> Dict[str, bytes]:
    """Every figure as PNG bytes: {name: png}."""
    results = jsonable(results)
    plt = pyplot()
    out = {}
    for name in FIGURES:
        if name == "adaptation":
            fig, axes = plt.subplots(1, 2, figsize=(11, 5))
            _figure_adaptation(results, axes)
        else:
            fig, ax = plt.subplots(figsize=(6, 5))
            {"yearly_gap": _figure_yearly_gap, "answer_duration": _figure_duration, "future_loglik": _figure_loglik,
             "future_entropy": _figure_entropy}[name](results, ax)
        fig.tight_layout(rect=(0, 0.17, 1, 1) if name == "adaptation" else (0, 0, 1, 1))
        out[name] = figure_png(fig)
    return out


def write_report(results: Mapping[str, Any], out_dir: str, results_json: bool = False,
                 final: bool = True) -> Dict[str, Any]:
    """Writes report.md and figures/*.png into `out_dir` (beside the experiment's results.json; with `results_json`,
    results.json too) as one commit (`commit`; `final`: these files are the command's whole result); returns their
    paths."""
    fig_dir = storage.join(out_dir, "figures")
    return _commit_report(out_dir, draw_figures(results), markdown(results, fig_dir),
                          results if results_json else None, final)


def _commit_report(out_dir: str, drawn: Mapping[str, bytes], report: str,
                   results: Optional[Mapping[str, Any]], final: bool = True) -> Dict[str, Any]:
    """figures/NAME.png of `drawn`, report.md and (where `results` is given) results.json put in `out_dir` as one
    commit; returns their paths."""
    paths: Dict[str, Any] = {"figures": {name: storage.join(out_dir, "figures", f"{name}.png") for name in drawn},
                             "report": storage.join(out_dir, "report.md")}
    files: Dict[str, Any] = {paths["figures"][name]: png for name, png in drawn.items()}
    files[paths["report"]] = report
    if results is not None:
        paths["results"] = storage.join(out_dir, "results.json")
        files[paths["results"]] = json_text(results, sort_keys=True)
    commit(files, final)
    return paths


def commit(files: Mapping[str, Any], final: bool = True) -> None:
    """Puts a result's files in place together: each written to a temporary name beside its place first (a full
    disk fails here, leaving every earlier file as it was), then all renamed with SIGTERM and Ctrl-C deferred until
    the last rename (errors.deferred_signals). `final`: they are the command's whole result, so a signal answered
    after them is said to have come once the result was complete; one seed's folder of a run over seeds is not."""
    for path in files:
        storage.makedirs(storage.dirname(path))
    with deferred_signals(final):
        atomic_write_files(files)


# --------------------------------------------------------------------------------------------------------------------
# Several seeds.


def seeds_view(results: Mapping[str, Any]) -> Dict[str, Any]:
    """A results dict shaped like one seed's, for the report sections and figures: the first seed's results with
    every number that differs between the seeds replaced by an Estimate (its mean and 95 % interval over the seeds,
    from results["aggregate"]), the findings tested over the seeds, and the run's timing."""
    seeds = [str(s) for s in results["seeds"]]

    def merge(value: Any, aggregate: Any) -> Any:
        if isinstance(value, Mapping):
            aggregate = aggregate if isinstance(aggregate, Mapping) else {}
            return {k: merge(v, aggregate.get(k)) for k, v in value.items()}
        if (isinstance(value, (int, float)) and not isinstance(value, bool) and isinstance(aggregate, Mapping)
                and aggregate.get("low") is not None):
            return Estimate(aggregate["mean"], aggregate["low"], aggregate["high"])
        return value

    view = merge(jsonable(results["per_seed"][seeds[0]]), results.get("aggregate") or {})
    view["findings"] = results["findings"]
    timing = results.get("timing") or {}
    view["timing"] = {"stages": [[f"seed {s}", t] for s, t in (timing.get("per_seed_s") or {}).items()],
                      "total_s": timing.get("total_s"), "machine": timing.get("machine"),
                      "software": timing.get("software")}
    view["seed"] = ", ".join(seeds)
    return view


def _section_seeds(results: Mapping[str, Any]) -> str:
    seeds = [str(s) for s in results["seeds"]]
    return "\n".join([
        f"## {len(seeds)} seeds", "",
        f"The study ran once for each seed ({', '.join(seeds)}): each seed draws its own world, splits, "
        "initialisation and data order. Every number below is the mean over the seeds, with its 95 % interval "
        "(t-interval over the seeds) in brackets where the seeds differ; the figures show the intervals as error "
        "bars. Each finding is tested on each seed and then over the seeds (a one-sample t-test of the per-seed "
        "effects). Each seed's own report, with its per-seed tests: "
        + ", ".join(f"[seed {s}](seed_{s}/report.md)" for s in seeds) + "."])


def write_seeds_report(results: Mapping[str, Any], out_dir: str, results_json: bool = False) -> Dict[str, Any]:
    """The report of a run over several seeds: each seed's own report in out_dir/seed_<S>, and out_dir/report.md
    with figures/*.png from `seeds_view` (means with their intervals over the seeds), each folder's files one commit
    (with `results_json`, its results.json too). Returns the paths."""
    # A signal while a seed's folder is put in place stops the run before its own results: not a whole result.
    per_seed = {s: write_report(results["per_seed"][str(s)], storage.join(out_dir, f"seed_{s}"), results_json,
                                final=False)
                for s in results["seeds"]}
    view = seeds_view(results)
    title, _, rest = markdown(view).partition("\n\n")
    title = title.replace(" preset)", f" preset, {len(results['seeds'])} seeds)")
    paths = _commit_report(out_dir, draw_figures(view), "\n\n".join([title, _section_seeds(results), rest]),
                           results if results_json else None)
    return {**paths, "per_seed": per_seed}
