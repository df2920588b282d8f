"""The learning rate a finished ``vitlab lr-sensitivity`` study chose for each variant and depth (on validation loss),
read back from its ``sensitivity.csv`` for ``vitlab depth-study --lr-from``."""

from __future__ import annotations

import math
from pathlib import Path

from vitlab.errors import ConfigError


def best_rates(path: str | Path) -> dict[tuple[str, int], float]:
    """``{(variant, depth): best learning rate}`` from a study's ``sensitivity.csv`` (or the study folder holding it),
    for training each variant at each depth at its own rate (``vitlab depth-study --lr-from``). A row whose
    sensitivity is empty (a rate of the grid not finished yet) is refused: its best rate is not the grid's."""
    import csv

    file = Path(path)
    if file.is_dir():
        file = file / "sensitivity.csv"
    if not file.is_file():
        raise ConfigError(f"--lr-from {path}: no sensitivity.csv there; pass the folder of a finished `vitlab "
                          "lr-sensitivity` study or its sensitivity.csv")
    with file.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    out = {}
    for r in rows:
        try:
            sens, lr = float(r["lr_sensitivity"] or "nan"), float(r["best_lr"])
            key = (r["variant"], int(r["depth"]))
        except (KeyError, ValueError) as exc:
            raise ConfigError(f"--lr-from {file}: not a sensitivity.csv of `vitlab lr-sensitivity` ({exc})") from None
        if not math.isfinite(sens):
            raise ConfigError(f"--lr-from {file}: {key[0]} at depth {key[1]} has not finished every learning rate of "
                              "its grid, so its best rate is not the grid's; finish that study first")
        out[key] = lr
    return out
