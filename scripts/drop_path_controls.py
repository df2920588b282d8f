"""The drop-path controls of the rate x depth study (docs/findings.md, section 10, phase 4): the best arm at 24 blocks
trained without stochastic depth (phase 2's runs), with drop-path 0.1 at every block (uniform) and with 0.1 growing
linearly with depth (Huang et al. 2016's rule, as DeiT and CaiT use it), side by side, from the kept run records.

The arm is ``verdicts.best_arm``'s, chosen on phase 2's validation accuracy and never on the test set. Per setting: the
seeds finished and, once it has its :data:`SEEDS` seeds, the median test and validation accuracy over them (the test
set read once per run, at its end), the mean and sample standard deviation of the test accuracy, and the probes at
convergence of :mod:`probes_depth` (the last block's token similarity, the largest attention logit of any block);
a setting still training reads ``pending (k of 5 seeds)`` with no number, so no median comes from part of a setting.
The comparisons themselves (equivalence within 0.5 points, by paired TOST over the seeds) are verdicts.py's rows.

    python scripts/drop_path_controls.py           # write docs/results/depth_budget/drop_path.csv
    python scripts/drop_path_controls.py --check   # exit 1 when the CSV differs from the records
"""

from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path

if str(Path(__file__).resolve().parent) not in sys.path:  # verdicts and records_csv beside this script
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from probes_depth import run_probes  # noqa: E402
from records_csv import csv_main, csv_text  # noqa: E402
from verdicts import BUDGET_NAMES, BUDGET_SEEDS, NoRuns, arm_values, best_arm, run_dirs  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "docs" / "results" / "runs"
OUT = ROOT / "docs" / "results" / "depth_budget" / "drop_path.csv"
SEEDS, DEPTH = BUDGET_SEEDS, 24
# (drop-path rate, rule, the study folder its runs are in): phase 2's runs have none
SETTINGS = ((0.0, "none", "depth_budget"), (0.1, "uniform", "depth_budget_dp_uniform"),
            (0.1, "linear", "depth_budget_dp_linear"))
NUMBERS = ["test_acc_median", "test_acc_mean", "test_acc_sd", "val_acc_median", "token_similarity_last",
           "max_logit_max"]
COLUMNS = ["arm", "drop_path", "rule", "runs", "seeds"] + NUMBERS + ["status"]


def _values(cell: str, what: str, runs: Path) -> dict[int, float]:
    try:
        return arm_values(cell, what, runs)
    except NoRuns:
        return {}


def rows(runs: Path = RUNS) -> list[dict[str, str]]:
    """One row per drop-path setting of the best arm at 24 blocks; no arm and every setting pending until
    ``best_arm`` has chosen one (phase 2's 24-block cells all finished)."""
    arm = best_arm(runs)
    out = []
    for rate, rule, study in SETTINGS:
        cell = f"{study}/{arm}_depth{DEPTH}"
        row = {"arm": BUDGET_NAMES[arm][1] if arm else "", "drop_path": f"{rate:g}", "rule": rule,
               "runs": cell if arm else f"{study}/(the best arm)_depth{DEPTH}", **{k: "" for k in NUMBERS}}
        if arm is None:
            out.append({**row, "seeds": f"0/{SEEDS}", "status": "pending (the best arm is chosen when phase 2 ends)"})
            continue
        test = _values(cell, "acc", runs)  # points
        val = _values(cell, "final_val_acc", runs)
        complete = len(test) >= SEEDS
        row.update(seeds=f"{len(test)}/{SEEDS}",
                   status="complete" if complete else f"pending ({len(test)} of {SEEDS} seeds)")
        if complete:
            probes = [run_probes(r) for r in run_dirs(cell, runs)]
            row.update(test_acc_median=f"{statistics.median(test.values()):.6g}",
                       test_acc_mean=f"{statistics.fmean(test.values()):.6g}",
                       test_acc_sd=f"{statistics.stdev(test.values()):.6g}",
                       val_acc_median=f"{100 * statistics.median(val.values()):.6g}")
            for column in ("token_similarity_last", "max_logit_max"):
                finite = [p[column] for p in probes if math.isfinite(p[column])]
                row[column] = f"{statistics.median(finite):.6g}" if finite else ""
        out.append(row)
    return out


def table(runs: Path = RUNS) -> str:
    """The drop-path controls CSV text."""
    return csv_text(COLUMNS, rows(runs))


def main(argv: list[str] | None = None) -> int:
    OUT.parent.mkdir(parents=True, exist_ok=True)
    return csv_main(argv, description=__doc__.split("\n")[0], table=table, runs=RUNS, out=OUT,
                    what="drop-path controls CSV", script="drop_path_controls.py",
                    written=lambda text: f"{text.count(chr(10)) - 1} settings")


if __name__ == "__main__":
    raise SystemExit(main())
