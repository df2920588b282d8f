"""What the classifier head reads, and the attention maps that go with it.

A vitlab model's head reads one of two things (``ModelConfig.global_pool``):

- ``"token"``: the class token. ViT: the class token's row of a self-attention map; CaiT: the single
  query row of a class-attention map (keys ``[cls, patches]``, the patches being the output of the last
  self-attention block).
- ``"avg"``: the mean of the patch tokens (vitlab's default on digit data, and the only choice without a
  class token). The pooled output is the mean of the patch rows, so the map shown is the attention of the
  patch queries, averaged over them. CaiT's class-attention stage does not touch the patches, so with
  ``"avg"`` only its self-attention maps matter to the head.

:func:`readout_attention` reads a map the way the head reads the model; :mod:`vitlab.analysis.rollout`
carries the same reading through the layers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from vitlab.errors import ConfigError

POOLS = ("token", "avg")


@dataclass
class TokenLayout:
    """Token order of a model's full sequence, ``[front (class token, registers), patches, end registers]``,
    and what its head reads: ``pool="token"`` the class token (first), ``"avg"`` the mean of the patches."""

    num_front: int
    num_patches: int
    num_end: int
    grid_size: int
    class_token: bool
    pool: str = "token"

    def __post_init__(self) -> None:
        if self.pool not in POOLS:
            raise ConfigError(f"pool {self.pool!r} is not one of {POOLS}; use 'token' (class token) or 'avg'")

    @property
    def num_tokens(self) -> int:
        return self.num_front + self.num_patches + self.num_end

    @property
    def patches(self) -> slice:
        return slice(self.num_front, self.num_front + self.num_patches)

    @property
    def registers(self) -> list[int]:
        """Positions of the register tokens: after the class token in front (timm), after the patches at the
        end (ViT-5)."""
        end = self.num_front + self.num_patches
        return list(range(int(self.class_token), self.num_front)) + list(range(end, end + self.num_end))

    @property
    def reads_class_token(self) -> bool:
        """Whether the head reads the class token (else it averages the patch tokens)."""
        return self.class_token and self.pool == "token"

    @classmethod
    def of(cls, model: nn.Module) -> TokenLayout:
        """The layout of a vitlab model (``VisionTransformer`` or ``Cait``)."""
        cfg = model.cfg
        front = getattr(model, "num_front", model.num_prefix_tokens)
        end = getattr(model, "num_end", 0)
        pool = cfg.global_pool if cfg.class_token else "avg"
        return cls(front, model.num_patches, end, model.grid_size, bool(cfg.class_token), pool)

    def for_map(self, attn: Tensor) -> TokenLayout:
        """The layout of one map's keys: CaiT's self-attention maps hold the patches only."""
        t_k = attn.shape[-1]
        if t_k == self.num_tokens:
            return self
        if t_k == self.num_patches:
            return TokenLayout(0, self.num_patches, 0, self.grid_size, False, "avg")
        raise ConfigError(f"attention map over {t_k} keys does not fit a model of {self.num_tokens} tokens "
                          f"({self.num_patches} patches); pass the maps of the same model")


def to_grid(values: Tensor, grid_size: int) -> Tensor:
    """``(..., N)`` per-patch values -> ``(..., g, g)`` in row-major patch order."""
    if values.shape[-1] != grid_size * grid_size:
        raise ConfigError(f"{values.shape[-1]} patch values do not fill a {grid_size}x{grid_size} grid")
    return values.reshape(*values.shape[:-1], grid_size, grid_size)


def reads_query_row(attn: Tensor, layout: TokenLayout) -> bool:
    """Whether ``attn`` is read at its first query row (a class-attention map, or the class token's row
    when the head reads it) rather than averaged over its patch queries."""
    return attn.shape[-2] == 1 or layout.for_map(attn).reads_class_token


def readout_attention(attn: Tensor, layout: TokenLayout) -> Tensor:
    """Per-head attention over the patches of one map ``(B, H, T_q, T_k)`` -> ``(B, H, g, g)``, read as
    the head reads the model: the class token's row (the single row of a class-attention map), or the
    mean over the patch queries when the head averages the patches."""
    if attn.dim() != 4:
        raise ConfigError(f"an attention map must be (B, heads, T_q, T_k), got shape {tuple(attn.shape)}")
    keys = layout.for_map(attn)
    if reads_query_row(attn, layout):
        row = attn[:, :, 0, keys.patches]  # (B, H, N)
    else:
        row = attn[:, :, keys.patches, keys.patches].mean(dim=2)  # (B, H, N_q, N) -> (B, H, N)
    return to_grid(row.detach().float(), layout.grid_size)


def readout_register_attention(attn: Tensor, layout: TokenLayout) -> Tensor:
    """Per-head attention on each register token of one map ``(B, H, T_q, T_k)`` -> ``(B, H, R)``, read off the
    same row as :func:`readout_attention` (the class token's row, or the mean over the patch queries); ``R``
    is 0 when the map's keys hold no registers (CaiT, a model without them)."""
    if attn.dim() != 4:
        raise ConfigError(f"an attention map must be (B, heads, T_q, T_k), got shape {tuple(attn.shape)}")
    keys = layout.for_map(attn)
    regs = torch.tensor(keys.registers, dtype=torch.long, device=attn.device)
    if reads_query_row(attn, layout):
        rows = attn[:, :, 0].index_select(-1, regs)  # (B, H, R)
    else:
        rows = attn[:, :, keys.patches].index_select(-1, regs).mean(dim=2)  # (B, H, N_q, R) -> (B, H, R)
    return rows.detach().float()


class_token_attention = readout_attention  # the name before pooled models were read by their patches


def readout_label(attn: Tensor, layout: TokenLayout) -> str:
    """Which row of ``attn`` :func:`readout_attention` shows, and whether the head reads it, for titles."""
    if attn.shape[-2] == 1:
        row = "class-attention of the class token"
    elif layout.for_map(attn).reads_class_token:
        row = "class-token attention"
    else:
        row = "patch-token attention (mean over patch queries)"
    if layout.reads_class_token:
        return f"{row}; the head reads the class token"
    if attn.shape[-2] == 1:
        return f"{row}; not read by the head, which averages the patch tokens"
    return f"{row}; the head averages the patch tokens"
