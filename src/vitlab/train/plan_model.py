"""The model a run's plan names: its spec, resolved once from the run's options and its data set's model defaults
(:func:`resolve_model`, then :func:`with_recipe` for the recipe's drop-path), the name the run's first line gives it
(:func:`announced_model`), and its cost, measured on the meta device without allocating a weight (:func:`measure`).

Used by the run plan (:mod:`vitlab.train.plan`) only; the trainer builds the spec the plan holds, once
(:mod:`vitlab.train.run_model`).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from vitlab.catalog import dataset_info
from vitlab.errors import ConfigError, VitlabError
from vitlab.flops import model_macs, token_count
from vitlab.models.registry import PRESETS, find_preset, preset_differences, resolve_spec
from vitlab.models.spec import TIMM_PREFIX, ModelSpec, is_timm
from vitlab.train.config import RunConfig
from vitlab.train.recipes import model_defaults

__all__ = ["PRESET_NEUTRAL", "ModelCost", "announced_model", "measure", "resolve_model", "width", "with_recipe"]

PRESET_NEUTRAL = ("name", "num_classes", "drop_path_rate")  # no part of what a preset is: a label, data, recipe


@dataclass(frozen=True)
class ModelCost:
    """What one image costs the planned model, and whether its batches can be sliced (vitlab.perf)."""

    params: int
    macs: int | None  # multiply-accumulates per image (vitlab.flops.model_macs); None for a timm model whose plan
    # did not need them (counting them on the meta device takes longer than the run's first steps): measured then
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


def measure(spec: ModelSpec, *, img_size: int, in_chans: int, compile: bool = False, distributed: bool = False,
            macs: bool = True) -> ModelCost:
    """The cost of ``spec``'s model, built on the meta device (no weight is allocated, no random number drawn from
    the CPU's generator). A timm model's MACs are counted only with ``macs`` (vitlab's are a sum, always counted).
    Kept for the process's later plans of the same model (a study's seeds): a tiny ViT's meta build takes about
    5 ms."""
    from vitlab.perf import why_not_sliced

    count = macs or not spec.is_timm
    key = (json.dumps(spec.to_dict(), sort_keys=True, default=repr), img_size, in_chans, compile, distributed, count)
    if key not in _COSTS:
        try:
            with torch.device("meta"), _no_init():
                model = spec.build()
        except VitlabError:
            raise
        except Exception:  # noqa: BLE001 - a model whose construction reads values cannot be built on meta
            with torch.random.fork_rng(devices=[]):  # built on the CPU, leaving the run's random numbers as they are
                model = spec.build()
        _COSTS[key] = ModelCost(params=sum(p.numel() for p in model.parameters()),
                                macs=model_macs(model, img_size, in_chans) if count else None,
                                tokens=token_count(model),
                                why_not_sliced=why_not_sliced(model, compile=compile, distributed=distributed))
    return _COSTS[key]


_COSTS: dict[tuple, ModelCost] = {}  # measure's results in this process, by model and input


@contextlib.contextmanager
def _no_init() -> Iterator[None]:
    """``torch.nn.init``'s in-place initialisers made no-ops while a model is built on the meta device, where they
    compute nothing but still cost their dispatch (about half of a tiny ViT's meta build, so a run's plan adds little
    to the time before its first step). Shapes, and so the cost measured, do not depend on them."""
    names = [n for n in vars(torch.nn.init) if n.endswith("_") and not n.startswith("_")]
    saved = {n: getattr(torch.nn.init, n) for n in names}
    try:
        for n in names:
            setattr(torch.nn.init, n, _unchanged)
        yield
    finally:
        for n, f in saved.items():
            setattr(torch.nn.init, n, f)


def _unchanged(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    return tensor


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
