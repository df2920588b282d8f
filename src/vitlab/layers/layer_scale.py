"""LayerScale (CaiT) and the scalar residual gates it is compared with (ReZero, SkipInit)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from vitlab.errors import ConfigError

GATES = ("none", "layerscale", "rezero", "skipinit", "scalar")


class LayerScale(nn.Module):
    """Learnable per-channel gate ``x * gamma`` (a diagonal matrix on a residual branch).

    ``gamma`` has shape ``(dim,)`` and broadcasts over any leading dims of a channels-last input
    ``(..., dim)``. It is tagged ``_no_weight_decay = True``.
    """

    def __init__(self, dim: int, init_value: float = 1e-4) -> None:
        super().__init__()
        if dim <= 0:
            raise ConfigError(f"LayerScale dim must be positive, got {dim}; pass the channel count of the input")
        self.dim = dim
        self.init_value = init_value
        self.gamma = nn.Parameter(torch.full((dim,), float(init_value)))
        self.gamma._no_weight_decay = True

    def reset_parameters(self) -> None:
        nn.init.constant_(self.gamma, self.init_value)

    def forward(self, x: Tensor) -> Tensor:
        x = _check_channels_last(x, self.dim)
        return x * self.gamma.to(x.dtype)  # the output keeps x's dtype (bf16/fp16 stay so)

    def flop_count(self, num_tokens: int, *, matmul_only: bool = False) -> int:
        """One multiply per element: ``num_tokens * dim`` (0 when only matmul-like ops are asked for)."""
        return 0 if matmul_only else num_tokens * self.dim

    def extra_repr(self) -> str:
        return f"dim={self.dim}, init_value={self.init_value}"


@torch.fx.wrap  # a leaf of torch.fx graphs: the traced model checks the shape at run time, as the eager one
def _check_channels_last(x: Tensor, dim: int) -> Tensor:
    """``x`` itself, or a :class:`ConfigError` when its last dim is not ``dim``."""
    if x.shape[-1] != dim:
        raise ConfigError(
            f"LayerScale expects a channels-last input whose last dim is {dim}, got shape "
            f"{tuple(x.shape)}; move the channel axis last (e.g. x.permute(0, 2, 3, 1) for (B, C, H, W))"
        )
    return x


class ScalarGate(nn.Module):
    """One learnable scalar ``alpha`` on a residual branch: ReZero / SkipInit (alpha=0) or small-eps."""

    def __init__(self, init_value: float = 0.0) -> None:
        super().__init__()
        self.init_value = init_value
        self.alpha = nn.Parameter(torch.tensor(float(init_value)))
        self.alpha._no_weight_decay = True

    def reset_parameters(self) -> None:
        nn.init.constant_(self.alpha, self.init_value)

    def forward(self, x: Tensor) -> Tensor:
        return x * self.alpha.to(x.dtype)

    def flop_count(self, num_tokens: int, dim: int = 0, *, matmul_only: bool = False) -> int:
        return 0 if matmul_only else num_tokens * dim

    def extra_repr(self) -> str:
        return f"init_value={self.init_value}"


def cait_init_value(depth: int) -> float:
    """LayerScale init from CaiT's depth rule (Touvron et al. 2021): 0.1 up to depth 18, 1e-5 up to 24, 1e-6 deeper."""
    if depth <= 0:
        raise ConfigError(f"depth must be positive, got {depth}")
    if depth <= 18:
        return 0.1
    if depth <= 24:
        return 1e-5
    return 1e-6


def make_gate(kind: str, dim: int, init_value: float | None = 1e-4) -> nn.Module:
    """Build a residual gate.

    ``none``: identity. ``layerscale``: per-channel ``init_value``. ``rezero``: scalar 0 (the block also
    drops its pre-norms, as ReZero does). ``skipinit``: scalar 0, pre-norm kept. ``scalar``: scalar
    ``init_value`` (the small-epsilon variant CaiT found better than 0), pre-norm kept.
    """
    if kind == "none":
        return nn.Identity()
    if kind == "layerscale":
        return LayerScale(dim, 1e-4 if init_value is None else init_value)
    if kind in ("rezero", "skipinit"):
        return ScalarGate(0.0)
    if kind == "scalar":
        return ScalarGate(1e-4 if init_value is None else init_value)
    raise ConfigError(f"unknown gate {kind!r}; choose one of {', '.join(GATES)}")
