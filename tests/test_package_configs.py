"""The gin configs ship inside the package (templm/gin_configs, package data in setup.py; the repository's
gin_configs/ is a link to it): a wheel of the checkout, installed into a fresh virtual environment and run from a
folder outside the checkout, finds `temporal.gin` and `runs/cpu_demo.gin` on its search path and the study presets
of `templm reproduce --preset`."""

import glob
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile

import pytest

from templm_testing import xla_flags

pytestmark = pytest.mark.e2e

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What `pip wheel` reads of the checkout: built from a copy, so no build/ folder is left in (or stale in) the checkout.
SOURCES = ["setup.py", "setup.cfg", "pyproject.toml", "MANIFEST.in", "README.md", "templm", "tasks"]


def _run(args, **kwargs):
    return subprocess.run(args, capture_output=True, text=True, timeout=600, **kwargs)


def _wheel(tmp_path):
    source = tmp_path / "source"
    source.mkdir()
    for name in SOURCES:
        path = os.path.join(REPO, name)
        if os.path.isdir(path):
            shutil.copytree(path, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        elif os.path.isfile(path):
            shutil.copy(path, source / name)
    built = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                  "-w", str(tmp_path / "wheel"), str(source)])
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = glob.glob(str(tmp_path / "wheel" / "templm-*.whl"))
    return wheel


def _fresh_venv(tmp_path, wheel):
    """A virtual environment of its own with the wheel installed, seeing the dependencies of this one (its
    site-packages named in a .pth file, after its own, so its templm is the wheel's)."""
    venv = tmp_path / "venv"
    made = _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    assert made.returncode == 0, made.stderr
    python = str(venv / "bin" / "python")
    installed = _run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index",
                      "--quiet", wheel])
    assert installed.returncode == 0, installed.stderr[-3000:]
    site_packages = sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)})
    ours = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
    with open(os.path.join(site_packages, "dependencies.pth"), "w", encoding="utf-8") as f:
        f.write("".join(f"{path}\n" for path in sorted(ours)))
    return venv, site_packages


def test_an_installed_wheel_finds_its_configs_from_anywhere(tmp_path, verb_inputs):
    wheel = _wheel(tmp_path)
    shipped = {name for name in zipfile.ZipFile(wheel).namelist() if name.startswith("templm/gin_configs/")}
    in_checkout = {os.path.relpath(os.path.join(folder, name), REPO)
                   for folder, _, names in os.walk(os.path.join(REPO, "templm", "gin_configs")) for name in names}
    assert shipped == in_checkout and "templm/gin_configs/t5x/requirements.txt" in shipped
    assert os.path.realpath(os.path.join(REPO, "gin_configs")) == os.path.join(REPO, "templm", "gin_configs")

    venv, site_packages = _fresh_venv(tmp_path, wheel)
    elsewhere = tmp_path / "elsewhere"  # outside the checkout: nothing there but what a run writes
    elsewhere.mkdir()
    templm = str(venv / "bin" / "templm")
    where = _run([str(venv / "bin" / "python"), "-c", "import templm; print(templm.__file__); "
                  "print(templm.CONFIG_DIR)"], cwd=elsewhere)
    assert where.returncode == 0, where.stderr
    module, config_dir = where.stdout.split()
    assert module == os.path.join(site_packages, "templm", "__init__.py")  # the wheel's, not the checkout's
    assert os.path.isfile(os.path.join(config_dir, "study", "smoke.gin"))

    data = verb_inputs["data"]  # the session's task data (`data tasks` reads no config file)

    model_dir = tmp_path / "model"
    # One device (the suite's processes see 8 fake ones): the run is about finding its configs, and the step of a
    # one-device mesh compiles in less time (25 s of CPU for the command, against 34 s on 8 devices).
    one_device = {"XLA_FLAGS": xla_flags(1)}
    trained = _run([templm, "train", "--gin_file=temporal.gin", "--gin_file=runs/cpu_demo.gin",
                    "--gin.TASK_FEATURE_LENGTHS={'inputs': 32, 'targets': 8}", "--gin.BATCH_SIZE=8",
                    "--gin.EVAL_PERIOD=0", "--gin.TRAIN_STEPS=2", f"--gin.MODEL_DIR='{model_dir}'"],
                   cwd=elsewhere, env={**os.environ, "TEMPLM_DATA_DIR": str(data), **one_device})
    assert trained.returncode == 0, trained.stderr[-3000:]
    config = (model_dir / "config.gin").read_text()
    assert "TRAIN_STEPS = 2" in config and "num_encoder_layers" in config  # temporal.gin, its includes, cpu_demo
    assert "2" in os.listdir(model_dir / "checkpoints")

    # The preset is found in the installed package and parsed (with study/smoke.gin, which it includes): a study
    # with every field bound reaches the check of the values, and the binding on top is refused before any work.
    study = _run([templm, "reproduce", "--preset=tiny_test", f"--out={tmp_path / 'study'}", "--gin.Study.steps=0"],
                 cwd=elsewhere)
    assert study.returncode == 1
    assert "templm reproduce: error: templm.Study.steps: must be at least 1, got 0" in study.stderr, study.stderr
    assert not (tmp_path / "study").exists()
    assert os.listdir(elsewhere) == []


def test_python_requires_is_the_oldest_python_every_pinned_dependency_installs_on():
    """setup.py's python_requires is what the pins need, read from the installed distributions' own Requires-Python:
    each pin accepts it, and at least one refuses the Python before it (jax 0.10.2 refused 3.10 while setup.py still
    said >=3.10, and pip on a Cloud TPU image failed on jaxlib with no word of Python)."""
    import ast
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet

    tree = ast.parse(open(os.path.join(REPO, "setup.py"), encoding="utf-8").read())
    pins = next(ast.literal_eval(node.value) for node in ast.walk(tree)
                if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "INSTALL_REQUIRES")
    ours = next(ast.literal_eval(k.value) for node in ast.walk(tree) if isinstance(node, ast.Call)
                for k in node.keywords if k.arg == "python_requires")
    oldest = ours.removeprefix(">=")
    major, minor = (int(x) for x in oldest.split("."))
    before = f"{major}.{minor - 1}"
    refusing = []
    for pin in pins:
        needs = metadata.metadata(Requirement(pin).name).get("Requires-Python")
        if not needs:
            continue
        accepts = SpecifierSet(needs)
        assert accepts.contains(oldest), f"{pin} needs Python {needs}, setup.py says {ours}"
        if not accepts.contains(before):
            refusing.append(pin)
    assert refusing, f"every pin installs on Python {before}: setup.py's {ours} is stricter than they need"
