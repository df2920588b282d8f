"""The depth study: accuracy against depth for ViT, LayerScale, ReZero, SkipInit, CaiT and DeepViT at one width,
with the diagnostics of ``vitlab analyze`` for every run (attention collapse, residual ratios per block).

This makes the CaiT claim (LayerScale and class-attention let deeper models train) and the DeepViT claim
(attention maps of deep ViTs become alike across layers, re-attention keeps them apart) testable on data
this machine holds. Every variant shares the base preset's width, heads, image and patch size and the recipe.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vitlab.errors import ConfigError
from vitlab.experiments.common import RunSpec, aggregate, summary_value, unknown_option

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
    "cait": _cait,
    "deepvit": _vit("none", attn="reattention"),
}
DESCRIPTIONS = {
    "vit": "plain pre-norm ViT (gate none)",
    "layerscale": "LayerScale on both branches, init from the CaiT depth rule (cait_init_value(depth))",
    "rezero": "ReZero: one scalar gate per branch, init 0, pre-norms removed",
    "skipinit": "SkipInit: one scalar gate per branch, init 0, pre-norms kept",
    "cait": "CaiT: talking-heads self-attention with LayerScale on the patches, then 2 class-attention blocks",
    "deepvit": "DeepViT: re-attention (a learnable heads x heads mix of the maps, then a norm) in every block",
}


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
    """``(preset, overrides)`` of ``variant`` at ``depth`` on the width of preset ``base`` (validated)."""
    from vitlab.models import get_config

    if variant not in VARIANTS:
        raise ConfigError(unknown_option(variant, list(VARIANTS), "variant"))
    preset, overrides = VARIANTS[variant](base, depth)
    get_config(preset, **overrides)
    return preset, overrides


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
            run_cfg = cfg.replace(model=preset, model_overrides=overrides)
            for seed in seeds:
                info = {"variant": variant, "depth": depth, "seed": seed, "preset": preset,
                        "overrides": json.dumps(overrides, sort_keys=True)}
                specs.append(RunSpec(f"{variant}_depth{depth}_seed{seed}", run_cfg.replace(seed=seed), info))
    return specs


def diagnose(run_dir: Path, images: Any, labels: Any, classes: list[str], mean: tuple, std: tuple, *,
             threshold: float, batch_size: int = 32, full_report: bool = False) -> dict[str, Any]:
    """Attention collapse and residual ratios of the run's checkpoint on ``images`` (uint8 test images), saved
    as ``run_dir/diagnostics.json`` and read back when it exists with the same settings. ``full_report``
    also writes the whole ``vitlab analyze`` report (attention maps, rollout...) into ``run_dir/analysis``."""
    import torch

    from vitlab.analysis import SimilarityMeter, analyze_model, residual_ratios, write_json
    from vitlab.analysis.analyze import model_inputs
    from vitlab.checkpoint import load_model

    path = run_dir / "diagnostics.json"
    if path.is_file() and not (full_report and not (run_dir / "analysis" / "index.html").is_file()):
        diag = json.loads(path.read_text())
        if diag.get("threshold") == threshold and diag.get("num_images") == len(images):
            return diag
    model = load_model(run_dir).eval()
    if full_report:
        cmd = ["vitlab", "analyze", "--checkpoint", str(run_dir), "--output", str(run_dir / "analysis"),
               "--num-images", str(len(images)), "--threshold", f"{threshold:g}"]
        analyze_model(model, images, run_dir / "analysis", labels=labels, classes=classes, mean=mean, std=std,
                      threshold=threshold, batch_size=batch_size, command=cmd, title=f"Analysis of {run_dir.name}")
    x = model_inputs(model, images, mean, std)
    meter = SimilarityMeter(threshold)
    with torch.no_grad():
        for chunk in x.split(batch_size):
            meter.update(model.attention_maps(chunk))
    groups = meter.compute()
    diag = {"threshold": threshold, "num_images": len(images),
            "collapse": [{"group": g.name, "along": g.along, "layers": g.layers,
                          "mean_similarity": g.mean_off_diagonal(), "similar_blocks": g.similar.tolist(),
                          "similarity": g.similarity.tolist()} for g in groups],
            "residual_ratios": [r.row() for r in residual_ratios(model, x, batch_size=batch_size)]}
    write_json(path, diag)
    return diag


def diagnostic_columns(diag: dict[str, Any]) -> dict[str, Any]:
    """The per-run numbers of the study: self-attention collapse and residual-ratio summaries."""
    sa = next((g for g in diag["collapse"] if g["group"] == "self_attention"), None)
    ratios = diag["residual_ratios"]
    sa_ratios = [r for r in ratios if r["kind"] == "self_attention"]
    n = len(sa["layers"]) if sa else 0
    similar = sa["similar_blocks"] if sa else []
    attn = [r["attn_mean"] for r in sa_ratios]
    mlp = [r["mlp_mean"] for r in sa_ratios]
    return {
        "mean_similarity": sa["mean_similarity"] if sa and n > 1 else float("nan"),
        "layers_with_similar": sum(1 for c in similar if c > 0),
        "similar_fraction": sum(1 for c in similar if c > 0) / n if n > 1 else float("nan"),
        "mean_similar_blocks": sum(similar) / n if n > 1 else float("nan"),
        "ratio_attn_mean": sum(attn) / len(attn) if attn else float("nan"),
        "ratio_mlp_mean": sum(mlp) / len(mlp) if mlp else float("nan"),
        "ratio_attn_last": attn[-1] if attn else float("nan"),
        "ratio_mlp_last": mlp[-1] if mlp else float("nan"),
    }


DIAG_VALUES = ("mean_similarity", "similar_fraction", "mean_similar_blocks", "ratio_attn_mean", "ratio_mlp_mean")
VALUES = ("test_acc", "best_test_acc", "train_time_s") + DIAG_VALUES


def result_row(spec: RunSpec, summary: dict, diag: dict[str, Any]) -> dict[str, Any]:
    row = {k: spec.info[k] for k in ("variant", "depth", "seed")}
    for key in ("test_acc", "best_test_acc", "train_time_s", "params", "macs"):
        row[key] = summary_value(summary, key)
    row["params"], row["macs"] = int(row["params"]), int(row["macs"])
    row.update(diagnostic_columns(diag))
    row["preset"], row["overrides"], row["run"] = spec.info["preset"], spec.info["overrides"], spec.name
    return row


def per_layer_rows(spec: RunSpec, diag: dict[str, Any]) -> tuple[list[dict], list[dict]]:
    """Residual ratios per block and similar-block counts per attention layer of one run."""
    key = {k: spec.info[k] for k in ("variant", "depth", "seed")}
    ratios = [{**key, "block": r["block"], "kind": r["kind"], "attn_mean": r["attn_mean"],
               "attn_std": r["attn_std"], "mlp_mean": r["mlp_mean"], "mlp_std": r["mlp_std"]}
              for r in diag["residual_ratios"]]
    layers = []
    for g in diag["collapse"]:
        for i, layer in enumerate(g["layers"]):
            sim = g["similarity"][i]
            others = [s for j, s in enumerate(sim) if j != i]
            layers.append({**key, "group": g["group"], "layer": layer, "similar_blocks": g["similar_blocks"][i],
                           "similarity_prev": sim[i - 1] if i > 0 else float("nan"),
                           "mean_similarity_others": sum(others) / len(others) if others else float("nan")})
    return ratios, layers


def aggregate_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    agg = aggregate(rows, ("variant", "depth"), VALUES)
    first = {(r["variant"], r["depth"]): r for r in reversed(rows)}
    for a in agg:
        r = first[(a["variant"], a["depth"])]
        a["params"], a["macs"] = r["params"], r["macs"]
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
                       path: str | Path, title: str) -> Path:
    """One panel per ``(value, ylabel, scale)``: a line per variant with mean +- std over seeds against depth."""
    from vitlab.analysis.plots import new_figure, save

    fig = new_figure(5.0 * len(panels), 3.9)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    depths = sorted({a["depth"] for a in agg})
    for ax, (value, ylabel, scale) in zip(axes, panels):
        for variant, (x, m, s) in curves(agg, value, variants).items():
            ax.errorbar(x, [scale * v for v in m], yerr=[scale * v for v in s], marker="o", capsize=3, label=variant)
        ax.set_xscale("log", base=2)
        ax.set_xticks(depths, [str(d) for d in depths])
        ax.minorticks_off()
        ax.set_xlabel("depth (self-attention blocks)")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(title)
    return save(fig, path)


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


def plot_similarity(diags: dict[str, dict[str, Any]], depth: int, path: str | Path) -> Path:
    """Cross-layer similarity of the self-attention maps, one heatmap per variant at ``depth`` (seed 0), three
    panels per row."""
    import math as m

    import numpy as np

    from vitlab.analysis.plots import SIM, new_figure, save

    panels = []
    for variant, diag in diags.items():
        sa = next((g for g in diag["collapse"] if g["group"] == "self_attention"), None)
        if sa:
            panels.append((f"{variant} (mean {sa['mean_similarity']:.2f})", np.array(sa["similarity"])))
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
    write_csv(out / "results.csv", rows)
    write_csv(out / "summary.csv", agg)
    write_csv(out / "residual_ratios.csv", ratio_rows)
    write_csv(out / "collapse_layers.csv", layer_rows)
    plot_against_depth(agg, variants, [("test_acc", "test accuracy (%)", 100.0)], out / "accuracy_vs_depth.png",
                       "test accuracy against depth (mean +- std over seeds)")
    plot_against_depth(agg, variants, [("mean_similarity", "mean cross-layer similarity", 1.0),
                                       ("similar_fraction", f"layers with a similar block (> {threshold:g})", 1.0)],
                       out / "collapse_vs_depth.png", "attention collapse (self-attention maps)")
    plot_ratios(ratio_rows, variants, depths, out / "residual_ratios.png")
    figures = ["accuracy_vs_depth.png", "collapse_vs_depth.png", "residual_ratios.png"]
    sim_name = f"similarity_depth{max(depths)}.png"
    if deepest:
        plot_similarity(deepest, max(depths), out / sim_name)
    write_json(out / "summary.json", {**meta, "results": agg})
    best = {}
    for a in agg:
        if a["variant"] not in best or a["test_acc_mean"] > best[a["variant"]]["test_acc_mean"]:
            best[a["variant"]] = a
    lines = "; ".join(f"{v}: best {100 * best[v]['test_acc_mean']:.2f}% at depth {best[v]['depth']}"
                      for v in variants if v in best)
    variants_rows = [{"variant": v, "what": DESCRIPTIONS[v],
                      "overrides at the deepest depth": json.dumps(variant_model(v, meta["base"], max(depths))[1])}
                     for v in variants]
    sections = [
        Section("Accuracy against depth", f"{lines}. Final test accuracy after the same recipe; error bars are the "
                "standard deviation over seeds (0 with one seed).", ["accuracy_vs_depth.png"], ["summary.csv"]),
        Section("Attention collapse", "Mean cosine similarity between the attention maps of different "
                "self-attention layers (DeepViT, Zhou et al.: same head, same key token, compared over queries), and "
                f"the share of layers that have at least one other layer above {threshold:g}. Rising curves mean the "
                "extra blocks repeat the same attention.", ["collapse_vs_depth.png"]
                + ([sim_name] if deepest else []), ["collapse_layers.csv"]),
        Section("Residual ratios", "||gate(branch(x))||_2 / ||x||_2 per block after training (CaiT, Touvron et al.), "
                "mean over the test images used for the diagnostics and over seeds.", ["residual_ratios.png"],
                ["residual_ratios.csv"]),
        Section("Variants", "Every variant uses the base preset's width, heads, image and patch size, position "
                "embedding and the same recipe; results.csv records the exact overrides of each run. Each run's "
                "folder holds its checkpoint and diagnostics.json (with --analyze-runs also an analysis/ folder "
                "holding the full `vitlab analyze` report: attention maps per head, rollout).",
                [], [variants_rows]),
        Section("Every run", "", [], ["results.csv"]),
        Section("Settings", "", [], [[{"setting": k, "value": json.dumps(v) if not isinstance(v, str) else v}
                                      for k, v in meta.items()]]),
    ]
    write_report(out, title, command, sections)
    return {"summary": agg, "figures": figures + ([sim_name] if deepest else []), "text": lines}
