"""The figures of a depth study (:mod:`vitlab.experiments.depth_study`): values against depth per variant (mean +-
std over seeds; test accuracy as the median with every seed drawn), residual ratios per block, similar blocks per
layer, the cross-layer similarity heatmaps and the probes against depth and per epoch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vitlab.plots.axes import depth_axis


def curves(agg: list[dict[str, Any]], value: str, variants: list[str]) -> dict[str, tuple[list, list, list]]:
    """``{variant: (depths, means, stds)}`` of ``value`` in depth order: the lines of a figure against depth."""
    out = {}
    for v in variants:
        pts = sorted((a["depth"], a[f"{value}_mean"], a[f"{value}_std"]) for a in agg if a["variant"] == v)
        if pts:
            out[v] = ([p[0] for p in pts], [p[1] for p in pts], [p[2] for p in pts])
    return out


def seed_values(runs: list[dict[str, Any]], value: str, variant: str, depths: list[int]) -> list[list[float]]:
    """Per depth in ``depths``, the finite ``value`` of every run (seed) of ``variant`` at that depth."""
    out = []
    for d in depths:
        xs = [float(r[value]) for r in runs if r["variant"] == variant and int(r["depth"]) == int(d)]
        out.append([x for x in xs if x == x])
    return out


def plot_against_depth(agg: list[dict[str, Any]], variants: list[str], panels: list[tuple[str, str, float]],
                       path: str | Path, title: str, subsets: list[list[dict[str, Any]]] | None = None,
                       runs: list[dict[str, Any]] | None = None, planned: int | None = None) -> Path:
    """One panel per ``(value, ylabel, scale)``: a line per variant against depth (panel ``i`` draws the rows
    ``subsets[i]`` when given, else all of ``agg``); a variant keeps its colour across panels. The line is the mean
    +- std over seeds, or, given the per-run ``runs``, the median over seeds with every seed drawn as a dot beside
    it (a figure then shows the spread itself, and one lucky seed does not move the line).

    Given ``planned``, the number of seeds each point should have, a point with fewer finished runs (a study still
    running) is not a median over the planned seeds: the line leaves it out, and it is drawn as a hollow marker at
    the median of what finished, labelled ``k/planned``, beside its dots."""
    import statistics

    from vitlab.plots.figure import new_figure, save

    cols = min(3, len(panels))  # more than three panels wrap onto further rows
    nrows = -(-len(panels) // cols)
    fig = new_figure(5.0 * cols, 3.9 * nrows)
    axes = fig.subplots(nrows, cols, squeeze=False).ravel()
    for ax in axes[len(panels):]:
        ax.set_axis_off()
    depths = sorted({a["depth"] for a in agg})
    colours = {v: f"C{i % 10}" for i, v in enumerate(variants)}
    partial = False
    for i, (ax, (value, ylabel, scale)) in enumerate(zip(axes, panels)):
        rows = subsets[i] if subsets is not None else agg
        for j, (variant, (x, m, s)) in enumerate(curves(rows, value, variants).items()):
            if runs is None:
                ax.errorbar(x, [scale * v for v in m], yerr=[scale * v for v in s], marker="o", capsize=3,
                            label=variant, color=colours[variant])
                continue
            seeds = seed_values(runs, value, variant, x)
            kept = [(d, xs) for d, xs in zip(x, seeds) if xs]
            full, short = [], []  # points with their planned seeds, and points still running
            for d, xs in kept:
                (short if planned is not None and len(xs) < planned else full).append((d, xs))
            ax.plot([d for d, _ in full], [scale * statistics.median(xs) for _, xs in full], marker="o",
                    label=variant, color=colours[variant])
            partial = partial or bool(short)
            for d, xs in short:
                y = scale * statistics.median(xs)
                ax.plot([d], [y], marker="o", linestyle="none", markerfacecolor="none", color=colours[variant])
                ax.annotate(f"{len(xs)}/{planned}", (d, y), textcoords="offset points", xytext=(0, 6), ha="center",
                            fontsize=7, color=colours[variant])
            shift = 2 ** (0.04 * (j - (len(variants) - 1) / 2))  # side by side on the log-2 axis, not on top
            for d, xs in kept:
                ax.scatter([d * shift] * len(xs), [scale * v for v in xs], s=12, alpha=0.45, color=colours[variant],
                           linewidths=0)
        depth_axis(ax, depths, "depth (self-attention blocks)")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=8)
    if partial:
        title += f"\nhollow: fewer than {planned} seeds finished (k/{planned})"
    fig.suptitle(title)
    return save(fig, path)


def plot_accuracy(agg: list[dict[str, Any]], variants: list[str], path: str | Path,
                  runs: list[dict[str, Any]] | None = None, planned: int | None = None) -> Path:
    """Test accuracy against depth per variant: the median over seeds with each seed a dot when the per-run
    ``runs`` are given, else mean +- std; when some points are under-trained or diverged (they sit tens of points
    below and flatten every other line), a second panel shows the trained points alone at their scale. With
    ``planned`` seeds per point, a point with fewer finished runs is drawn apart (see :func:`plot_against_depth`)."""
    title = ("test accuracy against depth (median; a dot per seed)" if runs is not None
             else "test accuracy against depth (mean +- std over seeds)")
    panels = [("test_acc", "test accuracy (%)", 100.0)]
    trained = [a for a in agg if not a.get("undertrained") and not a.get("diverged")]
    if not trained or len(trained) == len(agg):
        return plot_against_depth(agg, variants, panels, path, title, runs=runs, planned=planned)
    panels.append(("test_acc", "test accuracy (%), trained points only", 100.0))
    return plot_against_depth(agg, variants, panels, path, title, subsets=[agg, trained], runs=runs, planned=planned)


def plot_ratios(ratio_rows: list[dict[str, Any]], variants: list[str], depths: list[int], path: str | Path) -> Path:
    """Residual ratio per block (attention branch solid, MLP dashed), one panel per depth, mean over seeds."""
    import matplotlib as mpl
    from matplotlib.ticker import MaxNLocator

    from vitlab.plots.figure import new_figure, save

    fig = new_figure(4.6 * len(depths), 3.8)
    axes = fig.subplots(1, len(depths), squeeze=False)[0]
    colors = mpl.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, depth in zip(axes, depths):
        for i, variant in enumerate(variants):
            rows = [r for r in ratio_rows if r["variant"] == variant and r["depth"] == depth]
            blocks = sorted({r["block"] for r in rows})
            if not blocks:
                continue
            for branch, style in (("attn", "-"), ("mlp", "--")):
                y = [_mean([r[f"{branch}_mean"] for r in rows if r["block"] == b]) for b in blocks]
                ax.plot(blocks, [max(v, 1e-8) for v in y], style, color=colors[i % len(colors)],
                        label=variant if branch == "attn" else None)
        ax.set_yscale("log")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("block (CaiT: class-attention last)")
        ax.set_title(f"depth {depth}")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("||gate(branch(x))|| / ||x||")
    axes[0].legend(fontsize=8, title="solid: attn, dashed: MLP", title_fontsize=7)
    fig.suptitle("residual ratio per block after training (mean over test images and seeds)")
    return save(fig, path)


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def similar_block_lines(layer_rows: list[dict[str, Any]], depth: int,
                        variants: list[str]) -> dict[str, tuple[list[int], list[float]]]:
    """``{label: (layers, mean similar blocks)}`` at ``depth``: for each self-attention layer, how many other
    layers have a map above the threshold (DeepViT's "number of similar blocks"), averaged over seeds. One line
    per variant from its recorded maps, plus ``"<variant> pre-mix"`` for the softmax maps before a head
    mix (re-attention, talking heads)."""
    out: dict[str, tuple[list[int], list[float]]] = {}
    for variant in variants:
        for maps, label in (("recorded", variant), ("pre_mix", f"{variant} pre-mix")):
            rows = [r for r in layer_rows if r["variant"] == variant and r["depth"] == depth
                    and r["maps"] == maps and r["group"] == "self_attention"]
            layers = sorted({r["layer"] for r in rows})
            if layers:
                out[label] = (layers, [_mean([r["similar_blocks"] for r in rows if r["layer"] == x])
                                       for x in layers])
    return out


def plot_similar_blocks(layer_rows: list[dict[str, Any]], variants: list[str], depths: list[int], threshold: float,
                        path: str | Path) -> Path:
    """Number of similar blocks per self-attention layer, one panel per depth (softmax maps before a head mix
    dashed): the per-layer view of attention collapse."""
    import matplotlib as mpl
    from matplotlib.ticker import MaxNLocator

    from vitlab.plots.figure import new_figure, save

    fig = new_figure(4.6 * len(depths), 3.8)
    axes = fig.subplots(1, len(depths), squeeze=False)[0]
    colors = mpl.rcParams["axes.prop_cycle"].by_key()["color"]
    color = {v: colors[i % len(colors)] for i, v in enumerate(variants)}
    for ax, depth in zip(axes, depths):
        for label, (layers, counts) in similar_block_lines(layer_rows, depth, variants).items():
            variant = label.removesuffix(" pre-mix")
            ax.plot(layers, counts, "--" if label.endswith("pre-mix") else "-", marker=".", color=color[variant],
                    label=label)
        ax.set_ylim(-0.5, max(depth - 1, 1) + 0.5)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("self-attention layer")
        ax.set_title(f"depth {depth}")
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel(f"similar blocks (cosine > {threshold:g})")
    axes[0].legend(fontsize=8)
    fig.suptitle("similar blocks per layer, mean over seeds\n(dashed: softmax maps before a head mix)", fontsize=10)
    return save(fig, path)


def plot_similarity(diags: dict[str, dict[str, Any]], depth: int, path: str | Path) -> Path | None:
    """Cross-layer similarity of the self-attention maps, one heatmap per variant at ``depth`` (the seed in each
    diagnostics' ``seed``, 0 when absent; a panel names any other), plus one of the softmax maps before a head mix
    ("pre-mix": re-attention, talking heads), three panels per row. None, and nothing drawn, when no diagnostics
    hold a self-attention group (every run failed or was kept without its diagnostics)."""
    import math as m

    import numpy as np

    from vitlab.plots.figure import SIM, new_figure, save

    panels = []
    for variant, diag in diags.items():
        name = variant if not diag.get("seed") else f"{variant} seed {diag['seed']}"
        for key, label in (("collapse", name), ("collapse_pre_mix", f"{name} pre-mix")):
            sa = next((g for g in diag.get(key, []) if g["group"] == "self_attention"), None)
            if sa:  # one block has no pair to compare: its similarity is NaN (null once read back from JSON)
                mean = sa.get("mean_similarity")
                shown = f"{mean:.2f}" if isinstance(mean, int | float) and m.isfinite(mean) else "n/a"
                panels.append((f"{label} (mean {shown})", np.array(sa["similarity"], dtype=float)))
    if not panels:
        return None
    cols = min(3, len(panels))
    rows = m.ceil(len(panels) / cols)
    lo = min(0.0, *(float(p[1].min()) for p in panels))
    fig = new_figure(3.6 * cols + 0.8, 3.4 * rows + 0.5)
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax, (title, sim) in zip(axes, panels):
        im = ax.imshow(sim, cmap=SIM, vmin=lo, vmax=1.0, interpolation="nearest")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("layer q")
        ax.set_ylabel("layer p")
    for ax in axes[len(panels):]:
        ax.set_axis_off()
    fig.colorbar(im, ax=list(axes), shrink=0.8, label="cosine similarity")
    fig.suptitle(f"cross-layer attention similarity at depth {depth}")
    return save(fig, path)


PROBE_PANELS = (("probe_similarity_last", "token_similarity", "token similarity"),
                ("probe_erank_uncentred_last", "effective_rank_uncentred", "effective rank, uncentred"),
                ("probe_max_logit", "max_logit", "max attention logit"),
                ("probe_artifacts", "artifact_count", "artifact tokens per image"))


def _per_block(rows: list[dict[str, Any]], variant: str, depth: int, name: str,
               key: str = "layer") -> tuple[list[int], list[float]]:
    """Mean over seeds of ``name`` per ``key`` (block, or epoch) of ``variant`` at ``depth`` (NaN values skipped)."""
    by: dict[int, list[float]] = {}
    for r in rows:
        v = r.get(name)
        if r["variant"] == variant and r["depth"] == depth and isinstance(v, int | float) and v == v:
            by.setdefault(int(r[key]), []).append(float(v))
    xs = sorted(by)
    return xs, [_mean(by[x]) for x in xs]


def plot_probes(agg: list[dict[str, Any]], layer_rows: list[dict[str, Any]], variants: list[str], depth: int,
                path: str | Path) -> Path:
    """One page: top row, per variant against depth (mean +- std over seeds), the last block's token similarity and
    uncentred effective rank (rank collapse), the max logit over blocks and the artifact tokens summed over blocks;
    bottom row, the same probes per block at ``depth``."""
    from vitlab.plots.figure import new_figure, save

    fig = new_figure(18.0, 7.4)
    axes = fig.subplots(2, 4, squeeze=False)
    depths = sorted({a["depth"] for a in agg})
    colours = {v: f"C{i % 10}" for i, v in enumerate(variants)}
    for j, (value, per_layer, label) in enumerate(PROBE_PANELS):
        top, bottom = axes[0, j], axes[1, j]
        if any(f"{value}_mean" in a for a in agg):
            for variant, (x, m, s) in curves(agg, value, variants).items():
                top.errorbar(x, m, yerr=s, marker="o", capsize=3, label=variant, color=colours[variant])
        depth_axis(top, depths)
        what = {"probe_similarity_last": "last block", "probe_erank_uncentred_last": "last block",
                "probe_max_logit": "max over blocks", "probe_artifacts": "sum over blocks"}[value]
        top.set_title(f"{label} ({what})", fontsize=9)
        top.grid(True, alpha=0.3)
        for variant in variants:
            x, y = _per_block(layer_rows, variant, depth, per_layer)
            if x:
                bottom.plot(x, y, "o-", ms=2.5, label=variant, color=colours[variant])
        bottom.set_xlabel(f"block (depth {depth})")
        bottom.set_title(f"{label} per block", fontsize=9)
        bottom.grid(True, alpha=0.3)
    axes[0, 0].legend(fontsize=8)
    fig.suptitle("probes against depth per variant (mean over seeds)")
    return save(fig, path)


def plot_probe_epochs(epoch_rows: list[dict[str, Any]], variants: list[str], depth: int, path: str | Path) -> Path:
    """Per epoch at ``depth``, per variant (mean over seeds): the last block's token similarity and uncentred
    effective rank, the max logit over blocks and the artifact tokens summed over blocks, on the run's fixed probe
    images."""
    from vitlab.plots.figure import new_figure, save

    fig = new_figure(18.0, 3.8)
    axes = fig.subplots(1, 4, squeeze=False)[0]
    colours = {v: f"C{i % 10}" for i, v in enumerate(variants)}
    reduce = {"token_similarity": "last", "effective_rank_uncentred": "last", "max_logit": "max",
              "artifact_count": "sum"}
    for ax, (_, name, label) in zip(axes, PROBE_PANELS):
        for variant in variants:
            mine = [r for r in epoch_rows if r["variant"] == variant and r["depth"] == depth]
            if not mine:
                continue
            last = max(int(r["layer"]) for r in mine)
            per_epoch: dict[tuple[int, int], list[float]] = {}  # (seed, epoch) -> values over blocks
            for r in mine:
                v = r.get(name)
                if isinstance(v, int | float) and v == v and (reduce[name] != "last" or int(r["layer"]) == last):
                    per_epoch.setdefault((r["seed"], int(r["epoch"])), []).append(float(v))
            fold = {"last": lambda vs: vs[-1], "max": max, "sum": sum}[reduce[name]]
            by_epoch: dict[int, list[float]] = {}
            for (_, epoch), vs in per_epoch.items():
                by_epoch.setdefault(epoch, []).append(fold(vs))
            xs = sorted(by_epoch)
            ax.plot(xs, [_mean(by_epoch[e]) for e in xs], "o-", ms=2.5, label=variant, color=colours[variant])
        ax.set_xlabel("epoch")
        ax.set_title(f"{label} ({reduce[name]} over blocks), depth {depth}", fontsize=9)
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=8)
    return save(fig, path)
