"""2-D rotary position embedding (axial RoPE) for ViT-5.

Two channel layouts, the same rotations up to a permutation of each head's channels:

- ``halves`` (vitlab's first layout): channel ``i`` pairs with ``i + d/2``; the first quarter of the pairs turn with
  the column index, the second with the row index. Its table is ``(2, T, d)``.
- ``vit5`` (the ViT-5 code, ``rope.py`` of wangf3014/ViT-5): adjacent channels ``(2i, 2i+1)`` pair; the first half of
  the head turns with the row index, the second with the column index. Its table is ``(2, T, d/2, 2)``, which is how
  :func:`apply_rope` tells the layouts apart. Weights trained in the ViT-5 code load with no channel reorder.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from vitlab.errors import ConfigError


def rope_2d_angles(grid_h: int, grid_w: int, head_dim: int, theta: float = 10000.0) -> Tensor:
    """Angles ``(grid_h * grid_w, head_dim // 2)`` in row-major order: the first quarter of the head
    channels rotate with the column index, the second quarter with the row index."""
    ay, ax = _axis_angles(grid_h, grid_w, head_dim, theta)
    return torch.cat([ax, ay], dim=1)


def vit5_angles(grid_h: int, grid_w: int, head_dim: int, theta: float = 10000.0) -> Tensor:
    """Angles ``(grid_h * grid_w, head_dim // 2)`` of the ViT-5 code, one per adjacent channel pair in row-major
    patch order: pairs ``0 .. d/4 - 1`` turn with the row index, pairs ``d/4 .. d/2 - 1`` with the column index,
    both at frequencies ``theta^(-k / (d/4))``."""
    return torch.cat(_axis_angles(grid_h, grid_w, head_dim, theta), dim=1)


def _axis_angles(grid_h: int, grid_w: int, head_dim: int, theta: float) -> tuple[Tensor, Tensor]:
    """``(row angles, column angles)``, each ``(grid_h * grid_w, head_dim // 4)`` in row-major patch order at
    frequencies ``theta^(-k / (d/4))``: the two layouts above differ only in which axis comes first."""
    if head_dim % 4:
        raise ConfigError(f"2-D RoPE needs a head dim divisible by 4, got {head_dim}; "
                          f"change embed_dim or num_heads, or set rope=False")
    quarter = head_dim // 4
    freqs = 1.0 / theta ** (torch.arange(quarter, dtype=torch.float64) / quarter)  # (d/4,)
    ys, xs = torch.meshgrid(torch.arange(grid_h, dtype=torch.float64),
                            torch.arange(grid_w, dtype=torch.float64), indexing="ij")
    return ys.flatten()[:, None] * freqs, xs.flatten()[:, None] * freqs  # (N, d/4) each


def rope_table(angles: Tensor, layout: str = "halves") -> Tensor:
    """``(T, d/2)`` angles -> stacked (cos, sin): ``(2, T, d)`` in the rotate-half layout, or ``(2, T, d/2, 2)``
    for ``layout='vit5'`` (adjacent pairs)."""
    if layout == "vit5":
        ang = angles[..., None].expand(*angles.shape, 2)
    else:
        ang = torch.cat([angles, angles], dim=-1)
    return torch.stack([ang.cos(), ang.sin()]).float()


def layout_rope(num_prefix: int, grid: int | tuple[int, int], num_reg_end: int, head_dim: int, theta: float,
                reg_theta: float, *, layout: str = "halves", patches: bool = True) -> Tensor:
    """ViT-5 token layout ``[prefix, patches, registers]``: prefix tokens are not rotated (angle 0),
    patches use their position on the ``grid`` (a side or ``(grid_h, grid_w)``; angle 0 with ``patches=False``),
    registers a small square grid of their own with ``reg_theta``. ``layout``: ``halves`` or ``vit5`` (see the
    module docstring)."""
    gh, gw = (grid, grid) if isinstance(grid, int) else grid
    angles = vit5_angles if layout == "vit5" else rope_2d_angles
    patch_angles = angles(gh, gw, head_dim, theta)
    parts = [torch.zeros(num_prefix, head_dim // 2, dtype=torch.float64),
             patch_angles if patches else torch.zeros_like(patch_angles)]
    if num_reg_end:
        side = math.isqrt(num_reg_end - 1) + 1
        parts.append(angles(side, side, head_dim, reg_theta)[:num_reg_end])
    return rope_table(torch.cat(parts), layout)


def rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def rotate_pairs(x: Tensor) -> Tensor:
    """``(..., d/2, 2)`` -> each adjacent pair ``(a, b)`` to ``(-b, a)``."""
    return torch.stack([-x[..., 1], x[..., 0]], dim=-1)


def apply_rope(x: Tensor, rope: Tensor) -> Tensor:
    """Rotate ``x`` ``(B, H, T, d)`` by the ``(2, T, d)`` table (cos, sin): ``x cos + rotate_half(x) sin``; a
    ``(2, T, d/2, 2)`` table (the ViT-5 layout) rotates adjacent channel pairs instead.
    The output keeps ``x``'s dtype (the table is cast to it)."""
    rope = rope.to(x.dtype)
    if rope.ndim == 4:
        xp = x.unflatten(-1, (-1, 2))  # (B, H, T, d/2, 2)
        return (xp * rope[0] + rotate_pairs(xp) * rope[1]).flatten(-2)
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
