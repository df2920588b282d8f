"""vitlab: build, train, measure and analyse vision transformers that go deeper."""

from typing import Any

from vitlab import timm_hook as _timm_hook
from vitlab.errors import CheckpointError, ConfigError, DataError, VitlabError
from vitlab.models import ModelConfig, build_model, create_model, get_config, list_models
from vitlab.version import __version__

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


# timm.create_model("vitlab.vit_mnist") works once both are imported, in either order (timm is not imported here)
_timm_hook.install()
