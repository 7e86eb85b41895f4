"""The study with --out in an emulator bucket (tests/cloud/conftest.py)."""

import os

import pytest

from cloud_testing import comparable
from templm_testing import run_templm


@pytest.mark.e2e
def test_the_study_into_a_bucket_gives_the_local_study_s_results(gcs, bucket, tiny_study, tmp_path):
    """The suite's tiny study (both halves) with --out in the bucket: results.json equal to the session's local run
    of the same command (timings and the folder's own name aside), report.md and the figures in the bucket, nothing
    in the folder the command ran in."""
    from templm_testing import TINY_STUDY

    out = f"gs://{bucket}/study"
    result = run_templm(*TINY_STUDY, f"--out={out}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert os.listdir(tmp_path) == []
    local_dir, _, _ = tiny_study()
    with open(os.path.join(local_dir, "results.json"), encoding="utf-8") as f:
        local = comparable(f.read(), str(local_dir))
    there = comparable(gcs.read(bucket, "study/results.json").decode("utf-8"), out)
    assert there == local
    names = set(gcs.objects(bucket))
    assert {"study/report.md", "study/run.json", "study/figures/future_loglik.png"} <= names
    assert not any(".partial" in n or n.endswith(".lock") or ".templm-probe" in n for n in names), sorted(names)
