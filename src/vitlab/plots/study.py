"""The figures of the sweep, comparison and complexity studies (the depth study's are :mod:`vitlab.plots.depth`):
each takes the numbers its study computed and draws them with :func:`vitlab.plots.figure.new_figure` /
:func:`~vitlab.plots.figure.save`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vitlab.plots.figure import new_figure, save


def plot_param(series: list[Any], param: Any, labels: list[str], path: str | Path, title: str) -> Path:
    """A sweep's figure: test accuracy (%) and training time (s) against ``param``'s values (a
    :class:`~vitlab.experiments.sweep.SweepParam`; ``labels``: each value as the tables write it), one line per
    :class:`~vitlab.experiments.sweep.Series`. A series that carries its seeds (``acc_seeds``) is drawn as the median
    over seeds with every seed a dot beside it, so one lucky or failed seed neither moves the line nor hides; one
    without them as the mean +- std."""
    fig = new_figure(10.0, 3.8)
    ax_acc, ax_time = fig.subplots(1, 2)
    numeric = param.numeric
    by_seed = bool(series) and all(s.acc_seeds for s in series)
    if numeric:  # the spacing of neighbouring values on a linear axis, which the seeds' dots are shifted by
        vals = sorted(float(v) for v in param.values)
        step = (vals[-1] - vals[0]) / (len(vals) - 1) if len(vals) > 1 and vals[-1] > vals[0] else 1.0
    else:
        step = 1.0
    for j, s in enumerate(series):
        x = [float(v) for v in s.x] if numeric else [param.values.index(v) for v in s.x]
        label = s.label or None
        if not by_seed:
            ax_acc.errorbar(x, [100 * m for m in s.acc_mean], yerr=[100 * d for d in s.acc_std], marker="o",
                            capsize=4, label=label)
            ax_time.errorbar(x, s.time_mean, yerr=s.time_std, marker="o", capsize=4, label=label)
            continue
        line = ax_acc.plot(x, [100 * m for m in s.acc_median], marker="o", label=label)[0]
        offset = 0.04 * (j - (len(series) - 1) / 2)  # lines' dots side by side, not on top of each other
        for xi, accs in zip(x, s.acc_seeds):
            at = xi * 2 ** offset if numeric and _log_axis(param) else xi + offset * step
            ax_acc.scatter([at] * len(accs), [100 * a for a in accs], s=14, alpha=0.5, color=line.get_color(),
                           linewidths=0)
        ax_time.plot(x, s.time_median, marker="o", label=label, color=line.get_color())
    for ax, ylabel in ((ax_acc, "test accuracy (%)"), (ax_time, "training time (s)")):
        if numeric:
            vals = [float(v) for v in param.values]
            if _log_axis(param):
                ax.set_xscale("log", base=2)
            ax.set_xticks(vals, labels)
            ax.minorticks_off()
        else:
            ax.set_xticks(list(range(len(labels))), labels)
        ax.set_xlabel(param.name)
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        if any(s.label for s in series):
            ax.legend(fontsize=8)
    spread = "median over seeds, a dot per seed" if by_seed else "mean +- std over seeds"
    ax_acc.set_title(f"test accuracy, {spread}")
    ax_time.set_title("training time, median over seeds" if by_seed else "training time, mean +- std over seeds")
    fig.suptitle(title)
    return save(fig, path)


def _log_axis(param: Any) -> bool:
    """Whether a numeric sweep's x axis is drawn on a log-2 scale: positive values spanning 8x or more."""
    vals = [float(v) for v in param.values]
    return min(vals) > 0 and max(vals) / min(vals) >= 8


def plot_compare(agg: list[dict[str, Any]], path: str | Path, title: str,
                 rows: list[dict[str, Any]] | None = None) -> Path:
    """Horizontal bars per row of the table: test accuracy, training time, parameters. With ``rows`` (one per run:
    ``label``, ``start``, ``test_acc``, ``train_time_s``) each bar is the median over seeds and every seed a dot on
    it, so one lucky or failed seed neither moves the bar nor hides; without them, the mean +- std."""
    import math

    def finite(r: dict[str, Any], key: str) -> bool:  # a failed seed's value is None or NaN
        return r.get(key) is not None and not math.isnan(float(r[key]))

    fig = new_figure(13.0, 0.6 * len(agg) + 1.8)
    axes = fig.subplots(1, 3, sharey=True)
    y = list(range(len(agg)))[::-1]
    labels = [a["label"] for a in agg]
    by_seed = rows is not None
    panels = ((axes[0], "test_acc", 100.0, "test accuracy (%)", "{:.2f}"),
              (axes[1], "train_time_s", 1.0, "training time (s)", "{:.0f}"))
    for ax, key, scale, xlabel, fmt in panels:
        if by_seed:
            centre = [scale * a[f"{key}_median"] for a in agg]
            ax.barh(y, centre, color="#1f77b4", alpha=0.6)
            for yi, a in zip(y, agg):
                seeds = [scale * float(r[key]) for r in rows
                         if (r["label"], r["start"]) == (a["label"], a["start"]) and finite(r, key)]
                ax.scatter(seeds, [yi] * len(seeds), s=16, color="#222222", alpha=0.7, linewidths=0, zorder=3)
        else:
            centre = [scale * a[f"{key}_mean"] for a in agg]
            ax.barh(y, centre, xerr=[scale * a[f"{key}_std"] for a in agg], color="#1f77b4", alpha=0.8, capsize=3)
        for yi, m in zip(y, centre):
            ax.text(m, yi + (0.3 if by_seed else 0.0), " " + fmt.format(m), va="center", fontsize=8)
        ax.set_xlabel(xlabel)
        ax.grid(True, axis="x", alpha=0.3)
    params = [a["params"] / 1e6 for a in agg]
    axes[2].barh(y, params, color="#2ca02c", alpha=0.8)
    for yi, a, p in zip(y, agg, params):
        macs = a["matmul_macs"] if a["matmul_macs"] is not None else a["macs"]
        note = f" {p:.2f}M, {macs / 1e6:.0f} MMACs" if macs is not None else f" {p:.2f}M"
        axes[2].text(p, yi, note, va="center", fontsize=8)
    axes[2].set_xlabel("parameters (M)")
    axes[2].grid(True, axis="x", alpha=0.3)
    axes[0].set_yticks(y, labels)
    spread = "median over seeds, a dot per seed" if by_seed else "mean +- std over seeds"
    axes[0].set_title(f"test accuracy, {spread}", fontsize=9)
    axes[1].set_title(f"training time, {spread}", fontsize=9)
    key = "test_acc_median" if by_seed else "test_acc_mean"
    lo = min([100 * a[key] for a in agg] + [100 * float(r["test_acc"]) for r in rows or () if finite(r, "test_acc")])
    axes[0].set_xlim(0.0 if lo < 60 else lo - 10, 101)
    for ax in axes[1:]:
        ax.set_xlim(0, ax.get_xlim()[1] * 1.35)
    fig.suptitle(title)
    return save(fig, path)


def plot_complexity(result: Any, path: str | Path, title: str) -> Path:
    """Three log-log panels against tokens of a :class:`~vitlab.experiments.complexity.ComplexityResult`: measured
    times with their fits, memory, analytic MACs by part."""
    import numpy as np
    from matplotlib.ticker import FuncFormatter, NullFormatter


    pts = result.points
    t = np.array([p.tokens for p in pts], dtype=float)
    fits = {r["quantity"]: r for r in result.fits}
    fig = new_figure(14.0, 4.2)
    axes = fig.subplots(1, 3)
    panels = ((axes[0], (("forward_s", "forward", "#1f77b4"), ("forward_backward_s", "forward+backward", "#d62728")),
               "seconds per batch", 1.0),
              (axes[1], (("memory_bytes", pts[0].memory_kind.replace("_", " "), "#2ca02c"),), "MiB", 2.0 ** -20),
              (axes[2], (("macs", "total", "#222222"), ("linear_macs", "token-linear", "#1f77b4"),
                         ("attention_macs", "attention (T^2)", "#d62728")), "MACs per image", 1.0))
    for ax, series, ylabel, scale in panels:
        for key, label, color in series:
            y = np.array([getattr(p, key) for p in pts], dtype=float) * scale
            fit = fits.get(key)
            text = f"{label}, b = {fit['exponent']:.2f}" if fit else label
            ax.plot(t, y, "o-", color=color, label=text)
            if fit:
                ax.plot(t, np.exp(fit["intercept"]) * t ** fit["exponent"] * scale, ":", color=color, alpha=0.7)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(t, [str(int(v)) for v in t])
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("tokens per image")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_title("measured time (median)")
    axes[1].set_title("memory")
    axes[2].set_title("analytic MACs")
    fig.suptitle(title)
    return save(fig, path)
