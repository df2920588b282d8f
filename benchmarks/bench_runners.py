"""How benchmarks/bench.py runs a model: the runtime settings (threads, processes, slices, AdamW kind, compile),
one runner per side (in processes of its own on CPU), and samples taken interleaved over rounds of fresh
processes."""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from bench_rows import Row, build, vitlab_model
from torch import nn

import vitlab
from vitlab import perf
from vitlab.layers.attention import Attention
from vitlab.train.optim import adamw
from vitlab.train.run_model import token_count

DEFAULT_THREADS = torch.get_num_threads()  # torch's default, read before anything changes it


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
    bf16: bool = False  # bf16 autocast on the CPU too (on CUDA the step always runs under it)

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
        if self.bf16:
            parts.append("bf16 autocast")
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
    return adamw(params, impl=impl, **kwargs)


def autocast(device: str, bf16: bool = False) -> contextlib.AbstractContextManager:
    """bf16 autocast on CUDA always, on the CPU when asked (``Runtime.bf16``; native on AVX-512 BF16 / AMX)."""
    if device == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    if bf16:
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


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
        with autocast(self.device, self.rt.bf16):
            return F.cross_entropy(self.net(self.x[start:stop]), self.y[start:stop],
                                   label_smoothing=self.recipe.get("label_smoothing", 0.0))

    def _infer(self, x: torch.Tensor) -> torch.Tensor:
        with autocast(self.device, self.rt.bf16):
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
        live = [*self.model.parameters(), *self.model.buffers(), self.x, self.y]
        if self.mode == "train":
            live += [v for s in self.opt.state.values() for v in s.values() if torch.is_tensor(v)]
        base = sum(t.numel() * t.element_size() for t in live)
        return base + perf.cpu_peak_bytes(self._memory_step)

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
