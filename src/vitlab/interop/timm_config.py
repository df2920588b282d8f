"""timm -> :class:`ModelConfig`: the vitlab config of a timm ``VisionTransformer`` or ``Cait`` (every timm feature
vitlab cannot express named in one error), and the config a bare timm/vitlab state dict proves by its keys and
shapes. The weights themselves move in :mod:`vitlab.interop.timm_convert`.
"""

from __future__ import annotations

import math
import re

import numpy as np
import torch
from timm.layers import Attention as TimmAttention
from timm.layers import DropPath
from timm.layers import LayerNorm as TimmLayerNorm
from timm.layers import LayerScale as TimmLayerScale
from timm.layers import Mlp as TimmMlp
from timm.layers import PatchEmbed as TimmPatchEmbed
from timm.layers import RmsNorm as TimmRmsNorm
from timm.layers import SwiGLU as TimmSwiGLU
from timm.layers.activations import GELU as TimmGELU
from timm.models.cait import Cait as TimmCait
from timm.models.cait import ClassAttn, LayerScaleBlock, LayerScaleBlockClassAttn, TalkingHeadAttn
from timm.models.vision_transformer import Block as TimmBlock
from timm.models.vision_transformer import ParallelScalingBlock
from timm.models.vision_transformer import VisionTransformer as TimmViT
from torch import Tensor, nn

from vitlab.errors import CheckpointError, ConfigError
from vitlab.interop.checks import block_indices, expect
from vitlab.layers import drop_path_rates
from vitlab.models import ModelConfig
from vitlab.models.cait import PRESETS as CAIT_PRESETS

NORM_EPS = 1e-6  # vitlab's LayerNorm / RMSNorm eps, as timm's ViT and CaiT


# ---------------------------------------------------------------- timm model -> ModelConfig

def config_from_timm(m: nn.Module, **overrides) -> ModelConfig:
    """The vitlab config of timm model ``m`` (``VisionTransformer`` or ``Cait``), with ``overrides`` applied.

    Raises :class:`ConfigError` naming every timm feature vitlab has no equivalent for.
    """
    if hasattr(m, "dist_token"):
        raise ConfigError(f"cannot convert timm {type(m).__name__}: vitlab has no distillation token (dist_token, "
                          f"head_dist); load its state dict with load_pretrained(..., drop_dist_token=True) instead")
    if type(m) is TimmCait:
        fields, drops = _cait_fields(m)
    elif type(m) is TimmViT:
        fields, drops = _vit_fields(m)
    else:
        raise ConfigError(f"from_timm takes timm's VisionTransformer or Cait, got {type(m).__name__}; "
                          f"vitlab has no equivalent of that architecture")
    problems: list[str] = []
    fields.update(_drop_fields(*drops, arch=fields["arch"], overrides=overrides, problems=problems))
    _raise_if(m, problems)
    arch_name = (getattr(m, "pretrained_cfg", None) or {}).get("architecture")
    fields["name"] = f"timm:{arch_name}" if arch_name else "timm"
    return ModelConfig().replace(**{**fields, **overrides})


def _raise_if(m: nn.Module, problems: list[str]) -> None:
    if problems:
        raise ConfigError(f"cannot convert timm {type(m).__name__}: vitlab has no equivalent of "
                          f"{'; '.join(dict.fromkeys(problems))}; convert a timm model without them")


def _vit_fields(m: nn.Module) -> tuple[dict, tuple]:
    problems = _patch_embed_problems(m.patch_embed)
    blocks, dim = list(m.blocks), m.embed_dim
    for name, mod in (("pre_norm=True (norm_pre)", m.norm_pre), ("patch dropout (patch_drop_rate > 0)", m.patch_drop)):
        if not isinstance(mod, nn.Identity):
            problems.append(name)
    if m.attn_pool is not None or m.global_pool not in ("token", "avg"):
        problems.append(f"global_pool={m.global_pool!r} (vitlab pools with 'token' or 'avg')")
    if m.pool_include_prefix:
        problems.append("pool_include_prefix=True")
    use_fc_norm = not isinstance(m.fc_norm, nn.Identity)
    if not use_fc_norm and isinstance(m.norm, nn.Identity):
        problems.append("final_norm=False (no norm before the head)")
    if not blocks:
        problems.append("a model without blocks (depth=0)")
    kinds = {_block_kind(b, dim, problems) for b in blocks}
    _raise_if(m, problems)
    if len(kinds) > 1:
        problems.append("blocks that differ from one another (heads, MLP, biases, QK-norm, scale norms or LayerScale)")
    norms = [m.norm, m.fc_norm, *(n for b in blocks for n in _block_norms(b))]
    norm = _norm_kind(norms, problems)
    _raise_if(m, problems)
    kind, b0 = next(iter(kinds)), blocks[0]
    fields = dict(
        arch="vit", img_size=m.patch_embed.img_size[0], patch_size=m.patch_embed.patch_size[0],
        in_chans=m.patch_embed.proj.in_channels, num_classes=_num_classes(m.head), embed_dim=dim,
        depth=len(blocks), num_heads=kind["heads"], mlp_ratio=_ratio(kind["hidden"], dim),
        qkv_bias=kind["qkv_bias"], qk_norm=kind["qk_norm"], mlp=kind["mlp"], norm=norm,
        gate="layerscale" if kind["ls"] else "none",
        init_values=float(_gates(b0)[0].init_values) if kind["ls"] else None,
        block=kind["block"], scale_attn_norm=kind["scale_attn_norm"], scale_mlp_norm=kind["scale_mlp_norm"],
        class_token=m.cls_token is not None, reg_tokens=m.num_reg_tokens, reg_position="front",
        pos_embed="none" if m.pos_embed is None else "learned", pos_embed_cls=not m.no_embed_class,
        global_pool=m.global_pool, fc_norm=None if use_fc_norm == (m.global_pool == "avg") else use_fc_norm,
    )
    if type(b0) is ParallelScalingBlock:
        drops = (m.head_drop.p, m.pos_drop.p, b0.mlp_drop.p, b0.attn_drop.p, [_drop_prob(b.drop_path) for b in blocks])
    else:
        drops = (m.head_drop.p, m.pos_drop.p, b0.attn.proj_drop.p, b0.attn.attn_drop.p,
                 [_drop_prob(b.drop_path1) for b in blocks])
    return fields, drops


def _gates(b: nn.Module) -> list[nn.Module]:
    return [b.ls] if type(b) is ParallelScalingBlock else [b.ls1, b.ls2]


def _block_norms(b: nn.Module) -> list[nn.Module]:
    if type(b) is ParallelScalingBlock:
        return [b.in_norm, b.q_norm, b.k_norm]
    return [b.norm1, b.norm2, b.attn.q_norm, b.attn.k_norm, b.attn.norm, b.mlp.norm]


def _parallel_kind(b: nn.Module, dim: int, problems: list[str]) -> _Kind:
    """What a timm ``ParallelScalingBlock`` (ViT-22B) holds: vitlab's ``block='parallel'``."""
    if b.out_proj is not None:
        problems.append("fuse_out_proj=True in ParallelScalingBlock (one output projection for both branches)")
        return _Kind()
    if type(b.mlp_act) is not TimmGELU and not (type(b.mlp_act) is nn.GELU and b.mlp_act.approximate == "none"):
        problems.append(f"a {type(b.mlp_act).__name__} activation in ParallelScalingBlock (vitlab: exact GELU)")
    if b.attn_out_proj.bias is None or b.mlp_out_proj.bias is None:
        problems.append("proj_bias=False")
    if not isinstance(b.ls, (nn.Identity, TimmLayerScale)):
        problems.append(f"{type(b.ls).__name__} residual gates")
    return _Kind(hidden=b.mlp_out_proj.in_features, qkv_bias=b.in_proj.bias is not None, mlp="gelu",
                 qk_norm=not isinstance(b.q_norm, nn.Identity), ls=isinstance(b.ls, TimmLayerScale),
                 heads=b.num_heads, block="parallel", scale_attn_norm=False, scale_mlp_norm=False)


def _block_kind(b: nn.Module, dim: int, problems: list[str]) -> _Kind:
    """What a timm ``Block`` or ``ParallelScalingBlock`` holds; appends to ``problems`` what vitlab cannot
    express."""
    if type(b) is ParallelScalingBlock:
        return _parallel_kind(b, dim, problems)
    if type(b) is not TimmBlock:
        problems.append(f"{type(b).__name__} blocks (vitlab has timm's pre-norm Block and ParallelScalingBlock)")
        return _Kind()
    a = b.attn
    if type(a) is not TimmAttention:
        problems.append(f"{type(a).__name__} attention")
        return _Kind()
    if getattr(a, "gate", None) is not None:
        problems.append("gated attention")
    if a.attn_dim != dim:
        problems.append("attn_head_dim other than embed_dim / num_heads")
    if a.proj.bias is None:
        problems.append("proj_bias=False")
    mlp = _mlp_kind(b.mlp, problems)
    for ls in (b.ls1, b.ls2):
        if not isinstance(ls, (nn.Identity, TimmLayerScale)):
            problems.append(f"{type(ls).__name__} residual gates")
    return _Kind(hidden=b.mlp.fc2.in_features, qkv_bias=a.qkv.bias is not None, mlp=mlp,
                 qk_norm=not isinstance(a.q_norm, nn.Identity), ls=isinstance(b.ls1, TimmLayerScale),
                 heads=a.num_heads, block="prenorm", scale_attn_norm=not isinstance(a.norm, nn.Identity),
                 scale_mlp_norm=not isinstance(b.mlp.norm, nn.Identity))


class _Kind(dict):
    """A hashable dict: the blocks of one model must all be of one kind."""

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(sorted(self.items())))


def _mlp_kind(mlp: nn.Module, problems: list[str]) -> str:
    if type(mlp) is TimmMlp:
        act_ok = type(mlp.act) is TimmGELU or (type(mlp.act) is nn.GELU and mlp.act.approximate == "none")
        kind = "gelu"
    elif type(mlp) is TimmSwiGLU:
        act_ok, kind = type(mlp.act) is nn.SiLU, "swiglu"
    else:
        problems.append(f"{type(mlp).__name__} MLPs (vitlab has Mlp with GELU and SwiGLU with SiLU)")
        return "gelu"
    if not act_ok:
        problems.append(f"a {type(mlp.act).__name__} activation in {type(mlp).__name__} "
                        f"(vitlab: exact GELU in Mlp, SiLU in SwiGLU)")
    if not isinstance(mlp.fc2, nn.Linear) or mlp.fc2.bias is None:
        problems.append("MLP layers without bias or as convolutions")
    return kind


def _norm_kind(norms: list[nn.Module], problems: list[str]) -> str:
    kinds = set()
    for n in norms:
        if isinstance(n, nn.Identity):
            continue
        if type(n) in (nn.LayerNorm, TimmLayerNorm) and n.elementwise_affine and n.bias is not None:
            kinds.add("layernorm")
        elif type(n) in (nn.RMSNorm, TimmRmsNorm) and n.elementwise_affine:
            kinds.add("rmsnorm")
        else:
            problems.append(f"{type(n).__name__} norms (vitlab has affine LayerNorm and RMSNorm)")
            continue
        if n.eps != NORM_EPS:
            problems.append(f"norm eps {n.eps} (vitlab's norms use {NORM_EPS})")
    if len(kinds) > 1:
        problems.append("a mix of LayerNorm and RMSNorm")
    return next(iter(kinds), "layernorm")


def _patch_embed_problems(pe: nn.Module) -> list[str]:
    if type(pe) is not TimmPatchEmbed:
        return [f"{type(pe).__name__} patch embedding (vitlab has the strided-conv PatchEmbed)"]
    problems = []
    if not isinstance(pe.norm, nn.Identity):
        problems.append("a norm in the patch embedding (embed_norm_layer)")
    if pe.proj.bias is None:
        problems.append("a patch embedding without bias")
    if pe.img_size is None or pe.img_size[0] != pe.img_size[1] or pe.patch_size[0] != pe.patch_size[1]:
        problems.append(f"non-square images or patches (img_size={pe.img_size}, patch_size={pe.patch_size})")
    elif pe.img_size[0] % pe.patch_size[0]:
        problems.append(f"img_size {pe.img_size[0]} not a multiple of patch_size {pe.patch_size[0]}")
    return problems


def _cait_fields(m: nn.Module) -> tuple[dict, tuple]:
    problems = _patch_embed_problems(m.patch_embed)
    blocks, cls_blocks = list(m.blocks), list(m.blocks_token_only or [])
    if not blocks or m.cls_token is None:
        problems.append("a pruned CaiT (no blocks or no class token)")
    if m.global_pool not in ("token", "avg"):
        problems.append(f"global_pool={m.global_pool!r} (vitlab pools with 'token' or 'avg')")
    for b in blocks:
        if type(b) is not LayerScaleBlock or type(b.attn) is not TalkingHeadAttn:
            problems.append(f"{type(b).__name__} / {type(b.attn).__name__} self-attention blocks")
            break
    for b in cls_blocks:
        if type(b) is not LayerScaleBlockClassAttn or type(b.attn) is not ClassAttn:
            problems.append(f"{type(b).__name__} / {type(b.attn).__name__} class-attention blocks")
            break
    _raise_if(m, problems)
    if any(_mlp_kind(b.mlp, problems) != "gelu" for b in blocks + cls_blocks):
        problems.append("SwiGLU MLPs in CaiT")
    norms = [m.norm, *(n for b in blocks + cls_blocks for n in (b.norm1, b.norm2))]
    norm = _norm_kind(norms, problems)
    _raise_if(m, problems)
    b0, dim = blocks[0], m.embed_dim
    fields = dict(
        arch="cait", attn="talking_heads", gate="layerscale", pos_embed_cls=False, reg_tokens=0,
        img_size=m.patch_embed.img_size[0], patch_size=m.patch_embed.patch_size[0],
        in_chans=m.patch_embed.proj.in_channels, num_classes=_num_classes(m.head), embed_dim=dim,
        depth=len(blocks), num_heads=b0.attn.num_heads, mlp_ratio=_ratio(b0.mlp.fc1.out_features, dim),
        qkv_bias=b0.attn.qkv.bias is not None, norm=norm,
        init_values=_cait_init(m, blocks + cls_blocks), depth_token_only=len(cls_blocks),
        mlp_ratio_token_only=_ratio(cls_blocks[0].mlp.fc1.out_features, dim) if cls_blocks else 4.0,
        global_pool=m.global_pool if m.global_pool in ("token", "avg") else "token",
    )
    drops = (m.head_drop.p, m.pos_drop.p, b0.attn.proj_drop.p, b0.attn.attn_drop.p,
             [_drop_prob(b.drop_path) for b in blocks])
    return fields, drops


def _cait_init(m: nn.Module, blocks: list[nn.Module]) -> float | None:
    """The LayerScale init timm built CaiT ``m`` with (timm does not store it): the gammas while they all
    still hold one value (an untrained model), else the value timm's preset of that name passes (vitlab's
    CaiT presets hold the same values), else None: not shown, so the depth rule."""
    gammas = [g for b in blocks for g in (b.gamma_1, b.gamma_2)]
    if gammas and not any(g.is_meta for g in gammas):
        first = gammas[0].detach().flatten()[0]
        if all(torch.all(g.detach() == first) for g in gammas):
            return float(str(np.float32(first.float().item())))  # 1e-05, not 9.99999974738e-06
    arch = (getattr(m, "pretrained_cfg", None) or {}).get("architecture") or ""
    preset = CAIT_PRESETS.get(re.sub(r"_\d+$", "", arch), {})
    return preset.get("init_values")


def _drop_fields(head: float, pos: float, proj: float, attn: float, rates: list[float], *, arch: str,
                 overrides: dict, problems: list[str]) -> dict:
    """vitlab's single ``drop_rate`` and its drop-path rule from timm's separate rates."""
    out = {"attn_drop_rate": attn}
    if "drop_rate" not in overrides:
        if len({head, pos, proj}) > 1:
            problems.append(f"separate dropout rates (drop_rate={head}, pos_drop_rate={pos}, "
                            f"proj_drop_rate={proj}): vitlab has one drop_rate, pass drop_rate=... to choose it")
        else:
            out["drop_rate"] = head
    if "drop_path_rate" not in overrides and rates:
        rate = max(rates)
        for rule in ("linear", "uniform") if arch == "vit" else ("uniform", "linear"):
            if all(abs(a - b) < 1e-6 for a, b in zip(rates, drop_path_rates(rate, len(rates), rule))):
                out.update(drop_path_rate=rate, drop_path_rule=rule)
                break
        else:
            problems.append(f"per-block drop-path rates {rates} that are neither uniform nor a linear ramp: "
                            f"pass drop_path_rate=... to choose one")
    return out


def _drop_prob(m: nn.Module) -> float:
    return float(m.drop_prob) if isinstance(m, DropPath) else 0.0


def _num_classes(head: nn.Module) -> int:
    return head.out_features if isinstance(head, nn.Linear) else 0


def _ratio(hidden: int, dim: int) -> float:
    """An mlp_ratio with ``int(dim * ratio) == hidden``."""
    ratio = hidden / dim
    while int(dim * ratio) < hidden:
        ratio = math.nextafter(ratio, math.inf)
    return ratio


# ---------------------------------------------------------------- state dict -> ModelConfig

def config_from_state_dict(state: dict[str, Tensor], *, num_heads: int | None = None,
                           global_pool: str | None = None) -> ModelConfig:
    """Infer a ViT or CaiT config from the keys and shapes of a timm/vitlab state dict: only what they prove.

    The number of heads shows only in QK-norm weights or CaiT's talking heads, else ``num_heads`` must be
    given. A ViT's pooling never shows when it has a class token (``fc_norm`` goes with either pooling), so
    ``global_pool`` must be given; without a class token it is ``'avg'``. CaiT pools its class token (its
    class-attention blocks feed nothing else) unless ``global_pool`` says otherwise. LayerScale init values
    do not show in trained weights: a CaiT is recorded with ``init_values=None`` (the depth rule).
    """
    pe = state.get("patch_embed.proj.weight")
    if pe is None or pe.ndim != 4:
        raise CheckpointError("the weights have no 'patch_embed.proj.weight' convolution, so they are not a ViT or "
                              "CaiT state dict; say what they are with a model name (--model NAME)")
    expect(state, "patch_embed.proj.weight", (None, None, None, None), why=" (embed_dim, channels, patch, patch)")
    dim, in_chans, patch = pe.shape[0], pe.shape[1], pe.shape[-1]
    of_d = f" (embed_dim {dim}, from patch_embed.proj.weight)"
    depth = block_indices(state, "blocks", same_keys=True)  # a model read from its shapes has blocks alike
    cait = "blocks_token_only.0.attn.q.weight" in state
    parallel = "blocks.0.in_proj.weight" in state  # timm's ParallelScalingBlock (ViT-22B): in_proj = [fc1; qkv]
    if parallel:
        in_proj = expect(state, "blocks.0.in_proj.weight", (None, dim), why=of_d)
        if in_proj.shape[0] <= 3 * dim:
            raise CheckpointError(f"blocks.0.in_proj.weight has shape {tuple(in_proj.shape)}, expected (H + {3 * dim}, "
                                  f"{dim}): the MLP's H rows, then q, k and v")
        fc1 = in_proj[:in_proj.shape[0] - 3 * dim]
    else:
        fc1 = expect(state, "blocks.0.mlp.fc1.weight", (None, dim), why=of_d)
        fc1 = fc1 if fc1 is not None else expect(state, "blocks.0.mlp.fc1_g.weight", (None, dim), why=of_d)
    if depth == 0 or fc1 is None:
        raise CheckpointError("the weights have no 'blocks.0.*' transformer blocks of a ViT or CaiT (missing key "
                              "blocks.0.mlp.fc1.weight); say what they are with a model name (--model NAME)")
    heads = num_heads
    if heads is None and "blocks.0.attn.proj_l.weight" in state:
        heads = expect(state, "blocks.0.attn.proj_l.weight", (None, None), why=" (heads, heads)").shape[0]
    for key in ("blocks.0.attn.q_norm.weight", "blocks.0.q_norm.weight"):
        if heads is None and key in state:
            head_dim = expect(state, key, (None,), why=" (the head dim)").shape[0]
            if dim % head_dim:
                raise CheckpointError(f"{key} has shape ({head_dim},), expected a head dim that divides embed_dim "
                                      f"{dim}")
            heads = dim // head_dim
    cls_token = "cls_token" in state
    if global_pool is None:
        global_pool = "token" if cait else None if cls_token else "avg"
    unknown = [what for what, missing in (("its number of heads (pass num_heads=N)", heads is None),
                                          ("its pooling, since fc_norm goes with either (pass global_pool='token' "
                                           "or 'avg')", global_pool is None)) if missing]
    if unknown:
        raise CheckpointError(f"a ViT state dict (embed_dim {dim}, depth {depth}) does not show {' nor '.join(unknown)}"
                              f"; give it to load_pretrained(None, path, ...) or say which model it is: "
                              f"load_pretrained('timm:NAME' or a vitlab preset, path) or `vitlab convert IN OUT "
                              f"--model NAME` (e.g. --model timm:vit_small_patch16_224, or --num-heads N "
                              f"--global-pool token|avg)")
    reg_token = expect(state, "reg_token", (1, None, dim), why=of_d)
    reg = reg_token.shape[1] if reg_token is not None else 0
    head = expect(state, "head.weight", (None, dim), why=of_d)
    f = dict(arch="cait" if cait else "vit", embed_dim=dim, in_chans=in_chans, patch_size=patch, depth=depth,
             num_heads=heads, mlp_ratio=_ratio(fc1.shape[0], dim),
             qkv_bias=("blocks.0.in_proj.bias" if parallel else "blocks.0.attn.qkv.bias") in state,
             norm="layernorm" if {"blocks.0.norm1.bias", "blocks.0.in_norm.bias"} & set(state) else "rmsnorm",
             num_classes=head.shape[0] if head is not None else 0, class_token=cls_token,
             global_pool=global_pool)
    pos = expect(state, "pos_embed", (1, None, dim), why=of_d)
    slots = 0
    if cait:
        cls_fc1 = expect(state, "blocks_token_only.0.mlp.fc1.weight", (None, dim), why=of_d)
        f.update(attn="talking_heads", gate="layerscale", pos_embed_cls=False, init_values=None,
                 depth_token_only=block_indices(state, "blocks_token_only", same_keys=True),
                 mlp_ratio_token_only=_ratio(cls_fc1.shape[0], dim) if cls_fc1 is not None else 4.0)
    else:
        f.update(mlp="swiglu" if "blocks.0.mlp.fc1_g.weight" in state else "gelu",
                 qk_norm={"blocks.0.attn.q_norm.weight", "blocks.0.q_norm.weight"} & set(state) != set(),
                 reg_tokens=reg, block="parallel" if parallel else "prenorm",
                 scale_attn_norm="blocks.0.attn.norm.weight" in state,
                 scale_mlp_norm="blocks.0.mlp.norm.weight" in state,
                 gate="layerscale" if {"blocks.0.ls1.gamma", "blocks.0.gamma_1", "blocks.0.ls.gamma"} & set(state)
                 else "none")
        fc_norm = "fc_norm.weight" in state  # the keys prove where the final norm sits, not the pooling
        f["fc_norm"] = None if fc_norm == (global_pool == "avg") else fc_norm
        if pos is not None:
            prefix = int(cls_token) + reg + int("dist_token" in state)
            f["pos_embed_cls"] = _is_square(pos.shape[1] - prefix)
            slots = prefix if f["pos_embed_cls"] else 0
    if pos is None:
        f.update(pos_embed="none", img_size=patch * (224 // patch))
    else:
        grid = math.isqrt(max(pos.shape[1] - slots, 0))
        if grid * grid != pos.shape[1] - slots or grid == 0:
            raise CheckpointError(f"pos_embed holds {pos.shape[1]} positions, not a square grid plus the prefix "
                                  f"tokens; say what the weights are with a model name (--model NAME)")
        f["img_size"] = grid * patch
    return ModelConfig(name="inferred").replace(**f)


def _is_square(n: int) -> bool:
    return n > 0 and math.isqrt(n) ** 2 == n
