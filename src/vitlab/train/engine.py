"""The trainer: :func:`train` runs one training run (one process, or each ``torchrun`` process) as its stages, in
the order of this package's files:

1. ``config.py``: the config checked, its model config resolved once, the output folder (:func:`settle`);
2. ``batches.py``: the data at the model's input, and the recipe its size implies (:func:`load_run_data`);
3. ``run_model.py``: the model, built once (:func:`build_run_model`), and its cost per image;
4. ``optim.py``: AdamW and the warm-up + cosine schedule;
5. ``resume.py``: a resumed run's state restored, the run folder opened;
6. ``loop.py``: the epochs, each evaluated and saved, and the summary (:class:`~vitlab.train.loop.Loop`).

Each stage uses only what the stages before it decided. The CPU threads and batch slices are planned where
performance is decided (:func:`vitlab.perf.plan_training`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from vitlab import perf
from vitlab.train.batches import load_run_data
from vitlab.train.config import RunConfig, settle
from vitlab.train.distributed import DistContext, init_distributed
from vitlab.train.loop import Loop, NonFiniteLoss, TrainResult
from vitlab.train.optim import WarmupCosine, build_optimizer
from vitlab.train.progress import Progress
from vitlab.train.resume import open_run_folder, restore
from vitlab.train.run_model import build_run_model, model_macs, token_count
from vitlab.train.signals import StopRequest

__all__ = ["NonFiniteLoss", "TrainResult", "Trainer", "train"]


def train(cfg: RunConfig, *, resume: str | Path | None = None, init_weights: str | Path | None = None,
          on_step: Callable[[Trainer], None] | None = None,
          on_epoch: Callable[[int, dict[str, Any]], bool] | None = None, verify: bool = True,
          force: bool = False) -> TrainResult:
    """Train as ``cfg`` says (one process, or each ``torchrun`` process); see :class:`Trainer`.

    ``init_weights`` starts the model from pretrained weights instead of its initialisation: a ``.safetensors`` /
    ``.pth`` file or vitlab checkpoint folder (timm's or vitlab's), or ``hub`` for timm's own weights of a
    ``timm:NAME`` model, adapted to the run's image size, patch size, channels and classes
    (:func:`vitlab.train.run_model.load_init`). ``verify=False`` resumes from a ``state.pt`` whose SHA-256 no
    longer matches its ``manifest.json``. ``force=True`` writes into an output folder without vitlab's marker that
    holds files a run replaces (:mod:`vitlab.train.output`).
    """
    ctx = init_distributed(cfg.device)
    try:
        return Trainer(cfg, ctx, resume=resume, init_weights=init_weights, on_step=on_step, on_epoch=on_epoch,
                       verify=verify, force=force).fit()
    finally:
        ctx.close()


class Trainer(Loop):
    """One training run: a new one, one continued from the checkpoint in ``resume``, or one whose model starts
    from ``init_weights``. ``on_step(trainer)`` is called after every optimiser step (tests, callbacks);
    ``on_epoch(epoch, row)`` after each epoch is evaluated, logged and saved (``row`` as in ``metrics.jsonl``,
    on every process): returning True ends the run there, early, with its summary (``stopped_early``).

    Constructing it runs the stages before the loop, in order; :meth:`fit` runs the loop."""

    def __init__(self, cfg: RunConfig, ctx: DistContext, *, resume: str | Path | None = None,
                 init_weights: str | Path | None = None, on_step: Callable[[Trainer], None] | None = None,
                 on_epoch: Callable[[int, dict[str, Any]], bool] | None = None, verify: bool = True,
                 force: bool = False) -> None:
        self.ctx, self.device, self.on_step, self.on_epoch = ctx, ctx.device, on_step, on_epoch
        self.stop, self.stopped_early = StopRequest(), False

        # 1. config: checked (out-of-range numbers, a missing tracking backend) before any data loads
        cfg, run_model, self.out_dir = settle(cfg, ctx, resume=resume, init_weights=init_weights, force=force)

        # 2. data, at the input the model takes; the recipe of the training set's size completes the config
        self.data, self.cfg, run_model = load_run_data(cfg, run_model, ctx)
        cfg = self.cfg

        # 3. model: built once, for the data's classes; its cost per image plans the CPU threads
        model = build_run_model(run_model, len(self.data.classes), seed=cfg.seed, init_weights=init_weights)
        self.model = model.to(self.device)
        if cfg.channels_last:  # 4-D tensors (convolution weights) only; everything else stays as it is
            self.model = self.model.to(memory_format=torch.channels_last)
        macs, tokens = model_macs(self.model, self.data.info), token_count(self.model)
        self.slices = perf.plan_training(self.model, self.device, batch_size=cfg.batch_size, slices=cfg.slices,
                                         threads=cfg.threads, compile=cfg.compile,
                                         distributed=ctx.distributed, macs=macs, tokens=tokens)
        self.ema = None
        if cfg.ema_decay:
            from timm.utils import ModelEmaV3

            self.ema = ModelEmaV3(self.model, decay=cfg.ema_decay)
        self.amp_dtype = torch.bfloat16 if cfg.amp == "bf16" or (cfg.amp == "auto" and self.device.type == "cuda") \
            else None

        # 4. optimiser and schedule (per step)
        self.optimizer = build_optimizer(self.model, lr=cfg.lr, weight_decay=cfg.weight_decay,
                                         layer_decay=cfg.layer_decay, optimizer=cfg.optimizer)
        steps = self.data.steps_per_epoch
        self.scheduler = WarmupCosine(self.optimizer, lr=cfg.lr, min_lr=cfg.min_lr, total_steps=cfg.epochs * steps,
                                      warmup_steps=round(cfg.warmup_epochs * steps))

        # 5. checkpoint: a resumed run's state, then the run folder (created and locked by rank 0)
        self.progress = Progress()
        if resume is not None:
            restore(resume, verify=verify, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler,
                    ema=self.ema, progress=self.progress, cfg=cfg)
        self.lock = open_run_folder(self.out_dir, resume, ctx)
