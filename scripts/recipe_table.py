"""Why the default recipe is the default: each choice of the mnist-5k recipe with its measured effect on the time
to 97.5 % and on the final accuracy, computed from the committed run records under docs/results/runs/.

One row for the default recipe first: the arm whose every setting equals today's defaults
(:func:`default_settings`, what ``vitlab train --dataset mnist-5k`` resolves to now, ``SIZE_DEFAULTS`` and the
digits' augmentation in ``vitlab.train.config``), so the row moves when a default does. Then one row per arm of
each study of :data:`STUDIES` (the ablations of docs/findings.md section 4, the sweeps of section 2) but the arm
the study compares against, and one row per recipe choice no record varies (:data:`UNMEASURED`: numbers empty,
``command`` the sweep that would measure it, choosing on the validation split it holds out). Columns:

- ``value``: what the arm changes against its baseline (``stem conv``), from the records' settings;
- ``baseline``: the study's arm with the default's settings, the arm every other arm of the study is compared
  with; ``STUDY/ARM`` where the study has no such arm and docs/findings.md compares it with another study's arm;
- ``runs``: the arm's runs (seeds);
- ``final_acc_median``: the median over the runs of the last epoch's test accuracy (``summary.json``'s
  ``final_test_acc``, percent); never the best epoch, which would pick an epoch on the test set;
- ``delta_acc_median``: the arm's median minus its baseline's, in points;
- ``reached``: how many of the runs reached 97.5 % in any epoch, e.g. ``2/3``;
- ``time_to_97_5_median``: per run, the seconds from the start until the end of the first epoch whose accuracy
  (``metrics.jsonl``'s ``val_acc`` where the run held out a validation split, else its ``test_acc``) reached
  97.5 %: the sum of the per-epoch ``seconds`` the run recorded (each epoch's training and evaluation, wall
  clock; every committed record has them, so nothing is apportioned from ``train_time_s``). A run that never
  reached it counts as never getting there (infinitely slow): the median is over all the runs, and empty when at
  least half of them never reached 97.5 %;
- ``time_ratio``: the baseline's median time to 97.5 % over the arm's (> 1: the arm gets there faster);
- ``note``: what docs/findings.md says limits the row (a baseline at other settings, times taken under other load);
- ``command``: ``summary.json``'s ``command`` of the arm's first seed where the record stores one; the committed
  records predate that field, so otherwise the study's command from docs/findings.md with ``--values`` narrowed
  to the arm (it trains the arm's seeds into the study's folder, or reads them back when they are there).

Times are compared within a study only, never across studies: studies ran in different sessions beside other
jobs, whose load moved the times up to 2x. Within a study they are comparable only as far as the runs shared
the load: the default's three runs were trained once (by the depth sweep) and copied into every study that has
the default as an arm, and ``note`` names the studies docs/findings.md says are not comparable in time.

    python scripts/recipe_table.py            # write docs/results/recipe_choices.csv
    python scripts/recipe_table.py --check    # exit 1 when the CSV differs from the records
"""

from __future__ import annotations

import json
import math
import re
import statistics
import sys
from dataclasses import MISSING, dataclass, fields
from functools import cache
from pathlib import Path
from typing import Any

if str(Path(__file__).resolve().parent) not in sys.path:  # records_csv beside this script, also loaded by path
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from records_csv import csv_main, csv_text  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "docs" / "results" / "runs"
OUT = ROOT / "docs" / "results" / "recipe_choices.csv"
COLUMNS = ["choice", "value", "baseline", "runs", "final_acc_median", "delta_acc_median", "reached",
           "time_to_97_5_median", "time_ratio", "study", "note", "command"]
TARGET = 0.975  # the accuracy the time is measured to
DATASET, NUM_TRAIN = "mnist-5k", 4000  # the recipe's data set and its training images


def _sweep(param: str, values: str, study: str, extra: str = "") -> str:
    """A study's command as docs/findings.md documents it."""
    return (f"vitlab sweep --model vit_mnist --dataset {DATASET} --param {param} --values {values}{extra} --seeds 3 "
            f"--budget default --threads 1 --no-progress --output runs/findings/{study}")


def unmeasured_command(option: str, values: str) -> str:
    """The sweep that measures a recipe option, holding out a validation split to choose on."""
    return (f"vitlab sweep --model vit_mnist --dataset {DATASET} --param {option} --values {values} --seeds 3 "
            f"--val-split 0.1 --budget default --threads 1 --no-progress --output runs/findings/sweep_{option}")


@dataclass(frozen=True)
class Study:
    name: str  # its folder under docs/results/runs/
    choice: str
    key: str  # the setting it varies, as :func:`differences` names it
    baseline: str  # the ARM of the study with the default's settings, or STUDY/ARM of another study
    command: str  # docs/findings.md's command of the study
    note: str = ""


DEFAULT_ARM = "ablation_label_smoothing/label_smoothing=0.1"  # findings 4: "the recipe exactly"
_DEFAULT_ELSEWHERE = "this study has no arm at the default's settings; docs/findings.md compares it with 4.1's"
STUDIES = (
    Study("ablation_conv_stem", "stem", "stem", "stem=patch", _sweep("stem", "patch,conv", "ablation_conv_stem",
                                                                     " --set patch_size=4"),
          "both arms at patch 4, not the default 7 (the conv stem needs an even patch); the patch arm is 2.2's "
          "patch-4 runs and the conv runs trained on another day beside another study: compare the cost by MACs "
          "(findings 4.5)"),
    Study("ablation_conv_stem_patch14", "stem at patch 14", "stem", "stem=patch",
          _sweep("stem", "patch,conv", "ablation_conv_stem_patch14", " --set patch_size=14"),
          "both arms at patch 14 (2x2 tokens); the conv arm is vit_mnist_conv_patch14, what `vitlab train` trains "
          "on digits with no --model; trained 2026-11-26, two runs at a time on a 2-core AMD EPYC Zen 3"),
    Study("sweep_patch_size", "patch size", "patch_size", "patch_size=7",
          _sweep("patch_size", "4,7,14", "sweep_patch_size")),
    Study("ablation_no_augment", "augmentation", "augmentation", DEFAULT_ARM,
          _sweep("label_smoothing", "0.1,0", "ablation_no_augment", " --no-augment"), _DEFAULT_ELSEWHERE),
    Study("ablation_label_smoothing", "label smoothing", "label_smoothing", "label_smoothing=0.1",
          _sweep("label_smoothing", "0.1,0", "ablation_label_smoothing")),
    Study("ablation_drop_path", "drop-path", "drop_path", "drop_path=0",
          _sweep("drop_path", "0,0.1,0.2", "ablation_drop_path")),
    Study("ablation_layer_decay", "layer decay", "layer_decay", DEFAULT_ARM,
          _sweep("lr", "0.002", "ablation_layer_decay", " --run-set layer_decay=0.75"), _DEFAULT_ELSEWHERE),
    Study("sweep_depth", "depth", "depth", "depth=8", _sweep("depth", "2,4,8,12", "sweep_depth")),
    Study("sweep_embed_dim", "width (embed_dim)", "embed_dim", "embed_dim=64",
          _sweep("embed_dim", "32,64,128,256", "sweep_embed_dim")),
    Study("sweep_num_heads", "heads", "num_heads", "num_heads=8", _sweep("num_heads", "1,2,4,8,16", "sweep_num_heads"),
          "a CI run shared the machine with part of these runs: their times are not comparable, the MACs are "
          "(findings 2.4)"),
    Study("sweep_mlp_ratio", "MLP ratio", "mlp_ratio", "mlp_ratio=4", _sweep("mlp_ratio", "1,2,4,8", "sweep_mlp_ratio"),
          "times taken at different moments beside different studies: not comparable, the MACs are (findings 2.5)"),
    Study("sweep_ema_decay", "EMA of the weights", "ema_decay", "ema_decay=0",
          unmeasured_command("ema_decay", "0,0.99,0.999"),
          "every arm holds out a validation split (3,600 training images, 400 to choose on) and times 97.5 % on it, "
          "which no run reached; final acc. is the test set's, read once; trained 2026-11-27, two runs at a time on "
          "a 2-core AMD EPYC Zen 3 (findings 4.6)"),
    Study("sweep_lr", "learning rate", "lr", "lr=0.002", unmeasured_command("lr", "1e-3,2e-3,4e-3"),
          "the validation split of 4.6 (no run reached 97.5 % on it; final acc. is the test set's); 4.6's "
          "ema_decay=0 runs are this sweep's lr=0.002 arm (the same settings, copied, not trained twice); trained "
          "2026-11-27 on the same Zen 3 (findings 4.7)"),
    Study("sweep_batch_size", "batch size", "batch_size", "batch_size=64",
          unmeasured_command("batch_size", "32,64,128"),
          "the validation split of 4.6 and its ema_decay=0 runs as the batch-64 arm, as in 4.7; the learning rate "
          "stays 2e-3 at every batch size; trained 2026-11-27 on the same Zen 3 (findings 4.8)"),
)

# Recipe choices a row reports as not measured unless some record varies them: (choice, option, values to sweep)
# (the batch size, learning rate and EMA rows come from their studies above)
UNMEASURED = (
    ("epochs", "epochs", "30,50,80"),
)


# ------------------------------------------------------------------------------------------------ settings

# run options that do not change what is trained (where, how fast, what is logged), and the model's fields that are
# a label or mirror a run option (drop_path_rate is the run's drop_path)
NOT_RECIPE = frozenset({"model", "model_overrides", "data_dir", "download", "seed", "device", "amp", "compile",
                        "threads", "slices", "flush_denormal", "eval_batch_size", "checkpoint_every",
                        "skip_nonfinite", "output", "progress", "logger", "probe_images"})
MODEL_NEUTRAL = frozenset({"name", "num_classes", "drop_path_rate"})
LABELS = {"augmentation": "augmentation", "label_smoothing": "label smoothing", "drop_path": "drop-path",
          "layer_decay": "layer decay", "stem": "stem", "patch_size": "patch", "depth": "depth",
          "embed_dim": "width", "num_heads": "heads", "mlp_ratio": "MLP ratio", "epochs": "epochs",
          "batch_size": "batch", "lr": "lr", "ema_decay": "EMA"}


@cache
def default_settings() -> tuple[dict[str, Any], dict[str, Any]]:
    """``(run, model)``: today's default run config (recipe fields only) and model config on mnist-5k, as the
    library resolves ``vitlab train --model vit_mnist --dataset mnist-5k``: the studies' plain ViT under the
    default recipe (the command's default model on digits, vit_mnist_conv_patch14, is chosen by
    scripts/recipe_scan.py, not by these records)."""
    from vitlab.train.config import RunConfig
    from vitlab.train.plan import plan_run

    plan = plan_run(RunConfig(model="vit_mnist", dataset=DATASET))
    assert plan.data.num_train == NUM_TRAIN, plan.data
    run = {k: v for k, v in plan.run.to_dict().items() if k not in NOT_RECIPE}
    return run, plan.spec.config.to_dict()


@cache
def _field_defaults() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The dataclass defaults of RunConfig and ModelConfig (what a record written before a field existed
    means), and what ``--no-augment`` sets."""
    from vitlab.models import ModelConfig
    from vitlab.train.config import NO_AUGMENT, RunConfig

    def of(cls: type) -> dict[str, Any]:
        return {f.name: f.default_factory() if f.default_factory is not MISSING else f.default for f in fields(cls)
                if f.default is not MISSING or f.default_factory is not MISSING}

    return of(RunConfig), of(ModelConfig), dict(NO_AUGMENT)


def _norm(v: Any) -> Any:
    """A setting as compared: tuples as lists, None as 0 (an unset switch or rate is off)."""
    if v is None:
        return 0
    return list(v) if isinstance(v, list | tuple) else v


def differences(config: dict[str, Any]) -> dict[str, Any]:
    """The settings of a run's ``config.json`` that differ from today's defaults, ``{name: the run's value}``;
    the augmentation collapses to ``{"augmentation": "off"}`` when the run had every augmentation off."""
    run_default, model_default = default_settings()
    run_fields, model_fields, no_augment = _field_defaults()
    run, model = config["run"], config["model"]
    out = {k: model.get(k, model_fields.get(k)) for k, v in model_default.items()
           if k not in MODEL_NEUTRAL and _norm(model.get(k, model_fields.get(k))) != _norm(v)}
    out.update({k: run.get(k, run_fields.get(k)) for k, v in run_default.items()
                if _norm(run.get(k, run_fields.get(k))) != _norm(v)})
    augment = {k: out[k] for k in no_augment if k in out}
    if augment and all(_norm(run.get(k, run_fields.get(k))) == _norm(v) for k, v in no_augment.items()):
        out = {k: v for k, v in out.items() if k not in augment}
        out["augmentation"] = "off"
    return out


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, list | tuple):
        return "-".join(_fmt(x) for x in v)
    return str(v)


def describe(settings: dict[str, Any], first: str | None = None) -> str:
    """``settings`` as text, ``first``'s value alone and first (``conv, patch 4``)."""
    parts = [_fmt(settings[first])] if first in settings else []
    parts += [f"{LABELS.get(k, k)} {_fmt(v)}" for k, v in settings.items() if k != first]
    return ", ".join(parts)


def describe_default() -> str:
    run, model = default_settings()
    return (f"{model['name']} ({model['stem']} stem, patch {model['patch_size']}, depth {model['depth']}, width "
            f"{model['embed_dim']}, {model['num_heads']} heads, MLP ratio {_fmt(model['mlp_ratio'])}), "
            f"{run['epochs']} epochs, batch {run['batch_size']}, lr {_fmt(run['lr'])}, label smoothing "
            f"{_fmt(run['label_smoothing'])}, drop-path {_fmt(run['drop_path'])}, augmentation on, "
            f"layer decay {'off' if not run['layer_decay'] else _fmt(run['layer_decay'])}, "
            f"EMA {'off' if not run['ema_decay'] else _fmt(run['ema_decay'])}")


# ------------------------------------------------------------------------------------------------ the records


@dataclass(frozen=True)
class Run:
    seed: int
    final_acc: float  # percent, the last epoch's
    time_to_target: float  # seconds until the end of the first epoch at TARGET; math.inf when never
    settings: dict[str, Any]  # :func:`differences`
    command: str | None  # summary.json's, where stored


def time_to_target(metrics: list[dict[str, Any]], where: Path) -> float:
    """Seconds of the epochs up to the first whose accuracy reached :data:`TARGET`; ``math.inf`` when none did."""
    elapsed = 0.0
    for row in metrics:
        if "seconds" not in row:
            raise ValueError(f"{where}: epoch {row.get('epoch')} records no 'seconds'")
        elapsed += row["seconds"]
        acc = row["val_acc"] if "val_acc" in row else row["test_acc"]
        if acc >= TARGET:
            return elapsed
    return math.inf


def load_run(folder: Path) -> Run:
    summary = json.loads((folder / "summary.json").read_text())
    config = json.loads((folder / "config.json").read_text())
    metrics = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return Run(int(config["run"]["seed"]), 100 * summary["final_test_acc"], time_to_target(metrics, folder),
               differences(config), summary.get("command"))


def arm_runs(runs: Path, arm: str) -> list[Run]:
    """The runs of ``STUDY/ARM`` (its folders ``ARM_seed=N``), by seed."""
    study, _, name = arm.partition("/")
    folders = [f for f in sorted((runs / study).glob("*_seed=*"))
               if re.fullmatch(re.escape(name) + r"_seed=\d+", f.name) and (f / "summary.json").is_file()]
    if not folders:
        raise ValueError(f"no finished run of {arm} under {runs}")
    return sorted((load_run(f) for f in folders), key=lambda r: r.seed)


def study_arms(runs: Path, study: str) -> list[str]:
    """The arms of ``study``: its run folders' names without ``_seed=N``."""
    names = {re.sub(r"_seed=\d+$", "", f.name) for f in (runs / study).glob("*_seed=*")
             if (f / "summary.json").is_file()}
    return sorted(names)


def _settings(runs: list[Run], arm: str) -> dict[str, Any]:
    first = runs[0].settings
    for r in runs[1:]:
        if r.settings != first:
            raise ValueError(f"{arm}: seed {r.seed} differs from seed {runs[0].seed} in more than the seed "
                             f"({r.settings} against {first})")
    return first


def _num(x: float, spec: str) -> str:
    return "" if not math.isfinite(x) else format(x, spec)


def arm_row(runs: list[Run], base: list[Run]) -> dict[str, str]:
    """The numbers of an arm's row against its baseline's runs."""
    acc, base_acc = (statistics.median(r.final_acc for r in rs) for rs in (runs, base))
    time, base_time = (statistics.median(r.time_to_target for r in rs) for rs in (runs, base))
    ratio = base_time / time if math.isfinite(time) and math.isfinite(base_time) else math.nan
    return {"runs": str(len(runs)), "final_acc_median": f"{acc:.2f}", "delta_acc_median": f"{acc - base_acc:.2f}",
            "reached": f"{sum(math.isfinite(r.time_to_target) for r in runs)}/{len(runs)}",
            "time_to_97_5_median": _num(time, ".1f"), "time_ratio": _num(ratio, ".2f")}


def narrowed(command: str, value: str) -> str:
    """``command`` with its ``--values`` narrowed to ``value``."""
    new, n = re.subn(r"--values \S+", f"--values {value}", command)
    if n != 1:
        raise ValueError(f"{command!r} has no single --values to narrow")
    return new


def _order(study: Study, arm: str) -> tuple[int, str]:
    """Arms in the order of the study's ``--values``."""
    values = re.search(r"--values (\S+)", study.command).group(1).split(",")
    value = arm.rpartition("=")[2]
    return (values.index(value) if value in values else len(values), arm)


def rows(runs: Path = RUNS, studies: tuple[Study, ...] = STUDIES, default_arm: str = DEFAULT_ARM) -> list[dict]:
    """The table: the default recipe's row, each study's arms but its baseline, then the choices not measured."""
    by_name = {s.name: s for s in studies}
    default = arm_runs(runs, default_arm)
    changed = _settings(default, default_arm)
    if changed:
        raise ValueError(f"{default_arm} is not today's default recipe: it differs in {changed}")
    d_study = by_name[default_arm.partition("/")[0]]
    out = [{"choice": "default recipe", "value": describe_default(), "baseline": default_arm.partition("/")[2],
            "study": d_study.name, **arm_row(default, default),
            "note": "the same runs (trained once) are the default arm of every study that has one",
            "command": default[0].command or narrowed(d_study.command, default_arm.rpartition("=")[2])}]
    varied: set[str] = set()
    for study in studies:
        base_name = study.baseline if "/" in study.baseline else f"{study.name}/{study.baseline}"
        base = arm_runs(runs, base_name)
        base_settings = _settings(base, base_name)
        for arm in sorted(study_arms(runs, study.name), key=lambda a: _order(study, a)):
            name = f"{study.name}/{arm}"
            if name == base_name:
                continue
            mine = arm_runs(runs, name)
            settings = _settings(mine, name)
            if not base_settings.items() <= settings.items():
                raise ValueError(f"{name} does not keep the settings of its baseline {base_name}: {settings} "
                                 f"against {base_settings}")
            change = {k: v for k, v in settings.items() if k not in base_settings}
            if study.key not in change:
                raise ValueError(f"{name} does not change {study.key} against {base_name}: {change}")
            varied |= set(settings)
            baseline = base_name if "/" in study.baseline else study.baseline
            if base_settings:
                baseline += f" ({describe(base_settings)})"
            out.append({"choice": study.choice, "value": describe(change, study.key), "baseline": baseline,
                        "study": study.name, **arm_row(mine, base), "note": study.note,
                        "command": mine[0].command or narrowed(study.command, arm.rpartition("=")[2])})
    run_default, _ = default_settings()
    for choice, option, values in UNMEASURED:
        if option in varied:
            continue
        default = _fmt(run_default[option]) if run_default[option] else "off"
        out.append({"choice": choice, "value": f"not measured; the default is {default}",
                    "note": "no record varies it; the command measures it (choose on its validation split)",
                    "command": unmeasured_command(option, values)})
    return out


def table(runs: Path = RUNS, studies: tuple[Study, ...] = STUDIES, default_arm: str = DEFAULT_ARM) -> str:
    """The CSV text."""
    return csv_text(COLUMNS, rows(runs, studies, default_arm), restval="")


def main(argv: list[str] | None = None) -> int:
    return csv_main(argv, description=__doc__.split("\n")[0], table=table, runs=RUNS, out=OUT, what="CSV",
                    script="recipe_table.py", written=lambda text: f"{text.count(chr(10)) - 1} rows")

if __name__ == "__main__":
    raise SystemExit(main())
