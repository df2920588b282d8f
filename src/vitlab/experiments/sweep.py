"""Hyper-parameter sweeps: train one model per value (a grid for several parameters) and
seed, then plot test accuracy (mean +- std over seeds) and training time against each parameter.

Any :class:`~vitlab.models.ModelConfig` field can be swept (``embed_dim``, ``patch_size``, ``depth``,
``num_heads``, ``mlp_ratio``, ``gate``...), and so can the recipe options of
:class:`~vitlab.train.config.RunConfig` (``lr``, ``batch_size``, ``drop_path``...). Values are parsed to
the field's type (:mod:`vitlab.train.config`). For ``timm:NAME`` models the values are read as YAML scalars and
passed to timm. :func:`run_sweep` runs a whole sweep from a :class:`SweepConfig`.
"""

from __future__ import annotations

import itertools
import json
import math
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vitlab import flops
from vitlab.errors import ConfigError
from vitlab.experiments.budget import run_marks, undertrained_warning, warning_section
from vitlab.experiments.runs import RunSpec
from vitlab.experiments.table import (
    aggregate_runs,
    has_validation,
    summary_value,
    summary_values,
    value_columns,
)
from vitlab.experiments.values import format_value, safe_name, split_list, unknown_option

MODEL, RUN = "model", "run"
SWEEPABLE_RUN = ("epochs", "batch_size", "lr", "min_lr", "weight_decay", "warmup_epochs", "label_smoothing",
                 "clip_grad", "drop_path", "drop_path_rule", "ema_decay", "degrees", "shear", "translate",
                 "erase_prob", "hflip", "pad_crop", "mixup", "cutmix", "limit_train", "layer_decay")
VALUES = ("test_acc", "train_time_s", "train_cpu_s", "wall_time_s")  # with a validation split also table.VALIDATION


@dataclass
class SweepParam:
    """A swept option: its name, whether it is a model option or a run option, and its parsed values."""

    name: str
    kind: str  # model | run
    values: list[Any]

    @property
    def numeric(self) -> bool:
        return all(isinstance(v, int | float) and not isinstance(v, bool) for v in self.values)


def param_types(model: str) -> dict[str, tuple[str, Any]]:
    """``{option: (kind, type)}`` of every sweepable option for ``model`` (model options win a name clash)."""
    from vitlab.models import ModelConfig
    from vitlab.train.config import RunConfig

    run_hints = typing.get_type_hints(RunConfig)
    out: dict[str, tuple[str, Any]] = {k: (RUN, run_hints[k]) for k in SWEEPABLE_RUN}
    if not model.startswith("timm:"):
        hints = typing.get_type_hints(ModelConfig)
        out.update({k: (MODEL, hints[k]) for k in ModelConfig.field_names() if k not in ("arch", "name")})
    return out


def parse_param(model: str, name: str, values: str) -> SweepParam:
    """Resolve ``--param NAME --values V1,V2`` for ``model``; unknown names get the closest valid ones."""
    from vitlab.train.config import coerce_to, parse_value

    name = name.strip().replace("-", "_")
    types = param_types(model)
    texts = split_list(values, f"--values for {name}")
    if name in types:
        kind, tp = types[name]
        parsed = [coerce_to(name, parse_value(t), tp, f"--values for {name}") for t in texts]
    elif model.startswith("timm:"):
        kind, parsed = MODEL, [parse_value(t) for t in texts]
    else:
        raise ConfigError(unknown_option(name, list(types), "sweep parameter"))
    unique: list[Any] = []
    for v in parsed:
        if v in unique:
            raise ConfigError(f"--values for {name} repeats {format_value(v)}; give each value once")
        unique.append(v)
    return SweepParam(name, kind, unique)


def parse_params(model: str, names: list[str], values: list[str]) -> list[SweepParam]:
    if not names:
        raise ConfigError("give at least one --param NAME --values V1,V2,...")
    if len(names) != len(values):
        raise ConfigError(f"{len(names)} --param but {len(values)} --values; give one --values after each --param")
    params = [parse_param(model, n, v) for n, v in zip(names, values)]
    seen = [p.name for p in params]
    if len(set(seen)) != len(seen):
        raise ConfigError(f"--param {', '.join(sorted({n for n in seen if seen.count(n) > 1}))} is given twice; "
                          "merge the values into one --values list")
    return params


def run_name(params: list[SweepParam], combo: tuple, seed: int) -> str:
    return safe_name("_".join(f"{p.name}={format_value(v)}" for p, v in zip(params, combo)) + f"_seed={seed}")


def sweep_specs(model: str, params: list[SweepParam], seeds: list[int], base: Any,
                fixed: dict[str, Any]) -> list[RunSpec]:
    """One :class:`RunSpec` per value combination and seed; every combination is validated before any runs."""
    from vitlab.models import get_config

    specs = []
    for combo in itertools.product(*(p.values for p in params)):
        overrides = dict(fixed)
        run_fields: dict[str, Any] = {}
        for p, v in zip(params, combo):
            (overrides if p.kind == MODEL else run_fields)[p.name] = v
        where = ", ".join(f"{p.name}={format_value(v)}" for p, v in zip(params, combo))
        try:
            if not model.startswith("timm:"):
                get_config(model, **overrides)
            cfg = base.replace(model=model, model_overrides=overrides, **run_fields)
            cfg.validate()
        except ConfigError as exc:
            raise ConfigError(f"the run {where} is invalid: {exc}") from None
        info = {p.name: format_value(v) for p, v in zip(params, combo)}
        for seed in seeds:
            specs.append(RunSpec(run_name(params, combo, seed), cfg.replace(seed=seed), {**info, "seed": seed}))
    return specs


def result_rows(pairs: list[tuple[RunSpec, dict]], params: list[SweepParam]) -> list[dict[str, Any]]:
    """One row per run: the swept values, seed, accuracies (final test; with a validation split also the final
    and best validation accuracy), parameters, MACs/FLOPs and times."""
    values = value_columns(VALUES, has_validation(summary for _, summary in pairs))
    rows = []
    for spec, summary in pairs:
        row = {p.name: spec.info[p.name] for p in params}
        row["seed"] = spec.info["seed"]
        row.update(summary_values(summary, values))
        row["epochs"] = summary_value(summary, "epochs")
        params_n, macs = summary_value(summary, "params"), summary_value(summary, "macs")
        if math.isnan(params_n) or math.isnan(macs):
            cfg = spec.config
            params_n, macs = flops.model_cost(cfg.model, cfg.model_overrides)
        row["params"] = int(params_n)
        row["macs"] = int(macs)
        row["flops"] = 2 * int(macs)
        row.update(run_marks(summary, spec.config))
        row["run"] = spec.name
        rows.append(row)
    return rows


def aggregate_rows(rows: list[dict[str, Any]], params: list[SweepParam]) -> list[dict[str, Any]]:
    """Mean and standard deviation over seeds of each value combination (``n`` runs each)."""
    return aggregate_runs(rows, [p.name for p in params], value_columns(VALUES, any("val_acc" in r for r in rows)))


@dataclass
class Series:
    """One line of a sweep figure: the other parameters' values, and per value of the swept one its x, the test
    accuracy's mean / std / median over seeds and every seed's accuracy (``acc_seeds``, empty when the per-run rows
    were not given), and the training time's mean / std / median."""

    label: str
    x: list[Any]
    acc_mean: list[float]
    acc_std: list[float]
    time_mean: list[float]
    time_std: list[float]
    acc_median: list[float] = field(default_factory=list)
    acc_seeds: list[list[float]] = field(default_factory=list)
    time_median: list[float] = field(default_factory=list)


def figure_series(agg: list[dict[str, Any]], param: SweepParam, params: list[SweepParam],
                  rows: list[dict[str, Any]] | None = None) -> list[Series]:
    """The lines of ``param``'s figure: one per combination of the other parameters, x in ``param.values`` order;
    given the per-run ``rows`` (:func:`result_rows`), each point also carries its seeds' finite test accuracies."""
    others = [p for p in params if p.name != param.name]
    out = []
    for combo in itertools.product(*(p.values for p in others)):
        fixed = {p.name: format_value(v) for p, v in zip(others, combo)}
        label = ", ".join(f"{k}={v}" for k, v in fixed.items())
        series = Series(label, [], [], [], [], [])
        for v in param.values:
            cell = {**fixed, param.name: format_value(v)}
            match = [a for a in agg if all(a[k] == fv for k, fv in cell.items())]
            if not match:
                continue
            a = match[0]
            series.x.append(v)
            series.acc_mean.append(a["test_acc_mean"])
            series.acc_std.append(a["test_acc_std"])
            series.time_mean.append(a["train_time_s_mean"])
            series.time_std.append(a["train_time_s_std"])
            series.acc_median.append(a.get("test_acc_median", a["test_acc_mean"]))
            series.time_median.append(a.get("train_time_s_median", a["train_time_s_mean"]))
            if rows is not None:
                accs = [float(r["test_acc"]) for r in rows if all(format_value(r[k]) == fv for k, fv in cell.items())]
                series.acc_seeds.append([x for x in accs if math.isfinite(x)])
        if series.x:
            out.append(series)
    return out


def summary_text(agg: list[dict[str, Any]], params: list[SweepParam]) -> str:
    """The sweep in one sentence: the best combination, chosen on the validation split when the runs held one
    out (its test accuracy beside it), else the highest final test accuracy, said to be read on the test set."""
    metric = "val_acc" if "val_acc_mean" in agg[0] else "test_acc"
    best = max(agg, key=lambda a: a[f"{metric}_mean"] if a[f"{metric}_mean"] == a[f"{metric}_mean"] else -1)
    where = ", ".join(f"{p.name}={best[p.name]}" for p in params)
    if metric == "val_acc":
        return (f"Best mean validation accuracy {100 * best['val_acc_mean']:.2f}% (+- {100 * best['val_acc_std']:.2f}, "
                f"{best['n']} seeds) at {where}; its test accuracy {100 * best['test_acc_mean']:.2f}% "
                f"(+- {100 * best['test_acc_std']:.2f}).")
    return (f"Best mean test accuracy {100 * best['test_acc_mean']:.2f}% (+- {100 * best['test_acc_std']:.2f}, "
            f"{best['n']} seeds) at {where}, read on the test set: a description of this grid, not a tuned "
            "result (--val-split chooses on held-out training images).")


def write_sweep(out: Path, pairs: list[tuple[RunSpec, dict]], params: list[SweepParam], *, title: str,
                command: str, meta: dict[str, Any]) -> dict[str, Any]:
    """results.csv, summary.csv, one ``sweep_<param>.png`` per parameter, summary.json and index.html."""
    from vitlab.plots.study import plot_param
    from vitlab.writers import Section, write_csv, write_json, write_report

    rows = result_rows(pairs, params)
    agg = aggregate_rows(rows, params)
    write_csv(out / "results.csv", rows)
    write_csv(out / "summary.csv", agg)
    figures = []
    for p in params:
        name = f"sweep_{safe_name(p.name)}.png"
        plot_param(figure_series(agg, p, params, rows), p, [format_value(v) for v in p.values], out / name,
                   f"{title}: {p.name}")
        figures.append(name)
    text = summary_text(agg, params)
    first = pairs[0][0].config
    warning = undertrained_warning(rows, first.dataset, first.limit_train)
    write_json(out / "summary.json", {**meta, "params": [{"name": p.name, "kind": p.kind, "values": p.values}
                                                          for p in params], "results": agg, "warning": warning})
    sections = warning_section(rows, [p.name for p in params] + ["seed"], warning)
    sections += [Section("Sweep", f"{text} Each point is the mean over seeds of the final test accuracy; error bars "
                        "are the sample standard deviation (0 with one seed). Training time is the time spent in "
                        "training steps, without evaluation; it was measured on a machine that may be shared.",
                        figures, ["summary.csv"]),
                Section("Every run", "One row per run; each run's folder holds its checkpoint, metrics.jsonl and "
                        "summary.json.", [], ["results.csv"]),
                Section("Settings", "", [], [[{"setting": k, "value": json.dumps(v) if not isinstance(v, str) else v}
                                              for k, v in meta.items()]])]
    write_report(out, title, command, sections)
    return {"rows": rows, "summary": agg, "figures": figures, "text": text, "warning": warning}


@dataclass
class SweepConfig:
    """A whole sweep: ``model`` trained with ``base`` once per combination of ``params`` and per seed."""

    model: str  # a preset or timm:NAME
    params: list[SweepParam]  # from parse_params
    base: Any  # the RunConfig of every run (recipe, data set); model and model options are set per run
    output: Path  # the study folder
    seeds: int = 1  # seeds 0..seeds-1 per combination
    fixed: dict[str, Any] = field(default_factory=dict)  # model options of every run
    command: str = ""  # the command line the report shows
    logger: str = "none"  # also track the study there (vitlab.train.tracking)
    finished_only: bool = False  # train nothing; tables from the runs already finished
    executor: Any = None  # where the runs train (vitlab.experiments.executors.ExecutorConfig; None: in this process)
    force: bool = False  # replace the files of the study's names in an --output folder vitlab did not claim


def sweep_run_specs(config: SweepConfig) -> list[RunSpec]:
    """The runs of ``config``, checked (what ``--dry-run`` plans and :func:`run_sweep` trains)."""
    if config.seeds < 1:
        raise ConfigError(f"--seeds must be >= 1, got {config.seeds}")
    clash = [p.name for p in config.params if p.name in config.fixed]
    if clash:
        raise ConfigError(f"{', '.join(clash)} is swept by --param and fixed by --set; drop one of them")
    return sweep_specs(config.model, config.params, list(range(config.seeds)), config.base, config.fixed)


def run_sweep(config: SweepConfig) -> dict[str, Any]:
    """Train (or read back) every run of the sweep and write its tables, figures and report into
    ``config.output``; returns :func:`write_sweep`'s result, the study folder (``out``) and the ``(spec, summary)``
    pairs (``pairs``; :func:`vitlab.experiments.runs.exit_status` tells which failed)."""
    from vitlab.experiments.runs import run_study, track_study

    base = config.base
    specs = sweep_run_specs(config)
    out, pairs = run_study(specs, config.output, "sweep", force=config.force, command=config.command, title="sweep",
                           finished_only=config.finished_only, executor=config.executor)
    title = f"Sweep of {config.model} on {base.dataset}"
    meta = {"model": config.model, "dataset": base.dataset, "seeds": config.seeds, "fixed_overrides": config.fixed,
            "run_config": base.to_dict()}
    result = write_sweep(out, pairs, config.params, title=title, command=config.command, meta=meta)
    track_study(out, config.logger, pairs, meta)
    return {**result, "out": out, "pairs": pairs}
