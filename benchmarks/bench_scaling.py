"""Training-step time and peak memory per image against tokens and depth, vitlab and timm, with figures
(benchmarks/bench.py --scaling)."""

from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path

from bench_rows import Row
from bench_runners import Runtime, interleaved, make_runner


def scaling(device: str, args: argparse.Namespace, out_dir: Path) -> dict:
    """Training-step time and peak memory per image against tokens (image size) and depth, vitlab and timm."""
    base = dict(embed_dim=192, num_heads=3, num_classes=10, patch_size=16, in_chans=3)
    sizes = (32, 64) if args.quick else (32, 64, 96, 128, 160, 224)
    depths = (1, 2) if args.quick else (2, 4, 8, 12)
    batch = 4 if args.quick else 16
    rt = Runtime(threads=1 if device == "cpu" else None)  # one thread: robust on a shared machine
    series = {"tokens": [], "depth": []}
    points = [("tokens", dict(base, img_size=s, depth=4 if not args.quick else 1)) for s in sizes]
    points += [("depth", dict(base, img_size=64, depth=d)) for d in depths]
    for axis, ov in points:
        row = Row(f"vit d{ov['depth']} {ov['img_size']}px", "vit_tiny", ov, batch, ("train",), {})
        runners = {}
        try:
            runners = {k: make_runner(k, row, "train", rt, device) for k in ("vitlab", "timm")}
            samples = interleaved(runners, max(1, args.repeats * args.rounds // 3), args.target_s / 2)
            point = {"x": (ov["img_size"] // 16) ** 2 + 1 if axis == "tokens" else ov["depth"]}
            for k, r in runners.items():
                point[k] = {"ms_per_image": statistics.median(samples[k]) * 1e3 / batch,
                            "peak_mb": r.peak_bytes() / 2**20}
        finally:
            for r in runners.values():
                r.close()
        series[axis].append(point)
    series["png"] = plot_scaling(series, out_dir)
    return series


def plot_scaling(series: dict, out_dir: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for axis, xlabel in (("tokens", "tokens (image size / 16, squared, + class)"), ("depth", "blocks")):
        pts = series[axis]
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.6))
        for k, style in (("vitlab", "o-"), ("timm", "s--")):
            xs = [p["x"] for p in pts]
            a1.plot(xs, [p[k]["ms_per_image"] for p in pts], style, label=k)
            a2.plot(xs, [p[k]["peak_mb"] for p in pts], style, label=k)
        a1.set(xlabel=xlabel, ylabel="training step, ms per image", title=f"time against {axis}")
        a2.set(xlabel=xlabel, ylabel="peak tensor memory, MB", title=f"memory against {axis}")
        for a in (a1, a2):
            a.grid(alpha=0.3)
            a.legend()
        fig.tight_layout()
        path = out_dir / f"scaling_{axis}.png"
        tmp = path.with_suffix(".tmp.png")
        fig.savefig(tmp, dpi=110)
        plt.close(fig)
        os.replace(tmp, path)
        paths.append(path.name)
    return paths
