"""``vitlab verdict``: two arms of runs compared with the run (seed) as the unit, and the verdict of the rule."""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "verdict", help="compare two arms of runs (seed as the unit): effect, 95 %% interval, test, verdict",
        description="Compare two arms of finished runs: the effect (A - B), its 95 %% interval, p-value and test "
                    "(paired t over the per-seed differences when both arms have the same seeds, Welch's t over "
                    "runs otherwise), the runs per arm, the minimal detectable effect at 80 %% power and the "
                    "verdict: 'reproduced' when the interval excludes zero on A's side ('A beats B'), "
                    "'contradicted' on B's side, 'undecided' otherwise (with the runs per arm that would decide "
                    "it). Each arm is a study folder, a run folder, STUDY/PREFIX (the runs PREFIX_seed* of a "
                    "study, e.g. runs/sweep_lr/lr=0.002) or a comma-separated list of these. A run without a "
                    "complete record is refused by name.")
    p.add_argument("runs_a", metavar="RUNS_A", help="the arm the claim says is larger (better)")
    p.add_argument("runs_b", metavar="RUNS_B", help="the arm it is compared with")
    pairing = p.add_mutually_exclusive_group()
    pairing.add_argument("--paired", dest="paired", action="store_true", default=None,
                         help="insist on the paired t (both arms must have the same seeds)")
    pairing.add_argument("--unpaired", dest="paired", action="store_false", help="Welch's t even when seeds match")
    p.add_argument("--margin", type=float, default=0.0, metavar="M",
                   help="an 'as good as' claim within M (TOST), in the measure's unit; state it before looking")
    p.add_argument("--noninferior", action="store_true", help="with --margin: a 'no worse than' claim instead")
    p.add_argument("--metric", default="acc", metavar="NAME",
                   help="what to compare: acc (test accuracy in points, default), max_logit, cv_attn, cv_mlp, "
                        "similarity, or a numeric key of summary.json such as final_val_loss")
    p.add_argument("--per-image", action="store_true",
                   help="also describe the paired arms on their stored test predictions (these runs on these "
                        "images; not the verdict)")
    p.add_argument("--csv", default=None, metavar="FILE", help="also write the row to FILE (CSV)")
    p.set_defaults(func=run, _parser=p)


def _arm(text: str) -> list[str] | str:
    parts = [t for t in text.split(",") if t]
    return parts if len(parts) > 1 else text


def run(args: argparse.Namespace) -> int:
    import csv
    import io
    import math

    from vitlab.atomic import atomic_write_text
    from vitlab.errors import ConfigError
    from vitlab.experiments.verdict import COLUMNS, compare_runs, describe, per_image, result_row

    if args.noninferior and not args.margin > 0:
        raise ConfigError("--noninferior needs --margin M > 0, the largest loss still counted as 'no worse'")
    if args.margin < 0 or not math.isfinite(args.margin):
        raise ConfigError(f"--margin must be a positive number, got {args.margin}")
    a, b = _arm(args.runs_a), _arm(args.runs_b)
    r = compare_runs(a, b, paired=args.paired, margin=args.margin, noninferior=args.noninferior, what=args.metric)
    unit = "points" if args.metric == "acc" else ""
    print(f"{args.runs_a} - {args.runs_b} ({args.metric})")
    for line in describe(r, unit):
        print(line)
    if args.per_image:
        c = per_image(a, b)
        print(f"per image (these runs on these {c.n_a} (seed, image) pairs, not a verdict): {100 * c.effect:+.4g} "
              f"points, {100 * c.ci_low:+.4g} to {100 * c.ci_high:+.4g}, p = {c.p:.3g} ({c.test})")
    if args.csv:
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
        w.writeheader()
        w.writerow(result_row(args.runs_a, args.runs_b, args.metric, r))
        atomic_write_text(args.csv, buf.getvalue())
        print(f"wrote {args.csv}")
    return 0
