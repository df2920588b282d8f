"""Each speed lever on the vit_mnist training step, measured interleaved against the setting it replaces
(benchmarks/bench.py --levers)."""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable
from dataclasses import replace

import torch
from bench_rows import ROWS, VIT_MNIST, Row, quick_row
from bench_runners import Runtime, interleaved, make_runner, measure_rounds
from torch import nn

from vitlab import perf


def lever_pair(row: Row, mode: str, base: tuple[str, Runtime], other: tuple[str, Runtime], device: str,
               args: argparse.Namespace, kind: str = "vitlab") -> dict:
    cold = other[1].compile and not args.quick and device == "cpu"  # the first step's compile without cache
    factories = {base[0]: functools.partial(make_runner, kind, row, mode, base[1], device),
                 other[0]: functools.partial(make_runner, kind, row, mode, other[1], device, cold_compile=cold)}
    samples, first, _ = measure_rounds(factories, args)
    ips = {n: row.batch / statistics.median(s) for n, s in samples.items()}
    return {"row": row.name, "mode": mode, "model": kind, "base": base[0], "base_images_per_s": ips[base[0]],
            "lever": other[0], "lever_images_per_s": ips[other[0]], "speedup": ips[other[0]] / ips[base[0]],
            "first_step_s": first[other[0]]}


def levers(device: str, args: argparse.Namespace) -> list[dict]:
    """Each lever on the vit_mnist training step, measured interleaved against the setting it replaces."""
    row = quick_row(VIT_MNIST) if args.quick else VIT_MNIST
    t1 = Runtime(threads=1, adamw="fused")
    pairs = [
        (("2 threads", Runtime(threads=2)), ("1 thread", Runtime(threads=1))),
        (("AdamW loop", Runtime(threads=1, adamw="loop")), ("AdamW foreach", Runtime(threads=1, adamw="foreach"))),
        (("AdamW foreach", Runtime(threads=1, adamw="foreach")), ("AdamW fused", t1)),
        (("SDPA attention", replace(t1, fused_attn=True)), ("explicit attention (auto)", t1)),
        (("eager", t1), ("torch.compile", replace(t1, compile=True))),
        (("fp32", t1), ("bf16 autocast", replace(t1, bf16=True))),  # CPU: native on AVX-512 BF16 / AMX only
        (("1 proc x 1 thread", t1), ("2 procs x 1 thread (DDP)", replace(t1, procs=2))),
        (("1 proc x 2 threads", replace(t1, threads=2)), ("2 procs x 1 thread (DDP)", replace(t1, procs=2))),
        (("1 proc x 2 threads", replace(t1, threads=2)), ("2 slices x 1 thread", replace(t1, slices=2))),
        (("2 procs x 1 thread (DDP)", replace(t1, procs=2)), ("2 slices x 1 thread", replace(t1, slices=2))),
    ]
    if device != "cpu":  # threads, gloo processes and CPU autocast are CPU levers
        pairs = [(b, o) for b, o in pairs if b[1].procs == o[1].procs == 1 and b[1].threads == o[1].threads
                 and b[1].slices == o[1].slices and not o[1].bf16]
    out = []
    for base, other in pairs:
        print(f"  lever: {base[0]} -> {other[0]}", flush=True)
        out.append(lever_pair(row, "train", base, other, device, args))
    if device != "cpu":
        return out
    print("  lever: talking-heads mixing (cait_xxs24 shapes, 1 thread)", flush=True)
    out.append(talking_heads_lever(args))
    print("  lever: channels-last input (vit_tiny p4 inference)", flush=True)
    tiny = ROWS[1] if not args.quick else quick_row(ROWS[1])
    out.append(lever_pair(tiny, "infer", ("NCHW input", Runtime(threads=1)),
                          ("channels-last input", Runtime(threads=1, channels_last=True)), device, args))
    return out


def talking_heads_lever(args: argparse.Namespace) -> dict:
    """The head mixing of CaiT's talking heads: permute + Linear (timm's) against one batched matmul."""
    from vitlab.layers.attention import mix_heads

    B, H, T = (4, 4, 16) if args.quick else (32, 4, 64)
    perf.set_threads(1)
    lin = nn.Linear(H, H)
    a = torch.randn(B, H, T, T, requires_grad=True)
    g = torch.randn(B, H, T, T)

    def permuted() -> None:
        lin(a.permute(0, 2, 3, 1)).permute(0, 3, 1, 2).softmax(-1).backward(g)

    def batched() -> None:
        mix_heads(a, lin).softmax(-1).backward(g)

    class Fn:
        def __init__(self, fn: Callable[[], None]) -> None:
            self.fn = fn

        def time(self, k: int) -> float:
            t0 = time.perf_counter()
            for _ in range(k):
                self.fn()
            return time.perf_counter() - t0

    samples = interleaved({"permute + Linear": Fn(permuted), "batched matmul": Fn(batched)}, args.repeats * args.rounds,
                          args.target_s / 4)
    ms = {n: statistics.median(s) * 1e3 for n, s in samples.items()}
    return {"row": f"mix_heads fwd+bwd ({B},{H},{T},{T})", "mode": "train", "model": "layer",
            "base": "permute + Linear", "base_ms": ms["permute + Linear"], "lever": "batched matmul",
            "lever_ms": ms["batched matmul"], "speedup": ms["permute + Linear"] / ms["batched matmul"]}
