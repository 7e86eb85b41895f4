"""T5 v1.1 encoder-decoder in flax.linen, with T5X's parameter names, logical axes and initialisers.

Architecture (Raffel et al. 2020, v1.1 changes). Pre-norm residual blocks with RMSNorm (a scale, no bias, no mean
subtraction, eps 1e-6); no bias terms anywhere; attention logits are not divided by sqrt(head_dim) (T5 folds that
factor into the query initialiser); relative position biases (bucketed distances, one table per stack, computed
once per stack and shared by its layers: bidirectional in the encoder, causal in the decoder; none in
cross-attention); gated-GELU MLP `(gelu_tanh(x W_i0) * (x W_i1)) W_o` (or any `mlp_activations` list, e.g. `("relu",)`
for the original T5); dropout on embeddings, after each attention / MLP block, on attention weights and inside the
MLP (broadcast along length, as T5X); a final RMSNorm per stack; one token embedding shared by encoder and decoder;
an untied output layer (`logits_dense`), or logits via the embedding scaled by emb_dim**-0.5 when
`logits_via_embedding` (the original T5).

Parameter tree (T5X names, so T5X checkpoints map one to one):

    token_embedder/embedding                                  (vocab, embed)
    encoder/relpos_bias/rel_embedding                         (heads, relpos_buckets)
    encoder/layers_N/pre_attention_layer_norm/scale           (embed,)
    encoder/layers_N/attention/{query,key,value}/kernel       (embed, joined_kv)
    encoder/layers_N/attention/out/kernel                     (joined_kv, embed)
    encoder/layers_N/pre_mlp_layer_norm/scale                 (embed,)
    encoder/layers_N/mlp/{wi_0,wi_1 | wi}/kernel              (embed, mlp)
    encoder/layers_N/mlp/wo/kernel                            (mlp, embed)
    encoder/encoder_norm/scale                                (embed,)
    decoder/relpos_bias/rel_embedding                         (heads, relpos_buckets)
    decoder/layers_N/{pre_self_attention_layer_norm, self_attention, pre_cross_attention_layer_norm,
                      encoder_decoder_attention, pre_mlp_layer_norm, mlp}/...
    decoder/decoder_norm/scale                                (embed,)
    decoder/logits_dense/kernel                               (embed, vocab)      [absent when tied]

The relative bias table is (heads, buckets) with axes ("heads", "relpos_buckets"), as T5X stores it (Hugging Face
stores its transpose; the importer transposes). Activations are constrained to ("batch", "length", "embed"),
("batch", "length", "mlp"), ("batch", "length", "heads", "kv") and ("batch", "length", "vocab"); with no axis rules
in scope the constraints are no-ops.

Parameter count of T5 v1.1 small (vocab 32128, d 512, 6 heads x 64, mlp 1024, 8 + 8 layers): 76,961,152 =
2 * 32128 * 512 (embedding, untied logits) + 8 * (4 * 512 * 384 + 3 * 512 * 1024 + 2 * 512) (encoder layers)
+ 8 * (8 * 512 * 384 + 3 * 512 * 1024 + 3 * 512) (decoder layers) + 2 * 32 * 6 (relative biases) + 2 * 512 (final
norms). See `count_parameters`.

Packing (seqio.EncDecFeatureConverter(pack=True)): with `encoder_segment_ids` / `decoder_segment_ids`, attention
never crosses segments (and stays causal in the decoder); with `encoder_positions` / `decoder_positions`, relative
positions are differences of those positions. Padding is id 0 (and segment 0).

Decoding. `decode=True` uses a flax "cache" collection: first `EncoderDecoderModel.init_cache` creates zeros for
`max_decode_length` positions, then each call feeds one token and appends its keys and values. Greedy and beam search
(length penalty ((5 + len) / 6) ** alpha, alpha 0.6, early stop once no live beam can beat the finished ones) are
`jax.lax.while_loop`s in `EncoderDecoderModel`.

Hugging Face checkpoints: `load_hf_checkpoint(dir)` reads `config.json` and `model.safetensors` (or a sharded
`model.safetensors.index.json`) with safetensors, never pickle; `save_hf_checkpoint` writes the same format.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import numbers
import os
import re
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple, Union

import jax
import jax.numpy as jnp
import numpy as np
import flax.linen as nn
from jax import lax
from safetensors.numpy import load_file, save_file

from templm.errors import DataError, read_json, require_field_types

Array = jax.Array
PyTree = Any

PAD_ID = 0
EOS_ID = 1
DECODER_START_ID = 0

# A large negative number for masked attention logits and dead beams (finite, so no inf - inf = nan).
_MASK_VALUE = -1e10
_NEG_INF = -1.0e7

# Logical axis names of activations.
_HIDDEN_AXES = ("batch", "length", "embed")
_MLP_AXES = ("batch", "length", "mlp")
_HEADS_AXES = ("batch", "length", "heads", "kv")
_LOGITS_AXES = ("batch", "length", "vocab")

_REMAT_POLICIES = {
    "none": None,
    "full": jax.checkpoint_policies.nothing_saveable,
    "minimal": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}

_ACTIVATIONS: Dict[str, Callable[[Array], Array]] = {
    "gelu": functools.partial(jax.nn.gelu, approximate=True),  # T5X's and HF's "gelu_new" (tanh approximation)
    "gelu_exact": functools.partial(jax.nn.gelu, approximate=False),
    "relu": jax.nn.relu,
    "silu": jax.nn.silu,
    "linear": lambda x: x,
}


# ----------------------------------------------------------------------------------------------------------------------
# Configuration
# ----------------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class T5Config:
    """Sizes and options of a T5 encoder-decoder. Parameters are always float32; `dtype` is the compute dtype."""

    vocab_size: int
    emb_dim: int
    num_heads: int
    head_dim: int
    mlp_dim: int
    num_encoder_layers: int
    num_decoder_layers: int
    dropout_rate: float = 0.0
    mlp_activations: Tuple[str, ...] = ("gelu", "linear")
    logits_via_embedding: bool = False
    dtype: Any = jnp.float32
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    float32_attention_logits: bool = True
    layer_norm_epsilon: float = 1e-6
    remat_policy: str = "none"  # "none" | "full" (recompute each layer) | "minimal" (save matmul outputs)

    def __post_init__(self):
        require_field_types(self, "templm.T5Config")  # a quoted number or an infinity from gin, named
        object.__setattr__(self, "mlp_activations", tuple(self.mlp_activations))
        for name in ("vocab_size", "emb_dim", "num_heads", "head_dim", "mlp_dim", "num_encoder_layers",
                     "num_decoder_layers", "relative_attention_num_buckets", "relative_attention_max_distance"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
                raise ValueError(f"T5Config.{name} must be a positive integer, got {value!r}")
        if self.relative_attention_num_buckets < 4:
            raise ValueError("T5Config.relative_attention_num_buckets must be >= 4 "
                             f"(got {self.relative_attention_num_buckets})")
        if not 0.0 <= self.dropout_rate < 1.0:
            raise ValueError(f"T5Config.dropout_rate must be in [0, 1), got {self.dropout_rate!r}")
        if not self.mlp_activations:
            raise ValueError("T5Config.mlp_activations must name at least one activation")
        for act in self.mlp_activations:
            if act not in _ACTIVATIONS:
                raise ValueError(f"T5Config.mlp_activations: unknown activation {act!r}; expected one of "
                                 f"{sorted(_ACTIVATIONS)}")
        try:
            dtype = jnp.dtype(self.dtype)  # also accepts names ("bfloat16"), as gin files give them
        except TypeError:
            dtype = None
        if dtype not in (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
            raise ValueError(f"T5Config.dtype must be float32, bfloat16 or float16, got {self.dtype!r}")
        object.__setattr__(self, "dtype", dtype)
        if self.remat_policy not in _REMAT_POLICIES:
            raise ValueError(f"T5Config.remat_policy must be one of {sorted(_REMAT_POLICIES)}, "
                             f"got {self.remat_policy!r}")

    def replace(self, **changes) -> "T5Config":
        return dataclasses.replace(self, **changes)


def _t5_1_1(emb_dim, num_heads, mlp_dim, num_layers, vocab_size=32128, head_dim=64):
    return T5Config(vocab_size=vocab_size, emb_dim=emb_dim, num_heads=num_heads, head_dim=head_dim, mlp_dim=mlp_dim,
                    num_encoder_layers=num_layers, num_decoder_layers=num_layers)


# The published T5 v1.1 sizes (google/t5-v1_1-*), plus "tiny" for tests and laptop runs (vocabulary of the embedded
# world: 768 SentencePiece pieces + 100 sentinels).
T5_1_1_CONFIGS: Dict[str, T5Config] = {
    "tiny": _t5_1_1(64, 4, 128, 2, vocab_size=868, head_dim=16),
    "small": _t5_1_1(512, 6, 1024, 8),
    "base": _t5_1_1(768, 12, 2048, 12),
    "large": _t5_1_1(1024, 16, 2816, 24),
    "xl": _t5_1_1(2048, 32, 5120, 24),
    "xxl": _t5_1_1(4096, 64, 10240, 24),
}


# ----------------------------------------------------------------------------------------------------------------------
# Layers
# ----------------------------------------------------------------------------------------------------------------------


def _constrain(x: Array, axes: Tuple[str, ...]) -> Array:
    return nn.with_logical_constraint(x, axes)


class Dense(nn.Module):
    """A bias-free linear map of the last axis, kernel (in, out) float32 with logical axes `kernel_axes`."""

    features: int
    kernel_axes: Tuple[str, str]
    kernel_init: Callable = nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal")
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: Array) -> Array:
        kernel = self.param("kernel", nn.with_logical_partitioning(self.kernel_init, self.kernel_axes),
                            (x.shape[-1], self.features), jnp.float32)
        return jnp.dot(x.astype(self.dtype), kernel.astype(self.dtype))


class RMSNorm(nn.Module):
    """T5 layer norm: x / sqrt(mean(x^2) + eps) * scale, computed in float32, no mean subtraction, no bias."""

    epsilon: float = 1e-6
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: Array) -> Array:
        x32 = x.astype(jnp.float32)
        y = x32 * lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + self.epsilon)
        scale = self.param("scale", nn.with_logical_partitioning(nn.initializers.ones, ("embed",)),
                           (x.shape[-1],), jnp.float32)
        return y.astype(self.dtype) * scale.astype(self.dtype)


class Embed(nn.Module):
    """The shared token embedding (vocab, embed), initialised N(0, 1) as T5X; `attend` gives tied logits."""

    num_embeddings: int
    features: int
    dtype: Any = jnp.float32

    def setup(self):
        self.embedding = self.param(
            "embedding", nn.with_logical_partitioning(nn.initializers.normal(stddev=1.0), ("vocab", "embed")),
            (self.num_embeddings, self.features), jnp.float32)

    def __call__(self, ids: Array) -> Array:
        out = jnp.take(self.embedding, ids, axis=0).astype(self.dtype)
        return _constrain(out, _HIDDEN_AXES)

    def attend(self, x: Array) -> Array:
        return jnp.dot(x.astype(self.dtype), self.embedding.astype(self.dtype).T)


def relative_position_bucket(relative_position: Array, bidirectional: bool, num_buckets: int,
                             max_distance: int) -> Array:
    """T5's bucket of `relative_position = key_position - query_position` (int array, any shape).

    Bidirectional: half the buckets for keys before the query, half for keys after. Within a half, distances below
    half of it get a bucket each; larger ones share log-spaced buckets up to `max_distance`, beyond which all fall
    in the last bucket. Causal (not bidirectional): keys after the query fall in bucket 0 (they are masked anyway).
    """
    n = -relative_position.astype(jnp.int32)
    bucket = jnp.zeros_like(n)
    if bidirectional:
        num_buckets //= 2
        bucket = bucket + (n < 0).astype(jnp.int32) * num_buckets
        n = jnp.abs(n)
    else:
        n = jnp.maximum(n, 0)
    max_exact = num_buckets // 2
    is_small = n < max_exact
    # The epsilon keeps log() finite at n = 0 (those use the exact branch anyway).
    log_ratio = jnp.log(n.astype(jnp.float32) / max_exact + jnp.finfo(jnp.float32).eps)
    large = max_exact + (log_ratio / math.log(max_distance / max_exact) * (num_buckets - max_exact)).astype(jnp.int32)
    large = jnp.minimum(large, num_buckets - 1)
    return bucket + jnp.where(is_small, n, large)


class RelativePositionBias(nn.Module):
    """Per-head bias from bucketed relative positions; table (heads, buckets), T5X's layout and init."""

    num_heads: int
    num_buckets: int
    max_distance: int
    bidirectional: bool

    @nn.compact
    def __call__(self, query_positions: Array, key_positions: Array) -> Array:
        """Positions [b, q] and [b, k] (b may be 1) -> float32 bias [b, heads, q, k]."""
        table = self.param(
            "rel_embedding",
            nn.with_logical_partitioning(nn.initializers.variance_scaling(1.0, "fan_avg", "uniform"),
                                         ("heads", "relpos_buckets")),
            (self.num_heads, self.num_buckets), jnp.float32)
        relative = key_positions[:, None, :] - query_positions[:, :, None]
        buckets = relative_position_bucket(relative, self.bidirectional, self.num_buckets, self.max_distance)
        bias = jnp.take(table.T, buckets, axis=0)  # [b, q, k, heads]
        return jnp.transpose(bias, (0, 3, 1, 2))


def _default_positions(tokens: Array) -> Array:
    return jnp.arange(tokens.shape[1], dtype=jnp.int32)[None, :]


def _attention_mask(query_valid: Optional[Array], key_valid: Optional[Array], query_segments: Optional[Array] = None,
                    key_segments: Optional[Array] = None, causal: bool = False,
                    length: Optional[int] = None) -> Optional[Array]:
    """Boolean mask [b, 1, q, k] (True = may attend) from validity, segment equality and causality."""
    mask = None

    def combine(m):
        return m if mask is None else jnp.logical_and(mask, m)

    if query_valid is not None and key_valid is not None:
        mask = combine(query_valid[:, None, :, None] & key_valid[:, None, None, :])
    elif key_valid is not None:
        mask = combine(key_valid[:, None, None, :])
    if query_segments is not None and key_segments is not None:
        mask = combine(query_segments[:, None, :, None] == key_segments[:, None, None, :])
    if causal:
        idx = jnp.arange(length, dtype=jnp.int32)
        mask = combine((idx[:, None] >= idx[None, :])[None, None])
    return mask


class MultiHeadAttention(nn.Module):
    """T5 attention: separate q/k/v kernels (embed, heads*head_dim), no 1/sqrt(d) scaling, optional kv cache."""

    config: T5Config
    deterministic: bool = True

    @nn.compact
    def __call__(self, inputs_q: Array, inputs_kv: Array, mask: Optional[Array], bias: Optional[Array],
                 decode: bool = False, decode_index: Optional[Array] = None) -> Array:
        """`decode`: keep a key/value cache (created on the first call, for the length of that call's input);
        later calls feed one position, written at `decode_index`, and attend to cache positions <= it."""
        cfg = self.config
        inner = cfg.num_heads * cfg.head_dim
        base_init = nn.initializers.variance_scaling(1.0, "fan_in", "normal")

        def query_init(key, shape, dtype=jnp.float32):
            # std (emb_dim * head_dim) ** -0.5: T5X's fan_in init divided by sqrt(head_dim).
            return base_init(key, shape, dtype) / jnp.sqrt(jnp.asarray(cfg.head_dim, dtype))

        proj = functools.partial(Dense, inner, ("embed", "joined_kv"), dtype=cfg.dtype)
        query = proj(kernel_init=query_init, name="query")(inputs_q)
        key = proj(kernel_init=base_init, name="key")(inputs_kv)
        value = proj(kernel_init=base_init, name="value")(inputs_kv)

        def heads(x):
            return _constrain(x.reshape(x.shape[:2] + (cfg.num_heads, cfg.head_dim)), _HEADS_AXES)

        query, key, value = heads(query), heads(key), heads(value)

        if decode:
            initialized = self.has_variable("cache", "cached_key")
            cached_key = self.variable("cache", "cached_key", jnp.zeros, key.shape, key.dtype)
            cached_value = self.variable("cache", "cached_value", jnp.zeros, value.shape, value.dtype)
            if initialized:
                batch, max_length = cached_key.value.shape[:2]
                if query.shape[1] != 1 or decode_index is None:
                    raise ValueError(f"decoding feeds one token per step (got {query.shape[1]}) at a decode_index")
                index = decode_index
                key = lax.dynamic_update_slice(cached_key.value, key.astype(cached_key.value.dtype),
                                               (0, index, 0, 0))
                value = lax.dynamic_update_slice(cached_value.value, value.astype(cached_value.value.dtype),
                                                 (0, index, 0, 0))
                cached_key.value, cached_value.value = key, value
                step_mask = (jnp.arange(max_length) <= index)[None, None, None, :]
                mask = step_mask if mask is None else jnp.logical_and(mask, step_mask)

        logits_dtype = jnp.float32 if cfg.float32_attention_logits else cfg.dtype
        logits = jnp.einsum("bqhd,bkhd->bhqk", query.astype(logits_dtype), key.astype(logits_dtype))
        if bias is not None:
            logits = logits + bias.astype(logits_dtype)
        if mask is not None:
            logits = jnp.where(mask, logits, jnp.asarray(_MASK_VALUE, logits_dtype))
        weights = jax.nn.softmax(logits, axis=-1).astype(cfg.dtype)
        if not self.deterministic and cfg.dropout_rate > 0.0:
            weights = nn.Dropout(rate=cfg.dropout_rate)(weights, deterministic=False)
        out = jnp.einsum("bhqk,bkhd->bqhd", weights, value.astype(cfg.dtype))
        out = _constrain(out, _HEADS_AXES).reshape(out.shape[:2] + (inner,))
        return Dense(cfg.emb_dim, ("joined_kv", "embed"), kernel_init=base_init, dtype=cfg.dtype, name="out")(out)


class MlpBlock(nn.Module):
    """(act_0(x W_i0) * act_1(x W_i1) * ...) W_o, with dropout broadcast along length, as T5X's MlpBlock."""

    config: T5Config
    deterministic: bool = True

    @nn.compact
    def __call__(self, x: Array) -> Array:
        cfg = self.config
        init = nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal")
        acts = cfg.mlp_activations
        h = None
        for i, act in enumerate(acts):
            name = "wi" if len(acts) == 1 else f"wi_{i}"
            y = _ACTIVATIONS[act](Dense(cfg.mlp_dim, ("embed", "mlp"), kernel_init=init, dtype=cfg.dtype,
                                        name=name)(x))
            h = y if h is None else h * y
        h = nn.Dropout(rate=cfg.dropout_rate, broadcast_dims=(-2,))(h, deterministic=self.deterministic)
        h = _constrain(h, _MLP_AXES)
        return Dense(cfg.emb_dim, ("mlp", "embed"), kernel_init=init, dtype=cfg.dtype, name="wo")(h)


def _dropout(cfg: T5Config, deterministic: bool):
    return nn.Dropout(rate=cfg.dropout_rate, broadcast_dims=(-2,), deterministic=deterministic)


class EncoderLayer(nn.Module):
    config: T5Config
    deterministic: bool = True

    @nn.compact
    def __call__(self, x: Array, mask: Optional[Array], bias: Array) -> Array:
        cfg, det = self.config, self.deterministic
        y = RMSNorm(cfg.layer_norm_epsilon, cfg.dtype, name="pre_attention_layer_norm")(x)
        y = MultiHeadAttention(cfg, det, name="attention")(y, y, mask, bias)
        x = x + _dropout(cfg, det)(y)
        y = RMSNorm(cfg.layer_norm_epsilon, cfg.dtype, name="pre_mlp_layer_norm")(x)
        y = MlpBlock(cfg, det, name="mlp")(y)
        x = x + _dropout(cfg, det)(y)
        return _constrain(x, _HIDDEN_AXES)


class DecoderLayer(nn.Module):
    config: T5Config
    deterministic: bool = True
    decode: bool = False

    @nn.compact
    def __call__(self, x: Array, encoded: Array, self_mask: Optional[Array], cross_mask: Optional[Array],
                 bias: Array, decode_index: Optional[Array] = None) -> Array:
        cfg, det = self.config, self.deterministic
        y = RMSNorm(cfg.layer_norm_epsilon, cfg.dtype, name="pre_self_attention_layer_norm")(x)
        y = MultiHeadAttention(cfg, det, name="self_attention")(y, y, self_mask, bias, decode=self.decode,
                                                               decode_index=decode_index)
        x = x + _dropout(cfg, det)(y)
        y = RMSNorm(cfg.layer_norm_epsilon, cfg.dtype, name="pre_cross_attention_layer_norm")(x)
        y = MultiHeadAttention(cfg, det, name="encoder_decoder_attention")(y, encoded, cross_mask, None)
        x = x + _dropout(cfg, det)(y)
        y = RMSNorm(cfg.layer_norm_epsilon, cfg.dtype, name="pre_mlp_layer_norm")(x)
        y = MlpBlock(cfg, det, name="mlp")(y)
        x = x + _dropout(cfg, det)(y)
        return _constrain(x, _HIDDEN_AXES)


def _maybe_remat(layer_cls, cfg: T5Config, decode: bool = False):
    policy = _REMAT_POLICIES[cfg.remat_policy]
    if cfg.remat_policy == "none" or decode:
        return layer_cls
    return nn.remat(layer_cls, policy=policy)


class Encoder(nn.Module):
    config: T5Config
    shared_embedding: nn.Module

    @nn.compact
    def __call__(self, tokens: Array, segment_ids: Optional[Array] = None, positions: Optional[Array] = None,
                 deterministic: bool = True) -> Array:
        cfg = self.config
        x = self.shared_embedding(tokens.astype(jnp.int32))
        x = _dropout(cfg, deterministic)(x)
        pos = _default_positions(tokens) if positions is None else positions.astype(jnp.int32)
        relpos = RelativePositionBias(cfg.num_heads, cfg.relative_attention_num_buckets,
                                      cfg.relative_attention_max_distance, bidirectional=True, name="relpos_bias")
        bias = relpos(pos, pos)
        valid = tokens > PAD_ID
        mask = _attention_mask(valid, valid, segment_ids, segment_ids)
        layer_cls = _maybe_remat(EncoderLayer, cfg)
        for i in range(cfg.num_encoder_layers):
            x = layer_cls(cfg, deterministic, name=f"layers_{i}")(x, mask, bias)
        x = RMSNorm(cfg.layer_norm_epsilon, cfg.dtype, name="encoder_norm")(x)
        return _constrain(_dropout(cfg, deterministic)(x), _HIDDEN_AXES)


class Decoder(nn.Module):
    """The decoder stack. With `decode=True` the first call (cache absent) creates the cache for the length of its
    input; later calls feed one token each, at the position held in the cache."""

    config: T5Config
    shared_embedding: nn.Module

    @nn.compact
    def __call__(self, encoded: Array, encoder_tokens: Array, decoder_input_tokens: Array,
                 encoder_segment_ids: Optional[Array] = None, decoder_segment_ids: Optional[Array] = None,
                 decoder_positions: Optional[Array] = None, deterministic: bool = True,
                 decode: bool = False) -> Array:
        cfg = self.config
        tokens = decoder_input_tokens.astype(jnp.int32)
        batch, length = tokens.shape
        stepping = decode and self.has_variable("cache", "cache_index")
        cross_mask = _attention_mask(None, encoder_tokens > PAD_ID, decoder_segment_ids, encoder_segment_ids)
        relpos = RelativePositionBias(cfg.num_heads, cfg.relative_attention_num_buckets,
                                      cfg.relative_attention_max_distance, bidirectional=False, name="relpos_bias")
        if decode:
            cache_index = self.variable("cache", "cache_index", lambda: jnp.zeros((), jnp.int32))
            key_positions = self.variable("cache", "key_positions",
                                          lambda: jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32),
                                                                   (batch, length)))
        if stepping:
            if length != 1:
                raise ValueError(f"decoding feeds one token per step; got decoder_input_tokens of shape {tokens.shape}")
            index = cache_index.value
            bias = relpos(jnp.broadcast_to(index, (batch, 1)), key_positions.value)
            self_mask = None  # the cached attention masks keys after `index`
        else:
            pos = _default_positions(tokens) if decoder_positions is None else decoder_positions.astype(jnp.int32)
            bias = relpos(pos, pos)
            self_mask = _attention_mask(None, None, decoder_segment_ids, decoder_segment_ids, causal=True,
                                        length=length)
            index = None
        x = self.shared_embedding(tokens)
        x = _dropout(cfg, deterministic)(x)
        layer_cls = _maybe_remat(DecoderLayer, cfg, decode)
        for i in range(cfg.num_decoder_layers):
            x = layer_cls(cfg, deterministic, decode, name=f"layers_{i}")(x, encoded, self_mask, cross_mask, bias,
                                                                           index)
        x = RMSNorm(cfg.layer_norm_epsilon, cfg.dtype, name="decoder_norm")(x)
        x = _dropout(cfg, deterministic)(x)
        if stepping:
            cache_index.value = cache_index.value + 1
        if cfg.logits_via_embedding:
            logits = self.shared_embedding.attend(x) / jnp.sqrt(jnp.asarray(cfg.emb_dim, cfg.dtype))
        else:
            logits = Dense(cfg.vocab_size, ("embed", "vocab"),
                           kernel_init=nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal"),
                           dtype=cfg.dtype, name="logits_dense")(x)
        return _constrain(logits, _LOGITS_AXES)


class T5(nn.Module):
    """The encoder-decoder: `encode`, `decode` and `__call__` (teacher forcing) over one shared embedding."""

    config: T5Config

    def setup(self):
        cfg = self.config
        self.token_embedder = Embed(cfg.vocab_size, cfg.emb_dim, cfg.dtype)
        self.encoder = Encoder(cfg, self.token_embedder)
        self.decoder = Decoder(cfg, self.token_embedder)

    def encode(self, encoder_input_tokens: Array, encoder_segment_ids: Optional[Array] = None,
               encoder_positions: Optional[Array] = None, enable_dropout: bool = False) -> Array:
        return self.encoder(encoder_input_tokens, encoder_segment_ids, encoder_positions, not enable_dropout)

    def decode(self, encoded: Array, encoder_input_tokens: Array, decoder_input_tokens: Array,
               encoder_segment_ids: Optional[Array] = None, decoder_segment_ids: Optional[Array] = None,
               decoder_positions: Optional[Array] = None, enable_dropout: bool = False,
               decode: bool = False) -> Array:
        return self.decoder(encoded, encoder_input_tokens, decoder_input_tokens, encoder_segment_ids,
                            decoder_segment_ids, decoder_positions, not enable_dropout, decode)

    def __call__(self, encoder_input_tokens: Array, decoder_input_tokens: Array,
                 encoder_segment_ids: Optional[Array] = None, decoder_segment_ids: Optional[Array] = None,
                 encoder_positions: Optional[Array] = None, decoder_positions: Optional[Array] = None,
                 enable_dropout: bool = False, decode: bool = False) -> Array:
        encoded = self.encode(encoder_input_tokens, encoder_segment_ids, encoder_positions, enable_dropout)
        return self.decode(encoded, encoder_input_tokens, decoder_input_tokens, encoder_segment_ids,
                           decoder_segment_ids, decoder_positions, enable_dropout, decode)


# ----------------------------------------------------------------------------------------------------------------------
# Losses
# ----------------------------------------------------------------------------------------------------------------------


def token_cross_entropy(logits: Array, targets: Array, z_loss: float = 0.0,
                        label_smoothing: float = 0.0) -> Tuple[Array, Array]:
    """Per-token (cross entropy, z-loss) as T5X's `compute_weighted_cross_entropy`, before weighting.

    With label smoothing the target distribution puts 1 - s on the target and s / (V - 1) on every other id, and the
    entropy of that distribution is subtracted (so a perfect prediction scores 0). The z-loss is z * logsumexp^2.
    """
    logits = logits.astype(jnp.float32)
    vocab = logits.shape[-1]
    log_z = jax.nn.logsumexp(logits, axis=-1)
    target_logit = jnp.take_along_axis(logits, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
    if label_smoothing > 0.0:
        confidence = 1.0 - label_smoothing
        low = label_smoothing / (vocab - 1)
        entropy = -(confidence * math.log(confidence) + (vocab - 1) * low * math.log(low + 1e-20))
        xent = log_z - (confidence - low) * target_logit - low * jnp.sum(logits, axis=-1) - entropy
    else:
        xent = log_z - target_logit
    return xent, z_loss * jnp.square(log_z)


def _loss_denominator(factor, weight_sum: Array, num_targets: int) -> Array:
    if factor is None or factor == "NUM_REAL_TARGET_TOKENS":
        return jnp.where(weight_sum > 0, weight_sum, 1.0)
    if factor == "NUM_TOTAL_TARGET_TOKENS":
        return jnp.asarray(float(num_targets), jnp.float32)
    if isinstance(factor, numbers.Real) and not isinstance(factor, bool) and factor > 0:
        return jnp.asarray(float(factor), jnp.float32)
    raise ValueError(f"loss_normalizing_factor must be None, a positive number, 'NUM_REAL_TARGET_TOKENS' or "
                     f"'NUM_TOTAL_TARGET_TOKENS'; got {factor!r}")


def _target_weights(batch: Mapping[str, Array]) -> Array:
    targets = batch["decoder_target_tokens"]
    weights = batch.get("decoder_loss_weights")
    if weights is None:
        return (targets > PAD_ID).astype(jnp.float32)
    return jnp.asarray(weights, jnp.float32)


def length_penalty(length, alpha: float):
    """GNMT / T5X brevity penalty ((5 + length) / 6) ** alpha; a finished beam's score is log p / penalty."""
    return ((5.0 + length) / 6.0) ** alpha


# ----------------------------------------------------------------------------------------------------------------------
# The model wrapper: pure functions of (params, batch)
# ----------------------------------------------------------------------------------------------------------------------


class EncoderDecoderModel:
    """T5X-style model interface: `init`, `loss_fn`, `score_batch`, `predict_batch`; every method is a pure function
    of its arguments (jit them; `method`, `num_beams` and `max_decode_length` of `predict_batch` are static).

    Batches are dicts of the seqio.EncDecFeatureConverter features: `encoder_input_tokens`, `decoder_input_tokens`,
    `decoder_target_tokens`, optional `decoder_loss_weights`, and when packed `encoder_segment_ids`,
    `decoder_segment_ids`, `encoder_positions`, `decoder_positions`.
    """

    def __init__(self, config: T5Config, *, z_loss: float = 1e-4, label_smoothing: float = 0.0,
                 loss_normalizing_factor: Union[None, float, str] = None, eos_id: int = EOS_ID,
                 decoder_start_id: int = DECODER_START_ID, length_penalty_alpha: float = 0.6):
        _loss_denominator(loss_normalizing_factor, jnp.ones(()), 1)  # validate early
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing!r}")
        self.config = config
        self.module = T5(config)
        self.z_loss = z_loss
        self.label_smoothing = label_smoothing
        self.loss_normalizing_factor = loss_normalizing_factor
        self.eos_id = eos_id
        self.decoder_start_id = decoder_start_id
        self.length_penalty_alpha = length_penalty_alpha

    # -- parameters ---------------------------------------------------------------------------------------------------

    def _dummy_inputs(self, input_len: int, target_len: int, batch: int):
        return (jnp.ones((batch, input_len), jnp.int32), jnp.ones((batch, target_len), jnp.int32))

    def init_boxed(self, rng: Array, input_len: int = 8, target_len: int = 8, batch: int = 1) -> PyTree:
        """Parameters with their `nn.Partitioned` boxes (logical axis names) still on."""
        enc, dec = self._dummy_inputs(input_len, target_len, batch)
        return self.module.init({"params": rng}, enc, dec, enable_dropout=False)["params"]

    def init(self, rng: Array, input_len: int = 8, target_len: int = 8, batch: int = 1) -> PyTree:
        """Float32 parameters (a plain nested dict). Shapes do not depend on the lengths or batch."""
        return nn.meta.unbox(self.init_boxed(rng, input_len, target_len, batch))

    def abstract_init(self, input_len: int = 8, target_len: int = 8, batch: int = 1) -> PyTree:
        """`jax.ShapeDtypeStruct`s of the parameters, with no allocation."""
        return jax.eval_shape(functools.partial(self.init, input_len=input_len, target_len=target_len, batch=batch),
                              jax.random.PRNGKey(0))

    def logical_partition_specs(self) -> PyTree:
        """The parameters' `PartitionSpec`s of logical axis names (same tree as `init`'s): map them to a mesh with
        `nn.logical_to_mesh_sharding(specs, mesh, rules)` and pass that as `out_shardings` of `jax.jit(init)`."""
        abstract = jax.eval_shape(self.init_boxed, jax.random.PRNGKey(0))
        return nn.get_partition_spec(abstract)

    # -- teacher forcing ----------------------------------------------------------------------------------------------

    @staticmethod
    def _packing_kwargs(batch: Mapping[str, Array]) -> Dict[str, Array]:
        return {k: batch[k] for k in ("encoder_segment_ids", "decoder_segment_ids", "encoder_positions",
                                      "decoder_positions") if batch.get(k) is not None}

    def logits(self, params: PyTree, batch: Mapping[str, Array], dropout_rng: Optional[Array] = None) -> Array:
        """Teacher-forced float32 logits [batch, target_len, vocab]; dropout on when `dropout_rng` is given."""
        enable_dropout = dropout_rng is not None and self.config.dropout_rate > 0.0
        rngs = {"dropout": dropout_rng} if enable_dropout else {}
        logits = self.module.apply({"params": params}, batch["encoder_input_tokens"], batch["decoder_input_tokens"],
                                   enable_dropout=enable_dropout, rngs=rngs, **self._packing_kwargs(batch))
        return logits.astype(jnp.float32)

    def loss_fn(self, params: PyTree, batch: Mapping[str, Array],
                dropout_rng: Optional[Array] = None) -> Tuple[Array, Dict[str, Array]]:
        """Weighted cross entropy (+ z-loss) over the targets, normalised by `loss_normalizing_factor`.

        Returns (loss, aux) with aux: `loss`, `cross_ent_loss`, `z_loss` (both normalised like the loss),
        `weight_sum`, `num_correct` and `accuracy` (argmax == target, over weighted tokens).
        """
        logits = self.logits(params, batch, dropout_rng)
        targets = batch["decoder_target_tokens"]
        weights = _target_weights(batch)
        xent, z = token_cross_entropy(logits, targets, self.z_loss, self.label_smoothing)
        weight_sum = jnp.sum(weights)
        denom = _loss_denominator(self.loss_normalizing_factor, weight_sum, targets.size)
        xent_sum = jnp.sum(xent * weights)
        z_sum = jnp.sum(z * weights)
        loss = (xent_sum + z_sum) / denom
        num_correct = jnp.sum((jnp.argmax(logits, axis=-1) == targets) * weights)
        aux = {
            "loss": loss,
            "cross_ent_loss": xent_sum / denom,
            "z_loss": z_sum / denom,
            "weight_sum": weight_sum,
            "num_correct": num_correct,
            "accuracy": num_correct / jnp.where(weight_sum > 0, weight_sum, 1.0),
        }
        return loss, aux

    def score_batch(self, params: PyTree, batch: Mapping[str, Array]) -> Array:
        """Sum over the targets of log p(target), per row [batch] (weights from decoder_loss_weights, else
        targets > 0). A packed row gets the sum over all its segments."""
        logits = self.logits(params, batch)
        log_probs = jax.nn.log_softmax(logits, axis=-1)
        targets = batch["decoder_target_tokens"].astype(jnp.int32)
        token_lp = jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
        return jnp.sum(token_lp * _target_weights(batch), axis=-1)

    # -- decoding -----------------------------------------------------------------------------------------------------

    def encode(self, params: PyTree, batch: Mapping[str, Array]) -> Array:
        return self.module.apply({"params": params}, batch["encoder_input_tokens"], method=T5.encode)

    def init_cache(self, params: PyTree, batch_size: int, max_decode_length: int) -> PyTree:
        """A zero decoding cache for `batch_size` rows of `max_decode_length` positions (cache_index 0)."""
        dummy_encoded = jnp.zeros((batch_size, 1, self.config.emb_dim), self.config.dtype)
        dummy_tokens = jnp.ones((batch_size, 1), jnp.int32)
        dummy_decoder = jnp.zeros((batch_size, max_decode_length), jnp.int32)
        _, variables = self.module.apply({"params": params}, dummy_encoded, dummy_tokens, dummy_decoder, decode=True,
                                         mutable=["cache"], method=T5.decode)
        return variables["cache"]

    def decode_step(self, params: PyTree, cache: PyTree, encoded: Array, encoder_input_tokens: Array,
                    tokens: Array) -> Tuple[Array, PyTree]:
        """Feed `tokens` [batch, 1] at the cache's position: float32 logits [batch, vocab] and the updated cache."""
        logits, variables = self.module.apply({"params": params, "cache": cache}, encoded, encoder_input_tokens,
                                              tokens, decode=True, mutable=["cache"], method=T5.decode)
        return logits[:, -1].astype(jnp.float32), variables["cache"]

    def predict_batch(self, params: PyTree, batch: Mapping[str, Array], method: str = "greedy",
                      num_beams: int = 4, max_decode_length: Optional[int] = None,
                      alpha: Optional[float] = None) -> Array:
        """Decoded int32 tokens [batch, max_decode_length]: EOS (1) included, zeros after it."""
        return self.predict_batch_with_aux(params, batch, method, num_beams, max_decode_length, alpha)[0]

    def predict_batch_with_aux(self, params: PyTree, batch: Mapping[str, Array], method: str = "greedy",
                               num_beams: int = 4, max_decode_length: Optional[int] = None,
                               alpha: Optional[float] = None) -> Tuple[Array, Dict[str, Array]]:
        """As `predict_batch`, plus aux `scores` [batch]: the sum of token log-probs (greedy) or the best beam's
        length-normalised score (beam)."""
        if max_decode_length is None:
            if "decoder_input_tokens" not in batch:
                raise ValueError("predict_batch needs max_decode_length (or decoder_input_tokens to take it from)")
            max_decode_length = batch["decoder_input_tokens"].shape[1]
        encoder_tokens = jnp.asarray(batch["encoder_input_tokens"], jnp.int32)
        encoded = self.encode(params, {"encoder_input_tokens": encoder_tokens})
        if method == "greedy":
            return self._greedy(params, encoded, encoder_tokens, max_decode_length)
        if method == "beam":
            if num_beams < 1:
                raise ValueError(f"num_beams must be >= 1, got {num_beams}")
            alpha = self.length_penalty_alpha if alpha is None else alpha
            return self._beam(params, encoded, encoder_tokens, max_decode_length, num_beams, alpha)
        raise ValueError(f"predict_batch method must be 'greedy' or 'beam', got {method!r}")

    def _greedy(self, params, encoded, encoder_tokens, max_len):
        batch = encoded.shape[0]
        cache = self.init_cache(params, batch, max_len)
        seqs = jnp.full((batch, max_len + 1), PAD_ID, jnp.int32).at[:, 0].set(self.decoder_start_id)
        state = (jnp.zeros((), jnp.int32), seqs, cache, jnp.zeros((batch,), bool), jnp.zeros((batch,), jnp.float32))

        def cond(state):
            i, _, _, done, _ = state
            return (i < max_len) & ~jnp.all(done)

        def body(state):
            i, seqs, cache, done, score = state
            token = lax.dynamic_slice_in_dim(seqs, i, 1, axis=1)
            logits, cache = self.decode_step(params, cache, encoded, encoder_tokens, token)
            log_probs = jax.nn.log_softmax(logits, axis=-1)
            nxt = jnp.argmax(logits, axis=-1).astype(jnp.int32)
            step_lp = jnp.take_along_axis(log_probs, nxt[:, None], axis=-1)[:, 0]
            nxt = jnp.where(done, PAD_ID, nxt)
            score = score + jnp.where(done, 0.0, step_lp)
            seqs = lax.dynamic_update_slice_in_dim(seqs, nxt[:, None], i + 1, axis=1)
            return i + 1, seqs, cache, done | (nxt == self.eos_id), score

        _, seqs, _, _, score = lax.while_loop(cond, body, state)
        return seqs[:, 1:], {"scores": score}

    def _beam(self, params, encoded, encoder_tokens, max_len, num_beams, alpha):
        batch, k = encoded.shape[0], num_beams
        vocab = self.config.vocab_size
        n_cand = min(2 * k, k * vocab)  # 2k candidates leave k live ones even if k of them end in EOS
        encoded = jnp.repeat(encoded, k, axis=0)
        encoder_tokens = jnp.repeat(encoder_tokens, k, axis=0)
        cache = self.init_cache(params, batch * k, max_len)
        seqs = jnp.full((batch, k, max_len + 1), PAD_ID, jnp.int32).at[:, :, 0].set(self.decoder_start_id)
        # Only the first live beam is real at the start (the others would duplicate it).
        live_lp = jnp.tile(jnp.asarray([0.0] + [_NEG_INF] * (k - 1), jnp.float32), (batch, 1))
        fin_scores = jnp.full((batch, k), _NEG_INF, jnp.float32)
        fin_flags = jnp.zeros((batch, k), bool)
        max_penalty = length_penalty(float(max_len), alpha)
        batch_offsets = (jnp.arange(batch, dtype=jnp.int32) * k)[:, None]

        def cond(state):
            i, _, live_lp, _, fin_scores, fin_flags, _ = state
            # The best a live beam can still reach: its log-prob can only fall, its penalty is at most max_penalty.
            best_live = live_lp[:, 0] / max_penalty
            worst_fin = jnp.where(jnp.all(fin_flags, axis=1), jnp.min(fin_scores, axis=1), _NEG_INF)
            return (i < max_len) & ~jnp.all(worst_fin > best_live)

        def body(state):
            i, seqs, live_lp, fin_seqs, fin_scores, fin_flags, cache = state
            tokens = lax.dynamic_slice_in_dim(seqs, i, 1, axis=2).reshape(batch * k, 1)
            logits, cache = self.decode_step(params, cache, encoded, encoder_tokens, tokens)
            log_probs = jax.nn.log_softmax(logits, axis=-1).reshape(batch, k, vocab)
            cand = (live_lp[:, :, None] + log_probs).reshape(batch, k * vocab)
            top_lp, top_idx = lax.top_k(cand, n_cand)
            src_beam = top_idx // vocab
            tok = (top_idx % vocab).astype(jnp.int32)
            top_seqs = jnp.take_along_axis(seqs, src_beam[:, :, None], axis=1)
            top_seqs = lax.dynamic_update_slice_in_dim(top_seqs, tok[:, :, None], i + 1, axis=2)
            ended = tok == self.eos_id
            # Candidates grown from the dead initial beams (possible only when k * vocab is small) never count.
            real = top_lp > 0.5 * _NEG_INF

            # Live beams: the best k candidates that did not end; their caches follow their source beams.
            new_live_lp, pick = lax.top_k(jnp.where(ended, _NEG_INF, top_lp), k)
            new_seqs = jnp.take_along_axis(top_seqs, pick[:, :, None], axis=1)
            rows = (batch_offsets + jnp.take_along_axis(src_beam, pick, axis=1)).reshape(-1)
            cache = jax.tree_util.tree_map(lambda x: x[rows] if x.ndim > 0 else x, cache)

            # Finished beams: merge the ones that ended now (scored with the length penalty) into the best k.
            new_flags = ended & real
            new_fin = jnp.where(new_flags, top_lp / length_penalty((i + 1).astype(jnp.float32), alpha), _NEG_INF)
            all_scores = jnp.concatenate([fin_scores, new_fin], axis=1)
            all_flags = jnp.concatenate([fin_flags, new_flags], axis=1)
            all_seqs = jnp.concatenate([fin_seqs, top_seqs], axis=1)
            fin_scores, pick = lax.top_k(all_scores, k)
            fin_flags = jnp.take_along_axis(all_flags, pick, axis=1)
            fin_seqs = jnp.take_along_axis(all_seqs, pick[:, :, None], axis=1)
            return i + 1, new_seqs, new_live_lp, fin_seqs, fin_scores, fin_flags, cache

        state = (jnp.zeros((), jnp.int32), seqs, live_lp, seqs, fin_scores, fin_flags, cache)
        _, seqs, live_lp, fin_seqs, fin_scores, fin_flags, _ = lax.while_loop(cond, body, state)
        # A row with no finished beam (none ended within max_len) returns its best live beam.
        any_fin = fin_flags[:, 0]
        best = jnp.where(any_fin[:, None], fin_seqs[:, 0], seqs[:, 0])
        score = jnp.where(any_fin, fin_scores[:, 0], live_lp[:, 0] / max_penalty)
        return best[:, 1:], {"scores": score}


def count_parameters(config: T5Config) -> int:
    """Number of parameters, from shapes only (no allocation)."""
    shapes = EncoderDecoderModel(config).abstract_init()
    return int(sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(shapes)))


# ----------------------------------------------------------------------------------------------------------------------
# Hugging Face checkpoints (config.json + model.safetensors)
# ----------------------------------------------------------------------------------------------------------------------

# HF activation name -> ours. HF's "gated-gelu" is special-cased to gelu_new (tanh), its plain "gelu" is exact.
_HF_TO_ACT = {"gelu_new": "gelu", "gelu_pytorch_tanh": "gelu", "gelu_fast": "gelu", "gelu": "gelu_exact",
              "relu": "relu", "silu": "silu", "swish": "silu"}
_ACT_TO_HF = {"gelu": "gelu_new", "gelu_exact": "gelu", "relu": "relu", "silu": "silu"}


def _activations_from_hf(proj: str, path: str) -> Tuple[str, ...]:
    if proj == "gated-gelu":
        return ("gelu", "linear")
    parts = proj.split("-") if isinstance(proj, str) else []
    if len(parts) == 2 and parts[0] == "gated" and parts[1] in _HF_TO_ACT:
        return (_HF_TO_ACT[parts[1]], "linear")
    if len(parts) == 1 and parts[0] in _HF_TO_ACT:
        return (_HF_TO_ACT[parts[0]],)
    raise DataError(f"feed_forward_proj {proj!r} is not supported; expected 'gated-gelu', 'relu', "
                    f"'gated-<act>' or '<act>' with act in {sorted(_HF_TO_ACT)}", path)


def _activations_to_hf(acts: Tuple[str, ...]) -> str:
    if acts == ("gelu", "linear"):
        return "gated-gelu"
    if len(acts) == 1 and acts[0] in _ACT_TO_HF:
        return _ACT_TO_HF[acts[0]]
    if len(acts) == 2 and acts[1] == "linear" and acts[0] in ("relu", "silu"):
        return f"gated-{acts[0]}"
    raise ValueError(f"mlp_activations {acts!r} have no Hugging Face feed_forward_proj")


def config_from_hf(hf: Mapping[str, Any], path: str = "config.json", dtype: Any = jnp.float32) -> T5Config:
    """T5Config from a Hugging Face T5 `config.json` dict (HF defaults where keys are absent). The output layer is
    read from the config alone here, as transformers 4 wrote it (`tie_word_embeddings`); `load_hf_checkpoint`
    decides it from the config and the tensors together (`hf_output_layer`), as transformers 5 does."""
    def need(key):
        if hf.get(key) is None:
            raise DataError(f"config.json has no {key!r} (expected a Hugging Face T5 config)", path)
        return hf[key]

    num_layers = need("num_layers")
    try:
        return T5Config(
            vocab_size=need("vocab_size"), emb_dim=need("d_model"), num_heads=need("num_heads"), head_dim=need("d_kv"),
            mlp_dim=need("d_ff"), num_encoder_layers=num_layers,
            num_decoder_layers=hf.get("num_decoder_layers") or num_layers,
            dropout_rate=float(hf.get("dropout_rate", 0.1)),
            mlp_activations=_activations_from_hf(hf.get("feed_forward_proj", "relu"), path),
            logits_via_embedding=bool(hf.get("tie_word_embeddings", True)), dtype=dtype,
            relative_attention_num_buckets=hf.get("relative_attention_num_buckets", 32),
            relative_attention_max_distance=hf.get("relative_attention_max_distance", 128),
            layer_norm_epsilon=float(hf.get("layer_norm_epsilon", 1e-6)))
    except (ValueError, TypeError) as e:
        if isinstance(e, DataError):
            raise
        raise DataError(f"bad T5 config: {e}", path) from None


def config_to_hf(config: T5Config) -> Dict[str, Any]:
    return {
        "architectures": ["T5ForConditionalGeneration"], "model_type": "t5", "is_encoder_decoder": True,
        "vocab_size": config.vocab_size, "d_model": config.emb_dim, "d_kv": config.head_dim, "d_ff": config.mlp_dim,
        "num_layers": config.num_encoder_layers, "num_decoder_layers": config.num_decoder_layers,
        "num_heads": config.num_heads, "relative_attention_num_buckets": config.relative_attention_num_buckets,
        "relative_attention_max_distance": config.relative_attention_max_distance,
        "feed_forward_proj": _activations_to_hf(config.mlp_activations),
        # Both keys, so that transformers 4 (tie_word_embeddings decides) and 5 (scale_decoder_outputs scales, the
        # tensors present decide the tying) read the same output layer.
        "tie_word_embeddings": config.logits_via_embedding, "scale_decoder_outputs": config.logits_via_embedding,
        "layer_norm_epsilon": config.layer_norm_epsilon,
        "dropout_rate": config.dropout_rate, "decoder_start_token_id": DECODER_START_ID, "eos_token_id": EOS_ID,
        "pad_token_id": PAD_ID,
    }


def hf_parameter_names(config: T5Config) -> Sequence[Tuple[str, Tuple[str, ...], bool]]:
    """(HF tensor name, our parameter path, transpose?) for every parameter. torch Linear weights are (out, in),
    ours (in, out); HF's relative bias table is (buckets, heads), ours (heads, buckets)."""
    rows = [("shared.weight", ("token_embedder", "embedding"), False)]
    acts = config.mlp_activations
    wi_names = ["wi"] if len(acts) == 1 else [f"wi_{i}" for i in range(len(acts))]

    def attention(hf_prefix, path):
        for hf, ours in zip("qkvo", ("query", "key", "value", "out")):
            rows.append((f"{hf_prefix}.{hf}.weight", path + (ours, "kernel"), True))

    def mlp(hf_prefix, path):
        for name in wi_names + ["wo"]:
            rows.append((f"{hf_prefix}.DenseReluDense.{name}.weight", path + ("mlp", name, "kernel"), True))

    def norm(hf_name, path):
        rows.append((hf_name, path + ("scale",), False))

    for i in range(config.num_encoder_layers):
        hf, ours = f"encoder.block.{i}", ("encoder", f"layers_{i}")
        norm(f"{hf}.layer.0.layer_norm.weight", ours + ("pre_attention_layer_norm",))
        attention(f"{hf}.layer.0.SelfAttention", ours + ("attention",))
        norm(f"{hf}.layer.1.layer_norm.weight", ours + ("pre_mlp_layer_norm",))
        mlp(f"{hf}.layer.1", ours)
    rows.append(("encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
                 ("encoder", "relpos_bias", "rel_embedding"), True))
    norm("encoder.final_layer_norm.weight", ("encoder", "encoder_norm"))
    for i in range(config.num_decoder_layers):
        hf, ours = f"decoder.block.{i}", ("decoder", f"layers_{i}")
        norm(f"{hf}.layer.0.layer_norm.weight", ours + ("pre_self_attention_layer_norm",))
        attention(f"{hf}.layer.0.SelfAttention", ours + ("self_attention",))
        norm(f"{hf}.layer.1.layer_norm.weight", ours + ("pre_cross_attention_layer_norm",))
        attention(f"{hf}.layer.1.EncDecAttention", ours + ("encoder_decoder_attention",))
        norm(f"{hf}.layer.2.layer_norm.weight", ours + ("pre_mlp_layer_norm",))
        mlp(f"{hf}.layer.2", ours)
    rows.append(("decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
                 ("decoder", "relpos_bias", "rel_embedding"), True))
    norm("decoder.final_layer_norm.weight", ("decoder", "decoder_norm"))
    if not config.logits_via_embedding:
        rows.append(("lm_head.weight", ("decoder", "logits_dense", "kernel"), True))
    return rows


# Where a tied embedding may be stored instead of `shared.weight` (safetensors keeps one name per shared tensor).
_EMBEDDING_ALIASES = ("shared.weight", "encoder.embed_tokens.weight", "decoder.embed_tokens.weight")


def _load_safetensors(path: str) -> Dict[str, np.ndarray]:
    if not os.path.isfile(path):
        raise DataError("missing safetensors file", path)
    try:
        return load_file(path)
    except Exception as e:  # safetensors raises its own error type (and OSError) for truncated or corrupt files
        raise DataError(f"cannot read safetensors weights ({type(e).__name__}: {e})", path) from None


# Weights a Hugging Face folder may hold in PyTorch's pickle format, which templm never loads (a pickle runs code).
_PICKLED_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json")


def _convert_hint(directory: str) -> str:
    """What to run once, with one's own torch, to turn a folder's pickled PyTorch weights into safetensors."""
    pickled = [name for name in _PICKLED_WEIGHTS if os.path.isfile(os.path.join(directory, name))]
    if not pickled:
        return ""
    return (f"; the folder holds {', '.join(pickled)}, which templm does not read (a PyTorch pickle can run code): "
            "convert it once with your own transformers and torch, e.g. python -c \"from transformers import "
            f"T5ForConditionalGeneration as M; M.from_pretrained({directory!r}).save_pretrained({directory!r}, "
            "safe_serialization=True)\", which writes model.safetensors beside it")


def _read_hf_tensors(directory: str, weights_file: Optional[str]) -> Tuple[Dict[str, np.ndarray], str]:
    if weights_file is not None:
        return _load_safetensors(weights_file), weights_file
    single = os.path.join(directory, "model.safetensors")
    index = os.path.join(directory, "model.safetensors.index.json")
    if not os.path.isfile(single) and not os.path.isfile(index):
        raise DataError("missing safetensors file (model.safetensors or model.safetensors.index.json)"
                        + _convert_hint(directory), single)
    if os.path.isfile(single) or not os.path.isfile(index):
        return _load_safetensors(single), single
    try:
        with open(index, encoding="utf-8") as f:
            weight_map = json.load(f)["weight_map"]
        shards = sorted(set(weight_map.values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise DataError(f"bad safetensors index (expected JSON with a 'weight_map'): {e}", index) from None
    tensors: Dict[str, np.ndarray] = {}
    for shard in shards:
        tensors.update(_load_safetensors(os.path.join(directory, shard)))
    return tensors, index


@dataclasses.dataclass(frozen=True)
class HFOutputLayer:
    """How a Hugging Face T5 checkpoint turns the decoder's output into logits: `head`, the tensor it multiplies
    by ("shared.weight": tied to the embedding; "lm_head.weight": its own), and `scale`, whether the output is first
    scaled by d_model ** -0.5."""

    head: str
    scale: bool


def hf_output_layer(hf: Mapping[str, Any], tensors: Mapping[str, np.ndarray], config_path: str,
                    weights_path: str) -> HFOutputLayer:
    """The output layer of a Hugging Face T5 folder, from its config and its tensors together, as the
    transformers version that wrote it reads it back:

    - transformers 5 writes `scale_decoder_outputs` (T5 v1.0: true, v1.1: false) and `tie_word_embeddings: true`
      for every T5; its head is `lm_head.weight` where the file holds one that differs from `shared.weight` (a
      v1.1 checkpoint converted from transformers 4 keeps its own), else the embedding;
    - transformers 4 (no `scale_decoder_outputs`) ties and scales when `tie_word_embeddings` is true (the default),
      and reads `lm_head.weight` unscaled when it is false.
    A config that contradicts the tensors is a DataError naming both: an untied config without `lm_head.weight`; a
    transformers 4 config that ties while the file holds an `lm_head.weight` different from the embedding (the two
    major versions would compute different logits from it)."""
    tie = bool(hf.get("tie_word_embeddings", True))
    head = tensors.get("lm_head.weight")
    shared = next((tensors[n] for n in _EMBEDDING_ALIASES if n in tensors), None)
    own_head = head is not None and (shared is None or head.shape != shared.shape or
                                     not np.array_equal(head, shared))
    if not tie and head is None:
        raise DataError(f"{config_path} has tie_word_embeddings false (an output layer of its own), but {weights_path} "
                        "holds no lm_head.weight: set tie_word_embeddings to true if the output layer is the "
                        "embedding, or use the weights file that has lm_head.weight", weights_path)
    if "scale_decoder_outputs" in hf:
        return HFOutputLayer("lm_head.weight" if own_head else "shared.weight", bool(hf["scale_decoder_outputs"]))
    if tie and own_head:
        raise DataError(f"{config_path} ties the output layer to the embedding (tie_word_embeddings true, no "
                        f"scale_decoder_outputs: transformers 4's config), but {weights_path} holds an lm_head.weight "
                        "that differs from shared.weight: transformers 4 reads the embedding and transformers 5 "
                        "lm_head.weight. Say which in config.json: tie_word_embeddings false for lm_head.weight (T5 "
                        "v1.1), or remove lm_head.weight", weights_path)
    return HFOutputLayer("shared.weight" if tie else "lm_head.weight", tie)


def _span(numbers: Any) -> str:
    """"0-11" for the numbers 0..11, "none" for none, "0-3, 7" otherwise (the first runs)."""
    if not numbers:
        return "none"
    runs, ordered = [], sorted(numbers)
    start = prev = ordered[0]
    for n in ordered[1:] + [None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        runs.append(f"{start}-{prev}" if prev != start else f"{start}")
        if n is not None:
            start = prev = n
    return ", ".join(runs[:4]) + (" ..." if len(runs) > 4 else "")


def load_hf_checkpoint(path_or_dir: str, dtype: Any = jnp.float32) -> Tuple[T5Config, PyTree]:
    """(T5Config, float32 numpy params) from a Hugging Face T5 checkpoint: a directory with `config.json` and
    `model.safetensors` (or `model.safetensors.index.json` and its shards), or the path of the `.safetensors` file
    (its directory holds `config.json`). `dtype` is the compute dtype put in the config. Reads no pickles.
    A missing, truncated or inconsistent file is a DataError naming it."""
    path_or_dir = os.fspath(path_or_dir)
    if not os.path.exists(path_or_dir):
        raise DataError("no such checkpoint directory or file", path_or_dir)
    if os.path.isdir(path_or_dir):
        directory, weights_file = path_or_dir, None
    elif path_or_dir.endswith(".safetensors"):
        directory, weights_file = os.path.dirname(path_or_dir) or ".", path_or_dir
    else:
        raise DataError("expected a checkpoint directory (config.json + model.safetensors) or a .safetensors file",
                        path_or_dir)
    config_path = os.path.join(directory, "config.json")
    hf_config = read_json(config_path, "missing config.json of the checkpoint")
    if not isinstance(hf_config, dict):
        raise DataError("config.json must hold a JSON object", config_path)
    config = config_from_hf(hf_config, config_path, dtype)
    tensors, weights_path = _read_hf_tensors(directory, weights_file)
    # The layers config.json claims, checked against the blocks the weights hold before any model is built from it
    # (a config claiming ten million layers grew memory for minutes).
    for side, claimed in (("encoder", config.num_encoder_layers), ("decoder", config.num_decoder_layers)):
        held = {int(match.group(1)) for match in map(re.compile(rf"{side}\.block\.(\d+)\.").match, tensors)
                if match}
        if held != set(range(claimed)):
            raise DataError(f"config.json ({config_path}) says {claimed:,} {side} layers, the weights hold "
                            f"{len(held):,} (blocks {_span(held)})", weights_path)
    output = hf_output_layer(hf_config, tensors, config_path, weights_path)
    # templm's tied output layer is T5X's: the embedding, scaled. Any other (its own head, or an unscaled
    # embedding) is an output layer of its own, the scale folded into its kernel.
    tied = output.head == "shared.weight" and output.scale
    config = dataclasses.replace(config, logits_via_embedding=tied)
    names = (output.head,) if output.head == "lm_head.weight" else _EMBEDDING_ALIASES
    head = next((tensors[n] for n in names if n in tensors), None)
    if not tied and head is not None:  # (a missing embedding is named below)
        head = np.asarray(head, np.float32)
        tensors = {**tensors, "lm_head.weight": head * np.float32(config.emb_dim ** -0.5) if output.scale else head}

    expected = EncoderDecoderModel(config).abstract_init()
    params: Dict[str, Any] = {}
    for hf_name, ours, transpose in hf_parameter_names(config):
        names = _EMBEDDING_ALIASES if hf_name == "shared.weight" else (hf_name,)
        found = [n for n in names if n in tensors]
        if not found:
            raise DataError(f"missing tensor {hf_name!r} (config.json: {config.num_encoder_layers} encoder / "
                            f"{config.num_decoder_layers} decoder layers, feed_forward_proj "
                            f"{hf_config.get('feed_forward_proj', 'relu')!r})", weights_path)
        array = np.array(tensors[found[0]], dtype=np.float32)
        if transpose:
            array = np.ascontiguousarray(array.T)
        want = expected
        for key in ours:
            want = want[key]
        if array.shape != tuple(want.shape):
            raise DataError(f"tensor {found[0]!r} has shape {tensors[found[0]].shape}, expected "
                            f"{tuple(want.shape)[::-1] if transpose else tuple(want.shape)} for this config",
                            weights_path)
        node = params
        for key in ours[:-1]:
            node = node.setdefault(key, {})
        node[ours[-1]] = array
    return config, params


def save_hf_checkpoint(params: PyTree, config: T5Config, directory: str) -> str:
    """Write `config.json` and `model.safetensors` (float32, HF names and layouts) into `directory`; returns it.
    Files are written under temporary names and renamed, so a failure leaves no half-written checkpoint."""
    directory = os.fspath(directory)
    os.makedirs(directory, exist_ok=True)
    tensors = {}
    for hf_name, ours, transpose in hf_parameter_names(config):
        node = params
        for key in ours:
            node = node[key]
        array = np.asarray(jax.device_get(node), dtype=np.float32)
        tensors[hf_name] = np.ascontiguousarray(array.T if transpose else array)
    weights, config_path = os.path.join(directory, "model.safetensors"), os.path.join(directory, "config.json")
    try:
        save_file(tensors, weights + ".tmp", metadata={"format": "pt"})
        with open(config_path + ".tmp", "w", encoding="utf-8") as f:
            json.dump(config_to_hf(config), f, indent=2, sort_keys=True)
        os.replace(weights + ".tmp", weights)
        os.replace(config_path + ".tmp", config_path)
    finally:
        for tmp in (weights + ".tmp", config_path + ".tmp"):
            if os.path.exists(tmp):
                os.remove(tmp)
    return directory
