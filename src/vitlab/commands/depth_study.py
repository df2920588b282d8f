"""``vitlab depth-study``: accuracy against depth per variant, with attention collapse and residual ratios."""

from __future__ import annotations

import argparse
from typing import Any

DEFAULT_VARIANTS = "vit,layerscale,rezero,skipinit,cait,deepvit"
ALL_VARIANTS = "vit,qknorm,layerscale,rezero,skipinit,fixup,tfixup,cait,vit5,deepvit"


def register(subparsers: Any) -> None:
    from vitlab.commands.options import add_dry_run_option, add_force_option, add_run_options

    p = subparsers.add_parser(
        "depth-study", help="accuracy, attention collapse and residual ratios against depth per variant",
        description="Train every --variants at every --depths (same width, heads, image and patch size as --base, "
                    "same recipe), each run in its own sub-folder of --output (finished runs are read back), then "
                    "analyse each checkpoint like `vitlab analyze`: cross-layer attention similarity and "
                    "similar-block counts (DeepViT), residual ratios per block (CaiT). Variants: vit (gate none), "
                    "layerscale (CaiT depth rule init), rezero, skipinit, fixup (Zhang et al. 2019), tfixup (Huang et "
                    "al. 2020; trained without warm-up), cait (cait_xxs24 at the base width, 2 class-attention "
                    "blocks), vit5 (the vit5_* block at the base width), deepvit (re-attention; its softmax maps "
                    "before the head mix are compared too), postnorm, "
                   "deepnorm (Wang et al. 2022), normformer (Shleifer et al. 2021), sigma_reparam (Zhai et al. 2023), "
                   "parallel (ViT-22B), depth_mup (1/sqrt(depth) branches). Runs "
                    "that end far below the data set's reference accuracy are marked under-trained. Writes "
                    "results.csv, summary.csv, residual_ratios.csv, collapse_layers.csv, figures and index.html.")
    p.add_argument("--dataset", default="mnist-5k", help="data set (default mnist-5k)")
    p.add_argument("--base", default="vit_mnist", help="preset giving width, heads, image and patch size "
                                                       "(default vit_mnist)")
    p.add_argument("--depths", required=True, metavar="D1,D2,...", help="depths to train, e.g. 6,12,24,36")
    p.add_argument("--variants", default=DEFAULT_VARIANTS, metavar="V1,V2,...",
                   help=f"variants to compare, from {ALL_VARIANTS} (default {DEFAULT_VARIANTS})")
    p.add_argument("--seeds", type=int, default=1, help="runs per variant and depth, seeds 0..N-1 (default 1)")
    p.add_argument("--num-images", type=int, default=64, help="test images the diagnostics average over "
                                                             "(default 64)")
    p.add_argument("--threshold", type=float, default=0.9,
                   help="similarity above which two blocks count as similar (default 0.9)")
    p.add_argument("--probe-images", type=int, default=64, metavar="N",
                   help="training images each run's per-layer probes (docs/analysis.md) are measured on after every "
                        "epoch; 0: at the end only (default 64)")
    p.add_argument("--set", action="append", default=None, metavar="KEY=VALUE",
                   help="model option for every variant (repeatable), e.g. --set global_pool=token; not one the "
                        "variants set (depth, gate, attn, init_values)")
    p.add_argument("--analyze-runs", action="store_true",
                   help="also write each run's full `vitlab analyze` report (attention maps, rollout) into "
                        "RUN/analysis")
    p.add_argument("--lr-from", default=None, metavar="STUDY",
                   help="train each variant at each depth at its own best learning rate, read from the "
                        "sensitivity.csv of a finished `vitlab lr-sensitivity` study (its folder or the file; chosen "
                        "there on validation loss); instead of --lr")
    add_run_options(p)
    p.add_argument("--output", required=True, metavar="DIR", help="study folder (runs, CSV, figures, index.html)")
    add_force_option(p)
    add_dry_run_option(p)
    p.set_defaults(func=run, _parser=p)


def run(args: argparse.Namespace) -> int:
    import math
    import sys

    from vitlab.commands.options import base_run_config, command_line, executor_config
    from vitlab.experiments.depth_study import (
        DepthStudyConfig,
        check_depth_study,
        parse_variants,
        run_depth_study,
        variant_notes,
    )
    from vitlab.experiments.runs import exit_status
    from vitlab.experiments.values import parse_ints
    from vitlab.train.options import parse_set

    config = DepthStudyConfig(args.base, parse_ints(args.depths, "--depths"), parse_variants(args.variants),
                              base_run_config(args, dataset=args.dataset), args.output, args.seeds, args.num_images,
                              args.threshold, parse_set(args.set), args.analyze_runs, command_line(args), args.logger,
                              finished_only=args.finished_only, executor=executor_config(args),
                              probe_images=args.probe_images, force=args.force, lr_from=args.lr_from)
    check_depth_study(config)
    for note in variant_notes(config.variants):
        print(note, file=sys.stderr)
    if args.dry_run:
        from vitlab.experiments.depth_study import depth_run_specs
        from vitlab.experiments.runs import print_plans

        return print_plans(depth_run_specs(config), args.output, "depth study")
    result = run_depth_study(config)
    for a in result["summary"]:
        print(f"{a['variant']:<10} depth {a['depth']:>3}: test accuracy {100 * a['test_acc_mean']:.2f}% "
              f"+- {100 * a['test_acc_std']:.2f}, mean similarity {a['mean_similarity_mean']:.3f}, "
              f"layers with a similar block {100 * a['similar_fraction_mean']:.0f}%"
              + (f" (before the head mix {a['mean_similarity_pre_mix_mean']:.3f}, "
                 f"{100 * a['similar_fraction_pre_mix_mean']:.0f}%)"
                 if a["mean_similarity_pre_mix_mean"] == a["mean_similarity_pre_mix_mean"] else "")
              + (f", entropy {a['attn_entropy_mean']:.2f}" if math.isfinite(a.get("attn_entropy_mean", math.nan))
                 else "")
              + f", residual ratio attn {a['ratio_attn_mean_mean']:.3f} mlp {a['ratio_mlp_mean_mean']:.3f}"
              + ("  [under-trained]" if a["undertrained"] else "")
              + (f"  [diverged: {a['diverged']} of {a['n']} seeds]" if a.get("diverged") else "")
              + (f"  [failed: {a['failed']} of {a['n']} seeds]" if a.get("failed") else ""))
    if result["warning"]:
        print(result["warning"])
    print(f"wrote results.csv, summary.csv, residual_ratios.csv, collapse_layers.csv, {', '.join(result['figures'])}"
          f", index.html to {result['out']}")
    return exit_status("depth-study", result["pairs"])  # 0: every run finished; 3: some failed, each named
