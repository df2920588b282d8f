"""Fixup (Zhang et al. 2019) and T-Fixup (Huang et al. 2020): init statistics against the papers' formulas,
identity blocks at init, and a few training steps without NaN."""

import math

import pytest
import torch

import vitlab
from vitlab.errors import ConfigError
from vitlab.layers import Block
from vitlab.layers.fixup import BiasedActivation, BiasedLinear, FixupGate, fixup_scale, tfixup_scales

DIM, DEPTH = 128, 6


def _model(gate: str, **kw):
    torch.manual_seed(0)
    return vitlab.create_model("vit_mnist", embed_dim=DIM, num_heads=4, depth=DEPTH, gate=gate, **kw)


def _close(actual: float, expected: float, rel: float = 0.05) -> None:
    assert actual == pytest.approx(expected, rel=rel), (actual, expected)


def test_fixup_scale_is_the_papers_exponent():
    assert fixup_scale(16, 2) == pytest.approx(16 ** -0.5)
    assert fixup_scale(16, 3) == pytest.approx(16 ** -0.25)  # a ResNet bottleneck-like branch of 3 layers
    assert tfixup_scales(16) == pytest.approx((0.67 * 16 ** -0.25, (9 * 16) ** -0.25))


def test_fixup_init_statistics_follow_the_formula():
    model = _model("fixup")
    scale = (2 * DEPTH) ** -0.5  # L = 2 branches per block, m = 2 layers per branch: L^(-1/(2m-2))
    for blk in model.blocks:
        _close(blk.attn.qkv.weight.std().item(), scale / math.sqrt(DIM))
        _close(blk.mlp.fc1.weight.std().item(), math.sqrt(2.0) * scale / math.sqrt(DIM))
        for last in (blk.attn.proj, blk.mlp.fc2):
            assert last.weight.abs().max() == 0 and last.bias.abs().max() == 0
        assert isinstance(blk.ls1, FixupGate) and blk.ls1.scale.item() == 1.0 and blk.ls1.bias.item() == 0.0
        assert all(isinstance(m, BiasedLinear) for m in (blk.attn.qkv, blk.attn.proj, blk.mlp.fc1, blk.mlp.fc2))
        assert isinstance(blk.mlp.act, BiasedActivation)
        assert isinstance(blk.norm1, torch.nn.Identity) and isinstance(blk.norm2, torch.nn.Identity)
    assert model.head.weight.abs().max() == 0 and model.head.bias.abs().max() == 0


def test_fixup_blocks_are_identities_at_init():
    model = _model("fixup").eval()
    x = torch.randn(2, 17, DIM)
    for blk in model.blocks:
        torch.testing.assert_close(blk(x), x)
    assert model(torch.randn(2, 1, 28, 28)).abs().max() == 0  # zero head


def test_tfixup_init_statistics_follow_the_formula():
    model = _model("tfixup")
    weights, embedding = tfixup_scales(DEPTH)
    xavier = math.sqrt(2.0 / (DIM + DIM))
    for blk in model.blocks:
        q, k, v = blk.attn.qkv.weight.split(DIM)
        _close(q.std().item(), xavier / math.sqrt(2))  # the authors' code: Xavier gain 1/sqrt(2), not scaled
        _close(k.std().item(), xavier / math.sqrt(2))
        _close(v.std().item(), weights * xavier)
        _close(blk.attn.proj.weight.std().item(), weights * xavier)
        hidden = blk.mlp.fc1.out_features
        _close(blk.mlp.fc1.weight.std().item(), weights * math.sqrt(2.0 / (DIM + hidden)))
        _close(blk.mlp.fc2.weight.std().item(), weights * math.sqrt(2.0 / (DIM + hidden)))
        assert isinstance(blk.norm1, torch.nn.Identity) and isinstance(blk.ls1, torch.nn.Identity)
    proj = model.patch_embed.proj.weight  # (D, C, p, p): a linear map from C p^2 pixels to D
    _close(proj.std().item(), embedding * math.sqrt(2.0 / (proj[0].numel() + DIM)))
    assert not any(isinstance(m, torch.nn.LayerNorm) or type(m).__name__ == "LayerNorm"
                   for b in model.blocks for m in b.modules())


def test_tfixup_token_embeddings_are_scaled_gaussians_and_positions_are_not_scaled():
    model = _model("tfixup", pos_embed="learned")
    _, embedding = tfixup_scales(DEPTH)
    _close(model.pos_embed.std().item(), 0.02, rel=0.1)  # outside T-Fixup, as in the authors' code
    _close(model.cls_token.std().item(), embedding, rel=0.3)  # the code's token std after its sqrt(d) scale


@pytest.mark.parametrize("gate", ["fixup", "tfixup"])
def test_norm_free_variants_train_without_nan(gate):
    torch.manual_seed(0)
    model = vitlab.create_model("vit_mnist", embed_dim=32, num_heads=4, depth=12, gate=gate)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(16, 1, 28, 28), torch.randint(0, 10, (16,))
    losses = []
    for _ in range(5):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(math.isfinite(v) for v in losses)
    assert losses[-1] < losses[0]
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_fixup_block_alone_keeps_timm_names():
    blk = Block(32, 4, gate="fixup")
    names = {n for n, _ in blk.named_parameters()}
    assert {"attn.qkv.weight", "attn.proj.weight", "mlp.fc1.weight", "mlp.fc2.weight", "ls1.scale",
            "ls1.bias", "attn.qkv.in_bias", "mlp.act.bias"} <= names
    assert not any(n.startswith("norm") for n in names)


@pytest.mark.parametrize("gate", ["fixup", "tfixup"])
def test_fixup_gates_refuse_cait(gate):
    with pytest.raises(ConfigError, match="vit preset"):
        vitlab.create_model("cait_xxs24", gate=gate)


@pytest.mark.parametrize("gate", ["fixup", "tfixup"])
def test_fixup_models_refuse_timm_export_in_one_line(gate: str) -> None:
    from vitlab.errors import ConfigError

    model = vitlab.create_model("vit_mnist", depth=2, gate=gate)
    with pytest.raises(ConfigError, match=gate):
        vitlab.to_timm(model)
