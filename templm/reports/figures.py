"""Figures for the reports: matplotlib without a display, and a PNG written atomically."""

from __future__ import annotations

import io

from templm.io import atomic_write


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display needed). Imported here, on first use: matplotlib is a heavy
    import that only the report writers need."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def figure_png(fig, dpi: int = 100) -> bytes:
    """`fig` as PNG bytes (then closed): for writers that put several files in place together."""
    try:
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=dpi)
        return buffer.getvalue()
    finally:
        pyplot().close(fig)


def save_figure(fig, path: str, dpi: int = 100) -> str:
    """Writes `fig` as PNG to `path` (through a temporary file, renamed when complete) and closes it."""
    return atomic_write(path, figure_png(fig, dpi))
