"""timm's factory contract for a keyword no model has: ``timm.create_model(name, bogus=1)`` raises ``TypeError``, as a
Python call with an unexpected keyword does. vitlab's error for it, :class:`~vitlab.errors.UnknownOptionError`, is a
``TypeError`` and a :class:`~vitlab.errors.ConfigError` (so a ``ValueError``, one line in the CLI, exit 2); a bad value
of a known option stays a ``ConfigError`` that is no ``TypeError``."""

from __future__ import annotations

import pytest
import timm

import vitlab
from _helpers import cli_error
from vitlab.errors import ConfigError, UnknownOptionError
from vitlab.models import PRESETS
from vitlab.models.registry import get_config

vitlab.register_timm()
TIMM_NAMES = timm.list_models("vitlab_*")


def unknown_option(fn, *args, **kwargs) -> str:
    """Call ``fn``; assert it raised one error that every caller's ``except`` finds; return its one-line message."""
    with pytest.raises(TypeError) as info:
        fn(*args, **kwargs)
    err = info.value
    assert isinstance(err, UnknownOptionError) and isinstance(err, ConfigError) and isinstance(err, ValueError)
    msg = str(err)
    assert msg and "\n" not in msg
    return msg


def test_every_preset_is_registered() -> None:
    assert sorted(TIMM_NAMES) == sorted(f"vitlab_{p}" for p in PRESETS) and len(TIMM_NAMES) == len(PRESETS)


@pytest.mark.parametrize("name", TIMM_NAMES)
def test_timm_create_model_raises_type_error_for_an_unknown_keyword(name: str) -> None:
    msg = unknown_option(timm.create_model, name, not_a_model_arg=1)
    assert "unknown model option 'not_a_model_arg'" in msg and "valid options:" in msg
    assert "'not_a_model_arg'" in unknown_option(timm.create_model, f"vitlab.{name.removeprefix('vitlab_')}",
                                                 not_a_model_arg=1)


def test_every_road_to_a_config_raises_it() -> None:
    hint = "unknown model option 'dept' (did you mean depth?)"
    assert hint in unknown_option(vitlab.create_model, "vit_mnist", dept=4)
    assert hint in unknown_option(get_config, "vit_mnist", dept=4)
    assert hint in unknown_option(vitlab.ModelConfig().replace, dept=4)
    assert hint in unknown_option(vitlab.ModelConfig.from_dict, {"dept": 4})
    assert hint in unknown_option(vitlab.create_model, vitlab.ModelConfig(), dept=4)
    assert hint in unknown_option(vitlab.create_model, "timm:vitlab_vit_mnist", dept=4)
    msg = unknown_option(vitlab.create_model, "timm:vit_tiny_patch16_224", not_a_model_arg=1)
    assert "does not accept these options" in msg and "'not_a_model_arg'" in msg


@pytest.mark.parametrize("overrides", [dict(gate="layerscal"), dict(depth="8"), dict(depth=2.5), dict(img_size=30),
                                       dict(qkv_bias="yes")])
def test_a_bad_value_of_a_known_option_stays_a_value_error(overrides: dict) -> None:
    for fn, name in ((timm.create_model, "vitlab_vit_mnist"), (vitlab.create_model, "vit_mnist")):
        with pytest.raises(ConfigError) as info:
            fn(name, **overrides)
        assert isinstance(info.value, ValueError) and not isinstance(info.value, TypeError)


def test_cli_prints_one_line_for_an_unknown_model_option(capsys, tmp_path) -> None:
    out = tmp_path / "o"
    msg = cli_error(capsys, ["train", "--model", "vit_mnist", "--set", "not_a_model_arg=1", "--output", str(out)])
    assert msg.startswith("unknown model option 'not_a_model_arg'")
    yaml_file = tmp_path / "run.yaml"
    yaml_file.write_text("model: vit_mnist\nmodel_overrides: {dept: 3}\n")
    msg = cli_error(capsys, ["train", "--config", str(yaml_file), "--output", str(out)])
    assert "unknown model option 'dept' (did you mean depth?)" in msg
    msg = cli_error(capsys, ["train", "--model", "timm:vit_tiny_patch16_224", "--set", "not_a_model_arg=1",
                             "--output", str(out)])
    assert "does not accept these options" in msg
    assert not out.exists()  # refused before anything was written
