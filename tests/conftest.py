"""Suite-wide settings: 8 fake CPU devices for sharding tests, a persistent JAX compilation cache, quiet TF."""

import os

# Before jax or tensorflow are imported anywhere in the suite.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR",
                      os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".cache", "jax"))


import pytest  # noqa: E402  (after the environment above)


@pytest.fixture(scope="module")
def task_data_for(tmp_path_factory):
    """build(name, TaskDataConfig) -> folder: task data in a fresh temporary folder, with the SeqIO tasks registered
    over it; the default registry is restored when the test module is done, so other modules see the usual one."""
    import tasks
    from templm.data.task_data import prepare_task_data

    def build(name, config):
        out = str(tmp_path_factory.mktemp(name) / "data")
        prepare_task_data(config, out)
        tasks.configure(data_dir=out)
        return out

    yield build
    tasks.configure()
