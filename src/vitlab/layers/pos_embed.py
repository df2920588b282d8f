"""Position embeddings: the Transformer's 1-D sinusoid, 2-D sin-cos, learned, or none."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from vitlab.errors import ConfigError

POS_EMBEDS = ("learned", "sincos1d", "sincos2d", "none")


def sincos_1d(num_positions: int, dim: int, temperature: float = 10000.0) -> Tensor:
    """The Transformer's sinusoid table, ``(num_positions, dim)``: with ``i`` the position and ``j`` the channel,
    ``PE(i, j) = sin(i / T^(j/d))`` for even ``j`` and ``cos(i / T^((j-1)/d))`` for odd ``j``."""
    pos = torch.arange(num_positions, dtype=torch.float64)[:, None]  # (P, 1)
    j = torch.arange(dim, dtype=torch.float64)[None, :]  # (1, d)
    even = j - (j % 2)
    angle = pos / temperature ** (even / dim)  # (P, d)
    pe = torch.where(j % 2 == 0, torch.sin(angle), torch.cos(angle))
    return pe.float()


def sincos_2d(grid_size: int, dim: int, temperature: float = 10000.0) -> Tensor:
    """2-D sin-cos table ``(grid_size**2, dim)`` in row-major patch order (MAE / big_vision layout):
    the first half of the channels encodes the column, the second half the row."""
    if dim % 4:
        raise ConfigError(f"2-D sin-cos position embedding needs embed_dim divisible by 4, got {dim}; "
                          f"use pos_embed='learned' or 'sincos1d'")
    ys, xs = torch.meshgrid(torch.arange(grid_size, dtype=torch.float64),
                            torch.arange(grid_size, dtype=torch.float64), indexing="ij")
    quarter = dim // 4
    omega = 1.0 / temperature ** (torch.arange(quarter, dtype=torch.float64) / quarter)  # (d/4,)
    ax = xs.flatten()[:, None] * omega[None]  # (N, d/4)
    ay = ys.flatten()[:, None] * omega[None]
    return torch.cat([ax.sin(), ax.cos(), ay.sin(), ay.cos()], dim=1).float()


def build_pos_embed(kind: str, *, grid_size: int, dim: int, num_prefix: int) -> Tensor | None:
    """Initial table ``(1, num_prefix + grid_size**2, dim)`` (``num_prefix`` 1 for a class slot, else 0).

    ``sincos1d`` numbers the class slot 0 and the patches 1..N; ``sincos2d`` gives the class
    slot zeros; ``learned`` is drawn N(0, 0.02) by the caller's init; ``none`` returns None.
    """
    n = grid_size**2
    if kind == "none":
        return None
    if kind == "learned":
        return torch.zeros(1, num_prefix + n, dim)
    if kind == "sincos1d":
        return sincos_1d(num_prefix + n, dim)[None]
    if kind == "sincos2d":
        table = sincos_2d(grid_size, dim)
        return torch.cat([torch.zeros(num_prefix, dim), table])[None]
    raise ConfigError(f"unknown pos_embed {kind!r}; choose one of {', '.join(POS_EMBEDS)}")


def resample_abs_pos_embed(pos_embed: Tensor, new_grid: int, num_prefix: int = 0,
                           mode: str = "bicubic") -> Tensor:
    """Resample ``(1, num_prefix + g*g, D)`` to ``new_grid``, leaving prefix slots untouched.

    Bilinear and bicubic use torch's antialiased kernels both ways, as timm's ``resample_abs_pos_embed``
    does, so a checkpoint resampled here equals the one timm loads at that size."""
    prefix, grid = pos_embed[:, :num_prefix], pos_embed[:, num_prefix:]
    old = int(math.isqrt(grid.shape[1]))
    if old * old != grid.shape[1]:
        raise ConfigError(f"position embedding of {grid.shape[1]} patch slots is not a square grid")
    if old == new_grid:
        return pos_embed
    dim = grid.shape[-1]
    grid = grid.reshape(1, old, old, dim).permute(0, 3, 1, 2).float()  # (1, D, g, g)
    grid = torch.nn.functional.interpolate(grid, size=(new_grid, new_grid), mode=mode, align_corners=False,
                                           antialias=mode in ("bilinear", "bicubic"))
    grid = grid.permute(0, 2, 3, 1).reshape(1, new_grid * new_grid, dim).to(pos_embed.dtype)
    return torch.cat([prefix, grid], dim=1)
