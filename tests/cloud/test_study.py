"""The study with --out in an emulator bucket (tests/cloud/conftest.py)."""

import os
import signal
import subprocess
import sys
import time

import pytest

from templm.errors import EXIT_PREEMPTED
from cloud_testing import comparable
from templm_testing import run_templm


@pytest.mark.e2e
def test_the_study_into_a_bucket_stopped_and_resumed_gives_the_local_study_s_results(gcs, bucket, tiny_study,
                                                                                     tmp_path):
    """The suite's tiny study, its time-aware half (--nostreaming: the streaming half's verbs in a bucket are
    tests/cloud/test_streaming.py's), with --out in the bucket, stopped by SIGTERM once its first model's checkpoint
    is there (exit 75, no results), then the same command again: it resumes the run from the bucket and its
    results.json equals the session's local run of the whole study but for the streaming half (timings and the
    folder's own name aside); report.md and the figures are in the bucket, nothing is in the folder the commands ran
    in."""
    from templm.metrics.findings import STREAMING
    from templm_testing import TINY_STUDY

    out = f"gs://{bucket}/study"
    study = (*TINY_STUDY, "--nostreaming", f"--out={out}")
    stopped = subprocess.Popen([sys.executable, "-m", "templm.cli", *study], cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 600
    while not any(n.startswith("study/models/uniform/checkpoints/") and n.endswith("/commit_success.txt")
                  for n in gcs.objects(bucket)):
        assert stopped.poll() is None, stopped.stderr.read()[-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.2)
    stopped.send_signal(signal.SIGTERM)
    _, err = stopped.communicate(timeout=600)
    assert stopped.returncode == EXIT_PREEMPTED, err[-3000:]
    assert "study/results.json" not in gcs.objects(bucket)

    result = run_templm(*study, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "resuming the time-aware half's models" in result.stderr
    assert os.listdir(tmp_path) == []
    local_dir, _, _ = tiny_study()
    with open(os.path.join(local_dir, "results.json"), encoding="utf-8") as f:
        local = comparable(f.read(), str(local_dir))
    del local["extra"]
    local["findings"] = {k: v for k, v in local["findings"].items() if v["half"] != STREAMING}
    there = comparable(gcs.read(bucket, "study/results.json").decode("utf-8"), out)
    assert there == local
    names = set(gcs.objects(bucket))
    assert {"study/report.md", "study/run.json", "study/figures/future_loglik.png"} <= names
    assert not any(".partial" in n or n.endswith(".lock") or ".templm-probe" in n for n in names), sorted(names)


def test_the_study_s_own_data_read_from_a_bucket_as_from_local_files(gcs, bucket, tmp_path):
    """The study's data stage on a researcher's material in the bucket (WMT files by a pattern, a TempLAMA release,
    the published split files; tests/support/published_material.py), into the bucket: the same task data counts,
    years and summary as from local files, and the same published split statistics."""
    import random

    from templm.experiments.reproduce import PRESETS, Reproduction, StudyData
    from templm.experiments.streaming import published_split_stats
    from published_material import documents, write_news_crawl, write_published_splits, write_templama_release
    from cloud_testing import upload

    rng = random.Random(7)
    root = tmp_path / "material"
    ids = write_news_crawl(root / "wmt", documents(rng))
    write_templama_release(root / "templama")
    split_dir, _ = write_published_splits(root / "splits", ids, rng)
    there = upload(root, f"gs://{bucket}/material")
    found = {}
    for base, out in ((str(root), str(tmp_path / "run")), (there, f"gs://{bucket}/run")):
        data = StudyData(corpus=f"{base}/wmt/news-docs.20*.en.filtered.gz", templama_dir=f"{base}/templama")
        prepared = Reproduction(PRESETS["tiny_test"], out, 0, data).prepare_data()
        summary = {k: v for k, v in prepared.summary.items() if k not in ("corpus", "templama_dir")}
        stats = published_split_stats(split_dir.replace(str(root), base))
        found[base] = (prepared.manifest["counts"], prepared.manifest["years"], summary,
                       {k: v for k, v in stats.items() if k != "split_dir"})
    assert found[there] == found[str(root)]
    assert "run/data/manifest.json" in gcs.objects(bucket)
