"""Run options written as text (``--set KEY=VALUE``, a study's ``--run-set`` and ``--values``): one parser, one
set of coercion rules, and the one list of options that do not change a run's result.

A value is read as a YAML scalar (``4`` an int, ``0.5`` a float, ``true`` a bool, ``null`` None) with the exponent
numbers YAML 1.1 leaves as strings (``1e-4``, ``5E3``) made floats, while a quoted value (``'8'``) stays a string,
so that it is validated (and refused) as the string it is. The field that receives it checks its type: a run
option by :func:`vitlab.train.config.coerce`, a model option by :class:`~vitlab.models.ModelConfig`'s own checks,
and where only the type is known (a sweep's values) by :func:`coerce_to`.
"""

from __future__ import annotations

import math
import re
import types
import typing
from collections.abc import Iterable
from typing import Any

from vitlab.errors import ConfigError

_YAML_EXPONENT = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d+$")


def numeric(value: Any) -> Any:
    """``value`` with the exponent numbers YAML 1.1 reads as strings (``1e-4``, ``5E3``) made floats.

    Other strings stay strings, so a quoted ``"8"`` is validated (and refused) as the string it is."""
    if isinstance(value, str) and _YAML_EXPONENT.match(value.strip()):
        return float(value)
    return value


def coerce_value(key: str, value: Any, tp: Any, source: str) -> Any:
    is_union = isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union
    args = typing.get_args(tp) if is_union else ()
    if value is None:
        if type(None) in args:
            return None
        raise ConfigError(f"{source}: {key} cannot be empty; give a value or remove the key")
    base = next(a for a in args if a is not type(None)) if is_union else tp
    origin = typing.get_origin(base) or base
    bad = ConfigError(f"{source}: {key} must be {getattr(origin, '__name__', origin)}, got {value!r}")
    if origin in (int, float):
        value = numeric(value)
    if origin is bool:
        if isinstance(value, bool):
            return value
        raise bad
    if origin is int:
        if isinstance(value, bool) or not isinstance(value, int | float) or (
                isinstance(value, float) and not value.is_integer()):
            raise bad
        return int(value)
    if origin is float:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ConfigError(f"{source}: {key} must be a finite number, got {value!r}")
        return float(value)
    if origin is str:
        if not isinstance(value, str):
            raise bad
        return value
    if origin is tuple:
        if not isinstance(value, list | tuple) or len(value) != 2:
            raise ConfigError(f"{source}: {key} must be two numbers, got {value!r}")
        return tuple(float(coerce_value(key, v, float, source)) for v in value)
    if origin is dict:
        if not isinstance(value, dict):
            raise bad
        return {k: numeric(v) for k, v in value.items()}
    return value


# Run options that do not change what a run computes, only where and how it runs, is shown or is tracked. A study
# reads a finished run back whatever these say, and `vitlab train --resume` may change them (resume.py adds what a
# continuation may also change). amp is not among them: bf16 autocast changes the numbers.
RESULT_NEUTRAL: frozenset[str] = frozenset({
    "output", "progress", "logger",  # where the outputs go and how they are shown or tracked
    "device", "threads", "slices", "compile", "channels_last",  # how it runs (slices are bit-exact, vitlab.perf)
    "flush_denormal",  # changes only values below 1.2e-38, never a reported number
    "data_dir", "download",  # where the data comes from
    "eval_batch_size", "checkpoint_every",  # evaluation in chunks, extra saves
    "probe_images",  # per-epoch measurements in eval mode, no weight or RNG stream touched
    "skip_nonfinite",  # what a failed step does; a finished run without skipped steps is the same either way
})


def parse_value(text: str) -> Any:
    """A command-line value: a YAML scalar, exponent numbers made floats, quoted text kept as a string; empty
    text is None and text that is not valid YAML stays the text itself."""
    import yaml

    if not text.strip():
        return None
    try:
        return numeric(yaml.safe_load(text))
    except yaml.YAMLError:
        return text


def parse_set(items: Iterable[str] | None, what: str = "--set") -> dict[str, Any]:
    """``["key=value", ...]`` -> ``{key: value}``, values read by :func:`parse_value` and dashes in keys made
    underscores; an item without ``=`` is an error naming ``what``."""
    out: dict[str, Any] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{what} {item!r} is not KEY=VALUE; e.g. {what} global_pool=avg")
        out[key.strip().replace("-", "_")] = parse_value(value)
    return out


def coerce_to(name: str, value: Any, tp: Any, source: str) -> Any:
    """``value`` (from :func:`parse_value`) as field ``name`` of type ``tp``, by the rules of the run config;
    ``none`` is None for an optional field. Errors name ``source`` (e.g. ``--values for depth``)."""
    optional = (isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union) and \
        type(None) in typing.get_args(tp)
    if optional and isinstance(value, str) and value.lower() == "none":
        return None
    return coerce_value(name, value, tp, source)
