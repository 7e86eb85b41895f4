"""tools/readme_tables.py: README's findings table is written from runs' results.json, not typed."""

import copy
import dataclasses
import json
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tools"))

import readme_tables  # noqa: E402
from templm.experiments.reproduce import combine_seeds  # noqa: E402
from templm.experiments.studies import load_study  # noqa: E402


def test_a_cell_holds_the_verdict_the_effect_its_interval_p_and_each_seeds_verdict():
    combined = {"verdict": "appears", "effect": -5.031, "interval": [-5.16, -4.912], "p_value": 3.1e-5,
                "per_seed": [{"verdict": "appears"}] * 3}
    assert readme_tables.cell(combined) == "**appears**: -5.03 [-5.16, -4.91], p=3.1e-05; all seeds appear"
    mixed = {"verdict": "inconclusive", "effect": -0.0171, "interval": [-0.0523, 0.0174], "p_value": 0.157,
             "per_seed": [{"verdict": "inconclusive"}, {"verdict": "opposite"}, {"verdict": "appears"}]}
    assert readme_tables.cell(mixed) == ("inconclusive: -0.017 [-0.052, +0.017], p=0.16; seeds inconclusive, "
                                         "opposite, appears")
    assert readme_tables.cell({"verdict": "not tested", "effect": None, "evidence": "the adapt stage was skipped"}) \
        == "not tested: the adapt stage was skipped"


def test_a_cell_over_seeds_counts_the_seeds_whose_effect_has_the_claims_sign_when_asked():
    seeds = [{"verdict": "appears", "effect": 8.8}, {"verdict": "inconclusive", "effect": -2.7},
             {"verdict": "inconclusive", "effect": 0.0}, {"verdict": "not tested", "effect": None}]
    finding = {"verdict": "inconclusive", "effect": 2.0, "interval": [-5.0, 9.0], "p_value": 0.4, "per_seed": seeds}
    plain = readme_tables.cell(finding)
    assert plain == "inconclusive: +2.00 [-5.00, +9.00], p=0.4; seeds appears, inconclusive, inconclusive, not tested"
    # a zero effect has neither sign; an untested seed is not counted
    assert readme_tables.cell(finding, +1) == plain + "; the paper's sign on 1 of 3"
    assert readme_tables.cell(finding, -1) == plain + "; the paper's sign on 1 of 3"
    seeds[2]["effect"] = -0.5
    assert readme_tables.cell(finding, -1) == plain + "; the paper's sign on 2 of 3"


def test_the_table_of_a_run_over_seeds_replaces_what_is_between_the_markers(tmp_path):
    """Two seeds made from the stored results of one run (the second with a larger streaming gap): the table has a
    row per finding of the registry with the combined numbers, the wall time, and the command that made it."""
    with open(os.path.join(REPO, "tests", "fixtures", "reproduce_results.json"), encoding="utf-8") as f:
        first = json.load(f)
    first["config"].update(dataclasses.asdict(load_study("smoke").preset))  # the preset as it is now
    second = copy.deepcopy(first)
    second["seed"] = 1
    second["findings"]["streaming_gap"]["effect"] += 0.2
    results = combine_seeds({"0": first, "1": second})
    results["timing"] = {"total_s": 125.0, "per_seed_s": {"0": 61.0, "1": 64.0}, "machine": "x86_64 2 CPU cores",
                         "software": {"jax": "0.10.2", "seqio": None, "sentencepiece": "0.2.2"}}
    source = tmp_path / "runs" / "smoke2" / "results.json"
    source.parent.mkdir(parents=True)
    source.write_text(json.dumps(results))
    readme = tmp_path / "README.md"
    readme.write_text(f"# T\n\nbefore\n\n{readme_tables.BEGIN}\nold table\n{readme_tables.END}\n\nafter\n")
    assert readme_tables.main([str(source), "--readme", str(readme), "--check"]) == 1
    assert readme_tables.main([str(source), "--readme", str(readme)]) == 0
    text = readme.read_text()
    assert text.startswith("# T\n\nbefore\n\n") and text.endswith("\n\nafter\n") and "old table" not in text
    gap = results["findings"]["streaming_gap"]
    assert gap["effect"] == pytest.approx((2 * first["findings"]["streaming_gap"]["effect"] + 0.2) / 2)
    row = next(line for line in text.splitlines() if line.startswith("| `streaming_gap`"))
    assert row == f"| `streaming_gap`: {gap['claim']} | {readme_tables.cell(gap)} |"
    assert "| finding | smoke, seeds 0,1 |" in text and "| wall time | 2m05s (1m01s, 1m04s per seed) |" in text
    assert (f"`templm reproduce --preset smoke --seeds 0,1 --out {source.parent}` on x86_64 2 CPU cores, with jax "
            "0.10.2, sentencepiece 0.2.2.\n") in text  # the versions that shape the numbers; one not installed left out
    names = [line.split("`")[1] for line in text.splitlines() if line.startswith("| `")]
    assert names == list(results["findings"])  # every finding, in the registry's order
    assert readme_tables.main([str(source), "--readme", str(readme), "--check"]) == 0
    # --signs: the stored run's gap is negative and the second seed's positive, the paper's sign (TIME-STRATIFIED above
    # CONTROL) on one of the two
    assert readme_tables.main([str(source), "--readme", str(readme), "--check", "--signs"]) == 1
    assert readme_tables.main([str(source), "--readme", str(readme), "--signs"]) == 0
    row = next(line for line in readme.read_text().splitlines() if line.startswith("| `streaming_gap`"))
    assert first["findings"]["streaming_gap"]["effect"] < 0 < second["findings"]["streaming_gap"]["effect"]
    assert row.endswith(f"{readme_tables.cell(gap)}; the paper's sign on 1 of 2 |")


def test_a_setting_the_run_changed_from_its_preset_is_in_its_column_and_command(tmp_path):
    """A run made with `--gin.Study.yearly_steps=...` (or before the preset changed) says so in its column's name and
    in its command; settings that leave the numbers as they are (the ETA's guess, trainings side by side) do not."""
    with open(os.path.join(REPO, "tests", "fixtures", "reproduce_results.json"), encoding="utf-8") as f:
        results = json.load(f)
    preset = dataclasses.asdict(load_study("smoke").preset)
    results["config"].update(preset, yearly_steps=preset["yearly_steps"] + 7, alphas=[0.25, 0.5],
                             estimated_steps_per_s=1.5, trainings_at_once=3)
    results["skipped"] = {"adapt": "--skip adaptation", "streaming": "--only time_aware", "calibration": "no file"}
    assert readme_tables.overrides(results) == {"alphas": [0.25, 0.5], "yearly_steps": preset["yearly_steps"] + 7}
    source = tmp_path / "one" / "results.json"
    source.parent.mkdir()
    source.write_text(json.dumps(results))
    readme = tmp_path / "README.md"
    readme.write_text(f"{readme_tables.BEGIN}\n{readme_tables.END}\n")
    assert readme_tables.main([str(source), "--readme", str(readme)]) == 0
    name = f"smoke, seed 0 (alphas=(0.25, 0.5), yearly_steps={preset['yearly_steps'] + 7})"
    text = readme.read_text()
    assert f"| finding | {name} |" in text
    assert (f"- {name}: `templm reproduce --preset smoke --seed 0 --only time_aware --skip adaptation "
            "'--gin.Study.alphas=(0.25, 0.5)' "
            f"--gin.Study.yearly_steps={preset['yearly_steps'] + 7} --out {source.parent}`") in text
    assert readme_tables._gin_value([["num_heads", 2], ["emb_dim", 32]]) == "{'num_heads': 2, 'emb_dim': 32}"
    results["preset"] = "a_study_of_its_own"  # not one of templm's presets: nothing to compare with
    assert readme_tables.overrides(results) == {}


def test_a_named_block_is_written_between_its_own_markers_and_leaves_the_first_table():
    begin, end = readme_tables.markers("smoke10")
    assert begin != readme_tables.BEGIN and "smoke10" in begin and end == "<!-- readme_tables: end smoke10 -->"
    readme = f"{readme_tables.BEGIN}\nfirst\n{readme_tables.END}\ntext\n{begin}\nsecond\n{end}\n"
    assert readme_tables.replace(readme, "new", "smoke10") == (
        f"{readme_tables.BEGIN}\nfirst\n{readme_tables.END}\ntext\n{begin}\nnew\n{end}\n")
    assert readme_tables.replace(readme, "new") == f"{readme_tables.BEGIN}\nnew\n{readme_tables.END}\ntext\n" \
        f"{begin}\nsecond\n{end}\n"
    with pytest.raises(ValueError, match="smoke10"):
        readme_tables.replace("no markers", "new", "smoke10")


def test_readme_has_the_markers_once():
    with open(os.path.join(REPO, "docs", "results.md"), encoding="utf-8") as f:
        text = f.read()
    assert text.count(readme_tables.BEGIN) == 1 and text.count(readme_tables.END) == 1


def test_the_streaming_numbers_beside_the_papers_come_from_each_seeds_stream_run():
    """The relative increase, its slope and the dynamic-evaluation gain are each seed's own overall word
    perplexities and slope, as the run's results.json holds them; their row shows every seed and the mean."""
    with open(os.path.join(REPO, "tests", "fixtures", "reproduce_results.json"), encoding="utf-8") as f:
        first = json.load(f)
    second = copy.deepcopy(first)
    ppl = second["extra"]["streaming"]["overall_word_ppl"]
    ppl["time_stratified/static"] = ppl["control/static"] * 1.2
    ppl["time_stratified/dynamic"] = ppl["control/static"] * 1.1
    numbers = readme_tables.streaming_numbers(combine_seeds({"0": first, "1": second}))
    own = first["extra"]["streaming"]["overall_word_ppl"]
    ts, ctl, dyn = own["time_stratified/static"], own["control/static"], own["time_stratified/dynamic"]
    assert numbers["relative_increase"] == pytest.approx([ts / ctl - 1, 0.2])
    assert numbers["dynamic_gain"] == pytest.approx([dyn / ts - 1, 1.1 / 1.2 - 1])
    assert numbers["gap_closed"] == pytest.approx([(ts - dyn) / (ts - ctl), 0.5])
    # The row's mean pools the seeds (a seed whose gap is near 0 would rule a mean of ratios).
    second_gap, second_gain = ctl * 0.2, ctl * 0.1
    assert readme_tables._pooled(numbers) == pytest.approx((ts - dyn + second_gain) / (ts - ctl + second_gap))
    assert readme_tables._percent([0.1, 9.0], mean=0.25) == "+25.0 % (seeds +10.0, +900.0)"
    assert numbers["slope"] == [first["extra"]["streaming"]["relative"]["static"]["slope_per_month"]] * 2
    # The model-size rows: the larger model's perplexity against the smaller's, and its slope minus the smaller's.
    large = own["time_stratified_large/static"]
    assert numbers["larger_ppl"] == pytest.approx([large / ts - 1, large / (ctl * 1.2) - 1])
    size = first["findings"]["streaming_size_slope"]
    assert numbers["size_slope"] == pytest.approx([size["slope_large"] - size["slope_small"]] * 2)
    assert readme_tables._percent([0.1, 0.2]) == "+15.0 % (seeds +10.0, +20.0)"
    assert readme_tables._percent([]) == "not run"


def test_the_detectable_slope_is_the_monthly_noise_over_the_months_spread():
    months = [f"2018-{m:02d}" for m in range(1, 13)] + [f"2019-{m:02d}" for m in range(1, 13)]
    noise = [0.05 if i % 2 else -0.05 for i in range(24)]
    line = {m: 0.1 + 0.01 * i for i, m in enumerate(months)}
    assert readme_tables._detectable_slope(line) == pytest.approx(0.0, abs=1e-9)  # no noise: any slope shows
    noisy = {m: v + e for (m, v), e in zip(line.items(), noise)}
    twice = {m: v + 2 * e for (m, v), e in zip(line.items(), noise)}
    assert readme_tables._detectable_slope(twice) == pytest.approx(2 * readme_tables._detectable_slope(noisy))
    # 2.8 standard errors of the slope: sd / sqrt(sum (x - mean)^2) with 24 months is sd / 33.9.
    assert readme_tables._detectable_slope(noisy) == pytest.approx(2.8 * 0.0511 / 33.91, rel=0.02)
    assert readme_tables._detectable_slope(dict(list(line.items())[:3])) is None


def _write_runs(tmp_path, name, runs):
    """Each run's results as tmp_path/seed_S/NAME; their paths."""
    paths = []
    for seed, results in runs.items():
        path = tmp_path / f"seed_{seed}" / name
        path.parent.mkdir()
        path.write_text(json.dumps(results))
        paths.append(str(path))
    return paths


def _is_eval(seed, verdict):
    finding = {"verdict": verdict, "effect": 0.52, "interval": [0.1, 0.9], "p_value": 0.012}
    proposals = [{"label": "text"}, {"label": "gold"}]
    rows = [{"proposal": p["label"], "level": level, "K": k, "ppl": 10.0 + seed + 1.0 / k, "ppl_se": 0.01 * k}
            for p in proposals for level in ("token", "sentence", "document") for k in (1, 64)]
    names = ("is_tightens_with_k", "is_token_level_optimistic", "is_flatter_proposal_tighter",
             "is_gold_proposal_tighter")
    return {"config": {"model": "kglm", "seed": seed, "ks": [1, 64], "test_docs": 40, "samples_per_proposal": 256,
                       "seconds": 125.0},
            "rows": rows, "per_document": {"proposals": proposals}, "findings": {n: finding for n in names},
            "exact_check": {"documents": 38, "exact_ppl": 9.5, "rows": [{"K": 64, "ppl": 9.75}]}}


def test_the_importance_sampling_table_has_each_effect_and_the_estimates_behind_it(tmp_path):
    readme = tmp_path / "README.md"
    begin, end = readme_tables.markers("is")
    readme.write_text(f"intro\n{begin}\nold\n{end}\noutro\n")
    sources = _write_runs(tmp_path, "is_eval.json", {11: _is_eval(11, "appears"), 12: _is_eval(12, "opposite")})
    assert readme_tables.main([*sources, "--readme", str(readme), "--block", "is"]) == 0
    lines = readme.read_text().splitlines()
    assert lines[2] == "| effect | seed 11 | seed 12 |"
    assert any(line.startswith("| `is_tightens_with_k`: More samples tighten") and line.endswith(
        "| **appears**: +0.52 [+0.10, +0.90], p=0.012 | opposite: +0.52 [+0.10, +0.90], p=0.012 |") for line in lines)
    assert "| proposal gold, aggregated per document, K = 64 | 21.016 +- 0.640 | 22.016 +- 0.640 |" in lines
    assert "| proposal text, aggregated per token, K = 64 | 21.016 +- 0.640 | 22.016 +- 0.640 |" in lines
    assert ("| exact check: the trained proposal at the largest K on prefixes of the test documents | 9.750 vs exact "
            "9.500 (38 prefixes) | 9.750 vs exact 9.500 (38 prefixes) |") in lines
    assert f"- seed 12: `templm is-eval --model=kglm --seed 12 --out {tmp_path / 'seed_12'}` (40 test documents, " \
           "256 samples a document and proposal)." in lines
    assert lines[0] == "intro" and lines[-1] == "outro"
    assert readme_tables.main([*sources, "--readme", str(readme), "--block", "is", "--check"]) == 0


def _appendices(seed, increase):
    gap = {"verdict": "appears", "effect": 0.05, "interval": [0.02, 0.08], "p_value": 0.001}
    periods = [{"shift_years": k, "months": [f"{2018 - k}-04", f"{2020 - k}-03"],
                "relative_increase": increase + k / 100, "findings": {"streaming_gap": gap}} for k in (0, 1)]
    distance = {"word_ppl": {"0": 15.5, "12": 16.25}, "control_word_ppl": 15.0}
    findings = {"appendix_every_period_gap": gap, "appendix_distance_growth": {**gap, "effect": 0.0032}}
    return {"config": {"seed": seed, "preset": "smoke", "shifts": [0, 1], "gaps": [0, 12], "seconds": 600.0},
            "periods": periods, "distance": distance, "findings": findings}


def test_the_appendices_table_has_each_finding_period_and_distance(tmp_path):
    readme = tmp_path / "README.md"
    begin, end = readme_tables.markers("appendices")
    readme.write_text(f"{begin}\n{end}\n")
    sources = _write_runs(tmp_path, "results.json", {21: _appendices(21, 0.05), 22: _appendices(22, -0.02)})
    assert readme_tables.main([*sources, "--readme", str(readme), "--block", "appendices"]) == 0
    lines = readme.read_text().splitlines()
    assert lines[1] == "| finding | seed 21 | seed 22 |"
    assert ("| Appendix B: relative increase, test 2017-04..2019-03 (cut-off 1 year(s) back) | +6.0 % (appears) | "
            "-1.0 % (appears) |") in lines
    assert "| Appendix C: word perplexity, training ends 12 months before the cut-off | 16.25 | 16.25 |" in lines
    assert "| Appendix C: CONTROL's word perplexity | 15.00 | 15.00 |" in lines
    assert any(line.startswith("| `appendix_distance_growth`:") and "**appears**: +0.003" in line for line in lines)
    assert f"- seed 22: `templm appendices --preset smoke --seed 22 --out {tmp_path / 'seed_22'}` (shifts 0,1, " \
           "gaps 0,12 months)." in lines
    mixed = [sources[0], str(tmp_path / "kglm.json")]
    (tmp_path / "kglm.json").write_text(json.dumps(_is_eval(11, "appears")))
    assert readme_tables.main([*mixed, "--readme", str(readme), "--block", "appendices"]) == 2
