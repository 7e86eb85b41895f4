"""Device meshes and the logical-axis rules that map parameter and activation axes onto them (T5X's scheme).

Parameters and activations carry logical names (`batch`, `length`, `embed`, `mlp`, `heads`, `kv`, `joined_kv`,
`vocab`, `relpos_buckets`); one rules table maps each onto a mesh axis (`data` or `model`) or leaves it replicated.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence, Tuple

import flax.linen as nn
import gin
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from templm.errors import require_numbers

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
        require_numbers("templm.make_mesh", {"num_partitions": (num_partitions, int, 1, None)})
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


# --------------------------------------------------------------------------------------------------------------------
# Several processes (multi-host): every process runs the same program; process 0 writes what is written once.


def initialize_distributed(coordinator_address: Optional[str], num_processes: Optional[int],
                           process_id: Optional[int]) -> None:
    """Joins the processes of one run (jax.distributed) when a coordinator is given; CPU hosts talk through gloo.
    Without one, a single process runs (on a Cloud TPU slice jax finds its hosts by itself)."""
    if coordinator_address:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(coordinator_address, num_processes, process_id)


def is_lead() -> bool:
    """Whether this process writes what a run writes once (results, reports, shared data): process 0."""
    return jax.process_index() == 0


def barrier(name: str) -> None:
    """Every process waits here until all have come (nothing to wait for in one process)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def on_lead(work: Callable[[], Any], failure: Callable[[], BaseException]) -> Any:
    """work() in process 0 alone, every process waiting until it is done: returns what it returned (None in the other
    processes). When it fails, process 0 raises its error and the others `failure()`, instead of waiting on a run
    that has ended. In one process, simply work()."""
    if jax.process_count() == 1:
        return work()
    from jax.experimental import multihost_utils

    result, done = None, False
    try:
        if is_lead():
            result = work()
        done = True
    finally:
        succeeded = bool(multihost_utils.broadcast_one_to_all(np.int32(1 if done else 0)))
        if not succeeded and not is_lead():
            raise failure()
    return result


def host_local(tree):
    """A pytree of arrays as whole values on this process's first device, so that one process can evaluate alone:
    arrays that span several processes are gathered from all of them (every process must call this at the same
    point). In one process the tree is returned as it is."""
    if jax.process_count() == 1:
        return tree
    from jax.experimental import multihost_utils

    return jax.device_put(multihost_utils.process_allgather(tree, tiled=True), jax.local_devices()[0])


def run_devices() -> list:
    """The devices one run of the study trains on: every accelerator; on CPU one device per process (host devices of
    one process share its cores, so more of them only add overhead)."""
    devices = jax.devices()
    if devices[0].platform != "cpu":
        return list(devices)
    return [jax.local_devices(process_index=p)[0] for p in range(jax.process_count())]
