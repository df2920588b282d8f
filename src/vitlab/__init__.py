"""vitlab: build, train, measure and analyse vision transformers that go deeper."""

import sys
from typing import Any

from vitlab.errors import CheckpointError, ConfigError, DataError, VitlabError
from vitlab.models import ModelConfig, build_model, create_model, get_config, list_models

__version__ = "0.1.0"

__all__ = ["CheckpointError", "ConfigError", "DataError", "ModelConfig", "VitlabError", "__version__",
           "build_model", "create_model", "from_timm", "get_config", "list_models", "load_pretrained",
           "register_timm", "to_timm"]

_LAZY = {"from_timm", "to_timm", "load_pretrained"}


def __getattr__(name: str) -> Any:
    # timm (and torchvision) load only when interop is used, which keeps `import vitlab` and the CLI quick
    if name in _LAZY:
        from vitlab import interop

        return getattr(interop, name)
    if name == "register_timm":
        from vitlab.interop.timm_registry import register_timm

        return register_timm
    raise AttributeError(f"module 'vitlab' has no attribute {name!r}")


# timm users find vitlab's presets (timm.create_model("vitlab.vit_mnist")) as soon as both are imported; with
# timm not imported yet, registering would cost its import, so that order calls vitlab.register_timm() itself
if "timm" in sys.modules:
    from vitlab.interop.timm_registry import register_timm as _register_timm

    _register_timm()
