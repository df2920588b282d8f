"""The tables of a study: one row per run read from its trainer summary, and the mean and standard deviation over
seeds per group. Sweep, compare and the depth study all build their ``results.csv`` and ``summary.csv`` here.

No column is chosen on the test set. ``test_acc`` is the test accuracy of the last epoch's weights. With a
validation split (``--val-split``, as ``vitlab train --val-split``) the runs also have ``val_acc`` (the last
epoch's) and ``best_val_acc`` (the best epoch, chosen on the validation images); without one nothing is selected,
the final epoch is reported. A trainer summary's ``best_test_acc`` (the best epoch chosen on the test set, written
by runs without a validation split) is never tabled.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence

SUMMARY_KEYS = {  # the column a study writes -> the keys of the trainer's summary.json, first found wins
    "test_acc": ("final_test_acc", "test_acc"),
    "val_acc": ("final_val_acc",),
    "best_val_acc": ("best_val_acc",),
    "train_time_s": ("train_time_s",),
    "train_cpu_s": ("train_cpu_s",),
    "wall_time_s": ("wall_time_s",),
    "epochs": ("epochs",),
    "params": ("params",),
    "macs": ("macs",),
}
VALIDATION = ("val_acc", "best_val_acc")  # columns of runs that held out a validation split


def summary_value(summary: dict, column: str) -> float:
    """The number a trainer summary holds for ``column`` (see :data:`SUMMARY_KEYS`), NaN when absent."""
    for key in SUMMARY_KEYS.get(column, (column,)):
        v = summary.get(key)
        if isinstance(v, bool):
            continue
        if isinstance(v, int | float):
            return float(v)
    return float("nan")


def diverged(summary: dict) -> bool:
    """Whether a run of a study diverged (:func:`vitlab.experiments.runs.train_run` keeps it as a result)."""
    return summary.get("diverged") is True


def has_validation(summaries: Iterable[dict]) -> bool:
    """Whether any of these trainer summaries comes from a run that held out a validation split."""
    return any(summary_value(s, "val_acc") == summary_value(s, "val_acc") for s in summaries)


def value_columns(base: Sequence[str], validation: bool) -> tuple[str, ...]:
    """The value columns of a study: ``base`` (``test_acc`` first), with :data:`VALIDATION` right after
    ``test_acc`` when the runs held out a validation split (:func:`has_validation`; for rows already made:
    ``"val_acc" in row``)."""
    if not validation:
        return tuple(base)
    rest = [c for c in base if c != "test_acc"]
    return ("test_acc", *VALIDATION, *rest) if "test_acc" in base else (*VALIDATION, *rest)


def summary_values(summary: dict, columns: Sequence[str]) -> dict[str, float]:
    """``{column: number}`` of one run's summary for each of ``columns`` (NaN when absent)."""
    return {c: summary_value(summary, c) for c in columns}


def finite_median(values: Sequence[float]) -> float:
    """Median of the finite ``values``; NaN when none (a diverged run's NaN loss does not move it)."""
    xs = [float(v) for v in values if v == v]
    return statistics.median(xs) if xs else float("nan")


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value) of the finite ``values``; NaNs when none."""
    xs = [float(v) for v in values if v == v]
    if not xs:
        return float("nan"), float("nan")
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def aggregate(rows: Sequence[dict], keys: Sequence[str], values: Sequence[str]) -> list[dict]:
    """Group ``rows`` by ``keys`` (first-seen order) and give ``n`` and ``<v>_mean`` / ``<v>_std`` / ``<v>_median``
    per value column (the median is what a page quotes over seeds: one lucky or failed seed does not move it; a
    column a row lacks, as in a record written before that measure existed, counts as NaN)."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in keys), []).append(r)
    out = []
    for key, members in groups.items():
        row = dict(zip(keys, key))
        row["n"] = len(members)
        for v in values:
            xs = [float(m.get(v, math.nan)) for m in members]
            row[f"{v}_mean"], row[f"{v}_std"] = mean_std(xs)
            row[f"{v}_median"] = finite_median(xs)
        out.append(row)
    return out


def mark_groups(agg: Sequence[dict], rows: Sequence[dict], keys: Sequence[str]) -> None:
    """Set ``undertrained`` on each aggregated row of ``agg`` (grouped by ``keys``) when any of its runs is, and
    ``diverged`` (and ``failed``, when any run of the study failed) to the number of its runs that did."""
    any_failed = any(r.get("failed", False) for r in rows)
    for a in agg:
        members = [r for r in rows if all(r[k] == a[k] for k in keys)]
        a["undertrained"] = any(r.get("undertrained", False) for r in members)
        a["diverged"] = sum(1 for r in members if r.get("diverged", False))
        if any_failed:
            a["failed"] = sum(1 for r in members if r.get("failed", False))


def aggregate_runs(rows: Sequence[dict], keys: Sequence[str], values: Sequence[str],
                   carry: Sequence[str] = ("params", "macs")) -> list[dict]:
    """A study's ``summary.csv``: :func:`aggregate` of ``rows`` by ``keys``, each group's ``carry`` columns (the
    same for every seed: parameters, MACs) from its first run, and the marks of :func:`mark_groups`."""
    agg = aggregate(rows, keys, values)
    first = {tuple(r[k] for k in keys): r for r in reversed(rows)}
    for a in agg:
        r = first[tuple(a[k] for k in keys)]
        a.update({c: r[c] for c in carry})
    mark_groups(agg, rows, keys)
    return agg
