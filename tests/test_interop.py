"""timm interop: from_timm / to_timm equivalence, round trips, load_pretrained adaptations, `vitlab convert`."""

from __future__ import annotations

import argparse
import json
import math
import re
import shlex
from functools import partial
from pathlib import Path

import pytest
import timm
import torch
from safetensors.torch import load_file, save_file
from timm.layers import SwiGLU, resample_abs_pos_embed
from timm.models import adapt_input_conv
from timm.models.cait import Cait as TimmCait
from timm.models.deit import VisionTransformerDistilled
from timm.models.vision_transformer import ParallelScalingBlock, ParallelThingsBlock, ResPostBlock
from timm.models.vision_transformer import VisionTransformer as TimmViT
from torch import nn

import vitlab
from _helpers import one_line, perturb
from vitlab.cli import main
from vitlab.errors import CheckpointError, ConfigError
from vitlab.interop import adapt_input_channels, adapt_state_dict, config_from_state_dict, save_weights

SMALL = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=4, num_classes=5)
DOCS = Path(__file__).resolve().parents[1] / "docs" / "interop.md"

TIMM_VIT_VARIANTS = {
    "plain": {},
    "deit3_layerscale": dict(init_values=1e-5, no_embed_class=True),
    "registers": dict(reg_tokens=4, no_embed_class=True),
    "registers_with_pos_slots": dict(reg_tokens=2),
    "qk_norm": dict(qk_norm=True),
    "rmsnorm": dict(norm_layer="rmsnorm", qk_norm=True, init_values=1e-4),
    "no_qkv_bias": dict(qkv_bias=False),
    "no_class_token": dict(class_token=False, global_pool="avg"),
    "no_class_token_pos_slots": dict(class_token=False, global_pool="avg", reg_tokens=1),
    "avg_pool_with_class_token": dict(global_pool="avg"),
    "token_pool_fc_norm": dict(fc_norm=True),
    "swiglu": dict(mlp_layer=SwiGLU, act_layer="silu"),
    "no_pos_embed": dict(pos_embed="none"),
    "dropouts": dict(drop_rate=0.1, pos_drop_rate=0.1, proj_drop_rate=0.1, attn_drop_rate=0.05,
                     drop_path_rate=0.2),
}


def images(model: nn.Module, batch: int = 3) -> torch.Tensor:
    cfg = model.cfg if hasattr(model, "cfg") else None
    c = cfg.in_chans if cfg else model.patch_embed.proj.in_channels
    s = cfg.img_size if cfg else model.patch_embed.img_size[0]
    return torch.randn(batch, c, s, s)


def assert_same_logits(a: nn.Module, b: nn.Module, x: torch.Tensor) -> None:
    a.eval()
    b.eval()
    with torch.no_grad():
        diff = (a(x) - b(x)).abs().max().item()
    assert diff < 1e-4, diff


# ---------------------------------------------------------------- from_timm


@pytest.mark.parametrize("variant", list(TIMM_VIT_VARIANTS))
def test_from_timm_vit_variants_match_timm_logits(variant: str) -> None:
    tm = perturb(TimmViT(**SMALL, **TIMM_VIT_VARIANTS[variant]))
    model = vitlab.from_timm(tm)
    assert isinstance(model, vitlab.models.VisionTransformer)
    assert set(model.state_dict()) == set(tm.state_dict())
    assert_same_logits(model, tm, images(tm))


def test_from_timm_reads_the_architecture() -> None:
    tm = TimmViT(**SMALL, reg_tokens=4, no_embed_class=True, init_values=1e-5, qk_norm=True, norm_layer="rmsnorm",
                 qkv_bias=False, mlp_ratio=3.0, drop_path_rate=0.1, drop_rate=0.1, pos_drop_rate=0.1,
                 proj_drop_rate=0.1)
    cfg = vitlab.from_timm(tm).cfg
    assert (cfg.reg_tokens, cfg.pos_embed_cls, cfg.gate, cfg.init_values) == (4, False, "layerscale", 1e-5)
    assert (cfg.qk_norm, cfg.norm, cfg.qkv_bias, cfg.mlp_ratio) == (True, "rmsnorm", False, 3.0)
    assert (cfg.drop_path_rate, cfg.drop_path_rule, cfg.drop_rate) == (pytest.approx(0.1), "linear", 0.1)
    assert (cfg.img_size, cfg.patch_size, cfg.embed_dim, cfg.depth, cfg.num_heads) == (32, 8, 32, 2, 4)


def test_from_timm_keeps_device_dtype_and_mode() -> None:
    tm = TimmViT(**SMALL).double().train()
    model = vitlab.from_timm(tm)
    assert model.training and next(model.parameters()).dtype == torch.float64
    assert not vitlab.from_timm(tm.eval()).training


@pytest.mark.parametrize("kwargs", [dict(init_values=1e-5), dict(init_values=1e-5, global_pool="avg"),
                                    dict(init_values=0.1, norm_layer=partial(timm.layers.RmsNorm, eps=1e-6)),
                                    dict(init_values=1e-5, qkv_bias=False, depth_token_only=1)])
def test_from_timm_cait_matches_timm_logits(kwargs: dict) -> None:
    tm = perturb(TimmCait(**SMALL, **kwargs))
    model = vitlab.from_timm(tm)
    assert isinstance(model, vitlab.models.Cait)
    assert model.cfg.depth_token_only == len(tm.blocks_token_only)
    assert_same_logits(model, tm, images(tm))


def test_from_timm_with_overrides_adapts_the_weights() -> None:
    tm = perturb(TimmViT(**SMALL))
    model = vitlab.from_timm(tm, img_size=64, num_classes=3, drop_path_rate=0.1)
    assert (model.cfg.img_size, model.cfg.num_classes, model.cfg.drop_path_rate) == (64, 3, 0.1)
    assert model.pos_embed.shape == (1, 1 + 64, 32)
    torch.testing.assert_close(model.blocks[1].mlp.fc2.weight, tm.blocks[1].mlp.fc2.weight)


UNSUPPORTED_TIMM = {
    "distillation token": lambda: VisionTransformerDistilled(**SMALL),
    "global_pool='map'": lambda: TimmViT(**SMALL, global_pool="map"),
    "pre_norm=True": lambda: TimmViT(**SMALL, pre_norm=True),
    "final_norm=False": lambda: TimmViT(**SMALL, final_norm=False),
    "a norm in the patch embedding": lambda: TimmViT(**SMALL, embed_norm_layer="layernorm"),
    "ParallelThingsBlock blocks": lambda: TimmViT(**SMALL, block_fn=ParallelThingsBlock),
    "fuse_out_proj=True": lambda: TimmViT(**SMALL, block_fn=partial(ParallelScalingBlock, fuse_out_proj=True)),
    "ResPostBlock blocks": lambda: TimmViT(**SMALL, block_fn=ResPostBlock),
    "GELUTanh activation": lambda: TimmViT(**SMALL, act_layer="gelu_tanh"),
    "proj_bias=False": lambda: TimmViT(**SMALL, proj_bias=False),
    "norm eps 1e-05": lambda: TimmViT(**SMALL, norm_layer=partial(nn.LayerNorm, eps=1e-5)),
    "patch dropout": lambda: TimmViT(**SMALL, patch_drop_rate=0.1),
    "pass drop_rate=": lambda: TimmViT(**SMALL, drop_rate=0.1),
    "VisionTransformer or Cait": lambda: nn.Linear(2, 2),
}


@pytest.mark.parametrize("needle", list(UNSUPPORTED_TIMM))
def test_from_timm_names_what_vitlab_cannot_express(needle: str) -> None:
    with pytest.raises(ConfigError) as exc:
        vitlab.from_timm(UNSUPPORTED_TIMM[needle]())
    assert needle in one_line(exc)


def test_from_timm_separate_dropouts_resolve_with_an_override() -> None:
    tm = perturb(TimmViT(**SMALL, drop_rate=0.1))
    model = vitlab.from_timm(tm, drop_rate=0.0)
    assert model.cfg.drop_rate == 0.0
    assert_same_logits(model, tm, images(tm))


# ---------------------------------------------------------------- to_timm

TO_TIMM_CASES = {
    "vit_mnist_sincos1d": ("vit_mnist", {}),
    "layerscale": ("vit_tiny", dict(SMALL, gate="layerscale", init_values=0.1)),
    "scalar_gate": ("vit_tiny", dict(SMALL, gate="scalar")),
    "skipinit_uniform_drop_path": ("vit_tiny", dict(SMALL, gate="skipinit", drop_path_rate=0.1,
                                                    drop_path_rule="uniform")),
    "sincos2d_avg": ("vit_tiny", dict(SMALL, pos_embed="sincos2d", global_pool="avg")),
    "registers_front": ("vit_tiny", dict(SMALL, reg_tokens=3)),
    # without RoPE on the patches or (rope_layout='halves') on the registers, which the ViT-5 layout rotates anyway
    "vit5_without_rope": ("vit5_small", dict(SMALL, rope=False, rope_layout="halves")),
    "swiglu_no_pos": ("vit_tiny", dict(SMALL, mlp="swiglu", pos_embed="none")),
    "cait": ("cait_xxs24", dict(SMALL)),
    "cait_rms_avg": ("cait_xxs24", dict(SMALL, norm="rmsnorm", global_pool="avg")),
    "cait_no_gate_plain_attn": ("cait_xxs24", dict(SMALL, gate="none", attn="mhsa")),
    "cait_scalar_no_pos": ("cait_xxs24", dict(SMALL, gate="scalar", pos_embed="none")),
}


@pytest.mark.parametrize("case", list(TO_TIMM_CASES))
def test_to_timm_matches_vitlab_logits_and_loads_back(case: str) -> None:
    name, kwargs = TO_TIMM_CASES[case]
    model = perturb(vitlab.create_model(name, **kwargs))
    tm = vitlab.to_timm(model)
    assert isinstance(tm, TimmCait if model.cfg.arch == "cait" else TimmViT)
    x = images(model)
    assert_same_logits(tm, model, x)
    assert_same_logits(vitlab.from_timm(tm), model, x)
    back = vitlab.create_model(model.cfg)  # timm's weights into the original vitlab architecture
    back.load_state_dict(adapt_state_dict(tm.state_dict(), back))
    assert_same_logits(back, model, x)


@pytest.mark.parametrize("name,kwargs,needle", [
    ("deepvit_16b", {}, "re-attention"),
    ("vit5_small", {}, "RoPE"),
    ("deepvit_s", dict(attn="mhsa"), "convolutional stem"),
    ("vit_tiny", dict(gate="rezero"), "ReZero"),
    ("vit_tiny", dict(attn="talking_heads"), "talking-heads attention in a ViT"),
    ("cait_xxs24", dict(mlp="swiglu"), "swiglu MLPs in CaiT"),
])
def test_to_timm_refuses_what_timm_cannot_express(name: str, kwargs: dict, needle: str) -> None:
    model = vitlab.create_model(name, **{**SMALL, "patch_size": 8, **kwargs})
    with pytest.raises(ConfigError) as exc:
        vitlab.to_timm(model)
    msg = one_line(exc)
    assert needle in msg and "timm has no equivalent" in msg


def test_round_trip_vitlab_timm_vitlab_keeps_weights_exactly() -> None:
    model = perturb(vitlab.create_model("vit_tiny", **SMALL, gate="layerscale", init_values=1e-5, reg_tokens=2,
                                        qk_norm=True))
    back = vitlab.from_timm(vitlab.to_timm(model))
    assert back.cfg.replace(name="") == model.cfg.replace(name="")
    ref = model.state_dict()
    for k, v in back.state_dict().items():
        assert torch.equal(v, ref[k]), k


@pytest.mark.parametrize("variant", ["plain", "registers", "rmsnorm", "no_class_token"])
def test_round_trip_timm_vitlab_timm_keeps_weights_exactly(variant: str) -> None:
    tm = perturb(TimmViT(**SMALL, **TIMM_VIT_VARIANTS[variant]))
    back = vitlab.to_timm(vitlab.from_timm(tm))
    ref = tm.state_dict()
    assert set(back.state_dict()) == set(ref)
    for k, v in back.state_dict().items():
        assert torch.equal(v, ref[k]), k
    assert_same_logits(back, tm, images(tm))


def test_round_trip_cait_both_ways() -> None:
    tm = perturb(TimmCait(**SMALL, init_values=1e-5))
    again = vitlab.to_timm(vitlab.from_timm(tm))
    for k, v in again.state_dict().items():
        assert torch.equal(v, tm.state_dict()[k]), k


# ---------------------------------------------------------------- load_pretrained: files


def write_checkpoint_dir(model: vitlab.models.VitlabModel, path: Path) -> Path:
    """A checkpoint directory in the trainer's layout: model.safetensors + config.json."""
    path.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps({"model": model.cfg.to_dict(), "run": {"epochs": 1}}))
    return path


def test_load_pretrained_reads_a_vitlab_checkpoint_dir_or_its_file(tmp_path: Path) -> None:
    model = perturb(vitlab.create_model("cait_xxs24", **SMALL, depth_token_only=1))
    ckpt = write_checkpoint_dir(model, tmp_path / "run")
    for loaded in (vitlab.load_pretrained(ckpt), vitlab.load_pretrained(None, ckpt / "model.safetensors")):
        assert loaded.cfg == model.cfg
        assert_same_logits(loaded, model, images(model))


def test_load_pretrained_reads_timm_pth_with_weights_only(tmp_path: Path) -> None:
    tm = perturb(TimmViT(**SMALL, init_values=1e-5))
    path = tmp_path / "ckpt.pth"
    torch.save({"model": {f"module.{k}": v for k, v in tm.state_dict().items()}, "epoch": 3}, path)
    model = vitlab.load_pretrained(vitlab.from_timm(TimmViT(**SMALL, init_values=1e-5)).cfg, path)
    assert_same_logits(model, tm, images(tm))


def test_load_pretrained_refuses_pickled_objects(tmp_path: Path) -> None:
    path = tmp_path / "ckpt.pth"
    torch.save({"state_dict": TimmViT(**SMALL).state_dict(), "args": argparse.Namespace(lr=0.1)}, path)
    with pytest.raises(CheckpointError) as exc:
        vitlab.load_pretrained(vitlab.from_timm(TimmViT(**SMALL)).cfg, path)
    assert "weights_only=True" in one_line(exc)


def test_load_pretrained_loads_a_model_in_place(tmp_path: Path) -> None:
    src = perturb(vitlab.create_model("vit_tiny", **SMALL))
    save_weights(src.state_dict(), tmp_path / "w.safetensors")
    dst = vitlab.create_model("vit_tiny", **SMALL)
    assert vitlab.load_pretrained(dst, tmp_path / "w.safetensors") is dst
    assert_same_logits(dst, src, images(src))


@pytest.mark.parametrize("path,needle", [("missing.safetensors", "no weight file"), ("w.npz", "neither"),
                                         ("broken.safetensors", "not a readable safetensors")])
def test_load_pretrained_bad_files(tmp_path: Path, path: str, needle: str) -> None:
    (tmp_path / "w.npz").write_bytes(b"x")
    (tmp_path / "broken.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(CheckpointError) as exc:
        vitlab.load_pretrained("vit_tiny", tmp_path / path)
    assert needle in one_line(exc)


# ---------------------------------------------------------------- load_pretrained: adaptations


def test_one_channel_conversion_equals_rgb_model_on_gray_copy(tmp_path: Path) -> None:
    tm = perturb(TimmViT(**SMALL, init_values=1e-5))
    path = tmp_path / "rgb.safetensors"
    save_file(tm.state_dict(), str(path))
    gray_model = vitlab.load_pretrained(vitlab.from_timm(tm).cfg, path, in_chans=1).eval()
    assert gray_model.patch_embed.proj.weight.shape[1] == 1
    gray = torch.rand(4, 1, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(gray_model(gray), tm.eval()(gray.expand(-1, 3, -1, -1)), atol=1e-4, rtol=0)


def test_adapt_input_channels_follows_timm() -> None:
    w = torch.randn(8, 3, 4, 4)
    for c in (1, 2, 3, 5, 7):
        torch.testing.assert_close(adapt_input_channels(w, c), adapt_input_conv(c, w))
    rgb = torch.rand(2, 3, 4, 4)  # six channels holding the RGB image twice give the RGB response
    six = adapt_input_channels(w, 6)
    torch.testing.assert_close(torch.einsum("ocij,bcij->bo", six, rgb.repeat(1, 2, 1, 1)),
                               torch.einsum("ocij,bcij->bo", w, rgb))


def smooth_table(grid: int, dim: int) -> torch.Tensor:
    """A position table sampled from a low-frequency field over the image, (grid*grid, dim)."""
    g = torch.Generator().manual_seed(0)
    fu, fv, phase = torch.rand(dim, generator=g) * 0.5, torch.rand(dim, generator=g) * 0.5, torch.rand(dim, generator=g)
    c = (torch.arange(grid) + 0.5) / grid  # patch centres in [0, 1]
    v, u = torch.meshgrid(c, c, indexing="ij")
    return 0.5 * torch.sin(2 * math.pi * (fu * u.reshape(-1, 1) + fv * v.reshape(-1, 1) + phase))


def logit_shift_at_double_size(folder: Path, table: torch.Tensor) -> float:
    """Largest logit change of an average-pooled ViT (8x8 grid) when loaded at twice the image size."""
    model = perturb(vitlab.create_model("vit_tiny", img_size=32, patch_size=4, embed_dim=32, depth=2, num_heads=4,
                                        num_classes=10, class_token=False, global_pool="avg"), 0.1)
    with torch.no_grad():
        model.pos_embed[0] = table
    folder.mkdir()
    save_weights(model.state_dict(), folder / "w.safetensors")
    big = vitlab.load_pretrained(model.cfg, folder / "w.safetensors", img_size=64).eval()
    assert big.pos_embed.shape == (1, 256, 32)
    low = torch.rand(6, 3, 8, 8)  # one colour per original patch
    x32 = low.repeat_interleave(4, -1).repeat_interleave(4, -2)
    x64 = low.repeat_interleave(8, -1).repeat_interleave(8, -2)
    with torch.no_grad():
        return (model.eval()(x32) - big(x64)).abs().max().item()


def test_resampling_a_smooth_position_embedding_keeps_logits_close(tmp_path: Path) -> None:
    """Tolerance: 5e-3 on logits of order 1 for a smooth table; the same values shuffled exceed it."""
    table = smooth_table(8, 32)
    smooth = logit_shift_at_double_size(tmp_path / "smooth", table)
    torch.manual_seed(0)
    rough = logit_shift_at_double_size(tmp_path / "rough", table[torch.randperm(64)])
    assert smooth < 5e-3, smooth
    assert rough > 5e-3, rough


@pytest.mark.parametrize("name,kwargs", [("vit_tiny", dict(reg_tokens=2)),
                                         ("vit_tiny", dict(class_token=False, global_pool="avg")), ("cait_xxs24", {}),
                                         ("vit5_small", dict(rope=False, pos_resample_antialias=True))])
def test_position_embedding_resampling_keeps_prefix_slots(tmp_path: Path, name: str, kwargs: dict) -> None:
    model = perturb(vitlab.create_model(name, **SMALL, **kwargs))
    save_weights(model.state_dict(), tmp_path / "w.safetensors")
    big = vitlab.load_pretrained(model.cfg, tmp_path / "w.safetensors", img_size=48)
    slots = model.num_prefix_tokens if model.cfg.pos_embed_cls else 0
    expected = resample_abs_pos_embed(model.pos_embed.detach(), [6, 6], num_prefix_tokens=slots)  # timm, the oracle
    assert big.pos_embed.shape == (1, slots + 36, 32)
    torch.testing.assert_close(big.pos_embed.detach(), expected, atol=1e-5, rtol=1e-5)
    assert torch.equal(big.pos_embed[:, :slots], model.pos_embed[:, :slots])


def test_fixed_sincos_table_is_recomputed_at_the_new_size(tmp_path: Path) -> None:
    """The 2-D sin-cos table is computed for the new grid; the 1-D sinusoid, numbered row-major on the 4x4 grid it
    was built for, is resampled as that 2-D grid (recomputed at 8x8 it would move patches to other places)."""
    model = perturb(vitlab.create_model("vit_mnist", pos_embed="sincos2d"))
    save_weights(model.state_dict(), tmp_path / "w.safetensors")
    big = vitlab.load_pretrained(model.cfg, tmp_path / "w.safetensors", img_size=56)
    assert torch.equal(big.pos_embed, vitlab.create_model("vit_mnist", pos_embed="sincos2d", img_size=56).pos_embed)
    assert torch.equal(big.blocks[0].attn.qkv.weight, model.blocks[0].attn.qkv.weight)
    model = perturb(vitlab.create_model("vit_mnist"))
    save_weights(model.state_dict(), tmp_path / "w.safetensors")
    big = vitlab.load_pretrained("vit_mnist", tmp_path / "w.safetensors", img_size=56)
    expected = resample_abs_pos_embed(model.pos_embed, [8, 8], num_prefix_tokens=1)  # timm, the oracle
    torch.testing.assert_close(big.pos_embed, expected, atol=1e-5, rtol=1e-5)
    assert torch.equal(big.blocks[0].attn.qkv.weight, model.blocks[0].attn.qkv.weight)


def test_learned_table_is_not_dropped_for_a_fixed_one(tmp_path: Path) -> None:
    """A learned position table cannot be replaced by the sin-cos table of another grid without a word."""
    learned = perturb(vitlab.create_model("vit_mnist", pos_embed="learned"))
    save_weights(learned.state_dict(), tmp_path / "w.safetensors")
    with pytest.raises(CheckpointError) as exc:
        vitlab.load_pretrained("vit_mnist", tmp_path / "w.safetensors", img_size=56)
    msg = one_line(exc)
    assert "pos_embed='learned'" in msg and "img_size=28" in msg
    resampled = vitlab.load_pretrained("vit_mnist", tmp_path / "w.safetensors", img_size=56, pos_embed="learned")
    assert resampled.pos_embed.shape == (1, 1 + 64, 64)
    same_grid = vitlab.load_pretrained("vit_mnist", tmp_path / "w.safetensors")  # nothing dropped: it is loaded
    assert torch.equal(same_grid.pos_embed, learned.pos_embed.detach())


def test_patch_size_change_resamples_the_kernel(tmp_path: Path) -> None:
    """Patch 8 -> 16 at twice the image size (same 4x4 grid): patch-constant images give the same logits."""
    tm = perturb(TimmViT(**SMALL, init_values=1e-5))
    save_file(tm.state_dict(), str(tmp_path / "w.safetensors"))
    model = vitlab.load_pretrained(vitlab.from_timm(tm).cfg, tmp_path / "w.safetensors", img_size=64, patch_size=16)
    assert model.patch_embed.proj.weight.shape == (32, 3, 16, 16)
    low = torch.rand(3, 3, 4, 4)
    x32, x64 = (low.repeat_interleave(s, -1).repeat_interleave(s, -2) for s in (8, 16))
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(x64), tm.eval()(x32), atol=1e-4, rtol=0)


def test_other_num_classes_gets_a_fresh_head(tmp_path: Path) -> None:
    src = perturb(vitlab.create_model("vit_tiny", **SMALL, global_pool="avg"))
    save_weights(src.state_dict(), tmp_path / "w.safetensors")
    model = vitlab.load_pretrained(src.cfg, tmp_path / "w.safetensors", num_classes=300)
    w = model.head.weight.detach()
    assert w.shape == (300, 32) and torch.all(model.head.bias == 0)
    assert 0.018 < w.std().item() < 0.022 and abs(w.mean().item()) < 0.002  # (truncated) normal, std 0.02
    x = images(src)
    with torch.no_grad():
        torch.testing.assert_close(model.eval().forward_head(model.forward_features(x), pre_logits=True),
                                   src.eval().forward_head(src.forward_features(x), pre_logits=True))
    features = vitlab.load_pretrained(src.cfg, tmp_path / "w.safetensors", num_classes=0)
    assert isinstance(features.head, nn.Identity)


def test_a_name_takes_the_checkpoint_geometry(tmp_path: Path) -> None:
    src = perturb(vitlab.create_model("vit_tiny", img_size=48, patch_size=8, in_chans=2, num_classes=7, depth=12))
    save_weights(src.state_dict(), tmp_path / "w.safetensors")
    model = vitlab.load_pretrained("vit_tiny", tmp_path / "w.safetensors")
    cfg = model.cfg
    assert (cfg.img_size, cfg.patch_size, cfg.in_chans, cfg.num_classes) == (48, 8, 2, 7)
    assert_same_logits(model, src, images(src, 2))


def test_wrong_keys_and_shapes_are_listed(tmp_path: Path) -> None:
    model = vitlab.create_model("vit_tiny", **SMALL)
    state = dict(model.state_dict())
    state["blocks.0.attn.qkvv.weight"] = state.pop("blocks.0.attn.qkv.weight")
    state["blocks.1.mlp.fc1.weight"] = torch.zeros(100, 32)
    save_weights(state, tmp_path / "w.safetensors")
    with pytest.raises(CheckpointError) as exc:
        vitlab.load_pretrained(model, tmp_path / "w.safetensors")
    msg = one_line(exc)
    assert "missing keys blocks.0.attn.qkv.weight" in msg
    assert "unexpected keys blocks.0.attn.qkvv.weight" in msg
    assert "blocks.1.mlp.fc1.weight (100, 32) vs (128, 32)" in msg


def test_another_architecture_is_an_error_not_a_partial_load(tmp_path: Path) -> None:
    save_weights(vitlab.create_model("vit_tiny", **SMALL).state_dict(), tmp_path / "w.safetensors")
    target = vitlab.create_model("vit_tiny", **{**SMALL, "depth": 3})
    before = {k: v.clone() for k, v in target.state_dict().items()}
    with pytest.raises(CheckpointError, match="missing keys blocks.2"):
        vitlab.load_pretrained(target, tmp_path / "w.safetensors")
    assert all(torch.equal(v, before[k]) for k, v in target.state_dict().items())


def test_distillation_token_is_refused_or_dropped(tmp_path: Path) -> None:
    tm = perturb(VisionTransformerDistilled(**SMALL))
    save_file(tm.state_dict(), str(tmp_path / "deit.safetensors"))
    cfg = vitlab.from_timm(TimmViT(**SMALL)).cfg
    with pytest.raises(CheckpointError) as exc:
        vitlab.load_pretrained(cfg, tmp_path / "deit.safetensors")
    assert "drop_dist_token=True" in one_line(exc)
    model = vitlab.load_pretrained(cfg, tmp_path / "deit.safetensors", drop_dist_token=True)
    pos = tm.pos_embed.detach()
    assert torch.equal(model.pos_embed.detach(), torch.cat([pos[:, :1], pos[:, 2:]], dim=1))
    big = vitlab.load_pretrained(None, tmp_path / "deit.safetensors", drop_dist_token=True, num_heads=4,
                                 global_pool="token", img_size=48)
    expected = resample_abs_pos_embed(pos, [6, 6], num_prefix_tokens=2)
    torch.testing.assert_close(big.pos_embed.detach(), torch.cat([expected[:, :1], expected[:, 2:]], dim=1))


def test_deit3_original_gamma_names_load(tmp_path: Path) -> None:
    tm = perturb(TimmViT(**SMALL, init_values=1e-5, no_embed_class=True))
    state = {re.sub(r"ls([12])\.gamma", r"gamma_\1", k): v for k, v in tm.state_dict().items()}
    assert "blocks.0.gamma_1" in state
    save_file(state, str(tmp_path / "deit3.safetensors"))
    model = vitlab.load_pretrained(vitlab.from_timm(tm).cfg, tmp_path / "deit3.safetensors")
    assert_same_logits(model, tm, images(tm))


def test_config_inferred_from_shapes(tmp_path: Path) -> None:
    for tm, pool in ((perturb(TimmViT(**SMALL, qk_norm=True, reg_tokens=4, no_embed_class=True, init_values=1e-5,
                                      mlp_ratio=2.0)), {"global_pool": "token"}),
                     (perturb(TimmViT(**SMALL, qk_norm=True, class_token=False, global_pool="avg")), {}),
                     (perturb(TimmCait(**SMALL, init_values=1e-5)), {})):
        save_file(tm.state_dict(), str(tmp_path / "w.safetensors"))
        model = vitlab.load_pretrained(None, tmp_path / "w.safetensors", **pool)
        assert model.cfg.num_heads == 4 and model.cfg.embed_dim == 32 and model.cfg.img_size == 32
        assert_same_logits(model, tm, images(tm))
    with pytest.raises(CheckpointError) as exc:
        config_from_state_dict(TimmViT(**SMALL).state_dict())
    msg = one_line(exc)
    assert "--model" in msg and "num_heads=N" in msg and "global_pool=" in msg
    assert config_from_state_dict(TimmViT(**SMALL).state_dict(), num_heads=4, global_pool="token").num_heads == 4


@pytest.mark.parametrize("timm_kwargs,pool", [(dict(fc_norm=True), "token"), (dict(global_pool="avg"), "avg"),
                                              (dict(global_pool="avg", fc_norm=False), "avg"), ({}, "token")],
                         ids=["token+fc_norm", "avg", "avg-no-fc_norm", "token"])
def test_state_dict_pooling_is_asked_not_guessed(tmp_path: Path, timm_kwargs: dict, pool: str) -> None:
    """With a class token the keys are the same for token and avg pooling: fc_norm goes with either."""
    tm = perturb(TimmViT(**SMALL, qk_norm=True, **timm_kwargs))  # QK-norm: the heads show in the shapes
    save_file(tm.state_dict(), str(tmp_path / "w.safetensors"))
    with pytest.raises(CheckpointError) as exc:
        vitlab.load_pretrained(None, tmp_path / "w.safetensors")
    assert "global_pool='token' or 'avg'" in one_line(exc)
    model = vitlab.load_pretrained(None, tmp_path / "w.safetensors", global_pool=pool)
    assert model.cfg.global_pool == pool
    assert isinstance(model.fc_norm, nn.Identity) == isinstance(tm.fc_norm, nn.Identity)
    assert_same_logits(model, tm, images(tm))


def test_cait_init_values_recorded_from_the_source(tmp_path: Path) -> None:
    """timm's cait_xxs36 passes init_values=1e-5 (not the depth rule's 1e-6); the config says so."""
    small = dict(embed_dim=32, num_heads=4, img_size=32, patch_size=8, num_classes=5)
    tm = timm.create_model("cait_xxs36_224", **small)  # depth 36, as timm builds it
    assert vitlab.from_timm(tm).cfg.init_values == 1e-5  # read from the untouched gammas
    perturb(tm)
    assert vitlab.from_timm(tm).cfg.init_values == 1e-5  # trained: from timm's preset of that name
    custom = TimmCait(**SMALL, init_values=3e-3)
    assert vitlab.from_timm(custom).cfg.init_values == 3e-3
    perturb(custom)  # trained and nameless: the init does not show, so the depth rule (None)
    assert vitlab.from_timm(custom).cfg.init_values is None
    assert vitlab.from_timm(custom, init_values=2e-2).cfg.init_values == 2e-2
    save_file(custom.state_dict(), str(tmp_path / "w.safetensors"))
    loaded = vitlab.load_pretrained(None, tmp_path / "w.safetensors")
    assert loaded.cfg.init_values is None and loaded.cfg.gate_init_value() == 0.1  # depth 2
    assert_same_logits(loaded, custom, images(custom))


def test_hub_name_offline_says_so_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "is_offline_mode", lambda: True, raising=False)
    with pytest.raises(CheckpointError) as exc:
        vitlab.load_pretrained("timm:vit_tiny_patch16_224")
    msg = one_line(exc)
    assert "offline" in msg and "load_pretrained('timm:vit_tiny_patch16_224', 'model.safetensors')" in msg
    with pytest.raises(ConfigError, match="unknown timm model"):
        vitlab.load_pretrained("timm:vit_tinny_patch16_224")
    with pytest.raises(CheckpointError, match="needs a weight file"):
        vitlab.load_pretrained("vit_tiny")


# ---------------------------------------------------------------- vitlab convert


def test_convert_timm_cait_to_vitlab_with_adaptation(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    tm = perturb(TimmCait(**SMALL, init_values=1e-5))
    save_file(tm.state_dict(), str(tmp_path / "cait.safetensors"))
    out = tmp_path / "cait_gray.safetensors"
    assert main(["convert", str(tmp_path / "cait.safetensors"), str(out), "--in-chans", "1", "--num-classes", "3",
                 "--img-size", "48"]) == 0
    assert "wrote" in capsys.readouterr().out
    model = vitlab.load_pretrained(out)  # the config travels in the metadata
    assert (model.cfg.arch, model.cfg.in_chans, model.cfg.num_classes, model.cfg.img_size) == ("cait", 1, 3, 48)
    ref = vitlab.load_pretrained(None, tmp_path / "cait.safetensors", in_chans=1, num_classes=3, img_size=48)
    torch.testing.assert_close(model.blocks[0].attn.qkv.weight, tm.blocks[0].attn.qkv.weight)
    torch.testing.assert_close(model.pos_embed, ref.pos_embed)


def test_convert_vitlab_checkpoint_to_timm(tmp_path: Path) -> None:
    model = perturb(vitlab.create_model("cait_xxs24", **SMALL, gate="scalar"))
    ckpt = write_checkpoint_dir(model, tmp_path / "run")
    out = tmp_path / "timm.safetensors"
    assert main(["convert", str(ckpt), str(out), "--to", "timm"]) == 0
    tm = TimmCait(**SMALL, init_values=1e-5)
    tm.load_state_dict(load_file(str(out)))  # strict: every timm key, nothing else
    assert_same_logits(tm, model, images(model))


def test_convert_errors_are_one_line_and_leave_no_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    save_file(TimmViT(**SMALL).state_dict(), str(tmp_path / "vit.safetensors"))
    out = tmp_path / "out.safetensors"
    assert main(["convert", str(tmp_path / "vit.safetensors"), str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("vitlab convert: error:") and "--model" in err and "\n" not in err
    assert main(["convert", str(tmp_path / "vit.safetensors"), str(tmp_path / "out.pth"), "--model",
                 "vit_tiny"]) == 2
    assert "must end in .safetensors" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["vit.safetensors"]


def test_save_weights_is_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import safetensors.torch

    def broken(tensors: dict, filename: str, metadata: dict | None = None) -> None:
        Path(filename).write_bytes(b"half")
        raise OSError("disk full")

    monkeypatch.setattr(safetensors.torch, "save_file", broken)
    with pytest.raises(OSError):
        save_weights({"a": torch.zeros(2)}, tmp_path / "w.safetensors")
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- docs/interop.md runs as written


def test_docs_snippets_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.chdir(tmp_path)
    cait = vitlab.create_model("cait_xxs24", img_size=28, patch_size=4, in_chans=1, num_classes=10, depth=2)
    write_checkpoint_dir(perturb(cait, 0.02), tmp_path / "runs" / "cait_mnist")
    text = DOCS.read_text()
    blocks = re.findall(r"```(python|bash)\n(.*?)```", text, flags=re.S)
    assert [kind for kind, _ in blocks] == ["python", "python", "bash", "python"]
    namespace: dict = {}
    for kind, code in blocks:
        if kind == "python":
            exec(compile(code, str(DOCS), "exec"), namespace)
            continue
        for line in code.replace("\\\n", " ").splitlines():
            assert main(shlex.split(line)[1:]) == 0, line
    out = capsys.readouterr().out
    assert "12 (2, 3, 17, 17) (2, 10)" in out and "True" in out and "(3,)" in out
    converted = vitlab.load_pretrained("vit_tiny_28x28x1.safetensors")
    assert (converted.cfg.img_size, converted.cfg.patch_size, converted.cfg.in_chans) == (28, 7, 1)
    TimmCait(img_size=28, patch_size=4, in_chans=1, num_classes=10, embed_dim=192, depth=2, num_heads=4
             ).load_state_dict(load_file("cait_mnist_timm.safetensors"))


def test_convert_cli_takes_pooling_and_heads_the_state_dict_cannot_show(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture) -> None:
    from timm.models.vision_transformer import VisionTransformer as TimmViT

    tm = perturb(TimmViT(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=4, num_classes=5,
                         global_pool="token", fc_norm=True)).eval()
    src = tmp_path / "vit.safetensors"
    save_file(tm.state_dict(), str(src))
    assert main(["convert", str(src), str(tmp_path / "no.safetensors")]) == 2
    err = capsys.readouterr().err
    assert "--num-heads N --global-pool token|avg" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "no.safetensors").exists()
    out = tmp_path / "vit_vitlab.safetensors"
    assert main(["convert", str(src), str(out), "--num-heads", "4", "--global-pool", "token"]) == 0
    model = vitlab.load_pretrained(out).eval()
    assert (model.cfg.num_heads, model.cfg.global_pool) == (4, "token")
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), tm(x), atol=1e-4, rtol=1e-4)
