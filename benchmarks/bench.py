#!/usr/bin/env python
"""vitlab against timm on the same architecture, batch and optimiser (issue "performance").

One run measures, interleaved (A/B/B/A, in 3 rounds of fresh processes; the median), the training
step (forward, backward, AdamW) and inference images/s of each vitlab preset and its timm peer, their
peak tensor memory, the ratio vitlab/timm and the model FLOP utilisation (MFU) against a large matrix
product timed in the same run. It prints a markdown table and writes JSON + markdown under ``--out``.

    .venv/bin/python benchmarks/bench.py               # the table in benchmarks/README.md (CPU, ~9 min)
    .venv/bin/python benchmarks/bench.py --quick       # smoke test: every row at toy size
    .venv/bin/python benchmarks/bench.py --e2e         # + `vitlab train` images/s against the bare step
    .venv/bin/python benchmarks/bench.py --levers      # + each speed lever on the vit_mnist step
    .venv/bin/python benchmarks/bench.py --scaling     # + time and memory against tokens and depth (PNG)
    .venv/bin/python benchmarks/bench.py --device cuda # bf16 autocast + fused attention, + vit_base@224

timm runs as a timm user gets it (torch's default threads and AdamW); vitlab runs with the settings of
:mod:`vitlab.perf` (the batch as one single-threaded slice per core, computed at once on a thread pool,
and fused AdamW; ``--vitlab-procs N`` uses N DDP processes instead). Neither changes the mathematics; the
``same runtime`` row gives timm vitlab's settings too.
"""


from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # the bench_* modules beside this script, also when it is loaded by path (tests)
    sys.path.insert(0, str(HERE))

import torch  # noqa: E402
from bench_e2e import e2e  # noqa: E402
from bench_levers import levers  # noqa: E402
from bench_rows import CUDA_ROWS, ROWS, Row, build, quick_row  # noqa: E402, F401 - Row, build: the tests' API
from bench_runners import DEFAULT_THREADS  # noqa: E402
from bench_scaling import scaling  # noqa: E402
from bench_throughput import matmul_peak, measure_row  # noqa: E402

from vitlab import perf  # noqa: E402


def markdown(report: dict) -> str:
    lines = [f"Command: `{report['command']}`  ", f"Machine: {report['machine']}  ",
             f"Large matmul: {report['matmul_gflops']:.0f} GFLOP/s ({report['matmul_note']})  ",
             f"Load average before/after: {report['load_before']} / {report['load_after']}"]
    if loaded(report):
        lines += ["", "**Measured on a loaded machine** (load average above half the cores): a step that uses several "
                  "threads stalls whenever another process holds one of its cores, so the rows with a multi-threaded "
                  "side are far from what a quiet machine gives; the `same runtime` rows and the levers measured "
                  "with one thread per process are the robust comparisons. Re-run on a quiet machine."]
    if report["rows"]:
        lines += ["", "| row | mode | batch | vitlab img/s | timm img/s | vitlab/timm | goal | vitlab MFU | timm MFU "
                  "| vitlab peak MB | timm peak MB | vitlab runtime | timm runtime |",
                  "|---|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---|---|"]
    for r in report["rows"]:
        v, t = r["vitlab"], r["timm"]
        goal = "-" if r["goal"] is None else f">= {r['goal']:.1f}x " + {True: "met", False: "**MISSED**",
                                                                          None: "(quick)"}[r["met"]]
        name = r["row"] + (f" ({'; '.join(r['notes'])})" if r["notes"] else "")
        lines.append(
            f"| {name} | {r['mode']} | {r['batch']} | {v['images_per_s']:.1f} | "
            f"{t['images_per_s']:.1f} | **{r['ratio']:.2f}x** | {goal} | {v['mfu']:.1%} | {t['mfu']:.1%} | "
            f"{v['peak_mb']:.0f} | {t['peak_mb']:.0f} | {v['runtime']} | {t['runtime']} |" if t else
            f"| {name} | {r['mode']} | {r['batch']} | {v['images_per_s']:.1f} | - | - | - | {v['mfu']:.1%} | - | "
            f"{v['peak_mb']:.0f} | - | {v['runtime']} | - |")
    for e in report.get("e2e") or []:
        lines.append("")
        if "skipped" in e:
            lines.append(f"End to end: skipped: {e['skipped']}")
        else:
            lines.append(f"End to end: `{e['command']}` trains at "
                         f"{e['train_images_per_s']:.0f} img/s against {e['bare_step_images_per_s']:.0f} img/s for "
                         f"the bare step ({e['bare_runtime']}, batch {e['batch']}): overhead "
                         f"{e['overhead']:.1%} (goal < 10%: {'met' if e['met'] else '**MISSED**'})")
    if report.get("levers"):
        lines += ["", "| lever | on | from | to | speedup |", "|---|---|---|---|---:|"]
        for lv in report["levers"]:
            if "base_images_per_s" in lv:
                frm = f"{lv['base']}: {lv['base_images_per_s']:.0f} img/s"
                to = f"{lv['lever']}: {lv['lever_images_per_s']:.0f} img/s"
                if lv["lever"] == "torch.compile":
                    to += f" (first step incl. compile {lv['first_step_s']:.0f} s)"
            else:
                frm, to = f"{lv['base']}: {lv['base_ms']:.2f} ms", f"{lv['lever']}: {lv['lever_ms']:.2f} ms"
            lines.append(f"| {lv['lever']} | {lv['row']} {lv['mode']} | {frm} | {to} | {lv['speedup']:.2f}x |")
    if report.get("scaling"):
        lines += ["", "Scaling figures: " + ", ".join(report["scaling"]["png"])]
    return "\n".join(lines) + "\n"


def loaded(report: dict) -> bool:
    """Whether other work kept the machine busy: the 1-minute load average before the run (after it, the
    run's own load counts) exceeded half the cores."""
    with contextlib.suppress(ValueError, IndexError, KeyError, AttributeError):
        return float(report["load_before"].split()[0]) > max(1, perf.cpu_cores()) / 2
    return False


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide the results from other users
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def machine(device: str) -> str:
    if device == "cuda":
        return f"{torch.cuda.get_device_name()}, torch {torch.__version__}"
    return (f"{perf.cpu_model()}, {perf.cpu_cores()} cores, torch {torch.__version__}, "
            f"timm {_timm_version()}, {DEFAULT_THREADS} default threads")


def _timm_version() -> str:
    import timm

    return timm.__version__


def load_average() -> str:
    with contextlib.suppress(OSError, AttributeError):
        return " ".join(f"{v:.1f}" for v in os.getloadavg())
    return "n/a"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="toy sizes, one repeat: a smoke test, not a measurement")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--rows", default="", help="comma-separated presets to keep (default: all)")
    p.add_argument("--repeats", type=int, default=None,
                   help="interleaved samples per runner and round (default 3, quick 1)")
    p.add_argument("--rounds", type=int, default=None,
                   help="rounds of fresh runner processes per comparison (default 3, quick 1)")
    p.add_argument("--target-s", type=float, default=None, help="seconds per sample (default 1.0, quick 0.02)")
    p.add_argument("--vitlab-procs", type=int, default=None, help="override vitlab's processes per row")
    p.add_argument("--no-same-runtime", dest="same_runtime", action="store_false",
                   help="skip the rows that give timm vitlab's runtime too")
    p.add_argument("--e2e", action="store_true", help="also time `vitlab train` against the bare step")
    p.add_argument("--levers", action="store_true", help="also measure each speed lever on vit_mnist")
    p.add_argument("--scaling", action="store_true", help="also time/memory against tokens and depth (PNG)")
    p.add_argument("--no-table", action="store_true", help="skip the main table (with --e2e/--levers/--scaling)")
    p.add_argument("--out", default=str(HERE / "results"), help="folder for the JSON, markdown and figures")
    args = p.parse_args(argv)
    args.repeats = args.repeats or (1 if args.quick else 3)
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.target_s = args.target_s or (0.02 if args.quick else 1.0)
    if args.repeats < 1 or args.rounds < 1 or args.target_s <= 0:
        p.error("--repeats and --rounds must be >= 1 and --target-s > 0")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: CUDA is not available on this machine; use --device cpu")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = args.device
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    rows = list(ROWS) + (list(CUDA_ROWS) if device == "cuda" else [])
    if args.rows:
        keep = {r.strip() for r in args.rows.split(",") if r.strip()}
        unknown = keep - {r.preset for r in rows}
        if unknown:
            print(f"bench.py: error: unknown rows {sorted(unknown)}; choose from "
                  f"{', '.join(r.preset for r in rows)}", file=sys.stderr)
            return 2
        rows = [r for r in rows if r.preset in keep]
    if args.quick:
        rows = [quick_row(r) for r in rows]
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    report: dict = {"command": "python benchmarks/bench.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                    "date": datetime.datetime.now().isoformat(timespec="seconds"), "device": device,
                    "machine": machine(device), "load_before": load_average(), "quick": args.quick, "rows": []}
    peak = matmul_peak(device, args.quick)  # timed before and after the rows; the better one counts
    report["matmul_note"] = ("bf16 8192^3" if device == "cuda" else f"fp32 2048^3, {DEFAULT_THREADS} threads"
                             ) + (", quick" if args.quick else "")
    if not args.no_table:
        for row in rows:
            for mode in row.modes:
                print(f"measuring {row.name} {mode} ...", flush=True)
                report["rows"] += [asdict(r) for r in measure_row(row, mode, device, args)]
    if args.e2e:
        print("measuring vitlab train end to end ...", flush=True)
        report["e2e"] = e2e(device, args)
    if args.levers:
        print("measuring levers ...", flush=True)
        report["levers"] = levers(device, args)
    if args.scaling:
        print("measuring scaling ...", flush=True)
        report["scaling"] = scaling(device, args, out_dir)
    peak = max(peak, matmul_peak(device, args.quick))
    report["matmul_gflops"] = peak / 1e9
    for r in report["rows"]:
        for side in (r["vitlab"], r["timm"]):
            if side:
                side["mfu"] = side["flops_per_image"] * side["images_per_s"] / peak
    report["load_after"] = load_average()
    text = markdown(report)
    print(text)
    stem = f"{device}{'_quick' if args.quick else ''}"
    write_atomic(out_dir / f"{stem}.json", json.dumps(report, indent=1) + "\n")
    write_atomic(out_dir / f"{stem}.md", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
