#!/usr/bin/env python
"""The validation-split scans that chose the default models of `vitlab train` on digits and clothing (docs/training.md).

    .venv/bin/python scripts/recipe_scan.py --device cuda --workers 14 --out runs/recipe_scan   # train, then tables
    .venv/bin/python scripts/recipe_scan.py --summarize runs/recipe_scan    # the tables of runs already made

Every arm trains with ``--val-split 0.1`` and is judged on those held-out training images only: the final and the
best validation accuracy and the first epoch at the threshold (97.5 % on mnist-5k, 92.5 % on Fashion-MNIST). The
test set is read once per run, after its last epoch, by ``vitlab train`` itself; its column is reported, never used
to choose. On a GPU the arms run in fp32 (``--amp off``) so that they match what a CPU computes up to rounding; the
epochs of the Fashion-MNIST arms are those that fit 15 minutes of a 2-core CPU at each model's measured speed.

Writes ``runs.csv`` (one row per run) and ``summary.csv`` (per arm: medians over seeds) into ``--out`` (or the
``--summarize`` folder), or into ``--tables`` where given (docs/results/recipe_scan).
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

FASHION_DIR = "/usr/share/datasets/fashion-mnist"
THRESHOLD = {"mnist-5k": 0.975, "fashion-mnist": 0.925}
C32 = ["--model", "vit_mnist_conv_patch14", "--set", "stem_chans=32"]
# the 19-epoch Fashion arms share these options (the clothing default's model and schedule, flips only)
E19 = [*C32, "--depth", "6", "--num-heads", "4", "--warmup-epochs", "1", "--epochs", "19", "--no-augment", "--hflip"]
# arm -> (data set, vitlab train options, seeds)
ARMS: dict[str, tuple[str, list[str], tuple[int, ...]]] = {
    "m_default": ("mnist-5k", ["--model", "vit_mnist"], (0, 1, 2)),
    "m_p14": ("mnist-5k", ["--model", "vit_mnist", "--patch-size", "14"], (0, 1, 2)),
    "m_p14_e100": ("mnist-5k", ["--model", "vit_mnist", "--patch-size", "14", "--epochs", "100"], (0, 1, 2)),
    "m_conv14": ("mnist-5k", ["--model", "vit_mnist_conv_patch14"], (0, 1, 2)),
    "m_conv14_e30": ("mnist-5k", ["--model", "vit_mnist_conv_patch14", "--epochs", "30"], (0, 1, 2)),
    "m_conv14_e100": ("mnist-5k", ["--model", "vit_mnist_conv_patch14", "--epochs", "100"], (0, 1, 2)),
    "m_conv4": ("mnist-5k", ["--model", "vit_mnist_conv"], (0, 1, 2)),
    "m_conv4_e100": ("mnist-5k", ["--model", "vit_mnist_conv", "--epochs", "100"], (0, 1, 2)),
    "f_default_e12": ("fashion-mnist", ["--model", "vit_mnist", "--epochs", "12"], (0, 1)),
    "f_default_e12_lr3": ("fashion-mnist", ["--model", "vit_mnist", "--epochs", "12", "--lr", "3e-3"], (0, 1)),
    "f_default_e30": ("fashion-mnist", ["--model", "vit_mnist", "--epochs", "30"], (0, 1)),
    "f_conv14_e5": ("fashion-mnist", ["--model", "vit_mnist_conv_patch14", "--epochs", "5"], (0, 1)),
    "f_conv14_d4_e6": ("fashion-mnist", ["--model", "vit_mnist_conv_patch14", "--depth", "4", "--epochs", "6"],
                       (0, 1)),
    "f_conv4_e5": ("fashion-mnist", ["--model", "vit_mnist_conv", "--epochs", "5"], (0, 1)),
    "f_p4_e5": ("fashion-mnist", ["--model", "vit_mnist", "--patch-size", "4", "--epochs", "5"], (0, 1)),
    # a narrower stem (32 channels: about twice the images/s of 64 on a 2-core CPU), at the epochs 15 CPU minutes
    # hold; run on the CPU, one seed each so far (docs/results/recipe_scan_cpu)
    "f_c32_e11": ("fashion-mnist", [*C32, "--epochs", "11"], (0,)),
    "f_c32_d6_e12": ("fashion-mnist", [*C32, "--depth", "6", "--drop-path", "0", "--epochs", "12"], (0,)),
    "f_c32_d6_e12_noaug": ("fashion-mnist", [*C32, "--depth", "6", "--epochs", "12", "--no-augment"], (0,)),
    "f_c32_d6_b256_lr3_e14_noaug": ("fashion-mnist", [*C32, "--depth", "6", "--batch-size", "256", "--lr", "3e-3",
                                                      "--epochs", "14", "--no-augment"], (0,)),
    "f_c32_d4_e15_noaug": ("fashion-mnist", [*C32, "--depth", "4", "--epochs", "15", "--no-augment"], (0,)),
    "f_c32_w128_d4_e12_noaug": ("fashion-mnist", [*C32, "--embed-dim", "128", "--num-heads", "4", "--depth", "4",
                                                  "--epochs", "12", "--no-augment"], (0,)),
    # 2026-11-27: 4 heads of 16 and 1 warm-up epoch at the 14 epochs 15 minutes hold, without and with flips
    "f_c32_d6_h4_w1_e14_noaug": ("fashion-mnist", [*C32, "--depth", "6", "--num-heads", "4", "--warmup-epochs", "1",
                                                   "--epochs", "14", "--no-augment"], (0,)),
    "f_c32_d6_h4_w1_e14_hflip": ("fashion-mnist", [*C32, "--depth", "6", "--num-heads", "4", "--warmup-epochs", "1",
                                                   "--epochs", "14", "--no-augment", "--hflip"], (0,)),
    # that arm (the clothing default since 2026-11-27) without label smoothing, and at lr 3e-3
    "f_c32_d6_h4_w1_e14_hflip_ls0": ("fashion-mnist", [*C32, "--depth", "6", "--num-heads", "4", "--warmup-epochs",
                                                       "1", "--epochs", "14", "--no-augment", "--hflip",
                                                       "--label-smoothing", "0"], (0,)),
    "f_c32_d6_h4_w1_e14_hflip_lr3": ("fashion-mnist", [*C32, "--depth", "6", "--num-heads", "4", "--warmup-epochs",
                                                       "1", "--epochs", "14", "--no-augment", "--hflip", "--lr",
                                                       "3e-3"], (0,)),
    # 2026-11-27: the stem in channels-last order (1.16x the images/s) buys 16 epochs in 15 minutes; lr 2e-3 and 3e-3
    "f_c32_d6_h4_w1_e16_hflip_cl": ("fashion-mnist", [*C32, "--depth", "6", "--num-heads", "4", "--warmup-epochs",
                                                      "1", "--epochs", "16", "--no-augment", "--hflip",
                                                      "--channels-last"], (0, 1)),
    "f_c32_d6_h4_w1_e16_hflip_cl_lr3": ("fashion-mnist", [*C32, "--depth", "6", "--num-heads", "4",
                                                          "--warmup-epochs", "1", "--epochs", "16", "--no-augment",
                                                          "--hflip", "--channels-last", "--lr", "3e-3"], (0, 1)),
    # the full runs of that default took 41 s an epoch (651 s for 16): 19 epochs (about 780 s) fit the 15 minutes too
    "f_c32_d6_h4_w1_e19_hflip_cl_lr3": ("fashion-mnist", [*E19, "--channels-last", "--lr", "3e-3"], (0, 1)),
    # batch 256 trains about 1.3x the images/s of batch 128 on 2 cores (fewer, larger steps): 23 epochs at lr 4e-3
    "f_c32_d6_h4_w1_e23_hflip_cl_b256_lr4": ("fashion-mnist", [*C32, "--depth", "6", "--num-heads", "4",
                                                               "--warmup-epochs", "1", "--epochs", "23",
                                                               "--batch-size", "256", "--no-augment", "--hflip",
                                                               "--channels-last", "--lr", "4e-3"], (0, 1)),
    # the 19-epoch default with an exponential moving average of the weights (evaluated with the average)
    "f_c32_d6_h4_w1_e19_hflip_cl_lr3_ema999": ("fashion-mnist", [*E19, "--channels-last", "--lr", "3e-3",
                                                                 "--ema-decay", "0.999"], (0, 1)),
    # that default (with the EMA) and a shift of up to one whole pixel against the over-fitting of the last epochs
    "f_c32_d6_h4_w1_e19_hflip_cl_lr3_ema999_pc1": ("fashion-mnist", [*E19, "--pad-crop", "1", "--channels-last",
                                                                     "--lr", "3e-3", "--ema-decay", "0.999"], (0, 1)),
}
RUN_FIELDS = ["arm", "dataset", "seed", "options", "epochs_planned", "epochs_run", "final_val_acc", "best_val_acc",
              "first_epoch_at_threshold", "threshold", "final_test_acc"]
SUMMARY_FIELDS = ["arm", "dataset", "options", "runs", "complete", "final_val_acc_median", "final_val_acc_min",
                  "final_val_acc_max", "first_epoch_at_threshold_median", "reached", "final_test_acc_median"]


def train_all(out: Path, device: str, workers: int, data_dir: str) -> None:
    """Every arm and seed as its own `vitlab train` process, ``workers`` at a time."""
    out.mkdir(parents=True, exist_ok=True)

    def one(job: tuple[str, str, list[str], int]) -> None:
        arm, dataset, options, seed = job
        cmd = [sys.executable, "-m", "vitlab", "train", *options, "--dataset", dataset, "--val-split", "0.1",
               "--seed", str(seed), "--device", device, "--amp", "off", "--no-progress",
               "--output", str(out / f"{arm}_{seed}")]
        if dataset == "fashion-mnist":
            cmd += ["--data-dir", data_dir]
        with open(out / f"{arm}_{seed}.log", "w") as log:
            subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=False)

    jobs = [(arm, ds, opts, s) for arm, (ds, opts, seeds) in ARMS.items() for s in seeds]
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(one, jobs))


def run_row(arm: str, seed: int, run: Path) -> dict:
    dataset, options, _ = ARMS[arm]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rows = [r for r in rows if "val_acc" in r]
    summary = json.loads((run / "summary.json").read_text()) if (run / "summary.json").exists() else {}
    planned = json.loads((run / "config.json").read_text())["run"]["epochs"]
    threshold = THRESHOLD[dataset]
    first = next((r["epoch"] for r in rows if r["val_acc"] >= threshold), None)
    return {"arm": arm, "dataset": dataset, "seed": seed, "options": " ".join(options), "epochs_planned": planned,
            "epochs_run": rows[-1]["epoch"] if rows else 0,
            "final_val_acc": rows[-1]["val_acc"] if rows else None,
            "best_val_acc": max(r["val_acc"] for r in rows) if rows else None,
            "first_epoch_at_threshold": first, "threshold": threshold,
            "final_test_acc": summary.get("final_test_acc")}


def summarize(runs_dir: Path, tables: Path) -> list[dict]:
    """runs.csv and summary.csv of the runs in ``runs_dir``; a run stopped before its last epoch is listed and
    left out of its arm's medians."""
    rows = [run_row(arm, seed, runs_dir / f"{arm}_{seed}") for arm, (_, _, seeds) in ARMS.items() for seed in seeds
            if (runs_dir / f"{arm}_{seed}" / "metrics.jsonl").exists()]
    summary = []
    for arm in ARMS:
        mine = [r for r in rows if r["arm"] == arm]
        if not mine:
            continue
        done = [r for r in mine if r["epochs_run"] == r["epochs_planned"]]
        vals = [r["final_val_acc"] for r in done]
        # a run that never reached the threshold counts as later than any (the median is empty if half never did)
        firsts = sorted(r["first_epoch_at_threshold"] or float("inf") for r in done)
        first = statistics.median(firsts) if done else None
        tests = [r["final_test_acc"] for r in done if r["final_test_acc"] is not None]
        summary.append({"arm": arm, "dataset": mine[0]["dataset"], "options": mine[0]["options"], "runs": len(mine),
                        "complete": len(done),
                        "final_val_acc_median": statistics.median(vals) if vals else None,
                        "final_val_acc_min": min(vals) if vals else None,
                        "final_val_acc_max": max(vals) if vals else None,
                        "first_epoch_at_threshold_median": None if first in (None, float("inf")) else first,
                        "reached": f"{sum(r['first_epoch_at_threshold'] is not None for r in done)}/{len(done)}",
                        "final_test_acc_median": statistics.median(tests) if tests else None})
    for row in summary:  # medians of accuracies: 5 decimals (a hundredth of a percentage point)
        row.update({k: round(v, 5) for k, v in row.items()
                    if isinstance(v, float) and k != "first_epoch_at_threshold_median"})
    tables.mkdir(parents=True, exist_ok=True)
    for name, fields, data in (("runs.csv", RUN_FIELDS, rows), ("summary.csv", SUMMARY_FIELDS, summary)):
        with open(tables / name, "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=fields, lineterminator="\n")
            writer.writeheader()
            writer.writerows(data)
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("runs/recipe_scan"), help="where the runs go")
    p.add_argument("--summarize", type=Path, metavar="DIR", help="only write the tables of the runs in DIR")
    p.add_argument("--tables", type=Path, help="where the tables go (default: the runs' folder)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--data-dir", default=FASHION_DIR, help="Fashion-MNIST's four idx .gz files")
    args = p.parse_args(argv)
    runs_dir = args.summarize or args.out
    if args.summarize is None:
        train_all(args.out, args.device, args.workers, args.data_dir)
    elif not runs_dir.is_dir():
        print(f"recipe_scan: {runs_dir} is not a folder of runs; give the --out of an earlier scan", file=sys.stderr)
        return 2
    for row in summarize(runs_dir, args.tables or runs_dir):
        print(f"{row['arm']:18s} {row['complete']}/{row['runs']} complete  val {row['final_val_acc_median']}  "
              f"first epoch at threshold {row['first_epoch_at_threshold_median']} ({row['reached']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
