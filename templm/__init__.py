"""templm: train and evaluate language models across time."""

__version__ = "0.1.0"
