"""Registers against none in the depth study's probes (``effect``: with registers minus without): artifact
tokens and the attention they and the registers receive, per depth,
with Welch's interval (vitlab.analysis.stats) over the seeds.

    python docs/results/registers/compare.py STUDY_REG0 STUDY_REG4 docs/results/registers
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

from vitlab.analysis.stats import verdict, welch

MEASURES = ("test_acc", "probe_artifacts", "probe_artifact_mass", "probe_register_mass", "probe_max_logit")
# Darcet et al. 2024: registers take over the artifacts' role, so fewer high-norm tokens draw less attention; the
# verdict is signed so that a reduction reproduces it (no claim for the other measures: no verdict)
CLAIMED_LOWER = ("probe_artifacts", "probe_artifact_mass")


def rows(study: Path) -> list[dict]:
    with open(study / "results.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def main(reg0: str, reg4: str, out: str) -> None:
    a, b = rows(Path(reg0)), rows(Path(reg4))
    table = []
    for depth in sorted({int(r["depth"]) for r in a}):
        for m in MEASURES:
            x = [float(r[m]) for r in b if int(r["depth"]) == depth]  # with registers
            y = [float(r[m]) for r in a if int(r["depth"]) == depth]  # without
            row = {"depth": depth, "measure": m, "with_registers": sum(x) / len(x),
                   "without": sum(y) / len(y) if y else float("nan"), "seeds": len(x)}
            if all(v == v for v in x + y):
                c = welch(x, y)
                row.update(effect=c.effect, ci_low=c.ci_low, ci_high=c.ci_high, p=c.p,
                           verdict=verdict(-c.ci_high, -c.ci_low) if m in CLAIMED_LOWER else "")
            table.append(row)
    keys = ["depth", "measure", "with_registers", "without", "effect", "ci_low", "ci_high", "p", "seeds", "verdict"]
    path = Path(out) / "comparison.csv"
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, keys)
        w.writeheader()
        for r in table:
            w.writerow({k: r.get(k, "") for k in keys})
    for name, src in (("results_reg0.csv", reg0), ("results_reg4.csv", reg4)):
        (Path(out) / name).write_text((Path(src) / "results.csv").read_text())
    print(path.read_text())


if __name__ == "__main__":
    main(*sys.argv[1:4])
