"""Register vitlab's presets in timm's registry when timm gets imported, without importing timm here.

``import vitlab`` stays free of timm's import cost; if timm is already loaded the presets are registered at
once, otherwise a one-shot import hook registers them right after timm's own import finishes. Either way
``timm.create_model("vitlab.vit_mnist")`` works in any import order.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import warnings
from importlib.machinery import ModuleSpec
from types import ModuleType


def _register() -> None:
    try:
        from vitlab.interop.timm_registry import register_timm

        register_timm()
    except Exception as exc:  # noqa: BLE001 - never break `import timm`; say why the names are missing
        warnings.warn(f"vitlab presets not registered in timm ({exc}); call vitlab.register_timm()", stacklevel=2)


class _AfterTimmImport(importlib.abc.MetaPathFinder):
    """Finds timm through the other finders and runs :func:`_register` after timm's module code."""

    def find_spec(self, name: str, path=None, target=None) -> ModuleSpec | None:
        if name != "timm":
            return None
        sys.meta_path.remove(self)  # one shot, and the lookup below must not come back here
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_register(module: ModuleType) -> None:
            exec_module(module)
            _register()

        spec.loader.exec_module = exec_then_register  # this spec's own loader instance
        return spec


def install() -> None:
    """Register now if timm is loaded, else once it is."""
    if "timm" in sys.modules:
        _register()
    elif not any(isinstance(f, _AfterTimmImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterTimmImport())
