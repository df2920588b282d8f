"""One road from a spec to a model: ``vitlab.create_model`` (and timm's ``timm.create_model("vitlab_...")``) resolve a
preset, ``timm:NAME``, a ModelConfig or a stored spec once, and ``ModelSpec.build`` is the only place a model is
instantiated; a training run resolves its model config once and builds its model once, resume included (its plan
measures the model on the meta device, where no weight is allocated)."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest
import timm
import torch

import vitlab
from vitlab.checkpoint import ModelSpec, load_model, read_spec, save_checkpoint, spec_of
from vitlab.errors import CheckpointError, ConfigError
from vitlab.models import Cait, VisionTransformer
from vitlab.train.config import RunConfig
from vitlab.train.engine import train

TINY_RUN = dict(limit_train=256, limit_test=128, batch_size=64, progress=False,
                model_overrides={"depth": 2, "embed_dim": 32, "num_heads": 4})
TIMM_TINY = dict(img_size=28, patch_size=7, in_chans=1, num_classes=10, embed_dim=32, depth=1, num_heads=2)


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """One entry per vitlab model instantiated with weights (not on the meta device): True when it was built inside
    ``ModelSpec.build``."""
    made: list[bool] = []
    inside = [0]
    real_build = ModelSpec.build

    def build(self: ModelSpec, *args, **kwargs):
        inside[0] += 1
        try:
            return real_build(self, *args, **kwargs)
        finally:
            inside[0] -= 1

    monkeypatch.setattr(ModelSpec, "build", build)
    for cls in (VisionTransformer, Cait):
        def init(self, *args, _real=cls.__init__, **kwargs) -> None:
            if torch.get_default_device().type != "meta":
                made.append(inside[0] > 0)
            _real(self, *args, **kwargs)

        monkeypatch.setattr(cls, "__init__", init)
    return made


@pytest.fixture
def resolutions(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The preset of every model config resolved (``get_config``, wherever vitlab's modules hold it)."""
    from vitlab.models import registry

    real = registry.get_config
    seen: list[str] = []

    def get_config(name: str, **overrides):
        seen.append(name)
        return real(name, **overrides)

    for module in [m for n, m in sys.modules.items() if n == "vitlab" or n.startswith("vitlab.")]:
        if getattr(module, "get_config", None) is real:
            monkeypatch.setattr(module, "get_config", get_config)
    return seen


def test_a_run_resolves_its_model_once_and_builds_it_once_resume_included(tmp_path: Path, builds, resolutions):
    out = tmp_path / "run"
    assert train(RunConfig(epochs=1, **TINY_RUN, output=str(out))).exit_code == 0
    assert (len(resolutions), len(builds)) == (1, 1)
    assert resolutions == ["vit_mnist"] and builds == [True]
    builds.clear()
    resolutions.clear()
    assert train({"epochs": 2}, resume=out).exit_code == 0  # as `train --resume --epochs 2` does
    assert (len(resolutions), len(builds)) == (1, 1)  # the architecture check uses the one model the run builds
    assert resolutions == ["vit_mnist"] and builds == [True]
    assert spec_of(load_model(out)).config.depth == 2


def test_a_depth_study_resolves_each_planned_model_once(resolutions):
    from vitlab.experiments.depth_study import depth_specs

    specs = depth_specs("vit_mnist", [2, 4], ["vit", "layerscale"], [0, 1], RunConfig())
    assert len(specs) == 8 and resolutions == ["vit_mnist"] * 4  # one per variant and depth, validated before any run


def test_a_resume_of_another_architecture_is_still_refused(tmp_path: Path, builds):
    out = tmp_path / "run"
    assert train(RunConfig(epochs=1, **TINY_RUN, output=str(out))).exit_code == 0
    builds.clear()
    with pytest.raises(CheckpointError, match=r"cannot resume .* missing keys \(blocks\.2\.") as exc:
        train({"epochs": 2, "model_overrides": {"depth": 3}}, resume=out)
    assert "start a new run" in str(exc.value) and builds == []  # refused by the plan, before any model is built


def test_create_model_takes_a_preset_a_timm_name_a_config_and_a_spec(tmp_path: Path, builds):
    preset = vitlab.create_model("vit_mnist", depth=1)
    from_config = vitlab.create_model(preset.cfg, num_classes=7)
    from_spec = vitlab.create_model(preset.vitlab_spec)
    timm_model = vitlab.create_model("timm:vit_tiny_patch16_224", **TIMM_TINY)
    assert builds == [True, True, True]  # timm's own model is timm's class; all four came through ModelSpec.build
    assert preset.vitlab_spec == ModelSpec(config=preset.cfg)
    assert from_config.cfg == preset.cfg.replace(num_classes=7) and from_config.vitlab_spec.config.num_classes == 7
    assert from_spec.cfg == preset.cfg
    assert timm_model.vitlab_spec == ModelSpec(timm="vit_tiny_patch16_224", kwargs=TIMM_TINY)
    save_checkpoint(tmp_path / "timm", timm_model)
    again = vitlab.create_model(read_spec(tmp_path / "timm"), num_classes=3)  # a stored spec, with an override
    assert isinstance(again, timm.models.VisionTransformer) and again.num_classes == 3
    assert again.vitlab_spec.kwargs == {**TIMM_TINY, "num_classes": 3}


def test_every_model_carries_its_spec_and_it_follows_the_model(tmp_path: Path):
    model = vitlab.create_model("cait_xxs24", depth=1, img_size=32, patch_size=8, num_classes=10)
    assert model.vitlab_spec == ModelSpec(config=model.cfg)
    model.reset_classifier(5)
    model.set_input_size(img_size=48)
    assert model.vitlab_spec.config.num_classes == 5 and model.vitlab_spec.config.img_size == 48
    save_checkpoint(tmp_path / "ck", model)
    loaded = load_model(tmp_path / "ck")  # the checkpoint rebuilds the model as it is now
    assert loaded.num_classes == 5 and loaded.cfg.img_size == 48
    for name, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], value), name


def test_timm_create_model_goes_through_the_same_road(builds):
    model = timm.create_model("vitlab_vit_mnist", depth=1, num_classes=3)
    dotted = timm.create_model("vitlab.cait_xxs24", depth=1, img_size=32, patch_size=8)
    assert builds == [True, True]
    assert model.vitlab_spec == ModelSpec(config=vitlab.get_config("vit_mnist", depth=1, num_classes=3))
    assert dotted.vitlab_spec.config == vitlab.get_config("cait_xxs24", depth=1, img_size=32, patch_size=8)
    assert vitlab.create_model("timm:vitlab_vit_mnist", depth=1).vitlab_spec.config.depth == 1


def test_loading_and_converting_build_through_the_road(tmp_path: Path, builds):
    source = vitlab.create_model("vit_mnist", depth=1)
    save_checkpoint(tmp_path / "ck", source)
    builds.clear()
    assert spec_of(load_model(tmp_path / "ck")) == source.vitlab_spec
    assert spec_of(load_model(tmp_path / "ck", model="vit_mnist", depth=1)).config.name == "vit_mnist"
    assert spec_of(vitlab.load_pretrained(None, tmp_path / "ck")).config == source.cfg
    theirs = timm.create_model("vit_tiny_patch16_224", **TIMM_TINY)
    ours = vitlab.from_timm(theirs)
    assert builds == [True] * 4  # load_pretrained also builds on the meta device to check the file: not counted
    assert ours.vitlab_spec.config == ours.cfg


def test_build_model_is_a_deprecated_alias_of_create_model(builds):
    cfg = vitlab.get_config("vit_mnist", depth=1)
    with pytest.warns(DeprecationWarning, match="vitlab.create_model"):
        model = vitlab.build_model(cfg)
    assert builds == [True] and model.vitlab_spec == ModelSpec(config=cfg)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        import vitlab as again

        assert "build_model" not in again.__all__  # `from vitlab import *` stays quiet


def test_the_internal_duplicates_are_gone():
    import vitlab.checkpoint as checkpoint
    import vitlab.train.run_model as run_model

    for module, name in ((checkpoint, "build_vitlab"), (checkpoint, "create_timm"), (run_model, "create_for_run")):
        assert not hasattr(module, name), name
    assert not hasattr(run_model, "RunModel")


def test_what_create_model_cannot_build_is_one_clear_error():
    with pytest.raises(ConfigError, match="pass a preset name"):
        vitlab.create_model(42)
    with pytest.raises(ConfigError, match="did you mean vit_mnist"):
        vitlab.create_model("vit_mnst")
    with pytest.raises(ConfigError, match="timm has no model"):
        vitlab.create_model("timm:vit_tiny_patch16_2240")
    with pytest.raises(ConfigError, match="no drop_path_rule"):
        vitlab.create_model("timm:vit_tiny_patch16_224", drop_path_rule="linear")
    with pytest.raises(CheckpointError, match="vitlab.create_model"):
        spec_of(torch.nn.Linear(2, 2))
