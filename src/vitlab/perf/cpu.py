"""What the CPU is and does: the cores this process may use, the model name timings quote, the tensor memory a
function allocates, and whether denormal floats are flushed to zero (the flag the trainer sets)."""

from __future__ import annotations

import contextlib
import os
import platform
from collections.abc import Callable, Iterator

import torch


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
