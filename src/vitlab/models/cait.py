"""CaiT (Touvron et al., 2021): LayerScale self-attention blocks on the patches, then
class-attention blocks where only the class token queries.

Parameter names follow timm's ``Cait``: ``patch_embed.proj``, ``pos_embed`` (patches only), ``cls_token``,
``blocks.{i}.{norm1,attn.qkv,attn.proj_l,attn.proj_w,attn.proj,norm2,mlp.fc1,mlp.fc2}``,
``blocks_token_only.{j}.{norm1,attn.q,attn.k,attn.v,attn.proj,norm2,mlp}``, ``norm``, ``head``; LayerScale is the
module of every vitlab block (``ls1.gamma``/``ls2.gamma``), which timm's ``Cait`` names ``gamma_1``/``gamma_2``
(a key map in :mod:`vitlab.interop.timm_convert`; older vitlab CaiT checkpoints with those names still load).
Unlike timm, the position embedding resamples to any image size (see :mod:`vitlab.interop`), and
``set_input_size`` / ``dynamic_img_size`` work for CaiT as for the ViT.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from vitlab.layers import ClassAttentionBlock, PatchEmbed, build_pos_embed, norm_layer
from vitlab.models.base import FlopRow, VitlabModel, head_linear, init_vit_weights
from vitlab.models.config import ModelConfig
from vitlab.models.input_size import ResizableInput
from vitlab.models.pretrained_cfg import build_pretrained_cfg, set_pretrained_cfg
from vitlab.models.spec import register_arch
from vitlab.models.vit import make_blocks

_CAIT = dict(arch="cait", attn="talking_heads", gate="layerscale", pos_embed_cls=False,
             drop_path_rule="uniform", depth_token_only=2)

# CaiT paper, Table 1 (dims, depth, heads) and the LayerScale init of each variant as timm and the official code
# set it (cait_xxs36: 1e-5, not the depth rule's 1e-6); a depth override re-derives it (registry.get_config)
PRESETS: dict[str, dict] = {
    "cait_xxs24": dict(_CAIT, embed_dim=192, depth=24, num_heads=4, init_values=1e-5),
    "cait_xxs36": dict(_CAIT, embed_dim=192, depth=36, num_heads=4, init_values=1e-5),
    "cait_xs24": dict(_CAIT, embed_dim=288, depth=24, num_heads=6, init_values=1e-5),
    "cait_s24": dict(_CAIT, embed_dim=384, depth=24, num_heads=8, init_values=1e-5),
    "cait_s36": dict(_CAIT, embed_dim=384, depth=36, num_heads=8, init_values=1e-6),
    "cait_m36": dict(_CAIT, embed_dim=768, depth=36, num_heads=16, init_values=1e-6),
    "cait_m48": dict(_CAIT, embed_dim=768, depth=48, num_heads=16, init_values=1e-6),
}


class Cait(ResizableInput, VitlabModel):
    """Class-Attention in Image Transformers."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        dim = cfg.embed_dim
        self.patch_embed = PatchEmbed(cfg.img_size, cfg.patch_size, cfg.in_chans, dim,
                                      dynamic_img_size=cfg.dynamic_img_size, dynamic_img_pad=cfg.dynamic_img_pad)
        self.grid_size = self.patch_embed.grid_size
        self.num_patches = self.patch_embed.num_patches
        self.num_prefix_tokens = 1
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        table = build_pos_embed(cfg.pos_embed, grid_size=self.grid_size, dim=dim, num_prefix=0)
        if table is None:
            self.pos_embed = None
        elif cfg.pos_embed == "learned":
            self.pos_embed = nn.Parameter(table)
        else:
            self.register_buffer("pos_embed", table)
        self.pos_drop = nn.Dropout(cfg.drop_rate)
        self.blocks = make_blocks(cfg)
        norm = norm_layer(cfg.norm)
        self.blocks_token_only = nn.ModuleList([
            ClassAttentionBlock(dim, cfg.num_heads, mlp_ratio=cfg.mlp_ratio_token_only, qkv_bias=cfg.qkv_bias,
                                norm_layer=norm, gate=cfg.gate, init_values=cfg.gate_init_value())
            for _ in range(cfg.depth_token_only)])
        self.norm = norm(dim)
        self.head_drop = nn.Dropout(cfg.drop_rate)
        self.head = head_linear(dim, cfg.num_classes)
        self.init_weights()
        set_pretrained_cfg(self, build_pretrained_cfg(cfg))

    def init_weights(self) -> None:
        if isinstance(self.pos_embed, nn.Parameter):
            nn.init.trunc_normal_(self.pos_embed, std=0.02)
        nn.init.trunc_normal_(self.cls_token, std=0.02)
        init_vit_weights(self, self.cfg.weight_init)

    def _patch_tokens(self, x: Tensor) -> Tensor:
        pos_embed = self.pos_embed_for(self.patch_embed.feat_size(x))
        x = self.patch_embed(x)  # (B, N, D)
        if pos_embed is not None:
            x = x + pos_embed
        return self.pos_drop(x)

    def forward_features(self, x: Tensor) -> Tensor:
        x = self._patch_tokens(x)
        for blk in self.blocks:
            x = self._run_block(blk, x)
        if self.blocks_token_only is not None:  # None: pruned by prune_intermediate_layers
            x = self.forward_cls(x)
        return self.norm(x)

    def forward_cls(self, x: Tensor) -> Tensor:
        """Patch tokens ``(B, N, D)`` -> ``(B, 1 + N, D)``: the class token through the class-attention blocks,
        prepended."""
        cls = self.cls_token.expand(x.shape[0], -1, -1)  # (B, 1, D)
        for blk in self.blocks_token_only:
            cls = blk(x, cls)
        return torch.cat([cls, x], dim=1)

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        x = x[:, 1:].mean(dim=1) if self.cfg.global_pool == "avg" else x[:, 0]
        x = self.head_drop(x)
        return x if pre_logits else self.head(x)

    def flop_rows(self) -> list[FlopRow]:
        n = self.num_patches
        rows = [FlopRow("patch_embed", self.patch_embed, n, {})]
        rows += [FlopRow(f"blocks.{i}", b, n, {}) for i, b in enumerate(self.blocks)]
        rows += [FlopRow(f"blocks_token_only.{i}", b, n + 1, {}) for i, b in enumerate(self.blocks_token_only)]
        rows.append(FlopRow("norm", self.norm, n + 1, {}))
        if isinstance(self.head, nn.Linear):
            rows.append(FlopRow("head", self.head, 1, {}))
        return rows

    def _token_layout(self) -> tuple[int, int]:
        return 0, 0  # the self-attention blocks see the patches only

    def _prune_head(self) -> None:
        """As timm: the class token and class-attention blocks go with the head."""
        self.blocks_token_only = None
        self.cls_token = None
        self.num_prefix_tokens = 0
        self.reset_classifier(0)

    def _extra_block_groups(self) -> list[tuple[str, tuple[int, ...] | None]]:
        # timm's grouping: class-attention block j shares a layer with block depth - depth_token_only + j
        if self.blocks_token_only is None:
            return []
        offset = len(self.blocks) - len(self.blocks_token_only)
        return [(rf"^blocks_token_only\.{j}\.", (offset + j,)) for j in range(len(self.blocks_token_only))]


register_arch("cait", Cait)
