"""A ``--config`` YAML file of run options, read as the mapping it holds (:func:`read_yaml`); its keys and value types
are checked by :func:`vitlab.train.config.load_yaml`, the command line then overrides them, and what they leave unset
is decided by the run plan (:mod:`vitlab.train.plan`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vitlab.errors import ConfigError

__all__ = ["read_yaml"]


def read_yaml(path: str | Path) -> dict[str, Any]:
    """The mapping a run config YAML file holds, refused in one line when the file is missing, unreadable, not YAML
    or not a mapping."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist; check the --config path")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        detail = str(exc).replace("\n", " ")
        raise ConfigError(f"config file {path} is not valid YAML ({detail}); fix the syntax") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {path} cannot be read as UTF-8 text ({exc}); pass a YAML text file") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of options (key: value), "
                          f"got {type(data).__name__}")
    return data
