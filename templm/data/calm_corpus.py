"""The CALM corpus: its layout on disk, its vocabulary, the tokenised cache, and the builders that write one.

CALM (Kruszewski et al., "Evaluating Online Continual Learning with CALM") streams token windows drawn from several
classes (languages or domains). This module holds what the stream reads: the corpus layout and its tokenised cache,
and two ways to make a corpus (from a folder of texts, or one class per news domain of the embedded world). The
stream itself is `calm_stream`, the loss log `calm_log`, the metrics `templm.metrics.calm`.

Corpus layout (as the original)
-------------------------------
``<root>/<class>.txt``, one file per class (class name = file stem; classes sorted by name, class index = position
in that order), and ``<root>/vocab/*.vocab``. The vocabulary is the union of the entries of the vocab files, read in
file-name order; each line is ``token`` or ``token<TAB>count`` (the count, when given, must be a non-negative
integer and is otherwise ignored). Surrounding whitespace is stripped from an entry and entries that are empty after
stripping are skipped, so whitespace is never read from a vocab file. Ids:

- ``<unk>`` is always id 0 (`UNK_ID`); a token outside the vocabulary reads as ``<unk>``.
- char level: ids 1, 2, 3 are space, tab and newline (the original adds these three too); word level: id 1 is
  ``<eol>`` (`EOL`), the end-of-line token.
- then the vocab files' entries in order of first appearance (duplicates keep their first id).

Text is read as UTF-8 (invalid bytes are a `DataError` naming the file and line) with ``\\r\\n`` and lone ``\\r``
read as ``\\n``. Char level: one token per character, newlines included. Word level: every line (a final line
without a newline counts as a line; a trailing newline does not start another) is split on whitespace and followed
by ``<eol>``, so line structure survives (the original dropped newlines at word level).

Cache: the token ids of each class are cached beside the data as ``<root>/.cache/<class>.<level>.npy`` (int32) with
``<class>.<level>.json`` recording the sha256 of the source bytes, of the vocabulary (its id-ordered token list) and
of the array. A cache whose hashes do not match is rebuilt; files are written to a temporary name and renamed, array
first, JSON last, so a reader never takes a half-written cache. A corpus directory that cannot be written is read
without caching.

Corpus builders
---------------
`build_calm_corpus_from_texts` turns a directory of ``*.txt`` files (one class per file) into the layout above, with
``vocab/<class>.vocab`` files of ``token<TAB>count`` lines (most frequent first; whitespace characters are left out
at char level, where space, tab and newline are built in). `build_calm_corpus_from_world` makes one class per news
domain of the embedded world (see `WORLD_DOMAINS`; the world's mentions.jsonl gives each sentence's source);
`build_world_corpus` does the same for a subset of the domains (`world_domains`), generating the world first when
its folder does not exist.
`check_corpus` checks a corpus beyond what the stream needs (every class has its vocabulary file).
"""

from __future__ import annotations

import collections
import hashlib
import io
import json
import os
import re
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
from absl import logging

from templm import console, paths
from templm.data.world import FACT_TEMPLATES, TOPICS, WorldConfig, generate_world
from templm.errors import DataError, loads_json
from templm.io import NamedWrites, atomic_write
from templm.outputs import build_output_folder

UNK = "<unk>"
UNK_ID = 0
EOL = "<eol>"
LEVELS = ("char", "word")
CHAR_SPECIALS = (" ", "\t", "\n")

CACHE_DIR = ".cache"
_CACHE_FORMAT = 1


# --------------------------------------------------------------------------------------------------------------------
# Vocabulary and tokenisation.


class CalmVocabulary:
    """Token <-> id for one corpus and level. `tokens[i]` is the token of id i; unknown tokens map to `UNK_ID`."""

    def __init__(self, tokens: Sequence[str], level: str):
        if level not in LEVELS:
            raise ValueError(f"model_level must be one of {LEVELS}, got {level!r}")
        self.level = level
        self.tokens: Tuple[str, ...] = tuple(tokens)
        if not self.tokens or self.tokens[UNK_ID] != UNK:
            raise ValueError(f"id {UNK_ID} must be {UNK!r}")
        self._index = {t: i for i, t in enumerate(self.tokens)}
        if len(self._index) != len(self.tokens):
            raise ValueError("vocabulary tokens must be distinct")
        self.sha256 = hashlib.sha256(json.dumps([level, self.tokens], ensure_ascii=False).encode("utf-8")).hexdigest()

    unk_id = UNK_ID

    def __len__(self) -> int:
        return len(self.tokens)

    def __contains__(self, token: str) -> bool:
        return token in self._index

    def __getitem__(self, i: int) -> str:
        return self.tokens[i]

    def id(self, token: str) -> int:
        return self._index.get(token, UNK_ID)

    def split(self, text: str) -> List[str]:
        """The tokens of `text` at this level (char: characters; word: words of each line, each line closed by
        `EOL`). `text` is taken as already newline-normalised."""
        if self.level == "char":
            return list(text)
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()  # a trailing newline does not start another line
        out: List[str] = []
        for line in lines:
            out.extend(line.split())
            out.append(EOL)
        return out

    def encode(self, text: str) -> np.ndarray:
        """int32 ids of `text`."""
        tokens = self.split(text)
        get = self._index.get
        return np.fromiter((get(t, UNK_ID) for t in tokens), dtype=np.int32, count=len(tokens))

    def decode(self, ids: Sequence[int]) -> str:
        """Char level: the characters joined; word level: the words of a line joined by spaces, `EOL` a newline."""
        tokens = [self.tokens[int(i)] for i in np.asarray(ids).reshape(-1)]
        if self.level == "char":
            return "".join(tokens)
        out, line = [], []
        for token in tokens:
            if token == EOL:
                out.append(" ".join(line) + "\n")
                line = []
            else:
                line.append(token)
        return "".join(out) + " ".join(line)

    def __repr__(self) -> str:
        return f"CalmVocabulary({len(self)} tokens, level={self.level!r})"


def _read_text(path: str) -> Tuple[str, str]:
    """(newline-normalised text, sha256 of the raw bytes); bad UTF-8 is a DataError naming the line."""
    try:
        with paths.open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise DataError(f"cannot read: {e.strerror or e}", path) from e
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise DataError(f"invalid UTF-8 at byte {e.start}; expected UTF-8 text", path, line) from e
    return text.replace("\r\n", "\n").replace("\r", "\n"), hashlib.sha256(raw).hexdigest()


def _vocab_entry(line: str, path: str, lineno: int) -> Optional[str]:
    """The token on one vocab line (`token` or `token<TAB>count`), or None for an entry that is only whitespace."""
    line = line.rstrip("\n")
    if "\t" in line:
        token, count = line.rsplit("\t", 1)
        count = count.strip()
        if not count.isdigit():
            raise DataError(f"expected `token` or `token<TAB>count` with a non-negative integer count, got "
                            f"count {count!r}", path, lineno)
    else:
        token = line
    token = token.strip()
    return token or None


def read_vocabulary(corpus_path: str, model_level: str) -> CalmVocabulary:
    """The vocabulary of a CALM corpus at `model_level` (see the module docstring for ids and file format)."""
    if model_level not in LEVELS:
        raise ValueError(f"model_level must be one of {LEVELS}, got {model_level!r}")
    vocab_dir = paths.join(corpus_path, "vocab")
    files = _files_in(vocab_dir, ".vocab")
    if not files:
        raise DataError("no vocabulary: expected one or more vocab/*.vocab files", vocab_dir)
    tokens = [UNK] + (list(CHAR_SPECIALS) if model_level == "char" else [EOL])
    seen = set(tokens)
    for path in files:
        try:
            with paths.open(path, encoding="utf-8") as f:
                for lineno, line in enumerate(f, 1):
                    token = _vocab_entry(line, path, lineno)
                    if token is not None and token not in seen:
                        seen.add(token)
                        tokens.append(token)
        except UnicodeDecodeError as e:
            raise DataError(f"invalid UTF-8: {e.reason}; expected UTF-8 text", path) from e
        except OSError as e:
            raise DataError(f"cannot read: {e.strerror or e}", path) from e
    return CalmVocabulary(tokens, model_level)


# --------------------------------------------------------------------------------------------------------------------
# The token cache.


def cache_paths(txt_path: str, level: str) -> Tuple[str, str]:
    """(array path, metadata path) of the token cache of one class file."""
    root, name = os.path.split(txt_path)
    stem = os.path.splitext(name)[0]
    base = os.path.join(root, CACHE_DIR, f"{stem}.{level}")
    return base + ".npy", base + ".json"


def _load_cache(npy_path: str, meta_path: str, source_sha: str, vocab: CalmVocabulary) -> Optional[np.ndarray]:
    try:
        with open(meta_path, encoding="utf-8") as f:
            meta = json.load(f)
        if (meta.get("format") != _CACHE_FORMAT or meta.get("level") != vocab.level
                or meta.get("source_sha256") != source_sha or meta.get("vocab_sha256") != vocab.sha256):
            return None
        ids = np.load(npy_path, allow_pickle=False)
        if ids.dtype != np.int32 or ids.ndim != 1 or ids.shape[0] != meta.get("tokens"):
            return None
        if hashlib.sha256(ids.tobytes()).hexdigest() != meta.get("array_sha256"):
            return None
        if ids.size and (ids.min() < 0 or ids.max() >= len(vocab)):
            return None
        return ids
    except (OSError, ValueError, TypeError, AttributeError):
        return None


def load_class_tokens(txt_path: str, vocab: CalmVocabulary, cache: bool = True) -> np.ndarray:
    """The int32 token ids of one class file, from the cache when it matches the text and vocabulary."""
    text, source_sha = _read_text(txt_path)
    npy_path, meta_path = cache_paths(txt_path, vocab.level)
    cache = cache and not paths.is_url(txt_path)  # a corpus in a bucket is tokenized afresh: no cache written there
    if cache:
        ids = _load_cache(npy_path, meta_path, source_sha, vocab)
        if ids is not None:
            return ids
    ids = vocab.encode(text)
    if cache:
        meta = {"format": _CACHE_FORMAT, "level": vocab.level, "source": os.path.basename(txt_path),
                "source_sha256": source_sha, "vocab_sha256": vocab.sha256, "tokens": int(ids.shape[0]),
                "array_sha256": hashlib.sha256(ids.tobytes()).hexdigest()}
        try:
            os.makedirs(os.path.dirname(npy_path), exist_ok=True)
            array = io.BytesIO()
            np.save(array, ids, allow_pickle=False)
            atomic_write(npy_path, array.getvalue())
            atomic_write(meta_path, json.dumps(meta, indent=1) + "\n")
        except OSError as e:
            console.warn(f"CALM: could not write the token cache for {txt_path} ({e}); continuing without it")
    return ids


def _files_in(folder: str, suffix: str) -> List[str]:
    """The files (not folders) directly in `folder` whose names end in `suffix`, sorted; none for no folder."""
    if not paths.isdir(folder):
        return []
    return [paths.join(folder, name) for name in paths.listdir(folder)
            if name.endswith(suffix) and paths.isfile(paths.join(folder, name))]


def class_files(corpus_path: str) -> List[str]:
    """The class files of a corpus, sorted by class name; a DataError when there are none."""
    if not paths.isdir(corpus_path):
        raise DataError("not a directory; expected a CALM corpus (<class>.txt files and vocab/)", corpus_path)
    files = sorted(_files_in(corpus_path, ".txt"), key=lambda p: os.path.splitext(paths.basename(p))[0])
    if not files:
        raise DataError("no class files: expected one <class>.txt per class", corpus_path)
    return files


# --------------------------------------------------------------------------------------------------------------------
# Corpus builders.


def _vocab_counts(text: str, level: str) -> List[Tuple[str, int]]:
    if level == "char":
        counts = collections.Counter(ch for ch in text if ch.strip())
    else:
        counts = collections.Counter(text.split())
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))


_CLASS_NAME = re.compile(r"^[^/\\\x00]+$")


def write_calm_corpus(texts: Mapping[str, str], out_dir: str, level: str, overwrite: bool = False
                      ) -> Dict[str, Dict[str, int]]:
    """Writes `texts` ({class name: text}) as a CALM corpus at `out_dir`: `<class>.txt` and `vocab/<class>.vocab`
    (token<TAB>count, most frequent first). Built in `<out_dir>.partial` and renamed, so nothing half-written stays;
    an existing `out_dir` is replaced only when it is empty or a CALM corpus, unless `overwrite`. Returns per-class
    counts."""
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
    if len(texts) < 1:
        raise ValueError("no classes to write")
    for name in texts:
        if not _CLASS_NAME.match(name) or name in (".", "..") or name.startswith("."):
            raise ValueError(f"class name {name!r} cannot be a file stem")
    vocab = CalmVocabulary([UNK] + (list(CHAR_SPECIALS) if level == "char" else [EOL]), level)

    def build(tmp: str) -> Dict[str, Dict[str, int]]:
        os.makedirs(os.path.join(tmp, "vocab"))
        stats: Dict[str, Dict[str, int]] = {}
        for name in sorted(texts):
            text = texts[name]
            with NamedWrites(os.path.join(tmp, f"{name}.txt"), "w", encoding="utf-8", newline="\n") as f:
                f.write(text)
            counts = _vocab_counts(text, level)
            with NamedWrites(os.path.join(tmp, "vocab", f"{name}.vocab"), "w", encoding="utf-8", newline="\n") as f:
                for token, count in counts:
                    f.write(f"{token}\t{count}\n")
            n_lines = text.count("\n") + (1 if text and not text.endswith("\n") else 0)
            stats[name] = {"lines": n_lines, "tokens": len(vocab.split(text)), "types": len(counts)}
        return stats

    return build_output_folder(out_dir, "CALM corpus", build, overwrite)


def build_calm_corpus_from_texts(src_dir: str, out_dir: str, level: str, overwrite: bool = False
                                 ) -> Dict[str, Dict[str, int]]:
    """A CALM corpus at `out_dir` from the `*.txt` files of `src_dir` (one class per file, class = file stem).

    The texts are copied newline-normalised; an empty (or whitespace-only) file is a DataError naming it. Returns
    {class: {"lines", "tokens", "types"}} (tokens at `level`, `<eol>` included at word level)."""
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
    if paths.absolute(src_dir) == paths.absolute(out_dir) or (
            not paths.is_url(src_dir) and os.path.realpath(src_dir) == os.path.realpath(out_dir)):
        raise ValueError("out_dir must differ from src_dir")
    texts: Dict[str, str] = {}
    for path in class_files(src_dir):
        text, _ = _read_text(path)
        if not text.strip():
            raise DataError("empty class file; expected text", path)
        texts[os.path.splitext(paths.basename(path))[0]] = text
    return write_calm_corpus(texts, out_dir, level, overwrite)


# The embedded world records the source of every sentence (mentions.jsonl): a relation id (FACT_TEMPLATES),
# "topic:<name>" (TOPICS), "burst" (BURST_TEMPLATES) or "rising" (RISING_TEMPLATES). Each source belongs to at most
# one domain.
WORLD_DOMAINS: Dict[str, Tuple[str, ...]] = {
    "sports": ("P54", "P286", "topic:sport"),
    "politics": ("P39", "P102", "P6"),
    "business": ("P108", "P488", "P127", "based_in", "topic:economy"),
    "education": ("P69",),
    "technology": ("topic:technology",),
    "weather": ("topic:weather",),
    "health": ("topic:health",),
}
# Left out by default: "burst" (storms, scandals, strikes, summits: no single domain), "rising" (passing mentions of
# any kind of name), "host_city" (games, cups, festivals, expos) and "located_in" (landmarks).


def world_sources() -> List[str]:
    """Every sentence source of the embedded world's news."""
    return list(FACT_TEMPLATES) + [f"topic:{topic}" for topic in TOPICS] + ["burst", "rising"]


def _world_lines(path: str, what: str):
    """(line number, object) of a JSON-lines file of the world; DataError naming the file and line otherwise."""
    try:
        f = paths.open(path, encoding="utf-8")
    except OSError as e:
        raise DataError(f"cannot read the world's {what}: {e.strerror or e}", path) from e
    with f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = loads_json(line)
            except json.JSONDecodeError as e:
                raise DataError(f"not JSON ({e.msg}); expected a {what} object", path, lineno) from None
            if not isinstance(row, dict):
                raise DataError(f"expected a {what} object", path, lineno)
            yield lineno, row


def build_calm_corpus_from_world(world_dir: str, out_dir: str, level: str = "word",
                                 domains: Optional[Mapping[str, Sequence[str]]] = None, overwrite: bool = False
                                 ) -> Dict[str, Any]:
    """A CALM corpus with one class per news domain of the embedded world at `world_dir`.

    Each sentence of news.jsonl has its span and source in mentions.jsonl (written beside it by the world's
    generator); it goes to the domain of its source in `domains` (default `WORLD_DOMAINS`); sentences of other
    sources are left out. A domain file holds its sentences one per line, in document order. Domains without
    sentences are not written. Returns {"classes": {domain: {"lines", "tokens", "types"}}, "sentences": n,
    "left_out": {source: n}}.
    """
    domains = WORLD_DOMAINS if domains is None else domains
    domain_of: Dict[str, str] = {}
    for domain, sources in domains.items():
        for source in sources:
            if source in domain_of and domain_of[source] != domain:
                raise ValueError(f"source {source!r} is in two domains: {domain_of[source]!r} and {domain!r}")
            domain_of[source] = domain
    unknown = sorted(set(domain_of) - set(world_sources()))
    if unknown:
        raise ValueError(f"unknown sentence source(s) {unknown}; known: {sorted(world_sources())}")
    news_path = paths.join(world_dir, "news.jsonl")
    mentions_path = paths.join(world_dir, "mentions.jsonl")
    lines: Dict[str, List[str]] = collections.defaultdict(list)
    left_out: Dict[str, int] = collections.Counter()
    total = 0
    mentions = _world_lines(mentions_path, "mentions")
    for lineno, doc in _world_lines(news_path, "document"):
        if not isinstance(doc.get("text"), str):
            raise DataError("expected an object with a string field `text`", news_path, lineno)
        mention_line, mention = next(mentions, (None, None))
        if mention is None or mention.get("id") != doc.get("id"):
            raise DataError(f"document {doc.get('id')!r} has no sentences in {mentions_path} at the same place "
                            f"(the two files are written together by `templm data world`)", news_path, lineno)
        sentences = mention.get("sentences")
        if not isinstance(sentences, list):
            raise DataError("no `sentences` list: a world drawn by an older templm; draw it again with "
                            "`templm data world`", mentions_path, mention_line)
        for start, end, source in sentences:
            sentence = " ".join(doc["text"][start:end].split())
            total += 1
            domain = domain_of.get(source)
            if domain is None:
                left_out[source] += 1
            else:
                lines[domain].append(sentence)
    if not lines:
        raise DataError("no sentence of the world's news falls in any domain", news_path)
    texts = {domain: "\n".join(ls) + "\n" for domain, ls in lines.items()}
    classes = write_calm_corpus(texts, out_dir, level, overwrite)
    return {"classes": classes, "sentences": total, "left_out": dict(sorted(left_out.items()))}


def world_domains(names: Optional[Sequence[str]] = None) -> Dict[str, Tuple[str, ...]]:
    """The `WORLD_DOMAINS` entries named in `names` (all when None); an unknown name is a ValueError."""
    if names is None:
        return dict(WORLD_DOMAINS)
    unknown = [n for n in names if n not in WORLD_DOMAINS]
    if unknown:
        raise ValueError(f"unknown world domain(s) {unknown}; known: {sorted(WORLD_DOMAINS)}")
    if len(set(names)) < 2:
        raise ValueError(f"CALM needs at least two classes, got domains {list(names)}")
    return {n: WORLD_DOMAINS[n] for n in names}


def build_world_corpus(world_dir: str, out_dir: str, level: str = "word", domains: Optional[Sequence[str]] = None,
                       world: Any = None, overwrite: bool = False) -> Dict[str, Any]:
    """A CALM corpus at `out_dir` from the embedded world at `world_dir`, one class per domain.

    When `world_dir` does not exist the world is generated there first from `world` (a `WorldConfig`; default
    `WorldConfig()`); an existing folder is never written to and must hold news.jsonl. Returns the corpus builder's
    stats plus "world_generated" (bool)."""
    generated = False
    if not paths.exists(world_dir):
        config = WorldConfig() if world is None else world
        if not isinstance(config, WorldConfig):
            raise ValueError(f"world must be a WorldConfig, got {type(config).__name__}")
        console.say(f"CALM: generating the embedded world into {world_dir}")
        logging.info("CALM: world config %s", config)
        generate_world(config, world_dir)
        generated = True
    elif not paths.isfile(paths.join(world_dir, "news.jsonl")):
        raise DataError("exists but holds no news.jsonl; expected a world folder (`templm data world`), or a path "
                        "that does not exist yet (the world is then generated there)", world_dir)
    stats = build_calm_corpus_from_world(world_dir, out_dir, level, world_domains(domains), overwrite)
    if len(stats["classes"]) < 2:
        raise DataError(f"the world's news fill only {sorted(stats['classes'])}; CALM needs two or more classes",
                        world_dir)
    return {**stats, "world_generated": generated}


def check_corpus(corpus_dir: str) -> List[str]:
    """Checks the CALM layout beyond what the iterator needs; returns the class names.

    When the vocab files are per class (some `vocab/<stem>.vocab` is named after a class, as both builders write
    them), every class must have its own: a missing one would silently turn that class into `<unk>`s."""
    names = [os.path.splitext(paths.basename(p))[0] for p in class_files(corpus_dir)]
    vocab_dir = paths.join(corpus_dir, "vocab")
    stems = {os.path.splitext(f)[0] for f in paths.listdir(vocab_dir) if f.endswith(".vocab")} \
        if paths.isdir(vocab_dir) else set()
    if not stems:
        raise DataError("no vocabulary: expected one or more vocab/*.vocab files", vocab_dir)
    if stems & set(names):
        missing = [n for n in names if n not in stems]
        if missing:
            raise DataError(f"class {missing[0]!r} ({missing[0]}.txt) has no vocabulary file; expected "
                            f"vocab/{missing[0]}.vocab beside the other classes' "
                            f"({', '.join(sorted(stems & set(names)))})",
                            paths.join(vocab_dir, f"{missing[0]}.vocab"))
    return names
