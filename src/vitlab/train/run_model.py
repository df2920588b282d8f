"""The model of a training run: ``--model`` (a vitlab preset with overrides, or ``timm:NAME``) resolved once into
the :class:`~vitlab.models.registry.ModelSpec` the run builds (:func:`resolve_run_model`), the input size it needs,
its initial weights (:func:`load_init`) and its cost per image.

The run builds its model once, from that spec (``ModelSpec.build``, the road every model takes), and the model
carries the spec (``model.vitlab_spec``), which the checkpoint stores.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from vitlab.errors import ConfigError
from vitlab.models.registry import PRESETS, TIMM_PREFIX, ModelSpec, is_timm
from vitlab.train.config import RunConfig, model_defaults

# native size and channels of each data set: what a timm model is created for unless told otherwise
DATA_SHAPES = {"mnist": (28, 1), "mnist-5k": (28, 1), "fashion-mnist": (28, 1), "cifar10": (32, 3),
               "cifar100": (32, 3)}


def _timm_input(name: str, overrides: dict[str, Any], dataset: str) -> tuple[int, int]:
    """(img_size, in_chans) a timm model is created for: the options, else the data set's native shape."""
    native = DATA_SHAPES.get(dataset)
    img_size = overrides.get("img_size", native[0] if native else None)
    in_chans = overrides.get("in_chans", native[1] if native else 3)
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


@dataclass(frozen=True)
class RunModel:
    """The model of a run, resolved once from its :class:`RunConfig` (see :func:`resolve_run_model`)."""

    spec: ModelSpec  # what the run builds, but for the data's class count (:meth:`spec_for`)
    overrides: dict[str, Any]  # the effective model options the run config stores (ModelConfig fields; timm kwargs)
    img_size: int  # the input the data is prepared at
    in_chans: int

    def with_recipe(self, cfg: RunConfig) -> RunModel:
        """This model with the resolved recipe's drop-path rate and rule, unless the model options set them."""
        recipe = {"drop_path_rate": cfg.drop_path}
        if cfg.drop_path_rule is not None:
            recipe["drop_path_rule"] = cfg.drop_path_rule
        recipe = {k: v for k, v in recipe.items() if k not in self.overrides}
        return dataclasses.replace(self, spec=self.spec.with_options(**recipe), overrides={**self.overrides, **recipe})

    def spec_for(self, num_classes: int) -> ModelSpec:
        """The spec of the run's model for the data's ``num_classes`` classes (they win over a ``num_classes``
        option)."""
        return self.spec.with_options(num_classes=num_classes)


def resolve_run_model(cfg: RunConfig) -> RunModel:
    """The model of run ``cfg``, before any data is loaded: the data set's defaults (vitlab ViTs) under the
    user's options, resolved into a spec once, and the input size and channels the data must be prepared at. The
    drop-path rate is a recipe option, known once the recipe is resolved for the training set's size
    (:meth:`RunModel.with_recipe`); the class count is the data's (:meth:`RunModel.spec_for`)."""
    name, overrides = cfg.model, dict(cfg.model_overrides)
    if is_timm(name):
        img_size, in_chans = _timm_input(name[len(TIMM_PREFIX):], overrides, cfg.dataset)
        spec = ModelSpec.of(name, **{**overrides, "img_size": img_size, "in_chans": in_chans})
        return RunModel(spec, overrides, img_size, in_chans)
    arch = overrides.get("arch", PRESETS.get(name, {}).get("arch", "vit"))
    if arch == "vit":
        overrides = {**model_defaults(cfg.dataset), **overrides}
    spec = ModelSpec.of(name, **{k: v for k, v in overrides.items() if k != "num_classes"})
    return RunModel(spec, overrides, spec.config.img_size, spec.config.in_chans)


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


def load_init(model: Any, init: str) -> None:
    """Load pretrained weights into ``model`` in place, adapted to its image size, patch size, channels and head
    by :func:`vitlab.interop.load_pretrained`.

    ``init``: a ``.safetensors`` / ``.pth`` file or vitlab checkpoint folder (timm or vitlab weights), or
    ``hub`` for timm's own pretrained weights of a ``timm:NAME`` model (needs the network). A timm model is
    converted to vitlab's equivalent for the adaptation and back to timm's keys.
    """
    from vitlab.interop import adapt_state_dict, load_pretrained, to_timm
    from vitlab.interop.timm_config import config_from_timm
    from vitlab.models import VitlabModel, create_model

    if isinstance(model, VitlabModel):
        if init == "hub":
            raise ConfigError(f"--pretrained hub downloads timm weights, but {model.cfg.name or 'this'} is a vitlab "
                              "model; pass a weight file")
        load_pretrained(model, init)
        return
    cfg = config_from_timm(model)
    if init == "hub":
        source = load_pretrained(f"timm:{model.vitlab_spec.timm}")
        with_weights = create_model(cfg)
        with_weights.load_state_dict(adapt_state_dict(source.state_dict(), with_weights))
    else:
        with_weights = load_pretrained(cfg, init)
    model.load_state_dict(to_timm(with_weights).state_dict())
