"""CaiT class-attention (Touvron et al. 2021): only the class token queries; keys and values are all tokens."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitlab.layers.attention import AttentionBase, check_heads
from vitlab.layers.block import ResidualGates
from vitlab.layers.mlp import Mlp
from vitlab.layers.norm import LayerNorm


class ClassAttention(AttentionBase):
    """Attention of the class token over ``[cls, patches]`` (timm names ``q``, ``k``, ``v``, ``proj``)."""

    def __init__(self, dim: int, num_heads: int = 8, *, qkv_bias: bool = True, attn_drop: float = 0.0,
                 proj_drop: float = 0.0) -> None:
        super().__init__()
        self.head_dim = check_heads(dim, num_heads)
        self.dim, self.num_heads = dim, num_heads
        self.scale = self.head_dim**-0.5
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        self.k = nn.Linear(dim, dim, bias=qkv_bias)
        self.v = nn.Linear(dim, dim, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x: Tensor) -> Tensor:
        """``x`` ``(B, T, C)`` with the class token first; returns the new class token ``(B, 1, C)``."""
        B, T, C = x.shape
        q = self.q(x[:, :1]).reshape(B, 1, self.num_heads, self.head_dim).transpose(1, 2)  # (B, H, 1, d)
        k = self.k(x).reshape(B, T, self.num_heads, self.head_dim).transpose(1, 2)  # (B, H, T, d)
        v = self.v(x).reshape(B, T, self.num_heads, self.head_dim).transpose(1, 2)
        if self.recording:
            attn = (q * self.scale) @ k.transpose(-2, -1)  # (B, H, 1, T)
            self._record_logits(attn)
            attn = attn.softmax(dim=-1)
            self._record(attn)
            x_cls = self.attn_drop(attn) @ v
        else:
            x_cls = F.scaled_dot_product_attention(q, k, v, dropout_p=self.attn_drop.p if self.training else 0.0)
        x_cls = x_cls.transpose(1, 2).reshape(B, 1, C)
        return self.proj_drop(self.proj(x_cls))

    def flop_count(self, num_tokens: int, *, matmul_only: bool = False) -> int:
        t, c, h = num_tokens, self.dim, self.num_heads
        macs = c * c + 2 * t * c * c + 2 * t * c + c * c  # q (one token), k and v, QK^T and AV, proj
        return macs if matmul_only else macs + c + h * t


class ClassAttentionBlock(ResidualGates, nn.Module):
    """``x_cls += gate(CA(norm1([x_cls, x])))``, ``x_cls += gate(MLP(norm2(x_cls)))``.

    The gates are modules ``ls1``/``ls2`` (timm's ``Cait`` names LayerScale's ``gamma_1``/``gamma_2``: a key map
    of :mod:`vitlab.interop.timm_convert`). LayerScale gates are registered before the layers, as in CaiT's
    self-attention blocks (:class:`~vitlab.layers.block.Block`'s ``gates_first``).
    """

    def __init__(self, dim: int, num_heads: int, *, mlp_ratio: float = 4.0, qkv_bias: bool = True,
                 norm_layer: type[nn.Module] = LayerNorm, gate: str = "layerscale", init_values: float = 1e-5,
                 drop_path: float = 0.0, proj_drop: float = 0.0, attn_drop: float = 0.0) -> None:
        super().__init__()
        gates_first = gate == "layerscale"  # CaiT's parameter order, as Block(gates_first=True)
        if gates_first:
            self._init_gates(dim, gate, init_values, drop_path)
        # ReZero drops the pre-norms, as in Block
        self.norm1 = nn.Identity() if gate == "rezero" else norm_layer(dim)
        self.attn = ClassAttention(dim, num_heads, qkv_bias=qkv_bias, attn_drop=attn_drop, proj_drop=proj_drop)
        self.norm2 = nn.Identity() if gate == "rezero" else norm_layer(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), drop=proj_drop)
        self.dim = dim
        if not gates_first:
            self._init_gates(dim, gate, init_values, drop_path)

    def forward(self, x: Tensor, x_cls: Tensor) -> Tensor:
        u = torch.cat([x_cls, x], dim=1)  # (B, 1 + N, C)
        x_cls = self._residual(1, x_cls, self.attn(self.norm1(u)))
        x_cls = self._residual(2, x_cls, self.mlp(self.norm2(x_cls)))
        return x_cls

    def flop_count(self, num_tokens: int, *, matmul_only: bool = False) -> int:
        f = self.attn.flop_count(num_tokens, matmul_only=matmul_only)
        f += self.mlp.flop_count(1, matmul_only=matmul_only)
        if not matmul_only:
            for norm, t in ((self.norm1, num_tokens), (self.norm2, 1)):
                f += norm.flop_count(t) if hasattr(norm, "flop_count") else 0
            f += 2 * self._gate_flops(1)
        return f
