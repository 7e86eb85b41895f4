"""templm.data.vocab: a small SentencePiece model trained once on a synthetic corpus, used through seqio."""

import json
import os
import random

import pytest
import sentencepiece
from sentencepiece import sentencepiece_model_pb2

from templm.data import DataError, read_documents
from templm.data.vocab import (load_vocabulary, sample_sentences, sentinels_in, split_sentences_for_spm,
                               task_extra_ids, train_spm)
from templm_testing import run_templm, with_sentinels

VOCAB_SIZE = 300
EXTRA_IDS = 100
N_DOCS = 200  # two lines of two sentences each: 800 training sentences


def _corpus(path, n_docs=N_DOCS, seed=7):
    """Writes a JSONL corpus of made-up words; returns the list of its sentences in order."""
    rng = random.Random(seed)
    lexicon = ["".join(rng.choice("abcdefghijklmnoprstuvwy") for _ in range(rng.randint(3, 8))) for _ in range(300)]
    names = [w.capitalize() for w in lexicon[:40]]
    sentences = []
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n_docs):
            lines = []
            for _ in range(2):
                words = " ".join(rng.choice(lexicon) for _ in range(6))
                first = f"{rng.choice(names)} {words} in {rng.randint(1990, 2020)}."
                second = f"It was {rng.choice(lexicon)}!"
                sentences += [first, second]
                lines.append(f"{first} {second}")
            f.write(json.dumps({"id": f"d{i}", "date": f"{2000 + i % 20}-01-01", "text": "\n".join(lines)}) + "\n")
    return sentences


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("vocab")
    corpus = str(root / "corpus.jsonl")
    sentences = _corpus(corpus)
    model_path = train_spm(read_documents(corpus), str(root / "out" / "spm"), vocab_size=VOCAB_SIZE, seed=0)
    return corpus, sentences, model_path


@pytest.fixture(scope="module")
def vocab(trained):
    return load_vocabulary(trained[2], extra_ids=EXTRA_IDS)


def _proto(path):
    model = sentencepiece_model_pb2.ModelProto()
    with open(path, "rb") as f:
        model.ParseFromString(f.read())
    return model


def test_writes_model_and_vocab_and_nothing_else(trained):
    _, _, model_path = trained
    out_dir = os.path.dirname(model_path)
    assert model_path == os.path.join(out_dir, "spm.model")
    assert sorted(os.listdir(out_dir)) == ["spm.model", "spm.vocab"]  # no temporary files left
    with open(os.path.join(out_dir, "spm.vocab"), encoding="utf-8") as f:
        pieces = [line.split("\t")[0] for line in f]
    assert pieces[:3] == ["<pad>", "</s>", "<unk>"] and len(pieces) == VOCAB_SIZE
    assert not any("extra_id" in p for p in pieces)  # sentinels are seqio's, not trained symbols


def test_t5_ids(vocab):
    assert (vocab.pad_id, vocab.eos_id, vocab.unk_id) == (0, 1, 2)
    assert vocab.bos_id == -1
    assert [vocab.tokenizer.id_to_piece(i) for i in range(3)] == ["<pad>", "</s>", "<unk>"]


def test_vocab_size_counts_extra_ids(vocab):
    assert vocab.vocab_size == VOCAB_SIZE + EXTRA_IDS


def test_round_trip(trained, vocab):
    _, sentences, _ = trained
    words = " ".join(sentences[:40]).replace(".", "").replace("!", "").split()
    unseen = " ".join(random.Random(0).sample(words, 8)) + " in 2011. It was!"  # new text, known characters
    assert unseen not in " ".join(sentences)
    for text in sentences[:5] + sentences[-3:] + [unseen, " ".join(sentences[10:14])]:
        ids = vocab.encode(text)
        assert ids and all(3 <= i < VOCAB_SIZE for i in ids), text  # no pad/eos/unk, no sentinel
        assert vocab.decode(ids) == text
    # A character never seen in training is unk; decoding renders it as " \u2047 ".
    ids = vocab.encode("It was \u00e9!")
    assert 2 in ids and vocab.decode(ids) == "It was  \u2047 !"
    # Decoding stops at the first eos.
    ids = vocab.encode(sentences[0])
    assert vocab.decode(ids + [1] + vocab.encode(sentences[1])) == sentences[0]


def test_sentinels_count_down_from_the_end(vocab):
    # seqio numbers sentinels in reverse: <extra_id_0> is the last id, <extra_id_99> the first after the trained ones.
    last = VOCAB_SIZE + EXTRA_IDS - 1
    assert vocab.encode("<extra_id_0>") == [last]
    assert vocab.encode("<extra_id_1>") == [last - 1]
    assert vocab.encode(f"<extra_id_{EXTRA_IDS - 1}>") == [VOCAB_SIZE]
    assert vocab.decode([last]) == "<extra_id_0>"
    text = "Kalo visited <extra_id_0> in 2011."
    ids = vocab.encode(text)
    assert last in ids
    assert vocab.decode(ids) == text


def test_a_file_that_holds_its_sentinels_takes_no_extra_ids(trained, tmp_path):
    """T5's public vocabulary holds its 100 sentinels; loading it with 100 more would define each twice."""
    plain = trained[2]
    t5_style = str(tmp_path / "with_sentinels.model")
    assert with_sentinels(plain, t5_style, count=100) == VOCAB_SIZE
    assert (sentinels_in(plain), sentinels_in(t5_style)) == (0, 100)
    assert (task_extra_ids(plain), task_extra_ids(t5_style)) == (100, 0)
    assert (task_extra_ids(plain, 0), task_extra_ids(plain, 7), task_extra_ids(t5_style, 0)) == (0, 7, 0)
    with pytest.raises(DataError, match="already holds 100 <extra_id_N> sentinel pieces") as e:
        task_extra_ids(t5_style, 100)
    assert t5_style in str(e.value)
    with pytest.raises(DataError, match="extra_ids must be >= 0"):
        task_extra_ids(plain, -1)
    with pytest.raises(DataError, match="no such SentencePiece model file"):
        sentinels_in(str(tmp_path / "missing.model"))
    same = load_vocabulary(t5_style, extra_ids=0)  # the ids match a plain file loaded with 100 extra ids
    assert same.vocab_size == VOCAB_SIZE + 100
    assert same.encode("<extra_id_0>") == [VOCAB_SIZE + 99] and same.encode("<extra_id_99>") == [VOCAB_SIZE]


def test_max_sentences_limits_training_lines(trained, tmp_path):
    corpus, sentences, model_path = trained
    assert _proto(model_path).trainer_spec.input_sentence_size == len(sentences) == 4 * N_DOCS
    small = train_spm(read_documents(corpus), str(tmp_path / "small"), vocab_size=100, max_sentences=120, seed=3)
    assert _proto(small).trainer_spec.input_sentence_size == 120

    sample, seen = sample_sentences(read_documents(corpus), 120, seed=3)
    assert seen == len(sentences) and len(sample) == 120
    assert set(sample) <= set(sentences)
    assert sample == sample_sentences(read_documents(corpus), 120, seed=3)[0]
    assert sample != sample_sentences(read_documents(corpus), 120, seed=4)[0]
    # A later half of the corpus is drawn from too: this is a sample, not the first 120 lines.
    assert set(sample) & set(sentences[len(sentences) // 2:])
    everything, _ = sample_sentences(read_documents(corpus), 10_000, seed=3)
    assert everything == sentences


def test_same_seed_same_bytes(trained, tmp_path):
    corpus, _, model_path = trained
    again = train_spm(read_documents(corpus), str(tmp_path / "again" / "spm"), vocab_size=VOCAB_SIZE, seed=0)
    with open(model_path, "rb") as a, open(again, "rb") as b:
        assert a.read() == b.read()
    sub1 = train_spm(read_documents(corpus), str(tmp_path / "s1"), vocab_size=100, max_sentences=120, seed=5)
    sub2 = train_spm(read_documents(corpus), str(tmp_path / "s2"), vocab_size=100, max_sentences=120, seed=5)
    with open(sub1, "rb") as a, open(sub2, "rb") as b:
        assert a.read() == b.read()


def test_the_model_and_vocab_are_sentencepieces_own_from_a_file_of_the_sample(trained, tmp_path):
    """templm trains from the sample in memory and writes the files itself (a full disk is then an error it sees);
    the bytes are those SentencePiece writes when it trains from a file of the same sample (its recorded input path
    cleared), and the .vocab is its own, line for line."""
    corpus, _, model_path = trained
    sample, _ = sample_sentences(read_documents(corpus), 1_000_000, 0)
    text = tmp_path / "sample.txt"
    text.write_text("".join(s + "\n" for s in sample), encoding="utf-8")
    sentencepiece.set_random_generator_seed(0)
    sentencepiece.SentencePieceTrainer.train(
        input=str(text), model_prefix=str(tmp_path / "own"), vocab_size=VOCAB_SIZE, model_type="unigram",
        character_coverage=1.0, pad_id=0, eos_id=1, unk_id=2, bos_id=-1, input_sentence_size=len(sample),
        shuffle_input_sentence=False, num_threads=1, minloglevel=2, hard_vocab_limit=True)
    own = _proto(tmp_path / "own.model")
    del own.trainer_spec.input[:]
    own.trainer_spec.model_prefix = ""
    with open(model_path, "rb") as f:
        assert f.read() == own.SerializeToString(deterministic=True)
    with open(model_path[:-len(".model")] + ".vocab", "rb") as a, open(tmp_path / "own.vocab", "rb") as b:
        assert a.read() == b.read()


def test_a_folder_with_a_comma_in_its_path_gets_the_same_model(trained, tmp_path):
    """SentencePiece splits its path options at commas (`runs/a,b/v` failed with NOT_FOUND "runs/a"): the model for
    such a folder is the same bytes as anywhere else, with nothing but the two files left there; so from the command
    line."""
    corpus, _, model_path = trained
    comma = train_spm(read_documents(corpus), str(tmp_path / "runs" / "a,b" / "spm"), vocab_size=VOCAB_SIZE, seed=0)
    with open(model_path, "rb") as a, open(comma, "rb") as b:
        assert a.read() == b.read()
    assert sorted(os.listdir(tmp_path / "runs" / "a,b")) == ["spm.model", "spm.vocab"]
    result = run_templm("data", "spm", f"--corpus={corpus}", f"--out={tmp_path / 'x,y' / 'v'}", "--vocab_size=120")
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout)["model"] == str(tmp_path / "x,y" / "v.model")


def test_split_sentences_for_spm():
    text = 'He said "no." Then it rained!\n\n  Second line?  yes \nno end'
    assert split_sentences_for_spm(text) == ['He said "no."', "Then it rained!", "Second line?", "yes", "no end"]


def test_no_text_is_a_data_error_naming_the_file(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    out = tmp_path / "out"
    with pytest.raises(DataError, match="no text") as info:
        train_spm(read_documents(str(empty), format="jsonl"), str(out / "spm"))
    assert str(empty) in str(info.value)
    assert not out.exists() or not os.listdir(out)


def test_vocab_size_too_large_is_a_value_error(trained, tmp_path):
    corpus, _, _ = trained
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=r"vocab_size=50000 is too large for this text: 800 sentence\(s\) support at"):
        train_spm(read_documents(corpus), str(out / "spm"), vocab_size=50000)
    assert os.listdir(out) == []  # nothing half-written
    with pytest.raises(ValueError, match="vocab_size=20 is too small"):
        train_spm(read_documents(corpus), str(out / "spm"), vocab_size=20)
    assert os.listdir(out) == []


def test_bad_arguments(trained, tmp_path):
    corpus, _, _ = trained
    with pytest.raises(ValueError, match="model_type"):
        train_spm(read_documents(corpus), str(tmp_path / "m"), model_type="wordpiece")
    with pytest.raises(ValueError, match="max_sentences"):
        train_spm(read_documents(corpus), str(tmp_path / "m"), max_sentences=0)


def test_missing_and_corrupt_models_are_data_errors(trained, tmp_path):
    _, _, model_path = trained
    with open(model_path, "rb") as f:
        data = f.read()
    missing = tmp_path / "missing.model"
    garbage = tmp_path / "garbage.model"
    garbage.write_bytes(b"\x00\x01not a model\xff" * 20)
    truncated = tmp_path / "truncated.model"
    truncated.write_bytes(data[: len(data) // 2])
    empty = tmp_path / "empty.model"
    empty.write_bytes(b"")
    with pytest.raises(DataError, match="no such SentencePiece model file") as info:
        load_vocabulary(str(missing))
    assert info.value.path == str(missing)
    for path in (garbage, truncated, empty):
        with pytest.raises(DataError, match="not a SentencePiece model") as info:
            load_vocabulary(str(path))
        assert info.value.path == str(path) and str(path) in str(info.value)


def test_non_t5_ids_are_rejected(trained, tmp_path):
    corpus, sentences, _ = trained
    text = tmp_path / "sentences.txt"
    text.write_text("\n".join(sentences) + "\n", encoding="utf-8")
    sentencepiece.SentencePieceTrainer.train(input=str(text), model_prefix=str(tmp_path / "default"), vocab_size=100,
                                             num_threads=1, minloglevel=2)  # sentencepiece's ids: unk=0, bos=1, eos=2
    with pytest.raises(DataError, match="expected pad id 0 and eos id 1"):
        load_vocabulary(str(tmp_path / "default.model"))


def test_retraining_in_place_is_seen_by_load_vocabulary(trained, tmp_path):
    corpus, _, _ = trained
    prefix = str(tmp_path / "spm")
    path = train_spm(read_documents(corpus), prefix, vocab_size=VOCAB_SIZE)
    assert load_vocabulary(path).vocab_size == VOCAB_SIZE + EXTRA_IDS
    # seqio caches models by path; a model retrained at the same path must not be served from that cache.
    assert train_spm(read_documents(corpus), prefix, vocab_size=100) == path
    assert load_vocabulary(path).vocab_size == 100 + EXTRA_IDS


@pytest.mark.parametrize("max_sentences", [1, 7, 300, 1000, 5000])
def test_the_reservoir_s_lines_follow_from_their_count_alone(max_sentences):
    """A pipeline draws the vocabulary's sample by counting the lines first (templm.data.task_data_beam): the lines
    `sample_sentences` keeps, and their order, are those `reservoir_lines` names from the count and the seed."""
    import datetime

    from templm.data.records import Document
    from templm.data.vocab import reservoir_lines, sample_sentences, split_sentences_for_spm

    docs = [Document(str(i), datetime.date(2014, 1, 1), f"Line {i} here. And {i} again! Third {i}?")
            for i in range(400)]
    lines = [line for doc in docs for line in split_sentences_for_spm(doc.text)]
    for seed in (0, 5):
        sample, seen = sample_sentences(iter(docs), max_sentences, seed)
        assert seen == len(lines) == 1200
        assert sample == [lines[n] for n in reservoir_lines(seen, max_sentences, seed)]
