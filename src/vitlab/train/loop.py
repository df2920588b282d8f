"""The training loop, the last stage of a run: epochs of reseeded steps, an evaluation and a checkpoint after each,
and the run's summary.

Every step reseeds all RNGs from (seed, epoch, step, rank) and every epoch's order is a function of
(seed, epoch), so the same seed gives the same metrics on CPU and ``--resume`` continues bit-exactly from
any saved step. SIGINT/SIGTERM save a resumable checkpoint and stop (exit 130/143). A run diverges when its loss
goes non-finite (with ``skip_nonfinite`` the step is skipped instead) or grows past :data:`DIVERGENCE_FACTOR` times
that of a uniform guess: it stops before the next save, so the last good checkpoint is kept, and its
``summary.json`` says ``diverged``.

Its length (about 435 lines) is the loop read in one sitting, from the epoch to the step to the summary; the
divergence rule lives in :mod:`vitlab.train.divergence`, the evaluation in :mod:`vitlab.train.evaluate`.
"""

from __future__ import annotations

import contextlib
import functools
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vitlab import perf, provenance
from vitlab.checkpoint import CONFIG, WEIGHTS, read_weights, save_checkpoint, unwrap, weights_of
from vitlab.data import DataSplit
from vitlab.errors import WriteError
from vitlab.train.batches import RunData, epoch_order
from vitlab.train.config import RunConfig
from vitlab.train.distributed import DistContext, shard
from vitlab.train.divergence import DIVERGENCE_FACTOR, LossDiverged, NonFiniteLoss
from vitlab.train.evaluate import autocast, evaluate
from vitlab.train.lock import RunLock
from vitlab.train.logging import RunLogger
from vitlab.train.optim import WarmupCosine
from vitlab.train.progress import Progress
from vitlab.train.run_model import announced_model, model_macs
from vitlab.train.seeding import derive_seed, generator, seed_everything
from vitlab.train.signals import StopRequest

AUG_STREAM = 0xA06  # the stream of each step's seed its augmentation draws from

@dataclass
class TrainResult:
    out_dir: Path
    summary: dict[str, Any]
    exit_code: int = 0  # 0, or 128 + signal when stopped by SIGINT/SIGTERM


class Loop:
    """The loop of a :class:`vitlab.train.engine.Trainer`, which sets up what it runs on (the attributes below)."""

    cfg: RunConfig
    ctx: DistContext
    device: torch.device
    data: RunData
    model: nn.Module
    ema: Any  # timm's ModelEmaV3, or None
    optimizer: torch.optim.Optimizer
    scheduler: WarmupCosine
    progress: Progress
    lock: RunLock
    out_dir: Path
    slices: int
    amp_dtype: torch.dtype | None
    stop: StopRequest
    on_step: Callable[[Any], None] | None
    on_epoch: Callable[[int, dict[str, Any]], bool] | None

    # ------------------------------------------------------------------------------------------ views

    @property
    def steps_per_epoch(self) -> int:
        return self.data.steps_per_epoch

    @property
    def data_info(self) -> dict[str, Any]:
        return self.data.info

    @property
    def mean(self) -> tuple[float, ...]:
        return self.data.mean

    @property
    def std(self) -> tuple[float, ...]:
        return self.data.std

    @property
    def pipeline(self):  # noqa: ANN201 - batches.BatchPipeline
        return self.data.pipeline

    @property
    def train_data(self) -> DataSplit:
        return self.data.train

    @property
    def test_data(self) -> DataSplit:
        return self.data.test

    @property
    def eval_data(self) -> DataSplit:
        return self.data.eval

    @property
    def eval_name(self) -> str:
        return self.data.eval_name

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

    def _criterion(self) -> nn.Module:
        return self.pipeline.criterion()

    def _wrap(self, model: nn.Module) -> nn.Module:
        """The model as the steps run it: under DDP on several processes, compiled with ``--compile``."""
        if self.ctx.distributed:
            from torch.nn.parallel import DistributedDataParallel

            ids = [self.device.index] if self.device.type == "cuda" else None
            model = DistributedDataParallel(model, device_ids=ids)
        if self.cfg.compile:
            model = torch.compile(model)
        return model

    def _fit(self) -> TrainResult:
        cfg, p = self.cfg, self.progress
        logger = None
        status = "failed"
        try:
            self.criterion = self._criterion()
            self.train_model = self._wrap(self.model)
            self._stop_votes = 0.0
            self._clock = time.perf_counter()
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
                if self.test_predictions is not None:  # of the final test evaluation (none: nothing trained now)
                    provenance.write_predictions(self.out_dir, self.test_data, self.test_predictions)
                logger.write_summary(summary)
            status = "finished"
            return TrainResult(self.out_dir, summary)
        except NonFiniteLoss as exc:  # diverged: said in summary.json as well as in the error
            if logger is not None and exc.summary is not None:
                logger.write_summary(exc.summary)
            raise
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
        name, note = announced_model(c, getattr(self.model, "vitlab_spec", None))  # the preset the run trains
        print(f"vitlab train: {name} ({note}{params / 1e6:.2f}M params) on {c.dataset} ({d['num_train']} train / "
              f"{d['num_test']} test, {d['in_chans']}x{d['img_size']}x{d['img_size']}), {c.epochs} epochs x "
              f"{self.steps_per_epoch} steps of {c.batch_size}, lr {c.lr:g}, {where}; output {self.out_dir}",
              flush=True)

    def _run_epoch(self, logger: RunLogger | None) -> bool:
        """Train the rest of the current epoch, evaluate, log and save; False when a stop was requested."""
        cfg, p = self.cfg, self.progress
        epoch = p.epoch
        self._clock = time.perf_counter()
        order = epoch_order(len(self.train_data), cfg.seed, epoch, repeats=cfg.repeated_aug or 1).to(self.device)
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
        if not metrics["loss"] <= self.divergence_limit:  # NaN too: checked before the save, which would keep it
            raise self._diverged_error(epoch, p.step - 1, metrics["loss"], f"{self.eval_name} loss after the epoch")
        self._tick()
        name = self.eval_name
        row = {"epoch": epoch + 1, "step": p.global_step, "train_loss": p.loss_sum / max(p.seen, 1),
               f"{name}_loss": metrics["loss"], f"{name}_acc": metrics["acc"], "lr": self.scheduler.get_last_lr(),
               "seconds": p.epoch_seconds}
        if cfg.probe_images and self.ctx.is_main:
            row.update(self._probe_columns())
        p.end_epoch(metrics["loss"], metrics["acc"])
        if logger is not None:
            logger.log_epoch(row)
        self.save()
        self.stopped_early = bool(self.on_epoch is not None and self.on_epoch(epoch + 1, row))
        return not self._stop_agreed(sync=True)

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
        n = min(self.cfg.probe_images, len(self.train_data))
        x = normalize(self.train_data.images[:n].to(self.device), self.mean, self.std)
        return probe_model(model, x, batch_size=min(n, self.cfg.eval_batch_size)).columns()

    test_predictions: torch.Tensor | None = None  # per test image, of the latest test evaluation

    def _evaluate(self, split: DataSplit) -> dict[str, Any]:
        """``evaluate`` on ``split``; a test evaluation also keeps each image's prediction, so the final one is
        written without reading the test set again."""
        on_test = split is self.test_data
        out = evaluate(self.eval_model, split, mean=self.mean, std=self.std, batch_size=self.cfg.eval_batch_size,
                       device=self.device, amp_dtype=self.amp_dtype, ctx=self.ctx, slices=self.slices,
                       predictions=on_test)
        if on_test:
            self.test_predictions = out["predictions"]
        return out

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
        if cfg.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)

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

    @property
    def divergence_limit(self) -> float:
        """The loss past which the run has diverged: :data:`DIVERGENCE_FACTOR` x ln(classes)."""
        return DIVERGENCE_FACTOR * math.log(max(len(self.data.classes), 2))

    def _causes(self) -> str:
        cfg = self.cfg
        causes = [f"a learning rate too high (--lr {cfg.lr:g}; try {cfg.lr / 4:g})"]
        if self.amp_dtype is not None:
            causes.append("low-precision overflow (try --amp off)")
        if not cfg.clip_grad:
            causes.append("no gradient clipping (try --clip-grad 1.0)")
        kept = f"the last good checkpoint in {self.out_dir} is kept" if (self.out_dir / CONFIG).exists() \
            else "no checkpoint was saved yet"
        return f"likely {' or '.join(causes)}; {kept}"

    def _nonfinite_error(self, epoch: int, step: int, loss: float) -> NonFiniteLoss:
        where = f"epoch {epoch + 1} step {step + 1} (global step {self.progress.global_step})"
        what = f"loss ({loss})" if not math.isfinite(loss) else f"gradient norm (loss {loss:.4g})"
        err = NonFiniteLoss(f"the run diverged: non-finite {what} at {where}; {self._causes()}; "
                            "--skip-nonfinite skips such steps instead")
        err.summary = self._diverged_summary(epoch, step, str(err))
        return err

    def _diverged_error(self, epoch: int, step: int, loss: float, what: str) -> LossDiverged:
        """The run's loss past :attr:`divergence_limit` (or a non-finite evaluation loss): the weights are wrecked,
        so the summary's figures are those of the last checkpoint, which is kept."""
        classes = len(self.data.classes)
        where = f"epoch {epoch + 1} step {step + 1} (global step {self.progress.global_step})"
        err = LossDiverged(f"the run diverged: {what} {loss:.4g} at {where} is more than {DIVERGENCE_FACTOR:g} times "
                           f"that of a uniform guess over the {classes} classes ({math.log(classes):.4g}); "
                           f"{self._causes()}")
        if (self.out_dir / CONFIG).exists():
            with contextlib.suppress(Exception):  # figures of the weights the folder keeps, not of the wrecked ones
                unwrap(self.eval_model).load_state_dict(read_weights(self.out_dir / WEIGHTS, verify=False)[0])
        err.summary = self._diverged_summary(epoch, step, str(err))
        return err

    def _diverged_summary(self, epoch: int, step: int, message: str) -> dict[str, Any] | None:
        """:meth:`summary` at a divergence: a non-finite step was not applied, so the weights are the last finite
        ones (after a loss past the limit, those of the kept checkpoint) and the test figures are theirs, evaluated
        now."""
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
            print(f"vitlab train: stopped by {self.stop.name} at epoch {p.epoch + 1} step {p.step}; "
                  f"resumable checkpoint saved in {self.out_dir} (continue with --resume {self.out_dir})",
                  file=sys.stderr, flush=True)
        return TrainResult(self.out_dir, {}, exit_code=self.stop.exit_code)

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
        p = self.progress
        macs = model_macs(self.model, self.data_info)
        judged = {"final_test_acc": p.eval_acc, "final_test_loss": p.eval_loss, "best_test_acc": p.best_eval_acc}
        if self.eval_name == "val":
            test = self._evaluate(self.test_data)
            judged = {"final_val_acc": p.eval_acc, "final_val_loss": p.eval_loss, "best_val_acc": p.best_eval_acc,
                      "final_test_acc": test["acc"], "final_test_loss": test["loss"]}
        return {"model": self.cfg.model, "dataset": self.cfg.dataset, "epochs": p.epoch,
                "steps": p.global_step, **judged, "best_epoch": p.best_epoch,
                "train_images_per_second": p.train_images / max(p.train_time_s, 1e-9),
                "wall_time_s": p.wall_time_s, "train_time_s": p.train_time_s, "train_cpu_s": p.train_cpu_s,
                "params": sum(t.numel() for t in self.model.parameters()), "macs": macs,
                "flops": 2 * macs if macs is not None else None, "skipped_steps": p.skipped_steps,
                "world_size": self.ctx.world_size, "device": str(self.device), **self.machine,
                "threads": torch.get_num_threads(), "slices": self.slices, "stopped_early": self.stopped_early,
                **provenance.stamp()}
