"""The reproduction's presets fit the world of a seed (templm/experiments/reproduce.py, streaming.py): the data and
vocabulary stages of the smoke and small presets, T5 and Transformer-XL halves, pass for a seed each (two seeds in
all), with a vocabulary of at most the preset's size. The sweep over 20 seeds is tools/sweep_presets.py (its figures
in BENCHMARKS.md); its check of one seed is the one run here."""

import importlib.util
import os

import pytest

from templm import tasks

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SEEDS = {"smoke": 100, "small": 101}  # none of them used by a preset run elsewhere in the repository


def _sweep():
    spec = importlib.util.spec_from_file_location("sweep_presets", os.path.join(REPO, "tools", "sweep_presets.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("preset", ["smoke", "small"])
def test_data_and_vocabulary_stages_pass_for_a_seed(preset, tmp_path):
    sweep = _sweep()
    assert sweep.parse_seeds("3-5,9") == [3, 4, 5, 9]
    from templm.experiments.reproduce import PRESETS

    with tasks.registration_scope():
        rows = [sweep.check_seed(preset, SEEDS[preset], str(tmp_path))]
    for row in rows:
        assert 100 < row["t5_pieces"] <= PRESETS[preset].vocab_size
        assert len(row["stream_pieces"]) >= 2  # one tokenizer per setup, each on its own training split
        assert all(n > 0 for n in row["stream_documents"].values())

