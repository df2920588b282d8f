"""How a run spends the cores (decided here, applied by :func:`plan_training`): torch's intra-op threads and the
number of concurrent batch slices. A small ViT's step is a chain of small kernels that two intra-op threads cannot
share well, so it is faster to split the batch into one slice per core and run the slices concurrently, each on one
single-threaded worker (:mod:`vitlab.perf.slices` in one process, or one process per slice under ``torchrun``)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from torch import nn

from vitlab.errors import ConfigError
from vitlab.perf.cpu import cpu_cores
from vitlab.perf.slices import batch_coupled, rng_is_thread_safe

# below this many tokens per process (rows of its GEMMs) a slice of the batch cannot keep a core busy
MIN_TOKENS_PER_PROC = 256


def set_threads(threads: int | None) -> int:
    """Set torch's intra-op threads (None: leave torch's default); return the count in force."""
    if threads is not None:
        if threads < 1:
            raise ConfigError(f"threads must be >= 1, got {threads}; use 1 per process on a busy CPU")
        torch.set_num_threads(threads)
    return torch.get_num_threads()


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
