"""The depth study: accuracy against depth for ViT, LayerScale, ReZero, SkipInit, Fixup, T-Fixup, CaiT, ViT-5 and
DeepViT at one width, with the diagnostics of ``vitlab analyze`` for every run (attention collapse, residual ratios
per block: :mod:`vitlab.analysis.depth_diagnostics`, figures: :mod:`vitlab.plots.depth`).

This makes the CaiT claim (LayerScale and class-attention let deeper models train) and the DeepViT claim
(attention maps of deep ViTs become alike across layers, re-attention keeps them apart) testable on data
this machine holds. Every variant shares the base preset's width, heads, image and patch size and the recipe.
Accuracy is the final epoch's on the test set; with ``--val-split`` also the final and best validation accuracy
(the best epoch chosen on the held-out training images, never on the test set).

With ``--lr-from`` each variant and depth trains at the rate a learning-rate study chose (``--lr-of V``: at V's),
and a run that study already trained with the same settings is copied in, not trained (:func:`reuse_grid`).

One file (about 550 lines): the variants table, the plan and the result rows of one study; diagnostics and
figures live in :mod:`vitlab.analysis` and :mod:`vitlab.plots`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vitlab.analysis.depth_diagnostics import DIAG_VALUES, diagnose, diagnostic_columns
from vitlab.errors import ConfigError
from vitlab.experiments.budget import run_marks, undertrained_warning, warning_section
from vitlab.experiments.runs import RunSpec, failed
from vitlab.experiments.table import aggregate_runs, has_validation, summary_values, value_columns
from vitlab.experiments.values import split_list, unknown_option

SHARED = ("img_size", "patch_size", "in_chans", "embed_dim", "num_heads", "mlp_ratio", "pos_embed")
NO_DIAGNOSTICS: dict[str, Any] = {"residual_ratios": [], "collapse": [], "collapse_pre_mix": []}  # a failed run's
VARIANT_KEYS = ("depth", "gate", "attn", "init_values", "depth_token_only", "block", "scale_attn_norm",
                "scale_mlp_norm", "sigma_reparam")  # what the variants differ by


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


def _vit5(base: str, depth: int) -> tuple[str, dict]:
    """The ViT-5 block (the ``vit5_*`` presets: RMSNorm, QK-norm, LayerScale 1e-4, registers, RoPE) at the width of
    ``base``."""
    from vitlab.models import get_config

    cfg = get_config(base)
    return "vit5_small", {**{k: getattr(cfg, k) for k in SHARED}, "depth": depth}


VARIANTS: dict[str, Callable[[str, int], tuple[str, dict]]] = {
    "vit": _vit("none"),
    "qknorm": _vit("none", qk_norm=True),
    "layerscale": _vit("layerscale", layerscale_init=True),
    "rezero": _vit("rezero"),
    "skipinit": _vit("skipinit"),
    "fixup": _vit("fixup"),
    "tfixup": _vit("tfixup"),
    "cait": _cait,
    "vit5": _vit5,
    "deepvit": _vit("none", attn="reattention"),
    "postnorm": _vit("none", block="postnorm"),
    "deepnorm": _vit("none", block="deepnorm"),
    "normformer": _vit("none", scale_attn_norm=True, scale_mlp_norm=True),
    "sigma_reparam": _vit("none", sigma_reparam=True),
    "parallel": _vit("none", block="parallel"),
    "depth_mup": _vit("depth_mup"),
}
DESCRIPTIONS = {
    "vit": "plain pre-norm ViT (gate none)",
    "qknorm": "the plain pre-norm ViT with QK-layernorm (a LayerNorm on each head's queries and keys before the "
              "dot product; Dehghani et al. 2023, which Wortsman et al. 2023 find lowers the LR sensitivity)",
    "layerscale": "LayerScale on both branches, init from the CaiT depth rule (cait_init_value(depth))",
    "rezero": "ReZero: one scalar gate per branch, init 0, pre-norms removed",
    "skipinit": "SkipInit: one scalar gate per branch, init 0, pre-norms kept",
    "fixup": "Fixup: pre-norms removed, last layer of each branch (attn.proj, mlp.fc2) and the head at 0, qkv and "
             "fc1 scaled by (2 depth)^-1/2, a scalar multiplier and scalar biases per branch",
    "tfixup": "T-Fixup: pre-norms removed, no gate, Xavier init with v, proj, fc1, fc2 scaled by 0.67 depth^-1/4 "
              "and the input embedding by (9 depth)^-1/4; trained without warm-up (warmup_epochs=0)",
    "cait": "CaiT: talking-heads self-attention with LayerScale on the patches, then 2 class-attention blocks",
    "vit5": "ViT-5 (Wang et al.): RMSNorm, QK-norm, no qkv bias, LayerScale 1e-4, 4 registers after the patches, "
            "2-D RoPE on patches and registers (the vit5_* presets, the authors' layout)",
    "deepvit": "DeepViT: re-attention (a learnable heads x heads mix of the maps, then a norm) in every block",
    "postnorm": "post-norm blocks (Vaswani et al. 2017): x = LN(x + f(x))",
    "deepnorm": "DeepNorm (Wang et al. 2022): x = LN(alpha x + f(x)), alpha = (2 depth)^1/4, v, proj and MLP drawn "
                "Xavier with gain (8 depth)^-1/4",
    "normformer": "NormFormer's extra norms (Shleifer et al. 2021; timm's scale_attn_norm, scale_mlp_norm): a norm "
                  "before attn.proj and one after the MLP's activation",
    "sigma_reparam": "sigma-Reparam (Zhai et al. 2023): every block linear uses gamma / sigma(W) * W, sigma by one "
                     "power-iteration step per training forward",
    "parallel": "parallel blocks (ViT-22B, Dehghani et al. 2023): x + attn(LN(x)) + mlp(LN(x))",
    "depth_mup": "depth-muP (Yang et al. 2023, Bordelon et al. 2023): each residual branch times 1/sqrt(depth)",
}


# run options a variant sets itself: T-Fixup is meant to train without learning-rate warm-up (Huang et al. 2020)
VARIANT_RUN: dict[str, dict[str, Any]] = {"tfixup": {"warmup_epochs": 0.0}}


def parse_variants(text: str) -> list[str]:
    """``--variants`` as a list, each known variant once."""
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
                shared: dict[str, Any] | None = None,
                rates: dict[tuple[str, int], float] | None = None, unrated: list[str] | None = None) -> list[RunSpec]:
    """One run per variant, depth and seed (seed-major, deepest first), all with the recipe of ``cfg`` and the model
    options ``shared`` (which must not touch what the variants set: depth, gate, attn, init_values...); ``rates``:
    each variant and depth at its own learning rate (``--lr-from``, :func:`vitlab.experiments.rates.best_rates`).
    A cell ``rates`` has no rate for is an error, or, given the list ``unrated``, left out and named in it."""
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
            run_options = dict(VARIANT_RUN.get(variant, {}))
            if rates is not None:
                if (variant, depth) not in rates and unrated is not None:
                    unrated.append(f"{variant} at depth {depth}")
                    continue
                if (variant, depth) not in rates:
                    raise ConfigError(f"--lr-from has no learning rate for {variant} at depth {depth}; run the "
                                      "learning-rate study at that variant and depth, or leave them out")
                run_options["lr"] = rates[(variant, depth)]
            run_cfg = cfg.replace(model=preset, model_overrides=overrides, **run_options)
            for seed in seeds:
                info = {"variant": variant, "depth": depth, "seed": seed, "preset": preset,
                        "overrides": json.dumps(overrides, sort_keys=True),
                        "run_options": json.dumps(run_options, sort_keys=True)}
                specs.append(RunSpec(f"{variant}_depth{depth}_seed{seed}", run_cfg.replace(seed=seed), info))
    # seed-major and deepest first: a study stopped early holds whole seeds, and the longest runs start first, so
    # parallel workers finish together (the order changes no run: each run's name and config are its own)
    order = {v: i for i, v in enumerate(variants)}
    return sorted(specs, key=lambda s: (s.info["seed"], -s.info["depth"], order[s.info["variant"]]))


VALUES = ("test_acc", "train_time_s", "train_cpu_s") + DIAG_VALUES  # with a validation split also table.VALIDATION


def result_row(spec: RunSpec, summary: dict, diag: dict[str, Any], validation: bool = False) -> dict[str, Any]:
    """One row of results.csv: the run's variant, depth and seed, its accuracies (``validation``: the runs held
    out a validation split) and times, cost, diagnostics and marks."""
    row = {k: spec.info[k] for k in ("variant", "depth", "seed")}
    row.update(summary_values(summary, value_columns(VALUES[:3], validation)))
    cost = summary_values(summary, ("params", "macs"))
    row["params"], row["macs"] = (int(v) if v == v else None for v in (cost["params"], cost["macs"]))
    row.update(diagnostic_columns(diag))
    row.update(run_marks(summary, spec.config))
    row["preset"], row["overrides"], row["run"] = spec.info["preset"], spec.info["overrides"], spec.name
    row["run_options"] = spec.info.get("run_options", "{}")
    return row


RATIO_COLUMNS = ["variant", "depth", "seed", "block", "kind", "attn_mean", "attn_std", "mlp_mean", "mlp_std"]
LAYER_COLUMNS = ["variant", "depth", "seed", "maps", "group", "layer", "similar_blocks", "similarity_prev",
                 "mean_similarity_others"]


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


def probe_rows(spec: RunSpec, diag: dict[str, Any], run_dir: Path) -> tuple[list[dict], list[dict]]:
    """The per-layer probes of one run: at the end (its diagnostics images) and per epoch (the probe columns of its
    ``metrics.jsonl``: the first ``probe_images`` training images), keyed by variant, depth and seed."""
    from vitlab.analysis.probes import current_names, layer_columns
    from vitlab.train.logging import read_metrics

    key = {k: spec.info[k] for k in ("variant", "depth", "seed")}
    end = [{**key, **current_names(r)} for r in diag.get("probes", [])]
    epochs = [{**key, "epoch": row.get("epoch"), "layer": layer, **values}
              for row in read_metrics(run_dir) for layer, values in sorted(layer_columns(row).items())]
    return end, epochs


def aggregate_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean and standard deviation over seeds per variant and depth."""
    return aggregate_runs(rows, ("variant", "depth"), value_columns(VALUES, any("val_acc" in r for r in rows)))


def best_depths(agg: list[dict[str, Any]], variants: list[str]) -> str:
    """Per variant, the depth with the best mean validation accuracy and its test accuracy when the runs held out a
    validation split; without one, the final test accuracy at every depth (nothing chosen on the test set)."""
    parts = []
    for v in variants:
        mine = sorted((a for a in agg if a["variant"] == v), key=lambda a: a["depth"])
        if not mine:
            continue
        if "val_acc_mean" in mine[0]:
            best = max(mine, key=lambda a: a["val_acc_mean"] if a["val_acc_mean"] == a["val_acc_mean"] else -1)
            parts.append(f"{v}: best validation accuracy {100 * best['val_acc_mean']:.2f}% at depth {best['depth']} "
                         f"(test {100 * best['test_acc_mean']:.2f}%)")
        else:
            parts.append(f"{v}: " + ", ".join(f"{100 * a['test_acc_mean']:.2f}% at depth {a['depth']}" for a in mine))
    return "; ".join(parts)


def write_study(out: Path, rows: list[dict], ratio_rows: list[dict], layer_rows: list[dict],
                deepest: dict[str, dict[str, Any]], *, variants: list[str], depths: list[int], threshold: float,
                title: str, command: str, meta: dict[str, Any], probe_layers: list[dict] | None = None,
                probe_epochs: list[dict] | None = None) -> dict[str, Any]:
    """results.csv, summary.csv, residual_ratios.csv, collapse_layers.csv, probes_layers.csv, probes_epochs.csv,
    the figures, summary.json, index.html."""
    from vitlab.plots.depth import (
        plot_accuracy,
        plot_against_depth,
        plot_ratios,
        plot_similar_blocks,
        plot_similarity,
    )
    from vitlab.writers import Section, write_csv, write_json, write_report

    agg = aggregate_rows(rows)
    warning = undertrained_warning(rows, meta["dataset"], (meta.get("run_config") or {}).get("limit_train"))
    write_csv(out / "results.csv", rows)
    write_csv(out / "summary.csv", agg)
    # empty (headers only) when no run has diagnostics: every run restored from a record kept before they were written
    write_csv(out / "residual_ratios.csv", ratio_rows, RATIO_COLUMNS)
    write_csv(out / "collapse_layers.csv", layer_rows, LAYER_COLUMNS)
    plot_accuracy(agg, variants, out / "accuracy_vs_depth.png", runs=rows, planned=meta.get("seeds"))
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
    def drawn(name: str, draw: Callable[[Path], Path | None] | None) -> list[str]:
        """``[name]`` when ``draw`` drew it; else ``[]``, and an earlier write's figure of that name is removed (no
        run has the diagnostics it would show)."""
        if draw is not None and draw(out / name) is not None:
            return [name]
        (out / name).unlink(missing_ok=True)
        return []

    ratio_fig = drawn("residual_ratios.png",
                      (lambda p: plot_ratios(ratio_rows, variants, depths, p)) if ratio_rows else None)
    blocks_fig = drawn("similar_blocks.png", (lambda p: plot_similar_blocks(layer_rows, variants, depths, threshold, p))
                       if layer_rows else None)
    figures = ["accuracy_vs_depth.png", "collapse_vs_depth.png", *ratio_fig, *blocks_fig]
    probe_sections = []
    if probe_layers:
        from vitlab.plots.depth import plot_probe_epochs, plot_probes

        write_csv(out / "probes_layers.csv", probe_layers)
        files = ["probes_layers.csv"]
        plot_probes(agg, probe_layers, variants, max(depths), out / "probes_vs_depth.png")
        figures.append("probes_vs_depth.png")
        shown = ["probes_vs_depth.png"]
        if probe_epochs:
            write_csv(out / "probes_epochs.csv", probe_epochs)
            files.append("probes_epochs.csv")
            plot_probe_epochs(probe_epochs, variants, max(depths), out / "probes_epochs.png")
            figures.append("probes_epochs.png")
            shown.append("probes_epochs.png")
        probe_sections.append(Section(
            "Probes against depth", "Per variant and depth, mean over seeds, on the diagnostics images: the last "
            "block's token similarity (mean pairwise cosine of the patch tokens; over-smoothing) and uncentred "
            "effective rank of the patch tokens (Roy & Vetterli 2007; 1 = rank collapse, Dong et al. 2021), the "
            "largest pre-softmax attention logit of any block (Dehghani et al. 2023), and the high-norm artifact "
            "tokens per image summed over the blocks (norm > 3 x the 90th percentile of the block's patch norms "
            "pooled over the images, and > 6 robust standard deviations of their logarithms; Darcet et al. 2024; "
            "not measurable below 16 patch tokens per image); below them the same per block at the "
            "deepest depth. The per-epoch figure follows the deepest runs during training on a fixed batch of "
            "training images (never test images). docs/analysis.md defines each probe.", shown, files))
    sim_fig = drawn(f"similarity_depth{max(depths)}.png", lambda p: plot_similarity(deepest, max(depths), p))
    write_json(out / "summary.json", {**meta, "results": agg, "warning": warning})
    lines = best_depths(agg, variants)
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
        Section("Accuracy against depth", f"{lines}. Final test accuracy after the same recipe (no epoch or depth "
                "is chosen on the test set; with --val-split the validation columns choose): the line is the median "
                "over seeds and each dot one seed (a point with fewer finished seeds than planned is a hollow marker "
                "off the line, labelled k/planned); summary.csv has the median, mean and standard deviation.",
                ["accuracy_vs_depth.png"], ["summary.csv"]),
        Section("Attention collapse", "Mean cosine similarity between the attention maps of different "
                "self-attention layers (Zhou et al. 2021, DeepViT: same head, same key token, compared over "
                f"queries), and the share of layers that have at least one other layer above {threshold:g}. Rising "
                f"curves mean the extra blocks repeat the same attention.{pre_mix_text} The per-layer figure "
                "counts, for each layer, the other layers whose maps are above the threshold (DeepViT's number of "
                "similar blocks).", ["collapse_vs_depth.png", *blocks_fig, *sim_fig], ["collapse_layers.csv"]),
        *probe_sections,
        Section("Residual ratios", "||gate(branch(x))||_2 / ||x||_2 per block after training (Touvron et al. "
                "2021, CaiT), mean over the test images used for the diagnostics and over seeds.",
                ratio_fig, ["residual_ratios.csv"]),
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
    return {"summary": agg, "figures": figures + sim_fig, "text": lines,
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
    executor: Any = None  # where the runs train (vitlab.experiments.executors.ExecutorConfig; None: in this process)
    probe_images: int = 64  # training images each run's per-epoch probes use (0: probes at the end only)
    force: bool = False  # replace the files of the study's names in an --output folder vitlab did not claim
    lr_from: str | None = None  # a learning-rate study's sensitivity.csv: each variant and depth at its best rate
    lr_of: str | None = None  # with lr_from: every variant at the rate chosen for this variant (same-rate control)
    reuse: str | None = None  # another depth study's folder: a run there with this run's name and settings is copied


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
    if config.reuse is not None:
        reuse = Path(config.reuse).expanduser()
        if not reuse.is_dir():
            raise ConfigError(f"--reuse {config.reuse}: no such folder; pass the output folder of another "
                              "`vitlab depth-study` whose finished runs this study may copy")
        if reuse.resolve() == Path(config.output).expanduser().resolve():
            raise ConfigError(f"--reuse {config.reuse} is this study's own --output, whose finished runs are read "
                              "back anyway; drop --reuse or name another study's folder")
    if config.lr_of is not None:
        if not config.lr_from:
            raise ConfigError(f"--lr-of {config.lr_of} picks a rate --lr-from read; add --lr-from STUDY (a finished "
                              "`vitlab lr-sensitivity` study), or drop --lr-of")
        if config.lr_of not in VARIANTS:
            raise ConfigError(f"--lr-of: {unknown_option(config.lr_of, list(VARIANTS), 'variant')}")
    return base_model


def study_rates(config: DepthStudyConfig) -> dict[tuple[str, int], float] | None:
    """``{(variant, depth): rate}`` of ``--lr-from`` (None without it): each variant's own best rate, or with
    ``--lr-of V`` the rate chosen for ``V`` at that depth for every variant (the same-rate control)."""
    if not config.lr_from:
        return None
    from vitlab.experiments.rates import best_rates

    if config.run.lr is not None:
        raise ConfigError("give --lr or --lr-from, not both: --lr-from sets each variant's rate")
    # only the cells this study trains must have finished their grid (none with --finished-only, which leaves out a
    # cell without a rate): the grid's other cells may still be running
    wanted = {(config.lr_of or v, d) for v in config.variants for d in config.depths}
    rates = best_rates(config.lr_from, set() if config.finished_only else wanted)
    if config.lr_of is None:
        return rates
    missing = [d for d in sorted(config.depths) if (config.lr_of, d) not in rates]
    if missing:
        raise ConfigError(f"--lr-from {config.lr_from} has no learning rate for {config.lr_of} at depth "
                          f"{', '.join(map(str, missing))} (--lr-of {config.lr_of}); run the learning-rate study for "
                          f"{config.lr_of} at that depth, or pass another --lr-of")
    return {(v, d): rates[(config.lr_of, d)] for v in config.variants for d in config.depths}


def grid_run_name(variant: str, depth: int, lr: float, seed: int) -> str:
    """The folder ``vitlab lr-sensitivity`` trains ``variant`` at ``depth``, rate ``lr`` and ``seed`` in (its
    ``lr_specs`` names its runs with this function; the rate as ``lr_name`` writes it)."""
    return f"{variant}_depth{depth}_lr{lr:g}_seed{seed}"


def grid_problem(grid_run: Path, spec: RunSpec, out: Path,
                 diagnostics: tuple[float, int] | None = None) -> str | None:
    """Why the finished run ``grid_run`` of a learning-rate study cannot stand in for ``spec`` (None: it can), the first
    that applies of: it has not finished, a setting that matters differs, it holds no weights (a kept record: the
    diagnostics need them) and no diagnostics made with the depth study's settings (``diagnostics``: its threshold
    and number of images; ``vitlab lr-sensitivity --diagnose`` writes them), or its record does not verify
    (:mod:`vitlab.experiments.record`).
    Settings are compared as the run would train them (:func:`vitlab.train.plan.plan_run`: options left to the
    recipe resolved, the model as built), so an option given to one study and not the other is a difference too;
    the result-neutral options (:data:`vitlab.train.config.RESULT_NEUTRAL`: output, threads, device...) are not."""
    from vitlab.checkpoint import ModelSpec
    from vitlab.errors import CheckpointError
    from vitlab.experiments.record import SUMMARY, WEIGHTS, UnverifiedRun, check_run, verified_config
    from vitlab.train.config import RESULT_NEUTRAL
    from vitlab.train.plan import plan_run

    if grid_run.is_symlink() or not grid_run.is_dir() or not (grid_run / SUMMARY).is_file():
        return "it has not finished"
    # other settings come first: a run that could never stand in (a drop-path control beside a grid run without drop
    # path) is named for that, not for the weights a kept record lacks (its config.json is read all the same)
    try:
        config, unverified = verified_config(grid_run), None
    except CheckpointError as exc:
        config, unverified = None, f"it cannot be verified ({str(exc).split('; ')[0]})"
    if config is not None:
        plan = plan_run(spec.config.replace(output=str(out / spec.name)), count_macs=False)
        stored = config["run"] if isinstance(config.get("run"), dict) else {}
        now = json.loads(json.dumps(plan.run.to_dict()))  # as config.json stores it
        saved = json.loads(json.dumps(ModelSpec.from_dict(config["model"]).options()))
        built = json.loads(json.dumps(plan.spec.options()))
        changed = [f"{k} {stored.get(k)!r} there, {now.get(k)!r} now" for k in sorted(set(stored) | set(now))
                   if k not in RESULT_NEUTRAL and k not in ("data", "model_overrides") and stored.get(k) != now.get(k)]
        changed += [f"{k} {saved.get(k)!r} there, {built.get(k)!r} now" for k in sorted(set(saved) | set(built))
                    if k != "name" and saved.get(k) != built.get(k)]
        if changed:
            return f"it was trained with other settings ({'; '.join(changed)})"
    if not can_diagnose(grid_run, diagnostics):
        made = "" if diagnostics is None else (f" and no diagnostics.json for {diagnostics[1]} images at threshold "
                                               f"{diagnostics[0]:g} (`vitlab lr-sensitivity --diagnose` writes it)")
        return f"it holds no {WEIGHTS} (a run record kept without weights), which the diagnostics read{made}"
    if unverified is not None:
        return unverified
    try:
        summary, _ = check_run(grid_run, spec.config)  # the engine's own decision, as the copy will be read back
    except UnverifiedRun:
        summary = None
    return None if summary is not None else "it is no finished run's record that verifies"


def _has_diagnostics(run_dir: Path, settings: tuple[float, int] | None) -> bool:
    """Whether ``run_dir`` holds the current diagnostics made at ``settings`` (threshold, number of images), which
    :func:`~vitlab.analysis.depth_diagnostics.diagnose` reads back instead of loading the weights."""
    from vitlab.analysis.depth_diagnostics import kept_diagnostics

    return settings is not None and kept_diagnostics(run_dir, *settings, current=True) is not None


def can_diagnose(run_dir: Path, settings: tuple[float, int] | None) -> bool:
    """Whether :func:`~vitlab.analysis.depth_diagnostics.diagnose` can diagnose the finished run ``run_dir``: it holds
    its weights, or the diagnostics made at ``settings`` (threshold, number of images), as a run record kept without
    weights does when they were written before; ``settings`` None (``--analyze-runs``, whose full report reads the
    weights) wants the weights."""
    from vitlab.experiments.record import WEIGHTS

    return (run_dir / WEIGHTS).is_file() or _has_diagnostics(run_dir, settings)


def diagnostic_images(dataset: str, data_dir: Any, model: Any, num_images: int) -> tuple:
    """The images the depth study diagnoses every run on, as :func:`~vitlab.analysis.depth_diagnostics.diagnose`
    takes them: the first ``num_images`` test images of ``dataset`` at ``model``'s size and channels, their labels,
    the class names and the dataset's normalisation (mean, std)."""
    from vitlab.data import load_dataset, normalization

    _, test = load_dataset(dataset, data_dir=data_dir, img_size=model.img_size, in_chans=model.in_chans)
    n = min(num_images, len(test))
    return (test.images[:n], test.labels[:n], test.classes, *normalization(dataset, model.in_chans))


def diagnose_runs(pairs: list[tuple[RunSpec, dict]], out: Path, dataset: str, data_dir: Any, model: Any, *,
                  num_images: int = 64, threshold: float = 0.9) -> list[str]:
    """Write the depth study's diagnostics (:func:`~vitlab.analysis.depth_diagnostics.diagnose`, the first
    ``num_images`` test images, ``threshold``: the depth study's defaults) into each finished run of ``pairs`` that
    still holds its weights, so that its record, kept without them, can stand in for a depth study's run
    (:func:`grid_problem`). Returns the runs left without diagnostics (failed, or restored without weights)."""
    import sys

    images = diagnostic_images(dataset, data_dir, model, num_images)
    n = len(images[0])
    left = []
    for i, (spec, summary) in enumerate(pairs):
        run_dir = out / spec.name
        if failed(summary) or not can_diagnose(run_dir, (threshold, n)):
            left.append(spec.name)
            continue
        print(f"[{i + 1}/{len(pairs)}] diagnostics of {spec.name}", file=sys.stderr, flush=True)
        diagnose(run_dir, *images, threshold=threshold)
    return left


def reuse_grid(specs: list[RunSpec], grid: Path, out: Path, title: str = "depth study",
               diagnostics: tuple[float, int] | None = None) -> list[RunSpec]:
    """Point each run of ``specs`` (at a rate ``--lr-from`` chose) that has no folder in the study ``out`` yet to the
    run of the learning-rate study ``grid`` with its variant, depth, rate and seed, where that run can stand in for
    it (:func:`grid_problem`): :func:`vitlab.experiments.runs.run_study` copies it in instead of training. A grid
    run that cannot is named in one line on stderr, with why, and the run trains."""
    return reuse_runs(specs, grid, out, lambda spec: grid_run_name(spec.info["variant"], spec.info["depth"],
                                                                   spec.config.lr, spec.info["seed"]), title,
                      diagnostics)


def reuse_runs(specs: list[RunSpec], source: Path, out: Path, name: Callable[[RunSpec], str] = lambda s: s.name,
               title: str = "depth study", diagnostics: tuple[float, int] | None = None) -> list[RunSpec]:
    """Point each run of ``specs`` that has no folder in ``out`` and no source yet to the run ``source / name(spec)``
    where that run can stand in for it (:func:`grid_problem`: finished, verified, the same settings as the run
    would train with); ``run_study`` copies it in instead of training. ``--reuse STUDY`` uses the run's own name (a
    run another depth study trained: the phase-2 runs a same-rate control shares where an arm's rate is the
    ViT's); a run there that cannot stand in is named in one line on stderr, with why, and the run trains."""
    import os
    import sys

    for spec in specs:
        grid_run = source / name(spec)
        if spec.source or os.path.lexists(out / spec.name) or not os.path.lexists(grid_run):
            continue
        problem = grid_problem(grid_run, spec, out, diagnostics)
        if problem is None:
            spec.source = str(grid_run)
        else:
            print(f"{title} {spec.name}: not reused from {grid_run}: {problem}; training it", file=sys.stderr,
                  flush=True)
    return specs


def depth_run_specs(config: DepthStudyConfig) -> list[RunSpec]:
    """The runs of ``config`` (what ``--dry-run`` plans and :func:`run_depth_study` trains)."""
    cfg = config.run
    if config.probe_images and not cfg.probe_images:
        cfg = cfg.replace(probe_images=config.probe_images)
    # --finished-only reads back what has finished: a cell whose rate --lr-from has not settled yet has no run to
    # read, so it is left out (named), which lets a study that runs cell by cell rewrite its whole table in between
    unrated: list[str] | None = [] if config.finished_only else None
    specs = depth_specs(config.base, sorted(config.depths), config.variants, list(range(config.seeds)), cfg,
                        config.shared, study_rates(config), unrated)
    if unrated:
        import sys

        print(f"depth study: --finished-only leaves out {', '.join(unrated)}: --lr-from {config.lr_from} has no "
              "rate for them yet (their learning-rate grid has not finished)", file=sys.stderr, flush=True)
    # a run kept without its weights stands in when it holds the diagnostics this study would compute (the full
    # --analyze-runs report needs the weights)
    diagnostics = None if config.analyze_runs else (config.threshold, config.num_images)
    if config.lr_from and Path(config.lr_from).is_dir() and not config.finished_only:
        specs = reuse_grid(specs, Path(config.lr_from).expanduser(), Path(config.output).expanduser(),
                           diagnostics=diagnostics)
    if config.reuse and not config.finished_only:
        specs = reuse_runs(specs, Path(config.reuse).expanduser(), Path(config.output).expanduser(),
                           diagnostics=diagnostics)
    return specs


def run_depth_study(config: DepthStudyConfig) -> dict[str, Any]:
    """Train (or read back) every run, diagnose each checkpoint, and write the tables, figures and report into
    ``config.output``; returns :func:`write_study`'s result and the study folder (``out``)."""
    import sys

    from vitlab.experiments.runs import run_study, track_study

    base_model = check_depth_study(config)
    variants, cfg = config.variants, config.run
    if config.probe_images and not cfg.probe_images:
        cfg = cfg.replace(probe_images=config.probe_images)
    specs = depth_run_specs(config)
    out, pairs = run_study(specs, config.output, "depth-study", force=config.force, command=config.command,
                           title="depth study", finished_only=config.finished_only, executor=config.executor)
    # the tables by variant, then depth, then seed, whatever order the runs trained in
    order = {v: i for i, v in enumerate(variants)}
    pairs = sorted(pairs, key=lambda p: (order[p[0].info["variant"]], p[0].info["depth"], p[0].info["seed"]))
    depths = sorted({spec.info["depth"] for spec, _ in pairs})  # --finished-only: the depths that have runs

    images = diagnostic_images(cfg.dataset, cfg.data_dir, base_model, config.num_images)
    n = len(images[0])
    rows, ratio_rows, layer_rows, deepest, probe_layers, probe_epochs = [], [], [], {}, [], []
    validation = has_validation(summary for _, summary in pairs)
    # a run record kept without its weights (restored from a repository) is diagnosed only from the diagnostics it
    # kept; without them its diagnostic columns stay empty, its accuracies and per-epoch probes are still read
    undiagnosable = {spec.name for spec, summary in pairs
                     if not failed(summary) and not can_diagnose(
                         out / spec.name, None if config.analyze_runs else (config.threshold, n))}
    if undiagnosable:
        needs = "no weights (--analyze-runs needs them)" if config.analyze_runs else (
            f"neither weights nor a diagnostics.json for {n} images at threshold {config.threshold:g}")
        print(f"depth study: {len(undiagnosable)} finished run(s) hold {needs}: "
              f"{', '.join(sorted(undiagnosable))}; their diagnostic columns are empty", file=sys.stderr, flush=True)
    for i, (spec, summary) in enumerate(pairs):
        print(f"[{i + 1}/{len(pairs)}] diagnostics of {spec.name}", file=sys.stderr, flush=True)
        diag = NO_DIAGNOSTICS if failed(summary) or spec.name in undiagnosable else diagnose(
            out / spec.name, *images, threshold=config.threshold, full_report=config.analyze_runs)
        rows.append(result_row(spec, summary, diag, validation))
        ratios, layers = per_layer_rows(spec, diag)
        ratio_rows += ratios
        layer_rows += layers
        end, epochs = probe_rows(spec, diag, out / spec.name)
        probe_layers += end
        probe_epochs += epochs
        # the similarity heatmaps: per variant the lowest seed at the deepest depth that has diagnostics (seed 0
        # unless its run failed or was restored from a record kept without them)
        if spec.info["depth"] == depths[-1] and diag.get("collapse") and spec.info["variant"] not in deepest:
            deepest[spec.info["variant"]] = {**diag, "seed": spec.info["seed"]}
    meta = {"base": config.base, "dataset": cfg.dataset, "depths": depths, "variants": variants,
            "seeds": config.seeds, "num_images": n, "threshold": config.threshold, "run_config": cfg.to_dict()}
    if config.lr_from:
        meta.update({"lr_from": str(config.lr_from), **({"lr_of": config.lr_of} if config.lr_of else {})})
    if config.reuse:
        meta["reuse"] = str(config.reuse)
    title = f"Depth study on {cfg.dataset} (width of {config.base})"
    result = write_study(out, rows, ratio_rows, layer_rows, deepest, variants=variants, depths=depths,
                         threshold=config.threshold, title=title, command=config.command, meta=meta,
                         probe_layers=probe_layers, probe_epochs=probe_epochs)
    track_study(out, config.logger, pairs, meta)
    return {**result, "out": out, "pairs": pairs}
