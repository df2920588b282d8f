"""vitlab: build, train, measure and analyse vision transformers that go deeper."""

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from typing import Any

from vitlab.errors import CheckpointError, ConfigError, DataError, VitlabError
from vitlab.version import __version__

__all__ = ["CheckpointError", "ConfigError", "DataError", "ModelConfig", "VitlabError", "__version__",
           "create_model", "from_timm", "from_vit5", "get_config", "list_models", "load_pretrained", "register_timm",
           "to_timm", "to_vit5"]

_LAZY = {"from_timm", "to_timm", "load_pretrained", "from_vit5", "to_vit5"}
# build_model: deprecated (it warns), kept for old code; vitlab.create_model takes a ModelConfig too
_MODELS = {"ModelConfig", "build_model", "create_model", "get_config", "list_models"}
_SUBPACKAGES = {"analysis", "checkpoint", "data", "experiments", "flops", "interop", "layers", "models", "perf",
                "inference", "plots", "train", "writers"}


def __getattr__(name: str) -> Any:
    # torch loads with the first model, timm (and torchvision) only when interop is used: `import vitlab` and the
    # CLI's parser (`vitlab --help`) stay torch-free and answer at once
    if name in _MODELS:
        from vitlab import models

        return getattr(models, name)
    if name in _LAZY:
        from vitlab import interop

        return getattr(interop, name)
    if name == "register_timm":
        from vitlab.interop.timm_registry import register_timm

        return register_timm
    if name in _SUBPACKAGES:  # `import vitlab; vitlab.models.X` as before the lazy facade
        return importlib.import_module(f"vitlab.{name}")
    raise AttributeError(f"module 'vitlab' has no attribute {name!r}")


# timm.create_model("vitlab.vit_mnist") works once both are imported, in either order. Importing timm here would
# more than double the CLI's start-up time (and timm has no plugin entry point), so with timm not loaded yet a
# one-shot import hook registers the presets right after timm's own import finishes.

def _register_in_timm() -> None:
    try:
        from vitlab.interop.timm_registry import register_timm

        register_timm()
    except Exception as exc:  # noqa: BLE001 - never break `import timm`; say why the names are missing
        warnings.warn(f"vitlab presets not registered in timm ({exc}); call vitlab.register_timm()", stacklevel=2)


class _AfterTimmImport(importlib.abc.MetaPathFinder):
    """Finds timm through the other finders and runs :func:`_register_in_timm` after timm's module code."""

    def find_spec(self, name, path=None, target=None):  # noqa: ANN001, ANN201 - importlib's protocol
        if name != "timm":
            return None
        sys.meta_path.remove(self)  # one shot, and the lookup below must not come back here
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_register(module) -> None:  # noqa: ANN001
            exec_module(module)
            _register_in_timm()

        spec.loader.exec_module = exec_then_register  # this spec's own loader instance
        return spec


if "timm" in sys.modules:
    _register_in_timm()
elif not any(isinstance(f, _AfterTimmImport) for f in sys.meta_path):
    sys.meta_path.insert(0, _AfterTimmImport())
