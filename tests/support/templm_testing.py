"""Helpers shared by several test modules (the test modules cannot import each other; tests/conftest.py puts this
folder on the import path)."""

import itertools
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_templm(*args, cwd=REPO, env=None, timeout=900):
    """`python -m templm.cli ARGS` in `cwd` (the repository by default): the CompletedProcess, output as text."""
    return subprocess.run([sys.executable, "-m", "templm.cli", *args], capture_output=True, text=True, cwd=cwd,
                          env=None if env is None else {**os.environ, **env}, timeout=timeout)


def write_texts(folder, texts):
    """One `<name>.txt` per entry of `texts` in `folder` (a CALM corpus source); returns the folder."""
    os.makedirs(folder, exist_ok=True)
    for name, text in texts.items():
        with open(os.path.join(folder, f"{name}.txt"), "w", encoding="utf-8") as f:
            f.write(text)
    return str(folder)


def farm_and_market():
    """Two small classes of text for CALM tests."""
    animals = itertools.cycle(["cat", "dog", "cow", "hen"])
    return {"farm": "".join(f"the {next(animals)} sat on the mat.\n" for _ in range(120)),
            "market": "".join(f"stocks rose {i % 7} points and bonds fell.\n" for i in range(60))}


def with_sentinels(model_path, out_path, count=100):
    """A copy of a SentencePiece model that holds `count` sentinel pieces, laid out as T5's public
    cc_all.32000.100extra model (appended, <extra_id_0> last)."""
    from sentencepiece import sentencepiece_model_pb2

    model = sentencepiece_model_pb2.ModelProto()
    with open(model_path, "rb") as f:
        model.ParseFromString(f.read())
    base = len(model.pieces)
    for i in reversed(range(count)):
        model.pieces.add(piece=f"\u2581<extra_id_{i}>", score=0.0,
                         type=sentencepiece_model_pb2.ModelProto.SentencePiece.USER_DEFINED)
    with open(out_path, "wb") as f:
        f.write(model.SerializeToString())
    return base
