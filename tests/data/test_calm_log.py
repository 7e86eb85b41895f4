"""The CALM loss log: the original's fields written per batch, atomic logs, and reading a log back with every
malformed line answered by a DataError naming the file and line."""

import json
import os

import numpy as np
import pytest

from templm.data.calm_corpus import build_calm_corpus_from_texts
from templm.data.calm_log import LossLogger, log_loss, read_loss_log
from templm.data.calm_stream import CALM
from templm.errors import DataError
from templm.metrics.calm import compute_metrics

SIZES = {"alpha": 2400, "beta": 1800, "gamma": 3000}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A word-level corpus of three classes, one line each: tokens "<c><i>" for i < the class's size."""
    src = tmp_path_factory.mktemp("src")
    for name, size in SIZES.items():
        (src / f"{name}.txt").write_text(" ".join(f"{name[0]}{i}" for i in range(size)) + "\n", encoding="utf-8")
    out = str(tmp_path_factory.mktemp("calm") / "corpus")
    build_calm_corpus_from_texts(str(src), out, "word")
    return out


def _calm(corpus, seed=0, **kw):
    args = dict(switch_frequency=4 * 5 * 3, nswitches=6, window_size=5, batch_size=4)
    args.update(kw)
    return CALM(corpus, "word", seed=seed, **args)


@pytest.mark.parametrize("line, reason", [
    ("{not json", "not JSON"),
    ('[1, 2]', "JSON object"),
    ('{"loss": 1.0, "domain": 0, "sequence": 3}', "domain_name"),
    ('{"loss": true, "domain": 0, "domain_name": "A", "sequence": 3}', "loss"),
    ('{"loss": NaN, "domain": 0, "domain_name": "A", "sequence": 3}', "loss"),
    ('{"loss": 1.0, "domain": 0, "domain_name": "A", "sequence": 1}', "must not decrease"),
    ('{"loss": 1.0, "domain": 1, "domain_name": "B", "sequence": 2}', "changes class"),
    ('{"loss": 1.0, "domain": 0, "domain_name": "Z", "sequence": 3}', "named"),
    ('{"loss": 1.0, "domain": -1, "domain_name": "A", "sequence": 3}', "domain"),
    ("", "empty line"),
])
def test_malformed_log_lines_name_file_and_line(tmp_path, line, reason):
    path = tmp_path / "log.jsonl"
    good = [json.dumps({"loss": 1.0, "domain": 0, "domain_name": "A", "sequence": 2})] * 2
    path.write_text("\n".join(good + [line]) + "\n")
    with pytest.raises(DataError, match=reason) as e:
        read_loss_log(str(path))
    assert e.value.path == str(path) and e.value.line == 3


def test_log_round_trip(corpus, tmp_path):
    calm = _calm(corpus, seed=4, nswitches=40)  # 120 segments: enough for metrics
    path = str(tmp_path / "loss.jsonl")
    with LossLogger(path) as log:
        for item in calm:
            log.log(item, np.float32(1.0 + item.domain + 0.01 * item.batch))
    with open(path) as f:
        rows = [json.loads(line) for line in f]
    assert len(rows) == len(calm)
    assert all(list(r) == ["loss", "domain", "domain_name", "sequence"] for r in rows)
    items = list(calm)
    assert [(r["domain"], r["domain_name"], r["sequence"]) for r in rows] == \
        [(i.domain, i.domain_name, i.sequence) for i in items]
    assert rows[0]["loss"] == pytest.approx(1.0 + items[0].domain)
    m = compute_metrics(read_loss_log(path))
    assert {f"loss_{n}" for n in calm.class_names} <= set(m)
    # The original's call shape: log_loss(file, the iterator, loss) logs the iterator's current batch.
    with open(tmp_path / "other.jsonl", "w") as f:
        for _ in zip(range(3), calm):
            log_loss(f, calm, 2.5)
    with open(tmp_path / "other.jsonl") as f:
        assert [json.loads(line) for line in f] == [
            {"loss": 2.5, "domain": i.domain, "domain_name": i.domain_name, "sequence": i.sequence}
            for i in items[:3]]
    # A run that fails leaves no log behind.
    with pytest.raises(RuntimeError):
        with LossLogger(str(tmp_path / "failed.jsonl")) as log:
            log.log(items[0], 1.0)
            raise RuntimeError("model diverged")
    assert sorted(os.listdir(tmp_path)) == ["loss.jsonl", "other.jsonl"]



def test_read_loss_log_gives_the_rows_in_log_order(tmp_path):
    path = tmp_path / "log.jsonl"
    lines = [{"loss": 1.5, "domain": 1, "domain_name": "B", "sequence": 0},
             {"loss": 2, "domain": 1, "domain_name": "B", "sequence": 0},
             {"loss": float("inf"), "domain": 0, "domain_name": "A", "sequence": 3}]
    path.write_text("".join(json.dumps(row) + "\n" for row in lines))
    rows = read_loss_log(str(path))
    assert rows == [(1.5, 1, "B", 0), (2.0, 1, "B", 0), (float("inf"), 0, "A", 3)]
    assert all(isinstance(r[0], float) for r in rows)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert read_loss_log(str(empty)) == []
    with pytest.raises(DataError, match="cannot read the loss log"):
        read_loss_log(str(tmp_path / "missing.jsonl"))
