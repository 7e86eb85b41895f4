"""A model on a test stream: the layout into parallel parts of segments and back, and evaluation of parallel parts
as independent streams."""

import jax
import jax.numpy as jnp
import numpy as np
import flax.linen as nn

from templm.evaluation.stream_eval import evaluate_stream, layout_stream, unlayout
from templm.models.transformer_xl import TXL_CONFIGS, TransformerXL


def test_layout_round_trip():
    tokens = np.arange(100, 120)  # 19 targets
    layout = layout_stream(tokens, batch_size=2, seg_len=4)
    assert layout.inputs.shape == (3, 2, 4) and layout.part_len == 12
    np.testing.assert_array_equal(unlayout(layout, layout.targets), tokens[1:])
    np.testing.assert_array_equal(unlayout(layout, layout.inputs), tokens[:-1])
    assert layout.weights.sum() == 19 and layout.weights[-1, 1, -1] == 0
    np.testing.assert_array_equal(layout.inputs[1, 1], [116, 117, 118, 119])  # part 1 starts at target 12


def test_evaluate_stream_batches_are_independent_streams():
    """With batch_size=2 the first part is evaluated exactly as the first half alone with batch_size=1."""
    model = TransformerXL(TXL_CONFIGS["tiny"])
    params = nn.unbox(jax.jit(model.init)(jax.random.PRNGKey(0), jnp.zeros((1, 16), jnp.int32)))["params"]
    tokens = np.random.default_rng(0).integers(0, 256, 129)
    both = evaluate_stream(model, params, tokens, batch_size=2, seg_len=16, mem_len=16)
    first = evaluate_stream(model, params, tokens[:65], batch_size=1, seg_len=16, mem_len=16)
    assert both.shape == (128,) and first.shape == (64,)
    np.testing.assert_allclose(both[:64], first, atol=1e-5)
    assert np.all(np.isfinite(both)) and np.all(both < 0)
