"""``vitlab complexity``: measured time and memory against the number of tokens, with fitted exponents."""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: Any) -> None:
    from vitlab.commands.options import add_set_option, add_study_output_options

    p = subparsers.add_parser(
        "complexity", help="time and memory against the number of tokens, with a fitted exponent",
        description="Build MODEL at each --img-sizes, time forward (eval, no grad) and forward+backward (train) on a "
                    "random batch (median of --repeats after one warm-up), measure memory (CUDA: peak allocated; "
                    "CPU: activation bytes saved for backward), fit log(time) = a + b log(tokens) and set it beside "
                    "the analytic MACs split into the token-linear and the attention (T^2) part. Writes "
                    "complexity.csv, fits.csv, complexity.png and index.html into --output.")
    p.add_argument("--model", default="vit_mnist", help="vitlab preset (default vit_mnist)")
    p.add_argument("--img-sizes", required=True, metavar="S1,S2,...",
                   help="image sides in pixels, multiples of the patch size, e.g. 28,56,84,112")
    add_set_option(p, "model option for every size (repeatable), e.g. --set patch_size=4")
    p.add_argument("--batch-size", type=int, default=8, help="images per timed batch (default 8)")
    p.add_argument("--repeats", type=int, default=5, help="timed repeats per size, the median is kept (default 5)")
    p.add_argument("--attention", default="fused", choices=("fused", "math"),
                   help="scaled_dot_product_attention kernel: fused (torch's choice, default) or math (materialises "
                        "and saves the T x T maps)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    add_study_output_options(p, "folder for the CSV, figure and index.html", dry_run=False)
    p.set_defaults(func=run, _parser=p)


def run(args: argparse.Namespace) -> int:
    import sys

    from vitlab.commands.options import command_line
    from vitlab.experiments.complexity import ComplexityConfig, run_complexity
    from vitlab.experiments.values import parse_ints
    from vitlab.train.config import parse_set

    config = ComplexityConfig(args.model, parse_ints(args.img_sizes, "--img-sizes"), args.output, parse_set(args.set),
                              args.batch_size, args.repeats, args.attention, args.device, args.threads,
                              command_line(args), force=args.force)
    done = run_complexity(config, log=lambda s: print(s, file=sys.stderr, flush=True))
    print(done["text"].split("\n\n")[0])
    print(f"wrote complexity.csv, fits.csv, complexity.png, index.html to {done['out']}")
    return 0
