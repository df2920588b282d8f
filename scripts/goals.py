"""The recipe's goals, decided from the committed time-to-accuracy results, into docs/results/goals.csv.

Each goal is a threshold claim about a new run of the default recipe ("the final test accuracy is at least 92.5 %",
"a run fits 900 s"), tested with the run (seed) as the unit: the one-sample t of the seeds' values against the goal
(:func:`vitlab.experiments.stats.compare` with a threshold), signed so that positive is the goal's side. The rule is the
verdicts' rule for one claim: **shown** when the 95 % interval lies wholly on the goal's side, **missed** when it lies
wholly on the other side, **not shown** otherwise (an interval that crosses the goal). README's summary of the
recipe is generated from this CSV (scripts/findings_tables.py README.md), so it cannot go stale.

    python scripts/goals.py              # write docs/results/goals.csv
    python scripts/goals.py --check      # exit 1 when the CSV differs from the results
"""

from __future__ import annotations

import json
import statistics
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

from vitlab.experiments import stats

if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from records_csv import csv_main, csv_text  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
OUT = ROOT / "docs" / "results" / "goals.csv"
COLUMNS = ["id", "dataset", "model", "goal", "unit", "seeds", "values", "median", "min", "max", "effect", "ci_low",
           "ci_high", "p", "test", "verdict", "cpu", "source", "command"]
SHOWN, MISSED, NOT_SHOWN = "shown", "missed", "not shown"


@dataclass(frozen=True)
class Goal:
    id: str
    source: str  # a time_to_accuracy JSON under benchmarks/results/
    goal: str
    value: str  # final_acc (in %) | total_s (training and per-epoch evaluation, seconds)
    threshold: float
    at_most: bool = False  # a budget: the value must stay below the threshold


GOALS = (
    Goal("mnist5k-985", "time_to_accuracy.json", "final test accuracy at least 98.5 %", "final_acc", 98.5),
    Goal("mnist5k-99", "time_to_accuracy.json", "final test accuracy at least 99 %", "final_acc", 99.0),
    Goal("fashion-925", "fashion_vitlab_3seeds_pc1/time_to_accuracy_fashion-mnist.json",
         "final test accuracy at least 92.5 %", "final_acc", 92.5),
    Goal("fashion-900s", "fashion_vitlab_3seeds_pc1/time_to_accuracy_fashion-mnist.json",
         "training and evaluation within 900 s (15 minutes)", "total_s", 900.0, at_most=True),
)


def evaluate(goal: Goal, results: Path = RESULTS) -> dict[str, str]:
    """The row of one goal: the vitlab side's runs of the benchmark result named by ``goal.source``."""
    record = json.loads((results / goal.source).read_text())
    side = record["sides"]["vitlab"]
    scale = 100.0 if goal.value == "final_acc" else 1.0
    values = [scale * m[goal.value] for m in side["milestones"]]
    seeds = [r["seed"] for r in side["runs"]]
    sign = -1.0 if goal.at_most else 1.0
    r = stats.compare([sign * v for v in values], sign * goal.threshold)
    lo, hi = sorted((r.ci_low, r.ci_high))
    verdict = SHOWN if lo > 0 else MISSED if hi < 0 else NOT_SHOWN
    unit = "points" if goal.value == "final_acc" else "s"
    return {"id": goal.id, "dataset": record["dataset"], "model": side.get("model", ""), "goal": goal.goal,
            "unit": unit, "seeds": " ".join(str(s) for s in seeds),
            "values": " / ".join(f"{v:.2f}" if unit == "points" else f"{v:.0f}" for v in values),
            "median": f"{statistics.median(values):.4g}", "min": f"{min(values):.4g}", "max": f"{max(values):.4g}",
            "effect": f"{r.effect:.3g}", "ci_low": f"{lo:.3g}", "ci_high": f"{hi:.3g}", "p": f"{r.p:.3g}",
            "test": f"{r.test}, {len(values)} seeds", "verdict": verdict, "cpu": record["cpu"],
            "source": f"benchmarks/results/{goal.source}", "command": record["command"]}


def table(results: Path = RESULTS) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return csv_text(COLUMNS, [evaluate(g, results) for g in GOALS])


def main(argv: list[str] | None = None) -> int:
    return csv_main(argv, description=__doc__.split("\n")[0], table=table, runs=RESULTS, out=OUT, what="goals CSV",
                    script="goals.py", written=lambda text: f"{len(GOALS)} goals")


if __name__ == "__main__":
    raise SystemExit(main())
