"""Assembled networks and their presets."""

from vitlab.models.base import FlopRow, VitlabModel
from vitlab.models.cait import Cait
from vitlab.models.config import ModelConfig
from vitlab.models.registry import PRESETS, build_model, create_model, get_config, list_models
from vitlab.models.vit import VisionTransformer

__all__ = ["PRESETS", "Cait", "FlopRow", "ModelConfig", "VisionTransformer", "VitlabModel", "build_model",
           "create_model", "get_config", "list_models"]
