"""One process or many: the process group under ``torchrun``, the sharding of each global batch, metric sums.

``torchrun --nproc_per_node=N -m vitlab train ...`` sets ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``; each process
then takes a contiguous 1/N slice of every global batch (the distributed sampler), DDP averages the
gradients, metrics are summed with ``all_reduce`` and only rank 0 writes files.

Teardown: :meth:`DistContext.close` must leave no gloo thread running when the interpreter exits. A gloo
process group runs its collectives on worker threads; a worker that drops the last reference to a finished
collective's tensor takes the GIL to free its Python object, and a thread that takes the GIL while the
interpreter finalizes is ended by ``pthread_exit``, whose unwinding through torch's ``noexcept`` frames calls
``std::terminate``: SIGABRT ("terminate called without an active exception"), seen at the end of otherwise
finished 2-process runs on a loaded machine. ``destroy_process_group()`` stops those threads only when it drops
the group's last reference, and two holders outlive it unless we act: (1) importing
``torch.distributed.nn.functional``, which ``DistributedDataParallel`` does on first use, stores the live default
group in ten functions' default arguments (``group=group.WORLD``), for good; importing it before the group exists
stores ``None``; (2) the DDP wrapper's reducer holds the group, and after a run the trainer that holds the wrapper
is garbage kept alive by a reference cycle (through frames from building the optimiser), freed whenever the cyclic
collector next runs, which may be during finalization itself; :meth:`DistContext.close` collects it first.
"""

from __future__ import annotations

import contextlib
import gc
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from vitlab.errors import ConfigError


@dataclass
class DistContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    backend: str | None = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        """Sum ``t`` over processes in place (a no-op for one process)."""
        if self.distributed:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()

    def broadcast_object(self, obj: object) -> object:
        if not self.distributed:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def close(self) -> None:
        """Tear the process group down so that no gloo thread outlives it (see the module docstring)."""
        if self.distributed and dist.is_initialized():
            # meet before tearing down: no rank closes its connections while a peer still sends on them; a dead
            # peer makes the barrier fail fast
            with contextlib.suppress(Exception):
                dist.barrier()
            gc.collect()  # a finished run's DDP wrapper, reachable only from reference cycles, releases the group
            dist.destroy_process_group()  # the last reference: the group's worker threads are joined here


def pick_device(name: str, local_rank: int = 0) -> torch.device:
    """``auto``: this process's GPU when CUDA is available, else the CPU."""
    if name == "auto":
        return torch.device(f"cuda:{local_rank}") if torch.cuda.is_available() else torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ConfigError(f"unknown device {name!r}; use auto, cpu, cuda or cuda:N") from exc
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError("--device cuda was asked for but CUDA is not available here; use --device cpu")
        if device.index is None:
            device = torch.device(f"cuda:{local_rank}")
    return device


def init_distributed(device_name: str = "auto") -> DistContext:
    """Join the process group when launched by ``torchrun`` (gloo on CPU, nccl on GPU); else one process."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = pick_device(device_name, local_rank)
    if world <= 1:
        return DistContext(device=device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        # before the group exists, so that its default arguments hold None, not the group (module docstring)
        import torch.distributed.nn.functional as _dist_nn  # noqa: F401

        dist.init_process_group(backend=backend, rank=rank, world_size=world)
    return DistContext(rank=rank, world_size=world, local_rank=local_rank, device=device, backend=backend)


def shard(global_batch: torch.Tensor, ctx: DistContext) -> torch.Tensor:
    """This process's contiguous slice of a global batch of indices (the global batch splits evenly)."""
    per = len(global_batch) // ctx.world_size
    return global_batch[ctx.rank * per:(ctx.rank + 1) * per]


def check_batch(batch_size: int, ctx: DistContext) -> None:
    if batch_size % ctx.world_size:
        raise ConfigError(f"--batch-size {batch_size} is the global batch and must split evenly over "
                          f"{ctx.world_size} processes; use a multiple of {ctx.world_size}")
