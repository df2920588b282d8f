"""The model `vitlab train` trains is a named preset. With no --model, on digits that is ``vit_mnist_conv_patch14``
(the recipe's default model) and elsewhere ``vit_mnist``, which the recipe reads out by average pooling with fc_norm
on digits and clothing and so names ``vit_mnist_gap``: the run's first line and its config.json name it, so that
``timm.create_model("vitlab_<name>", checkpoint_path=...)``, timm's validate.py and `vitlab eval` build that model from
the name alone. The run config keeps what the user typed (``vit_mnist``), and the weights are the ones the unnamed
model of before trained."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
import timm
import torch
from safetensors.torch import load_file
from timm.models import load_checkpoint

import vitlab
import vitlab.train.config as run_config_module
import vitlab.train.plan_model as plan_model
from _helpers import option_args
from test_time_to_accuracy_fashion import tiny_fashion
from vitlab.checkpoint import load_model, read_config
from vitlab.cli import main
from vitlab.data import load_dataset, normalize
from vitlab.experiments.runs import changed_options
from vitlab.models import get_config
from vitlab.train.batches import subset
from vitlab.train.config import RunConfig, default_model, default_recipe
from vitlab.train.plan import plan_run
from vitlab.train.run_model import INIT_STREAM, build_run_model
from vitlab.train.seeding import derive_seed

TINY = option_args(limit_train=64, limit_test=64, epochs=1, batch_size=16, progress=False)
DEFAULT_LINE = "vitlab train: vit_mnist_conv_patch14 (0.68M params) on mnist-5k ("
FIRST_LINE = "vitlab train: vit_mnist_gap (vit_mnist with the recipe's global_pool=avg; 0.40M params) on mnist-5k ("


def train(out: Path, *args: str, model: str | None = "vit_mnist") -> str:
    """A tiny `vitlab train` run in this process of ``model`` (None: no --model, the command's default) with
    ``args``; its first line."""
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert main(["train", *(["--model", model] if model else []), *TINY, *args, "--output", str(out)]) == 0
    return stdout.getvalue().splitlines()[0]


@pytest.fixture(scope="module")
def default_run(tmp_path_factory) -> tuple[Path, str]:
    """vit_mnist as the recipe trains it on digits: named vit_mnist_gap."""
    out = tmp_path_factory.mktemp("default") / "run"
    return out, train(out)


@pytest.mark.full  # the digits default model trained end to end
def test_no_model_option_trains_the_digits_default_and_timm_loads_it_by_name(tmp_path) -> None:
    run = tmp_path / "run"
    first = train(run, model=None)
    assert first.startswith(DEFAULT_LINE), first
    config = read_config(run)
    assert config["model"]["name"] == config["run"]["model"] == "vit_mnist_conv_patch14"
    assert config["model"]["stem"] == "conv" and config["model"]["patch_size"] == 14
    # a default-trained checkpoint through timm.create_model with the name alone, no other argument
    by_name = timm.create_model("vitlab_vit_mnist_conv_patch14", checkpoint_path=str(run / "model.safetensors"))
    _, test = load_dataset("mnist-5k", img_size=28, in_chans=1)
    data = config["run"]["data"]
    x = normalize(subset(test, 16).images, data["mean"], data["std"])
    with torch.no_grad():
        assert torch.equal(by_name.eval()(x), load_model(run).eval()(x))
    assert main(["eval", "--checkpoint", str(run)]) == 0
    # resumed, the run keeps its own model, whatever the default
    assert main(["train", "--resume", str(run), "--epochs", "2", "--no-progress"]) == 0
    assert read_config(run)["run"]["model"] == "vit_mnist_conv_patch14"


def test_the_default_model_by_kind_of_image(monkeypatch) -> None:
    assert [default_model(d) for d in ("mnist-5k", "MNIST", "fashion-mnist", "cifar10", "imagefolder:x")] == \
        ["vit_mnist_conv_patch14", "vit_mnist_conv_patch14", "vit_fashion_conv_patch14", "vit_mnist", "vit_mnist"]
    assert RunConfig().model == "vit_mnist"  # the library's default (the studies') stays the plain ViT
    # the command and the time-to-accuracy benchmark take it from the same table
    monkeypatch.setitem(run_config_module.DEFAULT_MODELS, "clothing", "vit_mnist_conv")
    assert default_model("fashion-mnist") == "vit_mnist_conv"


def test_a_default_run_trains_and_names_vit_mnist_gap(default_run) -> None:
    run, first = default_run
    assert first.startswith(FIRST_LINE), first
    config = read_config(run)
    assert config["model"]["name"] == "vit_mnist_gap"
    assert config["model"]["global_pool"] == "avg" and config["model"]["fc_norm"] is None
    assert config["run"]["model"] == "vit_mnist"  # what the user typed (the default), unchanged
    assert config["run"]["model_overrides"] == {"global_pool": "avg", "drop_path_rate": 0.0}
    gap = vitlab.create_model("vit_mnist_gap")
    assert {k: v for k, v in config["model"].items() if k != "drop_path_rate"} == \
        {k: v for k, v in gap.cfg.to_dict().items() if k != "drop_path_rate"}


def test_timm_builds_the_default_run_from_the_name_alone(default_run) -> None:
    run, _ = default_run
    weights = run / "model.safetensors"
    by_name = timm.create_model("vitlab_vit_mnist_gap", checkpoint_path=str(weights)).eval()  # strict load
    fresh = timm.create_model("vitlab_vit_mnist_gap")
    result = fresh.load_state_dict(load_file(str(weights)), strict=False)
    assert (result.missing_keys, result.unexpected_keys) == ([], [])
    # as timm's validate.py creates and loads it (--model vitlab_vit_mnist_gap --checkpoint RUN/model.safetensors)
    validate = timm.create_model("vitlab_vit_mnist_gap", pretrained=False, num_classes=None, global_pool=None,
                                 scriptable=False)
    load_checkpoint(validate, str(weights), False)
    validate.eval()
    data = read_config(run)["run"]["data"]
    # timm's data config of the name: the run's normalisation, the input the run trained at
    timm_data = timm.data.resolve_data_config({}, model=validate)
    assert timm_data["input_size"] == (1, 28, 28)
    assert (list(timm_data["mean"]), list(timm_data["std"])) == (data["mean"], data["std"])
    _, test = load_dataset("mnist-5k", img_size=28, in_chans=1)
    x = normalize(subset(test, 32).images, data["mean"], data["std"])
    reference = load_model(run).eval()
    with torch.no_grad():
        expected = reference(x)
        for model in (by_name, validate):
            assert torch.equal(model(x), expected)


def test_vitlab_eval_by_the_name_and_timm_refuses_the_class_token_preset(default_run, capsys) -> None:
    run, _ = default_run
    assert main(["eval", "--checkpoint", str(run)]) == 0
    assert main(["eval", "--checkpoint", str(run), "--model", "vit_mnist_gap"]) == 0
    capsys.readouterr()
    assert main(["eval", "--checkpoint", str(run), "--model", "vit_mnist"]) == 2
    assert "fc_norm" in capsys.readouterr().err
    with pytest.raises(RuntimeError, match=r"(?s)Missing key.*norm\.weight.*Unexpected key.*fc_norm\.weight"):
        timm.create_model("vitlab_vit_mnist", checkpoint_path=str(run / "model.safetensors"))


def test_the_name_changes_no_weight(default_run, tmp_path, monkeypatch) -> None:
    run, _ = default_run
    # the initial weights, as the run builds them and as the unnamed model of before was built
    plan = plan_run(RunConfig(limit_train=64, epochs=1, batch_size=16, output=str(tmp_path / "plan")))
    assert plan.spec.config.name == "vit_mnist_gap"
    now = build_run_model(plan.spec, seed=0).state_dict()
    torch.manual_seed(derive_seed(0, INIT_STREAM))
    before = vitlab.create_model("vit_mnist", global_pool="avg", drop_path_rate=0.0).state_dict()
    assert list(now) == list(before) and all(torch.equal(now[k], before[k]) for k in now)
    # a whole run with the renaming switched off (the old way): the same trained weights, the same run config
    monkeypatch.setattr(plan_model, "find_preset", lambda config, ignore=(): None)
    old = tmp_path / "old"
    assert train(old).startswith("vitlab train: vit_mnist (0.40M params) on mnist-5k (")
    new_weights, old_weights = load_file(str(run / "model.safetensors")), load_file(str(old / "model.safetensors"))
    assert list(new_weights) == list(old_weights)
    assert all(torch.equal(new_weights[k], old_weights[k]) for k in new_weights)
    new_config, old_config = read_config(run), read_config(old)
    assert old_config["model"]["name"] == "vit_mnist"
    assert {**old_config["model"], "name": "vit_mnist_gap"} == new_config["model"]
    assert {**old_config["run"], "output": None} == {**new_config["run"], "output": None}
    # a run made before the name existed still resumes, and a study still sees it as its own
    monkeypatch.undo()
    assert changed_options(RunConfig(limit_train=64, limit_test=64, epochs=1, batch_size=16), old) == []
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert main(["train", "--resume", str(old), "--epochs", "2"]) == 0
    assert json.loads((old / "summary.json").read_text())["epochs"] == 2


def test_default_pooling_on_clothing_is_named_too() -> None:
    spec, overrides, _, _ = plan_model.resolve_model(RunConfig(dataset="fashion-mnist"))
    assert spec.config.name == "vit_mnist_gap" and overrides == {"global_pool": "avg"}
    assert plan_model.resolve_model(RunConfig(dataset="cifar10"))[0].config.name == "vit_mnist"  # no default there


@pytest.mark.parametrize("option, name, overrides", [
    ("depth=2", "vit_mnist", {"depth": 2, "global_pool": "avg", "drop_path_rate": 0.0}),
    ("global_pool=token", "vit_mnist", {"global_pool": "token", "drop_path_rate": 0.0}),
])
def test_a_model_no_preset_equals_keeps_the_users_name(tmp_path, option, name, overrides) -> None:
    first = train(tmp_path / "run", "--set", option)
    assert first.startswith(f"vitlab train: {name} (0."), first
    config = read_config(tmp_path / "run")
    assert config["model"]["name"] == name and config["run"]["model"] == "vit_mnist"
    assert config["run"]["model_overrides"] == overrides


def test_the_clothing_default_is_a_narrow_stem_with_its_own_recipe() -> None:
    """On clothing the command trains vit_fashion_conv_patch14 (a 32-channel stem, 6 blocks, 4 heads) in
    channels-last order for 19 epochs at lr 3e-3 with one warm-up epoch, an EMA of the weights (decay 0.999) and
    left-right flips and a shift of up to one pixel as its only augmentation; every other option keeps the recipe of
    the data set's size, and digits add nothing."""
    cfg = get_config("vit_fashion_conv_patch14")
    assert (cfg.stem, cfg.stem_chans, cfg.depth, cfg.num_heads, cfg.patch_size, cfg.global_pool) == \
        ("conv", 32, 6, 4, 14, "avg")
    recipe = default_recipe("fashion-mnist")
    assert (recipe["epochs"], recipe["lr"], recipe["warmup_epochs"], recipe["hflip"]) == (19, 3e-3, 1, True)
    assert recipe["channels_last"] is True and recipe["ema_decay"] == 0.999
    assert recipe["pad_crop"] == 1 and recipe["degrees"] == 0 and recipe["erase_prob"] == 0
    assert "batch_size" not in recipe and "label_smoothing" not in recipe
    assert default_recipe("mnist-5k") == {} == default_recipe("cifar10")
    model = timm.create_model("vitlab_vit_fashion_conv_patch14")
    assert model.pretrained_cfg["mean"] == (0.286,)  # Fashion-MNIST's statistics, not MNIST's


@pytest.mark.full  # runs of the clothing recipe end to end
def test_the_command_applies_the_clothing_recipe_unless_an_option_says_otherwise(tmp_path) -> None:
    data = tiny_fashion(tmp_path / "fashion")
    common = ["train", "--dataset", "fashion-mnist", "--data-dir", str(data), "--limit-train", "64",
              "--limit-test", "32", "--batch-size", "32", "--no-progress"]
    assert main([*common, "--epochs", "1", "--output", str(tmp_path / "a")]) == 0
    run = read_config(tmp_path / "a")
    assert run["model"]["name"] == "vit_fashion_conv_patch14" and run["run"]["epochs"] == 1  # the user's epochs
    assert run["run"]["hflip"] is True and run["run"]["pad_crop"] == 1  # the default recipe's
    assert run["run"]["lr"] == 3e-3 and run["run"]["channels_last"] is True
    assert run["run"]["warmup_epochs"] == pytest.approx(0.1)  # the recipe's 1 of 19 epochs, fitted to the 1 asked
    assert run["run"]["ema_decay"] == 0.999
    assert main([*common, "--epochs", "1", "--no-hflip", "--output", str(tmp_path / "b")]) == 0
    assert read_config(tmp_path / "b")["run"]["hflip"] is False
    assert main([*common, "--model", "vit_mnist", "--epochs", "1", "--output", str(tmp_path / "c")]) == 0
    named = read_config(tmp_path / "c")["run"]
    assert named["hflip"] is True and named["pad_crop"] == 2  # a named model: the clothing augmentation of before
    assert named["lr"] == 2e-3 and named["channels_last"] is False  # and the recipe of the data set's size
    assert named["ema_decay"] == 0.0
