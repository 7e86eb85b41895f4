"""The reproduction report (templm/reports/reproduction.py) from a stored results.json (tests/fixtures/
reproduce_results.json, written by a `reproduce --preset smoke` run): report.md sections and numbers, the five
figures, each finding's verdict (templm/metrics/findings.py) and how it flips when the numbers do; a results dict
with nothing in it still gives a report."""

import copy
import json
import os

import pytest

from templm.experiments.reproduce import combine_seeds
from templm.metrics.findings import BY_NAME, STREAMING, STUDY, TIME_AWARE, judge, of_half
from templm.reports import reproduction as report
from templm.reports.tables import Estimate, finding_line

FIXTURE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "reproduce_results.json")
SECTIONS = ["# templm reproduction", "## The run", "## Expected findings",
            "## TempLAMA F1 and CustomNews F1 and perplexity",
            "## Yearly experts by year gap", "## F1 by how long the answer stays valid",
            "## Degradation into the future", "## Calibration on future relations", "## Adaptation to a new year",
            "## Timing"]


@pytest.fixture(scope="module")
def results():
    with open(FIXTURE, encoding="utf-8") as f:
        return json.load(f)


@pytest.fixture(scope="module")
def written(results, tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    paths = report.write_report(results, str(out))
    return out, paths


def verdicts(results):
    return {name: item["verdict"] for name, item in judge(results).items()}


def test_report_files_and_figures(results, written):
    out, paths = written
    assert sorted(os.listdir(out)) == ["figures", "report.md"]  # nothing half-written left
    assert sorted(os.listdir(out / "figures")) == sorted(f"{name}.png" for name in report.FIGURES)
    for name in report.FIGURES:
        data = (out / "figures" / f"{name}.png").read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, name
    assert paths["report"] == str(out / "report.md")


def test_report_sections_and_numbers(results, written):
    out, _ = written
    text = (out / "report.md").read_text()
    positions = [text.index(heading) for heading in SECTIONS]
    assert positions == sorted(positions)
    world = results["world"]
    assert f"preset `smoke`, seed {results['seed']}" in text
    assert f"world: {world['documents']} news documents" in text and f"{world['facts']} facts" in text
    # The paper's Table 2 row of the Temporal model: parameters, steps, perplexities and F1, from the numbers.
    t, s = results["regimes"]["temporal"]["templama"], results["summary"]["temporal"]
    c = results["regimes"]["temporal"]["customnews"]
    cells = [f"{c[k]:.2f}" if k in c else "n/a" for k in ("seen_f1", "future_f1")]
    row = (f"| Temporal | {s['params']:,} | {s['steps']} | {cells[0]} | {cells[1]} | {s['seen_ppl']:.2f} | "
           f"{s['future_ppl']:.2f} | "
           f"{t['seen_f1']:.2f} | {t['future_f1']:.2f} | {t['seen_em']:.2f} | {t['future_em']:.2f} |")
    assert row in text
    for name, model in results["models"].items():
        assert f"| {name} | {model['regime']} | {model['params']:,} | {model['steps']} |" in text
    for regime in ("temporal", "uniform"):
        adapt = results["adaptation"]["regimes"][regime]["summary"]["alphas"]["0.7"]
        news = results["adaptation"]["regimes"][regime]["customnews_summary"]["alphas"]["0.7"]
        row = (f"| {regime.capitalize()} + fine-tuning | 0.7 | {adapt['steps']} | {adapt['total_steps']} | "
               f"{adapt['new_f1']:.2f} | {adapt['old_f1']:.2f} | {news['new_f1']:.2f} | {news['old_f1']:.2f} |")
        assert row in text
        # Each regime's own reference, retrained from scratch on every year up to the new one.
        scratch = results["adaptation"]["regimes"][regime]["retrained"]
        assert (f"| {regime.capitalize()} retrained from scratch on every year | - | {scratch['steps']} | "
                f"{scratch['steps']} | {scratch['new_f1']:.2f} | {scratch['old_f1']:.2f} |") in text
    assert f"Total: {results['timing']['total_s']:.1f} s" in text
    for figure in report.FIGURES:
        assert f"(figures/{figure}.png)" in text


def test_findings_from_the_stored_numbers(results, written):
    """results.json holds each finding's test, both halves' in one place; the report lists them under their half,
    and testing the stored per-item numbers of the time-aware half again gives the same verdicts."""
    stored = results["findings"]
    assert set(stored) == {f.name for f in STUDY}
    assert {name: f["verdict"] for name, f in stored.items() if f["half"] == TIME_AWARE} == verdicts(results)
    text = (written[0] / "report.md").read_text()
    for name, found in stored.items():
        assert {"claim", "half", "verdict", "test", "effect", "interval", "p_value", "n", "evidence"} <= set(found)
        assert found["claim"] == BY_NAME[name].claim
        assert finding_line(found) in text
    findings_section = text[text.index("## Expected findings"):text.index("## TempLAMA F1")]
    streaming_part = findings_section[findings_section.index("Streaming perplexity, Transformer-XL"):]
    assert all(finding_line(stored[f.name]) in streaming_part for f in of_half(STREAMING))
    streaming_section = text[text.index("## Streaming perplexity and dynamic evaluation"):]
    assert "**appears**" not in streaming_section and "**inconclusive**" not in streaming_section  # listed once


def test_findings_follow_the_numbers(results):
    r = copy.deepcopy(results)
    del r["findings"]  # tested afresh from the per-query numbers
    f1 = r["per_query"]["f1"]
    f1["temporal"] = [x + 30.0 for x in f1["uniform"]]
    assert verdicts(r)["temporal_beats_uniform"] == "appears"
    f1["temporal"], f1["uniform"] = f1["uniform"], f1["temporal"]
    assert verdicts(r)["temporal_beats_uniform"] == "opposite"
    del r["degradation"]["temporal"]["items"], r["calibration"]
    items = judge(r)
    assert items["multi_answer_falls_faster"]["verdict"] == "inconclusive"
    assert "no per-query log-likelihood changes" in items["multi_answer_falls_faster"]["evidence"]
    assert items["entropy_order"]["verdict"] == "inconclusive"
    assert "**inconclusive**" in report.markdown(r)


def test_a_report_over_seeds_shows_means_intervals_and_each_seed(results, tmp_path):
    other = copy.deepcopy(results)
    other["seed"] = 1
    other["regimes"]["temporal"]["templama"]["seen_f1"] += 4.0
    other["world"]["facts"] += 1  # a count that differs between the seeds: its mean ends in .5
    for found in other["findings"].values():
        if found.get("effect") is not None:
            found["effect"] += 1.0
    combined = combine_seeds({"0": results, "1": other})
    combined["timing"] = {"total_s": 100.0, "machine": "test", "per_seed_s": {"0": 50.0, "1": 50.0}}
    paths = report.write_seeds_report(combined, str(tmp_path))
    text = open(paths["report"]).read()
    assert "(smoke preset, 2 seeds)" in text and "## 2 seeds" in text and "[seed 1](seed_1/report.md)" in text
    t = results["regimes"]["temporal"]["templama"]["seen_f1"]
    assert "| Temporal |" in text and f"{t + 2.0:.2f} [" in text  # the mean over the seeds, with its interval
    assert "one-sample t-test over the per-seed effects (2 seeds)" in text
    facts = results["world"]["facts"]
    assert f"{facts + 0.5:,.1f} facts" in text and "(means over the seeds)" in text
    for seed in ("0", "1"):
        assert (tmp_path / f"seed_{seed}" / "report.md").exists()
    assert sorted(os.listdir(tmp_path / "figures")) == sorted(f"{name}.png" for name in report.FIGURES)
    view = report.seeds_view(combined)
    assert isinstance(view["regimes"]["temporal"]["templama"]["seen_f1"], Estimate)
    assert view["regimes"]["uniform"]["templama"]["seen_f1"] == results["regimes"]["uniform"]["templama"]["seen_f1"]


def test_extra_stages_get_their_own_sections(results):
    r = copy.deepcopy(results)
    r["extra"] = {"probe": {"markdown": "Relative perplexity rises.", "slope": 0.01},
                  "other": {"markdown": "## Own heading\n\nText."}, "plain": {"x": 1}}
    r["timing"]["extra"] = {"probe": {"train_control": 12.25}}
    text = report.markdown(r)
    assert "|   probe: train_control | 12.2 |" in text
    assert "## probe\n\nRelative perplexity rises." in text
    assert "## Own heading\n\nText." in text and "## other" not in text
    assert '## plain\n\n```json\n{\n "x": 1\n}\n```' in text
    assert text.index("## Adaptation to a new year") < text.index("## probe") < text.index("## Timing")


def test_an_empty_results_dict_still_gives_a_report(tmp_path):
    paths = report.write_report({"preset": "smoke", "seed": 3}, str(tmp_path))
    text = open(paths["report"]).read()
    for heading in SECTIONS:
        assert heading in text
    assert (sum(line.startswith("- ") and "**inconclusive**" in line for line in text.splitlines())
            == len(of_half(TIME_AWARE)))  # no streaming half ran: its findings are not listed
    assert len(paths["figures"]) == len(report.FIGURES)


def test_the_figures_show_n_intervals_and_keep_legends_off_the_data(results):
    """Each estimate with its interval and n where one seed's per-item numbers give them, legends under the axes,
    and the retrained references as lines at their F1 instead of points at another step scale."""
    from templm.reports.figures import pyplot

    plt = pyplot()
    fig, ax = plt.subplots()
    report._figure_duration(results, ax)
    labels = [t.get_text() for t in ax.get_xticklabels()]
    counts = [results["duration"]["temporal"][b]["count"] for b in ("1", "2", "3-4", "5+")]
    assert labels == [f"{b} yr\nn={c:.0f}" for b, c in zip(("1", "2", "3-4", "5+"), counts)]
    assert any(getattr(c, "errorbar", None) is not None for c in ax.containers)  # the bars' 95 % intervals
    assert ax.get_legend().get_bbox_to_anchor().y0 < ax.bbox.y0  # under the axes
    plt.close(fig)
    fig, ax = plt.subplots()
    report._figure_entropy(results, ax)
    assert all("(n=" in t.get_text() for t in ax.get_legend().get_texts())
    plt.close(fig)
    fig, axes = plt.subplots(1, 2)
    report._figure_adaptation(results, axes)
    adapt = max(int(s) for r in results["adaptation"]["regimes"].values() for run in r["runs"].values()
                for s in [p["step"] for p in run["curve"]])
    for ax in axes:  # nothing drawn past the fine-tuning steps: the retrained models are horizontal lines
        drawn = [x for line in ax.get_lines() for x in line.get_xdata() if line.get_linestyle() not in (":", "-.")]
        assert max(drawn) == adapt
    assert any("retrained from scratch (" in t.get_text() for t in fig.legends[0].get_texts())
    plt.close(fig)


def test_results_report_and_figures_are_one_commit(results, tmp_path):
    """`templm reproduce` wrote results.json at the end of the study and report.md and the figures after it: a stop
    in between left a new results.json beside an older report (or none) and said no result was written. With
    results_json the three are put in place together: each file written under a temporary name first, then all
    renamed, SIGTERM deferred until the last rename and answered after it (the result was complete)."""
    import signal

    from templm.errors import Terminated, note_sigterm, reset_signal_notes, signal_during_commit

    paths = report.write_report(results, str(tmp_path), results_json=True)
    with open(paths["results"], encoding="utf-8") as f:
        assert json.load(f) == json.loads(json.dumps(results))
    assert sorted(os.listdir(tmp_path)) == ["figures", "report.md", "results.json"]
    previous = signal.getsignal(signal.SIGTERM)
    reset_signal_notes()
    note_sigterm()
    try:
        def stopped_while_written(tmp):  # SIGTERM arrives while the commit writes its files
            os.kill(os.getpid(), signal.SIGTERM)
            with open(tmp, "w", encoding="utf-8") as f:
                f.write("# another report\n")

        files = {str(tmp_path / "results.json"): '{"another": 1}\n', str(tmp_path / "report.md"): stopped_while_written,
                 str(tmp_path / "figures" / "yearly_gap.png"): b"another figure"}
        with pytest.raises(Terminated):
            report.commit(files)
        assert signal_during_commit()  # answered after the commit: the command says the result is whole
        assert (tmp_path / "report.md").read_text() == "# another report\n"
        assert (tmp_path / "results.json").read_text() == '{"another": 1}\n'
        assert (tmp_path / "figures" / "yearly_gap.png").read_bytes() == b"another figure"
        assert not [name for name in os.listdir(tmp_path) if name.endswith(".tmp")]
    finally:
        signal.signal(signal.SIGTERM, previous)
        reset_signal_notes()


def test_a_signal_while_a_seeds_folder_is_put_in_place_is_not_a_whole_result(results, tmp_path):
    """A run over seeds commits each seed's folder, then the run's own results.json, report and figures. SIGTERM
    while the first seed's report went into place was answered after that folder's commit and said the run's result
    was complete and written whole, though the run's own files were never written. It is answered there, and says
    no result (the run's) was written; the seed's folder is whole."""
    import signal

    from templm.errors import Terminated, note_sigterm, reset_signal_notes, signal_during_commit
    from templm_testing import signal_at

    other = copy.deepcopy(results)
    other["seed"] = 1
    combined = combine_seeds({"0": results, "1": other})
    combined["timing"] = {"total_s": 100.0, "machine": "test", "per_seed_s": {"0": 50.0, "1": 50.0}}
    previous = signal.getsignal(signal.SIGTERM)
    reset_signal_notes()
    note_sigterm()
    try:
        with signal_at(signal.SIGTERM, renamed=tmp_path / "seed_0" / "report.md") as hook, pytest.raises(Terminated):
            report.write_seeds_report(combined, str(tmp_path), results_json=True)
        assert hook.fired
        assert not signal_during_commit()  # the command line says: no result was written
    finally:
        signal.signal(signal.SIGTERM, previous)
        reset_signal_notes()
    assert sorted(os.listdir(tmp_path)) == ["seed_0"]  # not the run's results, report or figures, nor seed 1's
    with open(tmp_path / "seed_0" / "results.json", encoding="utf-8") as f:
        assert json.load(f) == json.loads(json.dumps(results))
    assert sorted(os.listdir(tmp_path / "seed_0")) == ["figures", "report.md", "results.json"]
