"""``vitlab convert IN OUT``: timm, vitlab or ViT-5 (the authors' code) weights in, adapted vitlab, timm or ViT-5
weights out."""

from __future__ import annotations

import argparse
import json


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "convert", help="convert weights between timm, vitlab and the ViT-5 code, adapting size, channels and classes",
        description="Read IN (a .safetensors or .pth state dict of timm or vitlab, or a vitlab checkpoint "
                    "directory; with --from vit5 a checkpoint of the ViT-5 authors' code), adapt it to "
                    "--img-size/--patch-size/--in-chans/--num-classes, and write OUT as safetensors in vitlab's, "
                    "timm's or the ViT-5 code's layout (--to vit5 also writes .pth, {'model': state}, for its "
                    "main.py --finetune). The architecture comes from --model, a vitlab checkpoint's config, or the "
                    "shapes of IN. Every key and shape of IN is checked before a model is built, and NaN or infinite "
                    "weights are refused unless --allow-nonfinite: one line naming the file and the key, nothing "
                    "written.")
    p.add_argument("input", metavar="IN", help="weight file (.safetensors, .pth) or vitlab checkpoint directory")
    p.add_argument("output", metavar="OUT", help="output .safetensors file (.pth also with --to vit5)")
    p.add_argument("--from", dest="source", choices=("auto", "vit5"), default="auto",
                   help="what IN is: auto (timm or vitlab, told by its keys; default) or vit5 (a checkpoint of the "
                        "ViT-5 authors' code, wangf3014/ViT-5)")
    p.add_argument("--to", choices=("vitlab", "timm", "vit5"), default="vitlab", help="layout of OUT (default: vitlab)")
    p.add_argument("--ema", action="store_true", help="with --from vit5: the training checkpoint's model_ema")
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
    p.add_argument("--allow-nonfinite", action="store_true",
                   help="convert weights holding NaN or infinite values (refused by default: a diverged run or a "
                        "damaged file)")
    p.add_argument("--no-verify", dest="verify", action="store_false",
                   help="read a vitlab checkpoint file whose SHA-256 no longer matches its manifest.json (edited on "
                        "purpose)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from vitlab.checkpoint import check_output_path, save_weights
    from vitlab.checkpoint.files import check_new_file
    from vitlab.errors import ConfigError
    from vitlab.interop import from_vit5, load_pretrained, to_timm, to_vit5

    check_new_file(args.output, overwrite=args.overwrite)  # no existing file replaced unasked, none in a run folder
    pth_out = args.to == "vit5" and str(args.output).endswith(".pth")
    if not pth_out:
        check_output_path(args.output)
    overrides = {k: v for k, v in (("img_size", args.img_size), ("patch_size", args.patch_size),
                                   ("in_chans", args.in_chans), ("num_classes", args.num_classes),
                                   ("num_heads", args.num_heads), ("global_pool", args.global_pool)) if v is not None}
    if args.source == "vit5":
        extra = [flag for flag, on in (("--model", args.model), ("--global-pool", args.global_pool),
                                       ("--drop-dist-token", args.drop_dist_token)) if on]
        if extra:
            raise ConfigError(f"{', '.join(extra)} do not apply to --from vit5 (the checkpoint's shapes give the "
                              f"architecture); drop them")
        model = from_vit5(args.input, ema=args.ema, allow_nonfinite=args.allow_nonfinite, **overrides)
    else:
        if args.ema:
            raise ConfigError("--ema reads a ViT-5 training checkpoint's model_ema; use it with --from vit5")
        model = load_pretrained(args.model, args.input, drop_dist_token=args.drop_dist_token, verify=args.verify,
                                allow_nonfinite=args.allow_nonfinite, **overrides)
    cfg = model.cfg
    if args.to == "vit5":
        state = to_vit5(model)
    else:
        state = to_timm(model).state_dict() if args.to == "timm" else model.state_dict()
    if pth_out:
        _save_pth({"model": state}, args.output)
    else:
        save_weights(state, args.output, metadata={"format": args.to, "vitlab_config": json.dumps(cfg.to_dict())})
    params = sum(p.numel() for p in model.parameters())
    print(f"wrote {args.output}: {args.to} layout, {cfg.arch} embed_dim {cfg.embed_dim} depth {cfg.depth} "
          f"heads {cfg.num_heads}, {cfg.img_size}x{cfg.img_size}x{cfg.in_chans} patch {cfg.patch_size}, "
          f"{cfg.num_classes} classes, {params / 1e6:.2f}M parameters")
    return 0


def _save_pth(obj: dict, path: str) -> None:
    """``torch.save`` to ``path`` atomically (a checkpoint the ViT-5 code's ``main.py --finetune`` reads)."""
    from pathlib import Path

    import torch

    from vitlab import atomic
    from vitlab.errors import CheckpointError

    if not Path(path).parent.is_dir():
        raise CheckpointError(f"output directory {Path(path).parent} does not exist; create it first")
    atomic.atomic_write(path, lambda tmp: torch.save(obj, tmp))
