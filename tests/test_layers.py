"""The layering of WORKSPACE.md holds: every module of templm sits in a layer of .importlinter, and no module imports
from a layer above its own (function-local imports included). A deliberate upward import makes the check fail."""

import configparser
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _layers():
    config = configparser.ConfigParser()
    config.read(os.path.join(ROOT, ".importlinter"))
    text = config["importlinter:contract:layers"]["layers"]
    return [name.strip() for line in text.split("\n") for name in line.split("|") if name.strip()]


def _lint(root):
    env = {**os.environ, "PYTHONPATH": root}
    return subprocess.run([sys.executable, "-c", "import sys; from importlinter.cli import lint_imports; "
                           "sys.exit(lint_imports())"], cwd=root, env=env, capture_output=True, text=True)


def test_every_module_of_templm_is_in_a_layer():
    layers = set(_layers())
    names = set()
    for entry in os.listdir(os.path.join(ROOT, "templm")):
        path = os.path.join(ROOT, "templm", entry)
        if entry.endswith(".py") and entry != "__init__.py":
            names.add("templm." + entry[:-3])
        elif os.path.isfile(os.path.join(path, "__init__.py")):
            names.add("templm." + entry)
    assert names - layers == set(), "modules outside every layer of .importlinter"
    assert {"templm.tasks", "templm.cli", "templm.data", "templm.errors"} <= layers


def test_imports_only_point_down():
    result = _lint(ROOT)
    assert result.returncode == 0, result.stdout[-4000:]


@pytest.mark.parametrize("module,upward", [("templm/data/records.py", "templm.cli"),
                                           ("templm/metrics/qa.py", "templm.training.trainer")])
def test_an_upward_import_breaks_the_check(tmp_path, module, upward):
    for name in ("templm",):
        shutil.copytree(os.path.join(ROOT, name), tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(os.path.join(ROOT, ".importlinter"), tmp_path / ".importlinter")
    with open(tmp_path / module, "a", encoding="utf-8") as f:
        f.write(f"\n\ndef _late():\n    import {upward}  # noqa: F401\n")
    result = _lint(str(tmp_path))
    assert result.returncode != 0
    assert f"{module[:-3].replace('/', '.')} -> {upward}" in result.stdout


def test_the_seams_of_the_training_path_take_config_objects_not_long_lists():
    """The trainers, the loop and the experiments' entry points take T5X-shaped config objects (issue 40: they took
    17 to 28 parameters each); a seam that grows past a dozen parameters wants another object."""
    import inspect

    from templm.experiments.calm import run_calm
    from templm.experiments.streaming import stream_evaluation
    from templm.training import kglm_trainer, lm_trainer, loop, trainer

    counts = {f.__name__: len(inspect.signature(f).parameters)
              for f in (trainer.train, lm_trainer.train_lm, kglm_trainer.train_latent_lm, loop.run, run_calm,
                        stream_evaluation)}
    # (run_calm and stream_evaluation took `overwrite` with the output-folder contract of issue 44)
    assert counts == {"train": 12, "train_lm": 10, "train_latent_lm": 10, "run": 4, "run_calm": 8,
                      "stream_evaluation": 10}
