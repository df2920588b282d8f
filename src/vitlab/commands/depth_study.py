"""``vitlab depth-study``: accuracy against depth per variant, with attention collapse and residual ratios."""

from __future__ import annotations

import argparse
from typing import Any

DEFAULT_VARIANTS = "vit,layerscale,rezero,skipinit,cait,deepvit"
ALL_VARIANTS = "vit,qknorm,layerscale,rezero,skipinit,fixup,tfixup,cait,vit5,deepvit"


def register(subparsers: Any) -> None:
    from vitlab.commands.options import (
        add_depth_grid_options,
        add_probe_images_option,
        add_run_options,
        add_seeds_option,
        add_set_option,
        add_study_data_options,
        add_study_output_options,
    )

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
    add_study_data_options(p)
    add_depth_grid_options(p, default_variants=DEFAULT_VARIANTS, depths_example="6,12,24,36",
                           variants_help=f"variants to compare, from {ALL_VARIANTS} (default {DEFAULT_VARIANTS})")
    add_seeds_option(p, "variant and depth")
    p.add_argument("--num-images", type=int, default=64, help="test images the diagnostics average over "
                                                             "(default 64)")
    p.add_argument("--threshold", type=float, default=0.9,
                   help="similarity above which two blocks count as similar (default 0.9)")
    add_probe_images_option(p, "training images each run's per-layer probes (docs/analysis.md) are measured on "
                               "after every epoch; 0: at the end only (default 64)")
    add_set_option(p, "model option for every variant (repeatable), e.g. --set global_pool=token; not one the "
                      "variants set (depth, gate, attn, init_values)")
    p.add_argument("--analyze-runs", action="store_true",
                   help="also write each run's full `vitlab analyze` report (attention maps, rollout) into "
                        "RUN/analysis")
    p.add_argument("--lr-from", default=None, metavar="STUDY",
                   help="train each variant at each depth at its own best learning rate, read from the "
                        "sensitivity.csv of a finished `vitlab lr-sensitivity` study (its folder or the file; chosen "
                        "there on validation loss); instead of --lr. Given the study's folder, a run that study "
                        "already trained with the same variant, depth, rate, seed and settings is copied into "
                        "--output instead of trained (reported as reused; --dry-run lists them)")
    p.add_argument("--lr-of", default=None, metavar="VARIANT",
                   help="with --lr-from: train every variant at the rate it chose for VARIANT at that depth (the "
                        "same-rate control, e.g. --lr-of vit: each arm at the plain ViT's rate)")
    p.add_argument("--reuse", default=None, metavar="STUDY",
                   help="the folder of another `vitlab depth-study`: a run finished there under this run's name, "
                        "with the same settings (checked as --lr-from's grid runs are), is copied into --output "
                        "instead of trained, e.g. the same-rate control reusing the main study's runs of an arm whose "
                        "own rate is the ViT's")
    add_run_options(p)
    add_study_output_options(p)
    p.set_defaults(func=run, _parser=p)


def run(args: argparse.Namespace) -> int:
    import sys

    from vitlab.commands.options import run_study_command, study_fields
    from vitlab.experiments.depth_study import (
        DepthStudyConfig,
        check_depth_study,
        depth_run_specs,
        parse_variants,
        run_depth_study,
        variant_notes,
    )
    from vitlab.experiments.values import parse_ints
    from vitlab.train.config import parse_set

    config = DepthStudyConfig(args.base, parse_ints(args.depths, "--depths"), parse_variants(args.variants),
                              **study_fields(args), seeds=args.seeds, num_images=args.num_images,
                              threshold=args.threshold, shared=parse_set(args.set), analyze_runs=args.analyze_runs,
                              logger=args.logger, probe_images=args.probe_images, lr_from=args.lr_from,
                              lr_of=args.lr_of, reuse=args.reuse)
    check_depth_study(config)
    for note in variant_notes(config.variants):
        print(note, file=sys.stderr)
    return run_study_command(args, config, plan=depth_run_specs, train=run_depth_study, report=report_lines,
                             title="depth study")


def report_lines(result: dict[str, Any]) -> list[str]:
    """What ``vitlab depth-study`` prints of a finished study: a line per variant and depth, the warning, the files
    written."""
    import math

    lines = []
    for a in result["summary"]:
        lines.append(f"{a['variant']:<10} depth {a['depth']:>3}: test accuracy {100 * a['test_acc_mean']:.2f}% "
                     f"+- {100 * a['test_acc_std']:.2f}, mean similarity {a['mean_similarity_mean']:.3f}, "
                     f"layers with a similar block {100 * a['similar_fraction_mean']:.0f}%"
                     + (f" (before the head mix {a['mean_similarity_pre_mix_mean']:.3f}, "
                        f"{100 * a['similar_fraction_pre_mix_mean']:.0f}%)"
                        if a["mean_similarity_pre_mix_mean"] == a["mean_similarity_pre_mix_mean"] else "")
                     + (f", entropy {a['attn_entropy_mean']:.2f}"
                        if math.isfinite(a.get("attn_entropy_mean", math.nan)) else "")
                     + f", residual ratio attn {a['ratio_attn_mean_mean']:.3f} mlp {a['ratio_mlp_mean_mean']:.3f}"
                     + ("  [under-trained]" if a["undertrained"] else "")
                     + (f"  [diverged: {a['diverged']} of {a['n']} seeds]" if a.get("diverged") else "")
                     + (f"  [failed: {a['failed']} of {a['n']} seeds]" if a.get("failed") else ""))
    if result["warning"]:
        lines.append(result["warning"])
    lines.append(f"wrote results.csv, summary.csv, residual_ratios.csv, collapse_layers.csv, "
                 f"{', '.join(result['figures'])}, index.html to {result['out']}")
    return lines
