"""Small file and value helpers every layer shares: atomic writes, JSON-safe values, file digests, durations."""

from __future__ import annotations

import datetime
import hashlib
import json
import math
import os
import tempfile
from typing import Any, Callable, Mapping, Optional, Union

from templm import paths


def atomic_write(path: str, content: Union[str, bytes, Callable[[str], None]]) -> str:
    """Writes `path` through a temporary file beside it, renamed into place only when complete, so a reader (or a
    crash) never sees a half-written file. `content` is text, bytes, or a function that writes the temporary path it
    is given (e.g. a figure's savefig). On an error the temporary file is removed and `path` is left as it was."""
    path = os.fspath(path)
    atomic_write_files({path: content})
    return path


def atomic_write_files(contents: Mapping[str, Union[str, bytes, Callable[[str], None]]]) -> None:
    """Writes several files that belong together (a vocabulary's .model and .vocab) as `atomic_write` writes one:
    every one to a temporary file beside its place first, then all renamed, so a failure while writing (a full disk)
    leaves every path as it was. A failed write names the file it was writing.

    A URL (gs://) is an object in a store with no rename: its content is made in full first (a callable's in a local
    temporary file), then uploaded to its place, where the object appears only complete and replaces the old one at
    once. Several objects are put one after the other: each is whole, but a failure between two leaves the first
    new and the second old."""
    contents = {os.fspath(path): content for path, content in contents.items()}
    remote = {path: content for path, content in contents.items() if paths.is_url(path)}
    if remote:
        _put_objects(remote)
    written = {}
    try:
        for path, content in contents.items():
            if path in remote:
                continue
            stem, ext = os.path.splitext(os.path.basename(path))
            fd, written[path] = tempfile.mkstemp(prefix=f".{stem}.", suffix=f"{ext}.tmp",
                                                 dir=os.path.dirname(os.path.abspath(path)))
            try:
                if callable(content):
                    os.close(fd)
                    content(written[path])
                else:
                    with os.fdopen(fd, "wb") as f:
                        f.write(content.encode("utf-8") if isinstance(content, str) else content)
                        f.flush()
                        os.fsync(f.fileno())
            except OSError as e:  # a write to the open file names none
                raise write_failure_named(e, path) from None
            os.chmod(written[path], 0o644)
        for path, tmp in written.items():
            os.replace(tmp, path)
    except BaseException:
        for tmp in written.values():
            try:
                os.unlink(tmp)
            except OSError:
                pass
        raise


def _put_objects(contents: Mapping[str, Union[str, bytes, Callable[[str], None]]]) -> None:
    with tempfile.TemporaryDirectory(prefix="templm-put-") as tmp:
        made = {}
        for i, (path, content) in enumerate(contents.items()):
            if callable(content):
                made[path] = os.path.join(tmp, f"{i}{os.path.splitext(paths.basename(path))[1]}")
                content(made[path])
                with open(made[path], "rb") as f:
                    made[path] = f.read()
            else:
                made[path] = content.encode("utf-8") if isinstance(content, str) else content
        for path, data in made.items():
            with paths.open(path, "wb") as f:
                f.write(data)


def jsonable(value: Any) -> Any:
    """A copy of `value` with JSON types only: dict keys become strings, tuples lists, numpy scalars and arrays
    Python numbers and lists, dates ISO strings, and non-finite floats None (JSON has no NaN or infinity)."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (str, bool)) or value is None:
        return value
    if isinstance(value, (datetime.date, datetime.datetime)):
        return value.isoformat()
    if hasattr(value, "tolist"):  # numpy arrays and scalars, jax arrays
        return jsonable(value.tolist())
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, int):
        return value
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def write_failure_named(error: OSError, path: str) -> OSError:
    """`error`, a failed write, naming `path` where it names no file (a full disk, a file-size limit: "File too
    large"), so that a verb's one line says which file it was writing; an error that names its file, as it is."""
    if error.errno and not error.filename:
        return OSError(error.errno, f"{os.strerror(error.errno)} while writing it", path)
    return error


class NamedWrites:
    """A local file opened for writing whose failures name it: an OSError of a write, flush or close that names no
    file (a full disk, a file-size limit: "File too large") is raised again naming `path`, so that a verb's one line
    says which file it was writing even when several are open at once (`shown`: the name to give, e.g. the final
    name of a temporary file)."""

    def __init__(self, path: str, mode: str = "w", shown: Optional[str] = None, **kwargs: Any):
        self.path = os.fspath(shown or path)
        self._file = self._call(lambda: open(os.fspath(path), mode, **kwargs))

    def _call(self, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except OSError as e:
            raise write_failure_named(e, self.path) from None

    def write(self, data: Any) -> int:
        return self._call(lambda: self._file.write(data))

    def flush(self) -> None:
        self._call(self._file.flush)

    def close(self) -> None:
        self._call(self._file.close)

    def __enter__(self) -> "NamedWrites":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        if exc_info[0] is None:
            self.close()
        else:  # already failing: close without hiding that error
            try:
                self._file.close()
            except OSError:
                pass


def json_text(value: Any, sort_keys: bool = False) -> str:
    """`jsonable(value)` as the indented JSON text templm writes (`write_json`)."""
    return json.dumps(jsonable(value), indent=1, sort_keys=sort_keys, allow_nan=False) + "\n"


def write_json(path: str, value: Any, sort_keys: bool = False) -> str:
    """`jsonable(value)` as indented JSON, written atomically; returns the path."""
    return atomic_write(path, json_text(value, sort_keys))


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with paths.open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def format_duration(seconds: float) -> str:
    """2m13s, 1h05m12s; '?' for an unknown (infinite or NaN) duration."""
    if seconds is None or not math.isfinite(seconds):
        return "?"
    minutes, sec = divmod(int(round(max(seconds, 0.0))), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{sec:02d}s" if hours else f"{minutes}m{sec:02d}s"


def lookup(value: Any, *path: Any, default: Any = None) -> Any:
    """value[path[0]][path[1]]...; `default` where a key is missing or a level is not a mapping (results dicts)."""
    for key in path:
        if not isinstance(value, Mapping) or key not in value:
            return default
        value = value[key]
    return value
