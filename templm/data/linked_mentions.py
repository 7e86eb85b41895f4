"""News documents with their entity mentions linked to the world's knowledge graph, as the arrays of the
knowledge-graph language model (templm.models.kglm).

The embedded world writes what such a model needs: `world.json` (the graph: entities and dated facts) and
`mentions.jsonl` (per document, the character span of every entity it names and every sentence's span). This module
turns them into, per document:

- tokens: words and punctuation marks (`tokenize`: a regular expression, so that the mention spans, given in
  characters, fall on token boundaries), as ids of a `Vocabulary` built from the training documents and the
  entities' names;
- candidates: at every position, each entity whose name's tokens match the text there (the spans a mention could
  take; a name may also be read as plain words);
- for every candidate, the ways the graph reaches it from another entity: (parent entity, relation label) pairs of
  the facts valid on the document's date, a relation read in either direction (label r for subject -> object,
  r + R for object -> subject);
- the gold latent decisions from the annotations: at each gold mention's first token the candidate and how it was
  reached ("new": from the whole graph; "related": from an entity the document named before, the most recent one
  the graph links to it), the mention's other tokens "inside", every other token a "word".

`DocumentBatch` pads a list of documents to fixed shapes [B, T, C, J] for the jitted model; the number of objects
of each (entity, label) on each document's date (what the model's "related" choice divides by) is computed per
batch, from the graph.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import datetime
import json
import re
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from templm import paths
from templm.errors import DataError, loads_json, read_json

# Decision kinds, per token position.
WORD, NEW, RELATED, INSIDE = 0, 1, 2, 3
PAD = -1
KINDS = ("word", "new", "related", "inside")

_TOKEN = re.compile(r"\w+|[^\w\s]")


def tokenize(text: str) -> Tuple[List[str], List[int], List[int]]:
    """(tokens, character starts, character ends): runs of word characters and single other marks."""
    tokens, starts, ends = [], [], []
    for m in _TOKEN.finditer(text):
        tokens.append(m.group())
        starts.append(m.start())
        ends.append(m.end())
    return tokens, starts, ends


class Vocabulary:
    """Word ids: 0 pads, 1 is the unknown word, then the words in order of first appearance."""

    PAD_ID, UNK_ID = 0, 1

    def __init__(self, words: Iterable[str]):
        self.words: List[str] = ["<pad>", "<unk>"]
        self.ids: Dict[str, int] = {}
        for w in words:
            if w not in self.ids:
                self.ids[w] = len(self.words)
                self.words.append(w)

    def __len__(self) -> int:
        return len(self.words)

    def encode(self, tokens: Sequence[str]) -> np.ndarray:
        return np.array([self.ids.get(t, self.UNK_ID) for t in tokens], np.int32)


@dataclasses.dataclass(frozen=True)
class GraphFact:
    subject: int  # entity index
    relation: int  # relation index (forward label; its inverse is relation + num_relations)
    object: int
    start: Optional[datetime.date]
    end: Optional[datetime.date]

    def valid_on(self, date: datetime.date) -> bool:
        return (self.start is None or self.start <= date) and (self.end is None or date <= self.end)


class KnowledgeGraph:
    """The world's entities (by index) and dated facts, readable in both directions."""

    def __init__(self, entities: Sequence[Mapping[str, str]], facts: Sequence[Mapping[str, object]], where: str = ""):
        self.ids = [str(e["id"]) for e in entities]
        self.names = [str(e["name"]) for e in entities]
        self.index = {eid: i for i, eid in enumerate(self.ids)}
        self.relations = sorted({str(f["relation"]) for f in facts})
        rel_index = {r: i for i, r in enumerate(self.relations)}
        parse = lambda s: None if s is None else datetime.date.fromisoformat(str(s))  # noqa: E731
        self.facts: List[GraphFact] = []
        for n, f in enumerate(facts):
            try:
                self.facts.append(GraphFact(self.index[str(f["subject"])], rel_index[str(f["relation"])],
                                            self.index[str(f["object"])], parse(f.get("start")), parse(f.get("end"))))
            except (KeyError, ValueError) as e:
                raise DataError(f"fact {n} names an entity the graph does not hold or a bad date: {e}", where) from None
        # facts touching each entity, for the pairs that reach it
        self.touching: Dict[int, List[GraphFact]] = collections.defaultdict(list)
        for f in self.facts:
            self.touching[f.object].append(f)
            self.touching[f.subject].append(f)
        self.name_tokens = [tokenize(name)[0] for name in self.names]

    @property
    def num_entities(self) -> int:
        return len(self.ids)

    @property
    def num_labels(self) -> int:
        """Relation labels: each relation forward and inverse."""
        return 2 * len(self.relations)

    def label_name(self, label: int) -> str:
        r = len(self.relations)
        return self.relations[label] if label < r else self.relations[label - r] + "^-1"

    def parents(self, entity: int, date: datetime.date) -> List[Tuple[int, int]]:
        """(parent, label) pairs whose facts valid on `date` lead to `entity` (sorted, without repeats)."""
        r = len(self.relations)
        pairs = set()
        for f in self.touching.get(entity, ()):
            if f.valid_on(date):
                if f.object == entity:
                    pairs.add((f.subject, f.relation))
                if f.subject == entity:
                    pairs.add((f.object, f.relation + r))
        return sorted(pairs)

    def object_counts(self, date: datetime.date) -> np.ndarray:
        """[num_entities, num_labels]: how many entities each (entity, label) reaches on `date`."""
        r = len(self.relations)
        counts = np.zeros((self.num_entities, self.num_labels), np.int32)
        for f in self.facts:
            if f.valid_on(date):
                counts[f.subject, f.relation] += 1
                counts[f.object, f.relation + r] += 1
        return counts


def read_graph(world_dir: str) -> KnowledgeGraph:
    path = paths.join(world_dir, "world.json")
    raw = read_json(path, "no world.json: not a world folder (templm data world)")
    if not isinstance(raw, dict) or "entities" not in raw or "facts" not in raw:
        raise DataError("expected an object with 'entities' and 'facts'", path)
    return KnowledgeGraph(raw["entities"], raw["facts"], path)


@dataclasses.dataclass
class LinkedDocument:
    """One document as the knowledge-graph LM reads it (module docstring). Positions index `tokens`."""

    id: str
    date: datetime.date
    words: List[str]
    tokens: np.ndarray  # [n] word ids
    sentence: np.ndarray  # [n] sentence index of each token
    candidates: List[List[Tuple[int, int]]]  # per position: (entity, length in tokens)
    pairs: List[List[List[Tuple[int, int]]]]  # per position, per candidate: (parent, label)
    gold: List[Tuple[int, int, int]]  # per position: (kind, candidate index, pair index); -1 where unused

    def __len__(self) -> int:
        return len(self.words)


class _NameIndex:
    """Entities by the first token of their name, for candidate matching."""

    def __init__(self, graph: KnowledgeGraph):
        self.by_first: Dict[str, List[int]] = collections.defaultdict(list)
        for e, toks in enumerate(graph.name_tokens):
            if toks:
                self.by_first[toks[0]].append(e)
        self.graph = graph

    def at(self, words: Sequence[str], t: int) -> List[Tuple[int, int]]:
        out = []
        for e in self.by_first.get(words[t], ()):
            toks = self.graph.name_tokens[e]
            if list(words[t:t + len(toks)]) == toks:
                out.append((e, len(toks)))
        return out


def link_document(doc: Mapping[str, object], mention: Mapping[str, object], graph: KnowledgeGraph,
                  vocab: Vocabulary, names: Optional[_NameIndex] = None, where: str = "") -> LinkedDocument:
    """A news.jsonl record and its mentions.jsonl record as a LinkedDocument (module docstring)."""
    names = names or _NameIndex(graph)
    text = str(doc["text"])
    try:
        date = datetime.date.fromisoformat(str(doc["date"])[:10])
    except ValueError:
        raise DataError(f"document {doc.get('id')!r}: date {doc.get('date')!r} is not YYYY-MM-DD", where) from None
    words, starts, ends = tokenize(text)
    n = len(words)
    sentence = np.zeros(n, np.int32)
    spans = sorted((int(s[0]), int(s[1])) for s in mention.get("sentences", []))
    if spans:
        begins = [s for s, _ in spans]
        for t in range(n):
            sentence[t] = max(0, bisect.bisect_right(begins, starts[t]) - 1)
    candidates = [names.at(words, t) for t in range(n)]
    pairs = [[graph.parents(e, date) for e, _ in cands] for cands in candidates]
    start_at = {s: t for t, s in enumerate(starts)}
    end_at = {e: t for t, e in enumerate(ends)}
    gold: List[Tuple[int, int, int]] = [(WORD, PAD, PAD)] * n
    named: List[int] = []  # entities the gold annotations have named so far, in order
    for begin, end, eid in sorted((int(a), int(b), str(c)) for a, b, c in mention.get("entities", [])):
        if eid not in graph.index:
            raise DataError(f"document {doc.get('id')!r}: mention of {eid!r}, which world.json does not hold", where)
        t, last = start_at.get(begin), end_at.get(end)
        if t is None or last is None:
            raise DataError(f"document {doc.get('id')!r}: the mention at characters {begin}-{end} does not fall on "
                            f"word boundaries", where)
        entity = graph.index[eid]
        c = next((i for i, (e, length) in enumerate(candidates[t]) if e == entity and length == last - t + 1), None)
        if c is None or any(k != WORD for k, _, _ in gold[t:last + 1]):
            continue  # a span that does not read as the entity's name, or overlaps another: left as words
        choice = (NEW, c, PAD)
        for parent in reversed(named):  # the most recent entity the graph links to it
            js = [j for j, (p, _) in enumerate(pairs[t][c]) if p == parent]
            if js:
                choice = (RELATED, c, js[0])
                break
        gold[t] = choice
        for u in range(t + 1, last + 1):
            gold[u] = (INSIDE, PAD, PAD)
        if entity not in named:
            named.append(entity)
        else:  # most recent last
            named.remove(entity)
            named.append(entity)
    return LinkedDocument(str(doc["id"]), date, words, vocab.encode(words), sentence, candidates, pairs, gold)


def read_linked_documents(world_dir: str) -> Tuple[List[Dict[str, object]], List[Dict[str, object]]]:
    """(news records, mention records) of a world folder, in file order, checked to pair up by id."""
    out = []
    for name in ("news.jsonl", "mentions.jsonl"):
        path = paths.join(world_dir, name)
        rows = []
        try:
            with paths.open(path, encoding="utf-8") as f:
                for n, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        rows.append(loads_json(line))
                    except json.JSONDecodeError as e:
                        raise DataError(f"line {n} is not valid JSON ({e.msg})", path) from None
        except FileNotFoundError:
            raise DataError(f"no {name}: not a world folder (templm data world)", path) from None
        out.append(rows)
    news, mentions = out
    if len(news) != len(mentions) or any(a.get("id") != b.get("id") for a, b in zip(news, mentions)):
        raise DataError("mentions.jsonl does not list news.jsonl's documents in the same order",
                        paths.join(world_dir, "mentions.jsonl"))
    return news, mentions


def build_vocabulary(news: Sequence[Mapping[str, object]]) -> Vocabulary:
    """The training documents' words (an entity's name is matched by its text, so a name the training documents
    never use is still a candidate; its words read as unknown)."""
    words: List[str] = []
    for doc in news:
        words.extend(tokenize(str(doc["text"]))[0])
    return Vocabulary(words)


def link_documents(news: Sequence[Mapping[str, object]], mentions: Sequence[Mapping[str, object]],
                   graph: KnowledgeGraph, vocab: Vocabulary, where: str = "") -> List[LinkedDocument]:
    names = _NameIndex(graph)
    return [link_document(d, m, graph, vocab, names, where) for d, m in zip(news, mentions)]


@dataclasses.dataclass(frozen=True)
class Shapes:
    """The padded sizes of a batch: tokens T, candidates per position C, pairs per candidate J."""

    length: int
    candidates: int
    pairs: int

    @staticmethod
    def covering(docs: Sequence[LinkedDocument], multiple: int = 8) -> "Shapes":
        up = lambda x: max(multiple, -(-x // multiple) * multiple)  # noqa: E731
        length = max((len(d) for d in docs), default=1)
        cands = max((len(c) for d in docs for c in d.candidates), default=1)
        pairs = max((len(p) for d in docs for ps in d.pairs for p in ps), default=1)
        return Shapes(up(length), max(1, cands), max(1, pairs))


def document_batch(docs: Sequence[LinkedDocument], shapes: Shapes, graph: KnowledgeGraph,
                   batch_size: Optional[int] = None) -> Dict[str, np.ndarray]:
    """The arrays of `docs` padded to `shapes` (and to `batch_size` rows with empty documents):

    tokens, sentence [B, T]; length [B]; cand_entity, cand_length [B, T, C] (-1 / 0 pad); pair_parent, pair_label
    [B, T, C, J] (-1 pad); object_count [B, E, L] (entities each (entity, label) reaches on the document's date);
    gold_kind, gold_cand, gold_pair [B, T] (gold_kind -1 past the end).
    """
    b = batch_size or len(docs)
    if len(docs) > b:
        raise ValueError(f"{len(docs)} documents do not fit a batch of {b}")
    t, c, j = shapes.length, shapes.candidates, shapes.pairs
    out = {"tokens": np.zeros((b, t), np.int32), "sentence": np.zeros((b, t), np.int32),
           "length": np.zeros((b,), np.int32),
           "cand_entity": np.full((b, t, c), -1, np.int32), "cand_length": np.zeros((b, t, c), np.int32),
           "pair_parent": np.full((b, t, c, j), -1, np.int32), "pair_label": np.full((b, t, c, j), -1, np.int32),
           "object_count": np.zeros((b, graph.num_entities, graph.num_labels), np.int32),
           "gold_kind": np.full((b, t), PAD, np.int32), "gold_cand": np.full((b, t), PAD, np.int32),
           "gold_pair": np.full((b, t), PAD, np.int32)}
    counts_by_date: Dict[datetime.date, np.ndarray] = {}
    for i, d in enumerate(docs):
        n = len(d)
        if n > t:
            raise ValueError(f"document {d.id} has {n} tokens, more than the batch's {t}")
        out["tokens"][i, :n] = d.tokens
        out["sentence"][i, :n] = d.sentence
        out["length"][i] = n
        for pos, cands in enumerate(d.candidates):
            if len(cands) > c:
                raise ValueError(f"document {d.id}: {len(cands)} candidates at token {pos}, more than {c}")
            for k, (e, length) in enumerate(cands):
                out["cand_entity"][i, pos, k] = e
                out["cand_length"][i, pos, k] = length
                ps = d.pairs[pos][k][:j]
                if len(d.pairs[pos][k]) > j:
                    raise ValueError(f"document {d.id}: {len(d.pairs[pos][k])} pairs at token {pos}, more than {j}")
                for m, (p, label) in enumerate(ps):
                    out["pair_parent"][i, pos, k, m] = p
                    out["pair_label"][i, pos, k, m] = label
        for pos, (kind, cand, pair) in enumerate(d.gold):
            out["gold_kind"][i, pos], out["gold_cand"][i, pos], out["gold_pair"][i, pos] = kind, cand, pair
        if d.date not in counts_by_date:
            counts_by_date[d.date] = graph.object_counts(d.date)
        out["object_count"][i] = counts_by_date[d.date]
    return out
