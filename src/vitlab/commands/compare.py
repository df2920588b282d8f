"""``vitlab compare``: vitlab and timm models, from scratch and fine-tuned, with one recipe on one data set."""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: Any) -> None:
    from vitlab.commands.options import (
        add_run_options,
        add_seeds_option,
        add_set_option,
        add_study_data_options,
        add_study_output_options,
    )

    p = subparsers.add_parser(
        "compare", help="compare models (vitlab presets, timm:NAME, fine-tuned checkpoints) on one recipe",
        description="Train every --models from scratch with one recipe and, for each --pretrained, a fine-tuned "
                    "copy starting from local weights (timm or vitlab, .safetensors/.pth or a checkpoint folder; "
                    "position embedding, input channels, patch kernel and head adapted), each in its own "
                    "sub-folder of --output (finished runs are read back). Writes results.csv, summary.csv "
                    "(accuracy, params, MACs, time), compare.png and index.html.")
    add_study_data_options(p)
    p.add_argument("--models", required=True, metavar="M1,M2,...",
                   help="vitlab presets and timm:NAME models, e.g. vit_mnist,timm:vit_tiny_patch16_224")
    p.add_argument("--pretrained", action="append", default=None, metavar="[NAME=]PATH",
                   help="weights to fine-tune from: values pair with --models in order ('-' skips one), or "
                        "NAME=PATH; 'hub' downloads timm's weights when online. Each adds a fine-tuned row")
    add_set_option(p, "model option for one model (MODEL:KEY=VALUE) or all (KEY=VALUE), e.g. "
                      "--set timm:vit_tiny_patch16_224:patch_size=7", metavar="[MODEL:]KEY=VALUE")
    add_seeds_option(p, "row")
    add_run_options(p)
    add_study_output_options(p, "study folder (runs, CSV, figure, index.html)")
    p.set_defaults(func=run, _parser=p)


def run(args: argparse.Namespace) -> int:
    from vitlab.commands.options import run_study_command, study_fields
    from vitlab.errors import ConfigError
    from vitlab.experiments.compare import (
        CompareConfig,
        compare_run_specs,
        entries,
        parse_model_sets,
        parse_models,
        parse_pretrained,
        run_compare,
    )
    from vitlab.models import get_config

    if args.seeds < 1:
        raise ConfigError(f"--seeds must be >= 1, got {args.seeds}")
    models = parse_models(args.models)
    sets = parse_model_sets(args.set, models)
    for m in models:
        if not m.startswith("timm:"):
            get_config(m, **sets[m])
    # --finished-only reads back finished runs and trains none: the weights they started from need not be there
    items = entries(models, sets, parse_pretrained(args.pretrained, models, check=not args.finished_only))
    config = CompareConfig(items, **study_fields(args), seeds=args.seeds, logger=args.logger, models=models)
    return run_study_command(args, config, plan=compare_run_specs, train=run_compare, report=report_lines,
                             title="compare")


def report_lines(result: dict[str, Any]) -> list[str]:
    """What ``vitlab compare`` prints of a finished comparison: a line per row (medians over seeds), the warning, the
    files written."""
    lines = []
    for t in result["summary"]:
        macs = t["matmul_macs"] if t["matmul_macs"] is not None else t["macs"]
        over = f" (median of {t['seeds']} seeds)" if t["seeds"] > 1 else ""
        lines.append(f"{t['model']:<45} test accuracy {100 * t['test_acc_median']:.2f}%{over}, "
                     f"{(t['params'] or 0) / 1e6:.3f}M params, {(macs or 0) / 1e6:.1f} matmul MMACs, training "
                     f"{t['train_time_s_median']:.1f} s ({t['start']})"
                     + ("  [under-trained]" if t["undertrained"] else "")
                     + (f"  [diverged: {t['diverged']} of {t['seeds']} seeds]" if t.get("diverged") else "")
                     + (f"  [failed: {t['failed']} of {t['seeds']} seeds]" if t.get("failed") else ""))
    if result["warning"]:
        lines.append(result["warning"])
    lines.append(f"wrote results.csv, summary.csv, compare.png, index.html to {result['out']}")
    return lines
