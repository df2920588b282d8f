"""Weight files: the one reader and the one writer of safetensors (and the reader of torch ``.pth`` state dicts).

Safetensors files are never unpickled; ``.pth`` files are read with ``torch.load(weights_only=True)``. Every
write goes through :func:`vitlab.atomic.atomic_write`: a temporary file, fsynced, then renamed.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import torch
from torch import Tensor

from vitlab import atomic
from vitlab.errors import CheckpointError

TORCH_SUFFIXES = (".pth", ".pt", ".bin", ".ckpt")


def read_safetensors(p: Path) -> tuple[dict[str, Tensor], dict[str, str]]:
    """The tensors and the metadata of a ``.safetensors`` file."""
    from safetensors import SafetensorError, safe_open
    from safetensors.torch import load_file

    try:
        state = load_file(p)
        with safe_open(p, framework="pt") as f:
            meta = f.metadata() or {}
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{p} is not a readable safetensors file ({first_line(exc)}); re-save it") from None
    return state, meta


def read_torch(p: Path) -> dict[str, Tensor]:
    """The state dict in a torch ``.pth`` file (also under a ``model`` / ``state_dict`` key), no code unpickled."""
    try:
        with warnings.catch_warnings():  # torch's notes on the pickle protocol: the refusal below is the one line
            warnings.simplefilter("ignore", UserWarning)
            obj = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any failure to unpickle safely means a bad file
        raise CheckpointError(f"{p} cannot be read with weights_only=True ({first_line(exc)}); vitlab never "
                              f"unpickles code: re-save it as torch.save(model.state_dict(), ...) or safetensors"
                              ) from None
    for key in ("model", "state_dict", "model_state_dict"):
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            obj = obj[key]
    if not isinstance(obj, dict) or not obj:
        raise CheckpointError(f"{p} does not hold a state dict (a dict of tensors); save model.state_dict()")
    bad = [k for k, v in obj.items() if not isinstance(v, Tensor)]
    if bad:
        raise CheckpointError(f"{p} holds non-tensor entries {', '.join(map(str, bad[:5]))}; save model.state_dict()")
    return obj


def write_safetensors(path: str | os.PathLike, tensors: dict[str, Tensor], metadata: dict[str, str] | None) -> None:
    """Write ``tensors`` (CPU, contiguous, separate storage each) to ``path`` atomically."""
    from safetensors.torch import save_file

    atomic.atomic_write(path, lambda tmp: save_file(tensors, tmp, metadata=metadata))


def safetensors_bytes(tensors: dict[str, Tensor], metadata: dict[str, str] | None) -> bytes:
    """The bytes of a ``.safetensors`` file of ``tensors`` (CPU, contiguous, separate storage each)."""
    from safetensors.torch import save

    return save(tensors, metadata=metadata)


def save_weights(state: dict[str, Tensor], path: str | os.PathLike, metadata: dict[str, str] | None = None) -> Path:
    """Write ``state`` to a ``.safetensors`` file atomically (a temporary file, fsynced, then a rename)."""
    p = check_output_path(path)
    tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in state.items()}
    write_safetensors(p, tensors, metadata)
    return p


def check_output_path(path: str | os.PathLike) -> Path:
    """``path`` as a writable ``.safetensors`` target, or a :class:`CheckpointError` naming the fix."""
    p = Path(path)
    if p.suffix != ".safetensors":
        raise CheckpointError(f"output {p} must end in .safetensors")
    if not p.parent.is_dir():
        raise CheckpointError(f"output directory {p.parent} does not exist; create it first")
    return p


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
