"""Depth-scaled residual branches (depth-muP): ``x_{l+1} = x_l + f_l(x_l) / sqrt(L)``.

Yang et al. 2023 ("Tensor Programs VI: Feature Learning in Infinite-Depth Neural Networks", Depth-muP) and
Bordelon et al. 2023 ("Depthwise Hyperparameter Transfer in Residual Networks") multiply every residual branch
by ``1/sqrt(L)`` for a stack of ``L`` blocks, so the residual stream's variance stays O(1) as the depth grows and
hyperparameters found at one depth carry over to another. vitlab takes ``L = depth`` (the number of blocks; both
branches of a block get the same multiplier, as Bordelon et al.'s transformer). The multiplier is a constant,
not learned (``gate='depth_mup'``); the papers' learning-rate rule for the branch weights is a recipe matter
left to the optimiser settings.
"""

from __future__ import annotations

import math

from torch import Tensor, nn

from vitlab.errors import ConfigError


def depth_mup_scale(depth: int) -> float:
    """The depth-muP branch multiplier ``1 / sqrt(depth)``."""
    if not isinstance(depth, int) or depth <= 0:
        raise ConfigError(f"gate='depth_mup' needs the number of blocks, a positive integer; got {depth!r}")
    return 1.0 / math.sqrt(depth)


class DepthScale(nn.Module):
    """A fixed multiplier ``x * scale`` on a residual branch, ``scale = 1/sqrt(depth)`` (no parameters)."""

    def __init__(self, depth: int) -> None:
        super().__init__()
        self.depth = depth
        self.scale = depth_mup_scale(depth)

    def forward(self, x: Tensor) -> Tensor:
        return x * self.scale

    def flop_count(self, num_tokens: int, dim: int = 0, *, matmul_only: bool = False) -> int:
        """One multiply per element of the branch: ``num_tokens * dim``."""
        return 0 if matmul_only else num_tokens * dim

    def extra_repr(self) -> str:
        return f"depth={self.depth}, scale={self.scale:.4g}"


DEPTH_GATES = ("depth_mup",)  # gates whose multiplier follows the model's depth
