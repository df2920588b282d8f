"""Load weights from a local file (or, online, through timm) into a vitlab model, adapting them to its shape.

Adaptations: the position embedding is resampled bicubically to another grid (prefix slots for the class,
distillation and register tokens kept apart; CaiT's is patches-only); the patch kernel is resampled when the
patch size changes (timm's FlexiViT pseudo-inverse); the input channels are summed for ``in_chans=1`` or
repeated and rescaled otherwise; a head of another size is replaced by a fresh one. Every other key and shape
must match: a mismatch is an error that lists them.
"""

from __future__ import annotations

import math
import os
import re
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch
from torch import Tensor, nn

from vitlab.checkpoint import read_weights
from vitlab.checkpoint.data_config import apply_checkpoint_file
from vitlab.checkpoint.weights import first_line
from vitlab.errors import CheckpointError, ConfigError
from vitlab.interop.checks import block_indices, check_dtypes, check_finite, expect, naming
from vitlab.interop.timm_config import config_from_state_dict, config_from_timm
from vitlab.interop.timm_convert import from_timm_state_dict
from vitlab.layers import build_pos_embed, resample_abs_pos_embed
from vitlab.layers.pos_embed import pos_embed_at_grid
from vitlab.models import ModelConfig, VitlabModel, create_model, get_config
from vitlab.models.size_limits import check_budget

HUB_PREFIXES = ("timm:", "hf-hub:")
_WRAPPERS = ("module.", "_orig_mod.", "model.")  # DDP, torch.compile, Lightning-style key prefixes


def load_pretrained(model_or_name: VitlabModel | ModelConfig | str | None = None, path: str | os.PathLike | None = None,
                    *, drop_dist_token: bool = False, verify: bool = True, allow_nonfinite: bool = False,
                    **overrides: Any) -> VitlabModel:
    """Load weights into a vitlab model, adapting them to its image size, patch size, channels and classes.

    ``model_or_name``: a model (loaded in place unless ``overrides`` ask for another shape), a
    :class:`ModelConfig`, a vitlab preset, ``'timm:NAME'`` / ``'hf-hub:ORG/NAME'``, or None to read the
    architecture from a vitlab checkpoint's config or infer it from the shapes. ``path``: a ``.safetensors``
    or ``.pth`` file (timm's or vitlab's state dict; ``.pth`` read with ``weights_only=True``) or a vitlab
    checkpoint directory; without it, a ``timm:``/``hf-hub:`` name downloads through timm. ``overrides`` are
    :class:`ModelConfig` fields; for a name the image size, patch size, channels and classes default to the
    checkpoint's. ``drop_dist_token`` loads a distilled DeiT without its distillation token. ``verify=False`` loads
    a vitlab checkpoint file whose SHA-256 no longer matches its ``manifest.json`` (edited on purpose).

    Every key and shape is checked before the model is allocated (dense floating-point tensors, block indices 0 to
    N-1 matching the model's depth, then the whole state against the model built on the meta device), and NaN or
    infinite weights are refused unless ``allow_nonfinite``: one :class:`CheckpointError` line naming the file and
    the key; a model passed in is left untouched.
    """
    if path is None and isinstance(model_or_name, (str, os.PathLike)) and not str(model_or_name).startswith(
            HUB_PREFIXES) and Path(model_or_name).exists():
        model_or_name, path = None, model_or_name
    if path is None:
        if isinstance(model_or_name, str) and model_or_name.startswith(HUB_PREFIXES):
            return from_timm(download_timm(model_or_name), **overrides)
        raise CheckpointError("load_pretrained needs a weight file: load_pretrained(MODEL_OR_NAME, "
                              "'path/to/weights.safetensors'), or a 'timm:NAME' to download while online")
    state, file_cfg = read_weights(path, verify=verify)
    state = strip_wrappers(state)
    with naming(str(path)):
        check_dtypes(state)
        check_finite(state, allow_nonfinite)
        given = isinstance(model_or_name, VitlabModel) and not overrides
        cfg = model_or_name.cfg if given else _target_config(model_or_name, state, file_cfg, overrides)
        if not given:
            check_budget(cfg)  # a model too large to build is refused as create_model would, before the keys
        check_depth(state, cfg)
        # every key and shape against the model, built on the meta device (no memory) unless it was passed in
        adapted = adapt_state_dict(state, model_or_name if given else create_model(cfg, device="meta"),
                                   drop_dist_token=drop_dist_token)
    model = model_or_name if given else create_model(cfg)
    if any(v.is_meta for v in adapted.values()):  # a fresh head (another class count), drawn for real this time
        adapted = adapt_state_dict(state, model, drop_dist_token=drop_dist_token)
    model.load_state_dict(adapted)
    return apply_checkpoint_file(model, path)  # pretrained_cfg: a vitlab run's normalisation, for timm.data


def check_depth(state: dict[str, Tensor], cfg: ModelConfig) -> None:
    """Refuse weights whose blocks do not run ``blocks.0`` to ``blocks.{depth-1}`` (and CaiT's
    ``blocks_token_only``) of ``cfg``, from the keys alone: a file naming ``blocks.4999`` builds nothing."""
    families = [("blocks", cfg.depth)] + ([("blocks_token_only", cfg.depth_token_only)] if cfg.arch == "cait" else [])
    for prefix, depth in families:
        n = block_indices(state, prefix)
        if n < depth:
            raise CheckpointError(f"missing keys {prefix}.{n}.* to {prefix}.{depth - 1}.*: the model has depth "
                                  f"{depth}, the weights hold {n} blocks, expected {depth}; load them into the model "
                                  f"they were saved from (pass it as model_or_name, or --model NAME)")
        if n > depth:
            raise CheckpointError(f"unexpected keys {prefix}.{depth}.* to {prefix}.{n - 1}.*: the model has depth "
                                  f"{depth}, the weights hold {n} blocks, expected {depth}; load them into the model "
                                  f"they were saved from (pass it as model_or_name, or --model NAME)")


def _target_config(model_or_name: Any, state: dict[str, Tensor], file_cfg: ModelConfig | None,
                   overrides: dict) -> ModelConfig:
    """The config of the model the weights go into (built by ``create_model(cfg)``, as before this check)."""
    if isinstance(model_or_name, VitlabModel):
        return model_or_name.cfg.replace(**overrides)
    if isinstance(model_or_name, ModelConfig):
        return model_or_name.replace(**overrides)
    if model_or_name is None and file_cfg is not None:
        return file_cfg.replace(**overrides)
    if model_or_name is None:
        base = config_from_state_dict(state, num_heads=overrides.get("num_heads"),
                                      global_pool=overrides.get("global_pool"))
    elif isinstance(model_or_name, str) and model_or_name.startswith(HUB_PREFIXES):
        base = config_from_timm(timm_skeleton(model_or_name))
    elif isinstance(model_or_name, str):
        base = get_config(model_or_name)
    else:
        raise ConfigError(f"model_or_name must be a vitlab model, a ModelConfig, a preset or 'timm:NAME' name, "
                          f"or None, got {type(model_or_name).__name__}")
    return base.replace(**{**source_geometry(state, base), **overrides})


def from_timm(timm_model: nn.Module, **overrides) -> VitlabModel:
    """The vitlab model equivalent to ``timm_model`` (timm's ``VisionTransformer`` or ``Cait``), carrying its
    weights; same device, dtype and train/eval mode.

    ``overrides`` are :class:`ModelConfig` fields; ``img_size``, ``patch_size``, ``in_chans`` and
    ``num_classes`` adapt the weights as :func:`vitlab.load_pretrained` does.
    """
    model = create_model(config_from_timm(timm_model, **overrides))
    model.load_state_dict(adapt_state_dict(timm_model.state_dict(), model))
    p = next(timm_model.parameters(), None)
    if p is not None:
        model.to(device=p.device, dtype=p.dtype)
    return model.train(timm_model.training)


# ---------------------------------------------------------------- weight files

def strip_wrappers(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Remove a ``module.`` / ``_orig_mod.`` / ``model.`` prefix that every key carries."""
    changed = True
    while changed and state:
        changed = False
        for prefix in _WRAPPERS:
            if all(k.startswith(prefix) for k in state):
                state = {k[len(prefix):]: v for k, v in state.items()}
                changed = True
    return state


# ---------------------------------------------------------------- adaptation

def pos_slots(model: VitlabModel) -> int:
    """Prefix slots at the front of ``model``'s position table (class and front registers, if it has them)."""
    return model.num_prefix_tokens if model.cfg.pos_embed_cls else 0


def source_geometry(state: dict[str, Tensor], base: ModelConfig) -> dict[str, int]:
    """``img_size``, ``patch_size``, ``in_chans``, ``num_classes`` (and a convolutional stem's ``stem_chans``) of the
    weights, read from their shapes for an architecture like ``base``; fields the shapes do not show are left out."""
    out: dict[str, int] = {}
    kernel = (None, None, None, None)
    proj = expect(state, "patch_embed.proj.weight", kernel, why=" (embed_dim, channels, patch, patch)")
    first = expect(state, "patch_embed.conv1.weight" if base.stem == "conv" else "patch_embed.proj.weight", kernel,
                   why=" (channels out, channels in, kernel, kernel)")
    head = expect(state, "head.weight", (None, None), why=" (classes, embed_dim)")
    if proj is not None:
        out["patch_size"] = proj.shape[-1] * (2 if base.stem == "conv" else 1)
    if first is not None:
        out["in_chans"] = first.shape[1]
        if base.stem == "conv":
            out["stem_chans"] = first.shape[0]
    out["num_classes"] = head.shape[0] if head is not None else 0
    pos = state.get("pos_embed")
    if pos is not None and pos.ndim == 3 and "patch_size" in out:
        slots = 0
        if base.pos_embed_cls and base.arch == "vit":
            slots = int(base.class_token) + (base.reg_tokens if base.reg_position == "front" else 0)
            slots += int("dist_token" in state)
        grid = math.isqrt(max(pos.shape[1] - slots, 0))
        if grid and grid * grid == pos.shape[1] - slots:
            out["img_size"] = grid * out["patch_size"]
    return out


def adapt_state_dict(state: dict[str, Tensor], model: VitlabModel, *, drop_dist_token: bool = False
                     ) -> dict[str, Tensor]:
    """``state`` (timm's or vitlab's layout) under ``model``'s names and shapes, ready for a strict load.

    Raises :class:`CheckpointError` listing missing and unexpected keys and shape mismatches.
    """
    state = strip_wrappers(dict(state))
    if any(re.match(r"^blocks\.\d+\.attn\.rope(_reg)?\.freqs$", k) for k in state):
        raise CheckpointError("the weights hold RoPE freqs buffers: a checkpoint of the ViT-5 authors' code; load it "
                              "with vitlab.from_vit5(path) or `vitlab convert --from vit5 IN OUT`")
    if model.cfg.arch == "vit":  # DeiT-III's original layer-scale names
        state = {re.sub(r"^blocks\.(\d+)\.gamma_([12])$", r"blocks.\1.ls\2.gamma", k): v for k, v in state.items()}
    state = from_timm_state_dict(state, model)
    target = model.state_dict()
    _drop_dist(state, model, drop_dist_token)
    _adapt_pos_embed(state, model, target)
    _adapt_patch_embed(state, model, target)
    _adapt_head(state, model, target)
    check_state_dict(state, target, model)
    return state


def _drop_dist(state: dict[str, Tensor], model: VitlabModel, drop: bool) -> None:
    if "dist_token" not in state:
        return
    if not drop:
        raise CheckpointError("the weights carry a distillation token (dist_token, head_dist: a distilled DeiT), "
                              "which vitlab models do not have; pass drop_dist_token=True (--drop-dist-token) to "
                              "load them without it")
    for key in ("dist_token", "head_dist.weight", "head_dist.bias"):
        state.pop(key, None)
    pos = state.get("pos_embed")
    if pos is not None and pos.ndim == 3 and pos_slots(model) and model.cfg.class_token:
        state["pos_embed"] = torch.cat([pos[:, :1], pos[:, 2:]], dim=1)  # [cls, dist, patches] -> [cls, patches]


def _adapt_pos_embed(state: dict[str, Tensor], model: VitlabModel, target: dict[str, Tensor]) -> None:
    src = state.get("pos_embed")
    if src is None or "pos_embed" not in target or src.ndim != 3 or src.shape[-1] != target["pos_embed"].shape[-1]:
        return
    slots = pos_slots(model)
    grid = math.isqrt(max(src.shape[1] - slots, 0))
    if grid == 0 or grid * grid != src.shape[1] - slots:
        raise CheckpointError(f"pos_embed holds {src.shape[1]} positions, not {slots} prefix slot(s) plus a square "
                              f"grid: the weights have another token layout (class token, registers, "
                              f"no_embed_class); load them into the model they were saved from")
    if grid == model.grid_size:
        return
    if isinstance(model.pos_embed, nn.Parameter):
        state["pos_embed"] = resample_abs_pos_embed(src, model.grid_size, num_prefix=slots, mode="bicubic",
                                                    antialias=model.cfg.pos_resample_antialias)
    else:  # a fixed table moves to the new grid as the model would move it (pos_embed_at_grid)
        kind = model.cfg.pos_embed
        own = build_pos_embed(kind, grid_size=grid, dim=src.shape[-1], num_prefix=slots)
        if own is None or not torch.allclose(src.float(), own.to(src.dtype).float(), atol=1e-6):
            raise CheckpointError(f"the file's pos_embed ({grid}x{grid} grid) is not the fixed {kind} table this model "
                                  f"builds at that grid, so replacing it would drop learned weights; load it into a "
                                  f"model with pos_embed='learned' (resampled) or at "
                                  f"img_size={grid * model.cfg.patch_size} (its own grid)")
        state["pos_embed"] = pos_embed_at_grid(kind, src, model.grid_size, grid, num_prefix=slots,
                                               antialias=model.cfg.pos_resample_antialias)


def _adapt_patch_embed(state: dict[str, Tensor], model: VitlabModel, target: dict[str, Tensor]) -> None:
    key = "patch_embed.proj.weight"
    w = state.get(key)  # another width or a malformed kernel: left to the shape check
    if (w is not None and key in target and w.ndim == 4 and w.numel() and w.shape[0] == target[key].shape[0]
            and w.shape[-2:] != target[key].shape[-2:]):
        state[key] = resample_patch_kernel(w, target[key].shape[-1])
    first = "patch_embed.conv1.weight" if model.cfg.stem == "conv" else key
    w = state.get(first)
    if (w is not None and first in target and w.ndim == 4 and w.numel() and w.shape[0] == target[first].shape[0]
            and w.shape[1] != target[first].shape[1]):
        state[first] = adapt_input_channels(w, target[first].shape[1])


def _adapt_head(state: dict[str, Tensor], model: VitlabModel, target: dict[str, Tensor]) -> None:
    if "head.weight" not in target:  # num_classes=0: features only
        state.pop("head.weight", None)
        state.pop("head.bias", None)
        return
    w = state.get("head.weight")
    if w is not None and w.shape == target["head.weight"].shape:
        return
    if w is not None and (w.ndim != 2 or w.shape[-1] != target["head.weight"].shape[-1]):
        return  # another embed_dim, or not a matrix: reported by the shape check
    weight = torch.empty_like(target["head.weight"])  # another number of classes: a fresh head, as the model's init
    nn.init.trunc_normal_(weight, std=0.02)
    state["head.weight"], state["head.bias"] = weight, torch.zeros_like(target["head.bias"])


def resample_patch_kernel(weight: Tensor, patch_size: int) -> Tensor:
    """Resample a patch-embedding kernel ``(D, C, p, p)`` to ``(D, C, patch_size, patch_size)`` so that a patch
    resized to the new size gives (as near as possible) the same embedding (FlexiViT, via timm)."""
    from timm.layers import resample_patch_embed

    out = resample_patch_embed(weight.float(), [patch_size, patch_size], interpolation="bicubic", antialias=True)
    return out.to(weight.dtype)


def adapt_input_channels(weight: Tensor, in_chans: int) -> Tensor:
    """A first-layer kernel ``(D, C, k, k)`` for ``in_chans`` inputs: ``in_chans=1`` sums the channels (a gray
    image then gives the features of its RGB copy); other counts repeat the channels cyclically and rescale
    by ``C / in_chans`` (timm's rule)."""
    c = weight.shape[1]
    if in_chans == c:
        return weight
    w = weight.float()
    if in_chans == 1:
        out = w.sum(dim=1, keepdim=True)
    else:
        out = w.repeat(1, math.ceil(in_chans / c), 1, 1)[:, :in_chans] * (c / in_chans)
    return out.to(weight.dtype)


def check_state_dict(state: dict[str, Tensor], target: dict[str, Tensor], model: VitlabModel) -> None:
    """Raise :class:`CheckpointError` listing every missing or unexpected key and every shape mismatch."""
    missing = [k for k in target if k not in state]
    unexpected = [k for k in state if k not in target]
    shapes = [f"{k} {tuple(state[k].shape)} vs {tuple(target[k].shape)}" for k in target
              if k in state and state[k].shape != target[k].shape]
    parts = [f"{what} {_listing(keys)}" for what, keys in (("missing keys", missing), ("unexpected keys", unexpected),
                                                          ("shape mismatches (file vs model)", shapes)) if keys]
    if parts:
        raise CheckpointError(f"the weights do not fit {describe(model)}: {'; '.join(parts)}; load them into the "
                              f"model they were saved from (pass it as model_or_name, or --model NAME)")


def describe(model: VitlabModel) -> str:
    c = model.cfg
    return (f"{c.name or c.arch} ({c.arch}, embed_dim {c.embed_dim}, depth {c.depth}, {c.num_heads} heads, "
            f"{c.img_size}x{c.img_size}x{c.in_chans}, patch {c.patch_size}, {c.num_classes} classes)")


def _listing(keys: list[str], limit: int = 8) -> str:
    more = f" (+{len(keys) - limit} more)" if len(keys) > limit else ""
    return ", ".join(keys[:limit]) + more


# ---------------------------------------------------------------- timm and the hub

def timm_skeleton(name: str) -> nn.Module:
    """timm's model ``name`` (``timm:NAME`` or ``hf-hub:ORG/NAME``) without weights, on the meta device."""
    import timm

    arch = _timm_arch(name)
    if arch.startswith("hf-hub:") and not hub_online():
        raise CheckpointError(_offline_message(name))
    with torch.device("meta"):
        return timm.create_model(arch, pretrained=False)


def download_timm(name: str) -> nn.Module:
    """timm's pretrained model ``name`` (needs the network)."""
    import timm

    arch = _timm_arch(name)
    if not hub_online():
        raise CheckpointError(_offline_message(name))
    try:
        return timm.create_model(arch, pretrained=True)
    except Exception as exc:  # any download or hub failure becomes one line
        raise CheckpointError(f"could not load {name!r} through timm ({first_line(exc)}); download the weights "
                              f"elsewhere and pass the file: load_pretrained({name!r}, 'model.safetensors')") from None


def _timm_arch(name: str) -> str:
    import timm

    arch = name[len("timm:"):] if name.startswith("timm:") else name
    if not arch.startswith("hf-hub:") and not timm.is_model(arch):
        import difflib

        close = difflib.get_close_matches(arch, timm.list_models(), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else " (timm.list_models() lists them)"
        raise ConfigError(f"unknown timm model {arch!r}{hint}")
    return arch


def hub_online() -> bool:
    """False when the Hugging Face hub cannot be reached: offline mode set, or its host does not resolve."""
    from huggingface_hub import constants

    offline = constants.is_offline_mode() if hasattr(constants, "is_offline_mode") else constants.HF_HUB_OFFLINE
    if offline:
        return False
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True
    try:
        socket.getaddrinfo(urlparse(constants.ENDPOINT).hostname, 443)
    except OSError:
        return False
    return True


def _offline_message(name: str) -> str:
    return (f"cannot download {name!r}: this machine is offline (the Hugging Face hub is unreachable); fetch the "
            f"weights where there is a network and pass the local file: load_pretrained({name!r}, "
            f"'model.safetensors') or `vitlab convert model.safetensors OUT --model {name}`")
