"""Generic tests over every preset (at small sizes), the presets themselves, and timm as an oracle."""

from __future__ import annotations

import math

import pytest
import torch
from timm.layers import RmsNorm
from timm.models.cait import Cait as TimmCait
from timm.models.vision_transformer import VisionTransformer as TimmViT
from torch import nn

import vitlab
from _helpers import one_line
from vitlab.errors import ConfigError
from vitlab.interop.timm_convert import from_timm_state_dict, to_timm_state_dict
from vitlab.layers import Attention, ClassAttention, LayerScale, ReAttention, ScalarGate, record_attention, sincos_1d
from vitlab.models import Cait, ModelConfig, VisionTransformer

PRESETS = vitlab.list_models()
SMALL = dict(img_size=32, patch_size=8, depth=2)


def narrow(name: str, **overrides) -> vitlab.models.VitlabModel:
    """Preset ``name`` at img 32, patch 8, depth 2 and head dim 16 (its attention kind, gates and layout kept)."""
    heads = vitlab.get_config(name).num_heads
    return vitlab.create_model(name, **{**SMALL, "embed_dim": 16 * heads, **overrides})


def num_tokens(model: vitlab.models.VitlabModel) -> int:
    cfg = model.cfg
    return int(cfg.class_token) + cfg.reg_tokens + model.num_patches


# --- every preset ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", PRESETS)
def test_forward_backward_every_parameter_gets_a_gradient(name: str) -> None:
    wide = vitlab.get_config(name).embed_dim > 768  # ViT-5 large/xlarge: narrowed to keep the test fast
    model = (narrow(name) if wide else vitlab.create_model(name, **SMALL)).train()
    cfg = model.cfg
    x = torch.randn(2, cfg.in_chans, 32, 32)
    out = model(x)
    assert out.shape == (2, cfg.num_classes) and torch.isfinite(out).all()
    torch.nn.functional.cross_entropy(out, torch.tensor([0, 1])).backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None, pname
        assert torch.isfinite(p.grad).all(), pname
        assert p.grad.abs().sum() > 0, f"{pname} got an all-zero gradient"


@pytest.mark.parametrize("gate", ["rezero", "skipinit"])
def test_zero_gates_block_branch_gradients_but_not_the_gates(gate: str) -> None:
    model = vitlab.create_model("vit_mnist", depth=2, gate=gate).train()
    x = torch.randn(2, 1, 28, 28)
    ratios = model.residual_ratios(x)
    assert all(r["attn"].abs().max() == 0 and r["mlp"].abs().max() == 0 for r in ratios)
    model(x).logsumexp(-1).sum().backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None, pname
        # behind the zero gates: the branch weights, and the patch embedding whose tokens only reach the
        # class token through the (silent) attention branches
        in_branch = pname.startswith(("blocks.", "patch_embed.")) and not pname.endswith(".alpha")
        if in_branch:
            assert p.grad.abs().max() == 0, pname
        else:
            assert p.grad.abs().sum() > 0, pname
    assert all(isinstance(b.ls1, ScalarGate) and b.ls1.alpha.grad.abs() > 0 for b in model.blocks)


@pytest.mark.parametrize("name", PRESETS)
def test_features_head_and_intermediate_layers(name: str) -> None:
    model = narrow(name).eval()
    cfg = model.cfg
    x = torch.randn(2, cfg.in_chans, 32, 32)
    feats = model.forward_features(x)
    assert feats.shape == (2, num_tokens(model), cfg.embed_dim)
    pre = model.forward_head(feats, pre_logits=True)
    assert pre.shape == (2, model.num_features)
    torch.testing.assert_close(model.forward_head(feats), model.head(pre))
    inter = model.get_intermediate_layers(x, 2)  # timm's semantics: the patch tokens of the last 2 blocks
    assert len(inter) == 2
    assert all(t.shape == (2, model.num_patches, cfg.embed_dim) for t in inter)
    if isinstance(model, VisionTransformer):
        patches = feats[:, model.num_front:feats.shape[1] - model.num_end]
        torch.testing.assert_close(model.get_intermediate_layers(x, 1, norm=True)[0], patches)
    model.reset_classifier(5)
    assert model(x).shape == (2, 5) and model.num_classes == 5
    model.reset_classifier(0)
    torch.testing.assert_close(model(x), pre)


def force_fused(model: nn.Module) -> int:
    """Make every attention layer that can fuse take SDPA; the number of layers that will call it."""
    fusable = 0
    for m in model.modules():
        if isinstance(m, Attention) and not m.talking_heads:
            m.fused, fusable = True, fusable + 1
        elif isinstance(m, ClassAttention):
            fusable += 1
    return fusable


@pytest.mark.parametrize("name", PRESETS)
def test_explicit_attention_path_keeps_the_logits(name: str, sdpa_calls: list) -> None:
    model = narrow(name).eval()
    x = torch.randn(2, model.cfg.in_chans, 32, 32)
    fusable = force_fused(model)  # with autograd on and <= 32 tokens the automatic choice is explicit
    fused = model(x)
    assert len(sdpa_calls) == fusable  # each fusable layer ran the fused kernel
    with record_attention(model.modules()) as maps:
        explicit = model(x)
    assert len(sdpa_calls) == fusable  # and none did while recording
    torch.testing.assert_close(explicit, fused, atol=1e-5, rtol=1e-5)
    assert len(maps) == len(model.attention_layers()) == model.cfg.depth + (
        model.cfg.depth_token_only if isinstance(model, Cait) else 0)
    assert all(m._maps is None for m in model.attention_layers())


@pytest.mark.parametrize("overrides", [dict(qk_norm=True), dict(rope=True), dict(qk_norm=True, rope=True)],
                         ids=["qk_norm", "rope", "qk_norm+rope"])
def test_explicit_attention_path_keeps_the_logits_qk_norm_rope(overrides: dict, sdpa_calls: list) -> None:
    model = vitlab.create_model("vit_mnist", depth=2, **overrides).eval()
    x = torch.randn(2, 1, 28, 28)
    assert force_fused(model) == 2
    fused = model(x)
    assert len(sdpa_calls) == 2
    maps = model.attention_maps(x)
    assert len(sdpa_calls) == 2
    with record_attention(model.modules()):
        explicit = model(x)
    torch.testing.assert_close(explicit, fused, atol=1e-5, rtol=1e-5)
    assert all(m.shape == (2, 8, 17, 17) for m in maps)
    torch.testing.assert_close(maps[0].sum(-1), torch.ones(2, 8, 17))


def test_attention_maps_mhsa() -> None:
    model = vitlab.create_model("vit_mnist", depth=3)
    maps = model.attention_maps(torch.randn(2, 1, 28, 28))
    assert len(maps) == 3
    for m in maps:
        assert m.shape == (2, 8, 17, 17)
        torch.testing.assert_close(m.sum(-1), torch.ones(2, 8, 17))


def test_attention_maps_cait_talking_heads_then_class_attention() -> None:
    model = narrow("cait_xxs24")
    n = model.num_patches
    maps = model.attention_maps(torch.randn(2, 3, 32, 32))
    assert len(maps) == 2 + 2
    assert all(m.shape == (2, 4, n, n) for m in maps[:2])  # talking heads over the patches only
    for m in maps[2:]:  # class-attention: one query (the class token) over [cls, patches]
        assert m.shape == (2, 4, 1, n + 1)
        torch.testing.assert_close(m.sum(-1), torch.ones(2, 4, 1))
    assert isinstance(model.blocks[0].attn, Attention) and model.blocks[0].attn.talking_heads
    assert isinstance(model.blocks_token_only[0].attn, ClassAttention)


@pytest.mark.parametrize("norm", ["batch", "layer"])
def test_attention_maps_reattention(norm: str) -> None:
    model = narrow("deepvit_16b", reattn_norm=norm)
    maps = model.attention_maps(torch.randn(2, 3, 32, 32))
    assert len(maps) == 2 and all(m.shape == (2, 12, 17, 17) for m in maps)
    assert all(isinstance(b.attn, ReAttention) and b.attn.norm_kind == norm for b in model.blocks)


def test_attention_maps_vit5_include_registers() -> None:
    model = narrow("vit5_small")
    maps = model.attention_maps(torch.randn(2, 3, 32, 32))
    t = 1 + 16 + 4  # cls + patches + 4 registers
    assert model.cfg.reg_tokens == 4 and model.num_end == 4
    for m in maps:
        assert m.shape == (2, 6, t, t)
        torch.testing.assert_close(m.sum(-1), torch.ones(2, 6, t))
    assert model.rope.shape == (2, t, 8, 2)  # (cos, sin) per adjacent channel pair: the ViT-5 code's RoPE layout


def test_attention_maps_carry_gradients() -> None:
    model = vitlab.create_model("vit_mnist", depth=1)
    maps = model.attention_maps(torch.randn(1, 1, 28, 28))
    maps[0][..., 0].sum().backward()
    assert model.blocks[0].attn.qkv.weight.grad.abs().sum() > 0


def test_deepvit_reattention_in_last_blocks_only() -> None:
    model = vitlab.create_model("deepvit_s", img_size=32, patch_size=8, depth=8, embed_dim=192)
    kinds = [type(b.attn) for b in model.blocks]
    assert kinds == [Attention] * 3 + [ReAttention] * 5  # reattn_last=5
    assert type(model.patch_embed).__name__ == "ConvStem"


def test_residual_ratios_per_gated_block() -> None:
    model = narrow("cait_xxs24", init_values=1e-5)  # at depth 2 the rule would give 0.1
    ratios = model.residual_ratios(torch.randn(2, 3, 32, 32))
    assert len(ratios) == 2 + 2  # SA blocks then CA blocks
    for r in ratios:
        assert set(r) == {"attn", "mlp"} and r["attn"].shape == (2,) and r["mlp"].shape == (2,)
        assert (r["attn"] > 0).all() and (r["attn"] < 1e-3).all()
    plain = narrow("vit_tiny").residual_ratios(torch.randn(2, 3, 32, 32))
    assert all((r["mlp"] > 1e-3).all() for r in plain)


# --- the presets themselves ------------------------------------------------------------------------


def test_vit_mnist_is_the_seed_003_model() -> None:
    model = vitlab.create_model("vit_mnist")
    cfg = model.cfg
    assert (cfg.img_size, cfg.in_chans, cfg.patch_size, cfg.embed_dim, cfg.depth, cfg.num_heads, cfg.num_classes) == (
        28, 1, 7, 64, 8, 8, 10)
    assert model.num_patches == 16 and model.cls_token.shape == (1, 1, 64)
    assert "pos_embed" not in dict(model.named_parameters())  # fixed, a buffer
    torch.testing.assert_close(model.pos_embed[0], sincos_1d(17, 64))
    assert model(torch.randn(3, 1, 28, 28)).shape == (3, 10)


def test_vit5_layout_and_gates() -> None:
    model = vitlab.create_model("vit5_small", depth=2)
    assert model.reg_token.shape == (1, 4, 384) and model.pos_embed.shape == (1, 196, 384)
    assert all(isinstance(b.ls1, LayerScale) and b.ls1.gamma[0].item() == pytest.approx(1e-4) for b in model.blocks)
    assert model.blocks[0].attn.qkv.bias is None
    assert type(model.norm).__name__ == "RMSNorm"


def test_cait_presets_layerscale_init_and_uniform_drop_path() -> None:
    expected = {"cait_xxs24": 1e-5, "cait_s24": 1e-5, "cait_s36": 1e-6, "cait_m48": 1e-6}
    for name, value in expected.items():
        assert vitlab.get_config(name).init_values == value
    model = vitlab.create_model("cait_xxs24", **SMALL, drop_path_rate=0.1)
    assert model.blocks[0].ls1.gamma[0].item() == pytest.approx(0.1)  # depth 2: the depth rule, not the preset's 1e-5
    assert [b.drop_path1.drop_prob for b in model.blocks] == pytest.approx([0.1, 0.1])


def _gammas(model: nn.Module) -> set[float]:
    """The distinct values of CaiT's gammas, as float32 numbers."""
    return {g.item() for n, p in model.named_parameters() if n.endswith(("ls1.gamma", "ls2.gamma"))
            for g in p.detach().unique()}


def _f32(*values: float) -> set[float]:
    return {torch.tensor(v, dtype=torch.float32).item() for v in values}


def test_cait_depth_override_rederives_the_layerscale_init() -> None:
    """A preset's init belongs to its depth; at another depth the CaiT depth rule applies, an explicit value stays."""
    tiny = dict(img_size=32, patch_size=8, embed_dim=32, num_heads=4)
    assert vitlab.get_config("cait_xxs36").init_values == 1e-5  # timm's value for this preset, kept at depth 36
    assert vitlab.get_config("cait_xxs36", depth=36).init_values == 1e-5
    for depth, rule in ((12, 0.1), (24, 1e-5), (40, 1e-6)):
        cfg = vitlab.get_config("cait_xxs36", depth=depth, **tiny)
        assert cfg.gate_init_value() == rule
        assert _gammas(vitlab.create_model(cfg)) == _f32(rule)
    assert _gammas(vitlab.create_model("cait_xxs24", depth=30, **tiny)) == _f32(1e-6)
    assert _gammas(vitlab.create_model("cait_xxs24", depth=30, init_values=1e-3, **tiny)) == _f32(1e-3)
    hand = ModelConfig(arch="cait", attn="talking_heads", gate="layerscale", pos_embed_cls=False, depth=20, **tiny)
    assert hand.init_values is None and _gammas(vitlab.create_model(hand)) == _f32(1e-5)
    assert hand.replace(depth=3).gate_init_value() == 0.1  # None follows the depth
    vit = vitlab.create_model("vit_mnist", depth=30, gate="layerscale")
    assert vit.cfg.gate_init_value() is None and vit.blocks[0].ls1.gamma[0].item() == pytest.approx(1e-4)


def test_residual_ratio_rows_warn_when_blocks_and_ratios_differ() -> None:
    from vitlab.analysis import summarize_ratios

    model = narrow("vit_tiny")  # 2 gated blocks
    parts = [{"attn": torch.rand(3, 4), "mlp": torch.rand(3, 4)}]  # 3 recorded (a block run twice)
    with pytest.warns(UserWarning, match="3 residual ratios per image but has 2 gated blocks"):
        rows = summarize_ratios(model, parts)
    assert [r.name for r in rows] == ["block 0", "block 1", "block 2"]


def test_drop_path_linear_schedule_in_model() -> None:
    model = vitlab.create_model("vit_mnist", depth=5, drop_path_rate=0.2)
    rates = [getattr(b.drop_path1, "drop_prob", 0.0) for b in model.blocks]
    assert rates == pytest.approx([0.0, 0.05, 0.1, 0.15, 0.2])


def test_no_weight_decay_names() -> None:
    model = narrow("vit5_small")
    nwd = model.no_weight_decay()
    assert {"cls_token", "reg_token", "pos_embed", "blocks.0.ls1.gamma", "blocks.0.norm1.weight",
            "blocks.0.attn.proj.bias", "blocks.0.attn.q_norm.weight"} <= nwd
    assert not {"blocks.0.attn.qkv.weight", "blocks.0.mlp.fc1.weight", "head.weight"} & nwd
    cait = narrow("cait_xxs24").no_weight_decay()
    assert {"blocks.0.ls1.gamma", "blocks_token_only.1.ls2.gamma", "cls_token", "pos_embed"} <= cait


def test_config_round_trip() -> None:
    cfg = vitlab.get_config("vit5_small", depth=3)
    again = ModelConfig.from_dict(cfg.to_dict())
    assert again == cfg
    a, b = vitlab.create_model(cfg), vitlab.create_model(again)
    assert {k: v.shape for k, v in a.state_dict().items()} == {k: v.shape for k, v in b.state_dict().items()}


# --- timm as the oracle: names, shapes, logits ------------------------------------------------------


def _shapes(model: nn.Module) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def _timm_kwargs(cfg: ModelConfig) -> dict:
    return dict(img_size=cfg.img_size, patch_size=cfg.patch_size, in_chans=cfg.in_chans,
                num_classes=cfg.num_classes, embed_dim=cfg.embed_dim, depth=cfg.depth, num_heads=cfg.num_heads,
                mlp_ratio=cfg.mlp_ratio)


def _timm_model(cfg: ModelConfig) -> nn.Module:
    if cfg.arch == "cait":
        return TimmCait(**_timm_kwargs(cfg), qkv_bias=cfg.qkv_bias, init_values=cfg.gate_init_value(),
                        depth_token_only=cfg.depth_token_only)
    if cfg.reg_tokens:  # ViT-5-like: what timm's VisionTransformer can express of it
        return TimmViT(**_timm_kwargs(cfg), reg_tokens=cfg.reg_tokens, no_embed_class=True, qk_norm=True,
                       norm_layer=RmsNorm, qkv_bias=False, init_values=cfg.init_values)
    return TimmViT(**_timm_kwargs(cfg), qkv_bias=cfg.qkv_bias)


TIMM_NAMED = ["vit_mnist", "vit_tiny", "vit_small", "vit_base", *vitlab.list_models("cait*"),
              *vitlab.list_models("vit5*")]


@pytest.mark.parametrize("name", TIMM_NAMED)
def test_state_dict_names_and_shapes_equal_timm(name: str) -> None:
    """A ViT's names are timm's; a CaiT's after the key map to timm (LayerScale ``ls{j}.gamma`` -> ``gamma_{j}``)."""
    cfg = vitlab.get_config(name, depth=2)
    with torch.device("meta"):  # names and shapes only: no memory, no init time
        ours, ref = vitlab.create_model(cfg), _timm_model(cfg)
    assert {k: tuple(v.shape) for k, v in to_timm_state_dict(ours).items()} == _shapes(ref)
    if cfg.arch == "vit":
        assert _shapes(ours) == _shapes(ref)


def _perturbed_timm_state(ref: nn.Module) -> dict[str, torch.Tensor]:
    """timm's weights moved away from their init (LayerScale, norms, biases and tokens included)."""
    sd = {k: v + 0.1 * torch.randn_like(v) for k, v in ref.state_dict().items()}
    ref.load_state_dict(sd)
    return sd


@pytest.mark.parametrize("name,overrides", [
    ("vit_tiny", {}),
    ("vit_mnist", {}),
    ("cait_xxs24", {}),
    ("vit5_small", dict(rope=False, reg_position="front")),  # timm has no RoPE and puts registers first
], ids=["vit_tiny", "vit_mnist", "cait_xxs24", "vit5_small-norope-front"])
def test_logits_equal_timm_with_the_same_weights(name: str, overrides: dict) -> None:
    img = 28 if name == "vit_mnist" else 32
    patch = 7 if name == "vit_mnist" else 8
    cfg = vitlab.get_config(name, img_size=img, patch_size=patch, depth=2, embed_dim=64, num_heads=4, **overrides)
    ref = _timm_model(cfg).eval()
    ours = vitlab.create_model(cfg).eval()
    ours.load_state_dict(from_timm_state_dict(_perturbed_timm_state(ref), ours), strict=True)
    x = torch.randn(2, cfg.in_chans, img, img)
    torch.testing.assert_close(ours(x), ref(x), atol=1e-5, rtol=1e-5)


# --- clear errors ----------------------------------------------------------------------------------


def test_error_heads_not_dividing_dim() -> None:
    with pytest.raises(ConfigError) as exc:
        vitlab.create_model("vit_tiny", num_heads=5)
    msg = one_line(exc)
    assert "num_heads 5" in msg and "embed_dim 192" in msg and "pick num_heads" in msg


def test_error_image_not_divisible_by_patch() -> None:
    with pytest.raises(ConfigError) as exc:
        vitlab.create_model("vit_mnist", img_size=30)
    msg = one_line(exc)
    assert "img_size 30" in msg and "patch_size 7" in msg and "28" in msg and "35" in msg


def test_error_unknown_preset_names_the_closest() -> None:
    with pytest.raises(ConfigError) as exc:
        vitlab.create_model("cait_s42")
    msg = one_line(exc)
    assert "cait_s42" in msg and "cait_s24" in msg and "vitlab models" in msg


def test_error_unknown_override_key() -> None:
    with pytest.raises(ConfigError) as exc:
        vitlab.create_model("vit_tiny", embed_dimm=64)
    msg = one_line(exc)
    assert "embed_dimm" in msg and "did you mean embed_dim" in msg


@pytest.mark.parametrize("shape", [(2, 3, 28, 28), (2, 1, 32, 32), (1, 28, 28)])
def test_error_wrong_input_shape(shape: tuple[int, ...]) -> None:
    model = vitlab.create_model("vit_mnist", depth=1)
    with pytest.raises(ConfigError) as exc:
        model(torch.randn(shape))
    assert "(B, 1, 28, 28)" in one_line(exc)


@pytest.mark.parametrize("overrides,needle", [
    (dict(gate="layerscal"), "did you mean 'layerscale'"),
    (dict(class_token=False), "global_pool='avg'"),
    (dict(rope=True, num_heads=32), "head dim divisible by 4"),
    (dict(drop_path_rate=1.0), "drop_path_rate"),
    (dict(attn="reattention", qk_norm=True), "set qk_norm=False"),
])
def test_error_bad_combinations(overrides: dict, needle: str) -> None:
    with pytest.raises(ConfigError) as exc:
        vitlab.create_model("vit_mnist", **overrides)
    assert needle in one_line(exc)


def test_weight_init_xavier_draws_the_block_linears_wider_and_keeps_the_head():
    torch.manual_seed(0)
    default = vitlab.create_model("vit_mnist")
    torch.manual_seed(0)
    xavier = vitlab.create_model("vit_mnist", weight_init="xavier")
    qkv = xavier.blocks[0].attn.qkv.weight  # (192, 64): Xavier-uniform bound sqrt(6 / (64 + 192))
    assert qkv.abs().max() <= math.sqrt(6 / 256) + 1e-6 and qkv.std() > 0.08
    assert default.blocks[0].attn.qkv.weight.std() < 0.021
    assert xavier.head.weight.std() < 0.021 and torch.equal(xavier.blocks[3].mlp.fc1.bias, torch.zeros(256))
    with pytest.raises(ConfigError, match="weight_init"):
        vitlab.create_model("vit_mnist", weight_init="jax")
