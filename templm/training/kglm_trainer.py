"""Training the knowledge-graph LM and its proposal on annotated documents (templm.models.kglm), through the one
loop (loop.py: the run folder, progress, checkpoints, SIGTERM, resume).

Both are trained on the gold annotations, as KGLM and its proposal are on annotated text: the generative model by
the joint likelihood log p(x, z_gold) per token, the proposal by log q(z_gold | x) per decision. `which` names the
network: "model" or "proposal". Batches are `batch_size` documents of an epoch's permutation (drawn from `seed`), so
the data position is the step and a resumed run repeats the run that never stopped.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any, Dict, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from templm import paths
from templm.data.linked_mentions import RELATED, WORD, KnowledgeGraph, LinkedDocument, Shapes, document_batch
from templm.models.kglm import (KGLMConfig, KnowledgeGraphLM, MentionProposal, gold_options, init_generative,
                                init_proposal, log_joint_terms, proposal_scan)
from templm.training import loop, partitioning, state as train_state
from templm.training.configs import CheckpointConfig, OptimizerConfig, SaveCheckpointConfig

WHICH = ("model", "proposal")
_RESUME_KEYS = ("which", "seed", "batch_size", "data_fingerprint", "model_config")
# What sets each (named in the message of a resume refused).
_RESUME_BINDINGS = {"which": "the model or its proposal", "seed": "the run's seed", "batch_size": "batch_size",
                    "data_fingerprint": "the documents it trains on", "model_config": "the model's config"}


def documents_fingerprint(docs: Sequence[LinkedDocument]) -> str:
    """SHA-256 (first 16 hex digits) of the documents' ids, tokens and gold decisions."""
    h = hashlib.sha256()
    for d in docs:
        h.update(d.id.encode())
        h.update(np.asarray(d.tokens, np.int32).tobytes())
        h.update(np.asarray(d.gold, np.int32).tobytes())
    return h.hexdigest()[:16]


def batch_documents(num_docs: int, batch_size: int, seed: int, position: int) -> np.ndarray:
    """Indices of the documents of the batch at a data position: consecutive slices of a permutation drawn anew
    each epoch (the last partial slice of an epoch is left out)."""
    per_epoch = max(1, num_docs // batch_size)
    epoch, index = divmod(position, per_epoch)
    order = np.random.default_rng([seed, epoch]).permutation(num_docs)
    return order[index * batch_size:(index + 1) * batch_size]


def loss_fn(which: str, config: KGLMConfig):
    """loss(params, batch) -> (loss, aux) of a batch (arrays of `document_batch`) for the model or the proposal."""
    if which == "model":
        model = KnowledgeGraphLM(config)

        def loss(params, batch):
            options = batch["gold_options"]
            terms = jax.vmap(lambda doc, o: log_joint_terms(model, params, doc, o))(batch, options)
            tokens = jnp.maximum(batch["length"].sum(), 1)
            nll = -terms.sum() / tokens
            return nll, {"ppl": jnp.exp(nll)}
        return loss
    proposal = MentionProposal(config)

    def loss(params, batch):
        def one(doc, forced):
            scores = proposal.apply({"params": params}, doc, method=MentionProposal.option_scores)
            return proposal_scan(scores, doc, forced=forced).log_q
        log_q = jax.vmap(one)(batch, batch["gold_options"])
        decisions = (batch["gold_kind"] >= WORD) & (batch["gold_kind"] <= RELATED)
        nll = -log_q.sum() / jnp.maximum(decisions.sum(), 1)
        return nll, {"ppl": jnp.exp(nll)}  # per decision
    return loss


def init_params(which: str, config: KGLMConfig, shapes: Shapes, example: Dict[str, np.ndarray], seed: int) -> Any:
    rng = jax.random.key(seed)
    if which == "model":
        return init_generative(KnowledgeGraphLM(config), rng, shapes.candidates, shapes.pairs)
    one = {k: jnp.asarray(v[0]) for k, v in example.items()}
    return init_proposal(MentionProposal(config), rng, one)


@dataclasses.dataclass(frozen=True)
class LinkedDataset:
    """The training data of a knowledge-graph LM: linked documents, their graph, the padded shapes of a batch and
    the batch size (documents per step, drawn by `batch_documents`)."""

    docs: Sequence[LinkedDocument]
    graph: KnowledgeGraph
    shapes: Shapes
    batch_size: int = 16


def train_latent_lm(model_dir: str, which: str, config: KGLMConfig, dataset: LinkedDataset, total_steps: int,
                    optimizer_cfg: OptimizerConfig = OptimizerConfig(learning_rate=3e-3, max_grad_norm=1.0),
                    checkpoint_cfg: CheckpointConfig = CheckpointConfig(SaveCheckpointConfig(period=0, keep=1)),
                    random_seed: int = 0, stats_period: int = 50,
                    options: loop.RunOptions = loop.RunOptions()) -> loop.TrainResult:
    """Trains the model or the proposal (`which`) on `dataset` into `model_dir` (resuming a run there); returns a
    loop.TrainResult whose params are host arrays. The learning rate follows optimizer_cfg's schedule over
    total_steps: a run resumed with more steps than it was started with follows another schedule from there unless
    it is "constant". Checkpoints every checkpoint_cfg.save.period steps (0: only at the end)."""
    docs, graph, shapes, batch_size = dataset.docs, dataset.graph, dataset.shapes, dataset.batch_size
    seed = random_seed
    if which not in WHICH:
        raise ValueError(f"which must be one of {WHICH}, got {which!r}")
    if len(docs) < batch_size:
        raise ValueError(f"{len(docs)} training documents do not fill one batch of {batch_size}")
    mesh = options.mesh or partitioning.make_mesh()
    if batch_size % mesh.shape["data"]:
        raise ValueError(f"batch_size {batch_size} must divide by the mesh's data axis ({mesh.shape['data']})")
    model_dir = paths.absolute(model_dir)
    replicated = partitioning.replicated(mesh)
    data_sharding = partitioning.data_sharding(mesh)

    def batch_at(position: int) -> Dict[str, jax.Array]:
        picked = [docs[i] for i in batch_documents(len(docs), batch_size, seed, position)]
        batch = document_batch(picked, shapes, graph)
        batch["gold_options"] = gold_options(batch)
        return train_state.global_batch(batch, data_sharding)

    tx = optimizer_cfg.build(total_steps)
    loss = loss_fn(which, config)

    def step(state, batch, rng):
        (value, aux), grads = jax.value_and_grad(loss, has_aux=True)(state["params"], batch)
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        metrics = {"loss": value, **aux, "grad_norm": optax.tree.norm(grads), "param_norm": optax.tree.norm(params)}
        return {**state, "step": state["step"] + 1, "params": params, "opt_state": opt_state}, metrics

    meta = {"kind": "kglm", "which": which, "seed": seed, "batch_size": batch_size,
            "data_fingerprint": documents_fingerprint(docs), "model_config": dataclasses.asdict(config),
            "shapes": dataclasses.asdict(shapes)}
    save = checkpoint_cfg.save
    with loop.RunFolder(model_dir, save.period, save.keep, save.async_save) as folder:
        example = document_batch(docs[:1], shapes, graph)
        params = jax.device_put(init_params(which, config, shapes, example, seed), replicated)
        state, shardings = train_state.train_state(params, tx, mesh)
        state, start_step, last, _ = folder.resume(state, meta, _RESUME_KEYS, _RESUME_BINDINGS)
        batch_shardings = jax.tree.map(lambda _: data_sharding, batch_at(0))
        step_fn = train_state.compile_step(step, shardings, batch_shardings, mesh)
        context = loop.RunContext(folder.checkpointer, folder.log, meta, jax.random.key(seed + 1), start_step,
                                  total_steps, stats_period,
                                  hooks=loop.Hooks(progress=options.progress, name=f"kglm {which}"))
        state, logged = loop.run(step_fn, state, batch_at, context)
    return loop.finish(start_step, total_steps, {"params": jax.tree.map(np.asarray, state["params"])}, logged, last)
