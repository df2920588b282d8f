"""``vitlab train``: train a preset (with overrides) or a timm model on a data set; see docs/training.md."""

from __future__ import annotations

import argparse
import os
from typing import Any

# CLI flag -> ModelConfig field (timm: keyword argument)
MODEL_FLAGS = ("img_size", "patch_size", "in_chans", "depth", "embed_dim", "num_heads", "mlp_ratio", "gate", "attn",
               "block", "reg_tokens")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("train", help="train a model on a data set",
                              description="Train a vitlab preset or a timm model. Recipe options left unset take "
                              "the defaults of the data set size (docs/training.md); a --config YAML file sets "
                              "any option and flags override it.")
    S = argparse.SUPPRESS
    g = p.add_argument_group("model")
    g.add_argument("--model", default=S, help="preset name (vitlab models) or timm:NAME (default: "
                   "vit_mnist_conv_patch14 on digits, vit_fashion_conv_patch14 with its own recipe (19 epochs, "
                   "EMA, flip, 1-pixel shift) on clothing, vit_mnist elsewhere; docs/training.md)")
    g.add_argument("--img-size", type=int, default=S)
    g.add_argument("--patch-size", type=int, default=S)
    g.add_argument("--in-chans", type=int, default=S)
    g.add_argument("--depth", type=int, default=S)
    g.add_argument("--embed-dim", type=int, default=S)
    g.add_argument("--num-heads", type=int, default=S)
    g.add_argument("--mlp-ratio", type=float, default=S)
    g.add_argument("--gate", default=S,
                   help="none | layerscale | rezero | skipinit | scalar | depth_mup | fixup | tfixup")
    g.add_argument("--block", default=S, help="prenorm | postnorm | deepnorm | parallel (ViT block layout)")
    g.add_argument("--reg-tokens", type=int, default=S, metavar="N", help="N register tokens (Darcet et al. 2024), "
                   "left out of the pooling")
    g.add_argument("--attn", default=S, help="mhsa | talking_heads | reattention")
    g.add_argument("--drop-path", type=float, default=S, help="stochastic depth rate (the model's drop_path_rate)")
    g.add_argument("--drop-path-rule", choices=("uniform", "linear"), default=S)
    g.add_argument("--set", action="append", default=S, metavar="KEY=VALUE",
                   help="any ModelConfig field (timm: model keyword), e.g. --set global_pool=avg; repeatable")
    g = p.add_argument_group("data")
    g.add_argument("--dataset", default=S, help="mnist | fashion-mnist | cifar10 | cifar100 | mnist-5k (default) "
                   "| imagefolder")
    g.add_argument("--data-dir", default=S, help="local data folder (offline MNIST .gz files, cifar, imagefolder)")
    g.add_argument("--no-download", dest="download", action="store_false", default=S)
    g.add_argument("--limit-train", type=int, default=S, metavar="N", help="train on a fixed subset of N images")
    g.add_argument("--limit-test", type=int, default=S, metavar="N", help="test on a fixed subset of N images")
    g.add_argument("--stratify", action="store_true", default=S,
                   help="draw --limit-train/--limit-test and the --val-split/--val-size hold-out per class, each "
                        "class keeping its share (a fixed draw, the same on every machine)")
    g.add_argument("--val-split", type=float, default=S, metavar="F",
                   help="hold out a fixed fraction F of the training images and evaluate on them every epoch; "
                   "the test set is then evaluated once, at the end (tune on this, not on the test set)")
    g.add_argument("--val-size", type=int, default=S, metavar="N", help="as --val-split, N images")
    g = p.add_argument_group("recipe (unset: the data set's defaults)")
    g.add_argument("--recipe", choices=("default", "deit3"), default=S,
                   help="named defaults over the data set's: deit3 is DeiT III's (LAMB, BCE, mixup/cutmix, 3-Augment, "
                        "repeated augmentation, LayerScale; docs/training.md#the-deit-iii-recipe); flags still win")
    g.add_argument("--optimizer", choices=("adamw", "lamb"), default=S, help="default adamw")
    g.add_argument("--loss", choices=("ce", "bce"), default=S, help="ce (cross-entropy, default) | bce (binary)")
    g.add_argument("--repeated-aug", type=int, default=S, metavar="N",
                   help="repeated augmentation: each image N times per epoch (DeiT: 3; 1: off)")
    g.add_argument("--epochs", type=int, default=S)
    g.add_argument("--batch-size", type=int, default=S, help="global batch size (over all processes)")
    g.add_argument("--lr", type=float, default=S, help="peak learning rate")
    g.add_argument("--min-lr", type=float, default=S)
    g.add_argument("--weight-decay", type=float, default=S)
    g.add_argument("--warmup-epochs", type=float, default=S)
    g.add_argument("--label-smoothing", type=float, default=S)
    g.add_argument("--clip-grad", type=float, default=S, help="max gradient norm (0: off)")
    g.add_argument("--ema-decay", type=float, default=S, help="EMA of the weights (0: off), e.g. 0.999")
    g.add_argument("--layer-decay", type=float, default=S, help="layer-wise lr decay (BEiT/timm), e.g. 0.75 (off)")
    g = p.add_argument_group("augmentation (unset: the data set's defaults)")
    g.add_argument("--degrees", type=float, default=S)
    g.add_argument("--scale", type=float, nargs=2, default=S, metavar=("LOW", "HIGH"))
    g.add_argument("--shear", type=float, default=S)
    g.add_argument("--translate", type=float, default=S)
    g.add_argument("--erase-prob", type=float, default=S)
    g.add_argument("--hflip", action=argparse.BooleanOptionalAction, default=S)
    g.add_argument("--pad-crop", type=int, default=S)
    g.add_argument("--trivial-augment", action=argparse.BooleanOptionalAction, default=S,
                   help="torchvision TrivialAugmentWide per image (RGB data)")
    g.add_argument("--three-augment", action=argparse.BooleanOptionalAction, default=S,
                   help="DeiT III's 3-Augment: one of grayscale / solarize / blur per image")
    g.add_argument("--color-jitter", type=float, default=S, help="brightness/contrast/saturation jitter (0: off)")
    g.add_argument("--mixup", type=float, default=S, help="mixup alpha (0: off)")
    g.add_argument("--cutmix", type=float, default=S, help="cutmix alpha (0: off)")
    g.add_argument("--no-augment", action="store_true", default=S, help="switch every augmentation off")
    g = p.add_argument_group("run")
    g.add_argument("--config", default=S, help="YAML file of run options; flags override it")
    g.add_argument("--output", default=S, help="output folder (default runs/MODEL_DATASET_TIME)")
    g.add_argument("--resume", default=S, metavar="DIR", help="continue the run saved in DIR exactly")
    g.add_argument("--dry-run", action="store_true", default=S,
                   help="print the run's plan (every option resolved, the data, the schedule, the threads) and its "
                        "estimated cost, then stop: nothing is trained or written, no folder created")
    g.add_argument("--force", action="store_true", default=S,
                   help="write into an --output folder that is not a vitlab run folder (no vitlab config.json) "
                        "although it holds files a run replaces (metrics.jsonl, summary.json, state.pt...)")
    g.add_argument("--no-verify", dest="verify", action="store_false", default=S,
                   help="--resume from a state.pt whose SHA-256 no longer matches its manifest.json (edited on "
                        "purpose)")
    g.add_argument("--seed", type=int, default=S)
    g.add_argument("--device", default=S, help="auto (default) | cpu | cuda | cuda:N")
    g.add_argument("--amp", choices=("auto", "bf16", "off"), default=S, help="auto: bf16 autocast on CUDA")
    g.add_argument("--compile", action="store_true", default=S, help="torch.compile the model")
    g.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=S,
                   help="keep a convolutional stem's weights and the images in channels-last (NHWC) memory order, "
                        "as timm's --channels-last (faster convolutions on CPUs and GPUs; on in the clothing "
                        "default recipe, used when no --model is given)")
    g.add_argument("--threads", type=int, default=S, help="torch CPU threads (per slice)")
    g.add_argument("--slices", type=int, default=S, metavar="N",
                   help="CPU: split each batch into N slices computed at once on N threads (default: one per "
                   "core for small models when the batch splits evenly; 1 when --threads is given)")
    g.add_argument("--keep-denormals", dest="flush_denormal", action="store_false", default=S,
                   help="CPU: compute denormal floats exactly (default: flush them to zero, which keeps late "
                   "epochs from slowing down; vitlab.perf.flush_denormals)")
    g.add_argument("--eval-batch-size", type=int, default=S)
    g.add_argument("--checkpoint-every", type=int, default=S, metavar="N", help="also save every N steps")
    g.add_argument("--skip-nonfinite", action="store_true", default=S, help="skip steps with a NaN/inf loss")
    g.add_argument("--probe-images", type=int, default=S, metavar="N",
                   help="log the per-layer probes (vitlab.analysis.probes) every epoch, on the first N training "
                   "images (default 0: off)")
    g.add_argument("--no-progress", dest="progress", action="store_false", default=S)
    g.add_argument("--logger", default=S, metavar="NAME", help="also track the run in tensorboard | mlflow | wandb "
                   "(default none: metrics.jsonl and summary.json only); docs/training.md#tracking")
    p.set_defaults(func=run)


def cli_options(args: argparse.Namespace) -> dict[str, Any]:
    """The run options given on the command line (and in --config), CLI winning, as RunConfig fields."""
    from vitlab.train.config import NO_AUGMENT, load_yaml, parse_set

    given = dict(vars(args))
    for key in ("func", "command", "config", "resume", "verify", "force", "dry_run"):
        given.pop(key, None)
    options = load_yaml(args.config) if getattr(args, "config", None) else {}
    overrides = dict(options.get("model_overrides") or {})
    overrides.update(parse_set(given.pop("set", [])))
    for key in MODEL_FLAGS:
        if key in given:
            overrides[key] = given.pop(key)
    if given.pop("no_augment", False):
        options.update(NO_AUGMENT)
    if "scale" in given:
        given["scale"] = tuple(given["scale"])
    options.update(given)
    if overrides:
        options["model_overrides"] = overrides
    return options


def run(args: argparse.Namespace) -> int:
    from vitlab.train.engine import train

    options = cli_options(args)
    resume, verify, force = getattr(args, "resume", None), getattr(args, "verify", True), getattr(args, "force", False)
    if getattr(args, "dry_run", False):
        return dry_run(options, resume=resume, verify=verify, force=force)
    result = train(options, resume=resume, verify=verify, force=force)
    if result.exit_code or os.environ.get("RANK", "0") != "0":
        return result.exit_code
    s = result.summary
    if "final_val_acc" in s:
        print(f"final val_acc {100 * s['final_val_acc']:.2f}% (best {100 * s['best_val_acc']:.2f}% at epoch "
              f"{s['best_epoch']}); test set, read once at the end: test_acc {100 * s['final_test_acc']:.2f}%, "
              f"test_loss {s['final_test_loss']:.4f}; {s['train_images_per_second']:.0f} train images/s, "
              f"{s['wall_time_s']:.1f} s; outputs in {result.out_dir}")
        return 0
    print(f"final test_acc {100 * s['final_test_acc']:.2f}% (best {100 * s['best_test_acc']:.2f}% at epoch "
          f"{s['best_epoch']}), test_loss {s['final_test_loss']:.4f}, {s['train_images_per_second']:.0f} train "
          f"images/s, {s['wall_time_s']:.1f} s; outputs in {result.out_dir}")
    return 0


def dry_run(options: dict[str, Any], *, resume: str | None, verify: bool, force: bool) -> int:
    """Print the plan a run of ``options`` would train (its first line, then the plan in full) without training."""
    import sys

    from vitlab.train.plan import plan_run

    plan = plan_run(options, resume=resume, verify=verify, force=force)
    for warning in plan.warnings:
        print(f"vitlab train: warning: {warning}", file=sys.stderr, flush=True)
    print(f"{plan.describe()} (dry run: nothing is trained or written)")
    for line in plan.lines():
        print(f"  {line}")
    return 0
