"""The corpus clean-up "Mind the Gap" applies before splitting: non-English documents and near-duplicates out.

`DocumentFilter` looks at each document once, in the corpus's order, and says why it drops it, if it does:

* "other_language": langid.py (Lui and Baldwin's off-line language identifier, 97 languages) names another language
  than `language` for the document's first `language_chars` characters. Shorter documents than `min_language_chars`
  are kept unchecked (identification on a few words is noise) and counted.
* "near_duplicate": the Jaccard similarity of its word `shingle_words`-grams with a document kept earlier reaches
  `near_duplicate_threshold`: datasketch's MinHash LSH (`num_perm` permutations, seeded) proposes the candidates and
  their MinHash estimate of the similarity decides. The first of a group is kept, so in a corpus in date order the
  earliest copy stays and later copies go, wherever the cut-off falls between them. Memory: each kept document's
  signature (4 bytes a permutation) and its LSH band keys.

Its `stats()` go to stats.json, so a split records what was removed and with which settings.
"""

from __future__ import annotations

import array
import collections
import dataclasses
import hashlib
import os
import re
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from templm import paths
from templm.data.records import Document
from templm.io import atomic_write
from templm.settings import Settings

REASONS = ("other_language", "near_duplicate")
_WORD = re.compile(r"\w+", re.UNICODE)
_IDENTIFIER: Dict[str, Any] = {}

# The languages langid's model tells apart (its nb_classes): a FilterConfig checks its language against them without
# unpacking the model (about a second), which the defaults built when templm is imported would otherwise pay in every
# process. tests/data/test_filters.py compares them with the model's.
LANGID_LANGUAGES = frozenset(
    "af am an ar as az be bg bn br bs ca cs cy da de dz el en eo es et eu fa fi fo fr ga gl gu he hi hr ht hu hy id is "
    "it ja jv ka kk km kn ko ku ky la lb lo lt lv mg mk ml mn mr ms mt nb ne nl nn no oc or pa pl ps pt qu ro ru rw se "
    "si sk sl sq sr sv sw ta te th tl tr ug uk ur vi vo wa xh zh zu".split())


@dataclasses.dataclass(frozen=True)
class FilterConfig:
    """What `DocumentFilter` removes. `language` None: no language check; `near_duplicate_threshold` None: no
    near-duplicate check."""

    language: Optional[str] = "en"
    min_language_chars: int = 200
    language_chars: int = 2000
    near_duplicate_threshold: Optional[float] = 0.8
    shingle_words: int = 5
    num_perm: int = 128
    seed: int = 1

    def __post_init__(self):
        if self.language is not None and self.language not in LANGID_LANGUAGES:
            raise ValueError(f"language must be one of langid's ISO 639-1 codes ({', '.join(sorted(LANGID_LANGUAGES))})"
                             f", got {self.language!r}")
        threshold = self.near_duplicate_threshold
        if threshold is not None and not (isinstance(threshold, (int, float)) and 0.0 < threshold < 1.0):
            raise ValueError(f"near_duplicate_threshold must be in (0, 1) (MinHash LSH cannot band for 1) or None, "
                             f"got {threshold!r}")
        for name in ("min_language_chars", "language_chars", "shingle_words", "num_perm"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < (0 if name == "min_language_chars"
                                                                                  else 1):
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)!r}")

    @property
    def active(self) -> bool:
        return self.language is not None or self.near_duplicate_threshold is not None


def _identifier():
    """langid's identifier with normalised probabilities, loaded once a process (`_langid_model`)."""
    if "langid" not in _IDENTIFIER:
        from langid import langid

        _IDENTIFIER["langid"] = langid.LanguageIdentifier(*_langid_model(langid.model), norm_probs=True)
    return _IDENTIFIER["langid"]


def _langid_model(modelstring: bytes) -> tuple:
    """The arguments of langid's LanguageIdentifier for its model string. Unpacking the string (a bz2-compressed
    pickle of Python lists) takes 1-3 s, paid by every process that filters a corpus (each Beam worker's too: a
    minute of the test suite); its arrays are kept in templm's cache as an .npz named after the string's digest,
    written whole, and read back in milliseconds. A cache that cannot be read or written is unpacked again, and one
    in a bucket is not used (a download for every process)."""
    digest = hashlib.sha256(modelstring if isinstance(modelstring, bytes) else modelstring.encode()).hexdigest()[:16]
    cache = Settings.from_environment().cache_dir
    path = None if paths.is_url(cache) else os.path.join(cache, f"langid-{digest}.npz")
    if path is not None:
        try:
            with np.load(path, allow_pickle=False) as z:
                outputs = np.split(z["tk_output_values"], np.cumsum(z["tk_output_lengths"])[:-1])
                return (z["nb_ptc"], z["nb_pc"], int(z["nb_numfeats"]), z["nb_classes"].tolist(),
                        array.array(str(z["tk_nextmove_type"]), z["tk_nextmove"].tobytes()),
                        {int(k): tuple(v.tolist()) for k, v in zip(z["tk_output_keys"], outputs)})
        except (OSError, ValueError, KeyError):
            pass
    from langid import langid

    model = langid.LanguageIdentifier.from_modelstring(modelstring)
    if path is not None:
        keys = sorted(model.tk_output)
        arrays = {"nb_ptc": model.nb_ptc, "nb_pc": model.nb_pc, "nb_numfeats": np.int64(model.nb_numfeats),
                  "nb_classes": np.array(model.nb_classes),
                  "tk_nextmove": np.frombuffer(model.tk_nextmove.tobytes(), np.uint8),
                  "tk_nextmove_type": np.array(model.tk_nextmove.typecode),
                  "tk_output_keys": np.array(keys, np.int64),
                  "tk_output_lengths": np.array([len(model.tk_output[k]) for k in keys], np.int64),
                  "tk_output_values": np.array([f for k in keys for f in model.tk_output[k]], np.int64)}

        def write(tmp):
            with open(tmp, "wb") as f:
                np.savez(f, **arrays)

        try:
            os.makedirs(cache, exist_ok=True)
            atomic_write(path, write)
        except OSError:
            pass
    return (model.nb_ptc, model.nb_pc, model.nb_numfeats, model.nb_classes, model.tk_nextmove, model.tk_output)


def language_of(text: str) -> str:
    """langid's language of `text`: its classify's argmax, with the naive-Bayes dot product over the features the
    text has (a few hundred of langid's 7,480) instead of all of them, ten times faster; the same scores, summed in
    another order (tests/data/test_filters.py compares the two)."""
    identifier = _identifier()
    features = identifier.instance2fv(text)
    present = np.flatnonzero(features)
    scores = features[present].astype(np.float64) @ identifier.nb_ptc[present] + identifier.nb_pc
    return str(identifier.nb_classes[int(np.argmax(scores))])


def shingles(text: str, n: int) -> set:
    """The word n-grams of a text (lower-cased \\w+ words), as bytes; a text of fewer words is one shingle."""
    words = _WORD.findall(text.lower())
    if len(words) <= n:
        return {" ".join(words).encode("utf-8")}
    return {" ".join(words[i:i + n]).encode("utf-8") for i in range(len(words) - n + 1)}


def language_check(config: FilterConfig, text: str) -> Tuple[str, Optional[str]]:
    """The language check of one document's text: ("unchecked", None) for a text too short to identify (or no
    check), else ("kept" or "other_language", the language langid names)."""
    if config.language is None or len(text) < config.min_language_chars:
        return "unchecked", None
    language = language_of(text[:config.language_chars])
    return ("kept" if language == config.language else "other_language"), language


class Signer:
    """A text's MinHash signature (`num_perm` uint32 values) with the config's seeded permutations, drawn once
    (MinHash draws them anew for each signature otherwise), and the LSH bands (`bands`: [start, end) ranges of the
    signature) datasketch's MinHashLSH uses for the threshold: two signatures are candidates when a band is equal."""

    def __init__(self, config: FilterConfig):
        from datasketch import MinHash, MinHashLSH

        self.config = config
        first = MinHash(num_perm=config.num_perm, seed=config.seed)
        self._permutations, self._scheme = first.permutations, first.scheme
        self.lsh = MinHashLSH(threshold=float(config.near_duplicate_threshold), num_perm=config.num_perm)
        self.bands = list(self.lsh.hashranges)

    def minhash(self, text: str):
        from datasketch import MinHash

        c = self.config
        signature = MinHash(num_perm=c.num_perm, seed=c.seed, permutations=self._permutations, scheme=self._scheme)
        signature.update_batch(sorted(shingles(text, c.shingle_words)))
        return signature

    def __call__(self, text: str) -> np.ndarray:
        return self.minhash(text).hashvalues.astype(np.uint32)


def similarity(a: np.ndarray, b: np.ndarray) -> float:
    """MinHash's estimate of two documents' Jaccard similarity: the share of equal signature values."""
    return float(np.mean(a == b))


def filter_stats(config: FilterConfig, other_language: int, languages_removed: collections.Counter,
                 language_unchecked: int, near_duplicates: int, kept: int) -> Dict[str, Any]:
    """What stats.json's "cleaned" says: the settings and what the clean-up removed."""
    c = config
    return {"language": c.language, "min_language_chars": c.min_language_chars,
            "language_chars": c.language_chars, "near_duplicate_threshold": c.near_duplicate_threshold,
            "shingle_words": c.shingle_words, "num_perm": c.num_perm, "seed": c.seed,
            "other_language_removed": other_language,
            "languages_removed": dict(languages_removed.most_common()),
            "language_unchecked_short": language_unchecked,
            "near_duplicates_removed": near_duplicates, "kept": kept}


class DocumentFilter:
    """Decides, document by document in the corpus's order, which to drop (module docstring)."""

    def __init__(self, config: FilterConfig = FilterConfig()):
        self.config = config
        self.removed = {reason: 0 for reason in REASONS}
        self.languages_removed: collections.Counter = collections.Counter()
        self.language_unchecked = 0
        self._kept = 0
        self._signatures: List[np.ndarray] = []
        self._signer = Signer(config) if config.near_duplicate_threshold is not None else None

    def reason(self, doc: Document) -> Optional[str]:
        """None to keep `doc` (and remember it for the near-duplicate check), else why it is dropped."""
        c = self.config
        if c.language is not None:
            verdict, language = language_check(c, doc.text)
            if verdict == "unchecked":
                self.language_unchecked += 1
            elif verdict == "other_language":
                self.removed["other_language"] += 1
                self.languages_removed[language] += 1
                return "other_language"
        if self._signer is not None:
            signature = self._signer.minhash(doc.text)
            values = signature.hashvalues.astype(np.uint32)
            lsh = self._signer.lsh
            if max((similarity(self._signatures[k], values) for k in lsh.query(signature)), default=0.0) >= \
                    c.near_duplicate_threshold:
                self.removed["near_duplicate"] += 1
                return "near_duplicate"
            lsh.insert(len(self._signatures), signature, check_duplication=False)
            self._signatures.append(values)
        self._kept += 1
        return None

    def stats(self) -> Dict[str, Any]:
        return filter_stats(self.config, self.removed["other_language"], self.languages_removed,
                            self.language_unchecked, self.removed["near_duplicate"], self._kept)
