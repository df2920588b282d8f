"""The authors' ViT-5 checkpoints (wangf3014/ViT-5, ``models_vit5.py``) in and out of vitlab.

vitlab's ``vit5_*`` presets use the official RoPE channel layout (``rope_layout='vit5'``), so the weights map one to
one: ``blocks.{i}.gamma_{1,2}`` are vitlab's ``blocks.{i}.ls{1,2}.gamma`` and the official RoPE ``freqs`` buffers
(fixed by the head dim and theta) are checked against the config and dropped; every other key has the same name
and shape. At another ``img_size`` the position table is resized as the authors' ``main.py`` does (bicubic, no
antialiasing; the presets' ``pos_resample_antialias=False``) and RoPE is built for the new grid, as the official
model built at that size computes it.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from vitlab.checkpoint.weights import first_line, read_safetensors
from vitlab.errors import CheckpointError, ConfigError
from vitlab.models import ModelConfig, VitlabModel, create_model, get_config

_PRESETS = {(384, 12, 6): "vit5_small", (768, 12, 12): "vit5_base", (1024, 24, 16): "vit5_large",
            (1152, 28, 16): "vit5_xlarge"}
_FREQS = re.compile(r"^blocks\.(\d+)\.attn\.(rope|rope_reg)\.freqs$")


def read_vit5(path_or_state_dict: str | os.PathLike | dict[str, Tensor], *, ema: bool = False) -> dict[str, Tensor]:
    """The official model's state dict from a ``.pth`` file (``torch.load(weights_only=True)``; the training
    checkpoint's ``model`` entry, or ``model_ema`` with ``ema=True``), a ``.safetensors`` file, or a dict."""
    if isinstance(path_or_state_dict, dict):
        obj: Any = path_or_state_dict
        where = "the state dict"
    else:
        p = Path(path_or_state_dict)
        where = str(p)
        if not p.is_file():
            raise CheckpointError(f"no ViT-5 checkpoint {p}; pass an existing .pth or .safetensors file")
        if p.suffix == ".safetensors":
            obj, _ = read_safetensors(p)
        elif p.suffix in (".pth", ".pt", ".bin"):
            obj = _torch_load(p)
        else:
            raise CheckpointError(f"{p} is neither .pth nor .safetensors; pass the checkpoint the ViT-5 code saved "
                                  f"(checkpoint.pth) or its weights as safetensors")
    key = "model_ema" if ema else "model"
    if isinstance(obj, dict) and isinstance(obj.get(key), dict):
        obj = obj[key]
    elif ema:
        raise CheckpointError(f"{where} has no 'model_ema' entry; load it without ema=True (--ema)")
    if isinstance(obj, dict) and isinstance(obj.get("state_dict"), dict):
        obj = obj["state_dict"]
    if not isinstance(obj, dict) or not obj or not all(isinstance(v, Tensor) for v in obj.values()):
        raise CheckpointError(f"{where} does not hold a ViT-5 state dict (a dict of tensors, or a training "
                              f"checkpoint with a 'model' entry)")
    from vitlab.interop.pretrained import strip_wrappers

    return strip_wrappers(dict(obj))


def _torch_load(p: Path) -> Any:
    # the ViT-5 code's training checkpoints also hold its argparse.Namespace of arguments: allowed as plain data
    try:
        with torch.serialization.safe_globals([argparse.Namespace]):
            with warnings.catch_warnings():  # torch's notes on the pickle protocol: the refusal below is the one line
                warnings.simplefilter("ignore", UserWarning)
                return torch.load(p, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any failure to unpickle safely means a bad file
        raise CheckpointError(f"{p} cannot be read with weights_only=True ({first_line(exc)}); vitlab never "
                              f"unpickles code: re-save the weights as torch.save(model.state_dict(), ...) or "
                              f"safetensors") from None


def official_freqs(head_dim: int, theta: float) -> Tensor:
    """The ``freqs`` buffer of the official ``VisionRotaryEmbedding(head_dim // 2, theta=theta)``."""
    dim = head_dim // 2
    return 1.0 / (theta ** (torch.arange(0, dim, 2)[:(dim // 2)].float() / dim))


def vit5_config(state: dict[str, Tensor], **overrides: Any) -> ModelConfig:
    """The :class:`ModelConfig` of an official ViT-5 (or DeiT-III LayerScale) state dict, read from its shapes;
    ``overrides`` are :class:`ModelConfig` fields (another ``img_size`` or ``num_classes`` adapts the weights)."""
    proj = state.get("patch_embed.proj.weight")
    if proj is None or proj.ndim != 4 or "blocks.0.attn.qkv.weight" not in state:
        raise CheckpointError("not a ViT-5 state dict (no patch_embed.proj.weight or blocks.0.attn.qkv.weight); "
                              "pass the checkpoint the ViT-5 code saved, or load vitlab/timm weights with "
                              "vitlab.load_pretrained")
    if any(k.startswith("blocks.0.mlp.w") for k in state):
        raise CheckpointError("the checkpoint's blocks use the official SwiGLU MLP (w1, w2, w3), which the released "
                              "vit5_* models do not; vitlab has no layout for it")
    dim, in_chans, patch = proj.shape[0], proj.shape[1], proj.shape[-1]
    depth = 1 + max(int(m.group(1)) for k in state if (m := re.match(r"^blocks\.(\d+)\.", k)))
    head_dim = _head_dim(state, overrides)
    geometry: dict[str, Any] = dict(
        embed_dim=dim, depth=depth, num_heads=dim // head_dim, in_chans=in_chans, patch_size=patch,
        mlp_ratio=state["blocks.0.mlp.fc1.weight"].shape[0] / dim,
        num_classes=state["head.weight"].shape[0] if "head.weight" in state else 0,
        reg_tokens=state["reg_token"].shape[1] if "reg_token" in state else 0,
        qkv_bias="blocks.0.attn.qkv.bias" in state, qk_norm="blocks.0.attn.q_norm.weight" in state,
        rope="blocks.0.attn.rope.freqs" in state, gate="layerscale" if "blocks.0.gamma_1" in state else "none",
        norm="layernorm" if "norm.bias" in state else "rmsnorm",
        pos_embed="learned" if "pos_embed" in state else "none")
    pos = state.get("pos_embed")
    if pos is not None:
        side = math.isqrt(pos.shape[1])
        if side * side != pos.shape[1]:
            raise CheckpointError(f"pos_embed holds {pos.shape[1]} positions, not a square grid of patches")
        geometry["img_size"] = side * patch
    if geometry["qk_norm"] and geometry["norm"] != "rmsnorm":
        raise CheckpointError("a LayerNorm model with the official (RMSNorm) QK-norm has no vitlab layout")
    base = _PRESETS.get((dim, depth, dim // head_dim), "vit5_small")
    try:
        cfg = get_config(base, **{**geometry, **overrides})
    except ConfigError as exc:
        raise ConfigError(f"the ViT-5 checkpoint gives no valid vitlab model: {exc}") from None
    if (dim, depth, dim // head_dim) not in _PRESETS:
        cfg = cfg.replace(name="vit5")
    return cfg


def _head_dim(state: dict[str, Tensor], overrides: dict[str, Any]) -> int:
    dim = state["patch_embed.proj.weight"].shape[0]
    if "num_heads" in overrides:
        return dim // overrides["num_heads"]
    q = state.get("blocks.0.attn.q_norm.weight")
    if q is not None:
        return q.shape[0]
    freqs = state.get("blocks.0.attn.rope.freqs", state.get("blocks.0.attn.rope_reg.freqs"))
    if freqs is not None:
        return 4 * freqs.shape[0]
    raise CheckpointError("the checkpoint's shapes do not show the number of heads (no QK-norm, no RoPE); pass "
                          "num_heads=N (--num-heads N)")


def check_freqs(state: dict[str, Tensor], cfg: ModelConfig) -> dict[str, Tensor]:
    """``state`` without the RoPE ``freqs`` buffers, after checking they are the ones ``cfg`` builds (a wrong
    theta or head count would rotate differently)."""
    head_dim = cfg.embed_dim // cfg.num_heads
    out, bad, found = {}, [], {"rope": False, "rope_reg": False}
    for k, v in state.items():
        m = _FREQS.match(k)
        if not m:
            out[k] = v
            continue
        found[m.group(2)] = True
        theta = cfg.rope_theta if m.group(2) == "rope" else cfg.reg_rope_theta
        want = official_freqs(head_dim, theta)
        if v.shape != want.shape or not torch.allclose(v.float(), want, rtol=1e-5, atol=0):
            bad.append(k)
    if bad:
        raise CheckpointError(f"RoPE frequencies {', '.join(bad[:4])} are not those of head dim {head_dim} with "
                              f"rope_theta={cfg.rope_theta}, reg_rope_theta={cfg.reg_rope_theta}; pass the theta and "
                              f"num_heads the model was trained with")
    if cfg.rope != found["rope"] or bool(cfg.reg_tokens) != found["rope_reg"]:
        raise CheckpointError(f"the checkpoint's RoPE buffers (patches: {found['rope']}, registers: "
                              f"{found['rope_reg']}) do not match rope={cfg.rope}, reg_tokens={cfg.reg_tokens}")
    return out


def from_vit5(path_or_state_dict: str | os.PathLike | dict[str, Tensor], *, ema: bool = False,
              **create_model_kwargs: Any) -> VitlabModel:
    """A vitlab model carrying the weights of an official ViT-5 checkpoint (a ``.pth`` file the authors' code
    saved, a ``.safetensors`` file, or a state dict), with equal logits.

    ``ema=True`` takes the training checkpoint's ``model_ema``. ``create_model_kwargs`` are :class:`ModelConfig`
    fields: ``img_size`` resizes the position table as the authors' ``main.py`` (bicubic, no antialiasing),
    ``num_classes`` of another count gives a fresh head; every key and shape is checked.
    """
    from vitlab.interop.pretrained import adapt_state_dict

    state = read_vit5(path_or_state_dict, ema=ema)
    source = vit5_config(state, **{k: v for k, v in create_model_kwargs.items()
                                   if k in ("num_heads", "rope_theta", "reg_rope_theta")})
    cfg = vit5_config(state, **create_model_kwargs)
    state = check_freqs(state, source)
    state = {re.sub(r"^blocks\.(\d+)\.gamma_([12])$", r"blocks.\1.ls\2.gamma", k): v for k, v in state.items()}
    model = create_model(cfg)
    model.load_state_dict(adapt_state_dict(state, model))
    return model


def vit5_unsupported(model: VitlabModel) -> list[str]:
    """What ``model`` holds that the official ``vit_models`` of the ViT-5 code cannot express."""
    c = model.cfg
    checks = [
        (c.arch == "vit" and c.attn == "mhsa", f"arch={c.arch!r}, attn={c.attn!r} (the official blocks: plain "
                                               f"multi-head self-attention)"),
        (c.class_token and c.global_pool == "token" and not c.fc_norm, "no class token or average pooling"),
        (c.stem == "patch", "the convolutional stem"),
        (c.mlp == "gelu", f"mlp={c.mlp!r} (the released models use the GELU MLP)"),
        (c.gate in ("layerscale", "none"), f"gate={c.gate!r} (official: LayerScale or none)"),
        (c.pos_embed in ("learned", "none") and not (c.pos_embed == "learned" and c.pos_embed_cls),
         "a position table that is not learned on the patches only (pos_embed_cls=False)"),
        (not c.rope or c.rope_layout == "vit5", "rope_layout='halves' (the official rotation pairs adjacent channels)"),
        (not c.reg_tokens or c.rope_layout == "vit5", "registers outside rope_layout='vit5' (officially at the end, "
                                                      "a square count, rotated)"),
        (not c.qk_norm or c.norm == "rmsnorm", "QK-norm with LayerNorm (the official QK-norm is RMSNorm)"),
        (not c.rope or c.rope_theta == 10000.0, f"rope_theta={c.rope_theta} (the official patch RoPE: 10000)"),
    ]
    return [why for ok, why in checks if not ok]


def to_vit5(model: VitlabModel) -> dict[str, Tensor]:
    """``model``'s weights as the official ViT-5 code's state dict (``gamma_{1,2}``, RoPE ``freqs`` buffers), to
    load with ``vit_models(...).load_state_dict`` or ``main.py --finetune`` (saved as ``{'model': state}``).

    Raises :class:`ConfigError` listing what that code cannot express."""
    missing = vit5_unsupported(model)
    if missing:
        raise ConfigError(f"the ViT-5 code cannot express {model.cfg.name or 'this model'}: {'; '.join(missing)}; "
                          f"convert a vit5_* model")
    cfg = model.cfg
    head_dim = cfg.embed_dim // cfg.num_heads
    out: dict[str, Tensor] = {}
    for k, v in model.state_dict().items():
        out[re.sub(r"^blocks\.(\d+)\.ls([12])\.gamma$", r"blocks.\1.gamma_\2", k)] = v.detach().clone()
    for i in range(cfg.depth):
        if cfg.rope:
            out[f"blocks.{i}.attn.rope.freqs"] = official_freqs(head_dim, cfg.rope_theta)
        if cfg.reg_tokens:
            out[f"blocks.{i}.attn.rope_reg.freqs"] = official_freqs(head_dim, cfg.reg_rope_theta)
    return out


def vit5_kwargs(model: VitlabModel) -> dict[str, Any]:
    """The ``vit_models`` arguments of the official code that build ``model``'s architecture (with
    ``norm_layer=partial(RMSNorm, eps=1e-6)`` for ``norm='rmsnorm'``, ``partial(nn.LayerNorm, eps=1e-6)`` else)."""
    c = model.cfg
    return dict(img_size=c.img_size, patch_size=c.patch_size, in_chans=c.in_chans, num_classes=c.num_classes,
                embed_dim=c.embed_dim, depth=c.depth, num_heads=c.num_heads, mlp_ratio=c.mlp_ratio,
                qkv_bias=c.qkv_bias, num_registers=c.reg_tokens, flash=False, rope=c.rope, reg_theta=c.reg_rope_theta,
                qk_norm=c.qk_norm, layer_scale=c.gate == "layerscale", init_scale=c.gate_init_value() or 1e-4,
                ape=c.pos_embed == "learned", drop_rate=c.drop_rate, attn_drop_rate=c.attn_drop_rate,
                drop_path_rate=c.drop_path_rate)
