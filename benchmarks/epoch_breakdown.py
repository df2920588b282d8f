"""Where one epoch of the default mnist-5k recipe goes: augmentation, training steps, evaluation.

    .venv/bin/python benchmarks/epoch_breakdown.py             # vit_mnist, 4,000 + 1,000 images, ~30 s
    .venv/bin/python benchmarks/epoch_breakdown.py --quick     # smoke test

It bounds two time-to-accuracy levers: cheaper augmentation can save at most the augmentation's share of an
epoch, and evaluating less often at most the evaluation's share. The pieces are timed as the trainer runs them,
on random images of mnist-5k's shape (uint8 1x28x28, 10 classes; time does not depend on the pixels), one thread:

- **augmentation**: ``BatchPipeline.train_batch`` (normalise + the digits' random affine, per-image parameters,
  one ``grid_sample``) of every batch of 64;
- **training step**: forward, loss with label smoothing, backward, gradient clipping, AdamW step;
- **evaluation**: ``vitlab.inference.evaluate`` of the 1,000 test images (eval mode, no gradients, batch 1,000).

Times are CPU seconds of this thread (``time.thread_time``), not wall seconds: they do not change with the load
other processes put on a shared machine, so the shares hold on a busy one. Median of ``--repeats`` epochs after a
warm-up epoch. Writes ``epoch_breakdown.md`` and ``.json`` into ``--out`` (default benchmarks/results).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

from vitlab.atomic import atomic_path
from vitlab.catalog import CATALOG
from vitlab.data import DataSplit
from vitlab.inference.evaluate import evaluate
from vitlab.models import create_model
from vitlab.perf import cpu_model
from vitlab.train.batches import BatchPipeline
from vitlab.train.config import AUGMENT_DEFAULTS, RunConfig, size_defaults

MNIST5K = CATALOG["mnist-5k"]
MEAN, STD = MNIST5K.mean, MNIST5K.std


def one_epoch(model: nn.Module, opt: torch.optim.Optimizer, pipe: BatchPipeline, train: DataSplit, test: DataSplit,
              batch: int, smoothing: float, clip: float, seed: int) -> dict[str, float]:
    loss_fn = nn.CrossEntropyLoss(label_smoothing=smoothing)
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(train.labels), generator=gen)
    aug = step = 0.0
    model.train()
    for i in range(0, len(order) - batch + 1, batch):
        idx = order[i:i + batch]
        t0 = time.thread_time()
        x, y = pipe.train_batch(train.images[idx], train.labels[idx], gen)
        t1 = time.thread_time()
        loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        t2 = time.thread_time()
        aug, step = aug + t1 - t0, step + t2 - t1
    t0 = time.thread_time()
    evaluate(model, test, mean=MEAN, std=STD, batch_size=1000, device=torch.device("cpu"))
    return {"augmentation": aug, "training step": step, "evaluation": time.thread_time() - t0}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="vit_mnist")
    parser.add_argument("--train", type=int, default=MNIST5K.num_train, help="training images (mnist-5k: 4,000)")
    parser.add_argument("--test", type=int, default=MNIST5K.num_test, help="test images (mnist-5k: 1,000)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="256 + 128 images, 1 repeat")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = parser.parse_args(argv)
    if args.quick:
        args.train, args.test, args.repeats = 256, 128, 1
    torch.set_num_threads(1)
    torch.manual_seed(0)
    recipe = size_defaults(4000)
    cfg = RunConfig(model=args.model, dataset="mnist-5k", **AUGMENT_DEFAULTS["digits"])
    pipe = BatchPipeline(cfg, MEAN, STD, num_classes=MNIST5K.num_classes, in_chans=MNIST5K.in_chans)
    model = create_model(args.model, global_pool="avg")
    opt = torch.optim.AdamW(model.parameters(), lr=recipe["lr"], weight_decay=recipe["weight_decay"])

    def split(n: int) -> DataSplit:
        return DataSplit(torch.randint(0, 256, (n, 1, 28, 28), dtype=torch.uint8), torch.randint(0, 10, (n,)),
                         [str(c) for c in range(10)])

    train, test = split(args.train), split(args.test)
    runs = [one_epoch(model, opt, pipe, train, test, recipe["batch_size"], recipe["label_smoothing"],
                      recipe["clip_grad"], seed) for seed in range(args.repeats + 1)][1:]
    parts = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    total = sum(parts.values())
    result = {"model": args.model, "train_images": args.train, "test_images": args.test,
              "batch_size": recipe["batch_size"], "repeats": args.repeats, "cpu": cpu_model(),
              "torch": torch.__version__, "threads": 1, "cpu_seconds": parts,
              "share": {k: v / total for k, v in parts.items()}, "epoch_cpu_seconds": total}
    lines = [f"# One epoch of {args.model} on mnist-5k's shape, by part",
             "",
             f"`python benchmarks/epoch_breakdown.py`; {result['cpu']}, torch {torch.__version__}, one thread; "
             f"{args.train} training images in batches of {recipe['batch_size']} with the digits' augmentation, "
             f"{args.test} test images; CPU seconds of the thread, median of {args.repeats} epochs after a warm-up.",
             "",
             "| part | CPU s | share of the epoch |",
             "| --- | ---: | ---: |"]
    lines += [f"| {k} | {v:.2f} | {100 * v / total:.1f} % |" for k, v in parts.items()]
    lines += [f"| epoch | {total:.2f} | 100 % |", ""]
    args.out.mkdir(parents=True, exist_ok=True)
    for name, text in (("epoch_breakdown.md", "\n".join(lines)),
                       ("epoch_breakdown.json", json.dumps(result, indent=2) + "\n")):
        with atomic_path(args.out / name) as tmp:
            Path(tmp).write_text(text)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
