"""``vitlab lr-sensitivity``: how wide a range of learning rates each variant trains at, against depth."""

from __future__ import annotations

import argparse
from typing import Any

DEFAULT_VARIANTS = "vit,layerscale,cait,deepvit,rezero,fixup,tfixup"


def register(subparsers: Any) -> None:
    from vitlab.commands.options import add_force_option, add_run_options

    p = subparsers.add_parser(
        "lr-sensitivity", help="final loss against learning rate per variant and depth; LR sensitivity, divergence",
        description="Train every --variants (those of `vitlab depth-study`) at every --depths and every --lrs, "
                    "--seeds runs each, on a short schedule, and measure how wide a range of learning rates each "
                    "trains at (Wortsman et al. 2023, 'Small-scale proxies for large-scale Transformer training "
                    "instabilities'): per variant and depth the best learning rate and final validation loss, the "
                    "LR sensitivity (mean over the grid of min(loss, ln classes) minus the best), the share of runs "
                    "that diverged, and the largest attention logit per layer over training. Needs --val-split: "
                    "the best learning rate is chosen on validation images, never on the test set. Finished runs "
                    "are read back, so an interrupted study resumes. Writes results.csv, summary.csv, "
                    "sensitivity.csv, logits.csv, figures and index.html.")
    p.add_argument("--dataset", default="mnist-5k", help="data set (default mnist-5k)")
    p.add_argument("--base", default="vit_mnist", help="preset giving width, heads, image and patch size "
                                                       "(default vit_mnist)")
    p.add_argument("--depths", required=True, metavar="D1,D2,...", help="depths to train, e.g. 6,12,24,48")
    p.add_argument("--lrs", required=True, metavar="LR1,LR2,...",
                   help="peak learning rates, e.g. 3e-4,7e-4,2e-3,5e-3,1e-2 (33x around the recipe's 2e-3)")
    p.add_argument("--variants", default=DEFAULT_VARIANTS, metavar="V1,V2,...",
                   help=f"variants of `vitlab depth-study` (default {DEFAULT_VARIANTS})")
    p.add_argument("--seeds", type=int, default=1, help="runs per variant, depth and learning rate, seeds 0..N-1 "
                                                        "(default 1; a later invocation with more adds the rest)")
    p.add_argument("--probe-images", type=int, default=64, metavar="N",
                   help="training images the per-layer attention logits are measured on after every epoch "
                        "(default 64)")
    p.add_argument("--set", action="append", default=None, metavar="KEY=VALUE",
                   help="model option for every variant (repeatable), not one the variants set")
    add_run_options(p)
    p.add_argument("--output", required=True, metavar="DIR", help="study folder (runs, CSV, figures, index.html)")
    add_force_option(p)
    p.set_defaults(func=run, _parser=p)


def run(args: argparse.Namespace) -> int:
    import sys

    from vitlab.commands.options import base_run_config, command_line, executor_config
    from vitlab.errors import ConfigError
    from vitlab.experiments.depth_study import parse_variants, variant_notes
    from vitlab.experiments.lr_sensitivity import LRSensitivityConfig, check_lr_sensitivity, run_lr_sensitivity
    from vitlab.experiments.runs import exit_status
    from vitlab.experiments.values import parse_ints, split_list
    from vitlab.train.options import parse_set

    lrs = []
    for text in split_list(args.lrs, "--lrs"):
        try:
            lrs.append(float(text))
        except ValueError:
            raise ConfigError(f"--lrs: {text!r} is not a number; pass e.g. --lrs 3e-4,7e-4,2e-3,5e-3,1e-2") from None
    config = LRSensitivityConfig(args.base, parse_ints(args.depths, "--depths"), parse_variants(args.variants), lrs,
                                 base_run_config(args, dataset=args.dataset), args.output, args.seeds,
                                 parse_set(args.set), command_line(args), finished_only=args.finished_only,
                                 executor=executor_config(args), probe_images=args.probe_images, force=args.force)
    check_lr_sensitivity(config)
    for note in variant_notes(config.variants):
        print(note, file=sys.stderr)
    result = run_lr_sensitivity(config)
    for s in result["sensitivity"]:
        print(f"{s['variant']:<10} depth {s['depth']:>3}: best lr {s['best_lr']:g} (validation loss "
              f"{s['best_val_loss']:.3f}, test accuracy {100 * s['test_acc_at_best_lr']:.2f}%), LR sensitivity "
              f"{s['lr_sensitivity']:.3f}, diverged {100 * s['divergence_rate']:.0f}% of {s['runs']} runs, "
              f"max attention logit {s['max_logit']:.3g}")
    print(f"wrote results.csv, summary.csv, sensitivity.csv, logits.csv, {', '.join(result['figures'])}, index.html "
          f"to {result['out']}")
    return exit_status("lr-sensitivity", result["pairs"])  # 0: every run finished; 3: some failed, each named
