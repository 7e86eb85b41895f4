"""SentencePiece vocabularies: train one on a corpus split (T5-compatible ids), load one as a seqio vocabulary.

T5 conventions: pad=0, eos=1, unk=2, no bos. The 100 sentinels `<extra_id_0>`.. are not trained: seqio's
`SentencePieceVocabulary(extra_ids=100)` appends them after the trained pieces, `<extra_id_0>` taking the last id.
Some published files hold the sentinels already (T5's cc_all.32000.100extra): those load with extra_ids=0
(`sentinels_in`, `task_extra_ids`).
"""

from __future__ import annotations

import io
import logging
import os
import random
import re
import sys
from typing import TYPE_CHECKING, Iterable, List, Optional, Tuple

import sentencepiece
from sentencepiece import sentencepiece_model_pb2

from templm import paths
from templm.data.records import Document
from templm.errors import DataError
from templm.io import atomic_write_files

if TYPE_CHECKING:
    import seqio

MODEL_TYPES = ("unigram", "bpe", "char", "word")
PAD_ID, EOS_ID, UNK_ID = 0, 1, 2

# A sentence ends at . ! or ? (optionally closed by a quote or bracket) followed by whitespace.
_SENTENCE_END = re.compile(r"(?:(?<=[.!?])|(?<=[.!?][\"')\]]))\s+")


def split_sentences_for_spm(text: str) -> List[str]:
    """Training lines of a document: its lines, each cut after sentence-final punctuation; blank pieces dropped.

    Only an approximation of sentence boundaries (abbreviations are cut too); it keeps lines short enough for the
    trainer (which skips lines over 4192 bytes) and costs nothing in quality for a subword vocabulary.
    """
    out = []
    for line in text.splitlines():
        for piece in _SENTENCE_END.split(line):
            piece = piece.strip()
            if piece:
                out.append(piece)
    return out


def sample_sentences(documents: Iterable[Document], max_sentences: int, seed: int = 0) -> Tuple[List[str], int]:
    """A uniform sample of at most `max_sentences` training lines, streamed (reservoir sampling, `random.Random(seed)`).

    Returns (sample, total number of lines seen). Same documents and seed give the same sample. Which lines it holds
    depends on their number alone (`reservoir_lines`), so a pipeline that counts the lines first draws the same.
    """
    if max_sentences < 1:
        raise ValueError(f"max_sentences must be >= 1, got {max_sentences}")
    rng = random.Random(seed)
    reservoir: List[str] = []
    seen = 0
    for doc in documents:
        for sentence in split_sentences_for_spm(doc.text):
            seen += 1
            if len(reservoir) < max_sentences:
                reservoir.append(sentence)
            else:
                j = rng.randrange(seen)
                if j < max_sentences:
                    reservoir[j] = sentence
    return reservoir, seen


def reservoir_lines(seen: int, max_sentences: int, seed: int = 0) -> List[int]:
    """The numbers (from 0) of the lines `sample_sentences` holds after `seen` lines, in its sample's order: its
    generator's draws do not depend on the lines, so they are made here from the count alone."""
    if max_sentences < 1:
        raise ValueError(f"max_sentences must be >= 1, got {max_sentences}")
    rng = random.Random(seed)
    slots = list(range(min(seen, max_sentences)))
    for number in range(max_sentences, seen):
        j = rng.randrange(number + 1)
        if j < max_sentences:
            slots[j] = number
    return slots


def train_spm(documents: Iterable[Document], model_prefix: str, vocab_size: int = 32000,
              max_sentences: int = 1_000_000, seed: int = 0, model_type: str = "unigram",
              character_coverage: float = 1.0, exact_size: bool = True,
              sample: Optional[Tuple[List[str], int]] = None) -> str:
    """Trains a SentencePiece model on (a sample of) `documents`; returns the path of `model_prefix + ".model"`.

    Writes `<model_prefix>.model` and `<model_prefix>.vocab`, both renamed into place from temporary files once both
    are complete. Ids follow T5: pad=0, eos=1, unk=2, no bos; `vocab_size` counts them and excludes
    the sentinels seqio adds. The same documents, settings and seed give a byte-identical `.model`: the trainer runs on
    one thread with a fixed seed, on the sample in memory (the model records no path). The model's
    `trainer_spec.input_sentence_size` holds the number of lines it was trained on.

    With `exact_size=False`, `vocab_size` is an upper bound: a text too small to support that many pieces gets as
    many as it supports (SentencePiece's soft limit; where the text supports `vocab_size`, the model is the same
    either way). Use it where the text is drawn at random (the embedded world of any seed) and the vocabulary only
    has to fit.

    `sample`: (lines, lines seen) drawn already as `sample_sentences` draws them from `documents` (a pipeline's,
    `task_data_beam`); `documents` is then not read.

    Raises DataError (naming the corpus file when `documents` is a reader) when there is no text, and ValueError when
    `vocab_size` is too large (with exact_size) or too small for the text.
    """
    if model_type not in MODEL_TYPES:
        raise ValueError(f"model_type must be one of {MODEL_TYPES}, got {model_type!r}")
    if not isinstance(vocab_size, int) or vocab_size < 4:
        raise ValueError(f"vocab_size must be an integer >= 4 (pad, eos, unk and one piece), got {vocab_size!r}")
    if not 0.0 < character_coverage <= 1.0:
        raise ValueError(f"character_coverage must be in (0, 1], got {character_coverage}")
    model_prefix = os.fspath(model_prefix)
    if not paths.basename(model_prefix) or model_prefix.endswith(("/", os.sep)):  # `DIR/` would write the hidden DIR/.model and DIR/.vocab
        raise ValueError(f"the model prefix {model_prefix!r} names a folder, not a file prefix: give one such as "
                         f"{os.path.join(model_prefix, 'spm')!r} (it writes spm.model and spm.vocab there)")
    source = getattr(documents, "path", None)
    sentences, seen = sample if sample is not None else sample_sentences(documents, max_sentences, seed)
    n_sentences = len(sentences)
    if not sentences:
        raise DataError("no text to train a SentencePiece vocabulary on (no non-blank lines in any document)", source)
    logging.info("spm: training a %d-piece %s vocabulary on %d of %d sentences", vocab_size, model_type,
                 n_sentences, seen)

    paths.makedirs(paths.dirname(paths.absolute(model_prefix)))
    # The trainer reads the sample from memory and hands the model back: it is given no path at all (its options are
    # comma-separated, so a path with a comma broke it), and templm writes every output file itself.
    sentencepiece.set_random_generator_seed(seed)
    model_bytes = io.BytesIO()
    try:
        sentencepiece.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences), model_writer=model_bytes, vocab_size=vocab_size,
            model_type=model_type, character_coverage=character_coverage, pad_id=PAD_ID, eos_id=EOS_ID,
            unk_id=UNK_ID, bos_id=-1,
            # The trainer refuses a sampling size of 100 or fewer lines; 0 (no sampling) reads every line, as the
            # sample has been drawn already.
            input_sentence_size=n_sentences if n_sentences > 100 else 0, shuffle_input_sentence=False,
            num_threads=1, minloglevel=1, hard_vocab_limit=exact_size)
    except RuntimeError as e:
        raise _training_error(str(e), vocab_size, n_sentences, source) from None
    del sentences
    model = sentencepiece_model_pb2.ModelProto()
    model.ParseFromString(model_bytes.getvalue())
    model.trainer_spec.input_sentence_size = n_sentences
    model.trainer_spec.model_prefix = ""  # set, though empty: the same bytes as the models templm wrote from files
    # The .vocab as SentencePiece writes it: each piece and its score (C++ stream formatting, as %g).
    vocab = "".join(f"{piece.piece}\t{piece.score:g}\n" for piece in model.pieces)
    # Both written beside their places, then both renamed: a failure leaves the earlier pair as it was.
    atomic_write_files({model_prefix + ".vocab": vocab.encode("utf-8"),
                        model_prefix + ".model": model.SerializeToString(deterministic=True)})
    _forget_cached_models()
    return model_prefix + ".model"


def _training_error(message: str, vocab_size: int, n_sentences: int, source) -> ValueError:
    reason = message.strip().splitlines()[-1] if message.strip() else "unknown error"
    match = re.search(r"Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+)", message)
    if match:
        return ValueError(
            f"vocab_size={vocab_size} is too large for this text: {n_sentences} sentence(s) support at most "
            f"{match.group(2)} pieces; lower vocab_size or train on more text"
            + (f" (corpus {source})" if source else ""))
    match = re.search(r"smaller than required_chars\. (\d+) vs (\d+)", message)
    if match:
        return ValueError(
            f"vocab_size={vocab_size} is too small for this text: its characters (at character_coverage) and the "
            f"pad/eos/unk pieces need at least {match.group(2)}; raise vocab_size or lower character_coverage")
    return ValueError(f"SentencePiece could not train a {vocab_size}-piece vocabulary: {reason}")


def _forget_cached_models() -> None:
    """seqio caches loaded models by path: drop them so a model rewritten in place is reloaded."""
    vocabularies = sys.modules.get("seqio.vocabularies")
    cached = getattr(vocabularies, "_load_model_internal", None)
    if cached is not None and hasattr(cached, "cache_clear"):
        cached.cache_clear()


_SENTINEL_PIECE = re.compile(r"^\u2581?<extra_id_\d+>$")
DEFAULT_EXTRA_IDS = 100


def _read_model(model_path: str) -> sentencepiece_model_pb2.ModelProto:
    """The SentencePiece model proto at `model_path` (any tf.io.gfile path); DataError naming it when it is missing,
    unreadable or not a model proto."""
    import tensorflow as tf
    from google.protobuf.message import DecodeError

    if not tf.io.gfile.exists(model_path):
        raise DataError("no such SentencePiece model file", model_path)
    try:
        with tf.io.gfile.GFile(model_path, "rb") as f:
            data = f.read()
    except tf.errors.OpError as e:
        raise DataError(f"cannot read SentencePiece model: {e.message}", model_path) from None
    model = sentencepiece_model_pb2.ModelProto()
    try:
        model.ParseFromString(data)
    except DecodeError as e:
        raise DataError(f"not a SentencePiece model (corrupt or truncated): {e}", model_path) from None
    return model


def sentinels_in(model_path: str) -> int:
    """How many `<extra_id_N>` pieces the SentencePiece model file at `model_path` (any tf.io.gfile path) holds."""
    model = _read_model(os.fspath(model_path))
    return sum(1 for piece in model.pieces if _SENTINEL_PIECE.match(piece.piece))


def task_extra_ids(model_path: str, extra_ids: "int | None" = None) -> int:
    """The extra ids a T5 vocabulary over `model_path` needs: 100 sentinels appended by seqio, or none where the file
    holds its own (as T5's public cc_all.32000.100extra model; T5X's model configs load it with extra_ids=0).

    An explicit `extra_ids` is checked: adding sentinels to a file that has them would define each twice."""
    have = sentinels_in(model_path)
    if extra_ids is None:
        return 0 if have else DEFAULT_EXTRA_IDS
    if extra_ids and have:
        raise DataError(f"this SentencePiece model already holds {have} <extra_id_N> sentinel pieces, so it takes "
                        f"extra_ids=0, not {extra_ids} (leave extra_ids unset to detect it)", model_path)
    if extra_ids < 0:
        raise DataError(f"extra_ids must be >= 0, got {extra_ids}", model_path)
    return int(extra_ids)


def load_vocabulary(model_path: str, extra_ids: int = 100) -> "seqio.SentencePieceVocabulary":
    """A seqio SentencePieceVocabulary over `model_path` with `extra_ids` sentinels, loaded and checked now.

    `model_path` may be any path tf.io.gfile reads (local or gs://). Raises DataError naming the path when the file
    is missing, is not a SentencePiece model (garbage, truncated), or does not use T5's pad=0 and eos=1.
    """
    import seqio  # here, not at module level: tensorflow takes seconds to import and training does not need it
    import tensorflow as tf
    from google.protobuf.message import DecodeError

    model_path = os.fspath(model_path)
    model = _read_model(model_path)
    if not model.pieces or not model.HasField("trainer_spec") or not model.HasField("normalizer_spec"):
        raise DataError("not a SentencePiece model (corrupt or truncated): missing pieces, trainer or normalizer spec",
                        model_path)
    vocabulary = seqio.SentencePieceVocabulary(model_path, extra_ids=extra_ids)
    try:
        vocabulary.load_model()
    except (RuntimeError, OSError, ValueError, DecodeError, tf.errors.OpError) as e:
        raise DataError(f"not a valid SentencePiece model: {e}", model_path) from None
    pad_id, eos_id = vocabulary.tokenizer.pad_id(), vocabulary.tokenizer.eos_id()
    if (pad_id, eos_id) != (PAD_ID, EOS_ID):
        raise DataError(f"not a T5 vocabulary: expected pad id {PAD_ID} and eos id {EOS_ID}, the model has pad id "
                        f"{pad_id} and eos id {eos_id} (train one with templm.data.vocab.train_spm)", model_path)
    return vocabulary
