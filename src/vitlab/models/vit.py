"""The Vision Transformer (Dosovitskiy et al. 2021), assembled from parts; DeepViT and ViT-5 are configurations of it.

Token layout: ``[cls?, registers (front)?, patches, registers (end)?]``. Parameter names follow timm's
``VisionTransformer``: ``patch_embed.proj``, ``cls_token``, ``reg_token``, ``pos_embed``,
``blocks.{i}.{norm1,attn.qkv,attn.q_norm,attn.k_norm,attn.proj,ls1.gamma,norm2,mlp.fc1,mlp.fc2,ls2.gamma}``,
``norm``, ``fc_norm``, ``head``.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import Tensor, nn

from vitlab.layers import (
    Attention,
    ConvStem,
    PatchEmbed,
    ReAttention,
    apply_sigma_reparam,
    block_layer,
    build_pos_embed,
    drop_path_rates,
    init_block_variants,
    layout_rope,
    mlp_layer,
    norm_layer,
)
from vitlab.layers.fixup import init_fixup, init_tfixup
from vitlab.models.base import FlopRow, VitlabModel, head_linear, init_vit_weights
from vitlab.models.config import ModelConfig
from vitlab.models.input_size import ResizableInput, is_grid
from vitlab.models.pretrained_cfg import build_pretrained_cfg, set_pretrained_cfg
from vitlab.models.spec import register_arch

# a leaf of torch.fx graphs: traced with dynamic_img_size, RoPE is built for each input's grid at run time
torch.fx.wrap("layout_rope")

# a from-scratch ViT for 28x28 digits: CLS token, fixed 1-D sinusoidal positions (the paper's plain ViT of the studies)
_VIT_MNIST = dict(img_size=28, patch_size=7, in_chans=1, num_classes=10, embed_dim=64, depth=8, num_heads=8,
                  mlp_ratio=4.0, pos_embed="sincos1d")

PRESETS: dict[str, dict] = {
    "vit_mnist": _VIT_MNIST,
    # what `vitlab train --model vit_mnist` trains on digits and clothing: vit_mnist
    # read out by average pooling of the patch tokens with fc_norm (timm's rule for global_pool='avg'; the class
    # token stays a token)
    "vit_mnist_gap": {**_VIT_MNIST, "global_pool": "avg"},
    # the most accurate configuration measured on mnist-5k (docs/training.md): vit_mnist_gap behind a convolutional
    # stem (Xiao et al. 2021, "Early convolutions help transformers see better"; DeepViT's conv stem), at patch 4
    "vit_mnist_conv": {**_VIT_MNIST, "global_pool": "avg", "stem": "conv", "patch_size": 4},
    # the same stem at patch 14: the stem's 14x14 feature maps cut into 2x2 tokens, so the eight blocks see 4 tokens
    # (vit_mnist_conv: 49); what `vitlab train` trains on digits when no --model is given (docs/training.md)
    "vit_mnist_conv_patch14": {**_VIT_MNIST, "global_pool": "avg", "stem": "conv", "patch_size": 14},
    # that model with a stem of 32 channels, 6 blocks and 4 heads of 16, about twice the images/s on a CPU: what
    # `vitlab train` trains on clothing (Fashion-MNIST) when no --model is given, 19 epochs in 15 minutes of 2 cores
    "vit_fashion_conv_patch14": {**_VIT_MNIST, "global_pool": "avg", "stem": "conv", "patch_size": 14,
                                 "stem_chans": 32, "depth": 6, "num_heads": 4},
    # ViT (Dosovitskiy et al., 2021) / DeiT sizes
    "vit_tiny": dict(embed_dim=192, depth=12, num_heads=3),
    "vit_small": dict(embed_dim=384, depth=12, num_heads=6),
    "vit_base": dict(embed_dim=768, depth=12, num_heads=12),
}


def block_attention(cfg: ModelConfig, index: int) -> tuple[type[nn.Module], dict]:
    """The attention class and its options for block ``index`` under ``cfg``."""
    norm = norm_layer(cfg.norm)
    if cfg.attn == "reattention":
        first = 0 if cfg.reattn_last is None else max(0, cfg.depth - cfg.reattn_last)
        if index >= first:
            return ReAttention, dict(qkv_bias=cfg.qkv_bias, norm=cfg.reattn_norm, scale=cfg.reattn_scale,
                                     attn_drop=cfg.attn_drop_rate)
    return Attention, dict(qkv_bias=cfg.qkv_bias, qk_norm=cfg.qk_norm, norm_layer=norm,
                           talking_heads=cfg.attn == "talking_heads", attn_drop=cfg.attn_drop_rate,
                           scale_norm=cfg.scale_attn_norm)


def make_blocks(cfg: ModelConfig) -> nn.ModuleList:
    """The ``depth`` self-attention blocks of ``cfg`` in its ``block`` layout (:mod:`vitlab.layers.block_variants`),
    with sigma-Reparam's linears when asked; CaiT's LayerScale blocks register their gates first (the parameter
    order of timm's ``Cait``, see :class:`~vitlab.layers.Block`)."""
    gates_first = cfg.arch == "cait" and cfg.gate == "layerscale"
    rates = drop_path_rates(cfg.drop_path_rate, cfg.depth, cfg.drop_path_rule)
    blocks, layer = [], block_layer(cfg.block)
    for i in range(cfg.depth):
        attn_layer, attn_kwargs = block_attention(cfg, i)
        blocks.append(layer(cfg.embed_dim, cfg.num_heads, mlp_ratio=cfg.mlp_ratio, attn_layer=attn_layer,
                            attn_kwargs=attn_kwargs, mlp_layer=mlp_layer(cfg.mlp), norm_layer=norm_layer(cfg.norm),
                            gate=cfg.gate, init_values=cfg.gate_init_value(), drop_path=rates[i],
                            proj_drop=cfg.drop_rate if cfg.drop_rate_at == "all" else 0.0, gates_first=gates_first,
                            depth=cfg.depth, scale_mlp_norm=cfg.scale_mlp_norm))
    stack = nn.ModuleList(blocks)
    if cfg.sigma_reparam:
        apply_sigma_reparam(stack)
    return stack


class VisionTransformer(ResizableInput, VitlabModel):
    """ViT with optional class token, registers, LayerScale or scalar gates, re-attention, QK-norm, RoPE.

    ``cfg.dynamic_img_size``: any ``H, W`` multiple of the patch (non-square too), with the position table
    resampled (learned) or computed (sin-cos) and RoPE built for that grid on each call."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        dim = cfg.embed_dim
        stem = partial(ConvStem, stem_chans=cfg.stem_chans) if cfg.stem == "conv" else PatchEmbed
        self.patch_embed = stem(cfg.img_size, cfg.patch_size, cfg.in_chans, dim,
                                dynamic_img_size=cfg.dynamic_img_size, dynamic_img_pad=cfg.dynamic_img_pad)
        self.grid_size = self.patch_embed.grid_size
        self.num_patches = self.patch_embed.num_patches
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim)) if cfg.class_token else None
        self.reg_token = nn.Parameter(torch.zeros(1, cfg.reg_tokens, dim)) if cfg.reg_tokens else None
        self.num_front = int(cfg.class_token) + (cfg.reg_tokens if cfg.reg_position == "front" else 0)
        self.num_end = cfg.reg_tokens if cfg.reg_position == "end" else 0
        self.num_prefix_tokens = self.num_front
        table = build_pos_embed(cfg.pos_embed, grid_size=self.grid_size, dim=dim,
                                num_prefix=self.num_front if cfg.pos_embed_cls else 0)
        if table is None:
            self.pos_embed = None
        elif cfg.pos_embed == "learned":
            self.pos_embed = nn.Parameter(table)
        else:  # fixed sin-cos: a buffer under timm's name, saved with the weights
            self.register_buffer("pos_embed", table)
        # drop_rate_at='head': the ViT-5 code drops out only before the head
        self.pos_drop = nn.Dropout(cfg.drop_rate if cfg.drop_rate_at == "all" else 0.0)
        if cfg.rotates:
            self.register_buffer("rope", self._rope_table(self.grid_size), persistent=False)  # (2, T, head_dim)
        else:
            self.rope = None
        self.blocks = make_blocks(cfg)
        norm = norm_layer(cfg.norm)
        use_fc_norm = cfg.global_pool == "avg" if cfg.fc_norm is None else cfg.fc_norm
        self.norm = nn.Identity() if use_fc_norm else norm(dim)
        self.fc_norm = norm(dim) if use_fc_norm else nn.Identity()
        self.head_drop = nn.Dropout(cfg.drop_rate)
        self.head = head_linear(dim, cfg.num_classes)
        self.init_weights()
        set_pretrained_cfg(self, build_pretrained_cfg(cfg))

    def _pos_slots(self) -> int:
        return self.num_front if self.cfg.pos_embed_cls else 0

    def _rope_table(self, grid: int | tuple[int, int]) -> Tensor:
        cfg = self.cfg
        return layout_rope(self.num_front, grid, self.num_end, cfg.embed_dim // cfg.num_heads, cfg.rope_theta,
                           cfg.reg_rope_theta, layout=cfg.rope_layout, patches=cfg.rope)

    def _input_size_changed(self) -> None:
        if self.rope is not None:
            self.rope = self._rope_table(self.grid_size).to(self.rope.device)

    def rope_for(self, grid: tuple[int, int]) -> Tensor | None:
        """The RoPE table ``(2, T, head_dim)`` for a ``(h, w)`` patch grid (the stored one at the configured grid)."""
        if self.rope is None or is_grid(grid, self.grid_size):
            return self.rope
        return self._rope_table(tuple(grid)).to(self.rope.device)

    def init_weights(self) -> None:
        if isinstance(self.pos_embed, nn.Parameter):
            nn.init.trunc_normal_(self.pos_embed, std=0.02)
        for tok in (self.cls_token, self.reg_token):
            if tok is not None and self.cfg.token_init_std is None:
                nn.init.normal_(tok, std=1e-6)  # timm
            elif tok is not None:  # the ViT-5 code, DeiT III: trunc_normal_(std=0.02)
                nn.init.trunc_normal_(tok, std=self.cfg.token_init_std)
        init_vit_weights(self, self.cfg.weight_init)
        for m in self.modules():
            if isinstance(m, ReAttention):
                m.reset_parameters()
        init_block_variants(self)  # DeepNorm's init, sigma-Reparam's state (no-ops otherwise)
        if self.cfg.gate == "fixup":
            init_fixup(list(self.blocks), self.head)
        elif self.cfg.gate == "tfixup":
            init_tfixup(self)

    def _tokens(self, x: Tensor, grid: tuple[int, int] | None = None) -> Tensor:
        """Patches ``(B, N, D)`` on a ``(h, w)`` grid (default: the configured one) -> all tokens ``(B, T, D)``
        with position embedding added."""
        B = x.shape[0]
        pos_embed = self.pos_embed if grid is None else self.pos_embed_for(grid)
        front = []
        if self.cls_token is not None:
            front.append(self.cls_token.expand(B, -1, -1))
        if self.reg_token is not None and self.num_front > int(self.cls_token is not None):
            front.append(self.reg_token.expand(B, -1, -1))
        if pos_embed is not None and not self.cfg.pos_embed_cls:
            x = x + pos_embed
        if front:
            x = torch.cat([*front, x], dim=1)
        if pos_embed is not None and self.cfg.pos_embed_cls:
            x = x + pos_embed
        if self.num_end:
            x = torch.cat([x, self.reg_token.expand(B, -1, -1)], dim=1)
        return self.pos_drop(x)

    def _embed(self, x: Tensor) -> tuple[Tensor, Tensor | None]:
        """Images ``(B, C, H, W)`` -> tokens ``(B, T, D)`` and the RoPE table for their patch grid."""
        grid = self.patch_embed.feat_size(x)
        return self._tokens(self.patch_embed(x), grid), self.rope_for(grid)

    def forward_features(self, x: Tensor) -> Tensor:
        x, rope = self._embed(x)  # (B, T, D)
        for blk in self.blocks:
            x = self._run_block(blk, x, rope)
        return self.norm(x)

    def pool(self, x: Tensor) -> Tensor:
        if self.cfg.global_pool == "avg":
            return x[:, self.num_front:x.shape[1] - self.num_end].mean(dim=1)  # patch tokens only
        return x[:, 0]

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        x = self.head_drop(self.fc_norm(self.pool(x)))
        return x if pre_logits else self.head(x)

    def flop_rows(self) -> list[FlopRow]:
        t = self.num_front + self.num_patches + self.num_end
        rows = [FlopRow("patch_embed", self.patch_embed, self.num_patches, {})]
        rows += [FlopRow(f"blocks.{i}", b, t, {"rope": self.rope is not None}) for i, b in enumerate(self.blocks)]
        if hasattr(self.norm, "flop_count"):
            rows.append(FlopRow("norm", self.norm, t, {}))
        if hasattr(self.fc_norm, "flop_count"):
            rows.append(FlopRow("fc_norm", self.fc_norm, 1, {}))
        if isinstance(self.head, nn.Linear):
            rows.append(FlopRow("head", self.head, 1, {}))
        return rows

    def _token_layout(self) -> tuple[int, int]:
        return self.num_front, self.num_end


register_arch("vit", VisionTransformer)
