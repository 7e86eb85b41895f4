"""`python -m templm.cli VERB ...`, the same as `templm VERB ...`."""

from templm.cli.dispatch import run

run()
