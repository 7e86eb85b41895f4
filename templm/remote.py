"""Object stores (gs://) where templm reads and writes: the check of a location before any work, and the lock of a
run folder in a bucket.

* `check_location(url, what, write=True)`: one request (a create-only probe object, then its removal; or a read of
  the object or prefix) before any work, so that a bucket that does not exist, no credentials, no route to the
  host or no permission is one line naming the path and the cause (a DataError), not a traceback after the work.
  gs:// goes through google-cloud-storage (its errors say which of these it is, and it does not retry for
  minutes as TensorFlow's client does); other schemes through tf.io.gfile.
* `object_lock(url, what)`: a create-only object (`ifGenerationMatch=0`) holding the run's identity (command, pid,
  host, start, heartbeat). A second run is refused naming the holder. The holder refreshes the heartbeat every
  HEARTBEAT seconds (each write conditional on the generation it wrote last); a lock is stale, and taken over by a
  conditional write (so that of two runs that find it stale one wins), when its holder is a process of this host
  that no longer exists, or when its heartbeat is older than STALE_AFTER seconds (a run killed on another host).
  On schemes without preconditions (s3://, ram://) the lock is a best effort: an existence check, then a write.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import socket
import sys
import threading
import time
import uuid
from typing import Any, Dict, Iterator, Optional, Tuple

from templm import paths
from templm.errors import DataError

HEARTBEAT = 60.0
STALE_AFTER = 600.0
_TIMEOUT = (10, 60)  # (connect, read) seconds of one request to the store


def _storage_client():
    """A google-cloud-storage client (STORAGE_EMULATOR_HOST points it at an emulator, as its docs say)."""
    from google.cloud import storage

    return storage.Client()


def _split(url: str) -> Tuple[str, str]:
    """(bucket, object name or prefix) of a URL."""
    return paths.bucket(url), paths.key(url)


def _cause(error: BaseException, url: str) -> str:
    """What a failed request to the store says about why, in words a user acts on."""
    from google.api_core import exceptions as api
    from google.auth import exceptions as auth

    bucket = f"gs://{_split(url)[0]}"
    if isinstance(error, auth.DefaultCredentialsError):
        return ("no Google Cloud credentials on this machine: run `gcloud auth application-default login`, or set "
                "GOOGLE_APPLICATION_CREDENTIALS to a service account's key file")
    if isinstance(error, auth.RefreshError):
        return f"the Google Cloud credentials were refused ({_first_line(error)}): log in again"
    if isinstance(error, api.NotFound):
        return f"the bucket {bucket} does not exist (or these credentials cannot see it): create it or fix the name"
    if isinstance(error, (api.Forbidden, api.Unauthorized)):
        return f"no permission to {'write' if 'POST' in str(error) or 'PUT' in str(error) else 'use'} {bucket} " \
               f"with these credentials ({_first_line(error)})"
    if _is_connection_error(error):
        host = os.environ.get("STORAGE_EMULATOR_HOST") or "storage.googleapis.com"
        return f"cannot reach {host}: no route to the storage host ({_first_line(error)})"
    return _first_line(error)


def _is_connection_error(error: BaseException) -> bool:
    import requests
    from google.auth import exceptions as auth

    while error is not None:
        if isinstance(error, (requests.ConnectionError, requests.Timeout, auth.TransportError, ConnectionError,
                              TimeoutError)):
            return True
        error = error.__cause__ or error.__context__
    return False


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return (text[0] if text else type(error).__name__)[:300]


def check_location(url: str, what: str, write: bool = True) -> None:
    """Raises DataError naming `url` and the cause unless it can be written (or, `write` False, read) now. Local
    paths are not checked here."""
    if not paths.is_url(url):
        return
    if paths.scheme(url) == "gs":
        _check_gcs(url, what, write)
    else:
        _check_gfile(url, what, write)


def _check_gcs(url: str, what: str, write: bool) -> None:
    name, key = _split(url)
    try:
        bucket = _storage_client().bucket(name)
        if write:
            probe = bucket.blob(_object_name(key, f".templm-probe-{uuid.uuid4().hex}"))
            probe.upload_from_string(b"", if_generation_match=0, timeout=_TIMEOUT, retry=None)
            probe.delete(timeout=_TIMEOUT, retry=None)
        elif not bucket.blob(key).exists(timeout=_TIMEOUT, retry=None) and not any(
                bucket.list_blobs(prefix=key.rstrip("/") + "/" if key else None, max_results=1, timeout=_TIMEOUT,
                                  retry=None)):
            raise DataError(f"{what}: no such object or folder", url)
    except DataError:
        raise
    except Exception as e:  # the client's errors, classified by _cause
        raise DataError(f"{what}: {'cannot write there' if write else 'cannot read it'}: {_cause(e, url)}; "
                        "nothing was done", url) from None


def _object_name(prefix: str, name: str) -> str:
    return f"{prefix.rstrip('/')}/{name}" if prefix else name


def _check_gfile(url: str, what: str, write: bool) -> None:
    try:
        if write:
            paths.makedirs(url)
            probe = paths.join(url, f".templm-probe-{uuid.uuid4().hex}")
            with paths.open(probe, "wb") as f:
                f.write(b"")
            paths.remove(probe)
        elif not paths.exists(url):
            raise DataError(f"{what}: no such object or folder", url)
    except DataError:
        raise
    except Exception as e:
        raise DataError(f"{what}: {'cannot write there' if write else 'cannot read it'}: {_first_line(e)}; "
                        "nothing was done", url) from None


# ---------------------------------------------------------------------------------------------------------------------
# The lock of a run folder in a bucket.

def _holder() -> Dict[str, Any]:
    return {"pid": os.getpid(), "host": socket.gethostname(), "command": " ".join(sys.argv[:3]) or "python",
            "since": datetime.datetime.now().isoformat(timespec="seconds"), "heartbeat": time.time(),
            "token": uuid.uuid4().hex}


class _GcsObject:
    """One object with generation preconditions (google-cloud-storage)."""

    def __init__(self, url: str):
        name, key = _split(url)
        self.blob = _storage_client().bucket(name).blob(key)

    def create(self, text: str) -> Optional[int]:
        from google.api_core import exceptions as api

        try:
            self.blob.upload_from_string(text, if_generation_match=0, timeout=_TIMEOUT)
        except api.PreconditionFailed:
            return None
        return self.blob.generation

    def read(self) -> Tuple[Optional[str], Optional[int]]:
        from google.api_core import exceptions as api

        try:
            text = self.blob.download_as_text(timeout=_TIMEOUT)
        except api.NotFound:
            return None, None
        return text, self.blob.generation

    def replace(self, text: str, generation: int) -> Optional[int]:
        from google.api_core import exceptions as api

        try:
            self.blob.upload_from_string(text, if_generation_match=generation, timeout=_TIMEOUT)
        except (api.PreconditionFailed, api.NotFound):
            return None
        return self.blob.generation

    def delete(self, generation: int) -> None:
        from google.api_core import exceptions as api

        try:
            self.blob.delete(if_generation_match=generation, timeout=_TIMEOUT)
        except (api.PreconditionFailed, api.NotFound):
            pass


class _GfileObject:
    """The same without preconditions (a best effort): the generation is the token the content holds."""

    def __init__(self, url: str):
        self.url = url

    def read(self) -> Tuple[Optional[str], Optional[str]]:
        if not paths.exists(self.url):
            return None, None
        with paths.open(self.url) as f:
            text = f.read()
        try:
            return text, json.loads(text).get("token")
        except ValueError:
            return text, None

    def create(self, text: str) -> Optional[str]:
        if paths.exists(self.url):
            return None
        return self._write(text)

    def replace(self, text: str, generation) -> Optional[str]:
        if self.read()[1] != generation:
            return None
        return self._write(text)

    def _write(self, text: str) -> str:
        with paths.open(self.url, "w") as f:
            f.write(text)
        return json.loads(text)["token"]

    def delete(self, generation) -> None:
        if self.read()[1] == generation:
            paths.remove(self.url)


def _alive_here(holder: Dict[str, Any]) -> bool:
    """False when `holder` is a process of this host that no longer exists."""
    if holder.get("host") != socket.gethostname():
        return True
    try:
        os.kill(int(holder.get("pid", 0)), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError, TypeError):
        return True
    return True


def _stale(holder: Dict[str, Any], now: float) -> bool:
    return not _alive_here(holder) or now - float(holder.get("heartbeat", 0)) > STALE_AFTER


@contextlib.contextmanager
def object_lock(url: str, what: str) -> Iterator[None]:
    """Holds the lock object `url` for the block (module docstring); DataError naming the holder when it is held."""
    store = _GcsObject(url) if paths.scheme(url) == "gs" else _GfileObject(url)
    me = _holder()
    generation = store.create(json.dumps(me))
    if generation is None:
        text, found = store.read()
        try:
            holder = json.loads(text) if text else {}
        except ValueError:
            holder = {}
        if text is None:  # released between the two requests
            generation = store.create(json.dumps(me))
        elif isinstance(holder, dict) and "pid" in holder and _stale(holder, time.time()):
            generation = store.replace(json.dumps(me), found)
        if generation is None:
            if not (isinstance(holder, dict) and "pid" in holder):
                raise DataError("is not a templm lock (templm takes this name for its lock): move it away; nothing "
                                "was changed", url)
            age = time.time() - float(holder.get("heartbeat", 0))
            raise DataError(
                f"{what} is in use by `{holder.get('command', 'templm')}` (pid {holder.get('pid', '?')} on "
                f"{holder.get('host', '?')}, since {holder.get('since', '?')}, last heard from {age:.0f} s ago); "
                f"wait for it to end, or stop it. A run killed on another host leaves its lock until it is "
                f"{STALE_AFTER:.0f} s old; if you know that run has ended, remove the lock: gcloud storage rm {url}",
                url)
    state = {"generation": generation}
    stop = threading.Event()

    def beat():
        while not stop.wait(HEARTBEAT):
            me["heartbeat"] = time.time()
            try:
                renewed = store.replace(json.dumps(me), state["generation"])
            except Exception:  # a failed heartbeat is retried at the next one
                continue
            if renewed is None:
                from templm import console

                console.warn(f"the lock {url} was taken over by another run (it found this run's heartbeat older "
                             f"than {STALE_AFTER:.0f} s): two runs may now write {what}")
                return
            state["generation"] = renewed

    thread = threading.Thread(target=beat, name="templm-lock-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        store.delete(state["generation"])
