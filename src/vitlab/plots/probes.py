"""Figures of the per-layer probes (:mod:`vitlab.analysis.probes`): the probes against the layer, and the
high-norm artifact tokens drawn on the images."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch.nn.functional as F
from matplotlib import colormaps

from vitlab.analysis.probes import Probes
from vitlab.plots.figure import new_figure, save

PANELS = (("token_similarity", "token similarity (mean pairwise cosine)"),
          ("effective_rank_uncentred", "effective rank: uncentred (solid), centred (dashed)"),
          ("rank_residual", "residual to rank one ||X - 1x^T|| / ||X||"),
          ("artifact_count", "high-norm artifact tokens per image"),
          ("attn_entropy", "attention entropy, mean over heads (nats)"),
          ("max_logit", "max pre-softmax attention logit"))


def probes_figure(p: Probes, path: str | Path, *, title: str = "") -> Path:
    """Six panels against the block index: similarity, effective rank (uncentred and centred), rank residual,
    artifact count (with the attention mass they receive; no points where not measurable), attention entropy (mean
    and each head) and the max logit."""
    rows = p.rows()
    x = np.asarray(p.layers)
    fig = new_figure(11.0, 6.2)
    axes = fig.subplots(2, 3).flatten()
    for ax, (name, label) in zip(axes, PANELS):
        y = np.asarray([r[name] for r in rows], dtype=float)
        ax.plot(x, y, "o-", ms=3, color="#1f77b4")
        if name == "effective_rank_uncentred":
            ax.plot(x, np.asarray([r["effective_rank_centred"] for r in rows], dtype=float), "o--", ms=3,
                    color="#1f77b4", alpha=0.6)
        if name == "attn_entropy" and p.attn_entropy and p.attn_entropy[0]:
            heads = np.asarray([e or [math.nan] for e in p.attn_entropy], dtype=float)
            for h in range(heads.shape[1]):
                ax.plot(x, heads[:, h], "-", lw=0.7, color="#999999", alpha=0.7)
        if name == "artifact_count":
            twin = ax.twinx()
            for key, colour, what in (("artifact_mass_all", "#d62728", "all queries"),
                                      ("artifact_mass_cls", "#ff7f0e", "class token"),
                                      ("register_mass_all", "#2ca02c", "to the registers, all queries")):
                m = np.asarray([r[key] for r in rows], dtype=float)
                if np.isfinite(m).any():
                    label = f"attention {what}" if what.startswith("to") else f"attention to them ({what})"
                    twin.plot(x, m, "s--", ms=2, color=colour, lw=1, label=label)
            ax.set_ylim(bottom=0)
            twin.set_ylim(0, 1)
            twin.set_ylabel("attention mass", fontsize=8)
            if twin.get_legend_handles_labels()[0]:
                twin.legend(fontsize=6, loc="upper left")
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("block")
    if title:
        fig.suptitle(title, fontsize=10)
    return save(fig, path)


def artifact_figure(images: np.ndarray, p: Probes, path: str | Path, grid_size: int, *,
                    layers: Sequence[int] | None = None, row_titles: Sequence[str] | None = None,
                    title: str = "") -> Path:
    """Rows: images; columns: the input, then the patch-token norms of chosen blocks drawn over it (one colour
    scale per image and block) with the high-norm outliers outlined in cyan.

    ``images`` ``(S, H, W, 3)`` in [0, 1]; ``p.token_norms`` / ``p.outliers`` ``(L, B, N)`` with ``B >= S``;
    ``layers`` defaults to up to five blocks spread over the depth, the last included."""
    L = len(p.layers)
    if layers is None:
        layers = sorted({round(i * (L - 1) / 4) for i in range(5)}) if L > 1 else [0]
    S, h, w = images.shape[:3]
    K = len(layers)
    fig = new_figure(max(4.0, 1.3 * (K + 1) + 0.6), 1.3 * S + 0.7)
    axes = fig.subplots(S, K + 1, squeeze=False)
    for s in range(S):
        axes[s, 0].imshow(images[s], interpolation="nearest")
        axes[s, 0].set_ylabel(row_titles[s] if row_titles is not None else str(s), fontsize=7)
        for j, layer in enumerate(layers):
            ax = axes[s, j + 1]
            norms = p.token_norms[layer, s].float()
            g = norms.reshape(1, 1, grid_size, grid_size)
            lo, hi = float(norms.min()), float(norms.max())
            heat = F.interpolate((g - lo) / max(hi - lo, 1e-12), size=(h, w), mode="nearest")[0, 0].numpy()
            ax.imshow(0.45 * images[s] + 0.55 * colormaps["magma"](heat)[..., :3], interpolation="nearest")
            mask = p.outliers[layer, s].reshape(grid_size, grid_size)
            ph, pw = h / grid_size, w / grid_size
            for r, c in mask.nonzero().tolist():
                ax.add_patch(_rect((c * pw - 0.5, r * ph - 0.5), pw, ph))
            if s == 0:
                ax.set_title(f"block {p.layers[layer]}", fontsize=8)
            ax.set_xlabel(f"{int(mask.sum())} out / max {hi:.3g}", fontsize=6)
    for ax in axes.flatten():
        ax.set_xticks([])
        ax.set_yticks([])
    axes[0, 0].set_title("input", fontsize=8)
    cut = f"> {p.ratio:g} x 90th percentile and > {p.k:g} robust sd of log norm, pooled"
    fig.suptitle(title or f"patch-token norms; artifacts ({cut}) outlined", fontsize=9)
    return save(fig, path)


def _rect(xy: tuple[float, float], w: float, h: float):  # noqa: ANN202 - a matplotlib Rectangle
    from matplotlib.patches import Rectangle

    return Rectangle(xy, w, h, fill=False, edgecolor="cyan", linewidth=1.2)
