"""`python exec_with.py [--file_size=BYTES] [--die_with_parent] -- COMMAND ARGS...`: sets the limits asked for in
this fresh, single-threaded process, then becomes COMMAND (exec).

What a test would otherwise do in subprocess's `preexec_fn`, Python code run in the child between fork and exec:
unsafe in a parent with threads (JAX's, the suite's servers'), where a lock another thread held at the fork stays
held in the child, and JAX warns of a deadlock at every such fork.

--file_size    files limited to BYTES (RLIMIT_FSIZE), SIGXFSZ ignored: a write past it fails with EFBIG, as one on a
               full disk does
--die_with_parent  SIGTERM when the process that started this one ends, however it ends (Linux's PR_SET_PDEATHSIG,
               kept across exec)
"""

import os
import resource
import signal
import sys


def launcher(*options: str) -> list:
    """The command-line prefix that runs what follows it through this file with `options`."""
    return [sys.executable, os.path.abspath(__file__), *options, "--"]


def main(argv):
    if "--" not in argv:
        sys.exit(f"usage: {__doc__.splitlines()[0]}")
    cut = argv.index("--")
    options, command = argv[:cut], argv[cut + 1:]
    for option in options:
        if option.startswith("--file_size="):
            size = int(option.split("=", 1)[1])
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # ignored stays ignored across exec
            resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
        elif option == "--die_with_parent":
            try:
                import ctypes

                ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
            except (OSError, AttributeError):
                pass
        else:
            sys.exit(f"exec_with.py: unknown option {option}")
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
