"""The report of an Optuna search: trials.csv, the optimisation history, the per-epoch curves that pruning
read, the parameter importances (Optuna's fANOVA evaluator), summary.json and index.html."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from vitlab.experiments.values import format_value

# the per-epoch metric on the validation split -> its direction (the test set is read once per trial, never compared)
OBJECTIVES = {"val_acc": "maximize", "val_loss": "minimize"}

LABELS = {"val_acc": "validation accuracy (%)", "val_loss": "validation loss"}


def _scale(metric: str, v: float) -> float:
    return 100 * v if metric == "val_acc" else v


def trial_rows(study: Any, params: list[Any]) -> list[dict[str, Any]]:
    """One row per trial: number, state, value (the objective on the validation split), the searched values, the
    test accuracy of a complete trial (measured once at its end), epochs, duration and run folder."""
    rows = []
    for t in study.get_trials(deepcopy=False):
        row: dict[str, Any] = {"number": t.number, "state": t.state.name,
                               "value": t.value if t.value is not None else float("nan")}
        for p in params:
            row[p.name] = format_value(t.params[p.name]) if p.name in t.params else ""
        test_acc = t.user_attrs.get("test_acc")
        row["test_acc"] = test_acc if t.state.name == "COMPLETE" and test_acc is not None else float("nan")
        row["epochs"] = t.user_attrs.get("epochs", "")
        row["duration_s"] = round(t.duration.total_seconds(), 2) if t.duration is not None else float("nan")
        row["run"] = t.user_attrs.get("run", "")
        row["note"] = t.user_attrs.get("error", "") or (f"re-run of trial {t.user_attrs['rerun_of']}"
                                                        if "rerun_of" in t.user_attrs else "")
        rows.append(row)
    return rows


def plot_history(study: Any, metric: str, path: Path, title: str) -> Path:
    """Each finished trial's value against its number (pruned trials at their last reported epoch) and the
    best value so far."""
    from optuna.trial import TrialState

    from vitlab.analysis.plots import new_figure, save

    fig = new_figure(7.0, 4.0)
    ax = fig.subplots()
    maximize = OBJECTIVES[metric] == "maximize"
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

    from vitlab.analysis.plots import new_figure, save

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


def importances(study: Any) -> tuple[dict[str, float] | None, str]:
    """Optuna's parameter importances over the complete trials, or None and the reason they cannot be had."""
    import optuna
    from optuna.trial import TrialState

    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if len(complete) < 2:
        return None, f"{len(complete)} complete trial(s): importances need at least 2."
    distinct = {k for t in complete for k in t.params if len({json.dumps(u.params.get(k)) for u in complete}) > 1}
    if not distinct:
        return None, "every complete trial has the same values: nothing to attribute the differences to."
    try:
        # fANOVA named (Optuna 5 made PED-ANOVA the default, which warns on small studies), seeded: the same
        # study gives the same importances
        evaluator = optuna.importance.FanovaImportanceEvaluator(seed=0)
        return optuna.importance.get_param_importances(study, evaluator=evaluator), ""
    except (RuntimeError, ValueError) as exc:
        return None, f"Optuna could not compute them ({exc})."


def plot_importance(imp: dict[str, float], path: Path, title: str) -> Path:
    from vitlab.analysis.plots import new_figure, save

    names = list(imp)[::-1]
    fig = new_figure(6.0, 1.2 + 0.45 * len(names))
    ax = fig.subplots()
    ax.barh(names, [imp[n] for n in names], color="#1f77b4")
    ax.set_xlabel("importance (share of the variance of the objective, fANOVA)")
    ax.set_xlim(0, 1)
    ax.grid(True, axis="x", alpha=0.3)
    ax.set_title(title)
    return save(fig, path)


def write_search(study: Any, config: Any, *, storage: str) -> dict[str, Any]:
    """Write the report of ``config`` (a :class:`~vitlab.experiments.search.SearchConfig`) into its ``output``;
    returns its rows, best trial, text and figure names."""
    from optuna.trial import TrialState

    from vitlab.analysis.report import Section, write_csv, write_json, write_report

    out, metric = config.output, config.objective
    rows = trial_rows(study, config.params)
    write_csv(out / "trials.csv", rows)
    title = f"Optuna search of {config.model} on {config.dataset}"
    figures = [plot_history(study, metric, out / "history.png", "optimisation history").name,
               plot_curves(study, metric, out / "curves.png", f"per-epoch {metric} of each trial").name]
    imp, why = importances(study)
    if imp is not None:
        figures.append(plot_importance(imp, out / "importance.png", "parameter importances").name)
    counts = {s.name.lower(): len(study.get_trials(deepcopy=False, states=(s,)))
              for s in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)}
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    best = None
    if complete:
        b = study.best_trial
        best = {"number": b.number, "value": b.value, "params": b.params, "run": b.user_attrs.get("run"),
                "test_acc": b.user_attrs.get("test_acc")}
    text = (f"{len(rows)} trials: {counts['complete']} complete, {counts['pruned']} pruned, {counts['fail']} failed "
            f"({config.pruner} pruner on the per-epoch {metric}).")
    if best is not None:
        shown = _shown(metric, best["value"])
        where = ", ".join(f"{k}={format_value(v)}" for k, v in best["params"].items())
        test = best["test_acc"]
        tested = f"; its test accuracy {100 * test:.2f}%" if isinstance(test, float) and math.isfinite(test) else ""
        text += f" Best {metric} {shown} in trial {best['number']} at {where}{tested}."
    meta = {"model": config.model, "dataset": config.dataset, "space": [p.describe() for p in config.params],
            "fixed_overrides": config.fixed, "objective": metric, "direction": OBJECTIVES[metric],
            "pruner": config.pruner, "prune_startup": config.prune_startup, "prune_warmup": config.prune_warmup,
            "seed": config.seed, "trials": config.trials, "storage": storage, "run_config": config.base.to_dict()}
    write_json(out / "summary.json", {**meta, "counts": counts, "best": best,
                                      "importances": imp, "importances_note": why})
    imp_text = (f"Importances by Optuna's fANOVA evaluator over the {counts['complete']} complete trials: the share "
                "of the objective's variance each parameter explains (rough with few trials)." if imp is not None
                else f"No importance figure: {why}")
    sections = [
        Section("Search", f"{text} Values are each trial's final {metric}, on the validation images it held out "
                "(the test set is read once per trial and never compared); a pruned trial shows the last epoch "
                "it reported. The study is stored in optuna.db: running the same command with a larger --trials "
                "continues it.", figures[:2], []),
        Section("Parameter importances", imp_text, figures[2:],
                [[{"parameter": k, "importance": round(v, 4)} for k, v in imp.items()]] if imp else []),
        Section("Every trial", "One row per trial; each run folder holds its checkpoint, metrics.jsonl and "
                "summary.json.", [], ["trials.csv"]),
        Section("Settings", "", [], [[{"setting": k, "value": v if isinstance(v, str) else json.dumps(v)}
                                      for k, v in meta.items()]]),
    ]
    write_report(out, title, config.command, sections)
    return {"trials": rows, "best": best, "text": text, "figures": figures, "counts": counts,
            "importances": imp}


def _shown(metric: str, v: float) -> str:
    if not math.isfinite(v):
        return "n/a"
    return f"{100 * v:.2f}%" if metric == "val_acc" else f"{v:.4f}"
