"""The main table of benchmarks/bench.py: training-step and inference images/s of vitlab and timm, their peak
tensor memory, the ratio and the model FLOP utilisation against a large matrix product."""

from __future__ import annotations

import argparse
import functools
import math
import statistics
import time
from dataclasses import dataclass, field, replace

import torch
from bench_rows import Row, matmul_flops_per_image
from bench_runners import DEFAULT_THREADS, TIMM_RUNTIME, make_runner, measure_rounds, sync, vitlab_runtime

from vitlab import perf


def matmul_peak(device: str, quick: bool = False) -> float:
    """FLOP/s of a large square matrix product (fp32 on CPU with torch's default threads, bf16 on CUDA)."""
    n = 512 if quick else (8192 if device == "cuda" else 2048)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    perf.set_threads(DEFAULT_THREADS)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    best = math.inf
    for _ in range(2 if quick else 7):
        sync(device)
        t0 = time.perf_counter()
        a @ b
        sync(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


@dataclass
class Side:
    """One side (vitlab or timm) of a measured row."""

    runtime: str
    images_per_s: float
    samples_s: list[float]
    first_step_s: float
    peak_mb: float
    flops_per_image: float
    mfu: float = 0.0  # filled in once the run's matmul peak is known


@dataclass
class Result:
    row: str
    mode: str
    batch: int
    peer: str
    vitlab: Side
    timm: Side | None
    ratio: float | None
    goal: float | None
    met: bool | None
    notes: list[str] = field(default_factory=list)


def measure_row(row: Row, mode: str, device: str, args: argparse.Namespace) -> list[Result]:
    """vitlab against timm as timm users run it, and (``args.same_runtime``) against timm under vitlab's
    runtime too, all runners interleaved; one Result per comparison."""
    vl_rt = vitlab_runtime(row, mode, device)
    if args.vitlab_procs:
        vl_rt = replace(vl_rt, procs=args.vitlab_procs, slices=1,
                        threads=max(1, DEFAULT_THREADS // args.vitlab_procs))
    plans = {"vitlab": ("vitlab", vl_rt)}
    if row.peer != "none":
        plans["timm"] = ("timm", TIMM_RUNTIME)
        if args.same_runtime and vl_rt != TIMM_RUNTIME:
            plans["timm same runtime"] = ("timm", vl_rt)
    factories = {n: functools.partial(make_runner, kind, row, mode, rt, device) for n, (kind, rt) in plans.items()}
    samples, first, peak = measure_rounds(factories, args, memory=True)
    flops = matmul_flops_per_image(row, mode)
    sides = {}
    for name, (_, rt) in plans.items():
        ips = row.batch / statistics.median(samples[name])
        sides[name] = Side(runtime=rt.label(mode), images_per_s=ips, samples_s=samples[name],
                           first_step_s=first[name], peak_mb=peak[name] / 2**20, flops_per_image=flops)
    notes = {"nearest": ["nearest timm peer: no RoPE"], "none": ["no timm peer: absolute figures"]}.get(row.peer, [])
    vl = sides["vitlab"]
    if "timm" not in sides:
        return [Result(row.name, mode, row.batch, row.peer, vl, None, None, None, None, notes)]
    ratio = vl.images_per_s / sides["timm"].images_per_s
    goal = row.goals.get(mode)
    out = [Result(row.name, mode, row.batch, row.peer, vl, sides["timm"], ratio, goal,
                  None if goal is None or args.quick else ratio >= goal, notes)]
    if "timm same runtime" in sides:  # information: the model code alone, no goal
        same = sides["timm same runtime"]
        out.append(Result(row.name, mode, row.batch, row.peer, vl, same, vl.images_per_s / same.images_per_s,
                          None, None, [*notes, "same runtime for both: model code alone"]))
    return out
