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
from vitlab.errors import ConfigError

SMALL = dict(img_size=32, patch_size=8, embed_dim=32, depth=4, num_heads=4, num_classes=5)
TIMM_SMALL = dict(img_size=32, patch_size=8, embed_dim=32, depth=4, num_heads=4, num_classes=5)

# index arguments timm accepts: None (all), int n (the last n), sequences (unsorted, repeated, negative)
GOOD_INDICES = [None, 1, 3, 4, [0], [2, 0], [-1, -1], [0, -1], [3, 1, 3], [-4, 3], (1, 2), [1, -3, 2]]
BAD_INDICES = [0, 5, -1, [4], [-5], [0, 4], []]


def perturb(model: nn.Module, scale: float = 0.2) -> nn.Module:
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * scale)
    return model


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
                assert_close_nested(model.get_intermediate_layers(x, n, **args), tm.get_intermediate_layers(x, n, **args))


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
