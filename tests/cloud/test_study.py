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
