"""The model stage of a run: the model its plan names, built once (:func:`build_run_model`) from the plan's
:class:`~vitlab.models.spec.ModelSpec` and initialised from the run's seed or pretrained weights (:func:`load_init`).

The run builds its model once, from that spec (``ModelSpec.build``, the road every model takes), and the model
carries the spec (``model.vitlab_spec``), which the checkpoint stores. What the spec is, and what the model costs, the
plan decided (:mod:`vitlab.train.plan_model`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from vitlab.errors import ConfigError
from vitlab.flops import token_count  # re-exported: its former home
from vitlab.models.spec import ModelSpec
from vitlab.train.seeding import derive_seed

__all__ = ["INIT_STREAM", "build_run_model", "load_init", "token_count"]

INIT_STREAM = 0x1417  # the stream of the run's seed the initial weights are drawn from


def build_run_model(spec: ModelSpec, *, seed: int, init_weights: str | Path | None = None) -> nn.Module:
    """The run's model, built once from ``spec``: initialised from the run's seed (a stream of its own), or started
    from pretrained weights (:func:`load_init`)."""
    torch.manual_seed(derive_seed(seed, INIT_STREAM))
    model = spec.build()
    if init_weights is not None:
        load_init(model, str(init_weights))
    return model


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
