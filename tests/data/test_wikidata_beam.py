"""TempLAMA from a Wikidata dump on Apache Beam (templm.data.wikidata_beam): the same train/val/test.jsonl bytes and
stats.json counts as the single-process reading, on the hand-made dump that exercises every rule
(tests/fixtures/wikidata_dump.json, one entity a line as `latest-all.json` writes it) and on a gzipped copy with the
objects' lines moved before their subjects', with Beam's local runner in this process and with two worker
processes; through the command line (`templm data templama --runner=FnApiRunner`) too."""

import gzip
import json
import os

import pytest

from templm.data.wikidata import build_templama
from templm.data.wikidata_beam import LOOKUP_STATS, build_templama_beam
from templm.errors import DataError
from templm_testing import REPO, run_templm, run_templm_process

DUMP = os.path.join(REPO, "tests", "fixtures", "wikidata_dump.json")
IN_PROCESS = ["--runner=FnApiRunner", "--direct_num_workers=1"]
TWO_WORKERS = ["--runner=FnApiRunner", "--direct_num_workers=2", "--direct_running_mode=multi_processing"]


def _outputs(folder):
    files = {name: (folder / name).read_bytes() for name in ("train.jsonl", "val.jsonl", "test.jsonl")}
    stats = json.loads((folder / "stats.json").read_text())
    for key in (*LOOKUP_STATS, "seconds"):  # how the single process found its names, and its time
        stats.pop(key)
    return files, stats


def _reordered_gz(tmp_path):
    """The dump gzipped, its lines in another order: the last entity lines (the objects) first."""
    with open(DUMP, encoding="utf-8") as f:
        lines = [line.rstrip("\n").rstrip(",") for line in f][1:-1]
    path = tmp_path / "reordered.json.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write("[\n" + ",\n".join(lines[-9:] + lines[:-9]) + "\n]\n")
    return str(path)


@pytest.mark.parametrize("dump, options", [("as published", IN_PROCESS), ("as published", TWO_WORKERS),
                                           ("gzipped, objects first", IN_PROCESS)],
                         ids=["one worker", "two worker processes", "gzipped, objects first"])
def test_beam_gives_the_single_process_files(tmp_path, options, dump):
    path = DUMP if dump == "as published" else _reordered_gz(tmp_path)
    settings = dict(max_subjects=4, seed=0, require_enwiki=False)
    build_templama(path, str(tmp_path / "single"), **settings)
    build_templama_beam(path, str(tmp_path / "beam"), options, **settings)
    single, beam = _outputs(tmp_path / "single"), _outputs(tmp_path / "beam")
    assert beam == single
    assert single[1]["queries"] > 0 and single[1]["dropped_subject_no_enwiki"] == 0


def test_with_a_temp_location_the_pipeline_leaves_its_work_there_and_removes_it(tmp_path):
    """On Dataflow the workers write their results where the driver reads them: under --temp_location (a bucket)."""
    temp = tmp_path / "temp"
    temp.mkdir()
    build_templama(DUMP, str(tmp_path / "single"), require_enwiki=False)
    build_templama_beam(DUMP, str(tmp_path / "beam"), IN_PROCESS + [f"--temp_location={temp}"], require_enwiki=False)
    assert _outputs(tmp_path / "beam") == _outputs(tmp_path / "single")
    assert os.listdir(temp) == []


def test_the_command_line_runs_the_pipeline_and_refuses_a_malformed_line_naming_the_file(tmp_path):
    common = ["data", "templama", f"--dump={DUMP}", "--max_subjects=4"]
    assert run_templm(*common, f"--out={tmp_path / 'single'}").returncode == 0
    result = run_templm(*common, f"--out={tmp_path / 'beam'}", "--runner=FnApiRunner")
    assert result.returncode == 0, result.stderr[-2000:]
    assert _outputs(tmp_path / "beam") == _outputs(tmp_path / "single")  # require_enwiki, the paper's rule

    bad = tmp_path / "bad.json"
    with open(DUMP, encoding="utf-8") as f:
        lines = f.read().splitlines()
    bad.write_text("\n".join(lines[:5] + ['{"id": "Q999", "labels": {oops},'] + lines[5:]) + "\n")
    result = run_templm("data", "templama", f"--dump={bad}", f"--out={tmp_path / 'bad'}", "--runner=FnApiRunner")
    assert result.returncode == 1, result.stderr[-2000:]
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith(f"templm data templama: error: {bad}") and "malformed JSON" in line, line
    assert "{oops}" in line and "Traceback" not in result.stderr
    assert not (tmp_path / "bad").exists() and not (tmp_path / "bad.partial").exists()


def test_a_malformed_line_in_the_pipeline_is_a_data_error_naming_the_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('[\n{"id": "Q1", "labels": [1, 2\n]\n')
    with pytest.raises(DataError, match="malformed JSON.*the line that begins"):
        build_templama_beam(str(bad), str(tmp_path / "out"), IN_PROCESS, require_enwiki=False)


@pytest.mark.e2e
def test_beam_s_worker_processes_are_heard_only_when_asked(tmp_path):
    """Beam's SDK worker processes log at INFO to the standard error they inherit (20-odd lines each, whatever the
    driver's log settings): a fresh `templm data templama` on two of them leaves standard error empty, and with
    --verbosity=1 their lines are there; the same result either way."""
    args = ["data", "templama", f"--dump={DUMP}", "--max_subjects=4", "--norequire_enwiki", "--runner=FnApiRunner",
            "--pipeline_options=--direct_num_workers=2,--direct_running_mode=multi_processing"]
    quiet = run_templm_process(*args, f"--out={tmp_path / 'quiet'}")
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr[-3000:]
    loud = run_templm_process(*args, f"--out={tmp_path / 'loud'}", "--verbosity=1")
    assert loud.returncode == 0, loud.stderr[-3000:]
    assert loud.stderr.count("Python sdk harness starting") >= 2, loud.stderr[-3000:]
    assert json.loads(quiet.stdout) == json.loads(loud.stdout) and json.loads(quiet.stdout)["queries"] > 0
