"""The one road to a model: presets as data, the model spec, and :func:`create_model`.

``create_model(model, **overrides)`` takes a preset name, ``"timm:NAME"``, a :class:`ModelConfig` or a
:class:`ModelSpec`; :meth:`ModelSpec.of` resolves it (a preset's config is resolved here, once) and
:meth:`ModelSpec.build` is the only code that instantiates a model from a spec: the CLI, training, resume,
checkpoint loading, weight conversion and timm's ``timm.create_model("vitlab_...")`` all come through it. A spec is
what a checkpoint stores (``config.json``: ``ModelConfig.to_dict()`` or ``{"timm": NAME, "kwargs": {...}}``), and
every model built carries it as ``model.vitlab_spec``.
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
import warnings
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from vitlab.errors import ConfigError
from vitlab.models import cait, deepvit, vit, vit5
from vitlab.models.base import VitlabModel, build_placed
from vitlab.models.config import ModelConfig

PRESETS: dict[str, dict] = {}
for _family in (vit, cait, deepvit, vit5):
    PRESETS.update(_family.PRESETS)

TIMM_PREFIX = "timm:"


def is_timm(name: str) -> bool:
    """Whether ``name`` names a timm model (``timm:NAME``)."""
    return name.startswith(TIMM_PREFIX)


def list_models(pattern: str = "*") -> list[str]:
    """Preset names matching a shell-style ``pattern``, in registry order."""
    return [n for n in PRESETS if fnmatch.fnmatch(n, pattern)]


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


@dataclass(frozen=True)
class ModelSpec:
    """A vitlab model (``config``) or a timm model (``timm`` name and ``kwargs``); exactly one is set."""

    config: ModelConfig | None = None
    timm: str | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def is_timm(self) -> bool:
        return self.timm is not None

    @classmethod
    def of(cls, model: str | ModelConfig | ModelSpec, **overrides: Any) -> ModelSpec:
        """The spec of a preset name, ``"timm:NAME"`` (``overrides``: its ``timm.create_model`` keyword
        arguments), a :class:`ModelConfig` or a spec, with ``overrides`` applied."""
        if isinstance(model, ModelSpec):
            return model.with_options(**overrides)
        if isinstance(model, ModelConfig):
            return cls(config=model.replace(**overrides) if overrides else model)
        if isinstance(model, str) and is_timm(model):
            return cls(timm=model[len(TIMM_PREFIX):], kwargs=dict(overrides))
        if isinstance(model, str):
            return cls(config=get_config(model, **overrides))
        raise ConfigError(f"cannot create a model from a {type(model).__name__}; pass a preset name (`vitlab models` "
                          f"lists them), 'timm:NAME', a ModelConfig or a ModelSpec")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelSpec:
        """The spec of a ``config.json`` ``"model"`` entry (a ``ValueError`` when it does not describe one)."""
        if "timm" in d:
            return cls(timm=str(d["timm"]), kwargs=dict(d.get("kwargs") or {}))
        return cls(config=ModelConfig.from_dict(d))

    def to_dict(self) -> dict[str, Any]:
        if self.is_timm:
            return {"timm": self.timm, "kwargs": self.kwargs}
        return self.config.to_dict()

    def options(self) -> dict[str, Any]:
        """The stored options: the ModelConfig fields, or timm's keyword arguments."""
        return dict(self.kwargs) if self.is_timm else self.config.to_dict()

    def with_options(self, **overrides: Any) -> ModelSpec:
        """This spec with ``overrides`` (ModelConfig fields, or timm keyword arguments) applied."""
        if not overrides:
            return self
        if self.is_timm:
            return dataclasses.replace(self, kwargs={**self.kwargs, **overrides})
        return dataclasses.replace(self, config=self.config.replace(**overrides))

    @property
    def label(self) -> str:
        """A short human name, e.g. ``vit (vit_mnist)`` or ``timm:vit_tiny_patch16_224``."""
        if self.is_timm:
            return f"timm:{self.timm}"
        return f"{self.config.arch} ({self.config.name or 'custom'})"

    @property
    def input_shape(self) -> tuple[int, int]:
        """(img_size, in_chans) the model expects."""
        stored = self.options()
        img_size = stored.get("img_size", 224)
        img_size = img_size[0] if isinstance(img_size, list | tuple) else img_size
        return int(img_size), int(stored.get("in_chans", 3))

    def build(self) -> nn.Module:
        """A freshly initialised model of this spec: the one place a model is instantiated (use
        :func:`create_model`). A vitlab model's ``vitlab_spec`` is its live config; a timm model gets this spec."""
        if not self.is_timm:
            self.config.validate()
            return (cait.Cait if self.config.arch == "cait" else vit.VisionTransformer)(self.config)
        model = _create_timm(self.timm, self.kwargs)
        if not isinstance(model, VitlabModel):  # timm:vitlab_P is a vitlab model, carrying its own config
            model.vitlab_spec = self
        return model


def _create_timm(name: str, kwargs: dict[str, Any]) -> nn.Module:
    """``timm.create_model(name, pretrained=False, **kwargs)`` with one-line errors."""
    import timm

    from vitlab.models.pretrained_cfg import fit_timm_pretrained_cfg

    if not timm.is_model(name):
        close = difflib.get_close_matches(name, timm.list_models(), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ConfigError(f"timm has no model {name!r}{hint} (python -c 'import timm; print(timm.list_models())')")
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
    return fit_timm_pretrained_cfg(model, kwargs)  # timm keeps the default size's; timm.data should see this model's


def create_model(model: str | ModelConfig | ModelSpec, *, device: Any = None, dtype: Any = None,
                 **overrides: Any) -> nn.Module:
    """Create a model: a preset name (any :class:`ModelConfig` field: ``img_size``, ``patch_size``, ``in_chans``,
    ``num_classes``, ``depth``, ``embed_dim``, ``num_heads``, ``mlp_ratio``, ``gate``, ``attn``, ... overrides the
    preset), ``"timm:NAME"`` (``overrides`` go to ``timm.create_model``), a :class:`ModelConfig`, or a
    :class:`ModelSpec` (e.g. ``vitlab.checkpoint.read_spec(run_dir)``). The model carries its spec as
    ``model.vitlab_spec``. ``device`` / ``dtype`` (as timm's): its parameters and buffers are created on that device
    (``'meta'``: shapes only) in that floating-point dtype; they are not part of the spec."""
    spec = ModelSpec.of(model, **overrides)
    return build_placed(spec.build, device, dtype)


def build_model(cfg: ModelConfig) -> VitlabModel:
    """Deprecated: use :func:`create_model`, which takes a :class:`ModelConfig` too."""
    warnings.warn("vitlab.build_model(cfg) is deprecated; use vitlab.create_model(cfg)", DeprecationWarning,
                  stacklevel=2)
    return create_model(cfg)
