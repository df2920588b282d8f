#!/usr/bin/env python
"""What denormal floats cost a CPU training step of a trained model, and where they come from.

A trained transformer's activations and gradients hold values below float32's smallest normal number
(1.2e-38); the CPU computes those in microcode, many times slower. This script loads a trained checkpoint and a
freshly initialised copy of the same model and times one training step (forward, backward, AdamW) of each on one
thread, with denormals computed exactly and flushed to zero (``vitlab.perf.flush_denormals``, what ``vitlab
train`` does on the CPU by default), A/B interleaved; CPU thread time (``time.thread_time``), median of
``--steps``. It also counts the denormal values each kind of module outputs and receives as gradient in one
step. The inputs are a fixed batch of standard-normal images (the model's own input size).

    .venv/bin/python benchmarks/denormals.py --checkpoint runs/findings/pretrain_fashion

Writes results/denormals.md and results/denormals.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from collections import Counter
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from vitlab.atomic import atomic_path
from vitlab.checkpoint import load_model
from vitlab.errors import VitlabError
from vitlab.perf import cpu_model, flush_denormals

RESULTS = Path(__file__).resolve().parent / "results"
TINY = torch.finfo(torch.float32).tiny


def denormal_count(t: torch.Tensor) -> int:
    t = t.detach()
    return int(((t != 0) & (t.abs() < TINY)).sum()) if t.is_floating_point() else 0


def step_seconds(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, flush: bool) -> float:
    opt = torch.optim.AdamW(model.parameters(), lr=0.0)  # lr 0: every step sees the same weights
    with flush_denormals(flush):
        start = time.thread_time()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        seconds = time.thread_time() - start
    model.zero_grad(set_to_none=True)
    return seconds


def where(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, dict[str, int]]:
    """Denormal values per module class in one step: in the outputs of forward and in the gradients of backward."""
    out, grad = Counter(), Counter()
    hooks = []
    for m in model.modules():
        if next(m.children(), None) is not None:
            continue  # leaves only: a block's output would count its last layer's again
        name = type(m).__name__
        hooks.append(m.register_forward_hook(lambda m, i, o, name=name: out.update(
            {name: sum(denormal_count(t) for t in (o if isinstance(o, tuple) else (o,)) if torch.is_tensor(t))})))
        hooks.append(m.register_full_backward_hook(lambda m, gi, go, name=name: grad.update(
            {name: sum(denormal_count(t) for t in gi if t is not None)})))
    try:
        with warnings.catch_warnings():  # the first layer's input needs no gradient; its hook says so
            warnings.filterwarnings("ignore", message="Full backward hook is firing")
            F.cross_entropy(model(x), y).backward()
    finally:
        for h in hooks:
            h.remove()
        model.zero_grad(set_to_none=True)
    return {"forward": dict(out.most_common()), "backward": dict(grad.most_common())}


def input_shape(model: nn.Module) -> tuple[int, int]:
    """(channels, side) the model was built for: its patch embedding's (timm's pretrained_cfg keeps the
    original 3x224x224 of a timm model built at another size)."""
    pe = getattr(model, "patch_embed", None)
    conv = next((m for m in pe.modules() if isinstance(m, nn.Conv2d)), None) if pe is not None else None
    side = getattr(pe, "img_size", None)
    if conv is None or side is None:
        raise VitlabError("benchmarks/denormals.py times ViT-style models (a patch_embed with a convolution)")
    return conv.in_channels, side if isinstance(side, int) else side[0]


def reinitialised(path: str) -> nn.Module:
    model = load_model(path)
    for m in model.modules():
        if hasattr(m, "reset_parameters"):
            m.reset_parameters()
    return model


def run(checkpoint: str, batch: int, steps: int, out: Path) -> dict:
    torch.set_num_threads(1)
    trained, fresh = load_model(checkpoint), reinitialised(checkpoint)
    chans, size = input_shape(trained)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, chans, size, size, generator=g)
    y = torch.randint(0, 10, (batch,), generator=g)
    times = {(m, f): [] for m in ("trained", "fresh") for f in (False, True)}
    for _ in range(steps):  # interleaved, so a change of machine load hits every cell alike
        for (name, flush), ts in times.items():
            ts.append(step_seconds(trained if name == "trained" else fresh, x, y, flush=flush))
    median = {k: statistics.median(v) for k, v in times.items()}
    report = {"checkpoint": checkpoint, "cpu": cpu_model(), "torch": torch.__version__, "batch": batch,
              "steps": steps, "command": "python " + " ".join(sys.argv),
              "step_s": {f"{m}, {'flushed' if f else 'exact'}": s for (m, f), s in median.items()},
              "slowdown_trained": median[("trained", False)] / median[("trained", True)],
              "slowdown_fresh": median[("fresh", False)] / median[("fresh", True)],
              "denormals_trained": where(trained, x, y), "denormals_fresh": where(fresh, x, y)}
    out.mkdir(parents=True, exist_ok=True)
    with atomic_path(out / "denormals.json") as tmp:
        Path(tmp).write_text(json.dumps(report, indent=2))
    with atomic_path(out / "denormals.md") as tmp:
        Path(tmp).write_text(markdown(report))
    return report


def markdown(r: dict) -> str:
    lines = [f"Command: `{r['command']}`  ", f"Machine: {r['cpu']}, one thread, torch {r['torch']}  ",
             f"Checkpoint: {r['checkpoint']}, batch {r['batch']}, median of {r['steps']} steps (CPU thread time)",
             "", "| model | denormals exact (s/step) | flushed (s/step) | exact / flushed |",
             "| --- | ---: | ---: | ---: |"]
    for m in ("trained", "fresh"):
        exact, flushed = r["step_s"][f"{m}, exact"], r["step_s"][f"{m}, flushed"]
        lines.append(f"| {m} | {exact:.3f} | {flushed:.3f} | {exact / flushed:.2f}x |")
    for m in ("trained", "fresh"):
        d = r[f"denormals_{m}"]
        top = lambda c: ", ".join(f"{k} {v:,}" for k, v in list(c.items())[:4] if v) or "none"  # noqa: E731
        lines += ["", f"Denormal values in one step of the {m} model: forward outputs: {top(d['forward'])}; "
                      f"gradients: {top(d['backward'])}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True, help="a trained vitlab checkpoint folder (vitlab train --output)")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    if args.batch < 1 or args.steps < 1:
        p.error("--batch and --steps must be at least 1")
    try:
        report = run(args.checkpoint, args.batch, args.steps, args.out)
    except VitlabError as exc:
        p.error(str(exc))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
