"""The report of an Optuna search: trials.csv, the optimisation history, the per-epoch curves that pruning
read, the parameter importances (Optuna's fANOVA evaluator; the figures are drawn by :mod:`vitlab.plots.search`),
summary.json and index.html."""

from __future__ import annotations

import json
import math
from typing import Any

from vitlab.experiments.values import format_value

# the per-epoch metric on the validation split -> its direction (the test set is read once per trial, never compared)
OBJECTIVES = {"val_acc": "maximize", "val_loss": "minimize"}


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


def write_search(study: Any, config: Any, *, storage: str) -> dict[str, Any]:
    """Write the report of ``config`` (a :class:`~vitlab.experiments.search.SearchConfig`) into its ``output``;
    returns its rows, best trial, text and figure names."""
    from optuna.trial import TrialState

    from vitlab.plots.search import plot_curves, plot_history, plot_importance
    from vitlab.writers import Section, write_csv, write_json, write_report

    out, metric = config.output, config.objective
    rows = trial_rows(study, config.params)
    write_csv(out / "trials.csv", rows)
    title = f"Optuna search of {config.model} on {config.dataset}"
    figures = [plot_history(study, metric, out / "history.png", "optimisation history",
                            maximize=OBJECTIVES[metric] == "maximize").name,
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
