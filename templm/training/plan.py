"""`templm plan`: will a T5 training configuration fit a device mesh? Answered before launching, on this machine.

The train step of the configuration (model, optimizer, batch, lengths, microbatches, mesh and logical-axis rules, as
`templm.train` binds them) is lowered and compiled for fake CPU devices laid out as the mesh, on abstract inputs:
no parameter is allocated. Per device: the bytes of the parameters and of the optimizer state (from each array's
shard), of one batch, and the compiled step's temporary memory (XLA's memory analysis), against the memory of the
device kind. The step is compiled for one and two layers a stack and its temporaries extended linearly to the
model's layers (`layer_extrapolated`; `exact=True` compiles the model itself): the layers are unrolled, so a whole
T5-large step takes minutes to compile on a laptop, its one- and two-layer steps seconds. Arrays whose sharded
dimensions do not divide the mesh axes are reported instead (jit refuses them).

CPU compilation approximates the accelerator's: XLA's temporary memory differs between backends (fusion, layouts),
so the verdict keeps a margin (`HEADROOM`).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from templm.training import partitioning
from templm.training.state import mesh_rules, optimizer_state_shardings

GIB = 1 << 30
# Memory of one JAX device of each kind (a TPU v3 core has half of its chip's 32 GiB; a v4 chip is one device).
DEVICE_MEMORY_GIB: Dict[str, float] = {"tpu_v3": 16, "tpu_v4": 32, "tpu_v5e": 16, "tpu_v5p": 95, "a100_40": 40,
                                       "a100_80": 80, "h100": 80, "h200": 141, "cpu": 16}
HEADROOM = 0.9  # the verdict "fits" leaves this share of the device's memory as the most the estimate may take
BATCH_KEYS = ("encoder_input_tokens", "encoder_segment_ids", "encoder_positions", "decoder_input_tokens",
              "decoder_target_tokens", "decoder_loss_weights", "decoder_segment_ids", "decoder_positions")


def _axis_size(mesh, axes) -> int:
    return int(np.prod([mesh.shape[a] for a in (axes if isinstance(axes, tuple) else (axes,))]))


def _device_bytes(tree: Any, mesh) -> int:
    """Bytes one device holds of a pytree of ShapeDtypeStructs with NamedShardings (the largest shard: a dimension
    the axes do not divide is rounded up)."""
    total = 0
    for leaf in jax.tree.leaves(tree):
        spec = tuple(getattr(leaf.sharding, "spec", None) or ())
        shape = [-(-size // _axis_size(mesh, spec[d])) if d < len(spec) and spec[d] is not None else size
                 for d, size in enumerate(leaf.shape)]
        total += int(np.prod(shape, dtype=np.int64)) * np.dtype(leaf.dtype).itemsize
    return total


def _uneven(tree: Any, mesh) -> List[str]:
    """The arrays whose sharded dimensions the mesh axes do not divide, as "path: dimension d of size n over axis
    a of size k"."""
    problems = []
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
        spec = getattr(leaf.sharding, "spec", None) or ()
        for dim, axes in enumerate(spec):
            if axes is None:
                continue
            size = _axis_size(mesh, axes)
            if leaf.shape[dim] % size:
                problems.append(f"{jax.tree_util.keystr(path)}: dimension {dim} of size {leaf.shape[dim]} over "
                                f"{axes} of size {size}")
    return problems


def _optimizer_state(tx, params: Any, mesh) -> Any:
    """The optimizer state's shapes with the layout training gives it (state.optimizer_state_shardings)."""
    shardings = optimizer_state_shardings(tx, params, mesh)
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                        jax.eval_shape(tx.init, params), shardings)


def _measure(parameters: int, state: Any, batch: Any, mesh, device_kind: str,
             temp: Optional[Callable[[], Tuple[int, str]]]) -> Dict[str, Any]:
    """The plan's dict for abstract `state` and `batch` (ShapeDtypeStructs with shardings); `temp()` gives the step's
    temporary bytes and how they were found (None: the step is not compiled)."""
    if device_kind not in DEVICE_MEMORY_GIB:
        raise ValueError(f"device kind {device_kind!r}: expected one of {', '.join(DEVICE_MEMORY_GIB)}")
    uneven = _uneven(state, mesh) + _uneven(batch, mesh)
    memory = DEVICE_MEMORY_GIB[device_kind] * GIB
    result: Dict[str, Any] = {
        "mesh": dict(mesh.shape), "devices": int(mesh.size), "device_kind": device_kind, "device_memory": memory,
        "parameters": int(parameters),
        "bytes": {"params": _device_bytes(state["params"], mesh), "opt_state": _device_bytes(state["opt_state"], mesh),
                  "batch": _device_bytes(batch, mesh), "temp": None, "total": None},
        "uneven": uneven, "fits": None, "temp_from": None}
    if uneven or temp is None:
        return result
    b = result["bytes"]
    b["temp"], result["temp_from"] = temp()
    b["total"] = b["params"] + b["opt_state"] + b["batch"] + b["temp"]
    result["fits"] = b["total"] <= HEADROOM * memory
    return result


def _compiled_temp(state: Any, batch: Any, step_fn: Any, mesh) -> int:
    """The temporary bytes per device of step_fn(state, batch, rng) -> (state, metrics), compiled with the state
    donated, as the trainers compile it (XLA's memory analysis)."""
    replicated = partitioning.replicated(mesh)
    step = jax.jit(step_fn, in_shardings=(jax.tree.map(lambda x: x.sharding, state),
                                          jax.tree.map(lambda x: x.sharding, batch), replicated),
                   out_shardings=(jax.tree.map(lambda x: x.sharding, state), replicated), donate_argnums=0)
    rng = jax.ShapeDtypeStruct(jax.random.key(0).shape, jax.random.key(0).dtype, sharding=replicated)
    analysis = step.lower(state, batch, rng).compile().memory_analysis()
    return int(getattr(analysis, "temp_size_in_bytes", 0) or 0)


def layer_extrapolated(compiled: Callable[[Tuple[int, ...]], int], layers: Tuple[int, ...],
                       exact: bool) -> Tuple[int, str]:
    """The step's temporary bytes for a stack of `layers` (one count per stack: T5's encoder and decoder, the
    Transformer-XL's one), and how they were found. A step's temporaries grow by the same bytes with each layer of a
    stack (its saved activations, its gradients, its optimizer update), so they are compiled for one layer per stack
    and for two layers in each stack in turn, and extended linearly: a few layers compile in seconds where the whole
    unrolled stack takes minutes (T5-large: 48 layers). `compiled(layers)` compiles the step of a model with those
    layers. `exact` (or a model of at most two layers a stack) compiles the model itself."""
    if exact or max(layers) <= 2:
        return compiled(layers), "compiled"
    base = compiled(tuple(1 for _ in layers))
    if len(set(layers)) == 1:  # stacks of one depth: grow them together
        return base + (layers[0] - 1) * (compiled(tuple(2 for _ in layers)) - base), "extrapolated"
    total = base
    for i, n in enumerate(layers):
        total += (n - 1) * (compiled(tuple(2 if j == i else 1 for j in range(len(layers)))) - base)
    return total, "extrapolated"


def plan(model: Any, tx: Any, lengths: Mapping[str, int], batch_size: int, mesh, rules,
         microbatches: int = 1, device_kind: str = "tpu_v4", compile_step: bool = True,
         exact: bool = False) -> Dict[str, Any]:
    """The memory plan of one T5 train step (module docstring) as a dict: mesh, device_kind, device_memory, bytes
    per device (params, opt_state, batch, temp, total), uneven (arrays the mesh cannot shard), fits (bool, or None
    when the step was not compiled), parameters (the model's parameter count) and temp_from ("compiled", or
    "extrapolated" from models of one and two layers a stack: `layer_extrapolated`; `exact` compiles the model)."""
    from templm.training.trainer import make_train_step  # the step templm trains with

    def abstract(variant):
        shapes = jax.eval_shape(lambda rng: variant.init(rng, lengths["inputs"], lengths["targets"]),
                                jax.random.key(0))
        param_shardings = partitioning.logical_shardings(variant.logical_partition_specs(), mesh, rules)
        params = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), shapes,
                              param_shardings)
        replicated = partitioning.replicated(mesh)
        state = {"step": jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated), "params": params,
                 "opt_state": _optimizer_state(tx, params, mesh)}
        data = partitioning.data_sharding(mesh)
        batch = {key: jax.ShapeDtypeStruct((batch_size, lengths["targets" if key.startswith("decoder") else
                                                                "inputs"]), jnp.int32, sharding=data)
                 for key in BATCH_KEYS}
        return sum(np.prod(p.shape, dtype=np.int64) for p in jax.tree.leaves(shapes)), state, batch

    def compiled(layers):
        variant = _with_layers(model, num_encoder_layers=layers[0], num_decoder_layers=layers[1])
        _, state, batch = abstract(variant)
        return _compiled_temp(state, batch, make_train_step(variant, tx, microbatches), mesh)

    with mesh_rules(mesh, rules):
        parameters, state, batch = abstract(model)
        layers = (model.config.num_encoder_layers, model.config.num_decoder_layers)
        return _measure(parameters, state, batch, mesh, device_kind,
                        (lambda: layer_extrapolated(compiled, layers, exact)) if compile_step else None)


def _with_layers(model: Any, **layers: int) -> Any:
    """The model with other layer counts (the same class, its other settings kept); the model itself where they
    are its own."""
    import copy
    import dataclasses

    if all(getattr(model.config, name) == value for name, value in layers.items()):
        return model
    variant = copy.copy(model)
    variant.config = dataclasses.replace(model.config, **layers)
    variant.module = type(model.module)(variant.config)
    return variant


def plan_lm(config: Any, tx: Any, batch_size: int, mesh, rules, device_kind: str = "tpu_v4",
            compile_step: bool = True, exact: bool = False) -> Dict[str, Any]:
    """The memory plan of one Transformer-XL train step (templm.training.lm_trainer's, memories in the state), as
    `plan` gives it for T5: `config` a TransformerXLConfig, batch_size rows of config.tgt_len tokens."""
    import dataclasses

    import flax.linen as nn
    from jax.sharding import PartitionSpec

    from templm.models.transformer_xl import TransformerXL
    from templm.training.lm_trainer import make_lm_train_step

    def abstract(cfg):
        model = TransformerXL(cfg)
        tokens = jax.ShapeDtypeStruct((batch_size, cfg.tgt_len), jnp.int32)
        boxed = jax.eval_shape(lambda rng: model.init(rng, jnp.zeros(tokens.shape, tokens.dtype), None, True,
                                                      mem_len=0)["params"], jax.random.key(0))
        param_shardings = partitioning.logical_shardings(nn.get_partition_spec(boxed), mesh, rules)
        shapes = jax.tree.map(lambda x: x.value if isinstance(x, nn.meta.AxisMetadata) else x, boxed,
                              is_leaf=lambda x: isinstance(x, nn.meta.AxisMetadata))  # the boxes' shapes
        params = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), shapes,
                              param_shardings)
        replicated = partitioning.replicated(mesh)
        mem_sharding = partitioning.logical_shardings(PartitionSpec("batch", "length", "embed"), mesh, rules)
        rows = partitioning.logical_shardings(PartitionSpec("batch"), mesh, rules)
        state = {"step": jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated), "params": params,
                 "opt_state": _optimizer_state(tx, params, mesh),
                 "mems": [jax.ShapeDtypeStruct((batch_size, cfg.mem_len, cfg.d_model), cfg.dtype,
                                               sharding=mem_sharding) for _ in range(cfg.n_layer + 1)],
                 "mem_valid": jax.ShapeDtypeStruct((batch_size,), jnp.int32, sharding=rows)}
        data = partitioning.data_sharding(mesh)
        batch = {"inputs": jax.ShapeDtypeStruct((batch_size, cfg.tgt_len), jnp.int32, sharding=data),
                 "targets": jax.ShapeDtypeStruct((batch_size, cfg.tgt_len), jnp.int32, sharding=data),
                 "reset": jax.ShapeDtypeStruct((batch_size,), jnp.int32, sharding=data)}
        parameters = sum(np.prod(p.shape, dtype=np.int64) for p in jax.tree.leaves(shapes))
        return parameters, state, batch, make_lm_train_step(model, tx, cfg.mem_len)

    def compiled(layers):
        _, state, batch, step = abstract(dataclasses.replace(config, n_layer=layers[0]))
        return _compiled_temp(state, batch, step, mesh)

    with mesh_rules(mesh, rules):
        parameters, state, batch, _ = abstract(config)
        return _measure(parameters, state, batch, mesh, device_kind,
                        (lambda: layer_extrapolated(compiled, (config.n_layer,), exact)) if compile_step else None)


MICROBATCHES = (2, 4, 8, 16, 32)  # what a remedy tries first, for a step that splits its batch (T5's)


def find_remedy(attempt: Callable[[int, Tuple[int, int]], Mapping[str, Any]], mesh_shape: Tuple[int, int],
                batch_size: int, microbatches: Optional[int] = 1) -> Optional[Dict[str, Any]]:
    """What makes a configuration that does not fit fit, computed: each candidate is planned (compiled) by
    `attempt(microbatches, (data, model))` in order, and the first that fits and shards is returned as
    {"change", "microbatches", "mesh_shape", "result"}; None when none does. Candidates: more microbatches (those
    dividing a data shard's rows; `microbatches` None for a step without them), then a larger model axis on the same
    devices (data / 2 x model * 2, and so on), which shards the parameters, the optimizer state and the
    activations further but needs dimensions the new axis divides."""
    data, model = mesh_shape
    candidates = []
    if microbatches is not None:
        rows = batch_size // data
        candidates += [(f"microbatches={m}", m, mesh_shape) for m in MICROBATCHES if m > microbatches and rows % m == 0]
    factor = 2
    while data % factor == 0:
        candidates.append((f"mesh data {data // factor} x model {model * factor} "
                           f"(templm.make_mesh.mesh_shape=({data // factor}, {model * factor}))",
                           microbatches or 1, (data // factor, model * factor)))
        factor *= 2
    for change, m, shape in candidates:
        result = attempt(m, shape)
        if not result["uneven"] and result["fits"]:
            return {"change": change, "microbatches": m, "mesh_shape": shape, "result": dict(result)}
    return None


def describe_remedy(result: Mapping[str, Any], remedy: Optional[Mapping[str, Any]]) -> str:
    """The line `templm plan` prints under a verdict of "does not fit": the remedy it computed, or that none of the
    candidates fits."""
    if result["fits"] is not False:
        return ""
    if remedy is None:
        return ("  no remedy among more microbatches and a larger model axis on these devices: a larger device kind, "
                "more devices, or a smaller batch")
    found = remedy["result"]
    return (f"  remedy: {remedy['change']} fits ({100 * found['bytes']['total'] / found['device_memory']:.1f}% of the "
            f"device's memory, step temporaries {found['bytes']['temp'] / GIB:.2f} GiB)")


def describe(result: Mapping[str, Any], name: Optional[str] = None) -> str:
    """The plan as the lines `templm plan` prints."""
    mesh = " x ".join(f"{axis} {size}" for axis, size in result["mesh"].items())
    lines = [f"{name + ': ' if name else ''}{result['parameters']:,} parameters on {result['devices']} "
             f"{result['device_kind']} devices ({mesh}), {result['device_memory'] / GIB:.0f} GiB each"]
    b = result["bytes"]
    for key, label in (("params", "parameters"), ("opt_state", "optimizer state"), ("batch", "batch"),
                       ("temp", "step temporaries"), ("total", "total")):
        if b[key] is not None:
            if key == "temp":
                label += " (compiled)" if result.get("temp_from") == "compiled" else " (1-2 layers, extended)"
            lines.append(f"  {label:32s} {b[key] / GIB:9.3f} GiB per device")
    if result["uneven"]:
        lines.append("  does not shard: " + "; ".join(result["uneven"][:5]) +
                     (f"; ... ({len(result['uneven'])} arrays)" if len(result["uneven"]) > 5 else ""))
    elif result["fits"] is not None:
        share = b["total"] / result["device_memory"]
        lines.append(f"  {'fits' if result['fits'] else 'does not fit'}: {100 * share:.1f}% of the device's memory "
                     f"(the verdict allows {100 * HEADROOM:.0f}%)")
    return "\n".join(lines)
