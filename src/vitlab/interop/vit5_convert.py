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
from vitlab.interop.checks import block_indices, check_dtypes, check_finite, expect, naming
from vitlab.models import ModelConfig, VitlabModel, create_model, get_config

_PRESETS = {(384, 12, 6): "vit5_small", (768, 12, 12): "vit5_base", (1024, 24, 16): "vit5_large",
            (1152, 28, 16): "vit5_xlarge"}
_FREQS = re.compile(r"^blocks\.(\d+)\.attn\.(rope|rope_reg)\.freqs$")
# the keys of the official vit_models (and DeiT-III's, which it extends): outside the blocks, and in each block
_TOP_KEYS = ("cls_token", "reg_token", "pos_embed", "patch_embed.proj.weight", "patch_embed.proj.bias", "norm.weight",
             "norm.bias", "head.weight", "head.bias")
_BLOCK_KEYS = ("gamma_1", "gamma_2", "norm1.weight", "norm1.bias", "attn.qkv.weight", "attn.qkv.bias",
               "attn.proj.weight", "attn.proj.bias", "attn.rope.freqs", "attn.rope_reg.freqs", "attn.q_norm.weight",
               "attn.k_norm.weight", "norm2.weight", "norm2.bias", "mlp.fc1.weight", "mlp.fc1.bias", "mlp.fc2.weight",
               "mlp.fc2.bias")
_BLOCK_REQUIRED = ("norm1.weight", "attn.qkv.weight", "attn.proj.weight", "attn.proj.bias", "norm2.weight",
                   "mlp.fc1.weight", "mlp.fc1.bias", "mlp.fc2.weight", "mlp.fc2.bias")
_NOT_VIT5 = ("not a ViT-5 state dict (no patch_embed.proj.weight or blocks.0.attn.qkv.weight); pass the checkpoint the "
             "ViT-5 code saved, or load vitlab/timm weights with vitlab.load_pretrained")


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
    check_vit5_state(state)
    proj = state["patch_embed.proj.weight"]
    dim, in_chans, patch = proj.shape[0], proj.shape[1], proj.shape[-1]
    depth = block_indices(state)
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


def check_vit5_state(state: dict[str, Tensor]) -> None:
    """Refuse, before any model is built, a state dict that is not one the official ``vit_models`` saved: a key it
    does not have, a block index missing (``blocks.0`` to ``blocks.{N-1}``), a block without a key the others hold
    (or without one every block has), a tensor that is not floating-point and dense, a shape that does not follow
    from the patch embedding's width ``D``: ``cls_token`` (1, 1, D), ``reg_token`` / ``pos_embed`` (1, N, D),
    ``qkv`` (3D, D), ``fc1`` (H, D) with one H in every block, ``q_norm`` / ``k_norm`` a head dim dividing D..."""
    proj = state.get("patch_embed.proj.weight")
    if proj is None or not any(k.startswith("blocks.") for k in state):
        raise CheckpointError(_NOT_VIT5)
    if any(re.match(r"^blocks\.\d+\.mlp\.w[123]\.", k) for k in state):
        raise CheckpointError("the checkpoint's blocks use the official SwiGLU MLP (w1, w2, w3), which the released "
                              "vit5_* models do not; vitlab has no layout for it")
    unexpected = [k for k in state if k not in _TOP_KEYS and not (
        (m := re.match(r"^blocks\.\d+\.(.+)$", k)) and m.group(1) in _BLOCK_KEYS)]
    if unexpected:
        more = f" (+{len(unexpected) - 8} more)" if len(unexpected) > 8 else ""
        raise CheckpointError(f"unexpected keys {', '.join(unexpected[:8])}{more}, expected only the keys of the ViT-5 "
                              f"code's vit_models; pass the checkpoint it saved")
    check_dtypes(state, counters=())
    expect(state, "patch_embed.proj.weight", (None, None, None, None), why=" (embed_dim, channels, patch, patch)")
    if proj.shape[-1] != proj.shape[-2]:
        raise CheckpointError(f"patch_embed.proj.weight has shape {tuple(proj.shape)}, expected a square patch kernel "
                              f"(embed_dim, channels, p, p)")
    d = proj.shape[0]
    of_d = f" (embed_dim {d}, from patch_embed.proj.weight)"
    depth = block_indices(state, same_keys=True)
    lacking = [f"blocks.0.{s}" for s in _BLOCK_REQUIRED if f"blocks.0.{s}" not in state]
    if lacking:  # block 0 lacks it, and (same_keys) so does every block
        raise CheckpointError(f"missing keys {', '.join(lacking)} (in every block), expected in each block of the "
                              f"ViT-5 code's vit_models; the file is damaged: re-save the whole state dict")
    for key, shape in (("patch_embed.proj.bias", (d,)), ("cls_token", (1, 1, d)), ("norm.weight", (d,))):
        expect(state, key, shape, why=of_d, required=True)
    for key, shape in (("norm.bias", (d,)), ("reg_token", (1, None, d)), ("pos_embed", (1, None, d)),
                       ("head.weight", (None, d))):
        expect(state, key, shape, why=of_d)
    if "head.weight" in state:
        expect(state, "head.bias", (state["head.weight"].shape[0],), why=" (one per class of head.weight)")
    hidden = expect(state, "blocks.0.mlp.fc1.weight", (None, d), why=of_d).shape[0]
    q = expect(state, "blocks.0.attn.q_norm.weight", (None,), why=" (the head dim)")
    head_dim = q.shape[0] if q is not None else None
    if head_dim is not None and d % head_dim:
        raise CheckpointError(f"blocks.0.attn.q_norm.weight has shape ({head_dim},), expected a head dim that divides "
                              f"embed_dim {d}")
    shapes = {"gamma_1": (d,), "gamma_2": (d,), "norm1.weight": (d,), "norm1.bias": (d,), "norm2.weight": (d,),
              "norm2.bias": (d,), "attn.qkv.weight": (3 * d, d), "attn.qkv.bias": (3 * d,), "attn.proj.weight": (d, d),
              "attn.proj.bias": (d,), "attn.q_norm.weight": (head_dim,), "attn.k_norm.weight": (head_dim,),
              "attn.rope.freqs": (None,), "attn.rope_reg.freqs": (None,), "mlp.fc1.weight": (hidden, d),
              "mlp.fc1.bias": (hidden,), "mlp.fc2.weight": (d, hidden), "mlp.fc2.bias": (d,)}
    why = f"{of_d[:-1]}, MLP width {hidden} from blocks.0.mlp.fc1.weight, head dim {head_dim})"
    for i in range(depth):
        for suffix, shape in shapes.items():
            expect(state, f"blocks.{i}.{suffix}", shape, why=why)


def _head_dim(state: dict[str, Tensor], overrides: dict[str, Any]) -> int:
    dim = state["patch_embed.proj.weight"].shape[0]
    if "num_heads" in overrides:
        heads = overrides["num_heads"]
        if not isinstance(heads, int) or isinstance(heads, bool) or heads < 1 or dim % heads:
            raise ConfigError(f"num_heads {heads!r} does not divide the checkpoint's embed_dim {dim}; pass the number "
                              f"of heads it was trained with (--num-heads N)")
        return dim // heads
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
              allow_nonfinite: bool = False, **create_model_kwargs: Any) -> VitlabModel:
    """A vitlab model carrying the weights of an official ViT-5 checkpoint (a ``.pth`` file the authors' code
    saved, a ``.safetensors`` file, or a state dict), with equal logits.

    ``ema=True`` takes the training checkpoint's ``model_ema``. ``create_model_kwargs`` are :class:`ModelConfig`
    fields: ``img_size`` resizes the position table as the authors' ``main.py`` (bicubic, no antialiasing),
    ``num_classes`` of another count gives a fresh head. Every key and shape is checked before the model is
    allocated (:func:`check_vit5_state`, then against the model built on the meta device), and NaN or infinite
    weights are refused unless ``allow_nonfinite``: one :class:`CheckpointError` line naming the file and the key.
    """
    from vitlab.interop.pretrained import adapt_state_dict

    where = "the state dict" if isinstance(path_or_state_dict, dict) else str(path_or_state_dict)
    state = read_vit5(path_or_state_dict, ema=ema)
    with naming(where):
        check_vit5_state(state)
        check_finite(state, allow_nonfinite)
        source = vit5_config(state, **{k: v for k, v in create_model_kwargs.items()
                                       if k in ("num_heads", "rope_theta", "reg_rope_theta")})
        cfg = vit5_config(state, **create_model_kwargs)
        state = check_freqs(state, source)
        state = {re.sub(r"^blocks\.(\d+)\.gamma_([12])$", r"blocks.\1.ls\2.gamma", k): v for k, v in state.items()}
        adapted = adapt_state_dict(state, create_model(cfg, device="meta"))  # every key and shape, no memory yet
    model = create_model(cfg)
    if any(v.is_meta for v in adapted.values()):  # a fresh head (another class count), drawn for real this time
        adapted = adapt_state_dict(state, model)
    model.load_state_dict(adapted)
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
