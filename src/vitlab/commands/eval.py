"""``vitlab eval``: loss, accuracy and confusion matrix of a checkpoint on a data set's test split."""

from __future__ import annotations

import argparse

EVAL_FILES = ("confusion_matrix.png",)  # what eval writes into --output


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("eval", help="evaluate a checkpoint on a test set",
                              description="Print test loss and accuracy of a checkpoint (by default on the data "
                              "it was trained on, with the same --limit-test subset) and write "
                              "confusion_matrix.png into the checkpoint folder or --output.")
    p.add_argument("--checkpoint", required=True, metavar="DIR",
                   help="a `vitlab train --output` folder, or its Hub folder (`vitlab export --format hf`)")
    p.add_argument("--dataset", help="data set (default: the one the checkpoint was trained on)")
    p.add_argument("--data-dir", help="local data folder (default: the training run's)")
    p.add_argument("--limit-test", type=int, metavar="N", help="a fixed subset of N test images "
                   "(default: the training run's)")
    p.add_argument("--batch-size", type=int, default=1000)
    p.add_argument("--output", metavar="DIR", help="folder for confusion_matrix.png (default: the checkpoint)")
    p.add_argument("--force", action="store_true",
                   help="write into an --output folder vitlab did not claim (no .vitlab-output.json) although it "
                        "holds a confusion_matrix.png, replacing it")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--model", help="the architecture you expect (preset or timm:NAME); a checkpoint of "
                   "another one is refused")
    p.add_argument("--amp", choices=("auto", "bf16", "off"), help="bf16 autocast (default: as in training)")
    p.add_argument("--no-download", dest="download", action="store_false")
    p.add_argument("--no-verify", dest="verify", action="store_false",
                   help="load a checkpoint file whose SHA-256 no longer matches its manifest.json (edited on purpose)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    import torch

    from vitlab import outputs
    from vitlab.checkpoint import ModelSpec
    from vitlab.data import load_dataset
    from vitlab.errors import ConfigError, DataError
    from vitlab.inference.evaluate import evaluate
    from vitlab.inference.predict import checkpoint_normalization
    from vitlab.interop.hub import load_checkpoint
    from vitlab.plots.confusion import save_confusion_matrix
    from vitlab.train.distributed import pick_device

    if args.batch_size <= 0:
        raise ConfigError(f"--batch-size must be positive, got {args.batch_size}")
    # config.json checked and validated; a Hub folder carries the run's config.json
    model, config = load_checkpoint(args.checkpoint, model=args.model, verify=args.verify)
    if args.output:  # a folder of the user's is refused before any data loads (vitlab.outputs)
        outputs.check(args.output, "eval", EVAL_FILES, force=args.force, runs=True)
    run_cfg = config.get("run") or {}
    img_size, in_chans = ModelSpec.from_dict(config["model"]).input_shape
    dataset = args.dataset or run_cfg.get("dataset")
    if dataset is None:
        raise ConfigError(f"{args.checkpoint} does not say which data it was trained on; pass --dataset")
    same_data = dataset == run_cfg.get("dataset")
    data_dir = args.data_dir or (run_cfg.get("data_dir") if same_data else None)
    limit = args.limit_test or (run_cfg.get("limit_test") if same_data else None)
    _, test = load_dataset(dataset, data_dir=data_dir, img_size=img_size, in_chans=in_chans,
                           download=args.download, limit_train=1, limit_test=limit)  # subset before resizing
    num_classes = getattr(model, "num_classes", None)
    if num_classes and num_classes != len(test.classes):
        raise DataError(f"the checkpoint predicts {num_classes} classes but {dataset} has {len(test.classes)}; "
                        "evaluate on a data set with the classes it was trained on")
    device = pick_device(args.device)
    mean, std = checkpoint_normalization(config, dataset, in_chans)
    model = model.to(device)
    test.images, test.labels = test.images.to(device), test.labels.to(device)
    amp = args.amp or run_cfg.get("amp", "off")
    amp_dtype = torch.bfloat16 if amp == "bf16" or (amp == "auto" and device.type == "cuda") else None
    m = evaluate(model, test, mean=mean, std=std, batch_size=args.batch_size, device=device, amp_dtype=amp_dtype)
    out_dir = Path(args.checkpoint)
    if out_dir.is_file():
        out_dir = out_dir.parent  # the checkpoint's model.safetensors: its run folder
    if args.output:
        out_dir = outputs.claim(args.output, "eval", EVAL_FILES, force=args.force, runs=True)
    png = save_confusion_matrix(out_dir / "confusion_matrix.png", m["confusion"], test.classes,
                                title=f"{dataset} test, accuracy {100 * m['acc']:.2f}%")
    print(f"test_loss {m['loss']:.4f}  test_acc {100 * m['acc']:.2f}%  ({m['count']} images, {dataset} test)")
    print(f"confusion matrix: {png}")
    return 0
