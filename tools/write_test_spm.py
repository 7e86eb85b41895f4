"""Writes the suite's checked-in SentencePiece model, tests/fixtures/stream64.model (and its .vocab): 64 pieces
trained by templm.data.vocab.train_spm on 60 seeded documents of a made-up 60-word lexicon (the one
tests/support/templm_testing.py's `stream_lexicon` draws). The suite loads it instead of training one per session,
as seqio's test_utils ship theirs. The same bytes on every run (checked: two runs, one MD5).

    python tools/write_test_spm.py
"""

import datetime
import os
import random
import shutil
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "support"))

from templm_testing import stream_lexicon  # noqa: E402

from templm.data.records import Document  # noqa: E402
from templm.data.vocab import train_spm  # noqa: E402


def main() -> None:
    lexicon, rng = stream_lexicon()
    docs = [Document(f"t{i}", datetime.date(2019, 1 + i % 12, 1),
                     " ".join(rng.choice(lexicon) for _ in range(12)) + ". Café, naïve!") for i in range(60)]
    with tempfile.TemporaryDirectory() as folder:
        path = train_spm(docs, os.path.join(folder, "stream64"), vocab_size=64, seed=0)
        for suffix in (".model", ".vocab"):
            shutil.copyfile(path[:-len(".model")] + suffix, os.path.join(ROOT, "tests", "fixtures",
                                                                         "stream64" + suffix))
    print(os.path.join(ROOT, "tests", "fixtures", "stream64.model"))


if __name__ == "__main__":
    main()
