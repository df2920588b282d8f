"""``vitlab analyze``: attention collapse, residual ratios, attention maps / rollout and the position-embedding
figure of a checkpoint, on test images, written as PNG + CSV + JSON and an offline ``index.html``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

DEFAULT_DATASET = "mnist-5k"


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "analyze", help="attention collapse, residual ratios, attention maps of a checkpoint",
        description="Analyse a trained model: cross-layer attention similarity (DeepViT), residual ratios (CaiT), "
                    "class-token attention per head and rollout, position-embedding similarity. Writes PNG, CSV, "
                    "summary.json and index.html into --output.")
    p.add_argument("--checkpoint", required=True, metavar="DIR",
                   help="checkpoint folder: model.safetensors + config.json (written by vitlab train)")
    p.add_argument("--output", required=True, metavar="DIR", help="folder for the figures, tables and index.html")
    p.add_argument("--force", action="store_true",
                   help="write into an --output folder vitlab did not claim (no .vitlab-output.json) although it "
                        "holds files of the names the analysis writes, replacing them (a run folder is refused all "
                        "the same)")
    p.add_argument("--dataset", default=None, metavar="NAME",
                   help=f"images to analyse (test split); default: the checkpoint's run dataset or {DEFAULT_DATASET}")
    p.add_argument("--data-dir", default=None, metavar="DIR", help="local data folder (see vitlab.data.load_dataset)")
    p.add_argument("--num-images", type=int, default=64, metavar="N",
                   help="test images averaged over, taken class by class in turn (default 64)")
    p.add_argument("--show", type=int, default=6, metavar="N", help="images drawn in the attention figures (default 6)")
    p.add_argument("--threshold", type=float, default=0.9, metavar="X",
                   help="similarity above which two blocks count as similar (default 0.9)")
    p.add_argument("--layer", type=int, default=None, metavar="I",
                   help="attention layer drawn per head (default: the last the head depends on; CaiT: the last "
                        "class-attention, or the last self-attention when the head average-pools)")
    p.add_argument("--rollout", default="attention", choices=("attention", "gradient"),
                   help="attention rollout (Abnar & Zuidema) or class-specific gradient-weighted rollout "
                        "(Chefer et al.) (default attention)")
    p.add_argument("--head-fusion", default="mean", choices=("mean", "max", "min"),
                   help="how rollout fuses the heads of a layer (default mean)")
    p.add_argument("--discard-ratio", type=float, default=0.0, metavar="X",
                   help="rollout drops the lowest fraction X of each fused map, the class token's own entry "
                        "kept (default 0; vit-explain uses 0.9)")
    p.add_argument("--target-class", type=int, default=None, metavar="C",
                   help="class whose logit gradient rollout explains (default: each image's predicted class)")
    p.add_argument("--show-registers", action="store_true",
                   help="draw the register tokens' share of the row the maps read beside each map and report it per "
                        "layer (attention_registers.png/.csv, summary.json); hidden by default")
    p.add_argument("--batch-size", type=int, default=32, metavar="N", help="images per forward pass (default 32)")
    p.add_argument("--device", default="auto", metavar="DEV",
                   help="cpu, cuda, cuda:1, ... (default: cuda when available)")
    p.add_argument("--no-verify", dest="verify", action="store_false",
                   help="load a checkpoint file whose SHA-256 no longer matches its manifest.json (edited on purpose)")
    p.set_defaults(func=run)


def load_checkpoint(checkpoint: Path, verify: bool = True) -> tuple[Any, dict]:
    """The vitlab model of a checkpoint folder and the ``"run"`` section of its config.json ({} if none)."""
    from vitlab.checkpoint import load_model, read_config
    from vitlab.errors import CheckpointError, ConfigError
    from vitlab.models import VitlabModel

    if not checkpoint.exists():
        raise CheckpointError(f"checkpoint {checkpoint} does not exist; pass --checkpoint the output folder of a "
                              "`vitlab train` run (model.safetensors + config.json)")
    model = load_model(checkpoint, verify=verify)  # config.json checked (unless --no-verify) and validated
    run = read_config(checkpoint, verify=False).get("run")
    if not isinstance(model, VitlabModel):
        raise ConfigError(f"checkpoint {checkpoint} holds a {type(model).__module__.split('.')[0]} "
                          f"{type(model).__name__}, which records no attention maps; analyse a vitlab model "
                          "(timm weights convert with vitlab.interop)")
    return model, run if isinstance(run, dict) else {}


def classes_in_turn(labels: Any, n: int) -> Any:
    """Indices of ``n`` images taken class by class in turn (first of each class, then second, ...), so the
    images drawn cover the classes even when a split is sorted by label."""
    import torch

    rank = torch.empty_like(labels)
    for c in labels.unique():
        idx = (labels == c).nonzero().flatten()
        rank[idx] = torch.arange(len(idx))
    order = torch.argsort(rank * (int(labels.max()) + 1) + labels, stable=True)
    return order[:n]


def command_line(args: argparse.Namespace, dataset: str, data_dir: str | None) -> list[str]:
    """The exact command, every option spelled out with the value used."""
    cmd = ["vitlab", "analyze", "--checkpoint", str(args.checkpoint), "--output", str(args.output),
           "--dataset", dataset]
    if data_dir:
        cmd += ["--data-dir", str(data_dir)]
    cmd += ["--num-images", str(args.num_images), "--show", str(args.show), "--threshold", f"{args.threshold:g}",
            "--batch-size", str(args.batch_size), "--device", args.device]
    if args.layer is not None:
        cmd += ["--layer", str(args.layer)]
    cmd += ["--rollout", args.rollout, "--head-fusion", args.head_fusion, "--discard-ratio", f"{args.discard_ratio:g}"]
    if args.target_class is not None:
        cmd += ["--target-class", str(args.target_class)]
    if getattr(args, "show_registers", False):
        cmd += ["--show-registers"]
    return cmd


def run(args: argparse.Namespace) -> int:
    import torch

    from vitlab import outputs
    from vitlab.analysis import analyze_model
    from vitlab.analysis.analyze import NO_REGISTERS, OUTPUTS
    from vitlab.data import load_dataset, normalization
    from vitlab.errors import ConfigError

    for key in ("num_images", "show", "batch_size"):
        if getattr(args, key) < 1:
            raise ConfigError(f"--{key.replace('_', '-')} must be >= 1, got {getattr(args, key)}")
    checkpoint = Path(args.checkpoint).expanduser()
    model, run_cfg = load_checkpoint(checkpoint, args.verify)
    outputs.check(args.output, "analyze", OUTPUTS, force=args.force)  # before any data loads
    dataset = args.dataset or run_cfg.get("dataset") or DEFAULT_DATASET
    data_dir = args.data_dir or (run_cfg.get("data_dir") if not args.dataset else None)
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"--device {args.device} asks for CUDA but none is available; use --device cpu")
    cfg = model.cfg
    _, test = load_dataset(dataset, data_dir=data_dir, img_size=cfg.img_size, in_chans=cfg.in_chans)
    if len(test) == 0:
        raise ConfigError(f"the test split of {dataset} is empty; pass --dataset / --data-dir with test images")
    pick = classes_in_turn(test.labels, args.num_images)
    mean, std = normalization(dataset, cfg.in_chans)
    result = analyze_model(model.to(device), test.images[pick], args.output, labels=test.labels[pick],
                           classes=test.classes, mean=mean, std=std, threshold=args.threshold, num_show=args.show,
                           layer=args.layer, batch_size=args.batch_size, command=command_line(args, dataset, data_dir),
                           title=f"Analysis of {cfg.name or cfg.arch} ({checkpoint.name}) on {dataset}",
                           method=args.rollout, head_fusion=args.head_fusion, discard_ratio=args.discard_ratio,
                           target_class=args.target_class, show_registers=args.show_registers, force=args.force)
    for g in result.groups:
        print(f"{g.name}: mean cross-layer similarity {g.mean_off_diagonal():.3f}, similar blocks per layer "
              f"{g.similar.tolist()}")
    print(f"maps: {result.summary['attention_readout']}; rollout: {result.summary['rollout']['label']}")
    if args.show_registers:
        reg = result.register_attention
        shares = ", ".join(f"{d['share']:.3f}" for d in reg["layers"]) if reg else ""
        print(f"registers' share per layer: {shares}" if reg else NO_REGISTERS)
    print(f"wrote {len(result.files)} files to {result.out_dir} (open {result.out_dir / 'index.html'})")
    return 0
