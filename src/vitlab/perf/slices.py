"""Sliced (threaded) steps: a batch computed as concurrent row slices on a thread pool, the same arithmetic as one
call up to float rounding. ``sliced_backward`` computes the gradient of a batch's mean loss as the weighted sum of
its slices' gradients, taken concurrently (torch releases the GIL inside its kernels) and summed in slice order, so
the result does not depend on which thread finishes first. Random layers draw from the slice's own generator
(:func:`vitlab.slice_rng.slice_generator`), seeded from the global one; a model whose random or batch-coupled layers
cannot be sliced is told by :func:`rng_is_thread_safe` and :func:`batch_coupled`."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor

import torch
from torch import Tensor, nn

from vitlab.errors import ConfigError
from vitlab.perf.cpu import flushes_denormals
from vitlab.slice_rng import _local


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
