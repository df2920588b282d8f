"""timm's ``pretrained_cfg`` for vitlab models: what ``timm.data.resolve_data_config(model=m)`` reads.

Every vitlab model carries ``model.pretrained_cfg`` (and its alias ``model.default_cfg``, as timm models do):
the input size ``(C, H, W)``, the normalisation, interpolation and crop, the class count and the names of
the first convolution and the classifier. The normalisation is, in order of preference, the one a vitlab
checkpoint was trained with (set by :mod:`vitlab.checkpoint.data_config` when one is loaded), the statistics of
the data set a preset is made for (``vit_mnist``), else ImageNet's as timm assumes.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from vitlab.models.config import ModelConfig

Stats = tuple[tuple[float, ...], tuple[float, ...]]
IMAGENET: Stats = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))  # timm.data.IMAGENET_DEFAULT_MEAN / _STD
LUMA = (0.299, 0.587, 0.114)  # ITU-R 601, the 3 -> 1 channel weights of vitlab.data
# presets made for one data set: that data set's statistics (vitlab.data's table; a test keeps them equal)
PRESET_STATS: dict[str, Stats] = {"vit_mnist": ((0.1307,), (0.3081,))}
# vitlab's own pipeline resizes whole images bilinearly (no crop); timm's ViT defaults otherwise
VITLAB_PIPELINE = {"interpolation": "bilinear", "crop_pct": 1.0}
TIMM_VIT_PIPELINE = {"interpolation": "bicubic", "crop_pct": 0.9}


def imagenet_statistics(in_chans: int) -> Stats:
    """ImageNet's (mean, std) at ``in_chans`` channels: 1 takes the luminance-weighted values (as vitlab.data
    converts RGB statistics), other counts than 1 and 3 the channel average repeated."""
    mean, std = IMAGENET
    if in_chans == 3:
        return mean, std
    if in_chans == 1:
        return (round(sum(w * m for w, m in zip(LUMA, mean)), 4),), (round(sum(w * s for w, s in zip(LUMA, std)), 4),)
    return (round(sum(mean) / 3, 4),) * in_chans, (round(sum(std) / 3, 4),) * in_chans


def preset_statistics(cfg: ModelConfig) -> Stats | None:
    """The statistics of the data set preset ``cfg.name`` is made for, when ``cfg`` keeps its channel count."""
    stats = PRESET_STATS.get(cfg.name)
    return stats if stats is not None and len(stats[0]) == cfg.in_chans else None


def build_pretrained_cfg(cfg: ModelConfig, *, mean: tuple[float, ...] | None = None,
                         std: tuple[float, ...] | None = None, label_names: list[str] | None = None
                         ) -> dict[str, Any]:
    """The ``pretrained_cfg`` dict of a model built from ``cfg`` (keys are timm's ``PretrainedCfg`` fields).

    ``mean``/``std`` (a data set's or a run's) win over the preset's data set, which wins over ImageNet; with
    known statistics the pipeline is vitlab's (whole image, bilinear), else timm's ViT default."""
    stats = (tuple(mean), tuple(std)) if mean is not None and std is not None else preset_statistics(cfg)
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
