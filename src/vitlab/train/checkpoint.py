"""Checkpoints: ``model.safetensors`` + ``config.json`` (+ ``state.pt`` to resume), each written atomically.

A checkpoint directory holds

- ``model.safetensors``: the weights (``safetensors.torch.save_file``; never unpickled);
- ``config.json``: ``{"format": "vitlab-checkpoint/1", "model": <ModelConfig.to_dict() or
  {"timm": NAME, "kwargs": {...}}>, "run": <run config>, "vitlab_version": ...}``;
- ``state.pt`` (training runs): model, optimiser, scheduler, EMA, step, epoch, RNG and metrics, plain
  tensors and numbers only, read back with ``torch.load(weights_only=True)``. It carries its own copy of
  the weights, so resuming reads one file that is replaced in a single step.

Every file goes to a temporary name in the same directory and is then ``os.replace``-d: a kill mid-write
leaves the previous file intact and no partial file under the final name.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vitlab.atomic import atomic_path
from vitlab.errors import CheckpointError
from vitlab.models import build_model, get_config
from vitlab.models.pretrained_cfg import apply_checkpoint_config
from vitlab.train.models import TIMM_PREFIX, create_timm, is_timm, model_from_spec, spec_label, spec_of, unwrap

FORMAT = "vitlab-checkpoint/1"
WEIGHTS, CONFIG, STATE = "model.safetensors", "config.json", "state.pt"


def atomic_write(path: str | Path, write: Callable[[str], None]) -> None:
    """Call ``write(tmp_path)`` on a temporary file beside ``path``, fsync it, then rename it to ``path``."""
    with atomic_path(path) as tmp:
        write(str(tmp))


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    def write(tmp: str) -> None:
        with open(tmp, "wb") as fh:
            fh.write(data)

    atomic_write(path, write)


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def weights_of(model: nn.Module) -> dict[str, torch.Tensor]:
    """CPU copies of the state dict (separate storage per tensor, as safetensors requires)."""
    return {k: v.detach().to("cpu", copy=True).contiguous() for k, v in unwrap(model).state_dict().items()}


def save_checkpoint(out_dir: str | Path, model: nn.Module, *, run_config: dict | None = None,
                    train_state: dict | None = None) -> Path:
    """Write ``model.safetensors``, ``config.json`` and, when given, ``state.pt`` into ``out_dir``."""
    from safetensors.torch import save_file

    from vitlab import __version__

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name in (STATE, WEIGHTS, CONFIG):  # temporaries a SIGKILL left mid-write (this is the only writer)
        for stale in out.glob(f".{name}.*.tmp"):
            stale.unlink(missing_ok=True)
    config = {"format": FORMAT, "model": spec_of(model), "run": run_config, "vitlab_version": __version__}
    if train_state is not None:
        buf = io.BytesIO()
        torch.save(train_state, buf)
        atomic_write_bytes(out / STATE, buf.getvalue())
    weights = weights_of(model)
    atomic_write(out / WEIGHTS, lambda tmp: save_file(weights, tmp, metadata={"format": FORMAT}))
    atomic_write_text(out / CONFIG, json.dumps(config, indent=2) + "\n")
    return out


def _checkpoint_dir(path: str | Path) -> Path:
    path = Path(path)
    if path.is_file() and path.name == WEIGHTS:
        return path.parent
    if path.is_file():
        raise CheckpointError(f"{path} is not a checkpoint; pass the checkpoint directory (with {WEIGHTS} and "
                              f"{CONFIG}) or its {WEIGHTS}")
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {path} does not exist; pass the --output directory of a "
                              "`vitlab train` run")
    return path


def read_config(path: str | Path) -> dict[str, Any]:
    """The ``config.json`` of a checkpoint directory (or of the directory of its ``model.safetensors``)."""
    d = _checkpoint_dir(path)
    file = d / CONFIG
    if not file.is_file():
        raise CheckpointError(f"{d} has no {CONFIG}, so its architecture is unknown; load weights saved by "
                              f"`vitlab train --output DIR` or vitlab.train.save_checkpoint (which write "
                              f"{WEIGHTS} and {CONFIG} together), or load raw timm weights with vitlab.interop")
    try:
        config = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{file} is not valid JSON ({exc}); re-save the checkpoint") from exc
    if not isinstance(config, dict) or config.get("format") != FORMAT or "model" not in config:
        raise CheckpointError(f"{file} is not a {FORMAT} config; re-save the checkpoint with vitlab")
    return config


def read_weights(path: str | Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    file = _checkpoint_dir(path) / WEIGHTS
    if not file.is_file():
        raise CheckpointError(f"{file.parent} has no {WEIGHTS}; pass the directory of a finished or "
                              "interrupted `vitlab train` run")
    try:
        return load_file(str(file))
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{file} is not a readable safetensors file ({exc}); re-save it") from exc


def state_mismatch(expected: dict[str, torch.Tensor], found: dict[str, torch.Tensor]) -> str:
    """'' when both state dicts have the same keys and shapes, else a short description of the differences."""
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    shapes = [f"{k} {tuple(found[k].shape)} vs {tuple(expected[k].shape)}"
              for k in sorted(set(expected) & set(found)) if found[k].shape != expected[k].shape]

    def few(items: list[str]) -> str:
        return ", ".join(items[:4]) + (f", ... ({len(items)} in all)" if len(items) > 4 else "")

    parts = []
    if missing:
        parts.append(f"{len(missing)} missing keys ({few(missing)})")
    if unexpected:
        parts.append(f"{len(unexpected)} unexpected keys ({few(unexpected)})")
    if shapes:
        parts.append(f"{len(shapes)} shape mismatches, checkpoint vs model ({few(shapes)})")
    return "; ".join(parts)


def _config_diff(saved: dict[str, Any], wanted: dict[str, Any]) -> str:
    keys = [k for k in ("arch", "name", "timm", "embed_dim", "depth", "num_heads", "patch_size", "img_size",
                        "in_chans", "num_classes", "attn", "gate") if saved.get(k) != wanted.get(k)]
    return ", ".join(f"{k} {saved.get(k)!r} vs {wanted.get(k)!r}" for k in keys)


def load_model(path: str | Path, *, model: str | None = None, **overrides: Any) -> nn.Module:
    """Rebuild the model of a checkpoint and load its weights, checking every key and shape.

    ``overrides`` change options of the stored architecture (``drop_path_rate=0``...). ``model`` names the
    architecture the caller expects instead (a preset or ``timm:NAME``, built at the checkpoint's
    img_size/in_chans/num_classes unless overridden); a checkpoint of another architecture raises
    :class:`CheckpointError` listing the mismatch.
    """
    config = read_config(path)
    spec = config["model"]
    if model is None:
        try:
            net = model_from_spec(spec, **overrides)
        except ValueError as exc:
            raise CheckpointError(f"cannot rebuild the model of {path} ({exc})") from exc
    else:
        stored = spec.get("kwargs", {}) if "timm" in spec else spec
        shape = ("img_size", "patch_size", "in_chans", "num_classes")
        opts = {k: stored[k] for k in shape if stored.get(k) is not None}
        opts.update(overrides)
        if is_timm(model):
            net = create_timm(model[len(TIMM_PREFIX):], opts)
        else:
            cfg = get_config(model, **opts)
            net = build_model(cfg)
            net.vitlab_spec = cfg.to_dict()
    weights = read_weights(path)
    expected = net.state_dict()
    problem = state_mismatch(expected, weights)
    if problem and model is None and not overrides:  # the two files disagree with each other
        raise CheckpointError(f"checkpoint {path}: {WEIGHTS} does not fit the {spec_label(spec)} model its {CONFIG} "
                              f"describes: {problem}; the two files come from different runs or were edited, "
                              "restore both from the same run")
    if problem:
        wanted = spec_of(net)
        diff = _config_diff(spec, wanted) if "timm" not in spec and "timm" not in wanted else ""
        raise CheckpointError(
            f"checkpoint {path} holds a {spec_label(spec)} model but a {spec_label(wanted)} model was asked for"
            f"{f' ({diff})' if diff else ''}: {problem}; load it without --model/overrides, or pass the "
            "matching --model")
    net.load_state_dict(weights)
    return apply_checkpoint_config(net, config)  # pretrained_cfg: the run's normalisation, for timm.data


def load_train_state(path: str | Path) -> dict[str, Any]:
    """The ``state.pt`` of a checkpoint directory, loaded with ``weights_only=True`` (no code is unpickled)."""
    file = _checkpoint_dir(path) / STATE
    if not file.is_file():
        raise CheckpointError(f"{file.parent} has no {STATE} to resume from; it was saved without training "
                              "state (start a new run, or fine-tune from its weights)")
    try:
        return torch.load(file, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unpickling failure is a bad file
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CheckpointError(f"{file} cannot be read safely ({msg}); it is damaged or not a vitlab state file, "
                              "start a new run") from exc
