"""The mechanism of the rate x depth study (docs/findings.md, section 10): what the trained models' tokens and
attention look like against depth, per arm, from phase 2's run records.

Each run's last epoch with probes in its ``metrics.jsonl`` (the ``probe/NAME/block{i}`` columns,
:func:`vitlab.analysis.probes.layer_columns`; docs/analysis.md): the token similarity, the uncentred effective rank
and the attention entropy at the last block, and the largest attention logit over all blocks. Per (arm, depth) the
median over the cell's seeds, once the cell (``depth_budget/ARM_depthD_seedN``) has its :data:`SEEDS` seeds: a cell
still training reads ``pending (k of 5 seeds)`` with no number, so no median comes from part of a cell. The figure
(probe against depth) is drawn once every cell of phase 2 (:data:`ARMS` at :data:`DEPTHS`) is complete.

    python scripts/probes_depth.py             # write docs/results/depth_budget/probes_depth.csv (and the figure)
    python scripts/probes_depth.py --check     # exit 1 when the CSV differs from the records

The figure (docs/figures/findings_budget_probes.png, once phase 2 is complete): a column per arm, a row per probe,
the depth on the log-2 axis of the depth studies (:func:`vitlab.plots.axes.depth_axis`).
"""

from __future__ import annotations

import csv
import io
import math
import statistics
import sys
from pathlib import Path
from typing import Any

if str(Path(__file__).resolve().parent) not in sys.path:  # verdicts and records_csv beside this script
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from records_csv import csv_main, csv_text  # noqa: E402
from verdicts import BUDGET_ARMS, BUDGET_NAMES, BUDGET_SEEDS, NoRuns, run_dirs  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "docs" / "results" / "runs"
OUT = ROOT / "docs" / "results" / "depth_budget" / "probes_depth.csv"
FIGURE = ROOT / "docs" / "figures" / "findings_budget_probes.png"
ARMS, DEPTHS, SEEDS = BUDGET_ARMS, (6, 12, 24), BUDGET_SEEDS
# (CSV column, probe, over the blocks: the last block's value or the maximum, axis label)
PROBES = (("token_similarity_last", "token_similarity", "last", "token similarity\n(last block)"),
          ("effective_rank_uncentred_last", "effective_rank_uncentred", "last", "effective rank,\nuncentred (last)"),
          ("attn_entropy_last", "attn_entropy", "last", "attention entropy\n(last block)"),
          ("max_logit_max", "max_logit", "max", "largest attention\nlogit (any block)"))
COLUMNS = ["variant", "depth", "seeds"] + [p[0] for p in PROBES] + ["status"]


def run_probes(run: Path) -> dict[str, float]:
    """One run's probes at its last epoch with probes: ``{column: value}`` of :data:`PROBES` (NaN where the run has
    no such probe)."""
    from vitlab.analysis.probes import layer_columns
    from vitlab.train.logging import read_metrics

    layers: dict[int, dict[str, Any]] = {}
    for row in read_metrics(run):
        found = layer_columns(row)
        if found:
            layers = found
    out = {}
    for column, probe, over, _ in PROBES:
        values = [(layer, float(v[probe])) for layer, v in sorted(layers.items())
                  if isinstance(v.get(probe), int | float) and math.isfinite(v[probe])]
        if not values:
            out[column] = math.nan
        elif over == "last":
            out[column] = values[-1][1] if values[-1][0] == max(layers) else math.nan
        else:
            out[column] = max(v for _, v in values)
    return out


def rows(runs: Path = RUNS) -> list[dict[str, str]]:
    """One row per arm and depth: the seeds finished and, once the cell has its :data:`SEEDS` seeds, each probe's
    median over them."""
    per_cell: dict[tuple[str, int], list[dict[str, float]]] = {}
    for arm in ARMS:
        for depth in DEPTHS:
            try:
                per_cell[(arm, depth)] = [run_probes(r) for r in run_dirs(f"depth_budget/{arm}_depth{depth}", runs)]
            except NoRuns:
                per_cell[(arm, depth)] = []
    out = []
    for (arm, depth), found in per_cell.items():
        complete = len(found) >= SEEDS
        row = {"variant": arm, "depth": str(depth), "seeds": f"{len(found)}/{SEEDS}",
               "status": "complete" if complete else f"pending ({len(found)} of {SEEDS} seeds)"}
        for column, *_ in PROBES:
            finite = [p[column] for p in found if math.isfinite(p[column])]
            row[column] = f"{statistics.median(finite):.6g}" if complete and finite else ""
        out.append(row)
    return out


def table(runs: Path = RUNS) -> str:
    """The probes CSV text."""
    return csv_text(COLUMNS, rows(runs))


def figure(text: str, path: Path = FIGURE) -> Path | None:
    """Draw the probes CSV ``text`` (a column per arm, a row per probe, median against depth); None, and nothing
    drawn, while a cell of phase 2 is pending."""
    table_rows = list(csv.DictReader(io.StringIO(text)))
    if not table_rows or any(r["status"] != "complete" for r in table_rows):
        return None
    from vitlab.plots.axes import depth_axis
    from vitlab.plots.figure import new_figure, save

    fig = new_figure(2.3 * len(ARMS), 1.9 * len(PROBES))
    axes = fig.subplots(len(PROBES), len(ARMS), sharex=True, sharey="row", squeeze=False)
    for j, arm in enumerate(ARMS):
        mine = sorted((r for r in table_rows if r["variant"] == arm), key=lambda r: int(r["depth"]))
        for i, (column, _, _, label) in enumerate(PROBES):
            ax = axes[i][j]
            points = [(int(r["depth"]), float(r[column])) for r in mine if r[column]]
            ax.plot([d for d, _ in points], [v for _, v in points], "o-", color="#222222")
            depth_axis(ax, list(DEPTHS), "depth (blocks)" if i == len(PROBES) - 1 else "")
            if i == 0:
                ax.set_title(BUDGET_NAMES[arm][1])
            if j == 0:
                ax.set_ylabel(label, fontsize=8)
    fig.suptitle(f"Probes at convergence against depth, median over {SEEDS} seeds (section 10, phase 2)")
    return save(fig, path)


def _written(text: str) -> str:
    drawn = figure(text)
    return f"{text.count(chr(10)) - 1} cells; " + (f"figure {drawn}" if drawn else "no figure: phase 2 is pending")


def main(argv: list[str] | None = None) -> int:
    OUT.parent.mkdir(parents=True, exist_ok=True)
    return csv_main(argv, description=__doc__.split("\n")[0], table=table, runs=RUNS, out=OUT, what="probes CSV",
                    script="probes_depth.py", written=_written)


if __name__ == "__main__":
    raise SystemExit(main())
