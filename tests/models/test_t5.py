"""T5 v1.1 encoder-decoder: sizes, logical axes, Hugging Face import against a numpy forward pass, cached decoding,
packing, scoring, greedy and beam search on a memorised task, bfloat16 compute.

Compiled functions are shared through module-scoped fixtures with fixed shapes (compilation dominates on 2 cores).
"""

import functools
import itertools
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from safetensors.numpy import save_file

from templm.errors import DataError
from templm.models import t5

# A small config for the behavioural tests (vocabulary 64 keeps the beam / log-softmax work tiny).
CFG = t5.T5Config(vocab_size=64, emb_dim=32, num_heads=2, head_dim=16, mlp_dim=64, num_encoder_layers=2,
                  num_decoder_layers=2, relative_attention_num_buckets=8, relative_attention_max_distance=16)
ENC_LEN, DEC_LEN = 12, 8


@pytest.fixture(scope="module")
def model():
    return t5.EncoderDecoderModel(CFG)


@pytest.fixture(scope="module")
def params(model):
    return jax.jit(functools.partial(model.init, input_len=ENC_LEN, target_len=DEC_LEN))(jax.random.PRNGKey(0))


@pytest.fixture(scope="module")
def forward(model):
    """One compiled function for the unpacked [4, ENC_LEN] / [4, DEC_LEN] batches: logits, scores, loss, aux, the
    scores of the same batch without decoder_loss_weights and the losses under other normalisations (XLA shares
    the forward passes, so this costs one compilation)."""
    summed = t5.EncoderDecoderModel(CFG, loss_normalizing_factor=1.0, z_loss=0.0)
    per_position = t5.EncoderDecoderModel(CFG, loss_normalizing_factor="NUM_TOTAL_TARGET_TOKENS", z_loss=0.0)
    no_z = t5.EncoderDecoderModel(CFG, z_loss=0.0)

    @jax.jit
    def fn(params, batch):
        loss, aux = model.loss_fn(params, batch)
        unweighted = {k: v for k, v in batch.items() if k != "decoder_loss_weights"}
        return {"logits": model.logits(params, batch), "scores": model.score_batch(params, batch),
                "scores_unweighted": model.score_batch(params, unweighted), "loss": loss, "aux": aux,
                "loss_summed": summed.loss_fn(params, batch)[0], "loss_no_z": no_z.loss_fn(params, batch)[0],
                "loss_per_position": per_position.loss_fn(params, batch)[0]}
    return fn


def shift_right(targets):
    """Decoder inputs of unpacked targets: start token 0, then the targets without the last."""
    return np.concatenate([np.zeros_like(targets[:, :1]), targets[:, :-1]], axis=1)


def make_batch(inputs, targets, enc_len=ENC_LEN, dec_len=DEC_LEN):
    """An unpacked batch from lists of token lists (EOS appended, zero padded)."""
    enc = np.zeros((len(inputs), enc_len), np.int32)
    tgt = np.zeros((len(targets), dec_len), np.int32)
    for i, (x, y) in enumerate(zip(inputs, targets)):
        enc[i, :len(x) + 1] = list(x) + [t5.EOS_ID]
        tgt[i, :len(y) + 1] = list(y) + [t5.EOS_ID]
    return {"encoder_input_tokens": enc, "decoder_input_tokens": shift_right(tgt), "decoder_target_tokens": tgt,
            "decoder_loss_weights": (tgt > 0).astype(np.float32)}


# A fixed unpacked batch of four examples (padded rows), shared by several tests.
BATCH = make_batch([[5, 9, 13, 7, 22, 31, 4], [40, 41, 3], [7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7], [2]],
                   [[17, 18, 19, 20, 6], [33, 12], [3, 4, 5, 6, 7, 8, 9], []])


# ----------------------------------------------------------------------------------------------------------------------
# Sizes and logical axes
# ----------------------------------------------------------------------------------------------------------------------


def _count(tree):
    return int(sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(tree)))


def expected_count(cfg):
    """Hand formula: embedding, per-layer attention / MLP / norms, relative bias tables, final norms, logits."""
    e, inner, m, n_act = cfg.emb_dim, cfg.num_heads * cfg.head_dim, cfg.mlp_dim, len(cfg.mlp_activations)
    attention = 4 * e * inner
    mlp = (n_act + 1) * e * m
    encoder_layer = attention + mlp + 2 * e
    decoder_layer = 2 * attention + mlp + 3 * e
    relpos = cfg.relative_attention_num_buckets * cfg.num_heads
    logits = 0 if cfg.logits_via_embedding else e * cfg.vocab_size
    return (cfg.vocab_size * e + cfg.num_encoder_layers * encoder_layer + cfg.num_decoder_layers * decoder_layer
            + 2 * relpos + 2 * e + logits)


def test_parameter_counts():
    tiny = t5.T5_1_1_CONFIGS["tiny"]
    shapes = t5.EncoderDecoderModel(tiny).abstract_init()
    # tiny: 2*868*64 (embedding + logits) + 2*(4*64*64 + 3*64*128 + 128) + 2*(8*64*64 + 3*64*128 + 192)
    #       + 2*32*4 + 2*64 = 111,104 + 82,176 + 115,072 + 256 + 128
    assert _count(shapes) == expected_count(tiny) == 308_736
    # T5 v1.1 small, shapes only: 2*32128*512 (embedding, untied logits = 32,899,072)
    #   + 8 encoder layers * (4*512*384 + 3*512*1024 + 2*512 = 2,360,320) = 18,882,560
    #   + 8 decoder layers * (8*512*384 + 3*512*1024 + 3*512 = 3,147,264) = 25,178,112
    #   + relative biases 2*32*6 = 384 + final norms 2*512 = 1,024  -> 76,961,152 (the published ~77M).
    small = t5.T5_1_1_CONFIGS["small"]
    assert t5.count_parameters(small) == expected_count(small) == 76_961_152
    assert t5.count_parameters(t5.T5_1_1_CONFIGS["base"]) == expected_count(t5.T5_1_1_CONFIGS["base"])
    tied_relu = tiny.replace(mlp_activations=("relu",), logits_via_embedding=True)
    assert t5.count_parameters(tied_relu) == expected_count(tied_relu) == 308_736 - 868 * 64 - 4 * 64 * 128


def test_published_sizes():
    sizes = {name: (c.emb_dim, c.num_heads, c.head_dim, c.mlp_dim, c.num_encoder_layers, c.num_decoder_layers)
             for name, c in t5.T5_1_1_CONFIGS.items()}
    assert sizes["small"] == (512, 6, 64, 1024, 8, 8)
    assert sizes["base"] == (768, 12, 64, 2048, 12, 12)
    assert sizes["large"] == (1024, 16, 64, 2816, 24, 24)
    assert sizes["xl"] == (2048, 32, 64, 5120, 24, 24)
    assert sizes["xxl"] == (4096, 64, 64, 10240, 24, 24)
    assert {c.vocab_size for n, c in t5.T5_1_1_CONFIGS.items() if n != "tiny"} == {32128}
    with pytest.raises(ValueError, match="mlp_activations"):
        CFG.replace(mlp_activations=("tanhh",))


EXPECTED_AXES = {
    ("token_embedder", "embedding"): ("vocab", "embed"),
    ("encoder", "relpos_bias", "rel_embedding"): ("heads", "relpos_buckets"),
    ("decoder", "relpos_bias", "rel_embedding"): ("heads", "relpos_buckets"),
    ("encoder", "encoder_norm", "scale"): ("embed",),
    ("decoder", "decoder_norm", "scale"): ("embed",),
    ("decoder", "logits_dense", "kernel"): ("embed", "vocab"),
}


def _path_names(path):
    return tuple(p.key for p in path)


def test_logical_partition_specs(model):
    specs = model.logical_partition_specs()
    shapes = model.abstract_init()
    flat_specs = {_path_names(p): s for p, s in jax.tree_util.tree_flatten_with_path(
        specs, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))[0]}
    flat_shapes = {_path_names(p): s for p, s in jax.tree_util.tree_flatten_with_path(shapes)[0]}
    assert set(flat_specs) == set(flat_shapes)
    seen = set()
    for path, spec in flat_specs.items():
        assert isinstance(spec, jax.sharding.PartitionSpec) and len(spec) == len(flat_shapes[path].shape), path
        if path in EXPECTED_AXES:
            want = EXPECTED_AXES[path]
        elif path[-2] in ("query", "key", "value"):
            want = ("embed", "joined_kv")
        elif path[-2] == "out":
            want = ("joined_kv", "embed")
        elif path[-2] in ("wi_0", "wi_1"):
            want = ("embed", "mlp")
        elif path[-2] == "wo":
            want = ("mlp", "embed")
        elif path[-1] == "scale":
            want = ("embed",)
        else:
            raise AssertionError(f"unexpected parameter {path}")
        assert tuple(spec) == want, path
        seen.add(want)
    assert len(seen) == 8
    # Every parameter is float32; the query kernel of layer 0 has the T5X shape (embed, heads * head_dim).
    assert {x.dtype for x in jax.tree_util.tree_leaves(shapes)} == {jnp.dtype(jnp.float32)}
    assert shapes["encoder"]["layers_0"]["attention"]["query"]["kernel"].shape == (32, 32)


def test_initialisation_scales(params):
    layer = params["encoder"]["layers_0"]
    e, d, inner = CFG.emb_dim, CFG.head_dim, CFG.num_heads * CFG.head_dim
    std = lambda x: float(np.std(np.asarray(x)))
    assert std(params["token_embedder"]["embedding"]) == pytest.approx(1.0, rel=0.1)
    assert std(layer["attention"]["query"]["kernel"]) == pytest.approx((e * d) ** -0.5, rel=0.15)
    assert std(layer["attention"]["key"]["kernel"]) == pytest.approx(e ** -0.5, rel=0.15)
    assert std(layer["attention"]["out"]["kernel"]) == pytest.approx(inner ** -0.5, rel=0.15)
    assert std(layer["mlp"]["wi_0"]["kernel"]) == pytest.approx(e ** -0.5, rel=0.15)
    assert np.all(np.asarray(layer["pre_mlp_layer_norm"]["scale"]) == 1.0)


# ----------------------------------------------------------------------------------------------------------------------
# Hugging Face import, checked against an independent numpy T5 forward pass on the HF weights
# ----------------------------------------------------------------------------------------------------------------------


def hf_config(gated, tied):
    return {"d_model": 16, "d_kv": 8, "d_ff": 24, "num_layers": 2, "num_decoder_layers": 2, "num_heads": 2,
            "relative_attention_num_buckets": 8, "relative_attention_max_distance": 20, "vocab_size": 40,
            "feed_forward_proj": "gated-gelu" if gated else "relu", "tie_word_embeddings": tied,
            "layer_norm_epsilon": 1e-6, "model_type": "t5"}


def hf_weights(hf, seed):
    """Random weights under Hugging Face T5 names and layouts (torch Linear: (out, in))."""
    rng = np.random.default_rng(seed)
    d, inner, f, h = hf["d_model"], hf["num_heads"] * hf["d_kv"], hf["d_ff"], hf["num_heads"]
    gated = hf["feed_forward_proj"].startswith("gated")
    w = {"shared.weight": rng.normal(0, 1.0, (hf["vocab_size"], d))}

    def lin(name, out_dim, in_dim):
        w[name] = rng.normal(0, in_dim ** -0.5, (out_dim, in_dim))

    def attention(prefix):
        for p in "qkv":
            lin(f"{prefix}.{p}.weight", inner, d)
        lin(f"{prefix}.o.weight", d, inner)

    def mlp(prefix):
        for name in (["wi_0", "wi_1"] if gated else ["wi"]):
            lin(f"{prefix}.DenseReluDense.{name}.weight", f, d)
        lin(f"{prefix}.DenseReluDense.wo.weight", d, f)

    def norm(name):
        w[name] = 1.0 + 0.2 * rng.normal(size=(d,))

    for stack, n_sub in (("encoder", 2), ("decoder", 3)):
        for i in range(hf["num_layers"]):
            b = f"{stack}.block.{i}"
            attention(f"{b}.layer.0.SelfAttention")
            if stack == "decoder":
                attention(f"{b}.layer.1.EncDecAttention")
            mlp(f"{b}.layer.{n_sub - 1}")
            for j in range(n_sub):
                norm(f"{b}.layer.{j}.layer_norm.weight")
        w[f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"] = rng.normal(
            0, 0.5, (hf["relative_attention_num_buckets"], h))
        norm(f"{stack}.final_layer_norm.weight")
    if not hf["tie_word_embeddings"]:
        lin("lm_head.weight", hf["vocab_size"], d)
    return {k: v.astype(np.float32) for k, v in w.items()}


def np_relative_bucket(rel, bidirectional, num_buckets, max_distance):
    """Hugging Face's bucketing, rewritten in numpy: rel = key position - query position."""
    out = np.zeros_like(rel)
    if bidirectional:
        num_buckets //= 2
        out += (rel > 0).astype(rel.dtype) * num_buckets
        rel = np.abs(rel)
    else:
        rel = -np.minimum(rel, 0)
    max_exact = num_buckets // 2
    with np.errstate(divide="ignore", invalid="ignore"):
        large = max_exact + (np.log(rel.astype(np.float32) / max_exact) / math.log(max_distance / max_exact)
                             * (num_buckets - max_exact)).astype(rel.dtype)
    large = np.minimum(large, num_buckets - 1)
    return out + np.where(rel < max_exact, rel, large)


def np_t5_logits(w, hf, enc_ids, dec_ids, head=None, scale=None):
    """T5 forward pass in float64 numpy for one example: encoder ids [S] (0 = pad), decoder input ids [T]. The output
    layer multiplies by `head` ("shared.weight" or "lm_head.weight") after scaling by d_model ** -0.5 when `scale`;
    by default both from tie_word_embeddings, as transformers 4 reads it."""
    w = {k: v.astype(np.float64) for k, v in w.items()}
    h, dk, eps = hf["num_heads"], hf["d_kv"], hf["layer_norm_epsilon"]
    nb, md = hf["relative_attention_num_buckets"], hf["relative_attention_max_distance"]
    gated = hf["feed_forward_proj"] == "gated-gelu"

    def rms(x, name):
        return w[name] * x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)

    def linear(x, name):
        return x @ w[name].T

    def gelu_new(x):
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))

    def position_bias(name, q_len, k_len, bidirectional):
        rel = np.arange(k_len)[None, :] - np.arange(q_len)[:, None]
        return np.transpose(w[name][np_relative_bucket(rel, bidirectional, nb, md)], (2, 0, 1))

    def attention(x, kv, prefix, bias, allowed):
        q = linear(x, f"{prefix}.q.weight").reshape(len(x), h, dk)
        k = linear(kv, f"{prefix}.k.weight").reshape(len(kv), h, dk)
        v = linear(kv, f"{prefix}.v.weight").reshape(len(kv), h, dk)
        scores = np.einsum("qhd,khd->hqk", q, k) + bias
        scores = np.where(allowed[None], scores, -np.inf)
        p = np.exp(scores - scores.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        return linear(np.einsum("hqk,khd->qhd", p, v).reshape(len(x), h * dk), f"{prefix}.o.weight")

    def ff(x, prefix):
        if gated:
            hid = gelu_new(linear(x, f"{prefix}.wi_0.weight")) * linear(x, f"{prefix}.wi_1.weight")
        else:
            hid = np.maximum(linear(x, f"{prefix}.wi.weight"), 0.0)
        return linear(hid, f"{prefix}.wo.weight")

    enc_valid = enc_ids > 0
    s, t = len(enc_ids), len(dec_ids)
    x = w["shared.weight"][enc_ids]
    bias = position_bias("encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight", s, s, True)
    for i in range(hf["num_layers"]):
        b = f"encoder.block.{i}.layer"
        x = x + attention(rms(x, f"{b}.0.layer_norm.weight"), rms(x, f"{b}.0.layer_norm.weight"),
                          f"{b}.0.SelfAttention", bias, np.broadcast_to(enc_valid[None, :], (s, s)))
        x = x + ff(rms(x, f"{b}.1.layer_norm.weight"), f"{b}.1.DenseReluDense")
    enc = rms(x, "encoder.final_layer_norm.weight")

    y = w["shared.weight"][dec_ids]
    bias = position_bias("decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight", t, t, False)
    causal = np.tril(np.ones((t, t), bool))
    for i in range(hf["num_decoder_layers"]):
        b = f"decoder.block.{i}.layer"
        n = rms(y, f"{b}.0.layer_norm.weight")
        y = y + attention(n, n, f"{b}.0.SelfAttention", bias, causal)
        y = y + attention(rms(y, f"{b}.1.layer_norm.weight"), enc, f"{b}.1.EncDecAttention", 0.0,
                          np.broadcast_to(enc_valid[None, :], (t, s)))
        y = y + ff(rms(y, f"{b}.2.layer_norm.weight"), f"{b}.2.DenseReluDense")
    y = rms(y, "decoder.final_layer_norm.weight")
    tie = hf.get("tie_word_embeddings", True)
    head = head or ("shared.weight" if tie else "lm_head.weight")
    scale = tie if scale is None else scale
    return (y * hf["d_model"] ** -0.5 if scale else y) @ w[head].T


# The output layer of each layout transformers writes for T5 (checked against transformers 4.57.6 and 5.25.0, whose
# own logits templm's equal: tests/models/test_hf_transformers.py, `make test-network`): config keys, whether the
# weights hold an lm_head.weight of their own, and the (head, scale) transformers computes with.
HF_LAYOUTS = {
    "t4-v1.1": ({"tie_word_embeddings": False}, True, ("lm_head.weight", False)),
    "t4-v1.0": ({}, False, ("shared.weight", True)),
    # transformers 5 writes tie_word_embeddings true for every T5 and scale_decoder_outputs beside it ...
    "t5-v1.0": ({"tie_word_embeddings": True, "scale_decoder_outputs": True}, False, ("shared.weight", True)),
    # ... a v1.1 model made there has no head of its own; one converted from transformers 4 keeps lm_head.weight.
    "t5-v1.1": ({"tie_word_embeddings": True, "scale_decoder_outputs": False}, False, ("shared.weight", False)),
    "t5-v1.1-from-t4": ({"tie_word_embeddings": True, "scale_decoder_outputs": False}, True,
                        ("lm_head.weight", False)),
}


@pytest.mark.parametrize("layout", sorted(HF_LAYOUTS))
def test_every_hf_output_layer_layout_gives_the_logits_transformers_computes(tmp_path, layout):
    keys, own_head, (head, scale) = HF_LAYOUTS[layout]
    hf = {k: v for k, v in hf_config(True, False).items() if k != "tie_word_embeddings"}
    hf.update(keys, d_model=12, d_kv=6)  # d_model ** -0.5 is no power of two: a scale folded in is checked closely
    weights = hf_weights(dict(hf, tie_word_embeddings=not own_head), seed=11)
    (tmp_path / "config.json").write_text(json.dumps(hf))
    save_file(weights, str(tmp_path / "model.safetensors"))
    config, params = t5.load_hf_checkpoint(str(tmp_path))
    assert config.logits_via_embedding == (head == "shared.weight" and scale)
    enc = np.array([[3, 9, 14, 22, 1, 0, 0], [5, 5, 8, 31, 17, 11, 1]], np.int32)
    dec = np.array([[0, 6, 12, 3, 7], [0, 2, 17, 9, 39]], np.int32)
    logits = np.asarray(t5.EncoderDecoderModel(config).logits(params, {"encoder_input_tokens": enc,
                                                                       "decoder_input_tokens": dec}))
    want = np.stack([np_t5_logits(weights, hf, enc[i], dec[i], head, scale) for i in range(2)])
    assert np.abs(want).max() > 1.0
    np.testing.assert_allclose(logits, want, atol=2e-5, rtol=1e-5)
    # Saved back, it reads the same (under both readers: the config says tie and scale explicitly).
    t5.save_hf_checkpoint(params, config, str(tmp_path / "saved"))
    config2, params2 = t5.load_hf_checkpoint(str(tmp_path / "saved"))
    assert config2 == config
    jax.tree_util.tree_map(np.testing.assert_array_equal, params2, params)


def test_a_config_that_contradicts_its_tensors_names_both(tmp_path):
    hf = hf_config(True, False)
    weights = hf_weights(hf, seed=12)
    head = weights.pop("lm_head.weight")
    (tmp_path / "config.json").write_text(json.dumps(hf))
    save_file(weights, str(tmp_path / "model.safetensors"))
    with pytest.raises(DataError, match=r"config.json has tie_word_embeddings false .* holds no lm_head.weight"):
        t5.load_hf_checkpoint(str(tmp_path))
    # transformers 4's config ties, yet the file has a head of its own: the two versions disagree, so neither is
    # guessed.
    (tmp_path / "config.json").write_text(json.dumps(dict(hf, tie_word_embeddings=True)))
    save_file({**weights, "lm_head.weight": head}, str(tmp_path / "model.safetensors"))
    with pytest.raises(DataError, match=r"ties the output layer .* lm_head.weight that differs from shared.weight") \
            as info:
        t5.load_hf_checkpoint(str(tmp_path))
    assert str(tmp_path / "config.json") in str(info.value) and str(tmp_path / "model.safetensors") in str(info.value)
    # The same head as the embedding (transformers 4 sometimes wrote both): tied, as either version reads it.
    save_file({**weights, "lm_head.weight": weights["shared.weight"]}, str(tmp_path / "model.safetensors"))
    assert t5.load_hf_checkpoint(str(tmp_path))[0].logits_via_embedding


@pytest.mark.parametrize("gated,tied", [(True, False), (False, True)], ids=["gated-gelu-untied", "relu-tied"])
def test_hf_import_matches_numpy_forward(tmp_path, gated, tied):
    hf = hf_config(gated, tied)
    weights = hf_weights(hf, seed=1 + int(tied))
    (tmp_path / "config.json").write_text(json.dumps(hf))
    save_file(weights, str(tmp_path / "model.safetensors"))

    config, params = t5.load_hf_checkpoint(str(tmp_path))
    assert config.mlp_activations == (("gelu", "linear") if gated else ("relu",))
    assert config.logits_via_embedding == tied
    assert (config.emb_dim, config.num_heads, config.head_dim, config.mlp_dim) == (16, 2, 8, 24)
    model = t5.EncoderDecoderModel(config)
    assert jax.tree_util.tree_structure(params) == jax.tree_util.tree_structure(model.abstract_init())

    # Sequences longer than max_exact so the log-spaced buckets are exercised; the second encoder row is padded.
    rng = np.random.default_rng(7)
    enc = rng.integers(2, 40, size=(2, 14)).astype(np.int32)
    enc[1, 9:] = 0
    dec = np.concatenate([np.zeros((2, 1), np.int32), rng.integers(1, 40, size=(2, 10))], axis=1).astype(np.int32)
    logits = np.asarray(jax.jit(model.logits)(params, {"encoder_input_tokens": enc, "decoder_input_tokens": dec}))
    want = np.stack([np_t5_logits(weights, hf, enc[i], dec[i]) for i in range(2)])
    assert np.abs(want).max() > 1.0  # not trivially small
    np.testing.assert_allclose(logits, want, atol=2e-5, rtol=1e-5)

    # Round trip through save_hf_checkpoint: the same tensors under the same names.
    out = tmp_path / "saved"
    t5.save_hf_checkpoint(params, config, str(out))
    config2, params2 = t5.load_hf_checkpoint(str(out / "model.safetensors"))
    assert config2 == config
    jax.tree_util.tree_map(np.testing.assert_array_equal, params2, params)
    saved = json.loads((out / "config.json").read_text())
    assert saved["feed_forward_proj"] == hf["feed_forward_proj"] and saved["tie_word_embeddings"] == tied


def test_hf_import_errors(tmp_path, monkeypatch):
    hf = hf_config(True, False)
    with pytest.raises(DataError, match="no such checkpoint"):
        t5.load_hf_checkpoint(str(tmp_path / "absent"))
    with pytest.raises(DataError, match="config.json"):
        t5.load_hf_checkpoint(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps(hf))
    with pytest.raises(DataError, match="model.safetensors"):
        t5.load_hf_checkpoint(str(tmp_path))
    weights = hf_weights(hf, seed=3)
    save_file(weights, str(tmp_path / "model.safetensors"))
    data = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(data[: len(data) // 2])  # truncated
    with pytest.raises(DataError, match="model.safetensors"):
        t5.load_hf_checkpoint(str(tmp_path))
    del weights["decoder.block.1.layer.2.DenseReluDense.wo.weight"]
    save_file(weights, str(tmp_path / "model.safetensors"))
    with pytest.raises(DataError, match="decoder.block.1.layer.2.DenseReluDense.wo.weight"):
        t5.load_hf_checkpoint(str(tmp_path))
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(DataError, match="config.json"):
        t5.load_hf_checkpoint(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps(dict(hf, feed_forward_proj="gated-tanh")))
    with pytest.raises(DataError, match="feed_forward_proj"):
        t5.load_hf_checkpoint(str(tmp_path))
    # A config.json claiming ten million layers: refused against the weights' blocks before any model is built (it
    # grew memory for minutes).
    (tmp_path / "config.json").write_text(json.dumps(dict(hf, num_layers=10_000_000)))
    with pytest.raises(DataError, match=r"model.safetensors: config.json \(.*config.json\) says 10,000,000 encoder "
                                        r"layers, the weights hold 2 \(blocks 0-1\)"):
        t5.load_hf_checkpoint(str(tmp_path))
    # A config.json of gigabytes is refused after the limit's bytes, not read whole (the limit lowered here).
    from templm import errors

    monkeypatch.setattr(errors, "MAX_JSON_CHARS", 4096)
    (tmp_path / "config.json").write_text(json.dumps(hf) + " " * 5000)
    with pytest.raises(DataError) as refused:
        t5.load_hf_checkpoint(str(tmp_path))
    assert str(refused.value).startswith(f"{tmp_path / 'config.json'}: longer than 0 MiB: not a JSON file of the kind "
                                         "templm reads whole")


def test_relative_position_bucket_matches_hf():
    rel = np.arange(-200, 201, dtype=np.int32)[None, :]
    for bidirectional in (True, False):
        for nb, md in ((32, 128), (8, 20)):
            got = np.asarray(t5.relative_position_bucket(jnp.asarray(rel), bidirectional, nb, md))
            np.testing.assert_array_equal(got, np_relative_bucket(rel, bidirectional, nb, md))


# ----------------------------------------------------------------------------------------------------------------------
# Decoding cache, packing, scoring
# ----------------------------------------------------------------------------------------------------------------------


def test_cached_decoding_matches_teacher_forcing(model, params, forward):
    full = np.asarray(forward(params, BATCH)["logits"])

    @jax.jit
    def step_by_step(params, batch):
        # One token per call to decode_step, threading the cache through a scan over the target positions.
        encoded = model.encode(params, batch)
        cache = model.init_cache(params, batch["decoder_input_tokens"].shape[0], DEC_LEN)

        def step(cache, tokens):
            logits, cache = model.decode_step(params, cache, encoded, batch["encoder_input_tokens"], tokens[:, None])
            return cache, logits

        cache, logits = jax.lax.scan(step, cache, batch["decoder_input_tokens"].T)
        return jnp.swapaxes(logits, 0, 1), cache

    stepped, cache = step_by_step(params, BATCH)
    for t in range(DEC_LEN):
        np.testing.assert_allclose(np.asarray(stepped[:, t]), full[:, t], atol=1e-5, rtol=1e-5, err_msg=f"step {t}")
    assert int(cache["decoder"]["cache_index"]) == DEC_LEN
    assert cache["decoder"]["layers_1"]["self_attention"]["cached_key"].shape == (4, DEC_LEN, 2, 16)


def test_packing_matches_separate_sequences(model, params, forward):
    # Two examples packed into row 0 (row 1 holds a third), as seqio.EncDecFeatureConverter(pack=True) lays out.
    a_in, a_out = [5, 9, 13, 7, 1], [17, 18, 19, 1]
    b_in, b_out = [40, 41, 3, 1], [33, 12, 1]
    c_in, c_out = [8, 8, 2, 1], [21, 1]

    def packed_row(pairs):
        row = {k: np.zeros(n, np.int32) for k, n in (("enc", ENC_LEN), ("eseg", ENC_LEN), ("epos", ENC_LEN),
                                                     ("tgt", DEC_LEN), ("dseg", DEC_LEN), ("dpos", DEC_LEN),
                                                     ("din", DEC_LEN))}
        e = d = 0
        for seg, (x, y) in enumerate(pairs, start=1):
            row["enc"][e:e + len(x)], row["eseg"][e:e + len(x)], row["epos"][e:e + len(x)] = x, seg, range(len(x))
            row["tgt"][d:d + len(y)], row["dseg"][d:d + len(y)], row["dpos"][d:d + len(y)] = y, seg, range(len(y))
            row["din"][d:d + len(y)] = [0] + y[:-1]
            e, d = e + len(x), d + len(y)
        return row

    rows = [packed_row([(a_in, a_out), (b_in, b_out)]), packed_row([(c_in, c_out)]), packed_row([]),
            packed_row([(b_in, b_out), (c_in, c_out), (a_in[1:], a_out[1:])])]
    packed = {"encoder_input_tokens": np.stack([r["enc"] for r in rows]),
              "encoder_segment_ids": np.stack([r["eseg"] for r in rows]),
              "encoder_positions": np.stack([r["epos"] for r in rows]),
              "decoder_target_tokens": np.stack([r["tgt"] for r in rows]),
              "decoder_input_tokens": np.stack([r["din"] for r in rows]),
              "decoder_segment_ids": np.stack([r["dseg"] for r in rows]),
              "decoder_positions": np.stack([r["dpos"] for r in rows])}
    separate = make_batch([a_in[:-1], b_in[:-1], [], []], [a_out[:-1], b_out[:-1], [], []])

    packed_fn = jax.jit(model.logits)
    packed_logits = np.asarray(packed_fn(params, packed))
    separate_logits = np.asarray(forward(params, separate)["logits"])
    na, nb = len(a_out), len(b_out)
    np.testing.assert_allclose(packed_logits[0, :na], separate_logits[0, :na], atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(packed_logits[0, na:na + nb], separate_logits[1, :nb], atol=1e-5, rtol=1e-5)

    def token_losses(logits, batch):
        xent, z = t5.token_cross_entropy(jnp.asarray(logits), jnp.asarray(batch["decoder_target_tokens"]), 1e-4)
        return np.asarray(xent + z)

    packed_losses, separate_losses = token_losses(packed_logits, packed), token_losses(separate_logits, separate)
    np.testing.assert_allclose(packed_losses[0, :na], separate_losses[0, :na], atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(packed_losses[0, na:na + nb], separate_losses[1, :nb], atol=1e-5, rtol=1e-5)
    # With one segment per row the second example would see the first: the masks matter.
    leaky = dict(packed, encoder_segment_ids=(packed["encoder_input_tokens"] > 0).astype(np.int32),
                 decoder_segment_ids=np.ones_like(packed["decoder_segment_ids"]))
    leaky_logits = np.asarray(packed_fn(params, leaky))
    assert np.abs(leaky_logits[0, na:na + nb] - separate_logits[1, :nb]).max() > 1e-3


def test_score_batch_and_loss(params, forward):
    out = forward(params, BATCH)
    logits = np.asarray(out["logits"], np.float64)
    log_probs = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
        - logits.max(-1, keepdims=True)
    targets = BATCH["decoder_target_tokens"]
    token_lp = np.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
    weights = targets > 0
    scores = np.asarray(out["scores"])
    np.testing.assert_allclose(scores, (token_lp * weights).sum(-1), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(out["scores_unweighted"]), scores, rtol=1e-5)

    loss, aux = out["loss"], out["aux"]
    log_z = np.log(np.exp(logits).sum(-1))
    z = 1e-4 * log_z ** 2
    n = weights.sum()
    assert float(aux["weight_sum"]) == n
    assert float(aux["cross_ent_loss"]) == pytest.approx(float((-token_lp * weights).sum() / n), rel=1e-5)
    assert float(aux["z_loss"]) == pytest.approx(float((z * weights).sum() / n), rel=1e-4)
    assert float(loss) == pytest.approx(float(aux["cross_ent_loss"] + aux["z_loss"]), rel=1e-6)
    correct = ((logits.argmax(-1) == targets) * weights).sum()
    assert float(aux["accuracy"]) == pytest.approx(correct / n)


def test_label_smoothing_and_normalisation():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 3, 7)).astype(np.float32)
    targets = rng.integers(0, 7, size=(2, 3))
    s = 0.1
    soft = np.full((2, 3, 7), s / 6)
    np.put_along_axis(soft, targets[..., None], 1 - s, axis=-1)
    log_sm = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    entropy = -(soft * np.log(soft)).sum(-1)
    xent, z = t5.token_cross_entropy(jnp.asarray(logits), jnp.asarray(targets), 0.0, label_smoothing=s)
    np.testing.assert_allclose(np.asarray(xent), -(soft * log_sm).sum(-1) - entropy, rtol=1e-5, atol=1e-6)
    assert float(jnp.max(z)) == 0.0
    with pytest.raises(ValueError, match="loss_normalizing_factor"):
        t5.EncoderDecoderModel(CFG, loss_normalizing_factor="NUM_SOMETHING")


def test_loss_normalizing_factors(params, forward):
    out = forward(params, BATCH)
    loss_sum, loss_mean = float(out["loss_summed"]), float(out["loss_no_z"])
    weight_sum = float(out["aux"]["weight_sum"])
    assert loss_sum == pytest.approx(loss_mean * weight_sum, rel=1e-5)
    assert float(out["loss_per_position"]) == pytest.approx(loss_sum / BATCH["decoder_target_tokens"].size, rel=1e-5)
    assert float(out["aux"]["cross_ent_loss"]) == pytest.approx(loss_mean, rel=1e-5)


# ----------------------------------------------------------------------------------------------------------------------
# Training, greedy and beam search
# ----------------------------------------------------------------------------------------------------------------------

PAIRS_IN = [[4, 5, 6, 7], [10, 11], [20, 21, 22, 23, 24, 25], [30, 5, 30]]
PAIRS_OUT = [[50, 51, 52], [40, 41, 42, 43, 44], [9], [60, 61, 62, 63]]


@pytest.fixture(scope="module")
def trained(model, params):
    batch = make_batch(PAIRS_IN, PAIRS_OUT)
    tx = optax.adam(3e-3)

    @jax.jit
    def train_step(p, opt_state, batch):
        (loss, aux), grads = jax.value_and_grad(model.loss_fn, has_aux=True)(p, batch)
        updates, opt_state = tx.update(grads, opt_state, p)
        return optax.apply_updates(p, updates), opt_state, loss, aux["accuracy"]

    p, opt_state = params, tx.init(params)
    losses = []
    for _ in range(150):
        p, opt_state, loss, acc = train_step(p, opt_state, batch)
        losses.append(float(loss))
    return p, batch, losses, float(acc)


def test_training_memorises_and_decoders_recover_targets(model, trained, forward):
    p, batch, losses, accuracy = trained
    assert losses[-1] < 0.1 * losses[0] and losses[-1] < 0.2, losses[::25]
    assert accuracy == 1.0
    predict = jax.jit(model.predict_batch_with_aux, static_argnames=("method", "num_beams", "max_decode_length"))
    greedy, greedy_aux = predict(p, batch, method="greedy", max_decode_length=DEC_LEN)
    np.testing.assert_array_equal(np.asarray(greedy), batch["decoder_target_tokens"])
    beam, beam_aux = predict(p, batch, method="beam", num_beams=3, max_decode_length=DEC_LEN)
    np.testing.assert_array_equal(np.asarray(beam), batch["decoder_target_tokens"])
    # Greedy's score is the sum of log-probs; beam's is that sum divided by ((5 + len) / 6) ** 0.6.
    lengths = (batch["decoder_target_tokens"] > 0).sum(-1)
    np.testing.assert_allclose(np.asarray(beam_aux["scores"]),
                               np.asarray(greedy_aux["scores"]) / ((5.0 + lengths) / 6.0) ** 0.6, rtol=1e-4,
                               atol=1e-6)
    scores = np.asarray(forward(p, batch)["scores"])
    np.testing.assert_allclose(np.asarray(greedy_aux["scores"]), scores, rtol=1e-4, atol=1e-5)


def test_beam_search_is_exact_when_the_beams_cover_every_prefix():
    """Vocabulary 6, at most 3 tokens: 32 beams keep every live prefix (5 + 25), so beam search must return the
    best-scoring finished sequence of an exhaustive search (log p / ((5 + len) / 6) ** 0.6); 8 beams need not."""
    cfg = t5.T5Config(vocab_size=6, emb_dim=16, num_heads=2, head_dim=8, mlp_dim=32, num_encoder_layers=1,
                      num_decoder_layers=1)
    model = t5.EncoderDecoderModel(cfg)
    params = jax.jit(model.init)(jax.random.PRNGKey(7))
    params["decoder"]["logits_dense"]["kernel"] = params["decoder"]["logits_dense"]["kernel"] * 2.0  # sharper
    enc = np.array([[3, 4, 5, 1], [2, 5, 1, 0], [4, 4, 4, 1]], np.int32)
    max_len = 3
    beam, aux = jax.jit(functools.partial(model.predict_batch_with_aux, method="beam", num_beams=32,
                                          max_decode_length=max_len))(params, {"encoder_input_tokens": enc})

    candidates = [list(prefix) + [t5.EOS_ID] for n in range(max_len)
                  for prefix in itertools.product([0, 2, 3, 4, 5], repeat=n)]
    dec_in = np.zeros((len(candidates), max_len), np.int32)
    for i, seq in enumerate(candidates):
        dec_in[i, 1:len(seq)] = seq[:-1]
    n = len(candidates)
    logits = np.asarray(jax.jit(model.logits)(params, {"encoder_input_tokens": np.repeat(enc, n, axis=0),
                                                       "decoder_input_tokens": np.tile(dec_in, (3, 1))}), np.float64)
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    best_lengths = []
    for row in range(3):
        lp = log_probs[row * n:(row + 1) * n]
        scores = [sum(lp[i, j, tok] for j, tok in enumerate(seq)) / ((5.0 + len(seq)) / 6.0) ** 0.6
                  for i, seq in enumerate(candidates)]
        best = candidates[int(np.argmax(scores))]
        best_lengths.append(len(best))
        assert list(np.asarray(beam[row])) == best + [0] * (max_len - len(best)), row
        assert float(aux["scores"][row]) == pytest.approx(max(scores), abs=1e-4)
    assert max(best_lengths) > 1  # the optimum is not just the first-step EOS


# ----------------------------------------------------------------------------------------------------------------------
# bfloat16 compute
# ----------------------------------------------------------------------------------------------------------------------


def test_bfloat16_compute_keeps_float32_params(params, forward):
    bf16 = t5.EncoderDecoderModel(CFG.replace(dtype=jnp.bfloat16))
    assert {x.dtype for x in jax.tree_util.tree_leaves(bf16.abstract_init())} == {jnp.dtype(jnp.float32)}
    raw = jax.eval_shape(lambda p: bf16.module.apply({"params": p}, BATCH["encoder_input_tokens"],
                                                     BATCH["decoder_input_tokens"]), params)
    assert raw.dtype == jnp.bfloat16
    # Gradients with respect to the float32 parameters stay float32 (shapes only: no compilation).
    grads = jax.eval_shape(jax.grad(lambda p: bf16.loss_fn(p, BATCH)[0]), params)
    assert {x.dtype for x in jax.tree_util.tree_leaves(grads)} == {jnp.dtype(jnp.float32)}
    loss_bf16, aux = jax.jit(bf16.loss_fn)(params, BATCH)
    loss_f32 = forward(params, BATCH)["loss"]
    assert np.isfinite(float(loss_bf16))
    assert float(loss_bf16) == pytest.approx(float(loss_f32), rel=0.05)
    assert float(loss_bf16) != float(loss_f32)  # it did compute in bfloat16
