"""Tests of templm.training.kglm_trainer: the knowledge-graph LM and its proposal learn the gold annotations through
the one loop (the loss falls), a run stopped and resumed ends with the parameters of one that never stopped, and a
run folder of other data is refused by name."""

import json

import jax
import numpy as np
import pytest

from templm.data import linked_mentions as lm
from templm.errors import DataError
from templm.models.kglm import KGLMConfig
from templm.training.configs import CheckpointConfig, OptimizerConfig, SaveCheckpointConfig
from templm.training.kglm_trainer import LinkedDataset, batch_documents, train_latent_lm
from templm.training.loop import RunOptions
from templm_testing import MINI_DOCS, write_mini_world

STEPS = 12


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    # eight copies of the three documents, so that a batch of 8 fills the 8 devices' data axis
    docs = [(f"{doc_id}-{i}", *rest) for i in range(8) for doc_id, *rest in MINI_DOCS]
    folder = write_mini_world(tmp_path_factory.mktemp("kglm_train") / "world", docs=docs)
    graph = lm.read_graph(folder)
    news, mentions = lm.read_linked_documents(folder)
    vocab = lm.build_vocabulary(news)
    linked = lm.link_documents(news, mentions, graph, vocab)
    config = KGLMConfig(len(vocab), graph.num_entities, graph.num_labels, embed=16, hidden=16, proposal_hidden=16)
    return {"docs": linked, "graph": graph, "shapes": lm.Shapes.covering(linked), "config": config}


def train(data, folder, which, steps, docs=None):
    # a constant learning rate: the default cosine schedule spans train_steps, so a run stopped early by asking for
    # fewer steps would follow another schedule
    dataset = LinkedDataset(docs or data["docs"], data["graph"], data["shapes"], batch_size=8)
    return train_latent_lm(str(folder), which, data["config"], dataset, steps,
                           OptimizerConfig(learning_rate=1e-2, schedule="constant", max_grad_norm=1.0),
                           CheckpointConfig(SaveCheckpointConfig(period=6, keep=1)), random_seed=3, stats_period=1,
                           options=RunOptions(progress=False))


def losses(folder):
    return [json.loads(line)["loss"] for line in (folder / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("which", ["model", "proposal"])
def test_the_loss_falls_and_a_resumed_run_ends_where_an_unbroken_one_does(data, tmp_path, which):
    whole = train(data, tmp_path / "whole", which, STEPS)
    logged = losses(tmp_path / "whole")
    assert len(logged) == STEPS and logged[-1] < 0.7 * logged[0]
    train(data, tmp_path / "broken", which, STEPS // 2)
    resumed = train(data, tmp_path / "broken", which, STEPS)
    assert resumed.start_step == STEPS // 2 and resumed.step == STEPS
    for a, b in zip(jax.tree.leaves(whole.params), jax.tree.leaves(resumed.params)):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(DataError, match=r"other settings: data_fingerprint .* there, .* in this run "
                                        r"\(the documents it trains on\)") as err:
        train(data, tmp_path / "broken", which, STEPS + 1, docs=data["docs"][:16])
    assert "checkpoints" in str(err.value)


def test_each_epoch_visits_every_document_once_in_a_new_order():
    epoch0 = np.concatenate([batch_documents(10, 3, 0, p) for p in range(3)])
    epoch1 = np.concatenate([batch_documents(10, 3, 0, p) for p in range(3, 6)])
    assert len(set(epoch0)) == 9 and len(set(epoch1)) == 9 and list(epoch0) != list(epoch1)
    assert list(batch_documents(10, 3, 0, 4)) == list(batch_documents(10, 3, 0, 4))
