"""FLOP accounting: layer formulas and whole models against FlopCounterMode, summaries and paper numbers."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import vitlab
from vitlab import flops
from vitlab.layers import (
    Attention,
    ClassAttention,
    ConvStem,
    LayerNorm,
    LayerScale,
    Mlp,
    PatchEmbed,
    ReAttention,
    RMSNorm,
    SwiGLU,
    layout_rope,
)

PRESETS = vitlab.list_models()
# presets whose default-size, full-depth cross-check on the meta device takes about a second on 2 cores
HEAVY = {n for n in PRESETS if vitlab.get_config(n).depth > 24 or vitlab.get_config(n).embed_dim > 768}


def counted(module: nn.Module, *args, **kwargs) -> int:
    """Matmul FLOPs of ``module(*args)`` as ``FlopCounterMode`` reports them (eval, MATH attention)."""
    return flops.torch_flops(_Call(module, kwargs), *args)


class _Call(nn.Module):
    def __init__(self, module: nn.Module, kwargs: dict) -> None:
        super().__init__()
        self.module, self.kwargs = module, kwargs

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        return self.module(*args, **self.kwargs)


# --- layer formulas --------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs", [{}, dict(talking_heads=True), dict(qk_norm=True), dict(qkv_bias=False)],
                         ids=["plain", "talking_heads", "qk_norm", "no_bias"])
def test_attention_flop_count_matches_torch(kwargs: dict) -> None:
    attn = Attention(48, 6, **kwargs)
    assert 2 * attn.flop_count(13, matmul_only=True) == counted(attn, torch.randn(1, 13, 48))


def test_attention_with_rope_flop_count_matches_torch() -> None:
    attn = Attention(32, 2, qk_norm=True)
    rope = layout_rope(1, 3, 4, 16, 10000.0, 100.0)  # T = 1 + 9 + 4
    assert 2 * attn.flop_count(14, matmul_only=True, rope=True) == counted(attn, torch.randn(1, 14, 32), rope=rope)
    extra = attn.flop_count(14, rope=True) - attn.flop_count(14)
    assert extra == 2 * 2 * 14 * 32  # q and k: x * cos and rotate_half(x) * sin


def test_talking_heads_cost_exactly_two_head_mixes() -> None:
    t, h = 11, 4
    plain, talking = Attention(32, h), Attention(32, h, talking_heads=True)
    diff = talking.flop_count(t, matmul_only=True) - plain.flop_count(t, matmul_only=True)
    assert diff == 2 * t * t * h * h  # proj_l and proj_w: Linear(H, H) at every (query, key)


@pytest.mark.parametrize("norm,scale", [("batch", False), ("layer", False), ("batch", True)])
def test_reattention_flop_count_matches_torch(norm: str, scale: bool) -> None:
    t, c, h = 10, 36, 6
    reattn = ReAttention(c, h, norm=norm, scale=scale)
    assert 2 * reattn.flop_count(t, matmul_only=True) == counted(reattn, torch.randn(1, t, c))
    plain = Attention(c, h).flop_count(t, matmul_only=True)
    assert reattn.flop_count(t, matmul_only=True) - plain == t * t * h * h  # the Theta einsum
    per_elem = (2 if norm == "batch" else 3) + (1 if scale else 0)
    assert reattn.flop_count(t) - reattn.flop_count(t, matmul_only=True) == t * c + h * t * t * (1 + per_elem)


def test_class_attention_flop_count_matches_torch() -> None:
    ca = ClassAttention(32, 4)
    t = 17
    assert 2 * ca.flop_count(t, matmul_only=True) == counted(ca, torch.randn(1, t, 32))
    # one query: q and proj on one token, k and v on all of them, QK^T and AV of size t
    assert ca.flop_count(t, matmul_only=True) == 2 * 32 * 32 + 2 * t * 32 * 32 + 2 * t * 32


@pytest.mark.parametrize("layer", [Mlp(24, 96), Mlp(24, 50, bias=False), SwiGLU(24, 64)], ids=["mlp", "mlp_nobias",
                                                                                             "swiglu"])
def test_mlp_flop_count_matches_torch(layer: nn.Module) -> None:
    assert 2 * layer.flop_count(9, matmul_only=True) == counted(layer, torch.randn(1, 9, 24))


def test_patch_embed_and_conv_stem_flop_count_match_torch() -> None:
    pe = PatchEmbed(32, 8, 3, 40)
    assert 2 * pe.flop_count() == counted(pe, torch.randn(1, 3, 32, 32))
    assert pe.flop_count() == 16 * 3 * 64 * 40
    stem = ConvStem(32, 8, 3, 40)
    assert 2 * stem.flop_count(matmul_only=True) == counted(stem, torch.randn(1, 3, 32, 32))
    assert stem.flop_count() - stem.flop_count(matmul_only=True) == 3 * 2 * 16 * 16 * 64  # eval BatchNorms


@pytest.mark.parametrize("layer", [LayerNorm(16), RMSNorm(16), LayerScale(16)], ids=["ln", "rms", "ls"])
def test_elementwise_layers_have_no_matmul_flops(layer: nn.Module) -> None:
    assert counted(layer, torch.randn(1, 5, 16)) == 0
    assert layer.flop_count(5, matmul_only=True) == 0
    assert layer.flop_count(5) > 0


# --- whole models against FlopCounterMode ----------------------------------------------------------


def _meta(name: str, **overrides) -> vitlab.models.VitlabModel:
    with torch.device("meta"):
        return vitlab.create_model(name, **overrides)


@pytest.mark.parametrize("img", [32, 64])
@pytest.mark.parametrize("name", PRESETS)
def test_cross_check_every_preset_at_two_sizes(name: str, img: int) -> None:
    model = _meta(name, img_size=img, patch_size=8, depth=3)
    ours, theirs = flops.cross_check(model)
    assert ours == theirs > 0


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in HEAVY else n for n in PRESETS])
def test_cross_check_every_preset_at_default_size(name: str) -> None:
    ours, theirs = flops.cross_check(_meta(name))
    assert ours == theirs


@pytest.mark.parametrize("overrides", [
    dict(gate="rezero"), dict(gate="skipinit"), dict(gate="scalar"), dict(gate="layerscale"), dict(mlp="swiglu"),
    dict(reg_tokens=3, reg_position="front"), dict(reg_tokens=2, reg_position="end", rope=True),
    dict(global_pool="avg", class_token=False), dict(global_pool="avg"), dict(pos_embed="sincos2d"),
    dict(attn="reattention", reattn_norm="layer", reattn_scale=True, reattn_last=1),
    dict(stem="conv", patch_size=4), dict(patch_size=4, num_classes=0), dict(norm="rmsnorm", qk_norm=True),
    dict(attn="talking_heads", depth=1, mlp_ratio=2.5),
], ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_cross_check_variants(overrides: dict) -> None:
    model = _meta("vit_mnist", **{"img_size": 32, "patch_size": 8, "depth": 2, **overrides})
    ours, theirs = flops.cross_check(model)
    assert ours == theirs


@pytest.mark.parametrize("name", ["vit_mnist", "cait_xxs24", "deepvit_s", "vit5_small"])
def test_cross_check_on_real_tensors(name: str) -> None:
    model = vitlab.create_model(name, img_size=32, patch_size=8, depth=2).train()
    with torch.no_grad():  # the counter must work inside no_grad too, and restore training mode
        ours, theirs = flops.cross_check(model)
    assert ours == theirs and model.training


def test_vit_mnist_matmul_macs_by_hand() -> None:
    n, t, d, hid, heads = 16, 17, 64, 256, 8
    per_block = t * d * 3 * d + 2 * t * t * d + t * d * d + 2 * t * d * hid  # qkv, QK^T + AV, proj, MLP
    matmul = n * 49 * d + 8 * per_block + d * 10  # patch conv, 8 blocks, head
    model = vitlab.create_model("vit_mnist")
    assert model.flop_count(matmul_only=True) == matmul
    # elementwise: 2 LayerNorms (3 per element), q * scale, softmax division, GELU; final LayerNorm
    per_block_ew = 2 * 3 * t * d + t * d + heads * t * t + t * hid
    assert model.flop_count() == matmul + 8 * per_block_ew + 3 * t * d


# --- summaries -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", PRESETS)
def test_summary_adds_up(name: str) -> None:
    model = _meta(name)
    s = flops.summarize(model)
    assert s.macs == model.flop_count() and s.matmul_macs == model.flop_count(matmul_only=True)
    assert s.flops == 2 * s.macs
    assert s.params == sum(p.numel() for p in model.parameters())
    by_type = s.by_type
    assert set(by_type) <= set(flops.TYPES)
    assert sum(t["macs"] for t in by_type.values()) == s.macs
    assert sum(t["params"] for t in by_type.values()) == s.params
    assert len({r.name for r in s.rows}) == len(s.rows)
    attn_kinds = {"attention", "reattention"}
    assert sum(r.type in attn_kinds for r in s.rows) == model.cfg.depth
    if model.cfg.arch == "cait":
        assert sum(r.type == "class_attention" for r in s.rows) == model.cfg.depth_token_only


def test_summary_gate_rows() -> None:
    model = _meta("vit5_small", depth=2)
    t = 1 + 196 + 4
    rows = {r.name: r for r in flops.summarize(model).rows}
    for i in range(2):
        for g in ("ls1", "ls2"):
            r = rows[f"blocks.{i}.{g}"]
            assert (r.type, r.macs, r.matmul_macs, r.params, r.tokens) == ("layerscale", t * 384, 0, 384, t)
    cait = {r.name: r for r in flops.summarize(_meta("cait_xxs24", depth=1)).rows}
    assert cait["blocks.0.ls1"].macs == 196 * 192 and cait["blocks.0.ls1"].type == "layerscale"
    assert cait["blocks_token_only.0.ls2"].macs == 192  # class-attention blocks update one token
    assert cait["blocks_token_only.0.attn"].tokens == 197
    assert cait["blocks_token_only.0.mlp"].tokens == 1
    rezero = {r.name: r for r in flops.summarize(_meta("vit_mnist", gate="rezero")).rows}
    assert rezero["blocks.0.ls1"].type == "gate" and rezero["blocks.0.ls1"].macs == 17 * 64
    assert "blocks.0.norm1" not in rezero  # ReZero has no pre-norms


@pytest.mark.parametrize("name,gmacs,mparams", [
    ("vit_tiny", 1.3, 5.7), ("vit_small", 4.6, 22.1), ("vit_base", 17.6, 86.6),  # DeiT, Table 1
    ("cait_xxs24", 2.5, 12.0), ("cait_xxs36", 3.8, 17.3), ("cait_xs24", 5.4, 26.6),  # CaiT, Table 3
    ("cait_s24", 9.4, 46.9), ("cait_s36", 13.9, 68.2),
])
def test_paper_numbers_at_224(name: str, gmacs: float, mparams: float) -> None:
    s = flops.summarize(_meta(name))
    assert round(s.macs / 1e9, 1) == gmacs  # the papers' "FLOPs" are MACs
    assert round(s.params / 1e6, 1) == mparams


def test_format_table_and_json() -> None:
    model = vitlab.create_model("cait_xxs24", img_size=32, patch_size=8, depth=2)
    s = flops.summarize(model)
    text = flops.format_table(s)
    for r in s.rows:
        assert f"\n{r.name} " in text
    assert f"{s.macs:,}" in text and f"{s.flops:,}" in text and "= 2 x MACs" in text
    assert "class_attention" in text and "layerscale" in text
    d = json.loads(json.dumps(s.to_dict()))
    assert d["macs"] == s.macs and d["flops"] == 2 * s.macs and len(d["rows"]) == len(s.rows)
    assert flops.format_cross_check(10, 10).endswith("OK, equal")
    assert "MISMATCH by +2" in flops.format_cross_check(10, 12)
    assert flops.human(9_358_877_648, "MACs") == "9.36 GMACs" and flops.human(512, "MACs") == "512 MACs"
