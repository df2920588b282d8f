"""Where the model looks: class-token attention per head and averaged, and attention rollout.

Which row is shown depends on the model:

- ViT with a class token: the class token's row of the chosen layer (default the last).
- CaiT: the chosen class-attention layer's single query row (default the last CA layer); its keys are
  ``[cls, patches]``, the patches being the output of the last self-attention block.
- No class token (global average pooling): the mean attention each patch *receives* from all queries.

Attention rollout (Abnar & Zuidema, 2020) averages the heads, adds the identity for the residual path,
renormalises the rows and multiplies the layers: ``R = Ã_L ... Ã_1`` with ``Ã = rownorm(mean_h A + I)``.
``R[i, j]`` is how much output token ``i`` draws on input token ``j``. Re-attention maps (DeepViT) are
mixed across heads and batch-normalised, so they are not row-stochastic: negative head means are clipped
to 0 before the identity is added. What is read off ``R``:

- class token: its row over the input patches; the share landing on the class token itself and on
  registers (ViT-5, timm ``reg_tokens``) is returned apart as ``Rollout.patch_mass < 1``;
- no class token: the mean over patch rows, matching average pooling;
- CaiT: the self-attention layers roll out over the patches (``R_sa``, ``(N, N)``); each class-attention
  layer ``j`` then updates the class token's relevance ``r`` over ``[cls, patches]`` as
  ``r_j = Ã_j[0] r_{j-1} + [0, Ã_j[1:]]`` (``Ã_j = rownorm(row_j + e_0)``, ``r_0 = e_0``), and the patch
  part is carried back to the input patches through ``R_sa``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from vitlab.errors import ConfigError


@dataclass
class TokenLayout:
    """Token order of a model's full sequence: ``[front (class token, registers), patches, end registers]``."""

    num_front: int
    num_patches: int
    num_end: int
    grid_size: int
    class_token: bool

    @property
    def num_tokens(self) -> int:
        return self.num_front + self.num_patches + self.num_end

    @property
    def patches(self) -> slice:
        return slice(self.num_front, self.num_front + self.num_patches)

    @classmethod
    def of(cls, model: nn.Module) -> TokenLayout:
        """The layout of a vitlab model (``VisionTransformer`` or ``Cait``)."""
        cfg = model.cfg
        front = getattr(model, "num_front", model.num_prefix_tokens)
        end = getattr(model, "num_end", 0)
        return cls(front, model.num_patches, end, model.grid_size, bool(cfg.class_token))

    def for_map(self, attn: Tensor) -> TokenLayout:
        """The layout of one map's keys: CaiT's self-attention maps hold the patches only."""
        t_k = attn.shape[-1]
        if t_k == self.num_tokens:
            return self
        if t_k == self.num_patches:
            return TokenLayout(0, self.num_patches, 0, self.grid_size, False)
        raise ConfigError(f"attention map over {t_k} keys does not fit a model of {self.num_tokens} tokens "
                          f"({self.num_patches} patches); pass the maps of the same model")


def to_grid(values: Tensor, grid_size: int) -> Tensor:
    """``(..., N)`` per-patch values -> ``(..., g, g)`` in row-major patch order."""
    if values.shape[-1] != grid_size * grid_size:
        raise ConfigError(f"{values.shape[-1]} patch values do not fill a {grid_size}x{grid_size} grid")
    return values.reshape(*values.shape[:-1], grid_size, grid_size)


def class_token_attention(attn: Tensor, layout: TokenLayout) -> Tensor:
    """Per-head attention over the patches of one map ``(B, H, T_q, T_k)`` -> ``(B, H, g, g)``.

    The class token's row when there is one (the single row of a class-attention map), else the mean
    attention each patch receives over all queries.
    """
    if attn.dim() != 4:
        raise ConfigError(f"an attention map must be (B, heads, T_q, T_k), got shape {tuple(attn.shape)}")
    keys = layout.for_map(attn)
    if attn.shape[-2] == 1 or keys.class_token:
        row = attn[:, :, 0, keys.patches]  # (B, H, N)
    else:
        row = attn[:, :, :, keys.patches].mean(dim=2)  # (B, H, T_q, N) -> (B, H, N)
    return to_grid(row.detach().float(), layout.grid_size)


def _fused(attn: Tensor) -> Tensor:
    """Head mean, negatives clipped, identity added, rows renormalised: ``(B, H, T, T) -> (B, T, T)``."""
    a = attn.detach().float().mean(dim=1).clamp_min(0)
    a = a + torch.eye(a.shape[-1], device=a.device)
    return a / a.sum(dim=-1, keepdim=True)


def rollout(maps: list[Tensor]) -> Tensor:
    """Attention rollout ``(B, T, T)`` of self-attention maps ``(B, H, T, T)`` in forward order."""
    if not maps:
        raise ConfigError("attention rollout needs at least one self-attention map")
    shape = tuple(maps[0].shape)
    if len(shape) != 4 or shape[-1] != shape[-2]:
        raise ConfigError(f"rollout needs square self-attention maps (B, H, T, T), got shape {shape}")
    result = _fused(maps[0])
    for m in maps[1:]:
        if tuple(m.shape) != shape:
            raise ConfigError(f"rollout maps differ in shape ({tuple(m.shape)} vs {shape}); roll out one stage")
        result = _fused(m) @ result  # later layers act on the left
    return result


def class_attention_rollout(ca_maps: list[Tensor], patch_rollout: Tensor | None = None) -> Tensor:
    """Relevance ``(B, 1 + N)`` of ``[class token, input patches]`` for the class token after CaiT's
    class-attention layers ``(B, H, 1, 1 + N)``; ``patch_rollout`` ``(B, N, N)`` maps the patches back
    through the self-attention stage (None: identity)."""
    if not ca_maps:
        raise ConfigError("class-attention rollout needs at least one class-attention map")
    r = None
    for m in ca_maps:
        if m.dim() != 4 or m.shape[-2] != 1:
            raise ConfigError(f"class-attention maps must be (B, H, 1, T), got shape {tuple(m.shape)}")
        a = m.detach().float().mean(dim=1)[:, 0].clamp_min(0)  # (B, 1 + N)
        a = a.clone()
        a[:, 0] += 1.0
        a = a / a.sum(dim=-1, keepdim=True)
        if r is None:
            r = a
        else:
            r = a[:, :1] * r + torch.cat([torch.zeros_like(a[:, :1]), a[:, 1:]], dim=1)
    if patch_rollout is not None:
        if patch_rollout.shape[-1] != r.shape[-1] - 1:
            raise ConfigError(f"patch rollout over {patch_rollout.shape[-1]} tokens does not match class "
                              f"attention over {r.shape[-1] - 1} patches")
        patches = (r[:, None, 1:] @ patch_rollout.float())[:, 0]  # (B, 1, N) @ (B, N, N) -> (B, N)
        r = torch.cat([r[:, :1], patches], dim=1)
    return r


@dataclass
class Rollout:
    """Rollout relevance of the input patches ``(B, g, g)`` and the share of it on patches ``(B,)``."""

    relevance: Tensor
    patch_mass: Tensor


def model_rollout(maps: list[Tensor], layout: TokenLayout) -> Rollout:
    """Rollout of a whole model's maps read off as the module docstring describes."""
    sa = [m for m in maps if m.shape[-2] == m.shape[-1]]
    ca = [m for m in maps if m.shape[-2] == 1 and m.shape[-1] > 1]
    if len(sa) + len(ca) != len(maps):
        raise ConfigError("attention maps are neither self-attention (T_q == T_k) nor class-attention (T_q == 1)")
    if ca:
        r = class_attention_rollout(ca, rollout(sa) if sa else None)  # (B, 1 + N)
        rel = r[:, 1:]
    else:
        R = rollout(sa)  # (B, T, T)
        keys = layout.for_map(sa[0])
        if keys.class_token:
            rel = R[:, 0, keys.patches]  # (B, N)
        else:
            rel = R[:, keys.patches, keys.patches].mean(dim=1)  # (B, N, N) -> (B, N)
    return Rollout(to_grid(rel, layout.grid_size), rel.sum(dim=-1))
