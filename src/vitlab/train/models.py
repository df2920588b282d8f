"""Resolve ``--model``: a vitlab preset with overrides, or ``timm:NAME`` created for the data.

Every model built here carries ``model.vitlab_spec``, the JSON-able description a checkpoint stores:
``ModelConfig.to_dict()`` for vitlab models, ``{"timm": NAME, "kwargs": {...}}`` for timm ones.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from vitlab.errors import CheckpointError, ConfigError
from vitlab.models import ModelConfig, VitlabModel, build_model, get_config

TIMM_PREFIX = "timm:"
# native size and channels of each data set: what a timm model is created for unless told otherwise
DATA_SHAPES = {"mnist": (28, 1), "mnist-5k": (28, 1), "fashion-mnist": (28, 1), "cifar10": (32, 3),
               "cifar100": (32, 3)}


def is_timm(name: str) -> bool:
    return name.startswith(TIMM_PREFIX)


def model_input(name: str, overrides: dict[str, Any], dataset: str) -> tuple[int, int]:
    """(img_size, in_chans) the data must be prepared at for this model."""
    if not is_timm(name):
        cfg = get_config(name, **_vitlab_overrides(overrides))
        return cfg.img_size, cfg.in_chans
    native = DATA_SHAPES.get(dataset)
    img_size = overrides.get("img_size", native[0] if native else None)
    in_chans = overrides.get("in_chans", native[1] if native else 3)
    if img_size is None:
        img_size = _timm_default_size(name[len(TIMM_PREFIX):])
    if isinstance(img_size, list | tuple):
        if len(set(img_size)) != 1:
            raise ConfigError(f"img_size {img_size} must be square for vitlab's data; give one number")
        img_size = img_size[0]
    return int(img_size), int(in_chans)


def _timm_default_size(name: str) -> int:
    import timm

    try:
        return int(timm.get_pretrained_cfg(name).input_size[-1])
    except (AttributeError, RuntimeError, ValueError):
        return 224


def _vitlab_overrides(overrides: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in overrides.items() if k != "num_classes"}


def create_for_run(name: str, overrides: dict[str, Any], *, num_classes: int, img_size: int,
                   in_chans: int) -> nn.Module:
    """Build ``name`` (preset or ``timm:NAME``) with ``overrides`` for ``num_classes`` classes."""
    if is_timm(name):
        kwargs = {**overrides, "img_size": img_size, "in_chans": in_chans, "num_classes": num_classes}
        return create_timm(name[len(TIMM_PREFIX):], kwargs)
    cfg = get_config(name, **{**_vitlab_overrides(overrides), "num_classes": num_classes})
    model = build_model(cfg)
    model.vitlab_spec = cfg.to_dict()
    return model


def create_timm(name: str, kwargs: dict[str, Any]) -> nn.Module:
    """``timm.create_model(name, pretrained=False, **kwargs)`` with one-line errors."""
    import timm

    if not timm.is_model(name):
        import difflib

        close = difflib.get_close_matches(name, timm.list_models(), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ConfigError(f"timm has no model {name!r}{hint} (python -c 'import timm; print(timm.list_models())')")
    kwargs = dict(kwargs)
    if "drop_path_rule" in kwargs:
        raise ConfigError("timm models have no drop_path_rule (timm uses the linear rule); drop --drop-path-rule")
    try:
        model = timm.create_model(name, pretrained=False, **kwargs)
    except TypeError as exc:
        raise ConfigError(f"timm model {name} does not accept these options ({exc}); remove the unsupported "
                          f"--set / flag") from exc
    except (AssertionError, RuntimeError, ValueError) as exc:
        msg = str(exc).replace("\n", " ") or type(exc).__name__
        raise ConfigError(f"timm cannot build {name} with {kwargs} ({msg}); change the size options") from exc
    model.vitlab_spec = {"timm": name, "kwargs": kwargs}
    return model


def spec_of(model: nn.Module) -> dict[str, Any]:
    """The checkpoint description of ``model`` (see module doc)."""
    model = unwrap(model)
    spec = getattr(model, "vitlab_spec", None)
    if spec is not None:
        return spec
    if isinstance(model, VitlabModel):
        return model.cfg.to_dict()
    raise CheckpointError(f"cannot describe a {type(model).__name__} in a checkpoint; build it with "
                          "vitlab.create_model or vitlab.train.models.create_timm")


def model_from_spec(spec: dict[str, Any], **overrides: Any) -> nn.Module:
    """Rebuild a model from its checkpoint description, with optional option overrides."""
    if "timm" in spec:
        return create_timm(spec["timm"], {**spec.get("kwargs", {}), **overrides})
    cfg = ModelConfig.from_dict(spec).replace(**overrides)
    model = build_model(cfg)
    model.vitlab_spec = cfg.to_dict()
    return model


def input_shape(spec: dict[str, Any]) -> tuple[int, int]:
    """(img_size, in_chans) a model description expects."""
    stored = spec.get("kwargs", {}) if "timm" in spec else spec
    img_size = stored.get("img_size", 224)
    img_size = img_size[0] if isinstance(img_size, list | tuple) else img_size
    return int(img_size), int(stored.get("in_chans", 3))


def spec_label(spec: dict[str, Any]) -> str:
    """A short human name of a model description, e.g. ``vit (vit_mnist)`` or ``timm:vit_tiny_patch16_224``."""
    if "timm" in spec:
        return f"timm:{spec['timm']}"
    return f"{spec.get('arch', '?')} ({spec.get('name') or 'custom'})"


def unwrap(model: nn.Module) -> nn.Module:
    """The plain module under DistributedDataParallel / torch.compile wrappers."""
    while True:
        if hasattr(model, "_orig_mod"):
            model = model._orig_mod
        elif type(model).__name__ in ("DistributedDataParallel", "DataParallel") and hasattr(model, "module"):
            model = model.module
        else:
            return model


def model_macs(model: nn.Module, data: dict[str, Any]) -> int | None:
    """Multiply-accumulates per image: vitlab's ``flop_count()``, else ``FlopCounterMode`` (matmul FLOPs / 2)."""
    if hasattr(model, "flop_count"):
        return int(model.flop_count())
    from vitlab.flops import torch_flops  # MATH attention backend: the fused CPU kernel is not counted

    x = torch.zeros(1, data["in_chans"], data["img_size"], data["img_size"], device=next(model.parameters()).device)
    return torch_flops(model, x) // 2


def token_count(model: nn.Module) -> int | None:
    """Tokens per image of a ViT-like model (patches + prefix tokens, vitlab's or timm's attributes), else None."""
    patches = getattr(getattr(model, "patch_embed", None), "num_patches", None)
    if not isinstance(patches, int) or patches <= 0:
        return None
    return patches + int(getattr(model, "num_prefix_tokens", 0) or 0)
