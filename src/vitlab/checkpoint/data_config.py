"""The normalisation a checkpoint was trained with, carried into the loaded model's ``pretrained_cfg`` (timm's
data config; see :mod:`vitlab.models.pretrained_cfg`), and the check of the data part of a ``config.json``
(:func:`check_run_data`): the values every load uses are validated as the command line validates them."""

from __future__ import annotations

import math
import numbers
from pathlib import Path
from typing import Any

from torch import nn

from vitlab.checkpoint.textfiles import read_json
from vitlab.data import normalization
from vitlab.errors import CheckpointError, DataError
from vitlab.models import ModelConfig
from vitlab.models.pretrained_cfg import VITLAB_PIPELINE, build_pretrained_cfg, set_pretrained_cfg


def run_statistics(config: dict[str, Any], in_chans: int) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """(mean, std) of a checkpoint's ``config.json`` at ``in_chans`` channels: the run's own when the channel
    count matches, else its data set's converted to ``in_chans``; None when neither is known."""
    run = config.get("run") or {}
    data = run.get("data") or {}
    if data.get("mean") and data.get("std") and len(data["mean"]) == in_chans == len(data["std"]):
        return tuple(data["mean"]), tuple(data["std"])
    if run.get("dataset"):
        try:
            return normalization(run["dataset"], in_chans)
        except DataError:
            return None
    return None


def apply_checkpoint_config(model: nn.Module, config: dict[str, Any]) -> nn.Module:
    """Give ``model`` (vitlab or timm) the normalisation and class names of the checkpoint whose ``config.json``
    is ``config``."""
    cfg = getattr(model, "cfg", None)
    in_chans = cfg.in_chans if isinstance(cfg, ModelConfig) else int(
        (getattr(model, "pretrained_cfg", None) or {}).get("input_size", (getattr(model, "in_chans", 3),))[0])
    stats = run_statistics(config, in_chans)
    if stats is None:
        return model
    if isinstance(cfg, ModelConfig):
        classes = ((config.get("run") or {}).get("data") or {}).get("classes")
        set_pretrained_cfg(model, build_pretrained_cfg(cfg, mean=stats[0], std=stats[1], label_names=classes))
    else:
        old = dict(getattr(model, "pretrained_cfg", None) or {})
        set_pretrained_cfg(model, {**old, **VITLAB_PIPELINE, "mean": stats[0], "std": stats[1]})
    return model


def apply_checkpoint_file(model: nn.Module, path: str | Path) -> nn.Module:
    """:func:`apply_checkpoint_config` with the ``config.json`` of the checkpoint at ``path`` (its directory or a
    weight file inside it); a path without a vitlab ``config.json`` leaves ``model`` as it is."""
    p = Path(path)
    file = p / "config.json" if p.is_dir() else p.parent / "config.json"
    try:  # a config.json that is not vitlab's (or not JSON) is someone else's file: left alone, as a missing one
        config = read_json(file, fix="", error=CheckpointError)
    except CheckpointError:
        return model
    if isinstance(config, dict) and str(config.get("format", "")).startswith("vitlab-checkpoint/"):
        apply_checkpoint_config(model, config)
    return model


def check_run_data(config: dict[str, Any], file: Path, in_chans: int, num_classes: int | None) -> None:
    """Refuse, in one line naming ``file``, a ``config.json`` whose ``run`` / ``run.data`` values no run could have
    written: a normalisation that is not one positive finite std (and one finite mean) per channel of the model's
    ``in_chans``, class names that are not distinct non-empty text, one per class of the model."""
    run = config.get("run")
    if run is None:
        return
    problem = _run_problem(run, in_chans, num_classes)
    if problem:
        raise CheckpointError(f"{file}: {problem}; restore the file from a good copy of the run (or re-save the "
                              "checkpoint)")


def _finite(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)


def _run_problem(run: Any, in_chans: int, num_classes: int | None) -> str:
    if not isinstance(run, dict):
        return f"run must be a mapping of run options, got {type(run).__name__}"
    data = run.get("data")
    if data is None:
        return ""
    if not isinstance(data, dict):
        return f"run.data must be a mapping (classes, mean, std, ...), got {type(data).__name__}"
    per = f"{in_chans} (one per channel)"
    mean, std = data.get("mean"), data.get("std")
    if mean is not None and not (isinstance(mean, list) and len(mean) == in_chans and all(map(_finite, mean))):
        return f"run.data mean must be {in_chans} finite number{'s' if in_chans > 1 else ''}, one per channel, " \
               f"got {mean!r}"
    if std is not None and not (isinstance(std, list) and len(std) == in_chans
                                and all(_finite(v) and v > 0 for v in std)):
        return f"run.data std must be positive finite numbers, {per}, got {std!r} (a std of 0 divides by zero)"
    classes = data.get("classes")
    if classes is None:
        return ""
    if not isinstance(classes, list) or not all(isinstance(c, str) and c for c in classes):
        return f"run.data class names must be non-empty text, got {str(classes)[:80]}"
    if len(set(classes)) != len(classes):
        return "run.data class names must be distinct, got " + str(classes)[:80]
    if num_classes and len(classes) != num_classes:
        return f"run.data holds {len(classes)} class names for a model of {num_classes} classes"
    return ""
