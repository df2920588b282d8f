"""``--channels-last`` (timm's flag of the same name): the convolutional stem's weights and the images in NHWC memory
order while a run trains, the same numbers up to rounding, checkpoints and resumes as usual; on by default in the
clothing recipe, off elsewhere."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import timm
import torch

from _helpers import run_config
from vitlab.checkpoint import load_train_state, read_config
from vitlab.cli import main
from vitlab.train.config import RESULT_NEUTRAL, RunConfig, default_recipe
from vitlab.train.engine import train

CL = torch.channels_last
# the command's default model on digits (a 64-channel stem), shrunk; batch 16 of 64 images: 4 steps an epoch
STEM = {**run_config(), "model": "vit_mnist_conv_patch14", "batch_size": 16}


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def layouts(trainer) -> tuple[bool, bool]:
    """Whether every 4-D weight of the trainer's model is channels-last, and whether any is."""
    flags = [p.is_contiguous(memory_format=CL) and not p.is_contiguous()
             for p in trainer.model.parameters() if p.ndim == 4 and p.shape[1] > 1]
    return all(flags), any(flags)


@pytest.mark.full  # two runs of the conv-stem default model
def test_a_channels_last_run_trains_in_nhwc_and_computes_the_same_numbers(tmp_path) -> None:
    seen: dict[str, tuple[bool, bool]] = {}
    grads: dict[str, dict[str, torch.Tensor]] = {}

    def watch(name: str):
        def hook(trainer) -> None:
            seen.setdefault(name, layouts(trainer))
            if trainer.progress.global_step == 1:  # the first step's gradients, from the same weights and batch
                grads[name] = {k: p.grad.contiguous().clone() for k, p in trainer.model.named_parameters()}
        return hook

    nchw = train(RunConfig(epochs=2, **STEM, output=str(tmp_path / "nchw")), on_step=watch("nchw"))
    nhwc = train(RunConfig(epochs=2, **STEM, channels_last=True, output=str(tmp_path / "nhwc")),
                 on_step=watch("nhwc"))
    assert nchw.exit_code == nhwc.exit_code == 0
    assert seen == {"nchw": (False, False), "nhwc": (True, True)}  # the stem's convolutions ran in NHWC
    for k, g in grads["nchw"].items():  # another convolution kernel: the same gradients up to float rounding
        assert (grads["nhwc"][k] - g).abs().max() <= 1e-4 * g.abs().max() + 1e-9, k
    # and the same run: Adam and batch norm magnify the rounding a little over 32 steps, not to the second decimal
    losses = [[r["train_loss"] for r in metrics(tmp_path / name)] for name in ("nchw", "nhwc")]
    assert losses[0] == pytest.approx(losses[1], abs=2e-3)
    assert read_config(tmp_path / "nhwc")["run"]["channels_last"] is True
    # the saved weights are plain (contiguous) tensors that timm loads by the run's name
    model = timm.create_model("vitlab_vit_mnist_conv_patch14", **STEM["model_overrides"],
                              checkpoint_path=str(tmp_path / "nhwc" / "model.safetensors"))
    assert all(p.is_contiguous() for p in model.parameters())


@pytest.mark.full  # stop-and-resume against an uninterrupted run
def test_a_channels_last_run_resumes_bit_exactly(tmp_path) -> None:
    cfg = RunConfig(epochs=2, **STEM, channels_last=True, ema_decay=0.9)

    def stop_after(step: int):
        def hook(trainer) -> None:
            if trainer.progress.global_step == step:
                trainer.stop.request()
        return hook

    assert train(cfg.replace(output=str(tmp_path / "full"))).exit_code == 0
    assert train(cfg.replace(output=str(tmp_path / "part")), on_step=stop_after(3)).exit_code == 143
    assert main(["train", "--resume", str(tmp_path / "part")]) == 0
    full, part = load_train_state(tmp_path / "full"), load_train_state(tmp_path / "part")
    for k, v in full["model"].items():
        assert torch.equal(part["model"][k], v), k


@pytest.mark.full  # two runs of the clothing recipe end to end
def test_the_clothing_recipe_turns_it_on_and_the_flag_turns_it_off(tmp_path) -> None:
    from test_time_to_accuracy_fashion import tiny_fashion

    assert default_recipe("fashion-mnist")["channels_last"] is True
    assert "channels_last" not in default_recipe("mnist-5k") and RunConfig().channels_last is False
    assert "channels_last" in RESULT_NEUTRAL  # a resumed run may switch it: where the numbers are computed, not which
    data = tiny_fashion(tmp_path / "fashion")
    common = ["train", "--dataset", "fashion-mnist", "--data-dir", str(data), "--limit-train", "32", "--limit-test",
              "16", "--batch-size", "16", "--epochs", "1", "--no-progress"]
    assert main([*common, "--output", str(tmp_path / "on")]) == 0
    assert main([*common, "--no-channels-last", "--output", str(tmp_path / "off")]) == 0
    assert read_config(tmp_path / "on")["run"]["channels_last"] is True
    assert read_config(tmp_path / "off")["run"]["channels_last"] is False


@pytest.mark.parametrize("flag", ["--channels-last", "--no-channels-last"])
def test_the_flag_is_on_the_command(flag, capsys) -> None:
    with pytest.raises(SystemExit) as e:
        main(["train", flag, "--help"])
    assert e.value.code == 0 and "--channels-last" in capsys.readouterr().out
