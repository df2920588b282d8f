"""The figures of an Optuna search (:mod:`vitlab.experiments.search_report` writes them): the optimisation history,
the per-epoch curves that pruning read and the parameter importances."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vitlab.plots.figure import new_figure, save

LABELS = {"val_acc": "validation accuracy (%)", "val_loss": "validation loss"}


def _scale(metric: str, v: float) -> float:
    return 100 * v if metric == "val_acc" else v


def plot_history(study: Any, metric: str, path: Path, title: str, *, maximize: bool) -> Path:
    """Each finished trial's value against its number (pruned trials at their last reported epoch) and the
    best value so far (the largest when ``maximize``, else the smallest)."""
    from optuna.trial import TrialState

    fig = new_figure(7.0, 4.0)
    ax = fig.subplots()
    best, xs_best, ys_best = None, [], []
    for state, style in ((TrialState.COMPLETE, dict(color="#1f77b4", marker="o", label="complete")),
                         (TrialState.PRUNED, dict(color="#999999", marker="x", label="pruned (last epoch reported)"))):
        pts = [(t.number, _scale(metric, t.value)) for t in study.get_trials(deepcopy=False, states=(state,))
               if t.value is not None]
        if pts:
            ax.scatter(*zip(*pts), **style, zorder=3)
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        v = _scale(metric, t.value)
        best = v if best is None or (v > best if maximize else v < best) else best
        xs_best.append(t.number)
        ys_best.append(best)
    if xs_best:
        ax.step(xs_best, ys_best, where="post", color="#d62728", label="best complete so far")
    ax.set_xlabel("trial")
    ax.set_ylabel(LABELS[metric])
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title)
    return save(fig, path)


def plot_curves(study: Any, metric: str, path: Path, title: str) -> Path:
    """The per-epoch metric each trial reported (what the pruner compared); pruned trials dashed."""
    from optuna.trial import TrialState

    fig = new_figure(7.0, 4.0)
    ax = fig.subplots()
    for t in study.get_trials(deepcopy=False):
        steps = sorted(t.intermediate_values)
        if not steps:
            continue
        pruned = t.state == TrialState.PRUNED
        ax.plot(steps, [_scale(metric, t.intermediate_values[s]) for s in steps], marker=".",
                linestyle="--" if pruned else "-", alpha=0.6 if pruned else 0.9,
                label=f"trial {t.number}" + (" (pruned)" if pruned else ""))
    ax.set_xlabel("epoch")
    ax.set_ylabel(LABELS[metric])
    ax.grid(True, alpha=0.3)
    if len(study.trials) <= 12:
        ax.legend(fontsize=7)
    ax.set_title(title)
    return save(fig, path)


def plot_importance(imp: dict[str, float], path: Path, title: str) -> Path:
    """One bar per parameter: its share of the objective's variance (``imp``, most important on top)."""
    names = list(imp)[::-1]
    fig = new_figure(6.0, 1.2 + 0.45 * len(names))
    ax = fig.subplots()
    ax.barh(names, [imp[n] for n in names], color="#1f77b4")
    ax.set_xlabel("importance (share of the variance of the objective, fANOVA)")
    ax.set_xlim(0, 1)
    ax.grid(True, axis="x", alpha=0.3)
    ax.set_title(title)
    return save(fig, path)
