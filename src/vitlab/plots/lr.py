"""The figures of a learning-rate sensitivity study (:mod:`vitlab.experiments.lr_sensitivity`): final validation
loss against learning rate per variant (a line per depth), LR sensitivity, best loss and divergence rate against
depth, and the largest attention logit against learning rate."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from vitlab.plots.axes import depth_axis


def _grid(n: int) -> tuple[int, int]:
    cols = min(4, max(n, 1))
    return -(-max(n, 1) // cols), cols


def _per_variant(rows: list[dict[str, Any]], value: str, variants: list[str], path: str | Path, ylabel: str,
                 title: str, hline: float | None = None, log_y: bool = False) -> Path:
    """A panel per variant, a line per depth: ``value`` (mean over seeds) against the learning rate; a diverged
    group is drawn as an x at the top of its panel."""
    from vitlab.plots.figure import new_figure, save

    nrows, cols = _grid(len(variants))
    fig = new_figure(4.2 * cols, 3.4 * nrows)
    axes = fig.subplots(nrows, cols, squeeze=False, sharex=True).ravel()  # one rate axis for every variant
    for ax in axes[len(variants):]:
        ax.set_axis_off()
    depths = sorted({r["depth"] for r in rows})
    colours = {d: f"C{i % 10}" for i, d in enumerate(depths)}
    for ax, variant in zip(axes, variants):
        for d in depths:
            pts = sorted((r["lr"], r[value]) for r in rows if r["variant"] == variant and r["depth"] == d)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", color=colours[d], label=f"depth {d}")
            div = [r["lr"] for r in rows if r["variant"] == variant and r["depth"] == d and r.get("diverged")]
            if div:
                ax.plot(div, [hline if hline is not None else 0.0] * len(div), "x", color=colours[d], markersize=9)
        if hline is not None:
            ax.axhline(hline, color="grey", linestyle="--", linewidth=1)
            ax.set_ylim(0, 1.08 * hline)  # losses on one scale, from 0 to just above a uniform guess's
        ax.set_xscale("log")
        if log_y:
            ax.set_yscale("log")
        ax.set_title(variant)
        ax.set_xlabel("peak learning rate")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(title)
    return save(fig, path)


def plot_loss_vs_lr(per_lr: list[dict[str, Any]], variants: list[str], uniform_loss: float,
                    path: str | Path) -> Path:
    """Final validation loss (diverged runs at the uniform guess's loss, marked x) against the learning rate."""
    return _per_variant(per_lr, "capped_loss_mean", variants, path, "final validation loss",
                        "final validation loss against learning rate (mean over seeds; x: a run diverged)",
                        hline=uniform_loss)


def plot_logits(per_lr: list[dict[str, Any]], variants: list[str], path: str | Path) -> Path:
    """The largest attention logit of any layer after training against the learning rate."""
    rows = [r for r in per_lr if isinstance(r.get("max_logit_mean"), float) and math.isfinite(r["max_logit_mean"])]
    return _per_variant(rows, "max_logit_mean", variants, path, "max attention logit",
                        "largest pre-softmax attention logit, any layer (mean over seeds)", log_y=True)


def plot_sensitivity(sens: list[dict[str, Any]], variants: list[str], path: str | Path) -> Path:
    """LR sensitivity, best validation loss and divergence rate against depth, a line per variant."""
    from vitlab.plots.figure import new_figure, save

    panels = [("lr_sensitivity", "LR sensitivity (nats; read with the best loss)"),
              ("best_val_loss", "best final validation loss"), ("divergence_rate", "share of runs that diverged")]
    fig = new_figure(5.0 * len(panels), 3.9)
    axes = fig.subplots(1, len(panels), squeeze=False).ravel()
    depths = sorted({r["depth"] for r in sens})
    for ax, (value, ylabel) in zip(axes, panels):
        for i, v in enumerate(variants):
            pts = sorted((r["depth"], r[value]) for r in sens if r["variant"] == v)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", color=f"C{i % 10}", label=v)
        depth_axis(ax, depths)
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("learning-rate sensitivity against depth (Wortsman et al. 2023)")
    return save(fig, path)


def plot_logit_growth(logits: list[dict[str, Any]], variants: list[str], depth: int, path: str | Path) -> Path:
    """At ``depth``: the largest attention logit of any layer after each epoch, a panel per variant, a line per
    learning rate (mean over seeds): how the logits grow over training at each rate (Wortsman et al. 2023)."""
    from vitlab.plots.figure import new_figure, save

    per_run: dict[tuple, float] = {}
    for r in logits:
        value = r["max_logit"]
        if r["depth"] != depth or not (isinstance(value, float) and math.isfinite(value)):
            continue
        key = (r["variant"], r["lr"], r["seed"], r["epoch"])
        per_run[key] = max(per_run.get(key, -math.inf), value)
    nrows, cols = _grid(len(variants))
    fig = new_figure(4.2 * cols, 3.4 * nrows)
    axes = fig.subplots(nrows, cols, squeeze=False, sharex=True).ravel()
    for ax in axes[len(variants):]:
        ax.set_axis_off()
    lrs = sorted({k[1] for k in per_run})
    for ax, variant in zip(axes, variants):
        for i, lr in enumerate(lrs):
            epochs = sorted({k[3] for k in per_run if k[0] == variant and k[1] == lr})
            means = []
            for e in epochs:
                vals = [v for k, v in per_run.items() if k[0] == variant and k[1] == lr and k[3] == e]
                means.append(sum(vals) / len(vals))
            if epochs:
                ax.plot(epochs, means, marker="o", color=f"C{i % 10}", label=f"lr {lr:g}")
        ax.set_yscale("log")
        ax.set_title(variant)
        ax.set_xlabel("epoch")
        ax.set_ylabel("max attention logit, any layer")
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"attention logit growth over training at depth {depth} (mean over seeds)")
    return save(fig, path)
