#!/usr/bin/env python
"""Time to accuracy on mnist-5k: vitlab's default recipe against a tuned timm recipe, interleaved in one run.

    .venv/bin/python benchmarks/time_to_accuracy.py                 # 3 seeds, both sides (~15-30 min, 2 cores)
    .venv/bin/python benchmarks/time_to_accuracy.py --seeds 0 --timm-epochs 100
    .venv/bin/python benchmarks/time_to_accuracy.py --quick         # a smoke test: tiny data, 2 epochs each

vitlab runs ``vitlab train`` with no recipe option (the defaults a user gets: ``vit_mnist`` on mnist-5k). timm
runs its ``VisionTransformer`` at the same size (28x28x1, patch 7, dim 64, 8 blocks, 8 heads, MLP 4, average
pooling, drop-path 0.1) with the recipe written out below in this file (AdamW lr 2e-3, weight decay 0.05 on
matrices only, 3 warm-up epochs then cosine per step, label smoothing 0.1, clipping 1.0, batch 128, one random
affine per image applied to the batch as tensors). Both train on the same 4,000 digits, evaluate on the same
1,000 after every epoch, and each seed runs vitlab then timm back to back, so machine load hits both alike.

Time is the wall time of training plus the per-epoch evaluations, summed epoch by epoch (start-up and data
loading excluded); "time to X %" is that sum at the first epoch whose test accuracy reaches X %. Writes
``time_to_accuracy.md`` and ``time_to_accuracy.json`` into ``--out`` (default benchmarks/results/).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from vitlab.data import load_dataset, normalization, normalize
from vitlab.perf import cpu_model
from vitlab.train.batches import subset
from vitlab.train.config import RunConfig
from vitlab.train.engine import train

THRESHOLDS = (0.975, 0.98)
RESULTS = Path(__file__).resolve().parent / "results"

# the tuned timm recipe (per the issue that asked for this benchmark)
TIMM_MODEL = dict(img_size=28, patch_size=7, in_chans=1, num_classes=10, embed_dim=64, depth=8, num_heads=8,
                  mlp_ratio=4.0, global_pool="avg", drop_path_rate=0.1)
TIMM_RECIPE = dict(lr=2e-3, weight_decay=0.05, warmup_epochs=3, label_smoothing=0.1, clip_grad=1.0, batch_size=128,
                   min_lr=1e-5, degrees=12.0, scale=(0.9, 1.1), shear=8.0, translate=0.12)


def load_average() -> float | None:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None


# ---------------------------------------------------------------------------------------------------- timm side


def random_affine(x: torch.Tensor, gen: torch.Generator, r: dict[str, Any]) -> torch.Tensor:
    """One random rotation/scale/x-shear/shift per image of a (B, C, H, W) float batch, as one grid_sample."""
    b = len(x)
    u = torch.rand(b, 5, generator=gen) * 2 - 1  # (B, 5) in [-1, 1)
    angle, shear = torch.deg2rad(u[:, 0] * r["degrees"]), torch.deg2rad(u[:, 2] * r["shear"])
    lo, hi = r["scale"]
    s = (lo + hi) / 2 + u[:, 1] * (hi - lo) / 2
    cos, sin, tan = torch.cos(angle), torch.sin(angle), torch.tan(shear)
    fwd = torch.stack([torch.stack([cos * s, (cos * tan - sin) * s], 1),
                       torch.stack([sin * s, (sin * tan + cos) * s], 1)], 1)  # (B, 2, 2) output <- input map
    inv = torch.linalg.inv(fwd)
    shift = (u[:, 3:5] * r["translate"] * 2).unsqueeze(-1)  # (B, 2, 1) in normalised [-1, 1] units
    theta = torch.cat([inv, -inv @ shift], dim=2).to(x.device)  # (B, 2, 3), drawn on the CPU generator
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


def run_timm(seed: int, epochs: int, data: dict[str, Any], threads: int,
             device: str = "cpu") -> list[dict[str, float]]:
    """Train timm's ViT with :data:`TIMM_RECIPE`; one row (epoch, test_acc, seconds) per epoch."""
    from timm.models.vision_transformer import VisionTransformer
    from timm.optim import param_groups_weight_decay

    r = TIMM_RECIPE
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    model = VisionTransformer(**TIMM_MODEL).to(device)
    groups = param_groups_weight_decay(model, r["weight_decay"], no_weight_decay_list=model.no_weight_decay())
    opt = torch.optim.AdamW(groups, lr=r["lr"])
    xtr, ytr, xte, yte = (data[k].to(device) for k in ("x_train", "y_train", "x_test", "y_test"))
    steps = len(xtr) // r["batch_size"]
    total, warm = epochs * steps, r["warmup_epochs"] * steps

    def lr_at(step: int) -> float:
        if step < warm:
            return r["lr"] * (step + 1) / warm
        t = (step - warm) / max(1, total - warm)
        return r["min_lr"] + 0.5 * (r["lr"] - r["min_lr"]) * (1 + math.cos(math.pi * t))

    gen = torch.Generator().manual_seed(seed)
    rows, step = [], 0
    for epoch in range(epochs):
        start = time.perf_counter()
        model.train()
        order = torch.randperm(len(xtr), generator=gen).to(device)
        for i in range(steps):
            idx = order[i * r["batch_size"]:(i + 1) * r["batch_size"]]
            x = random_affine(xtr[idx], gen, r)
            for group in opt.param_groups:
                group["lr"] = lr_at(step)
            loss = F.cross_entropy(model(x), ytr[idx], label_smoothing=r["label_smoothing"])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), r["clip_grad"])
            opt.step()
            step += 1
        model.eval()
        with torch.no_grad():
            correct = sum(int((model(xte[i:i + 1000]).argmax(1) == yte[i:i + 1000]).sum())
                          for i in range(0, len(xte), 1000))
        if device != "cpu":
            torch.cuda.synchronize()
        rows.append({"epoch": epoch + 1, "test_acc": correct / len(xte), "seconds": time.perf_counter() - start})
    return rows


def mnist5k_tensors(limit_train: int | None, limit_test: int | None) -> dict[str, Any]:
    train_split, test_split = load_dataset("mnist-5k", img_size=28, in_chans=1)
    train_split, test_split = subset(train_split, limit_train), subset(test_split, limit_test)
    mean, std = normalization("mnist-5k", 1)
    return {"x_train": normalize(train_split.images, mean, std), "y_train": train_split.labels,
            "x_test": normalize(test_split.images, mean, std), "y_test": test_split.labels}


# -------------------------------------------------------------------------------------------------- vitlab side


def run_vitlab(seed: int, epochs: int | None, limit_train: int | None, limit_test: int | None,
               workdir: Path, device: str = "cpu") -> tuple[list[dict[str, float]], dict[str, Any]]:
    """``vitlab train`` with the defaults (only the seed, the device, and the smoke test's sizes, are set)."""
    cfg = RunConfig(seed=seed, epochs=epochs, limit_train=limit_train, limit_test=limit_test, progress=False,
                    device=device, output=str(workdir / f"vitlab_seed{seed}"))
    result = train(cfg)
    rows = [json.loads(line) for line in (result.out_dir / "metrics.jsonl").read_text().splitlines()]
    recipe = json.loads((result.out_dir / "config.json").read_text())["run"]
    return ([{"epoch": r["epoch"], "test_acc": r["test_acc"], "seconds": r["seconds"]} for r in rows],
            {k: recipe[k] for k in ("epochs", "batch_size", "lr", "warmup_epochs", "model_overrides")})


# ------------------------------------------------------------------------------------------------------ summary


def milestones(rows: list[dict[str, float]]) -> dict[str, Any]:
    """Seconds and epochs until each threshold is first reached (None if never), final and best accuracy."""
    out: dict[str, Any] = {"final_acc": rows[-1]["test_acc"], "best_acc": max(r["test_acc"] for r in rows),
                           "epochs": len(rows), "total_s": sum(r["seconds"] for r in rows)}
    for t in THRESHOLDS:
        elapsed, hit = 0.0, None
        for r in rows:
            elapsed += r["seconds"]
            if r["test_acc"] >= t:
                hit = (elapsed, r["epoch"])
                break
        out[f"s_to_{t}"], out[f"epoch_to_{t}"] = (hit if hit else (None, None))
    return out


def spread(values: list[float | None]) -> str:
    """``median (min-max)`` over seeds; a value not reached counts as infinitely late."""
    if not values:
        return "-"
    got = sorted(math.inf if v is None else v for v in values)
    fmt = lambda v: "never" if math.isinf(v) else f"{v:.1f}"  # noqa: E731
    return f"{fmt(statistics.median(got))} ({fmt(got[0])}-{fmt(got[-1])})"


def markdown(report: dict[str, Any]) -> str:
    sides = report["sides"]
    lines = [
        "# Time to accuracy on mnist-5k: vitlab's default recipe against tuned timm",
        "",
        f"Command: `{report['command']}`  ",
        f"Machine: {report['cpu']}, {report['cores']} cores, device {report['device']}, torch {report['torch']}; "
        f"load average {report['load_before']} before, {report['load_after']} after (other processes share the "
        "cores; both sides ran interleaved, seed by seed, each run in a fresh process, so load hits them alike).",
        "",
        "Seconds are training plus per-epoch evaluation, summed epoch by epoch; median (min-max) over seeds "
        f"{', '.join(map(str, report['seeds']))}.",
        "",
        "| recipe | epochs | s to 97.5 % | epoch to 97.5 % | s to 98 % | final acc (%) | best acc (%) | total s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, side in sides.items():
        m = side["milestones"]
        col = {key: spread([x[key] for x in m]) for key in ("s_to_0.975", "epoch_to_0.975", "s_to_0.98", "total_s")}
        pct = {key: spread([100 * x[key] for x in m]) for key in ("final_acc", "best_acc")}
        lines.append(f"| {name} | {m[0]['epochs']} | {col['s_to_0.975']} | {col['epoch_to_0.975']} | "
                     f"{col['s_to_0.98']} | {pct['final_acc']} | {pct['best_acc']} | {col['total_s']} |")
    ratio = report.get("speedup_to_97.5")
    lines += ["", f"Speed-up to 97.5 % (timm's median seconds / vitlab's): "
              f"{'not reached by both' if ratio is None else f'{ratio:.2f}x'}.", "",
              f"vitlab recipe (the defaults): `{json.dumps(sides.get('vitlab', {}).get('recipe'))}`  ",
              f"timm recipe: `{json.dumps(TIMM_RECIPE)}`, model `{json.dumps(TIMM_MODEL)}`", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--timm-epochs", type=int, default=60, help="timm's schedule length (60: 97.6 %% in reference)")
    ap.add_argument("--timm-threads", type=int, default=os.cpu_count() or 1,
                    help="torch threads of the timm side (default: one per core, as torch does)")
    ap.add_argument("--vitlab-epochs", type=int, default=None, help="default: the recipe's own")
    ap.add_argument("--device", default="cpu", help="cpu (default) | cuda | cuda:N, for both sides")
    ap.add_argument("--only", choices=("vitlab", "timm"), default=None, help="run one side only")
    ap.add_argument("--quick", action="store_true", help="smoke test: 256/100 images, 1 epoch, the first seed")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--one", nargs=3, metavar=("SIDE", "SEED", "JSON"), default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    limit_train = limit_test = None
    if args.quick:
        args.seeds, args.timm_epochs, args.vitlab_epochs = args.seeds[:1], 1, 1
        limit_train, limit_test = 256, 100
    if args.one is not None:  # one run, in this (fresh) process, written to JSON for the parent
        side, seed, out = args.one[0], int(args.one[1]), Path(args.one[2])
        one: dict[str, Any] = {}
        if side == "vitlab":
            one["rows"], one["recipe"] = run_vitlab(seed, args.vitlab_epochs, limit_train, limit_test, out.parent,
                                                    args.device)
        else:
            one["rows"] = run_timm(seed, args.timm_epochs, mnist5k_tensors(limit_train, limit_test),
                                   args.timm_threads, args.device)
        out.write_text(json.dumps(one))
        return 0
    sides = [s for s in ("vitlab", "timm") if args.only in (None, s)]
    report: dict[str, Any] = {
        "command": " ".join(["python", "benchmarks/time_to_accuracy.py", *(sys.argv[1:] if argv is None else argv)]),
        "cpu": cpu_model(), "cores": os.cpu_count(), "torch": torch.__version__, "seeds": args.seeds,
        "device": torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else "cpu",
        "load_before": load_average(), "sides": {s: {"runs": [], "milestones": []} for s in sides}}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            for side in sides:
                # each run in a fresh process: sides sharing a process disturb each other's OpenMP thread state
                out = Path(tmp) / f"{side}_{seed}.json"
                cmd = [sys.executable, str(Path(__file__).resolve()), "--one", side, str(seed), str(out),
                       "--timm-epochs", str(args.timm_epochs), "--timm-threads", str(args.timm_threads),
                       "--device", args.device] + (["--vitlab-epochs", str(args.vitlab_epochs)]
                                                   if args.vitlab_epochs else []) + (["--quick"] if args.quick else [])
                subprocess.run(cmd, check=True)
                one = json.loads(out.read_text())
                if side == "vitlab":
                    report["sides"]["vitlab"]["recipe"] = one["recipe"]
                rows = one["rows"]
                report["sides"][side]["runs"].append({"seed": seed, "rows": rows})
                report["sides"][side]["milestones"].append(milestones(rows))
                m = report["sides"][side]["milestones"][-1]
                print(f"{side} seed {seed}: final {100 * m['final_acc']:.2f} %, 97.5 % after "
                      f"{m['s_to_0.975']} s (epoch {m['epoch_to_0.975']}), total {m['total_s']:.0f} s, load "
                      f"{load_average()}", flush=True)
    report["load_after"] = load_average()
    if len(sides) == 2:
        med = {s: [x["s_to_0.975"] for x in report["sides"][s]["milestones"]] for s in sides}
        if all(v is not None for vals in med.values() for v in vals):
            report["speedup_to_97.5"] = statistics.median(med["timm"]) / statistics.median(med["vitlab"])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "time_to_accuracy.json").write_text(json.dumps(report, indent=1) + "\n")
    (args.out / "time_to_accuracy.md").write_text(markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
