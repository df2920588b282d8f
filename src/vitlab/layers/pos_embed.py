"""Position embeddings: the Transformer's 1-D sinusoid, 2-D sin-cos, learned, or none.

On another patch grid a table follows the patches' 2-D places (:func:`pos_embed_at_grid`): a learned table and the
1-D sinusoid (whose numbering is row-major on the grid it was built for) are resampled as images of that grid, the
2-D sin-cos table is computed for the new grid (a patch at row r, column c keeps its coordinates)."""

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


def sincos_2d(grid_size: int | tuple[int, int], dim: int, temperature: float = 10000.0) -> Tensor:
    """2-D sin-cos table ``(grid_h * grid_w, dim)`` in row-major patch order (MAE / big_vision layout):
    the first half of the channels encodes the column, the second half the row. ``grid_size``: the side
    of a square grid or ``(grid_h, grid_w)``."""
    if dim % 4:
        raise ConfigError(f"2-D sin-cos position embedding needs embed_dim divisible by 4, got {dim}; "
                          f"use pos_embed='learned' or 'sincos1d'")
    gh, gw = grid_hw(grid_size)
    ys, xs = torch.meshgrid(torch.arange(gh, dtype=torch.float64),
                            torch.arange(gw, dtype=torch.float64), indexing="ij")
    quarter = dim // 4
    omega = 1.0 / temperature ** (torch.arange(quarter, dtype=torch.float64) / quarter)  # (d/4,)
    ax = xs.flatten()[:, None] * omega[None]  # (N, d/4)
    ay = ys.flatten()[:, None] * omega[None]
    return torch.cat([ax.sin(), ax.cos(), ay.sin(), ay.cos()], dim=1).float()


def grid_hw(grid_size: int | tuple[int, int] | list[int]) -> tuple[int, int]:
    """``(grid_h, grid_w)`` of a square side or a pair."""
    if isinstance(grid_size, int):
        return grid_size, grid_size
    gh, gw = grid_size
    return int(gh), int(gw)


def build_pos_embed(kind: str, *, grid_size: int | tuple[int, int], dim: int, num_prefix: int) -> Tensor | None:
    """Initial table ``(1, num_prefix + grid_h * grid_w, dim)`` (``num_prefix`` 1 for a class slot, else 0).

    ``sincos1d`` numbers the class slot 0 and the patches 1..N; ``sincos2d`` gives the class
    slot zeros; ``learned`` is drawn N(0, 0.02) by the caller's init; ``none`` returns None.
    """
    gh, gw = grid_hw(grid_size)
    n = gh * gw
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


def resample_abs_pos_embed(pos_embed: Tensor, new_grid: int | tuple[int, int], num_prefix: int = 0,
                           mode: str = "bicubic", old_grid: int | tuple[int, int] | None = None,
                           antialias: bool = True) -> Tensor:
    """Resample ``(1, num_prefix + h*w, D)`` to ``new_grid`` (a side or ``(h, w)``), leaving prefix slots untouched.

    ``old_grid`` defaults to the square grid the table holds. With ``antialias`` (the default) bilinear and bicubic
    use torch's antialiased kernels both ways, as timm's ``resample_abs_pos_embed`` does, so a checkpoint resampled
    here equals the one timm loads at that size; ``antialias=False`` is plain interpolation, as the ViT-5 and DeiT
    code's ``main.py`` resizes for fine-tuning at another size (the two differ both ways: torch's antialiased bicubic
    kernel is PIL's, a = -0.5, and also widens when shrinking; the plain one has a = -0.75)."""
    prefix, grid = pos_embed[:, :num_prefix], pos_embed[:, num_prefix:]
    if old_grid is None:
        side = int(math.isqrt(grid.shape[1]))
        if side * side != grid.shape[1]:
            raise ConfigError(f"position embedding of {grid.shape[1]} patch slots is not a square grid; "
                              f"pass old_grid=(h, w)")
        old_grid = side
    (oh, ow), (nh, nw) = grid_hw(old_grid), grid_hw(new_grid)
    if oh * ow != grid.shape[1]:
        raise ConfigError(f"position embedding of {grid.shape[1]} patch slots does not fit a {oh}x{ow} grid")
    if (oh, ow) == (nh, nw):
        return pos_embed
    dim = grid.shape[-1]
    grid = grid.reshape(1, oh, ow, dim).permute(0, 3, 1, 2).float()  # (1, D, h, w)
    grid = torch.nn.functional.interpolate(grid, size=(nh, nw), mode=mode, align_corners=False,
                                           antialias=antialias and mode in ("bilinear", "bicubic"))
    grid = grid.permute(0, 2, 3, 1).reshape(1, nh * nw, dim).to(pos_embed.dtype)  # (1, h'*w', D)
    return torch.cat([prefix, grid], dim=1)


def pos_embed_at_grid(kind: str, pos_embed: Tensor, new_grid: int | tuple[int, int],
                      old_grid: int | tuple[int, int], num_prefix: int = 0, antialias: bool = True) -> Tensor:
    """The ``kind`` table ``pos_embed`` ``(1, num_prefix + h*w, D)`` of an ``old_grid`` patch grid moved to
    ``new_grid``, each patch keeping its 2-D place. ``learned`` and ``sincos1d`` are resampled bicubically (the
    1-D sinusoid numbers the patches row-major on ``old_grid``, so a table recomputed on another grid would give a
    patch the position of another place); ``sincos2d`` is computed for ``new_grid``. Prefix slots stay as they are.
    ``antialias``: as :func:`resample_abs_pos_embed`."""
    (oh, ow), (nh, nw) = grid_hw(old_grid), grid_hw(new_grid)
    if (oh, ow) == (nh, nw):
        return pos_embed
    if kind in ("learned", "sincos1d"):
        return resample_abs_pos_embed(pos_embed, (nh, nw), num_prefix=num_prefix, old_grid=(oh, ow),
                                      antialias=antialias)
    if kind == "sincos2d":
        table = sincos_2d((nh, nw), pos_embed.shape[-1]).to(pos_embed)
        return torch.cat([pos_embed[:, :num_prefix], table[None]], dim=1)
    raise ConfigError(f"no position table of kind {kind!r} to move to a {nh}x{nw} grid; "
                      f"choose one of learned, sincos1d, sincos2d")
