"""Dynamic evaluation: lr=0 is static evaluation, frozen subsets stay bitwise, the RMS rule by hand, repeated text."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import flax.linen as nn

from templm.evaluation.dynamic_eval import (adapt_mask, collect_ms, dynamic_eval_stream, param_paths,
                                            rms_decay_rate, rms_update, sgd_update, static_eval_stream)
from templm.models.transformer_xl import TXL_CONFIGS, TransformerXL, lm_loss, next_mem_valid

N, B, T = 8, 2, 16  # every stream in this file: 8 segments of 2 rows of 16 tokens (one compile per variant)
MEM = 16
TINY = TXL_CONFIGS["tiny"]
MODEL = TransformerXL(TINY)


def shapes_of(config):
    return nn.unbox(jax.eval_shape(TransformerXL(config).init, jax.random.PRNGKey(0),
                                   jax.ShapeDtypeStruct((B, T), jnp.int32)))["params"]


def random_params(config, seed):
    """Every entry random (norm scales around 1), so biases and norms matter and no gradient is trivially zero."""
    rng = np.random.default_rng(seed)

    def fill(path, leaf):
        base = 1.0 if path[-1].key == "scale" else 0.0
        return jnp.asarray(base + 0.1 * rng.standard_normal(leaf.shape), jnp.float32)

    return jax.tree_util.tree_map_with_path(fill, shapes_of(config))


@pytest.fixture(scope="module")
def params():
    return random_params(TINY, seed=0)


@pytest.fixture(scope="module")
def repeated():
    """[N, B, T+1]: each row is one document of N*T/2 tokens (24 distinct token ids) read twice in a row."""
    rng = np.random.default_rng(1)
    rows = []
    for _ in range(B):
        doc = rng.choice(rng.choice(TINY.vocab_size, 24, replace=False), size=N * T // 2)
        stream = np.concatenate([doc, doc, doc[:1]])
        rows.append(np.stack([stream[i * T:(i + 1) * T + 1] for i in range(N)]))
    return jnp.asarray(np.stack(rows, axis=1), jnp.int32)


@pytest.fixture(scope="module")
def static_lp(params, repeated):
    return np.asarray(static_eval_stream(MODEL, params, repeated, MEM))


def ppl(lp):
    return float(np.exp(-np.mean(lp)))


def leaves_by_path(tree):
    return dict(zip(jax.tree_util.tree_leaves(param_paths(tree)), jax.tree_util.tree_leaves(tree)))


# ------------------------------------------------------------------------------------------------------------------


def test_lr_zero_equals_static_exactly(params, repeated, static_lp):
    lp, new_params = dynamic_eval_stream(MODEL, params, repeated, MEM, "sgd", 0.0, "all", return_params=True)
    assert lp.shape == (N, B, T)
    np.testing.assert_array_equal(np.asarray(lp), static_lp)
    for a, b in zip(jax.tree_util.tree_leaves(new_params), jax.tree_util.tree_leaves(params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_repeated_document_gets_easier_with_dynamic_eval_only(params, repeated, static_lp):
    half = N // 2
    dyn = np.asarray(dynamic_eval_stream(MODEL, params, repeated, MEM, "sgd", 0.1, "all"))
    # Static: the model learns nothing, so the second copy is as hard as the first (random weights cannot copy).
    assert 0.9 < ppl(static_lp[half:]) / ppl(static_lp[:half]) < 1.1
    # Dynamic: the first segment is scored before any step, so it matches static; the second copy falls sharply.
    np.testing.assert_array_equal(dyn[0], static_lp[0])
    assert ppl(dyn[half:]) < 0.5 * ppl(dyn[:half])
    assert ppl(dyn[half:]) < 0.5 * ppl(static_lp[half:])


def test_zero_weights_never_train(params, repeated, static_lp):
    inputs, targets = repeated[..., :-1], repeated[..., 1:]
    lp, new_params = dynamic_eval_stream(MODEL, params, (inputs, targets, jnp.zeros(targets.shape)), MEM, "sgd", 0.1,
                                         "all", return_params=True)
    np.testing.assert_array_equal(np.asarray(lp), static_lp)
    for a, b in zip(jax.tree_util.tree_leaves(new_params), jax.tree_util.tree_leaves(params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("which, adapted", [
    ("embeddings", {"embedding"}),
    ("biases", None),  # every leaf named scale, bias, u_bias, v_bias, output_bias
])
def test_frozen_parameters_stay_bitwise_unchanged(params, repeated, static_lp, which, adapted):
    lp, new_params = dynamic_eval_stream(MODEL, params, repeated, MEM, "sgd", 0.1, which, return_params=True)
    before, after = leaves_by_path(params), leaves_by_path(new_params)
    if adapted is None:
        adapted = {p for p in before if p.rsplit("/", 1)[-1] in {"scale", "bias", "u_bias", "v_bias", "output_bias"}}
        assert "output_bias" in adapted and "layer_1/u_bias" in adapted and "layer_0/mlp/norm/scale" in adapted
    assert set(before) == set(after)
    for path in before:
        if path in adapted:
            assert not np.array_equal(np.asarray(after[path]), np.asarray(before[path])), f"{path} did not adapt"
        else:
            np.testing.assert_array_equal(np.asarray(after[path]), np.asarray(before[path]), err_msg=path)
    assert not np.array_equal(np.asarray(lp[1:]), static_lp[1:])  # the adapted subset did change predictions


def test_adapt_mask_presets_and_regexes():
    untied = dataclasses.replace(TINY, tie_weights=False, untie_r=False, pre_lnorm=True)
    shapes = shapes_of(untied)

    def selected(which):
        mask = adapt_mask(shapes, which)
        return {p for p, m in zip(jax.tree_util.tree_leaves(param_paths(shapes)), jax.tree_util.tree_leaves(mask))
                if m}

    all_paths = set(jax.tree_util.tree_leaves(param_paths(shapes)))
    assert selected("all") == all_paths
    assert selected("embeddings") == {"embedding", "output_kernel"}
    assert selected("biases") == {p for p in all_paths if p.split("/")[-1] in
                                  ("scale", "bias", "u_bias", "v_bias", "output_bias")}
    assert {"u_bias", "v_bias", "output_bias", "final_norm/scale", "layer_0/mlp/wi/bias"} <= selected("biases")
    assert not any(p.endswith("kernel") for p in selected("biases"))
    assert selected(r"^layer_1/mlp/") == {p for p in all_paths if p.startswith("layer_1/mlp/")}
    assert selected(r"^embedding$") == {"embedding"}
    # Tied model: embeddings is the embedding alone.
    assert {p for p, m in zip(jax.tree_util.tree_leaves(param_paths(shapes_of(TINY))),
                              jax.tree_util.tree_leaves(adapt_mask(shapes_of(TINY), "embeddings"))) if m} \
        == {"embedding"}
    with pytest.raises(ValueError, match="selects no parameter"):
        adapt_mask(shapes, "no_such_layer")
    with pytest.raises(ValueError, match="regular expression"):
        adapt_mask(shapes, "layer_(")
    # A mask pytree passes through; a wrong one is refused.
    mask = adapt_mask(shapes, "biases")
    assert adapt_mask(shapes, mask) == mask
    with pytest.raises(ValueError):
        adapt_mask(shapes, {"embedding": True})


def test_update_rules_by_hand():
    theta = {"a": jnp.array([1.0, -2.0]), "b": jnp.array(0.5)}
    theta0 = {"a": jnp.array([0.0, -1.0]), "b": jnp.array(1.0)}
    g = {"a": jnp.array([0.2, -0.4]), "b": jnp.array(1.0)}
    ss = {"a": jnp.array([0.04, 0.16]), "b": jnp.array(1.0)}  # sqrt: 0.2, 0.4, 1.0
    lr, decay, eps = 0.1, 0.5, 1e-3

    got = sgd_update(theta, g, lr)
    np.testing.assert_allclose(got["a"], [0.98, -1.96], rtol=1e-6)
    np.testing.assert_allclose(got["b"], 0.4, rtol=1e-6)

    # The raw rate: d = lr * g / (sqrt(ss) + eps) + decay * sqrt(ss) * (theta - theta0); theta <- theta - d
    d_a = [0.1 * 0.2 / 0.201 + 0.5 * 0.2 * 1.0, 0.1 * -0.4 / 0.401 + 0.5 * 0.4 * -1.0]
    d_b = 0.1 * 1.0 / 1.001 + 0.5 * 1.0 * -0.5
    got = rms_update(theta, g, ss, theta0, lr, decay, eps, normalise_decay=False)
    np.testing.assert_allclose(got["a"], [1.0 - d_a[0], -2.0 - d_a[1]], rtol=1e-6)
    np.testing.assert_allclose(got["b"], 0.5 - d_b, rtol=1e-6)

    # Krause's normalised decay, the default: rate = min(sqrt(ss) / mean(sqrt(ss)), 1 / decay); mean 1.6 / 3.
    mean = 1.6 / 3
    rate = [min(0.2 / mean, 2.0), min(0.4 / mean, 2.0), min(1.0 / mean, 2.0)]
    d_a = [0.1 * 0.2 / 0.201 + 0.5 * rate[0] * 1.0, 0.1 * -0.4 / 0.401 + 0.5 * rate[1] * -1.0]
    d_b = 0.1 * 1.0 / 1.001 + 0.5 * rate[2] * -0.5
    got = rms_update(theta, g, ss, theta0, lr, decay, eps)
    np.testing.assert_allclose(got["a"], [1.0 - d_a[0], -2.0 - d_a[1]], rtol=1e-6)
    np.testing.assert_allclose(got["b"], 0.5 - d_b, rtol=1e-6)
    # The clip: with decay 1, a rate above 1 is cut to 1, so theta lands exactly on theta0 when lr = 0.
    got = rms_update(theta, g, {"a": jnp.array([0.0, 0.0]), "b": jnp.array(1.0)}, theta0, 0.0, 1.0, eps,
                     normalise_decay=True)
    np.testing.assert_allclose(got["b"], 1.0, rtol=1e-6)


def test_rms_stream_matches_step_by_step_reference(params, repeated):
    """collect_ms and the scanned RMS rule against a plain Python loop over segments with lm_loss and rms_update."""
    train = repeated[::-1]  # some other stream of the same shape
    ms = collect_ms(params, train, model=MODEL, mem_len=MEM)

    @jax.jit
    def grad_step(p, inp, tgt, mems, valid):
        (_, (nll, new_mems)), g = jax.value_and_grad(
            lambda q: (lambda out: (out[0], (out[1], out[2])))(
                lm_loss(q, inp, tgt, mems, MEM, True, model=MODEL, mem_valid=valid)), has_aux=True)(p)
        return nll, new_mems, g

    def loop(p, tokens, fn):
        mems, valid = MODEL.init_mems(B, MEM), jnp.zeros((), jnp.int32)
        out = []
        for seg in tokens:
            nll, mems, g = grad_step(p, seg[:, :-1], seg[:, 1:], mems, valid)
            valid = next_mem_valid(valid, T, MEM)
            out.append(-nll)
            p = fn(p, g)
        return np.stack(out), p

    squares = []
    loop(params, train, lambda p, g: (squares.append(jax.tree_util.tree_map(jnp.square, g)), p)[1])
    expected_ms = jax.tree_util.tree_map(lambda *s: sum(s) / len(s), *squares)
    for a, b in zip(jax.tree_util.tree_leaves(ms), jax.tree_util.tree_leaves(expected_ms)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-12)

    lr, decay, eps = 3e-3, 0.02, 1e-5
    lp, new_params = dynamic_eval_stream(MODEL, params, repeated, MEM, "rms", lr, "all", decay=decay, eps=eps,
                                         ms=ms, return_params=True)
    rms_step = jax.jit(lambda p, g: rms_update(p, g, ms, params, lr, decay, eps))
    ref_lp, ref_params = loop(params, repeated, rms_step)
    np.testing.assert_allclose(np.asarray(lp), ref_lp, rtol=1e-4, atol=1e-4)
    for a, b in zip(jax.tree_util.tree_leaves(new_params), jax.tree_util.tree_leaves(ref_params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
    assert ppl(np.asarray(lp)[N // 2:]) < ppl(np.asarray(lp)[:N // 2])


def test_bad_arguments(params, repeated):
    with pytest.raises(ValueError, match="rule"):
        dynamic_eval_stream(MODEL, params, repeated, MEM, "adam", 0.1)
    with pytest.raises(ValueError, match="ms"):
        dynamic_eval_stream(MODEL, params, repeated, MEM, "rms", 0.1)
    with pytest.raises(ValueError, match="segments"):
        static_eval_stream(MODEL, params, repeated[0], MEM)


def test_rms_decay_is_a_contraction_only_with_the_normalised_rate(params):
    """Krause's normalised rate (the default) keeps decay * rate <= 1 on every parameter, so the decay term maps a
    deviation d from theta0 to (1 - decay * rate) d, never longer, and 300 segments with a strong decay stay finite
    and near theta0. The raw rate sqrt(ss) with the same decay exceeds 2 on the parameters the test picks, where
    that map lengthens d (|1 - decay * sqrt(ss)| > 1): one step of the rule with lr 0 shows it on those parameters
    and only on them. What the raw rule then does over a long stream (NaN within a few dozen segments) is not
    asserted, and every distance is measured on the host: XLA's max reduction on the CPU drops NaN in large arrays,
    so a device-side max of NaN parameters can come out finite."""
    rng = np.random.default_rng(5)
    long_stream = rng.integers(0, TINY.vocab_size, size=(300, B, T + 1))
    ms = collect_ms(params, long_stream[:N], model=MODEL, mem_len=MEM)
    leaves = lambda tree: [np.asarray(leaf, np.float64) for leaf in jax.tree_util.tree_leaves(tree)]  # noqa: E731
    decay = 3.0 / max(float(np.sqrt(leaf).max()) for leaf in leaves(ms))  # the raw rate reaches 3 on one entry

    normalised = leaves(rms_decay_rate(ms, decay))
    raw = leaves(rms_decay_rate(ms, decay, normalise_decay=False))
    assert max(float((decay * r).max()) for r in normalised) <= 1.0 + 1e-6
    expanding = [decay * r > 2.0 for r in raw]
    assert sum(int(e.sum()) for e in expanding) > 0

    shift = 0.01
    moved = jax.tree_util.tree_map(lambda p: p + shift, params)
    zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
    for normalise, rates in ((True, normalised), (False, raw)):
        stepped = rms_update(moved, zeros, ms, params, 0.0, decay, 1e-3, normalise_decay=normalise)
        for new, old, rate in zip(leaves(stepped), leaves(params), rates):  # the deviation after one step
            np.testing.assert_allclose(new - old, (1.0 - decay * rate) * shift, rtol=1e-3, atol=1e-6)
    lengthened = [np.abs(1.0 - decay * r) > 1.0 for r in raw]
    assert all((le == ex).all() for le, ex in zip(lengthened, expanding))

    lp, bounded = dynamic_eval_stream(MODEL, params, long_stream, MEM, "rms", 1e-3, decay=decay, eps=1e-3, ms=ms,
                                      return_params=True)
    assert np.isfinite(np.asarray(lp)).all()
    distances = [np.abs(a - b).max() for a, b in zip(leaves(bounded), leaves(params))]
    assert np.isfinite(distances).all() and max(distances) < 1.0
