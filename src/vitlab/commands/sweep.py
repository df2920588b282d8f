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
    from vitlab.experiments.common import add_run_options

    p = subparsers.add_parser(
        "sweep", help="hyper-parameter sweep: accuracy and training time against option values",
        description="Train MODEL on DATASET once per value of --param (several --param/--values pairs make a grid) "
                    "and per seed, each run in its own sub-folder of --output; runs whose summary.json exists are "
                    "read back, not re-run. Writes results.csv (one row per run), summary.csv (mean and std over "
                    "seeds), sweep_<param>.png and index.html.")
    p.add_argument("--model", default="vit_mnist", help="preset or timm:NAME (default vit_mnist)")
    p.add_argument("--dataset", default="mnist-5k", help="data set (default mnist-5k)")
    p.add_argument("--param", action="append", default=None, metavar="NAME",
                   help="option to sweep: any model option (embed_dim, depth, ...) or recipe option (lr, ...); "
                        "repeat with --values for a grid")
    p.add_argument("--values", action=_AfterParam, default=None, metavar="V1,V2,...",
                   help="comma-separated values of the preceding --param (with --search optuna: its choices)")
    p.add_argument("--range", action=_AfterParam, default=None, metavar="LOW:HIGH[:log][:int]",
                   help="--search optuna: the range of the preceding --param, e.g. 1e-4:1e-2:log; :int draws "
                        "whole numbers (integer options always do)")
    p.add_argument("--seeds", type=int, default=1, help="runs per value, seeds 0..N-1 (default 1)")
    p.add_argument("--set", action="append", default=None, metavar="KEY=VALUE",
                   help="model option fixed for every run (repeatable)")
    p.add_argument("--search", choices=("grid", "optuna"), default="grid",
                   help="grid (default): every combination of --values; optuna: --trials runs whose values "
                        "Optuna's TPE sampler picks, unpromising ones pruned, resumable from DIR/optuna.db "
                        "(needs pip install 'vitlab[optuna]')")
    p.add_argument("--trials", type=int, default=None,
                   help="--search optuna: finished trials in total, counting earlier invocations (default 20)")
    p.add_argument("--pruner", choices=("median", "hyperband", "none"), default=None,
                   help="--search optuna: stop a trial whose per-epoch test metric is below the median of earlier "
                        "trials at that epoch (median, default), by successive halving (hyperband), or never")
    p.add_argument("--prune-startup", type=int, default=None, metavar="N",
                   help="--pruner median: finished trials before any is pruned (default 5)")
    p.add_argument("--prune-warmup", type=int, default=None, metavar="E",
                   help="--search optuna: the first E epochs of a trial are never pruned (default 0)")
    p.add_argument("--objective", choices=("test_acc", "test_loss"), default=None,
                   help="--search optuna: maximise the final test accuracy (test_acc, default) or minimise "
                        "the test loss; pruning reads the same metric each epoch")
    p.add_argument("--seed", type=int, default=None,
                   help="--search optuna: the sampler's seed and every trial's training seed (default 0)")
    add_run_options(p)
    p.add_argument("--output", required=True, metavar="DIR", help="study folder (runs, CSV, figures, index.html)")
    p.set_defaults(func=run, _parser=p)


SEARCH_ONLY = ("range", "trials", "pruner", "prune_startup", "prune_warmup", "objective", "seed")


def run(args: argparse.Namespace) -> int:
    from vitlab.errors import ConfigError

    if args.search == "optuna":
        from vitlab.experiments.search import run_command

        return run_command(args)
    given = [f"--{k.replace('_', '-')}" for k in SEARCH_ONLY if getattr(args, k) is not None]
    if given:
        raise ConfigError(f"{', '.join(given)} belong(s) to --search optuna; a grid takes --values only")
    from vitlab.experiments.common import (
        base_run_config,
        check_output,
        command_line,
        model_overrides,
        parse_set,
        run_all,
        track_study,
        yaml_value,
    )
    from vitlab.experiments.sweep import parse_params, sweep_specs, write_sweep

    if args.seeds < 1:
        raise ConfigError(f"--seeds must be >= 1, got {args.seeds}")
    params = parse_params(args.model, args.param or [], args.values or [])
    if args.model.startswith("timm:"):
        fixed = {k: yaml_value(v) for k, v in parse_set(args.set).items()}
    else:
        fixed = model_overrides(args.set)
    clash = [p.name for p in params if p.name in fixed]
    if clash:
        raise ConfigError(f"{', '.join(clash)} is swept by --param and fixed by --set; drop one of them")
    base = base_run_config(args, dataset=args.dataset)
    specs = sweep_specs(args.model, params, list(range(args.seeds)), base, fixed)
    out = check_output(args.output)
    pairs = run_all(specs, out, title="sweep")
    title = f"Sweep of {args.model} on {args.dataset}"
    meta = {"model": args.model, "dataset": args.dataset, "seeds": args.seeds, "fixed_overrides": fixed,
            "run_config": base.to_dict()}
    command = command_line(args, paired=("param", "values"))
    result = write_sweep(out, pairs, params, title=title, command=command, meta=meta)
    track_study(out, args.logger, pairs, meta)
    for a in result["summary"]:
        where = ", ".join(f"{p.name}={a[p.name]}" for p in params)
        print(f"{where}: test accuracy {100 * a['test_acc_mean']:.2f}% +- {100 * a['test_acc_std']:.2f} "
              f"({a['n']} seeds), training {a['train_time_s_mean']:.1f} s, {a['params'] / 1e6:.3f}M params, "
              f"{a['macs'] / 1e6:.1f} MMACs" + ("  [under-trained]" if a["undertrained"] else ""))
    if result["warning"]:
        print(result["warning"])
    print(f"{result['text']} Wrote results.csv, summary.csv, {', '.join(result['figures'])}, index.html to {out}")
    return 0
