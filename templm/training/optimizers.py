"""Optimizers and learning-rate schedules from optax, for both trainers.

Optimizers: Adafactor with T5's defaults (factored second moments, decay 0.8, update clipping 1.0, parameter-scaled
steps), Adam (Transformer-XL's recipe) or AdamW; `max_grad_norm` > 0 clips gradients by their global norm first.

Schedules: "constant" (0.001, the time-aware T5 paper's fine-tuning rate), T5X's "rsqrt" (base / sqrt(max(step,
warmup_steps))), and "cosine" (Transformer-XL's: decay to 0 at `decay_steps`); "constant" and "cosine" start with a
linear warm-up from 0 over `warmup_steps` when it is positive.
"""

from __future__ import annotations

from typing import Callable, Optional

import gin
import jax.numpy as jnp
import optax

from templm.errors import require_numbers

OPTIMIZERS = ("adafactor", "adam", "adamw")
SCHEDULES = ("constant", "rsqrt", "cosine")
RSQRT_WARMUP_STEPS = 10_000  # T5X's default


@gin.configurable(module="templm")
def learning_rate_schedule(kind: str = "constant", base_learning_rate: float = 0.001,
                           warmup_steps: Optional[int] = None, decay_steps: int = 1):
    """The learning rate by step. warmup_steps: default 10,000 for "rsqrt" (T5X), 0 otherwise; decay_steps: where
    "cosine" reaches 0 (the run's train_steps)."""
    require_numbers("templm.learning_rate_schedule", {
        "base_learning_rate": (base_learning_rate, float, 0, None), "warmup_steps": (warmup_steps, int, 0, None),
        "decay_steps": (decay_steps, int, 1, None)}, optional=("warmup_steps",))
    if kind == "rsqrt":
        warmup = RSQRT_WARMUP_STEPS if warmup_steps is None else warmup_steps
        if warmup < 1:
            raise ValueError(f"learning_rate_schedule: 'rsqrt' needs warmup_steps >= 1, got {warmup}")
        return lambda step: base_learning_rate / jnp.sqrt(jnp.maximum(step, warmup).astype(jnp.float32))
    warmup = warmup_steps or 0
    if kind == "constant":
        main = optax.constant_schedule(base_learning_rate)
    elif kind == "cosine":
        main = optax.cosine_decay_schedule(base_learning_rate, max(1, decay_steps - warmup))
    else:
        raise ValueError(f"learning_rate_schedule.kind must be one of {SCHEDULES}, got {kind!r}")
    if warmup > 0:
        return optax.join_schedules([optax.linear_schedule(0.0, base_learning_rate, warmup), main], [warmup])
    return main


@gin.configurable(module="templm")
def make_optimizer(name: str = "adafactor", learning_rate=None, decay_rate: float = 0.8,
                   clipping_threshold: float = 1.0, b1: float = 0.9, b2: float = 0.999, weight_decay: float = 0.0,
                   max_grad_norm: float = 0.0) -> optax.GradientTransformation:
    """`adafactor` (T5's defaults), `adam` or `adamw`; learning_rate: a number or a schedule (default: the gin-bound
    `learning_rate_schedule()`)."""
    if not callable(learning_rate):  # a number (a schedule is checked where it is made)
        require_numbers("templm.make_optimizer", {"learning_rate": (learning_rate, float, 0, None)},
                        optional=("learning_rate",))
    require_numbers("templm.make_optimizer", {
        "decay_rate": (decay_rate, float, 0, None), "clipping_threshold": (clipping_threshold, float, 0, None),
        "b1": (b1, float, 0, None), "b2": (b2, float, 0, None), "weight_decay": (weight_decay, float, 0, None),
        "max_grad_norm": (max_grad_norm, float, 0, None)})
    learning_rate = learning_rate if learning_rate is not None else learning_rate_schedule()
    if name == "adafactor":
        tx = optax.adafactor(learning_rate=learning_rate, decay_rate=decay_rate, clipping_threshold=clipping_threshold,
                             multiply_by_parameter_scale=True, factored=True,
                             weight_decay_rate=weight_decay or None)
    elif name == "adam" and not weight_decay:
        tx = optax.adam(learning_rate, b1=b1, b2=b2)
    elif name in ("adam", "adamw"):
        tx = optax.adamw(learning_rate, b1=b1, b2=b2, weight_decay=weight_decay)
    else:
        raise ValueError(f"make_optimizer.name must be one of {OPTIMIZERS}, got {name!r}")
    if max_grad_norm > 0:
        tx = optax.chain(optax.clip_by_global_norm(max_grad_norm), tx)
    return tx


def logged_learning_rate() -> Optional[Callable[[int], float]]:
    """The learning rate `make_optimizer()` uses, by step, for the logs: the gin-bound `learning_rate_schedule()`,
    or a number bound to `make_optimizer.learning_rate`; None where gin binds something else there."""
    try:
        bound = gin.query_parameter("templm.make_optimizer.learning_rate")
    except ValueError:  # not bound: make_optimizer takes learning_rate_schedule()
        schedule = learning_rate_schedule()
        return lambda step: float(schedule(step))
    if isinstance(bound, (int, float)) and not isinstance(bound, bool):
        return lambda step: float(bound)
    return None


def bound_optimizer() -> str:
    """What gin binds for `make_optimizer()` and its schedule, as one hashable value: two runs whose optimizers
    `make_optimizer()` builds with equal bindings compile the same update step (the step cache's key, loop.py)."""
    return repr([sorted(gin.get_bindings(f"templm.{name}").items(), key=lambda item: item[0])
                 for name in ("make_optimizer", "learning_rate_schedule")])


def bound_optimizer_name() -> str:
    """The optimizer `make_optimizer()` builds as gin binds it ("adafactor", "adam" or "adamw"): what a checkpoint's
    record says of the optimizer whose state it holds."""
    try:
        return str(gin.query_parameter("templm.make_optimizer.name"))
    except ValueError:  # not bound: make_optimizer's default
        return "adafactor"
