"""Stochastic depth: timm's ``DropPath`` and the per-block rate schedules."""

from __future__ import annotations

from timm.layers import DropPath

from vitlab.errors import ConfigError

__all__ = ["DropPath", "drop_path_rates", "DROP_PATH_RULES"]

DROP_PATH_RULES = ("uniform", "linear")


def drop_path_rates(rate: float, depth: int, rule: str = "linear") -> list[float]:
    """Per-block drop rates: ``uniform`` gives every block ``rate`` (CaiT); ``linear`` ramps 0 -> ``rate`` (DeiT)."""
    if not 0.0 <= rate < 1.0:
        raise ConfigError(f"drop_path_rate must be in [0, 1), got {rate}")
    if rule == "uniform":
        return [rate] * depth
    if rule == "linear":
        if depth == 1:
            return [rate]
        return [rate * i / (depth - 1) for i in range(depth)]
    raise ConfigError(f"unknown drop-path rule {rule!r}; choose one of {', '.join(DROP_PATH_RULES)}")
