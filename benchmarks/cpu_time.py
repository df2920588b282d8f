#!/usr/bin/env python
"""Single-threaded CPU-time figures behind benchmarks/README.md's analysis (one thread, ``time.thread_time``,
which other processes barely disturb; A/B pairs interleaved). Prints markdown.

    .venv/bin/python benchmarks/cpu_time.py            # every section, ~2 min
    .venv/bin/python benchmarks/cpu_time.py --only rope,gelu

Sections: ``profile`` (where a vit_mnist training step at batch 64 spends its time), ``batch`` (images/s of
the step against the micro-batch size), ``gelu`` (GELU backward: the kernel against a formula from a saved
Phi), ``softmax`` (over the last axis against the one before), ``rope`` (apply_rope with and without
autograd's five-pass form), ``infer`` (vitlab against timm, vit_mnist inference and the batch-1 overhead).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

import vitlab
from vitlab.layers import rope as rope_mod

SECTIONS = ("profile", "batch", "gelu", "softmax", "rope", "infer")


def cpu_us(fn: Callable[[], object], n: int = 50) -> float:
    """Median CPU microseconds of ``fn`` over 5 runs of ``n`` calls (after a warm-up)."""
    for _ in range(3):
        fn()
    runs = []
    for _ in range(5):
        t = time.thread_time()
        for _ in range(n):
            fn()
        runs.append((time.thread_time() - t) / n * 1e6)
    return sorted(runs)[2]


def ab(fns: dict[str, Callable[[], object]], n: int, rounds: int = 6) -> dict[str, float]:
    """Median CPU microseconds per call of each function, measured alternately (A/B/B/A)."""
    names, got = list(fns), {k: [] for k in fns}
    for r in range(rounds):
        for k in names if r % 2 == 0 else names[::-1]:
            got[k].append(cpu_us(fns[k], n))
    return {k: sorted(v)[len(v) // 2] for k, v in got.items()}


def mnist_step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
               micro: int | None = None) -> None:
    opt.zero_grad(set_to_none=True)
    micro = micro or len(x)
    for i in range(0, len(x), micro):
        (F.cross_entropy(model(x[i:i + micro]), y[i:i + micro]) * (min(micro, len(x) - i) / len(x))).backward()
    opt.step()


def profile() -> list[str]:
    from torch.profiler import profile as prof

    torch.manual_seed(0)
    m = vitlab.create_model("vit_mnist")
    opt = torch.optim.AdamW(m.parameters(), fused=True)
    x, y = torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,))
    step_us = cpu_us(lambda: mnist_step(m, opt, x, y), 10)
    with prof() as p:
        for _ in range(3):
            mnist_step(m, opt, x, y)
    rows = sorted(p.key_averages(), key=lambda e: -e.self_cpu_time_total)[:10]
    out = [f"vit_mnist training step, batch 64, one thread: {step_us / 1e3:.1f} ms CPU", "",
           "| op | ms per step | calls per step | us per call |", "|---|---:|---:|---:|"]
    for e in rows:
        out.append(f"| {e.key} | {e.self_cpu_time_total / 3e3:.2f} | {e.count // 3} | "
                   f"{e.self_cpu_time_total / max(e.count, 1):.0f} |")
    return out


def batch() -> list[str]:
    torch.manual_seed(0)
    m = vitlab.create_model("vit_mnist")
    opt = torch.optim.AdamW(m.parameters(), fused=True)
    x, y = torch.randn(128, 1, 28, 28), torch.randint(0, 10, (128,))
    sizes = (128, 64, 32, 16, 8)
    us = ab({str(b): (lambda b=b: mnist_step(m, opt, x, y, b)) for b in sizes}, 2, rounds=4)
    return ["| micro-batch (of a 128-image step) | images/s (CPU time) |", "|---:|---:|"] + [
        f"| {b} | {128 / us[str(b)] * 1e6:.0f} |" for b in sizes]


def gelu() -> list[str]:
    x = torch.randn(64, 17, 256)
    g = torch.randn_like(x)
    phi = 0.5 * (1 + torch.erf(x / math.sqrt(2)))

    def from_phi() -> torch.Tensor:
        return torch.addcmul(phi, x, torch.exp(x * x * -0.5), value=1 / math.sqrt(2 * math.pi)).mul_(g)

    us = ab({"aten gelu_backward": lambda: torch.ops.aten.gelu_backward(g, x), "from saved Phi": from_phi}, 100)
    return ["| GELU backward on (64, 17, 256), hot in cache | us per call |", "|---|---:|"] + [
        f"| {k} | {v:.0f} |" for k, v in us.items()]


def softmax() -> list[str]:
    s = torch.randn(512, 17, 17)
    st = s.transpose(-1, -2).contiguous()
    us = ab({"softmax over the last axis": lambda: s.softmax(-1), "over the axis before": lambda: st.softmax(-2)},
            200)
    return ["| softmax of (512, 17, 17) maps | us per call |", "|---|---:|"] + [
        f"| {k} | {v:.0f} |" for k, v in us.items()]


def rope() -> list[str]:
    def five_pass(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
        return x * table[0] + rope_mod.rotate_half(x) * table[1]

    torch.manual_seed(0)
    m = vitlab.create_model("vit5_small").eval()
    x = torch.randn(8, 3, 224, 224)
    from vitlab.layers import attention

    fast = attention.apply_rope
    out = {}
    for name, fn in (("five passes", five_pass), ("three passes (vitlab, no autograd)", fast)):
        def run(fn=fn) -> None:
            attention.apply_rope = fn
            with torch.inference_mode():
                m(x)
        out[name] = run
    try:
        us = ab(out, 1, rounds=4)
    finally:
        attention.apply_rope = fast
    q = torch.randn(8, 6, 201, 64, requires_grad=True)
    table, g = torch.randn(2, 201, 64), torch.randn(8, 6, 201, 64)

    def three_pass_grad() -> None:  # the in-place form, forced under autograd
        h = q.shape[-1] // 2
        o = q * table[0]
        o[..., :h].addcmul_(q[..., h:], table[1][..., :h], value=-1)
        o[..., h:].addcmul_(q[..., :h], table[1][..., h:])
        o.backward(g)

    bw = ab({"five passes": lambda: five_pass(q, table).backward(g), "three passes in place": three_pass_grad}, 10)
    return ["| ViT-5-S inference, batch 8 | images/s (CPU time) |", "|---|---:|"] + [
        f"| {k} | {8 / v * 1e6:.2f} |" for k, v in us.items()] + [
        "", "| apply_rope fwd+bwd on (8, 6, 201, 64) | ms |", "|---|---:|"] + [
        f"| {k} | {v / 1e3:.2f} |" for k, v in bw.items()]


def infer() -> list[str]:
    from timm.models.vision_transformer import VisionTransformer

    torch.manual_seed(0)
    models = {"vitlab": vitlab.create_model("vit_mnist").eval(),
              "timm": VisionTransformer(img_size=28, patch_size=7, in_chans=1, num_classes=10, embed_dim=64,
                                        depth=8, num_heads=8).eval()}
    x64, x1 = torch.randn(64, 1, 28, 28), torch.randn(1, 1, 28, 28)
    with torch.inference_mode():
        big = ab({k: (lambda m=m: m(x64)) for k, m in models.items()}, 10)
        one = ab({k: (lambda m=m: m(x1)) for k, m in models.items()}, 100)
    return ["| vit_mnist inference, one thread | batch 64: images/s (CPU time) | batch 1: us per forward |",
            "|---|---:|---:|"] + [f"| {k} | {64 / big[k] * 1e6:.0f} | {one[k]:.0f} |" for k in models]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default="", help=f"comma-separated sections (default all: {', '.join(SECTIONS)})")
    args = p.parse_args(argv)
    chosen = [s.strip() for s in args.only.split(",") if s.strip()] or list(SECTIONS)
    unknown = sorted(set(chosen) - set(SECTIONS))
    if unknown:
        print(f"cpu_time.py: error: unknown sections {unknown}; choose from {', '.join(SECTIONS)}", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    for name in chosen:
        print(f"\n### {name}\n", flush=True)
        print("\n".join(globals()[name]()), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
