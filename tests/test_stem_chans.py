"""``stem_chans``: the width of the convolutional stem (DeepViT's is 64), a model option like any other: the
convolutions, the parameter and FLOP counts, and weights loaded by name all follow it."""

from __future__ import annotations

import pytest
import timm
import torch
from safetensors.torch import save_file

import vitlab
from vitlab import flops
from vitlab.errors import ConfigError
from vitlab.models.size_limits import param_count


@pytest.mark.parametrize("chans", [16, 32, 64])
def test_the_stem_has_the_channels_asked_and_the_counts_follow(chans: int) -> None:
    model = vitlab.create_model("vit_mnist_conv_patch14", stem_chans=chans)
    stem = model.patch_embed
    assert [stem.conv1.out_channels, stem.conv2.in_channels, stem.conv3.out_channels, stem.proj.in_channels] == \
        [chans] * 4
    assert sum(p.numel() for p in model.parameters()) == param_count(model.cfg)
    ours, theirs = flops.cross_check(model)
    assert ours == theirs
    assert model(torch.randn(2, 1, 28, 28)).shape == (2, 10)


def test_the_default_is_deepvits_64() -> None:
    assert vitlab.create_model("vit_mnist_conv_patch14").patch_embed.conv2.weight.shape[:2] == (64, 64)


@pytest.mark.parametrize("bad", [0, -8, 2.5, True])
def test_a_bad_width_is_one_config_error(bad) -> None:
    with pytest.raises(ConfigError, match="stem_chans must be a positive integer"):
        vitlab.create_model("vit_mnist_conv_patch14", stem_chans=bad)


def test_weights_of_a_narrow_stem_load_by_the_preset_name(tmp_path) -> None:
    """load_pretrained reads the stem's width from the weights, as it reads patch_size and in_chans."""
    src = vitlab.create_model("vit_mnist_conv_patch14", stem_chans=24).eval()
    path = tmp_path / "model.safetensors"
    save_file({k: v.contiguous() for k, v in src.state_dict().items()}, str(path))
    loaded = vitlab.load_pretrained("vit_mnist_conv_patch14", path).eval()
    assert loaded.cfg.stem_chans == 24
    x = torch.randn(3, 1, 28, 28)
    torch.testing.assert_close(loaded(x), src(x))


def test_timm_builds_the_width_from_a_keyword() -> None:
    model = timm.create_model("vitlab_vit_mnist_conv_patch14", stem_chans=32)
    assert model.patch_embed.conv2.weight.shape[:2] == (32, 32)
