"""`python -m templm.cli VERB ...`, the same as `templm VERB ...`."""

from templm.cli.start import run

run()
