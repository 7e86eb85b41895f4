"""What templm's Beam pipelines share: the pipeline run quietly, the folder where the workers leave their (small)
results for the driver, and reading them back."""

from __future__ import annotations

import contextlib
import tempfile
import uuid
from typing import Any, Iterator, List, Optional

from templm import console, paths


@contextlib.contextmanager
def pipeline(options: Any) -> Iterator[Any]:
    """`beam.Pipeline(options=options)`, run when the block ends, as `with beam.Pipeline(...)` runs it. With library
    logs off (absl's verbosity at ERROR or below: the command line without --verbosity) standard error, the file
    descriptor, is on /dev/null while it is built and run. Beam's SDK worker processes (the local runners'
    `--direct_running_mode=multi_processing`) log at INFO to the standard error they inherit, whatever the driver's
    settings: 20-odd lines a worker. A worker's failure still reaches the error the run raises, which the command
    line prints."""
    import apache_beam as beam

    with console.silenced_unless_verbose():
        with beam.Pipeline(options=options) as built:
            yield built


@contextlib.contextmanager
def work_folder(options: Any, prefix: str, work_dir: Optional[str] = None) -> Iterator[str]:
    """A folder every worker can write: `work_dir` if given (kept), else a new folder under the pipeline options'
    --temp_location (a bucket on Dataflow), else a temporary folder here; the last two are removed afterwards."""
    from apache_beam.options.pipeline_options import GoogleCloudOptions

    temp_location = options.view_as(GoogleCloudOptions).temp_location
    with tempfile.TemporaryDirectory(prefix=prefix) as local:
        work = work_dir or (paths.join(temp_location, f"{prefix}{uuid.uuid4().hex}") if temp_location else local)
        try:
            yield work
        finally:
            if work != local and not work_dir:
                paths.rmtree(work)


def read_lines(pattern: str) -> List[str]:
    """The lines of the files a pattern matches (the shards Beam wrote), in the files' name order."""
    lines: List[str] = []
    for path in sorted(paths.glob(pattern)):
        with paths.open(path, "r", encoding="utf-8") as f:
            lines.extend(line for line in f.read().splitlines() if line)
    return lines
