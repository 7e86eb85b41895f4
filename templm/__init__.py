"""templm: train and evaluate language models across time."""

import os as _os

__version__ = "0.1.0"

# The gin configs and study presets, shipped inside the package (package data): `--gin_file=temporal.gin` and
# `templm reproduce --preset smoke` find them here wherever templm is installed (the repository's gin_configs/ is a
# link to this folder).
CONFIG_DIR = _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "gin_configs")
