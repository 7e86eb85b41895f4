"""The CALM loss log: one JSON line per batch, written as the stream is scored and read back for the metrics.

`log_loss` / `LossLogger` write one JSON line per batch with exactly the original's fields ``loss``, ``domain``
(class index), ``domain_name`` and ``sequence`` (segment id), so logs are comparable with the original's.
`read_loss_log` reads a log back as (loss, domain, domain_name, sequence) rows, checked line by line: segment ids must
not decrease from line to line, a segment keeps one class, and a class index keeps one name; anything else (and any
malformed line) is a `DataError` naming the file and line. The metrics of the rows are
`templm.metrics.calm.compute_metrics`.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from typing import IO, Any, Dict, List, Mapping, Optional, Tuple, Union

import numpy as np

from templm import paths
from templm.data.calm_stream import CALM, CalmBatch
from templm.errors import DataError, loads_json

LOG_FIELDS = ("loss", "domain", "domain_name", "sequence")

LogRow = Tuple[float, int, str, int]  # (loss, domain, domain_name, sequence)


# --------------------------------------------------------------------------------------------------------------------
# The loss log.


def _log_fields(item: Union[CalmBatch, CALM, Mapping[str, Any]]) -> Tuple[int, str, int]:
    if isinstance(item, CALM):
        if item.current is None:
            raise ValueError("the CALM iterator has not yielded a batch yet")
        item = item.current
    if isinstance(item, CalmBatch):
        return item.domain, item.domain_name, item.sequence
    if isinstance(item, Mapping):
        try:
            return int(item["domain"]), str(item["domain_name"]), int(item["sequence"])
        except KeyError as e:
            raise ValueError(f"a log item needs domain, domain_name and sequence; missing {e}") from None
    raise TypeError(f"expected a CalmBatch, a CALM iterator or a mapping, got {type(item).__name__}")


def log_loss(file: IO[str], item: Union[CalmBatch, CALM, Mapping[str, Any]], loss: Any) -> None:
    """Writes one JSON line `{"loss", "domain", "domain_name", "sequence"}` (the original's fields) to `file`.

    `item` is the batch the loss belongs to (or the CALM iterator, meaning its current batch, as in the original, or a
    mapping with those fields); `loss` is any scalar (numpy and JAX scalars included). NaN is refused; an infinite
    loss is written as Python's json writes it (`Infinity`), which `read_loss_log` reads."""
    domain, domain_name, sequence = _log_fields(item)
    value = float(np.asarray(loss).reshape(()))  # raises on non-scalars
    if math.isnan(value):
        raise ValueError(f"loss is NaN (segment {sequence}, class {domain_name!r})")
    row = {"loss": value, "domain": domain, "domain_name": domain_name, "sequence": sequence}
    file.write(json.dumps(row, ensure_ascii=False) + "\n")


class LossLogger:
    """A loss log written to a temporary file and renamed to `path` on `close()` (a `with` block that raises
    leaves nothing behind). `log(item, loss)` as `log_loss`."""

    def __init__(self, path: str):
        self.path = path
        # In a bucket the log is written locally and put as one object at close().
        directory = None if paths.is_url(path) else os.path.dirname(os.path.abspath(path))
        fd, self._tmp = tempfile.mkstemp(dir=directory, prefix="." + paths.basename(path) + ".", suffix=".tmp")
        self._file: Optional[IO[str]] = os.fdopen(fd, "w", encoding="utf-8")
        self.count = 0

    def log(self, item: Union[CalmBatch, CALM, Mapping[str, Any]], loss: Any) -> None:
        if self._file is None:
            raise ValueError(f"the loss log {self.path} is closed")
        log_loss(self._file, item, loss)
        self.count += 1

    def close(self) -> None:
        if self._file is None:
            return
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        self._file = None
        if paths.is_url(self.path):
            paths.copy(self._tmp, self.path, overwrite=True)
            os.unlink(self._tmp)
        else:
            os.replace(self._tmp, self.path)

    def abort(self) -> None:
        """Discards the log."""
        if self._file is not None:
            self._file.close()
            self._file = None
        try:
            os.unlink(self._tmp)
        except OSError:
            pass

    def __enter__(self) -> "LossLogger":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


# --------------------------------------------------------------------------------------------------------------------
# Reading a log.


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def read_loss_log(log_file: str) -> List[LogRow]:
    """The (loss, domain, domain_name, sequence) rows of a loss log, validated (see the module docstring)."""
    rows: List[LogRow] = []
    names: Dict[int, str] = {}
    domains: Dict[str, int] = {}
    try:
        f = paths.open(log_file, encoding="utf-8")
    except OSError as e:
        raise DataError(f"cannot read the loss log: {e.strerror or e}", log_file) from e
    with f:
        lineno = 0
        try:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    raise DataError("empty line; expected a JSON object with loss, domain, domain_name, sequence",
                                    log_file, lineno)
                try:
                    row = loads_json(line)
                except json.JSONDecodeError as e:
                    raise DataError(f"not JSON ({e.msg}); expected an object with loss, domain, domain_name, "
                                    f"sequence", log_file, lineno) from None
                if not isinstance(row, dict):
                    raise DataError(f"expected a JSON object, got {type(row).__name__}", log_file, lineno)
                missing = [k for k in LOG_FIELDS if k not in row]
                if missing:
                    raise DataError(f"missing field(s) {', '.join(missing)}", log_file, lineno)
                loss, domain, name, sequence = (row[k] for k in LOG_FIELDS)
                if isinstance(loss, bool) or not isinstance(loss, (int, float)) or math.isnan(loss):
                    raise DataError(f"loss must be a number, got {loss!r}", log_file, lineno)
                if not _is_int(domain) or domain < 0:
                    raise DataError(f"domain must be a class index (integer >= 0), got {domain!r}", log_file,
                                    lineno)
                if not isinstance(name, str):
                    raise DataError(f"domain_name must be a string, got {name!r}", log_file, lineno)
                if not _is_int(sequence) or sequence < 0:
                    raise DataError(f"sequence must be a segment id (integer >= 0), got {sequence!r}", log_file,
                                    lineno)
                if names.setdefault(domain, name) != name:
                    raise DataError(f"class {domain} is named {name!r} here but {names[domain]!r} earlier",
                                    log_file, lineno)
                if domains.setdefault(name, domain) != domain:
                    raise DataError(f"class name {name!r} has index {domain} here but {domains[name]} earlier",
                                    log_file, lineno)
                if rows:
                    prev_sequence, prev_domain = rows[-1][3], rows[-1][1]
                    if sequence < prev_sequence:
                        raise DataError(f"segment id {sequence} after {prev_sequence}; segment ids must not "
                                        f"decrease", log_file, lineno)
                    if sequence == prev_sequence and domain != prev_domain:
                        raise DataError(f"segment {sequence} changes class from {prev_domain} to {domain}",
                                        log_file, lineno)
                rows.append((float(loss), domain, name, sequence))
        except UnicodeDecodeError as e:
            raise DataError(f"invalid UTF-8 ({e.reason})", log_file, lineno + 1) from None
    return rows
