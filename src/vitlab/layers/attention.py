"""Multi-head self-attention (Dosovitskiy et al. 2021) with a fused SDPA path and an explicit path that returns maps.

Options: qkv bias, QK-norm (ViT-5), talking heads (CaiT: head mixing before and after the softmax) and
2-D RoPE (ViT-5). Every attention kind in vitlab derives from :class:`AttentionBase`, so
:func:`record_attention` collects the maps of any model.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitlab.errors import ConfigError
from vitlab.layers.norm import LayerNorm
from vitlab.layers.rope import apply_rope

# a leaf of torch.fx graphs: the traced model picks its rotation's autograd-free path per call, as the eager one
torch.fx.wrap("apply_rope")


def check_heads(dim: int, num_heads: int) -> int:
    """Return the head dim, or raise when ``num_heads`` does not divide ``dim``."""
    if dim <= 0 or num_heads <= 0:
        raise ConfigError(f"embed_dim and num_heads must be positive, got {dim} and {num_heads}")
    if dim % num_heads:
        ok = [h for h in range(1, min(dim, 32) + 1) if dim % h == 0]
        raise ConfigError(f"num_heads {num_heads} does not divide embed_dim {dim}; pick num_heads from "
                          f"{ok} or an embed_dim that is a multiple of {num_heads}")
    return dim // num_heads


class AttentionBase(nn.Module):
    """Shared plumbing: the map recorders used by :func:`record_attention` and :func:`record_pre_mix`."""

    _maps: list[Tensor] | None = None
    _pre_mix: list[Tensor] | None = None
    _logits: list[Tensor] | None = None

    @property
    def recording(self) -> bool:
        return self._maps is not None or self._pre_mix is not None or self._logits is not None

    @property
    def mixes_heads_after_softmax(self) -> bool:
        """Whether the map that multiplies V is a mix over heads of the softmax maps (DeepViT's re-attention,
        CaiT's talking heads): its rows are no longer probabilities."""
        return False

    def _record(self, attn: Tensor) -> None:
        if self._maps is not None:
            self._maps.append(attn)

    def _record_pre_mix(self, attn: Tensor) -> None:
        if self._pre_mix is not None:
            self._pre_mix.append(attn)

    def _record_logits(self, logits: Tensor) -> None:
        if self._logits is not None:
            self._logits.append(logits)


@contextlib.contextmanager
def _recording(mods: list[AttentionBase], slot: str) -> Iterator[list[Tensor]]:
    """Point the recorder ``slot`` of every module in ``mods`` at one list, yield it, and detach them."""
    maps: list[Tensor] = []
    for m in mods:
        setattr(m, slot, maps)
    try:
        yield maps
    finally:
        for m in mods:
            setattr(m, slot, None)


def record_attention(modules: Iterable[nn.Module]) -> contextlib.AbstractContextManager[list[Tensor]]:
    """Within the block, every attention module appends its map ``(B, heads, T_q, T_k)`` to the
    yielded list in call order and takes its explicit path."""
    return _recording([m for m in modules if isinstance(m, AttentionBase)], "_maps")


def record_pre_mix(modules: Iterable[nn.Module]) -> contextlib.AbstractContextManager[list[Tensor]]:
    """Within the block, every attention module that mixes heads after the softmax (re-attention, talking
    heads) appends its softmax maps ``(B, heads, T, T)`` *before* that mix (probability rows, comparable with
    plain attention's maps) to the yielded list, in call order."""
    return _recording([m for m in modules if isinstance(m, AttentionBase) and m.mixes_heads_after_softmax],
                      "_pre_mix")


def record_logits(modules: Iterable[nn.Module]) -> contextlib.AbstractContextManager[list[Tensor]]:
    """Within the block, every attention module appends its pre-softmax logits ``Q K^T / sqrt(d)``
    ``(B, heads, T_q, T_k)`` (before any head mix) to the yielded list in call order and takes its explicit path;
    the logit growth that precedes divergence (Dehghani et al. 2023, ViT-22B) is read from them."""
    return _recording([m for m in modules if isinstance(m, AttentionBase)], "_logits")


def mix_heads(attn: Tensor, mix: nn.Linear) -> Tensor:
    """``mix`` applied over the head axis of ``(B, H, T_q, T_k)`` maps (talking heads), as one batched
    matmul on the contiguous maps: the same sums as ``mix(attn.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)``
    without the two permuted copies."""
    B, H, Tq, Tk = attn.shape
    G = mix.out_features
    bias = mix.bias.view(1, G, 1).expand(B, G, Tq * Tk) if mix.bias is not None else attn.new_zeros(())
    out = torch.baddbmm(bias, mix.weight.expand(B, G, H), attn.reshape(B, H, Tq * Tk),
                        beta=1 if mix.bias is not None else 0)  # (B, G, Tq * Tk)
    return out.view(B, G, Tq, Tk)


class Attention(AttentionBase):
    """``softmax(Q K^T / sqrt(d)) V`` over ``heads`` (timm names ``qkv``, ``q_norm``, ``k_norm``, ``proj``;
    talking heads adds ``proj_l`` and ``proj_w`` as timm's CaiT)."""

    explicit_max_tokens = 32  # the CPU crossover measured in benchmarks/README.md

    def __init__(self, dim: int, num_heads: int = 8, *, qkv_bias: bool = True, qk_norm: bool = False,
                 talking_heads: bool = False, norm_layer: type[nn.Module] = LayerNorm,
                 attn_drop: float = 0.0, proj_drop: float = 0.0, scale_norm: bool = False) -> None:
        super().__init__()
        self.head_dim = check_heads(dim, num_heads)
        self.dim, self.num_heads = dim, num_heads
        self.scale = self.head_dim**-0.5
        self.talking_heads = talking_heads
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.q_norm = norm_layer(self.head_dim) if qk_norm else nn.Identity()
        self.k_norm = norm_layer(self.head_dim) if qk_norm else nn.Identity()
        if talking_heads:
            self.proj_l = nn.Linear(num_heads, num_heads)
            self.proj_w = nn.Linear(num_heads, num_heads)
        self.attn_drop = nn.Dropout(attn_drop)
        # scale_norm: a norm of the heads' output before proj (timm's scale_attn_norm; NormFormer, Shleifer et al. 2021)
        self.norm = norm_layer(dim) if scale_norm else nn.Identity()
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        self.fused: bool | None = None  # None: the faster path per call; True: SDPA; False: explicit

    def forward(self, x: Tensor, rope: Tensor | None = None) -> Tensor:
        B, T, C = x.shape
        qkv = self.qkv(x).reshape(B, T, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        explicit = self.recording or self.talking_heads or self._explicit_is_faster(x, T)
        if explicit:
            qkv = qkv.contiguous()  # one copy, so the batched matmuls below need none
        q, k, v = qkv.unbind(0)  # (B, H, T, d) each
        q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:
            q, k = apply_rope(q, rope), apply_rope(k, rope)
        if explicit:
            x = self._explicit(q, k, v)
        else:
            x = F.scaled_dot_product_attention(q, k, v, dropout_p=self.attn_drop.p if self.training else 0.0)
        x = x.transpose(1, 2).reshape(B, T, C)  # (B, H, T, d) -> (B, T, C)
        return self.proj_drop(self.proj(self.norm(x)))

    @property
    def mixes_heads_after_softmax(self) -> bool:
        return self.talking_heads

    def _explicit_is_faster(self, x: Tensor, num_tokens: int) -> bool:
        """``fused`` None picks per call: on CPU with autograd, few tokens and no attention dropout, the
        explicit batched matmuls beat the fused kernel (whose backward is slow on tiny heads). A torch.fx graph
        has no per-call choice: traced, ``fused`` None takes the fused kernel (timm's ``Attention`` default)."""
        if self.fused is not None:
            return not self.fused
        if isinstance(x, torch.fx.Proxy):
            return False
        return (x.device.type == "cpu" and torch.is_grad_enabled() and num_tokens <= self.explicit_max_tokens
                and not (self.training and self.attn_drop.p > 0))

    def _explicit(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        attn = (q * self.scale) @ k.transpose(-2, -1)  # (B, H, T, T)
        self._record_logits(attn)
        if self.talking_heads:
            attn = mix_heads(attn, self.proj_l)  # mix heads before the softmax
        attn = attn.softmax(dim=-1)
        if self.talking_heads:
            self._record_pre_mix(attn)
            attn = mix_heads(attn, self.proj_w)  # and after
        self._record(attn)
        return self.attn_drop(attn) @ v  # (B, H, T, d)

    def flop_count(self, num_tokens: int, *, matmul_only: bool = False, rope: bool = False) -> int:
        t, c, h = num_tokens, self.dim, self.num_heads
        macs = t * c * 3 * c + 2 * t * t * c + t * c * c  # qkv, QK^T and AV, proj
        if self.talking_heads:
            macs += 2 * t * t * h * h
        if matmul_only:
            return macs
        extra = t * c + h * t * t  # q * scale, softmax division
        if isinstance(self.q_norm, nn.Module) and hasattr(self.q_norm, "flop_count"):
            extra += 2 * self.q_norm.flop_count(t * h)
        if hasattr(self.norm, "flop_count"):
            extra += self.norm.flop_count(t)
        if rope:
            extra += 2 * 2 * t * c  # q and k: x * cos + rot(x) * sin
        return macs + extra
