"""`templm reproduce` as a multi-host run: two processes (jax.distributed over gloo, one CPU device each) run the
same command; every training of both halves spans both processes, each process evaluates on its own device, process
0 alone writes the folder. Its numbers are the one-process run's with the same data shards (float noise apart): that
run is the suite's tiny reproduction (tests/conftest.py's `tiny_study`, in-process, with two data shards), which
tests/experiments/test_reproduce.py checks on its own."""

import json
import math
import os
import subprocess
import sys

import pytest

from templm_testing import xla_flags

pytestmark = pytest.mark.e2e

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _start(out, *extra):
    env = {**os.environ, "XLA_FLAGS": xla_flags(1)}
    return subprocess.Popen([sys.executable, "-m", "templm.cli", "reproduce", "--preset=tiny_test", f"--out={out}",
                             *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)


# Numbers made of summed log-likelihoods (each span's, and Table 7's test on them): held to their own tolerance, and
# their evidence line (with a p that moves in its third digit) to its verdict.
SUMMED = ("/per_query/customnews/loglik/", "/adaptation/regimes/temporal/per_query/customnews/loglik/",
          "/adaptation/regimes/uniform/per_query/customnews/loglik/", "/findings/perplexity_order/")


def _numbers(tree, path=""):
    """{path: leaf} of a results dict (timing and the data-shard setting left out)."""
    if isinstance(tree, dict):
        out = {}
        for key, value in tree.items():
            if key not in ("timing", "data_shards"):
                out.update(_numbers(value, f"{path}/{key}"))
        return out
    if isinstance(tree, list):
        out = {}
        for i, value in enumerate(tree):
            out.update(_numbers(value, f"{path}[{i}]"))
        return out
    return {path: tree}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_study):
    """({"multi": the two processes' folder, "single": the one-process run's}, their results, the two processes'
    (stdout, stderr)). The processes start first; the one-process run is made (or waited for) while they run."""
    root = tmp_path_factory.mktemp("multihost")
    port = 21000 + os.getpid() % 20000
    hosts = [_start(root / "multi", f"--coordinator_address=localhost:{port}", "--num_processes=2",
                    f"--process_id={i}") for i in range(2)]
    try:
        single = tiny_study()[0]
    except BaseException:
        for proc in hosts:
            proc.kill()
            proc.communicate()
        raise
    outputs = [proc.communicate(timeout=1500) for proc in hosts]
    for proc, (_, err) in zip(hosts, outputs):
        assert proc.returncode == 0, err[-3000:]
    folders = {"multi": root / "multi", "single": single}
    results = {}
    for run, folder in folders.items():
        with open(folder / "results.json", encoding="utf-8") as f:
            results[run] = json.load(f)
    return folders, results, outputs


def test_two_processes_give_the_one_process_numbers(runs):
    _, results, _ = runs
    multi, single = _numbers(results["multi"]), _numbers(results["single"])
    assert set(multi) == set(single)
    assert results["multi"]["config"]["data_shards"] == 0 and results["single"]["config"]["data_shards"] == 2
    assert set(results["multi"]["models"]) == {"uniform", "temporal", "yearly_2016", "retrain", "retrain_uniform",
                                               "adapt_alpha0.5", "adapt_uniform_alpha0.5"}
    for path, value in single.items():
        if isinstance(value, float) and not math.isnan(value):
            # Summed over two devices instead of one: the same numbers to float32 noise, relative 1e-4, or 1e-5
            # absolute for numbers near 0 that are differences of model outputs (a slope of entropies over the
            # years). A bootstrap interval's end is an order statistic of the resampled estimates: noise that swaps
            # two neighbouring ones moves it by their spacing, so it is held to a thousandth of the interval's width.
            tolerance = 1e-5
            if path.endswith("/p_value"):
                tolerance = 1e-3  # a test of a slope near 0 moves its p with that noise; verdicts are equal (below)
            if path.startswith(SUMMED):
                # A span's log-likelihood sums its tokens' log-probabilities: their noise adds up (seen: 1.2e-4
                # relative on a sum of -42 nats, 1e-4 nats on a mean difference of two models' sums, 0.0016 on a p).
                tolerance = 1e-2 if path.endswith("/p_value") else max(2e-3, 1e-3 * abs(value))
            if path.endswith(("/interval[0]", "/interval[1]")):
                low, high = single[path[:-3] + "[0]"], single[path[:-3] + "[1]"]
                if isinstance(low, float) and isinstance(high, float) and math.isfinite(high - low):
                    tolerance = max(tolerance, 1e-3 * abs(high - low))
            assert multi[path] == pytest.approx(value, rel=1e-4, abs=tolerance), path
        elif not isinstance(value, float) and not (path.startswith(SUMMED) and path.endswith("/evidence")):
            assert multi[path] == value, path  # counts, predictions' F1 per query, verdicts, names, evidence


def test_process_zero_alone_writes_and_both_halves_span_the_processes(runs):
    folders, results, outputs = runs
    (out0, err0), (out1, err1) = outputs
    assert f"templm reproduce: tiny_test preset, seed 0: {folders['multi']}/report.md" in out0
    assert "templm reproduce" not in out1 and "reproduce [" not in err1  # no report line, no progress
    assert "reproduce [1/7] data: starting" in err0 and "skipped" not in results["multi"]
    # The same files, but for the record of the streaming data step that process 0 left for the other.
    assert sorted(os.listdir(folders["multi"])) == sorted(os.listdir(folders["single"]))
    streaming = sorted(os.listdir(folders["multi"] / "stream_experiment"))
    assert streaming == sorted(os.listdir(folders["single"] / "stream_experiment") + ["data.json"])
    for model in ("time_stratified", "control"):  # the Transformer-XL trainings, step by step, as one process's
        losses = {}
        for run in ("multi", "single"):
            with open(folders[run] / "stream_experiment" / model / "metrics.jsonl", encoding="utf-8") as f:
                losses[run] = [row["loss"] for row in map(json.loads, f) if row.get("split") == "train"]
        assert losses["multi"] and losses["multi"] == pytest.approx(losses["single"], rel=1e-4)
