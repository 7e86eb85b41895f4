"""Labels for the text of a test stream: an LDA topic per document and a part of speech per word.

The streaming analyses (templm.metrics.stream) group perplexity by these labels. Both come from heavy optional
libraries, imported only when a label is asked for: scikit-learn for the topics, spaCy (and an English model) for the
parts of speech; without spaCy `pos_tags` says why instead of failing.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np

from templm.data.token_stream import TokenStream


def assign_topics(texts: Sequence[str], n_topics: int = 10, seed: int = 0, max_features: int = 5000,
                  n_top_words: int = 8, max_iter: int = 50) -> Tuple[np.ndarray, List[List[str]]]:
    """LDA topics (scikit-learn LatentDirichletAllocation, batch variational Bayes for `max_iter` passes, over
    CountVectorizer counts of at most `max_features` words, English stop words removed): (argmax topic of each
    document [D], the `n_top_words` heaviest words of each topic)."""
    # scikit-learn: a heavy dependency, loaded only when topics are asked for.
    from sklearn.decomposition import LatentDirichletAllocation
    from sklearn.feature_extraction.text import CountVectorizer

    vectorizer = CountVectorizer(stop_words="english", max_features=max_features)
    try:
        counts = vectorizer.fit_transform(texts)
    except ValueError:  # no word survives (empty or stop-word-only documents)
        return np.zeros(len(texts), np.int64), [[] for _ in range(n_topics)]
    lda = LatentDirichletAllocation(n_components=n_topics, random_state=seed, learning_method="batch",
                                    max_iter=max_iter)
    doc_topic = lda.fit_transform(counts)
    vocab = vectorizer.get_feature_names_out()
    top = [[str(vocab[j]) for j in np.argsort(-row)[:n_top_words]] for row in lda.components_]
    return np.argmax(doc_topic, axis=1).astype(np.int64), top


def pos_tags(stream: TokenStream, model_name: str = "en_core_web_sm") -> Tuple[Optional[List[str]], Optional[str]]:
    """Universal POS tag of every word (EOS words: "EOS") with spaCy on the Moses words, or (None, reason) when
    spaCy or its English model is not installed."""
    try:  # spaCy: optional and heavy, loaded only when parts of speech are asked for
        import spacy
        from spacy.tokens import Doc
    except ImportError:
        return None, "spaCy is not installed"
    try:
        nlp = spacy.load(model_name, disable=["parser", "ner", "lemmatizer"])
    except (OSError, ImportError) as e:
        return None, f"spaCy model {model_name!r} is not available: {e}"
    tags = ["EOS"] * stream.n_words
    bounds = np.flatnonzero(np.diff(np.concatenate([[-1], stream.word_doc, [-1]])))
    for a, b in zip(bounds[:-1], bounds[1:]):
        idx = [k for k in range(a, b) if not stream.word_is_eos[k]]
        if not idx:
            continue
        doc = Doc(nlp.vocab, words=[stream.word_text[k] for k in idx])
        for _, proc in nlp.pipeline:
            doc = proc(doc)
        for k, token in zip(idx, doc):
            tags[k] = token.pos_ or "X"
    return tags, None
