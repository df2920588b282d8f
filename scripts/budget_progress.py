"""How far the rate x depth study (docs/findings.md, section 10) has got: per phase, the runs finished and planned,
those still to train at each depth and a rough cost, from the kept run records (``docs/results/runs/depth_budget*``),
so the page's progress is generated like its tables instead of kept by hand.

A phase's runs are those ``scripts/depth_budget.sh`` asks for (one row per output folder):

1. ``depth_budget_grid``: every arm at 6, 12 and 24 blocks at each rate of :data:`GRID`, seed 0;
2. ``depth_budget``: every cell at its grid's best rate, :data:`BUDGET_SEEDS` seeds (seed 0 copied from the grid);
3. ``depth_budget_same_rate``: the four arms other than the ViT at the ViT's best rate (a cell whose own best rate
   is the ViT's copies its runs from phase 2);
4. ``depth_budget_dp_uniform`` and ``depth_budget_dp_linear``: the best arm (``verdicts.best_arm``, chosen on
   validation) at 24 blocks;
5. ``depth_budget_wortsman``: the grid at seeds 0-2 for the ViT and QK-layernorm at 6 and 24 blocks (seed 0 copied
   from phase 1 at the grid's own rates).

A rate study's cell plans every rate of :data:`GRID` and any rate it has added beyond the grid's edge (``--bracket``:
a rate is planned once a run of it exists, so a rate still to be added is not counted yet). A run is finished when its
``summary.json`` is kept; a run the study copies from another phase's record counts as ``to copy``, not as one to
train. The machines column names the processors the finished runs trained on (from each ``summary.json``), with how
many runs each: times are comparable within one machine only. The cost column multiplies the runs to train at each
depth by the median ``wall_time_s`` of the study's finished runs at that depth (each trained with two workers on a
2-core machine: a rough guide, not a measurement).

    python scripts/budget_progress.py           # write docs/results/depth_budget/progress.csv
    python scripts/budget_progress.py --check   # exit 1 when the CSV differs from the records
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

if str(Path(__file__).resolve().parent) not in sys.path:  # verdicts and records_csv beside this script
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from proxy_rank import GRID  # noqa: E402  (phase 1's --lrs, section 10's design)
from records_csv import csv_main, csv_text  # noqa: E402
from verdicts import BUDGET_ARMS, BUDGET_NAMES, BUDGET_SEEDS, NoRuns, best_arm, best_lr  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "docs" / "results" / "runs"
OUT = ROOT / "docs" / "results" / "depth_budget" / "progress.csv"
DEPTHS = (6, 12, 24)
WORTSMAN_SEEDS = 3
BEST = "best"  # a phase 4 cell's arm: the one verdicts.best_arm chooses when phase 2 ends
COLUMNS = ["phase", "runs", "what", "finished", "planned", "to_copy", "train_6", "train_12", "train_24", "hours",
           "status", "machines"]
RUN_NAME = re.compile(r"(?P<arm>[a-z]+)_depth(?P<depth>\d+)(?:_lr(?P<lr>[0-9.e+-]+))?_seed(?P<seed>\d+)$")


@dataclass(frozen=True)
class Phase:
    phase: str
    folder: str
    what: str
    cells: tuple[tuple[str, int], ...]
    seeds: int
    rates: bool = False  # a rate study: each cell at every rate of GRID (and any it added beyond the edge)


PHASES = (
    Phase("1", "depth_budget_grid", "the rate grid: every arm and depth at 5 rates (more beyond an edge), seed 0",
          tuple((a, d) for a in BUDGET_ARMS for d in DEPTHS), 1, rates=True),
    Phase("2", "depth_budget", f"each cell at its best rate, {BUDGET_SEEDS} seeds (seed 0 copied from the grid)",
          tuple((a, d) for a in BUDGET_ARMS for d in DEPTHS), BUDGET_SEEDS),
    Phase("3", "depth_budget_same_rate", f"the same-rate control: the other four arms at the ViT's rate, "
          f"{BUDGET_SEEDS} seeds (a cell whose rate is the ViT's copied from phase 2)",
          tuple((a, d) for a in BUDGET_ARMS[1:] for d in DEPTHS), BUDGET_SEEDS),
    Phase("4", "depth_budget_dp_uniform", f"drop-path 0.1, uniform, at 24 blocks for the best arm, {BUDGET_SEEDS} "
          "seeds", ((BEST, 24),), BUDGET_SEEDS),
    Phase("4", "depth_budget_dp_linear", f"drop-path 0.1, linear, at 24 blocks for the best arm, {BUDGET_SEEDS} seeds",
          ((BEST, 24),), BUDGET_SEEDS),
    Phase("5", "depth_budget_wortsman", "Wortsman et al.'s claims: the grid at seeds 0-2 for the ViT and QK-layernorm "
          "at 6 and 24 blocks (seed 0 copied from the grid at its own rates)",
          (("vit", 6), ("vit", 24), ("qknorm", 6), ("qknorm", 24)), WORTSMAN_SEEDS, rates=True),
)


def finished(folder: Path) -> dict[tuple[str, int, float | None, int], Path]:
    """``{(arm, depth, lr or None, seed): run}`` of the runs under ``folder`` whose summary.json is kept."""
    out = {}
    for summary in sorted(folder.glob("*/summary.json")) if folder.is_dir() else ():
        m = RUN_NAME.match(summary.parent.name)
        if m:
            lr = float(m["lr"]) if m["lr"] else None
            out[(m["arm"], int(m["depth"]), lr, int(m["seed"]))] = summary.parent
    return out


class Records:
    """The kept run records under ``runs``: each phase folder's finished runs and each cell's best rate, read once
    per table (a table asks for them once per planned run)."""

    def __init__(self, runs: Path) -> None:
        self.runs = runs
        self._finished: dict[str, dict[tuple[str, int, float | None, int], Path]] = {}
        self._best: dict[tuple[str, int], float | None] = {}
        self._summaries: dict[Path, dict] = {}

    def summary(self, run: Path) -> dict:
        """The finished run's ``summary.json``, read once (the cost and the machines columns both use it)."""
        if run not in self._summaries:
            self._summaries[run] = json.loads((run / "summary.json").read_text())
        return self._summaries[run]

    def finished(self, folder: str) -> dict[tuple[str, int, float | None, int], Path]:
        """:func:`finished` of the phase folder ``folder``."""
        if folder not in self._finished:
            self._finished[folder] = finished(self.runs / folder)
        return self._finished[folder]

    def best(self, arm: str, depth: int) -> float | None:
        """The cell's best rate once its grid has finished every rate of :data:`GRID` (until then it may move)."""
        if (arm, depth) not in self._best:
            rates = {lr for (a, d, lr, _) in self.finished("depth_budget_grid") if (a, d) == (arm, depth)}
            rate = None
            if set(GRID) <= rates:
                try:
                    rate = best_lr(self.runs / "depth_budget_grid", f"{arm}_depth{depth}")
                except (NoRuns, ValueError):
                    pass
            self._best[(arm, depth)] = rate
        return self._best[(arm, depth)]


def planned(phase: Phase, records: Records, best: str | None) -> list[tuple[str, int, float | None, int]]:
    """The runs ``phase`` plans, as ``(arm, depth, lr or None, seed)``; a phase 4 cell's arm is ``best`` (or
    :data:`BEST` while none is chosen)."""
    done = records.finished(phase.folder)
    out = []
    for arm, depth in phase.cells:
        arm = (best or BEST) if arm == BEST else arm
        if phase.rates:
            rates = sorted(set(GRID) | {lr for (a, d, lr, _) in done if (a, d) == (arm, depth) and lr is not None})
        else:
            rates = [None]
        out += [(arm, depth, lr, seed) for lr in rates for seed in range(phase.seeds)]
    return out


def copy_source(phase: Phase, run: tuple[str, int, float | None, int], records: Records) -> bool:
    """Whether the study copies ``run`` from another phase's finished record instead of training it (seed 0 of phase
    2 from the grid at the cell's best rate, of phase 5 at the grid's own rates; phase 3's cells whose own best rate
    is the ViT's, from phase 2)."""
    arm, depth, lr, seed = run
    grid = records.finished("depth_budget_grid")
    if phase.phase == "2" and seed == 0:
        rate = records.best(arm, depth)
        return rate is not None and (arm, depth, rate, 0) in grid
    if phase.phase == "5" and seed == 0:  # at the grid's own rates only (scripts/depth_budget.sh)
        return lr in GRID and (arm, depth, lr, 0) in grid
    if phase.phase == "3":
        own, vit = records.best(arm, depth), records.best("vit", depth)
        return own is not None and own == vit and (arm, depth, None, seed) in records.finished("depth_budget")
    return False


def run_seconds(records: Records) -> dict[int, float]:
    """``{depth: median wall_time_s}`` over the finished runs of every phase's folder that record it."""
    times: dict[int, list[float]] = {}
    for phase in PHASES:
        for (_, depth, _, _), run in records.finished(phase.folder).items():
            wall = records.summary(run).get("wall_time_s")
            if isinstance(wall, (int, float)) and wall > 0:
                times.setdefault(depth, []).append(float(wall))
    return {d: statistics.median(t) for d, t in times.items()}


def machine(summary: dict) -> str:
    """The processor a run trained on, as its ``summary.json`` names it (the GPU for a GPU run), shortened:
    ``"Intel(R) Xeon(R) Processor @ 2.80GHz (cpu family 6, model 106)"`` reads ``"Intel Xeon @ 2.80GHz (family 6,
    model 106)"``; ``"unrecorded"`` for a record that does not say."""
    name = summary.get("gpu") if summary.get("device", "cpu") != "cpu" and summary.get("gpu") else summary.get("cpu")
    if not name:
        return "unrecorded"
    name = re.sub(r"\((?:R|TM)\)|\bProcessor\b|\bCPU\b(?= @)", "", str(name), flags=re.IGNORECASE)
    return re.sub(r"\s+", " ", name.replace("cpu family", "family")).strip()


def machines(summaries: list[dict]) -> str:
    """``"name: count; ..."`` over the runs' ``summaries``, most runs first (ties by name): where a phase's runs
    trained, so that a time is compared only within one machine."""
    counts: dict[str, int] = {}
    for summary in summaries:
        name = machine(summary)
        counts[name] = counts.get(name, 0) + 1
    return "; ".join(f"{name}: {n}" for name, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def _hours(train: dict[int, int], seconds: dict[int, float]) -> str:
    if any(n and d not in seconds for d, n in train.items()):
        return ""  # a depth with runs to train and no finished run to time
    return f"{sum(n * seconds.get(d, 0.0) for d, n in train.items()) / 3600:.1f}"


def rows(runs: Path = RUNS) -> list[dict[str, str]]:
    """One row per phase folder, then ``all``: the totals, and the median run time per depth the cost uses."""
    records = Records(runs)
    best, seconds, out, every = best_arm(runs), run_seconds(records), [], []
    total, train_total = {"finished": 0, "planned": 0, "to_copy": 0}, {d: 0 for d in DEPTHS}
    for phase in PHASES:
        done = records.finished(phase.folder)
        plan = planned(phase, records, best)
        left = [r for r in plan if r not in done]
        copies = [r for r in left if copy_source(phase, r, records)]
        train = {d: sum(1 for r in left if r[1] == d and r not in copies) for d in DEPTHS}
        kept = [done[r] for r in plan if r in done]  # the planned runs that have finished
        n_done = len(kept)
        if phase.cells[0][0] == BEST and best is None:
            status = "waits for phase 2 to choose its arm"
        else:
            status = "complete" if not left else "under way" if n_done else "not started"
        what = phase.what.replace("the best arm", f"the best arm ({BUDGET_NAMES[best][1]})") if best else phase.what
        out.append({"phase": phase.phase, "runs": phase.folder, "what": what, "finished": str(n_done),
                    "planned": str(len(plan)), "to_copy": str(len(copies)),
                    **{f"train_{d}": str(train[d]) for d in DEPTHS}, "hours": _hours(train, seconds),
                    "status": status, "machines": machines([records.summary(r) for r in kept])})
        every += kept
        for key, n in (("finished", n_done), ("planned", len(plan)), ("to_copy", len(copies))):
            total[key] += n
        for d in DEPTHS:
            train_total[d] += train[d]
    per_run = ", ".join(f"{seconds[d]:.0f} s at {d}" for d in DEPTHS if d in seconds)
    out.append({"phase": "all", "runs": "depth_budget*", "what": "every phase" + (
        f"; a run takes about {per_run} blocks (the median wall time of the finished runs)" if per_run else ""),
        "finished": str(total["finished"]), "planned": str(total["planned"]), "to_copy": str(total["to_copy"]),
        **{f"train_{d}": str(train_total[d]) for d in DEPTHS}, "hours": _hours(train_total, seconds),
        "status": "complete" if total["finished"] == total["planned"] else "under way",
        "machines": machines([records.summary(r) for r in every])})
    return out


def table(runs: Path = RUNS) -> str:
    """The progress CSV text."""
    return csv_text(COLUMNS, rows(runs))


def main(argv: list[str] | None = None) -> int:
    OUT.parent.mkdir(parents=True, exist_ok=True)
    return csv_main(argv, description=__doc__.split("\n")[0], table=table, runs=RUNS, out=OUT, what="progress CSV",
                    script="budget_progress.py", written=lambda text: f"{text.count(chr(10)) - 1} rows")


if __name__ == "__main__":
    raise SystemExit(main())
