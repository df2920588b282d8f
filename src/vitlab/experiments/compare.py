"""Model comparison: vitlab presets and timm models trained from scratch with one recipe, and
models fine-tuned from local checkpoints, with accuracy, parameters, MACs and training time.

``--pretrained PATH`` values pair with ``--models`` in order (``-`` skips a model); ``NAME=PATH`` pairs with
model ``NAME``. Each adds a fine-tuned row beside the model's from-scratch row. PATH is a ``.safetensors`` /
``.pth`` file or a vitlab checkpoint folder, timm's or vitlab's weights, adapted to the run's image size, patch
size, channels and classes by :func:`vitlab.interop.load_pretrained`; ``hub`` takes timm's own pretrained
weights (needs the network).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vitlab.errors import CheckpointError, ConfigError
from vitlab.experiments.budget import run_marks, undertrained_warning, warning_section
from vitlab.experiments.runs import RunSpec
from vitlab.experiments.table import (
    VALIDATION,
    aggregate_runs,
    has_validation,
    summary_value,
    summary_values,
    value_columns,
)
from vitlab.experiments.values import safe_name, split_list

SKIP = ("-", "none", "")
VALUES = ("test_acc", "train_time_s", "train_cpu_s", "wall_time_s")  # with a validation split also table.VALIDATION


@dataclass
class Entry:
    """One row of the table: a model, its options and the weights it starts from (None: from scratch)."""

    model: str
    overrides: dict[str, Any]
    init: str | None = None
    index: int = 0  # fine-tuned rows of one model are numbered 1, 2, ...

    @property
    def start(self) -> str:
        if self.init is None:
            return "scratch"
        return "timm hub weights" if self.init == "hub" else f"fine-tuned from {self.init}"

    @property
    def label(self) -> str:
        if self.init is None:
            return f"{self.model} (scratch)"
        return f"{self.model} (fine-tuned{f' #{self.index}' if self.index > 1 else ''})"


def parse_models(text: str) -> list[str]:
    from vitlab.models import list_models

    models = split_list(text, "--models")
    presets = set(list_models())
    for m in models:
        if not m.startswith("timm:") and m not in presets:
            import difflib

            close = difflib.get_close_matches(m, presets, n=3, cutoff=0.4)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise ConfigError(f"--models: unknown preset {m!r}{hint} (a vitlab preset, or timm:NAME)")
    if len(set(models)) != len(models):
        raise ConfigError("--models lists a model twice; list each once (fine-tuned rows come from --pretrained)")
    return models


def parse_model_sets(items: list[str] | None, models: list[str]) -> dict[str, dict[str, Any]]:
    """``--set [MODEL:]KEY=VALUE`` -> options per model (without MODEL: for every model); ``KEY=VALUE`` read by
    :func:`vitlab.train.config.parse_set`, as every command's ``--set``."""
    from vitlab.train.config import parse_set

    out: dict[str, dict[str, Any]] = {m: {} for m in models}
    for item in items or ():
        lhs, sep, value = item.partition("=")
        name, colon, key = lhs.rpartition(":")
        if not sep or not key.strip():
            raise ConfigError(f"--set {item!r} must be [MODEL:]KEY=VALUE, e.g. --set timm:vit_tiny_patch16_224:"
                              "patch_size=7")
        targets = models if not colon or not name else [name]
        for t in targets:
            if t not in out:
                raise ConfigError(f"--set {item!r} names model {t!r}, which is not in --models ({', '.join(models)})")
            out[t].update(parse_set([f"{key}={value}"]))
    return out


def parse_pretrained(items: list[str] | None, models: list[str], check: bool = True) -> list[tuple[str, str]]:
    """``(model, path)`` pairs: ``NAME=PATH`` by name, other values by position (``-`` skips that model); each
    path must exist (``hub``: the hub be reachable) unless ``check`` is False (``--finished-only`` trains nothing)."""
    pairs = []
    position = 0
    for item in items or ():
        name, sep, path = item.partition("=")
        if sep and name in models:
            pairs.append((name, path))
            continue
        if position >= len(models):
            raise ConfigError(f"--pretrained {item!r} has no model to pair with: {len(models)} --models; write "
                              "NAME=PATH to name the model")
        if item.strip().lower() not in SKIP:
            pairs.append((models[position], item))
        position += 1
    for model, path in pairs if check else ():  # --finished-only trains nothing, so it needs no weights
        check_weights(model, path)
    return pairs


def check_weights(model: str, path: str) -> None:
    """Fail now, before any training, when the weights cannot be found."""
    if path == "hub":
        from vitlab.interop.pretrained import hub_online

        if not model.startswith("timm:"):
            raise ConfigError(f"--pretrained {model}=hub: hub weights exist for timm:NAME models only; pass a file")
        if not hub_online():
            raise CheckpointError(f"--pretrained {model}=hub needs the network but the Hugging Face hub is "
                                  "unreachable; pass a local .safetensors or .pth file instead")
        return
    p = Path(path).expanduser()
    if not p.exists():
        raise CheckpointError(f"--pretrained {path}: no such file or folder; pass a .safetensors or .pth weight "
                              "file, or a vitlab checkpoint folder")


def entries(models: list[str], sets: dict[str, dict[str, Any]], pretrained: list[tuple[str, str]]) -> list[Entry]:
    """From-scratch rows in ``models`` order, each followed by its fine-tuned rows."""
    out = []
    for m in models:
        out.append(Entry(m, dict(sets[m])))
        inits = [p for name, p in pretrained if name == m]
        out += [Entry(m, dict(sets[m]), str(Path(p).expanduser()) if p != "hub" else p, k + 1)
                for k, p in enumerate(inits)]
    return out


def compare_specs(items: list[Entry], cfg: Any, seeds: list[int]) -> list[RunSpec]:
    specs = []
    for e in items:
        start = "scratch" if e.init is None else f"finetune{e.index}"
        for seed in seeds:
            info = {"model": e.model, "label": e.label, "start": e.start, "overrides": e.overrides, "seed": seed}
            specs.append(RunSpec(safe_name(f"{e.model.replace(':', '-')}_{start}_seed{seed}"),
                                 cfg.replace(model=e.model, model_overrides=e.overrides, seed=seed), info, e.init))
    return specs


def matmul_macs(run_dir: Path) -> int | None:
    """Matmul multiply-adds per image of a run's model (FlopCounterMode FLOPs / 2, on the meta device): one
    definition for vitlab and timm models alike."""
    import torch

    from vitlab.checkpoint import read_config, read_spec
    from vitlab.flops import torch_flops

    try:
        config, spec = read_config(run_dir), read_spec(run_dir)
    except CheckpointError:
        return None
    data = (config.get("run") or {}).get("data") or {}
    if "img_size" not in data:
        return None
    with torch.device("meta"):
        model = spec.build()
        x = torch.empty(1, data["in_chans"], data["img_size"], data["img_size"])
        return torch_flops(model, x) // 2


def result_rows(pairs: list[tuple[RunSpec, dict]], out: Path) -> list[dict[str, Any]]:
    """One row per run: the model, how it started, seed, accuracies (final test; with a validation split also the
    final and best validation accuracy), times, parameters and MACs."""
    import json

    values = value_columns(VALUES, has_validation(summary for _, summary in pairs))
    rows = []
    for spec, summary in pairs:
        row = {"label": spec.info["label"], "model": spec.info["model"], "start": spec.info["start"],
               "seed": spec.info["seed"]}
        row.update(summary_values(summary, values))
        row["epochs"] = summary_value(summary, "epochs")
        params = summary_value(summary, "params")
        row["params"] = int(params) if params == params else None  # None: a failed run
        macs = summary_value(summary, "macs")
        row["macs"] = int(macs) if macs == macs else None
        row["matmul_macs"] = matmul_macs(out / spec.name)
        row["overrides"] = json.dumps(spec.info["overrides"], sort_keys=True)
        row.update(run_marks(summary, spec.config))
        row["run"] = spec.name
        rows.append(row)
    return rows


def aggregate_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean and standard deviation over seeds per row of the table (model and how it started)."""
    values = value_columns(VALUES, any("val_acc" in r for r in rows))
    return aggregate_runs(rows, ("label", "start"), values, carry=("model", "params", "macs", "matmul_macs"))


def write_compare(out: Path, pairs: list[tuple[RunSpec, dict]], *, title: str, command: str,
                  meta: dict[str, Any]) -> dict[str, Any]:
    """results.csv (one row per run), summary.csv (mean, std and median over seeds), compare.png, index.html."""
    import json

    from vitlab.plots.study import plot_compare
    from vitlab.writers import Section, write_csv, write_json, write_report

    rows = result_rows(pairs, out)
    agg = aggregate_rows(rows)
    write_csv(out / "results.csv", rows)
    table = [{"model": a["label"], "start": a["start"], "test_acc": a["test_acc_mean"],
              "test_acc_std": a["test_acc_std"], "test_acc_median": a["test_acc_median"],
              **({c: a[f"{c}_mean"] for c in VALIDATION} if "val_acc_mean" in a else {}),
              "seeds": a["n"], "params": a["params"], "macs": a["macs"],
              "matmul_macs": a["matmul_macs"], "train_time_s": a["train_time_s_mean"],
              "train_time_s_median": a["train_time_s_median"],
              "wall_time_s": a["wall_time_s_mean"], "undertrained": a["undertrained"],
              "diverged": a["diverged"], **({"failed": a["failed"]} if "failed" in a else {})} for a in agg]
    write_csv(out / "summary.csv", table)
    plot_compare(agg, out / "compare.png", title, rows)
    first = pairs[0][0].config
    warning = undertrained_warning(rows, first.dataset, first.limit_train)
    write_json(out / "summary.json", {**meta, "results": table, "warning": warning})
    text = "; ".join(f"{t['model']}: {100 * t['test_acc_median']:.2f}%" for t in table)
    sections = [
        *warning_section(rows, ("label", "seed"), warning),
        Section("Comparison", f"{text}. Final test accuracy after the same recipe, the median over seeds (the bars; "
                "each seed is a dot; summary.csv also has the mean and sd). macs is each model's own count (vitlab: "
                "every multiply, timm: FlopCounterMode); matmul_macs counts the matrix products of both the same way "
                "(FlopCounterMode FLOPs / 2), per image. Training time is the time spent in training steps, on a "
                "machine that may be shared.", ["compare.png"], ["summary.csv"]),
        Section("Every run", "Each run's folder holds its checkpoint, metrics.jsonl and summary.json.", [],
                ["results.csv"]),
        Section("Settings", "", [], [[{"setting": k, "value": json.dumps(v) if not isinstance(v, str) else v}
                                      for k, v in meta.items()]]),
    ]
    write_report(out, title, command, sections)
    return {"rows": rows, "summary": table, "text": text, "warning": warning}


@dataclass
class CompareConfig:
    """A whole comparison: every entry (a model from scratch or fine-tuned) trained with ``run`` per seed."""

    entries: list[Entry]  # from entries(): from-scratch rows, each followed by its fine-tuned rows
    run: Any  # the RunConfig of every run (recipe, data set); model and model options are set per entry
    output: Path  # the study folder
    seeds: int = 1
    command: str = ""  # the command line the report shows
    logger: str = "none"  # also track the study there (vitlab.train.tracking)
    models: list[str] = field(default_factory=list)  # the --models, as given (for the report's settings)
    finished_only: bool = False  # train nothing; tables from the runs already finished
    executor: Any = None  # where the runs train (vitlab.experiments.executors.ExecutorConfig; None: in this process)
    force: bool = False  # replace the files of the study's names in an --output folder vitlab did not claim


def compare_run_specs(config: CompareConfig) -> list[RunSpec]:
    """The runs of ``config``, checked (what ``--dry-run`` plans and :func:`run_compare` trains)."""
    if config.seeds < 1:
        raise ConfigError(f"--seeds must be >= 1, got {config.seeds}")
    return compare_specs(config.entries, config.run, list(range(config.seeds)))


def run_compare(config: CompareConfig) -> dict[str, Any]:
    """Train (or read back) every run and write the table, figure and report into ``config.output``; returns
    :func:`write_compare`'s result and the study folder (``out``)."""
    from vitlab.experiments.runs import run_study, track_study

    cfg, items = config.run, config.entries
    specs = compare_run_specs(config)
    models = config.models or list(dict.fromkeys(e.model for e in items))
    out, pairs = run_study(specs, config.output, "compare", force=config.force, command=config.command,
                           title="compare", finished_only=config.finished_only, executor=config.executor)
    meta = {"dataset": cfg.dataset, "models": models,
            "overrides": {e.model: e.overrides for e in items if e.init is None},
            "pretrained": {e.label: e.init for e in items if e.init}, "seeds": config.seeds,
            "run_config": cfg.to_dict()}
    result = write_compare(out, pairs, title=f"Comparison on {cfg.dataset}", command=config.command, meta=meta)
    track_study(out, config.logger, pairs, meta)
    return {**result, "out": out, "pairs": pairs}
