"""``vitlab flops MODEL``: per-module multiplies (MACs), FLOPs = 2 x MACs, and a cross-check with torch."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

DESCRIPTION = """Print the per-module table of parameters and multiplies (MACs) for one image, the totals as MACs
and FLOPs (= 2 x MACs; paper tables print MACs and call them FLOPs) and a cross-check: twice the matmul-like
MACs must equal what torch.utils.flop_counter.FlopCounterMode counts for one forward pass (eval mode, MATH
attention backend). Exit status 1 when the two disagree."""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("flops", help="per-module FLOP / parameter table of a preset",
                              description=DESCRIPTION)
    p.add_argument("model", metavar="MODEL", help="preset name (see `vitlab models`)")
    p.add_argument("--img-size", type=int, help="input side in pixels (default: the preset's)")
    p.add_argument("--patch-size", type=int, help="patch side in pixels (default: the preset's)")
    p.add_argument("--in-chans", type=int, help="input channels (default: the preset's)")
    p.add_argument("--num-classes", type=int, help="classes of the head, 0 for none (default: the preset's)")
    p.add_argument("--device", default="meta",
                   help="where to build the model for the cross-check: meta (default: shapes only, instant for "
                        "any size), cpu or cuda")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from vitlab import flops
    from vitlab.models import create_model

    overrides = {k: v for k, v in (("img_size", args.img_size), ("patch_size", args.patch_size),
                                   ("in_chans", args.in_chans), ("num_classes", args.num_classes)) if v is not None}
    device = _device(args.device)
    with torch.device(device):
        model = create_model(args.model, **overrides)
    summary = flops.summarize(model)
    ours, theirs = flops.cross_check(model)
    if args.json:
        out = summary.to_dict()
        out["cross_check"] = {"ours_flops": ours, "torch_flops": theirs, "equal": ours == theirs}
        print(json.dumps(out, indent=1))
    else:
        print(flops.format_table(summary))
        print(flops.format_cross_check(ours, theirs))
    return 0 if ours == theirs else 1


def _device(name: str) -> torch.device:
    import torch

    from vitlab.errors import ConfigError

    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ConfigError(f"unknown device {name!r}; use meta, cpu or cuda") from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda asked for but no CUDA device is visible; use --device meta or cpu")
    if device.type not in ("meta", "cpu", "cuda"):
        raise ConfigError(f"unsupported device {name!r}; use meta, cpu or cuda")
    return device
