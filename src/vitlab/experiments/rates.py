"""The learning rate a finished ``vitlab lr-sensitivity`` study chose for each variant and depth (on validation loss),
read back from its ``sensitivity.csv`` for ``vitlab depth-study --lr-from``, with a warning for each rate on the edge
of its cell's rates (``bracketed`` False: the optimum may lie beyond them)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

from vitlab.checkpoint.textfiles import read_csv
from vitlab.errors import ConfigError

COLUMNS = ("variant", "depth", "best_lr", "lr_sensitivity")
FIX = "pass the sensitivity.csv a finished `vitlab lr-sensitivity` study wrote (its folder or the file)"


def best_rates(path: str | Path, cells: set[tuple[str, int]] | None = None) -> dict[tuple[str, int], float]:
    """``{(variant, depth): best learning rate}`` from a study's ``sensitivity.csv`` (or the study folder holding it),
    for training each variant at each depth at its own rate (``vitlab depth-study --lr-from``). Given ``cells``, the
    (variant, depth) pairs the caller will train, a row of another cell whose grid has not finished yet is left out
    instead of refused (and its edge warning not printed), so a study can train the cells whose grids have finished
    while the others' still run; an empty set requires none.

    Every row is checked before anything runs, each refusal one :class:`ConfigError` line naming ``--lr-from FILE``
    and the line: a row whose sensitivity is empty (a rate of the grid not finished yet: its best rate is not the
    grid's), a rate no run could train at (not finite, not in the range ``--lr`` allows), a depth that is not a
    positive integer, two rows for one variant and depth; and, from
    :func:`vitlab.checkpoint.textfiles.read_csv`, a file that is not a UTF-8 CSV table of at most 16 MiB with
    these columns.

    A file with a ``bracketed`` column (``vitlab lr-sensitivity`` writes one) gets one warning line on stderr per row
    whose best rate is on the edge of its rates (``False``), naming the fix (``--bracket``); the rate is still
    used. A file without the column is read as before, silently."""
    from vitlab.train.config import LIMITS

    file = Path(path)
    if file.is_dir():
        file = file / "sensitivity.csv"
    if not file.is_file():
        raise ConfigError(f"--lr-from {path}: no sensitivity.csv there; {FIX}")
    name = f"--lr-from {file}"
    low, high, interval, why = LIMITS["lr"]
    out: dict[tuple[str, int], float] = {}
    lines: dict[tuple[str, int], int] = {}
    edges: list[str] = []
    for line, r in read_csv(file, name=name, fix=FIX, columns=COLUMNS, error=ConfigError):
        at = f"{name} line {line}"
        variant = r["variant"].strip()
        if not variant:
            raise ConfigError(f"{at}: the variant is empty; {FIX}")
        try:
            depth = int(r["depth"])
        except ValueError:
            depth = 0
        if depth < 1:
            raise ConfigError(f"{at}: depth {r['depth'][:40]!r} is not a positive whole number; {FIX}")
        key = (variant, depth)
        if key in lines:
            raise ConfigError(f"{name} lines {lines[key]} and {line} both give {variant} at depth {depth}; keep the "
                              f"one row a study writes for each variant and depth")
        lines[key] = line
        try:
            sens = float(r["lr_sensitivity"] or "nan")
        except ValueError:
            raise ConfigError(f"{at}: lr_sensitivity {r['lr_sensitivity'][:40]!r} is not a number; {FIX}") from None
        if not math.isfinite(sens) and cells is not None and key not in cells:
            continue  # another cell's grid, still running: not this study's concern
        if not math.isfinite(sens):
            raise ConfigError(f"{at}: {variant} at depth {depth} has not finished every learning rate of its grid, so "
                              f"its best rate is not the grid's; finish that study first")
        try:
            lr = float(r["best_lr"])
        except ValueError:
            lr = math.nan
        if not (math.isfinite(lr) and low(lr) and high(lr)):
            raise ConfigError(f"{at}: best_lr {r['best_lr'][:40]!r} of {variant} at depth {depth} is not a learning "
                              f"rate a run can train at (a number in {interval}: {why}); rerun that study, or correct "
                              f"the row")
        out[key] = lr
        if (r.get("bracketed") or "").strip().lower() == "false" and (cells is None or key in cells):
            edges.append(f"vitlab: {at}: {variant} at depth {depth}: best rate {lr:g} is on the edge of its grid; "
                         f"the optimum may lie beyond it: rerun the lr-sensitivity study with --bracket 2")
    for warning in edges:  # once every row is accepted: a refused file prints its refusal alone
        print(warning, file=sys.stderr, flush=True)
    return out
