"""The T5 trainer's input pipeline (templm/training/input_pipeline.py): the faster converter settings give seqio's
batches exactly; data shards read disjoint files, give the same global batch for any number of processes, and
continue from a saved state."""

import os

import numpy as np
import pytest
import seqio

from templm import tasks
from templm.data.task_data import TaskDataConfig
from templm.data.world import WorldConfig
from templm.errors import ConfigError, DataError
from templm.training.input_pipeline import TrainingInput, training_batches


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
    ours = training_batches(name, lengths, 16, 3, pack)
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


def _years(vocabulary, batch):
    """The year of each row's example, from its "year: YYYY" prefix (the Temporal regime)."""
    return {int(vocabulary.decode(row.tolist()).split()[1]) for row in batch["encoder_input_tokens"]}


def test_data_shards_read_disjoint_files_that_together_are_the_whole_split(data_dir):
    """Three shards of a task with one training file per year: each process reads one year's file only, no two
    share one, and together they read every training year."""
    name, lengths = "customnews_ssm_temporal", {"inputs": 64, "targets": 16}
    vocabulary = seqio.get_mixture_or_task(name).output_features["inputs"].vocabulary
    train_years = set(tasks.current()["train_years"])
    assert len(train_years) == 3
    seen = []
    for p in range(3):
        inputs = TrainingInput(name, lengths, 6, 5, False, data_shards=3, process=(p, 3))
        assert inputs.shards == [p] and inputs.rows == 2
        seen.append(set().union(*(_years(vocabulary, inputs.next()) for _ in range(30))))
        inputs.close()
    assert all(len(years) == 1 for years in seen)
    assert set().union(*seen) == train_years


def test_the_global_batch_is_the_same_for_one_process_or_two(data_dir):
    name, lengths = "temporal_mixture", {"inputs": 32, "targets": 8}
    one = TrainingInput(name, lengths, 8, 3, True, data_shards=2, process=(0, 1))
    two = [TrainingInput(name, lengths, 8, 3, True, data_shards=2, process=(p, 2)) for p in range(2)]
    for _ in range(5):
        whole, halves = one.next(), [t.next() for t in two]
        for key in whole:
            np.testing.assert_array_equal(whole[key], np.concatenate([h[key] for h in halves]), err_msg=key)
    with pytest.raises(ConfigError, match=r"DatasetConfig.shards 3 must be a multiple of the number of processes"):
        TrainingInput(name, lengths, 8, 3, True, data_shards=3, process=(0, 2))


def test_a_saved_input_state_continues_where_it_stopped(data_dir):
    """The state restored into a fresh pipeline gives the batches the first one gave next: no batch is replayed."""
    name, lengths = "temporal_mixture", {"inputs": 32, "targets": 8}
    first = TrainingInput(name, lengths, 8, 4, True, data_shards=2, process=(0, 1))
    for _ in range(7):
        first.next()
    saved = first.state()
    assert sorted(saved) == ["shard-00000-of-00002", "shard-00001-of-00002"]
    expected = [first.next() for _ in range(3)]
    second = TrainingInput(name, lengths, 8, 4, True, data_shards=2, process=(0, 1))
    second.restore(saved, "test")
    for want in expected:
        got = second.next()
        for key in want:
            np.testing.assert_array_equal(got[key], want[key], err_msg=key)
    other = TrainingInput(name, lengths, 8, 4, True, data_shards=4, process=(0, 4))  # one of four shards' pipelines
    with pytest.raises(DataError, match="no input state for shard-00000-of-00004"):
        other.restore(saved, "test")


def _ids(path):
    import tensorflow as tf

    return [tf.train.Example.FromString(r.numpy()).features.feature["id"].bytes_list.value[0]
            for r in tf.data.TFRecordDataset(path)]


def test_a_year_written_in_several_files_gives_each_data_shard_files_of_its_own(task_data_for, data_dir, capsys):
    """`files_per_year=2` deals each year's records into two files (the same records as one file holds), and two
    data shards then read files of their own; with more shards than files, each reads them all, with a warning."""
    split = task_data_for("files", TaskDataConfig(world=WorldConfig(seed=2, start_year=2013, end_year=2016,
                                                                    subjects_per_relation=6, docs_per_month=10),
                                                  vocab_size=300, future_years=1, files_per_year=2))
    try:
        folder = os.path.join(split, "customnews")
        parts = [os.path.join(folder, f"train-2014-0000{i}-of-00002.tfrecord") for i in range(2)]
        assert not os.path.exists(os.path.join(folder, "train-2014.tfrecord"))
        ids = [_ids(p) for p in parts]
        assert abs(len(ids[0]) - len(ids[1])) <= 1 and not set(ids[0]) & set(ids[1])
        assert sorted(ids[0] + ids[1]) == sorted(_ids(os.path.join(data_dir, "customnews", "train-2014.tfrecord")))
        lengths = {"inputs": 32, "targets": 8}
        TrainingInput("temporal_mixture", lengths, 8, 3, True, data_shards=2, process=(0, 2)).close()
        assert "fewer train files" not in capsys.readouterr().err
        TrainingInput("temporal_mixture", lengths, 8, 3, True, data_shards=8, process=(0, 2)).close()
        err = capsys.readouterr().err
        assert "customnews_ssm_temporal (6), templama_temporal (6): fewer train files than the 8 data shards" in err
    finally:
        tasks.configure(data_dir=data_dir)


def test_a_pipeline_tf_data_cannot_save_falls_back_to_the_data_position(data_dir, capsys):
    """A preprocessor with a Python function makes the iterator unsavable: state() is None with one warning, so the
    checkpoints hold the data position only (and a resume replays), instead of every save failing."""
    import tensorflow as tf

    vocabulary = tasks.current()["vocabulary"]
    features = {name: seqio.Feature(vocabulary) for name in ("inputs", "targets")}

    def source(split, shuffle_files, seed=None):
        return tf.data.Dataset.from_tensor_slices({"inputs": ["the city voted"] * 8, "targets": ["tram"] * 8})

    def python_identity(ds):
        def identity(ex):
            text = tf.py_function(lambda x: x, [ex["inputs"]], tf.string)
            return {**ex, "inputs": tf.ensure_shape(text, [])}

        return ds.map(identity)

    seqio.TaskRegistry.add("python_function_test", seqio.FunctionDataSource(source, splits=["train"]),
                           preprocessors=[python_identity, seqio.preprocessors.tokenize,
                                          seqio.preprocessors.append_eos], output_features=features)
    try:
        inputs = TrainingInput("python_function_test", {"inputs": 16, "targets": 4}, 4, 0, True, process=(0, 1))
        inputs.next()
        assert inputs.state() is None and inputs.state() is None
        err = capsys.readouterr().err
        assert err.count("the input pipeline of python_function_test cannot save its position") == 1, err
        assert "PyFunc is stateful" in err and "a resume reads the consumed batches again" in err
        inputs.close()
    finally:
        seqio.TaskRegistry.remove("python_function_test")


def test_close_lets_go_of_the_pipelines_in_a_thread_that_deletes_them(data_dir):
    """close() hands the iterators to a thread of their own (their deletion can wait while a pipeline is still
    filling); once that thread ends none is alive, so none can outlive the process, and a closed input has none."""
    import threading
    import weakref

    inputs = TrainingInput("temporal_mixture", {"inputs": 64, "targets": 16}, 8, 3, True, data_shards=2,
                           process=(0, 1))
    inputs.next()
    alive = [weakref.ref(it) for it in inputs._iterators]
    assert len(alive) == 2 and all(ref() is not None for ref in alive)
    inputs.close()
    assert inputs._iterators == []
    for thread in [t for t in threading.enumerate() if t.name == "templm-input-close"]:
        thread.join()
    assert all(ref() is None for ref in alive)
