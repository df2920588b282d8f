"""Block variants: post-norm, DeepNorm, NormFormer's norms, sigma-Reparam, ViT-22B parallel blocks, depth-muP;
each against its paper's equation and initialisation, against timm where timm has it, and trained a few steps at
depth 24; registers as an option of every ViT-family preset."""

from __future__ import annotations

import argparse
import math

import pytest
import torch
import torch.nn.functional as F
from timm.models.vision_transformer import ParallelScalingBlock
from timm.models.vision_transformer import VisionTransformer as TimmViT

import vitlab
from vitlab.errors import ConfigError
from vitlab.experiments.depth_study import VARIANTS, variant_model
from vitlab.layers import (
    DeepNormBlock,
    DepthScale,
    ParallelBlock,
    PostNormBlock,
    SigmaReparamLinear,
    deepnorm_alpha,
    deepnorm_beta,
)

TINY = dict(img_size=16, patch_size=4, in_chans=1, num_classes=10, embed_dim=32, num_heads=2, mlp_ratio=2.0)
NEW_VARIANTS = ("postnorm", "deepnorm", "normformer", "sigma_reparam", "parallel", "depth_mup")


def _tiny(**kw) -> vitlab.models.VitlabModel:
    return vitlab.create_model("vit_mnist", **{**TINY, **kw})


@pytest.mark.parametrize("variant", NEW_VARIANTS)
def test_variant_trains_at_depth_24_without_nan(variant: str) -> None:
    preset, overrides = variant_model(variant, "vit_mnist", 24)
    torch.manual_seed(0)
    model = vitlab.create_model(preset, **{**overrides, **TINY})
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(8, 1, 16, 16), torch.randint(0, 10, (8,))
    losses = []
    for _ in range(4):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
        opt.step()
        losses.append(loss.item())
    assert all(math.isfinite(v) for v in losses)
    assert losses[-1] < losses[0]  # a handful of steps on one batch: the loss goes down


def test_every_new_variant_is_a_depth_study_variant() -> None:
    assert set(NEW_VARIANTS) <= set(VARIANTS)
    assert variant_model("deepnorm", "vit_mnist", 12)[1]["block"] == "deepnorm"
    assert variant_model("depth_mup", "vit_mnist", 12)[1]["gate"] == "depth_mup"


def _block_io(model, i: int = 0) -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(1)
    return model.blocks[i].eval(), torch.randn(2, 17, model.cfg.embed_dim)


def test_postnorm_block_is_the_original_transformers() -> None:
    model = _tiny(block="postnorm", depth=3)
    blk, x = _block_io(model)
    assert isinstance(blk, PostNormBlock)
    h = blk.norm1(x + blk.attn(x))
    torch.testing.assert_close(blk(x), blk.norm2(h + blk.mlp(h)))


def test_deepnorm_equation_and_init_follow_wang_et_al() -> None:
    depth, d = 24, 64
    torch.manual_seed(0)
    model = vitlab.create_model("vit_mnist", **{**TINY, "embed_dim": d, "num_heads": 4, "mlp_ratio": 4.0,
                                                "block": "deepnorm", "depth": depth})
    blk, x = _block_io(model)
    assert isinstance(blk, DeepNormBlock)
    alpha, beta = (2 * depth) ** 0.25, (8 * depth) ** -0.25  # encoder-only: alpha = (2N)^1/4, beta = (8N)^-1/4
    assert blk.alpha == pytest.approx(alpha) == deepnorm_alpha(depth)
    assert blk.beta == pytest.approx(beta) == deepnorm_beta(depth)
    h = blk.norm1(alpha * x + blk.attn(x))
    torch.testing.assert_close(blk(x), blk.norm2(alpha * h + blk.mlp(h)))

    def xavier_std(w: torch.Tensor, gain: float) -> float:
        return gain * math.sqrt(2.0 / (w.shape[0] + w.shape[1]))

    stds = {name: [] for name in ("q", "k", "v", "proj", "fc1", "fc2")}
    for b in model.blocks:
        q, k, v = b.attn.qkv.weight.detach().split(d)
        for name, w, gain in (("q", q, 1.0), ("k", k, 1.0), ("v", v, beta), ("proj", b.attn.proj.weight, beta),
                              ("fc1", b.mlp.fc1.weight, beta), ("fc2", b.mlp.fc2.weight, beta)):
            stds[name].append(w.detach().std().item() / xavier_std(w, gain))
        for lin in (b.attn.qkv, b.attn.proj, b.mlp.fc1, b.mlp.fc2):
            assert torch.all(lin.bias == 0)
    for name, ratios in stds.items():  # Xavier-normal draws: std gain * sqrt(2 / (fan_in + fan_out))
        assert sum(ratios) / len(ratios) == pytest.approx(1.0, abs=0.03), name


def test_parallel_block_is_vit22bs() -> None:
    model = _tiny(block="parallel", depth=2, gate="layerscale", init_values=0.5)
    blk, x = _block_io(model)
    assert isinstance(blk, ParallelBlock) and isinstance(blk.norm2, torch.nn.Identity)
    y = blk.norm1(x)
    torch.testing.assert_close(blk(x), x + blk.ls1(blk.attn(y)) + blk.ls2(blk.mlp(y)))


def test_depth_mup_scales_each_branch_by_one_over_sqrt_depth() -> None:
    depth = 16
    model = _tiny(gate="depth_mup", depth=depth)
    blk, x = _block_io(model)
    assert isinstance(blk.ls1, DepthScale) and blk.ls1.scale == blk.ls2.scale == 1 / math.sqrt(depth)
    assert not any(True for _ in blk.ls1.parameters())  # a fixed multiplier, not a learned gate
    h = x + blk.attn(blk.norm1(x)) / math.sqrt(depth)
    torch.testing.assert_close(blk(x), h + blk.mlp(blk.norm2(h)) / math.sqrt(depth))


def test_normformer_norms_sit_where_timms_scale_norms_do() -> None:
    model = _tiny(scale_attn_norm=True, scale_mlp_norm=True, depth=2)
    blk = model.blocks[0]
    assert blk.attn.norm.normalized_shape == (32,) and blk.mlp.norm.normalized_shape == (64,)
    base = _tiny(depth=2)
    extra = sum(p.numel() for p in model.parameters()) - sum(p.numel() for p in base.parameters())
    assert extra == 2 * (2 * 32 + 2 * 64)  # per block: a LayerNorm over dim and one over the MLP's hidden width


def test_sigma_reparam_starts_at_the_plain_weights_and_follows_the_paper() -> None:
    torch.manual_seed(0)
    model = _tiny(sigma_reparam=True, depth=2)
    lin = model.blocks[0].attn.qkv
    assert isinstance(lin, SigmaReparamLinear) and isinstance(model.blocks[1].mlp.fc2, SigmaReparamLinear)
    W = lin.weight.detach()
    U, S, Vh = torch.linalg.svd(W)
    # at init (the authors' code): u, v the top singular vectors, gamma = sigma(W), so W_hat = W
    assert lin.gamma.item() == pytest.approx(S[0].item(), rel=1e-5)
    assert abs(torch.dot(lin.u, Vh[0]).item()) == pytest.approx(1.0, abs=1e-5)
    lin.eval()
    torch.testing.assert_close(lin.reparam_weight().detach(), W, rtol=1e-5, atol=1e-6)
    x = torch.randn(3, 32)
    torch.testing.assert_close(lin(x), F.linear(x, W, lin.bias), rtol=1e-4, atol=1e-5)
    # a changed W: eval leaves u, v alone; each training forward takes one power step, converging to sigma(W)
    with torch.no_grad():
        lin.weight.add_(torch.randn_like(W) * 0.05)
    u0 = lin.u.clone()
    lin(x)
    assert torch.equal(lin.u, u0)
    lin.train()
    for _ in range(30):
        lin(x)
    assert not torch.equal(lin.u, u0)
    assert lin.sigma().item() == pytest.approx(torch.linalg.matrix_norm(lin.weight.detach(), 2).item(), rel=1e-3)
    # W_hat = gamma / sigma(W) W: spectral norm gamma; the gradient reaches W through sigma, and gamma
    assert torch.linalg.matrix_norm(lin.reparam_weight().detach(), 2).item() == pytest.approx(lin.gamma.item(),
                                                                                             rel=1e-3)
    lin(x).sum().backward()
    assert lin.gamma.grad is not None and lin.weight.grad is not None
    assert {"blocks.0.attn.qkv.u", "blocks.0.attn.qkv.v"} <= set(model.state_dict())  # saved, resumed


def _randomize(m: torch.nn.Module) -> None:
    torch.manual_seed(3)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn_like(p) * 0.2 + (1.0 if p.ndim == 1 and p.numel() > 1 else 0.0))


TIMM_CASES = {
    "normformer": dict(scale_attn_norm=True, scale_mlp_norm=True),
    "normformer_ls_reg": dict(scale_attn_norm=True, scale_mlp_norm=True, init_values=0.1, reg_tokens=2),
    "parallel_qkv_bias": dict(block_fn=ParallelScalingBlock, qkv_bias=True),
    "parallel_vit22b": dict(block_fn=ParallelScalingBlock, qkv_bias=False, qk_norm=True, init_values=0.1),
    "parallel_reg_avg": dict(block_fn=ParallelScalingBlock, reg_tokens=4, class_token=False, global_pool="avg"),
    "registers": dict(reg_tokens=4),
}


@pytest.mark.parametrize("case", list(TIMM_CASES))
def test_equal_logits_with_timm_both_ways(case: str) -> None:
    kw = dict(img_size=16, patch_size=4, in_chans=1, num_classes=10, embed_dim=32, depth=2, num_heads=2,
              mlp_ratio=2.0, **TIMM_CASES[case])
    tm = TimmViT(**kw).eval()
    _randomize(tm)
    x = torch.randn(2, 1, 16, 16)
    ours = vitlab.from_timm(tm).eval()
    torch.testing.assert_close(ours(x), tm(x), rtol=1e-4, atol=1e-4)
    if "block_fn" in kw:
        assert ours.cfg.block == "parallel"
    back = vitlab.to_timm(ours).eval()
    assert type(back.blocks[0]) is type(tm.blocks[0])
    torch.testing.assert_close(back(x), tm(x), rtol=1e-4, atol=1e-4)
    # and a vitlab model of that config, to timm and back through a bare state dict
    model = vitlab.create_model(ours.cfg).eval()
    _randomize(model)
    if model.cfg.block == "parallel" and model.cfg.gate == "layerscale":  # timm's one LayerScale for both branches
        for b in model.blocks:
            b.ls2.gamma.data.copy_(b.ls1.gamma)
    torch.testing.assert_close(vitlab.to_timm(model).eval()(x), model(x), rtol=1e-4, atol=1e-4)


def test_parallel_with_unequal_gates_refuses_timm() -> None:
    model = _tiny(block="parallel", gate="layerscale", depth=2)
    with torch.no_grad():
        model.blocks[0].ls2.gamma.fill_(0.3)
    with pytest.raises(vitlab.errors.CheckpointError, match="one LayerScale"):
        vitlab.to_timm(model)


@pytest.mark.parametrize("overrides, match", [
    (dict(block="postnorm", gate="rezero"), "removes"),
    (dict(block="parallel", scale_attn_norm=True), "ParallelScalingBlock"),
    (dict(block="sandwich"), "choose one of prenorm"),
    (dict(sigma_reparam=True, gate="fixup"), "rescales"),
])
def test_impossible_variants_name_the_fix(overrides: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        _tiny(**overrides)


def test_cait_refuses_vit_block_variants() -> None:
    with pytest.raises(ConfigError, match="vit preset"):
        vitlab.create_model("cait_xxs24", block="deepnorm", depth=2)


def test_registers_on_every_vit_family_preset_stay_out_of_the_pooling() -> None:
    presets = [n for n in vitlab.list_models() if vitlab.models.get_config(n).arch == "vit"]
    assert presets
    for name in presets:
        with torch.device("meta"):
            model = vitlab.create_model(name, reg_tokens=4, depth=1)  # a square count: ViT-5 rotates them on a grid
        assert model.reg_token.shape[1] == 4
    model = _tiny(reg_tokens=3, global_pool="avg", depth=1).eval()
    tokens = torch.randn(2, 1 + 3 + 16, 32)
    front, end = model._token_layout()
    torch.testing.assert_close(model.pool(tokens), tokens[:, front:tokens.shape[1] - end].mean(1))
    assert front == 4 and end == 0


def test_train_cli_takes_block_and_register_flags() -> None:
    from vitlab.commands import train

    parser = argparse.ArgumentParser()
    train.register(parser.add_subparsers())
    args = parser.parse_args(["train", "--block", "parallel", "--reg-tokens", "4", "--gate", "depth_mup"])
    overrides = train.cli_options(args)["model_overrides"]
    assert overrides == {"block": "parallel", "reg_tokens": 4, "gate": "depth_mup"}
