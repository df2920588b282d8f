"""``vitlab complexity``: measured time and memory against the number of tokens, with fitted exponents."""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: Any) -> None:
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
    p.add_argument("--set", action="append", default=None, metavar="KEY=VALUE",
                   help="model option for every size (repeatable), e.g. --set patch_size=4")
    p.add_argument("--batch-size", type=int, default=8, help="images per timed batch (default 8)")
    p.add_argument("--repeats", type=int, default=5, help="timed repeats per size, the median is kept (default 5)")
    p.add_argument("--attention", default="fused", choices=("fused", "math"),
                   help="scaled_dot_product_attention kernel: fused (torch's choice, default) or math (materialises "
                        "and saves the T x T maps)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--output", required=True, metavar="DIR", help="folder for the CSV, figure and index.html")
    p.set_defaults(func=run, _parser=p)


def run(args: argparse.Namespace) -> int:
    import sys

    import torch

    from vitlab.analysis.report import Section, write_csv, write_json, write_report
    from vitlab.errors import ConfigError
    from vitlab.experiments.common import check_output, command_line, model_overrides, parse_ints
    from vitlab.experiments.complexity import COLUMNS, plot_complexity, run_complexity
    from vitlab.models import get_config

    sizes = parse_ints(args.img_sizes, "--img-sizes")
    overrides = model_overrides(args.set)
    if "img_size" in overrides:
        raise ConfigError("img_size is what --img-sizes varies; remove --set img_size")
    cfg = get_config(args.model, **overrides)
    bad = [s for s in sizes if s % cfg.patch_size]
    if bad:
        raise ConfigError(f"--img-sizes {','.join(map(str, bad))} are not multiples of the patch size "
                          f"{cfg.patch_size}; use e.g. {','.join(str(cfg.patch_size * k) for k in (4, 8, 12, 16))}")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"--device {args.device} asks for CUDA but none is available; use --device cpu")
    if args.threads is not None:
        if args.threads < 1:
            raise ConfigError(f"--threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    out = check_output(args.output)
    result = run_complexity(args.model, sizes, overrides=overrides, batch_size=args.batch_size,
                            repeats=args.repeats, device=device, backend=args.attention,
                            log=lambda s: print(s, file=sys.stderr, flush=True))
    write_csv(out / "complexity.csv", [p.row() for p in result.points], COLUMNS)
    write_csv(out / "fits.csv", result.fits)
    title = (f"{args.model}: cost against tokens ({device.type}, {args.attention} attention, batch {args.batch_size}, "
             f"{torch.get_num_threads()} threads)")
    plot_complexity(result, out / "complexity.png", title)
    fits = {r["quantity"]: r for r in result.fits}
    write_json(out / "summary.json", {"model": args.model, "overrides": overrides, "device": str(device),
                                      "attention": args.attention,
                                      "threads": torch.get_num_threads(), "points": [p.row() for p in result.points],
                                      "fits": result.fits})
    last = result.points[-1]
    text = (f"Fitted exponents b of quantity ~ tokens^b over {len(sizes)} sizes: forward "
            f"{fits['forward_s']['exponent']:.2f}, forward+backward {fits['forward_backward_s']['exponent']:.2f}, "
            f"analytic MACs {fits['macs']['exponent']:.2f} (attention part {fits['attention_macs']['exponent']:.2f}, "
            f"token-linear part {fits['linear_macs']['exponent']:.2f}). At {last.tokens} tokens the attention "
            f"(T^2) part is {100 * last.attention_macs / last.macs:.1f}% of the MACs, so the measured exponent "
            "moves from about 1 towards 2 as the token count grows.\n\n"
            "Memory on CUDA is the peak allocated during forward+backward above the baseline; on CPU it is the "
            "activation bytes autograd saves for backward (saved_tensors_hooks, each storage once, parameters "
            "left out), because tracemalloc does not see torch's allocator and the RSS only grows. The fused "
            "attention kernel does not save the T x T maps, so this memory grows about linearly; with --attention "
            "math the maps are saved and the quadratic term appears. Times are medians of the repeats on a "
            "machine that may be shared.")
    write_report(out, title, command_line(args), [
        Section("Cost against tokens", text, ["complexity.png"], ["complexity.csv", "fits.csv"])])
    print(text.split("\n\n")[0])
    print(f"wrote complexity.csv, fits.csv, complexity.png, index.html to {out}")
    return 0
