"""The checkpoint directory: ``model.safetensors`` + ``config.json`` (+ ``state.pt`` to resume), each written
atomically, and the weight files ``load_pretrained`` reads.

A checkpoint directory holds

- ``model.safetensors``: the weights (``safetensors.torch.save_file``; never unpickled);
- ``config.json``: ``{"format": "vitlab-checkpoint/1", "model": <ModelSpec.to_dict()>, "run": <run config>,
  "vitlab_version": ...}``;
- ``state.pt`` (training runs): model, optimiser, scheduler, EMA, step, epoch, RNG and metrics, plain
  tensors and numbers only, read back with ``torch.load(weights_only=True)``. It carries its own copy of
  the weights, so resuming reads one file that is replaced in a single step;
- ``manifest.json``: the SHA-256 and size of ``model.safetensors``, ``config.json`` and ``state.pt``, checked on
  every load (:mod:`vitlab.checkpoint.manifest`; ``verify=False`` skips the check). The values of ``config.json``
  are validated on every load, checked or not (:func:`read_config`).

Every file goes to a temporary name in the same directory and is then ``os.replace``-d (``vitlab.atomic``):
a kill mid-write leaves the previous file intact and no partial file under the final name. A write that fails
(a full disk) raises a one-line :class:`~vitlab.errors.WriteError` and leaves the previous checkpoint loadable.
"""

from __future__ import annotations

import io
import json
import os
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from vitlab import atomic
from vitlab.checkpoint import manifest
from vitlab.checkpoint.data_config import apply_checkpoint_config, check_run_data
from vitlab.checkpoint.legacy import rename_legacy_keys
from vitlab.checkpoint.manifest import MANIFEST
from vitlab.checkpoint.spec import ModelSpec, spec_of, unwrap
from vitlab.checkpoint.textfiles import read_json
from vitlab.checkpoint.weights import TORCH_SUFFIXES, read_safetensors, read_torch, safetensors_bytes
from vitlab.errors import CheckpointError
from vitlab.models import ModelConfig, create_model
from vitlab.version import __version__

FORMAT = "vitlab-checkpoint/1"
WEIGHTS, CONFIG, STATE = "model.safetensors", "config.json", "state.pt"


def weights_of(model: nn.Module) -> dict[str, torch.Tensor]:
    """CPU copies of the state dict (separate storage per tensor, as safetensors requires)."""
    return {k: v.detach().to("cpu", copy=True).contiguous() for k, v in unwrap(model).state_dict().items()}


def save_checkpoint(out_dir: str | Path, model: nn.Module, *, run_config: dict | None = None,
                    train_state: dict | None = None) -> Path:
    """Write ``model.safetensors``, ``config.json``, ``manifest.json`` and, when given, ``state.pt`` into
    ``out_dir``; a failed write raises :class:`~vitlab.errors.WriteError` and keeps the previous checkpoint."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name in (STATE, WEIGHTS, CONFIG, MANIFEST):  # temporaries a SIGKILL left mid-write (the only writer)
        for stale in out.glob(f".{name}.*.tmp"):
            stale.unlink(missing_ok=True)
    config = {"format": FORMAT, "model": spec_of(model).to_dict(), "run": run_config, "vitlab_version": __version__}
    blobs = {}
    if train_state is not None:
        buf = io.BytesIO()
        torch.save(train_state, buf)
        blobs[STATE] = buf.getvalue()
    blobs[WEIGHTS] = safetensors_bytes(weights_of(model), {"format": FORMAT})
    blobs[CONFIG] = (json.dumps(config, indent=2) + "\n").encode()
    kept = "the previous checkpoint in it is kept and loads" if (out / CONFIG).is_file() else "no checkpoint yet"
    try:
        files = manifest.begin(out, {k: manifest.entry_of(v) for k, v in blobs.items()}, (WEIGHTS, STATE, CONFIG))
        for name, data in blobs.items():  # state.pt first: it alone is read to resume
            atomic.atomic_write_bytes(out / name, data)
        manifest.commit(out, files)
    except OSError as exc:
        raise atomic.write_error("the checkpoint", out, exc, sum(map(len, blobs.values())),
                                 f"free some space there ({kept})") from exc
    return out


def is_run_folder(folder: str | Path) -> bool:
    """True when ``folder`` holds vitlab's marker, the ``config.json`` (a file, not a link) whose ``format`` is
    :data:`FORMAT` that every checkpoint writes: the folder of a vitlab run or ``save_checkpoint``."""
    file = Path(folder) / CONFIG
    try:
        if file.is_symlink() or not file.is_file() or file.stat().st_size > 1 << 24:
            return False
        config = json.loads(file.read_bytes())
    except (OSError, ValueError, RecursionError):  # RecursionError: JSON nested too deeply to read
        return False
    return isinstance(config, dict) and config.get("format") == FORMAT


def check_new_file(path: str | Path, *, overwrite: bool = False, flag: str = "--overwrite") -> Path:
    """``path`` as the target of a command that writes one file (``vitlab convert``): refused, in one line, when it
    exists and ``overwrite`` is False (``flag`` names the way to replace it), when its folder is a run folder
    (:func:`is_run_folder`; its files belong to that run, whatever ``overwrite`` says) or when the file system
    cannot hold its name."""
    p = Path(path)
    try:
        if len(os.fsencode(p.name)) + 14 > os.pathconf(p.parent if p.parent.is_dir() else ".", "PC_NAME_MAX"):
            raise CheckpointError(f"output name {p.name[:20]}... ({len(os.fsencode(p.name))} bytes) is too long for "
                                  "the file system; pick a shorter name")
        if is_run_folder(p.parent):
            raise CheckpointError(f"{p.parent} is a run folder of vitlab (its {CONFIG}, {WEIGHTS} and manifest belong "
                                  "to that run); write the output elsewhere")
        if os.path.lexists(p):
            kind = "a folder" if p.is_dir() else "a link" if p.is_symlink() else "a file"
            if overwrite and kind != "a folder":
                return p
            fix = f"pass {flag} to replace it, or " if kind != "a folder" else ""
            raise CheckpointError(f"output {p} exists ({kind}); {fix}pick another output name")
    except OSError as exc:
        raise CheckpointError(f"output {p} cannot be used ({exc.strerror or exc}); pick another output") from None
    return p


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


def read_config(path: str | Path, *, verify: bool = True) -> dict[str, Any]:
    """The ``config.json`` of a checkpoint directory (or of the directory of its ``model.safetensors``), its
    values validated (the model config, the normalisation and class names) and, unless ``verify`` is False, its
    SHA-256 checked against the ``manifest.json`` beside it."""
    d = _checkpoint_dir(path)
    file = d / CONFIG
    if not file.is_file():
        raise CheckpointError(f"{d} has no {CONFIG}, so its architecture is unknown; load weights saved by "
                              f"`vitlab train --output DIR` or vitlab.checkpoint.save_checkpoint (which write "
                              f"{WEIGHTS} and {CONFIG} together), or load raw timm weights with vitlab.interop")
    config = read_json(file, fix="re-save the checkpoint", error=CheckpointError)
    if not isinstance(config, dict) or config.get("format") != FORMAT or "model" not in config:
        raise CheckpointError(f"{file} is not a {FORMAT} config; re-save the checkpoint with vitlab")
    spec = _spec_of(config["model"], path)
    check_run_data(config, file, spec.input_shape[1], spec.options().get("num_classes"))
    if verify:
        manifest.verify(file, expected=True)
    return config


def _spec_of(model: Any, path: str | Path) -> ModelSpec:
    try:
        if not isinstance(model, dict):
            raise TypeError(f"'model' must be a mapping, got {type(model).__name__}")
        return ModelSpec.from_dict(model)
    except (ValueError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"cannot rebuild the model of {path} ({exc})") from exc


def read_spec(path: str | Path, *, verify: bool = True) -> ModelSpec:
    """The model spec of a checkpoint directory (its ``config.json`` read by :func:`read_config`)."""
    return _spec_of(read_config(path, verify=verify)["model"], path)


def _checkpoint_weights(path: str | Path, verify: bool) -> dict[str, torch.Tensor]:
    file = _checkpoint_dir(path) / WEIGHTS
    if not file.is_file():
        raise CheckpointError(f"{file.parent} has no {WEIGHTS}; pass the directory of a finished or "
                              "interrupted `vitlab train` run")
    state = read_safetensors(file)[0]
    if verify:
        manifest.verify(file)
    return state


def read_weights(path: str | os.PathLike, *, verify: bool = True) -> tuple[dict[str, Tensor], ModelConfig | None]:
    """The state dict in ``path`` and, for a vitlab checkpoint or export, its model config (else None).

    ``path``: a ``.safetensors`` file, a ``.pth``/``.pt``/``.bin`` file (read with ``weights_only=True``),
    or a checkpoint directory holding ``model.safetensors`` and ``config.json``. A file listed in the
    ``manifest.json`` beside it must match its recorded SHA-256 unless ``verify`` is False.
    """
    p = Path(path)
    if p.is_dir():
        weights = p / WEIGHTS
        if not weights.is_file():
            raise CheckpointError(f"{p} is a directory without model.safetensors; pass a vitlab checkpoint directory "
                                  f"(model.safetensors + config.json) or the weight file itself")
        state, _ = read_weights(weights, verify=verify)
        return state, _config_json(p / CONFIG, required=True, verify=verify)
    if not p.is_file():
        raise CheckpointError(f"no weight file {p}; pass an existing .safetensors or .pth file or a vitlab "
                              f"checkpoint directory")
    if p.suffix == ".safetensors":
        state, meta = read_safetensors(p)
        if verify:
            manifest.verify(p)
        if "vitlab_config" in meta:
            return state, _metadata_config(p, meta["vitlab_config"])
        return state, _config_json(p.parent / CONFIG, required=False, verify=verify)
    if p.suffix in TORCH_SUFFIXES:
        state = read_torch(p)
        if verify:
            manifest.verify(p)
        return state, None
    raise CheckpointError(f"{p} is neither .safetensors nor {'/'.join(TORCH_SUFFIXES)}; save the weights in one "
                          f"of those formats")


def _metadata_config(p: Path, text: str) -> ModelConfig:
    """The model config a ``vitlab convert`` export stores in its ``vitlab_config`` metadata (a JSON object)."""
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:  # RecursionError: nested too deeply to read
        data = exc
    if not isinstance(data, dict):
        what = "is not JSON" if isinstance(data, Exception) else f"is a JSON {type(data).__name__}"
        raise CheckpointError(f"the vitlab_config metadata of {p} {what}, not a model config object; re-export "
                              "the weights with `vitlab convert`, or load them with a model name")
    try:
        return ModelConfig.from_dict(data)
    except (ValueError, TypeError) as exc:  # ConfigError is a ValueError
        raise CheckpointError(f"the vitlab_config metadata of {p} is not a valid model config ({exc}); re-export the "
                              "weights with `vitlab convert`, or load them with a model name") from exc


def _config_json(p: Path, required: bool, verify: bool = True) -> ModelConfig | None:
    """The vitlab model config of a checkpoint's ``config.json`` (``{"model": {...}, "run": {...}}``), its values
    validated and (``verify``) its SHA-256 checked against the ``manifest.json`` beside it."""
    if not p.is_file():
        if required:
            raise CheckpointError(f"{p.parent} has no config.json; pass the weight file and the model name instead")
        return None
    try:
        data = read_json(p, fix="restore it or pass the weight file and a model name", error=CheckpointError)
    except CheckpointError:
        if required:
            raise
        return None
    model = data.get("model") if isinstance(data, dict) else None
    if not isinstance(model, dict) or "arch" not in model:
        if required:
            raise CheckpointError(f"{p} has no vitlab model config under 'model'; pass the weight file and a model "
                                  f"name")
        return None
    cfg = ModelConfig.from_dict(model)
    check_run_data(data, p, cfg.in_chans, cfg.num_classes)
    if verify:
        manifest.verify(p, expected=True)
    return cfg


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


def _config_diff(saved: ModelSpec, wanted: ModelSpec) -> str:
    if saved.is_timm or wanted.is_timm:
        return ""
    a, b = saved.config.to_dict(), wanted.config.to_dict()
    keys = [k for k in ("arch", "name", "embed_dim", "depth", "num_heads", "patch_size", "img_size",
                        "in_chans", "num_classes", "attn", "gate") if a.get(k) != b.get(k)]
    return ", ".join(f"{k} {a.get(k)!r} vs {b.get(k)!r}" for k in keys)


def load_model(path: str | Path, *, model: str | None = None, verify: bool = True, **overrides: Any) -> nn.Module:
    """Rebuild the model of a checkpoint and load its weights, checking every key and shape and (unless
    ``verify`` is False) the SHA-256 its ``manifest.json`` records.

    ``overrides`` change options of the stored architecture (``drop_path_rate=0``...). ``model`` names the
    architecture the caller expects instead (a preset or ``timm:NAME``, built at the checkpoint's
    img_size/in_chans/num_classes unless overridden); a checkpoint of another architecture raises
    :class:`CheckpointError` listing the mismatch.
    """
    spec = read_spec(path, verify=verify)
    if model is None:
        try:
            net = create_model(spec, **overrides)
        except ValueError as exc:
            raise CheckpointError(f"cannot rebuild the model of {path} ({exc})") from exc
    else:
        stored = spec.options()
        shape = ("img_size", "patch_size", "in_chans", "num_classes")
        opts = {k: stored[k] for k in shape if stored.get(k) is not None}
        net = create_model(model, **{**opts, **overrides})
    expected = net.state_dict()
    weights = rename_legacy_keys(_checkpoint_weights(path, verify), expected)
    problem = state_mismatch(expected, weights)
    if problem and model is None and not overrides:  # the two files disagree with each other
        raise CheckpointError(f"checkpoint {path}: {WEIGHTS} does not fit the {spec.label} model its {CONFIG} "
                              f"describes: {problem}; the two files come from different runs or were edited, "
                              "restore both from the same run")
    if problem:
        wanted = spec_of(net)
        diff = _config_diff(spec, wanted)
        raise CheckpointError(
            f"checkpoint {path} holds a {spec.label} model but a {wanted.label} model was asked for"
            f"{f' ({diff})' if diff else ''}: {problem}; load it without --model/overrides, or pass the "
            "matching --model")
    net.load_state_dict(weights)
    # pretrained_cfg: the run's normalisation (config.json checked by read_spec above), for timm.data
    return apply_checkpoint_config(net, read_config(path, verify=False))


def load_train_state(path: str | Path, *, verify: bool = True) -> dict[str, Any]:
    """The ``state.pt`` of a checkpoint directory, loaded with ``weights_only=True`` (no code is unpickled) and
    checked against its ``manifest.json`` unless ``verify`` is False."""
    file = _checkpoint_dir(path) / STATE
    if not file.is_file():
        raise CheckpointError(f"{file.parent} has no {STATE} to resume from; it was saved without training "
                              "state (start a new run, or fine-tune from its weights)")
    try:
        with warnings.catch_warnings():  # torch's notes on the pickle protocol: the refusal below is the one line
            warnings.simplefilter("ignore", UserWarning)
            state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unpickling failure is a bad file
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CheckpointError(f"{file} cannot be read safely ({msg}); it is damaged or not a vitlab state file, "
                              "start a new run") from exc
    if verify:
        manifest.verify(file)
    return state
