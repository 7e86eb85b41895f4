"""Registers templm's SeqIO tasks and mixtures for one task-data folder (see templm.data.task_data).

Task names (every one has the splits train, validation and test):

    customnews_ssm_uniform         salient-span masking on every year, no time prefix
    customnews_ssm_temporal        the same, inputs prefixed "year: YYYY " from the document date
    customnews_ssm_yearly_YYYY     one year's documents, no prefix (one model per year)
    customnews_ssm_temporal_YYYY   one year's documents with the prefix (the slices adaptation mixes)
    customnews_random_spans        the training years' news sentences whole under T5's own objective: 15 % of the
                                   tokens, in random spans of 3 on average, for sentinels (a study's starting model)
    templama_uniform, templama_temporal, templama_yearly_YYYY      TempLAMA cloze queries, same regimes
    cronquestions                  closed-book CronQuestions, where configured (`register_cronquestions`)

The training split of the every-year tasks (uniform, temporal, and so their mixtures) holds only the TRAINING years:
the seen years of the task data's manifest unless configured otherwise (`templm.tasks.configure(train_years=...)`, gin
`templm.tasks.configure.train_years`, or $TEMPLM_TRAIN_YEARS as "2010-2018" or "2010,2012"), so a model trained through
`gin_configs/{uniform,temporal}.gin` never sees the future years it is tested on (Dhingra et al. train on 2010-2018
and test 2019-2020 as the future). Their validation and test splits hold every year; a yearly task holds its year.

Mixtures: `uniform_mixture`, `temporal_mixture`, `yearly_YYYY_mixture` mix CustomNews and TempLAMA training data
1000:1; `temporal_adapt_YYYY_alphaAAA` samples year YYYY's news with probability alpha (AAA = 100 x alpha, 010..090)
and the older years' with 1 - alpha, shared equally, with the year prefix, beside TempLAMA's training queries 1000:1
as in training, and `uniform_adapt_YYYY_alphaAAA` the same without it (`adapt_mixture(year, alpha, regime)` registers
any other alpha). Their TempLAMA queries are the training years' (configure `train_years` to include the new year).

Metrics come out by year through the `year` feature every example carries (keys `f1_2014`, `ppl_2014`, ...), and by
slice (`seen_f1`, `future_f1`) from the manifest's seen and future years. Every task reports EM/F1 of the predicted
span (TempLAMA's answer, CustomNews's masked salient span) and masked-LM perplexity.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Sequence

import seqio
import tensorflow as tf

from templm.data import regimes
from templm.data.salient_spans import SENTINEL
from templm.metrics import qa

CUSTOMNEWS, TEMPLAMA = "customnews", "templama"
REGIMES = regimes.SHARED_MODEL  # the regimes with every-year tasks and mixtures (yearly has its per-year ones)
SPLITS = ("train", "validation", "test")
NEWS_TO_TEMPLAMA_RATE = 1000.0
ADAPT_ALPHAS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)

_FEATURES = {
    "inputs": tf.io.FixedLenFeature([], tf.string),
    "targets": tf.io.FixedLenFeature([], tf.string),
    "answers": tf.io.VarLenFeature(tf.string),
    "year": tf.io.FixedLenFeature([], tf.int64),
    "id": tf.io.FixedLenFeature([], tf.string),
}

# A task whose training split has at most this many examples keeps its tokenized examples in memory after the
# first pass (tf.data cache before the repeat), so later epochs skip parsing and SentencePiece; about 1 KB each.
# Later epochs then read the files in the first epoch's (seeded) order; the shuffle buffer after the repeat
# (SHUFFLE_BUFFER, or the split) still mixes the examples. 0 switches the cache off.
MEMORY_CACHE_MAX_EXAMPLES = 250_000

_registered: List[str] = []  # names this module added, so that `register` can replace them
_adapt_years: List[int] = []  # the years of the registered task data, for adapt_mixture


class PreparedSource(seqio.TFExampleDataSource):
    """A TFExample source whose files are built on first use (`ensure()` runs before the files are listed)."""

    def __init__(self, ensure: Callable[[], object], **kwargs):
        self._ensure = ensure
        super().__init__(**kwargs)

    def list_shards(self, split: str) -> Sequence[str]:
        self._ensure()
        return super().list_shards(split)


# Hooks that build a vocabulary's model file on first use, by file path. Kept outside the vocabulary objects, whose
# state seqio compares (T5X refuses a task whose vocabulary differs from the model's) and gin deep-copies.
_PREPARE: Dict[str, Callable[[], object]] = {}


class PreparedVocabulary(seqio.SentencePieceVocabulary):
    """A SentencePiece vocabulary whose model file is built on first use (the embedded world, before its first run).

    It carries no state of its own: it equals, and pickles like, `seqio.SentencePieceVocabulary(path, extra_ids)`."""

    def _model_context(self):
        _PREPARE.get(self._sentencepiece_model_file, lambda: None)()
        return super()._model_context()


def task_vocabulary(path: str, extra_ids: int, ensure: Optional[Callable[[], object]] = None
                    ) -> seqio.SentencePieceVocabulary:
    """The tasks' vocabulary: `seqio.SentencePieceVocabulary(path, extra_ids)` as T5X's model configs build theirs;
    with `ensure`, one that runs it before the file is first read."""
    if ensure is None:
        _PREPARE.pop(path, None)
        return seqio.SentencePieceVocabulary(path, extra_ids=extra_ids)
    _PREPARE[path] = ensure
    return PreparedVocabulary(path, extra_ids=extra_ids)


def _parse(dataset: tf.data.Dataset) -> tf.data.Dataset:
    def fix(ex):
        ex = dict(ex)
        ex["answers"] = tf.sparse.to_dense(ex["answers"])
        ex["year"] = tf.cast(ex["year"], tf.int32)
        return ex

    return dataset.map(fix, num_parallel_calls=tf.data.AUTOTUNE)


def add_year_prefix(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """The Temporal regime: inputs become "year: YYYY " + inputs (templm.data.regimes.year_prefix)."""
    def prefix(ex):
        ex = dict(ex)
        ex["inputs"] = tf.strings.join([regimes.PREFIX_HEAD, tf.strings.as_string(ex["year"]), regimes.PREFIX_TAIL,
                                        ex["inputs"]])
        return ex

    return dataset.map(prefix, num_parallel_calls=tf.data.AUTOTUNE)


def cache_in_memory(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """Keeps the (tokenized) examples in memory after the first pass; the order and content stay as they were."""
    return dataset.cache()


def qa_ppl_postprocessor(output, example=None, is_target=False):
    """Targets carry what both the EM/F1 and the perplexity metrics need; predictions are the answer text."""
    if not is_target:
        return qa.qa_postprocessor(output, example, is_target)
    return {**qa.qa_postprocessor(output, example, True),
            **qa.ppl_postprocessor(output, example, True)}


# Examples seqio's shuffle buffer holds (after the repeat), at most: T5's tasks' 10,000, or a task's whole training
# split where that is smaller and known. A buffer beyond the split mixes the start of the next epochs into the first
# one, and before the first batch the pipeline has to fill it (a tiny task of 5 examples read 2,000 times over).
SHUFFLE_BUFFER = 10_000


def shuffle_buffer_size(num_examples: Optional[Dict[str, int]]) -> int:
    """The shuffle buffer of a task with `num_examples` (split -> count; None: not known)."""
    train = (num_examples or {}).get("train")
    return SHUFFLE_BUFFER if not train else min(SHUFFLE_BUFFER, train)


def _add_task(name: str, folder: str, pattern: str, data_dir: str, ensure, vocabulary,
              num_examples: Optional[Dict[str, int]], train_years: Optional[Sequence[int]], parse: Sequence[Callable],
              after_cache: Sequence[Callable] = (), **task_kwargs) -> None:
    """Registers one task over `folder`'s record files of the years `pattern` matches (with `train_years`, its train
    split reads only those years' files): its records through `parse`, tokenized, cached, through `after_cache` (what
    must vary from one epoch to the next) and EOS; `task_kwargs` go to seqio.TaskRegistry.add."""
    # A year's records are in {split}-YYYY.tfrecord or, split further, in {split}-YYYY-0000i-of-0000N.tfrecord.
    patterns = {split: f"{data_dir}/{folder}/{split}-{pattern}*.tfrecord" for split in SPLITS}
    if train_years is not None:
        patterns["train"] = [f"{data_dir}/{folder}/train-{year}*.tfrecord" for year in sorted(train_years)]
    source = PreparedSource(ensure, split_to_filepattern=patterns, feature_description=_FEATURES,
                            num_input_examples=num_examples)
    # Tokenized before seqio's cache point (an offline `seqio` cache stores token ids, as T5's tasks do); EOS after.
    preprocessors = [*parse, seqio.preprocessors.tokenize]
    if num_examples and 0 < num_examples.get("train", 0) <= MEMORY_CACHE_MAX_EXAMPLES:
        preprocessors.append(cache_in_memory)
    preprocessors += [seqio.CacheDatasetPlaceholder(), *after_cache, seqio.preprocessors.append_eos_after_trim]
    seqio.TaskRegistry.add(
        name, source=source, preprocessors=preprocessors,
        output_features={"inputs": seqio.Feature(vocabulary, add_eos=True),
                         "targets": seqio.Feature(vocabulary, add_eos=True)},
        shuffle_buffer_size=shuffle_buffer_size(num_examples), **task_kwargs)
    _registered.append(name)


def _task(name: str, folder: str, pattern: str, regime: str, data_dir: str, ensure, vocabulary,
          num_examples: Optional[Dict[str, int]], seen_years, future_years,
          train_years: Optional[Sequence[int]] = None) -> None:
    """One task of the regime `regime` (_add_task says which files it reads)."""
    parse = [_parse, add_year_prefix] if regimes.regime(regime).year_prefix else [_parse]
    # EM/F1 of the predicted span (TempLAMA's answer; CustomNews's masked salient span, the paper's main CustomNews
    # metric) and the masked-LM perplexity, overall, by year and by slice.
    metric_fns = [qa.make_qa_metric_fn(seen_years, future_years), qa.make_perplexity_metric_fn()]
    _add_task(name, folder, pattern, data_dir, ensure, vocabulary, num_examples, train_years, parse,
              postprocess_fn=qa_ppl_postprocessor, metric_fns=metric_fns)


# T5's span corruption (Raffel et al. 2020, section 3.1.4): 15 % of a text's tokens, in spans of 3 on average, each
# span replaced by one sentinel in the inputs, and the targets the spans, each after its sentinel.
NOISE_DENSITY = 0.15
MEAN_SPAN_LENGTH = 3.0


def news_text(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """A CustomNews record's sentence whole, as "targets": its masked salient span (targets) back at the sentinel."""
    def whole(ex):
        parts = tf.strings.split(ex["inputs"], SENTINEL, maxsplit=1)
        text = tf.cond(tf.size(parts) == 2, lambda: tf.strings.join([parts[0], ex["targets"], parts[-1]]),
                       lambda: ex["inputs"])
        return {"targets": text}

    return dataset.map(whole, num_parallel_calls=tf.data.AUTOTUNE)


def _segment(items: tf.Tensor, segments: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    """`items` split at random into `segments` non-empty runs (their lengths, in order)."""
    cuts = tf.argsort(tf.random.stateless_uniform([tf.maximum(items - 1, 0)], seed))[:segments - 1] + 1
    bounds = tf.concat([[0], tf.sort(cuts), [items]], axis=0)
    return bounds[1:] - bounds[:-1]


def corrupt_spans(tokens: tf.Tensor, seed: tf.Tensor, vocab_size: int) -> Dict[str, tf.Tensor]:
    """{"inputs", "targets"} of one tokenized text as T5 corrupts it: round(NOISE_DENSITY x its length) tokens (at
    least one), in round(that / MEAN_SPAN_LENGTH) spans of random lengths between runs of kept tokens (the text
    starts with kept ones), drawn from `seed`; the i-th span becomes sentinel i (id vocab_size - 1 - i, seqio's
    <extra_id_i>) in the inputs, and the targets are each span after its sentinel. A text longer than the feature
    lengths is corrupted whole, then trimmed (the targets may then hold a span whose sentinel was cut from the
    inputs; T5 sizes its texts beforehand instead)."""
    n = tf.size(tokens)
    noisy = tf.clip_by_value(tf.cast(tf.round(tf.cast(n, tf.float32) * NOISE_DENSITY), tf.int32), 1,
                             tf.maximum(n - 1, 1))
    spans = tf.maximum(1, tf.minimum(tf.cast(tf.round(tf.cast(noisy, tf.float32) / MEAN_SPAN_LENGTH), tf.int32),
                                     tf.minimum(noisy, n - noisy)))
    seeds = tf.random.experimental.stateless_split(seed, 2)
    runs = tf.reshape(tf.stack([_segment(n - noisy, spans, seeds[0]), _segment(noisy, spans, seeds[1])], axis=1),
                      [-1])
    noise = tf.repeat(tf.tile([False, True], [spans]), runs)[:n]
    first = noise & ~tf.concat([[False], noise[:-1]], axis=0)
    sentinel = vocab_size - tf.cumsum(tf.cast(first, tokens.dtype))
    inputs = tf.boolean_mask(tf.where(first, sentinel, tokens), ~noise | first)
    pairs = tf.reshape(tf.stack([tf.where(first, sentinel, -1), tf.where(noise, tokens, -1)], axis=1), [-1])
    return {"inputs": inputs, "targets": tf.boolean_mask(pairs, pairs >= 0)}


def random_spans(dataset: tf.data.Dataset, output_features) -> tf.data.Dataset:
    """T5's span corruption of each tokenized text ("targets"), seeded by seqio's seeds for the dataset."""
    vocab_size = output_features["targets"].vocabulary.vocab_size

    def corrupt(ex, seed):
        return corrupt_spans(ex["targets"], seed, vocab_size)

    return seqio.map_over_dataset(corrupt, num_seeds=1)(dataset)


# Examples buffered ahead of the mixture's sampling, on each task's side and after it (about 1 KB each).
MIXTURE_PREFETCH = 2048


def sample_with_prefetch(datasets: Sequence[tf.data.Dataset], rates: Sequence[float], seed: Optional[int]
                         ) -> tf.data.Dataset:
    """seqio's default mixture sampling (tf.data's sample_from_datasets, stopping when an input runs out), with each
    task's examples and the mixed stream prefetched. The examples and their order are exactly seqio's (a test
    compares them); without the buffers the sampling pulls every example synchronously from its task's pipeline, and
    a mixture fed the packer half as many rows per second as its larger task alone (BENCHMARKS.md)."""
    datasets = [ds.prefetch(MIXTURE_PREFETCH) for ds in datasets]
    mixed = tf.data.Dataset.sample_from_datasets(datasets, rates, seed=seed, stop_on_empty_dataset=True)
    return mixed.prefetch(MIXTURE_PREFETCH)


def _mixture(name: str, tasks_and_rates) -> None:
    seqio.MixtureRegistry.add(name, list(tasks_and_rates), sample_fn=sample_with_prefetch)
    _registered.append(name)


def _count(counts: Optional[dict], folder: str, years: Iterable[int]) -> Optional[Dict[str, int]]:
    if not counts or folder not in counts:
        return None
    return {split: sum(counts[folder].get(split, {}).get(str(y), 0) for y in years) for split in SPLITS}


def registered() -> List[str]:
    """Every task and mixture name this module has registered."""
    return list(_registered)


def unregister() -> None:
    """Removes every task and mixture this module registered."""
    for name in _registered:
        seqio.MixtureRegistry.remove(name)
        seqio.TaskRegistry.remove(name)
    _registered.clear()


def register(data_dir: str, years: Sequence[int], seen_years: Sequence[int], future_years: Sequence[int],
             vocabulary: seqio.Vocabulary, ensure: Callable[[], object] = lambda: None,
             counts: Optional[dict] = None, train_years: Optional[Sequence[int]] = None) -> None:
    """(Re-)registers every task and mixture over the record files in `data_dir`; the every-year tasks train on
    `train_years` (default: `seen_years`)."""
    unregister()
    years = sorted(years)
    train_years = sorted(int(y) for y in (seen_years if train_years is None else train_years))
    unknown = sorted(set(train_years) - set(years))
    if unknown or not train_years:
        raise ValueError(f"training years {train_years} must be a non-empty subset of the task data's years "
                         f"{years}" + (f" (unknown: {unknown})" if unknown else ""))
    common = dict(data_dir=data_dir, ensure=ensure, vocabulary=vocabulary, seen_years=seen_years,
                  future_years=future_years)
    for folder, stem in ((CUSTOMNEWS, "customnews_ssm"), (TEMPLAMA, "templama")):
        examples = _count(counts, folder, years)
        if examples is not None:  # the train split holds the training years only
            examples["train"] = _count(counts, folder, train_years)["train"]
        if folder == CUSTOMNEWS:  # the training years' sentences under T5's span corruption (no metrics: training)
            _add_task("customnews_random_spans", folder, "*", data_dir, ensure, vocabulary, examples, train_years,
                      [news_text], [random_spans])
        for regime in REGIMES:
            _task(f"{stem}_{regime}", folder, "*", regime, num_examples=examples, train_years=train_years, **common)
        for year in years:
            _task(f"{stem}_yearly_{year}", folder, str(year), "uniform",
                  num_examples=_count(counts, folder, [year]), **common)
            if folder == CUSTOMNEWS:
                _task(f"{stem}_temporal_{year}", folder, str(year), "temporal",
                      num_examples=_count(counts, folder, [year]), **common)
    for regime in REGIMES:
        _mixture(f"{regime}_mixture", [(f"customnews_ssm_{regime}", NEWS_TO_TEMPLAMA_RATE),
                                       (f"templama_{regime}", 1.0)])
    for year in years:
        _mixture(f"yearly_{year}_mixture", [(f"customnews_ssm_yearly_{year}", NEWS_TO_TEMPLAMA_RATE),
                                            (f"templama_yearly_{year}", 1.0)])
    _adapt_years[:] = years
    for year in years[1:]:
        for alpha in ADAPT_ALPHAS:
            for regime in REGIMES:
                adapt_mixture(year, alpha, regime)


@contextlib.contextmanager
def registration_scope() -> Iterator[None]:
    """The registry as it is now (seqio's tasks and mixtures, the names and years this module keeps, the files' build
    hooks) is put back when the block ends, whatever the block registered."""
    saved = (dict(seqio.TaskRegistry._REGISTRY), dict(seqio.MixtureRegistry._REGISTRY), list(_registered),
             list(_adapt_years), dict(_PREPARE))
    try:
        yield
    finally:
        for registry_dict, entries in ((seqio.TaskRegistry._REGISTRY, saved[0]),
                                       (seqio.MixtureRegistry._REGISTRY, saved[1])):
            registry_dict.clear()
            registry_dict.update(entries)
        _registered[:] = saved[2]
        _adapt_years[:] = saved[3]
        _PREPARE.clear()
        _PREPARE.update(saved[4])


CRONQUESTIONS = "cronquestions"
# The TempLAMA features less the year (its questions carry their own times), plus the question's kind.
_CRON_FEATURES = {**{k: v for k, v in _FEATURES.items() if k != "year"},
                  "answer_type": tf.io.FixedLenFeature([], tf.string),
                  "question_type": tf.io.FixedLenFeature([], tf.string)}


def _dense_answers(dataset: tf.data.Dataset) -> tf.data.Dataset:
    def fix(ex):
        return {**ex, "answers": tf.sparse.to_dense(ex["answers"])}

    return dataset.map(fix, num_parallel_calls=tf.data.AUTOTUNE)


def register_cronquestions(data_dir: str, vocabulary: seqio.Vocabulary, counts: Optional[dict] = None) -> str:
    """(Re-)registers the closed-book CronQuestions task (Dhingra et al., Table 4) over the record files that
    `templm data cronquestions` wrote into `data_dir` (templm.data.cronquestions): the question as inputs, no year
    prefix (its questions carry their own times), trained on the first answer and scored by SQuAD EM and F1 against
    the best of every answer. Returns the task's name."""
    if CRONQUESTIONS in seqio.TaskRegistry.names():
        seqio.TaskRegistry.remove(CRONQUESTIONS)
    num_examples = None if counts is None else {k: v["questions"] for k, v in counts.items()}
    source = seqio.TFExampleDataSource(
        split_to_filepattern={split: f"{data_dir.rstrip('/')}/{split}.tfrecord" for split in SPLITS},
        feature_description=_CRON_FEATURES, num_input_examples=num_examples)
    seqio.TaskRegistry.add(
        CRONQUESTIONS, source=source,
        preprocessors=[_dense_answers, seqio.preprocessors.tokenize, seqio.CacheDatasetPlaceholder(),
                       seqio.preprocessors.append_eos_after_trim],
        output_features={"inputs": seqio.Feature(vocabulary, add_eos=True),
                         "targets": seqio.Feature(vocabulary, add_eos=True)},
        postprocess_fn=qa.qa_postprocessor, metric_fns=[qa.make_qa_metric_fn()],
        shuffle_buffer_size=shuffle_buffer_size(num_examples))
    if CRONQUESTIONS not in _registered:
        _registered.append(CRONQUESTIONS)
    return CRONQUESTIONS


def adapt_mixture_name(year: int, alpha: float, regime: str = "temporal") -> str:
    return f"{regime}_adapt_{year}_alpha{round(alpha * 100):03d}"


def adapt_mixture(year: int, alpha: float, regime: str = "temporal") -> str:
    """Registers (once) and returns the mixture that samples `year`'s news with probability alpha and the older
    years' with 1 - alpha, with the year prefix (regime "temporal") or without it ("uniform"), shaped like the
    training mixtures: the news and the regime's TempLAMA training queries (those of the registered training years)
    NEWS_TO_TEMPLAMA_RATE to 1."""
    if regime not in REGIMES:
        raise ValueError(f"adapt_mixture: regime must be one of {REGIMES}, got {regime!r}")
    name = adapt_mixture_name(year, alpha, regime)
    if name in seqio.MixtureRegistry.names():
        return name
    older = [y for y in _adapt_years if y < year]
    if year not in _adapt_years or not older:
        raise ValueError(f"adapt_mixture: year {year} needs task data for it and for an earlier year "
                         f"(have {_adapt_years})")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"adapt_mixture: alpha must be in (0, 1), got {alpha}")
    # One year's news with the year prefix (the temporal slices) or without it (the yearly tasks' slices).
    stem = "customnews_ssm_temporal" if regimes.regime(regime).year_prefix else "customnews_ssm_yearly"
    news = NEWS_TO_TEMPLAMA_RATE / (NEWS_TO_TEMPLAMA_RATE + 1.0)
    rates = [(f"{stem}_{year}", news * alpha)]
    rates += [(f"{stem}_{y}", news * (1.0 - alpha) / len(older)) for y in older]
    rates.append((f"templama_{regime}", 1.0 - news))
    _mixture(name, rates)
    return name
