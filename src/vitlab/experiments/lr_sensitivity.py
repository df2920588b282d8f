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

Bracketing (``--bracket N``, :func:`next_rate`): a cell whose best rate is the lowest or highest of its rates may
have its optimum beyond the grid. Once every run of its curve finished, such a cell gets the next rate beyond that
edge (the edge divided or multiplied by the grid's own step there), for all its seeds, until its best rate is
interior, ``N`` rates were added on that side, or the next rate is not one a run can train at. The rule is applied
as each run ends (:func:`bracket_follow`), so an extension trains in the same worker pool, ahead of the grid's runs
still queued, instead of waiting for the whole grid. The expectation stays over the
shared grid (``--lrs``: every cell's sensitivity is a mean over one range), the minimum is over the cell's whole
curve. The rates a study adds follow from its finished runs alone, so the same command re-derives them and resumes;
an invocation without ``--bracket`` plans (and tabulates) the grid alone.

Nothing is chosen on the test set: the best learning rate is the one with the lowest validation loss, and the
test accuracy is reported at it.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vitlab.errors import ConfigError
from vitlab.experiments.depth_study import DESCRIPTIONS, VARIANT_RUN, depth_specs, grid_run_name
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
            name = grid_run_name(info["variant"], info["depth"], lr, info["seed"])
            specs.append(RunSpec(name, s.config, info))
    return sorted(specs, key=spec_order(variants))


def spec_order(variants: list[str]) -> Callable[[RunSpec], tuple]:
    """The order of :func:`lr_specs` (seed, deepest first, ``variants``' order, rate) as a sort key: the order of
    the study's tables whatever order its runs trained in (``--bracket`` adds rates as cells complete)."""
    order = {v: i for i, v in enumerate(variants)}
    return lambda s: (s.info["seed"], -s.info["depth"], order[s.info["variant"]], s.info["lr"])


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
    """``{(variant, depth): {seed: sensitivity}}``: :func:`lr_sensitivity` with ``grid=lrs`` (the study's shared
    rates) for every seed that finished every rate of ``lrs`` and of its cell's whole curve (every rate a run of the
    cell in ``rows`` has, failed or not: the rates added beyond the grid's edge too)."""
    curves: dict[tuple, dict[int, dict[float, float]]] = {}
    rates: dict[tuple, set[float]] = {}
    for r in rows:
        key = (r["variant"], r["depth"])
        rates.setdefault(key, set()).add(r["lr"])
        if not r.get("failed"):
            curves.setdefault(key, {}).setdefault(r["seed"], {})[r["lr"]] = capped_loss(r, l0)
    return {key: {seed: lr_sensitivity(c, lrs) for seed, c in sorted(by_seed.items())
                  if set(c) >= set(lrs) | rates[key]}
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
    """sensitivity.csv: per variant and depth, the range of its rates (``lr_low``, ``lr_high``: the grid and any
    rate added beyond its edge), the best learning rate over them (lowest mean capped validation loss, ties to the
    lower rate), whether it is ``bracketed`` (interior: a rate on either side is worse), its loss, validation and
    test accuracy, the LR sensitivity over the grid (the mean over seeds of each seed's :func:`lr_sensitivity`,
    ``per_seed`` from :func:`seed_sensitivities`; ``seeds``: how many seeds it counts, those that finished every rate
    of the cell's curve; ``lr_sensitivity_std``: their sample standard deviation, NaN below two), the share of runs
    that diverged, and the largest attention logit of any run. A (variant, depth) with no seed that finished every
    learning rate of its curve (runs not finished yet) gets NaN sensitivity: the mean would be over another range."""
    groups: dict[tuple, list[dict]] = {}
    for a in lr_rows:
        groups.setdefault((a["variant"], a["depth"]), []).append(a)
    out = []
    for (variant, depth), members in groups.items():
        best = min(members, key=lambda a: (a["capped_loss_mean"], a["lr"]))
        low, high = min(a["lr"] for a in members), max(a["lr"] for a in members)
        seeds = per_seed.get((variant, depth), {})
        runs = sum(a["n"] for a in members)
        logits = [a["max_logit_mean"] for a in members if _finite(a["max_logit_mean"])]
        out.append({
            "variant": variant, "depth": depth, "lrs": len(members), "lr_low": low, "lr_high": high, "runs": runs,
            "best_lr": best["lr"], "bracketed": low < best["lr"] < high, "best_val_loss": best["capped_loss_mean"],
            "best_val_acc": best["val_acc_mean"], "test_acc_at_best_lr": best["test_acc_mean"],
            "lr_sensitivity": sum(seeds.values()) / len(seeds) if seeds else math.nan, "seeds": len(seeds),
            "lr_sensitivity_std": statistics.stdev(seeds.values()) if len(seeds) > 1 else math.nan,
            "divergence_rate": sum(a["diverged"] for a in members) / runs if runs else math.nan,
            "max_logit": max(logits) if logits else math.nan,
        })
    return sorted(out, key=lambda a: (a["variant"], a["depth"]))


def clean_rate(lr: float) -> float:
    """A rate rounded to 6 significant digits (as :func:`lr_name` writes it), so that a rate computed as the edge
    times the grid's step names the same run folder in every invocation."""
    return float(f"{lr:.6g}")


def cell_curves(rows: list[dict[str, Any]], l0: float, seeds: Iterable[int]) -> dict[tuple, dict[float, float] | None]:
    """``{(variant, depth): {lr: mean capped loss over seeds}}`` per cell of ``rows`` (results.csv's rows: variant,
    depth, lr, seed, val_loss, diverged, failed); None for a cell where some seed of ``seeds`` has not finished some
    rate of the cell (a failed run, or one not read back): its best rate is not settled yet."""
    seeds = set(seeds)
    losses: dict[tuple, dict[float, dict[int, float]]] = {}
    for r in rows:
        at = losses.setdefault((r["variant"], r["depth"]), {}).setdefault(r["lr"], {})
        if not r.get("failed"):
            at[r["seed"]] = capped_loss(r, l0)
    return {key: ({lr: sum(by_seed.values()) / len(by_seed) for lr, by_seed in curve.items()}
                  if all(set(by_seed) >= seeds for by_seed in curve.values()) else None)
            for key, curve in losses.items()}


def next_rate(curve: dict[float, float], grid: Iterable[float], limit: int,
              check: Callable[[float], None] | None = None) -> tuple[float | None, str]:
    """The extension rule of ``--bracket limit`` for one cell: ``(rate to add, "")``, or ``(None, why not)``.

    ``curve`` is the cell's mean capped loss per rate (every seed finished every rate), ``grid`` the study's shared
    rates. The best rate is the lowest loss, ties to the lower rate. When it is the lowest (highest) of the curve,
    the next rate is that edge divided (multiplied) by the grid's own step at that edge, ``r2 / r1`` (``rn /
    r(n-1)``), rounded by :func:`clean_rate`; none when the best is interior, when ``limit`` rates beyond the grid
    are already on that side, or when ``check(rate)`` (the run config's validation) raises :class:`ConfigError`."""
    grid = sorted(grid)
    rates = sorted(curve)
    best = min(rates, key=lambda lr: (curve[lr], lr))
    if rates[0] < best < rates[-1]:
        return None, ""
    if best == rates[0]:
        side, added, edge = "low", sum(lr < grid[0] for lr in rates), rates[0]
        step = grid[1] / grid[0]
        rate = clean_rate(edge / step)
    else:
        side, added, edge = "high", sum(lr > grid[-1] for lr in rates), rates[-1]
        step = grid[-1] / grid[-2]
        rate = clean_rate(edge * step)
    where = f"best rate {best:g} is the {'lowest' if side == 'low' else 'highest'} of its rates"
    if added >= limit:
        return None, (f"{where}; --bracket {limit} adds no further rate on that side" if limit else
                      f"{where}; --bracket N adds rates beyond it")
    if rate in curve or rate == edge:
        return None, f"{where}; the grid's step {step:g} rounds the next rate back onto {edge:g}"
    try:
        if check is not None:
            check(rate)
    except ConfigError as exc:
        return None, f"{where}; the next rate {rate:g} is not one a run can train at ({str(exc).split('; ')[0]})"
    return rate, ""


UNFINISHED = "not every run of its rates finished, so no rate was added beyond them"


def extensions(rows: list[dict[str, Any]], l0: float, grid: Iterable[float], seeds: Iterable[int], limit: int,
               check: Callable[[float], None] | None = None) -> tuple[list[tuple[str, int, float]], dict[tuple, str]]:
    """One round of ``--bracket limit`` over every cell of ``rows``: the ``(variant, depth, rate)`` to add (for
    every seed of the cell), and per cell not extended now a note: why it stops (:func:`next_rate`; empty when its
    best rate is interior), or that a run of it has not finished."""
    grid = sorted(grid)
    adds, notes = [], {}
    for key, curve in sorted(cell_curves(rows, l0, seeds).items()):
        if curve is None:
            notes[key] = UNFINISHED
            continue
        rate, why = next_rate(curve, grid, limit, check)
        if rate is None:
            notes[key] = why
        else:
            adds.append((*key, rate))
    return adds, notes


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
    bracket: int = 0  # rates a cell may add beyond each edge of the grid while its best rate is on that edge
    diagnose: bool = False  # write the depth study's diagnostics into every finished run that has its weights


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
    if config.bracket < 0:
        raise ConfigError(f"--bracket must be >= 0 (rates added beyond each edge of the grid), got {config.bracket}")
    if not config.probe_images:
        raise ConfigError("--probe-images 0 would record no attention logit over training; pass --probe-images N "
                          "(e.g. 64)")
    if (config.run.val_split or 0) <= 0:
        raise ConfigError("the learning-rate sensitivity compares validation losses; pass --val-split F (e.g. 0.1) "
                          "so that no learning rate is chosen on the test set")


def lr_run_specs(config: LRSensitivityConfig) -> list[RunSpec]:
    """The grid's runs of ``config``, checked (what :func:`run_lr_sensitivity` trains first; ``--dry-run`` plans
    these and the rates :func:`planned_runs` adds)."""
    check_lr_sensitivity(config)
    cfg = config.run.replace(probe_images=config.probe_images)
    return lr_specs(config.base, sorted(config.depths), config.variants, sorted(config.lrs),
                    list(range(config.seeds)), cfg, config.shared)


Pairs = list[tuple[RunSpec, dict]]


def _loss_row(spec: RunSpec, summary: dict) -> dict[str, Any]:
    """What the extension rule reads of a run: its cell, rate, seed, final validation loss, diverged, failed."""
    return {**{k: spec.info[k] for k in ("variant", "depth", "lr", "seed")},
            "val_loss": summary_value(summary, "final_val_loss"), "diverged": diverged(summary),
            "failed": failed(summary)}


def _extension_runs(config: LRSensitivityConfig, pairs: Pairs, l0: float,
                    planned: set[str]) -> tuple[list[RunSpec], dict[tuple, str]]:
    """One step of ``--bracket``: the runs :func:`extensions` adds over ``pairs`` (a run not finished has a
    ``failed`` summary, so its cell waits) that are not in ``planned``, and the note per cell not extended."""
    cfg = config.run.replace(probe_images=config.probe_images)
    seeds = list(range(config.seeds))
    adds, notes = extensions([_loss_row(s, summary) for s, summary in pairs], l0, config.lrs, seeds, config.bracket,
                             lambda lr: config.run.replace(lr=lr).validate())
    new = [spec for variant, depth, lr in adds
           for spec in lr_specs(config.base, [depth], [variant], [lr], seeds, cfg, config.shared)
           if spec.name not in planned]
    return new, notes


def _say_added(config: LRSensitivityConfig, new: list[RunSpec], verb: str = "adding") -> None:
    """The stderr line naming the runs ``--bracket`` adds beyond a cell's edge."""
    import sys

    cells = sorted({f"{s.info['variant']} at depth {s.info['depth']} at lr {lr_name(s.info['lr'])}" for s in new})
    print(f"lr sensitivity --bracket {config.bracket}: best rate on the edge of its rates; {verb} {len(new)} run(s) "
          f"beyond it: {', '.join(cells)}", file=sys.stderr, flush=True)


def bracket_rounds(config: LRSensitivityConfig, pairs: Pairs, l0: float,
                   read: Callable[[list[RunSpec]], Pairs]) -> tuple[list[RunSpec], Pairs, dict[tuple, str]]:
    """``--bracket``'s rounds after the grid's ``pairs``: each round :func:`extensions` of every run read so far,
    the new runs handed to ``read`` (which trains or reads back those it can and returns their pairs), until a round
    adds no run not planned before (every cell settled; a rate a run of which did not finish stops its cell).
    Returns the runs planned beyond the grid, every pair, and the last round's note per cell."""
    planned = {spec.name for spec, _ in pairs}
    added: list[RunSpec] = []
    pairs = list(pairs)
    while True:
        new, notes = _extension_runs(config, pairs, l0, planned)
        if not new:
            return added, pairs, notes
        planned.update(spec.name for spec in new)
        added += new
        pairs += read(new)


def bracket_follow(config: LRSensitivityConfig, specs: list[RunSpec],
                   out: Path) -> Callable[[dict[str, dict]], list[RunSpec]]:
    """``--bracket``'s rule while the study runs (``run_study``'s ``follow``): given the summaries so far, the runs
    :func:`extensions` adds for every cell whose runs have all finished, at once, so that a cell's next rate trains
    as soon as its curve is complete instead of after the whole grid (no worker waits for a round). Each run is
    returned once; a cell with a run not finished yet (or failed) waits."""
    planned = list(specs)
    names = {spec.name for spec in planned}

    def follow(summaries: dict[str, dict]) -> list[RunSpec]:
        pairs = [(s, summaries.get(s.name) or {"failed": "not finished yet"}) for s in planned]
        try:
            l0 = math.log(_num_classes(config.run.dataset, out, pairs))
        except ConfigError:  # an unknown data set's classes: known once a run has finished
            return []
        new, _ = _extension_runs(config, pairs, l0, names)
        if new:
            planned.extend(new)
            names.update(spec.name for spec in new)
            _say_added(config, new)
        return new

    return follow


def planned_runs(config: LRSensitivityConfig) -> tuple[list[RunSpec], list[str]]:
    """What ``--dry-run`` plans: the grid's runs, then (``--bracket N``) the runs beyond the grid's edge that the
    finished runs in ``config.output`` already determine; and the lines that say what is decided later. Reads the
    folder, writes nothing."""
    from vitlab.experiments.record import finished_run

    specs = lr_run_specs(config)
    if not config.bracket:
        return specs, []
    out = Path(config.output).expanduser()

    def read(new: list[RunSpec]) -> Pairs:  # a run not finished yet keeps its cell's next rate undecided
        return [(spec, finished_run(out / spec.name, spec.config) or {"failed": "not finished yet"}) for spec in new]

    pairs = read(specs)
    added: list[RunSpec] = []
    notes: dict[tuple, str] = {}
    if any(not failed(summary) for _, summary in pairs):
        l0 = math.log(_num_classes(config.run.dataset, out, pairs))
        added, pairs, notes = bracket_rounds(config, pairs, l0, read)
    cells = len(config.variants) * len(config.depths)
    open_cells = cells - sum(1 for note in notes.values() if note != UNFINISHED)  # the rest: runs still to finish
    lines = [f"lr sensitivity --bracket {config.bracket}: {len(added)} run(s) beyond the grid's edge follow from "
             f"the finished runs (listed above)"]
    if open_cells:
        lines.append(f"lr sensitivity --bracket {config.bracket}: further rates are decided only after the grid's "
                     f"runs finish: {open_cells} of {cells} cells may each add up to {config.bracket} rate(s) beyond "
                     "the edge where their best rate lies")
    else:
        lines.append(f"lr sensitivity --bracket {config.bracket}: every cell's rates are settled")
    return [*specs, *added], lines


def run_lr_sensitivity(config: LRSensitivityConfig) -> dict[str, Any]:
    """Train (or read back) every run of the grid, then (``--bracket N``) the rates :func:`bracket_rounds` adds
    beyond its edges, and write results.csv, summary.csv, sensitivity.csv, logits.csv, the figures, summary.json
    and index.html into ``config.output`` (``--diagnose``: also each run's diagnostics.json,
    :func:`vitlab.experiments.depth_study.diagnose_runs`). Returns those tables, the pairs, and ``notes``: per
    cell whose best rate is not interior, why no further rate was added."""

    from vitlab.experiments.record import finished_run
    from vitlab.experiments.runs import run_study

    specs = lr_run_specs(config)
    depths, lrs = sorted(config.depths), sorted(config.lrs)
    cfg = config.run.replace(probe_images=config.probe_images)
    options = {"force": config.force, "command": config.command, "title": "lr sensitivity",
               "finished_only": config.finished_only, "executor": config.executor}
    # --bracket: a cell's next rate trains as soon as its curve is complete (bracket_follow); the rounds after it
    # find nothing left unless a run failed (finished_only: the rounds read back what earlier invocations added)
    follow = (bracket_follow(config, specs, Path(config.output).expanduser())
              if config.bracket and not config.finished_only else None)
    out, pairs = run_study(specs, config.output, "lr-sensitivity", **options, follow=follow)
    l0 = math.log(_num_classes(cfg.dataset, out, pairs))

    def read(new: list[RunSpec]) -> Pairs:
        if config.finished_only:
            new = [spec for spec in new if finished_run(out / spec.name, spec.config) is not None]
        if not new:
            return []
        _say_added(config, new, "reading back" if config.finished_only else "adding")
        return run_study(new, out, "lr-sensitivity", **options)[1]

    notes: dict[tuple, str] = {}
    if config.bracket:
        _, pairs, notes = bracket_rounds(config, pairs, l0, read)
    rows, logits = [], []
    key = spec_order(config.variants)
    pairs = sorted(pairs, key=lambda pair: key(pair[0]))
    for spec, summary in pairs:
        row, layers = result_row(spec, summary, out / spec.name)
        rows.append(row)
        logits += layers
    meta = {"base": config.base, "dataset": cfg.dataset, "depths": depths, "variants": config.variants, "lrs": lrs,
            "bracket": config.bracket, "seeds": config.seeds, "uniform_loss": l0, "run_config": cfg.to_dict()}
    result = write_study(out, rows, logits, meta, command=config.command)
    if config.diagnose:  # so that `depth-study --lr-from` can copy a run whose record was kept without weights
        from vitlab.experiments.depth_study import diagnose_runs
        from vitlab.models import get_config

        diagnose_runs(pairs, out, cfg.dataset, cfg.data_dir, get_config(config.base))
    if not config.bracket:
        _, notes = extensions(rows, l0, lrs, range(config.seeds), 0)
    return {**result, "out": out, "pairs": pairs, "notes": notes}


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
        Section("LR sensitivity, best loss and divergence against depth", "LR sensitivity (Wortsman et al. 2023), "
                "per seed, then the mean over seeds: the mean over the grid (--lrs) of min(loss, ln(classes)) minus "
                "the best loss over every rate of the cell (the grid and any rate --bracket added beyond its edge), "
                "with its sample standard deviation over the seeds counted (seeds: those that finished every rate); "
                "the best learning rate is chosen on the validation loss, and the test accuracy is the one at it; "
                "bracketed: the best rate is interior of the cell's rates (lr_low..lr_high).",
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
