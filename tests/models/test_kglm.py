"""Tests of templm.models.kglm and templm.evaluation.latent_lm_perplexity on a five-entity graph: the model is a
proper distribution at every decision, the readings of a document are all listed, the proposal scores what it draws
and mixes in the gold annotations as asked, and, on the model itself, the importance-sampled estimate is a
stochastic upper bound on the exact marginal that tightens as K grows."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from templm.data import linked_mentions as lm
from templm.evaluation.latent_lm_perplexity import (exact_log_marginals, sample_token_log_weights,
                                                    truncate_documents)
from templm.models import kglm
from templm_testing import write_mini_world

CONFIG = dict(embed=8, hidden=8, proposal_hidden=8)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    folder = write_mini_world(tmp_path_factory.mktemp("kglm") / "world")
    graph = lm.read_graph(folder)
    news, mentions = lm.read_linked_documents(folder)
    vocab = lm.build_vocabulary(news)
    docs = lm.link_documents(news, mentions, graph, vocab)
    shapes = lm.Shapes.covering(docs)
    batch = lm.document_batch(docs, shapes, graph)
    config = kglm.KGLMConfig(len(vocab), graph.num_entities, graph.num_labels, **CONFIG)
    p = kglm.init_generative(kglm.KnowledgeGraphLM(config), jax.random.key(0), shapes.candidates, shapes.pairs)
    q = kglm.init_proposal(kglm.MentionProposal(config), jax.random.key(1),
                           {k: jnp.asarray(v[0]) for k, v in batch.items()})
    return {"graph": graph, "docs": docs, "batch": batch, "config": config, "p": p, "q": q, "shapes": shapes}


def one(batch, b):
    return {k: jnp.asarray(v[b]) for k, v in batch.items()}


def test_the_model_sums_to_one_over_everything_a_decision_can_emit(world):
    """At a decision with Ada Lovel and Dane already mentioned (on 2014-05-01 Ada Lovel reaches Bree and Fenn by
    member_of, Bree and Fenn reach her by its inverse, Dane reaches nothing), the probabilities of every word, every
    new entity and every (parent, label, entity reached) add up to 1."""
    config, graph, p = world["config"], world["graph"], world["p"]
    model = kglm.KnowledgeGraphLM(config)
    count = world["batch"]["object_count"][0]  # d1's date
    e = graph.index
    local = np.zeros(graph.num_entities, bool)
    local[[e["E0"], e["E3"]]] = True
    h = jax.random.normal(jax.random.key(3), (config.hidden,))
    carry = (h, jnp.asarray(local), jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32))
    doc = {"object_count": jnp.asarray(count)}

    def term(token, option, entity, parent=0, label=0):
        xs = (jnp.int32(token), jnp.int32(option), jnp.array([entity], jnp.int32), jnp.array([1], jnp.int32),
              jnp.array([[parent]], jnp.int32), jnp.array([[label]], jnp.int32), jnp.bool_(True))
        _, t = model.apply({"params": p}, carry, xs, doc, method=kglm.KnowledgeGraphLM.step)
        return float(t)

    total = sum(math.exp(term(v, 0, 0)) for v in range(config.vocab_size))
    total += sum(math.exp(term(0, 1, x)) for x in range(graph.num_entities))
    reached = 0
    for f in graph.facts:
        for parent, label, obj in ((f.subject, f.relation, f.object), (f.object, f.relation + 2, f.subject)):
            if local[parent] and f.valid_on(world["docs"][0].date):
                total += math.exp(term(0, 2, obj, parent, label))
                reached += 1
    assert reached == 2  # Ada Lovel -> Bree, Ada Lovel -> Fenn
    assert total == pytest.approx(1.0, abs=1e-5)
    # Without a mentioned entity that reaches anything, "related" has no mass: words and new entities sum to 1
    local[:] = False
    local[e["E3"]] = True
    carry = (h, jnp.asarray(local), jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32))
    words_and_new = sum(math.exp(term(v, 0, 0)) for v in range(config.vocab_size)) + \
        sum(math.exp(term(0, 1, x)) for x in range(graph.num_entities))
    assert words_and_new == pytest.approx(1.0, abs=1e-5)


def test_every_reading_of_a_document_is_listed(world):
    """d1 names Ada Lovel, Bree, Corvo and Dane: Ada Lovel as words or new (2); Bree as words, new, or from Ada Lovel
    when she was read as a mention (2 or 3); Corvo and Dane as words or new (2 x 2): (2 + 3) x 4 = 20 readings."""
    batch = world["batch"]
    doc = {k: v[0] for k, v in batch.items()}
    readings = kglm.enumerate_options(doc)
    assert len(readings) == 20 and len({tuple(r) for r in readings}) == 20
    gold = kglm.gold_options(batch)[0]
    assert any((r == gold).all() for r in readings)
    assert kglm.enumerate_options(doc, limit=10) is None


def test_the_proposal_scores_what_it_draws_and_mixes_in_the_gold_annotations(world):
    config, batch, q = world["config"], world["batch"], world["q"]
    proposal = kglm.MentionProposal(config)
    doc = one(batch, 0)
    scores = proposal.apply({"params": q}, doc, method=kglm.MentionProposal.option_scores)
    draws = jax.vmap(lambda key: kglm.proposal_scan(scores, doc, key))(jax.random.split(jax.random.key(5), 64))
    rescored = jax.vmap(lambda o: kglm.proposal_scan(scores, doc, forced=o).log_q)(draws.options)
    np.testing.assert_allclose(rescored, draws.log_q, atol=1e-6)
    # a position inside a drawn mention decides nothing; past the end neither
    assert (draws.options[:, 10:] == -1).all() and (draws.log_q[:, 10:] == 0).all()
    new_ada = draws.options[:, 0] == 1
    assert (draws.options[new_ada, 1] == -1).all() and (draws.options[~new_ada, 1] == 0).all()
    # with gold_weight w, the gold option of the first decision (Ada Lovel, new) gets at least w
    gold = kglm.gold_options(batch)[0]
    forced = jnp.asarray(gold)
    plain = float(kglm.proposal_scan(scores, doc, forced=forced).log_q[0])
    mixed = float(kglm.proposal_scan(scores, doc, forced=forced, gold_weight=0.9).log_q[0])
    assert mixed == pytest.approx(math.log(0.9 + 0.1 * math.exp(plain)), abs=1e-6)
    # a temperature divides the scores: at a two-option decision, q(gold) moves towards 1/2
    hot = float(kglm.proposal_scan(scores, doc, forced=forced, temperature=1e6).log_q[0])
    assert hot == pytest.approx(math.log(0.5), abs=1e-4)


def test_the_estimate_is_a_stochastic_upper_bound_that_tightens_with_k(world):
    """On the model itself: the exact log p(x) of each document sums every reading; with K samples of an untrained
    proposal the mean estimate (over independent runs) stays below it, by less as K grows, and is close at the
    largest K."""
    config, batch = world["config"], world["batch"]
    exact = np.array(exact_log_marginals(config, world["p"], batch))
    lw = sample_token_log_weights(config, world["p"], world["q"], batch, 4096, jax.random.key(7), doc_chunk=4,
                                  sample_chunk=1024)
    doc_lw = lw.sum(-1)  # [S, B]
    gaps, ses = [], []
    for k in (1, 4, 16, 64, 256):
        runs = doc_lw.shape[0] // k
        est = np.logaddexp.reduce(doc_lw[: runs * k].reshape(runs, k, -1), axis=1) - math.log(k)  # [runs, B]
        total = est.sum(-1)
        mean, se = total.mean(), total.std(ddof=1) / math.sqrt(runs)
        assert mean <= exact.sum() + 3 * se  # an upper bound on perplexity, in expectation
        gaps.append(exact.sum() - mean)
        ses.append(se)
    assert gaps[0] > 10 * ses[0] and gaps[0] > 0.5  # K = 1 is well below: KL(q || posterior)
    for a, b, se_a, se_b in zip(gaps, gaps[1:], ses, ses[1:]):
        assert b <= a + 3 * math.hypot(se_a, se_b)  # tightens with K
    assert gaps[-1] < 0.1 * gaps[0]


def test_truncated_documents_keep_only_what_fits(world):
    batch = world["batch"]
    short = truncate_documents(batch, 1)
    assert list(short["length"]) == [7, 5, 7]  # d1's first sentence; d2 and d3 have one
    assert (short["cand_entity"][0, 7:] == -1).all() and short["cand_entity"][0, 5, 0] >= 0
    assert list(short["gold_kind"][0, :8]) == [1, 3, 0, 2, 0, 1, 0, -1]
    assert len(kglm.enumerate_options({k: v[0] for k, v in short.items()})) == 10
