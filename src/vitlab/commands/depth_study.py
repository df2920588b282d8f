"""``vitlab depth-study``: accuracy against depth per variant, with attention collapse and residual ratios."""

from __future__ import annotations

import argparse
from typing import Any

DEFAULT_VARIANTS = "vit,layerscale,rezero,skipinit,cait,deepvit"
ALL_VARIANTS = "vit,layerscale,rezero,skipinit,fixup,tfixup,cait,deepvit"


def register(subparsers: Any) -> None:
    from vitlab.experiments.common import add_run_options

    p = subparsers.add_parser(
        "depth-study", help="accuracy, attention collapse and residual ratios against depth per variant",
        description="Train every --variants at every --depths (same width, heads, image and patch size as --base, "
                    "same recipe), each run in its own sub-folder of --output (finished runs are read back), then "
                    "analyse each checkpoint like `vitlab analyze`: cross-layer attention similarity and "
                    "similar-block counts (DeepViT), residual ratios per block (CaiT). Variants: vit (gate none), "
                    "layerscale (CaiT depth rule init), rezero, skipinit, fixup (Zhang et al. 2019), tfixup (Huang et "
                    "al. 2020; trained without warm-up), cait (cait_xxs24 at the base width, 2 class-attention "
                    "blocks), deepvit (re-attention; its softmax maps before the head mix are compared too). Runs "
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
    p.add_argument("--set", action="append", default=None, metavar="KEY=VALUE",
                   help="model option for every variant (repeatable), e.g. --set global_pool=token; not one the "
                        "variants set (depth, gate, attn, init_values)")
    p.add_argument("--analyze-runs", action="store_true",
                   help="also write each run's full `vitlab analyze` report (attention maps, rollout) into "
                        "RUN/analysis")
    add_run_options(p)
    p.add_argument("--output", required=True, metavar="DIR", help="study folder (runs, CSV, figures, index.html)")
    p.set_defaults(func=run, _parser=p)


def run(args: argparse.Namespace) -> int:
    import sys

    from vitlab.data import load_dataset, normalization
    from vitlab.errors import ConfigError
    from vitlab.experiments.common import (
        base_run_config,
        check_output,
        command_line,
        model_overrides,
        parse_ints,
        run_all,
        track_study,
    )
    from vitlab.experiments.depth_study import (
        VARIANT_RUN,
        depth_specs,
        diagnose,
        parse_variants,
        per_layer_rows,
        result_row,
        write_study,
    )
    from vitlab.models import get_config

    depths = sorted(parse_ints(args.depths, "--depths"))
    variants = parse_variants(args.variants)
    if args.seeds < 1 or args.num_images < 1:
        raise ConfigError(f"--seeds and --num-images must be >= 1, got {args.seeds} and {args.num_images}")
    if not -1.0 <= args.threshold <= 1.0:
        raise ConfigError(f"--threshold {args.threshold} is not a cosine similarity; pass a value in [-1, 1]")
    base_model = get_config(args.base)
    if base_model.arch != "vit":
        raise ConfigError(f"--base {args.base} is a {base_model.arch} preset; pass a ViT preset (e.g. vit_mnist) "
                          "whose width the variants share")
    cfg = base_run_config(args, dataset=args.dataset)
    specs = depth_specs(args.base, depths, variants, list(range(args.seeds)), cfg, model_overrides(args.set))
    for v in variants:
        if VARIANT_RUN.get(v):
            sets = ", ".join(f"{k}={val:g}" for k, val in VARIANT_RUN[v].items())
            print(f"note: the {v} variant trains with {sets} whatever the recipe says (its paper's setting)",
                  file=sys.stderr)
    out = check_output(args.output)
    pairs = run_all(specs, out, title="depth study")

    _, test = load_dataset(args.dataset, data_dir=args.data_dir, img_size=base_model.img_size,
                           in_chans=base_model.in_chans)
    n = min(args.num_images, len(test))
    mean, std = normalization(args.dataset, base_model.in_chans)
    rows, ratio_rows, layer_rows, deepest = [], [], [], {}
    for i, (spec, summary) in enumerate(pairs):
        print(f"[{i + 1}/{len(pairs)}] diagnostics of {spec.name}", file=sys.stderr, flush=True)
        diag = diagnose(out / spec.name, test.images[:n], test.labels[:n], test.classes, mean, std,
                        threshold=args.threshold, full_report=args.analyze_runs)
        rows.append(result_row(spec, summary, diag))
        ratios, layers = per_layer_rows(spec, diag)
        ratio_rows += ratios
        layer_rows += layers
        if spec.info["depth"] == depths[-1] and spec.info["seed"] == 0:
            deepest[spec.info["variant"]] = diag
    meta = {"base": args.base, "dataset": args.dataset, "depths": depths, "variants": variants,
            "seeds": args.seeds, "num_images": n, "threshold": args.threshold, "run_config": cfg.to_dict()}
    title = f"Depth study on {args.dataset} (width of {args.base})"
    result = write_study(out, rows, ratio_rows, layer_rows, deepest, variants=variants, depths=depths,
                         threshold=args.threshold, title=title, command=command_line(args), meta=meta)
    track_study(out, args.logger, pairs, meta)
    for a in result["summary"]:
        print(f"{a['variant']:<10} depth {a['depth']:>3}: test accuracy {100 * a['test_acc_mean']:.2f}% "
              f"+- {100 * a['test_acc_std']:.2f}, mean similarity {a['mean_similarity_mean']:.3f}, "
              f"layers with a similar block {100 * a['similar_fraction_mean']:.0f}%"
              + (f" (before the head mix {a['mean_similarity_pre_mix_mean']:.3f}, "
                 f"{100 * a['similar_fraction_pre_mix_mean']:.0f}%)"
                 if a["mean_similarity_pre_mix_mean"] == a["mean_similarity_pre_mix_mean"] else "")
              + f", residual ratio attn {a['ratio_attn_mean_mean']:.3f} mlp {a['ratio_mlp_mean_mean']:.3f}"
              + ("  [under-trained]" if a["undertrained"] else ""))
    if result["warning"]:
        print(result["warning"])
    print(f"wrote results.csv, summary.csv, residual_ratios.csv, collapse_layers.csv, {', '.join(result['figures'])}"
          f", index.html to {out}")
    return 0
