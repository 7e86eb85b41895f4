"""Device meshes and the logical-axis rules that map parameter and activation axes onto them (T5X's scheme).

Parameters and activations carry logical names (`batch`, `length`, `embed`, `mlp`, `heads`, `kv`, `joined_kv`,
`vocab`, `relpos_buckets`); one rules table maps each onto a mesh axis (`data` or `model`) or leaves it replicated.
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

import flax.linen as nn
import gin
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "model")

# T5X's standard rules (t5x.partitioning.standard_logical_axis_rules with 1-D parameter partitioning).
STANDARD_LOGICAL_AXIS_RULES: Tuple[Tuple[str, Optional[str]], ...] = (
    ("batch", "data"),
    ("vocab", "model"),
    ("embed", None),
    ("mlp", "model"),
    ("heads", "model"),
    ("kv", None),
    ("joined_kv", "model"),
    ("relpos_buckets", None),
    ("abspos_buckets", None),
    ("length", None),
    ("layers", None),
    ("stack", None),
    ("mlp_activations", None),
)


@gin.configurable(module="templm")
def make_mesh(num_partitions: int = 1, mesh_shape: Optional[Sequence[int]] = None,
              devices: Optional[Sequence[jax.Device]] = None) -> Mesh:
    """A ("data", "model") mesh: `mesh_shape` = (data, model) if given, else model = `num_partitions`."""
    devices = list(devices if devices is not None else jax.devices())
    if mesh_shape is None:
        if len(devices) % num_partitions:
            raise ValueError(f"num_partitions={num_partitions} does not divide the {len(devices)} devices")
        mesh_shape = (len(devices) // num_partitions, num_partitions)
    mesh_shape = tuple(int(d) for d in mesh_shape)
    if len(mesh_shape) != 2 or int(np.prod(mesh_shape)) != len(devices):
        raise ValueError(f"mesh_shape {mesh_shape} does not hold the {len(devices)} devices as (data, model)")
    # Devices of one process stay together along the data axis, so each host feeds a contiguous block of rows.
    grid = np.array(sorted(devices, key=lambda d: (d.process_index, d.id))).reshape(mesh_shape)
    return Mesh(grid, MESH_AXES)


@gin.configurable(module="templm")
def logical_axis_rules(rules: Sequence[Tuple[str, Optional[str]]] = STANDARD_LOGICAL_AXIS_RULES):
    """The rules table, bindable in gin (`logical_axis_rules.rules = [...]`)."""
    return tuple((name, axis) for name, axis in rules)


def logical_shardings(logical_specs, mesh: Mesh, rules) -> object:
    """NamedShardings for a pytree of logical PartitionSpecs."""
    return nn.logical_to_mesh_sharding(logical_specs, mesh, list(rules))


def data_sharding(mesh: Mesh) -> NamedSharding:
    """Batches are split along the mesh's data axis, replicated along the model axis."""
    return NamedSharding(mesh, PartitionSpec("data"))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())
