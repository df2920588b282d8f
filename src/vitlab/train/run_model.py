"""The model of a training run, built once (:func:`build_run_model`) from the
:class:`~vitlab.models.spec.ModelSpec` its config resolved (:func:`vitlab.train.config.resolve_run_model`):
its initial weights (:func:`load_init`), its cost per image and the name the run's first line gives it.

The run builds its model once, from that spec (``ModelSpec.build``, the road every model takes), and the model
carries the spec (``model.vitlab_spec``), which the checkpoint stores.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from vitlab.errors import ConfigError
from vitlab.models.registry import PRESETS, preset_differences
from vitlab.models.spec import ModelSpec
from vitlab.train.config import PRESET_NEUTRAL, RunConfig, RunModel, model_defaults
from vitlab.train.seeding import derive_seed

INIT_STREAM = 0x1417  # the stream of the run's seed the initial weights are drawn from


def build_run_model(run_model: RunModel, num_classes: int, *, seed: int,
                    init_weights: str | Path | None = None) -> nn.Module:
    """The run's model, built once from its spec for the data's ``num_classes`` classes: initialised from the
    run's seed (a stream of its own), or started from pretrained weights (:func:`load_init`)."""
    torch.manual_seed(derive_seed(seed, INIT_STREAM))
    model = run_model.spec_for(num_classes).build()
    if init_weights is not None:
        load_init(model, str(init_weights))
    return model


def announced_model(cfg: RunConfig, spec: ModelSpec | None) -> tuple[str, str]:
    """(name, note) of the model a run's first line names: the preset it typed, or the preset its data set's model
    defaults made of it (:func:`vitlab.train.config.resolve_run_model`) with a note of what made it, e.g.
    ``("vit_mnist_gap", "vit_mnist with the recipe's global_pool=avg; ")``."""
    name = spec.config.name if spec is not None and spec.config is not None else ""
    if name in ("", cfg.model) or cfg.model not in PRESETS:  # timm:NAME, or the preset as typed
        return cfg.model, ""
    recipe = set(model_defaults(cfg.dataset)) | ({"gate"} if cfg.recipe == "deit3" else set())
    said = [("the recipe's " if k in recipe else "") + f"{k}={v}"
            for k, v in preset_differences(spec.config, cfg.model, PRESET_NEUTRAL).items()]
    return name, f"{cfg.model} with {', '.join(said)}; " if said else f"{cfg.model}; "


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
