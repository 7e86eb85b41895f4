"""A knowledge-graph language model with latent entity mentions (in the spirit of KGLM, Logan et al. 2019) and the
learned proposal that importance sampling draws its latent decisions from.

The generative model p(x, z) reads a document left to right with a GRU. At each position that is not inside a
mention it makes a latent decision:

- word: the next token from the vocabulary, p(type=word | h) p(x_t | h);
- new: an entity from the whole graph, p(type=new | h) p(e | h), whose name is then copied token by token;
- related: an entity reached through the graph from one the document has already mentioned,
  p(type=related | h) p(parent | h, local) p(label | h, parent) / n(parent, label): a parent among the entities
  mentioned so far (the local graph), a relation label the graph has for it on the document's date, and one of the
  n(parent, label) entities that label reaches, uniformly; its name is copied.

Every distribution is normalised over everything the model could produce (the "related" type only exists once a
mentioned entity has a relation; a parent only with a label that reaches something), so p is a proper distribution
over (x, z). The copied entity's embedding enters the GRU with each token of its name, and the local graph grows
with each mention: the state depends on every earlier decision, so p(x) = sum_z p(x, z) has no dynamic programme;
it is a sum over every way of reading each name in the text as words or as a mention (reached in each way the graph
allows), exponential in the number of names. `enumerate_options` lists them all for short documents (the tests'
exact reference); importance sampling estimates it otherwise (templm.evaluation.latent_lm_perplexity).

The proposal q(z | x) is a tagger: a bidirectional GRU over the whole document (it sees the tokens after the
decision, as KGLM's proposal does) scores, at every position, each option the text allows (word; a mention of each
candidate entity whose name starts there, new or through each (parent, label) pair the graph has). Only the
options' availability depends on the decisions sampled before (a parent must already be mentioned; the tokens of a
chosen mention are inside it), so the scores are computed once per document and the sampling scan only masks them.
`temperature` divides the scores; `gold_weight` > 0 mixes in the gold annotations: at each decision the gold option,
where it is available, takes that share of the probability (a proposal that sees the annotations).

Decisions are one integer per position, an option index: 0 word, 1 + c a new mention of candidate c, 1 + C + c J + j
a mention of candidate c through its pair j; -1 inside a mention and past the end. Arrays of a batch are those of
`templm.data.linked_mentions.document_batch`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

NEG = -1e30  # the score of an option that is not available
# Entities the training documents never name keep their initial embedding: a small one, so that an unseen entity
# (the world's emerging names) enters the state as little more than "an entity", not as noise.
_entity_init = nn.initializers.normal(0.02)


@dataclasses.dataclass(frozen=True)
class KGLMConfig:
    vocab_size: int
    num_entities: int
    num_labels: int
    embed: int = 64
    hidden: int = 64
    proposal_hidden: int = 64
    max_name_length: int = 16  # longest entity name the proposal's length embedding distinguishes


def num_options(candidates: int, pairs: int) -> int:
    return 1 + candidates + candidates * pairs


# ----------------------------------------------------------------------------------------------------------------
# The generative model.


class KnowledgeGraphLM(nn.Module):
    """p(x, z): `step` is one position (module docstring); `log_joint_terms` scans it over a document."""

    config: KGLMConfig

    def setup(self):
        c = self.config
        self.word_embed = nn.Embed(c.vocab_size, c.embed)
        self.entity_embed = nn.Embed(c.num_entities, c.embed, embedding_init=_entity_init)
        self.entity_in = nn.Dense(c.embed, use_bias=False)
        self.cell = nn.GRUCell(c.hidden)
        self.type_head = nn.Dense(3)
        self.word_head = nn.Dense(c.vocab_size)
        self.new_query = nn.Dense(c.embed)
        self.parent_query = nn.Dense(c.embed)
        self.label_head = nn.Dense(c.num_labels)

    def step(self, carry, xs, doc):
        """One position for one document. carry: (h [H], local [E] bool, remaining, current); xs: token, option,
        cand_entity [C], cand_length [C], pair_parent [C, J], pair_label [C, J], valid; doc: object_count [E, L].
        Returns (carry, log p of the position's decision and what it emits; 0 inside a mention and past the end)."""
        h, local, remaining, current = carry
        token, option, cand_entity, cand_length, pair_parent, pair_label, valid = xs
        count = doc["object_count"]
        n_cand, n_pair = pair_parent.shape
        has_label = count > 0  # [E, L]
        eligible = local & has_label.any(-1)  # parents the "related" type can start from
        type_logits = self.type_head(h)
        type_logits = jnp.where(jnp.array([True, True, False]) | eligible.any(), type_logits, NEG)
        log_type = jax.nn.log_softmax(type_logits)
        table = jnp.asarray(self.entity_embed.embedding)
        deciding = (remaining == 0) & valid
        # word
        log_word = jax.nn.log_softmax(self.word_head(h))[token]
        # new: the candidate entity from the whole graph
        is_new = (option >= 1) & (option < 1 + n_cand)
        c_new = jnp.clip(option - 1, 0, n_cand - 1)
        log_new = jax.nn.log_softmax(table @ self.new_query(h))
        # related: parent among the eligible mentioned entities, a label it has, one of the entities it reaches
        flat = jnp.clip(option - 1 - n_cand, 0, n_cand * n_pair - 1)
        c_rel, j_rel = flat // n_pair, flat % n_pair
        parent = jnp.clip(pair_parent[c_rel, j_rel], 0, None)
        label = jnp.clip(pair_label[c_rel, j_rel], 0, None)
        parent_logits = jnp.where(eligible, table @ self.parent_query(h), NEG)
        label_logits = jnp.where(has_label[parent], self.label_head(jnp.concatenate([h, table[parent]])), NEG)
        log_related = (jax.nn.log_softmax(parent_logits)[parent] + jax.nn.log_softmax(label_logits)[label]
                       - jnp.log(jnp.maximum(count[parent, label], 1)).astype(h.dtype))
        is_related = option >= 1 + n_cand
        cand = jnp.where(is_new, c_new, c_rel)
        term = jnp.where(is_related, log_type[2] + log_related,
                         jnp.where(is_new, log_type[1] + log_new[cand_entity[c_new]], log_type[0] + log_word))
        term = jnp.where(deciding, term, 0.0)
        # the state: the mention's entity enters with each of its tokens; the local graph grows with each mention
        starts = deciding & (option >= 1)
        entity = jnp.where(starts, cand_entity[cand], current)
        in_mention = starts | ((remaining > 0) & valid)
        x = self.word_embed(token) + jnp.where(in_mention, 1.0, 0.0) * self.entity_in(table[jnp.clip(entity, 0, None)])
        h_next, _ = self.cell(h, x)
        h = jnp.where(valid, h_next, h)
        local = local | (starts & (jnp.arange(local.shape[0]) == entity))
        remaining = jnp.where(starts, cand_length[cand] - 1, jnp.maximum(remaining - valid.astype(remaining.dtype), 0))
        return (h, local, remaining, entity), term

    def initial_carry(self, num_entities: int):
        h = jnp.zeros((self.config.hidden,), jnp.float32)
        return h, jnp.zeros((num_entities,), bool), jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32)


def _time_major(doc: Dict[str, Any], options: jax.Array):
    """The per-position inputs of one document, positions first."""
    t = doc["tokens"].shape[0]
    valid = jnp.arange(t) < doc["length"]
    return (doc["tokens"], options, doc["cand_entity"], doc["cand_length"], doc["pair_parent"], doc["pair_label"],
            valid)


def log_joint_terms(model: KnowledgeGraphLM, params, doc: Dict[str, Any], options: jax.Array) -> jax.Array:
    """[T] log p of each position's decision and emission for ONE document (unbatched arrays of
    `document_batch`) read with the decisions `options` [T]; their sum is log p(x, z). vmap it over documents and
    samples."""
    carry = model.initial_carry(doc["object_count"].shape[0])

    def body(carry, xs):
        return model.apply({"params": params}, carry, xs, doc, method=KnowledgeGraphLM.step)

    _, terms = jax.lax.scan(body, carry, _time_major(doc, options))
    return terms


def init_generative(model: KnowledgeGraphLM, rng: jax.Array, shapes_c: int, shapes_j: int) -> Any:
    c = model.config
    carry = model.initial_carry(c.num_entities)
    xs = (jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32), jnp.zeros((shapes_c,), jnp.int32),
          jnp.ones((shapes_c,), jnp.int32), jnp.zeros((shapes_c, shapes_j), jnp.int32),
          jnp.zeros((shapes_c, shapes_j), jnp.int32), jnp.ones((), bool))
    doc = {"object_count": jnp.ones((c.num_entities, c.num_labels), jnp.int32)}
    return model.init(rng, carry, xs, doc, method=KnowledgeGraphLM.step)["params"]


# ----------------------------------------------------------------------------------------------------------------
# The proposal.


class MentionProposal(nn.Module):
    """q(z | x): `option_scores` gives every position's option scores from the whole document (module docstring)."""

    config: KGLMConfig

    def setup(self):
        c = self.config
        self.word_embed = nn.Embed(c.vocab_size, c.embed)
        self.forward_rnn = nn.RNN(nn.GRUCell(c.proposal_hidden))
        self.backward_rnn = nn.RNN(nn.GRUCell(c.proposal_hidden), reverse=True, keep_order=True)
        self.entity_embed = nn.Embed(c.num_entities, c.embed, embedding_init=_entity_init)
        self.label_embed = nn.Embed(c.num_labels, c.embed)
        self.length_embed = nn.Embed(c.max_name_length + 1, c.proposal_hidden)
        self.word_score = nn.Dense(1)
        self.context = nn.Dense(c.proposal_hidden)
        self.entity_in = nn.Dense(c.proposal_hidden, use_bias=False)
        self.parent_in = nn.Dense(c.proposal_hidden, use_bias=False)
        self.label_in = nn.Dense(c.proposal_hidden, use_bias=False)
        self.new_score = nn.Dense(1)
        self.related_score = nn.Dense(1)

    def option_scores(self, doc: Dict[str, Any]) -> jax.Array:
        """[T, O] scores of one document's options (unavailable candidates and pairs at NEG)."""
        x = self.word_embed(doc["tokens"])[None]
        lengths = doc["length"][None]
        f = jnp.concatenate([self.forward_rnn(x, seq_lengths=lengths), self.backward_rnn(x, seq_lengths=lengths)],
                            -1)[0]  # [T, 2H]
        ctx = self.context(f)  # [T, H]
        ent = doc["cand_entity"]
        length = jnp.clip(doc["cand_length"], 0, self.config.max_name_length)
        mention = ctx[:, None] + self.entity_in(self.entity_embed(jnp.clip(ent, 0, None))) + \
            self.length_embed(length)  # [T, C, H]
        new = self.new_score(jnp.tanh(mention))[..., 0]  # [T, C]
        new = jnp.where(ent >= 0, new, NEG)
        parent, label = doc["pair_parent"], doc["pair_label"]
        rel = mention[:, :, None] + self.parent_in(self.entity_embed(jnp.clip(parent, 0, None))) + \
            self.label_in(self.label_embed(jnp.clip(label, 0, None)))  # [T, C, J, H]
        related = self.related_score(jnp.tanh(rel))[..., 0]
        related = jnp.where(parent >= 0, related, NEG)
        t = ent.shape[0]
        return jnp.concatenate([self.word_score(f), new, related.reshape(t, -1)], -1)


def init_proposal(model: MentionProposal, rng: jax.Array, doc: Dict[str, Any]) -> Any:
    return model.init(rng, doc, method=MentionProposal.option_scores)["params"]


class ProposalDraw(NamedTuple):
    options: jax.Array  # [T] the decisions (option indices; -1 inside a mention and past the end)
    log_q: jax.Array  # [T] log q of each position's decision (0 where there is none)


def _option_parts(n_options: int, n_cand: int, n_pair: int):
    o = jnp.arange(n_options)
    is_rel = o >= 1 + n_cand
    flat = jnp.clip(o - 1 - n_cand, 0, n_cand * n_pair - 1)
    cand = jnp.where(is_rel, flat // n_pair, jnp.clip(o - 1, 0, n_cand - 1))
    return is_rel, cand, flat % n_pair


def proposal_scan(scores: jax.Array, doc: Dict[str, Any], rng: Optional[jax.Array] = None,
                  forced: Optional[jax.Array] = None, temperature: float = 1.0, gold_weight: float = 0.0
                  ) -> ProposalDraw:
    """Draws the decisions of ONE document from q (rng), or scores given ones (forced [T]): a scan over positions
    that masks each position's option `scores` [T, O] by what the decisions before allow (a related option needs its
    parent mentioned; nothing is decided inside a mention), divides them by `temperature`, mixes in the gold option
    with `gold_weight`, and takes the option. vmap it over samples and documents."""
    t_len, n_options = scores.shape
    n_cand = doc["cand_entity"].shape[-1]
    n_pair = doc["pair_parent"].shape[-1]
    is_rel, opt_cand, opt_pair = _option_parts(n_options, n_cand, n_pair)
    gold = _gold_options(doc, n_cand, n_pair)
    num_entities = doc["object_count"].shape[0]
    keys = jax.random.split(rng, t_len) if rng is not None else jnp.zeros((t_len, 2), jnp.uint32)
    chosen_in = forced if forced is not None else jnp.full((t_len,), -1, jnp.int32)

    def body(carry, xs):
        local, remaining = carry
        score, key, given, valid, g, cand_entity, cand_length, pair_parent = xs
        parent = pair_parent[opt_cand, opt_pair]
        allowed = jnp.where(is_rel, (parent >= 0) & local[jnp.clip(parent, 0, None)], score > NEG / 2)
        logits = jnp.where(allowed, score / temperature, NEG)
        log_p = jax.nn.log_softmax(logits)
        if gold_weight:
            gold_ok = (g >= 0) & allowed[jnp.clip(g, 0, None)]
            mixed = jnp.logaddexp(math.log1p(-gold_weight) + log_p,
                                  jnp.where(jnp.arange(n_options) == g, math.log(gold_weight), NEG))
            log_p = jnp.where(gold_ok, mixed, log_p)
        deciding = (remaining == 0) & valid
        if rng is not None:
            option = jax.random.categorical(key, log_p)
        else:
            option = given
        option = jnp.where(deciding, option, -1)
        log_q = jnp.where(deciding, log_p[jnp.clip(option, 0, None)], 0.0)
        starts = deciding & (option >= 1)
        c = opt_cand[jnp.clip(option, 0, None)]
        entity = cand_entity[c]
        local = local | (starts & (jnp.arange(num_entities) == entity))
        remaining = jnp.where(starts, cand_length[c] - 1, jnp.maximum(remaining - valid.astype(remaining.dtype), 0))
        return (local, remaining), (option, log_q)

    valid = jnp.arange(t_len) < doc["length"]
    xs = (scores, keys, chosen_in, valid, gold, doc["cand_entity"], doc["cand_length"], doc["pair_parent"])
    _, (options, log_q) = jax.lax.scan(body, (jnp.zeros((num_entities,), bool), jnp.zeros((), jnp.int32)), xs)
    return ProposalDraw(options, log_q)


def _gold_options(doc: Dict[str, Any], n_cand: int, n_pair: int) -> jax.Array:
    """[T] the gold decision of each position as an option index (-1 where the gold has none: inside, past the
    end)."""
    kind, cand, pair = doc["gold_kind"], doc["gold_cand"], doc["gold_pair"]
    return jnp.where(kind == 0, 0, jnp.where(kind == 1, 1 + cand,
                                             jnp.where(kind == 2, 1 + n_cand + cand * n_pair + pair, -1)))


def gold_options(doc: Dict[str, np.ndarray]) -> np.ndarray:
    """The gold decisions of a batch (or one document) as option indices, on the host."""
    n_cand, n_pair = doc["cand_entity"].shape[-1], doc["pair_parent"].shape[-1]
    return np.asarray(_gold_options({k: jnp.asarray(v) for k, v in doc.items()}, n_cand, n_pair))


# ----------------------------------------------------------------------------------------------------------------
# Every reading of a short document (the exact marginal).


def enumerate_options(doc: Dict[str, np.ndarray], limit: int = 4096) -> Optional[np.ndarray]:
    """[P, T] every decision sequence of ONE document (host arrays of `document_batch`, unbatched) under which p
    produces its text: each candidate name read as words or as a mention (new, or through each pair whose parent is
    already mentioned). None when there are more than `limit`."""
    length = int(doc["length"])
    t_len = doc["tokens"].shape[0]
    n_cand, n_pair = doc["cand_entity"].shape[-1], doc["pair_parent"].shape[-1]
    count = doc["object_count"]
    has_label = count.sum(-1) > 0
    out: List[List[int]] = []

    def walk(t: int, local: frozenset, prefix: List[int]) -> bool:
        if len(out) > limit:
            return False
        if t >= length:
            out.append(prefix + [-1] * (t_len - len(prefix)))
            return True
        choices: List[Tuple[int, int]] = [(0, 1)]
        for c in range(n_cand):
            e = int(doc["cand_entity"][t, c])
            if e < 0:
                continue
            span = int(doc["cand_length"][t, c])
            choices.append((1 + c, span))
            for j in range(n_pair):
                p = int(doc["pair_parent"][t, c, j])
                if p >= 0 and p in local and has_label[p]:
                    choices.append((1 + n_cand + c * n_pair + j, span))
        for option, span in choices:
            if option == 0:
                nxt = local
            else:
                c = option - 1 if option <= n_cand else (option - 1 - n_cand) // n_pair
                nxt = local | {int(doc["cand_entity"][t, c])}
            if not walk(t + span, nxt, prefix + [option] + [-1] * (span - 1)):
                return False
        return True

    if not walk(0, frozenset(), []):
        return None
    return np.array(out, np.int32)


def parameter_count(params: Any) -> int:
    return int(sum(np.prod(x.shape) for x in jax.tree.leaves(params)))
