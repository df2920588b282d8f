"""``vitlab convert IN OUT``: timm or vitlab weights in, adapted vitlab or timm safetensors out."""

from __future__ import annotations

import argparse
import json


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "convert", help="convert weights between timm and vitlab, adapting size, channels and classes",
        description="Read IN (a .safetensors or .pth state dict of timm or vitlab, or a vitlab checkpoint "
                    "directory), adapt it to --img-size/--patch-size/--in-chans/--num-classes, and write OUT as "
                    "safetensors in vitlab's or timm's layout. The architecture comes from --model, a vitlab "
                    "checkpoint's config, or the shapes of IN.")
    p.add_argument("input", metavar="IN", help="weight file (.safetensors, .pth) or vitlab checkpoint directory")
    p.add_argument("output", metavar="OUT", help="output .safetensors file")
    p.add_argument("--to", choices=("vitlab", "timm"), default="vitlab", help="layout of OUT (default: vitlab)")
    p.add_argument("--model", metavar="NAME", default=None,
                   help="what IN is: a vitlab preset or timm:NAME (needed when the shapes do not tell, e.g. the "
                        "number of heads of a plain ViT)")
    p.add_argument("--img-size", type=int, default=None, help="resample the position embedding to this image size")
    p.add_argument("--patch-size", type=int, default=None, help="resample the patch kernel to this patch size")
    p.add_argument("--in-chans", type=int, default=None, help="input channels (1 sums the RGB kernels)")
    p.add_argument("--num-classes", type=int, default=None, help="classes (another count gets a fresh head)")
    p.add_argument("--num-heads", type=int, default=None,
                   help="heads of a plain ViT state dict (its shapes do not show them); or give --model")
    p.add_argument("--global-pool", choices=("token", "avg"), default=None,
                   help="what the head of a class-token ViT state dict reads (its keys do not show it); or --model")
    p.add_argument("--drop-dist-token", action="store_true", help="load a distilled DeiT without its dist token")
    p.add_argument("--overwrite", action="store_true", help="replace OUT when it exists (never a run folder's file)")
    p.add_argument("--no-verify", dest="verify", action="store_false",
                   help="read a vitlab checkpoint file whose SHA-256 no longer matches its manifest.json (edited on "
                        "purpose)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from vitlab.checkpoint import check_output_path, save_weights
    from vitlab.checkpoint.files import check_new_file
    from vitlab.interop import load_pretrained, to_timm

    check_new_file(args.output, overwrite=args.overwrite)  # no existing file replaced unasked, none in a run folder
    check_output_path(args.output)
    overrides = {k: v for k, v in (("img_size", args.img_size), ("patch_size", args.patch_size),
                                   ("in_chans", args.in_chans), ("num_classes", args.num_classes),
                                   ("num_heads", args.num_heads), ("global_pool", args.global_pool)) if v is not None}
    model = load_pretrained(args.model, args.input, drop_dist_token=args.drop_dist_token, verify=args.verify,
                            **overrides)
    state = to_timm(model).state_dict() if args.to == "timm" else model.state_dict()
    cfg = model.cfg
    save_weights(state, args.output, metadata={"format": args.to, "vitlab_config": json.dumps(cfg.to_dict())})
    params = sum(p.numel() for p in model.parameters())
    print(f"wrote {args.output}: {args.to} layout, {cfg.arch} embed_dim {cfg.embed_dim} depth {cfg.depth} "
          f"heads {cfg.num_heads}, {cfg.img_size}x{cfg.img_size}x{cfg.in_chans} patch {cfg.patch_size}, "
          f"{cfg.num_classes} classes, {params / 1e6:.2f}M parameters")
    return 0
