"""The Hugging Face Hub folder that timm reads: a vitlab run (or model) as ``config.json`` + ``model.safetensors`` +
``README.md``, loaded by ``timm.create_model("hf-hub:ORG/NAME", pretrained=True)`` once uploaded, or by
``timm.create_model("local-dir:DIR", pretrained=True)`` on disk (with vitlab imported, which registers its
architectures in timm).

``config.json`` carries the keys timm's ``save_for_hf`` writes and ``load_model_config_from_path`` reads
(``timm/models/_hub.py``): ``architecture`` (the registered name, ``vitlab_<preset>``), ``num_classes``,
``num_features``, ``global_pool``, ``model_args`` (the keyword arguments that rebuild this architecture from the
preset: depth, widths, image size, ...; timm passes them to the model's entry point) and ``pretrained_cfg`` (the
run's input size, normalisation and class names, for ``timm.data.resolve_data_config``). It also keeps the run
folder's own ``config.json`` under ``"vitlab"``, so ``vitlab eval`` / ``predict --checkpoint DIR`` read the folder as
they read the run; ``manifest.json`` records the SHA-256 of both files, as in a run folder. ``README.md`` is a model
card generated from the run's record (data, recipe, command, metrics, hardware, licence).

Publishing is one call of the user's own ``huggingface_hub``: ``HfApi().upload_folder(repo_id=..., folder_path=DIR)``.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from torch import nn

from vitlab.checkpoint import CONFIG, FORMAT, WEIGHTS, ModelSpec, load_model, read_config, spec_of, state_mismatch
from vitlab.checkpoint import manifest as manifests
from vitlab.checkpoint.data_config import apply_checkpoint_config, check_run_data
from vitlab.checkpoint.files import is_run_folder, weights_of
from vitlab.checkpoint.textfiles import read_json
from vitlab.checkpoint.weights import read_safetensors, safetensors_bytes
from vitlab.errors import CheckpointError, ConfigError
from vitlab.models import PRESETS, ModelConfig, create_model, get_config
from vitlab.models.registry import preset_differences
from vitlab.version import __version__

CARD = "README.md"
VITLAB_KEY = "vitlab"  # config.json: the run folder's own config (format, model spec, run options)
TIMM_PREFIX = "vitlab_"  # the names vitlab's presets have in timm's registry (vitlab.interop.timm_registry)
LICENSE = "apache-2.0"  # the model card's default, vitlab's own licence (and timm's default)
# pretrained_cfg keys that say where weights came from (timm's filter_pretrained_cfg(remove_source=True)), and the
# keys timm keeps even when they are None
SOURCE_KEYS = {"url", "file", "hf_hub_id", "hf_hub_filename", "source", "state_dict", "tag"}
KEEP_NULL = {"pool_size", "first_conv", "classifier"}
# the papers behind each part of an architecture, named in the model card
PAPERS = {
    "vit": "Dosovitskiy et al. 2021, An Image is Worth 16x16 Words (ViT)",
    "cait": "Touvron et al. 2021, Going deeper with Image Transformers (CaiT: class attention, talking heads)",
    "reattention": "Zhou et al. 2021, DeepViT: Towards Deeper Vision Transformer (re-attention)",
    "talking_heads": "Shazeer et al. 2020, Talking-Heads Attention",
    "vit5": "Wang et al., ViT-5 (RMSNorm, QK-norm, 2-D RoPE, registers at the end)",
    "registers": "Darcet et al. 2024, Vision Transformers Need Registers",
    "layerscale": "Touvron et al. 2021, Going deeper with Image Transformers (LayerScale)",
    "conv_stem": "Xiao et al. 2021, Early Convolutions Help Transformers See Better (convolutional stem)",
}
HF_DATASETS = {"mnist": "mnist", "mnist-5k": "mnist", "fashion-mnist": "fashion_mnist", "cifar10": "cifar10",
               "cifar100": "cifar100"}


# ---- config.json ----------------------------------------------------------------------------------------------------

def timm_architecture(spec: ModelSpec) -> tuple[str, dict[str, Any]]:
    """The name timm builds ``spec`` by and the ``model_args`` that make it this model: for a vitlab config the
    preset it is closest to (``vitlab_<preset>``) and the fields that differ from that preset, always with
    ``img_size``, ``in_chans`` and ``num_classes``; for a timm model its name and keyword arguments."""
    if spec.is_timm:
        return spec.timm, dict(spec.kwargs)
    cfg = spec.config
    preset = cfg.name if cfg.name in PRESETS else min(
        PRESETS, key=lambda p: len(preset_differences(cfg, p, ignore=("name",))))
    args = {"img_size": cfg.img_size, "in_chans": cfg.in_chans, "num_classes": cfg.num_classes,
            **preset_differences(cfg, preset, ignore=("name",))}
    for _ in range(2):  # a preset's rule may re-derive a field from another (CaiT's LayerScale init at a new depth)
        rebuilt = get_config(preset, **args).to_dict()
        wrong = {k: v for k, v in cfg.to_dict().items() if k != "name" and rebuilt[k] != v}
        if not wrong:
            return TIMM_PREFIX + preset, args
        args.update(wrong)
    raise ConfigError(f"cannot express the {spec.label} model as timm's {TIMM_PREFIX}{preset} with keyword "
                      f"arguments (fields {', '.join(wrong)} differ); report this as a vitlab bug")


def hub_config(model: nn.Module, checkpoint_config: dict[str, Any]) -> dict[str, Any]:
    """The ``config.json`` of the Hub folder of ``model`` (its ``pretrained_cfg`` set from the run, as
    :func:`vitlab.checkpoint.load_model` sets it), in the layout of timm's ``save_config_for_hf``, with
    ``checkpoint_config`` (the run folder's ``config.json``) under ``"vitlab"``."""
    architecture, model_args = timm_architecture(ModelSpec.from_dict(checkpoint_config["model"]))
    pretrained_cfg = {k: _json(v) for k, v in (getattr(model, "pretrained_cfg", None) or {}).items()
                      if k not in SOURCE_KEYS and k != "architecture" and (v is not None or k in KEEP_NULL)}
    pretrained_cfg["custom_load"] = False  # the weights are the model's own state dict
    num_classes = int(getattr(model, "num_classes", pretrained_cfg.get("num_classes", 0)))
    pretrained_cfg["num_classes"] = num_classes
    out: dict[str, Any] = {"architecture": architecture, "num_classes": num_classes}
    if getattr(model, "num_features", None) is not None:
        out["num_features"] = int(model.num_features)
    pool = _global_pool(model)
    if pool:
        out["global_pool"] = pool
    out["model_args"] = _json(model_args)
    out["pretrained_cfg"] = pretrained_cfg
    out[VITLAB_KEY] = checkpoint_config
    return out


def _global_pool(model: nn.Module) -> str | None:
    cfg = getattr(model, "cfg", None)
    if isinstance(cfg, ModelConfig):
        return cfg.global_pool
    pool = getattr(model, "global_pool", None)
    return pool if isinstance(pool, str) and pool else None


def _json(value: Any) -> Any:
    """``value`` as JSON holds it (tuples as lists)."""
    if isinstance(value, dict):
        return {k: _json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json(v) for v in value]
    return value


# ---- README.md: the model card --------------------------------------------------------------------------------------

def model_card(config: dict[str, Any], summary: dict[str, Any] | None, *, name: str,
               license: str = LICENSE) -> str:
    """The model card (``README.md``, Hub metadata in its YAML header) of a Hub folder whose ``config.json`` is
    ``config``, from the run's record: its data, recipe, command, metrics and hardware (``summary``: the run's
    ``summary.json``, None for a model saved without a run)."""
    vitlab = config[VITLAB_KEY]
    spec = ModelSpec.from_dict(vitlab["model"])
    run = vitlab.get("run") or {}
    summary = summary or {}
    pre = config["pretrained_cfg"]
    dataset = run.get("dataset")
    lines = ["---", "tags:", "- image-classification", "- timm", "- vitlab", "library_name: timm",
             f"license: {license}", "pipeline_tag: image-classification"]
    if dataset in HF_DATASETS:
        lines += ["datasets:", f"- {HF_DATASETS[dataset]}"]
    lines += ["---", f"# Model card for {name}", ""]
    what = f"a vitlab {spec.label} model" + (f" trained on {dataset}" if dataset else "")
    lines += [f"{what[0].upper()}{what[1:]} with vitlab "
              f"{vitlab.get('vitlab_version', __version__)}; timm loads it as `{config['architecture']}` once vitlab "
              "is imported.", ""]
    lines += ["## Model details", ""]
    lines += [f"- **Architecture:** `{config['architecture']}` with `model_args` "
              f"{json.dumps(config['model_args'], sort_keys=True)}"]
    lines += [f"- **Input:** {' x '.join(str(s) for s in pre.get('input_size', ()))} (channels x height x width), "
              f"normalised with mean {pre.get('mean')} and std {pre.get('std')}, resized "
              f"{pre.get('interpolation', 'bilinear')}, crop {pre.get('crop_pct', 1.0)}"]
    classes = pre.get("label_names")
    lines += [f"- **Classes:** {config['num_classes']}" + (f" ({', '.join(map(str, classes))})" if classes else "")]
    for key, label, scale in (("params", "Parameters (M)", 1e-6), ("macs", "GMACs per image", 1e-9)):
        if isinstance(summary.get(key), int | float):
            lines.append(f"- **{label}:** {summary[key] * scale:.4g}")
    lines += [f"- **Papers:** {'; '.join(_papers(spec))}", ""]
    if run:
        lines += ["## Training", ""] + _training(run, summary) + [""]
    results = _results(summary)
    if results:
        lines += ["## Results", "", "| metric | value |", "| --- | --- |"] + results + [""]
    lines += ["## Use", "", "```python", "import timm", "import vitlab  # registers vitlab's architectures in timm",
              "", f'model = timm.create_model("hf-hub:ORG/{name}", pretrained=True).eval()  # or "local-dir:PATH"',
              "config = timm.data.resolve_data_config(model=model)  # input size, mean, std of the run",
              "```", "", "With vitlab's commands: `vitlab eval --checkpoint PATH` and "
              "`vitlab predict --checkpoint PATH IMAGE...` read this folder as they read the run folder.", ""]
    lines += ["## Licence", "", f"The weights are released under `{license}`"
              + (f"; they were trained on {dataset}, whose own terms apply to them as well." if dataset else ".")]
    return "\n".join(lines) + "\n"


def _papers(spec: ModelSpec) -> list[str]:
    if spec.is_timm:
        return [f"see timm's documentation of {spec.timm}"]
    cfg = spec.config
    keys = ["cait" if cfg.arch == "cait" else "vit"]
    keys += [k for k, on in (("reattention", cfg.attn == "reattention"),
                             ("talking_heads", cfg.attn == "talking_heads" and cfg.arch != "cait"),
                             ("vit5", cfg.rope_layout == "vit5"), ("registers", cfg.reg_tokens > 0),
                             ("layerscale", cfg.gate == "layerscale" and cfg.arch != "cait"),
                             ("conv_stem", cfg.stem == "conv")) if on]
    return [PAPERS[k] for k in keys]


def _training(run: dict[str, Any], summary: dict[str, Any]) -> list[str]:
    data = run.get("data") or {}
    sizes = ", ".join(f"{data[k]} {what}" for k, what in (("num_train", "training images"),
                                                          ("num_test", "test images")) if data.get(k) is not None)
    out = [f"- **Data:** {run.get('dataset')}" + (f" ({sizes})" if sizes else "")
           + (f", {run['val_split']} held out for validation" if run.get("val_split") else "")]
    recipe = [f"{run.get(k)} {label}" for k, label in (("epochs", "epochs"), ("batch_size", "images per batch"))
              if run.get(k) is not None]
    recipe += [f"{label} {run[k]:g}" for k, label in (("lr", "peak lr"), ("weight_decay", "weight decay"),
                                                     ("warmup_epochs", "warmup epochs"),
                                                     ("label_smoothing", "label smoothing"),
                                                     ("clip_grad", "gradient clip"), ("ema_decay", "EMA decay"),
                                                     ("drop_path", "drop path"))
               if isinstance(run.get(k), int | float) and not isinstance(run.get(k), bool)
               and (run[k] or k not in ("ema_decay", "drop_path"))]
    recipe += [f"optimizer {run.get('optimizer') or 'adamw'}", f"recipe {run.get('recipe') or 'default'}",
               f"seed {run.get('seed')}"]
    out.append(f"- **Recipe:** {', '.join(recipe)}")
    augment = [f"{k} {run[k]}" for k in ("degrees", "scale", "shear", "translate", "erase_prob", "hflip",
                                         "pad_crop", "mixup", "cutmix") if run.get(k) not in (None, 0, 0.0, False)]
    out.append(f"- **Augmentation:** {', '.join(augment) if augment else 'none'}")
    if summary.get("command"):
        out.append(f"- **Command:** `{summary['command']}`")
    if summary.get("git_commit"):
        out.append(f"- **Code:** vitlab git commit {summary['git_commit']}")
    hardware = [f"{k.replace('_', ' ')} {summary[k]}" for k in ("device", "cpu", "cpu_model", "gpu", "gpu_name",
                                                                 "world_size", "threads", "slices") if
                summary.get(k) not in (None, "")]
    if hardware:
        out.append(f"- **Hardware:** {', '.join(hardware)}")
    times = [f"{label} {summary[k]:.1f} s" for k, label in (("train_time_s", "training"), ("wall_time_s", "wall"))
             if isinstance(summary.get(k), int | float)]
    if isinstance(summary.get("train_images_per_second"), int | float):
        times.append(f"{summary['train_images_per_second']:.0f} training images/s")
    if times:
        out.append(f"- **Time:** {', '.join(times)}")
    return out


def _results(summary: dict[str, Any]) -> list[str]:
    rows = []
    for key, value in summary.items():
        if not key.startswith(("final_", "best_")) or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if key == "best_epoch" or not math.isfinite(value):
            continue
        shown = f"{100 * value:.2f} %" if key.endswith("_acc") else f"{value:.4f}"
        if key.startswith("best_") and summary.get("best_epoch") is not None:
            shown += f" (epoch {summary['best_epoch']})"
        rows.append(f"| {key.replace('_', ' ')} | {shown} |")
    return rows


# ---- writing the folder ---------------------------------------------------------------------------------------------

def save_for_hf(source: str | os.PathLike | nn.Module, out_dir: str | os.PathLike, *, force: bool = False,
                license: str = LICENSE, name: str | None = None, verify: bool = True) -> Path:
    """Write the Hub folder of ``source`` (a run folder, a Hub folder, or a model built by
    :func:`vitlab.create_model`) to ``out_dir``: ``config.json``, ``model.safetensors``, ``README.md`` (the model
    card, its licence ``license``, named ``name`` or the folder's name) and ``manifest.json``.

    The folder is written whole under a temporary name beside ``out_dir`` and renamed into place, so an error leaves
    nothing behind. An existing ``out_dir`` that is not empty is refused unless ``force`` and it is an earlier Hub
    folder of vitlab (never a run folder or a folder of other files)."""
    out = Path(out_dir)
    _check_target(out, force)
    if isinstance(source, nn.Module):
        model = source
        checkpoint_config = {"format": FORMAT, "model": spec_of(model).to_dict(), "run": None,
                             "vitlab_version": __version__}
        summary = None
    else:
        model, checkpoint_config = load_checkpoint(source, verify=verify)
        summary = _summary(Path(source))
    config = hub_config(model, checkpoint_config)
    card = model_card(config, summary, name=name or out.resolve().name, license=license)
    blobs = {WEIGHTS: safetensors_bytes(weights_of(model), {"format": "pt"}),
             CONFIG: (json.dumps(config, indent=2) + "\n").encode(), CARD: card.encode()}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp"))
    try:
        for file, data in blobs.items():
            (tmp / file).write_bytes(data)
        manifests.commit(tmp, {k: manifests.entry_of(v) for k, v in blobs.items() if k != CARD})
        os.chmod(tmp, 0o777 & ~_umask())
        _replace_dir(tmp, out)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(f"cannot write the Hub folder {out} ({exc.strerror or exc}); nothing was written there, "
                              "free some space or pick another output") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _check_target(out: Path, force: bool) -> None:
    """Refuse, in one line, an output that is a file, a run folder, or a folder with files in it (unless ``force``
    and it is an earlier Hub folder)."""
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise CheckpointError(f"output {out} exists and is not a folder; pick another --output")
    if not out.is_dir() or not any(out.iterdir()):
        return
    if is_run_folder(out):
        raise CheckpointError(f"output {out} is a run folder of vitlab (its files belong to that run); write the "
                              "Hub folder elsewhere")
    if not is_hub_folder(out):
        raise CheckpointError(f"output {out} holds files that are not a Hub folder of vitlab; pick another --output "
                              "(an empty or new folder)")
    if not force:
        raise CheckpointError(f"output {out} already holds a Hub folder; pass --force to replace it, or pick "
                              "another --output")


def _replace_dir(tmp: Path, out: Path) -> None:
    """Put the folder ``tmp`` at ``out`` (missing, empty, or an earlier export moved aside and then removed)."""
    if out.is_dir() and any(out.iterdir()):
        old = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".old"))
        os.replace(out, old / "x")
        try:
            os.replace(tmp, out)
        except OSError:
            os.replace(old / "x", out)  # put the earlier export back
            raise
        shutil.rmtree(old, ignore_errors=True)
        return
    if out.is_dir():
        out.rmdir()
    os.replace(tmp, out)


def _summary(folder: Path) -> dict[str, Any] | None:
    """The run's ``summary.json`` (a Hub folder's copy inside its card is not read back)."""
    try:
        data = json.loads((folder / "summary.json").read_text())
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


# ---- reading it back ------------------------------------------------------------------------------------------------

def is_hub_folder(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a folder whose ``config.json`` is a Hub config written by vitlab (timm's keys and the
    run's config under ``"vitlab"``)."""
    file = Path(path) / CONFIG
    try:
        if not file.is_file() or file.stat().st_size > 1 << 24:
            return False
        config = json.loads(file.read_bytes())
    except (OSError, ValueError, RecursionError):  # RecursionError: JSON nested too deeply to read
        return False
    return isinstance(config, dict) and "architecture" in config and isinstance(config.get(VITLAB_KEY), dict)


def read_hub_config(path: str | os.PathLike, *, verify: bool = True) -> dict[str, Any]:
    """The run config a Hub folder keeps under ``"vitlab"`` (the run folder's ``config.json``), validated as a run
    folder's is and checked to describe the model timm builds from ``architecture`` and ``model_args``; unless
    ``verify`` is False, the file is first checked against the folder's ``manifest.json``."""
    file = Path(path) / CONFIG
    config = read_json(file, fix="restore the Hub folder from its source", error=CheckpointError)  # 16 MiB at most
    if verify:
        manifests.verify(file)
    vitlab = config.get(VITLAB_KEY) if isinstance(config, dict) else None
    if not isinstance(vitlab, dict) or vitlab.get("format") != FORMAT or not isinstance(vitlab.get("model"), dict):
        raise CheckpointError(f"{file} has no vitlab run config under '{VITLAB_KEY}'; load this folder with "
                              "timm.create_model('local-dir:...') or export it again with `vitlab export`")
    try:
        spec = ModelSpec.from_dict(vitlab["model"])
        architecture, model_args = timm_architecture(spec)
    except (ValueError, TypeError) as exc:
        raise CheckpointError(f"cannot rebuild the model of {path} ({exc})") from None
    if (config.get("architecture"), config.get("model_args")) != (architecture, _json(model_args)):
        raise CheckpointError(f"{file}: architecture/model_args ({config.get('architecture')}) do not describe the "
                              f"model under '{VITLAB_KEY}' ({architecture}): the file was edited; export the run again")
    check_run_data(vitlab, file, spec.input_shape[1], spec.options().get("num_classes"))
    return vitlab


def load_checkpoint(path: str | os.PathLike, *, model: str | None = None,
                    verify: bool = True) -> tuple[nn.Module, dict[str, Any]]:
    """The model and the run config (``config.json`` of a run folder) of a run folder or a Hub folder written by
    :func:`save_for_hf`: what ``vitlab eval`` and ``predict`` read. ``model`` names the architecture expected (a
    preset or ``timm:NAME``); ``verify=False`` loads files whose SHA-256 no longer matches ``manifest.json``."""
    p = Path(path)
    if not is_hub_folder(p):
        return load_model(p, model=model, verify=verify), read_config(p, verify=False)
    config = read_hub_config(p, verify=verify)
    spec = ModelSpec.from_dict(config["model"])
    net = create_model(spec)
    if model is not None:
        stored = spec.options()
        shape = {k: stored[k] for k in ("img_size", "patch_size", "in_chans", "num_classes")
                 if stored.get(k) is not None}
        wanted = spec_of(create_model(model, **shape))
        if _without_name(wanted) != _without_name(spec):
            raise CheckpointError(f"{p} holds a {spec.label} model but a {wanted.label} model was asked for; load it "
                                  "without --model, or pass the matching --model")
    file = p / WEIGHTS
    if not file.is_file():
        raise CheckpointError(f"{p} has no {WEIGHTS}; restore the Hub folder from its source")
    state = read_safetensors(file)[0]
    if verify:
        manifests.verify(file)
    problem = state_mismatch(net.state_dict(), state)
    if problem:
        raise CheckpointError(f"{file} does not fit the {spec.label} model of its {CONFIG}: {problem}; export the run "
                              "again")
    net.load_state_dict(state)
    return apply_checkpoint_config(net, config), config


def _without_name(spec: ModelSpec) -> dict[str, Any]:
    return {k: v for k, v in spec.to_dict().items() if k != "name"}
