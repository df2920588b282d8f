# Copyright 2026 Feng Wang
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""The official ViT-5 model (Wang et al., ViT-5), a pinned copy used as the test oracle.

Source: https://github.com/wangf3014/ViT-5 at commit b7b0796062f4b51ae00523cb77c7117ae2dff536,
files ``models_vit5.py`` and ``rope.py`` (the ``vit_models`` class, its blocks and the ``vit5_*`` builders) and
the position-table interpolation of ``main.py`` (``--finetune``). Changes, none of which alters the function
computed:

- timm imports from ``timm.layers`` / ``timm.models.vision_transformer`` (the ``timm.models.layers`` alias is
  deprecated); ``@register_model`` dropped, so importing this file does not touch timm's registry;
- the optional ``flash_attn`` import dropped (every ``vit5_*`` builder passes ``flash=False``);
- ``einops.rearrange`` / ``repeat`` written with torch ops (einops is not a dependency);
- ``VisionRotaryEmbedding.forward`` builds its positions on the input's device instead of ``.cuda()``;
- ``torch.nn.functional as F`` imported (upstream's ``forward`` calls ``F.dropout`` for ``drop_rate > 0``
  without importing it);
- the unused ``rotate_freqs`` and the ``deit_*_LS`` builders left out.
"""
# ruff: noqa
import math
from functools import partial
from math import pi

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import DropPath, Mlp, PatchEmbed, trunc_normal_

PINNED_COMMIT = "b7b0796062f4b51ae00523cb77c7117ae2dff536"


# ------------------------------------------------------------------------------------------------ rope.py

def broadcat(freqss, dim=-1):
    num_freqss = len(freqss)
    shape_lens = set(list(map(lambda t: len(t.shape), freqss)))
    assert len(shape_lens) == 1, 'freqss must all have the same number of dimensions'
    shape_len = list(shape_lens)[0]
    dim = (dim + shape_len) if dim < 0 else dim
    dims = list(zip(*map(lambda t: list(t.shape), freqss)))
    expandable_dims = [(i, val) for i, val in enumerate(dims) if i != dim]
    assert all([*map(lambda t: len(set(t[1])) <= 2, expandable_dims)]), 'invalid dimensions for broadcastable concatentation'
    max_dims = list(map(lambda t: (t[0], max(t[1])), expandable_dims))
    expanded_dims = list(map(lambda t: (t[0], (t[1],) * num_freqss), max_dims))
    expanded_dims.insert(dim, (dim, dims[dim]))
    expandable_shapes = list(zip(*map(lambda t: t[1], expanded_dims)))
    freqss = list(map(lambda t: t[0].expand(*t[1]), zip(freqss, expandable_shapes)))
    return torch.cat(freqss, dim=dim)


def rotate_half(x):
    # upstream: rearrange(x, '... (d r) -> ... d r', r=2); stack((-x2, x1)); rearrange back
    x = x.reshape(*x.shape[:-1], -1, 2)
    x1, x2 = x.unbind(dim=-1)
    x = torch.stack((-x2, x1), dim=-1)
    return x.flatten(-2)


class VisionRotaryEmbedding(nn.Module):
    def __init__(
        self,
        dim,
        pt_seq_len=14,
        custom_freqs=None,
        freqs_for='lang',
        theta=10000,
        max_freq=10,
        num_freqs=1,
    ):
        super().__init__()
        if custom_freqs:
            freqs = custom_freqs
        elif freqs_for == 'lang':
            freqs = 1. / (theta ** (torch.arange(0, dim, 2)[:(dim // 2)].float() / dim))
        elif freqs_for == 'pixel':
            freqs = torch.linspace(1., max_freq / 2, dim // 2) * pi
        elif freqs_for == 'constant':
            freqs = torch.ones(num_freqs).float()
        else:
            raise ValueError(f'unknown modality {freqs_for}')

        self.pt_seq_len = pt_seq_len
        self.register_buffer("freqs", freqs)

    def forward(self, x):
        ft_seq_len = int(np.sqrt(x.shape[1]))
        t = torch.arange(ft_seq_len, device=x.device) / ft_seq_len * self.pt_seq_len  # upstream: .cuda()

        freqs = torch.einsum('..., f -> ... f', t, self.freqs)
        freqs = freqs.repeat_interleave(2, dim=-1)  # upstream: repeat(freqs, '... n -> ... (n r)', r=2)
        freqs = broadcat((freqs[:, None, :], freqs[None, :, :]), dim=-1)

        freqs_cos = freqs.cos().view(-1, 1, freqs.shape[-1])
        freqs_sin = freqs.sin().view(-1, 1, freqs.shape[-1])
        return x * freqs_cos + rotate_half(x) * freqs_sin


# ------------------------------------------------------------------------------------------------ models_vit5.py

class Attention(nn.Module):
    # taken from https://github.com/rwightman/pytorch-image-models/blob/master/timm/models/vision_transformer.py
    def __init__(self, dim, num_heads=8, qkv_bias=False, qk_scale=None, attn_drop=0., proj_drop=0., flash=True,
                 rope_size=0, rope_reg_size=0, num_registers=0, reg_theta=10000, qk_norm=False):
        super().__init__()
        self.num_heads = num_heads
        head_dim = dim // num_heads
        self.scale = qk_scale or head_dim ** -0.5

        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

        self.flash = flash
        self.num_registers = num_registers
        self.rope = VisionRotaryEmbedding(head_dim//2, rope_size) if rope_size > 0 else None
        self.rope_reg = VisionRotaryEmbedding(head_dim//2, rope_reg_size, theta=reg_theta) if rope_reg_size > 0 else None

        self.qk_norm = qk_norm
        if qk_norm:
            self.q_norm = RMSNorm(head_dim, eps=1e-6)
            self.k_norm = RMSNorm(head_dim, eps=1e-6)

    def forward(self, x):
        B, N, C = x.shape
        reg_idx = N - self.num_registers

        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, C // self.num_heads)
        q, k, v = qkv.unbind(dim=2)

        if self.qk_norm:
            qk_dtype = q.dtype
            q = self.q_norm(q).to(qk_dtype)
            k = self.k_norm(k).to(qk_dtype)

        if self.rope is not None:
            q = torch.cat((q[:, :1], self.rope(q[:, 1: reg_idx]), q[:, reg_idx:]), dim=1)
            k = torch.cat((k[:, :1], self.rope(k[:, 1: reg_idx]), k[:, reg_idx:]), dim=1)
        if self.rope_reg is not None:
            q = torch.cat((q[:, :1], q[:, 1: reg_idx], self.rope_reg(q[:, reg_idx:])), dim=1)
            k = torch.cat((k[:, :1], k[:, 1: reg_idx], self.rope_reg(k[:, reg_idx:])), dim=1)

        if self.flash:
            raise NotImplementedError("flash_attn path not part of the test oracle")
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q = q * self.scale
        attn = (q @ k.transpose(-2, -1))
        attn = attn.softmax(dim=-1)
        attn = self.attn_drop(attn)
        x = (attn @ v).transpose(1, 2).reshape(B, N, C)

        x = self.proj(x)
        x = self.proj_drop(x)
        return x


class RMSNorm(nn.Module):
    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class Block(nn.Module):
    def __init__(self, dim, num_heads, mlp_ratio=4., qkv_bias=False, qk_scale=None, drop=0., attn_drop=0., drop_path=0.,
                 act_layer=nn.GELU, norm_layer=nn.LayerNorm, Attention_block=Attention, Mlp_block=Mlp, init_values=1e-4,
                 flash=True, rope_size=0, rope_reg_size=0, reg_theta=10000, num_registers=0, qk_norm=False, layer_scale=True):
        super().__init__()
        self.norm1 = norm_layer(dim)
        self.attn = Attention_block(
            dim, num_heads=num_heads, qkv_bias=qkv_bias, qk_scale=qk_scale, attn_drop=attn_drop, proj_drop=drop, flash=flash,
            rope_size=rope_size, rope_reg_size=rope_reg_size, num_registers=num_registers, qk_norm=qk_norm, reg_theta=reg_theta)
        self.drop_path = DropPath(drop_path) if drop_path > 0. else nn.Identity()
        self.norm2 = norm_layer(dim)
        mlp_hidden_dim = int(dim * mlp_ratio)
        self.mlp = Mlp_block(in_features=dim, hidden_features=mlp_hidden_dim, act_layer=act_layer, drop=drop)

        self.layer_scale = layer_scale
        if layer_scale:
            self.gamma_1 = nn.Parameter(init_values * torch.ones((dim)), requires_grad=True)
            self.gamma_2 = nn.Parameter(init_values * torch.ones((dim)), requires_grad=True)

    def forward(self, x):
        if self.layer_scale:
            x = x + self.drop_path(self.gamma_1 * self.attn(self.norm1(x)))
            x = x + self.drop_path(self.gamma_2 * self.mlp(self.norm2(x)))
        else:
            x = x + self.drop_path(self.attn(self.norm1(x)))
            x = x + self.drop_path(self.mlp(self.norm2(x)))
        return x


class vit_models(nn.Module):
    """ Vision Transformer with LayerScale (https://arxiv.org/abs/2103.17239) support
    taken from https://github.com/rwightman/pytorch-image-models/blob/master/timm/models/vision_transformer.py
    with slight modifications
    """
    def __init__(self, img_size=224, patch_size=16, in_chans=3, num_classes=1000, embed_dim=768, depth=12, num_heads=12, mlp_ratio=4.,
                 qkv_bias=False, qk_scale=None, drop_rate=0., attn_drop_rate=0., drop_path_rate=0., norm_layer=nn.LayerNorm, ape=True,
                 block_layers=Block, Patch_layer=PatchEmbed, act_layer=nn.GELU, Attention_block=Attention, Mlp_block=Mlp,
                 init_scale=1e-4, flash=True, rope=False, num_registers=0, qk_norm=False, reg_theta=10000, layer_scale=True, **kwargs):
        super().__init__()
        self.dropout_rate = drop_rate
        self.num_classes = num_classes
        self.num_features = self.embed_dim = embed_dim
        self.num_registers = num_registers

        self.patch_embed = Patch_layer(
                img_size=img_size, patch_size=patch_size, in_chans=in_chans, embed_dim=embed_dim)
        num_patches = self.patch_embed.num_patches

        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.reg_token = nn.Parameter(torch.zeros(1, num_registers, embed_dim)) if num_registers > 0 else None

        rope_reg_size = int(num_registers ** 0.5)
        assert rope_reg_size ** 2 == num_registers, "num_registers must be a square number"

        self.pos_embed = nn.Parameter(torch.zeros(1, num_patches, embed_dim)) if ape else None

        dpr = [drop_path_rate for i in range(depth)]
        self.blocks = nn.ModuleList([
            block_layers(
                dim=embed_dim, num_heads=num_heads, mlp_ratio=mlp_ratio, qkv_bias=qkv_bias, qk_scale=qk_scale,
                drop=0.0, attn_drop=attn_drop_rate, drop_path=dpr[i], norm_layer=norm_layer,
                act_layer=act_layer, Attention_block=Attention_block, Mlp_block=Mlp_block, init_values=init_scale,
                flash=flash, rope_size=img_size // patch_size if rope else 0,
                rope_reg_size=rope_reg_size, num_registers=num_registers,
                qk_norm=qk_norm, reg_theta=reg_theta, layer_scale=layer_scale)
            for i in range(depth)])

        self.norm = norm_layer(embed_dim)

        self.feature_info = [dict(num_chs=embed_dim, reduction=0, module='head')]
        self.head = nn.Linear(embed_dim, num_classes) if num_classes > 0 else nn.Identity()

        trunc_normal_(self.cls_token, std=.02)
        if ape:
            trunc_normal_(self.pos_embed, std=.02)
        if num_registers > 0:
            trunc_normal_(self.reg_token, std=.02)
        self.apply(self._init_weights)

    def _init_weights(self, m):
        if isinstance(m, nn.Linear):
            trunc_normal_(m.weight, std=.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.constant_(m.bias, 0)
        elif isinstance(m, nn.LayerNorm):
            nn.init.constant_(m.bias, 0)
            nn.init.constant_(m.weight, 1.0)

    def forward_features(self, x):
        B = x.shape[0]
        x = self.patch_embed(x)

        cls_tokens = self.cls_token.expand(B, -1, -1)
        registers = self.reg_token.expand(B, -1, -1) if self.reg_token is not None else None

        if self.pos_embed is not None:
            x = x + self.pos_embed

        x = torch.cat((cls_tokens, x), dim=1)
        if registers is not None:
            x = torch.cat((x, registers), dim=1)

        for i, blk in enumerate(self.blocks):
            x = blk(x)

        x = self.norm(x)
        return x[:, 0]

    def forward(self, x):
        x = self.forward_features(x)
        if self.dropout_rate:
            x = F.dropout(x, p=float(self.dropout_rate), training=self.training)
        x = self.head(x)
        return x


def vit5_small(img_size=224, **kwargs):
    return vit_models(
        img_size=img_size, patch_size=16, embed_dim=384, depth=12, num_heads=6, mlp_ratio=4, qkv_bias=False, num_registers=4, flash=False,
        norm_layer=partial(RMSNorm, eps=1e-6), block_layers=Block, rope=True, rope_reg=True, reg_theta=100, qk_norm=True, **kwargs)


def vit5_base(img_size=224, **kwargs):
    return vit_models(
        img_size=img_size, patch_size=16, embed_dim=768, depth=12, num_heads=12, mlp_ratio=4, qkv_bias=False, num_registers=4, flash=False,
        norm_layer=partial(RMSNorm, eps=1e-6), block_layers=Block, rope=True, rope_reg=True, reg_theta=100, qk_norm=True, **kwargs)


def vit5_large(img_size=224, **kwargs):
    return vit_models(
        img_size=img_size, patch_size=16, embed_dim=1024, depth=24, num_heads=16, mlp_ratio=4, qkv_bias=False, num_registers=4, flash=False,
        norm_layer=partial(RMSNorm, eps=1e-6), block_layers=Block, rope=True, rope_reg=True, reg_theta=100, qk_norm=True, **kwargs)


def vit5_xlarge(img_size=224, **kwargs):
    return vit_models(
        img_size=img_size, patch_size=16, embed_dim=1152, depth=28, num_heads=16, mlp_ratio=4, qkv_bias=False, num_registers=4, flash=False,
        norm_layer=partial(RMSNorm, eps=1e-6), block_layers=Block, rope=True, rope_reg=True, reg_theta=100, qk_norm=True, **kwargs)


def vit5_shape(img_size=224, patch_size=16, embed_dim=384, depth=12, num_heads=6, **kwargs):
    """A ``vit5_*`` builder's model at another width/depth (the same arguments otherwise), for fast tests."""
    return vit_models(
        img_size=img_size, patch_size=patch_size, embed_dim=embed_dim, depth=depth, num_heads=num_heads, mlp_ratio=4,
        qkv_bias=False, num_registers=kwargs.pop("num_registers", 4), flash=False,
        norm_layer=partial(RMSNorm, eps=1e-6), block_layers=Block, rope=kwargs.pop("rope", True), rope_reg=True,
        reg_theta=100, qk_norm=True, **kwargs)


BUILDERS = {"vit5_small": vit5_small, "vit5_base": vit5_base, "vit5_large": vit5_large, "vit5_xlarge": vit5_xlarge}


# ------------------------------------------------------------------------------------------------ main.py (--finetune)

def interpolate_pos_embed(checkpoint_model, model):
    """``main.py``'s resizing of ``pos_embed`` for a model built at another ``img_size`` (in place)."""
    if "pos_embed" in checkpoint_model:
        # interpolate position embedding
        pos_embed_checkpoint = checkpoint_model['pos_embed']
        embedding_size = pos_embed_checkpoint.shape[-1]
        num_patches = model.patch_embed.num_patches
        num_extra_tokens = model.pos_embed.shape[-2] - num_patches
        # height (== width) for the checkpoint position embedding
        orig_size = int((pos_embed_checkpoint.shape[-2] - num_extra_tokens) ** 0.5)
        # height (== width) for the new position embedding
        new_size = int(num_patches ** 0.5)
        # class_token and dist_token are kept unchanged
        extra_tokens = pos_embed_checkpoint[:, :num_extra_tokens]
        # only the position tokens are interpolated
        pos_tokens = pos_embed_checkpoint[:, num_extra_tokens:]
        pos_tokens = pos_tokens.reshape(-1, orig_size, orig_size, embedding_size).permute(0, 3, 1, 2)
        pos_tokens = torch.nn.functional.interpolate(
            pos_tokens, size=(new_size, new_size), mode='bicubic', align_corners=False)
        pos_tokens = pos_tokens.permute(0, 2, 3, 1).flatten(1, 2)
        new_pos_embed = torch.cat((extra_tokens, pos_tokens), dim=1)
        checkpoint_model['pos_embed'] = new_pos_embed
    return checkpoint_model
