"""``vitlab lr-sensitivity``: how wide a range of learning rates each variant trains at, against depth."""

from __future__ import annotations

import argparse
from typing import Any

DEFAULT_VARIANTS = "vit,layerscale,cait,deepvit,rezero,fixup,tfixup"


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
        "lr-sensitivity", help="final loss against learning rate per variant and depth; LR sensitivity, divergence",
        description="Train every --variants (those of `vitlab depth-study`) at every --depths and every --lrs, "
                    "--seeds runs each, on a short schedule, and measure how wide a range of learning rates each "
                    "trains at (Wortsman et al. 2023, 'Small-scale proxies for large-scale Transformer training "
                    "instabilities'): per variant and depth the best learning rate and final validation loss, the "
                    "LR sensitivity (mean over the grid of min(loss, ln classes) minus the best over every rate; "
                    "--bracket adds rates beyond the grid's edge where the best lies), the share of runs "
                    "that diverged, and the largest attention logit per layer over training. Needs --val-split: "
                    "the best learning rate is chosen on validation images, never on the test set. Finished runs "
                    "are read back, so an interrupted study resumes. Writes results.csv, summary.csv, "
                    "sensitivity.csv, logits.csv, figures and index.html.")
    add_study_data_options(p)
    add_depth_grid_options(p, default_variants=DEFAULT_VARIANTS, depths_example="6,12,24,48", lrs=True,
                           variants_help=f"variants of `vitlab depth-study` (default {DEFAULT_VARIANTS})")
    add_seeds_option(p, "variant, depth and learning rate", "; a later invocation with more adds the rest")
    p.add_argument("--bracket", type=int, default=0, metavar="N",
                   help="after the grid's runs, a variant and depth whose best rate is the lowest (highest) of its "
                        "rates also trains, for every seed, the next rate beyond that edge (the edge divided "
                        "(multiplied) by the grid's step there), until its best rate is interior or N rates were "
                        "added on that side (default 0: the grid alone). The sensitivity stays a mean over --lrs, "
                        "its minimum over every rate; the same command resumes")
    p.add_argument("--diagnose", action="store_true",
                   help="also write the depth study's diagnostics (attention collapse, residual ratios on 64 test "
                        "images) into every finished run that has its weights, so that `vitlab depth-study "
                        "--lr-from` can copy the run from its record once the weights are gone (records are kept "
                        "without weights)")
    add_probe_images_option(p, "training images the per-layer attention logits are measured on after every epoch "
                               "(default 64)")
    add_set_option(p, "model option for every variant (repeatable), not one the variants set")
    add_run_options(p)
    add_study_output_options(p)
    p.set_defaults(func=run, _parser=p)


def run(args: argparse.Namespace) -> int:
    import sys

    from vitlab.commands.options import run_study_command, study_fields
    from vitlab.errors import ConfigError
    from vitlab.experiments.depth_study import parse_variants, variant_notes
    from vitlab.experiments.lr_sensitivity import (
        LRSensitivityConfig,
        check_lr_sensitivity,
        planned_runs,
        run_lr_sensitivity,
    )
    from vitlab.experiments.values import parse_ints, split_list
    from vitlab.train.config import parse_set

    lrs = []
    for text in split_list(args.lrs, "--lrs"):
        try:
            lrs.append(float(text))
        except ValueError:
            raise ConfigError(f"--lrs: {text!r} is not a number; pass e.g. --lrs 3e-4,7e-4,2e-3,5e-3,1e-2") from None
    config = LRSensitivityConfig(args.base, parse_ints(args.depths, "--depths"), parse_variants(args.variants), lrs,
                                 **study_fields(args), seeds=args.seeds, shared=parse_set(args.set),
                                 probe_images=args.probe_images, bracket=args.bracket,
                                 diagnose=args.diagnose)
    check_lr_sensitivity(config)
    for note in variant_notes(config.variants):
        print(note, file=sys.stderr)
    later: list[str] = []  # a dry run's lines on the rates decided after the grid's runs

    def plan(config: LRSensitivityConfig) -> list:
        specs, lines = planned_runs(config)
        later.extend(lines)
        return specs

    status = run_study_command(args, config, plan=plan, train=run_lr_sensitivity, report=report_lines,
                               title="lr sensitivity")
    for line in later:
        print(line)
    return status


def report_lines(result: dict[str, Any]) -> list[str]:
    """What ``vitlab lr-sensitivity`` prints of a finished study: a line per variant and depth (with whether its
    best rate is bracketed, and if not why no rate was added beyond it), the files written."""
    notes = result.get("notes", {})
    lines = [f"{s['variant']:<10} depth {s['depth']:>3}: best lr {s['best_lr']:g} (validation loss "
             f"{s['best_val_loss']:.3f}, test accuracy {100 * s['test_acc_at_best_lr']:.2f}%), LR sensitivity "
             f"{s['lr_sensitivity']:.3f}, diverged {100 * s['divergence_rate']:.0f}% of {s['runs']} runs, "
             f"max attention logit {s['max_logit']:.3g}; {_bracket_words(s, notes.get((s['variant'], s['depth'])))}"
             for s in result["sensitivity"]]
    lines.append(f"wrote results.csv, summary.csv, sensitivity.csv, logits.csv, {', '.join(result['figures'])}, "
                 f"index.html to {result['out']}")
    return lines


def _bracket_words(row: dict[str, Any], note: str | None) -> str:
    """Whether a cell's best rate is interior of its rates ``lr_low..lr_high``, and if not why it stayed so."""
    span = f"{row['lr_low']:g}..{row['lr_high']:g}"
    if row["bracketed"]:
        return f"bracketed (interior of {span})"
    return f"not bracketed: on the edge of {span}" + (f" ({note})" if note else "")
