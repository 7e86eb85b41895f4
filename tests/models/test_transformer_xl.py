"""Transformer-XL: recurrence equals one long causal pass, masks, rel_shift, parameter counts, training, sharding."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import flax.linen as nn

from templm.models.transformer_xl import (TXL_CONFIGS, TransformerXL, TransformerXLConfig, attention_mask,
                                          count_parameters, lm_loss, next_mem_valid, rel_shift,
                                          relative_distances, token_log_probs)

B, T = 2, 16
TINY = TXL_CONFIGS["tiny"]
# A variant exercising the other branches: pre-LN, untied output layer, shared u/v, clamped distances.
VARIANT = dataclasses.replace(TINY, pre_lnorm=True, tie_weights=False, untie_r=False, clamp_len=5)

_FORWARDS = {}


def forward(config):
    """Jitted deterministic apply for a config: f(params, tokens, mems, mem_valid, mem_len) -> (logits, mems)."""
    if config not in _FORWARDS:
        model = TransformerXL(config)

        def run(params, tokens, mems, mem_valid, mem_len):
            return model.apply({"params": params}, tokens, mems, True, mem_len=mem_len, mem_valid=mem_valid)

        _FORWARDS[config] = jax.jit(run, static_argnums=4)
    return _FORWARDS[config]


def init_params(config, seed=0):
    init = jax.jit(TransformerXL(config).init)
    return nn.unbox(init(jax.random.PRNGKey(seed), jnp.zeros((B, T), jnp.int32)))["params"]


def random_params(config, seed):
    """Parameters of the model's shapes with every entry random (layer norms and biases too), without compiling
    init: the invariance tests then also cover non-trivial norm scales and biases."""
    shapes = nn.unbox(jax.eval_shape(TransformerXL(config).init, jax.random.PRNGKey(0),
                                     jax.ShapeDtypeStruct((B, T), jnp.int32)))["params"]
    rng = np.random.default_rng(seed)

    def fill(path, leaf):
        base = 1.0 if getattr(path[-1], "key", None) == "scale" else 0.0
        return jnp.asarray(base + 0.1 * rng.standard_normal(leaf.shape), jnp.float32)

    return jax.tree_util.tree_map_with_path(fill, shapes)


@pytest.fixture(scope="module")
def tiny_params():
    return random_params(TINY, seed=0)


@pytest.fixture(scope="module")
def variant_params():
    return random_params(VARIANT, seed=1)


@pytest.fixture(scope="module")
def stream():
    return jax.random.randint(jax.random.PRNGKey(42), (B, 2 * T), 0, TINY.vocab_size, jnp.int32)


def two_segments(config, params, tokens, mem_len=T):
    """Logits [B, 2T] from two segments of T with memory carried (starting from no memory)."""
    f = forward(config)
    l1, m1 = f(params, tokens[:, :T], None, None, mem_len)
    l2, m2 = f(params, tokens[:, T:], m1, None, mem_len)
    return jnp.concatenate([l1, l2], axis=1), m1, m2


# ------------------------------------------------------------------------------------------------------------------
# The key invariant: recurrence over segments == one causal pass over their concatenation.


@pytest.mark.parametrize("name", ["tiny", "variant"])
def test_segments_with_memory_equal_one_long_pass(name, tiny_params, variant_params, stream):
    config, params = (TINY, tiny_params) if name == "tiny" else (VARIANT, variant_params)
    one_pass = dataclasses.replace(config, tgt_len=2 * T, mem_len=0)
    full, full_mems = forward(one_pass)(params, stream, None, None, 0)
    assert full.shape == (B, 2 * T, config.vocab_size) and full.dtype == jnp.float32
    assert len(full_mems) == config.n_layer + 1 and all(m.shape == (B, 0, config.d_model) for m in full_mems)

    assert float(jnp.max(jnp.abs(full[:, T:] - full[:, :T]))) > 1e-3  # the comparison is not vacuous

    # Fixed-shape path: zero memories of length T with mem_valid counting the filled rows.
    f = forward(config)
    mems = TransformerXL(config).init_mems(B, T)
    l1, mems = f(params, stream[:, :T], mems, jnp.int32(0), T)
    valid = next_mem_valid(0, T, T)
    l2, _ = f(params, stream[:, T:], mems, valid, T)
    np.testing.assert_allclose(l1, full[:, :T], atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(l2, full[:, T:], atol=1e-5, rtol=1e-5)
    if name == "variant":
        return

    # Growing memory from None (the default path).
    seg, m1, m2 = two_segments(config, params, stream)
    np.testing.assert_allclose(seg, full, atol=1e-5, rtol=1e-5)
    # The memory is the layer inputs of the previous segment: the first one is the scaled embedding.
    assert len(m1) == config.n_layer + 1 and all(m.shape == (B, T, config.d_model) for m in m1)
    embedded = params["embedding"][stream[:, T:]] * np.sqrt(config.d_model)
    np.testing.assert_allclose(m2[0], embedded, atol=1e-5, rtol=1e-5)


def test_memory_keeps_last_mem_len_states_and_grows(tiny_params, stream):
    f = forward(TINY)
    l1, m1 = f(tiny_params, stream[:, :T], None, None, 24)
    l2, m2 = f(tiny_params, stream[:, T:], m1, None, 24)
    assert [m.shape[1] for m in m1] == [T] * 3 and [m.shape[1] for m in m2] == [24] * 3
    for a, b in zip(m1, m2):
        np.testing.assert_array_equal(b[:, :8], a[:, 8:])  # the oldest 8 states dropped, the rest kept in order
    # The memory carries no gradient: new mems are constants with respect to the old mems and the parameters.
    grads = jax.jit(jax.grad(lambda m, p: sum(jnp.sum(x) for x in f(p, stream[:, T:], m, None, 24)[1][1:]),
                             argnums=(0, 1)))(m1, tiny_params)
    assert all(float(jnp.max(jnp.abs(g))) == 0.0 for g in jax.tree_util.tree_leaves(grads))


# ------------------------------------------------------------------------------------------------------------------
# Masks.


@pytest.mark.parametrize("position", [0, 5, 15, 16, 23, 31])
def test_changing_a_later_token_never_changes_an_earlier_logit(position, tiny_params, stream):
    base, _, _ = two_segments(TINY, tiny_params, stream)
    changed = stream.at[:, position].set((stream[:, position] + 7) % TINY.vocab_size)
    other, _, _ = two_segments(TINY, tiny_params, changed)
    np.testing.assert_allclose(other[:, :position], base[:, :position], atol=1e-6, rtol=0)  # exact on CPU
    # The changed token itself (and, through the memory, the next segment) does move the logits.
    assert float(jnp.max(jnp.abs(other[:, position] - base[:, position]))) > 1e-4
    if position < T:
        assert float(jnp.min(jnp.max(jnp.abs(other[:, T:] - base[:, T:]), axis=-1))) > 1e-6


def test_first_segment_with_empty_memory_equals_no_memory(tiny_params, stream):
    f = forward(TINY)
    reference, ref_mems = f(tiny_params, stream[:, :T], None, None, 24)
    zeros = TransformerXL(TINY).init_mems(B, 24)
    masked, mems = f(tiny_params, stream[:, :T], zeros, jnp.zeros((B,), jnp.int32), 24)
    np.testing.assert_allclose(masked, reference, atol=1e-6, rtol=1e-6)
    for kept, ref in zip(mems, ref_mems):  # the real states sit at the end of the fixed-length memory
        np.testing.assert_allclose(kept[:, -T:], ref, atol=1e-6)
    # Without the mask the zero padding is attended and changes the logits: the masking matters.
    unmasked, _ = f(tiny_params, stream[:, :T], zeros, jnp.full((B,), 24, jnp.int32), 24)
    assert float(jnp.max(jnp.abs(unmasked - reference))) > 1e-4

    # Per-example mem_valid: a stream that restarts (row 1) ignores its stale memory, the other (row 0) uses it.
    l2, _ = f(tiny_params, stream[:, T:], mems, jnp.array([T, 0], jnp.int32), 24)
    fresh, _ = f(tiny_params, stream[:, T:], None, None, 24)
    np.testing.assert_allclose(l2[1], fresh[1], atol=1e-6, rtol=1e-6)
    assert float(jnp.max(jnp.abs(l2[0] - fresh[0]))) > 1e-4


def test_attention_mask_causal_and_valid_memory():
    mask = np.asarray(attention_mask(4, 3, mem_valid=jnp.array([3, 1])))
    assert mask.shape == (2, 1, 4, 7)
    for b, valid in enumerate([3, 1]):
        for i in range(4):
            expected = [(3 - valid) <= j <= 3 + i for j in range(7)]
            assert mask[b, 0, i].tolist() == expected


def test_same_length_mask_counts_and_positions():
    qlen, mlen = T, T
    causal = np.asarray(attention_mask(qlen, mlen))[0, 0]
    same = np.asarray(attention_mask(qlen, mlen, same_length=True, mem_len=mlen))[0, 0]
    assert (causal.sum(-1) == mlen + 1 + np.arange(qlen)).all()
    assert (same.sum(-1) == mlen + 1).all()  # every query attends to the same number of keys
    assert not (same & ~causal).any()  # same_length only removes keys
    removed = causal & ~same
    for i in range(qlen):
        assert np.flatnonzero(removed[i]).tolist() == list(range(i))  # exactly the oldest i keys of query i
    # At the start of a stream (nothing in memory yet) the window is truncated by what exists.
    start = np.asarray(attention_mask(qlen, mlen, same_length=True, mem_len=mlen, mem_valid=0))[0, 0]
    assert (start.sum(-1) == np.arange(1, qlen + 1)).all()
    # A longer memory than the window: every query still sees mem_len + 1 keys.
    long = np.asarray(attention_mask(8, 12, same_length=True, mem_len=5))[0, 0]
    assert (long.sum(-1) == 6).all()
    assert [np.flatnonzero(r).tolist() for r in long[:2]] == [list(range(7, 13)), list(range(8, 14))]


def test_same_length_model_differs_only_where_the_mask_does(tiny_params, stream):
    # In segment 1 the window (mem_len + 1 = 17 keys) covers all 16 causal keys: same_length changes nothing there
    # (the mask test checks that), so both models carry the same memory into segment 2.
    causal, m1, _ = two_segments(TINY, tiny_params, stream)
    same, _ = forward(dataclasses.replace(TINY, same_length=True))(tiny_params, stream[:, T:], m1, None, T)
    # The first query of segment 2 sees the same 17 keys under both masks; every later query loses its oldest ones.
    np.testing.assert_allclose(same[:, 0], causal[:, T], atol=1e-5, rtol=1e-5)
    diff = np.asarray(jnp.max(jnp.abs(same[:, 1:] - causal[:, T + 1:]), axis=-1))
    assert (diff > 1e-5).all()


# ------------------------------------------------------------------------------------------------------------------
# rel_shift and positions.


@pytest.mark.parametrize("qlen,mlen", [(5, 7), (6, 0), (1, 3)])
def test_rel_shift_matches_direct_relative_index(qlen, mlen):
    klen = qlen + mlen
    x = np.random.default_rng(qlen + mlen).normal(size=(2, 3, qlen, klen)).astype(np.float32)
    shifted = np.asarray(rel_shift(x))
    distances = np.asarray(relative_distances(klen))  # row m of the encodings is distance klen - 1 - m
    for i in range(qlen):
        for j in range(mlen + i + 1):  # every key the query may attend
            m = int(np.flatnonzero(distances == (mlen + i) - j)[0])  # the row for the true distance i - j
            np.testing.assert_array_equal(shifted[..., i, j], x[..., i, m])


def test_relative_distances_clamp():
    assert relative_distances(6).tolist() == [5, 4, 3, 2, 1, 0]
    assert relative_distances(6, clamp_len=3).tolist() == [3, 3, 3, 2, 1, 0]
    assert relative_distances(6, clamp_len=-1).tolist() == [5, 4, 3, 2, 1, 0]


# ------------------------------------------------------------------------------------------------------------------
# Parameters.


def formula_param_count(c: TransformerXLConfig) -> int:
    d, hd = c.d_model, c.n_head * c.d_head
    attention = 4 * d * hd + hd * d + 2 * d  # W_q, W_k, W_v, W_R; W_o; layer norm
    feed_forward = d * c.d_inner + c.d_inner + c.d_inner * d + d + 2 * d
    uv = 2 * c.n_head * c.d_head
    per_layer = attention + feed_forward + (uv if c.untie_r else 0)
    total = c.vocab_size * d + c.n_layer * per_layer + (0 if c.untie_r else uv)
    total += c.vocab_size + (0 if c.tie_weights else d * c.vocab_size)  # output bias (+ untied softmax matrix)
    total += 2 * d if c.pre_lnorm else 0  # final layer norm of the pre-LN stack
    return total


def test_parameter_counts(tiny_params):
    tiny_count = count_parameters(TINY)
    assert sum(x.size for x in jax.tree_util.tree_leaves(tiny_params)) == tiny_count
    assert tiny_count == formula_param_count(TINY) == 91_520
    for cfg in [VARIANT, dataclasses.replace(TINY, untie_r=False), dataclasses.replace(TINY, tie_weights=False)]:
        assert count_parameters(cfg) == formula_param_count(cfg)
    paper = TXL_CONFIGS["paper"]
    paper_count = count_parameters(paper)  # jax.eval_shape: no allocation
    print(f"\nTransformer-XL parameter counts: tiny={tiny_count:,} mid={count_parameters(TXL_CONFIGS['mid']):,} "
          f"paper={paper_count:,} (Lazaridou et al. report ~287M)")
    assert paper_count == formula_param_count(paper) == 297_085_011
    assert abs(paper_count - 287e6) / 287e6 < 0.04


_EXPECTED_AXES = {
    "embedding": ("vocab", "embed"),
    "output_bias": ("vocab",),
    "output_kernel": ("embed", "vocab"),
    "u_bias": ("heads", "kv"),
    "v_bias": ("heads", "kv"),
    "query/kernel": ("embed", "joined_kv"),
    "key/kernel": ("embed", "joined_kv"),
    "value/kernel": ("embed", "joined_kv"),
    "pos/kernel": ("embed", "joined_kv"),
    "out/kernel": ("joined_kv", "embed"),
    "wi/kernel": ("embed", "mlp"),
    "wi/bias": ("mlp",),
    "wo/kernel": ("mlp", "embed"),
    "wo/bias": ("embed",),
    "norm/scale": ("embed",),
    "norm/bias": ("embed",),
    "final_norm/scale": ("embed",),
    "final_norm/bias": ("embed",),
}


@pytest.mark.parametrize("config", [TINY, VARIANT], ids=["tiny", "variant"])
def test_every_parameter_has_logical_axes(config):
    shapes = jax.eval_shape(TransformerXL(config).init, jax.random.PRNGKey(0), jnp.zeros((B, T), jnp.int32))
    leaves = jax.tree_util.tree_leaves_with_path(shapes["params"], is_leaf=lambda x: isinstance(x, nn.Partitioned))
    assert len(leaves) == len(jax.tree_util.tree_leaves(shapes["params"]))
    for path, leaf in leaves:
        name = "/".join(str(getattr(k, "key", k)) for k in path)
        assert isinstance(leaf, nn.Partitioned), f"{name} has no logical axis names"
        assert len(leaf.names) == leaf.value.ndim, name
        suffix = [s for s in _EXPECTED_AXES if name == s or name.endswith("/" + s)]
        assert suffix, f"unexpected parameter {name}"
        assert leaf.names == _EXPECTED_AXES[max(suffix, key=len)], name
    names = {"/".join(str(getattr(k, "key", k)) for k in p) for p, _ in leaves}
    assert ("output_kernel" in names) == (not config.tie_weights)
    assert ("u_bias" in names) == (not config.untie_r)


def test_sharded_run_matches_single_device(tiny_params, stream):
    if jax.device_count() < 8:
        pytest.skip("needs 8 (fake) devices")
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "model"))
    rules = (("batch", "data"), ("vocab", "model"), ("joined_kv", "model"), ("mlp", "model"), ("heads", None),
             ("kv", None), ("embed", None), ("length", None))
    model = TransformerXL(TINY)
    abstract = jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.zeros((B, T), jnp.int32))
    shardings = nn.logical_to_mesh_sharding(nn.get_partition_spec(abstract), mesh, rules)
    params = jax.device_put(tiny_params, shardings["params"])
    assert params["layer_0"]["mlp"]["wi"]["kernel"].sharding.spec == jax.sharding.PartitionSpec(None, "model")

    reference, m1, _ = two_segments(TINY, tiny_params, stream)
    m1 = jax.device_put(m1, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data")))

    def run(p, tokens, mems):
        return model.apply({"params": p}, tokens, mems, True, mem_len=T)

    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        lowered = jax.jit(run).lower(params, stream[:, T:], m1)
        logits, new_mems = lowered.compile()(params, stream[:, T:], m1)
    assert "sharding_constraint" in lowered.as_text()  # the activation constraints were applied
    assert logits.sharding.spec == jax.sharding.PartitionSpec("data", None, "model")  # ("batch", "length", "vocab")
    np.testing.assert_allclose(logits, reference[:, T:], atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------------------------------------------
# Loss helpers and training.


def test_loss_helpers_agree(tiny_params, stream):
    tokens, targets = stream[:, :T], jnp.roll(stream, -1, axis=1)[:, :T]
    loss_fn = jax.jit(lambda p, w: lm_loss(p, tokens, targets, None, T, model=TransformerXL(TINY), weights=w))
    loss, nll, mems = loss_fn(tiny_params, jnp.ones((B, T)))
    logp, _ = jax.jit(functools.partial(token_log_probs, model=TransformerXL(TINY)),
                      static_argnums=4)(tiny_params, tokens, targets, None, T)
    np.testing.assert_allclose(nll, -logp, atol=1e-5)
    np.testing.assert_allclose(loss, jnp.mean(nll), rtol=1e-6)
    assert nll.shape == (B, T) and float(loss) == pytest.approx(np.log(TINY.vocab_size), abs=0.5)
    assert len(mems) == TINY.n_layer + 1 and mems[0].shape == (B, T, TINY.d_model)
    weighted, nll_again, _ = loss_fn(tiny_params, jnp.zeros((B, T)).at[0, :4].set(1.0))  # padding weighted out
    np.testing.assert_allclose(weighted, jnp.mean(nll[0, :4]), rtol=1e-5)
    np.testing.assert_allclose(nll_again, nll, rtol=1e-6)


def test_tiny_model_learns_a_repeating_sequence():
    config = dataclasses.replace(TINY, dropout=0.1, dropatt=0.1)
    model = TransformerXL(config)
    pattern = jax.random.randint(jax.random.PRNGKey(7), (11,), 0, config.vocab_size)
    stream = jnp.tile(pattern, 40)[None, :].repeat(B, axis=0)
    params = init_params(config, seed=3)
    optimizer = optax.adam(1e-2)
    opt_state = optimizer.init(params)

    @jax.jit
    def step(params, opt_state, mems, mem_valid, tokens, targets, rng):
        def loss_fn(p):
            loss, _, new_mems = lm_loss(p, tokens, targets, mems, T, False, {"dropout": rng}, model=model,
                                        mem_valid=mem_valid)
            return loss, new_mems

        (loss, new_mems), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, new_mems, loss

    mems, mem_valid, losses = model.init_mems(B, T), jnp.int32(0), []
    for i in range(20):
        start = i * T
        tokens, targets = stream[:, start:start + T], stream[:, start + 1:start + T + 1]
        params, opt_state, mems, loss = step(params, opt_state, mems, mem_valid, tokens, targets,
                                             jax.random.PRNGKey(100 + i))
        mem_valid = next_mem_valid(mem_valid, T, T)
        losses.append(float(loss))
    assert np.isfinite(losses).all()
    assert np.mean(losses[-4:]) < 0.2 * losses[0], losses
