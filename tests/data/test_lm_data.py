"""The training data of a language model (templm/data/lm_data.py): tokenised documents with EOS, the batchify layout,
epochs in date order or reshuffled."""

import dataclasses

import numpy as np

from templm.data.lm_data import LMData, tokenize_documents
from templm.data.records import Document


def test_batchify_layout_epochs_and_shuffle():
    docs = [np.arange(10 * d + 3, 10 * d + 3 + n, dtype=np.int32) for d, n in enumerate([5, 3, 7, 4, 6])]
    tokens = np.concatenate([np.append(d, 1) for d in docs]).astype(np.int32)
    offsets = np.concatenate([[0], np.cumsum([len(d) + 1 for d in docs])])
    data = LMData(tokens, offsets, eos_id=1, batch_size=2, seg_len=3)
    stream = np.concatenate([[1], tokens])  # 31 tokens: rows of 15, 4 segments of 3 (+1 target) per row
    assert data.row_len == 15 and data.segments_per_epoch == 4
    for k in range(4):
        b = data.batch(k)
        for row in range(2):
            start = row * 15 + 3 * k
            np.testing.assert_array_equal(b["inputs"][row], stream[start:start + 3])
            np.testing.assert_array_equal(b["targets"][row], stream[start + 1:start + 4])
        assert (b["reset"] == int(k == 0)).all()
    np.testing.assert_array_equal(data.batch(5)["inputs"], data.batch(1)["inputs"])  # date order: every epoch alike
    np.testing.assert_array_equal(data.batch(4, rows=slice(1, 2))["inputs"], data.batch(0)["inputs"][1:])

    shuffled = dataclasses.replace(data, order="shuffle", seed=5)
    epochs = [shuffled.epoch_stream(e) for e in range(3)]
    assert all(sorted(e.tolist()) == sorted(stream.tolist()) for e in epochs)  # the same tokens, documents intact
    assert len({tuple(e) for e in epochs}) > 1  # reshuffled per epoch
    np.testing.assert_array_equal(shuffled.epoch_stream(2), dataclasses.replace(data, order="shuffle",
                                                                                seed=5).epoch_stream(2))
    order = shuffled.document_order(1)
    np.testing.assert_array_equal(epochs[1], np.concatenate([[1]] + [tokens[offsets[d]:offsets[d + 1]]
                                                                      for d in order]))


def test_tokenize_documents_appends_eos():
    class Pieces:
        def eos_id(self):
            return 1

        def encode(self, texts):
            return [[ord(c) for c in t] for t in texts]

    docs = [Document("a", None, "hi"), Document("b", None, ""), Document("c", None, "xyz")]
    tokens, offsets = tokenize_documents(docs, Pieces())
    assert tokens.tolist() == [104, 105, 1, 1, 120, 121, 122, 1] and offsets.tolist() == [0, 3, 4, 8]
