"""The normalisation a checkpoint was trained with, carried into the loaded model's ``pretrained_cfg`` (timm's
data config; see :mod:`vitlab.models.pretrained_cfg`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from torch import nn

from vitlab.data import normalization
from vitlab.errors import DataError
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
    try:
        config = json.loads(file.read_text())
    except (OSError, ValueError):
        return model
    if isinstance(config, dict) and str(config.get("format", "")).startswith("vitlab-checkpoint/"):
        apply_checkpoint_config(model, config)
    return model
