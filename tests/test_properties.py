"""Property tests (hypothesis): configuration validation and the parsers of untrusted files.

Every property has the same shape: whatever the input, the code either works (a model that runs at that size,
a config whose values are usable, a parsed file) or raises the one vitlab error type for that input, never
another exception. Examples are few and sizes tiny so the file runs in seconds; ``derandomize`` keeps CI stable.
"""

from __future__ import annotations

import io
import json
import math
import typing
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from vitlab import ConfigError, create_model, get_config
from vitlab.errors import CheckpointError, DataError
from vitlab.models import ModelConfig
from vitlab.models.config import ARCHS, ATTNS, BLOCKS, DROP_RATE_AT, POOLS, REG_POSITIONS, ROPE_LAYOUTS, STEMS
from vitlab.train.config import LIMITS, RunConfig, load_yaml

FAST = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
CHEAP = settings(FAST, max_examples=200)

TINY = dict(img_size=8, patch_size=4, in_chans=1, num_classes=3, embed_dim=8, depth=1, num_heads=2)

CHOICES = {"arch": ARCHS, "attn": ATTNS, "gate": ("none", "layerscale", "rezero", "skipinit", "scalar"),
           "norm": ("layernorm", "rmsnorm"), "mlp": ("gelu", "swiglu"),
           "pos_embed": ("learned", "sincos1d", "sincos2d", "none"), "global_pool": POOLS, "stem": STEMS,
           "reg_position": REG_POSITIONS, "reattn_norm": ("batch", "layer"), "drop_path_rule": ("linear", "uniform"),
           "weight_init": ("trunc_normal", "xavier"), "rope_layout": ROPE_LAYOUTS, "block": BLOCKS,
           "drop_rate_at": DROP_RATE_AT}
INTS = ("img_size", "patch_size", "in_chans", "num_classes", "embed_dim", "depth", "num_heads", "reg_tokens",
        "depth_token_only", "reattn_last", "stem_chans")
BOOLS = ("qkv_bias", "qk_norm", "reattn_scale", "rope", "class_token", "pos_embed_cls", "fc_norm", "dynamic_img_size",
         "dynamic_img_pad", "pos_resample_antialias", "scale_attn_norm", "scale_mlp_norm", "sigma_reparam")
FLOATS = ("mlp_ratio", "rope_theta", "reg_rope_theta", "init_values", "drop_rate", "attn_drop_rate",
          "drop_path_rate", "mlp_ratio_token_only", "token_init_std")
OPTIONAL = ("reattn_last", "fc_norm", "init_values", "token_init_std")


def test_the_tables_cover_every_field() -> None:
    assert set(CHOICES) | set(INTS) | set(BOOLS) | set(FLOATS) | {"name"} == set(ModelConfig.field_names())


# ------------------------------------------------------------------------------------ model configs

OPTION_VALUES = {
    "img_size": st.sampled_from([4, 6, 8, 12, 7, 0, -8]),
    "patch_size": st.sampled_from([1, 2, 3, 4, 0]),
    "in_chans": st.sampled_from([1, 3, 0]),
    "num_classes": st.sampled_from([0, 1, 3, -1]),
    "embed_dim": st.sampled_from([4, 6, 8, 12, 16, 0]),
    "depth": st.sampled_from([0, 1, 2]),
    "num_heads": st.sampled_from([1, 2, 3, 4, 0, -2]),
    "mlp_ratio": st.sampled_from([0.5, 1.0, 2.0, 0.0, -1.0, 0.01]),
    "qkv_bias": st.booleans(), "qk_norm": st.booleans(),
    "attn": st.sampled_from(ATTNS), "reattn_last": st.sampled_from([None, 0, 1, 5, -1]),
    "reattn_norm": st.sampled_from(["batch", "layer"]), "reattn_scale": st.booleans(),
    "rope": st.booleans(), "rope_theta": st.sampled_from([10000.0, 100.0, 0.0, -1.0]),
    "gate": st.sampled_from(CHOICES["gate"]), "init_values": st.sampled_from([None, 1e-5, 0.1, 0.0]),
    "norm": st.sampled_from(["layernorm", "rmsnorm"]), "mlp": st.sampled_from(["gelu", "swiglu"]),
    "class_token": st.booleans(), "reg_tokens": st.sampled_from([0, 1, 2, -1]),
    "reg_position": st.sampled_from(REG_POSITIONS), "pos_embed": st.sampled_from(CHOICES["pos_embed"]),
    "pos_embed_cls": st.booleans(), "global_pool": st.sampled_from(POOLS),
    "fc_norm": st.sampled_from([None, True, False]), "stem": st.sampled_from(STEMS),
    "stem_chans": st.sampled_from([4, 8, 0]),
    "weight_init": st.sampled_from(["trunc_normal", "xavier", "jax"]),
    "drop_rate": st.sampled_from([0.0, 0.1, 1.0, -0.1]), "drop_path_rate": st.sampled_from([0.0, 0.2, 1.5]),
    "depth_token_only": st.sampled_from([0, 1, 2, -1]), "mlp_ratio_token_only": st.sampled_from([1.0, 0.0]),
    "block": st.sampled_from(BLOCKS), "scale_attn_norm": st.booleans(), "scale_mlp_norm": st.booleans(),
    "sigma_reparam": st.booleans(),
}
CAIT = dict(arch="cait", attn="talking_heads", gate="layerscale", pos_embed_cls=False)


@st.composite
def model_options(draw: st.DrawFn) -> dict:
    """Tiny ViT or CaiT architectures with up to six options changed, valid or not: zero/negative sizes, sizes
    that do not divide, every option and combination."""
    base = draw(st.sampled_from([{}, CAIT]))
    keys = draw(st.lists(st.sampled_from(sorted(OPTION_VALUES)), unique=True, max_size=6))
    return {**base, **{k: draw(OPTION_VALUES[k], label=k) for k in keys}}


@FAST
@given(options=model_options())
def test_a_config_builds_a_working_model_or_raises_config_error(options: dict) -> None:
    try:
        cfg = get_config("vit_mnist", **{**TINY, **options})
    except ConfigError as exc:
        assert str(exc) and "\n" not in str(exc)
        event("refused")
        return
    event(f"built {cfg.arch}")
    model = create_model(cfg).eval()
    x = torch.randn(2, cfg.in_chans, cfg.img_size, cfg.img_size)
    with torch.no_grad():
        out = model(x)
        maps = model.attention_maps(x)
    assert out.shape == (2, cfg.num_classes or cfg.embed_dim) and torch.isfinite(out).all()
    blocks = cfg.depth + (cfg.depth_token_only if cfg.arch == "cait" else 0)
    assert len(maps) == blocks
    for a in maps:
        assert a.shape[:2] == (2, cfg.num_heads) and torch.isfinite(a).all()


@CHEAP
@given(img=st.integers(-4, 20), patch=st.integers(-2, 9), dim=st.integers(-4, 24), heads=st.integers(-2, 9),
       depth=st.integers(-1, 3))
def test_size_validation_matches_the_arithmetic(img: int, patch: int, dim: int, heads: int, depth: int) -> None:
    """Accepted exactly when every size is positive, the patch divides the image and the heads divide the dim."""
    valid = min(img, patch, dim, heads, depth) > 0 and img % patch == 0 and dim % heads == 0
    options = dict(TINY, img_size=img, patch_size=patch, embed_dim=dim, num_heads=heads, depth=depth)
    if valid:
        cfg = get_config("vit_mnist", **options)
        assert (cfg.img_size, cfg.patch_size, cfg.embed_dim, cfg.num_heads) == (img, patch, dim, heads)
    else:
        with pytest.raises(ConfigError) as info:
            get_config("vit_mnist", **options)
        assert "\n" not in str(info.value)


def junk_for(field: str) -> st.SearchStrategy:
    """Values of the wrong type (or non-finite) for ``field``."""
    anything = st.one_of(st.text(max_size=4), st.lists(st.integers(), max_size=2),
                         st.dictionaries(st.text(), st.none()))
    none = st.nothing() if field in OPTIONAL else st.none()
    if field in CHOICES:
        return st.one_of(st.text(max_size=8).filter(lambda v: v not in CHOICES[field]), st.integers(), st.none())
    if field in INTS:
        return st.one_of(anything, none, st.booleans(),
                         st.floats(allow_nan=True, allow_infinity=True).filter(lambda v: not float(v).is_integer()))
    if field in BOOLS:
        return st.one_of(anything, none, st.integers(), st.floats(allow_nan=True))
    return st.one_of(anything, none, st.booleans(), st.sampled_from([math.nan, math.inf, -math.inf]))


@CHEAP
@given(data=st.data(), field=st.sampled_from(sorted(set(ModelConfig.field_names()) - {"name"})))
def test_a_value_of_the_wrong_type_raises_config_error(data: st.DataObject, field: str) -> None:
    value = data.draw(junk_for(field), label=field)
    with pytest.raises(ConfigError) as info:
        get_config("vit_mnist", **{**TINY, field: value})
    assert field in str(info.value) and "\n" not in str(info.value)


@CHEAP
@given(key=st.text(min_size=1, max_size=12).filter(lambda k: k not in ModelConfig.field_names()))
def test_an_unknown_option_raises_config_error(key: str) -> None:
    with pytest.raises(ConfigError, match="unknown model option"):
        get_config("vit_mnist", **{key: 1})


@FAST
@given(options=model_options())
def test_an_accepted_config_survives_the_json_round_trip(options: dict) -> None:
    """Checkpoints store ``to_dict()`` as JSON; reading it back must give the same architecture."""
    try:
        cfg = get_config("vit_mnist", **{**TINY, **options})
    except ConfigError:
        return
    assert ModelConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


# -------------------------------------------------------------------------------------- run configs

RUN_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-3, 300), st.floats(allow_nan=True, allow_infinity=True),
                       st.text(max_size=4), st.lists(st.one_of(st.floats(-2, 3), st.just(math.nan)), max_size=3))


@CHEAP
@given(changes=st.dictionaries(st.sampled_from(RunConfig.field_names()), RUN_VALUES, max_size=4),
       num_train=st.integers(1, 200_000))
def test_a_run_config_is_usable_or_raises_config_error(changes: dict, num_train: int) -> None:
    try:
        cfg = RunConfig.from_dict(changes, "test").resolve(num_train)
    except ConfigError as exc:
        assert "\n" not in str(exc)
        return
    for key in ("epochs", "batch_size", "eval_batch_size"):
        value = getattr(cfg, key)
        assert isinstance(value, int) and not isinstance(value, bool) and value > 0
    for key in ("lr", "min_lr", "weight_decay", "warmup_epochs", "label_smoothing", "clip_grad", "drop_path",
                "ema_decay", "degrees", "shear", "translate", "erase_prob", "mixup", "cutmix"):
        value = getattr(cfg, key)
        assert isinstance(value, int | float) and not isinstance(value, bool), (key, value)
        assert math.isfinite(value) and value >= 0, (key, value)
    assert cfg.lr > 0 and 0 < cfg.scale[0] <= cfg.scale[1] and math.isfinite(cfg.scale[1])
    assert 0 <= cfg.label_smoothing < 1 and 0 <= cfg.drop_path < 1
    for key, (low, high, _, _) in LIMITS.items():  # every number within the range a run can work with
        values = getattr(cfg, key)
        assert all(low(v) and high(v) for v in (values if isinstance(values, tuple) else (values,)) if v is not None)


def _outside(key: str) -> st.SearchStrategy:
    """Finite numbers, most of them outside ``LIMITS[key]``; floats for float fields, integers for int fields."""
    kind = typing.get_type_hints(RunConfig).get(key)
    if kind is int or int in typing.get_args(kind):  # every int field, new ones included
        return st.one_of(st.integers(-10**12, 10**12), st.sampled_from([0, -1, 100_001, 1_000_001, 4097, 1025]))
    return st.one_of(st.floats(-1e300, 1e300, allow_nan=False), st.sampled_from([3e38, 0.0, -1e-9, 10.0, 180.5, 90.0,
                                                                                 1.0, 100.5, 1.5]))


@CHEAP
@given(data=st.data(), key=st.sampled_from(sorted(LIMITS)), flags=st.booleans())
def test_a_number_out_of_range_is_refused_up_front_naming_the_range(data: st.DataObject, key: str,
                                                                    flags: bool) -> None:
    """``--lr 3e38`` and every other number beyond what a run can work with: one line naming the allowed range,
    before any data is loaded (``RunConfig.validate``, which ``vitlab.train.engine.train`` calls first)."""
    value = data.draw(_outside(key))
    low, high, interval, _ = LIMITS[key]
    option = (min(value, 10.0), value) if key == "scale" else value  # scale: the high end out of range
    try:
        cfg = RunConfig().replace(**{key: option}) if flags else RunConfig.from_dict({key: option}, "x.yaml")
        cfg.validate()
    except ConfigError as exc:
        assert not (low(value) and high(value)) or (key == "scale" and option[0] > option[1]), (key, value)
        if not key == "scale" or option[0] <= option[1]:
            assert f"{key} must be in {interval}, got " in str(exc) and "\n" not in str(exc)
        return
    assert low(value) and high(value), (key, value)


RUN_FLOATS = ("lr", "min_lr", "weight_decay", "warmup_epochs", "label_smoothing", "clip_grad", "drop_path",
              "ema_decay", "degrees", "shear", "translate", "erase_prob", "mixup", "cutmix")
RUN_INTS = ("epochs", "batch_size", "eval_batch_size", "limit_train", "limit_test", "threads", "seed", "pad_crop",
            "checkpoint_every")


@FAST
@given(field=st.sampled_from(RUN_FLOATS + RUN_INTS + ("scale",)),
       value=st.sampled_from([math.nan, math.inf, -math.inf]), flags=st.booleans())
def test_a_non_finite_run_option_raises_config_error(field: str, value: float, flags: bool) -> None:
    """NaN or infinite numbers never reach the trainer, from YAML (``.nan``) or flags (``--lr nan``)."""
    bad = [1.0, value] if field == "scale" else value
    with pytest.raises(ConfigError) as info:
        if flags:
            RunConfig().replace(**{field: bad}).resolve(4000)
        else:
            RunConfig.from_dict({field: bad}, "config file x.yaml").resolve(4000)
    assert field in str(info.value) and "\n" not in str(info.value)


@CHEAP
@given(text=st.text(max_size=60))
def test_any_yaml_text_loads_or_raises_config_error(tmp_path_factory: pytest.TempPathFactory, text: str) -> None:
    path = tmp_path_factory.mktemp("yaml") / "run.yaml"
    path.write_text(text)
    try:
        options = load_yaml(path)
    except ConfigError as exc:
        assert "\n" not in str(exc)
        return
    assert set(options) <= set(RunConfig.field_names())


# ---------------------------------------------------------------------------------- untrusted files

def _file(tmp_path_factory: pytest.TempPathFactory, name: str, data: bytes) -> Path:
    path = tmp_path_factory.mktemp("f") / name
    path.write_bytes(data)
    return path


IDX_HEADER = st.sampled_from([b"\x00\x00\x08\x03\x00\x00\x00\x02\x00\x00\x00\x03\x00\x00\x00\x03",
                              b"\x00\x00\x08\x01\x00\x00\x00\x05", b"\x1f\x8b", b""])


@CHEAP
@given(head=IDX_HEADER, body=st.binary(max_size=64))
def test_idx_reader_parses_or_raises_data_error(tmp_path_factory: pytest.TempPathFactory, head: bytes,
                                                body: bytes) -> None:
    from vitlab.data import read_idx

    path = _file(tmp_path_factory, "x-idx3-ubyte", head + body)
    try:
        array = read_idx(path)
    except DataError as exc:
        assert str(path) in str(exc) and "\n" not in str(exc)
        return
    dims = (head + body)[3]
    assert array.ndim == dims and array.size * array.itemsize + 4 + 4 * dims == len(head + body)


@FAST
@given(data=st.binary(max_size=200), prefix=st.sampled_from([b"", b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"GIF89a"]))
def test_image_loader_reads_or_raises_data_error(tmp_path_factory: pytest.TempPathFactory, data: bytes,
                                                 prefix: bytes) -> None:
    from vitlab.data import load_image

    path = _file(tmp_path_factory, "img.png", prefix + data)
    try:
        image = load_image(path, img_size=8, in_chans=1)
    except DataError as exc:
        assert "\n" not in str(exc)
        return
    assert image.shape == (1, 8, 8) and image.dtype == torch.uint8


def _good_state_bytes(legacy: bool) -> bytes:
    buf = io.BytesIO()
    torch.save({"model": {"w": torch.arange(6.0)}, "progress": {"epoch": 1}}, buf,
               _use_new_zipfile_serialization=not legacy)
    return buf.getvalue()


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
@FAST
@given(legacy=st.booleans(), cut=st.integers(0, 10_000),
       flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=6))
def test_damaged_state_file_loads_or_raises_checkpoint_error(tmp_path_factory: pytest.TempPathFactory, legacy: bool,
                                                            cut: int, flips: list[tuple[int, int]]) -> None:
    from vitlab.checkpoint import load_train_state
    from vitlab.interop import read_weights

    data = bytearray(_good_state_bytes(legacy))
    data = data[:cut % (len(data) + 1)]
    for pos, byte in flips:
        if data:
            data[pos % len(data)] = byte
    path = _file(tmp_path_factory, "state.pt", bytes(data))
    for load in (lambda: load_train_state(path.parent), lambda: read_weights(path.with_name("state.pt"))):
        try:
            load()
        except CheckpointError as exc:
            assert "\n" not in str(exc)


@FAST
@given(cut=st.one_of(st.none(), st.integers(0, 4000)),
       flips=st.lists(st.tuples(st.integers(0, 4000), st.integers(0, 255)), max_size=6))
def test_damaged_checkpoint_loads_or_raises_checkpoint_error(tmp_path_factory: pytest.TempPathFactory,
                                                             cut: int | None, flips: list[tuple[int, int]]) -> None:
    from vitlab import create_model
    from vitlab.checkpoint import load_model, save_checkpoint

    out = tmp_path_factory.mktemp("ck")
    save_checkpoint(out, create_model("vit_mnist", **{**TINY, "num_classes": 10}))
    original = (out / "model.safetensors").read_bytes()
    data = bytearray(original)
    if cut is not None:
        data = data[:cut % (len(data) + 1)]
    for pos, byte in flips:
        if data:
            data[pos % len(data)] = byte
    (out / "model.safetensors").write_bytes(bytes(data))
    try:
        model = load_model(out)
    except CheckpointError as exc:
        assert "\n" not in str(exc)
        return
    assert bytes(data) == original  # any change is refused: by the parser or by the manifest's SHA-256
    assert model.cfg.embed_dim == TINY["embed_dim"]
