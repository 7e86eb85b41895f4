"""Tests of templm.data.linked_mentions: a world folder (world.json, news.jsonl, mentions.jsonl written here in the
generator's layout) as the knowledge-graph LM's arrays: tokens, candidate names, the graph's pairs on the document's
date in both directions, the gold decisions, padded batches, and bad input named."""

import json

import numpy as np
import pytest

from templm.data import linked_mentions as lm
from templm.errors import DataError
from templm_testing import FACTS, write_mini_world as write_world

def linked(folder):
    graph = lm.read_graph(folder)
    news, mentions = lm.read_linked_documents(folder)
    vocab = lm.build_vocabulary(news)
    return graph, vocab, lm.link_documents(news, mentions, graph, vocab)


def test_documents_become_tokens_candidates_pairs_and_gold_decisions(tmp_path):
    graph, vocab, (d1, d2, d3) = linked(write_world(tmp_path / "w"))
    assert graph.relations == ["located_in", "member_of"] and graph.num_labels == 4
    assert d1.words == ["Ada", "Lovel", "joined", "Bree", "in", "Corvo", ".", "Dane", "won", "."]
    assert list(d1.sentence) == [0, 0, 0, 0, 0, 0, 0, 1, 1, 1]
    assert vocab.words[:4] == ["<pad>", "<unk>", "Ada", "Lovel"] and list(d1.tokens[:2]) == [2, 3]
    e = graph.index
    assert d1.candidates[0] == [(e["E0"], 2)] and d1.candidates[3] == [(e["E1"], 1)] and d1.candidates[2] == []
    # member_of forward is label 1, its inverse 3; located_in (0) ended in 2013, so on 2014-05-01 Corvo has no pair
    assert d1.pairs[3] == [[(e["E0"], 1)]] and d1.pairs[0] == [[(e["E1"], 3), (e["E4"], 3)]]
    assert d1.pairs[5] == [[]]
    W, N, R, I = lm.WORD, lm.NEW, lm.RELATED, lm.INSIDE
    assert [k for k, _, _ in d1.gold] == [N, I, W, R, W, N, W, N, W, W]
    assert d1.gold[3] == (R, 0, 0)
    # in 2013 Dane is located in Corvo: Corvo is reached from Dane, forward
    assert d2.pairs[3] == [[(e["E3"], 0)]] and d2.gold[3] == (R, 0, 0)
    # Ada Lovel is reached from the most recent entity linked to her: Bree, not Fenn
    assert d3.gold[4][0] == R and d3.pairs[4][0][d3.gold[4][2]] == (e["E1"], 3)


def test_a_batch_pads_the_documents_and_counts_what_each_pair_reaches(tmp_path):
    graph, _, docs = linked(write_world(tmp_path / "w"))
    shapes = lm.Shapes.covering(docs)
    assert shapes == lm.Shapes(length=16, candidates=1, pairs=2)
    batch = lm.document_batch(docs, shapes, graph, batch_size=4)
    assert batch["tokens"].shape == (4, 16) and list(batch["length"]) == [10, 5, 7, 0]
    assert batch["cand_entity"].shape == (4, 16, 1) and batch["pair_parent"].shape == (4, 16, 1, 2)
    e = graph.index
    count = batch["object_count"]
    assert count[0, e["E0"], 1] == 2 and count[0, e["E1"], 3] == 1 and count[0, e["E3"], 0] == 0
    assert count[1, e["E3"], 0] == 1 and count[1, e["E0"], 1] == 1  # 2013-02-01: Fenn not yet
    assert list(batch["gold_kind"][0, :11]) == [1, 3, 0, 2, 0, 1, 0, 1, 0, 0, -1]
    assert batch["gold_kind"][3].max() == -1 and batch["cand_entity"][3].max() == -1
    with pytest.raises(ValueError, match="do not fit a batch of 2"):
        lm.document_batch(docs, shapes, graph, batch_size=2)


def test_bad_input_names_the_file_and_the_document(tmp_path):
    folder = write_world(tmp_path / "w")
    graph = lm.read_graph(folder)
    news, mentions = lm.read_linked_documents(folder)
    vocab = lm.build_vocabulary(news)
    off = dict(mentions[0], entities=[[0, 6, "E0"]])  # "Ada Lo"
    with pytest.raises(DataError, match="d1.*characters 0-6 does not fall on word boundaries") as err:
        lm.link_document(news[0], off, graph, vocab, where="mentions.jsonl")
    assert "mentions.jsonl" in str(err.value)
    with pytest.raises(DataError, match="mention of 'E9', which world.json does not hold"):
        lm.link_document(news[0], dict(mentions[0], entities=[[0, 9, "E9"]]), graph, vocab)
    (tmp_path / "w" / "mentions.jsonl").write_text("\n".join(json.dumps(m) for m in mentions[::-1]) + "\n")
    with pytest.raises(DataError, match="does not list news.jsonl's documents in the same order"):
        lm.read_linked_documents(folder)
    (tmp_path / "w" / "news.jsonl").write_text('{"id": "d1", "date": "2014-05-01"\n')
    with pytest.raises(DataError, match="line 1 is not valid JSON"):
        lm.read_linked_documents(folder)
    with pytest.raises(DataError, match="no world.json"):
        lm.read_graph(str(tmp_path / "nowhere"))
    bad_fact = [dict(FACTS[0], object="E7")]
    with pytest.raises(DataError, match="fact 0 names an entity the graph does not hold"):
        lm.read_graph(write_world(tmp_path / "v", facts=bad_fact))
