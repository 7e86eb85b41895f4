"""`templm train`, eval and infer with MODEL_DIR and the task data in an emulator bucket (tests/cloud/conftest.py):
kill -9 and SIGTERM, resumed bitwise; the same evaluation and predictions as a local run."""

import json
import os
import signal
import subprocess
import sys

import pytest

from templm import paths
from templm.errors import EXIT_PREEMPTED
from templm.training.checkpoints import load_params
from cloud_testing import CONFIG, params_equal, upload, wait_for_object
from templm_testing import run_templm, run_templm_stopped


@pytest.mark.e2e
def test_train_into_a_bucket_resumes_bitwise_after_kill_9_and_sigterm(gcs, bucket, data_dir, tmp_path):
    """`templm train` with MODEL_DIR and the task data (TEMPLM_DATA_DIR) in the bucket: killed with SIGKILL after a
    checkpoint, run again (its lock, left by the dead process, is taken over), stopped by SIGTERM (exit 75,
    checkpoint in the bucket), run again to the end: the parameters equal an uninterrupted local run's on the local
    task data bit for bit. No folder named after the URL appears where the commands ran."""
    remote_data = upload(data_dir, f"gs://{bucket}/data")
    env = {**os.environ, "TEMPLM_DATA_DIR": remote_data}
    model_dir = f"gs://{bucket}/runs/t"
    argv = [sys.executable, "-m", "templm.cli", "train", *CONFIG, f"--gin.MODEL_DIR='{model_dir}'",
            "--gin.TRAIN_STEPS=100000", "--gin.SAVE_PERIOD=3"]
    work = tmp_path / "cwd"
    work.mkdir()

    killed = subprocess.Popen(argv, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_object(gcs, bucket, "runs/t/checkpoints/3/commit_success.txt", killed)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    assert "runs/t/.templm.lock" in gcs.objects(bucket)  # the dead run's lock is still there

    # Run again, in this process (a process's own handling of SIGTERM is the kill -9 run's above and the fault
    # matrix's): it takes the dead run's lock over and is stopped once it has saved again.
    steps = {int(n.split("/")[3]) for n in gcs.objects(bucket) if n.startswith("runs/t/checkpoints/")
             and n.split("/")[3].isdigit()}
    saved = f"runs/t/checkpoints/{max(steps) + 3}/commit_success.txt"
    stopped = run_templm_stopped(lambda: saved in gcs.objects(bucket), *argv[3:], cwd=work,
                                 env={"TEMPLM_DATA_DIR": remote_data})
    assert stopped.returncode == EXIT_PREEMPTED, stopped.stderr[-3000:]
    assert stopped.stdout == "" and "stopped by SIGTERM" in stopped.stderr
    assert "runs/t/.templm.lock" not in gcs.objects(bucket)  # released on the way out

    _, meta = load_params(f"{model_dir}/checkpoints")
    total = meta["step"] + 2
    finished = run_templm("train", *CONFIG, f"--gin.MODEL_DIR='{model_dir}'", f"--gin.TRAIN_STEPS={total}",
                          "--gin.SAVE_PERIOD=3", cwd=work, env={"TEMPLM_DATA_DIR": remote_data})
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert json.loads(finished.stdout.strip().splitlines()[-1])["start_step"] == meta["step"]
    reference = run_templm("train", *CONFIG, f"--gin.MODEL_DIR='{tmp_path / 'ref'}'", f"--gin.TRAIN_STEPS={total}",
                           f"--gin.SAVE_PERIOD={total}", cwd=work, env={"TEMPLM_DATA_DIR": data_dir})
    assert reference.returncode == 0, reference.stderr[-3000:]
    same, meta = params_equal(str(tmp_path / "ref" / "checkpoints"), f"{model_dir}/checkpoints")
    assert same and meta["step"] == total

    names = set(gcs.objects(bucket))
    assert {"runs/t/config.gin", "runs/t/metrics.jsonl"} <= names
    assert any(n.startswith("runs/t/train/events.out.tfevents") for n in names)  # TensorBoard in the bucket
    with paths.open(f"{model_dir}/metrics.jsonl") as f:
        logged = [json.loads(line)["step"] for line in f if '"train"' in line]
    assert logged[-1] == total
    # eval and infer of the checkpoint in the bucket (queries from it, predictions into it) give the numbers and
    # predictions of the same steps trained locally.
    queries = '{"query": "Ann Lee plays for _X_.", "date": "2014"}\n{"inputs": "year: 2015 <extra_id_0> is it."}\n'
    with paths.open(f"gs://{bucket}/queries.jsonl", "w") as f:
        f.write(queries)
    (tmp_path / "queries.jsonl").write_text(queries)
    outputs = {}
    for where, model, inputs, out in ((work, model_dir, f"gs://{bucket}/queries.jsonl", f"gs://{bucket}/eval"),
                                      (work, str(tmp_path / "ref"), str(tmp_path / "queries.jsonl"),
                                       str(tmp_path / "eval"))):
        common = [*CONFIG, f"--gin.MODEL_DIR='{model}'"]
        env_here = {"TEMPLM_DATA_DIR": remote_data if model == model_dir else data_dir}
        result = run_templm("eval", *common, "--split=validation", "--num_examples=4", f"--out={out}", cwd=where,
                            env=env_here)
        assert result.returncode == 0, result.stderr[-3000:]
        result = run_templm("infer", *common, f"--input={inputs}", f"--output={out}/predictions.jsonl", cwd=where,
                            env=env_here)
        assert result.returncode == 0, result.stderr[-3000:]
        with paths.open(f"{out}/eval_validation.json") as f:
            report = json.load(f)
        with paths.open(f"{out}/predictions.jsonl") as f:
            outputs[model] = (report["metrics"], report["step"], f.read())
    assert outputs[model_dir] == outputs[str(tmp_path / "ref")]
    assert os.listdir(work) == []  # no ./gs:/... folder where the commands ran
