"""Checks a weight file passes before any model is built for it: the tensors (dense, floating-point, finite), the
block indices (``blocks.0`` to ``blocks.{N-1}``, none missing, each block with the keys of the others), the shapes the
architecture is read from; then every key and shape against the model, built on the meta device (no memory).

A file naming ``blocks.4999.*`` must not build a 5,000-block model before its missing blocks are noticed, and a
1.5 KB ``.pth`` holding a stride-0 view of shape (100000, 100000) must not allocate 40 GB: each check here reads
only shapes and storage sizes, until :func:`check_finite`, which reads the values of tensors already known to be
dense. Every refusal is one :class:`CheckpointError` line naming the key and what was expected; the callers prefix
the file (:func:`naming`)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

import torch
from torch import Tensor

from vitlab.errors import CheckpointError

NONFINITE_FIX = "pass allow_nonfinite=True (--allow-nonfinite) to convert it as it is"


@contextlib.contextmanager
def naming(where: str) -> Iterator[None]:
    """Prefix a :class:`CheckpointError` raised inside with ``where`` (the file), unless it names it already."""
    try:
        yield
    except CheckpointError as exc:
        if where in str(exc):
            raise
        raise CheckpointError(f"{where}: {exc}") from None


def check_dtypes(state: dict[str, Tensor], *, counters: tuple[str, ...] = ("num_batches_tracked",)) -> None:
    """Every value a dense tensor (its storage holds all its elements: a stride-0 view of a huge shape is refused
    before anything reads it) of a floating-point dtype, but for keys ending in one of ``counters`` (integer
    buffers such as a BatchNorm's count of batches)."""
    for key, v in state.items():
        if not isinstance(v, Tensor):
            raise CheckpointError(f"{key} is a {type(v).__name__}, expected a tensor; save model.state_dict()")
        if not v.is_floating_point() and not (key.endswith(counters) and not v.is_complex()):
            raise CheckpointError(f"{key} is a {v.dtype} tensor, expected a floating-point one; re-save the weights "
                                  f"as saved by the model (float32, float16 or bfloat16)")
        need = v.numel() * v.element_size()
        if need and need > v.untyped_storage().nbytes() - v.storage_offset() * v.element_size():
            raise CheckpointError(f"{key} of shape {tuple(v.shape)} is a view over {v.untyped_storage().nbytes():,} "
                                  f"bytes (strides {v.stride()}), expected its own {need:,} bytes of values; re-save "
                                  f"the weights with every tensor .contiguous()")


def check_finite(state: dict[str, Tensor], allow_nonfinite: bool = False) -> None:
    """Refuse a floating-point tensor holding NaN or infinity, unless ``allow_nonfinite``."""
    if allow_nonfinite:
        return
    for key, v in state.items():
        if v.is_floating_point() and v.numel():
            bad = int((~torch.isfinite(v)).sum())
            if bad:
                raise CheckpointError(f"{key} holds {bad} non-finite value{'s' * (bad > 1)} (NaN or infinity) of "
                                      f"{v.numel()}, expected finite weights (a diverged run, or a damaged file); "
                                      f"{NONFINITE_FIX}")


def block_indices(state: dict[str, Tensor], prefix: str = "blocks", *, same_keys: bool = False) -> int:
    """The number of ``{prefix}.{i}.*`` blocks, after checking their indices run 0..N-1 with none missing (and, with
    ``same_keys``, that every block holds the keys every other holds)."""
    pattern = re.compile(rf"^{re.escape(prefix)}\.(\d+)\.(.+)$")
    blocks: dict[int, set[str]] = {}
    for key in state:
        m = pattern.match(key)
        if m:
            blocks.setdefault(int(m.group(1)), set()).add(m.group(2))
    if not blocks:
        return 0
    n = max(blocks) + 1
    absent = [i for i in range(n) if i not in blocks]
    if absent:
        gap = f"{prefix}.{absent[0]}.*" + (f" to {prefix}.{absent[-1]}.*" if len(absent) > 1 else "")
        raise CheckpointError(f"missing keys {gap} ({len(absent)} of the {n} blocks {prefix}.0 to {prefix}.{n - 1} "
                              f"the keys name), expected every block index from 0 to {n - 1}; the file is damaged or "
                              f"cut: re-save the whole state dict")
    if same_keys:
        union = set().union(*blocks.values())
        for i in range(n):
            lacking = sorted(union - blocks[i])
            if lacking:
                more = f" (+{len(lacking) - 4} more)" if len(lacking) > 4 else ""
                raise CheckpointError(f"missing keys {', '.join(f'{prefix}.{i}.{s}' for s in lacking[:4])}{more}, "
                                      f"expected in every block as the other blocks hold them; the file is damaged: "
                                      f"re-save the whole state dict")
    return n


def expect(state: dict[str, Tensor], key: str, shape: tuple[int | None, ...], *, why: str = "",
           required: bool = False) -> Tensor | None:
    """``state[key]`` (None when absent and not ``required``) after checking its shape: ``shape`` gives each
    dimension, None for any size above 0."""
    v = state.get(key)
    if v is None:
        if required:
            raise CheckpointError(f"missing key {key}, expected a tensor of shape {_text(shape)}{why}")
        return None
    ok = v.ndim == len(shape) and all(s > 0 if want is None else s == want for s, want in zip(v.shape, shape))
    if not ok:
        raise CheckpointError(f"{key} has shape {tuple(v.shape)}, expected {_text(shape)}{why}; the file is damaged "
                              f"or holds another model")
    return v


def _text(shape: tuple[int | None, ...]) -> str:
    """``(N, 24)``, with ``, N > 0`` when any size is free."""
    dims = "(" + ", ".join("N" if s is None else str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"
    return dims + (" with N > 0" if None in shape else "")

