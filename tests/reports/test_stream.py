"""The streaming report: report.md and the figures of one run beside its results.json (all or nothing), and the
reproduction report's streaming section with its numbers and the figures drawn from the run's results.json."""

import json
import math
import os

import pytest

from templm.io import write_json
from templm.metrics.findings import STREAMING, judge
from templm.metrics.stream import summarize
from templm.reports.stream import streaming_section, write_stream_report
from templm.reports.tables import finding_line

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def results(drifting_stream):
    """stream_results of nine documents over three months, TIME-STRATIFIED drifting away from CONTROL."""
    return drifting_stream["results"]


def test_report_files(results, tmp_path):
    rel = results["relative"]
    out = tmp_path / "report"
    out.mkdir()
    write_json(str(out / "results.json"), results)  # the experiment's file
    written = write_stream_report(results, str(out))
    assert set(written) == {"report.md", "relative_perplexity.png", "emerging_words.png"}
    assert sorted(os.listdir(out)) == sorted(list(written) + ["results.json"])  # no temporary file left
    loaded = json.loads((out / "results.json").read_text())
    assert loaded["months"] == ["2020-01", "2020-02", "2020-03"]
    assert math.isclose(loaded["relative"]["static"]["slope"], rel["static"]["slope"])
    md = (out / "report.md").read_text()
    for heading in ("## Perplexity per month (word level)", "## Emerging words", "## First and later occurrences",
                    "## Perplexity per topic", "| zorblat |"):
        assert heading in md
    for png in ("relative_perplexity.png", "emerging_words.png"):
        assert (out / png).read_bytes()[:8] == PNG
    found = judge(results, STREAMING)  # as `templm stream` stores them: the report lists each with its verdict
    with_findings = write_stream_report({**results, "findings": found}, str(tmp_path / "with_findings"))
    text = open(with_findings["report.md"]).read()
    assert text.index("## Expected findings") < text.index("## Overall")
    assert all(finding_line(f) in text for f in found.values())
    assert found["streaming_gap"]["verdict"] in text
    # The report reads the numbers results.json holds: rendered from the file, it is the same report.
    again = write_stream_report(loaded, str(tmp_path / "again"))
    assert (tmp_path / "again" / "report.md").read_text() == md and set(again) == set(written)

    # A failure half-way leaves the previous report as it was and no temporary files.
    before = (out / "report.md").read_bytes()
    with pytest.raises(TypeError):
        write_stream_report(dict(results, broken=object()), str(out))
    assert (out / "report.md").read_bytes() == before
    assert sorted(os.listdir(out)) == sorted(list(written) + ["results.json"])


def test_streaming_section_table_lines(tmp_path):
    """The streaming half's section from a hand-made summary: its numbers, and no finding (the report lists both
    halves' findings in its findings section)."""
    summary = {"overall_word_ppl": {"time_stratified/static": 12.0, "time_stratified/dynamic": 9.0,
                                    "control/static": 8.0},
               "relative": {"static": {"mean": 0.5, "slope_per_month": -0.01, "first_month": 0.6, "last_month": 0.4},
                            "dynamic": {"mean": 0.1, "slope_per_month": 0.0, "first_month": 0.2, "last_month": 0.0}},
               "dynamic_gain": {"dynamic": -0.25}, "months": ["2018-01", "2018-02"]}
    text = streaming_section(summary, str(tmp_path / "figures"))
    assert "**inconclusive**" not in text and "**appears**" not in text
    assert "| time_stratified/dynamic | 9.00 |" in text
    assert "| static | +50.0% | -1.0% | +60.0% | +40.0% |" in text
    assert "Dynamic evaluation against static TIME-STRATIFIED (word perplexity): dynamic -25.0%." in text
    assert "![" not in text and not os.path.exists(tmp_path / "figures")  # no results.json named: no figures


def test_streaming_section_draws_the_figures_from_results_json(results, tmp_path):
    path = write_json(str(tmp_path / "results.json"), results)
    summary = dict(summarize(json.loads(open(path).read())), results=path)
    text = streaming_section(summary, str(tmp_path / "out" / "figures"))
    assert "![Relative perplexity by month](figures/stream_relative_perplexity.png)" in text
    assert "![Emerging words](figures/stream_emerging_words.png)" in text
    for name in ("stream_relative_perplexity.png", "stream_emerging_words.png"):
        assert (tmp_path / "out" / "figures" / name).read_bytes()[:8] == PNG
    assert "## Streaming perplexity and dynamic evaluation (Transformer-XL)" in text
