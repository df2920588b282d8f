"""timm's model API on vitlab models: pretrained_cfg for timm.data, set_input_size, dynamic_img_size, and the
presets in timm's registry (timm.create_model + validate-style evaluation of a vitlab checkpoint)."""

from __future__ import annotations

import json
import re
import shutil
import warnings
from pathlib import Path

import pytest
import timm
import timm.data
import torch
from PIL import Image
from timm.layers import resample_abs_pos_embed as timm_resample
from timm.models.vision_transformer import VisionTransformer as TimmViT

import vitlab
from vitlab.checkpoint import load_model, read_config, save_checkpoint, spec_of
from vitlab.cli import main
from vitlab.data import load_dataset, normalize
from vitlab.errors import CheckpointError, ConfigError
from vitlab.interop import to_timm
from vitlab.train.batches import subset

MNIST_STATS = ((0.1307,), (0.3081,))


def perturb(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Random values in every parameter, so zero-initialised or symmetric weights hide nothing; the position
    table as large as the patch embeddings, so a wrong table shows in the output."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            scale = 1.0 if name == "pos_embed" else 0.02 if name == "patch_embed.proj.weight" else 0.2
            p.copy_(torch.randn(p.shape, generator=g) * scale)
    return model.eval()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ck") / "run"
    args = ["train", "--model", "vit_mnist", "--depth", "1", "--embed-dim", "16", "--num-heads", "2", "--epochs", "1",
            "--limit-train", "64", "--limit-test", "64", "--batch-size", "16", "--no-progress", "--device", "cpu",
            "--threads", "1", "--output", str(out)]
    assert main(args) == 0
    return out


# ---------------------------------------------------------------------------------------------- pretrained_cfg

def test_presets_carry_a_pretrained_cfg_timm_data_reads() -> None:
    m = vitlab.create_model("vit_mnist", depth=1)
    assert m.default_cfg is m.pretrained_cfg
    cfg = timm.data.resolve_data_config({}, model=m)
    assert cfg["input_size"] == (1, 28, 28) and (cfg["mean"], cfg["std"]) == MNIST_STATS
    assert cfg["crop_pct"] == 1.0 and cfg["interpolation"] == "bilinear"  # vitlab's pipeline: whole image
    assert m.pretrained_cfg["first_conv"] == "patch_embed.proj" and m.pretrained_cfg["classifier"] == "head"
    assert isinstance(m.get_submodule(m.pretrained_cfg["first_conv"]), torch.nn.Conv2d)
    assert m.pretrained_cfg["num_classes"] == 10
    tiny = vitlab.create_model("cait_xxs24", depth=1, img_size=64, num_classes=7)
    cfg = timm.data.resolve_data_config({}, model=tiny)
    assert cfg["input_size"] == (3, 64, 64) and cfg["mean"] == timm.data.IMAGENET_DEFAULT_MEAN
    gray = vitlab.create_model("vit_tiny", depth=1, in_chans=1)
    assert len(gray.pretrained_cfg["mean"]) == 1 and gray.pretrained_cfg["input_size"] == (1, 224, 224)
    timm.models.PretrainedCfg(**gray.pretrained_cfg)  # only timm's field names


def test_a_trained_checkpoint_carries_its_normalisation(checkpoint, tmp_path) -> None:
    run_data = read_config(checkpoint)["run"]["data"]
    _, test = load_dataset("mnist-5k", img_size=28, in_chans=1)
    img = Image.fromarray(test.images[0, 0].numpy(), mode="L")
    for model in (load_model(checkpoint), vitlab.load_pretrained(checkpoint),
                  vitlab.load_pretrained(checkpoint / "model.safetensors")):
        cfg = timm.data.resolve_data_config({}, model=model)
        assert cfg["input_size"] == (1, 28, 28)
        assert cfg["mean"] == tuple(run_data["mean"]) and cfg["std"] == tuple(run_data["std"])
        x = timm.data.create_transform(**cfg)(img)
        torch.testing.assert_close(x, normalize(test.images[0], run_data["mean"], run_data["std"]))
    # the statistics come from config.json, not from the preset: edit them and they follow
    other = tmp_path / "other"
    shutil.copytree(checkpoint, other)
    config = json.loads((other / "config.json").read_text())
    config["run"]["data"].update(mean=[0.25], std=[0.5])
    (other / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="config.json"):  # the manifest's checksum covers config.json
        load_model(other)
    for model in (load_model(other, verify=False), vitlab.load_pretrained(other, verify=False)):  # edited on purpose
        assert (model.pretrained_cfg["mean"], model.pretrained_cfg["std"]) == ((0.25,), (0.5,))
    # a 3-channel model of the 1-channel checkpoint: the data set's statistics at 3 channels
    rgb = vitlab.load_pretrained(checkpoint, in_chans=3)
    assert rgb.pretrained_cfg["input_size"] == (3, 28, 28) and rgb.pretrained_cfg["mean"] == MNIST_STATS[0] * 3


def test_a_timm_model_built_at_another_size_reports_that_size(tmp_path) -> None:
    from vitlab.checkpoint.data_config import apply_checkpoint_config

    # timm itself keeps the default size's pretrained_cfg (3x224x224, three means, 1000 classes)
    plain = timm.create_model("vit_tiny_patch16_224", img_size=28, patch_size=7, in_chans=1, num_classes=10)
    assert plain.pretrained_cfg["input_size"] == (3, 224, 224)
    m = vitlab.create_model("timm:vit_tiny_patch16_224", img_size=28, patch_size=7, in_chans=1, num_classes=10)
    cfg = timm.data.resolve_data_config({}, model=m)
    assert cfg["input_size"] == (1, 28, 28) and cfg["mean"] == (0.5,) and cfg["std"] == (0.5,)
    assert m.pretrained_cfg["num_classes"] == 10 and m.default_cfg is m.pretrained_cfg
    assert m(torch.zeros(2, *cfg["input_size"])).shape == (2, 10)  # the pipeline fits the model
    rect = vitlab.create_model("timm:vit_tiny_patch16_224", img_size=(32, 48), patch_size=8, in_chans=3, num_classes=5)
    assert rect.pretrained_cfg["input_size"] == (3, 32, 48)
    assert rect.pretrained_cfg["mean"] == plain.pretrained_cfg["mean"]  # same channel count: unchanged
    # a vitlab run's statistics now reach a one-channel timm model (they were refused as the wrong count)
    apply_checkpoint_config(m, {"format": "vitlab-checkpoint/1", "run": {"data": {"mean": [0.1307],
                                                                                   "std": [0.3081]}}})
    assert (m.pretrained_cfg["mean"], m.pretrained_cfg["std"]) == MNIST_STATS
    assert m.pretrained_cfg["input_size"] == (1, 28, 28)


def test_channel_statistics() -> None:
    from vitlab.models.pretrained_cfg import channel_statistics

    assert channel_statistics((0.5, 0.5, 0.5), (0.5, 0.5, 0.5), 1) == ((0.5,), (0.5,))
    assert channel_statistics((0.1307,), (0.3081,), 3) == ((0.1307,) * 3, (0.3081,) * 3)
    assert channel_statistics((0.2, 0.4), (0.1, 0.3), 4) == ((0.3,) * 4, (0.2,) * 4)
    assert channel_statistics((0.1, 0.2, 0.3), (0.1, 0.1, 0.1), 3) == ((0.1, 0.2, 0.3), (0.1, 0.1, 0.1))


def test_the_models_statistics_are_the_data_sets() -> None:
    from vitlab.data import normalization
    from vitlab.models.pretrained_cfg import PRESET_STATS, imagenet_statistics

    assert PRESET_STATS["vit_mnist"] == normalization("mnist", 1)
    for in_chans in (1, 3):
        assert imagenet_statistics(in_chans) == normalization("imagefolder", in_chans)


# ---------------------------------------------------------------------------------------------- set_input_size

def test_patch_kernel_resampling_is_flexivits() -> None:
    from timm.layers import resample_patch_embed

    from vitlab.layers.patch_embed import resample_kernel

    w = torch.randn(8, 3, 16, 16)
    for size in (7, 12, 24):
        torch.testing.assert_close(resample_kernel(w, size), resample_patch_embed(w, [size, size]), atol=1e-4,
                                   rtol=1e-4)


@pytest.mark.parametrize("pos_embed_cls", [True, False])
def test_set_input_size_matches_timm_on_converted_weights(pos_embed_cls) -> None:
    m = perturb(vitlab.create_model("vit_tiny", depth=2, embed_dim=32, num_heads=4, img_size=32, patch_size=8,
                                    num_classes=5, reg_tokens=1, pos_embed_cls=pos_embed_cls))
    tm = to_timm(m)
    for img_size, patch_size, x in ((48, None, torch.randn(2, 3, 48, 48)), (48, 12, torch.randn(2, 3, 48, 48)),
                                    (None, 4, torch.randn(2, 3, 48, 48))):
        m.set_input_size(img_size=img_size, patch_size=patch_size)
        tm.set_input_size(img_size=img_size, patch_size=patch_size)
        with torch.no_grad():
            torch.testing.assert_close(m(x), tm(x), rtol=1e-4, atol=1e-4)
    assert m.cfg.img_size == 48 and m.cfg.patch_size == 4 and m.grid_size == 12 and m.num_patches == 144
    assert m.pretrained_cfg["input_size"] == (3, 48, 48) and m.default_cfg is m.pretrained_cfg
    assert m.flop_count() > 0 and timm.data.resolve_data_config({}, model=m)["input_size"] == (3, 48, 48)


def test_set_input_size_recomputes_fixed_tables_and_rope() -> None:
    for preset, extra in (("vit_mnist", {}), ("vit5_small", dict(embed_dim=64, num_heads=4)),
                          ("vit_tiny", dict(pos_embed="sincos2d", embed_dim=32, num_heads=4))):
        m = perturb(vitlab.create_model(preset, depth=1, img_size=28, patch_size=7, **extra))
        before = m.pos_embed.detach().clone()
        m.set_input_size(img_size=42)
        fresh = vitlab.create_model(preset, depth=1, img_size=42, patch_size=7, **extra).eval()
        state = m.state_dict()
        if m.cfg.pos_embed == "sincos2d":
            assert torch.equal(state["pos_embed"], fresh.state_dict()["pos_embed"])  # recomputed, not resampled
        elif m.cfg.pos_embed == "sincos1d":  # row-major numbers of the 4x4 grid: resampled as that 2-D grid
            want = timm_resample(before, (6, 6), (4, 4), num_prefix_tokens=1)
            torch.testing.assert_close(state["pos_embed"], want, rtol=1e-5, atol=1e-5)
        fresh.load_state_dict(state)
        if m.rope is not None:
            torch.testing.assert_close(m.rope, fresh.rope)
        x = torch.randn(2, m.cfg.in_chans, 42, 42)
        with torch.no_grad():
            torch.testing.assert_close(m(x), fresh(x))


def test_set_input_size_errors_and_the_checkpoint_spec(tmp_path) -> None:
    m = vitlab.create_model("vit_mnist", depth=1)
    with pytest.raises(ConfigError, match="not square"):
        m.set_input_size(img_size=(28, 42))
    with pytest.raises(ConfigError, match="not a multiple of patch_size"):
        m.set_input_size(img_size=30)
    with pytest.raises(ConfigError, match="set_input_size"):
        m(torch.zeros(1, 1, 42, 42))
    assert m.cfg.img_size == 28  # a refused resize changes nothing
    run = vitlab.create_model("vit_mnist", depth=1, num_classes=10)  # carries its spec, as a run's model does
    run.set_input_size(img_size=(42, 42))
    assert spec_of(run).config.img_size == 42
    save_checkpoint(tmp_path / "ck", run)
    assert load_model(tmp_path / "ck").pos_embed.shape == (1, 37, 64)


# ---------------------------------------------------------------------------------------------- dynamic_img_size

def timm_vit_like(m) -> TimmViT:
    """timm's ViT with ``dynamic_img_size=True`` and the converted weights of vitlab model ``m``."""
    c = m.cfg
    tm = TimmViT(img_size=c.img_size, patch_size=c.patch_size, in_chans=c.in_chans, num_classes=c.num_classes,
                 embed_dim=c.embed_dim, depth=c.depth, num_heads=c.num_heads, reg_tokens=c.reg_tokens,
                 no_embed_class=not c.pos_embed_cls, global_pool=c.global_pool, dynamic_img_size=True)
    tm.load_state_dict(to_timm(m).state_dict())
    return tm.eval()


@pytest.mark.parametrize("pos_embed_cls,global_pool", [(True, "token"), (False, "avg")])
def test_dynamic_vit_matches_timm_on_non_square_inputs(pos_embed_cls, global_pool) -> None:
    m = perturb(vitlab.create_model("vit_tiny", depth=2, embed_dim=32, num_heads=4, img_size=32, patch_size=8,
                                    num_classes=5, reg_tokens=1, pos_embed_cls=pos_embed_cls,
                                    global_pool=global_pool, dynamic_img_size=True))
    tm = timm_vit_like(m)
    for shape in ((24, 40), (32, 32), (56, 16)):
        x = torch.randn(2, 3, *shape)
        with torch.no_grad():
            torch.testing.assert_close(m(x), tm(x), rtol=1e-4, atol=1e-4)
    assert m.pretrained_cfg["fixed_input_size"] is False


def test_dynamic_sincos_and_rope_follow_the_grid() -> None:
    m = perturb(vitlab.create_model("vit5_small", depth=1, embed_dim=64, num_heads=4, img_size=32, patch_size=8,
                                    pos_embed="sincos2d", dynamic_img_size=True))
    x = torch.randn(2, 3, 24, 40)
    grid_tables = m.pos_embed_for((3, 5)), m.rope_for((3, 5))
    from vitlab.layers import layout_rope, sincos_2d

    torch.testing.assert_close(grid_tables[0][0], sincos_2d((3, 5), 64))
    torch.testing.assert_close(grid_tables[1], layout_rope(1, (3, 5), 4, 16, 10000.0, 100.0, layout="vit5"))
    # the same numbers as running the blocks by hand on those tables
    with torch.no_grad():
        t = m.patch_embed(x) + grid_tables[0]
        t = torch.cat([m.cls_token.expand(2, -1, -1), t, m.reg_token.expand(2, -1, -1)], dim=1)
        for blk in m.blocks:
            t = blk(t, layout_rope(1, (3, 5), 4, 16, 10000.0, 100.0, layout="vit5"))
        torch.testing.assert_close(m.forward_features(x), m.norm(t))


def test_dynamic_cait_agrees_with_set_input_size_and_timm_surgery() -> None:
    kw = dict(depth=2, embed_dim=32, num_heads=4, img_size=32, patch_size=8, num_classes=5)
    dyn = perturb(vitlab.create_model("cait_xxs24", dynamic_img_size=True, **kw))
    fixed = vitlab.create_model("cait_xxs24", **kw)
    fixed.load_state_dict(dyn.state_dict())
    fixed.set_input_size(img_size=48)
    x = torch.randn(2, 3, 48, 48)
    with torch.no_grad():
        torch.testing.assert_close(dyn(x), fixed.eval()(x))
    # non-square: timm's Cait cannot resize itself; given the table timm's resampler makes, it agrees
    tm = to_timm(dyn)
    tm.patch_embed.set_input_size(img_size=(24, 40))
    tm.pos_embed = torch.nn.Parameter(timm_resample(tm.pos_embed, (3, 5), (4, 4), num_prefix_tokens=0))
    x = torch.randn(2, 3, 24, 40)
    with torch.no_grad():
        torch.testing.assert_close(dyn(x), tm.eval()(x), rtol=1e-4, atol=1e-4)


def test_dynamic_img_pad_and_size_errors() -> None:
    kw = dict(depth=1, img_size=28, patch_size=7, dynamic_img_size=True)
    pad = perturb(vitlab.create_model("vit_mnist", dynamic_img_pad=True, **kw))
    plain = vitlab.create_model("vit_mnist", **kw)
    plain.load_state_dict(pad.state_dict())
    x = torch.randn(2, 1, 30, 20)
    with torch.no_grad():
        torch.testing.assert_close(pad(x), plain.eval()(torch.nn.functional.pad(x, (0, 1, 0, 5))))
    with pytest.raises(ConfigError, match="dynamic_img_pad=True"):
        plain(x)
    with pytest.raises(ConfigError, match="needs dynamic_img_size=True"):
        vitlab.create_model("vit_mnist", dynamic_img_pad=True)
    with pytest.raises(ConfigError, match=r"\(B, 1, H, W\)"):
        plain(torch.zeros(1, 3, 28, 28))


# ---------------------------------------------------------------------------------------------- timm registry

def test_presets_are_timm_models_after_import() -> None:
    assert timm.is_model("vitlab.vit_mnist") and timm.is_model("vitlab_cait_xxs24")
    assert set(timm.list_models("vitlab_*")) == {f"vitlab_{p}" for p in vitlab.list_models()}
    m = timm.create_model("vitlab.vit_mnist", num_classes=3, depth=1, img_size=56, drop_path_rate=0.1)
    assert isinstance(m, vitlab.models.VisionTransformer)
    assert (m.cfg.num_classes, m.cfg.depth, m.cfg.img_size, m.cfg.drop_path_rate) == (3, 1, 56, 0.1)
    c = timm.create_model("vitlab_cait_xxs24", depth=1, in_chans=1, img_size=32, patch_size=8, dynamic_img_size=True)
    assert isinstance(c, vitlab.models.Cait) and c(torch.zeros(1, 1, 16, 40)).shape == (1, 1000)
    assert timm.get_pretrained_cfg("vitlab.vit_mnist").input_size == (1, 28, 28)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # registering again overwrites nothing
        vitlab.register_timm()
    with pytest.raises(ConfigError, match="unknown model option 'detph'"):
        timm.create_model("vitlab.vit_mnist", detph=2)
    with pytest.raises(ConfigError, match="no downloadable weights"):
        timm.create_model("vitlab.vit_mnist", pretrained=True)
    with pytest.raises(ConfigError, match="name a vitlab preset"):
        timm.create_model("vitlab")


def test_timm_validate_style_evaluation_of_a_vitlab_checkpoint(checkpoint, capsys) -> None:
    assert main(["eval", "--checkpoint", str(checkpoint), "--limit-test", "64"]) == 0
    acc = re.search(r"test_acc ([\d.]+)%", capsys.readouterr().out).group(1)
    _, test = load_dataset("mnist-5k", img_size=28, in_chans=1)
    test = subset(test, 64)
    arch = {k: read_config(checkpoint)["model"][k] for k in ("depth", "embed_dim", "num_heads", "global_pool")}
    by_path = timm.create_model("vitlab.vit_mnist", num_classes=10,
                                checkpoint_path=str(checkpoint / "model.safetensors"), **arch)
    by_file = timm.create_model("vitlab_vit_mnist", pretrained=True, pretrained_cfg_overlay=dict(file=str(checkpoint)))
    reference = load_model(checkpoint).eval()
    run = read_config(checkpoint)["run"]["data"]
    with torch.no_grad():
        expected = reference(normalize(test.images, run["mean"], run["std"])).argmax(1)
    for model in (by_path, by_file):
        model.eval()
        transform = timm.data.create_transform(**timm.data.resolve_data_config({}, model=model))
        batch = torch.stack([transform(Image.fromarray(img[0].numpy(), mode="L")) for img in test.images])
        with torch.no_grad():
            pred = model(batch).argmax(1)
        assert torch.equal(pred, expected)
        assert f"{100 * (pred == test.labels).float().mean().item():.2f}" == acc  # as `vitlab eval` prints it
    with pytest.raises(ConfigError, match="holds a vit_mnist model"):
        timm.create_model("vitlab.vit_tiny", pretrained=True, pretrained_cfg_overlay=dict(file=str(checkpoint)))


def test_import_vitlab_leaves_timm_alone_and_registers_when_timm_comes() -> None:
    import subprocess
    import sys

    code = ("import sys, warnings; warnings.simplefilter('error'); import vitlab; assert 'timm' not in sys.modules; "
            "import timm; print(timm.create_model('vitlab.vit_mnist', depth=1).cfg.name)")
    src = str(Path(vitlab.__file__).parents[1])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={"PYTHONPATH": src},
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "vit_mnist", out.stderr
