"""The training loop: data in memory, batch augmentation, AdamW + warm-up/cosine, checkpoints, resume, DDP.

Every step reseeds all RNGs from (seed, epoch, step, rank) and every epoch's order is a function of
(seed, epoch), so the same seed gives the same metrics on CPU and ``--resume`` continues bit-exactly from
any saved step. SIGINT/SIGTERM save a resumable checkpoint and stop (exit 130/143); a non-finite loss
stops the run (or with ``skip_nonfinite`` skips the step) and keeps the last good checkpoint.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vitlab import perf
from vitlab.checkpoint import (
    CONFIG,
    STATE,
    save_checkpoint,
    weights_of,
)
from vitlab.data import DataSplit, load_dataset, normalization
from vitlab.errors import CheckpointError, ConfigError, WriteError
from vitlab.train.batches import BatchPipeline, epoch_order, holdout, subset
from vitlab.train.config import RunConfig, canonical_dataset
from vitlab.train.distributed import DistContext, check_batch, init_distributed, shard
from vitlab.train.evaluate import autocast, evaluate
from vitlab.train.lock import RunLock, check_free
from vitlab.train.logging import METRICS, RunLogger
from vitlab.train.optim import WarmupCosine, build_optimizer
from vitlab.train.progress import Progress
from vitlab.train.resume import Resume
from vitlab.train.run_model import load_init, model_macs, resolve_run_model, token_count
from vitlab.train.seeding import derive_seed, generator, seed_everything
from vitlab.train.signals import StopRequest

INIT_STREAM, AUG_STREAM = 0x1417, 0xA06
SMALL_MODEL_MACS = 50_000_000  # per image; below it a CPU run uses one thread unless told otherwise


class NonFiniteLoss(ConfigError):
    """The loss (or gradient norm) became NaN or infinite. ``summary``: the run's numbers at that step (the test
    accuracy of its last finite weights, ``diverged`` and where), so a study can keep the divergence as a result;
    None when they could not be taken."""

    summary: dict[str, Any] | None = None


@dataclass
class TrainResult:
    out_dir: Path
    summary: dict[str, Any]
    exit_code: int = 0  # 0, or 128 + signal when stopped by SIGINT/SIGTERM


def train(cfg: RunConfig, *, resume: str | Path | None = None, init_weights: str | Path | None = None,
          on_step: Callable[[Trainer], None] | None = None,
          on_epoch: Callable[[int, dict[str, Any]], bool] | None = None, verify: bool = True) -> TrainResult:
    """Train as ``cfg`` says (one process, or each ``torchrun`` process); see :class:`Trainer`.

    ``init_weights`` starts the model from pretrained weights instead of its initialisation: a ``.safetensors`` /
    ``.pth`` file or vitlab checkpoint folder (timm's or vitlab's), or ``hub`` for timm's own weights of a
    ``timm:NAME`` model, adapted to the run's image size, patch size, channels and classes (:func:`load_init`).
    ``verify=False`` resumes from a ``state.pt`` whose SHA-256 no longer matches its ``manifest.json``.
    """
    ctx = init_distributed(cfg.device)
    try:
        return Trainer(cfg, ctx, resume=resume, init_weights=init_weights, on_step=on_step, on_epoch=on_epoch,
                       verify=verify).fit()
    finally:
        ctx.close()


def default_output(cfg: RunConfig) -> Path:
    name = cfg.model.replace(":", "-").replace("/", "-")
    return Path("runs") / f"{name}_{cfg.dataset}_{time.strftime('%Y%m%d-%H%M%S')}"


class Trainer:
    """One training run: a new one, one continued from the checkpoint in ``resume``, or one whose model starts
    from ``init_weights``. ``on_step(trainer)`` is called after every optimiser step (tests, callbacks);
    ``on_epoch(epoch, row)`` after each epoch is evaluated, logged and saved (``row`` as in ``metrics.jsonl``,
    on every process): returning True ends the run there, early, with its summary (``stopped_early``)."""

    def __init__(self, cfg: RunConfig, ctx: DistContext, *, resume: str | Path | None = None,
                 init_weights: str | Path | None = None, on_step: Callable[[Trainer], None] | None = None,
                 on_epoch: Callable[[int, dict[str, Any]], bool] | None = None, verify: bool = True) -> None:
        self.ctx, self.on_step, self.on_epoch, self.stop = ctx, on_step, on_epoch, StopRequest()
        self.stopped_early = False
        self.device = ctx.device
        cfg = cfg.replace(dataset=canonical_dataset(cfg.dataset))
        cfg.validate()  # out-of-range numbers and a missing tracking backend: refused before any data loads
        if resume is not None and init_weights is not None:
            raise ConfigError("a resumed run continues from its own weights; drop the initial weights, or start a new "
                              "run with another --output")
        resumed = Resume.load(resume, verify) if resume is not None else None
        run_model = resolve_run_model(cfg)  # the model config, resolved once; the model is built once, below
        self.out_dir = self._output_dir(cfg, resume)
        if not ctx.is_main:  # rank 0 downloads first
            ctx.barrier()
        img_size, in_chans = run_model.img_size, run_model.in_chans
        train_split, test_split = load_dataset(cfg.dataset, data_dir=cfg.data_dir, img_size=img_size,
                                               in_chans=in_chans, download=cfg.download and ctx.is_main)
        if ctx.is_main:
            ctx.barrier()
        train_split, test_split = subset(train_split, cfg.limit_train), subset(test_split, cfg.limit_test)
        train_split, val_split = holdout(train_split, fraction=cfg.val_split, size=cfg.val_size)
        cfg = cfg.resolve(len(train_split))
        run_model = run_model.with_recipe(cfg)
        cfg = cfg.replace(model_overrides=run_model.overrides)  # what the checkpoint stores
        check_batch(cfg.batch_size, ctx)
        self.steps_per_epoch = len(train_split) // cfg.batch_size
        if self.steps_per_epoch == 0:
            raise ConfigError(f"--batch-size {cfg.batch_size} is larger than the {len(train_split)} training "
                              f"images; use --batch-size {len(train_split)} or less")
        self.cfg = cfg
        self.classes = list(train_split.classes)
        self.mean, self.std = normalization(cfg.dataset, in_chans)
        self.data_info = {"classes": self.classes, "mean": list(self.mean), "std": list(self.std),
                          "img_size": img_size, "in_chans": in_chans, "num_train": len(train_split),
                          "num_test": len(test_split)}
        if val_split is not None:
            self.data_info["num_val"] = len(val_split)

        torch.manual_seed(derive_seed(cfg.seed, INIT_STREAM))
        model = run_model.spec_for(len(self.classes)).build()
        self.model = model.to(self.device)
        self.slices = self._plan_cpu(cfg)
        self.train_data = self._to_device(train_split)
        self.test_data = self._to_device(test_split)
        # what each epoch is judged on: the held-out validation images when there are some, else the test set
        self.eval_name = "test" if val_split is None else "val"
        self.eval_data = self.test_data if val_split is None else self._to_device(val_split)
        self.pipeline = BatchPipeline(cfg, self.mean, self.std, len(self.classes), in_chans)
        self.optimizer = build_optimizer(self.model, lr=cfg.lr, weight_decay=cfg.weight_decay,
                                         layer_decay=cfg.layer_decay)
        total = cfg.epochs * self.steps_per_epoch
        self.scheduler = WarmupCosine(self.optimizer, lr=cfg.lr, min_lr=cfg.min_lr, total_steps=total,
                                      warmup_steps=round(cfg.warmup_epochs * self.steps_per_epoch))
        self.ema = None
        if cfg.ema_decay:
            from timm.utils import ModelEmaV3

            self.ema = ModelEmaV3(self.model, decay=cfg.ema_decay)
        self.criterion = self._criterion()
        self.amp_dtype = torch.bfloat16 if cfg.amp == "bf16" or (cfg.amp == "auto" and self.device.type == "cuda") \
            else None
        self.progress = Progress()
        self._stop_votes = 0.0
        self._clock = time.perf_counter()
        if resumed is not None:
            self._restore(resumed)
        elif init_weights is not None:
            self._load_init(init_weights)
        self.train_model = self._wrap(self.model)
        self._prepare_output(resume)

    # ------------------------------------------------------------------------------------------ setup

    def _plan_cpu(self, cfg: RunConfig) -> int:
        """Set the CPU threads and return the number of concurrent batch slices (``vitlab.perf``).

        Slices: ``--slices``, else one per core (``perf.cpu_plan``) for a small model in one process when
        the batch splits into slices of at least 256 tokens, the model draws its randomness only through
        vitlab's DropPath, has no batch norm, and neither ``--threads`` nor ``--compile`` is given; else 1.
        Threads: ``--threads``, else one per slice when slicing, else ``OMP_NUM_THREADS`` when set, else one
        thread for small models (below :data:`SMALL_MODEL_MACS`, whose tiny matmuls gain nothing from intra-op
        threads and lose much on a busy machine) and the cores shared among the local processes for bigger
        ones."""
        if self.device.type != "cpu":
            if cfg.slices and cfg.slices > 1:
                raise ConfigError(f"--slices {cfg.slices} is a CPU option; drop it on {self.device}")
            return 1
        macs = model_macs(self.model, self.data_info) or 0
        slices = cfg.slices or 1
        self.model.train()  # the random and batch-coupled layers are judged as a training step runs them
        why_not = None
        if self.ctx.distributed:
            why_not = "under torchrun each process is one slice"
        elif cfg.compile:
            why_not = "a compiled model runs one slice"
        elif not perf.rng_is_thread_safe(self.model):
            why_not = "the model has dropout, whose random draws would depend on thread timing"
        elif perf.batch_coupled(self.model):
            why_not = "the model has batch norm, whose statistics span the whole batch"
        if cfg.slices and cfg.slices > 1 and why_not:
            raise ConfigError(f"--slices {cfg.slices}: {why_not}; use --slices 1")
        tokens = token_count(self.model)
        if cfg.slices is None and not why_not and not cfg.threads and macs < SMALL_MODEL_MACS and tokens:
            slices = perf.cpu_plan(cfg.batch_size, tokens).slices
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        elif slices > 1:
            torch.set_num_threads(max(1, perf.cpu_cores() // slices))
        elif "OMP_NUM_THREADS" not in os.environ:
            local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
            torch.set_num_threads(1 if macs < SMALL_MODEL_MACS else max(1, (os.cpu_count() or 1) // local))
        return slices

    def _to_device(self, split: DataSplit) -> DataSplit:
        return DataSplit(split.images.to(self.device), split.labels.to(self.device), split.classes)

    def _criterion(self) -> nn.Module:
        if self.pipeline.soft_targets:
            from timm.loss import SoftTargetCrossEntropy

            return SoftTargetCrossEntropy()
        return nn.CrossEntropyLoss(label_smoothing=self.cfg.label_smoothing)

    def _wrap(self, model: nn.Module) -> nn.Module:
        if self.ctx.distributed:
            from torch.nn.parallel import DistributedDataParallel

            ids = [self.device.index] if self.device.type == "cuda" else None
            model = DistributedDataParallel(model, device_ids=ids)
        if self.cfg.compile:
            model = torch.compile(model)
        return model

    def _output_dir(self, cfg: RunConfig, resume: str | Path | None) -> Path:
        """The output folder (the same on every process); refuses to overwrite another run's checkpoint."""
        out = Path(cfg.output) if cfg.output else (Path(resume) if resume else default_output(cfg))
        out = Path(self.ctx.broadcast_object(str(out)))
        if self.ctx.is_main:
            check_free(out)  # a live run writes there: refuse before loading any data
        if resume is None and (out / CONFIG).exists():
            raise ConfigError(f"{out} already holds a checkpoint; continue it with --resume {out}, or pick "
                              "another --output (or delete the folder)")
        return out

    def _prepare_output(self, resume: str | Path | None) -> None:
        """Create the output folder and take its lock (rank 0, the only writer; released when :meth:`fit` ends)."""
        self.lock = RunLock(self.out_dir)
        if not self.ctx.is_main:
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.lock.acquire()
        if resume is not None and Path(resume).resolve() != self.out_dir.resolve():
            src = Path(resume) / METRICS
            if src.is_file():
                shutil.copyfile(src, self.out_dir / METRICS)

    def _load_init(self, init_weights: str | Path) -> None:
        """Start from pretrained weights (adapted to this model by :func:`load_init`), the EMA copy too."""
        load_init(self.model, str(init_weights))
        if self.ema is not None:
            self.ema.module.load_state_dict(self.model.state_dict())

    def _restore(self, resumed: Resume) -> None:
        state, resume = resumed.state, resumed.path
        resumed.check_architecture(self.model)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.ema is not None:
            if state.get("ema") is None:
                raise CheckpointError(f"{resume}/{STATE} has no EMA weights but this run uses --ema-decay; "
                                      "resume with --ema-decay 0")
            self.ema.module.load_state_dict(state["ema"])
        self.progress.restore(state["progress"])

    # ------------------------------------------------------------------------------------------ state

    @property
    def eval_model(self) -> nn.Module:
        """The model that is evaluated and saved: the EMA copy when EMA is on."""
        return self.ema.module if self.ema is not None else self.model

    def run_config(self) -> dict[str, Any]:
        return {**self.cfg.to_dict(), "data": self.data_info}

    def train_state(self) -> dict[str, Any]:
        return {"model": weights_of(self.model), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "ema": weights_of(self.ema.module) if self.ema is not None else None,
                "progress": self.progress.to_dict(), "rng": torch.get_rng_state()}

    def save(self) -> None:
        if self.ctx.is_main:
            save_checkpoint(self.out_dir, self.eval_model, run_config=self.run_config(),
                            train_state=self.train_state())
        self.ctx.barrier()

    # ------------------------------------------------------------------------------------------ loop

    def fit(self) -> TrainResult:
        """Train to the last epoch (or a stop), on the CPU with denormal floats flushed to zero unless
        ``flush_denormal=False`` (``--keep-denormals``); the process's previous setting is restored after."""
        flush = self.cfg.flush_denormal and self.device.type == "cpu"
        with perf.flush_denormals() if flush else contextlib.nullcontext():
            return self._fit()

    def _fit(self) -> TrainResult:
        cfg, p = self.cfg, self.progress
        logger = None
        status = "failed"
        try:
            logger = RunLogger(self.out_dir, progress=cfg.progress, completed_epochs=p.epoch, tracker=cfg.logger,
                               params=self.run_config()) if self.ctx.is_main else None
            if self.ctx.is_main:
                self._announce()
            with self.stop:
                while p.epoch < cfg.epochs and not self.stopped_early:
                    if not self._run_epoch(logger) and p.epoch < cfg.epochs:
                        status = "stopped"
                        return self._interrupted()
            summary = self.summary()
            if logger is not None:
                logger.write_summary(summary)
            status = "finished"
            return TrainResult(self.out_dir, summary)
        except WriteError as exc:  # a full disk: say how to go on once there is space
            saved = (self.out_dir / CONFIG).is_file()
            then = f"continue with --resume {self.out_dir}" if saved else "start the run again (no checkpoint yet)"
            raise WriteError(f"{exc}; then {then}") from exc
        finally:
            if logger is not None:
                logger.close(status)
            self.lock.release()

    def _announce(self) -> None:
        c, d = self.cfg, self.data_info
        params = sum(t.numel() for t in self.model.parameters())
        where = f"{self.device}" + (f" x {self.ctx.world_size} processes" if self.ctx.distributed else "")
        if self.slices > 1:
            threads = torch.get_num_threads()
            where += f" ({self.slices} slices x {threads} thread{'s' * (threads > 1)})"
        print(f"vitlab train: {c.model} ({params / 1e6:.2f}M params) on {c.dataset} ({d['num_train']} train / "
              f"{d['num_test']} test, {d['in_chans']}x{d['img_size']}x{d['img_size']}), {c.epochs} epochs x "
              f"{self.steps_per_epoch} steps of {c.batch_size}, lr {c.lr:g}, {where}; output {self.out_dir}",
              flush=True)

    def _run_epoch(self, logger: RunLogger | None) -> bool:
        """Train the rest of the current epoch, evaluate, log and save; False when a stop was requested."""
        cfg, p = self.cfg, self.progress
        epoch = p.epoch
        self._clock = time.perf_counter()
        order = epoch_order(len(self.train_data), cfg.seed, epoch).to(self.device)
        bar = logger.bar(epoch=epoch + 1, epochs=cfg.epochs, total=self.steps_per_epoch, initial=p.step) \
            if logger else None
        self.train_model.train()
        try:
            while p.step < self.steps_per_epoch:
                start, cpu = time.perf_counter(), time.process_time()
                loss = self._train_step(epoch, p.step, order)
                p.train_time_s += time.perf_counter() - start
                if p.train_cpu_s is not None:
                    p.train_cpu_s += time.process_time() - cpu
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(loss=f"{loss:.4f}", lr=f"{self.scheduler.get_last_lr():.2e}",
                                    img_s=f"{p.train_images / max(p.train_time_s, 1e-9):.0f}", refresh=False)
                if self.on_step is not None:
                    self.on_step(self)
                if self._stop_agreed():
                    self._tick()
                    self.save()
                    return False
                if cfg.checkpoint_every and p.global_step % cfg.checkpoint_every == 0:
                    self._tick()
                    self.save()
        finally:
            if bar is not None:
                bar.close()
        metrics = self._evaluate(self.eval_data)
        self._tick()
        name = self.eval_name
        row = {"epoch": epoch + 1, "step": p.global_step, "train_loss": p.loss_sum / max(p.seen, 1),
               f"{name}_loss": metrics["loss"], f"{name}_acc": metrics["acc"], "lr": self.scheduler.get_last_lr(),
               "seconds": p.epoch_seconds}
        p.end_epoch(metrics["loss"], metrics["acc"])
        if logger is not None:
            logger.log_epoch(row)
        self.save()
        self.stopped_early = bool(self.on_epoch is not None and self.on_epoch(epoch + 1, row))
        return not self._stop_agreed(sync=True)

    def _evaluate(self, split: DataSplit) -> dict[str, Any]:
        return evaluate(self.eval_model, split, mean=self.mean, std=self.std, batch_size=self.cfg.eval_batch_size,
                        device=self.device, amp_dtype=self.amp_dtype, ctx=self.ctx, slices=self.slices)

    def _tick(self) -> None:
        """Add the wall time since the last tick to the run's and the epoch's clocks."""
        now = time.perf_counter()
        self.progress.wall_time_s += now - self._clock
        self.progress.epoch_seconds += now - self._clock
        self._clock = now

    def _train_step(self, epoch: int, step: int, order: torch.Tensor) -> float:
        cfg, p, ctx = self.cfg, self.progress, self.ctx
        seed_everything(derive_seed(cfg.seed, epoch, step, ctx.rank))
        gen = generator(derive_seed(cfg.seed, epoch, step, ctx.rank, AUG_STREAM))
        idx = shard(order[step * cfg.batch_size:(step + 1) * cfg.batch_size], ctx)
        x, y = self.pipeline.train_batch(self.train_data.images[idx], self.train_data.labels[idx], gen)

        def loss_of(start: int, stop: int) -> torch.Tensor:  # the mean loss of rows start:stop
            with autocast(self.device, self.amp_dtype):
                logits = self.train_model(x[start:stop])
            return self.criterion(logits.float(), y[start:stop])

        self.optimizer.zero_grad(set_to_none=True)
        loss = perf.sliced_backward(loss_of, len(x), self.model.parameters(), self.slices)
        finite = torch.isfinite(loss.detach())
        # the gradient norm is checked even without clipping (max_norm inf scales by exactly 1): a finite loss
        # with NaN/inf gradients would otherwise poison the weights and the next checkpoint
        norm = nn.utils.clip_grad_norm_(self.model.parameters(), cfg.clip_grad or float("inf"))
        finite = finite & torch.isfinite(norm)
        stats = torch.stack([loss.detach().float() * len(idx), torch.tensor(float(len(idx)), device=loss.device),
                             (~finite).float(), torch.tensor(float(self.stop.requested), device=loss.device)])
        stats = ctx.all_reduce_sum(stats.double()).tolist()
        self._stop_votes = stats[3]
        p.step += 1
        p.global_step += 1
        if stats[2]:
            if not cfg.skip_nonfinite:
                raise self._nonfinite_error(epoch, step, stats[0] / stats[1])
            p.skipped_steps += 1
            self.scheduler.step()
            return float("nan")
        self.optimizer.step()
        self.scheduler.step()
        if self.ema is not None:
            self.ema.update(self.model, step=p.global_step)
        p.loss_sum += stats[0]
        p.seen += stats[1]
        p.train_images += stats[1]
        return stats[0] / stats[1]

    def _stop_agreed(self, sync: bool = False) -> bool:
        """Every process stops at the same step once any of them got a signal (the votes travel with each
        step's metrics; ``sync`` all-reduces them now, at an epoch end)."""
        if not self.ctx.distributed:
            return self.stop.requested
        if sync:
            votes = torch.tensor([float(self.stop.requested)], dtype=torch.float64, device=self.device)
            self._stop_votes = self.ctx.all_reduce_sum(votes).item()
        return bool(self._stop_votes)

    def _nonfinite_error(self, epoch: int, step: int, loss: float) -> NonFiniteLoss:
        cfg = self.cfg
        causes = [f"a learning rate too high (--lr {cfg.lr:g}; try {cfg.lr / 4:g})"]
        if self.amp_dtype is not None:
            causes.append("low-precision overflow (try --amp off)")
        if not cfg.clip_grad:
            causes.append("no gradient clipping (try --clip-grad 1.0)")
        where = f"epoch {epoch + 1} step {step + 1} (global step {self.progress.global_step})"
        kept = f"the last good checkpoint in {self.out_dir} is kept" if (self.out_dir / CONFIG).exists() \
            else "no checkpoint was saved yet"
        what = f"loss ({loss})" if not math.isfinite(loss) else f"gradient norm (loss {loss:.4g})"
        err = NonFiniteLoss(f"non-finite {what} at {where}; likely {' or '.join(causes)}; {kept}; "
                            "--skip-nonfinite skips such steps instead")
        err.summary = self._diverged_summary(epoch, step, str(err))
        return err

    def _diverged_summary(self, epoch: int, step: int, message: str) -> dict[str, Any] | None:
        """:meth:`summary` at a divergence: the failed step was not applied, so the weights are the last finite
        ones and the test figures are theirs, evaluated now."""
        try:
            out = self.summary()
            if self.eval_name != "val":  # summary() evaluated the test set itself otherwise
                test = self._evaluate(self.test_data)
                out.update(final_test_acc=test["acc"], final_test_loss=test["loss"],
                           best_test_acc=max(out.get("best_test_acc") or 0.0, test["acc"]))
        except Exception:  # noqa: BLE001 - the divergence is the error to report, not a failure to describe it
            return None
        return {**out, "diverged": True, "diverged_at": {"epoch": epoch + 1, "step": step + 1,
                                                         "global_step": self.progress.global_step},
                "error": message}

    def _interrupted(self) -> TrainResult:
        p = self.progress
        if self.ctx.is_main:
            import sys

            print(f"vitlab train: stopped by {self.stop.name} at epoch {p.epoch + 1} step {p.step}; "
                  f"resumable checkpoint saved in {self.out_dir} (continue with --resume {self.out_dir})",
                  file=sys.stderr, flush=True)
        return TrainResult(self.out_dir, {}, exit_code=self.stop.exit_code)

    def summary(self) -> dict[str, Any]:
        """The run's numbers; with a validation split the per-epoch figures are ``*_val_*`` and the test set
        is evaluated here, once."""
        p = self.progress
        macs = model_macs(self.model, self.data_info)
        judged = {"final_test_acc": p.test_acc, "final_test_loss": p.test_loss, "best_test_acc": p.best_test_acc}
        if self.eval_name == "val":
            test = self._evaluate(self.test_data)
            judged = {"final_val_acc": p.test_acc, "final_val_loss": p.test_loss, "best_val_acc": p.best_test_acc,
                      "final_test_acc": test["acc"], "final_test_loss": test["loss"]}
        return {"model": self.cfg.model, "dataset": self.cfg.dataset, "epochs": p.epoch,
                "steps": p.global_step, **judged, "best_epoch": p.best_epoch,
                "train_images_per_second": p.train_images / max(p.train_time_s, 1e-9),
                "wall_time_s": p.wall_time_s, "train_time_s": p.train_time_s, "train_cpu_s": p.train_cpu_s,
                "params": sum(t.numel() for t in self.model.parameters()), "macs": macs,
                "flops": 2 * macs if macs is not None else None, "skipped_steps": p.skipped_steps,
                "world_size": self.ctx.world_size, "device": str(self.device), "threads": torch.get_num_threads(),
                "slices": self.slices, "stopped_early": self.stopped_early}
