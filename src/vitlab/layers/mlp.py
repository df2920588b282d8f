"""Feed-forward layers: GELU MLP and SwiGLU, with timm's parameter names."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

MLPS = ("gelu", "swiglu")


class Mlp(nn.Module):
    """``fc2(norm(GELU(fc1(x))))`` (the ViT MLP, Dosovitskiy et al. 2021); ``norm`` is Identity unless
    ``norm_layer`` is given (timm's ``scale_mlp_norm``; NormFormer's FFN norm, Shleifer et al. 2021)."""

    def __init__(self, dim: int, hidden_dim: int, *, bias: bool = True, drop: float = 0.0,
                 norm_layer: type[nn.Module] | None = None) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden_dim, bias=bias)
        self.act = nn.GELU()
        self.drop1 = nn.Dropout(drop)
        self.norm = norm_layer(hidden_dim) if norm_layer is not None else nn.Identity()
        self.fc2 = nn.Linear(hidden_dim, dim, bias=bias)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: Tensor) -> Tensor:
        return self.drop2(self.fc2(self.norm(self.drop1(self.act(self.fc1(x))))))

    def flop_count(self, num_tokens: int, *, matmul_only: bool = False) -> int:
        d, h = self.fc1.in_features, self.fc1.out_features
        macs = 2 * num_tokens * d * h
        return macs if matmul_only else macs + num_tokens * h + _norm_flops(self.norm, num_tokens)  # GELU: x * Phi(x)


class SwiGLU(nn.Module):
    """``fc2(norm(SiLU(fc1_g(x)) * fc1_x(x)))`` with timm's names (``norm`` is Identity unless ``norm_layer``)."""

    def __init__(self, dim: int, hidden_dim: int, *, bias: bool = True, drop: float = 0.0,
                 norm_layer: type[nn.Module] | None = None) -> None:
        super().__init__()
        self.fc1_g = nn.Linear(dim, hidden_dim, bias=bias)
        self.fc1_x = nn.Linear(dim, hidden_dim, bias=bias)
        self.drop1 = nn.Dropout(drop)
        self.norm = norm_layer(hidden_dim) if norm_layer is not None else nn.Identity()
        self.fc2 = nn.Linear(hidden_dim, dim, bias=bias)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: Tensor) -> Tensor:
        x = F.silu(self.fc1_g(x)) * self.fc1_x(x)
        return self.drop2(self.fc2(self.norm(self.drop1(x))))

    def flop_count(self, num_tokens: int, *, matmul_only: bool = False) -> int:
        d, h = self.fc1_g.in_features, self.fc1_g.out_features
        macs = 3 * num_tokens * d * h
        return macs if matmul_only else macs + 2 * num_tokens * h + _norm_flops(self.norm, num_tokens)  # g*sig(g), *x


def _norm_flops(norm: nn.Module, num_tokens: int) -> int:
    return norm.flop_count(num_tokens) if hasattr(norm, "flop_count") else 0


def mlp_layer(kind: str) -> type[nn.Module]:
    from vitlab.errors import ConfigError

    if kind == "gelu":
        return Mlp
    if kind == "swiglu":
        return SwiGLU
    raise ConfigError(f"unknown mlp {kind!r}; choose one of {', '.join(MLPS)}")
