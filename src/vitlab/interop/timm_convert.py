"""vitlab -> timm: ``to_timm``, the timm model of a vitlab config, and the state-dict maps between the two layouts
(``from_timm`` lives beside the state-dict adaptation it needs, in :mod:`vitlab.interop.pretrained`; the config of
a timm model or state dict in :mod:`vitlab.interop.timm_config`).

Parameter names are shared (``patch_embed.proj``, ``blocks.{i}.attn.qkv``, ``ls1.gamma``...), so most keys pass
through unchanged. What timm holds differently is mapped by :class:`Rule` s: CaiT's LayerScale ``ls{j}.gamma`` is
timm's ``gamma_{j}``, scalar gates become constant LayerScale gammas, a CaiT without gates gets gammas of ones, a
CaiT with plain attention gets identity talking-heads, a CaiT without position embedding gets a zero table. A fixed
sin-cos table becomes timm's (learnable) ``pos_embed`` with the same values.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
from timm.layers import DropPath
from timm.layers import LayerNorm as TimmLayerNorm
from timm.layers import Mlp as TimmMlp
from timm.layers import RmsNorm as TimmRmsNorm
from timm.layers import SwiGLU as TimmSwiGLU
from timm.models.cait import Cait as TimmCait
from timm.models.vision_transformer import Block as TimmBlock
from timm.models.vision_transformer import ParallelScalingBlock
from timm.models.vision_transformer import VisionTransformer as TimmViT
from torch import Tensor, nn

from vitlab.errors import CheckpointError, ConfigError
from vitlab.interop.timm_config import NORM_EPS
from vitlab.layers import LayerScale, ReAttention, ScalarGate, drop_path_rates
from vitlab.models import VitlabModel

# ---------------------------------------------------------------- ModelConfig -> timm model

def timm_unsupported(model: VitlabModel) -> list[str]:
    """What ``model`` holds that timm's ``VisionTransformer`` / ``Cait`` cannot express."""
    cfg = model.cfg
    out = []
    if any(isinstance(m, ReAttention) for m in model.modules()):
        out.append("DeepViT re-attention (attn='reattention')")
    if cfg.rope:
        out.append("ViT-5 2-D RoPE (rope=True)")
    elif cfg.rotates:
        out.append("ViT-5 RoPE on the registers (rope_layout='vit5' rotates registers after the patches even with "
                   "rope=False; set rope_layout='halves' or reg_position='front')")
    if cfg.stem == "conv":
        out.append("DeepViT's convolutional stem (stem='conv')")
    if cfg.gate == "rezero":
        out.append("ReZero gates, which drop the pre-norms (gate='rezero')")
    if cfg.gate in ("fixup", "tfixup"):
        out.append(f"{'Fixup' if cfg.gate == 'fixup' else 'T-Fixup'} blocks without LayerNorm (gate='{cfg.gate}')")
    if cfg.arch == "vit" and cfg.attn == "talking_heads":
        out.append("talking-heads attention in a ViT (timm has it only in Cait)")
    if cfg.arch == "cait" and cfg.mlp != "gelu":
        out.append(f"{cfg.mlp} MLPs in CaiT")
    if cfg.arch == "cait" and cfg.qk_norm:
        out.append("QK-norm in CaiT")
    if cfg.block in ("postnorm", "deepnorm"):
        out.append(f"{cfg.block} blocks (block={cfg.block!r}; timm's ResPostBlock normalises the branch, not the sum)")
    if cfg.block == "parallel" and (cfg.mlp != "gelu" or cfg.gate not in ("none", "layerscale")):
        out.append("a parallel block with a SwiGLU MLP or a scalar gate (timm's ParallelScalingBlock has a GELU MLP "
                   "and one LayerScale)")
    if cfg.sigma_reparam:
        out.append("sigma-Reparam linears (sigma_reparam=True)")
    if cfg.gate == "depth_mup":
        out.append("the depth-muP gate (gate='depth_mup')")
    if (cfg.arch == "vit" and cfg.reg_tokens and cfg.reg_position == "end" and cfg.pos_embed_cls
            and cfg.class_token and cfg.pos_embed != "none"):
        out.append("registers after the patches while the class token has a position slot (reg_position='end', "
                   "pos_embed_cls=True)")
    return out


def timm_model_for(model: VitlabModel) -> nn.Module:
    """A freshly initialised timm model with ``model``'s architecture."""
    cfg = model.cfg
    gated = cfg.gate in ("layerscale", "scalar", "skipinit")
    init = cfg.gate_init_value() if cfg.gate == "layerscale" and cfg.gate_init_value() else 1e-4
    common = dict(img_size=cfg.img_size, patch_size=cfg.patch_size, in_chans=cfg.in_chans,
                  num_classes=cfg.num_classes, global_pool=cfg.global_pool, embed_dim=cfg.embed_dim,
                  depth=cfg.depth, num_heads=cfg.num_heads, mlp_ratio=cfg.mlp_ratio, qkv_bias=cfg.qkv_bias,
                  drop_rate=cfg.drop_rate, pos_drop_rate=cfg.drop_rate, proj_drop_rate=cfg.drop_rate,
                  attn_drop_rate=cfg.attn_drop_rate)
    norm = TimmRmsNorm if cfg.norm == "rmsnorm" else TimmLayerNorm
    if cfg.arch == "cait":
        tm = TimmCait(**common, norm_layer=partial(norm, eps=NORM_EPS), init_values=init,
                      depth_token_only=cfg.depth_token_only, mlp_ratio_token_only=cfg.mlp_ratio_token_only)
        blocks = [(b, ("drop_path",)) for b in tm.blocks]
    else:
        slots = model.num_prefix_tokens if cfg.pos_embed_cls else 0
        tm = TimmViT(**common, qk_norm=cfg.qk_norm, init_values=init if gated else None,
                     class_token=cfg.class_token, reg_tokens=cfg.reg_tokens,
                     pos_embed="none" if cfg.pos_embed == "none" else "learn", no_embed_class=slots == 0,
                     fc_norm=cfg.fc_norm, norm_layer=norm, mlp_layer=TimmSwiGLU if cfg.mlp == "swiglu" else TimmMlp,
                     act_layer=nn.SiLU if cfg.mlp == "swiglu" else nn.GELU, scale_attn_norm=cfg.scale_attn_norm,
                     scale_mlp_norm=cfg.scale_mlp_norm,
                     block_fn=ParallelScalingBlock if cfg.block == "parallel" else TimmBlock)
        names = ("drop_path",) if cfg.block == "parallel" else ("drop_path1", "drop_path2")
        blocks = [(b, names) for b in tm.blocks]
    for (blk, names), rate in zip(blocks, drop_path_rates(cfg.drop_path_rate, cfg.depth, cfg.drop_path_rule)):
        for name in names:
            setattr(blk, name, DropPath(rate) if rate > 0 else nn.Identity())
    return tm


# ---------------------------------------------------------------- state-dict maps

@dataclass
class Rule:
    """One parameter that vitlab and timm hold differently: ``vitlab_key`` (None: vitlab has no such
    parameter) <-> ``timm_key``, with the value maps both ways (``to_vitlab`` raises when it cannot)."""

    vitlab_key: str | None
    timm_key: str
    to_timm: Callable[[Tensor | None], Tensor]
    to_vitlab: Callable[[Tensor], Tensor | None]


def conversion_rules(model: VitlabModel) -> list[Rule]:
    """The non-identity key maps for ``model``; every other key has the same name and value in both."""
    rules: list[Rule] = []
    dim = model.cfg.embed_dim
    gated = [(f"blocks.{i}", b) for i, b in enumerate(model.blocks)]
    if model.cfg.arch == "cait":
        gated += [(f"blocks_token_only.{i}", b) for i, b in enumerate(model.blocks_token_only)]
    for prefix, blk in gated:
        for j in (1, 2):
            gate = getattr(blk, f"ls{j}")
            timm_key = f"{prefix}.ls{j}.gamma" if model.cfg.arch == "vit" else f"{prefix}.gamma_{j}"
            if model.cfg.arch == "cait" and isinstance(gate, LayerScale):  # the same tensor, timm's Cait name
                rules.append(Rule(f"{prefix}.ls{j}.gamma", timm_key, _same, _same))
            elif isinstance(gate, ScalarGate):
                rules.append(Rule(f"{prefix}.ls{j}.alpha", timm_key, partial(_expand, dim=dim),
                                  partial(_constant, key=timm_key)))
            elif model.cfg.arch == "cait" and isinstance(gate, nn.Identity):
                rules.append(Rule(None, timm_key, partial(_fill, shape=(dim,), fill="ones"),
                                  partial(_require, key=timm_key, fill="ones")))
    if model.cfg.arch == "cait":
        heads = model.cfg.num_heads
        for i, blk in enumerate(model.blocks):
            if getattr(blk.attn, "talking_heads", True):
                continue
            for proj in ("proj_l", "proj_w"):
                for name, shape, fill in (("weight", (heads, heads), "eye"), ("bias", (heads,), "zeros")):
                    key = f"blocks.{i}.attn.{proj}.{name}"
                    rules.append(Rule(None, key, partial(_fill, shape=shape, fill=fill),
                                      partial(_require, key=key, fill=fill)))
        if model.pos_embed is None:
            shape = (1, model.num_patches, dim)
            rules.append(Rule(None, "pos_embed", partial(_fill, shape=shape, fill="zeros"),
                              partial(_require, key="pos_embed", fill="zeros")))
    return rules


def _same(value: Tensor) -> Tensor:
    return value


def _expand(alpha: Tensor, dim: int) -> Tensor:
    return alpha.detach().reshape(1).expand(dim).clone()


def _constant(gamma: Tensor, key: str) -> Tensor:
    if not torch.all(gamma == gamma.flatten()[0]):
        raise CheckpointError(f"{key} varies across channels, so a scalar gate cannot hold it; load it into a model "
                              f"with gate='layerscale'")
    return gamma.flatten()[0].clone()


def _fill(_: Tensor | None, shape: tuple[int, ...], fill: str) -> Tensor:
    if fill == "eye":
        return torch.eye(shape[0])
    return torch.ones(shape) if fill == "ones" else torch.zeros(shape)


def _require(value: Tensor, key: str, fill: str) -> None:
    expected = _fill(None, tuple(value.shape), fill) if fill != "eye" else torch.eye(value.shape[0])
    if value.shape != expected.shape or not torch.equal(value.float().cpu(), expected):
        what = {"ones": "all ones", "zeros": "all zeros", "eye": "the identity"}[fill]
        raise CheckpointError(f"{key} is not {what}, so this model (which has no such parameter) cannot hold it; "
                              f"load the weights into a model with LayerScale gates, talking-heads attention "
                              f"and a position embedding, as the file has")
    return None


def to_timm_state_dict(model: VitlabModel) -> dict[str, Tensor]:
    """``model``'s weights under timm's names and layout."""
    state = dict(model.state_dict())
    for rule in conversion_rules(model):
        value = state.pop(rule.vitlab_key) if rule.vitlab_key else None
        state[rule.timm_key] = rule.to_timm(value)
    for prefix in _parallel_prefixes(model):
        _parallel_to_timm(state, prefix)
    return state


# vitlab's parallel block -> timm's ParallelScalingBlock: names that move unchanged (vitlab, timm)
_PARALLEL_NAMES = (("norm1.", "in_norm."), ("attn.q_norm.", "q_norm."), ("attn.k_norm.", "k_norm."),
                   ("attn.proj.", "attn_out_proj."), ("mlp.fc2.", "mlp_out_proj."))


def _parallel_prefixes(model: VitlabModel) -> list[str]:
    return [f"blocks.{i}." for i in range(len(model.blocks))] if model.cfg.block == "parallel" else []


def _parallel_to_timm(state: dict[str, Tensor], p: str) -> None:
    """One parallel block to timm's layout: ``in_proj = [mlp.fc1; attn.qkv]`` (the MLP rows first), the MLP's
    bias in ``in_proj.bias`` (with the qkv bias) or ``mlp_bias`` (without), one LayerScale ``ls`` for both."""
    for ours, theirs in _PARALLEL_NAMES:
        for k in [k for k in state if k.startswith(p + ours)]:
            state[p + theirs + k[len(p + ours):]] = state.pop(k)
    state[p + "in_proj.weight"] = torch.cat([state.pop(p + "mlp.fc1.weight"), state.pop(p + "attn.qkv.weight")])
    fc1_bias, qkv_bias = state.pop(p + "mlp.fc1.bias"), state.pop(p + "attn.qkv.bias", None)
    if qkv_bias is None:
        state[p + "mlp_bias"] = fc1_bias
    else:
        state[p + "in_proj.bias"] = torch.cat([fc1_bias, qkv_bias])
    if p + "ls1.gamma" in state:
        g1, g2 = state.pop(p + "ls1.gamma"), state.pop(p + "ls2.gamma")
        if not torch.equal(g1, g2):
            raise CheckpointError(f"{p}ls1.gamma and {p}ls2.gamma differ, and timm's ParallelScalingBlock has one "
                                  f"LayerScale for both branches; keep this model in vitlab's format")
        state[p + "ls.gamma"] = g1


def _parallel_from_timm(state: dict[str, Tensor], p: str, hidden: int) -> None:
    """The inverse of :func:`_parallel_to_timm` (``hidden``: the MLP width, the first rows of ``in_proj``)."""
    for ours, theirs in _PARALLEL_NAMES:
        for k in [k for k in state if k.startswith(p + theirs)]:
            state[p + ours + k[len(p + theirs):]] = state.pop(k)
    w = state.pop(p + "in_proj.weight")
    state[p + "mlp.fc1.weight"], state[p + "attn.qkv.weight"] = w[:hidden], w[hidden:]
    if p + "in_proj.bias" in state:
        b = state.pop(p + "in_proj.bias")
        state[p + "mlp.fc1.bias"], state[p + "attn.qkv.bias"] = b[:hidden], b[hidden:]
    else:
        state[p + "mlp.fc1.bias"] = state.pop(p + "mlp_bias")
    if p + "ls.gamma" in state:
        g = state.pop(p + "ls.gamma")
        state[p + "ls1.gamma"], state[p + "ls2.gamma"] = g, g.clone()


def from_timm_state_dict(state: dict[str, Tensor], model: VitlabModel) -> dict[str, Tensor]:
    """A timm-layout (or already vitlab-layout) state dict under ``model``'s names."""
    state = dict(state)
    for prefix in _parallel_prefixes(model):
        if prefix + "in_proj.weight" in state:
            _parallel_from_timm(state, prefix, int(model.cfg.embed_dim * model.cfg.mlp_ratio))
    for rule in conversion_rules(model):
        if rule.vitlab_key in state or rule.timm_key not in state:
            continue
        value = rule.to_vitlab(state.pop(rule.timm_key))
        if rule.vitlab_key:
            state[rule.vitlab_key] = value
    return state


# ---------------------------------------------------------------- vitlab -> timm

def to_timm(model: VitlabModel) -> nn.Module:
    """The timm ``VisionTransformer`` or ``Cait`` equivalent to ``model``, carrying its weights; same device,
    dtype and train/eval mode. Raises :class:`ConfigError` for what timm cannot express (re-attention, RoPE...)."""
    reasons = timm_unsupported(model)
    if reasons:
        raise ConfigError(f"timm has no equivalent of {'; '.join(reasons)}; to_timm needs a model without them "
                          f"(keep this one in vitlab's format: `vitlab convert IN OUT --to vitlab`)")
    with torch.device("meta"):  # skip the initialisation: every parameter is overwritten below
        tm = timm_model_for(model)
    # a buffer might be one the state dict does not carry: then build the model for real
    tm = timm_model_for(model) if any(True for _ in tm.buffers()) else tm.to_empty(device="cpu")
    state = to_timm_state_dict(model)
    expected = tm.state_dict()
    wrong = sorted(set(state) ^ set(expected)) + [k for k in expected if k in state
                                                   and state[k].shape != expected[k].shape]
    if wrong:
        raise CheckpointError(f"internal key map from vitlab to timm is incomplete for {model.cfg.name or 'model'}: "
                              f"{', '.join(wrong[:8])}; please report it")
    tm.load_state_dict(state)
    p = next(model.parameters(), None)
    if p is not None:
        tm.to(device=p.device, dtype=p.dtype)
    return tm.train(model.training)
