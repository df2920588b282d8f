"""Wall time of one small study run four ways, side by side: one run after another in one process on one thread
(``--workers 1``) and on two (``--workers 1 --threads 2``, how a study ran before it had workers), two local worker
processes (``--executor local --workers 2``, one thread each), and a Ray instance on this machine
(``--executor ray``, one CPU per run).

    python benchmarks/study_throughput.py                # 8 runs of vit_mnist on mnist-5k, 3 epochs each
    python benchmarks/study_throughput.py --smoke        # 4 tiny runs, seconds: checks the script end to end

The one-thread ways train the same runs with one thread per run, so their tables are equal run by run (checked);
only the wall time differs (two threads per run may round differently). Prints a Markdown table (wall time, runs
per hour, ratio to sequential) with the CPU model.
Run it on a quiet machine: other work on the cores changes every number.
"""

from __future__ import annotations

import argparse
import csv
import shutil
import sys
import tempfile
import time
from pathlib import Path


def study(args: argparse.Namespace) -> list[str]:
    seeds = "2" if args.smoke else str(args.seeds)
    words = ["sweep", "--model", "vit_mnist", "--dataset", "mnist-5k", "--param", "depth",
             "--values", "1,2" if args.smoke else args.depths, "--seeds", seeds, "--epochs", str(args.epochs),
             "--threads", "1", "--device", "cpu", "--no-progress"]
    if args.smoke:
        words += ["--set", "embed_dim=16", "--set", "num_heads=2", "--limit-train", "64", "--limit-test", "32",
                  "--batch-size", "16"]
    return words


def table(out: Path) -> dict[str, str]:
    with open(out / "results.csv", newline="") as fh:
        return {r["run"]: r["test_acc"] for r in csv.DictReader(fh)}


def main(argv: list[str] | None = None) -> int:
    from vitlab.cli import main as vitlab
    from vitlab.perf import cpu_model

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--depths", default="2,4", help="depths of the sweep (default 2,4)")
    p.add_argument("--seeds", type=int, default=4, help="training seeds per depth (default 4: 8 runs)")
    p.add_argument("--epochs", type=int, default=3, help="epochs per run (default 3)")
    p.add_argument("--ways", default="sequential,sequential_2t,local2,ray", help="which ways to time (default all)")
    p.add_argument("--smoke", action="store_true", help="4 tiny runs of 1 epoch: the script end to end")
    args = p.parse_args(argv)
    if args.smoke:
        args.epochs = 1
    ways = {"sequential": ["--workers", "1"], "sequential_2t": ["--workers", "1", "--threads", "2"],
            "local2": ["--executor", "local", "--workers", "2"],
            "ray": ["--executor", "ray"]}
    chosen = [w.strip() for w in args.ways.split(",") if w.strip()]
    unknown = [w for w in chosen if w not in ways]
    if unknown:
        p.error(f"--ways {', '.join(unknown)}: choose from {', '.join(ways)}")
    if "ray" in chosen:
        try:
            import ray  # noqa: F401
        except ImportError:
            print("ray is not installed (pip install 'vitlab[ray]'): leaving the ray way out", file=sys.stderr)
            chosen.remove("ray")
    root = Path(tempfile.mkdtemp(prefix="vitlab-throughput-"))
    results, tables = [], {}
    try:
        for way in chosen:
            out = root / way
            start = time.perf_counter()
            code = vitlab([*study(args), *ways[way], "--output", str(out)])
            wall = time.perf_counter() - start
            if code:
                print(f"{way}: the study failed (exit {code})", file=sys.stderr)
                return code
            tables[way] = table(out)
            results.append((way, wall, len(tables[way])))
        if "ray" in chosen:
            import ray

            ray.shutdown()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    one_thread = [t for w, t in tables.items() if w != "sequential_2t"]
    same = all(t == one_thread[0] for t in one_thread)
    base = dict((w, t) for w, t, _ in results).get("sequential")
    print(f"CPU: {cpu_model()}; runs: {results[0][2]}; epochs per run: {args.epochs}; same table run by run: {same}")
    print("| way | wall time (s) | runs per hour | ratio to sequential |")
    print("|---|---:|---:|---:|")
    for way, wall, n in results:
        ratio = f"{wall / base:.2f}" if base else "n/a"
        print(f"| {way} | {wall:.1f} | {3600 * n / wall:.0f} | {ratio} |")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
