"""The model spec: what a checkpoint stores to rebuild its model, and building a model from it.

A spec is a vitlab :class:`ModelConfig`, or a timm model name with its ``timm.create_model`` keyword
arguments. In ``config.json`` it is ``ModelConfig.to_dict()`` or ``{"timm": NAME, "kwargs": {...}}``. Every
model built here carries its spec as ``model.vitlab_spec``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import nn

from vitlab.errors import CheckpointError, ConfigError
from vitlab.models import ModelConfig, VitlabModel, build_model
from vitlab.models.pretrained_cfg import fit_timm_pretrained_cfg

TIMM_PREFIX = "timm:"


def is_timm(name: str) -> bool:
    return name.startswith(TIMM_PREFIX)


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

    def build(self, **overrides: Any) -> nn.Module:
        """A freshly initialised model of this spec, with optional option overrides."""
        if self.is_timm:
            return create_timm(self.timm, {**self.kwargs, **overrides})
        return build_vitlab(self.config.replace(**overrides))


def build_vitlab(cfg: ModelConfig) -> VitlabModel:
    """``build_model(cfg)`` carrying its spec."""
    model = build_model(cfg)
    model.vitlab_spec = ModelSpec(config=cfg)
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
    fit_timm_pretrained_cfg(model, kwargs)  # timm keeps the default size's; timm.data should see this model's
    model.vitlab_spec = ModelSpec(timm=name, kwargs=kwargs)
    return model


def spec_of(model: nn.Module) -> ModelSpec:
    """The spec of ``model`` (see module doc)."""
    model = unwrap(model)
    spec = getattr(model, "vitlab_spec", None)
    if spec is not None:
        return spec
    if isinstance(model, VitlabModel):
        return ModelSpec(config=model.cfg)
    raise CheckpointError(f"cannot describe a {type(model).__name__} in a checkpoint; build it with "
                          "vitlab.create_model or vitlab.checkpoint.create_timm")


def unwrap(model: nn.Module) -> nn.Module:
    """The plain module under DistributedDataParallel / torch.compile wrappers."""
    while True:
        if hasattr(model, "_orig_mod"):
            model = model._orig_mod
        elif type(model).__name__ in ("DistributedDataParallel", "DataParallel") and hasattr(model, "module"):
            model = model.module
        else:
            return model
