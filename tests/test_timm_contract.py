"""timm's contract for vitlab models, with timm's own ViT and CaiT as the oracle: the index semantics of
``forward_intermediates`` / ``get_intermediate_layers`` / ``prune_intermediate_layers``, ``features_only`` feature
extractors with ``feature_info``, and the ``device=`` / ``dtype=`` construction arguments, for every ``vitlab_*``
model registered with timm."""

from __future__ import annotations

import pytest
import timm
import torch
from timm.models._features import FeatureGetterNet
from torch import nn

import vitlab
from _helpers import perturb
from vitlab.errors import ConfigError

SMALL = dict(img_size=32, patch_size=8, embed_dim=32, depth=4, num_heads=4, num_classes=5)
TIMM_SMALL = dict(img_size=32, patch_size=8, embed_dim=32, depth=4, num_heads=4, num_classes=5)

# index arguments timm accepts: None (all), int n (the last n), sequences (unsorted, repeated, negative)
GOOD_INDICES = [None, 1, 3, 4, [0], [2, 0], [-1, -1], [0, -1], [3, 1, 3], [-4, 3], (1, 2), [1, -3, 2]]
BAD_INDICES = [0, 5, -1, [4], [-5], [0, 4], []]


def pair(name: str, **kwargs) -> tuple[vitlab.VitlabModel, nn.Module]:
    """A vitlab model with moved weights and timm's own model holding the same weights."""
    model = perturb(vitlab.create_model(name, **{**SMALL, **kwargs})).eval()
    return model, vitlab.to_timm(model).eval()


def assert_close_nested(a, b) -> None:
    if isinstance(a, list | tuple):
        assert type(a) is type(b) and len(a) == len(b), (type(a), type(b), len(a), len(b))
        for u, v in zip(a, b):
            assert_close_nested(u, v)
    else:
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------------------------------- index semantics

@pytest.mark.parametrize("name,kwargs", [("vit_tiny", {}), ("vit_tiny", dict(reg_tokens=2)), ("cait_xxs24", {})])
def test_forward_intermediates_index_semantics_match_timm(name: str, kwargs: dict) -> None:
    """Unsorted indices come back in block order and repeated ones once, as timm's blocks append their output."""
    model, tm = pair(name, **kwargs)
    x = torch.randn(2, 3, 32, 32)
    for indices in GOOD_INDICES:
        for args in (dict(intermediates_only=True), dict(output_fmt="NLC", norm=True), dict(stop_early=True)):
            with torch.no_grad():
                ours, theirs = (m.forward_intermediates(x, indices=indices, **args) for m in (model, tm))
            if not args.get("intermediates_only"):
                ours, theirs = ours[1], theirs[1]
            assert len(ours) == len(theirs), (indices, args)
            assert_close_nested(ours, theirs)


def test_get_intermediate_layers_matches_timm() -> None:
    model, tm = pair("vit_tiny", reg_tokens=1)
    x = torch.randn(2, 3, 32, 32)
    for n in GOOD_INDICES[1:]:
        for args in (dict(), dict(reshape=True, norm=True), dict(return_prefix_tokens=True)):
            with torch.no_grad():
                ours, theirs = (m.get_intermediate_layers(x, n, **args) for m in (model, tm))
            assert_close_nested(ours, theirs)


@pytest.mark.parametrize("name", ["vit_tiny", "cait_xxs24"])
def test_prune_intermediate_layers_returns_what_timm_returns(name: str) -> None:
    for indices in GOOD_INDICES:
        model, tm = pair(name)
        assert model.prune_intermediate_layers(indices) == tm.prune_intermediate_layers(indices), indices
        assert len(model.blocks) == len(tm.blocks)


@pytest.mark.parametrize("indices", BAD_INDICES, ids=str)
def test_out_of_range_indices_are_refused_as_timm_refuses_them(indices) -> None:
    model, tm = pair("vit_tiny")
    x = torch.randn(1, 3, 32, 32)
    with pytest.raises((AssertionError, ValueError)):
        tm.forward_intermediates(x, indices=indices)
    with pytest.raises(ConfigError, match="out of range|use 1 to 4"):
        model.forward_intermediates(x, indices=indices)
    with pytest.raises(ConfigError):
        model.prune_intermediate_layers(indices)
    assert len(model.blocks) == 4 and not any(b._forward_hooks for b in model.blocks)


# ------------------------------------------------------------------------------------------- features_only

def narrow(name: str) -> dict:
    """Overrides that make preset ``name`` small: img 32, patch 8, depth 3, head dim 16 (its layout kept)."""
    return dict(img_size=32, patch_size=8, depth=3, embed_dim=16 * vitlab.get_config(name).num_heads)


TIMM_TWINS = {  # a vitlab preset and timm's own model of that architecture, built alike
    "vit_tiny": ("vit_tiny_patch16_224", dict(img_size=32, patch_size=8, depth=4, embed_dim=48, num_heads=3)),
    "cait_xxs24": ("cait_xxs24_224", dict(img_size=32, patch_size=8, depth=4, embed_dim=48, num_heads=4)),
}


@pytest.mark.parametrize("preset", list(TIMM_TWINS))
@pytest.mark.parametrize("out_indices", [None, (0, 2), 2, (-1,), [3, 0]], ids=str)
def test_features_only_matches_timms_own_model(preset: str, out_indices) -> None:
    """timm.create_model(..., features_only=True) returns the same kind of extractor as for timm's ViT / CaiT: the
    same feature_info, the same blocks kept, and the same features on the same weights."""
    name, kwargs = TIMM_TWINS[preset]
    kw = dict(features_only=True, **kwargs, **({} if out_indices is None else dict(out_indices=out_indices)))
    ours, theirs = timm.create_model(f"vitlab_{preset}", **kw).eval(), timm.create_model(name, **kw).eval()
    assert isinstance(ours, FeatureGetterNet) and type(ours) is type(theirs)
    assert ours.out_indices == theirs.out_indices
    for what in ("channels", "reduction", "module_name"):
        assert getattr(ours.feature_info, what)() == getattr(theirs.feature_info, what)(), what
    assert len(ours.model.blocks) == len(theirs.model.blocks)
    full = perturb(vitlab.create_model(preset, **kwargs))  # one set of weights, in vitlab's and in timm's names
    for extractor, weights in ((ours, full), (theirs, vitlab.to_timm(full))):
        assert extractor.model.load_state_dict(weights.state_dict(), strict=False).missing_keys == []
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert_close_nested(ours(x), theirs(x))
    assert "num_classes" not in ours.pretrained_cfg and ours.pretrained_cfg["input_size"] == (3, 32, 32)


@pytest.mark.parametrize("name", timm.list_models("vitlab_*"))
def test_every_registered_model_has_a_feature_extractor(name: str) -> None:
    preset = name.removeprefix("vitlab_")
    kw = narrow(preset)
    feats = timm.create_model(name, features_only=True, **kw).eval()
    info = feats.feature_info
    assert info.module_name() == [f"blocks.{i}" for i in (0, 1, 2)]
    in_chans = vitlab.get_config(preset).in_chans
    x = torch.randn(2, in_chans, 32, 32)
    with torch.no_grad():
        out = feats(x)
    want = [(2, c, 32 // r, 32 // r) for c, r in zip(info.channels(), info.reduction(), strict=True)]
    assert [tuple(t.shape) for t in out] == want
    one = timm.create_model(f"vitlab.{preset}", features_only=True, out_indices=(0,), **kw).eval()
    assert len(one.model.blocks) == 1 and one.feature_info.channels() == [kw["embed_dim"]]
    one.model.load_state_dict(feats.model.state_dict(), strict=False)  # block 0 and the embeddings
    with torch.no_grad():
        full = feats.model.forward_intermediates(x, indices=[0], intermediates_only=True)
        torch.testing.assert_close(one(x)[0], full[0])


def test_features_only_errors_name_the_fix() -> None:
    with pytest.raises(ConfigError, match="unknown feature_cls 'nope'"):
        timm.create_model("vitlab_vit_mnist", features_only=True, feature_cls="nope")
    with pytest.raises((ConfigError, AssertionError), match="out of range"):
        timm.create_model("vitlab_vit_mnist", features_only=True, out_indices=(0, 8))


# ------------------------------------------------------------------------------------------- device= / dtype=

def placements(model: nn.Module) -> set[tuple[str, torch.dtype]]:
    return {(t.device.type, t.dtype) for t in model.state_dict().values() if t.is_floating_point()}


@pytest.mark.parametrize("name", timm.list_models("vitlab_*"))
def test_device_and_dtype_construction_arguments(name: str) -> None:
    """timm 1.0 passes device= and dtype= to every model: the model is created there, in that dtype."""
    preset = name.removeprefix("vitlab_")
    kw = narrow(preset)
    meta = timm.create_model(name, device="meta", dtype=torch.bfloat16, **kw)
    assert placements(meta) == {("meta", torch.bfloat16)}
    assert placements(timm.create_model(name, device=torch.device("meta"), **kw)) == {("meta", torch.float32)}
    ref = timm.create_model(name, **kw).eval()
    f64 = timm.create_model(f"vitlab.{preset}", device="cpu", dtype=torch.float64, **kw).eval()
    assert placements(f64) == {("cpu", torch.float64)}
    f64.load_state_dict(ref.state_dict())
    x = torch.randn(2, vitlab.get_config(preset).in_chans, 32, 32)
    with torch.no_grad():
        out = f64(x.double())
        assert out.dtype == torch.float64
        torch.testing.assert_close(out.float(), ref(x), rtol=1e-4, atol=1e-4)
        bf16 = timm.create_model(name, dtype=torch.bfloat16, **kw).eval()
        assert bf16(x.bfloat16()).dtype == torch.bfloat16


def test_vitlab_create_model_takes_device_and_dtype() -> None:
    meta = vitlab.create_model("vit_mnist", device="meta", dtype="bfloat16")
    assert placements(meta) == {("meta", torch.bfloat16)}
    assert meta.vitlab_spec == vitlab.create_model("vit_mnist").vitlab_spec  # placement is not part of the spec
    assert placements(vitlab.create_model("cait_xxs24", dtype=torch.float64, **narrow("cait_xxs24"))) == {
        ("cpu", torch.float64)}
    with pytest.raises(ConfigError, match="floating-point torch dtype"):
        vitlab.create_model("vit_mnist", dtype=torch.int8)
    with pytest.raises(ConfigError, match="floating-point torch dtype"):
        timm.create_model("vitlab_vit_mnist", dtype="float3")
    with pytest.raises(ConfigError, match="torch device"):
        vitlab.create_model("vit_mnist", device="gpu7")
