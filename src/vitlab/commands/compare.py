"""``vitlab compare``: vitlab and timm models, from scratch and fine-tuned, with one recipe on one data set."""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: Any) -> None:
    from vitlab.commands.options import add_force_option, add_run_options

    p = subparsers.add_parser(
        "compare", help="compare models (vitlab presets, timm:NAME, fine-tuned checkpoints) on one recipe",
        description="Train every --models from scratch with one recipe and, for each --pretrained, a fine-tuned "
                    "copy starting from local weights (timm or vitlab, .safetensors/.pth or a checkpoint folder; "
                    "position embedding, input channels, patch kernel and head adapted), each in its own "
                    "sub-folder of --output (finished runs are read back). Writes results.csv, summary.csv "
                    "(accuracy, params, MACs, time), compare.png and index.html.")
    p.add_argument("--dataset", default="mnist-5k", help="data set (default mnist-5k)")
    p.add_argument("--models", required=True, metavar="M1,M2,...",
                   help="vitlab presets and timm:NAME models, e.g. vit_mnist,timm:vit_tiny_patch16_224")
    p.add_argument("--pretrained", action="append", default=None, metavar="[NAME=]PATH",
                   help="weights to fine-tune from: values pair with --models in order ('-' skips one), or "
                        "NAME=PATH; 'hub' downloads timm's weights when online. Each adds a fine-tuned row")
    p.add_argument("--set", action="append", default=None, metavar="[MODEL:]KEY=VALUE",
                   help="model option for one model (MODEL:KEY=VALUE) or all (KEY=VALUE), e.g. "
                        "--set timm:vit_tiny_patch16_224:patch_size=7")
    p.add_argument("--seeds", type=int, default=1, help="runs per row, seeds 0..N-1 (default 1)")
    add_run_options(p)
    p.add_argument("--output", required=True, metavar="DIR", help="study folder (runs, CSV, figure, index.html)")
    add_force_option(p)
    p.set_defaults(func=run, _parser=p)


def run(args: argparse.Namespace) -> int:
    from vitlab.commands.options import base_run_config, command_line, executor_config
    from vitlab.errors import ConfigError
    from vitlab.experiments.compare import (
        CompareConfig,
        entries,
        parse_model_sets,
        parse_models,
        parse_pretrained,
        run_compare,
    )
    from vitlab.experiments.runs import exit_status
    from vitlab.models import get_config

    if args.seeds < 1:
        raise ConfigError(f"--seeds must be >= 1, got {args.seeds}")
    models = parse_models(args.models)
    sets = parse_model_sets(args.set, models)
    for m in models:
        if not m.startswith("timm:"):
            get_config(m, **sets[m])
    items = entries(models, sets, parse_pretrained(args.pretrained, models))
    result = run_compare(CompareConfig(items, base_run_config(args, dataset=args.dataset), args.output, args.seeds,
                                       command_line(args), args.logger, models, finished_only=args.finished_only,
                                       executor=executor_config(args), force=args.force))
    for t in result["summary"]:
        macs = t["matmul_macs"] if t["matmul_macs"] is not None else t["macs"]
        print(f"{t['model']:<45} test accuracy {100 * t['test_acc']:.2f}%, {(t['params'] or 0) / 1e6:.3f}M params, "
              f"{(macs or 0) / 1e6:.1f} matmul MMACs, training {t['train_time_s']:.1f} s ({t['start']})"
              + ("  [under-trained]" if t["undertrained"] else "")
              + (f"  [diverged: {t['diverged']} of {t['seeds']} seeds]" if t.get("diverged") else "")
              + (f"  [failed: {t['failed']} of {t['seeds']} seeds]" if t.get("failed") else ""))
    if result["warning"]:
        print(result["warning"])
    print(f"wrote results.csv, summary.csv, compare.png, index.html to {result['out']}")
    return exit_status("compare", result["pairs"])  # 0: every run finished; 3: some failed, each named
