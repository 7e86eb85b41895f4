"""Run by Python at start-up in every process a test starts (tests/conftest.py puts this folder on PYTHONPATH):
installs tests/support/read_guard.py's hook from the environment, then runs the sitecustomize this one hides, if
the interpreter has one."""

import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _load(name, location):
    spec = importlib.util.spec_from_file_location(name, location)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_load("templm_read_guard", os.path.join(os.path.dirname(_HERE), "read_guard.py")).install_from_environment()

_others = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
_spec = importlib.machinery.PathFinder.find_spec("sitecustomize", _others)
if _spec is not None and _spec.origin:
    _load("_hidden_sitecustomize", _spec.origin)
