"""A model on a test stream: the stream cut into segments of a batch, scored statically or with dynamic evaluation.

Layout. `layout_stream` cuts the targets of a token stream (templm.data.token_stream) into `batch_size` contiguous
parts of equal length (a multiple of the segment length T, `token_stream.part_length`; the last part padded with
weight 0) that run as the B rows of a batch, in segments of T tokens: ``[N, B, T]`` inputs, targets and weights.
`evaluate_stream` scores them with static or dynamic evaluation (templm.evaluation.dynamic_eval, memory carried
across segments and documents) and returns log-probabilities back in stream order, the input of every analysis in
templm.metrics.stream. ``batch_size=1`` is the paper's setting (one stream, the memory always holds the true
history); with B > 1 each part starts with an empty memory.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import numpy as np

from templm.data.token_stream import TokenStream, part_length
from templm.evaluation import dynamic_eval


@dataclasses.dataclass
class StreamLayout:
    """inputs, targets, weights [N, B, T]; target b*part_len + n*T + t of the stream sits at [n, b, t]."""

    inputs: np.ndarray
    targets: np.ndarray
    weights: np.ndarray
    n_targets: int
    part_len: int
    seg_len: int

    @property
    def batch_size(self) -> int:
        return self.inputs.shape[1]


def layout_stream(tokens: np.ndarray, batch_size: int = 1, seg_len: int = 16) -> StreamLayout:
    """Cut a token stream (targets = tokens[1:]) into `batch_size` parallel parts of segments of `seg_len`."""
    tokens = np.asarray(tokens.tokens if isinstance(tokens, TokenStream) else tokens, np.int32).reshape(-1)
    n = len(tokens) - 1
    part = part_length(n, batch_size, seg_len)  # raises for batch_size or seg_len < 1
    if n < 1:
        raise ValueError("the stream needs at least two tokens")
    padded = np.zeros(batch_size * part + 1, np.int32)
    padded[:n + 1] = tokens
    starts = np.arange(batch_size)[:, None] * part + np.arange(part)[None, :]  # [B, P]
    n_seg = part // seg_len

    def cut(a):
        return np.ascontiguousarray(a.reshape(batch_size, n_seg, seg_len).transpose(1, 0, 2))

    return StreamLayout(inputs=cut(padded[starts]), targets=cut(padded[starts + 1]),
                        weights=cut((starts < n).astype(np.float32)), n_targets=n, part_len=part, seg_len=seg_len)


def unlayout(layout: StreamLayout, values: Any) -> np.ndarray:
    """Per-target values [N, B, T] back in stream order [n_targets]."""
    values = np.asarray(values)
    return values.transpose(1, 0, 2).reshape(-1)[:layout.n_targets]


def evaluate_stream(model: Any, params: Any, tokens: Any, *, batch_size: int = 1, seg_len: Optional[int] = None,
                    mem_len: Optional[int] = None, rule: Optional[str] = None, lr: float = 0.0,
                    which: Any = "all", decay: float = 0.0, eps: Optional[float] = None, ms: Any = None,
                    normalise_decay: bool = True) -> np.ndarray:
    """Log-probabilities [n_targets] float32 of a stream (a TokenStream or tokens [L+1]) in stream order.

    rule=None: static evaluation; "sgd" / "rms": dynamic evaluation with lr, which, decay, eps, ms, normalise_decay
    (templm.evaluation.dynamic_eval). seg_len defaults to the model's tgt_len, mem_len to its evaluation memory.
    """
    seg_len = model.config.tgt_len if seg_len is None else int(seg_len)
    layout = layout_stream(tokens, batch_size, seg_len)
    segments = (layout.inputs, layout.targets, layout.weights)
    if rule is None:
        lp = dynamic_eval.static_eval_stream(model, params, segments, mem_len)
    else:
        lp = dynamic_eval.dynamic_eval_stream(
            model, params, segments, mem_len, rule, lr, which, decay=decay,
            eps=dynamic_eval.DEFAULT_EPS if eps is None else eps, ms=ms, normalise_decay=normalise_decay)
    return unlayout(layout, lp).astype(np.float32)


