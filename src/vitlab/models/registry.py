"""The one road to a model: presets as data, and :func:`create_model`.

``create_model(model, **overrides)`` takes a preset name, ``"timm:NAME"``, a :class:`ModelConfig` or a
:class:`~vitlab.models.spec.ModelSpec`; :func:`resolve_spec` resolves it (a preset's config is resolved here, once)
and :meth:`ModelSpec.build` is the only code that instantiates a model from a spec: the CLI, training, resume,
checkpoint loading, weight conversion and timm's ``timm.create_model("vitlab_...")`` all come through it. A spec is
what a checkpoint stores (``config.json``: ``ModelConfig.to_dict()`` or ``{"timm": NAME, "kwargs": {...}}``), and
every model built carries it as ``model.vitlab_spec``.
"""

from __future__ import annotations

import difflib
import fnmatch
import warnings
from collections.abc import Sequence
from typing import Any

from torch import nn

from vitlab.errors import ConfigError
from vitlab.models import cait, deepvit, vit, vit5
from vitlab.models.base import VitlabModel, build_placed
from vitlab.models.config import ModelConfig
from vitlab.models.spec import TIMM_PREFIX, ModelSpec, is_timm

PRESETS: dict[str, dict] = {}
for _family in (vit, cait, deepvit, vit5):
    PRESETS.update(_family.PRESETS)

def list_models(pattern: str = "*") -> list[str]:
    """Preset names matching a shell-style ``pattern``, in registry order."""
    return [n for n in PRESETS if fnmatch.fnmatch(n, pattern)]


def preset_differences(config: ModelConfig, preset: str, ignore: Sequence[str] = ()) -> dict[str, Any]:
    """The fields but ``ignore`` in which ``config`` differs from preset ``preset``'s own config (its row over the
    ModelConfig defaults, read as data: nothing is resolved), with ``config``'s values."""
    row = ModelConfig(name=preset, **PRESETS[preset]).to_dict()
    return {k: v for k, v in config.to_dict().items() if k not in ignore and row[k] != v}


def find_preset(config: ModelConfig, ignore: Sequence[str] = ()) -> str | None:
    """The first preset whose config equals ``config`` in every field but ``ignore`` (e.g. the name), else None."""
    return next((p for p in PRESETS if not preset_differences(config, p, ignore)), None)


def get_config(name: str, **overrides) -> ModelConfig:
    """The :class:`ModelConfig` of preset ``name`` with ``overrides`` applied and validated."""
    if name not in PRESETS:
        close = difflib.get_close_matches(name, PRESETS, n=3, cutoff=0.4)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ConfigError(f"unknown model {name!r}{hint} (`vitlab models` lists all {len(PRESETS)} presets)")
    preset = PRESETS[name]
    if (preset.get("arch") == "cait" and "init_values" not in overrides
            and overrides.get("depth", preset.get("depth")) != preset.get("depth")):
        # a CaiT preset's LayerScale init belongs to its own depth: at another depth the depth rule applies
        preset = {k: v for k, v in preset.items() if k != "init_values"}
    return ModelConfig(name=name).replace(**{**preset, **overrides})


def resolve_spec(model: str | ModelConfig | ModelSpec, **overrides: Any) -> ModelSpec:
    """The spec of a preset name, ``"timm:NAME"`` (``overrides``: its ``timm.create_model`` keyword
    arguments), a :class:`ModelConfig` or a spec, with ``overrides`` applied."""
    if isinstance(model, ModelSpec):
        return model.with_options(**overrides)
    if isinstance(model, ModelConfig):
        return ModelSpec(config=model.replace(**overrides) if overrides else model)
    if isinstance(model, str) and is_timm(model):
        return ModelSpec(timm=model[len(TIMM_PREFIX):], kwargs=dict(overrides))
    if isinstance(model, str):
        return ModelSpec(config=get_config(model, **overrides))
    raise ConfigError(f"cannot create a model from a {type(model).__name__}; pass a preset name (`vitlab models` "
                      f"lists them), 'timm:NAME', a ModelConfig or a ModelSpec")


def create_model(model: str | ModelConfig | ModelSpec, *, device: Any = None, dtype: Any = None,
                 allow_large: bool = False, **overrides: Any) -> nn.Module:
    """Create a model: a preset name (any :class:`ModelConfig` field: ``img_size``, ``patch_size``, ``in_chans``,
    ``num_classes``, ``depth``, ``embed_dim``, ``num_heads``, ``mlp_ratio``, ``gate``, ``attn``, ... overrides the
    preset), ``"timm:NAME"`` (``overrides`` go to ``timm.create_model``), a :class:`ModelConfig`, or a
    :class:`ModelSpec` (e.g. ``vitlab.checkpoint.read_spec(run_dir)``). The model carries its spec as
    ``model.vitlab_spec``. ``device`` / ``dtype`` (as timm's): its parameters and buffers are created on that device
    (``'meta'``: shapes only) in that floating-point dtype; they are not part of the spec. A vitlab config beyond
    the size budget (2e9 parameters, 64 GiB of activations per image: :mod:`vitlab.models.size_limits`) is refused
    before anything is allocated, unless ``allow_large`` (or ``VITLAB_ALLOW_LARGE=1``) or ``device='meta'``."""
    spec = resolve_spec(model, **overrides)
    allow_large = allow_large or str(device) == "meta"
    return build_placed(lambda: spec.build(allow_large=allow_large), device, dtype)


def build_model(cfg: ModelConfig) -> VitlabModel:
    """Deprecated: use :func:`create_model`, which takes a :class:`ModelConfig` too."""
    warnings.warn("vitlab.build_model(cfg) is deprecated; use vitlab.create_model(cfg)", DeprecationWarning,
                  stacklevel=2)
    return create_model(cfg)
