"""Position-embedding similarity (Dosovitskiy et al. 2021, Fig. 7): the cosine similarity of each patch's
position embedding with every other patch's, drawn as a ``g x g`` grid of small ``g x g`` heatmaps.

Only the patch slots are compared: class-token / register slots of the table are dropped. A learned
table shows what training made of it; a fixed sin-cos table shows the structure it imposes (the Transformer's
1-D sinusoid numbers the patches in row-major order, so rows of the grid look alike).
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from vitlab.errors import ConfigError


def pos_embed_similarity(table: Tensor) -> Tensor:
    """``(N, D)`` position embeddings -> ``(N, N)`` cosine similarities (diagonal 1; zero rows give 0)."""
    if table.dim() == 3 and table.shape[0] == 1:
        table = table[0]
    if table.dim() != 2 or table.shape[0] == 0:
        raise ConfigError(f"position embedding must be (N, D) or (1, N, D), got shape {tuple(table.shape)}")
    unit = F.normalize(table.detach().float(), dim=-1, eps=1e-12)  # (N, D)
    return unit @ unit.T


def patch_pos_embed(model: nn.Module) -> Tensor:
    """The patch rows ``(N, D)`` of a vitlab model's absolute position embedding, prefix slots dropped."""
    table = getattr(model, "pos_embed", None)
    if table is None:
        raise ConfigError(f"model {model.cfg.name or model.cfg.arch!r} has no absolute position embedding "
                          "(pos_embed='none'); the similarity figure needs pos_embed learned, sincos1d or sincos2d")
    table = table.detach()[0]  # (slots, D)
    n = model.num_patches
    if table.shape[0] < n:
        raise ConfigError(f"position table has {table.shape[0]} slots for {n} patches; load a matching checkpoint")
    return table[table.shape[0] - n:]  # prefix slots (class token, front registers) come first


def similarity_grid(sim: Tensor, grid_size: int) -> Tensor:
    """``(N, N)`` -> ``(g, g, g, g)``: ``[r, c]`` is the heatmap of patch ``(r, c)`` against all patches."""
    n = grid_size * grid_size
    if tuple(sim.shape) != (n, n):
        raise ConfigError(f"similarity of shape {tuple(sim.shape)} does not match a {grid_size}x{grid_size} grid")
    return sim.reshape(grid_size, grid_size, grid_size, grid_size)  # (N, N) -> (r, c, r', c')
