"""Load a script of ``scripts/`` or ``benchmarks/`` by path, once per test session (neither folder is a package)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = (ROOT / "scripts", ROOT / "benchmarks")  # looked in, in this order


def load_script(name: str) -> ModuleType:
    """``scripts/<name>.py``, else ``benchmarks/<name>.py``, as a module, registered in ``sys.modules`` before it
    runs (dataclasses look their module up there) under ``vitlab_script_<name>``, so every test file shares one copy."""
    key = f"vitlab_script_{name}"
    if key not in sys.modules:
        path = next((folder / f"{name}.py" for folder in FOLDERS if (folder / f"{name}.py").is_file()), None)
        if path is None:
            raise FileNotFoundError(f"no {name}.py in {' or '.join(str(f) for f in FOLDERS)}")
        spec = importlib.util.spec_from_file_location(key, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[key]
            raise
    return sys.modules[key]
