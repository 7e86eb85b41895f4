"""The CALM stream: seeded segmentation, the iterator's windows and their continuity across switches, wrap-around,
and where the stream switches."""

import itertools
import math
import os

import numpy as np
import pytest
from scipy import stats

from templm.data.calm_corpus import EOL, build_calm_corpus_from_texts
from templm.data.calm_stream import (CALM, class_wraps, draw_class_order, draw_segment_lengths, segment_length_rate,
                                     switch_points)
from templm.errors import DataError

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


def _original_law(m):
    """The original CALM's segment lengths at scale m as a pmf over k = 1..kmax: rint of truncexpon(b=10 m, loc=0.1 m,
    scale=m), at least 1 (probabilities from scipy's CDF, independent of the sampler under test)."""
    law = stats.truncexpon(b=10 * m, loc=0.1 * m, scale=m)
    kmax = int(np.rint(0.1 * m + 10 * m * m)) + 1
    k = np.arange(1, kmax + 1)
    p = law.cdf(k + 0.5) - law.cdf(k - 0.5)
    p[0] = law.cdf(1.5)  # rint gives 0 or 1 below 1.5, and 0 is raised to 1
    return k, p


def test_segment_lengths_follow_the_original_law_by_default(corpus):
    # m = switch_frequency / window_size / batch_size = 1500 / 5 / 4 = 75 batches. The original shifts an exponential
    # of mean m by 0.1 m, so its mean is 82.5 batches, not m.
    calm = _calm(corpus, seed=2, switch_frequency=1500, nswitches=1500)
    assert calm.mean_segment_length == 75 and calm.segment_lengths == "original"
    lengths = np.array([n for _, n in calm.segments])
    k, p = _original_law(75.0)
    mean, sd = (k * p).sum(), math.sqrt(((k - (k * p).sum()) ** 2 * p).sum())
    assert mean == pytest.approx(82.5, abs=0.01)
    assert lengths.min() >= 8  # rint(0.1 m) = 8 at the least: the shift
    # The law's standard deviation is about m, so the mean of n = 4500 draws has a standard error near 75 /
    # sqrt(4500) = 1.1; a correct sampler misses by more than five of them with probability below 1e-6 (and the seed
    # is fixed), while the exact-mean law (mean 75) is 7 standard errors away.
    assert abs(lengths.mean() - mean) < 5 * sd / math.sqrt(lengths.size)
    exact = _calm(corpus, seed=2, switch_frequency=1500, nswitches=1500, segment_lengths="exact_mean")
    exact_lengths = np.array([n for _, n in exact.segments])
    assert abs(exact_lengths.mean() - 75) < 5 * exact_lengths.std() / math.sqrt(exact_lengths.size)
    assert exact_lengths.min() == 1 and [c for c, _ in exact.segments] == [c for c, _ in calm.segments]
    with pytest.raises(ValueError, match="segment_lengths"):
        _calm(corpus, segment_lengths="poisson")


@pytest.mark.parametrize("m", [0.25, 1.0, 3.0, 40.0])
def test_original_segment_law_is_the_originals(m):
    k, p = _original_law(m)
    draws = draw_segment_lengths(np.random.default_rng(0), m, 50_000, law="original")
    assert draws.dtype == np.int64 and draws.min() >= 1 and draws.max() <= k[-1]
    # The empirical CDF within the Dvoretzky-Kiefer-Wolfowitz band of the law's (exceeded with probability below
    # 1e-6; eps = 0.012 at n = 50,000). A sampler without the shift by 0.1 m, the rounding or the floor at 1 misses
    # it by 0.09 or more at one of these m; so does the exact-mean law.
    empirical = np.cumsum(np.bincount(draws, minlength=k[-1] + 1)[1:]) / draws.size
    eps = math.sqrt(math.log(2 / 1e-6) / (2 * draws.size))
    assert np.max(np.abs(empirical - np.cumsum(p))) < eps
    if m == 0.25:
        assert draws.tolist() == [1] * draws.size  # the law lies in [0.025, 0.65], rounded to 0 and raised to 1


def test_exact_mean_segment_law_is_exact():
    for m in (1.3, 6.0, 40.0):
        lam, cap = segment_length_rate(m)
        k = np.arange(1, cap + 1)
        p = np.exp(-lam * k)
        p /= p.sum()
        assert cap == math.ceil(10 * m)
        assert (k * p).sum() == pytest.approx(m, rel=1e-9)
        draws = draw_segment_lengths(np.random.default_rng(0), m, 50_000, law="exact_mean")
        sd = math.sqrt(((k - m) ** 2 * p).sum())
        assert abs(draws.mean() - m) < 5 * sd / math.sqrt(draws.size)  # 5 standard errors, as above
    assert draw_segment_lengths(np.random.default_rng(0), 0.4, 10, law="exact_mean").tolist() == [1] * 10


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
# Switches and wrap-around.

W, B = 16, 2


def _farm_and_market():
    animals = itertools.cycle(["cat", "dog", "cow", "hen"])
    return {"farm": "".join(f"the {next(animals)} sat on the mat.\n" for _ in range(120)),
            "market": "".join(f"stocks rose {i % 7} points and bonds fell.\n" for i in range(60))}


@pytest.fixture(scope="module")
def farm_stream(tmp_path_factory):
    """A two-class char-level CALM stream ("farm", a few sentences repeated, and "market")."""
    root = tmp_path_factory.mktemp("calm_stream")
    os.makedirs(root / "texts")
    for name, text in _farm_and_market().items():
        (root / "texts" / f"{name}.txt").write_text(text, encoding="utf-8")
    build_calm_corpus_from_texts(str(root / "texts"), str(root / "corpus"), "char")
    return CALM(str(root / "corpus"), "char", switch_frequency=W * B * 4, nswitches=10, window_size=W, batch_size=B,
                seed=0)


def test_switch_points_and_wraps(farm_stream):
    assert switch_points([0, 0, 1, 1, 1, 2, 3, 3]) == [2, 5, 6]
    assert switch_points([4]) == []
    stream = farm_stream
    wraps = class_wraps(stream)
    assert set(wraps) == {"farm", "market"}
    used = {name: sum(n for d, n in stream.segments if stream.class_names[d] == name) for name in wraps}
    for d, name in enumerate(stream.class_names):
        per_pass = (stream.class_stream(d).shape[1] - 1) // W
        assert wraps[name] == (used[name] - 1) // per_pass
