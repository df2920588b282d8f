"""The power law a cost follows in the number of tokens, fitted by least squares in log-log space."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from vitlab.errors import ConfigError


def fit_power_law(x: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """Least-squares fit of ``log y = a + b log x``; returns ``(a, b)``, so ``y ~ exp(a) * x ** b``."""
    pts = [(math.log(float(u)), math.log(float(v))) for u, v in zip(x, y) if u > 0 and v > 0]
    if len({p[0] for p in pts}) < 2:
        raise ConfigError("a power-law fit needs at least two distinct positive x values with positive y")
    mx = statistics.fmean(p[0] for p in pts)
    my = statistics.fmean(p[1] for p in pts)
    b = sum((px - mx) * (py - my) for px, py in pts) / sum((px - mx) ** 2 for px, _ in pts)
    return my - b * mx, b
