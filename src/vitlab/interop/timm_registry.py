"""vitlab presets in timm's model registry, so timm's own code (``create_model``, ``validate.py``) builds them.

Two spellings name preset ``P``: ``vitlab.P`` (one timm architecture ``vitlab`` whose pretrained tags are the
presets) and ``vitlab_P`` (one architecture per preset; ``timm.list_models('vitlab_*')`` lists them). Both
return the vitlab model itself, so every keyword of :class:`vitlab.ModelConfig` passes through
(``num_classes``, ``img_size``, ``in_chans``, ``depth``, ``dynamic_img_size``...).

timm's construction arguments work as for timm's own ViTs: ``features_only=True`` (with ``out_indices``,
``feature_cls``) returns timm's feature extractor with ``feature_info``, ``device=`` / ``dtype=`` create the model
there (``device='meta'``: shapes only).

Weights: ``checkpoint_path=RUN/model.safetensors`` (timm's loader, strict), or ``pretrained=True,
pretrained_cfg_overlay=dict(file=RUN)``, which rebuilds the checkpoint's own architecture and carries its
normalisation in ``pretrained_cfg``.
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import torch
from timm.models import PretrainedCfg
from timm.models._features import FeatureDictNet, FeatureGetterNet, FeatureHookNet, FeatureListNet
from timm.models._features_fx import FeatureGraphNet
from timm.models._registry import DefaultCfg, is_model, model_entrypoint, register_model
from torch import nn

from vitlab.errors import ConfigError
from vitlab.models import PRESETS, VitlabModel, create_model, get_config
from vitlab.models.base import build_placed
from vitlab.models.pretrained_cfg import build_pretrained_cfg, set_pretrained_cfg

ARCH = "vitlab"  # timm.create_model("vitlab.<preset>")
PREFIX = "vitlab_"  # timm.create_model("vitlab_<preset>")

__all__ = ["ARCH", "PREFIX", "register_timm", "timm_names"]

default_cfgs: dict[str, DefaultCfg] = {}  # read by timm's register_model: this module's pretrained cfgs

# timm's builder maps feature_cls names so (timm.models._builder.build_model_with_cfg)
FEATURE_CLASSES: dict[str, type[nn.Module]] = {"getter": FeatureGetterNet, "hook": FeatureHookNet,
                                               "list": FeatureListNet, "dict": FeatureDictNet, "fx": FeatureGraphNet}


def timm_names(dotted: bool = True) -> list[str]:
    """The names timm knows vitlab's presets by: ``vitlab.P`` (``dotted``) or ``vitlab_P``."""
    return [f"{ARCH}.{p}" if dotted else f"{PREFIX}{p}" for p in PRESETS]


def register_timm() -> list[str]:
    """Register every vitlab preset in timm's registry (idempotent); returns the ``vitlab_P`` names.

    ``import vitlab`` calls this itself when timm is already imported; import timm first, or call it."""
    if model_entrypoint_is_ours(ARCH):
        return timm_names(dotted=False)
    cfgs = {p: PretrainedCfg(**build_pretrained_cfg(get_config(p))) for p in PRESETS}
    default_cfgs[ARCH] = DefaultCfg(tags=deque(PRESETS), cfgs=dict(cfgs))
    _register(ARCH, _dotted_entrypoint)
    for preset, cfg in cfgs.items():
        default_cfgs[PREFIX + preset] = DefaultCfg(tags=deque([""]), cfgs={"": cfg})
        _register(PREFIX + preset, _preset_entrypoint(preset))
    return timm_names(dotted=False)


def model_entrypoint_is_ours(name: str) -> bool:
    return is_model(name) and getattr(model_entrypoint(name), "__module__", None) == __name__


def _register(name: str, fn: Callable[..., VitlabModel]) -> None:
    fn.__name__ = fn.__qualname__ = name
    fn.__module__ = __name__
    setattr(sys.modules[__name__], name, fn)
    register_model(fn)


def _dotted_entrypoint(pretrained: bool = False, pretrained_cfg: Any = None, **kwargs: Any) -> VitlabModel:
    """timm passes the tag of ``vitlab.<preset>`` as ``pretrained_cfg``."""
    preset = pretrained_cfg.tag if isinstance(pretrained_cfg, PretrainedCfg) else pretrained_cfg
    if not isinstance(preset, str) or preset not in PRESETS:
        raise ConfigError(f"name a vitlab preset after the dot, e.g. timm.create_model('{ARCH}.vit_mnist'); "
                          f"got {preset!r}; `vitlab models` lists them")
    return build_timm_model(preset, pretrained=pretrained, **kwargs)


def _preset_entrypoint(preset: str) -> Callable[..., VitlabModel]:
    def entry(pretrained: bool = False, pretrained_cfg: Any = None, **kwargs: Any) -> VitlabModel:
        if isinstance(pretrained_cfg, str) and pretrained_cfg:
            raise ConfigError(f"{PREFIX}{preset} has no pretrained tag {pretrained_cfg!r}; drop the "
                              f"'.{pretrained_cfg}'")
        kwargs.pop("pretrained_model_args", None)  # timm's copy of a Hub folder's model_args, already in kwargs
        if isinstance(pretrained_cfg, dict | PretrainedCfg) and _hub_source(pretrained_cfg):
            kwargs["hub_cfg"] = pretrained_cfg if isinstance(pretrained_cfg, dict) else pretrained_cfg.to_dict()
        return build_timm_model(preset, pretrained=pretrained, **kwargs)

    entry.__doc__ = f"vitlab preset {preset} (see vitlab.create_model)."
    return entry


def build_timm_model(preset: str, *, pretrained: bool = False, features_only: bool = False,
                     out_indices: int | Sequence[int] = 3, feature_cls: str | type = "getter",
                     device: torch.device | str | None = None, dtype: torch.dtype | None = None,
                     **kwargs: Any) -> nn.Module:
    """:func:`build_for_timm` under the construction arguments timm's builder (``build_model_with_cfg``) reads for
    every model: the model is created on ``device`` in ``dtype``; ``features_only`` returns timm's feature
    extractor (``feature_cls``, default ``'getter'``: timm's ``FeatureGetterNet`` over ``forward_intermediates``,
    the blocks after the last of ``out_indices`` pruned, as timm builds its ViTs) with ``feature_info``;
    ``out_indices``: the blocks it returns (int n: the last n; default the last 3, as timm's ViT and CaiT)."""
    model = build_placed(lambda: build_for_timm(preset, pretrained=pretrained, **kwargs), device, dtype)
    if not features_only:
        return model
    cls = FEATURE_CLASSES.get(feature_cls.lower()) if isinstance(feature_cls, str) else feature_cls
    if cls is None:
        raise ConfigError(f"unknown feature_cls {feature_cls!r}; choose one of {', '.join(FEATURE_CLASSES)}")
    from timm.models._builder import pretrained_cfg_for_features

    features = cls(model, out_indices=out_indices)
    features.pretrained_cfg = features.default_cfg = pretrained_cfg_for_features(model.pretrained_cfg)
    features.in_chans = model.cfg.in_chans
    return features


def _hub_source(cfg: dict | PretrainedCfg) -> bool:
    """Whether timm passed the ``pretrained_cfg`` of a Hub folder (``hf-hub:ORG/NAME``, ``local-dir:DIR``)."""
    source = cfg.get("source") if isinstance(cfg, dict) else cfg.source
    return source in ("hf-hub", "local-dir")


def build_for_timm(preset: str, *, pretrained: bool = False, pretrained_cfg_overlay: dict | None = None,
                   cache_dir: Any = None, hub_cfg: dict | None = None, **kwargs: Any) -> VitlabModel:
    """The vitlab model for ``timm.create_model``: timm's arguments read, then the one road of
    :func:`vitlab.create_model` (preset ``preset`` with ``kwargs`` as :class:`ModelConfig` overrides);
    ``pretrained=True`` loads ``pretrained_cfg_overlay['file']`` (a vitlab checkpoint or weight file), or with
    ``hub_cfg`` (the ``pretrained_cfg`` of a Hub folder, ``vitlab.interop.hub``) that folder's weights."""
    if hub_cfg is not None:
        return _build_from_hub(preset, hub_cfg, pretrained=pretrained, cache_dir=cache_dir, **kwargs)
    overlay = dict(pretrained_cfg_overlay or {})
    file = overlay.pop("file", None)
    if pretrained:
        if not file:
            raise ConfigError(f"vitlab preset {preset} has no downloadable weights; load a checkpoint with "
                              "pretrained_cfg_overlay=dict(file='RUN_DIR') or "
                              "checkpoint_path='RUN_DIR/model.safetensors'")
        from vitlab.interop.pretrained import load_pretrained, read_weights

        _, file_cfg = read_weights(file)
        if file_cfg is not None and file_cfg.name not in ("", preset):
            raise ConfigError(f"{file} holds a {file_cfg.name} model, not {preset}; create it as "
                              f"'{ARCH}.{file_cfg.name}'")
        model = load_pretrained(None if file_cfg is not None else preset, file, **kwargs)
    else:
        model = create_model(preset, **kwargs)
    if overlay:
        set_pretrained_cfg(model, {**model.pretrained_cfg, **overlay})
    return model


def _build_from_hub(preset: str, hub_cfg: dict, *, pretrained: bool, cache_dir: Any = None,
                    **kwargs: Any) -> VitlabModel:
    """The model of a Hub folder (``timm.create_model("local-dir:DIR")``: ``kwargs`` hold its ``model_args``), its
    weights loaded by timm's own loader when ``pretrained`` (adapted to another size, channel or class count as
    :func:`vitlab.load_pretrained` adapts them), and its ``pretrained_cfg`` (normalisation, class names)."""
    from timm.models import load_pretrained as load_timm_pretrained

    from vitlab.interop.pretrained import adapt_state_dict

    model = create_model(preset, **kwargs)
    if pretrained:
        load_timm_pretrained(model, pretrained_cfg=hub_cfg, num_classes=model.cfg.num_classes,
                             in_chans=model.cfg.in_chans, filter_fn=adapt_state_dict, cache_dir=cache_dir)
    cfg = {**hub_cfg, "input_size": model.pretrained_cfg["input_size"], "num_classes": model.cfg.num_classes}
    if hub_cfg.get("num_classes") != model.cfg.num_classes:
        cfg.pop("label_names", None)
    set_pretrained_cfg(model, cfg)
    return model
