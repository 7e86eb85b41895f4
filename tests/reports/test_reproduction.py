"""The reproduction report (templm/reports/reproduction.py) from a stored results.json (tests/fixtures/
reproduce_results.json, written by a `reproduce --preset smoke` run): report.md sections and numbers, the five
figures, each finding's verdict (templm/metrics/findings.py) and how it flips when the numbers do; a results dict
with nothing in it still gives a report."""

import copy
import json
import os

import pytest

from templm.metrics.findings import FINDINGS, findings
from templm.reports import reproduction as report

FIXTURE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "reproduce_results.json")
SECTIONS = ["# templm reproduction", "## The run", "## Expected findings", "## TempLAMA F1 and CustomNews perplexity",
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
    return {item["name"]: item["holds"] for item in findings(results)}


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
    row = (f"| Temporal | {s['params']:,} | {s['steps']} | {s['seen_ppl']:.2f} | {s['future_ppl']:.2f} | "
           f"{t['seen_f1']:.2f} | {t['future_f1']:.2f} | {t['seen_em']:.2f} | {t['future_em']:.2f} |")
    assert row in text
    for name, model in results["models"].items():
        assert f"| {name} | {model['regime']} | {model['params']:,} | {model['steps']} |" in text
    adapt = results["adaptation"]["summary"]["alphas"]["0.7"]
    row = f"| 0.7 | {adapt['steps']} | {adapt['total_steps']} | {adapt['new_f1']:.2f} | {adapt['old_f1']:.2f} |"
    assert row in text
    assert f"Total: {results['timing']['total_s']:.1f} s" in text
    for figure in report.FIGURES:
        assert f"(figures/{figure}.png)" in text


def test_findings_from_the_stored_numbers(results, written):
    assert verdicts(results) == {"temporal_beats_uniform": False, "yearly_falloff": True,
                                 "multi_answer_falls_faster": False, "entropy_order": False, "adaptation": True}
    text = (written[0] / "report.md").read_text()
    t = results["regimes"]["temporal"]["templama"]["seen_f1"]
    u = results["regimes"]["uniform"]["templama"]["seen_f1"]
    assert (f"- Temporal beats Uniform on seen-year TempLAMA F1: **does not appear**. seen-year TempLAMA F1: "
            f"Temporal {t:.2f}, Uniform {u:.2f}.") in text
    assert "- Yearly experts fall off with the year gap: **appears**." in text


def test_findings_follow_the_numbers(results):
    r = copy.deepcopy(results)
    r["regimes"]["temporal"]["templama"]["seen_f1"] = r["regimes"]["uniform"]["templama"]["seen_f1"] + 1
    r["calibration"]["temporal"]["normalized_entropy"] = {"frequent": {"2019": 0.9}, "rare": {"2019": 0.5},
                                                          "never": {"2019": 0.1}}
    groups = r["degradation"]["temporal"]["groups"]
    groups["single"]["mean"], groups["multiple"]["mean"] = groups["multiple"]["mean"], groups["single"]["mean"]
    r["yearly"]["falloff"] = {"f1_gap0": 40.0, "f1_other_gaps": 50.0, "slope_per_year": 10.0}
    for row in r["adaptation"]["summary"]["alphas"].values():
        row["old_kept"] = 0.5
    assert verdicts(r) == {"temporal_beats_uniform": True, "yearly_falloff": False,
                           "multi_answer_falls_faster": True, "entropy_order": True, "adaptation": False}
    r["degradation"]["temporal"]["groups"]["multiple"] = {"count": 0, "mean": {}}
    del r["calibration"]
    items = {i["name"]: i for i in findings(r)}
    assert items["multi_answer_falls_faster"]["holds"] is None
    assert "0 multi-answer" in items["multi_answer_falls_faster"]["evidence"]
    assert items["entropy_order"]["holds"] is None
    assert "**cannot be judged**" in report.markdown(r)


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
    assert text.count("**cannot be judged**") == len(FINDINGS)
    assert len(paths["figures"]) == len(report.FIGURES)
