"""The run configuration, the first stage of a run: one dataclass, YAML loading, the recipe defaults per data set
size, and the config as a run starts (:func:`settle`: checked, its model config resolved once, its output folder).

Precedence, lowest first: :data:`SIZE_DEFAULTS` (by training-set size) and :data:`AUGMENT_DEFAULTS` (by kind of
image), then a ``--config`` YAML file, then command-line flags; recipe fields left None are filled by :func:`resolve`.

Its length (about 420 lines) is its one concept: every run option with its limit and default sits beside the
others, so a reader checks an option's rule in one place.
"""

from __future__ import annotations

import dataclasses
import difflib
import sys
import time
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vitlab.catalog import dataset_info
from vitlab.data.datasets import canonical_dataset
from vitlab.errors import ConfigError
from vitlab.models.registry import find_preset, resolve_spec
from vitlab.models.spec import TIMM_PREFIX, ModelSpec, is_timm
from vitlab.train.distributed import DistContext
from vitlab.train.lock import check_free
from vitlab.train.options import coerce_value
from vitlab.train.output import check_new_run, check_path
from vitlab.train.recipes import DEIT3, RECIPES, recipe_defaults
from vitlab.train.tracking import check_logger

__all__ = ["AUGMENT_DEFAULTS", "DEFAULT_MODELS", "DEFAULT_RECIPES", "DEIT3", "NO_AUGMENT", "RECIPES", "RunConfig",
           "RunModel", "canonical_dataset", "coerce", "default_model", "default_recipe", "for_data", "load_yaml",
           "model_defaults", "recipe_defaults", "resolve_run_model", "settle", "size_defaults"]

# Training recipe by number of training images (the first row whose bound is >= N applies).
# The small-data row is tuned on mnist-5k (4,000 digits) with vit_mnist: batch 64 beat 128 and drop-path 0
# beat 0.1 (98.3% vs 97.2% after 60 epochs); 50 epochs (97.8%) fit in 5 minutes on one 2-core-machine thread,
# --epochs 60 gives 98.3%. Deep models (24+ blocks) still want --drop-path 0.1-0.2. See docs/training.md.
# The mid-size row is sized to Fashion-MNIST on a 2-core CPU: 20 epochs of batch 128 at lr 2e-3 (drop-path 0 for a
# 0.4M-parameter model) took 701 s with vit_mnist and ended at 88.2% test accuracy; the former row (30 epochs of
# batch 256 at lr 1e-3, drop-path 0.1) needed about 18 minutes. benchmarks/README.md, "Time to accuracy".
SIZE_DEFAULTS: list[tuple[int, dict[str, Any]]] = [
    (10_000, dict(epochs=50, batch_size=64, lr=2e-3, min_lr=1e-5, weight_decay=0.05, warmup_epochs=3,
                  label_smoothing=0.1, clip_grad=1.0, drop_path=0.0, ema_decay=0.0)),
    (100_000, dict(epochs=20, batch_size=128, lr=2e-3, min_lr=1e-5, weight_decay=0.05, warmup_epochs=2,
                   label_smoothing=0.1, clip_grad=1.0, drop_path=0.0, ema_decay=0.0)),
    (1 << 62, dict(epochs=10, batch_size=256, lr=1e-3, min_lr=1e-5, weight_decay=0.05, warmup_epochs=1,
                   label_smoothing=0.1, clip_grad=1.0, drop_path=0.1, ema_decay=0.0)),
]

# Augmentation by kind of image (each data set's kind is in vitlab.catalog): digits must not be flipped;
# natural images are flipped and shifted; clothing (Fashion-MNIST: centred, upright, mirror-symmetric garments) is
# flipped and shifted a little, never rotated or sheared: a rotated shirt or a sheared shoe is not a garment of the
# data set.
AUGMENT_DEFAULTS: dict[str, dict[str, Any]] = {
    "digits": dict(degrees=12.0, scale=(0.9, 1.1), shear=8.0, translate=0.12, erase_prob=0.0, hflip=False,
                   pad_crop=0, trivial_augment=False, mixup=0.0, cutmix=0.0),
    "clothing": dict(degrees=0.0, scale=(1.0, 1.0), shear=0.0, translate=0.0, erase_prob=0.0, hflip=True,
                     pad_crop=2, trivial_augment=False, mixup=0.0, cutmix=0.0),
    "natural": dict(degrees=0.0, scale=(1.0, 1.0), shear=0.0, translate=0.0, erase_prob=0.25, hflip=True,
                    pad_crop=4, trivial_augment=False, mixup=0.0, cutmix=0.0),
}
# what --no-augment sets: every augmentation off
NO_AUGMENT: dict[str, Any] = dict(degrees=0.0, scale=(1.0, 1.0), shear=0.0, translate=0.0, erase_prob=0.0,
                                  hflip=False, pad_crop=0, trivial_augment=False, mixup=0.0, cutmix=0.0,
                                  three_augment=False, color_jitter=0.0)

# Model overrides a data set's recipe applies to vitlab presets of arch 'vit' unless the user sets them.
# (on mnist-5k the class-token head learned far slower: 63% vs 80% test accuracy after 9 epochs; weight_init=xavier
# leaves the early plateau but did not reach 97.5% sooner: benchmarks/README.md, "Time to accuracy")
MODEL_DEFAULTS: dict[str, dict[str, Any]] = {"digits": {"global_pool": "avg"}, "clothing": {"global_pool": "avg"},
                                             "natural": {}}
# The model `vitlab train` trains with no --model, by kind of image (else vit_mnist; docs/training.md's scan), and
# the recipe options that model trains with unless the user sets them (DEFAULT_RECIPES). Command defaults, not library
# ones: RunConfig() and every study keep vit_mnist, the paper's plain ViT, and the recipe of the data set's size.
DEFAULT_MODELS: dict[str, str] = {"digits": "vit_mnist_conv_patch14", "clothing": "vit_fashion_conv_patch14"}
# clothing: a channels-last stem (1.16x the images/s on 2 cores), the 19 epochs 15 min hold, EMA, flip, 1-pixel shift
DEFAULT_RECIPES: dict[str, dict[str, Any]] = {"clothing": {**NO_AUGMENT, "epochs": 19, "lr": 3e-3, "warmup_epochs": 1,
                                                           "ema_decay": 0.999, "hflip": True, "pad_crop": 1,
                                                           "channels_last": True}}
PRESET_NEUTRAL = ("name", "num_classes", "drop_path_rate")  # no part of what a preset is: a label, data, recipe

AMP_MODES = ("auto", "bf16", "off")
OPTIMIZERS, LOSSES = ("adamw", "lamb"), ("ce", "bce")


@dataclass
class RunConfig:
    """Everything a training run needs besides the data; stored in each checkpoint's config.json."""

    model: str = "vit_mnist"  # a preset name, or timm:NAME
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
        """Fill every ``None`` recipe field from the defaults for ``num_train`` images of this data set, those of
        a named recipe (:func:`recipe_defaults`, ``width``: the model's embedding width) over them."""
        defaults = {**size_defaults(num_train), **AUGMENT_DEFAULTS[data_kind(self.dataset)]}
        batch_size = self.batch_size if self.batch_size is not None else defaults["batch_size"]
        defaults.update(recipe_defaults(self.recipe, batch_size=batch_size, width=width))
        filled = {k: v for k, v in defaults.items() if getattr(self, k) is None}
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


def size_defaults(num_train: int) -> dict[str, Any]:
    """The recipe row of :data:`SIZE_DEFAULTS` for a training set of ``num_train`` images."""
    return dict(next(row for bound, row in SIZE_DEFAULTS if num_train <= bound))


def data_kind(dataset: str) -> str:
    """The kind of image of a data set (its catalog entry's); natural for one the catalog does not know."""
    info = dataset_info(dataset)
    return info.kind if info is not None else "natural"


def model_defaults(dataset: str) -> dict[str, Any]:
    return dict(MODEL_DEFAULTS[data_kind(dataset)])


def default_model(dataset: str) -> str:
    """The preset `vitlab train` trains on ``dataset`` when no model is named (:data:`DEFAULT_MODELS`)."""
    return DEFAULT_MODELS.get(data_kind(dataset), RunConfig.model)


def default_recipe(dataset: str) -> dict[str, Any]:
    """The run options :func:`default_model` trains with on ``dataset`` where the user sets none
    (:data:`DEFAULT_RECIPES`); empty for a kind of image whose default recipe is that of its size."""
    return dict(DEFAULT_RECIPES.get(data_kind(dataset), {}))


# ------------------------------------------------------------------------------------- the run as it starts


def settle(cfg: RunConfig, ctx: DistContext, *, resume: str | Path | None = None,
           init_weights: str | Path | None = None, force: bool = False) -> tuple[RunConfig, RunModel, Path]:
    """The first stage of a run, before any data loads: the config checked (data set name made canonical, every
    value in range), its model config resolved once (:func:`resolve_run_model`), and the output folder (the same on
    every process), refused when another run writes there, a new run would overwrite a checkpoint or, unless
    ``force``, files in a folder without vitlab's marker (:mod:`vitlab.train.output`), or it sits in the data."""
    cfg = cfg.replace(dataset=canonical_dataset(cfg.dataset))
    cfg.validate()
    if resume is not None and init_weights is not None:
        raise ConfigError("a resumed run continues from its own weights; drop the initial weights, or start a new "
                          "run with another --output")
    run_model = resolve_run_model(cfg)
    if resume is None and ctx.is_main:
        warn_long_warmup(cfg)
    out = Path(cfg.output) if cfg.output else (Path(resume) if resume else default_output(cfg))
    out = Path(ctx.broadcast_object(str(out)))
    check_path(out, cfg.data_dir)
    if ctx.is_main:
        check_free(out)  # a live run writes there
    check_new_run(out, resume=resume, force=force)
    return cfg, run_model, out


def warn_long_warmup(cfg: RunConfig) -> None:
    """One line on stderr when a warm-up given is longer than the run: the learning rate then never reaches --lr
    nor decays (allowed, as a study of warm-ups may want it)."""
    if cfg.warmup_epochs is not None and cfg.epochs is not None and cfg.warmup_epochs > cfg.epochs:
        print(f"vitlab train: warning: the warm-up ({_num(cfg.warmup_epochs)} epochs) is longer than the run "
              f"({cfg.epochs} epochs), so the learning rate peaks at {100 * cfg.epochs / cfg.warmup_epochs:.0f}% of "
              f"--lr and never decays; pass --warmup-epochs {cfg.epochs} or less", file=sys.stderr, flush=True)


def default_output(cfg: RunConfig) -> Path:
    name = cfg.model.replace(":", "-").replace("/", "-")
    return Path("runs") / f"{name}_{cfg.dataset}_{time.strftime('%Y%m%d-%H%M%S')}"


def for_data(cfg: RunConfig, run_model: RunModel, num_train: int) -> tuple[RunConfig, RunModel]:
    """The config and model once the training set is known: the recipe of its size filled in
    (:meth:`RunConfig.resolve`), the model given the recipe's drop-path, and the run config storing the model options
    the model is built with."""
    cfg = cfg.resolve(num_train, width=run_model.width)
    run_model = run_model.with_recipe(cfg)
    return cfg.replace(model_overrides=run_model.overrides), run_model


@dataclass(frozen=True)
class RunModel:
    """The model config of a run, resolved once from its :class:`RunConfig` (see :func:`resolve_run_model`)."""

    spec: ModelSpec  # what the run builds, but for the data's class count (:meth:`spec_for`)
    overrides: dict[str, Any]  # the effective model options the run config stores (ModelConfig fields; timm kwargs)
    img_size: int  # the input the data is prepared at
    in_chans: int

    def with_recipe(self, cfg: RunConfig) -> RunModel:
        """This model with the resolved recipe's drop-path rate and rule, unless the model options set them."""
        recipe = {"drop_path_rate": cfg.drop_path}
        if cfg.drop_path_rule is not None:
            recipe["drop_path_rule"] = cfg.drop_path_rule
        recipe = {k: v for k, v in recipe.items() if k not in self.overrides}
        return dataclasses.replace(self, spec=self.spec.with_options(**recipe), overrides={**self.overrides, **recipe})

    @property
    def width(self) -> int | None:
        """The model's embedding width (vitlab presets; timm models: their ``embed_dim`` option), else None."""
        if self.spec.config is not None:
            return self.spec.config.embed_dim
        value = self.overrides.get("embed_dim")
        return int(value) if isinstance(value, int) else None

    def spec_for(self, num_classes: int) -> ModelSpec:
        """The spec of the run's model for the data's ``num_classes`` classes (they win over a ``num_classes``
        option)."""
        return self.spec.with_options(num_classes=num_classes)


def resolve_run_model(cfg: RunConfig) -> RunModel:
    """The model of run ``cfg``, before any data is loaded: the data set's defaults (vitlab ViTs) under the
    user's options, resolved into a spec once, and the input size and channels the data must be prepared at. The
    drop-path rate is a recipe option, known once the recipe is resolved for the training set's size
    (:meth:`RunModel.with_recipe`); the class count is the data's (:meth:`RunModel.spec_for`)."""
    name, overrides = cfg.model, dict(cfg.model_overrides)
    if is_timm(name):
        img_size, in_chans = _timm_input(name[len(TIMM_PREFIX):], overrides, cfg.dataset)
        spec = resolve_spec(name, **{**overrides, "img_size": img_size, "in_chans": in_chans})
        return RunModel(spec, overrides, img_size, in_chans)
    # the user's options checked as they stand, as vitlab.create_model checks them (a num_classes option too; the
    # data's count wins, spec_for); then the data set's defaults where the user set nothing
    spec = resolve_spec(name, **overrides)
    if spec.config.arch == "vit":
        defaults = {k: v for k, v in model_defaults(cfg.dataset).items() if k not in overrides}
        if cfg.recipe == "deit3" and spec.config.gate == "none" and "gate" not in overrides:
            defaults["gate"] = "layerscale"  # DeiT III trains its ViTs with LayerScale (init 1e-4, models_v2.py)
        overrides = {**defaults, **overrides}
        changed = spec.with_options(**defaults)
        # defaults that make the preset another preset take its name (vit_mnist -> vit_mnist_gap); no weight changes
        preset = find_preset(changed.config, PRESET_NEUTRAL) if changed.config != spec.config else None
        spec = changed.with_options(name=preset) if preset else changed
    return RunModel(spec, overrides, spec.config.img_size, spec.config.in_chans)


def _timm_input(name: str, overrides: dict[str, Any], dataset: str) -> tuple[int, int]:
    """(img_size, in_chans) a timm model is created for: the options, else the data set's native shape
    (vitlab.catalog), else timm's default size and 3 channels."""
    info = dataset_info(dataset)
    img_size = overrides.get("img_size", info.img_size if info else None)
    in_chans = overrides.get("in_chans", (info.in_chans if info else None) or 3)
    if img_size is None:
        img_size = _timm_default_size(name)
    if isinstance(img_size, list | tuple):
        if len(set(img_size)) != 1:
            raise ConfigError(f"img_size {img_size} must be square for vitlab's data; give one number")
        img_size = img_size[0]
    return int(img_size), int(in_chans)


def _timm_default_size(name: str) -> int:
    import timm

    try:
        return int(timm.get_pretrained_cfg(name).input_size[-1])
    except (AttributeError, RuntimeError, ValueError):
        return 224


def _type_of(name: str) -> Any:
    hints = typing.get_type_hints(RunConfig)
    return hints[name]


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
    import yaml

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist; check the --config path")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        detail = str(exc).replace("\n", " ")
        raise ConfigError(f"config file {path} is not valid YAML ({detail}); fix the syntax") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {path} cannot be read as UTF-8 text ({exc}); pass a YAML text file") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of options (key: value), "
                          f"got {type(data).__name__}")
    return coerce(data, f"config file {path}")
