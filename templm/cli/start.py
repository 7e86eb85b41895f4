"""The console script's first instructions (`templm ...`, `python -m templm.cli ...`): Ctrl-C and SIGTERM are noted
from here on, before the verbs' table and its libraries are imported, and answered once the verb's modules are
loaded (one line, exit 130 or 75; templm.cli.dispatch). Before, a SIGTERM in the first tenth of a second ended the
process by the signal's default (exit 143) without a word, and a Ctrl-C printed a traceback. Importing this module
sets the process's handlers: it is the command line's entry, not a library module (templm.cli.main, called from
Python, leaves a caller's handlers alone)."""

import signal
import threading

_NOTED: list = []

if threading.current_thread() is threading.main_thread():
    for _signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(_signum, lambda received, _: _NOTED.append(received))


def run() -> None:
    """`templm` on the process's arguments: templm.cli.dispatch.run with the signals noted so far."""
    from templm.cli.dispatch import run as dispatch_run

    dispatch_run(noted=_NOTED)
