"""vitlab: build, train, measure and analyse vision transformers that go deeper."""

from vitlab.errors import CheckpointError, ConfigError, DataError, VitlabError
from vitlab.interop import from_timm, load_pretrained, to_timm
from vitlab.models import ModelConfig, build_model, create_model, get_config, list_models

__version__ = "0.1.0"

__all__ = ["CheckpointError", "ConfigError", "DataError", "ModelConfig", "VitlabError", "__version__",
           "build_model", "create_model", "from_timm", "get_config", "list_models", "load_pretrained", "to_timm"]
