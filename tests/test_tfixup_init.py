"""T-Fixup's initialisation (Huang et al. 2020, as the authors' released fairseq code applies it) in a ViT: the std
of every weight it sets, the unscaled queries and keys, the embeddings' scale, and what it leaves alone."""

from __future__ import annotations

import math

import pytest
import torch

import vitlab
from vitlab.layers.fixup import tfixup_scales

D, DEPTH, HEADS = 384, 6, 6


def _model(**overrides) -> vitlab.models.VitlabModel:
    torch.manual_seed(0)
    cfg = dict(img_size=32, patch_size=8, in_chans=3, num_classes=10, embed_dim=D, depth=DEPTH, num_heads=HEADS,
               gate="tfixup", pos_embed="learned", reg_tokens=4)
    return vitlab.create_model("vit_mnist", **{**cfg, **overrides})


def _xavier_std(fan_in: int, fan_out: int, gain: float = 1.0) -> float:
    return gain * math.sqrt(2.0 / (fan_in + fan_out))


def _assert_std(w: torch.Tensor, expected: float, what: str) -> None:
    """Sample std within 6 standard errors of ``expected`` (a std estimate's relative error is ~ 1/sqrt(2n))."""
    n = w.numel()
    got = w.detach().float().std().item()
    assert abs(got / expected - 1) < 6 / math.sqrt(2 * n), f"{what}: std {got:.5g}, expected {expected:.5g} (n={n})"


def test_scales_are_the_papers() -> None:
    weights, embedding = tfixup_scales(DEPTH)
    assert weights == pytest.approx(0.67 * DEPTH ** -0.25)
    assert embedding == pytest.approx((9 * DEPTH) ** -0.25)


@pytest.mark.parametrize("mlp", ["gelu", "swiglu"])
def test_block_weights_follow_the_rule(mlp: str) -> None:
    model = _model(mlp=mlp)
    w, _ = tfixup_scales(DEPTH)
    for i, blk in enumerate(model.blocks):
        qkv = blk.attn.qkv.weight
        q, k, v = qkv[:D], qkv[D:2 * D], qkv[2 * D:]
        # q and k: the code's Xavier gain 1/sqrt(2) on each d x d matrix, not scaled by T-Fixup
        _assert_std(q, _xavier_std(D, D, 2 ** -0.5), f"blocks.{i} q")
        _assert_std(k, _xavier_std(D, D, 2 ** -0.5), f"blocks.{i} k")
        # v: the code's sqrt(2) undoes that gain, then 0.67 N^-1/4; proj and the MLP weights likewise
        _assert_std(v, w * _xavier_std(D, D), f"blocks.{i} v")
        _assert_std(blk.attn.proj.weight, w * _xavier_std(D, D), f"blocks.{i} proj")
        firsts = ["fc1_g", "fc1_x"] if mlp == "swiglu" else ["fc1"]
        for name in [*firsts, "fc2"]:
            layer = getattr(blk.mlp, name)
            _assert_std(layer.weight, w * _xavier_std(layer.in_features, layer.out_features), f"blocks.{i} {name}")
        # uniform draws (Xavier-uniform): never beyond the bound sqrt(3) * std
        assert q.abs().max() <= math.sqrt(3) * _xavier_std(D, D, 2 ** -0.5) + 1e-7
        assert v.abs().max() <= math.sqrt(3) * w * _xavier_std(D, D) + 1e-7
        for layer in (blk.attn.qkv, blk.attn.proj, blk.mlp.fc2):
            assert torch.count_nonzero(layer.bias) == 0
        assert isinstance(blk.norm1, torch.nn.Identity) and isinstance(blk.norm2, torch.nn.Identity)


def test_queries_and_keys_do_not_depend_on_depth_but_values_do() -> None:
    shallow, deep = _model(depth=2).blocks[0].attn.qkv.weight, _model(depth=32).blocks[0].attn.qkv.weight
    ratio = [deep[s].std().item() / shallow[s].std().item() for s in (slice(0, D), slice(D, 2 * D), slice(2 * D, None))]
    assert ratio[0] == pytest.approx(1, abs=0.02) and ratio[1] == pytest.approx(1, abs=0.02)
    assert ratio[2] == pytest.approx((32 / 2) ** -0.25, rel=0.02)


def test_embeddings() -> None:
    model = _model()
    _, e = tfixup_scales(DEPTH)
    proj = model.patch_embed.proj
    fan_in = proj.weight[0].numel()  # C p^2
    _assert_std(proj.weight, e * _xavier_std(fan_in, D), "patch_embed.proj")
    assert torch.count_nonzero(proj.bias) == 0
    # class and register tokens: the code's token std after fairseq's sqrt(d) embed scale, (9N)^-1/4
    _assert_std(model.cls_token, e, "cls_token")
    _assert_std(model.reg_token, e, "reg_token")
    # a learned position table is outside T-Fixup (the code adds unscaled positions): vitlab's default std 0.02
    _assert_std(model.pos_embed, 0.02, "pos_embed")  # trunc_normal_(std=0.02): cut at +-2, far out in the tails
    assert torch.equal(model.pos_embed, _model(gate="none").pos_embed)  # same draw as without T-Fixup
    head = model.head
    _assert_std(head.weight, _xavier_std(D, 10), "head")
    assert torch.count_nonzero(head.bias) == 0


def test_fixed_position_tables_are_untouched() -> None:
    cfg = dict(img_size=32, patch_size=8, embed_dim=64, depth=4, num_heads=4)
    plain = vitlab.create_model("vit_mnist", **cfg)  # sincos1d, a buffer
    tfixup = vitlab.create_model("vit_mnist", **cfg, gate="tfixup")
    assert torch.equal(plain.pos_embed, tfixup.pos_embed)
