"""The depth study: accuracy against depth for ViT, LayerScale, ReZero, SkipInit, Fixup, T-Fixup, CaiT and DeepViT at
one width,
with the diagnostics of ``vitlab analyze`` for every run (attention collapse, residual ratios per block).

This makes the CaiT claim (LayerScale and class-attention let deeper models train) and the DeepViT claim
(attention maps of deep ViTs become alike across layers, re-attention keeps them apart) testable on data
this machine holds. Every variant shares the base preset's width, heads, image and patch size and the recipe.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vitlab.errors import CheckpointError, ConfigError
from vitlab.experiments.common import (
    RunSpec,
    aggregate,
    diverged,
    mark_groups,
    summary_value,
    undertrained,
    undertrained_warning,
    unknown_option,
    warning_section,
)

SHARED = ("img_size", "patch_size", "in_chans", "embed_dim", "num_heads", "mlp_ratio", "pos_embed")
VARIANT_KEYS = ("depth", "gate", "attn", "init_values", "depth_token_only")  # what the variants differ by


def _vit(gate: str, layerscale_init: bool = False, **extra: Any) -> Callable[[str, int], tuple[str, dict]]:
    def build(base: str, depth: int) -> tuple[str, dict]:
        from vitlab.layers import cait_init_value

        overrides: dict[str, Any] = {"depth": depth, "gate": gate, **extra}
        if layerscale_init:
            overrides["init_values"] = cait_init_value(depth)
        return base, overrides

    return build


def _cait(base: str, depth: int) -> tuple[str, dict]:
    from vitlab.layers import cait_init_value
    from vitlab.models import get_config

    cfg = get_config(base)
    shared = {k: getattr(cfg, k) for k in SHARED}
    return "cait_xxs24", {**shared, "depth": depth, "depth_token_only": 2, "init_values": cait_init_value(depth)}


VARIANTS: dict[str, Callable[[str, int], tuple[str, dict]]] = {
    "vit": _vit("none"),
    "layerscale": _vit("layerscale", layerscale_init=True),
    "rezero": _vit("rezero"),
    "skipinit": _vit("skipinit"),
    "fixup": _vit("fixup"),
    "tfixup": _vit("tfixup"),
    "cait": _cait,
    "deepvit": _vit("none", attn="reattention"),
}
DESCRIPTIONS = {
    "vit": "plain pre-norm ViT (gate none)",
    "layerscale": "LayerScale on both branches, init from the CaiT depth rule (cait_init_value(depth))",
    "rezero": "ReZero: one scalar gate per branch, init 0, pre-norms removed",
    "skipinit": "SkipInit: one scalar gate per branch, init 0, pre-norms kept",
    "fixup": "Fixup: pre-norms removed, last layer of each branch (attn.proj, mlp.fc2) and the head at 0, qkv and "
             "fc1 scaled by (2 depth)^-1/2, a scalar multiplier and scalar biases per branch",
    "tfixup": "T-Fixup: pre-norms removed, no gate, Xavier init with v, proj, fc1, fc2 scaled by 0.67 depth^-1/4 "
              "and the input embedding by (9 depth)^-1/4; trained without warm-up (warmup_epochs=0)",
    "cait": "CaiT: talking-heads self-attention with LayerScale on the patches, then 2 class-attention blocks",
    "deepvit": "DeepViT: re-attention (a learnable heads x heads mix of the maps, then a norm) in every block",
}


# run options a variant sets itself: T-Fixup is meant to train without learning-rate warm-up (Huang et al. 2020)
VARIANT_RUN: dict[str, dict[str, Any]] = {"tfixup": {"warmup_epochs": 0.0}}


def parse_variants(text: str) -> list[str]:
    from vitlab.experiments.common import split_list

    out = []
    for v in split_list(text, "--variants"):
        if v not in VARIANTS:
            raise ConfigError(unknown_option(v, list(VARIANTS), "variant"))
        if v not in out:
            out.append(v)
    return out


def variant_model(variant: str, base: str, depth: int) -> tuple[str, dict[str, Any]]:
    """``(preset, overrides)`` of ``variant`` at ``depth`` on the width of preset ``base`` (:func:`depth_specs`
    validates each with the study's shared options)."""
    if variant not in VARIANTS:
        raise ConfigError(unknown_option(variant, list(VARIANTS), "variant"))
    return VARIANTS[variant](base, depth)


def depth_specs(base_model: str, depths: list[int], variants: list[str], seeds: list[int], cfg: Any,
                shared: dict[str, Any] | None = None) -> list[RunSpec]:
    """One run per variant, depth and seed, all with the recipe of ``cfg`` and the model options ``shared``
    (which must not touch what the variants set: depth, gate, attn, init_values...)."""
    from vitlab.models import get_config

    specs = []
    for variant in variants:
        for depth in depths:
            preset, overrides = variant_model(variant, base_model, depth)
            clash = sorted(set(shared or {}) & set(overrides) & set(VARIANT_KEYS))
            if clash:
                raise ConfigError(f"--set {', '.join(clash)} would change what the {variant} variant sets itself; "
                                  f"the variants differ by exactly these options, so set only others")
            overrides = {**overrides, **(shared or {})}
            get_config(preset, **overrides)
            run_options = VARIANT_RUN.get(variant, {})
            run_cfg = cfg.replace(model=preset, model_overrides=overrides, **run_options)
            for seed in seeds:
                info = {"variant": variant, "depth": depth, "seed": seed, "preset": preset,
                        "overrides": json.dumps(overrides, sort_keys=True),
                        "run_options": json.dumps(run_options, sort_keys=True)}
                specs.append(RunSpec(f"{variant}_depth{depth}_seed{seed}", run_cfg.replace(seed=seed), info))
    return specs


# what diagnostics.json holds; an older one is recomputed (or, without weights, kept). 2: pre-mix maps of talking
# heads too (1: re-attention's); 3: the entropy of the softmax maps per layer
DIAG_VERSION = 3


def diagnose(run_dir: Path, images: Any, labels: Any, classes: list[str], mean: tuple, std: tuple, *,
             threshold: float, batch_size: int = 32, full_report: bool = False) -> dict[str, Any]:
    """Attention collapse and residual ratios of the run's checkpoint on ``images`` (uint8 test images), saved
    as ``run_dir/diagnostics.json`` and read back when it exists with the same settings. ``full_report``
    also writes the whole ``vitlab analyze`` report (attention maps, rollout...) into ``run_dir/analysis``.

    ``collapse`` compares the maps multiplied with the values; for re-attention (DeepViT) and talking heads
    (CaiT) those are mixed over heads (re-attention's also normalised), not probability rows, so
    ``collapse_pre_mix`` also compares their softmax maps before that mix (empty for models without either)."""
    import torch

    from vitlab.analysis import SimilarityMeter, analyze_model, attention_entropy, residual_ratios, write_json
    from vitlab.analysis.analyze import model_inputs
    from vitlab.analysis.collapse import is_probability_rows
    from vitlab.checkpoint import load_model
    from vitlab.layers.attention import record_pre_mix

    path = run_dir / "diagnostics.json"
    old = None
    if path.is_file() and not (full_report and not (run_dir / "analysis" / "index.html").is_file()):
        diag = json.loads(path.read_text())
        if diag.get("threshold") == threshold and diag.get("num_images") == len(images):
            if diag.get("version") == DIAG_VERSION:
                return diag
            old = diag
    try:
        model = load_model(run_dir).eval()
    except CheckpointError:
        if old is None:
            raise
        # a run restored from its committed record has no weights: its older diagnostics stay, the measures
        # added since read NaN
        return old
    if full_report:
        cmd = ["vitlab", "analyze", "--checkpoint", str(run_dir), "--output", str(run_dir / "analysis"),
               "--num-images", str(len(images)), "--threshold", f"{threshold:g}"]
        analyze_model(model, images, run_dir / "analysis", labels=labels, classes=classes, mean=mean, std=std,
                      threshold=threshold, batch_size=batch_size, command=cmd, title=f"Analysis of {run_dir.name}")
    x = model_inputs(model, images, mean, std)
    meter, pre_meter = SimilarityMeter(threshold), SimilarityMeter(threshold)
    entropy, entropy_layers = None, []
    with torch.no_grad():
        for chunk in x.split(batch_size):
            with record_pre_mix(model.modules()) as pre_mix:
                maps = model.attention_maps(chunk)
            meter.update(maps)
            if pre_mix:
                pre_meter.update(list(pre_mix))
            # the softmax maps: before the head mix where the model mixes after the softmax
            softmax = list(pre_mix) or maps
            layers = [i for i, m in enumerate(softmax) if m.shape[-2] == m.shape[-1] and is_probability_rows(m)]
            if layers:
                e = attention_entropy([softmax[i] for i in layers]) * chunk.shape[0]
                entropy, entropy_layers = (e if entropy is None else entropy + e), layers
    diag = {"version": DIAG_VERSION, "threshold": threshold, "num_images": len(images),
            "collapse": _collapse_rows(meter.compute()),
            "collapse_pre_mix": _collapse_rows(pre_meter.compute()) if pre_meter.count else [],
            "entropy": {"layers": entropy_layers,
                        "values": (entropy / len(images)).tolist() if entropy is not None else []},
            "residual_ratios": [r.row() for r in residual_ratios(model, x, batch_size=batch_size)]}
    write_json(path, diag)
    return diag


def _collapse_rows(groups: list[Any]) -> list[dict[str, Any]]:
    return [{"group": g.name, "along": g.along, "layers": g.layers, "mean_similarity": g.mean_off_diagonal(),
             "similar_blocks": g.similar.tolist(), "similarity": g.similarity.tolist()} for g in groups]


def _collapse_columns(groups: list[dict[str, Any]], suffix: str = "") -> dict[str, Any]:
    sa = next((g for g in groups if g["group"] == "self_attention"), None)
    n = len(sa["layers"]) if sa else 0
    similar = sa["similar_blocks"] if sa else []
    return {
        f"mean_similarity{suffix}": sa["mean_similarity"] if sa and n > 1 else float("nan"),
        f"layers_with_similar{suffix}": sum(1 for c in similar if c > 0),
        f"similar_fraction{suffix}": sum(1 for c in similar if c > 0) / n if n > 1 else float("nan"),
        f"mean_similar_blocks{suffix}": sum(similar) / n if n > 1 else float("nan"),
    }


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def diagnostic_columns(diag: dict[str, Any]) -> dict[str, Any]:
    """The per-run numbers of the study: self-attention collapse (of the recorded maps, and ``*_pre_mix`` of
    the softmax maps before the head mix of re-attention or talking heads: NaN without either) and
    residual-ratio summaries."""
    ratios = diag["residual_ratios"]
    sa_ratios = [r for r in ratios if r["kind"] == "self_attention"]
    attn = [r["attn_mean"] for r in sa_ratios]
    mlp = [r["mlp_mean"] for r in sa_ratios]
    return {
        **_collapse_columns(diag["collapse"]),
        **_collapse_columns(diag.get("collapse_pre_mix", []), "_pre_mix"),
        "attn_entropy": _mean(diag.get("entropy", {}).get("values", [])),
        "ratio_attn_mean": _mean(attn),
        "ratio_mlp_mean": _mean(mlp),
        "ratio_attn_last": attn[-1] if attn else float("nan"),
        "ratio_mlp_last": mlp[-1] if mlp else float("nan"),
    }


DIAG_VALUES = ("mean_similarity", "similar_fraction", "mean_similar_blocks", "mean_similarity_pre_mix",
               "similar_fraction_pre_mix", "mean_similar_blocks_pre_mix", "attn_entropy", "ratio_attn_mean",
               "ratio_mlp_mean")
VALUES = ("test_acc", "best_test_acc", "train_time_s", "train_cpu_s") + DIAG_VALUES


def result_row(spec: RunSpec, summary: dict, diag: dict[str, Any]) -> dict[str, Any]:
    row = {k: spec.info[k] for k in ("variant", "depth", "seed")}
    for key in ("test_acc", "best_test_acc", "train_time_s", "train_cpu_s", "params", "macs"):
        row[key] = summary_value(summary, key)
    row["params"], row["macs"] = int(row["params"]), int(row["macs"])
    row.update(diagnostic_columns(diag))
    row["undertrained"] = undertrained(summary, spec.config)
    row["diverged"] = diverged(summary)
    row["preset"], row["overrides"], row["run"] = spec.info["preset"], spec.info["overrides"], spec.name
    row["run_options"] = spec.info.get("run_options", "{}")
    return row


def per_layer_rows(spec: RunSpec, diag: dict[str, Any]) -> tuple[list[dict], list[dict]]:
    """Residual ratios per block and similar-block counts per attention layer of one run."""
    key = {k: spec.info[k] for k in ("variant", "depth", "seed")}
    ratios = [{**key, "block": r["block"], "kind": r["kind"], "attn_mean": r["attn_mean"],
               "attn_std": r["attn_std"], "mlp_mean": r["mlp_mean"], "mlp_std": r["mlp_std"]}
              for r in diag["residual_ratios"]]
    layers = []
    for maps, groups in (("recorded", diag["collapse"]), ("pre_mix", diag.get("collapse_pre_mix", []))):
        for g in groups:
            for i, layer in enumerate(g["layers"]):
                sim = g["similarity"][i]
                others = [s for j, s in enumerate(sim) if j != i]
                layers.append({**key, "maps": maps, "group": g["group"], "layer": layer,
                               "similar_blocks": g["similar_blocks"][i],
                               "similarity_prev": sim[i - 1] if i > 0 else float("nan"),
                               "mean_similarity_others": sum(others) / len(others) if others else float("nan")})
    return ratios, layers


def aggregate_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    agg = aggregate(rows, ("variant", "depth"), VALUES)
    first = {(r["variant"], r["depth"]): r for r in reversed(rows)}
    for a in agg:
        r = first[(a["variant"], a["depth"])]
        a["params"], a["macs"] = r["params"], r["macs"]
    mark_groups(agg, rows, ("variant", "depth"))
    return agg


def curves(agg: list[dict[str, Any]], value: str, variants: list[str]) -> dict[str, tuple[list, list, list]]:
    """``{variant: (depths, means, stds)}`` of ``value`` in depth order: the lines of a figure against depth."""
    out = {}
    for v in variants:
        pts = sorted((a["depth"], a[f"{value}_mean"], a[f"{value}_std"]) for a in agg if a["variant"] == v)
        if pts:
            out[v] = ([p[0] for p in pts], [p[1] for p in pts], [p[2] for p in pts])
    return out


def plot_against_depth(agg: list[dict[str, Any]], variants: list[str], panels: list[tuple[str, str, float]],
                       path: str | Path, title: str, subsets: list[list[dict[str, Any]]] | None = None) -> Path:
    """One panel per ``(value, ylabel, scale)``: a line per variant with mean +- std over seeds against depth
    (panel ``i`` draws the rows ``subsets[i]`` when given, else all of ``agg``); a variant keeps its colour
    across panels."""
    from vitlab.analysis.plots import new_figure, save

    cols = min(3, len(panels))  # more than three panels wrap onto further rows
    nrows = -(-len(panels) // cols)
    fig = new_figure(5.0 * cols, 3.9 * nrows)
    axes = fig.subplots(nrows, cols, squeeze=False).ravel()
    for ax in axes[len(panels):]:
        ax.set_axis_off()
    depths = sorted({a["depth"] for a in agg})
    colours = {v: f"C{i % 10}" for i, v in enumerate(variants)}
    for i, (ax, (value, ylabel, scale)) in enumerate(zip(axes, panels)):
        rows = subsets[i] if subsets is not None else agg
        for variant, (x, m, s) in curves(rows, value, variants).items():
            ax.errorbar(x, [scale * v for v in m], yerr=[scale * v for v in s], marker="o", capsize=3, label=variant,
                        color=colours[variant])
        ax.set_xscale("log", base=2)
        ax.set_xticks(depths, [str(d) for d in depths])
        ax.minorticks_off()
        ax.set_xlabel("depth (self-attention blocks)")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(title)
    return save(fig, path)


def plot_accuracy(agg: list[dict[str, Any]], variants: list[str], path: str | Path) -> Path:
    """Test accuracy against depth per variant; when some points are under-trained or diverged (they sit tens of
    points below and flatten every other line), a second panel shows the trained points alone at their scale."""
    title = "test accuracy against depth (mean +- std over seeds)"
    panels = [("test_acc", "test accuracy (%)", 100.0)]
    trained = [a for a in agg if not a.get("undertrained") and not a.get("diverged")]
    if not trained or len(trained) == len(agg):
        return plot_against_depth(agg, variants, panels, path, title)
    panels.append(("test_acc", "test accuracy (%), trained points only", 100.0))
    return plot_against_depth(agg, variants, panels, path, title, subsets=[agg, trained])


def plot_ratios(ratio_rows: list[dict[str, Any]], variants: list[str], depths: list[int], path: str | Path) -> Path:
    """Residual ratio per block (attention branch solid, MLP dashed), one panel per depth, mean over seeds."""
    import matplotlib as mpl
    from matplotlib.ticker import MaxNLocator

    from vitlab.analysis.plots import new_figure, save

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

    from vitlab.analysis.plots import new_figure, save

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


def plot_similarity(diags: dict[str, dict[str, Any]], depth: int, path: str | Path) -> Path:
    """Cross-layer similarity of the self-attention maps, one heatmap per variant at ``depth`` (seed 0), plus
    one of the softmax maps before a head mix ("pre-mix": re-attention, talking heads), three panels per row."""
    import math as m

    import numpy as np

    from vitlab.analysis.plots import SIM, new_figure, save

    panels = []
    for variant, diag in diags.items():
        for key, label in (("collapse", variant), ("collapse_pre_mix", f"{variant} pre-mix")):
            sa = next((g for g in diag.get(key, []) if g["group"] == "self_attention"), None)
            if sa:
                panels.append((f"{label} (mean {sa['mean_similarity']:.2f})", np.array(sa["similarity"])))
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


def write_study(out: Path, rows: list[dict], ratio_rows: list[dict], layer_rows: list[dict],
                deepest: dict[str, dict[str, Any]], *, variants: list[str], depths: list[int], threshold: float,
                title: str, command: str, meta: dict[str, Any]) -> dict[str, Any]:
    """results.csv, summary.csv, residual_ratios.csv, collapse_layers.csv, the figures, summary.json, index.html."""
    from vitlab.analysis.report import Section, write_csv, write_json, write_report

    agg = aggregate_rows(rows)
    warning = undertrained_warning(rows, meta["dataset"], (meta.get("run_config") or {}).get("limit_train"))
    write_csv(out / "results.csv", rows)
    write_csv(out / "summary.csv", agg)
    write_csv(out / "residual_ratios.csv", ratio_rows)
    write_csv(out / "collapse_layers.csv", layer_rows)
    plot_accuracy(agg, variants, out / "accuracy_vs_depth.png")
    collapse_panels = [("mean_similarity", "mean cross-layer similarity", 1.0),
                       ("similar_fraction", f"layers with a similar block (> {threshold:g})", 1.0)]
    pre_mix = any(r["mean_similarity_pre_mix"] == r["mean_similarity_pre_mix"] for r in rows)
    if pre_mix:
        collapse_panels += [("mean_similarity_pre_mix", "before the head mix: mean similarity", 1.0),
                            ("similar_fraction_pre_mix", f"before the mix: layers with a similar block "
                                                         f"(> {threshold:g})", 1.0)]
    if any(r.get("attn_entropy") == r.get("attn_entropy") for r in rows):  # NaN only for older diagnostics
        collapse_panels.append(("attn_entropy", "entropy of the softmax maps (1 = uniform)", 1.0))
    plot_against_depth(agg, variants, collapse_panels, out / "collapse_vs_depth.png",
                       "attention collapse (self-attention maps)")
    plot_ratios(ratio_rows, variants, depths, out / "residual_ratios.png")
    plot_similar_blocks(layer_rows, variants, depths, threshold, out / "similar_blocks.png")
    figures = ["accuracy_vs_depth.png", "collapse_vs_depth.png", "residual_ratios.png", "similar_blocks.png"]
    sim_name = f"similarity_depth{max(depths)}.png"
    if deepest:
        plot_similarity(deepest, max(depths), out / sim_name)
    write_json(out / "summary.json", {**meta, "results": agg, "warning": warning})
    best = {}
    for a in agg:
        if a["variant"] not in best or a["test_acc_mean"] > best[a["variant"]]["test_acc_mean"]:
            best[a["variant"]] = a
    lines = "; ".join(f"{v}: best {100 * best[v]['test_acc_mean']:.2f}% at depth {best[v]['depth']}"
                      for v in variants if v in best)
    variants_rows = [{"variant": v, "what": DESCRIPTIONS[v],
                      "overrides at the deepest depth": json.dumps(variant_model(v, meta["base"], max(depths))[1]),
                      "run options it sets": json.dumps(VARIANT_RUN.get(v, {}))}
                     for v in variants]
    pre_mix_text = (" For re-attention (deepvit) and talking heads (cait) the recorded maps are mixed over heads "
                    "after the softmax (re-attention's also normalised), so their cosines sit near 0 partly by "
                    "construction; the *_pre_mix columns and the 'pre-mix' panels compare their softmax maps before "
                    "that mix, on the same scale as the other variants' maps. The attn_entropy column is the mean "
                    "normalised entropy of each model's softmax maps (1: uniform attention); near-uniform maps are "
                    "alike in every layer, so read a high similarity beside it."
                    if pre_mix else "")
    sections = [
        *warning_section(rows, ("variant", "depth", "seed"), warning),
        Section("Accuracy against depth", f"{lines}. Final test accuracy after the same recipe; error bars are the "
                "standard deviation over seeds (0 with one seed).", ["accuracy_vs_depth.png"], ["summary.csv"]),
        Section("Attention collapse", "Mean cosine similarity between the attention maps of different "
                "self-attention layers (Zhou et al. 2021, DeepViT: same head, same key token, compared over "
                f"queries), and the share of layers that have at least one other layer above {threshold:g}. Rising "
                f"curves mean the extra blocks repeat the same attention.{pre_mix_text} The per-layer figure "
                "counts, for each layer, the other layers whose maps are above the threshold (DeepViT's number of "
                "similar blocks).", ["collapse_vs_depth.png", "similar_blocks.png"]
                + ([sim_name] if deepest else []), ["collapse_layers.csv"]),
        Section("Residual ratios", "||gate(branch(x))||_2 / ||x||_2 per block after training (Touvron et al. "
                "2021, CaiT), mean over the test images used for the diagnostics and over seeds.",
                ["residual_ratios.png"], ["residual_ratios.csv"]),
        Section("Variants", "Every variant uses the base preset's width, heads, image and patch size, position "
                "embedding and the same recipe, except the run options a variant sets itself (T-Fixup: no "
                "warm-up); results.csv records the exact overrides and run options of each run. Each run's "
                "folder holds its checkpoint and diagnostics.json (with --analyze-runs also an analysis/ folder "
                "holding the full `vitlab analyze` report: attention maps per head, rollout).",
                [], [variants_rows]),
        Section("Every run", "", [], ["results.csv"]),
        Section("Settings", "", [], [[{"setting": k, "value": json.dumps(v) if not isinstance(v, str) else v}
                                      for k, v in meta.items()]]),
    ]
    write_report(out, title, command, sections)
    return {"summary": agg, "figures": figures + ([sim_name] if deepest else []), "text": lines,
            "warning": warning}


@dataclass
class DepthStudyConfig:
    """A whole depth study: every variant at every depth and seed on the width of preset ``base``."""

    base: str  # the ViT preset whose width, heads, image and patch size every variant shares
    depths: list[int]
    variants: list[str]
    run: Any  # the RunConfig of every run (recipe, data set); model and model options are set per run
    output: Path  # the study folder
    seeds: int = 1
    num_images: int = 64  # test images the diagnostics average over
    threshold: float = 0.9  # similarity above which two blocks count as similar
    shared: dict[str, Any] = field(default_factory=dict)  # model options of every variant (--set)
    analyze_runs: bool = False  # also write each run's full `vitlab analyze` report
    command: str = ""  # the command line the report shows
    logger: str = "none"  # also track the study there (vitlab.train.tracking)
    finished_only: bool = False  # train nothing; tables from the runs already finished


def variant_notes(variants: list[str]) -> list[str]:
    """One line per variant that sets run options itself, whatever the recipe says."""
    return [f"note: the {v} variant trains with {', '.join(f'{k}={val:g}' for k, val in VARIANT_RUN[v].items())} "
            "whatever the recipe says (its paper's setting)" for v in variants if VARIANT_RUN.get(v)]


def check_depth_study(config: DepthStudyConfig) -> Any:
    """Refuse impossible settings before anything runs; returns the base preset's ModelConfig."""
    from vitlab.models import get_config

    if config.seeds < 1 or config.num_images < 1:
        raise ConfigError(f"--seeds and --num-images must be >= 1, got {config.seeds} and {config.num_images}")
    if not -1.0 <= config.threshold <= 1.0:
        raise ConfigError(f"--threshold {config.threshold} is not a cosine similarity; pass a value in [-1, 1]")
    base_model = get_config(config.base)
    if base_model.arch != "vit":
        raise ConfigError(f"--base {config.base} is a {base_model.arch} preset; pass a ViT preset (e.g. vit_mnist) "
                          "whose width the variants share")
    return base_model


def run_depth_study(config: DepthStudyConfig) -> dict[str, Any]:
    """Train (or read back) every run, diagnose each checkpoint, and write the tables, figures and report into
    ``config.output``; returns :func:`write_study`'s result and the study folder (``out``)."""
    import sys

    from vitlab.data import load_dataset, normalization
    from vitlab.experiments.common import check_output, run_all, track_study

    base_model = check_depth_study(config)
    depths, variants, cfg = sorted(config.depths), config.variants, config.run
    specs = depth_specs(config.base, depths, variants, list(range(config.seeds)), cfg, config.shared)
    out = check_output(config.output)
    pairs = run_all(specs, out, title="depth study", finished_only=config.finished_only)
    depths = sorted({spec.info["depth"] for spec, _ in pairs})  # --finished-only: the depths that have runs

    _, test = load_dataset(cfg.dataset, data_dir=cfg.data_dir, img_size=base_model.img_size,
                           in_chans=base_model.in_chans)
    n = min(config.num_images, len(test))
    mean, std = normalization(cfg.dataset, base_model.in_chans)
    rows, ratio_rows, layer_rows, deepest = [], [], [], {}
    for i, (spec, summary) in enumerate(pairs):
        print(f"[{i + 1}/{len(pairs)}] diagnostics of {spec.name}", file=sys.stderr, flush=True)
        diag = diagnose(out / spec.name, test.images[:n], test.labels[:n], test.classes, mean, std,
                        threshold=config.threshold, full_report=config.analyze_runs)
        rows.append(result_row(spec, summary, diag))
        ratios, layers = per_layer_rows(spec, diag)
        ratio_rows += ratios
        layer_rows += layers
        if spec.info["depth"] == depths[-1] and spec.info["seed"] == 0:
            deepest[spec.info["variant"]] = diag
    meta = {"base": config.base, "dataset": cfg.dataset, "depths": depths, "variants": variants,
            "seeds": config.seeds, "num_images": n, "threshold": config.threshold, "run_config": cfg.to_dict()}
    title = f"Depth study on {cfg.dataset} (width of {config.base})"
    result = write_study(out, rows, ratio_rows, layer_rows, deepest, variants=variants, depths=depths,
                         threshold=config.threshold, title=title, command=config.command, meta=meta)
    track_study(out, config.logger, pairs, meta)
    return {**result, "out": out}
