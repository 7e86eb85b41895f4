"""The train state, created already laid out on the device mesh, and the update step compiled once for it.

As in big_vision: parameters are created by a jitted init whose outputs are placed by the logical-axis rules, so no
host ever holds the whole model; the optimizer statistics take the layout XLA propagates from the parameters (scalar
counts are replicated); the step counter is replicated. Both trainers (T5 and Transformer-XL) and the benchmark tools
build their state and step with these functions.

The state is a dict {"step", "params", "opt_state", ...extra}; extra holds what a model carries from step to step
(the Transformer-XL's memories), already placed.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Callable, Dict, Iterator, Mapping, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from templm.errors import ConfigError, require_memory
from templm.training import partitioning


@contextlib.contextmanager
def mesh_rules(mesh, rules) -> Iterator[None]:
    """The mesh and the logical-axis rules in effect (for init, the step and restores)."""
    with jax.set_mesh(mesh), nn.logical_axis_rules(list(rules)):
        yield


def sharded_params(init_fn: Callable[[jax.Array], Any], param_shardings: Any, seed: int) -> Any:
    """init_fn(rng) -> parameters, run jitted with its outputs laid out by `param_shardings`, once their size is
    known to fit (`require_params_fit`)."""
    rng = jax.random.key(seed)
    require_params_fit(jax.eval_shape(init_fn, rng), param_shardings)
    return jax.jit(init_fn, out_shardings=param_shardings)(rng)


def require_params_fit(shapes: Any, param_shardings: Any) -> None:
    """A ConfigError, before anything is allocated, when the parameters of these shapes cannot fit where they go:
    more than half of the machine's memory on CPU devices (which share it), or more than a device's memory over all
    devices when split evenly (the least any layout needs). A model size given by mistake (an emb_dim of 2^26: 8
    TiB) used to grow the process until the system killed it."""
    leaves = jax.tree.leaves(shapes)
    needed = float(sum(math.prod(leaf.shape) * jnp.dtype(leaf.dtype).itemsize for leaf in leaves))
    devices = sorted({d for s in jax.tree.leaves(param_shardings) for d in s.device_set}, key=lambda d: d.id)
    what = f"the model's {sum(math.prod(leaf.shape) for leaf in leaves):,} parameters (the sizes its gin config binds)"
    if not devices or devices[0].platform == "cpu":
        require_memory(needed, what)
        return
    stats = devices[0].memory_stats() or {}
    limit = stats.get("bytes_limit")
    if limit and needed / len(devices) > limit:
        raise ConfigError(f"{what}: {needed / 2 ** 30:,.1f} GiB, more than the {len(devices)} devices hold even "
                          f"split evenly ({limit / 2 ** 30:,.1f} GiB each); choose a smaller model or more devices")


def optimizer_state_shardings(tx, params: Any, mesh) -> Any:
    """The layout of the optimizer state of `params` (arrays on the mesh, or ShapeDtypeStructs with their
    shardings): a statistic of one parameter with that parameter's shape (Adam's two moments, Adafactor's
    unfactored second moment) lies as the parameter does; any other array (Adafactor's factored rows and columns,
    step counts) as XLA propagates it through `tx.init`, replicated where that would leave it on part of the mesh.
    (The moments are zeros, constants to XLA, which it would otherwise replicate: Adam's state took four times the
    sharded parameters' bytes on a model axis.) Asked of the compiler without allocating anything; `train_state`
    lays the state out so, and `templm plan` counts its bytes so."""
    replicated = partitioning.replicated(mesh)
    compiled = jax.jit(tx.init).lower(params).compile().output_shardings
    owners = {tuple(path): leaf for path, leaf in jax.tree_util.tree_leaves_with_path(params)}

    def layout(path, shape, found):
        for start in range(len(path)):  # the state's path ends with its parameter's (mu['encoder'][...]['kernel'])
            owner = owners.get(tuple(path[start:]))
            if owner is not None and tuple(owner.shape) == tuple(shape.shape):
                return owner.sharding
        return found if len(found.device_set) == mesh.size else replicated

    return jax.tree_util.tree_map_with_path(layout, jax.eval_shape(tx.init, params), compiled)


def train_state(params: Any, tx, mesh, **extra: Any) -> Tuple[Dict[str, Any], Any]:
    """(state, its shardings) for parameters already on the mesh: the optimizer initialised beside them
    (`optimizer_state_shardings`)."""
    replicated = partitioning.replicated(mesh)
    opt_state = jax.jit(tx.init, out_shardings=optimizer_state_shardings(tx, params, mesh))(params)
    state = {"step": jax.device_put(jnp.zeros((), jnp.int32), replicated), "params": params, "opt_state": opt_state,
             **extra}
    return state, jax.tree.map(lambda x: x.sharding, state)


def compile_step(step_fn: Callable, state_shardings: Any, batch_shardings: Any, mesh) -> Callable:
    """step_fn(state, batch, rng) -> (state, metrics), jitted once with explicit shardings and the state donated."""
    replicated = partitioning.replicated(mesh)
    return jax.jit(step_fn, in_shardings=(state_shardings, batch_shardings, replicated),
                   out_shardings=(state_shardings, replicated), donate_argnums=0)


def global_batch(local: Mapping[str, Any], shardings: Any) -> Dict[str, jax.Array]:
    """This process's rows of a batch as global arrays (`shardings`: one sharding, or one per key)."""
    pick = shardings.get if isinstance(shardings, Mapping) else (lambda key: shardings)
    return {k: jax.make_array_from_process_local_data(pick(k), v) for k, v in local.items()}
