"""Runtime settings that make a step fast on the machine at hand (measured in ``benchmarks/README.md``).

None of them changes the mathematics: thread counts, the AdamW implementation and data-parallel
processes only change how the same arithmetic is scheduled.

- ``adamw`` picks the fused AdamW kernel where this torch has it for the parameters' device (CPU and
  CUDA in torch >= 2.4), else the multi-tensor ``foreach`` one; on CPU torch's own default is the slow
  per-parameter loop.
- ``cpu_plan`` says how to spend the cores: a small ViT's step is a chain of small kernels that two
  intra-op threads cannot share well, so it is faster to split the batch into one slice per core and run
  the slices concurrently, each on one single-threaded worker (``sliced_backward`` / ``sliced_forward``
  in one process, or one process per slice under ``torchrun``).
- ``sliced_backward`` computes the gradient of a batch's mean loss as the weighted sum of its slices'
  gradients, taken concurrently on a thread pool (torch releases the GIL inside its kernels) and summed in
  slice order, so the result does not depend on which thread finishes first. Random layers draw from the
  slice's own generator (:func:`vitlab.slice_rng.slice_generator`), seeded from the global one.
"""

from __future__ import annotations

import contextlib
import functools
import os
import platform
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from vitlab.errors import ConfigError
from vitlab.slice_rng import _local, slice_generator

__all__ = ["CpuPlan", "adamw", "batch_coupled", "cpu_cores", "cpu_id", "cpu_model", "cpu_peak_bytes", "cpu_plan",
           "flush_denormals", "flushes_denormals", "fused_adamw_supported", "rng_is_thread_safe", "set_threads",
           "slice_bounds", "slice_generator", "sliced_backward", "sliced_forward"]

# below this many tokens per process (rows of its GEMMs) a slice of the batch cannot keep a core busy
MIN_TOKENS_PER_PROC = 256


def cpu_cores() -> int:
    """Cores this process may run on (its affinity mask, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _cpuinfo(cpuinfo: str | os.PathLike, keys: tuple[str, ...]) -> dict[str, str]:
    """The first non-empty value of each of ``keys`` in ``cpuinfo`` (/proc/cpuinfo's ``key : value`` lines); empty
    where the file does not exist (not Linux)."""
    fields: dict[str, str] = {}
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, sep, value = line.partition(":")
                key = key.strip().lower()
                if sep and key in keys and key not in fields and value.strip():
                    fields[key] = value.strip()
    except OSError:
        pass
    return fields


def cpu_model(cpuinfo: str | os.PathLike = "/proc/cpuinfo") -> str:
    """The CPU's model name as ``lscpu`` shows it ("Intel(R) Xeon(R) Processor", "AMD EPYC 7763 64-Core
    Processor"), read from ``cpuinfo``; where that file does not exist (not Linux) or names no model, what
    :func:`platform.processor` says, else the architecture. Timings quote it: the same code runs 2x apart on
    the CPUs one cloud hands out, and ``platform.processor()`` alone says only ``x86_64`` on Linux."""
    name = _cpuinfo(cpuinfo, ("model name",)).get("model name")
    return name or platform.processor() or platform.machine() or "unknown CPU"


def cpu_id(cpuinfo: str | os.PathLike = "/proc/cpuinfo") -> str:
    """:func:`cpu_model` with the family and model numbers where ``cpuinfo`` has them ("AMD EPYC (cpu family 25,
    model 1)"): clouds name several generations alike, and their speeds differ by up to 2x."""
    fields = _cpuinfo(cpuinfo, ("cpu family", "model"))
    extra = ", ".join(f"{k} {v}" for k, v in fields.items())
    return f"{cpu_model(cpuinfo)} ({extra})" if extra else cpu_model(cpuinfo)


def cpu_peak_bytes(fn: Callable[[], object]) -> int:
    """High-water mark of the tensor memory that ``fn()`` allocates on the CPU above what was live before it,
    from torch's memory profiler (it sees the calling thread only). Tensors freed inside ``fn`` count while they
    live, as an allocator would; the CUDA counterpart is ``torch.cuda.max_memory_allocated``."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    current = high = 0
    for e in events:
        current += e.nbytes()
        high = max(high, current)
    return high


def flushes_denormals() -> bool:
    """Whether this thread's CPU arithmetic flushes denormal floats (below 1.2e-38 in float32) to zero."""
    return (torch.tensor([1e-39], dtype=torch.float32) * 2).item() == 0.0


@contextlib.contextmanager
def flush_denormals(on: bool = True) -> Iterator[None]:
    """Flush denormal floats to zero on the CPU inside the block (``torch.set_flush_denormal``), then restore
    the previous setting. Denormals are computed in microcode, tens of times slower than normal floats; a trained
    transformer's gradients hold enough of them (none were found in its forward outputs) to make a CPU training
    step of timm's ViT-Tiny 1.9x slower late in training than at its start (benchmarks/README.md,
    "Denormal floats"). Flushing changes only values below 1.2e-38. The flag is per thread: threads started
    inside the block inherit it, and vitlab's slice workers copy the caller's."""
    before = flushes_denormals()
    torch.set_flush_denormal(on)
    try:
        yield
    finally:
        torch.set_flush_denormal(before)


def set_threads(threads: int | None) -> int:
    """Set torch's intra-op threads (None: leave torch's default); return the count in force."""
    if threads is not None:
        if threads < 1:
            raise ConfigError(f"threads must be >= 1, got {threads}; use 1 per process on a busy CPU")
        torch.set_num_threads(threads)
    return torch.get_num_threads()


def fused_adamw_supported(device: torch.device | str) -> bool:
    """Whether ``torch.optim.AdamW(fused=True)`` runs on ``device`` in this torch."""
    return _fused_adamw(torch.device(device).type)


@functools.cache
def _fused_adamw(kind: str) -> bool:
    if kind == "cuda":
        return True
    if kind != "cpu":
        return False
    try:
        torch.optim.AdamW([torch.zeros(1, requires_grad=True)], fused=True)
    except (RuntimeError, ValueError, TypeError):
        return False
    return True


def adamw(params: Iterable, *, impl: str = "auto", **kwargs) -> torch.optim.AdamW:
    """``torch.optim.AdamW`` with its fastest implementation: ``impl`` is ``auto`` (fused where supported,
    else foreach), ``fused``, ``foreach`` or ``loop`` (torch's per-parameter reference loop)."""
    params = list(params)
    if params and isinstance(params[0], dict):  # parameter groups
        params = [{**group, "params": list(group["params"])} for group in params]
        tensors = [p for group in params for p in group["params"]]
    else:
        tensors = params
    if impl == "auto":
        device = tensors[0].device if tensors else torch.device("cpu")
        impl = "fused" if fused_adamw_supported(device) else "foreach"
    if impl == "fused":
        return torch.optim.AdamW(params, fused=True, **kwargs)
    if impl == "foreach":
        return torch.optim.AdamW(params, foreach=True, **kwargs)
    if impl == "loop":
        return torch.optim.AdamW(params, foreach=False, **kwargs)
    raise ConfigError(f"unknown AdamW implementation {impl!r}; choose auto, fused, foreach or loop")


@dataclass(frozen=True)
class CpuPlan:
    """How to run a CPU step: the batch in ``slices`` concurrent slices, ``threads`` intra-op threads each."""

    slices: int
    threads: int

    @property
    def torchrun(self) -> str:
        """The launcher for one process per slice (the multi-process form of the same plan)."""
        return f"torchrun --nproc_per_node={self.slices}" if self.slices > 1 else ""


def cpu_plan(batch_size: int, tokens_per_image: int = 1, *, cores: int | None = None) -> CpuPlan:
    """One single-threaded slice per core when the batch splits evenly into slices of at least
    ``MIN_TOKENS_PER_PROC`` tokens; otherwise fewer slices, each with a share of the cores."""
    if batch_size < 1 or tokens_per_image < 1:
        raise ConfigError(f"batch_size and tokens_per_image must be >= 1, got {batch_size} and {tokens_per_image}")
    cores = cores or cpu_cores()
    slices = cores
    while slices > 1 and (batch_size % slices or batch_size // slices * tokens_per_image < MIN_TOKENS_PER_PROC):
        slices -= 1
    return CpuPlan(slices=slices, threads=max(1, cores // slices))


SMALL_MODEL_MACS = 50_000_000  # per image; below it a CPU run uses one thread unless told otherwise


@dataclass(frozen=True)
class ThreadPlan:
    """How a training run uses the CPU: each batch in ``slices`` concurrent slices, ``threads`` torch intra-op
    threads (None: torch's own setting, left as it is)."""

    slices: int
    threads: int | None


def why_not_sliced(model: nn.Module, *, compile: bool = False, distributed: bool = False) -> str | None:
    """Why ``model``'s batches cannot be computed as concurrent slices (None: they can)."""
    model.train()  # the random and batch-coupled layers are judged as a training step runs them
    if distributed:
        return "under torchrun each process is one slice"
    if compile:
        return "a compiled model runs one slice"
    if not rng_is_thread_safe(model):
        return "the model has dropout, whose random draws would depend on thread timing"
    if batch_coupled(model):
        return "the model has batch norm, whose statistics span the whole batch"
    return None


def thread_plan(device: torch.device, *, batch_size: int, slices: int | None = None, threads: int | None = None,
                macs: int | None = None, tokens: int | None = None, why_not: str | None = None) -> ThreadPlan:
    """The CPU threads and batch slices of a training run (decided, not applied; :func:`plan_training` applies it).

    Slices: ``slices`` (``--slices``), else one per core (:func:`cpu_plan`) for a small model in one process when
    the batch splits into slices of at least 256 tokens, the model draws its randomness only through vitlab's
    DropPath, has no batch norm, and neither ``threads`` nor ``compile`` is given (``why_not``,
    :func:`why_not_sliced`, says otherwise); else 1. Threads: ``threads``, else one per slice when slicing, else
    ``OMP_NUM_THREADS`` when set (left as torch set it), else one thread for a small model (below
    :data:`SMALL_MODEL_MACS` multiply-accumulates per image, ``macs``, whose tiny matmuls gain nothing from intra-op
    threads and lose much on a busy machine) that could have been sliced, and the cores shared among the local
    processes for bigger models and for those that cannot be sliced (batch norm, dropout, compile, torchrun).
    ``tokens``: tokens per image (None when not a ViT). Off the CPU: 1 slice, threads untouched, and ``slices``
    above 1 is refused."""
    if device.type != "cpu":
        if slices and slices > 1:
            raise ConfigError(f"--slices {slices} is a CPU option; drop it on {device}")
        return ThreadPlan(1, None)
    macs = macs or 0
    chosen = slices or 1
    if slices and slices > 1 and why_not:
        raise ConfigError(f"--slices {slices}: {why_not}; use --slices 1")
    if slices is None and not why_not and not threads and macs < SMALL_MODEL_MACS and tokens:
        chosen = cpu_plan(batch_size, tokens).slices
    if threads:
        return ThreadPlan(chosen, threads)
    if chosen > 1:
        return ThreadPlan(chosen, max(1, cpu_cores() // chosen))
    if "OMP_NUM_THREADS" in os.environ:
        return ThreadPlan(chosen, None)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    # a small model that could not be sliced (batch norm, dropout, compile, torchrun) takes the cores as
    # intra-op threads: vit_mnist_conv_patch14's stem (batch norm) trained 462 images/s on 2 threads against
    # 330 on one (batch 64, 2-core AMD EPYC Zen 3, 2026-11-26)
    small = macs < SMALL_MODEL_MACS and why_not is None
    return ThreadPlan(chosen, 1 if small else max(1, (os.cpu_count() or 1) // local))


def plan_training(model: nn.Module, device: torch.device, *, batch_size: int, slices: int | None = None,
                  threads: int | None = None, compile: bool = False, distributed: bool = False,
                  macs: int | None = None, tokens: int | None = None) -> int:
    """Set the CPU threads of a training run of ``model`` as :func:`thread_plan` decides and return its number of
    concurrent batch slices."""
    why_not = why_not_sliced(model, compile=compile, distributed=distributed) if device.type == "cpu" else None
    plan = thread_plan(device, batch_size=batch_size, slices=slices, threads=threads, macs=macs, tokens=tokens,
                       why_not=why_not)
    if plan.threads is not None:
        torch.set_num_threads(plan.threads)
    return plan.slices


# ----------------------------------------------------------------------------------- sliced (threaded) steps
@functools.cache
def _pool(workers: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(workers, thread_name_prefix="vitlab-slice")


def slice_bounds(batch_size: int, slices: int) -> list[tuple[int, int]]:
    """``slices`` contiguous row ranges covering ``batch_size`` rows, sizes differing by at most one."""
    if slices < 1:
        raise ConfigError(f"slices must be >= 1, got {slices}")
    slices = min(slices, max(batch_size, 1))
    cuts = [batch_size * i // slices for i in range(slices + 1)]
    return [(cuts[i], cuts[i + 1]) for i in range(slices)]


def rng_is_thread_safe(model: nn.Module) -> bool:
    """Whether ``model``'s random layers, as configured now, draw from :func:`slice_generator`: true when
    every active one is vitlab's DropPath; dropout (whose draws use the global generator) makes it false."""
    from vitlab.layers.drop_path import DropPath

    for m in model.modules():
        if not m.training:
            continue
        if isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0:
            return False
        if not isinstance(m, DropPath) and getattr(m, "drop_prob", 0.0):  # e.g. timm's DropPath
            return False
    return True


def batch_coupled(model: nn.Module) -> bool:
    """Whether ``model`` (as configured now) mixes the rows of a batch, as batch norm does in training: its
    statistics over a slice are not those over the batch, and concurrent slices would race on its running
    averages, so such a model is not sliced."""
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) and m.training for m in model.modules())


def _run_slices(work: Callable[[int, int], object], bounds: Sequence[tuple[int, int]],
                generators: Sequence[torch.Generator | None]) -> list:
    grad, inference = torch.is_grad_enabled(), torch.is_inference_mode_enabled()
    threads, flush = torch.get_num_threads(), flushes_denormals()

    def one(i: int):  # grad and inference mode are per thread: carry the caller's over
        if getattr(_local, "threads", None) != threads:
            # OpenMP's thread count is per thread too: a new thread would run its GEMMs on every core (and
            # keep extra OpenMP workers around that slowed later multi-threaded steps 1.4x in benchmarks)
            torch.set_num_threads(threads)
            _local.threads = threads
        if getattr(_local, "flush", None) != flush:  # the floating-point mode is per thread too
            torch.set_flush_denormal(flush)
            _local.flush = flush
        _local.generator = generators[i]
        try:
            with torch.inference_mode(inference), torch.set_grad_enabled(grad):
                return work(*bounds[i])
        finally:
            _local.generator = None

    if len(bounds) == 1:
        return [one(0)]
    futures = [_pool(len(bounds)).submit(one, i) for i in range(len(bounds))]
    return [f.result() for f in futures]


def sliced_backward(loss_fn: Callable[[int, int], Tensor], batch_size: int, params: Iterable[Tensor],
                    slices: int) -> Tensor:
    """Accumulate into each parameter's ``.grad`` the gradient of the batch's mean loss and return that loss
    (detached), computing ``loss_fn(start, stop)`` (the mean loss of rows ``start:stop``) on ``slices``
    threads at once. The slices' gradients, weighted by their share of the rows, are summed in slice order:
    the same gradient as one backward over the batch up to float rounding, the same bits on every run.
    With one slice it is ``loss.backward()``. Call it with one intra-op thread per slice."""
    params = [p for p in params if p.requires_grad]
    bounds = slice_bounds(batch_size, slices)
    if len(bounds) == 1:
        loss = loss_fn(0, batch_size)
        loss.backward()
        return loss.detach()
    seeds = torch.randint(0, 2**62, (len(bounds),)).tolist()  # from the global generator: reproducible
    generators = [torch.Generator().manual_seed(s) for s in seeds]

    def work(start: int, stop: int) -> tuple[Tensor, tuple]:
        w = (stop - start) / batch_size
        loss = loss_fn(start, stop) * w
        return loss.detach(), torch.autograd.grad(loss, params, allow_unused=True)

    results = _run_slices(work, bounds, generators)
    for i, p in enumerate(params):
        total = None
        for _, grads in results:
            g = grads[i]
            if g is not None:
                total = g if total is None else total.add_(g)  # slice order; the first slice's tensor is ours
        if total is not None:
            p.grad = total if p.grad is None else p.grad.add_(total)
    return torch.stack([loss for loss, _ in results]).sum()


def sliced_forward(fn: Callable[[Tensor], Tensor], x: Tensor, slices: int) -> Tensor:
    """``fn(x)`` for a batch-wise ``fn``, computed as ``slices`` row slices on as many threads and
    concatenated (inference: same outputs as one call up to float rounding)."""
    bounds = slice_bounds(x.shape[0], slices)
    if len(bounds) == 1:
        return fn(x)
    outs = _run_slices(lambda a, b: fn(x[a:b]), bounds, [None] * len(bounds))
    return torch.cat(outs)
