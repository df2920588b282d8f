"""Assembled networks and their presets."""

from vitlab.models.base import FlopRow, VitlabModel
from vitlab.models.cait import Cait
from vitlab.models.config import ModelConfig
from vitlab.models.registry import PRESETS, create_model, get_config, list_models
from vitlab.models.registry import build_model as build_model  # deprecated alias of create_model, not in __all__
from vitlab.models.spec import ModelSpec
from vitlab.models.vit import VisionTransformer

__all__ = ["PRESETS", "Cait", "FlopRow", "ModelConfig", "ModelSpec", "VisionTransformer", "VitlabModel",
           "create_model", "get_config", "list_models"]
