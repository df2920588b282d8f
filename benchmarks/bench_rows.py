"""The rows benchmarks/bench.py measures (an architecture at one input size and batch) and the two models of each
row: the vitlab preset and its timm peer."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
from torch import nn

import vitlab


@dataclass(frozen=True)
class Row:
    """One architecture at one input size and batch, measured in ``modes`` against its timm peer."""

    name: str
    preset: str
    overrides: dict
    batch: int
    modes: tuple[str, ...]
    goals: dict  # mode -> the vitlab/timm ratio to reach
    peer: str = "same"  # same | nearest (timm lacks a part) | none (no timm model)
    recipe: dict = field(default_factory=dict)  # label_smoothing, clip_grad, lr, weight_decay of the step


ROWS = (
    Row("vit_mnist 28x28x1", "vit_mnist", {}, 128, ("train", "infer"), {"train": 2.0, "infer": 1.0}),
    Row("vit_tiny p4 32x32x3", "vit_tiny", dict(img_size=32, patch_size=4, num_classes=10), 64, ("train", "infer"),
        {"train": 1.0, "infer": 1.0}),
    Row("cait_xxs24 p4 32x32x3", "cait_xxs24", dict(img_size=32, patch_size=4, num_classes=10), 32,
        ("train", "infer"), {"train": 1.0, "infer": 1.0}),
    Row("vit5_small 224", "vit5_small", {}, 16, ("infer",), {"infer": 1.0}, peer="nearest"),
    Row("deepvit_16b 224", "deepvit_16b", {}, 16, ("infer",), {}, peer="none"),
)
VIT_MNIST = ROWS[0]
CUDA_ROWS = (Row("vit_base 224", "vit_base", {}, 128, ("train", "infer"), {"train": 1.0, "infer": 1.0}),)


def quick_row(row: Row) -> Row:
    """A toy version of ``row`` that runs every code path in well under a second."""
    small = dict(depth=2)
    if row.preset.startswith("cait"):
        small["depth_token_only"] = 1
    if vitlab.get_config(row.preset, **row.overrides).img_size > 64:
        small.update(img_size=32, patch_size=16 if row.preset != "vit5_small" else 8)
    batch = 32 if "train" in row.modes else 4
    return replace(row, overrides={**row.overrides, **small}, batch=batch)


def vitlab_model(row: Row) -> nn.Module:
    return vitlab.create_model(row.preset, **row.overrides)


def timm_peer(row: Row) -> nn.Module:
    """timm's model of the same architecture (ViT-5: the nearest timm model, without RoPE)."""
    cfg = vitlab.get_config(row.preset, **row.overrides)
    common = dict(img_size=cfg.img_size, patch_size=cfg.patch_size, in_chans=cfg.in_chans,
                  num_classes=cfg.num_classes, embed_dim=cfg.embed_dim, depth=cfg.depth, num_heads=cfg.num_heads,
                  mlp_ratio=cfg.mlp_ratio, qkv_bias=cfg.qkv_bias)
    if cfg.arch == "cait":
        from timm.models.cait import Cait

        return Cait(**common, init_values=cfg.gate_init_value(), depth_token_only=cfg.depth_token_only,
                    mlp_ratio_token_only=cfg.mlp_ratio_token_only)
    from timm.models.vision_transformer import VisionTransformer

    if cfg.rope:
        from timm.layers import RmsNorm

        return VisionTransformer(**common, reg_tokens=cfg.reg_tokens, no_embed_class=True, qk_norm=True,
                                 norm_layer=RmsNorm, init_values=cfg.init_values, global_pool=cfg.global_pool)
    peer = VisionTransformer(**common, class_token=cfg.class_token, global_pool=cfg.global_pool)
    if cfg.pos_embed != "learned":
        peer.pos_embed.requires_grad_(False)  # vitlab's table is a fixed sin-cos buffer
    return peer


def build(kind: str, row: Row) -> nn.Module:
    torch.manual_seed(0)
    return vitlab_model(row) if kind == "vitlab" else timm_peer(row)


def matmul_flops_per_image(row: Row, mode: str) -> float:
    """Model FLOPs of one image (2 per multiply of the matmul-like ops; training = 3x forward)."""
    return 2.0 * vitlab_model(row).flop_count(matmul_only=True) * (3 if mode == "train" else 1)
