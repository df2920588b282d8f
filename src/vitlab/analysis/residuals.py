"""Residual ratios (CaiT, Touvron et al. 2021): ``||gate(branch(x))||_2 / ||x||_2`` per block and branch.

LayerScale makes this ratio more uniform across depth; a zero gate (ReZero / SkipInit at init) makes it 0.
The norms run over all tokens and channels of one image, so each block gives one ratio per image and
branch; :func:`residual_ratios` averages them over a batch.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from vitlab.errors import ConfigError
from vitlab.layers.block import ResidualGates
from vitlab.layers.class_attention import ClassAttentionBlock
from vitlab.models.eval_mode import analysis_mode


@dataclass
class BlockRatio:
    """Mean and standard deviation over images of one block's two residual ratios."""

    index: int
    name: str
    kind: str  # self_attention | class_attention
    attn_mean: float
    attn_std: float
    mlp_mean: float
    mlp_std: float

    def row(self) -> dict:
        return {"block": self.index, "name": self.name, "kind": self.kind, "attn_mean": self.attn_mean,
                "attn_std": self.attn_std, "mlp_mean": self.mlp_mean, "mlp_std": self.mlp_std}


def gated_blocks(model: nn.Module) -> list[tuple[str, str]]:
    """``(name, kind)`` of every block with gated residual branches, in forward order (CaiT: SA then CA)."""
    return [(n, "class_attention" if isinstance(m, ClassAttentionBlock) else "self_attention")
            for n, m in model.named_modules() if isinstance(m, ResidualGates)]


def stack_ratios(ratios: list[dict[str, Tensor]]) -> dict[str, Tensor]:
    """``model.residual_ratios(x)`` -> ``{"attn": (L, B), "mlp": (L, B)}``."""
    if not ratios:
        raise ConfigError("the model recorded no residual ratios; it needs blocks with residual branches "
                          "(vitlab Block / ClassAttentionBlock)")
    return {k: torch.stack([r[k].detach().float().cpu() for r in ratios]) for k in ("attn", "mlp")}


@torch.no_grad()
def residual_ratios(model: nn.Module, images: Tensor, batch_size: int = 64) -> list[BlockRatio]:
    """Mean and std over ``images`` (normalised ``(B, C, H, W)``) of each block's residual ratios.

    The model runs in eval mode (its own mode put back afterwards), on its own device, ``batch_size`` images
    at a time.
    """
    if images.dim() != 4 or len(images) == 0:
        raise ConfigError(f"images must be a non-empty (B, C, H, W) batch, got shape {tuple(images.shape)}")
    device = next(model.parameters()).device
    with analysis_mode(model):
        parts = [stack_ratios(model.residual_ratios(chunk.to(device))) for chunk in images.split(batch_size)]
    return summarize_ratios(model, parts)


def summarize_ratios(model: nn.Module, parts: list[dict[str, Tensor]]) -> list[BlockRatio]:
    """Mean and std over images of :func:`stack_ratios` outputs of several batches."""
    attn = torch.cat([p["attn"] for p in parts], dim=1)  # (L, N)
    mlp = torch.cat([p["mlp"] for p in parts], dim=1)
    names = gated_blocks(model)
    if len(names) != attn.shape[0]:  # a model that runs blocks in another order or number: number them
        warnings.warn(f"the model recorded {attn.shape[0]} residual ratios per image but has {len(names)} gated "
                      f"blocks (it runs blocks in another order or number), so the rows are numbered 'block i', "
                      f"not named after the blocks", UserWarning, stacklevel=2)
        names = [(f"block {i}", "self_attention") for i in range(attn.shape[0])]
    std = (lambda t: t.std(dim=1)) if attn.shape[1] > 1 else (lambda t: torch.zeros(t.shape[0]))
    a_mean, a_std, m_mean, m_std = attn.mean(dim=1), std(attn), mlp.mean(dim=1), std(mlp)
    return [BlockRatio(i, n, k, float(a_mean[i]), float(a_std[i]), float(m_mean[i]), float(m_std[i]))
            for i, (n, k) in enumerate(names)]
