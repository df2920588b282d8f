"""``vitlab sweep``: train one model per value of one or more options (a grid) and seed; plot accuracy and time."""

from __future__ import annotations

import argparse
from typing import Any


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
    p.add_argument("--values", action="append", default=None, metavar="V1,V2,...",
                   help="comma-separated values of the preceding --param")
    p.add_argument("--seeds", type=int, default=1, help="runs per value, seeds 0..N-1 (default 1)")
    p.add_argument("--set", action="append", default=None, metavar="KEY=VALUE",
                   help="model option fixed for every run (repeatable)")
    add_run_options(p)
    p.add_argument("--output", required=True, metavar="DIR", help="study folder (runs, CSV, figures, index.html)")
    p.set_defaults(func=run, _parser=p)


def run(args: argparse.Namespace) -> int:
    from vitlab.errors import ConfigError
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
