"""Runtime settings that make a step fast on the machine at hand (measured in ``benchmarks/README.md``).

None of them changes the mathematics: thread counts, the AdamW implementation and data-parallel
processes only change how the same arithmetic is scheduled.

- ``adamw`` picks the fused AdamW kernel where this torch has it for the parameters' device (CPU and
  CUDA in torch >= 2.4), else the multi-tensor ``foreach`` one; on CPU torch's own default is the slow
  per-parameter loop.
- ``cpu_plan`` says how to spend the cores: a small ViT's step is a chain of small kernels that two
  threads cannot share well, so one single-threaded process per core (DDP over gloo when training,
  each with its slice of the global batch) beats one process with every core.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from vitlab.errors import ConfigError

# below this many tokens per process (rows of its GEMMs) a slice of the batch cannot keep a core busy
MIN_TOKENS_PER_PROC = 256


def cpu_cores() -> int:
    """Cores this process may run on (its affinity mask, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


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
    """How to run a CPU training step: ``procs`` data-parallel processes of ``threads`` threads each."""

    procs: int
    threads: int

    @property
    def torchrun(self) -> str:
        return f"torchrun --nproc_per_node={self.procs}" if self.procs > 1 else ""


def cpu_plan(batch_size: int, tokens_per_image: int = 1, *, cores: int | None = None) -> CpuPlan:
    """One single-threaded process per core when the global batch splits evenly into per-process slices of
    at least ``MIN_TOKENS_PER_PROC`` tokens; otherwise fewer processes, each with a share of the cores."""
    if batch_size < 1 or tokens_per_image < 1:
        raise ConfigError(f"batch_size and tokens_per_image must be >= 1, got {batch_size} and {tokens_per_image}")
    cores = cores or cpu_cores()
    procs = cores
    while procs > 1 and (batch_size % procs or batch_size // procs * tokens_per_image < MIN_TOKENS_PER_PROC):
        procs -= 1
    return CpuPlan(procs=procs, threads=max(1, cores // procs))
