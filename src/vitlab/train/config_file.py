"""A ``--config`` YAML file of run options: read and checked (keys, value types) into the options it gives, which
the command line then overrides; what they leave unset is decided by the run plan (:mod:`vitlab.train.plan`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vitlab.errors import ConfigError

__all__ = ["load_yaml"]


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a run config YAML file (a mapping of :class:`RunConfig` fields) as a checked partial dict."""
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
    from vitlab.train.config import coerce  # the options module imports this one

    return coerce(data, f"config file {path}")
