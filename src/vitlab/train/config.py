"""The options of a training run and their limits: :class:`RunConfig` (every option, ``None`` where the recipe
decides), :data:`LIMITS` (the values a run can work with, each refused in one line naming the range) and
:func:`coerce` (keys and types of options given as text or YAML); the options written as text, read by one parser
(:func:`parse_set`, :func:`parse_value` for ``--set``, ``--run-set`` and ``--values``) and one set of coercion rules
(:func:`coerce_value`, :func:`coerce_to`); and :data:`RESULT_NEUTRAL`, the options that do not change a run's result.

What an unset option becomes is decided by the run plan (:mod:`vitlab.train.plan`) from the recipe tables
(:mod:`vitlab.train.recipes`); a ``--config`` file is read by :mod:`vitlab.train.config_file`.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import re
import types
import typing
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vitlab.errors import ConfigError
from vitlab.train.config_file import read_yaml
from vitlab.train.recipes import (  # re-exported: the tables' former home
    AUGMENT_DEFAULTS,
    DEFAULT_MODELS,
    DEFAULT_RECIPES,
    DEIT3,
    LIBRARY_MODEL,
    MODEL_DEFAULTS,
    NO_AUGMENT,
    RECIPES,
    SIZE_DEFAULTS,
    data_kind,
    default_model,
    default_recipe,
    fill,
    model_defaults,
    recipe_defaults,
    size_defaults,
)
from vitlab.train.tracking import check_logger

__all__ = ["AUGMENT_DEFAULTS", "DEFAULT_MODELS", "DEFAULT_RECIPES", "DEIT3", "LIMITS", "MODEL_DEFAULTS", "NO_AUGMENT",
           "RECIPES", "RESULT_NEUTRAL", "SIZE_DEFAULTS", "RunConfig", "coerce", "coerce_to", "coerce_value",
           "data_kind", "default_model", "default_recipe", "load_yaml", "model_defaults", "parse_set", "parse_value",
           "recipe_defaults", "size_defaults"]

AMP_MODES = ("auto", "bf16", "off")
OPTIMIZERS, LOSSES = ("adamw", "lamb"), ("ce", "bce")


@dataclass(frozen=True)
class RunConfig:
    """The options of a training run: those its user gives, ``None`` where the recipe decides (the run plan fills
    them, :func:`vitlab.train.plan.make_plan`); resolved, it is the ``run`` of each checkpoint's config.json."""

    model: str = LIBRARY_MODEL  # a preset name, or timm:NAME
    model_overrides: dict[str, Any] = field(default_factory=dict)  # ModelConfig fields (timm: kwargs)
    dataset: str = "mnist-5k"
    data_dir: str | None = None
    download: bool = True
    limit_train: int | None = None  # a fixed random subset of N training images
    limit_test: int | None = None
    val_split: float | None = None  # hold out this fraction of the training images; evaluate on it per epoch
    val_size: int | None = None  # ... or this many images; the test set is then read once, at the end
    stratify: bool = False  # draw limit_train/limit_test and the validation hold-out per class, in proportion
    # recipe; None takes the defaults of the data set size (SIZE_DEFAULTS)
    epochs: int | None = None
    batch_size: int | None = None  # global batch (split over DDP processes)
    lr: float | None = None
    min_lr: float | None = None
    weight_decay: float | None = None
    warmup_epochs: float | None = None
    label_smoothing: float | None = None
    clip_grad: float | None = None  # 0: off
    drop_path: float | None = None  # the model's drop_path_rate
    drop_path_rule: str | None = None  # uniform | linear (None: the preset's)
    ema_decay: float | None = None  # 0: off
    layer_decay: float | None = None  # layer-wise lr decay (BEiT / timm), e.g. 0.75; None or 1: off
    recipe: str = "default"  # default | deit3 (RECIPES): the defaults the None fields take
    optimizer: str | None = None  # adamw | lamb (None: adamw)
    loss: str | None = None  # ce | bce (None: ce)
    repeated_aug: int | None = None  # each image N times per epoch, in the same batch (DeiT: 3); None or 1: off
    # augmentation; None takes the defaults of the kind of image (AUGMENT_DEFAULTS)
    degrees: float | None = None
    scale: tuple[float, float] | None = None
    shear: float | None = None
    translate: float | None = None
    erase_prob: float | None = None
    hflip: bool | None = None
    pad_crop: int | None = None
    trivial_augment: bool | None = None
    three_augment: bool | None = None  # DeiT III's 3-Augment (vitlab.data.ThreeAugment); None: off
    color_jitter: float | None = None  # brightness / contrast / saturation jitter; None or 0: off
    mixup: float | None = None  # mixup alpha, 0: off
    cutmix: float | None = None  # cutmix alpha, 0: off
    # execution
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    amp: str = "auto"  # auto: bf16 autocast on CUDA, off on CPU
    compile: bool = False
    channels_last: bool = False  # the model's 4-D weights (a convolutional stem) and inputs in NHWC memory order
    threads: int | None = None  # torch intra-op threads (None: torch's default, or cores / processes)
    slices: int | None = None  # CPU: the batch as N concurrent slices (None: vitlab.perf.cpu_plan's choice)
    flush_denormal: bool = True  # CPU: denormal floats computed as zero (vitlab.perf.flush_denormals)
    eval_batch_size: int = 1000
    checkpoint_every: int = 0  # also save every N steps (0: only at epoch ends)
    skip_nonfinite: bool = False
    output: str | None = None
    progress: bool = True
    logger: str = "none"  # experiment tracking: none | tensorboard | mlflow | wandb (vitlab.train.tracking)
    probe_images: int = 0  # each epoch row also holds the per-layer probes on the first N training images (0: off)

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        if d["scale"] is not None:
            d["scale"] = list(d["scale"])
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = "run config") -> RunConfig:
        return cls(**coerce(d, source))

    def replace(self, **changes: Any) -> RunConfig:
        return dataclasses.replace(self, **coerce(changes, "run config"))

    def resolve(self, num_train: int, width: int | None = None) -> RunConfig:
        """This config with every unset recipe option filled for ``num_train`` training images of its data set
        (:func:`vitlab.train.recipes.fill`, ``width``: the model's embedding width), checked: the recipe a run of
        these options takes, as its plan decides it."""
        filled, _ = fill(self.to_dict(), num_train=num_train, width=width)
        cfg = dataclasses.replace(self, **filled)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the allowed range for an impossible value (see :data:`LIMITS`)."""
        for key in ("limit_train", "limit_test", "val_size"):
            v = getattr(self, key)
            if v is not None and v <= 0:
                raise ConfigError(f"{key} must be a positive integer, got {v}; fix --{key.replace('_', '-')}")
        for key, (low, high, interval, why) in LIMITS.items():
            values = getattr(self, key)
            for v in values if isinstance(values, tuple) else (values,):
                if v is not None and not (low(v) and high(v)):
                    flag = key.replace("_", "-")
                    raise ConfigError(f"{key} must be in {interval}, got {_num(v)}; fix --{flag} ({why})")
        if self.lr is not None and self.min_lr is not None and self.min_lr > self.lr:
            raise ConfigError(f"min_lr {_num(self.min_lr)} is above lr {_num(self.lr)}: the cosine schedule would "
                              f"climb to it instead of decaying; give --min-lr at most --lr (ViTs use about 1e-5)")
        if self.val_split is not None and not 0 < self.val_split < 1:
            raise ConfigError(f"val_split must be a fraction in (0, 1), got {self.val_split}; e.g. --val-split 0.1")
        if self.val_split is not None and self.val_size is not None:
            raise ConfigError("give --val-split or --val-size, not both")
        if self.layer_decay is not None and not 0 < self.layer_decay <= 1:
            raise ConfigError(f"layer_decay must be in (0, 1], got {self.layer_decay}; e.g. --layer-decay 0.75 "
                              f"(1 or unset: off)")
        if self.amp not in AMP_MODES:
            raise ConfigError(f"unknown amp {self.amp!r}; choose one of {', '.join(AMP_MODES)}")
        for key, choices in (("recipe", RECIPES), ("optimizer", OPTIMIZERS), ("loss", LOSSES)):
            value = getattr(self, key)
            if value is not None and value not in choices:
                raise ConfigError(f"unknown {key} {value!r}; choose one of {', '.join(choices)}")
        if self.drop_path_rule not in (None, "uniform", "linear"):
            raise ConfigError(f"unknown drop_path_rule {self.drop_path_rule!r}; choose uniform or linear")
        check_logger(self.logger)
        if self.scale is not None and not self.scale[0] <= self.scale[1]:
            raise ConfigError(f"scale {self.scale} must be two numbers 0 < low <= high, e.g. 0.9 1.1")


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() and abs(v) < 1e15 else f"{v:g}"


def _interval(low: float, high: float, *, open_low: bool = False, open_high: bool = False) -> tuple:
    """(test of the low bound, test of the high bound, the interval as text) of a :data:`LIMITS` row."""
    text = f"{'(' if open_low else '['}{_num(low)}, {_num(high)}{')' if open_high else ']'}"
    return ((lambda v: v > low) if open_low else (lambda v: v >= low),
            (lambda v: v < high) if open_high else (lambda v: v <= high), text)


# The values a run can work with; anything outside is refused before data is loaded, in one line naming the range.
LIMITS: dict[str, tuple[Any, Any, str, str]] = {key: (*_interval(*bounds, **kw), why) for key, bounds, kw, why in [
    ("epochs", (1, 100_000), {}, "100000 is far beyond any recipe"),
    ("batch_size", (1, 1_000_000), {}, "images per step; a million do not fit in any memory"),
    ("eval_batch_size", (1, 1_000_000), {}, "images per step; a million do not fit in any memory"),
    ("threads", (1, 4096), {}, "threads per process"),
    ("slices", (1, 4096), {}, "concurrent slices of a batch, one thread each"),
    ("checkpoint_every", (0, 1e12), {}, "steps between checkpoints, 0 for epoch ends only"),
    ("probe_images", (0, 100_000), {}, "training images the per-epoch probes run on, 0 for none"),
    ("lr", (0, 10), dict(open_low=True), "AdamW moves each weight by about lr per step, so above 10 the first "
                                          "step destroys the model; ViTs train at 1e-4 to 1e-2"),
    ("min_lr", (0, 10), {}, "the end of the cosine schedule; ViTs use about 1e-5"),
    ("weight_decay", (0, 10), dict(open_high=True), "AdamW multiplies the weights by 1 - lr x weight_decay each "
                                                    "step; ViTs use 0.05 to 0.3"),
    ("warmup_epochs", (0, 100_000), {}, "at most --epochs' own limit"),
    ("label_smoothing", (0, 1), dict(open_high=True), "1 would make every target uniform"),
    ("clip_grad", (0, 1e12), {}, "the largest gradient norm, 0 for no clipping"),
    ("drop_path", (0, 1), dict(open_high=True), "a drop probability of 1 removes every block"),
    ("ema_decay", (0, 1), dict(open_high=True), "1 would never update the average, 0 switches it off"),
    ("degrees", (0, 180), {}, "rotations are drawn in [-degrees, degrees]; more than 180 repeats a smaller one"),
    ("shear", (0, 90), dict(open_high=True), "a shear of 90 degrees flattens the image to a line"),
    ("translate", (0, 1), {}, "a shift as a fraction of the image size"),
    ("scale", (0, 10), dict(open_low=True), "a zoom factor; at 10x a 28-pixel image shows 3 of its pixels"),
    ("erase_prob", (0, 1), {}, "a probability"),
    ("mixup", (0, 100), {}, "the Beta(alpha, alpha) parameter; from about 10 on every mix is near 50:50"),
    ("cutmix", (0, 100), {}, "the Beta(alpha, alpha) parameter; from about 10 on every cut is near half the image"),
    ("pad_crop", (0, 1024), {}, "a shift in pixels; beyond the image size only padding is left"),
    ("color_jitter", (0, 1), {}, "factors are drawn in [1 - c, 1 + c]; above 1 a brightness factor is negative"),
    ("repeated_aug", (1, 64), {}, "copies of each image per epoch; DeiT uses 3"),
]}


def _type_of(name: str) -> Any:
    return _hints()[name]


@functools.cache
def _hints() -> dict[str, Any]:
    return typing.get_type_hints(RunConfig)


def coerce(d: dict[str, Any], source: str) -> dict[str, Any]:
    """Check keys (dashes allowed) and value types of a partial run config; returns the normalised dict."""
    names = RunConfig.field_names()
    out = {}
    for raw_key, value in d.items():
        key = str(raw_key).replace("-", "_")
        if key not in names:
            close = difflib.get_close_matches(key, names, n=2)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise ConfigError(f"{source}: unknown option {raw_key!r}{hint}; valid options: {', '.join(names)}")
        out[key] = coerce_value(key, value, _type_of(key), source)
    return out


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a run config YAML file (a mapping of :class:`RunConfig` fields) as a checked partial dict."""
    return coerce(read_yaml(path), f"config file {path}")


# ------------------------------------------------------------------------------------- options written as text
# Run options written as text (``--set KEY=VALUE``, a study's ``--run-set`` and ``--values``): one parser, one set of
# coercion rules, and the one list of options that do not change a run's result. A value is read as a YAML scalar
# (``4`` an int, ``0.5`` a float, ``true`` a bool, ``null`` None) with the exponent numbers YAML 1.1 leaves as strings
# (``1e-4``, ``5E3``) made floats, while a quoted value (``'8'``) stays a string, so that it is validated (and
# refused) as the string it is. The field that receives it checks its type: a run option by :func:`coerce`, a model
# option by :class:`~vitlab.models.ModelConfig`'s own checks, and where only the type is known (a sweep's values) by
# :func:`coerce_to`.

_YAML_EXPONENT = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d+$")


def numeric(value: Any) -> Any:
    """``value`` with the exponent numbers YAML 1.1 reads as strings (``1e-4``, ``5E3``) made floats.

    Other strings stay strings, so a quoted ``"8"`` is validated (and refused) as the string it is."""
    if isinstance(value, str) and _YAML_EXPONENT.match(value.strip()):
        return float(value)
    return value


def coerce_value(key: str, value: Any, tp: Any, source: str) -> Any:
    is_union = isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union
    args = typing.get_args(tp) if is_union else ()
    if value is None:
        if type(None) in args:
            return None
        raise ConfigError(f"{source}: {key} cannot be empty; give a value or remove the key")
    base = next(a for a in args if a is not type(None)) if is_union else tp
    origin = typing.get_origin(base) or base
    bad = ConfigError(f"{source}: {key} must be {getattr(origin, '__name__', origin)}, got {value!r}")
    if origin in (int, float):
        value = numeric(value)
    if origin is bool:
        if isinstance(value, bool):
            return value
        raise bad
    if origin is int:
        if isinstance(value, bool) or not isinstance(value, int | float) or (
                isinstance(value, float) and not value.is_integer()):
            raise bad
        return int(value)
    if origin is float:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ConfigError(f"{source}: {key} must be a finite number, got {value!r}")
        return float(value)
    if origin is str:
        if not isinstance(value, str):
            raise bad
        return value
    if origin is tuple:
        if not isinstance(value, list | tuple) or len(value) != 2:
            raise ConfigError(f"{source}: {key} must be two numbers, got {value!r}")
        return tuple(float(coerce_value(key, v, float, source)) for v in value)
    if origin is dict:
        if not isinstance(value, dict):
            raise bad
        return {k: numeric(v) for k, v in value.items()}
    return value


# Run options that do not change what a run computes, only where and how it runs, is shown or is tracked. A study
# reads a finished run back whatever these say, and `vitlab train --resume` may change them (resume.py adds what a
# continuation may also change). amp is not among them: bf16 autocast changes the numbers.
RESULT_NEUTRAL: frozenset[str] = frozenset({
    "output", "progress", "logger",  # where the outputs go and how they are shown or tracked
    "device", "threads", "slices", "compile", "channels_last",  # how it runs (slices are bit-exact, vitlab.perf)
    "flush_denormal",  # changes only values below 1.2e-38, never a reported number
    "data_dir", "download",  # where the data comes from
    "eval_batch_size", "checkpoint_every",  # evaluation in chunks, extra saves
    "probe_images",  # per-epoch measurements in eval mode, no weight or RNG stream touched
    "skip_nonfinite",  # what a failed step does; a finished run without skipped steps is the same either way
})


def parse_value(text: str) -> Any:
    """A command-line value: a YAML scalar, exponent numbers made floats, quoted text kept as a string; empty
    text is None and text that is not valid YAML stays the text itself."""
    import yaml

    if not text.strip():
        return None
    try:
        return numeric(yaml.safe_load(text))
    except yaml.YAMLError:
        return text


def parse_set(items: Iterable[str] | None, what: str = "--set") -> dict[str, Any]:
    """``["key=value", ...]`` -> ``{key: value}``, values read by :func:`parse_value` and dashes in keys made
    underscores; an item without ``=`` is an error naming ``what``."""
    out: dict[str, Any] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{what} {item!r} is not KEY=VALUE; e.g. {what} global_pool=avg")
        out[key.strip().replace("-", "_")] = parse_value(value)
    return out


def coerce_to(name: str, value: Any, tp: Any, source: str) -> Any:
    """``value`` (from :func:`parse_value`) as field ``name`` of type ``tp``, by the rules of the run config;
    ``none`` is None for an optional field. Errors name ``source`` (e.g. ``--values for depth``)."""
    optional = (isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union) and \
        type(None) in typing.get_args(tp)
    if optional and isinstance(value, str) and value.lower() == "none":
        return None
    return coerce_value(name, value, tp, source)
