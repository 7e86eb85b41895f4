"""Evaluation and inference of an encoder-decoder model on SeqIO tasks: jitted predict and score functions at a
fixed batch size (one compile each), plugged into `seqio.Evaluator` so every task reports its own metrics.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import jax
import numpy as np
import seqio
import tensorflow as tf

from templm import console, tasks
from templm.errors import Preempted, sigterm_received

MODEL_FEATURES = ("encoder_input_tokens", "decoder_input_tokens", "decoder_target_tokens", "decoder_loss_weights")


def _batches(dataset, batch_size: int) -> Iterable[Tuple[List[int], Dict[str, np.ndarray], int]]:
    """(indices, padded batch, number of real rows) from seqio's enumerated (index, features) dataset. SIGTERM noted
    by a training loop (errors.watch_sigterm) stops it at the next batch with Preempted: an evaluation inside a
    training run stops within a batch, not at its end."""
    rows: List[Tuple[int, Mapping[str, np.ndarray]]] = []
    try:
        for index, features in dataset.as_numpy_iterator():
            if sigterm_received():
                raise Preempted("during the evaluation")
            rows.append((int(index), features))
            if len(rows) == batch_size:
                yield _stack(rows, batch_size)
                rows = []
    except tf.errors.DataLossError as e:  # a damaged record file: named, not a TensorFlow traceback
        raise tasks.corrupt_records(e) from None
    if rows:
        yield _stack(rows, batch_size)


def _stack(rows, batch_size):
    indices = [i for i, _ in rows]
    keys = [k for k in MODEL_FEATURES if k in rows[0][1]]
    batch = {}
    for key in keys:
        column = np.stack([features[key] for _, features in rows])
        if len(rows) < batch_size:  # pad with copies of the first row; their outputs are dropped
            column = np.concatenate([column, np.repeat(column[:1], batch_size - len(rows), axis=0)])
        batch[key] = column
    return indices, batch, len(rows)


class ModelFns:
    """Jitted `predict` (greedy or beam) and `score` functions of one model and parameter set."""

    def __init__(self, model, params, batch_size: int = 32, method: str = "greedy", num_beams: int = 4,
                 max_decode_length: Optional[int] = None):
        self.model = model
        self.params = params
        self.batch_size = batch_size
        self._predict = jax.jit(functools.partial(model.predict_batch, method=method, num_beams=num_beams,
                                                  max_decode_length=max_decode_length))
        self._score = jax.jit(model.score_batch)

    def predict_tokens(self, batch: Mapping[str, np.ndarray]) -> np.ndarray:
        """The predicted token ids of one full batch of model features ([batch_size, ...])."""
        return np.asarray(self._predict(self.params, batch))

    def predict_fn(self, dataset) -> List[Tuple[int, Sequence[int]]]:
        out = []
        ticker = console.Ticker("eval: predicting", _cardinality(dataset), "examples")
        for indices, batch, n in _batches(dataset, self.batch_size):
            tokens = np.asarray(self._predict(self.params, batch))[:n]
            out.extend(zip(indices, [t.tolist() for t in tokens]))
            ticker.update(len(out))
        ticker.close()
        return out

    def score_fn(self, dataset) -> List[Tuple[int, float]]:
        out = []
        ticker = console.Ticker("eval: scoring", _cardinality(dataset), "examples")
        for indices, batch, n in _batches(dataset, self.batch_size):
            scores = np.asarray(self._score(self.params, batch))[:n]
            out.extend(zip(indices, scores.tolist()))
            ticker.update(len(out))
        ticker.close()
        return out


def _cardinality(dataset) -> Optional[int]:
    """The number of examples of a tf.data dataset where it knows it (else None: no ETA)."""
    try:
        n = int(dataset.cardinality())
    except (AttributeError, TypeError, ValueError):
        return None
    return n if n >= 0 else None


def evaluate(fns: ModelFns, mixture_or_task_name: str, feature_lengths: Mapping[str, int], split: str = "validation",
             num_examples: Optional[int] = None, step: Optional[int] = None) -> Dict[str, Dict[str, float]]:
    """Every task's metrics (EM/F1, perplexity, by year and slice) on `split`: {task name: {metric: value}}."""
    evaluator = seqio.Evaluator(mixture_or_task_name, seqio.EncDecFeatureConverter(pack=False), eval_split=split,
                                sequence_length=dict(feature_lengths), num_examples=num_examples,
                                async_compute_metrics=False)
    metrics, _ = evaluator.evaluate(compute_metrics=True, step=step, predict_fn=fns.predict_fn,
                                    score_fn=fns.score_fn)
    result = metrics.result()
    return {task: {name: float(_scalar(value)) for name, value in task_metrics.items()}
            for task, task_metrics in result.items()}


def _scalar(value: Any) -> float:
    return getattr(value, "value", value)


def infer_texts(fns: ModelFns, vocabulary, inputs: Sequence[str], input_length: int,
                postprocess: Optional[Callable[[str], str]] = None) -> List[str]:
    """Predictions for raw input strings (tokenised with `vocabulary`, EOS appended, truncated to input_length).

    `fns` must have been built with a `max_decode_length`, since no decoder inputs give the length here."""
    outputs: List[str] = []
    for start in range(0, len(inputs), fns.batch_size):
        chunk = inputs[start:start + fns.batch_size]
        encoded = np.zeros((fns.batch_size, input_length), np.int32)
        for i, text in enumerate(chunk):
            ids = list(vocabulary.encode(text))[:input_length - 1] + [1]
            encoded[i, :len(ids)] = ids
        tokens = fns.predict_tokens({"encoder_input_tokens": encoded})[:len(chunk)]
        for row in tokens:
            text = vocabulary.decode(row.tolist())
            outputs.append(postprocess(text) if postprocess else text)
    return outputs
