"""templm's path layer and its checks against the emulator (tests/cloud/conftest.py): URLs never made local
names, files through every client, the checks before any work (a missing bucket, no route, no credentials), the
lock of a run folder in a bucket, and every verb given a URL where it writes."""

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from templm import paths, remote
from templm.errors import DataError
from templm.io import atomic_write_files
from templm.outputs import lock_inside
from cloud_testing import CONFIG, closed_port
from templm_testing import REPO, run_templm


def test_urls_are_never_made_local_names():
    assert paths.absolute("gs://b/x/y/") == "gs://b/x/y"
    assert paths.join("gs://b/x", "c", "d.json") == "gs://b/x/c/d.json"
    assert paths.dirname("gs://b/x/y") == "gs://b/x" and paths.dirname("gs://b/x") == "gs://b"
    assert paths.basename("gs://b/x/y.json") == "y.json" and paths.bucket("gs://b/x") == "b"
    assert paths.is_url("ram://x") and not paths.is_url("gs:/b/x") and not paths.is_url("./gs:")
    assert paths.absolute("rel/x") == os.path.join(os.getcwd(), "rel", "x")


def test_the_table_of_docs_cloud_md_is_what_the_verbs_serve():
    from templm.cli.options import URL_SERVED

    page = open(os.path.join(REPO, "docs", "cloud.md"), encoding="utf-8").read()
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
    port = closed_port()
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
    port = closed_port()
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
        deadline = time.monotonic() + 30  # beats every 0.2 s; a loaded machine gets 30 s to show one
        while json.loads(gcs.read(bucket, ".templm.lock"))["heartbeat"] == first:
            assert time.monotonic() < deadline, "the heartbeat did not advance"
            time.sleep(0.05)
    assert ".templm.lock" not in gcs.objects(bucket)


@pytest.mark.parametrize("cause", ["no route", "no credentials"])
def test_data_tasks_refuses_an_unreachable_bucket_before_any_work(gcs, cause, tmp_path, monkeypatch):
    """The same command, with the storage host unreachable or no credentials on the machine: one line naming the
    output and the cause, exit 1, nothing built (locally or anywhere)."""
    port = closed_port()
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
    assert lines[-1].startswith("templm train: error: gs://no-such-bucket-y/t: MODEL_DIR: cannot write there: the "
                                "bucket gs://no-such-bucket-y does not exist"), result.stderr[-2000:]
    assert os.listdir(tmp_path) == []  # nothing built locally


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
    "data calm": ["--world_dir", "world", "--out", MISSING],
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


def test_a_plain_file_in_a_bucket_is_read_a_line_in_pieces_as_a_local_one(gcs, bucket, tmp_path):
    """A bucket's file (tf.io.gfile's GFile) reads whole lines, however long: a plain .jsonl in a bucket was read
    without the line limit a local or compressed one has. Buffered, its over-long line is read through in pieces and
    dropped as on a local disk: the same documents, the same message naming the line."""
    from templm.data.readers import JsonlReader

    doc = lambda i: json.dumps({"id": f"d{i}", "date": "2014-01-01", "text": "a short text"})  # noqa: E731
    local = tmp_path / "news.jsonl"
    local.write_text(doc(1) + "\n" + "x" * 50_000 + "\n" + doc(2) + "\n")
    url = f"gs://{bucket}/news.jsonl"
    paths.copy(str(local), url, overwrite=True)
    seen = {}
    for path in (str(local), url):
        reader = JsonlReader(path, on_error="skip", max_line_bytes=1000)
        seen[path] = ([d.id for d in reader], reader.skipped, reader.first_errors[0].replace(path, "FILE"))
    assert seen[url] == seen[str(local)] == (["d1", "d2"], 1, "FILE:2: a line longer than 1,000 bytes: not read "
                                                              "(a document or record is megabytes at most)")
    with pytest.raises(DataError, match=r"news.jsonl:2: a line longer than 1,000 bytes"):
        list(JsonlReader(url, max_line_bytes=1000))
