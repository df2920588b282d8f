"""vitlab's ViT-5 against the authors' code (tests/oracles/vit5_official.py, a pinned copy of wangf3014/ViT-5):
shapes, equal logits at two sizes, defaults (tokens, dropout, registers), from_vit5 / to_vit5 and `vitlab convert`."""

from __future__ import annotations

import argparse
import re
from functools import partial
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from timm.layers import resample_abs_pos_embed as timm_resample
from torch import nn

import vitlab
from oracles.vit5_official import BUILDERS, RMSNorm, interpolate_pos_embed, vit5_shape, vit_models
from vitlab.cli import main
from vitlab.errors import CheckpointError, ConfigError
from vitlab.interop.vit5_convert import from_vit5, to_vit5, vit5_kwargs

# every vit5_* preset at a small width (its head count kept) and depth 2
SMALL = {"vit5_small": (48, 6), "vit5_base": (96, 12), "vit5_large": (128, 16), "vit5_xlarge": (192, 16)}
TOL = dict(atol=1e-5, rtol=1e-5)


def randomise(model: nn.Module) -> nn.Module:
    """Weights far from their init (LayerScale 1e-4 would hide differences in the blocks)."""
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.3 + (1.0 if p.ndim == 1 else 0.0))
    return model.eval()


def official(name: str, img_size: int = 64, **kwargs) -> nn.Module:
    dim, heads = SMALL[name]
    return vit5_shape(img_size=img_size, embed_dim=dim, depth=2, num_heads=heads, num_classes=7, **kwargs)


def vitlab_key(key: str) -> str | None:
    """An official key under vitlab's name (None for the RoPE frequency buffers, which vitlab computes)."""
    if re.match(r"^blocks\.\d+\.attn\.rope(_reg)?\.freqs$", key):
        return None
    return re.sub(r"^blocks\.(\d+)\.gamma_([12])$", r"blocks.\1.ls\2.gamma", key)


def test_official_copy_is_pinned() -> None:
    from oracles import vit5_official

    assert vit5_official.PINNED_COMMIT == "b7b0796062f4b51ae00523cb77c7117ae2dff536"
    assert "Apache License, Version 2.0" in Path(vit5_official.__file__).read_text()


@pytest.mark.parametrize("name", sorted(SMALL))
def test_preset_has_the_official_parameters(name: str) -> None:
    """Full size, on the meta device: the same parameter count and, under the key map, the same shapes."""
    with torch.device("meta"):
        ours = vitlab.create_model(name)
        theirs = BUILDERS[name]()
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in theirs.parameters())
    mapped = {vitlab_key(k): tuple(v.shape) for k, v in theirs.state_dict().items() if vitlab_key(k)}
    assert mapped == {k: tuple(v.shape) for k, v in ours.state_dict().items()}


@pytest.mark.parametrize("name", sorted(SMALL))
def test_equal_logits_at_training_size_and_two_others(name: str) -> None:
    torch.manual_seed(1)
    theirs = randomise(official(name, 64))
    ours = from_vit5(theirs.state_dict()).eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), **TOL)
    for size in (96, 48):  # up and down: main.py's resizing (bicubic, no antialiasing), RoPE on the new grid
        other = vit5_shape_like(theirs, name, size)
        ours_at = from_vit5(theirs.state_dict(), img_size=size).eval()
        x = torch.randn(2, 3, size, size)
        with torch.no_grad():
            torch.testing.assert_close(ours_at(x), other(x), **TOL)


def vit5_shape_like(model: nn.Module, name: str, size: int) -> nn.Module:
    other = official(name, size).eval()
    other.load_state_dict(interpolate_pos_embed(dict(model.state_dict()), other))
    return other


def test_preset_loads_official_weights_without_channel_reorder() -> None:
    """The official weights under plain key renames give the official logits in the vit5 preset; in the
    previous layout (pairs (i, i + d/2), columns first) they do not."""
    torch.manual_seed(2)
    theirs = randomise(official("vit5_small"))
    state = {vitlab_key(k): v for k, v in theirs.state_dict().items() if vitlab_key(k)}
    ours = vitlab.create_model("vit5_small", img_size=64, embed_dim=48, depth=2, num_classes=7).eval()
    ours.load_state_dict(state)
    halves = vitlab.create_model("vit5_small", img_size=64, embed_dim=48, depth=2, num_classes=7,
                                 rope_layout="halves").eval()
    halves.load_state_dict(state)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), **TOL)
        assert (halves(x) - theirs(x)).abs().max() > 1e-2


def test_antialiased_resizing_is_an_option_with_timms_table() -> None:
    torch.manual_seed(3)
    theirs = randomise(official("vit5_small"))
    plain = from_vit5(theirs.state_dict(), img_size=32)
    smooth = from_vit5(theirs.state_dict(), img_size=32, pos_resample_antialias=True)
    src = theirs.pos_embed.detach()
    torch.testing.assert_close(plain.pos_embed.detach(), interpolate_pos_embed({"pos_embed": src}, plain)["pos_embed"])
    torch.testing.assert_close(smooth.pos_embed.detach(), timm_resample(src, [2, 2], num_prefix_tokens=0))
    assert (plain.pos_embed - smooth.pos_embed).abs().max() > 1e-3


def test_registers_follow_the_official_rules() -> None:
    with pytest.raises(ConfigError, match="square"):
        vitlab.create_model("vit5_small", reg_tokens=3)
    torch.manual_seed(4)
    x = torch.randn(2, 3, 64, 64)
    # nine registers on a 3x3 grid; and registers rotated even without RoPE on the patches
    for kwargs in (dict(num_registers=9), dict(rope=False)):
        theirs = randomise(official("vit5_small", **kwargs))
        ours = from_vit5(theirs.state_dict()).eval()
        assert ours.cfg.reg_tokens == theirs.num_registers and ours.cfg.rope == (kwargs.get("rope", True))
        with torch.no_grad():
            torch.testing.assert_close(ours(x), theirs(x), **TOL)


def test_token_init_and_dropout_places_are_the_official_ones() -> None:
    torch.manual_seed(5)
    m = vitlab.create_model("vit5_small", img_size=64, depth=2, reg_tokens=16, drop_rate=0.5)
    assert 0.015 < m.reg_token.std().item() < 0.025 and m.reg_token.abs().max() <= 2.0
    assert m.cls_token.abs().max() > 1e-3  # trunc-normal 0.02, not timm's 1e-6
    assert vitlab.create_model("vit_small").cls_token.abs().max() < 1e-4  # timm's init kept for the ViT presets
    drops = {n: mod.p for n, mod in m.named_modules() if isinstance(mod, nn.Dropout) and mod.p > 0}
    assert drops == {"head_drop": 0.5}
    m.train()  # dropout only before the head: the class token's features are those of eval mode
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        feats = m.pool(m.forward_features(x))
        m.eval()
        torch.testing.assert_close(m.pool(m.forward_features(x)), feats)


def test_to_vit5_runs_in_the_official_code() -> None:
    torch.manual_seed(6)
    ours = vitlab.create_model("vit5_base", img_size=64, embed_dim=96, depth=2, num_classes=5)
    randomise(ours)
    theirs = vit_models(norm_layer=partial(RMSNorm, eps=1e-6), **vit5_kwargs(ours)).eval()
    theirs.load_state_dict(to_vit5(ours))  # strict: every key, RoPE buffers included
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(theirs(x), ours(x), **TOL)
    with pytest.raises(ConfigError, match="rope_layout='halves'"):
        to_vit5(vitlab.create_model("vit5_small", rope_layout="halves", reg_tokens=0, depth=1))
    with pytest.raises(ConfigError, match="cannot express"):
        to_vit5(vitlab.create_model("vit_small", depth=1))  # a position slot for the class token


def test_from_vit5_checks_every_key_and_buffer() -> None:
    torch.manual_seed(7)
    state = dict(official("vit5_small").state_dict())
    bad = dict(state)
    bad["blocks.1.attn.rope_reg.freqs"] = bad["blocks.1.attn.rope_reg.freqs"] * 2  # another theta
    with pytest.raises(CheckpointError, match="RoPE frequencies blocks.1.attn.rope_reg.freqs"):
        from_vit5(bad)
    extra = dict(state, **{"blocks.0.attn.extra": torch.zeros(1)})
    with pytest.raises(CheckpointError, match="unexpected keys blocks.0.attn.extra"):
        from_vit5(extra)
    missing = {k: v for k, v in state.items() if k != "blocks.1.attn.proj.bias"}
    with pytest.raises(CheckpointError, match="missing keys blocks.1.attn.proj.bias"):
        from_vit5(missing)
    with pytest.raises(CheckpointError, match="not a ViT-5 state dict"):
        from_vit5({"fc.weight": torch.zeros(2, 2)})
    from vitlab.interop import adapt_state_dict

    with pytest.raises(CheckpointError, match="from_vit5"):  # load_pretrained names the loader to use
        adapt_state_dict(state, from_vit5(state))


def test_convert_cli_reads_a_checkpoint_the_official_code_saved(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture) -> None:
    torch.manual_seed(8)
    theirs, ema = randomise(official("vit5_small")), randomise(official("vit5_small"))
    ckpt = tmp_path / "checkpoint.pth"  # as the authors' main.py saves it
    torch.save({"model": theirs.state_dict(), "model_ema": ema.state_dict(), "epoch": 3,
                "args": argparse.Namespace(model="vit5_small", input_size=64)}, ckpt)
    out = tmp_path / "vit5.safetensors"
    assert main(["convert", "--from", "vit5", str(ckpt), str(out), "--img-size", "96"]) == 0
    ours = vitlab.load_pretrained(None, out).eval()
    x = torch.randn(2, 3, 96, 96)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), vit5_shape_like(theirs, "vit5_small", 96)(x), **TOL)
    assert main(["convert", "--from", "vit5", "--ema", str(ckpt), str(out), "--overwrite"]) == 0
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(vitlab.load_pretrained(None, out).eval()(x), ema(x), **TOL)
    back = tmp_path / "back.pth"  # and out again, for main.py --finetune
    assert main(["convert", str(out), str(back), "--to", "vit5"]) == 0
    again = official("vit5_small").eval()
    again.load_state_dict(torch.load(back, weights_only=True)["model"])
    with torch.no_grad():
        torch.testing.assert_close(again(x), ema(x), **TOL)
    capsys.readouterr()
    timm_file = tmp_path / "timm.safetensors"
    save_file({"fc.weight": torch.zeros(2, 2)}, timm_file)
    assert main(["convert", "--from", "vit5", str(timm_file), str(tmp_path / "a.safetensors")]) == 2
    err = capsys.readouterr().err
    assert "not a ViT-5 state dict" in err and "\n" not in err.strip()
    assert main(["convert", "--from", "vit5", "--model", "vit5_small", str(ckpt), str(tmp_path / "b.safetensors")]
                ) == 2
    assert "--model" in capsys.readouterr().err


def test_vit5_is_a_depth_study_variant_at_the_base_width(tmp_path: Path) -> None:
    from _helpers import option_args, read_rows
    from vitlab.experiments.depth_study import variant_model
    from vitlab.flops import summarize

    preset, overrides = variant_model("vit5", "vit_mnist", 3)
    model = vitlab.create_model(preset, **overrides)
    base = vitlab.get_config("vit_mnist")
    assert (model.cfg.embed_dim, model.cfg.num_heads, model.cfg.img_size, model.cfg.in_chans, model.cfg.depth) == (
        base.embed_dim, base.num_heads, base.img_size, base.in_chans, 3)
    assert model.cfg.rope and model.cfg.rope_layout == "vit5" and model.cfg.reg_tokens == 4
    # the FLOP table counts the rotations of q and k (x cos + rot(x) sin: 2 multiplies an element), also those of
    # the registers alone, which the ViT-5 layout rotates without patch RoPE
    t, c = 1 + 16 + 4, base.embed_dim
    no_rope = dict(overrides, rope=False)
    registers_only = summarize(vitlab.create_model(preset, **no_rope)).macs
    assert summarize(model).macs == registers_only
    halves = vitlab.create_model(preset, **no_rope, rope_layout="halves")
    assert registers_only - summarize(halves).macs == 3 * 4 * t * c
    out = tmp_path / "depth"
    argv = ["depth-study", "--depths", "1", "--variants", "vit5", "--num-images", "4",
            *option_args(epochs=1, limit_train=32, limit_test=16, batch_size=16, threads=1, progress=False),
            "--output", str(out)]
    assert main(argv) == 0
    rows = read_rows(out / "results.csv")
    assert [(r["variant"], r["preset"]) for r in rows] == [("vit5", "vit5_small")]
    assert 0.0 <= float(rows[0]["test_acc"]) <= 1.0
