"""``vitlab sweep``: train one model per value of one or more options (a grid) and seed; plot accuracy and time."""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: Any) -> None:
    from vitlab.commands.options import add_run_options

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
    p.add_argument("--values", action="append", default=None, metavar="V1,V2,...",
                   help="comma-separated values of the preceding --param")
    p.add_argument("--seeds", type=int, default=1, help="runs per value, seeds 0..N-1 (default 1)")
    p.add_argument("--set", action="append", default=None, metavar="KEY=VALUE",
                   help="model option fixed for every run (repeatable)")
    add_run_options(p)
    p.add_argument("--output", required=True, metavar="DIR", help="study folder (runs, CSV, figures, index.html)")
    p.set_defaults(func=run, _parser=p)


def run(args: argparse.Namespace) -> int:
    from vitlab.commands.options import base_run_config, command_line
    from vitlab.experiments.sweep import SweepConfig, parse_params, run_sweep
    from vitlab.train.options import parse_set

    params = parse_params(args.model, args.param or [], args.values or [])
    config = SweepConfig(args.model, params, base_run_config(args, dataset=args.dataset), args.output, args.seeds,
                         parse_set(args.set), command_line(args, paired=("param", "values")), args.logger)
    result = run_sweep(config)
    for a in result["summary"]:
        where = ", ".join(f"{p.name}={a[p.name]}" for p in params)
        print(f"{where}: test accuracy {100 * a['test_acc_mean']:.2f}% +- {100 * a['test_acc_std']:.2f} "
              f"({a['n']} seeds), training {a['train_time_s_mean']:.1f} s, {a['params'] / 1e6:.3f}M params, "
              f"{a['macs'] / 1e6:.1f} MMACs" + ("  [under-trained]" if a["undertrained"] else ""))
    if result["warning"]:
        print(result["warning"])
    print(f"{result['text']} Wrote results.csv, summary.csv, {', '.join(result['figures'])}, index.html to "
          f"{result['out']}")
    return 0
