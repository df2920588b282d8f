#!/usr/bin/env python
"""How long ``vitlab train`` takes from its call to the first optimiser step, against another revision of vitlab:
fresh processes of each side, interleaved (A/B, then B/A), the run (process) as the unit.

What is timed: inside a fresh process, with torch and ``vitlab.cli`` already imported, the time from
``vitlab.cli.main(["train", ...])`` to the first call of ``torch.optim.AdamW.step`` (the first batch's forward and
backward are in it, the same work on both sides); the run stops there. That is everything a run decides and loads
before it trains: its options, plan, data, model, optimiser and output folder. Both sides are checked out with
``git worktree`` into temporary folders (``--current``, default HEAD: commit first) and imported from there, so
that they differ in their code alone: the developer's own checkout ran its warm runs about 0.2 s slower than a
worktree of the same commit, in the backward of the first step (measured 2026-11-27, cause not found). Two runs
per process: ``cold``, the process's first (the lazy imports, timm's among them, and the first read of the data set
are in it: what one ``vitlab train`` waits), and ``warm``, a second run in the same process (what each further run
of an in-process study costs before its first step).

    .venv/bin/python benchmarks/first_step.py --baseline 6271d8e^            # ~4 min: 15 pairs
    .venv/bin/python benchmarks/first_step.py --baseline HEAD --repeats 2 --out /tmp/x   # smoke test

Prints and writes ``results/first_step.json`` / ``.md``: the median of each side, the mean paired difference with
its 95 % interval (paired t over the interleaved pairs, :func:`vitlab.experiments.stats.paired_t`) and the machine.
Time it on a quiet machine (no study, no other benchmark): a loaded core moves both sides, but not alike.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"

# runs in the fresh process: argv[1] the output folder, argv[2:] the train options
PROBE = r"""
import json, sys, time
import torch
import vitlab.cli

class _Stop(BaseException):
    pass

first = []
step = torch.optim.AdamW.step
def timed_step(self, *args, **kwargs):
    first.append(time.perf_counter())
    raise _Stop
torch.optim.AdamW.step = timed_step
out, options = sys.argv[1], sys.argv[2:]
took = []
for run in ("cold", "warm"):
    t0 = time.perf_counter()
    try:
        vitlab.cli.main(["train", *options, "--output", f"{out}-{run}"])
    except _Stop:
        pass
    took.append(first.pop() - t0 if first else None)
print(json.dumps({"cold": took[0], "warm": took[1], "vitlab": vitlab.__file__}))
"""

KINDS = ("cold", "warm")
TRAIN = ["--model", "vit_mnist", "--dataset", "mnist-5k", "--epochs", "2", "--no-progress"]


def sample(src: Path, options: list[str]) -> dict[str, float]:
    """Seconds to the first step of the cold and the warm run of one fresh process importing vitlab from ``src``."""
    with tempfile.TemporaryDirectory(prefix="vitlab-first-step-") as tmp:
        env = {**os.environ, "PYTHONPATH": str(src), "PYTHONDONTWRITEBYTECODE": "1"}
        proc = subprocess.run([sys.executable, "-c", PROBE, str(Path(tmp) / "run"), *options],
                              capture_output=True, text=True, env=env, cwd=tmp)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"the probe failed ({src}):\n{proc.stderr[-2000:]}")
    got = json.loads(lines[-1])
    if None in (got["cold"], got["warm"]) or not got["vitlab"].startswith(str(src)):
        raise SystemExit(f"a run never stepped, or vitlab came from {got['vitlab']}, not {src}")
    return {k: float(got[k]) for k in KINDS}


def cpu() -> str:
    try:
        from vitlab.perf import cpu_id

        return cpu_id()
    except Exception:  # noqa: BLE001 - a description only
        return platform.processor() or platform.machine()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline", required=True, metavar="REV", help="git revision to compare with, e.g. 6271d8e^")
    p.add_argument("--current", default="HEAD", metavar="REV", help="git revision measured (default HEAD)")
    p.add_argument("--repeats", type=int, default=15, help="pairs of fresh processes (default 15)")
    p.add_argument("--out", type=Path, default=RESULTS, help="folder for first_step.json / .md")
    p.add_argument("train", nargs="*", default=TRAIN, help=f"vitlab train options (default: {' '.join(TRAIN)})")
    args = p.parse_args(argv)
    if args.repeats < 2:
        p.error("--repeats must be at least 2 (the interval needs two pairs)")
    revs = {}
    for side, name in (("current", args.current), ("baseline", args.baseline)):
        rev = subprocess.run(["git", "rev-parse", "--short", name], cwd=ROOT, capture_output=True, text=True)
        if rev.returncode != 0:
            p.error(f"--{side} {name} is not a revision of this repository: {rev.stderr.strip()}")
        revs[side] = rev.stdout.strip()
    trees = {side: Path(tempfile.mkdtemp(prefix=f"vitlab-{side}-")) for side in revs}
    try:
        for side, tree in trees.items():
            subprocess.run(["git", "worktree", "add", "--detach", str(tree), revs[side]], cwd=ROOT, check=True,
                           capture_output=True)
        sides = {side: tree / "src" for side, tree in trees.items()}
        for src in sides.values():  # warm the file cache once per side
            sample(src, args.train)
        times: dict[str, dict[str, list[float]]] = {k: {kind: [] for kind in KINDS} for k in sides}
        for i in range(args.repeats):
            order = list(sides) if i % 2 == 0 else list(reversed(sides))
            for side in order:
                for kind, t in sample(sides[side], args.train).items():
                    times[side][kind].append(t)
    finally:
        for tree in trees.values():
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, capture_output=True)
            shutil.rmtree(tree, ignore_errors=True)

    from vitlab.experiments.stats import paired_t

    result = {"current": args.current, "current_commit": revs["current"], "baseline": args.baseline,
              "baseline_commit": revs["baseline"], "train": args.train,
              "repeats": args.repeats, "cpu": cpu(), "cores": os.cpu_count(), "python": platform.python_version()}
    md = (f"# Time to the first step: {args.current} ({revs['current']}) against {args.baseline} "
          f"({revs['baseline']})\n\n"
          f"`vitlab train {' '.join(args.train)}`, {args.repeats} interleaved pairs of fresh processes, {cpu()}, "
          f"{os.cpu_count()} cores, Python {platform.python_version()}. cold: a process's first run; warm: its "
          "second.\n\n| run | current median ms | baseline median ms | current - baseline, mean ms | 95 % CI | p |\n"
          "|---|---:|---:|---:|---|---:|\n")
    for kind in KINDS:
        cur, base = times["current"][kind], times["baseline"][kind]
        c = paired_t([x * 1e3 for x in cur], [x * 1e3 for x in base])
        result[kind] = {"median_ms": {"current": statistics.median(cur) * 1e3,
                                      "baseline": statistics.median(base) * 1e3},
                        "difference_ms": {"mean": c.effect, "ci95": [c.ci_low, c.ci_high], "p": c.p,
                                          "test": c.test},
                        "samples_s": {"current": cur, "baseline": base}}
        md += (f"| {kind} | {statistics.median(cur) * 1e3:.1f} | {statistics.median(base) * 1e3:.1f} | "
               f"{c.effect:+.1f} | [{c.ci_low:+.1f}, {c.ci_high:+.1f}] | {c.p:.3g} |\n")
    md += "\nPaired t over the interleaved pairs (vitlab.experiments.stats.paired_t); the process is the unit.\n"
    print(md)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "first_step.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "first_step.md").write_text(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
