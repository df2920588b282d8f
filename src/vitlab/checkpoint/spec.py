"""The model spec as the checkpoint sees it: what ``config.json`` stores to rebuild a model (``spec_of``).

The spec itself and building a model from it live in :mod:`vitlab.models.registry` (:class:`ModelSpec`,
:func:`vitlab.create_model`): one road from a spec to a model, re-exported here for the checkpoint's readers. In
``config.json`` a spec is ``ModelConfig.to_dict()`` or ``{"timm": NAME, "kwargs": {...}}``.
"""

from __future__ import annotations

from torch import nn

from vitlab.errors import CheckpointError
from vitlab.models.spec import TIMM_PREFIX, ModelSpec, is_timm

__all__ = ["TIMM_PREFIX", "ModelSpec", "is_timm", "spec_of", "unwrap"]


def spec_of(model: nn.Module) -> ModelSpec:
    """The spec of ``model`` (its ``vitlab_spec``; see :func:`vitlab.create_model`)."""
    spec = getattr(unwrap(model), "vitlab_spec", None)
    if isinstance(spec, ModelSpec):
        return spec
    raise CheckpointError(f"cannot describe a {type(unwrap(model)).__name__} in a checkpoint; build it with "
                          "vitlab.create_model (a preset, 'timm:NAME', a ModelConfig or a ModelSpec)")


def unwrap(model: nn.Module) -> nn.Module:
    """The plain module under DistributedDataParallel / torch.compile wrappers."""
    while True:
        if hasattr(model, "_orig_mod"):
            model = model._orig_mod
        elif type(model).__name__ in ("DistributedDataParallel", "DataParallel") and hasattr(model, "module"):
            model = model.module
        else:
            return model
