"""``vitlab sweep``: train one model per value of one or more options (a grid) and seed; plot accuracy and time."""

from __future__ import annotations

import argparse
from typing import Any


class _AfterParam(argparse.Action):
    """``--values`` / ``--range``: appended to their own list and remembered in order, paired with the
    preceding ``--param`` (``args.pairs``: ``[(param index, 'values' | 'range', text)]``)."""

    def __call__(self, parser: Any, namespace: argparse.Namespace, value: Any, option: Any = None) -> None:
        setattr(namespace, self.dest, [*(getattr(namespace, self.dest) or []), value])
        pairs = [*(getattr(namespace, "pairs", None) or []), (len(namespace.param or []) - 1, self.dest, value)]
        namespace.pairs = pairs


def register(subparsers: Any) -> None:
    from vitlab.commands.options import (
        add_run_options,
        add_seeds_option,
        add_set_option,
        add_study_data_options,
        add_study_output_options,
    )

    p = subparsers.add_parser(
        "sweep", help="hyper-parameter sweep: accuracy and training time against option values",
        description="Train MODEL on DATASET once per value of --param (several --param/--values pairs make a grid) "
                    "and per seed, each run in its own sub-folder of --output; finished runs (their record verified) "
                    "are read back, not re-run. Writes results.csv (one row per run), summary.csv (mean and std "
                    "over seeds), sweep_<param>.png and index.html. Exit status 0 when every run finished, 3 when "
                    "some failed (each named on stderr), 2 for bad input refused before any run trained.")
    p.add_argument("--model", default="vit_mnist", help="preset or timm:NAME (default vit_mnist)")
    add_study_data_options(p)
    p.add_argument("--param", action="append", default=None, metavar="NAME",
                   help="option to sweep: any model option (embed_dim, depth, ...) or recipe option (lr, ...); "
                        "repeat with --values for a grid")
    p.add_argument("--values", action=_AfterParam, default=None, metavar="V1,V2,...",
                   help="comma-separated values of the preceding --param (with --search optuna: its choices)")
    p.add_argument("--range", action=_AfterParam, default=None, metavar="LOW:HIGH[:log][:int]",
                   help="--search optuna: the range of the preceding --param, e.g. 1e-4:1e-2:log; :int draws "
                        "whole numbers (integer options always do)")
    add_seeds_option(p, "value")
    add_set_option(p, "model option fixed for every run (repeatable)")
    p.add_argument("--search", choices=("grid", "optuna"), default="grid",
                   help="grid (default): every combination of --values; optuna: --trials runs whose values "
                        "Optuna's TPE sampler picks, unpromising ones pruned, resumable from DIR/optuna.db "
                        "(needs pip install 'vitlab[optuna]')")
    p.add_argument("--trials", type=int, default=None,
                   help="--search optuna: finished trials in total, counting earlier invocations (default 20)")
    p.add_argument("--pruner", choices=("median", "hyperband", "none"), default=None,
                   help="--search optuna: stop a trial whose per-epoch validation metric is below the median of "
                        "earlier trials at that epoch (median, default), by successive halving (hyperband), or never")
    p.add_argument("--prune-startup", type=int, default=None, metavar="N",
                   help="--pruner median: finished trials before any is pruned (default 5)")
    p.add_argument("--prune-warmup", type=int, default=None, metavar="E",
                   help="--search optuna: the first E epochs of a trial are never pruned (default 0)")
    p.add_argument("--objective", choices=("val_acc", "val_loss", "test_acc", "test_loss"), default=None,
                   help="--search optuna: maximise the final validation accuracy (val_acc, default) or minimise the "
                        "validation loss (val_loss), on the --val-split each trial holds out (default 0.1); pruning "
                        "reads the same metric each epoch. The test set is never compared (test_* are refused)")
    p.add_argument("--storage", default=None, metavar="URL",
                   help="--search optuna: an Optuna RDB storage (sqlite:////shared/study.db, postgresql://...) that "
                        "several processes or machines work together, each running this same command with the same "
                        "shared --output (default: --output/optuna.db, one process)")
    p.add_argument("--seed", type=int, default=None,
                   help="--search optuna: the sampler's seed and every trial's training seed (default 0)")
    add_run_options(p)
    add_study_output_options(p)
    p.set_defaults(func=run, _parser=p)


SEARCH_ONLY = ("range", "trials", "pruner", "prune_startup", "prune_warmup", "objective", "seed", "storage")


def run(args: argparse.Namespace) -> int:
    from vitlab.errors import ConfigError

    if args.search == "optuna":
        if args.dry_run:
            raise ConfigError("--dry-run lists a grid's runs; an optuna search picks each trial's values as it goes, "
                              "so drop --dry-run (or plan one trial with `vitlab train --dry-run`)")
        return run_search_command(args)
    given = [f"--{k.replace('_', '-')}" for k in SEARCH_ONLY if getattr(args, k) is not None]
    if given:
        raise ConfigError(f"{', '.join(given)} belong(s) to --search optuna; a grid takes --values only")
    from vitlab.commands.options import run_study_command, study_fields
    from vitlab.experiments.sweep import SweepConfig, parse_params, run_sweep, sweep_run_specs
    from vitlab.train.config import parse_set

    params = parse_params(args.model, args.param or [], args.values or [])
    config = SweepConfig(args.model, params, **study_fields(args, paired=("param", "values"), run_field="base"),
                         seeds=args.seeds, fixed=parse_set(args.set), logger=args.logger)
    return run_study_command(args, config, plan=sweep_run_specs, train=run_sweep, title="sweep",
                             report=lambda result: report_lines(result, params))


def report_lines(result: dict[str, Any], params: list[Any]) -> list[str]:
    """What ``vitlab sweep`` prints of a finished grid: a line per combination, the warning, the files written."""
    lines = []
    for a in result["summary"]:
        where = ", ".join(f"{p.name}={a[p.name]}" for p in params)
        lines.append(f"{where}: test accuracy {100 * a['test_acc_mean']:.2f}% +- {100 * a['test_acc_std']:.2f} "
                     f"({a['n']} seeds), training {a['train_time_s_mean']:.1f} s, {a['params'] / 1e6:.3f}M params, "
                     f"{a['macs'] / 1e6:.1f} MMACs" + ("  [under-trained]" if a["undertrained"] else "")
                     + (f"  [diverged: {a['diverged']} of {a['n']} seeds]" if a.get("diverged") else "")
                     + (f"  [failed: {a['failed']} of {a['n']} seeds]" if a.get("failed") else ""))
    if result["warning"]:
        lines.append(result["warning"])
    lines.append(f"{result['text']} Wrote results.csv, summary.csv, {', '.join(result['figures'])}, index.html to "
                 f"{result['out']}")
    return lines


def run_search_command(args: argparse.Namespace) -> int:
    """``vitlab sweep --search optuna``: the search from the command's options, then one line of results."""
    import shlex
    from pathlib import Path

    from vitlab.commands.options import base_run_config, command_line
    from vitlab.errors import ConfigError
    from vitlab.experiments.search import SearchConfig, import_optuna, parse_search_params, run_search
    from vitlab.train.config import parse_set

    import_optuna()
    if args.executor != "local" or (args.workers or 1) > 1:
        raise ConfigError("--search optuna trains one trial at a time per process; to work a search on several "
                          "processes or machines, run this same command in each with one shared --storage URL "
                          "and --output folder (drop --executor/--workers)")
    if args.seeds != 1:
        raise ConfigError("--seeds is for the grid; --search optuna trains one run per trial with --seed")
    if args.finished_only:
        raise ConfigError("--finished-only is for the grid; drop it: --search optuna reads its finished trials "
                          "back from optuna.db when run again")
    names = args.param or []
    pairs = [(names[i] if 0 <= i < len(names) else None, how, text) for i, how, text in (args.pairs or [])]
    if any(n is None for n, _, _ in pairs) or len(pairs) != len(names):
        raise ConfigError(f"{len(names)} --param but {len(pairs)} --values/--range; give one after each --param")
    params = parse_search_params(args.model, [(n, how, t) for n, how, t in pairs])
    fixed = parse_set(args.set)
    extra = {"trials": 20 if args.trials is None else args.trials, "pruner": args.pruner or "median",
             "objective": args.objective or "val_acc", "seed": 0 if args.seed is None else args.seed,
             "prune_startup": 5 if args.prune_startup is None else args.prune_startup,
             "prune_warmup": args.prune_warmup or 0}
    shown = argparse.Namespace(**{**vars(args), "param": None, "values": None, "range": None})
    words = " ".join(f"--param {shlex.quote(n)} --{how} {shlex.quote(t)}" for n, how, t in pairs)
    command = command_line(shown).replace("vitlab sweep", f"vitlab sweep {words}", 1)
    config = SearchConfig(model=args.model, dataset=args.dataset, params=params,
                          base=base_run_config(args, dataset=args.dataset), output=Path(args.output), fixed=fixed,
                          command=command, storage=args.storage, force=args.force, **extra)
    config.validate()
    result = run_search(config)
    print(f"{result['text']} Wrote trials.csv, {', '.join(result['figures'])}, summary.json, index.html to "
          f"{config.output} (study in optuna.db)")
    return 0
