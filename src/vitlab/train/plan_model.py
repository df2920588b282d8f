"""The model a run's plan names: its spec, resolved once from the run's options and its data set's model defaults
(:func:`resolve_model`, then :func:`with_recipe` for the recipe's drop-path), the name the run's first line gives it
(:func:`announced_model`), and its cost, measured on the meta device without allocating a weight (:func:`measure`).

Used by the run plan (:mod:`vitlab.train.plan`) only; the trainer builds the spec the plan holds, once
(:mod:`vitlab.train.run_model`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from vitlab.catalog import dataset_info
from vitlab.errors import ConfigError
from vitlab.models.registry import PRESETS, find_preset, preset_differences, resolve_spec
from vitlab.models.spec import TIMM_PREFIX, ModelSpec, is_timm
from vitlab.train.config import RunConfig
from vitlab.train.recipes import model_defaults

__all__ = ["PRESET_NEUTRAL", "ModelCost", "announced_model", "measure", "model_macs", "resolve_model", "token_count",
           "width", "with_recipe"]

PRESET_NEUTRAL = ("name", "num_classes", "drop_path_rate")  # no part of what a preset is: a label, data, recipe


@dataclass(frozen=True)
class ModelCost:
    """What one image costs the planned model, and whether its batches can be sliced (vitlab.perf)."""

    params: int
    macs: int  # multiply-accumulates per image (vitlab's flop_count, else FlopCounterMode's matmul FLOPs / 2)
    tokens: int | None  # tokens per image (patches + prefix tokens); None for a model that is not a ViT
    why_not_sliced: str | None  # vitlab.perf.why_not_sliced of the model, None when its batches can be sliced


def resolve_model(cfg: RunConfig) -> tuple[ModelSpec, dict[str, Any], int, int]:
    """``(spec, overrides, img_size, in_chans)`` of run ``cfg`` before the recipe is known: the data set's defaults
    (vitlab ViTs) under the user's options, resolved into a spec once, the effective model options, and the input
    size and channels the data is prepared at."""
    name, overrides = cfg.model, dict(cfg.model_overrides)
    if is_timm(name):
        img_size, in_chans = _timm_input(name[len(TIMM_PREFIX):], overrides, cfg.dataset)
        spec = resolve_spec(name, **{**overrides, "img_size": img_size, "in_chans": in_chans})
        return spec, overrides, img_size, in_chans
    # the user's options checked as they stand, as vitlab.create_model checks them (a num_classes option too; the
    # data's count wins); then the data set's defaults where the user set nothing
    spec = resolve_spec(name, **overrides)
    if spec.config.arch == "vit":
        defaults = {k: v for k, v in model_defaults(cfg.dataset).items() if k not in overrides}
        if cfg.recipe == "deit3" and spec.config.gate == "none" and "gate" not in overrides:
            defaults["gate"] = "layerscale"  # DeiT III trains its ViTs with LayerScale (init 1e-4, models_v2.py)
        overrides = {**defaults, **overrides}
        changed = spec.with_options(**defaults)
        # defaults that make the preset another preset take its name (vit_mnist -> vit_mnist_gap); no weight changes
        preset = find_preset(changed.config, PRESET_NEUTRAL) if changed.config != spec.config else None
        spec = changed.with_options(name=preset) if preset else changed
    return spec, overrides, spec.config.img_size, spec.config.in_chans


def width(spec: ModelSpec, overrides: dict[str, Any]) -> int | None:
    """The model's embedding width (vitlab presets; timm models: their ``embed_dim`` option), else None."""
    if spec.config is not None:
        return spec.config.embed_dim
    value = overrides.get("embed_dim")
    return int(value) if isinstance(value, int) else None


def with_recipe(spec: ModelSpec, overrides: dict[str, Any], cfg: RunConfig,
                num_classes: int) -> tuple[ModelSpec, dict[str, Any]]:
    """The spec the run builds and the model options its config stores: the resolved recipe's drop-path rate and
    rule (unless the model options set them), and the data's ``num_classes`` (they win over a num_classes option)."""
    recipe = {"drop_path_rate": cfg.drop_path}
    if cfg.drop_path_rule is not None:
        recipe["drop_path_rule"] = cfg.drop_path_rule
    recipe = {k: v for k, v in recipe.items() if k not in overrides}
    return spec.with_options(**recipe, num_classes=num_classes), {**overrides, **recipe}


def announced_model(cfg: RunConfig, spec: ModelSpec) -> tuple[str, str]:
    """(name, note) of the model a run's first line names: the preset it typed, or the preset its data set's model
    defaults made of it (:func:`resolve_model`) with a note of what made it, e.g.
    ``("vit_mnist_gap", "vit_mnist with the recipe's global_pool=avg; ")``."""
    name = spec.config.name if spec.config is not None else ""
    if name in ("", cfg.model) or cfg.model not in PRESETS:  # timm:NAME, or the preset as typed
        return cfg.model, ""
    recipe = set(model_defaults(cfg.dataset)) | ({"gate"} if cfg.recipe == "deit3" else set())
    said = [("the recipe's " if k in recipe else "") + f"{k}={v}"
            for k, v in preset_differences(spec.config, cfg.model, PRESET_NEUTRAL).items()]
    return name, f"{cfg.model} with {', '.join(said)}; " if said else f"{cfg.model}; "


def measure(spec: ModelSpec, *, img_size: int, in_chans: int, compile: bool = False,
            distributed: bool = False) -> ModelCost:
    """The cost of ``spec``'s model, built on the meta device (no weight is allocated, no random number drawn from
    the CPU's generator); a model beyond vitlab's size budget is refused here, before any data loads."""
    from vitlab.perf import why_not_sliced

    with torch.device("meta"):
        model = spec.build()
    return ModelCost(params=sum(p.numel() for p in model.parameters()), macs=model_macs(model, img_size, in_chans),
                     tokens=token_count(model),
                     why_not_sliced=why_not_sliced(model, compile=compile, distributed=distributed))


def model_macs(model: nn.Module, img_size: int, in_chans: int) -> int:
    """Multiply-accumulates per image: vitlab's ``flop_count()``, else ``FlopCounterMode`` (matmul FLOPs / 2)."""
    if hasattr(model, "flop_count"):
        return int(model.flop_count())
    from vitlab.flops import torch_flops  # MATH attention backend: the fused CPU kernel is not counted

    x = torch.zeros(1, in_chans, img_size, img_size, device=next(model.parameters()).device)
    return torch_flops(model, x) // 2


def token_count(model: nn.Module) -> int | None:
    """Tokens per image of a ViT-like model (patches + prefix tokens, vitlab's or timm's attributes), else None."""
    patches = getattr(getattr(model, "patch_embed", None), "num_patches", None)
    if not isinstance(patches, int) or patches <= 0:
        return None
    return patches + int(getattr(model, "num_prefix_tokens", 0) or 0)


def _timm_input(name: str, overrides: dict[str, Any], dataset: str) -> tuple[int, int]:
    """(img_size, in_chans) a timm model is created for: the options, else the data set's native shape
    (vitlab.catalog), else timm's default size and 3 channels."""
    info = dataset_info(dataset)
    img_size = overrides.get("img_size", info.img_size if info else None)
    in_chans = overrides.get("in_chans", (info.in_chans if info else None) or 3)
    if img_size is None:
        img_size = _timm_default_size(name)
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
