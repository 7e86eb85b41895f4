"""The CALM corpus: vocabulary ids and file format, the token cache, the corpus builders (from texts, from the
embedded world), the corpus check, and `templm data calm` end to end."""

import collections
import json
import os

import numpy as np
import pytest

from templm.data.calm_corpus import (EOL, UNK, UNK_ID, WORLD_DOMAINS, build_calm_corpus_from_texts,
                                     build_calm_corpus_from_world, cache_paths, check_corpus, read_vocabulary,
                                     world_domains, world_sources)
from templm.data.calm_stream import CALM
from templm.data.world import WorldConfig, generate_world
from templm.errors import DataError
from templm_testing import farm_and_market, run_templm as templm, write_texts



# --------------------------------------------------------------------------------------------------------------------
# Vocabulary, tokenisation and the cache.


def test_vocabulary_ids_and_formats(tmp_path):
    root = tmp_path / "c"
    (root / "vocab").mkdir(parents=True)
    (root / "x.txt").write_text("ab a\r\nzz\n")
    (root / "vocab" / "a.vocab").write_text("a\t3\nb\n\n")
    (root / "vocab" / "b.vocab").write_text("b\t1\nab\t2\n")
    word = read_vocabulary(str(root), "word")
    assert word.tokens == (UNK, EOL, "a", "b", "ab") and UNK_ID == 0
    assert [word[i] for i in word.encode("ab a\r\nzz\n".replace("\r\n", "\n"))] == ["ab", "a", EOL, UNK, EOL]
    assert word.encode("a b\nab").tolist() == word.encode("a b\nab\n").tolist() == [2, 3, 1, 4, 1]
    char = read_vocabulary(str(root), "char")
    assert char.tokens == (UNK, " ", "\t", "\n", "a", "b", "ab")
    (root / "vocab" / "c.vocab").write_text("q\t7\nr\tmany\n")
    with pytest.raises(DataError) as e:
        read_vocabulary(str(root), "word")
    assert e.value.path.endswith("c.vocab") and e.value.line == 2


def _mtime(path):
    return os.stat(path).st_mtime_ns


def test_cache_is_reused_and_invalidated(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "left.txt").write_text("the cat sat on the mat\n" * 40)
    (src / "right.txt").write_text("a dog ran in a park\n" * 40)
    root = tmp_path / "corpus"
    build_calm_corpus_from_texts(str(src), str(root), "word")
    first = CALM(str(root), "word", 60, 3, 5, 2, seed=0)
    npy, meta = cache_paths(str(root / "left.txt"), "word")
    assert os.path.isfile(npy) and os.path.isfile(meta)
    assert not [f for f in os.listdir(root / ".cache") if f.endswith(".tmp")]
    stamp = _mtime(npy)
    again = CALM(str(root), "word", 60, 3, 5, 2, seed=0)
    assert _mtime(npy) == stamp  # a hit: not rewritten
    np.testing.assert_array_equal(again.class_stream(0), first.class_stream(0))
    # The text changes: the cache is rebuilt and the stream follows the new text.
    (root / "left.txt").write_text("the cat sat on the mat\n" * 40 + "the end\n")
    changed = CALM(str(root), "word", 60, 3, 5, 2, seed=0)
    assert json.loads(open(meta).read())["tokens"] == 40 * 7 + 3
    assert changed.class_stream(0).shape == (2, (40 * 7 + 3) // 2)
    # The vocabulary changes (a new word gets an id): rebuilt, "end" is no longer <unk>.
    assert UNK_ID in changed.class_stream(0)
    with open(root / "vocab" / "left.vocab", "a") as f:
        f.write("end\t1\n")
    grown = CALM(str(root), "word", 60, 3, 5, 2, seed=0)
    assert UNK_ID not in grown.class_stream(0)
    # A corrupt cache is rebuilt, not trusted.
    with open(npy, "wb") as f:
        f.write(b"garbage")
    repaired = CALM(str(root), "word", 60, 3, 5, 2, seed=0)
    np.testing.assert_array_equal(repaired.class_stream(0), grown.class_stream(0))
    assert np.load(npy).shape == (40 * 7 + 3,)


# --------------------------------------------------------------------------------------------------------------------
# Corpus builders.


def test_build_from_texts(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "en.txt").write_text("the cat\nthe hat\n", encoding="utf-8")
    (src / "fr.txt").write_text("le chat\r\nle chapeau é\n", encoding="utf-8")
    out = tmp_path / "out"
    stats = build_calm_corpus_from_texts(str(src), str(out), "char")
    assert sorted(os.listdir(out)) == [".templm.json", "en.txt", "fr.txt", "vocab"]
    assert (out / "fr.txt").read_text(encoding="utf-8") == "le chat\nle chapeau é\n"
    lines = (out / "vocab" / "en.vocab").read_text(encoding="utf-8").splitlines()
    assert lines[:2] == ["t\t4", "h\t3"] and "a\t2" in lines and not any(l.startswith(" ") for l in lines)
    assert stats["en"] == {"lines": 2, "tokens": 16, "types": 5}
    vocab = read_vocabulary(str(out), "char")
    assert vocab.tokens[:4] == (UNK, " ", "\t", "\n") and "é" in vocab
    # Word level, rebuilt in place of the char corpus.
    build_calm_corpus_from_texts(str(src), str(out), "word")
    assert (out / "vocab" / "en.vocab").read_text().splitlines() == ["the\t2", "cat\t1", "hat\t1"]
    assert read_vocabulary(str(out), "word").tokens[:2] == (UNK, EOL)
    (tmp_path / "keep").mkdir()
    (tmp_path / "keep" / "notes.md").write_text("mine")
    with pytest.raises(DataError, match=r"not a templm output, not a CALM corpus \(notes.md\)"):
        build_calm_corpus_from_texts(str(src), str(tmp_path / "keep"), "word")
    assert (tmp_path / "keep" / "notes.md").read_text() == "mine"
    (src / "empty.txt").write_text("\n\n")
    with pytest.raises(DataError, match="empty.txt"):
        build_calm_corpus_from_texts(str(src), str(tmp_path / "out2"), "word")
    assert not os.path.exists(tmp_path / "out2") and not os.path.exists(tmp_path / "out2.partial")


def test_build_from_a_tiny_world(tmp_path):
    world = str(tmp_path / "world")
    generate_world(WorldConfig(seed=1, start_year=2012, end_year=2013, subjects_per_relation=6, docs_per_month=3),
                   world)
    out = str(tmp_path / "corpus")
    stats = build_calm_corpus_from_world(world, out, "word")
    assert set(stats["classes"]) == set(WORLD_DOMAINS)
    assert set(stats["left_out"]) <= {"burst", "host_city", "located_in"}
    kept = sum(c["lines"] for c in stats["classes"].values())
    assert kept + sum(stats["left_out"].values()) == stats["sentences"]
    # Each domain file holds exactly the sentences the generator wrote from that domain's sources, in order.
    expected = collections.defaultdict(list)
    with open(os.path.join(world, "news.jsonl")) as news, open(os.path.join(world, "mentions.jsonl")) as mentions:
        for doc_line, mention_line in zip(news, mentions):
            text = json.loads(doc_line)["text"]
            for start, end, source in json.loads(mention_line)["sentences"]:
                domain = [d for d, sources in WORLD_DOMAINS.items() if source in sources]
                if domain:
                    expected[domain[0]].append(text[start:end])
    for domain in WORLD_DOMAINS:
        with open(os.path.join(out, f"{domain}.txt"), encoding="utf-8") as f:
            assert f.read().splitlines() == expected[domain]
    # The classes differ in vocabulary: each domain's own template words stay in it.
    vocab = {}
    for domain in WORLD_DOMAINS:
        with open(os.path.join(out, "vocab", f"{domain}.vocab"), encoding="utf-8") as f:
            vocab[domain] = {line.split("\t")[0] for line in f}
    assert "coach" in vocab["sports"] and "coach" not in vocab["politics"] | vocab["business"]
    assert "rally" in vocab["politics"] and "rally" not in vocab["sports"]
    assert "Inflation" in vocab["business"] and "Inflation" not in vocab["weather"]
    # Same world, same corpus; and the corpus feeds the iterator.
    again = str(tmp_path / "again")
    build_calm_corpus_from_world(world, again, "word")
    for name in os.listdir(out):
        if name.endswith(".txt"):
            assert open(os.path.join(out, name)).read() == open(os.path.join(again, name)).read()
    calm = CALM(out, "char", switch_frequency=40, nswitches=3, window_size=8, batch_size=2, seed=0)
    assert calm.class_names == tuple(sorted(WORLD_DOMAINS))
    assert len(list(calm)) == len(calm)


def test_a_world_without_sentence_sources_is_named(tmp_path):
    """A world folder drawn before mentions.jsonl recorded each sentence's source is refused, naming the file."""
    world = tmp_path / "world"
    world.mkdir()
    (world / "news.jsonl").write_text(json.dumps({"id": "a", "date": "2014-01-01", "text": "Rain fell."}) + "\n")
    (world / "mentions.jsonl").write_text(json.dumps({"id": "a", "facts": [], "entities": []}) + "\n")
    with pytest.raises(DataError, match="older templm") as e:
        build_calm_corpus_from_world(str(world), str(tmp_path / "out"), "word")
    assert e.value.path.endswith("mentions.jsonl") and e.value.line == 1
    assert set(WORLD_DOMAINS["sports"]) <= set(world_sources())


def test_world_domains_and_the_corpus_check(tmp_path):
    assert world_domains() == WORLD_DOMAINS
    assert world_domains(["sports", "weather"]) == {"sports": WORLD_DOMAINS["sports"],
                                                    "weather": WORLD_DOMAINS["weather"]}
    with pytest.raises(ValueError, match="unknown world domain"):
        world_domains(["sports", "gardening"])
    with pytest.raises(ValueError, match="two classes"):
        world_domains(["sports", "sports"])
    corpus = tmp_path / "corpus"
    build_calm_corpus_from_texts(write_texts(tmp_path / "texts", farm_and_market()), str(corpus), "char")
    assert check_corpus(str(corpus)) == ["farm", "market"]
    os.remove(corpus / "vocab" / "market.vocab")
    with pytest.raises(DataError, match="class 'market'") as e:
        check_corpus(str(corpus))
    assert e.value.path.endswith("market.vocab")
    with pytest.raises(DataError, match="not a directory; expected a CALM corpus"):
        check_corpus(str(tmp_path / "no_such_corpus"))


# --------------------------------------------------------------------------------------------------------------------
# `templm data calm`, end to end.


@pytest.mark.e2e
def test_data_calm_from_texts_and_from_world(tmp_path):
    texts = write_texts(tmp_path / "texts", farm_and_market())
    result = templm("data", "calm", f"--out={tmp_path / 'from_texts'}", f"--texts={texts}", "--level=char")
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads(result.stdout)
    assert sorted(summary["classes"]) == ["farm", "market"]
    assert sorted(os.listdir(tmp_path / "from_texts" / "vocab")) == ["farm.vocab", "market.vocab"]
    stream = CALM(str(tmp_path / "from_texts"), "char", 64, 2, 8, 2, 0)
    assert "t" in stream.vocab and stream.vocab.decode(stream.class_stream(0)[0, :8]) == "the cat "

    world = tmp_path / "world"  # does not exist: generated first
    result = templm("data", "calm", f"--out={tmp_path / 'from_world'}", f"--world_dir={world}",
                    "--domains=sports,weather", "--seed=3", "--gin.WorldConfig.start_year=2014",
                    "--gin.WorldConfig.end_year=2014", "--gin.WorldConfig.docs_per_month=5")
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads(result.stdout)
    assert summary["world_generated"] is True and sorted(summary["classes"]) == ["sports", "weather"]
    assert json.loads((world / "stats.json").read_text())["documents"] == 12 * 5
    assert sorted(f for f in os.listdir(tmp_path / "from_world") if f.endswith(".txt")) == ["sports.txt",
                                                                                           "weather.txt"]
    # An existing world is used as it is (not regenerated).
    again = templm("data", "calm", f"--out={tmp_path / 'again'}", f"--world_dir={world}", "--domains=sports,weather")
    assert again.returncode == 0, again.stderr[-2000:]
    assert json.loads(again.stdout)["world_generated"] is False
    assert (tmp_path / "again" / "sports.txt").read_text() == (tmp_path / "from_world" / "sports.txt").read_text()


@pytest.mark.e2e
def test_data_calm_needs_one_source(tmp_path):
    neither = templm("data", "calm", f"--out={tmp_path / 'x'}")
    assert neither.returncode == 1 and "exactly one of --world_dir" in neither.stderr
