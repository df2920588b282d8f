"""The random generator of the batch slice a thread is computing.

:func:`vitlab.perf.sliced_backward` runs the slices of a batch concurrently and gives each its own generator;
random layers (:class:`vitlab.layers.DropPath`) draw from :func:`slice_generator`, so that their draws do not
depend on thread timing. A small module of its own so that the layers need not import ``vitlab.perf``.
"""

from __future__ import annotations

import threading

import torch

_local = threading.local()  # .generator: this thread's slice generator; .threads: its torch thread count


def slice_generator() -> torch.Generator | None:
    """The generator of the batch slice this thread is computing (inside :func:`sliced_backward`), else None:
    random layers pass it to their draws so that each slice's randomness does not depend on thread timing."""
    return getattr(_local, "generator", None)
