"""`python -m templm.cli VERB ...`, the same as `templm VERB ...`."""

from templm.cli.main import run

run()
