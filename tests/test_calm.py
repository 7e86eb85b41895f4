"""CALM: corpus layout and cache, the switching stream, the loss log and the metrics, corpus builders."""

import json
import math
import os

import numpy as np
import pytest

from templm.data.records import DataError
from templm.data.world import WorldConfig, generate_world
from templm.evaluation.calm import (CALM, EOL, UNK, UNK_ID, WORLD_DOMAINS, LossLogger, build_calm_corpus_from_texts,
                                    build_calm_corpus_from_world, cache_paths, compute_metrics, draw_class_order,
                                    draw_segment_lengths, log_loss, read_vocabulary, segment_length_rate,
                                    world_sentence_source, world_templates)

# --------------------------------------------------------------------------------------------------------------------
# Fixtures: a word-level corpus whose every token names its own position, so continuity is checked independently of
# the iterator's internals.

SIZES = {"alpha": 2400, "beta": 1800, "gamma": 3000}


def _positional_texts():
    # One line per class: tokens "<c><i>", then the line's <eol>; token i of the class is "<c><i>" for i < size.
    return {name: " ".join(f"{name[0]}{i}" for i in range(size)) + "\n" for name, size in SIZES.items()}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    src = tmp_path_factory.mktemp("src")
    for name, text in _positional_texts().items():
        (src / f"{name}.txt").write_text(text, encoding="utf-8")
    out = str(tmp_path_factory.mktemp("calm") / "corpus")
    build_calm_corpus_from_texts(str(src), out, "word")
    return out


def _position(vocab, ids):
    """The position in its class's text of each token id (a token "<c><i>" is at position i; <eol> is the last)."""
    tokens = np.vectorize(lambda i: vocab[int(i)])(ids)
    return np.vectorize(lambda t: -1 if t == EOL else int(t[1:]))(tokens)


def _calm(corpus, seed=0, **kw):
    args = dict(switch_frequency=4 * 5 * 3, nswitches=6, window_size=5, batch_size=4)
    args.update(kw)
    return CALM(corpus, "word", seed=seed, **args)


# --------------------------------------------------------------------------------------------------------------------
# The iterator.


def test_same_seed_same_stream_other_seed_differs(corpus):
    a, b, c = _calm(corpus, seed=11), _calm(corpus, seed=11), _calm(corpus, seed=12)
    assert a.segments == b.segments
    assert a.segments != c.segments
    items_a, items_b = list(a), list(b)
    assert len(items_a) == len(a) == sum(n for _, n in a.segments)
    for x, y in zip(items_a, items_b):
        assert (x.domain, x.domain_name, x.sequence, x.batch) == (y.domain, y.domain_name, y.sequence, y.batch)
        np.testing.assert_array_equal(x.inputs, y.inputs)
        np.testing.assert_array_equal(x.targets, y.targets)
    # A second pass over the same iterator replays it.
    for x, y in zip(items_a, a):
        np.testing.assert_array_equal(x.inputs, y.inputs)


def test_item_fields_and_segments(corpus):
    calm = _calm(corpus, seed=3)
    assert calm.class_names == ("alpha", "beta", "gamma")
    items = list(calm)
    assert items[0].inputs.shape == items[0].targets.shape == (4, 5)
    assert items[0].inputs.dtype == np.int32
    # Items follow the planned segments: ids 0.., batch index 0..length-1, class index and name agree.
    expected = [(seq, c, b) for seq, (c, n) in enumerate(calm.segments) for b in range(n)]
    assert [(i.sequence, i.domain, i.batch) for i in items] == expected
    assert all(i.domain_name == calm.class_names[i.domain] for i in items)


def test_targets_are_inputs_shifted_by_one(corpus):
    calm = _calm(corpus, seed=5)
    for item in calm:
        np.testing.assert_array_equal(item.inputs[:, 1:], item.targets[:, :-1])
        # Within the class's text: each target is the token after its input (positions are consecutive).
        np.testing.assert_array_equal(_position(calm.vocab, item.targets), _position(calm.vocab, item.inputs) + 1)


def test_classes_resume_where_they_stopped(corpus):
    # switch_frequency large enough for long segments but no wrap: alpha has 2400 // 4 = 600 columns per row.
    calm = _calm(corpus, seed=7, switch_frequency=4 * 5 * 4, nswitches=5)
    rows = {c: SIZES[name] // 4 for c, name in enumerate(calm.class_names)}
    used = {c: sum(n for d, n in calm.segments if d == c) * 5 for c in rows}
    assert all(used[c] + 1 <= rows[c] for c in rows), "this test wants no wrap-around"
    last = {}
    resumed = 0
    for item in calm:
        pos = _position(calm.vocab, item.inputs)
        # Row r of the stream is the r-th equal cut of the class's text.
        np.testing.assert_array_equal(pos[:, 0] - pos[0, 0], np.arange(4) * rows[item.domain])
        if item.domain in last:
            prev = last[item.domain]
            # The first input of this batch is the token after the previous batch's last input, and equals its last
            # target, also across a segment boundary (a switch away and back).
            np.testing.assert_array_equal(pos[:, 0], prev[0][:, -1] + 1)
            np.testing.assert_array_equal(item.inputs[:, 0], prev[1][:, -1])
            resumed += item.batch == 0
        else:
            assert pos[0, 0] == 0
        last[item.domain] = (pos, item.targets)
    assert resumed == len(calm.segments) - 3  # every segment but each class's first resumed a class


def test_wrap_around_restarts_the_class(corpus):
    # beta: 1800 // 4 = 450 columns; windows of 5 need 6 columns, so 89 batches fit before wrapping to column 0.
    calm = _calm(corpus, seed=1, switch_frequency=4 * 5 * 60, nswitches=4)
    beta = calm.class_names.index("beta")
    starts = [int(_position(calm.vocab, item.inputs)[0, 0]) for item in calm if item.domain == beta]
    assert len(starts) > 89
    assert starts[:89] == [5 * k for k in range(89)]
    assert starts[89:92] == [0, 5, 10]


def test_class_order_has_no_adjacent_repeats():
    for nclasses in (2, 3, 5):
        for seed in range(20):
            order = draw_class_order(np.random.default_rng(seed), nclasses, 7)
            assert all(a != b for a, b in zip(order, order[1:]))
            assert np.bincount(order, minlength=nclasses).tolist() == [7] * nclasses
    with pytest.raises(ValueError):
        draw_class_order(np.random.default_rng(0), 1, 3)


def test_calm_segments_have_no_adjacent_repeats(corpus):
    for seed in range(5):
        segments = _calm(corpus, seed=seed, nswitches=30).segments
        classes = [c for c, _ in segments]
        assert all(a != b for a, b in zip(classes, classes[1:]))
        assert np.bincount(classes).tolist() == [30, 30, 30]


def test_segment_length_mean_matches_the_configuration(corpus):
    # m = switch_frequency / window_size / batch_size = 1500 / 5 / 4 = 75 batches.
    calm = _calm(corpus, seed=2, switch_frequency=1500, nswitches=1500)
    assert calm.mean_segment_length == 75
    lengths = np.array([n for _, n in calm.segments])
    assert lengths.min() >= 1 and lengths.max() <= 750  # support 1 .. ceil(10 m)
    # The law's standard deviation is about m (it is nearly exponential), so the mean of n = 4500 draws has a
    # standard error near 75 / sqrt(4500) = 1.1. A correct sampler misses by more than five standard errors with
    # probability below 1e-6 (the seed is fixed, so the test is deterministic anyway), while a bias as large as the
    # original's shift by 0.1 m (7.5 batches) is caught. Smaller biases are caught by the exact-law test below.
    se = lengths.std() / math.sqrt(lengths.size)
    assert abs(lengths.mean() - 75) < 5 * se


def test_segment_length_law_is_exact():
    for m in (1.3, 6.0, 40.0):
        lam, cap = segment_length_rate(m)
        k = np.arange(1, cap + 1)
        p = np.exp(-lam * k)
        p /= p.sum()
        assert cap == math.ceil(10 * m)
        assert (k * p).sum() == pytest.approx(m, rel=1e-9)
        draws = draw_segment_lengths(np.random.default_rng(0), m, 50_000)
        sd = math.sqrt(((k - m) ** 2 * p).sum())
        assert abs(draws.mean() - m) < 5 * sd / math.sqrt(draws.size)  # 5 standard errors, as above
    assert draw_segment_lengths(np.random.default_rng(0), 0.4, 10).tolist() == [1] * 10  # at least one batch


def test_bad_corpora_are_data_errors(tmp_path, corpus):
    with pytest.raises(DataError, match="beta.txt"):
        _calm(corpus, window_size=500)  # beta: 1801 // 4 = 450 columns < 501 (alpha's 600 and gamma's 750 suffice)
    src = tmp_path / "one"
    src.mkdir()
    (src / "only.txt").write_text("a b c\n" * 50)
    build_calm_corpus_from_texts(str(src), str(tmp_path / "one_corpus"), "word")
    with pytest.raises(DataError, match="two classes"):
        CALM(str(tmp_path / "one_corpus"), "word", 20, 2, 2, 1, seed=0)
    with pytest.raises(DataError, match="class files"):
        CALM(str(tmp_path), "word", 20, 2, 2, 1, seed=0)
    with pytest.raises(ValueError, match="model_level"):
        CALM(corpus, "byte", 20, 2, 2, 1, seed=0)


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
# The loss log and the metrics.


def _write_log(path, segments, names):
    """segments: [(class name, [losses])], ids 0.. in order; class index = position in `names`."""
    with open(path, "w") as f:
        for seq, (name, losses) in enumerate(segments):
            for loss in losses:
                f.write(json.dumps({"loss": loss, "domain": names.index(name), "domain_name": name,
                                    "sequence": seq}) + "\n")


NAMES = ["A", "B", "C", "D"]


def _designed_segments():
    # Burn-in (ids 0..49): A/B alternate with loss 100 (D once); were they kept, every A and B segment after the
    # burn-in would be scored against a previous mean of 100, and the mean loss would be far above 10.
    burn = [("D", [100.0])] + [("A" if i % 2 else "B", [100.0]) for i in range(1, 50)]
    post = [
        ("A", [4.0, 4.0]),  # 50: first A after the burn-in: unscored; A's reference becomes 4
        ("B", [6.0]),  # 51: unscored; B's reference 6
        ("A", [5.0, 3.0, 2.0]),  # 52: rec 1 (3 < 4 at index 1); first-10 mean 10/3 (fewer than 10 losses)
        ("B", [7.0] * 10 + [1.0, 1.0]),  # 53: rec 10; first-10 mean 7 (the 1.0s are the 11th and 12th); B's ref 6
        ("C", [9.0]),  # 54: only C segment: unscored
    ]
    # 55..100: A at odd ids, B at even, each [3, 3]. The first of each is below its reference (rec 0), the rest
    # equal to it, never strictly below (rec 2 = the segment length).
    post += [("A" if i % 2 else "B", [3.0, 3.0]) for i in range(55, 101)]
    post += [("B", [50.0, 50.0, 50.0])]  # 101: the last segment, never scored
    return burn + post


def test_metrics_on_a_designed_log(tmp_path):
    path = str(tmp_path / "log.jsonl")
    _write_log(path, _designed_segments(), NAMES)
    m = compute_metrics(path)
    loss = (8 + 6 + 10 + 72 + 9 + 46 * 6 + 150) / (2 + 1 + 3 + 12 + 1 + 46 * 2 + 3)
    assert m["loss"] == pytest.approx(loss)
    assert m["total_pp"] == pytest.approx(math.exp(loss))
    # Scored: A 52 (rec 1, I 10/3), A 55 (0, 3), 22 more A (2, 3); B 53 (10, 7), B 56 (0, 3), 22 more B (2, 3).
    assert m["rec_A"] == pytest.approx((1 + 0 + 22 * 2) / 24)
    assert m["rec_B"] == pytest.approx((10 + 0 + 22 * 2) / 24)
    assert m["rec"] == pytest.approx((1 + 10 + 2 * 22 * 2) / 48)
    assert m["ppl@sw_A"] == pytest.approx(math.exp((10 / 3 + 23 * 3) / 24))
    assert m["ppl@sw_B"] == pytest.approx(math.exp((7 + 23 * 3) / 24))
    assert m["ppl@sw"] == pytest.approx(math.exp((10 / 3 + 7 + 46 * 3) / 48))
    assert m["loss_A"] == pytest.approx((8 + 10 + 23 * 6) / (2 + 3 + 46))
    assert m["loss_B"] == pytest.approx((6 + 72 + 23 * 6 + 150) / (1 + 12 + 46 + 3))  # last segment included
    assert m["loss_C"] == 9.0 and m["total_pp_C"] == pytest.approx(math.exp(9))
    # C was never scored (one segment), D only appeared in the burn-in.
    assert set(m) == {"loss", "total_pp", "ppl@sw", "rec", "loss_A", "total_pp_A", "ppl@sw_A", "rec_A", "loss_B",
                      "total_pp_B", "ppl@sw_B", "rec_B", "loss_C", "total_pp_C"}
    assert all(isinstance(v, float) for v in m.values())


def test_metrics_need_100_segments(tmp_path):
    segments = _designed_segments()
    short, exact = str(tmp_path / "short.jsonl"), str(tmp_path / "exact.jsonl")
    _write_log(short, segments[:99], NAMES)  # ids 0..98
    _write_log(exact, segments[:100], NAMES)  # ids 0..99
    assert compute_metrics(short) == {}
    assert compute_metrics(exact)["loss"] > 0
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert compute_metrics(str(empty)) == {}


def test_total_pp_is_inf_from_loss_20(tmp_path):
    path = str(tmp_path / "log.jsonl")
    _write_log(path, [("A" if i % 2 else "B", [25.0 if i % 2 else 1.0]) for i in range(100)], NAMES)
    m = compute_metrics(path)
    assert m["loss"] == 13.0 and m["total_pp"] == pytest.approx(math.exp(13))
    assert m["total_pp_A"] == math.inf and m["total_pp_B"] == pytest.approx(math.e)
    assert m["ppl@sw_A"] == pytest.approx(math.exp(25))  # only total_pp has the cut-off
    _write_log(path, [("A" if i % 2 else "B", [20.0]) for i in range(100)], NAMES)
    assert compute_metrics(path)["total_pp"] == math.inf
    _write_log(path, [("A" if i % 2 else "B", [19.5]) for i in range(100)], NAMES)
    assert compute_metrics(path)["total_pp"] == pytest.approx(math.exp(19.5))


@pytest.mark.parametrize("line, reason", [
    ("{not json", "not JSON"),
    ('[1, 2]', "JSON object"),
    ('{"loss": 1.0, "domain": 0, "sequence": 3}', "domain_name"),
    ('{"loss": true, "domain": 0, "domain_name": "A", "sequence": 3}', "loss"),
    ('{"loss": NaN, "domain": 0, "domain_name": "A", "sequence": 3}', "loss"),
    ('{"loss": 1.0, "domain": 0, "domain_name": "A", "sequence": 1}', "must not decrease"),
    ('{"loss": 1.0, "domain": 1, "domain_name": "B", "sequence": 2}', "changes class"),
    ('{"loss": 1.0, "domain": 0, "domain_name": "Z", "sequence": 3}', "named"),
    ('{"loss": 1.0, "domain": -1, "domain_name": "A", "sequence": 3}', "domain"),
    ("", "empty line"),
])
def test_malformed_log_lines_name_file_and_line(tmp_path, line, reason):
    path = tmp_path / "log.jsonl"
    good = [json.dumps({"loss": 1.0, "domain": 0, "domain_name": "A", "sequence": 2})] * 2
    path.write_text("\n".join(good + [line]) + "\n")
    with pytest.raises(DataError, match=reason) as e:
        compute_metrics(str(path))
    assert e.value.path == str(path) and e.value.line == 3


def test_log_round_trip(corpus, tmp_path):
    calm = _calm(corpus, seed=4, nswitches=40)  # 120 segments: enough for metrics
    path = str(tmp_path / "loss.jsonl")
    with LossLogger(path) as log:
        for item in calm:
            log.log(item, np.float32(1.0 + item.domain + 0.01 * item.batch))
    with open(path) as f:
        rows = [json.loads(line) for line in f]
    assert len(rows) == len(calm)
    assert all(list(r) == ["loss", "domain", "domain_name", "sequence"] for r in rows)
    items = list(calm)
    assert [(r["domain"], r["domain_name"], r["sequence"]) for r in rows] == \
        [(i.domain, i.domain_name, i.sequence) for i in items]
    assert rows[0]["loss"] == pytest.approx(1.0 + items[0].domain)
    m = compute_metrics(path)
    assert {f"loss_{n}" for n in calm.class_names} <= set(m)
    # The original's call shape: log_loss(file, the iterator, loss) logs the iterator's current batch.
    with open(tmp_path / "other.jsonl", "w") as f:
        for _ in zip(range(3), calm):
            log_loss(f, calm, 2.5)
    with open(tmp_path / "other.jsonl") as f:
        assert [json.loads(line) for line in f] == [
            {"loss": 2.5, "domain": i.domain, "domain_name": i.domain_name, "sequence": i.sequence}
            for i in items[:3]]
    # A run that fails leaves no log behind.
    with pytest.raises(RuntimeError):
        with LossLogger(str(tmp_path / "failed.jsonl")) as log:
            log.log(items[0], 1.0)
            raise RuntimeError("model diverged")
    assert sorted(os.listdir(tmp_path)) == ["loss.jsonl", "other.jsonl"]


# --------------------------------------------------------------------------------------------------------------------
# Corpus builders.


def test_build_from_texts(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "en.txt").write_text("the cat\nthe hat\n", encoding="utf-8")
    (src / "fr.txt").write_text("le chat\r\nle chapeau é\n", encoding="utf-8")
    out = tmp_path / "out"
    stats = build_calm_corpus_from_texts(str(src), str(out), "char")
    assert sorted(os.listdir(out)) == ["en.txt", "fr.txt", "vocab"]
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
    with pytest.raises(FileExistsError):
        build_calm_corpus_from_texts(str(src), str(tmp_path / "keep"), "word")
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
    assert set(stats["left_out"]) <= {"burst", "host_city", "located_in"}  # every sentence matched a template
    kept = sum(c["lines"] for c in stats["classes"].values())
    assert kept + sum(stats["left_out"].values()) == stats["sentences"]
    templates = world_templates()
    for domain, sources in WORLD_DOMAINS.items():
        with open(os.path.join(out, f"{domain}.txt"), encoding="utf-8") as f:
            for line in f:
                assert world_sentence_source(line.rstrip("\n"), templates) in sources
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


def test_world_sentence_source_prefers_the_most_specific_template():
    templates = world_templates()
    assert world_sentence_source("Kado Bim, who plays for Rufa United, was named man of the match.",
                                 templates) == "P54"
    assert world_sentence_source("Rufa United is the head coach of Kado Bim.", templates) == "P286"
    assert world_sentence_source("Snow closed roads near Rufa.", templates) == "topic:weather"
    assert world_sentence_source("Nothing like any template here.", templates) is None
