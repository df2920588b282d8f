"""The shared style of vitlab's figures: a figure on its own matplotlib Agg canvas (no display, no pyplot state),
written as PNG atomically, and the colours every figure uses for the same things."""

from __future__ import annotations

from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from vitlab.atomic import atomic_path

DPI = 110
HEAT = "inferno"  # attention and relevance
SIM = "viridis"  # similarities
COLORS = {"attn": "#1f77b4", "mlp": "#d62728", "count": "#d62728", "sim": "#222222"}


def new_figure(width: float, height: float) -> Figure:
    """A figure on its own Agg canvas, in the shared style."""
    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def save(fig: Figure, path: str | Path) -> Path:
    """Write ``fig`` as PNG to ``path`` atomically."""
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=DPI)
    return Path(path)
