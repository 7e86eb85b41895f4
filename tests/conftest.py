"""Suite-wide settings: 8 fake CPU devices for sharding tests, XLA without LLVM's optimisations, a persistent JAX
compilation cache, quiet TF, a cache of templm's own for the session; the check that no test touches the checkout's
runs/ or the user's cache (tests/support/read_guard.py); the fixtures several test modules share."""

import atexit
import os
import shutil
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUPPORT = os.path.join(REPO, "tests", "support")

# Before jax or tensorflow are imported anywhere in the suite.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
# The suite's models are tiny: XLA's CPU compiler spends more on LLVM's optimisations than the steps they speed up
# take to run. Without them (backend optimisation level 0) a tiny study with a cold compilation cache took 70 -> 60 s
# (85 -> 71 s of CPU), and the suite's numbers change by float noise only (BENCHMARKS.md, "The suite"). The same
# flag reaches every process a test starts (templm_testing.xla_flags for one with its own device count).
if "--xla_backend_optimization_level" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " --xla_backend_optimization_level=0"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(REPO, ".cache", "jax"))
# The suite's compilations are of tiny models: most take 0.05-1 s, under JAX's default threshold for the persistent
# cache (1 s), and were compiled afresh by every run. Measured on tests/models, tests/evaluation and the KGLM trainer
# (one process, 2 cores): a warm run took 155 s of CPU with the default, 95 s with 0.05 s; a cold one alike (227, 215).
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.05")

# Nothing a run of the product left on this machine reaches a test: templm's cache (the embedded world's task data)
# is a fresh folder of the session's, libraries that keep a cache (matplotlib's fonts) keep it in the checkout's
# .cache, as the compilation cache, and every process of the suite logs a touch of runs/ or ~/.cache.
SESSION_DIR = tempfile.mkdtemp(prefix="templm-suite-")
atexit.register(shutil.rmtree, SESSION_DIR, ignore_errors=True)
os.environ["TEMPLM_CACHE"] = os.path.join(SESSION_DIR, "cache")
os.environ["XDG_CACHE_HOME"] = os.path.join(REPO, ".cache")
os.environ["MPLCONFIGDIR"] = os.path.join(REPO, ".cache", "matplotlib")

# Helpers shared by several test modules (tests/support/templm_testing.py).
sys.path.insert(0, SUPPORT)

import read_guard  # noqa: E402

READ_LOG = os.path.join(SESSION_DIR, "touched.log")
os.environ[read_guard.ROOTS_ENV] = os.pathsep.join(read_guard.forbidden_roots(REPO))
os.environ[read_guard.LOG_ENV] = READ_LOG
os.environ["PYTHONPATH"] = os.pathsep.join(
    [os.path.join(SUPPORT, "read_guard_site")] + [p for p in [os.environ.get("PYTHONPATH")] if p])
read_guard.install_from_environment()

import pytest  # noqa: E402  (after the environment above)

_read_log_offset = [0]


def _new_touches():
    lines, _read_log_offset[0] = read_guard.read_log(READ_LOG, _read_log_offset[0])
    return lines


def _touches_message(lines):
    shown = "\n  ".join(line.split("\t", 1)[1].replace("\t", " ") for line in lines[:10])
    more = f"\n  ... and {len(lines) - 10} more" if len(lines) > 10 else ""
    return ("touched what a run of the product leaves on this machine (the checkout's runs/ or the user's cache; "
            f"a test holds what it needs in its own temporary folder):\n  {shown}{more}")


@pytest.fixture(autouse=True)
def _no_runs_or_user_cache():
    """Fails the test (at its teardown) during which any process of the suite touched runs/ or ~/.cache; what
    module or session fixtures touched is blamed on the first test that uses them."""
    yield
    lines = _new_touches()
    if lines:
        pytest.fail(_touches_message(lines), pytrace=False)


def pytest_sessionfinish(session, exitstatus):
    lines = _new_touches()  # fixtures' teardowns after the last test
    if lines:
        session.config.get_terminal_writer().line("\n" + _touches_message(lines), red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


# The test files that take longest (seconds of one cold `make test --durations=0` at 6183520, each file's tests and
# fixtures summed, on a loaded 2-core machine), about slowest first: they run before every other file, in this order.
# The first two are the files of the session's tiny study, one for each worker; the multi-host file has two tests, so
# xdist hands its worker the third file at once (a worker with two tests or fewer left gets the next file): the
# trainer's file, whose two-process test then runs after the multi-host processes are done, not beside them (in a
# loaded run where the two overlapped they took 267 s and 324 s; 112 s and 253 s in a loaded run where they did not).
# `make test` hands files to two pytest-xdist workers in collection order (--dist loadfile --no-loadscope-reorder);
# xdist's default order, most tests first, left these files of one or two long tests (the multi-host run, the
# installed wheel) to the end, where one worker ran them while the other had nothing left to do.
SLOWEST_FILES = [
    "tests/experiments/test_reproduce.py",  # 430 s (builds the session's tiny study, or waits for it)
    "tests/experiments/test_reproduce_multihost.py",  # 253 s
    "tests/training/test_trainer.py",  # 636 s
    "tests/test_reentrant_cli.py",  # 449 s
    "tests/tasks/test_registry.py",  # 247 s
    "tests/test_cli.py",  # 206 s
    "tests/cloud/test_study.py",  # two seeds of the tiny study into an emulator bucket, stopped and resumed: ~150 s
    "tests/cloud/test_train.py",  # 80 s, alone (two training processes into an emulator bucket)
    "tests/experiments/test_reproduce_own_data.py",  # 140 s
    "tests/experiments/test_importance_sampling.py",  # 115 s
    "tests/test_package_configs.py",  # 108 s
    "tests/experiments/test_presets.py",  # 86 s
    "tests/training/test_plan.py",  # 84 s
    "tests/training/test_kglm_trainer.py",  # 79 s
    "tests/models/test_transformer_xl.py",  # 76 s
    "tests/training/test_lm_trainer.py",  # 74 s
    "tests/training/test_input_pipeline.py",  # 72 s
    "tests/models/test_kglm.py",  # 65 s
    "tests/test_fault_matrix.py",  # every verb x fault class in-process, with the shared verb inputs
    "tests/tasks/test_seqio_cache.py",  # seqio's cache on Beam, then a training from it: ~40 s
    "tests/data/test_task_data_beam.py",  # the task data on Beam, one case with two worker processes: ~30 s
    "tests/data/test_lm_streams.py",  # the token streams on Beam, one case with two worker processes: ~30 s
]


# Tests that train models, build task data or start processes for several seconds each (measured with --durations
# at c. 4 s or more on this project's 2-core machine), marked `slow`: `make test-fast` leaves them out with the e2e
# runs, `make test` runs them. A file listed whole, or a test by the start of its id.
SLOW = (
    "tests/tasks/test_seqio_cache.py",
    "tests/data/test_task_data_beam.py",
    "tests/data/test_lm_streams.py",
    "tests/data/test_wikidata_beam.py",
    "tests/training/test_trainer.py",
    "tests/training/test_kglm_trainer.py",
    "tests/training/test_lm_trainer.py",
    "tests/training/test_input_pipeline.py",
    "tests/experiments/test_presets.py",
    "tests/test_t5x_configs.py",
    "tests/test_outputs.py::test_two_task_data_builds_on_one_folder_at_once",
    "tests/tasks/test_registry.py::test_iterating_then_exiting_does_not_hang",
    "tests/tasks/test_registry.py::test_default_data_is_built_once_under_a_lock",
    "tests/tasks/test_registry.py::test_every_name_resolves_and_the_regimes_pack",
    "tests/tasks/test_registry.py::test_prefetching_mixture_gives_seqios_examples_in_seqios_order",
    "tests/tasks/test_registry.py::test_alpha_adaptation_mixture",
    "tests/tasks/test_registry.py::test_a_projects_own_tasks_module_does_not_hide_the_registry",
    "tests/tasks/test_registry.py::test_training_splits_hold_the_training_years_only",
    "tests/tasks/test_registry.py::test_news_to_templama_mixture_is_1000_to_1",
    "tests/tasks/test_registry.py::test_yearly_tasks_hold_only_their_year",
    "tests/tasks/test_registry.py::test_memory_cache_keeps_every_epoch_identical",
    "tests/cloud/test_data_verbs.py::test_the_data_verbs_read_and_write_a_bucket_as_a_local_folder",
    "tests/cloud/test_study.py::test_the_study_s_own_data_read_from_a_bucket_as_from_local_files",
    "tests/evaluation/test_dynamic_eval.py::test_rms_decay_is_a_contraction_only_with_the_normalised_rate",
    "tests/evaluation/test_routing.py::test_router_evaluation_routes_each_example_to_its_expert",
)


def pytest_collection_modifyitems(config, items):
    """SLOWEST_FILES first, in their order; every other file after them in the usual order (a stable sort). The
    tests SLOW lists are marked `slow`."""
    rank = {path: i for i, path in enumerate(SLOWEST_FILES)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))
    for item in items:
        if any(item.nodeid == s or item.nodeid.startswith((s + "::", s + "[")) for s in SLOW):
            item.add_marker(pytest.mark.slow)


def built_once(tmp_path_factory, name, build):
    """The folder `name` that `build(folder)` fills, built once per test session: under pytest-xdist the workers
    share it (pytest-xdist's pattern for session fixtures: the session's common temporary folder, the first worker
    to ask builds it under a lock, the others wait for it and read it). A failed build leaves no mark of being done,
    so the next to ask builds it again (and fails the same way)."""
    import fcntl

    shared = os.environ.get("PYTEST_XDIST_WORKER") is not None
    root = tmp_path_factory.getbasetemp().parent if shared else tmp_path_factory.getbasetemp()
    folder, done = root / name, root / f"{name}.done"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            build(folder)
            done.touch()
    return folder


@pytest.fixture(scope="session")
def tiny_study(tmp_path_factory):
    """() -> (run folder, stdout, stderr) of `templm reproduce` with templm_testing.TINY_STUDY (the tiny_test preset,
    seed 0, two data shards), run in-process once per session: tests/experiments/test_reproduce.py checks it and
    what it printed, and it is the one-process reference of tests/experiments/test_reproduce_multihost.py (whose two
    processes draw their batches from two data shards). A function, so that a caller can start its own processes
    before waiting for it. No test writes into the folder."""
    from templm_testing import TINY_STUDY, run_templm

    def build(folder):
        result = run_templm(*TINY_STUDY, f"--out={folder / 'run'}")
        (folder / "stdout.txt").write_text(result.stdout, encoding="utf-8")
        (folder / "stderr.txt").write_text(result.stderr, encoding="utf-8")
        assert result.returncode == 0, result.stderr[-3000:]

    made = []

    def get():
        if not made:
            folder = built_once(tmp_path_factory, "tiny_study", build)
            made.append((folder / "run", (folder / "stdout.txt").read_text(encoding="utf-8"),
                         (folder / "stderr.txt").read_text(encoding="utf-8")))
        return made[0]

    return get


@pytest.fixture(scope="session")
def verb_inputs(tmp_path_factory):
    """What every verb reads in tests/test_reentrant_cli.py and tests/test_fault_matrix.py, made once per session
    through templm.cli.main: a world (`world`, its news.jsonl a corpus), task data (`data`), a T5 run of two steps
    over it (`model`), CALM texts (`texts`), a query file (`queries`), a CronQuestions release as published
    (`release`: pickles and the id-to-name file; one question a split), and the world's streaming splits (`splits`)
    and SentencePiece model (`spm`) that a Transformer-XL run reads."""
    import pickle

    from templm_testing import (VERB_T5, VERB_TASK_FLAGS, VERB_WORLD_FLAGS, farm_and_market, run_templm,
                                write_texts)

    def build(root):
        for args in (("data", "world", f"--out={root / 'world'}", *VERB_WORLD_FLAGS),
                     ("data", "tasks", f"--out={root / 'data'}", *VERB_TASK_FLAGS)):
            result = run_templm(*args)
            assert result.returncode == 0, result.stderr[-3000:]
        result = run_templm("train", *VERB_T5, f"--gin.MODEL_DIR='{root / 'model'}'", "--gin.TRAIN_STEPS=2",
                            env={"TEMPLM_DATA_DIR": str(root / "data")})
        assert result.returncode == 0, result.stderr[-3000:]
        news = root / "world" / "news.jsonl"
        for args in (("data", "splits", f"--corpus={news}", f"--out={root / 'splits'}", "--cutoff=2016-06-30",
                      "--test_docs_per_month=2", "--test_months=6", "--heldout_per_year=4", "--allow_degenerate"),
                     ("data", "spm", f"--corpus={news}", f"--out={root / 'spm' / 'spm'}", "--vocab_size=150")):
            result = run_templm(*args)
            assert result.returncode == 0, result.stderr[-3000:]
        write_texts(root / "texts", farm_and_market())
        (root / "queries.jsonl").write_text('{"query": "Ann Lee plays for _X_.", "date": "2015"}\n')
        questions = root / "release" / "data" / "wikidata_big" / "questions"
        questions.mkdir(parents=True)
        (questions.parent / "kg").mkdir()
        (questions.parent / "kg" / "wd_id2entity_text.txt").write_text("Q76\tBarack Obama\nQ30\tUnited States\n")
        for split, name in (("train", "train"), ("validation", "valid"), ("test", "test")):
            with open(questions / f"{name}.pickle", "wb") as f:
                pickle.dump([{"question": f"Who led United States in 2010 ({split})", "answers": {"Q76"},
                              "answer_type": "entity", "template": "Who led {tail} in {time}",
                              "entities": {"Q30"}, "times": {2010}, "relations": ["P6"], "type": "simple_entity",
                              "annotation": {"tail": "Q30", "time": 2010}, "uniq_id": 1, "paraphrases": []}],
                            f, protocol=3)

    root = built_once(tmp_path_factory, "verb_inputs", build)
    return {"root": root, "world": root / "world", "data": root / "data", "model": root / "model",
            "texts": root / "texts", "queries": root / "queries.jsonl", "release": root / "release",
            "splits": root / "splits", "spm": root / "spm" / "spm.model"}


@pytest.fixture(scope="module")
def task_data_for(tmp_path_factory):
    """build(name, TaskDataConfig) -> folder: task data in a fresh temporary folder, with the SeqIO tasks registered
    over it; the default registry is restored when the test module is done, so other modules see the usual one."""
    from templm import tasks
    from templm.data.task_data import prepare_task_data

    def build(name, config):
        out = str(tmp_path_factory.mktemp(name) / "data")
        prepare_task_data(config, out)
        tasks.configure(data_dir=out)
        return out

    yield build
    tasks.configure()


@pytest.fixture(scope="session")
def stream_spm():
    """(a tiny SentencePiece processor, the 60-word lexicon it was trained on): the tokenizer of the streaming tests
    (tests/data/test_token_stream.py, tests/metrics/test_stream.py, tests/reports/test_stream.py), checked in as
    tests/fixtures/stream64.model (written by tools/write_test_spm.py)."""
    import sentencepiece

    processor = sentencepiece.SentencePieceProcessor(model_file=os.path.join(REPO, "tests", "fixtures",
                                                                             "stream64.model"))
    from templm_testing import stream_lexicon

    return processor, stream_lexicon()[0]


@pytest.fixture(scope="module")
def is_problem():
    """The importance-sampling tests' seeded HMM problem: 4 states, 6 words, 4 documents of lengths [7, 4, 8, 7]
    (padding in three) with 1-4 sentences each."""
    from templm.experiments.importance_sampling import make_is_eval_problem

    return make_is_eval_problem(0, num_states=4, vocab_size=6, num_docs=4, doc_length=8)


@pytest.fixture(scope="module")
def drifting_stream(stream_spm):
    """Nine documents over three months in a stream of the tiny tokenizer, with made-up token log-probabilities:
    TIME-STRATIFIED drifting away from CONTROL month by month, dynamic evaluation halving the drift, and their
    stream_results: {"documents", "stream", "results"} (tests/metrics/test_stream.py, tests/reports/test_stream.py)."""
    import datetime

    import numpy as np

    from templm.data.records import Document
    from templm.data.token_stream import build_stream, word_counts
    from templm.metrics.stream import stream_results

    sp, lexicon = stream_spm
    rng = np.random.default_rng(0)
    documents = [Document(f"d{i}", datetime.date(2020, 1 + i % 3, 1 + i),
                          " ".join(["zorblat"] * 3 + [lexicon[j] for j in rng.integers(0, 60, 10)]) + ".")
                 for i in range(9)]
    stream = build_stream(documents, sp)
    base = -rng.uniform(0.5, 3.0, stream.n_targets)
    months = np.asarray(stream.doc_months)[stream.token_doc]
    drift = np.select([months == "2020-01", months == "2020-02"], [0.0, 0.1], 0.2)
    runs = {"time_stratified": {"static": base - drift, "dynamic": base - drift / 2}, "control": {"static": base}}
    train_counts = word_counts(" ".join(lexicon[j] for j in rng.integers(0, 60, 400)) for _ in range(5))
    results = stream_results(stream, runs, seg_len=16, mem_len=16, train_counts=train_counts, min_test_count=20,
                             n_topics=2, settings={"model": "tiny"})
    return {"documents": documents, "stream": stream, "results": results}
