"""Labels of a stream's text: LDA topics group documents by their words; POS tags, skipped cleanly without spaCy."""

import random

from templm.data.stream_annotations import assign_topics, pos_tags
from templm.data.token_stream import EOS_WORD, TokenStream


def test_topics_group_documents():
    rng = random.Random(0)
    fruit = "apple banana orange fruit juice pear mango lemon".split()
    sport = "goal match football league referee striker keeper penalty".split()
    texts = [" ".join(rng.choice(fruit if d % 2 == 0 else sport) for _ in range(30)) for d in range(6)]
    doc_topic, top_words = assign_topics(texts, n_topics=2, seed=0, n_top_words=4)
    assert len(set(doc_topic[[0, 2, 4]])) == 1 and len(set(doc_topic[[1, 3, 5]])) == 1
    assert doc_topic[0] != doc_topic[1]
    assert set(top_words[doc_topic[0]]) <= set(fruit) and set(top_words[doc_topic[1]]) <= set(sport)


def test_pos_is_skipped_cleanly_without_spacy():
    words = ["The", "cat", "sat", EOS_WORD]
    stream = TokenStream(tokens=[1, 10, 11, 12, 1], token_doc=[0] * 4, token_word=[0, 1, 2, 3], word_text=words,
                         word_doc=[0] * 4, word_is_eos=[False, False, False, True], doc_ids=["d0"],
                         doc_months=["2020-01"])
    tags, reason = pos_tags(stream)
    if tags is None:
        assert "spaCy" in reason
    else:
        assert len(tags) == stream.n_words and tags[-1] == "EOS"
