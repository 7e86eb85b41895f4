"""Helpers shared by several test modules (the test modules cannot import each other; tests/conftest.py puts this
folder on the import path)."""

import itertools
import json
import os
import re
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# The suite's one tiny reproduction (tests/conftest.py's `tiny_study`): the tiny_test preset, seed 0, its batches
# drawn from two data shards as a run over two processes draws them (tests/experiments/test_reproduce_multihost.py).
# The smallest CALM run the metrics score (tests/experiments/test_calm.py), as command-line bindings.
CALM_TINY_RUN = ("--gin.templm.CalmStreamConfig.domains=['sports', 'politics']",
                 "--gin.templm.CalmStreamConfig.nswitches=50", "--gin.templm.CalmStreamConfig.switch_frequency=4",
                 "--gin.templm.CalmStreamConfig.window_size=8", "--gin.templm.CalmStreamConfig.batch_size=2",
                 "--gin.templm.CalmModelConfig.d_model=32", "--gin.templm.CalmModelConfig.d_head=16",
                 "--gin.templm.CalmModelConfig.d_inner=64", "--gin.templm.CalmModelConfig.n_layer=1",
                 "--gin.templm.CalmModelConfig.mem_len=8", "--gin.templm.CalmBaselineConfig.pretrain_batches=20",
                 "--gin.templm.CalmBaselineConfig.pretrain_passes=1",
                 "--gin.WorldConfig.end_year=2014", "--gin.WorldConfig.docs_per_month=10")

TINY_STUDY = ("reproduce", "--preset=tiny_test", "--seed=0", "--gin.templm.Study.data_shards=2")

# The inputs every verb reads in tests/test_reentrant_cli.py and tests/test_fault_matrix.py (tests/conftest.py's
# `verb_inputs`): a world, task data and a T5 run of two steps, at the smallest sizes the verbs accept.
VERB_WORLD_FLAGS = ("--start_year=2015", "--end_year=2017", "--subjects_per_relation=4", "--docs_per_month=6")
VERB_TASK_FLAGS = ("--vocab_size=200", "--future_years=1", "--gin.WorldConfig.start_year=2015",
                   "--gin.WorldConfig.end_year=2016", "--gin.WorldConfig.subjects_per_relation=4",
                   "--gin.WorldConfig.docs_per_month=3")
VERB_T5 = ("--gin_file=gin_configs/temporal.gin", "--gin_file=gin_configs/runs/cpu_demo.gin",
           "--gin.TASK_FEATURE_LENGTHS={'inputs': 32, 'targets': 8}", "--gin.BATCH_SIZE=8", "--gin.EVAL_PERIOD=0")


def xla_flags(devices):
    """The suite's XLA_FLAGS (tests/conftest.py) with `devices` fake CPU devices instead of its 8: for a process a
    test starts with a device count of its own, compiled as the suite's other processes are."""
    kept = [f for f in os.environ.get("XLA_FLAGS", "").split() if "host_platform_device_count" not in f]
    return " ".join([f"--xla_force_host_platform_device_count={devices}", *kept])


def run_templm(*args, cwd=REPO, env=None):
    """`templm ARGS` in this process (templm.cli.main) in `cwd` (the repository by default), with `env` added to the
    environment for the call: a CompletedProcess with the exit status and what it wrote to sys.stdout and
    sys.stderr. An `env` value of None takes the variable out for the call. Tests about the process itself (what
    reaches the terminal's descriptors, signals, limits) use `run_templm_process`."""
    import contextlib
    import io

    from templm.cli import main

    out, err = io.StringIO(), io.StringIO()
    saved_cwd, saved_env = os.getcwd(), dict(os.environ)
    try:
        os.chdir(cwd)
        for name, value in (env or {}).items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = main(list(args))
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
    return subprocess.CompletedProcess(["templm", *args], status, out.getvalue(), err.getvalue())


def run_templm_process(*args, cwd=REPO, env=None, timeout=900, **kwargs):
    """`python -m templm.cli ARGS` in a fresh process in `cwd`: the CompletedProcess, output as text."""
    return subprocess.run([sys.executable, "-m", "templm.cli", *args], capture_output=True, text=True, cwd=cwd,
                          env=None if env is None else {**os.environ, **env}, timeout=timeout, **kwargs)


def without_times(value):
    """A JSON value without the keys that hold a time (seconds, timings, rates, durations): what two runs of a verb
    on the same input must agree on. `time_stratified` is a split, not a time."""
    if isinstance(value, dict):
        return {k: without_times(v) for k, v in value.items()
                if not re.search(r"second|timing|time(?!_stratified)|elapsed|duration|rate|per_sec", k)}
    if isinstance(value, list):
        return [without_times(v) for v in value]
    return value


def folder_contents(out, bytes_only=False):
    """Every file under `out` as {path relative to it: its bytes}, a .json file as its value without the keys of a
    time (`without_times`) unless `bytes_only`."""
    import json

    found = {}
    for folder, _, names in os.walk(out):
        for name in names:
            path = os.path.join(folder, name)
            with open(path, "rb") as f:
                data = f.read()
            found[os.path.relpath(path, out)] = without_times(json.loads(data)) \
                if not bytes_only and name.endswith(".json") else data
    return found


def wmt_line(date, text, raw=None):
    """A line of WMT's document-level News Crawl as published: the date, the text split into sentences and the unsplit
    text (`raw`, by default the text's), both base64; the reader's id is the sha256 of the unsplit field."""
    import base64

    split = base64.b64encode(text.replace(". ", ".\n").encode()).decode()
    return f"{date:%Y%m%d}\t{split}\t{raw or base64.b64encode(text.encode()).decode()}\n"


def write_wmt_years(folder, lines_by_year):
    """One gzipped `news-docs.YEAR.en.filtered.gz` a year of {year: [wmt_line, ...]} in `folder`; returns the files."""
    import gzip

    files = []
    for year, lines in lines_by_year.items():
        path = os.path.join(folder, f"news-docs.{year}.en.filtered.gz")
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.writelines(lines)
        files.append(str(path))
    return files


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


def toy_step(state, batch, rng):
    """The toy step: adds the batch to the parameter; the loss is the new parameter (NaN when the batch is NaN)."""
    import jax.numpy as jnp

    params = state["params"] + batch["x"]
    return {"step": state["step"] + 1, "params": params}, {"loss": params, "param_norm": jnp.abs(params)}


def toy_run(tmp_path, start_state, train_steps, batches=None, start_step=0, save_period=0, **hooks):
    """The training loop (templm.training.loop.run) on a toy step into tmp_path: after step s, params = 1 + ... + s
    (the batch of position p is p + 1 unless `batches` says otherwise); checkpoints in tmp_path/checkpoints; `hooks`
    are loop.Hooks' fields."""
    import jax
    import jax.numpy as jnp

    from templm.training import loop
    from templm.training.checkpoints import Checkpointer

    checkpointer = Checkpointer(str(tmp_path / "checkpoints"), save_period, None)
    log = loop.MetricsLog(str(tmp_path))
    try:
        context = loop.RunContext(checkpointer, log, {"run": "test"}, jax.random.key(0), start_step, train_steps,
                                  log_period=2, tokens_per_step=8, hooks=loop.Hooks(**hooks))
        return loop.run(toy_step, start_state, batches or (lambda position: {"x": jnp.float32(position + 1)}),
                        context)
    finally:
        log.close()
        checkpointer.close()


def toy_state():
    import jax.numpy as jnp

    return {"step": jnp.zeros((), jnp.int32), "params": jnp.zeros((), jnp.float32)}


def lock_holder(lock_path, what):
    """A process that holds the templm lock `lock_path` until it is killed; returned once it holds the lock."""
    import textwrap

    script = textwrap.dedent(f"""
        import sys, time
        from templm.outputs import locked
        with locked({lock_path!r}, {what!r}):
            print("held", flush=True)
            time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "held", proc.stderr.read()
    return proc


def run_templm_stopped(when, *args, sig=None, timeout=300, **kwargs):
    """`run_templm(*args, **kwargs)` with SIGTERM (or `sig`) sent to this process, which runs the verb, as soon as
    `when()` is true (polled from a thread of its own; an AssertionError after `timeout` seconds without it). What the
    process as a whole does with a signal (its status, its last line, no crash on the way out) is for tests of a
    process; this is for what the verb does and leaves."""
    import signal
    import threading
    import time

    ended, seen = threading.Event(), []

    def watch():
        deadline = time.monotonic() + timeout
        while not ended.is_set() and time.monotonic() < deadline:
            if when():
                seen.append(True)
                os.kill(os.getpid(), sig or signal.SIGTERM)
                return
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, name="templm-test-signal")
    watcher.start()
    try:
        result = run_templm(*args, **kwargs)
    finally:
        ended.set()
        watcher.join()
    assert seen, f"the verb ended before the moment to stop it came: {result.stderr[-3000:]}"
    return result


class signal_at:
    """Within it, this process sends itself `signum` the first time a folder is made at `made` (the work has begun)
    or a file renamed to `renamed` (its result is being put in place): an audit hook, installed once for the rest of
    the process and idle outside the block. With `dropped`, the signal is sent from inside a garbage-collection
    callback, where the handler's exception (KeyboardInterrupt, Terminated) is printed and dropped, as in a real run a
    signal that lands in a finaliser. `.fired` says whether it was sent."""

    def __init__(self, signum, made=None, renamed=None, dropped=False):
        self.signum, self.dropped = signum, dropped
        self.made, self.renamed = made and str(made), renamed and str(renamed)
        self.fired = self.due = False

    def __enter__(self):
        import gc

        if not getattr(sys, "_templm_signal_hook", False):
            sys.addaudithook(_signal_on_event)
            gc.callbacks.append(_signal_in_collection)
            sys._templm_signal_hook = True
        _WATCH["watch"] = self
        return self

    def __exit__(self, *exc):
        _WATCH["watch"] = None
        return False


_WATCH = {"watch": None}


def _signal_on_event(event, args):
    watch = _WATCH["watch"]
    if watch is None or watch.fired or watch.due:
        return
    if (event == "os.mkdir" and watch.made == os.fspath(args[0])) or \
            (event == "os.rename" and watch.renamed == os.fspath(args[1])):
        if watch.dropped:
            import gc

            watch.due = True
            gc.collect()  # the callback sends the signal now, before the rename or after the folder is made
        else:
            watch.fired = True
            os.kill(os.getpid(), watch.signum)


def _signal_in_collection(phase, info):
    watch = _WATCH["watch"]
    if phase == "start" and watch is not None and watch.due and not watch.fired:
        watch.fired = True
        os.kill(os.getpid(), watch.signum)
        for _ in range(1000):  # Python runs the handler at a jump of this loop: its exception ends the callback
            pass


def wait_for_path(path, proc, timeout=240, poll=0.01):
    """Returns once `path` exists while `proc` (a Popen with stderr piped) runs; an AssertionError if the process
    ends first (with its error output) or the path does not appear in `timeout` seconds (the process is killed)."""
    import time

    start = time.time()
    while not os.path.exists(path):
        if proc.poll() is not None:
            raise AssertionError(f"the process ended before {path} appeared: {proc.stderr.read()[-3000:]}")
        if time.time() - start > timeout:
            proc.kill()
            raise AssertionError(f"{path} did not appear in {timeout} s")
        time.sleep(poll)


def event_tags(folder):
    """{tag: [(step, value), ...]} of the TensorBoard event files in `folder`."""
    import tensorflow as tf

    out = {}
    for name in sorted(os.listdir(folder)):
        for event in tf.compat.v1.train.summary_iterator(os.path.join(folder, name)):
            for value in event.summary.value:
                number = value.simple_value if value.HasField("simple_value") else float(
                    tf.make_ndarray(value.tensor))
                out.setdefault(value.tag, []).append((event.step, number))
    return out


# A knowledge graph and three documents that name its entities (templm.data.linked_mentions, templm.models.kglm).
ENTITIES = [{"id": "E0", "name": "Ada Lovel", "type": "politician", "first_date": "2010-01-01"},
            {"id": "E1", "name": "Bree", "type": "party", "first_date": "2010-01-01"},
            {"id": "E2", "name": "Corvo", "type": "city", "first_date": "2010-01-01"},
            {"id": "E3", "name": "Dane", "type": "club", "first_date": "2010-01-01"},
            {"id": "E4", "name": "Fenn", "type": "party", "first_date": "2012-01-01"}]
FACTS = [{"id": 0, "subject": "E0", "relation": "member_of", "object": "E1", "start": "2010-01-01", "end": None},
         {"id": 1, "subject": "E3", "relation": "located_in", "object": "E2", "start": "2012-01-01",
          "end": "2013-12-31"},
         {"id": 2, "subject": "E0", "relation": "member_of", "object": "E4", "start": "2013-06-01", "end": None}]
# (id, date, text, the names it mentions in order); sentences end at each "."
MINI_DOCS = [("d1", "2014-05-01", "Ada Lovel joined Bree in Corvo. Dane won.", ["Ada Lovel", "Bree", "Corvo", "Dane"]),
        ("d2", "2013-02-01", "Dane plays in Corvo.", ["Dane", "Corvo"]),
        ("d3", "2014-07-01", "Fenn and Bree met Ada Lovel.", ["Fenn", "Bree", "Ada Lovel"])]
NAMES = {e["name"]: e["id"] for e in ENTITIES}


def write_mini_world(folder, docs=MINI_DOCS, entities=ENTITIES, facts=FACTS):
    """A world folder of five entities and three documents in the generator's layout (world.json, news.jsonl,
    mentions.jsonl: the mention and sentence spans in characters), for the knowledge-graph LM's tests."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "world.json").write_text(json.dumps({"config": {}, "entities": entities, "facts": facts,
                                                   "words": []}))
    with open(folder / "news.jsonl", "w") as news, open(folder / "mentions.jsonl", "w") as mentions:
        for doc_id, date, text, names in docs:
            news.write(json.dumps({"id": doc_id, "date": date, "text": text}) + "\n")
            spans, at = [], 0
            for name in names:
                start = text.index(name, at)
                spans.append([start, start + len(name), NAMES[name]])
                at = start + len(name)
            sentences, begin = [], 0
            for end in [i + 1 for i, ch in enumerate(text) if ch == "."]:
                sentences.append([begin, end, "test"])
                begin = end + 1
            mentions.write(json.dumps({"id": doc_id, "facts": [], "entities": spans, "sentences": sentences}) + "\n")
    return str(folder)


def stream_lexicon():
    """(the 60 made-up words the streaming tests' tokenizer, tests/fixtures/stream64.model, was trained on, the
    seeded generator that drew them: tools/write_test_spm.py draws its documents from it)."""
    import random

    rng = random.Random(3)
    return ["".join(rng.choice("abcdefghiklmnoprstuvy") for _ in range(rng.randint(2, 7))) for _ in range(60)], rng
