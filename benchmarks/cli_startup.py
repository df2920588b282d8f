#!/usr/bin/env python
"""How long the ``vitlab`` command takes to answer ``--help``, against importing torch: the median wall time of
fresh processes (the interpreter's own start-up included). Prints a markdown table and writes
``results/cli_startup.json``.

    .venv/bin/python benchmarks/cli_startup.py            # 5 fresh processes per row, ~30 s
    .venv/bin/python benchmarks/cli_startup.py --runs 9
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from vitlab.perf import cpu_model

ROWS = (
    ("python -c pass", ["-c", "pass"]),
    ("vitlab --help", ["-m", "vitlab", "--help"]),
    ("vitlab train --help", ["-m", "vitlab", "train", "--help"]),
    ('python -c "import torch"', ["-c", "import torch"]),
)


def wall_seconds(args: list[str]) -> float:
    """Wall time of one fresh ``python ARGS`` process, output discarded; a failing command stops the benchmark."""
    start = time.perf_counter()
    subprocess.run([sys.executable, *args], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def measure(runs: int) -> list[dict]:
    """Rows interleaved run by run (so the machine's load hits each alike), after one warm-up of each."""
    for _, args in ROWS:
        wall_seconds(args)  # file-system caches warm
    samples: dict[str, list[float]] = {name: [] for name, _ in ROWS}
    for _ in range(runs):
        for name, args in ROWS:
            samples[name].append(wall_seconds(args))
    return [{"command": name, "median_s": statistics.median(v), "min_s": min(v), "max_s": max(v), "runs": runs}
            for name, v in samples.items()]


def table(rows: list[dict]) -> str:
    torch_s = next(r["median_s"] for r in rows if "import torch" in r["command"])
    lines = ["| command | median (s) | min - max (s) | / import torch |", "|---|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| `{r['command']}` | {r['median_s']:.2f} | {r['min_s']:.2f} - {r['max_s']:.2f} | "
                     f"{r['median_s'] / torch_s:.2f} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="fresh processes per row (default 5)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"), help="folder for the JSON")
    args = parser.parse_args()
    rows = measure(args.runs)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cli_startup.json").write_text(json.dumps({"cpu": cpu_model(), "python": platform.python_version(),
                                                      "rows": rows}, indent=1) + "\n")
    print(f"{cpu_model()}, Python {platform.python_version()}, median of {args.runs} fresh processes each\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
