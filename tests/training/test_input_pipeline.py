"""The T5 trainer's input pipeline (templm/training/input_pipeline.py): the faster converter settings give seqio's
batches exactly."""

import numpy as np
import pytest
import seqio

from templm.data.task_data import TaskDataConfig
from templm.data.world import WorldConfig
from templm.training.input_pipeline import training_batches


@pytest.fixture(scope="module")
def data_dir(task_data_for):
    return task_data_for("pipeline", TaskDataConfig(world=WorldConfig(seed=2, start_year=2013, end_year=2016,
                                                                      subjects_per_relation=6, docs_per_month=10),
                                                    vocab_size=300, future_years=1))


@pytest.mark.parametrize("name,pack", [("temporal_mixture", True), ("customnews_ssm_temporal", False)])
def test_training_batches_are_exactly_seqios_defaults(data_dir, name, pack):
    """The trainer's faster pipeline (no per-example length assertions, fused maps) yields seqio's batches."""
    lengths = {"inputs": 64, "targets": 16}  # room for two examples in a row
    reference = seqio.get_dataset(name, lengths, dataset_split="train", shuffle=True, num_epochs=None, seed=3,
                                  feature_converter=seqio.EncDecFeatureConverter(pack=pack)).batch(16)
    ours = training_batches(name, lengths, 16, 3, pack, 0)
    expected, got = reference.as_numpy_iterator(), ours.as_numpy_iterator()
    shared_rows = 0
    for _ in range(40):
        a, b = next(expected), next(got)
        assert sorted(a) == sorted(b)
        for key in a:
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)
        shared_rows += int((a.get("encoder_segment_ids", np.zeros((1, 1))).max(axis=1) > 1).sum())
    assert (shared_rows > 0) == pack  # packed batches do hold rows of several examples
    del expected, got
