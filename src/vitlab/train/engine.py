"""The trainer: :func:`train` runs one training run (one process, or each ``torchrun`` process) as its stages, read
top to bottom:

1. ``plan.py``: every setting of the run decided once, into a frozen plan (:func:`vitlab.train.plan.make_plan`);
2. ``batches.py``: the data the plan names, in memory (:func:`load_run_data`);
3. ``run_model.py``: the model, built once from the plan's spec (:func:`build_run_model`);
4. ``optim.py``: the optimiser and the plan's schedule;
5. ``resume.py``: a resumed run's state restored, the run folder opened;
6. this file: the epochs, each evaluated and saved, and the summary (:class:`Trainer`).

Each stage reads the plan and what the stages before it built; none decides a setting.

Every step reseeds all RNGs from (seed, epoch, step, rank) and every epoch's order is a function of (seed, epoch), so
the same seed gives the same metrics on CPU and ``--resume`` continues bit-exactly from any saved step. SIGINT/SIGTERM
save a resumable checkpoint and stop (exit 130/143). A run diverges when its loss goes non-finite (with
``skip_nonfinite`` the step is skipped instead) or grows past :data:`~vitlab.train.divergence.DIVERGENCE_FACTOR` times
that of a uniform guess: it stops before the next save, so the last good checkpoint is kept, and its ``summary.json``
says ``diverged``.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vitlab import perf, provenance
from vitlab.checkpoint import CONFIG, WEIGHTS, read_weights, save_checkpoint, unwrap, weights_of
from vitlab.data import DataSplit
from vitlab.errors import WriteError
from vitlab.flops import model_macs
from vitlab.inference.evaluate import autocast, evaluate
from vitlab.train.batches import epoch_order, load_run_data
from vitlab.train.config import RunConfig
from vitlab.train.distributed import DistContext, init_distributed, shard
from vitlab.train.divergence import (
    LossDiverged,
    NonFiniteLoss,
    causes,
    diverged_message,
    divergence_limit,
    nonfinite_message,
)
from vitlab.train.logging import RunLogger
from vitlab.train.optim import WarmupCosine, build_optimizer
from vitlab.train.plan import RunPlan, make_plan, request
from vitlab.train.progress import Progress
from vitlab.train.resume import open_run_folder, restore
from vitlab.train.run_model import build_run_model
from vitlab.train.seeding import derive_seed, generator, seed_everything
from vitlab.train.signals import StopRequest

__all__ = ["NonFiniteLoss", "TrainResult", "Trainer", "train"]

AUG_STREAM = 0xA06  # the stream of each step's seed its augmentation draws from


@dataclass
class TrainResult:
    out_dir: Path
    summary: dict[str, Any]
    exit_code: int = 0  # 0, or 128 + signal when stopped by SIGINT/SIGTERM


def train(options: RunConfig | Mapping[str, Any], *, resume: str | Path | None = None,
          init_weights: str | Path | None = None, on_step: Callable[[Trainer], None] | None = None,
          on_epoch: Callable[[int, dict[str, Any]], bool] | None = None, verify: bool = True,
          force: bool = False) -> TrainResult:
    """Train as ``options`` say (one process, or each ``torchrun`` process): a :class:`RunConfig`, or the mapping of
    the options a user gave (:func:`vitlab.train.plan.request`); see :class:`Trainer`.

    ``init_weights`` starts the model from pretrained weights instead of its initialisation: a ``.safetensors`` /
    ``.pth`` file or vitlab checkpoint folder (timm's or vitlab's), or ``hub`` for timm's own weights of a
    ``timm:NAME`` model, adapted to the run's image size, patch size, channels and classes
    (:func:`vitlab.train.run_model.load_init`). ``verify=False`` resumes from a checkpoint whose SHA-256 no longer
    matches its ``manifest.json``. ``force=True`` writes into an output folder without vitlab's marker that holds
    files a run replaces (:mod:`vitlab.outputs`, its run folders).
    """
    req = request(options, resume=resume, init_weights=init_weights, verify=verify)
    ctx = init_distributed(req.run.device)
    try:
        return Trainer(make_plan(req, ctx, force=force), ctx, on_step=on_step, on_epoch=on_epoch).fit()
    finally:
        ctx.close()


class Trainer:
    """One training run of ``plan``: a new one, one continued from the checkpoint it resumes, or one whose model
    starts from its initial weights. ``on_step(trainer)`` is called after every optimiser step (tests, callbacks);
    ``on_epoch(epoch, row)`` after each epoch is evaluated, logged and saved (``row`` as in ``metrics.jsonl``, on
    every process): returning True ends the run there, early, with its summary (``stopped_early``).

    Constructing it runs the stages before the loop, in order; :meth:`fit` runs the loop."""

    def __init__(self, plan: RunPlan, ctx: DistContext, *, on_step: Callable[[Trainer], None] | None = None,
                 on_epoch: Callable[[int, dict[str, Any]], bool] | None = None) -> None:
        run, schedule = plan.run, plan.schedule
        self.plan, self.ctx, self.device, self.on_step, self.on_epoch = plan, ctx, plan.device, on_step, on_epoch
        self.stop, self.stopped_early, self.test_predictions = StopRequest(), False, None
        self.divergence_limit = divergence_limit(plan.data.num_classes)
        if ctx.is_main:
            for warning in plan.warnings:
                print(f"vitlab train: warning: {warning}", file=sys.stderr, flush=True)

        # 2. data, at the input the model takes
        self.data = load_run_data(plan, ctx)

        # 3. model: built once; then the CPU threads the plan chose
        self.model = build_run_model(plan.spec, seed=run.seed, init_weights=plan.init_weights).to(self.device)
        if run.channels_last:  # 4-D tensors (convolution weights) only; everything else stays as it is
            self.model = self.model.to(memory_format=torch.channels_last)
        if plan.threads.threads is not None:
            torch.set_num_threads(plan.threads.threads)
        self.ema = None
        if run.ema_decay:
            from timm.utils import ModelEmaV3

            self.ema = ModelEmaV3(self.model, decay=run.ema_decay)

        # 4. optimiser and schedule (per step)
        self.optimizer = build_optimizer(self.model, lr=schedule.lr, weight_decay=run.weight_decay,
                                         layer_decay=run.layer_decay, optimizer=run.optimizer)
        self.scheduler = WarmupCosine(self.optimizer, lr=schedule.lr, min_lr=schedule.min_lr,
                                      total_steps=schedule.total_steps, warmup_steps=schedule.warmup_steps)

        # 5. checkpoint: a resumed run's state, then the run folder (created and locked by rank 0)
        self.progress = Progress()
        if plan.resume is not None:
            restore(plan.resume, verify=plan.verify, model=self.model, optimizer=self.optimizer,
                    scheduler=self.scheduler, ema=self.ema, progress=self.progress)
        self.lock = open_run_folder(plan.out_dir, plan.resume, ctx)

    # ------------------------------------------------------------------------------------------ checkpoint

    @property
    def eval_model(self) -> nn.Module:
        """The model that is evaluated and saved: the EMA copy when EMA is on."""
        return self.ema.module if self.ema is not None else self.model

    def run_config(self) -> dict[str, Any]:
        return self.plan.record(self.data.classes)

    def train_state(self) -> dict[str, Any]:
        return {"model": weights_of(self.model), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "ema": weights_of(self.ema.module) if self.ema is not None else None,
                "progress": self.progress.to_dict(), "rng": torch.get_rng_state()}

    def save(self) -> None:
        if self.ctx.is_main:
            save_checkpoint(self.plan.out_dir, self.eval_model, run_config=self.run_config(),
                            train_state=self.train_state())
        self.ctx.barrier()

    # ------------------------------------------------------------------------------------------ loop

    def fit(self) -> TrainResult:
        """Train to the last epoch (or a stop), on the CPU with denormal floats flushed to zero unless
        ``flush_denormal=False`` (``--keep-denormals``); the process's previous setting is restored after."""
        flush = self.plan.run.flush_denormal and self.device.type == "cpu"
        with perf.flush_denormals() if flush else contextlib.nullcontext():
            return self._fit()

    def _criterion(self) -> nn.Module:
        return self.data.pipeline.criterion()

    def _wrap(self, model: nn.Module) -> nn.Module:
        """The model as the steps run it: under DDP on several processes, compiled with ``--compile``."""
        if self.ctx.distributed:
            from torch.nn.parallel import DistributedDataParallel

            ids = [self.device.index] if self.device.type == "cuda" else None
            model = DistributedDataParallel(model, device_ids=ids)
        if self.plan.run.compile:
            model = torch.compile(model)
        return model

    def _fit(self) -> TrainResult:
        run, p, out_dir = self.plan.run, self.progress, self.plan.out_dir
        logger = None
        status = "failed"
        try:
            self.criterion = self._criterion()
            self.train_model = self._wrap(self.model)
            self._stop_votes = 0.0
            self._clock = time.perf_counter()
            logger = RunLogger(out_dir, progress=run.progress, completed_epochs=p.epoch, tracker=run.logger,
                               params=self.run_config()) if self.ctx.is_main else None
            if self.ctx.is_main:
                print(self.plan.describe(torch.get_num_threads()), flush=True)
            with self.stop:
                while p.epoch < run.epochs and not self.stopped_early:
                    if not self._run_epoch(logger) and p.epoch < run.epochs:
                        status = "stopped"
                        return self._interrupted()
            summary = self.summary()
            if logger is not None:
                if self.test_predictions is not None:  # of the final test evaluation (none: nothing trained now)
                    provenance.write_predictions(out_dir, self.data.test, self.test_predictions)
                logger.write_summary(summary)
            status = "finished"
            return TrainResult(out_dir, summary)
        except NonFiniteLoss as exc:  # diverged: said in summary.json as well as in the error
            if logger is not None and exc.summary is not None:
                logger.write_summary(exc.summary)
            raise
        except WriteError as exc:  # a full disk: say how to go on once there is space
            saved = (out_dir / CONFIG).is_file()
            then = f"continue with --resume {out_dir}" if saved else "start the run again (no checkpoint yet)"
            raise WriteError(f"{exc}; then {then}") from exc
        finally:
            if logger is not None:
                logger.close(status)
            self.lock.release()

    def _run_epoch(self, logger: RunLogger | None) -> bool:
        """Train the rest of the current epoch, evaluate, log and save; False when a stop was requested."""
        run, p, steps = self.plan.run, self.progress, self.plan.schedule.steps_per_epoch
        epoch = p.epoch
        self._clock = time.perf_counter()
        order = epoch_order(len(self.data.train), run.seed, epoch, repeats=run.repeated_aug or 1).to(self.device)
        bar = logger.bar(epoch=epoch + 1, epochs=run.epochs, total=steps, initial=p.step) if logger else None
        self.train_model.train()
        try:
            while p.step < steps:
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
                if run.checkpoint_every and p.global_step % run.checkpoint_every == 0:
                    self._tick()
                    self.save()
        finally:
            if bar is not None:
                bar.close()
        metrics = self._evaluate(self.data.eval)
        name = self.data.eval_name
        if not metrics["loss"] <= self.divergence_limit:  # NaN too: checked before the save, which would keep it
            raise self._diverged_error(epoch, p.step - 1, metrics["loss"], f"{name} loss after the epoch")
        self._tick()
        row = {"epoch": epoch + 1, "step": p.global_step, "train_loss": p.loss_sum / max(p.seen, 1),
               f"{name}_loss": metrics["loss"], f"{name}_acc": metrics["acc"], "lr": self.scheduler.get_last_lr(),
               "seconds": p.epoch_seconds}
        if run.probe_images and self.ctx.is_main:
            row.update(self._probe_columns())
        p.end_epoch(metrics["loss"], metrics["acc"])
        if logger is not None:
            logger.log_epoch(row)
        self.save()
        self.stopped_early = bool(self.on_epoch is not None and self.on_epoch(epoch + 1, row))
        return not self._stop_agreed(sync=True)

    def _train_step(self, epoch: int, step: int, order: torch.Tensor) -> float:
        run, p, ctx, batch = self.plan.run, self.progress, self.ctx, self.plan.schedule.batch_size
        seed_everything(derive_seed(run.seed, epoch, step, ctx.rank))
        gen = generator(derive_seed(run.seed, epoch, step, ctx.rank, AUG_STREAM))
        idx = shard(order[step * batch:(step + 1) * batch], ctx)
        x, y = self.data.pipeline.train_batch(self.data.train.images[idx], self.data.train.labels[idx], gen)
        if run.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)

        def loss_of(start: int, stop: int) -> torch.Tensor:  # the mean loss of rows start:stop
            with autocast(self.device, self.plan.amp_dtype):
                logits = self.train_model(x[start:stop])
            return self.criterion(logits.float(), y[start:stop])

        self.optimizer.zero_grad(set_to_none=True)
        loss = perf.sliced_backward(loss_of, len(x), self.model.parameters(), self.plan.threads.slices)
        finite = torch.isfinite(loss.detach())
        # the gradient norm is checked even without clipping (max_norm inf scales by exactly 1): a finite loss
        # with NaN/inf gradients would otherwise poison the weights and the next checkpoint
        norm = nn.utils.clip_grad_norm_(self.model.parameters(), run.clip_grad or float("inf"))
        finite = finite & torch.isfinite(norm)
        stats = torch.stack([loss.detach().float() * len(idx), torch.tensor(float(len(idx)), device=loss.device),
                             (~finite).float(), torch.tensor(float(self.stop.requested), device=loss.device)])
        stats = ctx.all_reduce_sum(stats.double()).tolist()
        self._stop_votes = stats[3]
        p.step += 1
        p.global_step += 1
        if stats[2]:
            if not run.skip_nonfinite:
                raise self._nonfinite_error(epoch, step, stats[0] / stats[1])
            p.skipped_steps += 1
            self.scheduler.step()
            return float("nan")
        if stats[0] / stats[1] > self.divergence_limit:
            raise self._diverged_error(epoch, step, stats[0] / stats[1], "training loss")
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

    def _tick(self) -> None:
        """Add the wall time since the last tick to the run's and the epoch's clocks."""
        now = time.perf_counter()
        self.progress.wall_time_s += now - self._clock
        self.progress.epoch_seconds += now - self._clock
        self._clock = now

    # ------------------------------------------------------------------------------------------ measures

    def _evaluate(self, split: DataSplit) -> dict[str, Any]:
        """``evaluate`` on ``split``; a test evaluation also keeps each image's prediction, so the final one is
        written without reading the test set again."""
        on_test = split is self.data.test
        out = evaluate(self.eval_model, split, mean=self.data.mean, std=self.data.std,
                       batch_size=self.plan.run.eval_batch_size, device=self.device, amp_dtype=self.plan.amp_dtype,
                       ctx=self.ctx, slices=self.plan.threads.slices, predictions=on_test)
        if on_test:
            self.test_predictions = out["predictions"]
        return out

    def _probe_columns(self) -> dict[str, float]:
        """The per-layer probes (:mod:`vitlab.analysis.probes`) of the evaluated model on the first ``probe_images``
        training images, unaugmented: the same images every epoch, never test images. Empty for a model without
        vitlab's blocks (timm models)."""
        from vitlab.analysis.probes import probe_model
        from vitlab.data import normalize
        from vitlab.models import VitlabModel

        model = unwrap(self.eval_model)
        if not isinstance(model, VitlabModel):
            return {}
        n = min(self.plan.run.probe_images, len(self.data.train))
        x = normalize(self.data.train.images[:n].to(self.device), self.data.mean, self.data.std)
        return probe_model(model, x, batch_size=min(n, self.plan.run.eval_batch_size)).columns()

    @functools.cached_property
    def machine(self) -> dict[str, str | None]:
        """The ``cpu`` and ``gpu`` keys of the summary, read once per run: the CPU as :func:`vitlab.perf.cpu_id`
        names it, and the CUDA device's name when the run trains on one (else None), so a run's timings say which
        machine they come from. A resumed run records the machine that finished it (this process's), not the one
        that started it: its ``train_time_s`` may add up epochs timed on another machine."""
        gpu = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else None
        return {"cpu": perf.cpu_id(), "gpu": gpu}

    def summary(self) -> dict[str, Any]:
        """The run's numbers; with a validation split the per-epoch figures are ``*_val_*`` and the test set
        is evaluated here, once."""
        p, run, macs = self.progress, self.plan.run, self.plan.cost.macs
        if macs is None:  # a timm model whose plan needed no MACs: counted now, on the trained model
            macs = model_macs(self.model, self.plan.data.img_size, self.plan.data.in_chans)
        judged = {"final_test_acc": p.eval_acc, "final_test_loss": p.eval_loss, "best_test_acc": p.best_eval_acc}
        if self.data.eval_name == "val":
            test = self._evaluate(self.data.test)
            judged = {"final_val_acc": p.eval_acc, "final_val_loss": p.eval_loss, "best_val_acc": p.best_eval_acc,
                      "final_test_acc": test["acc"], "final_test_loss": test["loss"]}
        return {"model": run.model, "dataset": run.dataset, "epochs": p.epoch,
                "steps": p.global_step, **judged, "best_epoch": p.best_epoch,
                "train_images_per_second": p.train_images / max(p.train_time_s, 1e-9),
                "wall_time_s": p.wall_time_s, "train_time_s": p.train_time_s, "train_cpu_s": p.train_cpu_s,
                "params": sum(t.numel() for t in self.model.parameters()), "macs": macs, "flops": 2 * macs,
                "skipped_steps": p.skipped_steps, "world_size": self.ctx.world_size, "device": str(self.device),
                **self.machine, "threads": torch.get_num_threads(), "slices": self.plan.threads.slices,
                "stopped_early": self.stopped_early, **provenance.stamp()}

    # ------------------------------------------------------------------------------------------ endings

    def _where(self, epoch: int, step: int) -> str:
        return f"epoch {epoch + 1} step {step + 1} (global step {self.progress.global_step})"

    def _causes(self) -> str:
        run = self.plan.run
        return causes(run.lr, amp=self.plan.amp_dtype is not None, clip_grad=run.clip_grad, out_dir=self.plan.out_dir)

    def _nonfinite_error(self, epoch: int, step: int, loss: float) -> NonFiniteLoss:
        err = NonFiniteLoss(nonfinite_message(self._where(epoch, step), loss, self._causes()))
        err.summary = self._diverged_summary(epoch, step, str(err))
        return err

    def _diverged_error(self, epoch: int, step: int, loss: float, what: str) -> LossDiverged:
        """The run's loss past :attr:`divergence_limit` (or a non-finite evaluation loss): the weights are wrecked,
        so the summary's figures are those of the last checkpoint, which is kept."""
        err = LossDiverged(diverged_message(self._where(epoch, step), what, loss, self.plan.data.num_classes,
                                            self._causes()))
        if (self.plan.out_dir / CONFIG).exists():
            with contextlib.suppress(Exception):  # figures of the weights the folder keeps, not of the wrecked ones
                unwrap(self.eval_model).load_state_dict(read_weights(self.plan.out_dir / WEIGHTS, verify=False)[0])
        err.summary = self._diverged_summary(epoch, step, str(err))
        return err

    def _diverged_summary(self, epoch: int, step: int, message: str) -> dict[str, Any] | None:
        """:meth:`summary` at a divergence: a non-finite step was not applied, so the weights are the last finite
        ones (after a loss past the limit, those of the kept checkpoint) and the test figures are theirs, evaluated
        now."""
        try:
            out = self.summary()
            if self.data.eval_name != "val":  # summary() evaluated the test set itself otherwise
                test = self._evaluate(self.data.test)
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
            print(f"vitlab train: stopped by {self.stop.name} at epoch {p.epoch + 1} step {p.step}; "
                  f"resumable checkpoint saved in {self.plan.out_dir} (continue with --resume {self.plan.out_dir})",
                  file=sys.stderr, flush=True)
        return TrainResult(self.plan.out_dir, {}, exit_code=self.stop.exit_code)

