"""`templm eval` refuses what it cannot evaluate before it restores anything: an unknown task, a split the task does
not have, and a number of examples below one (which used to mean "everything")."""

import pytest

from templm.errors import ConfigError
from templm.evaluation.checkpoint_eval import evaluate_checkpoint

LENGTHS = {"inputs": 32, "targets": 8}


@pytest.mark.parametrize("kwargs,message", [
    ({"split": "nosuch"}, "split 'nosuch': temporal_mixture has the splits test, train, validation"),
    ({"eval_mixture_or_task_name": "templama_temporal", "split": "dev"},
     "split 'dev': templama_temporal has the splits test, train, validation"),
    ({"num_examples": 0}, "num_examples must be at least 1, got 0"),
    ({"num_examples": -1}, "num_examples must be at least 1, got -1"),
    ({"eval_mixture_or_task_name": "no_such_task"}, "no task or mixture named 'no_such_task'"),
])
def test_what_cannot_be_evaluated_is_refused_before_any_work(tmp_path, kwargs, message):
    with pytest.raises(ConfigError) as e:
        evaluate_checkpoint(model_dir=str(tmp_path / "no_model_here"), mixture_or_task_name="temporal_mixture",
                            task_feature_lengths=LENGTHS, model=None, **kwargs)
    assert message in str(e.value)
