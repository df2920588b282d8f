"""``vitlab models [PATTERN]``: the presets with their parameters and GMACs at the default size."""

from __future__ import annotations

import argparse
import json


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "models", help="list model presets with params and GMACs",
        description="List the presets matching PATTERN (a shell pattern such as 'cait*', or a substring) with "
                    "their size, parameters (M) and multiply-adds per image at the default size (GMACs; "
                    "FLOPs = 2 x MACs). Models are built on the meta device, so this is instant.")
    p.add_argument("pattern", nargs="?", default="*", metavar="PATTERN", help="filter (default: all)")
    p.add_argument("--json", action="store_true", help="print a JSON list instead of the table")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import difflib

    from vitlab.errors import ConfigError
    from vitlab.models import PRESETS, list_models

    pattern = args.pattern if any(c in args.pattern for c in "*?[") else f"*{args.pattern}*"
    names = list_models(pattern)
    if not names:
        close = difflib.get_close_matches(args.pattern, PRESETS, n=3, cutoff=0.4)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ConfigError(f"no preset matches {args.pattern!r}{hint} (run `vitlab models` for all)")
    rows = [preset_row(n) for n in names]
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    w = max(13, *(len(r["name"]) for r in rows))  # the name column fits the longest name
    print(f"{'model':<{w}} {'arch':<5} {'img':>4} {'patch':>5} {'dim':>5} {'depth':>5} {'heads':>5} "
          f"{'attn':<13} {'gate':<10} {'params (M)':>10} {'GMACs':>8}")
    for r in rows:
        print(f"{r['name']:<{w}} {r['arch']:<5} {r['img_size']:>4} {r['patch_size']:>5} {r['embed_dim']:>5} "
              f"{r['depth']:>5} {r['num_heads']:>5} {r['attn']:<13} {r['gate']:<10} {r['params'] / 1e6:>10.2f} "
              f"{r['macs'] / 1e9:>8.3f}")
    print("GMACs: multiply-adds per image at the default size (FLOPs = 2 x MACs); see `vitlab flops MODEL`.")
    return 0


def preset_row(name: str) -> dict:
    """Size, parameters and MACs of preset ``name``, built on the meta device (no memory, no init time)."""
    import torch

    from vitlab.models import create_model

    with torch.device("meta"):
        model = create_model(name)
    cfg = model.cfg
    return {"name": name, "arch": cfg.arch, "img_size": cfg.img_size, "patch_size": cfg.patch_size,
            "embed_dim": cfg.embed_dim, "depth": cfg.depth, "num_heads": cfg.num_heads, "attn": cfg.attn,
            "gate": cfg.gate, "params": sum(p.numel() for p in model.parameters()), "macs": model.flop_count()}
