"""Optimizers from optax with T5's defaults: Adafactor (factored second moments, decay 0.8), or AdamW.

Learning rates: constant (0.001, the paper's fine-tuning rate) or T5X's rsqrt schedule,
lr = base / sqrt(max(step, warmup_steps)).
"""

from __future__ import annotations

import gin
import jax.numpy as jnp
import optax


@gin.configurable(module="templm")
def learning_rate_schedule(kind: str = "constant", base_learning_rate: float = 0.001, warmup_steps: int = 10_000):
    if kind == "constant":
        return optax.constant_schedule(base_learning_rate)
    if kind == "rsqrt":
        return lambda step: base_learning_rate / jnp.sqrt(jnp.maximum(step, warmup_steps).astype(jnp.float32))
    raise ValueError(f"learning_rate_schedule.kind must be 'constant' or 'rsqrt', got {kind!r}")


@gin.configurable(module="templm")
def make_optimizer(name: str = "adafactor", learning_rate=None, decay_rate: float = 0.8,
                   clipping_threshold: float = 1.0, weight_decay: float = 0.0,
                   max_grad_norm: float = 0.0) -> optax.GradientTransformation:
    """`adafactor` (T5 defaults) or `adamw`; `max_grad_norm` > 0 adds global-norm clipping first."""
    learning_rate = learning_rate if learning_rate is not None else learning_rate_schedule()
    if name == "adafactor":
        tx = optax.adafactor(learning_rate=learning_rate, decay_rate=decay_rate, clipping_threshold=clipping_threshold,
                             multiply_by_parameter_scale=True, factored=True,
                             weight_decay_rate=weight_decay or None)
    elif name == "adamw":
        tx = optax.adamw(learning_rate=learning_rate, weight_decay=weight_decay)
    else:
        raise ValueError(f"make_optimizer.name must be 'adafactor' or 'adamw', got {name!r}")
    if max_grad_norm > 0:
        tx = optax.chain(optax.clip_by_global_norm(max_grad_norm), tx)
    return tx
