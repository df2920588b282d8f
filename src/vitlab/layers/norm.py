"""Normalisation layers with multiply counts."""

from __future__ import annotations

from torch import nn

from vitlab.errors import ConfigError

NORMS = ("layernorm", "rmsnorm")


class LayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` (eps 1e-6, as timm's ViT) with ``flop_count``."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__(dim, eps=eps)

    def flop_count(self, num_tokens: int, *, matmul_only: bool = False) -> int:
        # (x - mean)^2, * rstd, * weight: three multiplies per element
        return 0 if matmul_only else 3 * num_tokens * self.normalized_shape[0]


class RMSNorm(nn.RMSNorm):
    """``nn.RMSNorm`` (eps 1e-6, parameter ``weight`` as timm's) with ``flop_count``."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__(dim, eps=eps)

    def flop_count(self, num_tokens: int, *, matmul_only: bool = False) -> int:
        # x^2, * rrms, * weight
        return 0 if matmul_only else 3 * num_tokens * self.normalized_shape[0]


def norm_layer(kind: str) -> type[nn.Module]:
    if kind == "layernorm":
        return LayerNorm
    if kind == "rmsnorm":
        return RMSNorm
    raise ConfigError(f"unknown norm {kind!r}; choose one of {', '.join(NORMS)}")
