"""Values of a study's options written as text: comma-separated lists, integers, and the spelling a value has in
folder names, CSV cells and legends."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vitlab.errors import ConfigError


def split_list(text: str, what: str) -> list[str]:
    """``'a,b, c'`` -> ``['a', 'b', 'c']``; an empty list is an error naming ``what``."""
    items = [t.strip() for t in str(text).split(",") if t.strip()]
    if not items:
        raise ConfigError(f"{what} is empty; give comma-separated values, e.g. 32,64,128")
    return items


def parse_ints(text: str, what: str, *, minimum: int = 1) -> list[int]:
    """Comma-separated integers ``>= minimum``, each once, in the given order."""
    out: list[int] = []
    for item in split_list(text, what):
        try:
            v = int(item)
        except ValueError:
            raise ConfigError(f"{what}: {item!r} is not an integer; give e.g. 6,12,24") from None
        if v < minimum:
            raise ConfigError(f"{what}: {v} must be >= {minimum}")
        if v not in out:
            out.append(v)
    return out


def format_value(v: Any) -> str:
    """A value as it appears in folder names, CSV cells and legends (``1e-05``, ``0.1``, ``true``)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "none"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def safe_name(text: str) -> str:
    """``text`` with anything but letters, digits and ``._=-+`` replaced by ``_`` (a folder name)."""
    return "".join(c if c.isalnum() or c in "._=-+" else "_" for c in text)


def unknown_option(key: str, names: Sequence[str], kind: str) -> str:
    import difflib

    close = difflib.get_close_matches(key, names, n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    return f"unknown {kind} {key!r}{hint} (valid: {', '.join(names)})"
