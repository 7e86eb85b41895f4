"""The study with --out in an emulator bucket (tests/cloud/conftest.py)."""

import json
import os

import pytest

from templm.errors import EXIT_PREEMPTED
from cloud_testing import comparable
from templm_testing import run_templm, run_templm_stopped


@pytest.mark.e2e
def test_a_study_of_two_seeds_into_a_bucket_stopped_and_resumed_gives_each_seed_s_numbers(gcs, bucket, tiny_study,
                                                                                         tmp_path):
    """`--seeds=0,4` of the suite's tiny study, its time-aware half (--nostreaming: the streaming half's verbs in a
    bucket are tests/cloud/test_streaming.py's), with --out in the bucket, stopped by SIGTERM once seed 0's first
    model's checkpoint is there: exit 75 and no result (no results.json or report.md of the run or of seed 0, nothing
    of seed 4). The same command again resumes seed 0 from the bucket, and its results.json equals the session's
    local run of the whole study (tiny_study, which never stopped) but for the streaming half (timings and the
    folder's own name aside); then it runs seed 4 and combines the two. report.md and the figures are in the bucket,
    nothing is in the folder the commands ran in. (One run for all: preemption and resume, a bucket, and several
    seeds, cost a study each.)"""
    from templm.metrics.findings import STREAMING
    from templm.metrics.statistics import VERDICTS

    out = f"gs://{bucket}/seeds"
    study = ("reproduce", "--preset=tiny_test", "--seeds=0,4", "--gin.templm.Study.data_shards=2", "--nostreaming",
             f"--out={out}")
    # Stopped in this process (what a process does with SIGTERM is the fault matrix's and tests/cloud/test_train.py's).
    stopped = run_templm_stopped(
        lambda: any(n.startswith("seeds/seed_0/models/uniform/checkpoints/") and n.endswith("/commit_success.txt")
                    for n in gcs.objects(bucket)), *study, cwd=tmp_path, timeout=600)
    assert stopped.returncode == EXIT_PREEMPTED, stopped.stderr[-3000:]
    assert "stopped by SIGTERM" in stopped.stderr and "run the same command again to resume" in stopped.stderr
    assert "templm reproduce:" not in stopped.stdout
    names = set(gcs.objects(bucket))
    assert not names & {"seeds/results.json", "seeds/report.md", "seeds/seed_0/results.json",
                        "seeds/seed_0/report.md"}
    assert not any(n.startswith("seeds/seed_4/") for n in names)

    again = run_templm(*study, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resuming the time-aware half's models" in again.stderr
    assert "holds no input state" not in again.stderr  # a finished model is kept without touching its input
    assert f"templm reproduce: tiny_test preset, seeds 0,4: {out}/report.md" in again.stdout
    assert os.listdir(tmp_path) == []
    local_dir, _, _ = tiny_study()
    with open(os.path.join(local_dir, "results.json"), encoding="utf-8") as f:
        local = comparable(f.read(), str(local_dir))
    del local["extra"]
    local["findings"] = {k: v for k, v in local["findings"].items() if v["half"] != STREAMING}
    per_seed = {seed: json.loads(gcs.read(bucket, f"seeds/seed_{seed}/results.json").decode("utf-8"))
                for seed in ("0", "4")}
    assert comparable(json.dumps(per_seed["0"]), f"{out}/seed_0") == local

    combined = json.loads(gcs.read(bucket, "seeds/results.json").decode("utf-8"))
    assert combined["seeds"] == [0, 4] and set(combined["per_seed"]) == {"0", "4"}
    for seed, alone in per_seed.items():  # each seed's run whole, as its own folder holds it
        assert combined["per_seed"][seed] == alone and alone["seed"] == int(seed)
    for name, found in combined["findings"].items():
        assert len(found["per_seed"]) == 2 and found["verdict"] in VERDICTS, name
    loss = combined["aggregate"]["models"]["uniform"]["train_loss"]
    losses = [per_seed[s]["models"]["uniform"]["train_loss"] for s in ("0", "4")]
    assert loss["mean"] == pytest.approx(sum(losses) / 2) and loss["n"] == 2 and loss["low"] < loss["mean"]
    assert "## 2 seeds" in gcs.read(bucket, "seeds/report.md").decode("utf-8")
    names = set(gcs.objects(bucket))
    assert {"seeds/seed_4/report.md", "seeds/seed_0/run.json"} <= names
    assert any(n.startswith("seeds/figures/") for n in names)
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
