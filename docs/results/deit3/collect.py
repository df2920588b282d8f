"""Collect the runs of the DeiT III / default recipe comparison (docs/training.md) into runs.csv and summary.json.

Usage: python docs/results/deit3/collect.py RUNS_DIR OUT_DIR, where RUNS_DIR holds one folder per run named
RECIPE-N with vitlab's summary.json and config.json; finished runs only.
"""

from __future__ import annotations

import csv
import json
import statistics
import sys
from pathlib import Path


def main(runs: Path, out: Path) -> None:
    rows = []
    for folder in sorted(p for p in runs.iterdir() if (p / "summary.json").is_file()):
        summary = json.loads((folder / "summary.json").read_text())
        run = json.loads((folder / "config.json").read_text())["run"]
        rows.append({"recipe": run.get("recipe", "default"), "seed": run["seed"], "epochs": summary["epochs"],
                     "final_test_acc": summary["final_test_acc"], "best_test_acc": summary["best_test_acc"],
                     "wall_time_s": round(summary["wall_time_s"], 1)})
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "runs.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    medians = {recipe: {"runs": len(accs), "median_final_test_acc": statistics.median(accs)}
               for recipe in sorted({r["recipe"] for r in rows})
               for accs in [[r["final_test_acc"] for r in rows if r["recipe"] == recipe]]}
    (out / "summary.json").write_text(json.dumps(medians, indent=2) + "\n")
    print(json.dumps(medians, indent=2))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
