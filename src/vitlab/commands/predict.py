"""``vitlab predict``: the top-k classes of image files under a checkpoint."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("predict", help="classify image files with a checkpoint",
                              description="Print the top-k classes and probabilities of each image (PNG, JPEG, "
                              "... of any size or mode; converted and resized as the model expects).")
    p.add_argument("--checkpoint", required=True, metavar="DIR", help="a `vitlab train --output` folder")
    p.add_argument("images", nargs="+", metavar="IMAGE")
    p.add_argument("--topk", type=int, default=5, metavar="K")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--no-verify", dest="verify", action="store_false",
                   help="load a checkpoint file whose SHA-256 no longer matches its manifest.json (edited on purpose)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from vitlab.checkpoint import load_model, read_config
    from vitlab.errors import ConfigError
    from vitlab.train.distributed import pick_device
    from vitlab.train.predict import predict_files

    if args.topk <= 0:
        raise ConfigError(f"--topk must be a positive integer, got {args.topk}")
    config = read_config(args.checkpoint)
    model = load_model(args.checkpoint, verify=args.verify)
    results = predict_files(model, config, args.images, k=args.topk, device=pick_device(args.device))
    for path, top in zip(args.images, results):
        print(f"{path}: " + ", ".join(f"{name} ({p:.4f})" for name, p in top))
    return 0
