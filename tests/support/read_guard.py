"""What the suite must never touch: the folders a run of the product leaves behind (the checkout's `runs/`, which
`make demo` fills) and the user's cache (`~/.cache`, where templm keeps its world and compilation caches).

A test that opens, lists, renames or removes anything there depends on what happened on this machine before the
suite ran, and may change a user's results. `install(roots, log_path)` adds an audit hook (PEP 578) that appends one
line per such touch to `log_path`; tests/conftest.py installs it in the suite's process and, through
`read_guard_site/sitecustomize.py` on PYTHONPATH, in every Python process a test starts, and fails the test during
which a line was written. The hook sees what Python code opens or lists (open, os.open, os.listdir, os.scandir and
the calls built on them: glob, os.walk, shutil); files that native code opens by itself (TensorFlow's file system,
SentencePiece loading a model by name) pass unseen, so the suite also points templm's cache at a folder of its own.
"""

import os
import sys

# Audit events whose first argument (for renames also the second) is a path the event touches.
_EVENTS = {"open": 1, "os.listdir": 1, "os.scandir": 1, "os.remove": 1, "os.rmdir": 1, "os.mkdir": 1,
           "os.rename": 2, "shutil.rmtree": 1, "shutil.copytree": 2, "shutil.move": 2}

ROOTS_ENV = "TEMPLM_TEST_FORBIDDEN"  # os.pathsep-separated folders
LOG_ENV = "TEMPLM_TEST_READ_LOG"

_state = {"roots": (), "fd": None, "busy": False}


def forbidden_roots(repo):
    """The folders no test may touch: the checkout's runs/ and the user's cache, each also as its real path."""
    home_cache = os.path.join(os.path.expanduser("~"), ".cache")
    roots = []
    for folder in (os.path.join(repo, "runs"), home_cache):
        for form in (os.path.abspath(folder), os.path.realpath(folder)):
            if form not in roots:
                roots.append(form)
    return roots


def touched_root(path, roots):
    """The root in `roots` that `path` (relative to the working directory) lies in, or None."""
    if isinstance(path, int):  # an open file descriptor
        return None
    try:
        text = os.fsdecode(path)
    except TypeError:
        return None
    absolute = os.path.abspath(text)
    for root in roots:
        if absolute == root or absolute.startswith(root + os.sep):
            return root
    return None


def _hook(event, args):
    count = _EVENTS.get(event)
    if count is None or _state["busy"]:
        return
    _state["busy"] = True
    try:
        for path in args[:count]:
            if path is not None and touched_root(path, _state["roots"]) is not None:
                line = f"{os.getpid()}\t{event}\t{os.path.abspath(os.fsdecode(path))}\n"
                os.write(_state["fd"], line.encode("utf-8", "backslashreplace"))
    finally:
        _state["busy"] = False


def install(roots, log_path):
    """Appends a line to `log_path` for every touch of a path under `roots`, in this process, from now on."""
    if _state["fd"] is not None:
        return
    _state["roots"] = tuple(roots)
    _state["fd"] = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    sys.addaudithook(_hook)


def install_from_environment():
    """install() with the roots and log named by the environment (a process a test started), if they are set."""
    roots, log_path = os.environ.get(ROOTS_ENV), os.environ.get(LOG_ENV)
    if roots and log_path:
        install([r for r in roots.split(os.pathsep) if r], log_path)


def read_log(log_path, offset=0):
    """(the lines written to the log after byte `offset`, the log's size)."""
    try:
        with open(log_path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], 0
    return data.decode("utf-8", "replace").splitlines(), offset + len(data)
