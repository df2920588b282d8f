"""The depth axis of the depth and learning-rate studies' figures: log 2, ticked at the depths measured."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.axes import Axes


def depth_axis(ax: Axes, depths: Sequence[int], label: str = "depth (blocks)") -> None:
    """Put depth on ``ax``'s x axis on a log-2 scale, one tick per depth in ``depths`` labelled with its value (no
    minor ticks), and ``label`` under it."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(depths, [str(d) for d in depths])
    ax.minorticks_off()
    ax.set_xlabel(label)
