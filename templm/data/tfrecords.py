"""TFRecord files written with the file system's failures named: TensorFlow's writer reports a full disk ("File too
large", "No space left on device") as its own OpError, which the command line took for a bug (a traceback). Here it
is the OSError it is, naming the file (exit 4). `data tasks` and `data cronquestions` write through it."""

from __future__ import annotations

from typing import Any, Callable

from templm.errors import as_os_error


def _tf():
    import tensorflow as tf  # deferred: seconds to import

    return tf


def system_errors(call: Callable[[], Any], path: str) -> Any:
    """call(), with a failure of the file system that TensorFlow reports as its own error raised as an OSError naming
    `path`."""
    try:
        return call()
    except _tf().errors.OpError as e:
        raise as_os_error(e, path, "writing TFRecords") or e from None


class RecordFile:
    """One TFRecord file, opened when made: `write(record)`, `close()`, or a with-block that closes it (on the way
    out of a failure too, without hiding it)."""

    def __init__(self, path: str):
        self.path = path
        self._writer = system_errors(lambda: _tf().io.TFRecordWriter(path), path)

    def write(self, record: bytes) -> None:
        system_errors(lambda: self._writer.write(record), self.path)

    def close(self) -> None:
        system_errors(self._writer.close, self.path)

    def __enter__(self) -> "RecordFile":
        return self

    def __exit__(self, kind, error, trace) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001  (the failure inside the block is the one to report)
            if error is None:
                raise
