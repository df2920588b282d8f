"""``vit_mnist_conv``: the most accurate configuration measured on mnist-5k (docs/training.md) is a preset, equal to
the model those runs trained, and a run asking for that configuration is named after it."""

from __future__ import annotations

import json
from pathlib import Path

import timm
import torch

import vitlab
from vitlab.checkpoint import ModelSpec
from vitlab.models import get_config

RECORD = Path(__file__).resolve().parents[1] / "docs" / "results" / "runs" / "ablation_conv_stem" / "stem=conv_seed=0"
NEUTRAL = ("name", "num_classes", "drop_path_rate")


def test_the_preset_is_the_model_the_measured_runs_trained():
    trained = ModelSpec.from_dict(json.loads((RECORD / "config.json").read_text())["model"]).config.to_dict()
    preset = get_config("vit_mnist_conv").to_dict()
    assert {k: v for k, v in trained.items() if k not in NEUTRAL} == {
        k: v for k, v in preset.items() if k not in NEUTRAL}
    assert preset["stem"] == "conv" and preset["patch_size"] == 4 and preset["global_pool"] == "avg"
    assert get_config("vit_mnist").stem == "patch"  # the studies' plain ViT is untouched


def test_timm_builds_it_by_name_for_digits():
    model = timm.create_model("vitlab_vit_mnist_conv")
    assert model.pretrained_cfg["input_size"] == (1, 28, 28)
    assert model(torch.randn(2, 1, 28, 28)).shape == (2, 10)
    ours = vitlab.create_model("vit_mnist_conv")
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in model.parameters())


def test_a_run_asking_for_that_configuration_is_named_after_it(tmp_path, capsys):
    from vitlab.cli import main

    out = tmp_path / "run"
    assert main(["train", "--model", "vit_mnist", "--set", "patch_size=4", "--set", "stem=conv", "--epochs", "1",
                 "--limit-train", "32", "--limit-test", "16", "--batch-size", "16", "--no-progress",
                 "--output", str(out)]) == 0
    assert "vit_mnist_conv (vit_mnist with " in capsys.readouterr().out
    assert json.loads((out / "config.json").read_text())["model"]["name"] == "vit_mnist_conv"
    reloaded = timm.create_model("vitlab_vit_mnist_conv", checkpoint_path=str(out / "model.safetensors"))
    assert reloaded(torch.randn(1, 1, 28, 28)).shape == (1, 10)


def test_the_patch14_conv_preset_sees_four_tokens_and_timm_builds_it():
    """``vit_mnist_conv_patch14``: vit_mnist_conv's stem cut into 2x2 tokens (the fast candidate for the default)."""
    cfg = get_config("vit_mnist_conv_patch14")
    conv = get_config("vit_mnist_conv").to_dict()
    assert {k: v for k, v in cfg.to_dict().items() if k not in ("patch_size", "name")} == {
        k: v for k, v in conv.items() if k not in ("patch_size", "name")} and cfg.patch_size == 14
    ours = vitlab.create_model("vit_mnist_conv_patch14")
    assert ours.patch_embed.num_patches == 4
    x = torch.randn(2, 1, 28, 28)
    assert ours.forward_features(x).shape[1] == 4 + 1  # 4 patch tokens and the class token
    model = timm.create_model("vitlab_vit_mnist_conv_patch14")
    assert model.pretrained_cfg["input_size"] == (1, 28, 28)
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in model.parameters())
