"""Did the proxies predict the rate x depth study (docs/findings.md, section 10)? Spearman's rank correlation
between a short proxy's answer and the study's converged one, over the (arm, depth) cells both have, with a 95 %
bootstrap interval over cells.

The proxies: section 7 (168 steps on mnist-5k's digits: ``docs/results/lr_sensitivity/sensitivity.csv``, per
variant and depth ``test_acc_at_best_lr`` and ``best_lr``) and section 8 (3 epochs of the full Fashion-MNIST at
section 7's rates: ``docs/results/depth_fashion/summary.csv``, ``test_acc_mean``; it chose no rate of its own). The
study, from its run records (``docs/results/runs/``): phase 2's median test accuracy over a cell's seeds
(``depth_budget/ARM_depthD_seedN``) and phase 1's best rate (``depth_budget_grid``: the lowest mean capped final
validation loss, the rule of ``vitlab lr-sensitivity``; ``scripts/verdicts.py``'s :func:`best_lr`). The cells are
those of :data:`CELLS` a proxy has: ``vit``, ``layerscale``, ``cait`` and ``deepvit`` at 6, 12 and 24 blocks (section
8: ``vit`` and ``layerscale``).

A row reads ``pending (k of n cells finished)`` with empty numbers until every cell has finished: in phase 2, its
:data:`SEEDS` seeds; in phase 1, every rate of the design's grid (:data:`GRID`) with the best rate inside the cell's
rates (bracketed). The interval is scipy.stats.bootstrap's, paired over cells (a resampled cell keeps both its
values), :data:`RESAMPLES` resamples from a fixed seed, by the percentile method (BCa's acceleration is a jackknife
over cells, undefined whenever a leave-one-out set of the discrete rates is constant); a resample in which one side is
constant has no rank correlation and is left out of the percentiles (the method column counts them).

    python scripts/proxy_rank.py               # write docs/results/depth_budget/proxy.csv
    python scripts/proxy_rank.py --check       # exit 1 when the CSV differs from the records
"""

from __future__ import annotations

import csv
import statistics
import sys
import warnings
from pathlib import Path

import numpy as np

if str(Path(__file__).resolve().parent) not in sys.path:  # verdicts and records_csv beside this script
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from records_csv import csv_main, csv_text  # noqa: E402
from verdicts import BUDGET_SEEDS, NoRuns, arm_values, best_lr, study_losses  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
RUNS = RESULTS / "runs"
OUT = RESULTS / "depth_budget" / "proxy.csv"
COLUMNS = ["proxy", "what", "cells", "spearman", "ci_low", "ci_high", "method", "status"]
CELLS = tuple((v, d) for v in ("vit", "layerscale", "cait", "deepvit") for d in (6, 12, 24))
GRID = (5e-4, 1e-3, 2e-3, 4e-3, 8e-3)  # phase 1's --lrs (section 10's design)
SEEDS = BUDGET_SEEDS  # phase 2's seeds per cell
RESAMPLES, RNG_SEED = 9999, 0
# (name, CSV under docs/results, accuracy column, rate column or None when the proxy chose no rate)
PROXIES = (("section 7: 168 steps on mnist-5k", "lr_sensitivity/sensitivity.csv", "test_acc_at_best_lr", "best_lr"),
           ("section 8: 3 epochs of Fashion-MNIST", "depth_fashion/summary.csv", "test_acc_mean", None))
WHAT = {"accuracy": "ranking of cells by accuracy: the proxy's test accuracy against phase 2's median test accuracy",
        "rate": "chosen rates: the proxy's best rate against phase 1's best rate"}


def spearman_rows(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    """Spearman's rank correlation along ``axis`` (the Pearson correlation of the average ranks, as
    scipy.stats.spearmanr), vectorised for scipy.stats.bootstrap; NaN where a side is constant."""
    from scipy.stats import rankdata

    rx, ry = rankdata(x, axis=axis), rankdata(y, axis=axis)
    rx = rx - rx.mean(axis=axis, keepdims=True)
    ry = ry - ry.mean(axis=axis, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        r = (rx * ry).sum(axis=axis) / np.sqrt((rx * rx).sum(axis=axis) * (ry * ry).sum(axis=axis))
    return np.clip(r, -1.0, 1.0)


def spearman_interval(x: list[float], y: list[float], resamples: int = RESAMPLES,
                      seed: int = RNG_SEED) -> tuple[float, float, float, int]:
    """``(rho, low, high, undefined)``: scipy.stats.spearmanr's rho of the paired values and the 95 % percentile
    bootstrap interval over the pairs (scipy.stats.bootstrap, ``paired=True``, ``rng=seed``), leaving out the
    ``undefined`` resamples in which one side is constant."""
    from scipy import stats

    xs, ys = np.asarray(x, float), np.asarray(y, float)
    with warnings.catch_warnings():  # a constant side: spearmanr warns and gives NaN
        warnings.simplefilter("ignore")
        rho = float(stats.spearmanr(xs, ys).statistic)
        res = stats.bootstrap((xs, ys), spearman_rows, paired=True, vectorized=True, n_resamples=resamples,
                              confidence_level=0.95, method="percentile", rng=np.random.default_rng(seed))
    dist = np.asarray(res.bootstrap_distribution)
    undefined = int(np.isnan(dist).sum())
    if undefined == len(dist):
        return rho, float("nan"), float("nan"), undefined
    low, high = np.nanpercentile(dist, [2.5, 97.5])
    return rho, float(low), float(high), undefined


def proxy_values(path: Path, column: str) -> dict[tuple[str, int], float]:
    """``{(variant, depth): value}`` of a proxy's CSV."""
    with path.open(newline="") as f:
        return {(r["variant"], int(r["depth"])): float(r[column]) for r in csv.DictReader(f)}


def phase2_accuracy(runs: Path) -> dict[tuple[str, int], float]:
    """``{cell: median test accuracy in points over its seeds}`` of the phase-2 cells that have all their seeds."""
    out = {}
    for v, d in CELLS:
        try:
            acc = arm_values(f"depth_budget/{v}_depth{d}", "acc", runs)
        except NoRuns:
            continue
        if len(acc) >= SEEDS:
            out[(v, d)] = statistics.median(acc.values())
    return out


def phase1_rates(runs: Path) -> dict[tuple[str, int], float]:
    """``{cell: best rate}`` of the phase-1 cells that ran every rate of :data:`GRID` and whose best rate (lowest mean
    capped final validation loss) lies inside their rates, not on an edge."""
    try:
        cells = study_losses(runs / "depth_budget_grid")
    except NoRuns:
        return {}
    out = {}
    for v, d in CELLS:
        losses = cells.get(f"{v}_depth{d}")
        if not losses or not set(GRID) <= set(losses):
            continue
        best = best_lr(runs / "depth_budget_grid", f"{v}_depth{d}")
        if min(losses) < best < max(losses):
            out[(v, d)] = best
    return out


def rows(runs: Path = RUNS, results: Path = RESULTS) -> list[dict[str, str]]:
    """One row per proxy and what it is compared on (accuracy ranking, chosen rate)."""
    study = {"accuracy": phase2_accuracy(runs), "rate": phase1_rates(runs)}
    out = []
    for name, source, acc_column, rate_column in PROXIES:
        for what, column in (("accuracy", acc_column), ("rate", rate_column)):
            row = {"proxy": name, "what": WHAT[what], "cells": "", "spearman": "", "ci_low": "", "ci_high": "",
                   "method": "", "status": ""}
            out.append(row)
            if column is None:
                row["status"] = "not applicable: the proxy trained each cell at section 7's rate"
                continue
            if not (results / source).is_file():
                row["status"] = f"no docs/results/{source}"
                continue
            proxy = proxy_values(results / source, column)
            cells = [c for c in CELLS if c in proxy]
            done = [c for c in cells if c in study[what]]
            row["cells"] = str(len(cells))
            if len(done) < len(cells):
                phase = "phase 2" if what == "accuracy" else "phase 1"
                row["status"] = f"pending ({len(done)} of {len(cells)} cells finished in {phase})"
                continue
            rho, low, high, undefined = spearman_interval([proxy[c] for c in cells], [study[what][c] for c in cells])
            row.update(spearman=f"{rho:.3f}", ci_low=f"{low:.3f}", ci_high=f"{high:.3f}", status="complete",
                       method=f"spearmanr; 95 % percentile bootstrap over cells, paired, {RESAMPLES} resamples, "
                              f"rng {RNG_SEED}" + (f", {undefined} constant resamples left out" if undefined else ""))
    return out


def table(runs: Path = RUNS, results: Path = RESULTS) -> str:
    """The proxy CSV text."""
    return csv_text(COLUMNS, rows(runs, results))


def main(argv: list[str] | None = None) -> int:
    OUT.parent.mkdir(parents=True, exist_ok=True)
    return csv_main(argv, description=__doc__.split("\n")[0], table=table, runs=RUNS, out=OUT, what="proxy CSV",
                    script="proxy_rank.py", written=lambda text: f"{text.count(chr(10)) - 1} rows")


if __name__ == "__main__":
    raise SystemExit(main())
