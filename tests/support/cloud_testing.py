"""Helpers of the tests in tests/cloud/: files of a local folder and of a bucket, uploads, waiting for an object."""

import json
import os
import socket
import time

import jax
import numpy as np

from templm import paths
from templm.training.checkpoints import load_params

CONFIG = ["--gin_file=temporal.gin", "--gin_file=runs/cpu_demo.gin",
          "--gin.TASK_FEATURE_LENGTHS={'inputs': 32, 'targets': 8}", "--gin.BATCH_SIZE=16", "--gin.EVAL_PERIOD=0",
          "--gin.templm.train.stats_period=1"]


def closed_port():
    """A port of 127.0.0.1 nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def upload(folder, url):
    """A local folder's files copied to `url`, as `gcloud storage cp -r` would; returns `url`."""
    for parent, _, names in os.walk(folder):
        for name in names:
            relative = os.path.relpath(os.path.join(parent, name), folder).replace(os.sep, "/")
            paths.copy(os.path.join(parent, name), f"{url}/{relative}", overwrite=True)
    return url


def local_files(folder):
    """{relative name: bytes} of every file under a local folder."""
    return {os.path.relpath(os.path.join(parent, name), folder).replace(os.sep, "/"):
            open(os.path.join(parent, name), "rb").read()
            for parent, _, names in os.walk(folder) for name in names}


def bucket_files(gcs, bucket):
    """{object name: bytes} of every object in the bucket, straight from the emulator."""
    return {name: gcs.read(bucket, name) for name in gcs.objects(bucket) if not name.endswith("/")}


def timeless(value):
    """A JSON value without the time things took (keys `seconds`, `elapsed_s`)."""
    if isinstance(value, dict):
        return {k: timeless(v) for k, v in value.items() if k not in ("seconds", "elapsed_s")}
    if isinstance(value, list):
        return [timeless(v) for v in value]
    return value


def params_equal(a_dir, b_dir):
    """(whether two checkpoint folders' latest parameters are equal bit for bit, the second one's record)."""
    a, _ = load_params(a_dir)
    b, meta = load_params(b_dir)
    same = jax.tree.map(lambda x, y: np.array_equal(np.asarray(x), np.asarray(y)), a, b)
    return all(jax.tree.leaves(same)), meta


def wait_for_object(gcs, bucket, name, proc, timeout=300):
    """Waits until the object `name` is in the bucket; AssertionError if `proc` ends first or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the run ended ({proc.returncode}): {proc.stderr.read()[-3000:]}")
        if name in gcs.objects(bucket):
            return
        time.sleep(0.2)
    raise AssertionError(f"no {name} within {timeout} s")


def comparable(text, out):
    """A results.json with its folder's name replaced and its timings left out."""
    results = json.loads(text.replace(out, "<OUT>"))
    results.pop("timing", None)
    return results
