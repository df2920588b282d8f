"""Gradient checkpointing: activation memory and step time with and without it, vitlab beside timm.

    .venv/bin/python benchmarks/grad_checkpointing.py                 # cait_s36 at 224, batch 2 (~5 min on 2 cores)
    .venv/bin/python benchmarks/grad_checkpointing.py --model cait_xxs24 --batch 4 --steps 2

Both sides run the same architecture with the same weights (timm's ``Cait`` / ``VisionTransformer`` from
``vitlab.to_timm``), each with its own ``set_grad_checkpointing``, in train mode without dropout or drop-path.
Per side and setting, one training step's forward and backward (no optimiser) gives:

- **kept for backward**: the bytes of the distinct tensors autograd holds between forward and backward
  (``torch.autograd.graph.saved_tensors_hooks``, parameters and buffers excluded), i.e. the activations;
- **peak**: the high-water mark of tensor memory allocated during forward + backward (the CPU memory profiler's
  allocation trace; the recomputed block's activations show up here);
- **step**: the median CPU seconds (``time.thread_time``) of ``--steps`` forward + backward passes after a
  warm-up one, on one thread: CPU time, unlike wall time, does not change with the load other processes put
  on a shared machine.

Writes ``grad_checkpointing.md`` and ``grad_checkpointing.json`` into ``--out`` (default benchmarks/results).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

import vitlab
from vitlab.atomic import atomic_path
from vitlab.errors import VitlabError
from vitlab.perf import cpu_model, cpu_peak_bytes

RESULTS = Path(__file__).resolve().parent / "results"


def saved_activation_bytes(model: nn.Module, x: torch.Tensor, *, checkpointing: bool) -> int:
    """Bytes of the distinct non-parameter tensors autograd keeps from forward to backward for one loss."""
    model.set_grad_checkpointing(checkpointing)
    own = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        if s.data_ptr() not in own and s.nbytes():
            storages[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = loss_of(model, x)
    loss.backward()
    model.zero_grad(set_to_none=True)
    return sum(storages.values())


def peak_step_bytes(model: nn.Module, x: torch.Tensor, *, checkpointing: bool) -> int:
    """High-water mark of the tensor memory allocated during one forward + backward (CPU memory profiler)."""
    model.set_grad_checkpointing(checkpointing)
    model.zero_grad(set_to_none=True)
    high = cpu_peak_bytes(lambda: loss_of(model, x).backward())
    model.zero_grad(set_to_none=True)
    return high


def step_seconds(model: nn.Module, x: torch.Tensor, *, checkpointing: bool, steps: int) -> float:
    model.set_grad_checkpointing(checkpointing)
    times = []
    for i in range(steps + 1):  # the first is a warm-up
        t0 = time.thread_time()
        loss_of(model, x).backward()
        model.zero_grad(set_to_none=True)
        if i:
            times.append(time.thread_time() - t0)
    return statistics.median(times)


def loss_of(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x).logsumexp(dim=1).mean()


def measure(model: nn.Module, x: torch.Tensor, steps: int) -> dict:
    out = {}
    for name, ckpt in (("plain", False), ("checkpointed", True)):
        out[name] = dict(saved_mb=saved_activation_bytes(model, x, checkpointing=ckpt) / 2**20,
                         peak_mb=peak_step_bytes(model, x, checkpointing=ckpt) / 2**20,
                         step_s=step_seconds(model, x, checkpointing=ckpt, steps=steps))
    model.set_grad_checkpointing(False)
    out["memory_ratio"] = out["checkpointed"]["saved_mb"] / out["plain"]["saved_mb"]
    out["peak_ratio"] = out["checkpointed"]["peak_mb"] / out["plain"]["peak_mb"]
    out["time_ratio"] = out["checkpointed"]["step_s"] / out["plain"]["step_s"]
    return out


def run(*, model: str = "cait_s36", img_size: int = 224, batch: int = 2, steps: int = 3, out: Path = RESULTS,
        overrides: dict | None = None, command: str = "") -> dict:
    """Measure both sides (on one thread) and write ``grad_checkpointing.{md,json}`` into ``out``; returns the
    report."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _run(model, img_size, batch, steps, Path(out), overrides or {}, command)
    finally:
        torch.set_num_threads(threads)


def _run(model: str, img_size: int, batch: int, steps: int, out: Path, overrides: dict, command: str) -> dict:
    torch.manual_seed(0)
    ours = vitlab.create_model(model, img_size=img_size, drop_rate=0.0, attn_drop_rate=0.0, drop_path_rate=0.0,
                               **overrides).train()
    theirs = vitlab.to_timm(ours).train()
    x = torch.randn(batch, ours.cfg.in_chans, img_size, img_size)
    report = dict(command=command, machine=machine(), torch=torch.__version__, timm_version=_timm_version(),
                  threads=torch.get_num_threads(), model=model, img_size=img_size, batch=batch, steps=steps,
                  overrides=overrides, vitlab=measure(ours, x, steps), timm=measure(theirs, x, steps))
    with atomic_path(out / "grad_checkpointing.json") as tmp:
        tmp.write_text(json.dumps(report, indent=1) + "\n")
    with atomic_path(out / "grad_checkpointing.md") as tmp:
        tmp.write_text(markdown(report))
    return report


def markdown(r: dict) -> str:
    lines = [f"# Gradient checkpointing: {r['model']} at {r['img_size']}, batch {r['batch']}", "",
             f"`{r['command'] or 'benchmarks/grad_checkpointing.py'}`  ",
             f"Machine: {r['machine']}; torch {r['torch']}, timm {r['timm_version']}, {r['threads']} thread, fp32, "
             f"train mode without dropout/drop-path; forward + backward, step = median CPU seconds of {r['steps']} "
             f"steps.", "",
             "| side | kept for backward, MB (plain -> ckpt) | ratio | peak step memory, MB (plain -> ckpt) | ratio "
             "| step CPU s (plain -> ckpt) | ratio |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for side in ("vitlab", "timm"):
        s = r[side]
        p, c = s["plain"], s["checkpointed"]
        lines.append(f"| {side} | {p['saved_mb']:.1f} -> {c['saved_mb']:.1f} | {s['memory_ratio']:.3f} | "
                     f"{p['peak_mb']:.1f} -> {c['peak_mb']:.1f} | {s['peak_ratio']:.3f} | "
                     f"{p['step_s']:.2f} -> {c['step_s']:.2f} | {s['time_ratio']:.2f} |")
    v, t = r["vitlab"], r["timm"]
    lines += ["", f"vitlab/timm with checkpointing: kept for backward "
              f"{v['checkpointed']['saved_mb'] / t['checkpointed']['saved_mb']:.2f}x, peak "
              f"{v['checkpointed']['peak_mb'] / t['checkpointed']['peak_mb']:.2f}x, step time "
              f"{v['checkpointed']['step_s'] / t['checkpointed']['step_s']:.2f}x.", ""]
    return "\n".join(lines)


def machine() -> str:
    return f"{cpu_model()}, {os.cpu_count()} cores"


def _timm_version() -> str:
    import timm

    return timm.__version__


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="cait_s36", help="a vitlab preset timm can express (default cait_s36)")
    p.add_argument("--img-size", type=int, default=224)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--steps", type=int, default=3, help="timed steps per setting (after one warm-up)")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    if args.batch < 1 or args.steps < 1:
        p.error("--batch and --steps must be >= 1")
    command = "python benchmarks/grad_checkpointing.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    try:
        report = run(model=args.model, img_size=args.img_size, batch=args.batch, steps=args.steps, out=args.out,
                     command=command.strip())
    except VitlabError as exc:
        print(f"grad_checkpointing.py: error: {exc}", file=sys.stderr)
        return 2
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
