"""templm: train and evaluate language models across time."""

import os as _os

__version__ = "0.1.0"

# The gin configs and study presets, shipped inside the package (package data): `--gin_file=temporal.gin` and
# `templm reproduce --preset smoke` find them here wherever templm is installed (the repository's gin_configs/ is a
# link to this folder).
CONFIG_DIR = _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "gin_configs")


def config_search_paths(first=()):
    """Where a gin file or an `include` is looked for, in order, as T5X does: `first` (the user's folders), the
    working directory, then the package's own configs (a name written `gin_configs/...`, as in the repository,
    found through the package folder that holds them)."""
    return list(first) + [_os.getcwd(), CONFIG_DIR, _os.path.dirname(CONFIG_DIR)]
