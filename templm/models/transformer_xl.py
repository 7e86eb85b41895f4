"""Transformer-XL (Dai et al. 2019) in flax.linen: relative positional attention and segment-level recurrence.

This is the language model of the streaming-perplexity experiments (Lazaridou et al., "Mind the Gap"). A long
token stream is cut into segments of `tgt_len` tokens; each layer attends over its own input for the current segment
plus a memory of the last `mem_len` hidden states of the same layer from earlier segments (gradients stopped).

Attention score between query position i and key position j, per head (Dai et al. 2019, section 3.3):

    score[i, j] = ((q_i + u) . k_j  +  (q_i + v) . (W_R R_{i-j})) / sqrt(d_head)

where R_{i-j} is the sinusoidal encoding of the distance i - j (clamped at `clamp_len` when that is > 0), u and v
are learned content and position biases ("heads", "kv") shared by all positions, per layer (`untie_r`) or shared by
all layers. The position term is computed once against the encodings of distances klen-1 .. 0 and realigned to the
(query, key) grid by `rel_shift` (the pad-and-reshape trick).

Memory. `__call__(tokens, mems, deterministic, mem_len=..., mem_valid=...)` returns `(logits, new_mems)`, where
`mems` holds n_layer + 1 arrays [B, M, d_model]: the embedding output and each layer's output, i.e. the input of
every layer and the output of the last one. The new memory of a layer is the last `mem_len` rows of
concat(old memory, current input), gradient stopped. `mem_len` is a call argument (training and evaluation use
different lengths; the paper trains with 384 and evaluates with 1600); it defaults to the config's.

The start of a stream has no history. Two ways to run it, giving the same logits:
  * `mems=None` (or arrays of length 0): the memory grows segment by segment up to `mem_len` (shapes change, so a
    jitted step compiles once per distinct memory length, at most ceil(mem_len / tgt_len) + 1 times);
  * fixed shapes: `mems = model.init_mems(batch, mem_len)` (zeros) with `mem_valid=0`; after each segment the caller
    sets `mem_valid = next_mem_valid(mem_valid, tgt_len, mem_len)`. Memory rows that are not yet filled are masked
    out of attention, so the first segment never attends to the zero padding. `mem_valid` may be a scalar or a [B]
    vector (streams of a batch may restart at different times).

Masking. Causal: query i (at key index M + i) sees keys j <= M + i that are valid. With `same_length=True` every
query attends to the same number of keys, mem_len + 1 (itself and the mem_len tokens before it; fewer only at the
very start of a stream, where that much history does not exist), as in the original TF code's `same_length` mask
when the memory is full. `attention_mask` builds the mask and is public so tests can check it.

Sharding. Every parameter carries logical axis names (nn.with_logical_partitioning, T5X names) and activations are
constrained with nn.with_logical_constraint; with no axis rules in scope the constraints are no-ops.

Parameter count of the "paper" configuration (18 layers, d_model 1024, 16 heads of 64, d_inner 4096, vocabulary
50,259, tied output layer, per-layer u and v, post-LN): 297,085,011 (`count_parameters`): 51.5M embedding, 13.64M
per layer, 50K output bias. Lazaridou et al. report ~287M; the 10M (3.5%) gap is not explained by the hyper-parameters
the paper states (an untied output layer would add 51.5M, shared u/v would remove 36,864), so we report our count.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import flax.linen as nn

from templm.errors import require_field_types

Array = jax.Array

# Logical axis names of activations (a rules table elsewhere maps them onto mesh axes).
_HIDDEN_AXES = ("batch", "length", "embed")
_HEADS_AXES = ("batch", "length", "heads", "kv")
_MLP_AXES = ("batch", "length", "mlp")
_LOGITS_AXES = ("batch", "length", "vocab")
_SCORE_AXES = ("batch", "heads", "length", None)

_INIT_STD = 0.02  # normal(0, 0.02) for every weight matrix, the embedding and u/v, as the original code
_LN_EPS = 1e-5  # torch.nn.LayerNorm default used by the original code


@dataclasses.dataclass(frozen=True)
class TransformerXLConfig:
    """Hyper-parameters of a Transformer-XL language model.

    tgt_len is the segment length used in training; mem_len the training memory length and eval_mem_len the
    evaluation memory length (None: same as mem_len). clamp_len > 0 clamps relative distances at that value
    (-1: no clamping). tie_weights: the output softmax uses the embedding matrix (plus its own bias). untie_r: u and
    v biases per layer (True) or one pair shared by all layers (False). dtype is the compute dtype; parameters are
    always float32.
    """

    vocab_size: int
    d_model: int
    n_head: int
    d_head: int
    d_inner: int
    n_layer: int
    tgt_len: int
    mem_len: int
    clamp_len: int = -1
    same_length: bool = False
    pre_lnorm: bool = False
    dropout: float = 0.1
    dropatt: float = 0.0
    tie_weights: bool = True
    untie_r: bool = True
    dtype: Any = jnp.float32
    eval_mem_len: Optional[int] = None

    def __post_init__(self):
        require_field_types(self, "templm.TransformerXLConfig")  # a quoted number or an infinity from gin, named
        for name in ("vocab_size", "d_model", "n_head", "d_head", "d_inner", "n_layer", "tgt_len"):
            if int(getattr(self, name)) <= 0:
                raise ValueError(f"TransformerXLConfig.{name} must be positive, got {getattr(self, name)!r}")
        if self.mem_len < 0:
            raise ValueError(f"TransformerXLConfig.mem_len must be >= 0, got {self.mem_len!r}")
        if self.d_model % 2:
            raise ValueError(f"TransformerXLConfig.d_model must be even (sinusoid encodings), got {self.d_model}")
        for name in ("dropout", "dropatt"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"TransformerXLConfig.{name} must be in [0, 1), got {getattr(self, name)!r}")

    @property
    def test_mem_len(self) -> int:
        """Memory length for evaluation: eval_mem_len when set, else mem_len."""
        return self.mem_len if self.eval_mem_len is None else self.eval_mem_len


TXL_CONFIGS: dict[str, TransformerXLConfig] = {
    # For tests and laptop demos.
    "tiny": TransformerXLConfig(vocab_size=256, d_model=64, n_head=2, d_head=32, d_inner=128, n_layer=2,
                                tgt_len=16, mem_len=16, dropout=0.0, dropatt=0.0),
    # A single-host model: trains on one GPU or a small TPU slice.
    "mid": TransformerXLConfig(vocab_size=8000, d_model=512, n_head=8, d_head=64, d_inner=2048, n_layer=6,
                               tgt_len=128, mem_len=128, dropout=0.1, dropatt=0.0),
    # Lazaridou et al. (2021): 18 layers, d_model 1024, 16 heads, d_inner 4096, segments of 1024 tokens, memory 384
    # in training and 1600 at test, GPT-2 style vocabulary of 50,259. Dropout rates are not reported; 0.1 / 0.0.
    "paper": TransformerXLConfig(vocab_size=50259, d_model=1024, n_head=16, d_head=64, d_inner=4096, n_layer=18,
                                 tgt_len=1024, mem_len=384, eval_mem_len=1600, dropout=0.1, dropatt=0.0,
                                 dtype=jnp.bfloat16),
}


# ----------------------------------------------------------------------------------------------------------------
# Position encodings, rel_shift, masks.


def sinusoid_encoding(distances: Array, d_model: int) -> Array:
    """Sinusoid encodings [K, d_model] of relative distances [K]: [sin(d * f), cos(d * f)], f = 10000^(-2i/d)."""
    inv_freq = 1.0 / (10000.0 ** (jnp.arange(0, d_model, 2, dtype=jnp.float32) / d_model))
    angles = distances.astype(jnp.float32)[:, None] * inv_freq[None, :]
    return jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)


def relative_distances(klen: int, clamp_len: int = -1) -> Array:
    """Distances klen-1 .. 0 (the encoding row m stands for distance klen-1-m), clamped at clamp_len when > 0."""
    distances = jnp.arange(klen - 1, -1, -1, dtype=jnp.float32)
    if clamp_len > 0:
        distances = jnp.minimum(distances, float(clamp_len))
    return distances


def rel_shift(x: Array) -> Array:
    """Realign position scores from (query, distance row) to (query, key) with the pad-and-reshape trick.

    x[..., i, m] is the score of query i against the encoding of distance K-1-m (K = the key length, Q <= K the
    query length, the queries being the last Q of the K positions). The result y[..., i, j] = x[..., i, Q-1-i+j]:
    the score against distance (K-Q+i) - j, the true distance between query i and key j. Entries with j > K-Q+i
    (future keys) hold other values and must be masked.

    Padding one zero column in front makes each row K+1 long; reading the flat buffer as rows of length K after
    skipping its first Q entries shifts row i left by Q-1-i places.
    """
    *lead, qlen, klen = x.shape
    padded = jnp.pad(x, [(0, 0)] * len(lead) + [(0, 0), (1, 0)])
    flat = padded.reshape(*lead, qlen * (klen + 1))
    return flat[..., qlen:].reshape(*lead, qlen, klen)


def attention_mask(qlen: int, mlen: int, *, same_length: bool = False, mem_len: Optional[int] = None,
                   mem_valid: Optional[Any] = None) -> Array:
    """Boolean attention mask [B or 1, 1, qlen, mlen + qlen]: True where query i may attend key j.

    Keys are the mlen memory positions followed by the qlen current ones; query i sits at key index mlen + i.
    Causal: j <= mlen + i. same_length: also j > mlen + i - (mem_len + 1), so every query sees mem_len + 1 keys
    (mem_len defaults to mlen). mem_valid (scalar or [B]): only the last mem_valid memory rows hold real history;
    the others (zero padding at the start of a stream) are masked.
    """
    query_at = jnp.arange(qlen)[:, None] + mlen
    key_at = jnp.arange(mlen + qlen)[None, :]
    allowed = key_at <= query_at
    if same_length:
        window = (mlen if mem_len is None else mem_len) + 1
        allowed = allowed & (key_at > query_at - window)
    allowed = allowed[None, None]
    if mem_valid is not None and mlen > 0:
        valid = jnp.clip(jnp.asarray(mem_valid, jnp.int32).reshape(-1), 0, mlen)  # [B] or [1]
        filled = key_at[None] >= (mlen - valid)[:, None, None]  # [B, 1, K]; current keys always pass
        allowed = allowed & filled[:, None]
    return allowed


def next_mem_valid(mem_valid: Any, qlen: int, mem_len: int) -> Any:
    """How many memory rows hold real history after one more segment of qlen tokens."""
    return jnp.minimum(jnp.asarray(mem_valid) + qlen, mem_len)


# ----------------------------------------------------------------------------------------------------------------
# Layers.


def _dense(features: int, axes: tuple[str, str], name: str, dtype: Any, bias_axes: Optional[tuple[str]] = None):
    return nn.Dense(
        features,
        use_bias=bias_axes is not None,
        dtype=dtype,
        param_dtype=jnp.float32,
        kernel_init=nn.with_logical_partitioning(nn.initializers.normal(_INIT_STD), axes),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), bias_axes or ("embed",)),
        name=name,
    )


def _layer_norm(name: str, dtype: Any) -> nn.LayerNorm:
    return nn.LayerNorm(
        epsilon=_LN_EPS,
        dtype=dtype,
        param_dtype=jnp.float32,
        scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(), ("embed",)),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), ("embed",)),
        name=name,
    )


def _uv_param(module: nn.Module, name: str, config: TransformerXLConfig) -> Array:
    return module.param(name, nn.with_logical_partitioning(nn.initializers.normal(_INIT_STD), ("heads", "kv")),
                        (config.n_head, config.d_head), jnp.float32)


class RelativeMultiHeadAttention(nn.Module):
    """Multi-head attention with Transformer-XL relative positions, over memory + current segment; with residual."""

    config: TransformerXLConfig

    @nn.compact
    def __call__(self, h: Array, mem: Optional[Array], pos_emb: Array, u_bias: Array, v_bias: Array, mask: Array,
                 deterministic: bool) -> Array:
        cfg = self.config
        batch, qlen, _ = h.shape
        n, dh = cfg.n_head, cfg.d_head
        context = h if mem is None else jnp.concatenate([mem.astype(h.dtype), h], axis=1)
        klen = context.shape[1]
        if cfg.pre_lnorm:
            norm = _layer_norm("norm", cfg.dtype)
            context = norm(context)
            query_in = context[:, klen - qlen:]
        else:
            query_in = h
        context = nn.with_logical_constraint(context, _HIDDEN_AXES)

        q = _dense(n * dh, ("embed", "joined_kv"), "query", cfg.dtype)(query_in).reshape(batch, qlen, n, dh)
        k = _dense(n * dh, ("embed", "joined_kv"), "key", cfg.dtype)(context).reshape(batch, klen, n, dh)
        v = _dense(n * dh, ("embed", "joined_kv"), "value", cfg.dtype)(context).reshape(batch, klen, n, dh)
        r = _dense(n * dh, ("embed", "joined_kv"), "pos", cfg.dtype)(pos_emb).reshape(klen, n, dh)
        q = nn.with_logical_constraint(q, _HEADS_AXES)
        k = nn.with_logical_constraint(k, _HEADS_AXES)
        v = nn.with_logical_constraint(v, _HEADS_AXES)

        content = jnp.einsum("bqnd,bknd->bnqk", q + u_bias.astype(q.dtype), k)
        position = rel_shift(jnp.einsum("bqnd,knd->bnqk", q + v_bias.astype(q.dtype), r))
        scores = (content.astype(jnp.float32) + position.astype(jnp.float32)) * (1.0 / math.sqrt(dh))
        scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
        scores = nn.with_logical_constraint(scores, _SCORE_AXES)
        probs = jax.nn.softmax(scores, axis=-1)
        probs = nn.Dropout(cfg.dropatt, name="attn_dropout")(probs, deterministic=deterministic)

        attended = jnp.einsum("bnqk,bknd->bqnd", probs.astype(cfg.dtype), v).reshape(batch, qlen, n * dh)
        out = _dense(cfg.d_model, ("joined_kv", "embed"), "out", cfg.dtype)(attended)
        out = nn.Dropout(cfg.dropout, name="out_dropout")(out, deterministic=deterministic)
        if cfg.pre_lnorm:
            y = h + out
        else:
            y = _layer_norm("norm", cfg.dtype)(h + out)
        return nn.with_logical_constraint(y, _HIDDEN_AXES)


class PositionwiseFeedForward(nn.Module):
    """ReLU feed-forward block with residual; layer norm before (pre_lnorm) or after."""

    config: TransformerXLConfig

    @nn.compact
    def __call__(self, h: Array, deterministic: bool) -> Array:
        cfg = self.config
        norm = _layer_norm("norm", cfg.dtype)
        x = norm(h) if cfg.pre_lnorm else h
        x = _dense(cfg.d_inner, ("embed", "mlp"), "wi", cfg.dtype, bias_axes=("mlp",))(x)
        x = nn.with_logical_constraint(jax.nn.relu(x), _MLP_AXES)
        x = nn.Dropout(cfg.dropout, name="inner_dropout")(x, deterministic=deterministic)
        x = _dense(cfg.d_model, ("mlp", "embed"), "wo", cfg.dtype, bias_axes=("embed",))(x)
        x = nn.Dropout(cfg.dropout, name="out_dropout")(x, deterministic=deterministic)
        y = h + x if cfg.pre_lnorm else norm(h + x)
        return nn.with_logical_constraint(y, _HIDDEN_AXES)


class TransformerXLLayer(nn.Module):
    config: TransformerXLConfig

    @nn.compact
    def __call__(self, h, mem, pos_emb, u_bias, v_bias, mask, deterministic):
        if self.config.untie_r:
            u_bias = _uv_param(self, "u_bias", self.config)
            v_bias = _uv_param(self, "v_bias", self.config)
        h = RelativeMultiHeadAttention(self.config, name="attention")(h, mem, pos_emb, u_bias, v_bias, mask,
                                                                      deterministic)
        return PositionwiseFeedForward(self.config, name="mlp")(h, deterministic)


class TransformerXL(nn.Module):
    """Transformer-XL decoder-only language model with segment-level recurrence."""

    config: TransformerXLConfig

    def init_mems(self, batch: int, mem_len: Optional[int] = None) -> list[Array]:
        """n_layer + 1 zero memories [batch, mem_len, d_model]; pass mem_valid=0 with them on the first segment."""
        cfg = self.config
        mem_len = cfg.mem_len if mem_len is None else mem_len
        return [jnp.zeros((batch, mem_len, cfg.d_model), cfg.dtype) for _ in range(cfg.n_layer + 1)]

    @nn.compact
    def __call__(self, tokens: Array, mems: Optional[Sequence[Array]] = None, deterministic: bool = True, *,
                 mem_len: Optional[int] = None, mem_valid: Optional[Any] = None) -> tuple[Array, list[Array]]:
        """tokens [B, T] int -> (logits [B, T, vocab] float32, new_mems: n_layer + 1 arrays [B, M', d_model]).

        mems: None or n_layer + 1 arrays [B, M, d_model]; mem_len (static) overrides config.mem_len and sets how
        many positions the new memory keeps (M' = min(mem_len, M + T)); mem_valid (scalar or [B], may be traced):
        how many of the last memory rows are real history (default: all M).
        """
        cfg = self.config
        mem_len = cfg.mem_len if mem_len is None else int(mem_len)
        if mem_len < 0:
            raise ValueError(f"mem_len must be >= 0, got {mem_len}")
        if tokens.ndim != 2:
            raise ValueError(f"tokens must be [batch, length], got shape {tokens.shape}")
        batch, qlen = tokens.shape
        if mems is not None and len(mems) != cfg.n_layer + 1:
            raise ValueError(f"mems must hold n_layer + 1 = {cfg.n_layer + 1} arrays, got {len(mems)}")
        mlen = 0 if mems is None else int(mems[0].shape[1])
        if mems is not None:
            for i, m in enumerate(mems):
                if m.shape != (batch, mlen, cfg.d_model):
                    raise ValueError(f"mems[{i}] has shape {m.shape}, expected {(batch, mlen, cfg.d_model)}")
        if mlen == 0:
            mems = None
        klen = mlen + qlen

        embedding = self.param("embedding",
                               nn.with_logical_partitioning(nn.initializers.normal(_INIT_STD), ("vocab", "embed")),
                               (cfg.vocab_size, cfg.d_model), jnp.float32)
        x = jnp.take(embedding, tokens.astype(jnp.int32), axis=0).astype(cfg.dtype) * math.sqrt(cfg.d_model)
        x = nn.with_logical_constraint(x, _HIDDEN_AXES)

        pos_emb = sinusoid_encoding(relative_distances(klen, cfg.clamp_len), cfg.d_model).astype(cfg.dtype)
        x = nn.Dropout(cfg.dropout, name="embed_dropout")(x, deterministic=deterministic)
        pos_emb = nn.Dropout(cfg.dropout, name="pos_dropout")(pos_emb, deterministic=deterministic)

        mask = attention_mask(qlen, mlen, same_length=cfg.same_length, mem_len=mem_len, mem_valid=mem_valid)

        if cfg.untie_r:
            u_bias = v_bias = None
        else:
            u_bias = _uv_param(self, "u_bias", cfg)
            v_bias = _uv_param(self, "v_bias", cfg)

        hiddens = [x]
        h = x
        for i in range(cfg.n_layer):
            h = TransformerXLLayer(cfg, name=f"layer_{i}")(h, None if mems is None else mems[i], pos_emb, u_bias,
                                                            v_bias, mask, deterministic)
            hiddens.append(h)

        if cfg.pre_lnorm:
            h = _layer_norm("final_norm", cfg.dtype)(h)
        h = nn.Dropout(cfg.dropout, name="final_dropout")(h, deterministic=deterministic)

        output_bias = self.param("output_bias", nn.with_logical_partitioning(nn.initializers.zeros_init(), ("vocab",)),
                                 (cfg.vocab_size,), jnp.float32)
        if cfg.tie_weights:
            logits = jnp.einsum("btd,vd->btv", h, embedding.astype(cfg.dtype))
        else:
            kernel = self.param("output_kernel",
                                nn.with_logical_partitioning(nn.initializers.normal(_INIT_STD), ("embed", "vocab")),
                                (cfg.d_model, cfg.vocab_size), jnp.float32)
            logits = jnp.einsum("btd,dv->btv", h, kernel.astype(cfg.dtype))
        logits = logits.astype(jnp.float32) + output_bias
        logits = nn.with_logical_constraint(logits, _LOGITS_AXES)

        new_mems = []
        for i, hid in enumerate(hiddens):
            full = hid if mems is None else jnp.concatenate([mems[i].astype(hid.dtype), hid], axis=1)
            kept = full[:, max(0, klen - mem_len):]
            new_mems.append(jax.lax.stop_gradient(nn.with_logical_constraint(kept, _HIDDEN_AXES)))
        return logits, new_mems


# ----------------------------------------------------------------------------------------------------------------
# Pure helpers for training and evaluation.


def _variables(params: Any) -> dict:
    """Accept the "params" collection itself or a variables dict holding it."""
    if isinstance(params, dict) and "params" in params:
        return params
    return {"params": params}


def lm_loss(params: Any, tokens: Array, targets: Array, mems: Optional[Sequence[Array]] = None,
            mem_len: Optional[int] = None, deterministic: bool = True, rngs: Optional[dict] = None, *,
            model: TransformerXL, weights: Optional[Array] = None,
            mem_valid: Optional[Any] = None) -> tuple[Array, Array, list[Array]]:
    """Next-token loss of one segment: (mean NLL over weighted tokens, per-token NLL [B, T], new_mems).

    targets [B, T] are the tokens to predict (usually tokens shifted by one in the stream); weights [B, T]
    (default all ones) zero out padding; the mean is sum(w * nll) / sum(w). Pure in params: differentiate with
    jax.grad(lambda p: lm_loss(p, ..., model=model)[0]) or wrap the tail as has_aux. mem_len must be static.
    rngs: {"dropout": key} when deterministic is False.
    """
    logits, new_mems = model.apply(_variables(params), tokens, mems, deterministic, mem_len=mem_len,
                                   mem_valid=mem_valid, rngs=rngs)
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    nll = -jnp.take_along_axis(log_probs, targets.astype(jnp.int32)[..., None], axis=-1)[..., 0]
    w = jnp.ones_like(nll) if weights is None else weights.astype(jnp.float32)
    loss = jnp.sum(nll * w) / jnp.maximum(jnp.sum(w), 1e-8)
    return loss, nll, new_mems


def token_log_probs(params: Any, tokens: Array, targets: Array, mems: Optional[Sequence[Array]] = None,
                    mem_len: Optional[int] = None, *, model: TransformerXL,
                    mem_valid: Optional[Any] = None) -> tuple[Array, list[Array]]:
    """Evaluation: (log p(targets[b, t] | history) [B, T] float32, new_mems), dropout off.

    mem_len defaults to the config's evaluation memory length (eval_mem_len, else mem_len).
    """
    mem_len = model.config.test_mem_len if mem_len is None else mem_len
    logits, new_mems = model.apply(_variables(params), tokens, mems, True, mem_len=mem_len, mem_valid=mem_valid)
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    return jnp.take_along_axis(log_probs, targets.astype(jnp.int32)[..., None], axis=-1)[..., 0], new_mems


def count_parameters(config: TransformerXLConfig) -> int:
    """Number of parameters, from shapes only (jax.eval_shape: nothing is allocated)."""
    model = TransformerXL(config)
    tokens = jax.ShapeDtypeStruct((1, min(config.tgt_len, 8)), jnp.int32)
    shapes = jax.eval_shape(functools.partial(model.init, mem_len=0), jax.random.PRNGKey(0), tokens)
    return int(sum(np.prod(leaf.shape) for leaf in jax.tree_util.tree_leaves(shapes["params"])))
