"""The block layouts a ViT can be built with (``ModelConfig.block``) and their whole-model initialisation.

- ``prenorm`` (default): :class:`~vitlab.layers.block.Block`, ``x + f(LN(x))`` (timm's ``Block``);
- ``postnorm``: :class:`~vitlab.layers.postnorm.PostNormBlock`, ``LN(x + f(x))`` (Vaswani et al. 2017);
- ``deepnorm``: :class:`~vitlab.layers.postnorm.DeepNormBlock`, ``LN(alpha x + f(x))`` (Wang et al. 2022);
- ``parallel``: :class:`~vitlab.layers.parallel_block.ParallelBlock`, ``x + attn(LN(x)) + mlp(LN(x))``
  (ViT-22B, Dehghani et al. 2023; timm's ``ParallelScalingBlock``).

Orthogonal to the layout: NormFormer's extra norms (``scale_attn_norm`` / ``scale_mlp_norm``, Shleifer et al.
2021), sigma-Reparam (``sigma_reparam``, Zhai et al. 2023, :mod:`vitlab.layers.sigma_reparam`) and the
depth-muP gate (``gate='depth_mup'``, :mod:`vitlab.layers.depth_scale`).
"""

from __future__ import annotations

from torch import nn

from vitlab.errors import ConfigError
from vitlab.layers.block import Block
from vitlab.layers.parallel_block import ParallelBlock
from vitlab.layers.postnorm import DeepNormBlock, PostNormBlock
from vitlab.layers.sigma_reparam import SigmaReparamLinear

BLOCKS = ("prenorm", "postnorm", "deepnorm", "parallel")


def block_layer(kind: str) -> type[Block]:
    """The block class of layout ``kind`` (one of :data:`BLOCKS`)."""
    layers = {"prenorm": Block, "postnorm": PostNormBlock, "deepnorm": DeepNormBlock, "parallel": ParallelBlock}
    if kind not in layers:
        raise ConfigError(f"unknown block {kind!r}; choose one of {', '.join(BLOCKS)}")
    return layers[kind]


def init_block_variants(model: nn.Module) -> None:
    """After the model's weight init: DeepNorm's initialisation of its blocks, then sigma-Reparam's ``u``, ``v``
    and ``gamma`` from the weights as drawn (so the reparameterised weights equal them)."""
    for m in model.modules():
        if isinstance(m, DeepNormBlock):
            m.reset_parameters()
    for m in model.modules():
        if isinstance(m, SigmaReparamLinear):
            m.reset_sigma()
