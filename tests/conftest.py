"""Suite-wide settings: 8 fake CPU devices for sharding tests, a persistent JAX compilation cache, quiet TF."""

import os

# Before jax or tensorflow are imported anywhere in the suite.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR",
                      os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".cache", "jax"))
