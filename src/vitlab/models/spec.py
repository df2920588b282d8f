"""The model spec: what a checkpoint stores to rebuild its model, and the one place a model is instantiated.

A spec is a vitlab :class:`ModelConfig`, or a timm model name with its ``timm.create_model`` keyword arguments. In
``config.json`` it is ``ModelConfig.to_dict()`` or ``{"timm": NAME, "kwargs": {...}}``. :meth:`ModelSpec.build`
instantiates it; :func:`vitlab.create_model` (``vitlab.models.registry``) resolves a preset name, ``"timm:NAME"``
or a config to a spec and builds it. Each architecture class registers itself here (:func:`register_arch`), as
timm's models register their entry points, so this module needs none of them.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from vitlab.errors import ConfigError, UnknownOptionError
from vitlab.models.config import ModelConfig
from vitlab.models.size_limits import check_budget

TIMM_PREFIX = "timm:"

# ModelConfig.arch -> the class that builds it (filled by vitlab.models.vit and vitlab.models.cait)
ARCHITECTURES: dict[str, Callable[[ModelConfig], nn.Module]] = {}


def register_arch(arch: str, cls: Callable[[ModelConfig], nn.Module]) -> None:
    """Build ``ModelConfig(arch=arch)`` with ``cls``."""
    ARCHITECTURES[arch] = cls


def is_timm(name: str) -> bool:
    """Whether ``name`` names a timm model (``timm:NAME``)."""
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

    def build(self, *, allow_large: bool = False) -> nn.Module:
        """A freshly initialised model of this spec: the one place a model is instantiated (use
        :func:`create_model`). A vitlab model's ``vitlab_spec`` is its live config; a timm model gets this spec.
        A vitlab config beyond the size budget (:mod:`vitlab.models.size_limits`) is refused before anything is
        allocated unless ``allow_large``."""
        if not self.is_timm:
            self.config.validate()
            check_budget(self.config, allow_large)
            return ARCHITECTURES[self.config.arch](self.config)
        model = _create_timm(self.timm, self.kwargs)
        if not isinstance(getattr(type(model), "vitlab_spec", None), property):  # timm:vitlab_P carries its own
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
    except UnknownOptionError:  # timm:vitlab_P: vitlab's own message names the option and the valid ones
        raise
    except TypeError as exc:  # an unexpected keyword stays a TypeError, as timm's factory raises it
        error = UnknownOptionError if "unexpected keyword argument" in str(exc) else ConfigError
        raise error(f"timm model {name} does not accept these options ({exc}); remove the unsupported "
                    f"--set / flag") from exc
    except (AssertionError, RuntimeError, ValueError) as exc:
        msg = str(exc).replace("\n", " ") or type(exc).__name__
        raise ConfigError(f"timm cannot build {name} with {kwargs} ({msg}); change the size options") from exc
    return fit_timm_pretrained_cfg(model, kwargs)  # timm keeps the default size's; timm.data should see this model's
