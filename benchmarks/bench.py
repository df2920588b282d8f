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
import functools
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import vitlab
from vitlab import perf
from vitlab.layers.attention import Attention
from vitlab.train.run_model import token_count

HERE = Path(__file__).resolve().parent
DEFAULT_THREADS = torch.get_num_threads()  # torch's default, read before anything changes it


# ----------------------------------------------------------------------------------------------- rows
@dataclass(frozen=True)
class Row:
    """One architecture at one input size and batch, measured in ``modes`` against its timm peer."""

    name: str
    preset: str
    overrides: dict
    batch: int
    modes: tuple[str, ...]
    goals: dict  # mode -> the vitlab/timm ratio to reach
    peer: str = "same"  # same | nearest (timm lacks a part) | none (no timm model)
    recipe: dict = field(default_factory=dict)  # label_smoothing, clip_grad, lr, weight_decay of the step


ROWS = (
    Row("vit_mnist 28x28x1", "vit_mnist", {}, 128, ("train", "infer"), {"train": 2.0, "infer": 1.0}),
    Row("vit_tiny p4 32x32x3", "vit_tiny", dict(img_size=32, patch_size=4, num_classes=10), 64, ("train", "infer"),
        {"train": 1.0, "infer": 1.0}),
    Row("cait_xxs24 p4 32x32x3", "cait_xxs24", dict(img_size=32, patch_size=4, num_classes=10), 32,
        ("train", "infer"), {"train": 1.0, "infer": 1.0}),
    Row("vit5_small 224", "vit5_small", {}, 16, ("infer",), {"infer": 1.0}, peer="nearest"),
    Row("deepvit_16b 224", "deepvit_16b", {}, 16, ("infer",), {}, peer="none"),
)
CUDA_ROWS = (Row("vit_base 224", "vit_base", {}, 128, ("train", "infer"), {"train": 1.0, "infer": 1.0}),)


def quick_row(row: Row) -> Row:
    """A toy version of ``row`` that runs every code path in well under a second."""
    small = dict(depth=2)
    if row.preset.startswith("cait"):
        small["depth_token_only"] = 1
    if vitlab.get_config(row.preset, **row.overrides).img_size > 64:
        small.update(img_size=32, patch_size=16 if row.preset != "vit5_small" else 8)
    batch = 32 if "train" in row.modes else 4
    return replace(row, overrides={**row.overrides, **small}, batch=batch)


# ----------------------------------------------------------------------------------------------- models
def vitlab_model(row: Row) -> nn.Module:
    return vitlab.create_model(row.preset, **row.overrides)


def timm_peer(row: Row) -> nn.Module:
    """timm's model of the same architecture (ViT-5: the nearest timm model, without RoPE)."""
    cfg = vitlab.get_config(row.preset, **row.overrides)
    common = dict(img_size=cfg.img_size, patch_size=cfg.patch_size, in_chans=cfg.in_chans,
                  num_classes=cfg.num_classes, embed_dim=cfg.embed_dim, depth=cfg.depth, num_heads=cfg.num_heads,
                  mlp_ratio=cfg.mlp_ratio, qkv_bias=cfg.qkv_bias)
    if cfg.arch == "cait":
        from timm.models.cait import Cait

        return Cait(**common, init_values=cfg.gate_init_value(), depth_token_only=cfg.depth_token_only,
                    mlp_ratio_token_only=cfg.mlp_ratio_token_only)
    from timm.models.vision_transformer import VisionTransformer

    if cfg.rope:
        from timm.layers import RmsNorm

        return VisionTransformer(**common, reg_tokens=cfg.reg_tokens, no_embed_class=True, qk_norm=True,
                                 norm_layer=RmsNorm, init_values=cfg.init_values, global_pool=cfg.global_pool)
    peer = VisionTransformer(**common, class_token=cfg.class_token, global_pool=cfg.global_pool)
    if cfg.pos_embed != "learned":
        peer.pos_embed.requires_grad_(False)  # vitlab's table is a fixed sin-cos buffer
    return peer


def build(kind: str, row: Row) -> nn.Module:
    torch.manual_seed(0)
    return vitlab_model(row) if kind == "vitlab" else timm_peer(row)


def matmul_flops_per_image(row: Row, mode: str) -> float:
    """Model FLOPs of one image (2 per multiply of the matmul-like ops; training = 3x forward)."""
    return 2.0 * vitlab_model(row).flop_count(matmul_only=True) * (3 if mode == "train" else 1)


# ----------------------------------------------------------------------------------------------- runtime
@dataclass(frozen=True)
class Runtime:
    """How a step runs; none of it changes the arithmetic."""

    threads: int | None = None  # per process; None: torch's default
    procs: int = 1  # data-parallel processes (DDP over gloo when training)
    slices: int = 1  # concurrent batch slices on a thread pool in one process (vitlab.perf.sliced_*)
    adamw: str = "default"  # default (torch's choice: the per-parameter loop on CPU) | loop | foreach | fused
    compile: bool = False
    fused_attn: bool | None = None  # vitlab attention: None picks per call, True SDPA, False explicit
    channels_last: bool = False

    def label(self, mode: str = "train") -> str:
        threads = self.threads or DEFAULT_THREADS
        if self.procs > 1:
            parts = [f"{self.procs} procs x {threads} thr"]
        elif self.slices > 1:
            parts = [f"{self.slices} slices x {threads} thr"]
        else:
            parts = [f"{threads} thr"]
        if mode == "train":
            parts.append(f"AdamW {self.adamw}")
        if self.compile:
            parts.append("compiled")
        if self.fused_attn is not None:
            parts.append("SDPA" if self.fused_attn else "explicit attn")
        if self.channels_last:
            parts.append("channels-last")
        return ", ".join(parts)


TIMM_RUNTIME = Runtime()


def vitlab_runtime(row: Row, mode: str, device: str) -> Runtime:
    """vitlab's settings (vitlab.perf): on CPU one single-threaded batch slice per core when the batch allows."""
    if device != "cpu":
        return Runtime(adamw="fused")
    plan = perf.cpu_plan(row.batch, token_count(vitlab_model(row)), cores=max(DEFAULT_THREADS, 1))
    return Runtime(threads=plan.threads, slices=plan.slices, adamw="fused")


def make_optimizer(model: nn.Module, impl: str, recipe: dict | None = None) -> torch.optim.Optimizer:
    """AdamW over the trainable parameters; ``impl='trainer'`` builds what `vitlab train` builds."""
    recipe = recipe or {}
    kwargs = dict(lr=recipe.get("lr", 1e-3), weight_decay=recipe.get("weight_decay", 0.05))
    if impl == "trainer":
        from vitlab.train.optim import build_optimizer

        return build_optimizer(model, **kwargs)
    params = [p for p in model.parameters() if p.requires_grad]
    if impl == "default":
        return torch.optim.AdamW(params, **kwargs)
    return perf.adamw(params, impl=impl, **kwargs)


def autocast(device: str) -> contextlib.AbstractContextManager:
    if device == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


# ----------------------------------------------------------------------------------------------- runners
class Runner:
    """One model under one runtime in this process: ``time(k)`` runs k steps and returns seconds."""

    def __init__(self, model: nn.Module, mode: str, row: Row, rt: Runtime, device: str, *,
                 rank: int = 0, world: int = 1) -> None:
        self.mode, self.rt, self.device = mode, rt, device
        self.threads = rt.threads or DEFAULT_THREADS
        perf.set_threads(self.threads)
        for m in model.modules():
            if isinstance(m, Attention):
                m.fused = rt.fused_attn
        model = model.to(device)
        cfg = vitlab.get_config(row.preset, **row.overrides)
        g = torch.Generator().manual_seed(1)
        x = torch.randn(row.batch, cfg.in_chans, cfg.img_size, cfg.img_size, generator=g)  # the global batch
        y = torch.randint(0, max(1, cfg.num_classes), (row.batch,), generator=g)
        per = row.batch // world
        self.x = x[rank * per:(rank + 1) * per].to(device)
        self.y = y[rank * per:(rank + 1) * per].to(device)
        if rt.channels_last:
            model = model.to(memory_format=torch.channels_last)
            self.x = self.x.contiguous(memory_format=torch.channels_last)
        self.model = model
        self.net: nn.Module = model
        if mode == "train" and world > 1:
            self.net = nn.parallel.DistributedDataParallel(model)
        if rt.compile:
            self.net = torch.compile(self.net)
        self.recipe = row.recipe
        if mode == "train":
            model.train()
            self.opt = make_optimizer(model, rt.adamw, row.recipe)
        else:
            model.eval()
        self.first_step_s = 0.0

    def _loss(self, start: int, stop: int) -> torch.Tensor:
        with autocast(self.device):
            return F.cross_entropy(self.net(self.x[start:stop]), self.y[start:stop],
                                   label_smoothing=self.recipe.get("label_smoothing", 0.0))

    def _infer(self, x: torch.Tensor) -> torch.Tensor:
        with autocast(self.device):
            return self.net(x)

    def step(self) -> None:
        if self.mode == "train":
            perf.sliced_backward(self._loss, len(self.x), self.model.parameters(), self.rt.slices)
            if self.recipe.get("clip_grad"):
                nn.utils.clip_grad_norm_(self.model.parameters(), self.recipe["clip_grad"])
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
        else:
            with torch.inference_mode():
                perf.sliced_forward(self._infer, self.x, self.rt.slices)

    def time(self, k: int) -> float:
        perf.set_threads(self.threads)
        sync(self.device)
        t0 = time.perf_counter()
        for _ in range(k):
            self.step()
        sync(self.device)
        return time.perf_counter() - t0

    def peak_bytes(self) -> int:
        """Peak tensor memory of one step: what lives between steps plus the step's high-water mark."""
        perf.set_threads(self.threads)
        if self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.step()
            torch.cuda.synchronize()
            return torch.cuda.max_memory_allocated()
        from torch.profiler import ProfilerActivity, profile

        live = [*self.model.parameters(), *self.model.buffers(), self.x, self.y]
        if self.mode == "train":
            live += [v for s in self.opt.state.values() for v in s.values() if torch.is_tensor(v)]
        base = sum(t.numel() * t.element_size() for t in live)
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            self._memory_step()
        events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                        key=lambda e: e.start_ns())
        cur = high = 0
        for e in events:
            cur += e.nbytes()
            high = max(high, cur)
        return base + high

    def _memory_step(self) -> None:
        """The step, for the memory profiler, which sees only this thread: concurrent slices are replayed
        here with every slice's forward alive before the backward (their peak when they run at once)."""
        if self.rt.slices == 1:
            return self.step()
        bounds = perf.slice_bounds(len(self.x), self.rt.slices)
        if self.mode == "train":
            params = [p for p in self.model.parameters() if p.requires_grad]
            loss = sum(self._loss(a, b) * (b - a) / len(self.x) for a, b in bounds)
            for p, g in zip(params, torch.autograd.grad(loss, params, allow_unused=True)):
                p.grad = g
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
        else:
            with torch.inference_mode():
                outs = [self._infer(self.x[a:b]) for a, b in bounds]
                del outs

    def close(self) -> None:
        pass


def _pool_worker(rank: int, world: int, init_file: str, spec: dict, conn) -> None:
    """A data-parallel process: builds its model, then runs the parent's commands ('time', 'mem', 'stop')."""
    import torch.distributed as dist

    try:
        rt: Runtime = spec["rt"]
        perf.set_threads(rt.threads)  # None: this fresh process's torch default
        if spec.get("cold_compile"):  # report the compile time a first run pays, not the on-disk cache's
            import torch._inductor.config as inductor_config

            inductor_config.force_disable_caches = True
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
        runner = Runner(build(spec["kind"], spec["row"]), spec["mode"], spec["row"], rt, "cpu", rank=rank,
                        world=world)
        t0 = time.perf_counter()
        runner.step()
        dist.barrier()
        conn.send(("ready", time.perf_counter() - t0))
        while True:
            cmd, arg = conn.recv()
            if cmd == "stop":
                break
            dist.barrier()
            if cmd == "time":
                conn.send(("ok", runner.time(arg)))
                dist.barrier()
            elif cmd == "mem":
                conn.send(("ok", runner.peak_bytes()))
        dist.destroy_process_group()
    except Exception:  # the parent re-raises it with the worker's traceback
        conn.send(("error", traceback.format_exc()))


class PoolRunner:
    """``rt.procs`` runners in processes of their own, each with its slice of the batch (DDP when training
    with several), driven from here over pipes.

    Every CPU side runs this way, even with one process: sides that shared a process disturbed each other
    (OpenMP's thread state, thread pools), and a fresh process is what a user of either library starts. While
    the workers run, this process waits on a pipe and uses no CPU.
    """

    def __init__(self, kind: str, row: Row, mode: str, rt: Runtime, *, cold_compile: bool = False) -> None:
        import torch.multiprocessing as mp

        if row.batch % rt.procs:
            raise ValueError(f"batch {row.batch} does not split over {rt.procs} processes")
        self.rt, self.mode, self.threads = rt, mode, rt.threads or 1
        ctx = mp.get_context("spawn")
        self._tmp = tempfile.TemporaryDirectory()
        init_file = os.path.join(self._tmp.name, "store")
        self.conns, self.procs = [], []
        spec = dict(kind=kind, row=row, mode=mode, rt=rt, cold_compile=cold_compile)
        for rank in range(rt.procs):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_pool_worker, args=(rank, rt.procs, init_file, spec, child), daemon=True)
            p.start()
            self.conns.append(parent)
            self.procs.append(p)
        self.first_step_s = max(self._recv_all())

    def _recv_all(self) -> list:
        out = []
        for conn, proc in zip(self.conns, self.procs):
            try:
                status, value = conn.recv()
            except EOFError:
                status, value = "error", f"the worker exited with code {proc.exitcode} before answering"
            if status == "error":
                self.close()
                raise RuntimeError(f"benchmark worker failed:\n{value}")
            out.append(value)
        return out

    def time(self, k: int) -> float:
        for conn in self.conns:
            conn.send(("time", k))
        return max(self._recv_all())

    def peak_bytes(self) -> int:
        for conn in self.conns:
            conn.send(("mem", None))
        return sum(self._recv_all())

    def close(self) -> None:
        for conn in self.conns:
            with contextlib.suppress(OSError, BrokenPipeError):
                conn.send(("stop", None))
        for p in self.procs:
            p.join(timeout=30)
            if p.is_alive():
                p.terminate()
        self.procs, self.conns = [], []
        self._tmp.cleanup()


def make_runner(kind: str, row: Row, mode: str, rt: Runtime, device: str, *,
                cold_compile: bool = False) -> Runner | PoolRunner:
    """A runner for one side: on CPU in processes of its own (:class:`PoolRunner`), on CUDA in this one."""
    if device == "cpu":
        return PoolRunner(kind, row, mode, rt, cold_compile=cold_compile)
    runner = Runner(build(kind, row), mode, row, rt, device)
    t0 = time.perf_counter()
    runner.time(1)  # first step: allocations, and the compile when asked
    runner.first_step_s = time.perf_counter() - t0
    return runner


# ----------------------------------------------------------------------------------------------- measuring
def interleaved(runners: dict[str, Runner | PoolRunner], repeats: int, target_s: float) -> dict[str, list[float]]:
    """Seconds per step of each runner, ``repeats`` samples taken A/B/B/A so that drift in the machine's
    load hits every runner alike; each sample times about ``target_s`` of steps."""
    names = list(runners)
    steps = {}
    for n in names:
        once = runners[n].time(1)
        steps[n] = max(1, round(target_s / max(once, 1e-6)))
    samples: dict[str, list[float]] = {n: [] for n in names}
    for i in range(repeats):
        for n in names if i % 2 == 0 else names[::-1]:
            samples[n].append(runners[n].time(steps[n]) / steps[n])
    return samples


def measure_rounds(factories: dict[str, Callable[[], Runner | PoolRunner]], args: argparse.Namespace, *,
                   memory: bool = False) -> tuple[dict[str, list[float]], dict[str, float], dict[str, float]]:
    """``args.rounds`` rounds, each with fresh runners (new processes on CPU) sampled ``args.repeats`` times
    interleaved: the samples of every round per runner, the first round's first-step seconds and (``memory``)
    peak bytes. Fresh processes matter: the same configuration ran 10-15% apart from one process to the next
    (memory placement), a difference that interleaving inside one pair of processes cannot average out."""
    samples: dict[str, list[float]] = {n: [] for n in factories}
    first: dict[str, float] = {}
    peak: dict[str, float] = {}
    for k in range(args.rounds):
        runners: dict[str, Runner | PoolRunner] = {}
        try:
            for n in (list(factories) if k % 2 == 0 else list(factories)[::-1]):
                runners[n] = factories[n]()
            got = interleaved({n: runners[n] for n in factories}, args.repeats, args.target_s)
            for n in factories:
                samples[n] += got[n]
                first.setdefault(n, runners[n].first_step_s)
                if memory and n not in peak:
                    peak[n] = runners[n].peak_bytes()
        finally:
            for r in runners.values():
                r.close()
    return samples, first, peak


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


# ----------------------------------------------------------------------------------------------- e2e
def e2e(device: str, args: argparse.Namespace) -> list[dict]:
    """`vitlab train` images/s (its summary.json) on mnist-5k against the bare step of the same model, batch,
    optimiser, recipe and runtime: one single-threaded process, and vitlab's plan (torchrun) when it differs."""
    probe = subprocess.run([sys.executable, "-m", "vitlab", "train", "--help"], capture_output=True, text=True)
    if probe.returncode != 0:
        return [{"skipped": "`vitlab train` does not exist yet; re-run with --e2e once it does"}]
    row = quick_row(VIT_MNIST) if args.quick else VIT_MNIST
    runtimes = [Runtime(threads=1, adamw="trainer")]
    plan = vitlab_runtime(row, "train", device)
    if plan.slices > 1:  # the plan in one process (the trainer's default), and as torchrun processes
        runtimes.append(replace(plan, adamw="trainer"))
        runtimes.append(replace(plan, procs=plan.slices, slices=1, adamw="trainer"))
    return [e2e_one(rt, device, args) for rt in runtimes] if device == "cpu" else [
        e2e_one(Runtime(adamw="trainer"), device, args)]


def e2e_one(rt: Runtime, device: str, args: argparse.Namespace) -> dict:
    """One `vitlab train` run pair under ``rt``; the bare step is timed between and after the two runs."""
    cmd = ["vitlab", "train", "--model", "vit_mnist", "--dataset", "mnist-5k", "--epochs", "2", "--no-progress",
           "--device", device]
    if args.quick:
        cmd[cmd.index("--epochs") + 1] = "1"
        cmd += ["--limit-train", "128", "--limit-test", "64", "--batch-size", "32"]
    if device == "cpu":
        cmd += ["--threads", str(rt.threads or DEFAULT_THREADS), "--slices", str(rt.slices)]
    launch = [sys.executable, "-m"]
    if rt.procs > 1:
        launch += ["torch.distributed.run", "--standalone", f"--nproc_per_node={rt.procs}", "-m"]
    with tempfile.TemporaryDirectory() as tmp:
        first = _train(launch + cmd, Path(tmp) / "run1")
        if "skipped" in first:
            return first
        config = first["config"]
        run = config.get("run") or {}
        batch = int(run.get("batch_size") or 128)
        recipe = {k: run[k] for k in ("label_smoothing", "clip_grad", "lr", "weight_decay")
                  if run.get(k) is not None}
        model = {k: v for k, v in (config.get("model") or {}).items() if k != "name"}
        row = Row("vit_mnist (the trainer's model and recipe)", "vit_mnist", model, batch, ("train",), {},
                  recipe=recipe)
        runner = make_runner("vitlab", row, "train", rt, device)
        try:
            samples = interleaved({"bare": runner}, args.repeats * args.rounds, args.target_s)["bare"]
            second = _train(launch + cmd, Path(tmp) / "run2")
            samples += interleaved({"bare": runner}, args.repeats * args.rounds, args.target_s)["bare"]
        finally:
            runner.close()
    runs = [r["summary"] for r in (first, second) if "summary" in r]
    trained = statistics.median(float(r["train_images_per_second"]) for r in runs)
    bare = batch / statistics.median(samples)
    overhead = 1 - trained / bare
    shown = (["torchrun", f"--nproc_per_node={rt.procs}", "-m"] if rt.procs > 1 else []) + cmd
    return {"command": " ".join(shown + ["--output", "DIR"]), "train_images_per_s": trained,
            "train_runs_images_per_s": [float(r["train_images_per_second"]) for r in runs],
            "wall_images_per_s": [r["steps"] * batch / r["wall_time_s"] for r in runs if r.get("wall_time_s")],
            "bare_step_images_per_s": bare, "bare_runtime": rt.label(), "overhead": overhead, "goal": 0.10,
            "met": overhead < 0.10, "batch": batch, "recipe": recipe}


def _train(argv: list[str], out: Path) -> dict:
    """Run ``vitlab train`` (``argv``) into ``out``; its summary and config, or why it could not run."""
    t0 = time.perf_counter()
    proc = subprocess.run([*argv, "--output", str(out)], capture_output=True, text=True)
    if proc.returncode != 0:
        last = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return {"skipped": f"`vitlab train` failed (exit {proc.returncode}): {last[0]}"}
    return {"summary": json.loads((out / "summary.json").read_text()),
            "config": json.loads((out / "config.json").read_text()), "wall_s": time.perf_counter() - t0}


# ----------------------------------------------------------------------------------------------- levers
VIT_MNIST = ROWS[0]


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
        (("1 proc x 1 thread", t1), ("2 procs x 1 thread (DDP)", replace(t1, procs=2))),
        (("1 proc x 2 threads", replace(t1, threads=2)), ("2 procs x 1 thread (DDP)", replace(t1, procs=2))),
        (("1 proc x 2 threads", replace(t1, threads=2)), ("2 slices x 1 thread", replace(t1, slices=2))),
        (("2 procs x 1 thread (DDP)", replace(t1, procs=2)), ("2 slices x 1 thread", replace(t1, slices=2))),
    ]
    if device != "cpu":  # threads and gloo processes are CPU levers
        pairs = [(b, o) for b, o in pairs if b[1].procs == o[1].procs == 1 and b[1].threads == o[1].threads
                 and b[1].slices == o[1].slices]
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


# ----------------------------------------------------------------------------------------------- scaling
def scaling(device: str, args: argparse.Namespace, out_dir: Path) -> dict:
    """Training-step time and peak memory per image against tokens (image size) and depth, vitlab and timm."""
    base = dict(embed_dim=192, num_heads=3, num_classes=10, patch_size=16, in_chans=3)
    sizes = (32, 64) if args.quick else (32, 64, 96, 128, 160, 224)
    depths = (1, 2) if args.quick else (2, 4, 8, 12)
    batch = 4 if args.quick else 16
    rt = Runtime(threads=1 if device == "cpu" else None)  # one thread: robust on a shared machine
    series = {"tokens": [], "depth": []}
    points = [("tokens", dict(base, img_size=s, depth=4 if not args.quick else 1)) for s in sizes]
    points += [("depth", dict(base, img_size=64, depth=d)) for d in depths]
    for axis, ov in points:
        row = Row(f"vit d{ov['depth']} {ov['img_size']}px", "vit_tiny", ov, batch, ("train",), {})
        runners = {}
        try:
            runners = {k: make_runner(k, row, "train", rt, device) for k in ("vitlab", "timm")}
            samples = interleaved(runners, max(1, args.repeats * args.rounds // 3), args.target_s / 2)
            point = {"x": (ov["img_size"] // 16) ** 2 + 1 if axis == "tokens" else ov["depth"]}
            for k, r in runners.items():
                point[k] = {"ms_per_image": statistics.median(samples[k]) * 1e3 / batch,
                            "peak_mb": r.peak_bytes() / 2**20}
        finally:
            for r in runners.values():
                r.close()
        series[axis].append(point)
    series["png"] = plot_scaling(series, out_dir)
    return series


def plot_scaling(series: dict, out_dir: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for axis, xlabel in (("tokens", "tokens (image size / 16, squared, + class)"), ("depth", "blocks")):
        pts = series[axis]
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.6))
        for k, style in (("vitlab", "o-"), ("timm", "s--")):
            xs = [p["x"] for p in pts]
            a1.plot(xs, [p[k]["ms_per_image"] for p in pts], style, label=k)
            a2.plot(xs, [p[k]["peak_mb"] for p in pts], style, label=k)
        a1.set(xlabel=xlabel, ylabel="training step, ms per image", title=f"time against {axis}")
        a2.set(xlabel=xlabel, ylabel="peak tensor memory, MB", title=f"memory against {axis}")
        for a in (a1, a2):
            a.grid(alpha=0.3)
            a.legend()
        fig.tight_layout()
        path = out_dir / f"scaling_{axis}.png"
        tmp = path.with_suffix(".tmp.png")
        fig.savefig(tmp, dpi=110)
        plt.close(fig)
        os.replace(tmp, path)
        paths.append(path.name)
    return paths


# ----------------------------------------------------------------------------------------------- output
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
    return (f"{platform.processor() or platform.machine()}, {perf.cpu_cores()} cores, torch {torch.__version__}, "
            f"timm {_timm_version()}, {DEFAULT_THREADS} default threads")


def _timm_version() -> str:
    import timm

    return timm.__version__


def load_average() -> str:
    with contextlib.suppress(OSError, AttributeError):
        return " ".join(f"{v:.1f}" for v in os.getloadavg())
    return "n/a"


# ----------------------------------------------------------------------------------------------- main
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
