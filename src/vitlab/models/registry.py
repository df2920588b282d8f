"""Presets as data: ``create_model(name, **overrides)`` and ``list_models()``."""

from __future__ import annotations

import difflib
import fnmatch

from vitlab.errors import ConfigError
from vitlab.models import cait, deepvit, vit, vit5
from vitlab.models.base import VitlabModel
from vitlab.models.config import ModelConfig

PRESETS: dict[str, dict] = {}
for _family in (vit, cait, deepvit, vit5):
    PRESETS.update(_family.PRESETS)


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


def build_model(cfg: ModelConfig) -> VitlabModel:
    """Instantiate the architecture ``cfg`` describes."""
    cfg.validate()
    if cfg.arch == "cait":
        return cait.Cait(cfg)
    return vit.VisionTransformer(cfg)


def create_model(name: str, **overrides) -> VitlabModel:
    """Create preset ``name``; any :class:`ModelConfig` field (``img_size``, ``patch_size``, ``in_chans``,
    ``num_classes``, ``depth``, ``embed_dim``, ``num_heads``, ``mlp_ratio``, ``gate``, ``attn``, ...) overrides
    the preset."""
    return build_model(get_config(name, **overrides))
