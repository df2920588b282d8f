"""DeepViT re-attention (Zhou et al. 2021): a learnable heads x heads mix of the softmaxed maps, then a norm."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from vitlab.errors import ConfigError
from vitlab.layers.attention import AttentionBase, check_heads, record_pre_mix

__all__ = ["REATTN_NORMS", "ReAttention", "record_pre_mix"]  # record_pre_mix: its first home

REATTN_NORMS = ("batch", "layer")


class ReAttention(AttentionBase):
    """``Norm(Theta^T softmax(Q K^T / sqrt(d))) V``.

    :func:`~vitlab.layers.record_attention` records the map multiplied with the values (mixed, normalised);
    :func:`record_pre_mix` records the softmax maps before the head mix.

    ``norm='batch'`` is BatchNorm over the head channels (the official code), ``'layer'`` LayerNorm over
    the heads at each position (vit-pytorch). ``scale=True`` multiplies the re-attended map by
    ``head_dim ** -0.5`` as the official ``apply_transform_scale`` option does. Attention dropout acts on the
    softmaxed maps before the head mix, as in the DeepViT code and vit-pytorch's ``deepvit.py``. Mixing
    before the values cannot be fused, so this module always takes the explicit path.
    """

    mixes_heads_after_softmax = True

    def __init__(self, dim: int, num_heads: int = 8, *, qkv_bias: bool = True, norm: str = "batch",
                 scale: bool = False, attn_drop: float = 0.0, proj_drop: float = 0.0) -> None:
        super().__init__()
        self.head_dim = check_heads(dim, num_heads)
        self.dim, self.num_heads = dim, num_heads
        self.scale = self.head_dim**-0.5
        self.reattn_scale = self.scale if scale else 1.0
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.reattn_weights = nn.Parameter(torch.empty(num_heads, num_heads))
        if norm == "batch":
            self.reattn_norm = nn.BatchNorm2d(num_heads)
        elif norm == "layer":
            self.reattn_norm = nn.LayerNorm(num_heads)
        else:
            raise ConfigError(f"unknown re-attention norm {norm!r}; choose one of {', '.join(REATTN_NORMS)}")
        self.norm_kind = norm
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # identity plus small noise: starts as plain attention, heads learn to mix
        with torch.no_grad():
            self.reattn_weights.copy_(torch.eye(self.num_heads) + 0.02 * torch.randn(self.num_heads,
                                                                                     self.num_heads))

    def forward(self, x: Tensor, rope: Tensor | None = None) -> Tensor:
        B, T, C = x.shape
        qkv = self.qkv(x).reshape(B, T, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)  # (B, H, T, d)
        attn = (q * self.scale) @ k.transpose(-2, -1)  # (B, H, T, T)
        self._record_logits(attn)
        attn = attn.softmax(dim=-1)
        self._record_pre_mix(attn)
        attn = self.attn_drop(attn)  # on the softmax maps, before the head mix, as both reference codes do
        attn = torch.einsum("bhij,hg->bgij", attn, self.reattn_weights)
        if self.norm_kind == "batch":
            attn = self.reattn_norm(attn)
        else:
            attn = self.reattn_norm(attn.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        attn = attn * self.reattn_scale
        self._record(attn)
        x = (attn @ v).transpose(1, 2).reshape(B, T, C)  # (B, H, T, d) -> (B, T, C)
        return self.proj_drop(self.proj(x))

    def flop_count(self, num_tokens: int, *, matmul_only: bool = False, rope: bool = False) -> int:
        t, c, h = num_tokens, self.dim, self.num_heads
        macs = t * c * 3 * c + 2 * t * t * c + t * c * c + t * t * h * h
        if matmul_only:
            return macs
        norm = 2 if self.norm_kind == "batch" else 3  # per element: BatchNorm (eval) 2, LayerNorm 3
        rescale = h * t * t if self.reattn_scale != 1.0 else 0
        return macs + t * c + h * t * t + norm * h * t * t + rescale  # q scale, softmax, norm, map scale
