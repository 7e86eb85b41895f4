"""Salient spans for salient-span masking (SSM): sentences, dates and named entities, and the examples made of them.

Sentence splitting is a documented rule set (no model to download): a sentence ends at `.`, `!` or `?` (optionally
followed by a closing quote or bracket) followed by whitespace and an upper-case letter, a digit or an opening
quote, unless the word before the period is a known abbreviation (Mr., Dr., Inc., U.S., ...) or a single capital
initial. Newlines always end a sentence.

Salient spans are dates (found by regular expressions: "12 March 2014", "March 12, 2014", "March 2014", ISO dates,
and years 1900-2099 after a word that puts them in date context, e.g. "in 2014") and named entities. Entities come
from a pluggable detector: `BuiltinEntityDetector` (capitalised multi-word spans, no download) by default, or
`SpacyEntityDetector(pipeline)` when a spaCy pipeline is installed.
"""

from __future__ import annotations

import dataclasses
import random
import re
from typing import Iterable, Iterator, List, Optional, Sequence, Tuple

SENTINEL = "<extra_id_0>"

_ABBREVIATIONS = {
    "mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "mt", "gen", "gov", "sen", "rep", "lt", "col", "capt", "sgt",
    "inc", "ltd", "co", "corp", "jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec",
    "vs", "etc", "e.g", "i.e", "u.s", "u.k", "u.n", "e.u", "a.m", "p.m", "approx", "dept", "est", "fig",
}
_SENTENCE_END = re.compile(r"[.!?][\"'\u201d)\]]*\s+(?=[\"'\u201c(\[]?[A-Z0-9])")


def split_sentences(text: str) -> List[Tuple[int, int]]:
    """Character spans (start, end) of the sentences of `text`, whitespace trimmed."""
    spans: List[Tuple[int, int]] = []
    for line in re.finditer(r"[^\n]+", text):
        start = line.start()
        for match in _SENTENCE_END.finditer(line.group()):
            stop = line.start() + match.start()  # the . ! or ?
            words = text[start:stop].split()
            word = words[-1].lower().lstrip("(\"'\u201c[") if words else ""
            follows = line.group()[match.end():match.end() + 1]
            if text[stop] == "." and (word in _ABBREVIATIONS or re.fullmatch(r"(?:[a-z]\.)*[a-z]", word)
                                      or (word == "no" and follows.isdigit())):
                continue
            spans.append((start, line.start() + match.start() + len(match.group().rstrip())))
            start = line.start() + match.end()
        spans.append((start, line.end()))
    trimmed = []
    for s, e in spans:
        piece = text[s:e]
        left, right = len(piece) - len(piece.lstrip()), len(piece.rstrip())
        if right > left:
            trimmed.append((s + left, s + right))
    return trimmed


_MONTHS = ("January|February|March|April|May|June|July|August|September|October|November|December|"
           "Jan\\.?|Feb\\.?|Mar\\.?|Apr\\.?|Jun\\.?|Jul\\.?|Aug\\.?|Sept?\\.?|Oct\\.?|Nov\\.?|Dec\\.?")
_YEAR = r"(?:19|20)\d{2}"
_DATE_PATTERNS = [
    re.compile(rf"\b\d{{1,2}} (?:{_MONTHS}) {_YEAR}\b"),  # 12 March 2014
    re.compile(rf"\b(?:{_MONTHS}) \d{{1,2}}, {_YEAR}\b"),  # March 12, 2014
    re.compile(rf"\b(?:{_MONTHS}) {_YEAR}\b"),  # March 2014
    re.compile(rf"\b{_YEAR}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12]\d|3[01])\b"),  # 2014-03-12
]
_YEAR_CONTEXT = re.compile(
    rf"\b(?:(?:[Ii]n|[Ss]ince|[Uu]ntil|[Bb]y|[Ff]rom|[Dd]uring|[Bb]efore|[Aa]fter|[Ee]arly|[Ll]ate|[Mm]id|"
    rf"[Tt]hrough|[Tt]ill|[Tt]he year|[Ss]eason)\s+|[Mm]id-)({_YEAR})\b")


def find_dates(text: str) -> List[Tuple[int, int]]:
    """Date spans, longest first where patterns overlap."""
    found: List[Tuple[int, int]] = []
    for pattern in _DATE_PATTERNS:
        found.extend(m.span() for m in pattern.finditer(text))
    found.extend(m.span(1) for m in _YEAR_CONTEXT.finditer(text))
    return _drop_overlaps(found)


def _drop_overlaps(spans: Iterable[Tuple[int, int]]) -> List[Tuple[int, int]]:
    """Keeps the longest of overlapping spans (earliest on ties); returns them in text order."""
    kept: List[Tuple[int, int]] = []
    for s, e in sorted(set(spans), key=lambda x: (-(x[1] - x[0]), x[0])):
        if all(e <= ks or s >= ke for ks, ke in kept):
            kept.append((s, e))
    return sorted(kept)


# Words that are capitalised because they start a sentence or a title, not because they name something.
_FUNCTION_WORDS = {
    "a", "an", "the", "on", "in", "at", "as", "by", "for", "from", "of", "to", "with", "under", "after", "before",
    "during", "since", "until", "when", "while", "if", "but", "and", "or", "so", "yet", "this", "that", "these",
    "those", "it", "its", "he", "she", "they", "we", "i", "you", "his", "her", "their", "our", "my", "there", "here",
    "what", "who", "which", "where", "why", "how", "all", "some", "many", "most", "more", "no", "not",
    "monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday",
    "january", "february", "march", "april", "may", "june", "july", "august", "september", "october", "november",
    "december", "mr", "mrs", "ms", "dr",
}
_CONNECTORS = {"of", "de", "la", "von", "van", "der", "for", "the", "du", "del", "da"}
_TOKEN = re.compile(r"(?:[A-Z]\.){2,}|[A-Za-z0-9][\w'\u2019\-.&]*\w|[A-Za-z0-9]")


@dataclasses.dataclass
class BuiltinEntityDetector:
    """Capitalised multi-word spans ("University of Rufimok", "Zazefos United"), with lower-case connectors inside.

    Rules: a run of capitalised tokens, joined by connectors (of, de, and, ...) when a capitalised token follows;
    leading function words (The, On, As, ...) and months/weekdays are dropped; a capitalised word that only starts
    the sentence is kept only when another capitalised word follows it directly, or when the same word occurs
    capitalised in mid-sentence elsewhere in the text.
    """

    min_length: int = 2
    known_names: frozenset = frozenset()  # words seen capitalised in mid-sentence across a corpus (see `fit`)

    def fit(self, texts: Iterable[str]) -> "BuiltinEntityDetector":
        """Learns which words a corpus capitalises in mid-sentence, so a sentence-initial "University of X" is
        recognised as a name while "Supporters of X" is not."""
        known = set()
        for text in texts:
            for s, e in split_sentences(text):
                for i, m in enumerate(_TOKEN.finditer(text[s:e])):
                    if i > 0 and m.group()[0].isupper():
                        known.add(m.group())
        return dataclasses.replace(self, known_names=frozenset(known))

    def __call__(self, text: str, sentences: Optional[Sequence[Tuple[int, int]]] = None) -> List[Tuple[int, int]]:
        sentences = sentences if sentences is not None else split_sentences(text)
        mid_sentence_caps = set(self.known_names)
        tokens_by_sentence = []
        for s, e in sentences:
            tokens = [(m.start() + s, m.end() + s, m.group()) for m in _TOKEN.finditer(text[s:e])]
            tokens_by_sentence.append(tokens)
            for i, (_, _, tok) in enumerate(tokens):
                if i > 0 and tok[0].isupper():
                    mid_sentence_caps.add(tok)
        spans = []
        for tokens in tokens_by_sentence:
            spans.extend(self._runs(tokens, mid_sentence_caps))
        return spans

    def _runs(self, tokens, mid_sentence_caps) -> Iterator[Tuple[int, int]]:
        i, n = 0, len(tokens)
        while i < n:
            if not self._capital(tokens[i][2]) or tokens[i][2].lower() in _FUNCTION_WORDS:
                i += 1  # "The", "On", "As", months and weekdays open no name
                continue
            j = i + 1  # tokens[i:j] is the run
            segment = 1  # capitalised tokens since the last connector
            while j < n:
                if self._capital(tokens[j][2]) and tokens[j][0] - tokens[j - 1][1] <= 1:
                    j += 1
                    segment += 1
                elif (segment == 1 and tokens[j][2] in _CONNECTORS and j + 1 < n and self._capital(tokens[j + 1][2])
                      and tokens[j + 1][0] - tokens[j][1] <= 1 and tokens[j][0] - tokens[j - 1][1] <= 1):
                    # "University of X", "Minister of Finance of X", but not "Ann Lee of Acme Labs".
                    j += 2
                    segment = 1
                else:
                    break
            run = list(range(i, j))
            # Drop a sentence-initial word that is not otherwise known as a name ("Supporters of X").
            if run and run[0] == 0 and tokens[0][2] not in mid_sentence_caps:
                follower = run[1] if len(run) > 1 else None
                if follower is None or tokens[follower][2] in _CONNECTORS:
                    run = run[1:]
                    while run and tokens[run[0]][2] in _CONNECTORS:
                        run = run[1:]
            if run and tokens[run[-1]][1] - tokens[run[0]][0] >= self.min_length:
                yield tokens[run[0]][0], tokens[run[-1]][1]
            i = j

    @staticmethod
    def _capital(token: str) -> bool:
        return token[0].isupper()


class SpacyEntityDetector:
    """Named entities from an installed spaCy pipeline (e.g. "en_core_web_sm"); dates are left to the regexes."""

    LABELS = ("PERSON", "ORG", "GPE", "LOC", "NORP", "FAC", "EVENT", "WORK_OF_ART", "LAW", "PRODUCT")

    def __init__(self, pipeline: str):
        try:
            import spacy  # optional: only when configured
        except ImportError:
            raise ValueError(f"entity detector {pipeline!r} needs spaCy: pip install spacy and the pipeline") from None
        try:
            self.nlp = spacy.load(pipeline, disable=["lemmatizer"])
        except OSError as e:
            raise ValueError(f"spaCy pipeline {pipeline!r} is not installed: {e}") from None

    def __call__(self, text: str, sentences=None) -> List[Tuple[int, int]]:
        return [(ent.start_char, ent.end_char) for ent in self.nlp(text).ents if ent.label_ in self.LABELS]


def make_entity_detector(name: str = "builtin"):
    """"builtin" or the name of an installed spaCy pipeline."""
    return BuiltinEntityDetector() if name == "builtin" else SpacyEntityDetector(name)


def salient_spans(text: str, detector=None, sentences=None) -> List[Tuple[int, int]]:
    """Dates and entities of `text` as character spans, overlaps resolved in favour of the longer span."""
    detector = detector or BuiltinEntityDetector()
    sentences = sentences if sentences is not None else split_sentences(text)
    return _drop_overlaps(find_dates(text) + detector(text, sentences))


@dataclasses.dataclass(frozen=True)
class SsmExample:
    """One salient-span-masking example: `inputs` holds SENTINEL where `targets` was."""

    inputs: str
    targets: str
    start: int  # of the span within the document
    end: int


def ssm_examples(text: str, detector=None, one_per_sentence: bool = False,
                 rng: Optional[random.Random] = None) -> List[SsmExample]:
    """An example per salient span, or (one_per_sentence) one span drawn per sentence with `rng`."""
    sentences = split_sentences(text)
    spans = salient_spans(text, detector, sentences)
    rng = rng or random.Random(0)
    examples = []
    for s, e in sentences:
        inside = [(a, b) for a, b in spans if s <= a and b <= e]
        if one_per_sentence and inside:
            inside = [rng.choice(inside)]
        for a, b in inside:
            examples.append(SsmExample(text[s:a] + SENTINEL + text[b:e], text[a:b], a, b))
    return examples


def cloze_to_ssm(query: str) -> str:
    """A TempLAMA query in SSM form: `_X_` becomes the first sentinel."""
    if "_X_" not in query:
        raise ValueError(f"query has no _X_: {query!r}")
    return query.replace("_X_", SENTINEL, 1)
