"""`import templm.tasks` registers every templm SeqIO task and mixture; see templm/tasks/registry.py for their names.
(`import tasks` does the same; `templm.tasks` is the name a project's own tasks.py cannot shadow.)

Where the data comes from, in order: `configure(data_dir=...)` (gin: `templm.tasks.configure.data_dir = '...'`, applied
by templm's verbs after their configs are parsed), the `TEMPLM_DATA_DIR` environment variable (a folder written by
`templm data tasks --out DIR`; any path tf.io.gfile reads, gs:// included), or by default the embedded world,
prepared on first use in `$TEMPLM_CACHE` (default `~/.cache/templm`) under a lock.
"""

import contextlib
import functools

import gin

from templm import paths
from templm.data import cronquestions, task_data, vocab
from templm.errors import DataError
from templm.settings import Settings, parse_years  # noqa: F401  (parse_years: templm.tasks.parse_years as before)
from templm.tasks import registry
from templm.tasks.registry import adapt_mixture, adapt_mixture_name

__all__ = ["adapt_mixture", "adapt_mixture_name", "configure", "current", "padded_vocab_size", "parse_years",
           "registration_scope", "seqio_cache_dirs", "temporal_adapt_mixture", "uniform_adapt_mixture", "vocabulary",
           "yearly_mixture"]

_current = {}


def configure(data_dir=None, vocabulary_path=None, extra_ids=None, train_years=None, cronquestions_dir=None,
              settings=None):
    """Registers the tasks over `data_dir` (default: the settings' data_dir, $TEMPLM_DATA_DIR, else the embedded
    world's cache folder).

    `settings`: a templm.settings.Settings, what the environment configures (default: read from it now); an argument
    given here wins over it. `vocabulary_path` (default: its vocabulary, $TEMPLM_VOCABULARY) replaces the folder's own
    SentencePiece model, e.g. T5's public cc_all.32000.100extra model, which upstream T5X's model configs and the
    paper's checkpoints use. `extra_ids` (default: $TEMPLM_EXTRA_IDS, else detected): the sentinels seqio appends,
    100, or 0 for a file that holds its own (as T5's public vocabulary), so that the vocabulary equals the one T5X's
    model configs build. `train_years` (default: $TEMPLM_TRAIN_YEARS, "2010-2018" or "2010,2011", else the
    manifest's seen years) are the years the training split of the every-year tasks and mixtures holds: the future
    years stay out of training. `cronquestions_dir` (default: $TEMPLM_CRONQUESTIONS_DIR): a folder of `templm data
    cronquestions`, registered as the task `cronquestions` with the same vocabulary, for fine-tuning the models on it
    (Dhingra et al., Table 4). Returns the manifest (for the default world before its first use: the years it will
    have).
    """
    settings = settings or Settings.from_environment()
    from_settings = not data_dir
    data_dir = data_dir or settings.data_dir
    vocabulary_path = vocabulary_path or settings.vocabulary
    extra_ids = settings.extra_ids if extra_ids is None else extra_ids
    default = data_dir is None
    data_dir = data_dir or task_data.default_data_dir(settings.cache_dir)
    manifest = task_data.read_manifest(data_dir)
    if manifest is None and not default:
        # (what TEMPLM_DATA_DIR names, what a folder given here is)
        if paths.isfile(data_dir):
            named, given = "a file, not a task-data folder", "is a file, not a task-data folder"
        elif paths.exists(data_dir):
            named, given = "a folder without task data (no manifest.json)", "no task data here (no manifest.json)"
        else:
            named, given = "no folder", "no such folder"
        what = f"TEMPLM_DATA_DIR names {named}" if from_settings else given
        raise DataError(f"{what}: build task data with `templm data tasks --out DIR`", data_dir)
    ensure = None
    if manifest is None:
        config = task_data.TaskDataConfig()
        years = list(range(config.world.start_year, config.world.end_year + 1))
        manifest = {"years": years, "seen_years": years[:-config.future_years],
                    "future_years": years[-config.future_years:], "vocabulary": "spm/vocab.model", "counts": None}
        ensure = functools.partial(task_data.ensure_task_data, data_dir, config)
    path = vocabulary_path or f"{data_dir.rstrip('/')}/{manifest['vocabulary']}"
    if ensure is not None and not vocabulary_path:  # the embedded world's own model: no sentinels, built later
        extra_ids = vocab.DEFAULT_EXTRA_IDS if extra_ids is None else extra_ids
    else:
        extra_ids = vocab.task_extra_ids(path, extra_ids)
    vocabulary = registry.task_vocabulary(path, extra_ids, ensure)
    ensure = ensure or (lambda: None)
    train_years = settings.train_years if train_years is None else train_years
    train_years = list(manifest["seen_years"] if train_years is None else train_years)
    registry.register(data_dir, manifest["years"], manifest["seen_years"], manifest["future_years"], vocabulary,
                      ensure, manifest.get("counts"), train_years=train_years)
    cronquestions_dir = cronquestions_dir or settings.cronquestions_dir
    if cronquestions_dir:
        cron = cronquestions.read_manifest(cronquestions_dir)
        if cron is None:
            raise DataError("no CronQuestions records here (no manifest.json): build them with `templm data "
                            "cronquestions --release DIR --out DIR`", cronquestions_dir)
        registry.register_cronquestions(cronquestions_dir, vocabulary, cron.get("splits"))
    _current.clear()
    _current.update(data_dir=data_dir, manifest=manifest, vocabulary=vocabulary, ensure=ensure,
                    train_years=sorted(int(y) for y in train_years), cronquestions_dir=cronquestions_dir)
    return manifest


def yearly_mixture(year):
    """The name of year `year`'s mixture (CustomNews 1000 : TempLAMA 1), for gin: `@tasks.yearly_mixture()`."""
    name = f"yearly_{year}_mixture"
    if name not in registry.registered():
        raise ValueError(f"no yearly mixture for {year}: the task data has years {_current['manifest']['years']}")
    return name


def temporal_adapt_mixture(year, alpha):
    """The alpha adaptation mixture of `year` (registered on demand), for gin: `@tasks.temporal_adapt_mixture()`."""
    return adapt_mixture(year, alpha, "temporal")


def uniform_adapt_mixture(year, alpha):
    """The same without the year prefix, to adapt a Uniform model: `@tasks.uniform_adapt_mixture()`."""
    return adapt_mixture(year, alpha, "uniform")


def vocabulary():
    """The tasks' vocabulary, for a model config: `VOCABULARY = @templm.tasks.vocabulary()` (gin_configs/t5x/
    templm_vocab.gin), so that the model reads and writes the ids the tasks produce."""
    return _current["vocabulary"]


def padded_vocab_size(multiple=128):
    """The tasks' vocabulary size (sentinels included) rounded up to `multiple`, as T5X's configs size the embedding
    (32,100 -> 32,128): `network.T5Config.vocab_size = @templm.tasks.padded_vocab_size()`."""
    size = _current["vocabulary"].vocab_size
    return -(-size // multiple) * multiple


# gin's configurables, kept across a reload of this module (importlib.reload runs it again in the same namespace):
# gin registers a name once, so a reload keeps the first wrappers, which call into this same namespace; the plain
# functions of a reload would not see the bindings (templm.tasks.configure.data_dir).
_gin_wrapped = globals().get("_gin_wrapped") or {}
for _fn in ("configure", "yearly_mixture", "temporal_adapt_mixture", "uniform_adapt_mixture", "vocabulary",
            "padded_vocab_size"):
    if _fn not in _gin_wrapped:
        _gin_wrapped[_fn] = gin.configurable(globals()[_fn], module="templm.tasks")
    globals()[_fn] = _gin_wrapped[_fn]


@contextlib.contextmanager
def registration_scope():
    """What `configure` and the registry hold now is put back when the block ends (templm.cli.main scopes each
    command's registration with it, so a command never sees what an earlier one in the process registered)."""
    saved = dict(_current)
    with registry.registration_scope():
        try:
            yield
        finally:
            _current.clear()
            _current.update(saved)


@contextlib.contextmanager
def seqio_cache_dirs(dirs):
    """seqio's global cache folders with `dirs` added for the block (T5X's `--seqio_additional_cache_dirs`), put
    back as they were after it, so that a later command in the process does not read this one's cache. seqio keeps
    the folder it finds on each Task: register the tasks inside the block (`configure`), not before."""
    import seqio

    before = list(seqio.get_global_cache_dirs())
    seqio.add_global_cache_dirs(list(dirs))
    try:
        yield
    finally:
        seqio.set_global_cache_dirs(before)


def current():
    """What `configure` last set up: data_dir, manifest, vocabulary, train_years and the `ensure` hook."""
    return dict(_current)


def corrupt_records(error: BaseException) -> DataError:
    """What TensorFlow's "corrupted record" (a DataLossError while the tasks' examples are read) is, as one DataError:
    the task data's record files are read one by one until the damaged one is found, and it is named with what to
    do (a traceback of TensorFlow's before)."""
    import tensorflow as tf  # the tasks' readers have loaded it already

    data_dir = str(_current.get("data_dir") or "")
    reason = str(getattr(error, "message", error)).split("[Op:")[0].split("}}")[-1].strip()
    base = data_dir.rstrip("/")
    # The record files of every task folder (customnews/, templama/, ...), and any at the top.
    files = sorted(tf.io.gfile.glob(f"{base}/*/*.tfrecord") + tf.io.gfile.glob(f"{base}/*.tfrecord")) if base else []
    for path in files:
        try:
            for _ in tf.data.TFRecordDataset(path):
                pass
        except tf.errors.DataLossError:
            return DataError(f"a task-data record file is damaged ({reason}): rebuild the task data (templm data "
                             "tasks --out DIR) or copy it again", path)
    return DataError(f"a record file of the task data is damaged ({reason}): rebuild it (templm data tasks --out "
                     "DIR) or copy it again", data_dir or "the task data")


configure()
