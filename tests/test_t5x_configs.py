"""gin_configs/t5x/*.gin serve users of upstream T5X: t5x is not installable here, so check them as text against
T5X's finetune run config (commit 0183fb0) and templm's registry."""

import os
import re

import pytest
import seqio

import tasks  # noqa: F401  (the default registry: the embedded world's years)

CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(__file__)), "gin_configs", "t5x")
T5X_INCLUDES = {"t5x/examples/t5/t5_1_1/small.gin", "t5x/configs/runs/finetune.gin"}
# The macros T5X's t5x/configs/runs/finetune.gin and t5_1_1/small.gin define.
T5X_MACROS = {"MODEL_DIR", "MIXTURE_OR_TASK_NAME", "TASK_FEATURE_LENGTHS", "MIXTURE_OR_TASK_MODULE", "TRAIN_STEPS",
              "INITIAL_CHECKPOINT_PATH", "DROPOUT_RATE", "USE_CACHED_TASKS", "BATCH_SIZE", "EVAL_STEPS",
              "EVAL_PERIOD", "EVALUATOR_USE_MEMORY_CACHE", "EVALUATOR_NUM_EXAMPLES", "JSON_WRITE_N_RESULTS",
              "USE_HARDWARE_RNG", "RANDOM_SEED"}


@pytest.mark.parametrize("regime", ["uniform", "temporal", "yearly"])
def test_t5x_config_uses_known_macros_and_registered_tasks(regime):
    with open(os.path.join(CONFIG_DIR, f"{regime}.gin")) as f:
        lines = [line for line in f.read().splitlines() if line.strip() and not line.startswith("#")]
    assert "import tasks" in lines
    includes = {m.group(1) for line in lines for m in [re.match(r"include '(.+)'", line)] if m}
    assert includes == T5X_INCLUDES
    macros = {m.group(1): m.group(2) for line in lines for m in [re.match(r"([A-Z_]+) = (.+)", line)] if m}
    assert set(macros) <= T5X_MACROS, set(macros) - T5X_MACROS
    name = macros["MIXTURE_OR_TASK_NAME"].strip("'")
    mixture = seqio.get_mixture_or_task(name)
    assert name.startswith(regime)
    lengths = eval(macros["TASK_FEATURE_LENGTHS"], {})  # a plain dict literal
    assert set(lengths) == set(mixture.output_features)
