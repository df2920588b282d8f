"""Keys of older vitlab checkpoints, renamed to today's on load.

- ``blocks.{i}.gamma_{j}`` / ``blocks_token_only.{i}.gamma_{j}`` -> ``...ls{j}.gamma``: vitlab's CaiT once held its
  LayerScale gammas as block parameters under timm's ``Cait`` names; every block now has the LayerScale module.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from torch import Tensor

LEGACY_KEYS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^(blocks|blocks_token_only)\.(\d+)\.gamma_([12])$"), r"\1.\2.ls\3.gamma"),
)


def rename_legacy_keys(state: dict[str, Tensor], expected: Iterable[str]) -> dict[str, Tensor]:
    """``state`` with each old key renamed where the target model (its state-dict keys ``expected``) holds the new
    name and not the old one (a timm ``Cait`` saved in a vitlab checkpoint keeps ``gamma_1``); order is kept."""
    expected = set(expected)
    out = {}
    for key, value in state.items():
        for pattern, repl in LEGACY_KEYS:
            new = pattern.sub(repl, key)
            if new != key and key not in expected and new in expected:
                key = new
                break
        out[key] = value
    return out
