"""The reproduction's presets fit the world of any seed (templm/experiments/reproduce.py, streaming.py): the data
and vocabulary stages of the smoke and small presets, T5 and Transformer-XL halves, pass for 20 seeds each, with a
vocabulary of at most the preset's size (fewer pieces where a seed's text supports fewer)."""

import pytest
import sentencepiece

from templm import tasks
from templm.experiments.reproduce import PRESETS, Reproduction
from templm.experiments.streaming import PRESETS as STREAM_PRESETS
from templm.experiments.streaming import prepare_preset_data

SEEDS = range(100, 120)  # none of them used by a preset run elsewhere in the repository


@pytest.mark.parametrize("preset", ["smoke", "small"])
def test_data_and_vocabulary_stages_pass_for_20_seeds(preset, tmp_path):
    pieces = {"t5": set(), "stream": set()}
    try:
        for seed in SEEDS:
            run = Reproduction(PRESETS[preset], str(tmp_path / f"{preset}_{seed}"), seed)
            data = run.prepare_data()
            data.check()  # the time-aware half can run on it
            assert data.seen and data.future and data.manifest["counts"]["templama"]["test"]
            model = sentencepiece.SentencePieceProcessor(model_file=f"{run.data_dir}/spm/vocab.model")
            assert 100 < model.get_piece_size() <= PRESETS[preset].vocab_size
            pieces["t5"].add(model.get_piece_size())
            data = prepare_preset_data(str(tmp_path / f"{preset}_{seed}" / "stream"), preset, seed)
            for spm_file in data["spm_models"].values():  # one per setup, each on its own training split
                model = sentencepiece.SentencePieceProcessor(model_file=spm_file)
                assert 100 < model.get_piece_size() <= STREAM_PRESETS[preset].vocab_size
                pieces["stream"].add(model.get_piece_size())
            assert all(data["splits"]["splits"][name]["documents"] > 0 for name in
                       ("time_stratified_train", "control_train", "test"))
    finally:
        tasks.configure()
    assert pieces["t5"] and pieces["stream"]
