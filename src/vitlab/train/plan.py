"""The run plan: everything a training run will do, decided once, before its first step, from the user's options and
the data set's facts. Where a run's learning rate (or any other setting) is decided has one answer: here.

:func:`request` settles the options:

1. a new run's: the user's (command line over YAML, or a study's cell), over the command's default model and recipe
   when no model is named; a resumed run's: its record (config.json), with the options the user changes, compared
   with the record here, once (a change outside :data:`RESUMABLE` is refused naming the option and both values).

:func:`make_plan` then decides, in this order:

2. the model: its spec from the options and the data set's model defaults (:mod:`vitlab.train.plan_model`);
3. the output folder, checked (nothing is created);
4. the data: the data set's facts (:mod:`vitlab.data.facts`: sizes and classes, before any image is decoded), the
   subsets, the validation hold-out, the normalisation;
5. the recipe of the training set's size under the options (:mod:`vitlab.train.recipes`), a warm-up the recipe
   chooses fitted to the run's epochs;
6. the model's final spec (the recipe's drop-path, the data's classes), its cost measured on the meta device, and
   for a resumed run its comparison with the stored model;
7. the schedule, the precision and the CPU threads and slices (:func:`vitlab.perf.thread_plan`).

The result is one frozen :class:`RunPlan`: what ``vitlab train`` prints first (:meth:`RunPlan.describe`;
``--dry-run`` prints only the plan), what config.json stores (:meth:`RunPlan.record`), and the only thing the trainer
(:mod:`vitlab.train.engine`) reads.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from vitlab.checkpoint import CONFIG, ModelSpec, read_config, state_mismatch
from vitlab.data.datasets import canonical_dataset, check_input, normalization
from vitlab.data.facts import data_facts
from vitlab.errors import CheckpointError, ConfigError
from vitlab.outputs import check_new_run, check_path
from vitlab.perf import ThreadPlan, thread_plan
from vitlab.train.config import RESULT_NEUTRAL, RunConfig
from vitlab.train.distributed import DistContext, check_batch, pick_device
from vitlab.train.lock import check_free
from vitlab.train.plan_model import ModelCost, announced_model, measure, resolve_model, width, with_recipe
from vitlab.train.recipes import default_model, default_recipe, fill

__all__ = ["RESUMABLE", "DataPlan", "Request", "RunPlan", "Schedule", "check_run_options", "make_plan",
           "model_differences", "plan_run", "request"]

# run options a resumed run may change without breaking the continuation: the result-neutral ones, more epochs, and
# model options (the model the plan resolves is compared with the stored one)
RESUMABLE = RESULT_NEUTRAL | {"epochs", "model", "model_overrides"}
NOT_OPTIONS = ("data",)  # what config.json's run holds besides the options: the data's facts


@dataclass(frozen=True)
class Request:
    """What the user asks for: the options settled (:func:`request`), before anything is read of the data."""

    run: RunConfig  # the options; None where the recipe decides
    chosen: frozenset[str]  # options the command's default recipe set, not the user
    resume: Path | None = None
    record: Mapping[str, Any] | None = None  # the resumed run's config.json
    init_weights: str | None = None
    verify: bool = True


@dataclass(frozen=True)
class DataPlan:
    """The run's data: which images, at which size, normalised how."""

    dataset: str
    data_dir: str | None
    download: bool
    img_size: int  # the input the images are prepared at (the model's)
    in_chans: int
    source_train: int  # images of the data set's training split (before --limit-train)
    source_test: int
    num_train: int  # images trained on: after --limit-train and the hold-out
    num_val: int | None  # held out of the training images (--val-split / --val-size), each epoch judged on them
    num_test: int  # after --limit-test
    num_classes: int
    classes: tuple[str, ...] | None  # None where only the loaded files name them (torchvision's data sets)
    mean: tuple[float, ...]
    std: tuple[float, ...]

    @property
    def limit_train(self) -> int:
        """Training images before the hold-out."""
        return self.num_train + (self.num_val or 0)

    def info(self, classes: list[str]) -> dict[str, Any]:
        """What config.json stores under ``run.data`` (``classes``: the names the loaded data gives)."""
        info = {"classes": list(classes), "mean": list(self.mean), "std": list(self.std), "img_size": self.img_size,
                "in_chans": self.in_chans, "num_train": self.num_train, "num_test": self.num_test}
        if self.num_val is not None:
            info["num_val"] = self.num_val
        return info


@dataclass(frozen=True)
class Schedule:
    """Steps and learning rates: a linear warm-up to ``lr``, then a cosine to ``min_lr`` (vitlab.train.optim)."""

    epochs: int
    batch_size: int  # global (split over the processes)
    steps_per_epoch: int
    lr: float
    min_lr: float
    warmup_epochs: float

    @property
    def total_steps(self) -> int:
        return self.epochs * self.steps_per_epoch

    @property
    def warmup_steps(self) -> int:
        return round(self.warmup_epochs * self.steps_per_epoch)


@dataclass(frozen=True)
class RunPlan:
    """Everything a training run will do (see the module's docstring)."""

    run: RunConfig  # every option resolved: config.json's run (with the data's facts, :meth:`record`)
    spec: ModelSpec  # the model the run builds, for the data's classes
    model_name: str  # the preset the first line names, and how the data set's defaults made it (model_note)
    model_note: str
    cost: ModelCost
    data: DataPlan
    schedule: Schedule
    threads: ThreadPlan
    device: torch.device
    world_size: int
    amp_dtype: torch.dtype | None  # bf16 autocast, or None
    out_dir: Path
    resume: Path | None
    init_weights: str | None
    verify: bool
    notes: tuple[str, ...]  # what the plan decided for the user that the user should know (a fitted warm-up)
    warnings: tuple[str, ...]  # options the run accepts but that defeat their purpose (stderr, one line each)

    def record(self, classes: list[str]) -> dict[str, Any]:
        """config.json's ``run``: the resolved options and the data's facts."""
        return {**self.run.to_dict(), "data": self.data.info(classes)}

    def describe(self, threads: int | None = None) -> str:
        """The run's first line: model, data, schedule, where it runs and its output folder."""
        c, d, s = self.run, self.data, self.schedule
        where = f"{self.device}" + (f" x {self.world_size} processes" if self.world_size > 1 else "")
        if self.threads.slices > 1:
            n = self.threads.threads or threads or torch.get_num_threads()
            where += f" ({self.threads.slices} slices x {n} thread{'s' * (n > 1)})"
        lr = f"lr {s.lr:g}" + "".join(f" ({note})" for note in self.notes)
        return (f"vitlab train: {self.model_name} ({self.model_note}{self.cost.params / 1e6:.2f}M params) on "
                f"{c.dataset} ({d.num_train} train / {d.num_test} test, {d.in_chans}x{d.img_size}x{d.img_size}), "
                f"{s.epochs} epochs x {s.steps_per_epoch} steps of {s.batch_size}, {lr}, {where}; output "
                f"{self.out_dir}")

    def estimated_flops(self) -> int | None:
        """Training FLOPs: 3 passes (forward, two backward) x 2 FLOPs per MAC for every trained image, one pass for
        every evaluated one (each epoch's judged images, and the test set once more after a validation run); None
        when the plan did not count the model's MACs."""
        s, d, macs = self.schedule, self.data, self.cost.macs
        if macs is None:
            return None
        trained = s.total_steps * s.batch_size
        judged = s.epochs * (d.num_val if d.num_val is not None else d.num_test)
        evaluated = judged + (d.num_test if d.num_val is not None else 0)
        return 2 * macs * (3 * trained + evaluated)

    def lines(self) -> list[str]:
        """The plan in full, as ``--dry-run`` prints it after :meth:`describe`: what the trainer will do, then every
        option as a ``--config`` YAML file would give it."""
        from vitlab.flops import human

        s, d, t = self.schedule, self.data, self.threads
        held = f", {d.num_val} held out for validation" if d.num_val is not None else ""
        flops, macs = self.estimated_flops(), self.cost.macs
        out = [
            f"model: {self.spec.label}, {self.cost.params:,} parameters"
            + (f", {human(macs, 'MACs')} per image" if macs is not None else ""),
            f"data: {d.limit_train} of {d.source_train} training images ({d.num_train} trained on{held}), "
            f"{d.num_test} of {d.source_test} test images, {d.num_classes} classes, {d.in_chans}x{d.img_size}x"
            f"{d.img_size}, normalised by mean {list(d.mean)} std {list(d.std)}",
            f"schedule: {s.epochs} epochs x {s.steps_per_epoch} steps = {s.total_steps} steps of {s.batch_size} "
            f"images; lr {s.lr:g} after {s.warmup_steps} warm-up steps ({s.warmup_epochs:g} epochs), cosine to "
            f"{s.min_lr:g}",
            f"device: {self.device}" + (f" x {self.world_size} processes" if self.world_size > 1 else "")
            + f", {t.slices} slice{'s' * (t.slices > 1)} of each batch, "
            + (f"{t.threads} torch thread{'s' * (t.threads > 1)}" if t.threads else "torch's threads")
            + f", {'bf16 autocast' if self.amp_dtype is not None else 'float32'}",
            *([f"cost: about {human(flops, 'FLOPs')} (3 x 2 x MACs per trained image, 2 x MACs per evaluated "
               "one)"] if flops is not None else []),
            "options (a --config file of them trains this run):",
        ]
        import yaml

        options = {k: v for k, v in self.run.to_dict().items() if k not in ("output",)}
        out += ["  " + line for line in yaml.safe_dump(options, sort_keys=False).splitlines()]
        return out


# ------------------------------------------------------------------------------------------------ 1. the options


def request(options: RunConfig | Mapping[str, Any], *, resume: str | Path | None = None,
            init_weights: str | Path | None = None, verify: bool = True, source: str = "command line") -> Request:
    """The options of a run, settled: ``options`` is a :class:`RunConfig` (its ``None`` fields left to the recipe)
    or the mapping of the options a user gave (``source`` names them in errors; with no ``model``, the data set's
    default model and its recipe, as ``vitlab train`` does). With ``resume``, the record of the run saved there with
    the given options over it (``verify=False``: a config.json whose SHA-256 no longer matches its manifest)."""
    if resume is not None and init_weights is not None:
        raise ConfigError("a resumed run continues from its own weights; drop the initial weights, or start a new "
                          "run with another --output")
    init = str(init_weights) if init_weights is not None else None
    if resume is not None:
        given = {k: v for k, v in options.to_dict().items() if v is not None} \
            if isinstance(options, RunConfig) else dict(options)
        record = read_config(resume, verify=verify)
        run = _resumed(Path(resume), record, given, source)
        return Request(_checked(run), frozenset(), Path(resume), record, init, verify)
    if isinstance(options, RunConfig):
        return Request(_checked(options), frozenset(), None, None, init, verify)
    layer: dict[str, Any] = {}
    if "model" not in options:  # the data set's default model and its recipe (a resumed run keeps its own)
        dataset = str(options.get("dataset", RunConfig.dataset))
        layer = {**default_recipe(dataset), "model": default_model(dataset)}
    run = RunConfig.from_dict({**layer, **options}, source)
    return Request(_checked(run), frozenset(set(layer) - set(options) - {"model"}), None, None, init, verify)


def _checked(run: RunConfig) -> RunConfig:
    run = run.replace(dataset=canonical_dataset(run.dataset))
    run.validate()
    return run


def _resumed(resume: Path, record: Mapping[str, Any], given: dict[str, Any], source: str) -> RunConfig:
    """The options of the run resumed from ``resume``: its record, continued in ``resume`` (wherever it was first
    written), with the ``given`` options over it; changing one outside :data:`RESUMABLE` is refused."""
    run = record.get("run")
    if not isinstance(run, dict):
        raise CheckpointError(f"{resume}/{CONFIG} holds no run config to resume; start a new run")
    stored = RunConfig.from_dict({k: v for k, v in run.items() if k not in NOT_OPTIONS}, f"{resume}/{CONFIG}")
    stored = stored.replace(output=str(resume))
    now = RunConfig.from_dict(given, source).to_dict()
    if "dataset" in given:
        now["dataset"] = canonical_dataset(now["dataset"])
    check_run_options(stored.to_dict(), {k: v for k, v in now.items() if k in given})
    if "model_overrides" in given:
        given = {**given, "model_overrides": {**stored.model_overrides, **given["model_overrides"]}}
    return stored.replace(**given)


def _differences(stored: Mapping[str, Any], now: Mapping[str, Any], keys: list[str]) -> list[str]:
    return [f"{k} {stored.get(k)!r} in the run, {now.get(k)!r} now" for k in keys]


def check_run_options(stored: Mapping[str, Any], now: Mapping[str, Any]) -> None:
    """Refuse run options in ``now`` (``RunConfig.to_dict()`` fields) that differ from the ``stored`` ones outside
    :data:`RESUMABLE`, in one line naming each option and both values."""
    changed = sorted(k for k, v in now.items() if k in stored and v != stored[k] and k not in RESUMABLE)
    if changed:
        flags = ", ".join(f"--{k.replace('_', '-')}" for k in changed)
        details = "; ".join(_differences(stored, now, changed))
        raise ConfigError(f"cannot change {flags} when resuming ({details}): the run would not continue exactly; "
                          f"drop {'it' if len(changed) == 1 else 'them'}, or start a new run with another --output")


def model_differences(saved: ModelSpec, built: ModelSpec) -> list[str]:
    """Each option (``ModelConfig`` field, or timm keyword) in which two specs differ, with both values; the preset
    name aside (a label)."""
    if saved.is_timm != built.is_timm or saved.timm != built.timm:
        return [f"model {saved.label!r} in the run, {built.label!r} now"]
    a, b = (json.loads(json.dumps(s.options())) for s in (saved, built))  # as config.json stores them
    return _differences(a, b, [k for k in sorted(set(a) | set(b)) if k != "name" and a.get(k) != b.get(k)])


def check_resumed_model(resume: Path, record: Mapping[str, Any], planned: ModelSpec) -> None:
    """Refuse to continue the run saved in ``resume`` with another model: another architecture (other weight
    shapes, compared on the meta device), or any other model option (``num_heads``, ``global_pool``, a drop-path
    rate...), named with both values."""
    saved = ModelSpec.from_dict(record["model"])
    options = "; ".join(model_differences(saved, planned)[:6])
    if not options:
        return
    with torch.device("meta"):
        problem = state_mismatch(planned.build(allow_large=True).state_dict(),
                                 saved.build(allow_large=True).state_dict())
    if problem:
        raise CheckpointError(f"cannot resume {resume}: it holds a {saved.label} model but this run builds a "
                              f"{planned.label} model: {problem} ({options}); resume without --model / model flags, "
                              "or start a new run")
    raise CheckpointError(f"cannot resume {resume} exactly: the model differs from the run's ({options}); resume "
                          "without --model / model flags, or start a new run with another --output")


# ------------------------------------------------------------------------------------------------ 2-7. the plan


def plan_run(options: RunConfig | Mapping[str, Any], ctx: DistContext | None = None, *,
             resume: str | Path | None = None, init_weights: str | Path | None = None, verify: bool = True,
             force: bool = False, count_macs: bool = True) -> RunPlan:
    """:func:`make_plan` of :func:`request` (``ctx``: this process's place among the run's; default one process on
    the options' device)."""
    req = request(options, resume=resume, init_weights=init_weights, verify=verify)
    return make_plan(req, ctx if ctx is not None else DistContext(device=pick_device(req.run.device)), force=force,
                     count_macs=count_macs)


def make_plan(req: Request, ctx: DistContext, *, force: bool = False, count_macs: bool = False) -> RunPlan:
    """The plan of the run ``req`` asks for, as process ``ctx`` runs it (see the module's docstring); ``force``
    lets a new run write into a folder without vitlab's marker that holds files a run replaces. A timm model's MACs
    are counted when the thread plan needs them (on the CPU without ``--threads``) or with ``count_macs``."""
    cfg = req.run
    # 2. the model, before the recipe: its input size, its width
    spec, overrides, img_size, in_chans = resolve_model(cfg)
    # 3. the output folder (the same on every process)
    out = Path(cfg.output) if cfg.output else (req.resume if req.resume is not None else default_output(cfg))
    out = Path(ctx.broadcast_object(str(out)))
    check_path(out, cfg.data_dir)
    if ctx.is_main:
        check_free(out)  # a live run writes there
    check_new_run(out, resume=req.resume, force=force)
    # 4. the data, from its facts
    check_input(img_size, in_chans)
    facts = data_facts(cfg.dataset, cfg.data_dir)
    if facts.num_classes < 2:  # one class: always right (accuracy 100%, loss 0), nothing learnt
        name = str(facts.classes[0]).encode("utf-8", "surrogateescape").decode("utf-8", "replace") \
            if facts.classes else ""
        raise ConfigError(f"{cfg.dataset} has one class ({name}), so every prediction would be right and nothing "
                          "is learnt; a classifier needs at least two classes (imagefolder: one sub-folder of "
                          "train/ per class)")
    num_train = min(cfg.limit_train, facts.num_train) if cfg.limit_train is not None else facts.num_train
    num_test = min(cfg.limit_test, facts.num_test) if cfg.limit_test is not None else facts.num_test
    num_val = held_out(num_train, fraction=cfg.val_split, size=cfg.val_size)
    num_train -= num_val or 0
    mean, std = normalization(cfg.dataset, in_chans)
    # 5. the recipe of the training set's size, under the options
    filled, note = fill(cfg.to_dict(), num_train=num_train, width=width(spec, overrides), chosen=req.chosen)
    cfg = cfg.replace(**filled)
    cfg.validate()
    check_batch(cfg.batch_size, ctx)
    steps = num_train // cfg.batch_size
    if steps == 0:
        raise ConfigError(f"--batch-size {cfg.batch_size} is larger than the {num_train} training "
                          f"images; use --batch-size {num_train} or less")
    # 6. the model's final spec, its cost, and a resumed run's model compared with the stored one
    spec, overrides = with_recipe(spec, overrides, cfg, facts.num_classes)
    cfg = cfg.replace(model_overrides=overrides)
    if req.resume is not None:
        check_resumed_model(req.resume, req.record, spec)
    cost = measure(spec, img_size=img_size, in_chans=in_chans, compile=cfg.compile, distributed=ctx.distributed,
                   macs=count_macs or (ctx.device.type == "cpu" and not cfg.threads))
    name, model_note = announced_model(cfg, spec)
    # 7. schedule, precision, threads
    schedule = Schedule(cfg.epochs, cfg.batch_size, steps, cfg.lr, cfg.min_lr, cfg.warmup_epochs)
    amp = torch.bfloat16 if cfg.amp == "bf16" or (cfg.amp == "auto" and ctx.device.type == "cuda") else None
    threads = thread_plan(ctx.device, batch_size=cfg.batch_size, slices=cfg.slices, threads=cfg.threads,
                          macs=cost.macs, tokens=cost.tokens, why_not=cost.why_not_sliced)
    data = DataPlan(cfg.dataset, cfg.data_dir, cfg.download, img_size, in_chans, facts.num_train, facts.num_test,
                    num_train, num_val, num_test, facts.num_classes, facts.classes, mean, std)
    warnings = () if req.resume is not None or "warmup_epochs" in filled or "warmup_epochs" in req.chosen \
        else long_warmup(cfg)
    return RunPlan(cfg, spec, name, model_note, cost, data, schedule, threads, ctx.device, ctx.world_size, amp, out,
                   req.resume, req.init_weights, req.verify, (note,) if note else (), warnings)


def held_out(num_train: int, *, fraction: float | None = None, size: int | None = None) -> int | None:
    """How many of ``num_train`` training images ``--val-size`` (or ``--val-split``) holds out; None for none."""
    if size is None and fraction is None:
        return None
    n = size if size is not None else round(fraction * num_train)
    if not 0 < n < num_train:
        what = f"--val-size {size}" if size is not None else f"--val-split {fraction}"
        raise ConfigError(f"{what} holds out {n} of the {num_train} training images; hold out at least one "
                          "and leave at least one to train on")
    return n


def long_warmup(cfg: RunConfig) -> tuple[str, ...]:
    """The warning for a warm-up the user gave that is longer than the run: the learning rate then never reaches
    --lr nor decays (allowed, as a study of warm-ups may want it)."""
    if cfg.warmup_epochs is None or cfg.epochs is None or cfg.warmup_epochs <= cfg.epochs:
        return ()
    return (f"the warm-up ({_num(cfg.warmup_epochs)} epochs) is longer than the run ({cfg.epochs} epochs), so the "
            f"learning rate peaks at {100 * cfg.epochs / cfg.warmup_epochs:.0f}% of --lr and never decays; pass "
            f"--warmup-epochs {cfg.epochs} or less",)


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() and abs(v) < 1e15 else f"{v:g}"


def default_output(cfg: RunConfig) -> Path:
    name = cfg.model.replace(":", "-").replace("/", "-")
    return Path("runs") / f"{name}_{cfg.dataset}_{time.strftime('%Y%m%d-%H%M%S')}"
