"""Learning-rate sensitivity against depth (Wortsman et al. 2023, "Small-scale proxies for large-scale Transformer
training instabilities"): every variant of the depth study at every depth, trained at every learning rate of a
grid and every seed on a short schedule; per variant and depth, the best final validation loss, the learning rate
it needs, how sensitive the loss is to the learning rate, how many runs diverged, and the largest pre-softmax
attention logit per layer over training (the instability the proxies paper ties to divergence).

LR sensitivity is the proxies paper's: ``E_lr[min(L(lr), L0) - min_lr L(lr)]`` over the grid
(:func:`lr_sensitivity`), where ``L(lr)`` is one seed's final validation loss, ``L0 = ln(classes)`` the loss of a
uniform guess (a run that diverged, or ends above it, counts as ``L0``), and the expectation is the mean over the
grid (equal steps in log learning rate). A (variant, depth) reports the mean over its seeds of each seed's
sensitivity: the seed is the unit, so the findings page's verdicts compare exactly these per-seed values. Lower is
better: a variant that trains at every learning rate scores near 0.

Nothing is chosen on the test set: the best learning rate is the one with the lowest validation loss, and the
test accuracy is reported at it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vitlab.errors import ConfigError
from vitlab.experiments.depth_study import DESCRIPTIONS, VARIANT_RUN, depth_specs
from vitlab.experiments.runs import RunSpec, failed
from vitlab.experiments.table import diverged, mean_std, summary_value

VALUES = ("val_loss", "val_acc", "test_acc", "train_loss", "max_logit")  # per run; mean/std over seeds per group


def lr_name(lr: float) -> str:
    """The learning rate as it appears in a run's folder name: ``2e-3`` -> ``0.002``."""
    return f"{lr:g}"


def lr_specs(base: str, depths: list[int], variants: list[str], lrs: list[float], seeds: list[int], cfg: Any,
             shared: dict[str, Any] | None = None) -> list[RunSpec]:
    """One run per variant, depth, learning rate and seed (the depth study's runs, each at ``lr``), deepest first
    within each seed so that workers started together finish together; seed 0 of everything before seed 1."""
    specs = []
    for lr in lrs:
        for s in depth_specs(base, depths, variants, seeds, cfg.replace(lr=lr), shared):
            info = {**s.info, "lr": lr}
            name = f"{info['variant']}_depth{info['depth']}_lr{lr_name(lr)}_seed{info['seed']}"
            specs.append(RunSpec(name, s.config, info))
    order = {v: i for i, v in enumerate(variants)}
    return sorted(specs, key=lambda s: (s.info["seed"], -s.info["depth"], order[s.info["variant"]], s.info["lr"]))


def _layer_logits(metrics: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``[{epoch, layer, max_logit}]`` from a run's metrics rows' probe columns (``probe/max_logit/block<i>``)."""
    from vitlab.analysis.probes import layer_columns

    out = [{"epoch": row.get("epoch"), "layer": layer, "max_logit": values["max_logit"]}
           for row in metrics for layer, values in layer_columns(row).items() if "max_logit" in values]
    return sorted(out, key=lambda r: (r["epoch"] or 0, r["layer"]))


def _last_train_loss(metrics: list[dict[str, Any]]) -> float:
    losses = [r["train_loss"] for r in metrics if isinstance(r.get("train_loss"), int | float)]
    return float(losses[-1]) if losses else math.nan


def result_row(spec: RunSpec, summary: dict, run_dir: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One row of results.csv and the run's max attention logit per layer and epoch."""
    key = {k: spec.info[k] for k in ("variant", "depth", "lr", "seed")}
    from vitlab.train.logging import read_metrics

    metrics = [] if failed(summary) else list(read_metrics(run_dir))  # read once: logits and the last loss
    layers = _layer_logits(metrics)
    row = {**key, "val_loss": summary_value(summary, "final_val_loss"), "val_acc": summary_value(summary, "val_acc"),
           "test_acc": summary_value(summary, "test_acc"),
           "train_loss": _last_train_loss(metrics),
           "max_logit": max((r["max_logit"] for r in layers if _finite(r["max_logit"])), default=math.nan),
           "diverged": diverged(summary), "failed": failed(summary),
           "diverged_epoch": (summary.get("diverged_at") or {}).get("epoch") if diverged(summary) else None,
           "train_time_s": summary_value(summary, "train_time_s"), "params": summary.get("params"),
           "preset": spec.info["preset"], "overrides": spec.info["overrides"],
           "run_options": spec.info.get("run_options", "{}"), "run": spec.name}
    return row, [{**key, **r} for r in layers]


def _finite(v: Any) -> bool:
    return isinstance(v, int | float) and math.isfinite(v)


def capped_loss(row: dict[str, Any], l0: float) -> float:
    """A run's final validation loss for the sensitivity: ``min(loss, L0)``, and ``L0`` when it diverged (its loss
    is the uniform guess's or worse) or has no finite loss."""
    loss = row.get("val_loss", math.nan)
    if row.get("diverged") or not _finite(loss):
        return l0
    return min(float(loss), l0)


def lr_sensitivity(curve: dict[float, float], grid: Iterable[float] | None = None) -> float:
    """The LR sensitivity of one loss-against-rate curve ``{lr: capped loss}`` (one seed): the mean over ``grid``
    of ``L(lr) - min_lr L(lr)``, where the minimum is over the whole curve.

    ``grid`` is the rates every cell of a study shares (the ``--lrs`` it was given; default: all of ``curve``'s);
    ``curve`` may hold more, the rates added beyond the grid's edge to bracket a cell's optimum. So the mean is over
    one range for every cell (sensitivities of two cells compare), and the reference is the cell's own best loss,
    not a truncated grid's edge."""
    rates = list(curve) if grid is None else list(grid)
    missing = [lr for lr in rates if lr not in curve]
    if missing:
        raise ValueError(f"the curve has no loss at learning rate(s) {missing} of the grid")
    best = min(curve.values())
    return sum(curve[lr] for lr in rates) / len(rates) - best


def seed_sensitivities(rows: list[dict[str, Any]], l0: float, lrs: list[float]) -> dict[tuple, dict[int, float]]:
    """``{(variant, depth): {seed: sensitivity}}`` for every seed that finished every learning rate of ``lrs``."""
    curves: dict[tuple, dict[int, dict[float, float]]] = {}
    for r in rows:
        if not r.get("failed"):
            curves.setdefault((r["variant"], r["depth"]), {}).setdefault(r["seed"], {})[r["lr"]] = capped_loss(r, l0)
    return {key: {seed: lr_sensitivity(c) for seed, c in sorted(by_seed.items()) if set(c) >= set(lrs)}
            for key, by_seed in curves.items()}


def lr_table(rows: list[dict[str, Any]], l0: float) -> list[dict[str, Any]]:
    """summary.csv: per variant, depth and learning rate, the mean and std over seeds of every value, the capped
    loss the sensitivity uses, and how many runs diverged."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if not r.get("failed"):
            groups.setdefault((r["variant"], r["depth"], r["lr"]), []).append(r)
    out = []
    for (variant, depth, lr), members in groups.items():
        a: dict[str, Any] = {"variant": variant, "depth": depth, "lr": lr, "n": len(members)}
        for v in VALUES:
            finite = [float(m[v]) for m in members if not m.get("diverged") and _finite(m.get(v))]
            a[f"{v}_mean"], a[f"{v}_std"] = mean_std(finite)
        a["capped_loss_mean"] = sum(capped_loss(m, l0) for m in members) / len(members)
        a["diverged"] = sum(1 for m in members if m.get("diverged"))
        out.append(a)
    return sorted(out, key=lambda a: (a["variant"], a["depth"], a["lr"]))


def sensitivity(lr_rows: list[dict[str, Any]], lrs: list[float],
                per_seed: dict[tuple, dict[int, float]]) -> list[dict[str, Any]]:
    """sensitivity.csv: per variant and depth, the best learning rate (lowest mean capped validation loss), its
    loss, validation and test accuracy, the LR sensitivity over the grid (the mean over seeds of each seed's
    :func:`lr_sensitivity`, ``per_seed`` from :func:`seed_sensitivities`), the share of runs that diverged, and the
    largest attention logit of any run. A (variant, depth) with no seed that finished every learning rate of the
    grid (runs not finished yet) gets NaN sensitivity: the mean would be over another range."""
    groups: dict[tuple, list[dict]] = {}
    for a in lr_rows:
        groups.setdefault((a["variant"], a["depth"]), []).append(a)
    out = []
    for (variant, depth), members in groups.items():
        best = min(members, key=lambda a: (a["capped_loss_mean"], a["lr"]))
        seeds = per_seed.get((variant, depth), {})
        runs = sum(a["n"] for a in members)
        logits = [a["max_logit_mean"] for a in members if _finite(a["max_logit_mean"])]
        out.append({
            "variant": variant, "depth": depth, "lrs": len(members), "runs": runs,
            "best_lr": best["lr"], "best_val_loss": best["capped_loss_mean"],
            "best_val_acc": best["val_acc_mean"], "test_acc_at_best_lr": best["test_acc_mean"],
            "lr_sensitivity": sum(seeds.values()) / len(seeds) if seeds else math.nan,
            "divergence_rate": sum(a["diverged"] for a in members) / runs if runs else math.nan,
            "max_logit": max(logits) if logits else math.nan,
        })
    return sorted(out, key=lambda a: (a["variant"], a["depth"]))


@dataclass
class LRSensitivityConfig:
    """A whole learning-rate sensitivity study."""

    base: str  # the ViT preset whose width, heads, image and patch size every variant shares
    depths: list[int]
    variants: list[str]
    lrs: list[float]
    run: Any  # the RunConfig of every run (its lr is replaced per run)
    output: Path
    seeds: int = 1
    shared: dict[str, Any] = field(default_factory=dict)
    command: str = ""
    finished_only: bool = False
    executor: Any = None
    probe_images: int = 64
    force: bool = False


def check_lr_sensitivity(config: LRSensitivityConfig) -> None:
    """Refuse impossible settings before anything runs."""
    from vitlab.experiments.depth_study import DepthStudyConfig, check_depth_study

    check_depth_study(DepthStudyConfig(config.base, config.depths, config.variants, config.run, config.output,
                                       config.seeds))
    if len(config.lrs) < 2:
        raise ConfigError(f"--lrs needs at least two learning rates to measure a sensitivity, got {config.lrs}; "
                          "pass e.g. --lrs 3e-4,7e-4,2e-3,5e-3,1e-2")
    bad = [lr for lr in config.lrs if not (_finite(lr) and lr > 0)]
    if bad:
        raise ConfigError(f"--lrs must be positive numbers, got {bad}")
    if len(set(config.lrs)) != len(config.lrs):
        raise ConfigError(f"--lrs repeats a value: {config.lrs}; give each learning rate once")
    for lr in config.lrs:
        config.run.replace(lr=lr).validate()  # an impossible rate is refused before any run trains
    if not config.probe_images:
        raise ConfigError("--probe-images 0 would record no attention logit over training; pass --probe-images N "
                          "(e.g. 64)")
    if (config.run.val_split or 0) <= 0:
        raise ConfigError("the learning-rate sensitivity compares validation losses; pass --val-split F (e.g. 0.1) "
                          "so that no learning rate is chosen on the test set")


def lr_run_specs(config: LRSensitivityConfig) -> list[RunSpec]:
    """The runs of ``config``, checked (what ``--dry-run`` plans and :func:`run_lr_sensitivity` trains)."""
    check_lr_sensitivity(config)
    cfg = config.run.replace(probe_images=config.probe_images)
    return lr_specs(config.base, sorted(config.depths), config.variants, sorted(config.lrs),
                    list(range(config.seeds)), cfg, config.shared)


def run_lr_sensitivity(config: LRSensitivityConfig) -> dict[str, Any]:
    """Train (or read back) every run and write results.csv, summary.csv, sensitivity.csv, logits.csv, the figures,
    summary.json and index.html into ``config.output``."""
    from vitlab.experiments.runs import run_study

    specs = lr_run_specs(config)
    depths, lrs = sorted(config.depths), sorted(config.lrs)
    cfg = config.run.replace(probe_images=config.probe_images)
    out, pairs = run_study(specs, config.output, "lr-sensitivity", force=config.force, command=config.command,
                           title="lr sensitivity", finished_only=config.finished_only, executor=config.executor)
    rows, logits = [], []
    for spec, summary in pairs:
        row, layers = result_row(spec, summary, out / spec.name)
        rows.append(row)
        logits += layers
    l0 = math.log(_num_classes(cfg.dataset, out, pairs))
    meta = {"base": config.base, "dataset": cfg.dataset, "depths": depths, "variants": config.variants, "lrs": lrs,
            "seeds": config.seeds, "uniform_loss": l0, "run_config": cfg.to_dict()}
    return {**write_study(out, rows, logits, meta, command=config.command), "out": out, "pairs": pairs}


def _num_classes(dataset: str, out: Path, pairs: list[tuple[RunSpec, dict]]) -> int:
    """The data set's classes: the catalog's, else those of the first finished run's model."""
    from vitlab.catalog import dataset_info

    info = dataset_info(dataset)
    if info is not None and info.num_classes:
        return info.num_classes
    for spec, summary in pairs:
        path = out / spec.name / "config.json"
        if not failed(summary) and path.is_file():
            return int(json.loads(path.read_text())["model"]["num_classes"])
    raise ConfigError(f"cannot tell how many classes {dataset} has; no run has finished")


def write_study(out: Path, rows: list[dict], logits: list[dict], meta: dict[str, Any], *,
                command: str) -> dict[str, Any]:
    """The tables, figures and report of a finished (or partly finished) study."""
    from vitlab.plots.lr import plot_logit_growth, plot_logits, plot_loss_vs_lr, plot_sensitivity
    from vitlab.writers import Section, write_csv, write_json, write_report

    per_lr = lr_table(rows, meta["uniform_loss"])
    sens = sensitivity(per_lr, meta["lrs"], seed_sensitivities(rows, meta["uniform_loss"], meta["lrs"]))
    write_csv(out / "results.csv", rows)
    write_csv(out / "summary.csv", per_lr)
    write_csv(out / "sensitivity.csv", sens)
    write_csv(out / "logits.csv", logits, columns=["variant", "depth", "lr", "seed", "epoch", "layer", "max_logit"])
    variants = [v for v in meta["variants"] if any(a["variant"] == v for a in per_lr)]
    plot_loss_vs_lr(per_lr, variants, meta["uniform_loss"], out / "loss_vs_lr.png")
    plot_sensitivity(sens, variants, out / "sensitivity_vs_depth.png")
    plot_logits(per_lr, variants, out / "max_logit_vs_lr.png")
    deepest = max(meta["depths"])
    plot_logit_growth(logits, variants, deepest, out / "logit_growth.png")
    write_json(out / "summary.json", {**meta, "sensitivity": sens})
    variants_rows = [{"variant": v, "what": DESCRIPTIONS[v], "run options it sets": json.dumps(VARIANT_RUN.get(v, {}))}
                     for v in variants]
    sections = [
        Section("Final validation loss against learning rate", "Per variant, a line per depth: the mean over seeds "
                f"of the final validation loss (a diverged run counts as the uniform guess's loss, ln(classes) = "
                f"{meta['uniform_loss']:.3f}, the dashed line).", ["loss_vs_lr.png"], ["summary.csv"]),
        Section("LR sensitivity, best loss and divergence against depth", "LR sensitivity (Wortsman et al. 2023): "
                "the mean over the grid of min(loss, ln(classes)) minus the best loss; the best learning rate is "
                "chosen on the validation loss, and the test accuracy is the one at it.",
                ["sensitivity_vs_depth.png"], ["sensitivity.csv"]),
        Section("Attention logits", "The largest pre-softmax attention logit of any layer (Dehghani et al. 2023), "
                "measured after every epoch on a fixed batch of training images, at the end of training, against "
                "the learning rate; below, at the deepest depth, its growth epoch by epoch at each rate; logits.csv "
                "holds every layer and epoch.", ["max_logit_vs_lr.png", "logit_growth.png"],
                ["logits.csv"]),
        Section("Variants", "", [], [variants_rows]),
        Section("Every run", "", [], ["results.csv"]),
    ]
    write_report(out, f"Learning-rate sensitivity against depth on {meta['dataset']} (width of {meta['base']})",
                 command, sections)
    return {"summary": per_lr, "sensitivity": sens,
            "figures": ["loss_vs_lr.png", "sensitivity_vs_depth.png", "max_logit_vs_lr.png", "logit_growth.png"]}
