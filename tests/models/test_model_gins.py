"""The model sizes are defined once: each gin_configs/models/t5_1_1_SIZE.gin (what `templm train` reads) builds
templm.models.t5.T5_1_1_CONFIGS[SIZE] (what the study and the size messages use) in every field but the compute
dtype (the gins of base and up compute in bfloat16, for accelerators), and every size of the table has its gin
file."""

import dataclasses
import os

import gin
import jax.numpy as jnp
import pytest

from templm.cli import REPO_ROOT, parse_gin
from templm.models.t5 import T5_1_1_CONFIGS, T5Config
import templm.training.trainer  # noqa: F401  (registers templm.T5Config and templm.EncoderDecoderModel with gin)


def test_every_size_of_the_table_has_a_gin_file_and_no_gin_file_is_outside_it():
    folder = os.path.join(REPO_ROOT, "gin_configs", "models")
    sizes = sorted(name[len("t5_1_1_"):-len(".gin")] for name in os.listdir(folder) if name.startswith("t5_1_1_"))
    assert sizes == sorted(T5_1_1_CONFIGS)


@pytest.mark.parametrize("size", sorted(T5_1_1_CONFIGS))
def test_a_model_gin_builds_the_tables_config(size):
    try:
        parse_gin([f"gin_configs/models/t5_1_1_{size}.gin"], ["DROPOUT_RATE = 0.0"])
        built = gin.get_configurable(T5Config)()
    finally:
        gin.clear_config()
    table = T5_1_1_CONFIGS[size]
    assert jnp.dtype(built.dtype) == jnp.dtype("bfloat16" if size in ("base", "large", "xl", "xxl") else "float32")
    assert dataclasses.replace(built, dtype=table.dtype) == table
