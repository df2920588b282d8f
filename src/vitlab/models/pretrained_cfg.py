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

from vitlab.catalog import CATALOG
from vitlab.models.config import ModelConfig

Stats = tuple[tuple[float, ...], tuple[float, ...]]
IMAGENET: Stats = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))  # timm.data.IMAGENET_DEFAULT_MEAN / _STD
LUMA = (0.299, 0.587, 0.114)  # ITU-R 601, the 3 -> 1 channel weights of vitlab.data
# presets made for one data set: that data set's statistics (vitlab.data's table; a test keeps them equal)
PRESET_STATS: dict[str, Stats] = {name: (CATALOG["mnist"].mean, CATALOG["mnist"].std)
                                  for name in ("vit_mnist", "vit_mnist_gap", "vit_mnist_conv",
                                               "vit_mnist_conv_patch14")}
PRESET_STATS["vit_fashion_conv_patch14"] = (CATALOG["fashion-mnist"].mean, CATALOG["fashion-mnist"].std)
# vitlab's own pipeline resizes whole images bilinearly (no crop); timm's ViT defaults otherwise
VITLAB_PIPELINE = {"interpolation": "bilinear", "crop_pct": 1.0}
TIMM_VIT_PIPELINE = {"interpolation": "bicubic", "crop_pct": 0.9}


def channel_statistics(mean: tuple[float, ...], std: tuple[float, ...], in_chans: int) -> Stats:
    """(mean, std) given per channel, at ``in_chans`` channels: unchanged at the same count; RGB to one channel
    takes the luminance-weighted values (as vitlab.data converts RGB statistics); one channel is repeated;
    any other change repeats the channel average."""
    mean, std = tuple(float(m) for m in mean), tuple(float(s) for s in std)
    if len(mean) == in_chans:
        return mean, std
    if in_chans == 1 and len(mean) == 3:
        return (round(sum(w * m for w, m in zip(LUMA, mean)), 4),), (round(sum(w * s for w, s in zip(LUMA, std)), 4),)
    if len(mean) == 1:
        return mean * in_chans, std * in_chans
    return (round(sum(mean) / len(mean), 4),) * in_chans, (round(sum(std) / len(std), 4),) * in_chans


def imagenet_statistics(in_chans: int) -> Stats:
    """ImageNet's (mean, std) at ``in_chans`` channels (:func:`channel_statistics`)."""
    return channel_statistics(*IMAGENET, in_chans)


def fit_timm_pretrained_cfg(model: nn.Module, kwargs: dict[str, Any]) -> nn.Module:
    """Make a timm model's ``pretrained_cfg`` describe the model that ``timm.create_model(name, **kwargs)`` built.

    timm keeps the architecture's default ``pretrained_cfg`` when a model is built at another size: a ViT-Tiny
    built with ``img_size=28, in_chans=1, num_classes=10`` still reports ``input_size (3, 224, 224)``, three
    channel means and 1000 classes, so ``timm.data.resolve_data_config(model=m)`` makes a pipeline the model
    cannot take. Here the input size, the channel count of the statistics and the class count follow
    ``kwargs``; a ``test_input_size`` for the default size is dropped when the size changes."""
    old = dict(getattr(model, "pretrained_cfg", None) or {})
    if not old:
        return model
    c, h, w = old.get("input_size") or (3, 224, 224)
    in_chans = int(kwargs.get("in_chans", c))
    new = dict(old)
    size = kwargs.get("img_size")
    if size is not None:
        h, w = (size, size) if isinstance(size, int) else tuple(size)
        new.pop("test_input_size", None)
    new["input_size"] = (in_chans, int(h), int(w))
    if old.get("mean") is not None and old.get("std") is not None:
        new["mean"], new["std"] = channel_statistics(old["mean"], old["std"], in_chans)
    if kwargs.get("num_classes") is not None:
        new["num_classes"] = int(kwargs["num_classes"])
        if int(kwargs["num_classes"]) != old.get("num_classes"):
            new.pop("label_names", None)
    set_pretrained_cfg(model, new)
    return model


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
