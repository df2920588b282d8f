"""The figures of ``vitlab analyze`` (:func:`vitlab.analysis.analyze_model`): cross-layer similarity heatmaps,
similar blocks per layer, residual ratios, attention maps and rollout over the images, position-embedding
similarity and the register tokens' share of attention.

Every function takes plain numbers (tensors or arrays), draws one figure in the shared style of
:mod:`vitlab.plots.figure` and writes a PNG atomically; the numbers behind each figure are written to CSV by the
caller.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from matplotlib import colormaps
from matplotlib.ticker import MaxNLocator
from torch import Tensor

from vitlab.plots.figure import COLORS, HEAT, SIM, new_figure, save


def _np(x: Tensor | np.ndarray) -> np.ndarray:
    return x.detach().float().cpu().numpy() if isinstance(x, Tensor) else np.asarray(x, dtype=np.float32)


def similarity_heatmaps(panels: Sequence[tuple[str, Tensor, Sequence[int]]], path: str | Path) -> Path:
    """One layer x layer heatmap per ``(title, sim (L, L), layer labels)``; colour scale up to 1."""
    lo = min(0.0, *(float(s.min()) for _, s, _ in panels))
    fig = new_figure(4.2 * len(panels) + 0.6, 4.0)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (title, sim, labels) in zip(axes, panels):
        im = ax.imshow(_np(sim), cmap=SIM, vmin=lo, vmax=1.0, interpolation="nearest")
        ticks = _ticks(len(labels))
        ax.set_xticks(ticks, [str(labels[i]) for i in ticks])
        ax.set_yticks(ticks, [str(labels[i]) for i in ticks])
        ax.set_xlabel("layer q")
        ax.set_ylabel("layer p")
        ax.set_title(title)
    fig.colorbar(im, ax=list(axes), shrink=0.85, label="cosine similarity")
    return save(fig, path)


def _ticks(n: int, most: int = 16) -> list[int]:
    step = max(1, -(-n // most))
    return list(range(0, n, step))


def similar_blocks_plot(panels: Sequence[tuple[str, Sequence[int], Tensor, Tensor, float]],
                        path: str | Path) -> Path:
    """Per ``(title, layer labels, similar-block counts, similarity to previous layer, threshold)``: the
    count as bars (left axis) and the adjacent-layer similarity as a line (right axis), as in DeepViT."""
    fig = new_figure(5.0 * len(panels), 3.4)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (title, labels, counts, prev, threshold) in zip(axes, panels):
        x = np.arange(len(labels))
        ax.bar(x, _np(counts), color=COLORS["count"], alpha=0.7, label=f"similar blocks (> {threshold:g})")
        ax.set_ylim(0, max(1, len(labels) - 1))
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("number of similar blocks", color=COLORS["count"])
        ax.set_xlabel("layer")
        ticks = _ticks(len(labels))
        ax.set_xticks(ticks, [str(labels[i]) for i in ticks])
        twin = ax.twinx()
        twin.plot(x, _np(prev), "o-", color=COLORS["sim"], ms=3, label="similarity to previous layer")
        twin.set_ylim(min(0.0, float(np.nanmin(_np(prev))) if len(labels) > 1 else 0.0), 1.02)
        twin.set_ylabel("similarity to previous layer")
        ax.set_title(title)
        handles = ax.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
        ax.legend(handles=handles, loc="upper left", fontsize=7)
    return save(fig, path)


def residual_plot(blocks: Sequence[int], attn: Sequence[float], mlp: Sequence[float], path: str | Path, *,
                  attn_std: Sequence[float] | None = None, mlp_std: Sequence[float] | None = None,
                  boundary: int | None = None, title: str = "") -> Path:
    """``||branch|| / ||x||`` per block for both branches; log scale when every value is positive.
    ``boundary``: the first class-attention block (CaiT), marked by a dashed line."""
    fig = new_figure(6.0, 3.6)
    ax = fig.add_subplot()
    x = np.asarray(blocks)
    for key, y, err in (("attn", attn, attn_std), ("mlp", mlp, mlp_std)):
        y = np.asarray(y, dtype=float)
        ax.plot(x, y, "o-", ms=3, color=COLORS[key], label=f"{key} branch")
        if err is not None:
            e = np.asarray(err, dtype=float)
            lo = np.maximum(y - e, y * 0.5) if np.all(y > 0) else y - e
            ax.fill_between(x, lo, y + e, color=COLORS[key], alpha=0.15, linewidth=0)
    values = np.asarray([*attn, *mlp], dtype=float)
    if len(values) and np.all(values > 0):
        ax.set_yscale("log")
    if boundary is not None:
        ax.axvline(boundary - 0.5, color="#888888", ls="--", lw=1)
        ax.text(boundary - 0.4, 0.98, "class attention", transform=ax.get_xaxis_transform(), va="top",
                fontsize=7, color="#666666")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("block")
    ax.set_ylabel(r"$\|g(x)\|_2 / \|x\|_2$")
    ax.set_title(title or "residual ratio per block")
    ax.legend(fontsize=8)
    return save(fig, path)


def display_images(images: Tensor) -> np.ndarray:
    """``(B, C, H, W)`` (uint8, or float of any range) -> ``(B, H, W, 3)`` floats in [0, 1] for display;
    float images are min-max scaled per image."""
    x = images.detach().float().cpu()
    if images.dtype == torch.uint8:
        x = x / 255.0
    else:
        lo = x.flatten(1).min(dim=1).values.view(-1, 1, 1, 1)
        hi = x.flatten(1).max(dim=1).values.view(-1, 1, 1, 1)
        x = (x - lo) / (hi - lo).clamp_min(1e-12)
    if x.shape[1] == 1:
        x = x.expand(-1, 3, -1, -1)
    return x[:, :3].permute(0, 2, 3, 1).clamp(0, 1).numpy()


def blend(image: np.ndarray, heat: Tensor, alpha: float = 0.55) -> np.ndarray:
    """``(H, W, 3)`` image and a ``(g, g)`` heat map (min-max scaled, nearest upsampled) blended in
    the heat colour map."""
    h = heat.detach().float().cpu()
    h = (h - h.min()) / (h.max() - h.min()).clamp_min(1e-12)
    h = F.interpolate(h[None, None], size=image.shape[:2], mode="nearest")[0, 0].numpy()
    rgb = colormaps[HEAT](h)[..., :3]
    return (1 - alpha) * image + alpha * rgb


def overlay_grid(images: np.ndarray, heats: Tensor, column_titles: Sequence[str], path: str | Path, *,
                 row_titles: Sequence[str] | None = None, title: str = "") -> Path:
    """Rows: images; columns: the input, then one overlay per heat map, drawn as one mosaic (fast for
    many heads).

    ``images`` ``(B, H, W, 3)`` in [0, 1] (see :func:`display_images`); ``heats`` ``(B, K, g, g)``; each map
    is min-max scaled on its own (the CSV keeps the raw values); ``title`` is wrapped to the figure's width.
    """
    B, K = heats.shape[:2]
    h, w = images.shape[1:3]
    gap = max(1, h // 14)
    out = np.ones((B * (h + gap) - gap, (K + 1) * (w + gap) - gap, 3), dtype=np.float32)  # white gaps
    for b in range(B):
        y = b * (h + gap)
        out[y:y + h, :w] = images[b]
        for k in range(K):
            x = (k + 1) * (w + gap)
            out[y:y + h, x:x + w] = blend(images[b], heats[b, k])
    cell = 1.0 if K + 1 <= 10 else 0.75
    width = max(4.0, cell * (K + 1) + 0.8)
    lines = [w for line in title.split("\n") for w in textwrap.wrap(line, width=int(width * 12))]
    fig = new_figure(width, cell * B + 0.6 + 0.15 * max(0, len(lines) - 1))
    ax = fig.add_subplot()
    ax.imshow(out, interpolation="nearest")
    ax.set_xticks([k * (w + gap) + (w - 1) / 2 for k in range(K + 1)], ["input", *column_titles], fontsize=7)
    ax.xaxis.tick_top()
    ax.set_yticks([b * (h + gap) + (h - 1) / 2 for b in range(B)],
                  list(row_titles) if row_titles is not None else [str(b) for b in range(B)], fontsize=7)
    ax.tick_params(length=0)
    for s in ax.spines.values():
        s.set_visible(False)
    if lines:
        ax.set_title("\n".join(lines), fontsize=9)
    return save(fig, path)


def mosaic(grid: Tensor, gap: float = float("nan")) -> np.ndarray:
    """``(g, g, g, g)`` -> one ``(g*(g+1)-1)^2`` image of ``g x g`` tiles separated by ``gap``."""
    g = grid.shape[0]
    tile = g + 1
    out = np.full((g * tile - 1, g * tile - 1), gap, dtype=np.float32)
    arr = _np(grid)
    for r in range(g):
        for c in range(g):
            out[r * tile:r * tile + g, c * tile:c * tile + g] = arr[r, c]
    return out


def pos_embed_figure(grid: Tensor, path: str | Path, *, title: str = "") -> Path:
    """The ViT paper's Fig. 7: tile ``(r, c)`` is the cosine similarity of patch ``(r, c)``'s position
    embedding with every patch (``grid`` from :func:`vitlab.analysis.pos_embed.similarity_grid`). The colour
    scale runs from the smallest similarity (or -1 when it is lower) to 1."""
    g = grid.shape[0]
    side = min(8.0, max(3.5, 0.45 * g + 1.5))
    fig = new_figure(side + 0.9, side)
    ax = fig.add_subplot()
    cmap = colormaps[SIM].with_extremes(bad="white")
    im = ax.imshow(mosaic(grid), cmap=cmap, vmin=max(-1.0, min(float(grid.min()), 0.99)),
                   vmax=1.0, interpolation="nearest")
    centers = [r * (g + 1) + (g - 1) / 2 for r in range(g)]
    ticks = _ticks(g)
    ax.set_xticks([centers[i] for i in ticks], [str(i + 1) for i in ticks])
    ax.set_yticks([centers[i] for i in ticks], [str(i + 1) for i in ticks])
    ax.set_xlabel("input patch column")
    ax.set_ylabel("input patch row")
    ax.set_title(title or "position embedding similarity")
    fig.colorbar(im, ax=ax, shrink=0.8, label="cosine similarity")
    for s in ax.spines.values():
        s.set_visible(False)
    return save(fig, path)


def register_figure(images: np.ndarray, heats: Tensor, patch_share: Tensor, reg_share: Tensor, reg_names: Sequence[str],
                    layer_share: Sequence[float], layer_names: Sequence[str], path: str | Path, *,
                    row_titles: Sequence[str] | None = None, title: str = "") -> Path:
    """The registers' attention beside the patch map: per shown image, the overlay of ``heats`` ``(B, g, g)`` and
    a bar of the row's share on the patches ``(B,)`` and on each register ``reg_share`` ``(B, R)``; below, the
    registers' total share per layer ``layer_share`` (mean over images and heads)."""
    B, R = reg_share.shape
    fig = new_figure(6.0, 1.1 * B + 2.0)
    grid = fig.add_gridspec(B + 1, 2, width_ratios=[1, 2.2], height_ratios=[1.0] * B + [1.6])
    names = ["patches", *reg_names]
    for b in range(B):
        ax = fig.add_subplot(grid[b, 0])
        ax.imshow(blend(images[b], heats[b]), interpolation="nearest")
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_ylabel(row_titles[b] if row_titles is not None else str(b), fontsize=7)
        bars = fig.add_subplot(grid[b, 1])
        values = [float(patch_share[b]), *(float(v) for v in reg_share[b])]
        bars.barh(range(R + 1), values, color=["#1f77b4"] + ["#2ca02c"] * R)
        bars.set_yticks(range(R + 1), names, fontsize=6)
        bars.invert_yaxis()
        bars.set_xlim(0, 1)
        bars.tick_params(labelsize=6)
        if b == B - 1:
            bars.set_xlabel("share of the row", fontsize=7)
    ax = fig.add_subplot(grid[B, :])
    ax.plot(range(len(layer_share)), list(layer_share), marker="o", color="#2ca02c")
    ax.set_xticks(range(len(layer_names)), [str(i) for i in range(len(layer_names))], fontsize=6)
    ax.set_xlabel("attention layer", fontsize=7)
    ax.set_ylabel("registers' share", fontsize=7)
    ax.set_ylim(0, 1.2 * max(layer_share, default=0.0) + 1e-6)
    ax.tick_params(labelsize=6)
    if title:
        fig.suptitle("\n".join(textwrap.wrap(title, width=80)), fontsize=8)
    return save(fig, path)
