"""``vitlab predict``: the top-k classes of image files under a checkpoint."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("predict", help="classify image files with a checkpoint",
                              description="Print the top-k classes and probabilities of each image (PNG, JPEG, "
                              "... of any size or mode; converted and resized as the model expects). A folder stands "
                              "for the image files in it and its sub-folders. A file that cannot be read is named "
                              "on stderr with the reason, one line each, and the others are still predicted; the "
                              "exit status is then 2 (0 when every file was predicted).")
    p.add_argument("--checkpoint", required=True, metavar="DIR",
                   help="a `vitlab train --output` folder, or its Hub folder (`vitlab export --format hf`)")
    p.add_argument("images", nargs="+", metavar="IMAGE", help="image files, or folders of them (searched "
                   "recursively; hidden files and links to folders skipped)")
    p.add_argument("--topk", type=int, default=5, metavar="K")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--strict", action="store_true",
                   help="stop at the first file that cannot be read (exit 2; the files before it are printed)")
    p.add_argument("--no-verify", dest="verify", action="store_false",
                   help="load a checkpoint file whose SHA-256 no longer matches its manifest.json (edited on purpose)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import sys

    from vitlab.errors import ConfigError, DataError
    from vitlab.inference.predict import iter_predictions, shown
    from vitlab.interop.hub import load_checkpoint
    from vitlab.train.distributed import pick_device

    if args.topk <= 0:
        raise ConfigError(f"--topk must be a positive integer, got {args.topk}")
    # config.json checked (unless --no-verify) and validated; a Hub folder carries the run's config.json
    model, config = load_checkpoint(args.checkpoint, verify=args.verify)
    failed = 0
    results = iter_predictions(model, config, args.images, k=args.topk, device=pick_device(args.device))
    for path, top in results:
        if isinstance(top, DataError):  # one line each, on stderr; the other files go on
            failed += 1
            print(f"vitlab predict: error: {shown(str(top))}", file=sys.stderr, flush=True)
            if args.strict:
                results.close()
                break
            continue
        print(f"{shown(str(path))}: " + ", ".join(f"{name} ({p:.4f})" for name, p in top), flush=True)
    return 2 if failed else 0
