"""Stochastic depth (per-sample residual drop) and the per-block rate schedules.

Written here rather than imported from ``timm.layers`` because importing timm pulls in torchvision and
torch.fx, which costs seconds on every ``vitlab`` command; the behaviour is the same as timm's
``DropPath(scale_by_keep=True)``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from vitlab.errors import ConfigError
from vitlab.slice_rng import slice_generator

__all__ = ["DropPath", "drop_path_rates", "DROP_PATH_RULES"]

DROP_PATH_RULES = ("uniform", "linear")


class DropPath(nn.Module):
    """In training, zero the whole residual branch of each sample with probability ``drop_prob`` and
    scale the kept ones by ``1 / (1 - drop_prob)``; identity in eval mode."""

    def __init__(self, drop_prob: float = 0.0) -> None:
        super().__init__()
        self.drop_prob = drop_prob

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.drop_prob == 0.0:
            return x
        return x * _keep_mask(x, 1.0 - self.drop_prob)

    def extra_repr(self) -> str:
        return f"drop_prob={self.drop_prob:.3f}"


@torch.fx.wrap  # a leaf of torch.fx graphs, so a traced model draws from the slice generator of each call too
def _keep_mask(x: Tensor, keep: float) -> Tensor:
    """``(B, 1, ..., 1)``: 0 with probability ``1 - keep``, else ``1 / keep``."""
    # inside a sliced step each slice draws from its own generator (None: the global one)
    mask = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep, generator=slice_generator())
    return mask.div_(keep)


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
