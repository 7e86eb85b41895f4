"""The SeqIO registry: task data, regimes (prefix or not, one year or all), mixtures, metrics, no hang at exit."""

import collections
import importlib
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import seqio

from templm import tasks
from templm.data.task_data import TaskDataConfig, ensure_task_data, read_manifest
from templm.data.world import WorldConfig
from templm_testing import with_sentinels

WORLD = WorldConfig(seed=1, start_year=2012, end_year=2016, subjects_per_relation=6, docs_per_month=12)
CONFIG = TaskDataConfig(world=WORLD, vocab_size=400, future_years=1)
LENGTHS = {"inputs": 48, "targets": 12}


@pytest.fixture(scope="module")
def data_dir(task_data_for):
    return task_data_for("tasks", CONFIG)


def _examples(name, split="validation", n=None, lengths=LENGTHS):
    ds = seqio.get_mixture_or_task(name).get_dataset(lengths, split=split, shuffle=False)
    if n is not None:
        ds = ds.take(n)
    return list(ds.as_numpy_iterator())


def test_manifest_years_slices_and_counts(data_dir):
    manifest = read_manifest(data_dir)
    assert manifest["years"] == [2012, 2013, 2014, 2015, 2016]
    assert manifest["seen_years"] == [2012, 2013, 2014, 2015] and manifest["future_years"] == [2016]
    with open(os.path.join(data_dir, "world", "stats.json")) as f:
        world_stats = json.load(f)
    templama = manifest["counts"]["templama"]
    assert sum(sum(v.values()) for v in templama.values()) == world_stats["templama_queries"]
    assert sum(templama["validation"].values()) == world_stats["templama_splits"]["val"]
    news = manifest["counts"]["customnews"]
    assert all(news[split][str(y)] > 0 for split in ("train", "validation", "test") for y in manifest["years"])
    with open(os.path.join(data_dir, "splits", "stats.json")) as f:  # the corpus where it is, not where it was built
        assert json.load(f)["yearly"]["corpus"] == os.path.join(os.path.abspath(data_dir), "world", "news.jsonl")


def test_year_prefix_only_in_temporal_tasks(data_dir):
    temporal = _examples("customnews_ssm_temporal")
    uniform = _examples("customnews_ssm_uniform")
    assert len(temporal) == len(uniform) > 100
    for ex in temporal:
        assert ex["inputs_pretokenized"].decode().startswith(f"year: {ex['year']} ")
    assert not any(ex["inputs_pretokenized"].decode().startswith("year:") for ex in uniform)
    # Same examples, same order: the prefix is the only difference.
    for t, u in zip(temporal, uniform):
        assert t["inputs_pretokenized"].decode() == f"year: {u['year']} " + u["inputs_pretokenized"].decode()
    for ex in _examples("templama_temporal"):
        assert ex["inputs_pretokenized"].decode().startswith(f"year: {ex['year']} ")
        assert b"<extra_id_0>" in ex["inputs_pretokenized"]
        assert ex["targets_pretokenized"] in list(ex["answers"])


def test_yearly_tasks_hold_only_their_year(data_dir):
    manifest = read_manifest(data_dir)
    for year in manifest["years"]:
        for name in (f"customnews_ssm_yearly_{year}", f"templama_yearly_{year}", f"customnews_ssm_temporal_{year}"):
            years = {int(ex["year"]) for ex in _examples(name)}
            assert years == {year}, name
    counted = collections.Counter(int(ex["year"]) for ex in _examples("templama_uniform"))
    assert counted == {int(y): n for y, n in manifest["counts"]["templama"]["validation"].items()}


def test_training_splits_hold_the_training_years_only(data_dir):
    """The future years stay out of training: the every-year tasks' train splits hold the seen years (the
    manifest's), their evaluation splits every year; `train_years` (or $TEMPLM_TRAIN_YEARS) chooses others."""
    assert tasks.current()["train_years"] == [2012, 2013, 2014, 2015]
    for name in ("customnews_ssm_uniform", "customnews_ssm_temporal", "templama_uniform", "templama_temporal"):
        assert {int(ex["year"]) for ex in _examples(name, split="train")} == {2012, 2013, 2014, 2015}, name
        assert 2016 in {int(ex["year"]) for ex in _examples(name, split="test")}, name
    try:
        tasks.configure(data_dir=data_dir, train_years=[2015, 2016])
        assert {int(ex["year"]) for ex in _examples("customnews_ssm_uniform", split="train")} == {2015, 2016}
        with pytest.raises(ValueError, match="unknown: \\[2030\\]"):
            tasks.configure(data_dir=data_dir, train_years=[2015, 2030])
        assert tasks.parse_years("2010-2012,2015") == [2010, 2011, 2012, 2015]
        with pytest.raises(ValueError, match="TEMPLM_TRAIN_YEARS"):
            tasks.parse_years("twenty", "TEMPLM_TRAIN_YEARS")
    finally:
        tasks.configure(data_dir=data_dir)


def test_a_tasks_shuffle_buffer_holds_its_training_split_at_most(data_dir):
    """seqio shuffles after the repeat: a buffer as large as T5's (10,000) on a task of a few hundred examples would
    read the split dozens of times before the first batch. Each task's buffer is its training split's size (the
    manifest's count over the training years) where that is below 10,000; every example of the split still comes out
    within the first three epochs' worth of the shuffled stream (an example is missed there only while each of its
    three copies waits in the buffer)."""
    from templm.tasks.registry import SHUFFLE_BUFFER, shuffle_buffer_size

    manifest = read_manifest(data_dir)
    for folder, name, years in (("templama", "templama_uniform", manifest["seen_years"]),
                                ("customnews", "customnews_ssm_yearly_2013", [2013])):
        count = sum(manifest["counts"][folder]["train"][str(y)] for y in years)
        assert 0 < count < SHUFFLE_BUFFER
        assert seqio.get_mixture_or_task(name).shuffle_buffer_size == count, name
    assert shuffle_buffer_size(None) == shuffle_buffer_size({"train": 0}) == SHUFFLE_BUFFER
    assert shuffle_buffer_size({"train": 10**6}) == SHUFFLE_BUFFER
    task = seqio.get_mixture_or_task("templama_uniform")
    ids = {ex["id"] for ex in task.get_dataset(LENGTHS, split="train", shuffle=False).as_numpy_iterator()}
    stream = task.get_dataset(LENGTHS, split="train", shuffle=True, num_epochs=None, seed=5).take(3 * len(ids))
    assert {ex["id"] for ex in stream.as_numpy_iterator()} == ids


def test_no_future_year_reaches_a_training_batch_through_the_shipped_configs(data_dir):
    """The paper's configs train on the seen years only: every example the temporal config's mixture yields for
    training carries the prefix of a seen year (2016 is this data's future year)."""
    import gin

    import templm.evaluation.checkpoint_eval  # noqa: F401  (registers what the configs bind)
    from templm.cli import parse_gin

    try:
        parse_gin(["gin_configs/temporal.gin"], ["MODEL_DIR = '/tmp/unused'"])
        mixture = gin.query_parameter("%MIXTURE_OR_TASK_NAME")
    finally:
        gin.clear_config()
    ds = seqio.get_mixture_or_task(mixture).get_dataset(LENGTHS, split="train", shuffle=True, seed=0,
                                                        num_epochs=None)
    vocabulary = seqio.get_mixture_or_task(mixture).output_features["inputs"].vocabulary
    examples = ds.take(3000).as_numpy_iterator()
    prefixes = collections.Counter(vocabulary.decode(ex["inputs"].tolist())[:10] for ex in examples)
    assert set(prefixes) == {f"year: {y}" for y in (2012, 2013, 2014, 2015)}, prefixes


def test_tokens_round_trip_through_the_task_vocabulary(data_dir):
    vocab = tasks.current()["vocabulary"]
    assert vocab.vocab_size == 400 + 100
    ex = _examples("templama_temporal", n=1, lengths={"inputs": 128, "targets": 32})[0]
    assert vocab.decode(ex["inputs"].tolist()) == ex["inputs_pretokenized"].decode()
    assert ex["inputs"][-1] == 1  # EOS appended
    assert vocab.encode("<extra_id_0>")[-1] == vocab.vocab_size - 1


def test_random_spans_corrupt_the_news_sentences_as_t5_does(data_dir):
    """customnews_random_spans (a study's starting model, Study.pretrain_objective): each training-year CustomNews
    sentence whole (its salient span back in place) under T5's span corruption: sentinels <extra_id_0>, <extra_id_1>,
    ... in the inputs, each followed in the targets by the tokens it replaced, about 15 % of the tokens; a seed
    draws the same spans again."""
    vocab = tasks.current()["vocabulary"]
    lengths = {"inputs": 256, "targets": 128}  # nothing trimmed
    ssm = _examples("customnews_ssm_uniform", split="train", lengths=lengths)

    def corrupted(seed):
        ds = seqio.get_mixture_or_task("customnews_random_spans").get_dataset(lengths, split="train", shuffle=False,
                                                                               seed=seed)
        return [(ex["inputs"].tolist(), ex["targets"].tolist()) for ex in ds.as_numpy_iterator()]

    spans = corrupted(3)
    assert len(spans) == len(ssm) > 100
    first_sentinel = vocab.vocab_size - 1
    noise = total = 0
    for ex, (inputs, targets) in zip(ssm, spans):
        whole = ex["inputs_pretokenized"].decode().replace("<extra_id_0>", ex["targets_pretokenized"].decode())
        assert inputs[-1] == targets[-1] == 1  # EOS
        inputs, targets = inputs[:-1], targets[:-1]
        sentinels = [t for t in inputs if t > first_sentinel - 100]
        assert sentinels == list(range(first_sentinel, first_sentinel - len(sentinels), -1)) and sentinels
        assert [t for t in targets if t > first_sentinel - 100] == sentinels and targets[0] == first_sentinel
        replaced, span = {}, None
        for t in targets:
            if t in sentinels:
                span = replaced.setdefault(t, [])
            else:
                span.append(t)
        assert all(replaced.values())  # every sentinel replaced at least one token
        rebuilt = [u for t in inputs for u in (replaced[t] if t in replaced else [t])]
        assert rebuilt == vocab.encode(whole)
        noise += sum(map(len, replaced.values()))
        total += len(rebuilt)
    assert 0.14 < noise / total < 0.16
    assert corrupted(3) == spans and corrupted(4) != spans


def _task_shares(name, n, key):
    ds = seqio.get_mixture_or_task(name).get_dataset(LENGTHS, split="train", shuffle=True, seed=7, num_epochs=None,
                                                     passthrough_features=["id", "year"])
    counts = collections.Counter(key(ex) for ex in ds.take(n).as_numpy_iterator())
    return {k: v / n for k, v in counts.items()}


def test_news_to_templama_mixture_is_1000_to_1(data_dir):
    mixture = seqio.get_mixture_or_task("temporal_mixture")
    assert {t.name: mixture.get_rate(t) for t in mixture.tasks} == {"customnews_ssm_temporal": 1000.0,
                                                                     "templama_temporal": 1.0}
    n = 20_000
    share = _task_shares("temporal_mixture", n, lambda ex: "news" if b"#" in ex["id"] else "templama")
    expected = 1 / 1001  # about 20 of 20,000: a 100:1 or 10000:1 mixture would be far outside 4 sigma
    sigma = (expected * (1 - expected) / n) ** 0.5
    assert abs(share.get("templama", 0.0) - expected) < 4 * sigma


@pytest.mark.parametrize("name", ["temporal_mixture", "temporal_adapt_2015_alpha030"])
def test_prefetching_mixture_gives_seqios_examples_in_seqios_order(data_dir, name):
    """Our mixtures' sampling (tasks.registry.sample_with_prefetch) against seqio's default sampling function."""
    ours = seqio.get_mixture_or_task(name)
    assert ours._sample_fn is tasks.registry.sample_with_prefetch
    plain = seqio.Mixture(f"plain_{name}", [(t.name, ours.get_rate(t)) for t in ours.tasks])
    streams = [m.get_dataset(LENGTHS, split="train", shuffle=True, seed=5, num_epochs=None,
                             passthrough_features=["id", "year"]).take(1500)
               for m in (ours, plain)]
    examples = [[(ex["id"], int(ex["year"])) for ex in ds.as_numpy_iterator()] for ds in streams]
    assert examples[0] == examples[1]
    assert len(set(examples[0])) > 1000
    if "adapt" in name:  # several tasks really are interleaved
        assert {year for _, year in examples[0]} == {2012, 2013, 2014, 2015}


def test_alpha_adaptation_mixture(data_dir):
    """Year 2015's news at alpha, the older years' at 1 - alpha, and TempLAMA's training queries 1000:1 as in the
    training mixtures (Dhingra et al. adapt on the training mixture's kind of data)."""
    name = tasks.adapt_mixture(2015, 0.3)
    assert name == "temporal_adapt_2015_alpha030"
    rates = {t.name: seqio.get_mixture_or_task(name).get_rate(t) for t in seqio.get_mixture_or_task(name).tasks}
    assert rates["templama_temporal"] == pytest.approx(1 / 1001)
    assert rates["customnews_ssm_temporal_2015"] == pytest.approx(0.3 * 1000 / 1001)
    assert sum(rates.values()) == pytest.approx(1.0)
    n = 4000
    share = _task_shares(name, n, lambda ex: int(ex["year"]))
    assert set(share) <= {2012, 2013, 2014, 2015} and {2012, 2013, 2014, 2015} <= set(share)
    sigma = (0.3 * 0.7 / n) ** 0.5
    assert abs(share[2015] - 0.3) < 4 * sigma
    for year in (2012, 2013, 2014):
        assert abs(share[year] - 0.7 / 3) < 4 * (0.7 / 3 * (1 - 0.7 / 3) / n) ** 0.5
    with pytest.raises(ValueError, match="earlier year"):
        tasks.adapt_mixture(2012, 0.5)
    # The Uniform model adapts on the same mixture without the year prefix.
    uniform = tasks.adapt_mixture(2015, 0.3, "uniform")
    assert uniform == "uniform_adapt_2015_alpha030" == tasks.uniform_adapt_mixture(year=2015, alpha=0.3)
    assert sorted(t.name for t in seqio.get_mixture_or_task(uniform).tasks) == [
        f"customnews_ssm_yearly_{y}" for y in (2012, 2013, 2014, 2015)] + ["templama_uniform"]
    vocabulary = seqio.get_mixture_or_task(uniform).output_features["inputs"].vocabulary
    texts = [vocabulary.decode(ex["inputs"].tolist()) for ex in _examples(uniform, split="train", n=50)]
    assert texts and not any(text.startswith("year:") for text in texts)


def test_every_name_resolves_and_the_regimes_pack(data_dir):
    task_names = [n for n in seqio.TaskRegistry.names() if n.startswith(("customnews_ssm_", "templama_"))]
    mixture_names = [n for n in seqio.MixtureRegistry.names() if n.endswith("_mixture") or "_adapt_" in n]
    assert len(task_names) == 2 * 2 + 5 * 3
    preregistered = [n for n in mixture_names if "_adapt_" not in n or n[-3:] in
                     {f"{round(a * 100):03d}" for a in tasks.registry.ADAPT_ALPHAS}]
    assert len(preregistered) == 2 + 5 + 2 * 4 * 9  # regimes, yearly, and per regime nine alphas for every year but
    # the first
    for name in task_names:
        source = seqio.get_mixture_or_task(name).source
        for split in ("train", "validation", "test"):
            assert source.list_shards(split), (name, split)
    for name in mixture_names:
        assert all(t.name in task_names for t in seqio.get_mixture_or_task(name).tasks)
    converter = seqio.EncDecFeatureConverter(pack=True)
    for name in ("uniform_mixture", "temporal_mixture", "yearly_2014_mixture", "temporal_adapt_2016_alpha050",
                 "templama_yearly_2016"):
        ds = seqio.get_dataset(mixture_or_task_name=name, task_feature_lengths={"inputs": 128, "targets": 32},
                               dataset_split="train", shuffle=True, seed=3, feature_converter=converter)
        rows = list(ds.take(8).as_numpy_iterator())
        assert rows[0]["encoder_input_tokens"].shape == (128,) and rows[0]["decoder_target_tokens"].shape == (32,)
        assert max(row["encoder_segment_ids"].max() for row in rows) >= 2  # examples are packed together


def test_metrics_through_the_task_postprocessor(data_dir):
    task = seqio.get_mixture_or_task("templama_temporal")
    examples = _examples("templama_temporal", split="test")
    targets = [task.postprocess_fn(ex["targets_pretokenized"], example=ex, is_target=True) for ex in examples]
    predictions = [task.postprocess_fn(b"<extra_id_0> " + ex["targets_pretokenized"] + b" <extra_id_1>")
                   for ex in examples]
    qa_fn, ppl_fn = task.metric_fns
    perfect = qa_fn(targets, predictions)
    assert perfect["em"] == 100.0 and perfect["f1"] == 100.0
    assert perfect["seen_count"] + perfect["future_count"] == len(examples) == perfect["count"]
    wrong = qa_fn(targets, ["nobody"] * len(targets))
    assert wrong["f1"] == 0.0 and wrong["future_f1"] == 0.0
    tokens = [t["num_tokens"] for t in targets]
    assert tokens == [int(np.count_nonzero(ex["targets"])) for ex in examples]
    # Every token at probability 1/2 gives perplexity 2 in every year.
    scores = [-n * np.log(2.0) for n in tokens]
    ppl = ppl_fn(targets, scores)
    assert ppl["ppl"] == pytest.approx(2.0)
    assert ppl["ppl_2016"] == pytest.approx(2.0)


def test_customnews_reports_the_f1_of_the_masked_span_by_year(data_dir):
    """The paper's CustomNews metric: F1 (and EM) of the predicted salient span, overall, by year and slice."""
    task = seqio.get_mixture_or_task("customnews_ssm_temporal")
    examples = _examples("customnews_ssm_temporal", split="test", n=200)
    targets = [task.postprocess_fn(ex["targets_pretokenized"], example=ex, is_target=True) for ex in examples]
    qa_fn, ppl_fn = task.metric_fns
    perfect = qa_fn(targets, [task.postprocess_fn(b"<extra_id_0> " + ex["targets_pretokenized"]) for ex in examples])
    years = {int(ex["year"]) for ex in examples}
    assert perfect["f1"] == perfect["em"] == 100.0 and perfect["count"] == len(examples)
    assert all(perfect[f"f1_{y}"] == 100.0 for y in years) and "seen_f1" in perfect
    half = qa_fn(targets, [t["answers"][0] if i % 2 else "nothing at all" for i, t in enumerate(targets)])
    assert half["em"] == pytest.approx(100.0 * (len(examples) // 2) / len(examples))


def test_import_twice_and_reconfigure(data_dir):
    importlib.reload(tasks)  # registers the default world again over the same names
    tasks.configure(data_dir=data_dir)
    assert "templama_yearly_2016" in seqio.TaskRegistry.names()
    assert "templama_yearly_2020" not in seqio.TaskRegistry.names()  # the default world's years are gone


def test_iterating_then_exiting_does_not_hang(data_dir):
    script = textwrap.dedent(f"""
        import seqio, tasks
        tasks.configure(data_dir={data_dir!r})
        ds = seqio.get_mixture_or_task("temporal_mixture").get_dataset(
            {{"inputs": 48, "targets": 12}}, split="train", shuffle=True, seed=1, num_epochs=None)
        it = ds.as_numpy_iterator()
        print(sum(1 for _, _ in zip(range(50), it)))
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "50"


def test_default_data_is_built_once_under_a_lock(tmp_path):
    """Two processes asking for the same folder at once: one builds it, the other waits and reads it."""
    script = textwrap.dedent(f"""
        import sys
        from absl import logging
        from templm.data.task_data import TaskDataConfig, ensure_task_data
        from templm.data.world import WorldConfig
        logging.set_verbosity(logging.INFO)
        config = TaskDataConfig(world=WorldConfig(start_year=2014, end_year=2015, subjects_per_relation=4,
                                                  docs_per_month=4), vocab_size=200)
        print(ensure_task_data({str(tmp_path / 'data')!r}, config)["years"])
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    outputs = [p.communicate(timeout=180) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert [out.strip() for out, _ in outputs] == ["[2014, 2015]"] * 2
    assert sum("preparing task data" in err for _, err in outputs) == 1
    assert ensure_task_data(str(tmp_path / "data"))["years"] == [2014, 2015]
    assert not os.path.exists(str(tmp_path / "data") + ".partial")


def test_memory_cache_keeps_every_epoch_identical(data_dir, monkeypatch):
    """World-sized tasks keep their tokenized examples in memory after the first pass: three epochs of the shuffled,
    repeated training stream of a one-file task are the same examples in the same order as with the cache switched
    off (with several files, the cache keeps the first epoch's file order), each example three times, and the
    tokenization sits before seqio's cache point (an offline seqio cache stores token ids)."""
    from templm.tasks import registry

    name = "customnews_ssm_temporal_2013"
    steps = [getattr(p, "__name__", type(p).__name__) for p in seqio.get_mixture_or_task(name).preprocessors]
    assert steps == ["_parse", "add_year_prefix", "tokenize", "cache_in_memory", "CacheDatasetPlaceholder",
                     "append_eos_after_trim"]
    count = read_manifest(data_dir)["counts"]["customnews"]["train"]["2013"]

    def stream():
        ds = seqio.get_mixture_or_task(name).get_dataset(LENGTHS, split="train", shuffle=True, seed=5,
                                                          num_epochs=3)
        return [(ex["inputs"].tolist(), ex["targets"].tolist()) for ex in ds.as_numpy_iterator()]

    cached = stream()
    monkeypatch.setattr(registry, "MEMORY_CACHE_MAX_EXAMPLES", 0)
    tasks.configure(data_dir=data_dir)
    try:
        steps = [getattr(p, "__name__", type(p).__name__) for p in seqio.get_mixture_or_task(name).preprocessors]
        assert "cache_in_memory" not in steps
        assert cached == stream()
    finally:
        monkeypatch.undo()
        tasks.configure(data_dir=data_dir)
    assert len(cached) == 3 * count
    once = collections.Counter((str(ex["inputs"].tolist()), str(ex["targets"].tolist()))
                               for ex in _examples(name, split="train"))
    assert collections.Counter((str(i), str(t)) for i, t in cached) == {k: 3 * v for k, v in once.items()}


# -- what upstream T5X relies on ---------------------------------------------------------------------------------------


def _t5x_equal(task_vocab, path, extra_ids):
    """T5X's check: the model's vocabulary, built by its gin as seqio.SentencePieceVocabulary(path, extra_ids), equals
    the task's under seqio's equality, both ways, also after a pickle round trip and gin's deep copy."""
    import copy
    import pickle

    model_vocab = seqio.SentencePieceVocabulary(path, extra_ids=extra_ids) if extra_ids else \
        seqio.SentencePieceVocabulary(path)
    again = pickle.loads(pickle.dumps(task_vocab))
    return (task_vocab == model_vocab and model_vocab == task_vocab and again == model_vocab
            and copy.deepcopy(task_vocab) == model_vocab)


def test_the_task_vocabulary_is_the_one_t5x_builds_and_pickles(data_dir, tmp_path, monkeypatch):
    vocab = tasks.current()["vocabulary"]
    path = os.path.join(data_dir, "spm", "vocab.model")
    assert vocab.sentencepiece_model_file == path and vocab.extra_ids == 100
    assert _t5x_equal(vocab, path, 100)
    assert not _t5x_equal(vocab, path, 0)  # the check can fail: a different number of sentinels is another vocabulary
    # The embedded world before its first use: its vocabulary is built later, and equals all the same.
    monkeypatch.delenv("TEMPLM_DATA_DIR", raising=False)
    monkeypatch.setenv("TEMPLM_CACHE", str(tmp_path / "cache"))
    try:
        tasks.configure()
        lazy = tasks.current()["vocabulary"]
        assert not os.path.exists(lazy.sentencepiece_model_file)
        assert _t5x_equal(lazy, lazy.sentencepiece_model_file, 100)
        assert not os.path.exists(lazy.sentencepiece_model_file)  # comparing and pickling built nothing
    finally:
        monkeypatch.undo()
        tasks.configure(data_dir=data_dir)


def test_a_vocabulary_file_with_its_own_sentinels_gets_no_extra_ids(data_dir, tmp_path, monkeypatch):
    from templm.errors import DataError

    t5_style = str(tmp_path / "sentencepiece.model")
    base = with_sentinels(os.path.join(data_dir, "spm", "vocab.model"), t5_style)
    try:
        tasks.configure(data_dir=data_dir, vocabulary_path=t5_style)
        vocab = tasks.current()["vocabulary"]
        assert vocab.extra_ids == 0 and vocab.vocab_size == base + 100
        assert vocab.tokenizer.piece_to_id("\u2581<extra_id_0>") == base + 99 == vocab.vocab_size - 1
        assert vocab.tokenizer.piece_to_id("\u2581<extra_id_99>") == base
        assert list(vocab.encode("<extra_id_0>")) == [base + 99]
        assert _t5x_equal(vocab, t5_style, 0)  # T5X's model configs load T5's file with extra_ids=0
        assert tasks.padded_vocab_size() == -(-(base + 100) // 128) * 128
        ex = _examples("templama_temporal", n=1)[0]
        assert vocab.decode(ex["inputs"].tolist()) == ex["inputs_pretokenized"].decode()
        with pytest.raises(DataError, match="already holds 100 <extra_id_N> sentinel pieces") as e:
            tasks.configure(data_dir=data_dir, vocabulary_path=t5_style, extra_ids=100)
        assert t5_style in str(e.value)
        monkeypatch.setenv("TEMPLM_EXTRA_IDS", "0")  # a plain file, told to add none
        tasks.configure(data_dir=data_dir)
        assert tasks.current()["vocabulary"].extra_ids == 0
    finally:
        monkeypatch.undo()
        tasks.configure(data_dir=data_dir)
    assert tasks.current()["vocabulary"].extra_ids == 100


def test_task_data_on_a_non_local_filesystem(data_dir):
    """Task data read through tf.io.gfile: a copy in TensorFlow's ram:// filesystem (as gs:// on Cloud TPU) gives
    the same examples as the local folder."""
    import tensorflow as tf

    remote = "ram://templm_test_tasks/data"
    for folder, _, files in os.walk(data_dir):
        rel = os.path.relpath(folder, data_dir)
        if rel.split(os.sep)[0] in ("world", "splits"):
            continue
        tf.io.gfile.makedirs(f"{remote}/{rel}")
        for name in files:
            tf.io.gfile.copy(os.path.join(folder, name), f"{remote}/{rel}/{name}".replace("/./", "/"), overwrite=True)
    local = [(ex["inputs"].tolist(), ex["targets"].tolist()) for ex in _examples("templama_temporal", "test")]
    try:
        manifest = tasks.configure(data_dir=remote)
        assert manifest["years"] == [2012, 2013, 2014, 2015, 2016]
        assert tasks.current()["vocabulary"].sentencepiece_model_file == f"{remote}/spm/vocab.model"
        there = [(ex["inputs"].tolist(), ex["targets"].tolist()) for ex in _examples("templama_temporal", "test")]
    finally:
        tasks.configure(data_dir=data_dir)
    assert there == local and len(local) > 10


def test_a_projects_own_tasks_module_does_not_hide_the_registry(data_dir, tmp_path):
    """A T5X project with its own tasks.py on the path first: `import templm.tasks` (what the T5X configs import)
    still registers templm's tasks, and the project's `tasks` stays the project's."""
    (tmp_path / "tasks.py").write_text("MINE = True\n")
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        import seqio, tasks
        assert tasks.MINE
        import templm.tasks
        templm.tasks.configure(data_dir={data_dir!r})
        print(seqio.get_mixture_or_task("temporal_mixture").name, tasks.MINE)
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180,
                            cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split()[-2:] == ["temporal_mixture", "True"]


def test_a_reload_keeps_the_gin_bindings_of_configure(data_dir):
    """After importlib.reload(templm.tasks), `templm.tasks.configure.data_dir` bound in gin still applies (the
    reloaded module's configure is gin's wrapper, not the plain function): a command run after a reload in the same
    process evaluated the default world's tasks instead of the bound folder's."""
    import gin

    importlib.reload(tasks)
    try:
        gin.parse_config([f"templm.tasks.configure.data_dir = '{data_dir}'"])
        manifest = tasks.configure()
        assert tasks.current()["data_dir"] == data_dir and manifest["years"] == tasks.current()["manifest"]["years"]
    finally:
        gin.clear_config()
        tasks.configure(data_dir=data_dir)
