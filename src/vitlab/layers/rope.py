"""2-D rotary position embedding (axial RoPE) for ViT-5."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from vitlab.errors import ConfigError


def rope_2d_angles(grid_h: int, grid_w: int, head_dim: int, theta: float = 10000.0) -> Tensor:
    """Angles ``(grid_h * grid_w, head_dim // 2)`` in row-major order: the first quarter of the head
    channels rotate with the column index, the second quarter with the row index."""
    if head_dim % 4:
        raise ConfigError(f"2-D RoPE needs a head dim divisible by 4, got {head_dim}; "
                          f"change embed_dim or num_heads, or set rope=False")
    quarter = head_dim // 4
    freqs = 1.0 / theta ** (torch.arange(quarter, dtype=torch.float64) / quarter)  # (d/4,)
    ys, xs = torch.meshgrid(torch.arange(grid_h, dtype=torch.float64),
                            torch.arange(grid_w, dtype=torch.float64), indexing="ij")
    ax = xs.flatten()[:, None] * freqs  # (N, d/4)
    ay = ys.flatten()[:, None] * freqs
    return torch.cat([ax, ay], dim=1)


def rope_table(angles: Tensor) -> Tensor:
    """``(T, d/2)`` angles -> ``(2, T, d)`` stacked (cos, sin) in the rotate-half layout."""
    ang = torch.cat([angles, angles], dim=-1)
    return torch.stack([ang.cos(), ang.sin()]).float()


def layout_rope(num_prefix: int, grid: int | tuple[int, int], num_reg_end: int, head_dim: int, theta: float,
                reg_theta: float) -> Tensor:
    """ViT-5 token layout ``[prefix, patches, registers]``: prefix tokens are not rotated (angle 0),
    patches use their position on the ``grid`` (a side or ``(grid_h, grid_w)``), registers a small square
    grid of their own with ``reg_theta``."""
    gh, gw = (grid, grid) if isinstance(grid, int) else grid
    parts = [torch.zeros(num_prefix, head_dim // 2, dtype=torch.float64),
             rope_2d_angles(gh, gw, head_dim, theta)]
    if num_reg_end:
        side = math.isqrt(num_reg_end - 1) + 1
        parts.append(rope_2d_angles(side, side, head_dim, reg_theta)[:num_reg_end])
    return rope_table(torch.cat(parts))


def rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rope(x: Tensor, rope: Tensor) -> Tensor:
    """Rotate ``x`` ``(B, H, T, d)`` by the ``(2, T, d)`` table (cos, sin): ``x cos + rotate_half(x) sin``.
    The output keeps ``x``'s dtype (the table is cast to it)."""
    rope = rope.to(x.dtype)
    if torch.is_grad_enabled() and x.requires_grad:
        return x * rope[0] + rotate_half(x) * rope[1]
    # without autograd: three passes instead of five (no negated copy, no concatenation), the same sums;
    # 2.5-5% on ViT-5-S inference (benchmarks/cpu_time.py --only rope); in-place halves would slow the backward
    h = x.shape[-1] // 2
    sin = rope[1]
    out = x * rope[0]
    out[..., :h].addcmul_(x[..., h:], sin[..., :h], value=-1)
    out[..., h:].addcmul_(x[..., :h], sin[..., h:])
    return out
