"""timm's ``pretrained_cfg`` for vitlab models: what ``timm.data.resolve_data_config(model=m)`` reads.

Every vitlab model carries ``model.pretrained_cfg`` (and its alias ``model.default_cfg``, as timm models do):
the input size ``(C, H, W)``, the normalisation, interpolation and crop, the class count and the names of
the first convolution and the classifier. The normalisation is, in order of preference, the one a vitlab
checkpoint was trained with (its ``config.json`` run config), the statistics of a known data set (a preset
made for one, such as ``vit_mnist``), else ImageNet's as timm assumes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from torch import nn

from vitlab.models.config import ModelConfig

IMAGENET_MEAN = (0.485, 0.456, 0.406)  # timm.data.IMAGENET_DEFAULT_MEAN / _STD
IMAGENET_STD = (0.229, 0.224, 0.225)
# presets made for one data set: their inputs follow that data set's statistics
PRESET_DATA = {"vit_mnist": "mnist"}
# vitlab's own pipeline resizes whole images bilinearly (no crop); timm's ViT defaults otherwise
VITLAB_PIPELINE = {"interpolation": "bilinear", "crop_pct": 1.0}
TIMM_VIT_PIPELINE = {"interpolation": "bicubic", "crop_pct": 0.9}


def data_statistics(dataset: str | None, in_chans: int) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """(mean, std) of ``dataset`` at ``in_chans`` channels, or None when unknown or not convertible."""
    if not dataset:
        return None
    from vitlab.data import normalization
    from vitlab.errors import DataError

    try:
        return normalization(dataset, in_chans)
    except DataError:
        return None


def imagenet_statistics(in_chans: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """ImageNet's (mean, std) at ``in_chans`` channels (1: the luminance-weighted values, as vitlab's data)."""
    if in_chans == 3:
        return IMAGENET_MEAN, IMAGENET_STD
    stats = data_statistics("imagefolder", in_chans)
    if stats is not None:
        return stats
    return (round(sum(IMAGENET_MEAN) / 3, 4),) * in_chans, (round(sum(IMAGENET_STD) / 3, 4),) * in_chans


def build_pretrained_cfg(cfg: ModelConfig, *, dataset: str | None = None, mean: tuple[float, ...] | None = None,
                         std: tuple[float, ...] | None = None, label_names: list[str] | None = None
                         ) -> dict[str, Any]:
    """The ``pretrained_cfg`` dict of a model built from ``cfg`` (keys are timm's ``PretrainedCfg`` fields).

    ``mean``/``std`` win over ``dataset``, which wins over the preset's data set, which wins over ImageNet."""
    dataset = dataset or PRESET_DATA.get(cfg.name)
    stats = (tuple(mean), tuple(std)) if mean is not None and std is not None else None
    stats = stats or data_statistics(dataset, cfg.in_chans)
    pipeline = VITLAB_PIPELINE if stats is not None else TIMM_VIT_PIPELINE
    mean, std = stats or imagenet_statistics(cfg.in_chans)
    out = {
        "architecture": cfg.name or cfg.arch,
        "input_size": (cfg.in_chans, cfg.img_size, cfg.img_size),
        "fixed_input_size": not cfg.dynamic_img_size,
        **pipeline,
        "crop_mode": "center",
        "mean": tuple(float(m) for m in mean),
        "std": tuple(float(s) for s in std),
        "num_classes": cfg.num_classes,
        "first_conv": "patch_embed.conv1" if cfg.stem == "conv" else "patch_embed.proj",
        "classifier": "head",
    }
    if label_names is not None and len(label_names) == cfg.num_classes:
        out["label_names"] = tuple(label_names)
    return out


def set_pretrained_cfg(model: nn.Module, cfg: dict[str, Any]) -> None:
    """Attach ``cfg`` as ``model.pretrained_cfg`` and its alias ``model.default_cfg`` (timm's attributes)."""
    model.pretrained_cfg = cfg
    model.default_cfg = cfg


def checkpoint_data(config: dict[str, Any], in_chans: int) -> dict[str, Any]:
    """``build_pretrained_cfg`` options from a vitlab checkpoint's ``config.json``: the normalisation the run
    trained with (at ``in_chans`` channels), its data set and class names."""
    run = config.get("run") or {}
    data = run.get("data") or {}
    out: dict[str, Any] = {"dataset": run.get("dataset")}
    if data.get("mean") and data.get("std") and len(data["mean"]) == in_chans == len(data["std"]):
        out.update(mean=tuple(data["mean"]), std=tuple(data["std"]))
    if data.get("classes"):
        out["label_names"] = list(data["classes"])
    return out


def apply_checkpoint_config(model: nn.Module, config: dict[str, Any]) -> nn.Module:
    """Give ``model`` (vitlab or timm) the normalisation of the checkpoint whose ``config.json`` is ``config``."""
    cfg = getattr(model, "cfg", None)
    if isinstance(cfg, ModelConfig):
        set_pretrained_cfg(model, build_pretrained_cfg(cfg, **checkpoint_data(config, cfg.in_chans)))
        return model
    old = dict(getattr(model, "pretrained_cfg", None) or {})
    in_chans = int(old.get("input_size", (getattr(model, "in_chans", 3),))[0])
    data = checkpoint_data(config, in_chans)
    stats = (data["mean"], data["std"]) if "mean" in data else data_statistics(data["dataset"], in_chans)
    if stats is not None:
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
