"""torch.fx symbolic tracing of every preset registered with timm: plain ``torch.fx.symbolic_trace``, torchvision's
and timm's FX feature extraction, forward and backward, as timm's own ``VisionTransformer`` traces (timm's
tests/test_models.py ``test_model_forward_fx`` / ``test_model_backward_fx``)."""

from __future__ import annotations

import copy
import operator

import pytest
import timm
import torch
import torch.nn.functional as F
from timm.layers import get_notrace_functions, get_notrace_modules
from timm.models import FeatureGraphNet
from torch import nn
from torchvision.models.feature_extraction import create_feature_extractor, get_graph_node_names

import vitlab
from vitlab.errors import ConfigError
from vitlab.interop.timm_registry import PREFIX
from vitlab.models import PRESETS

# timm's tracer arguments (tests/test_models.py ``_create_fx_model``)
TIMM_TRACER = dict(leaf_modules=get_notrace_modules(), autowrap_functions=get_notrace_functions(),
                   param_shapes_constant=True)


def small_kwargs(preset: str) -> dict:
    """The preset at two blocks, a small image, 10 classes and the widest presets (768 and more) at 16 channels a
    head: what a graph holds depends on the kinds of layers, not on their number or width."""
    cfg = PRESETS[preset]
    kwargs = dict(depth=2, num_classes=10)
    if not cfg.get("img_size"):
        kwargs["img_size"] = 32
    if cfg["embed_dim"] >= 768:
        kwargs["embed_dim"] = 16 * cfg["num_heads"]
    return kwargs


@pytest.fixture(scope="module")
def built() -> dict[tuple, nn.Module]:
    return {}


def make(built: dict, preset: str, **kwargs) -> nn.Module:
    """``timm.create_model('vitlab_<preset>')`` made small (:func:`small_kwargs`), built once per module."""
    kwargs = {**small_kwargs(preset), **kwargs}
    key = (preset, tuple(sorted(kwargs.items())))
    if key not in built:
        torch.manual_seed(0)
        built[key] = timm.create_model(PREFIX + preset, **kwargs)
    return copy.deepcopy(built[key])


def images(model: nn.Module, batch: int = 2, size: tuple[int, int] | None = None) -> torch.Tensor:
    h, w = size or (model.cfg.img_size, model.cfg.img_size)
    return torch.randn(batch, model.cfg.in_chans, h, w)


def grads(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_close(actual: torch.Tensor, expected: torch.Tensor, msg: str | None = None) -> None:
    """Equal up to float rounding: the traced graph takes the fused attention kernel where eager may take the
    explicit matmuls (a per-call choice), so sums agree to rounding relative to their scale."""
    scale = max(1.0, expected.abs().max().item())
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5 * scale, msg=msg)


def run_backward(fn, x: torch.Tensor, cotangent: torch.Tensor, model: nn.Module) -> tuple:
    """Output, input gradient and parameter gradients of ``fn(x)`` against ``cotangent``."""
    model.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_(True)
    torch.manual_seed(1)  # the same draws for eager and traced (dropout, drop-path)
    out = fn(x)
    out.backward(cotangent)
    return out.detach(), x.grad, grads(model)


def assert_same_backward(model: nn.Module, traced: nn.Module, x: torch.Tensor, unwrap=lambda y: y) -> None:
    cot = torch.randn_like(model(x))
    out, gx, gp = run_backward(model, x, cot, model)
    out_t, gx_t, gp_t = run_backward(lambda i: unwrap(traced(i)), x, cot, model)
    assert_close(out_t, out)
    assert_close(gx_t, gx)
    assert gp_t.keys() == gp.keys() == {n for n, p in model.named_parameters() if p.requires_grad}
    for name in gp:
        assert_close(gp_t[name], gp[name], msg=name)


def test_every_vitlab_model_registered_with_timm_is_covered() -> None:
    assert set(timm.list_models(PREFIX + "*")) == {PREFIX + p for p in vitlab.list_models()}


@pytest.mark.parametrize("preset", vitlab.list_models())
def test_symbolic_trace_forward_and_backward_match_eager(built: dict, preset: str) -> None:
    model = make(built, preset).eval()
    traced = torch.fx.symbolic_trace(model)
    x = images(model)
    with torch.no_grad():
        assert_close(traced(x), model(x))
    assert_same_backward(model, traced, x)


@pytest.mark.parametrize("preset", vitlab.list_models())
def test_timm_fx_extractor_in_train_mode_matches_eager(built: dict, preset: str) -> None:
    """timm's ``test_model_backward_fx``: torchvision's extractor with timm's tracer, train mode, every parameter
    gets a gradient; here also equal to eager's (the same random draws: dropout and drop-path on)."""
    model = make(built, preset, drop_rate=0.1, drop_path_rate=0.2).train()
    train_nodes, eval_nodes = get_graph_node_names(model, tracer_kwargs=TIMM_TRACER)
    fx = create_feature_extractor(model, train_return_nodes=[train_nodes[-1]], eval_return_nodes=[eval_nodes[-1]],
                                  tracer_kwargs=TIMM_TRACER)
    x = images(model)
    assert_same_backward(model, fx, x, unwrap=lambda out: next(iter(out.values())))
    fx.eval(), model.eval()
    with torch.no_grad():
        assert_close(next(iter(fx(x).values())), model(x))


@pytest.mark.parametrize("preset", vitlab.list_models())
def test_timm_feature_graph_net_gives_the_block_outputs(built: dict, preset: str) -> None:
    """``timm.models.FeatureGraphNet`` (timm's FX ``features_only``) returns what the ``feature_info`` modules
    return in eager mode."""
    model = make(built, preset).eval()
    indices = tuple(range(len(model.feature_info)))
    net = FeatureGraphNet(model, out_indices=indices, output_fmt="NLC")
    captured = {}
    for i in indices:
        module = model.get_submodule(model.feature_info[i]["module"])
        module.register_forward_hook(lambda _m, _i, out, i=i: captured.__setitem__(i, out))
    x = images(model)
    with torch.no_grad():
        feats = net(x)
        model(x)
    assert len(feats) == len(indices)
    for i, f in zip(indices, feats):
        assert_close(f, captured[i])


@pytest.mark.parametrize("preset", vitlab.list_models())
def test_dynamic_img_size_trace_follows_each_input_grid(built: dict, preset: str) -> None:
    """Traced once with ``dynamic_img_size``, the graph moves the position table (and RoPE) to each input's grid."""
    model = make(built, preset, dynamic_img_size=True).eval()
    traced = torch.fx.symbolic_trace(model)
    p = model.cfg.patch_size
    for size in ((model.cfg.img_size, model.cfg.img_size), (2 * p, 3 * p), (3 * p, p)):
        x = images(model, size=size)
        with torch.no_grad():
            assert_close(traced(x), model(x), msg=str(size))
    x = images(model, size=(2 * p, 3 * p))
    assert_same_backward(model, traced, x)


def test_torchvision_extractor_without_timm_tracer_arguments(built: dict) -> None:
    """vitlab's leaf functions are ``torch.fx.wrap``-ed, so any tracer keeps them (no timm registration needed)."""
    model = make(built, "vit5_small").eval()
    _, nodes = get_graph_node_names(model)
    assert "blocks.1.attn.scaled_dot_product_attention" in nodes
    fx = create_feature_extractor(model, return_nodes={"blocks.0": "b0", "norm": "out"})
    x = images(model)
    with torch.no_grad():
        out = fx(x)
        assert_close(out["out"], model.forward_features(x))
    assert out["b0"].shape == out["out"].shape


def test_timm_create_feature_extractor(built: dict) -> None:
    model = make(built, "cait_xxs24").eval()
    fx = timm.models.create_feature_extractor(model, return_nodes={"blocks.1": "patches", "norm": "out"})
    x = images(model)
    with torch.no_grad():
        out = fx(x)
        assert_close(out["out"], model.forward_features(x))
    assert out["patches"].shape == (2, model.num_patches, model.embed_dim)


@pytest.mark.parametrize("preset", ["vit_tiny", "cait_xxs24"])
def test_feature_graph_net_equals_timms_on_the_same_weights(built: dict, preset: str) -> None:
    """The oracle: FX features of a vitlab model equal those of timm's own model holding its weights."""
    model = make(built, preset).eval()
    theirs = vitlab.to_timm(model).eval()
    x = images(model)
    with torch.no_grad():
        ours = FeatureGraphNet(model, out_indices=(0, 1), output_fmt="NLC")(x)
        ref = FeatureGraphNet(theirs, out_indices=(0, 1), output_fmt="NLC")(x)
    for a, b in zip(ours, ref, strict=True):
        assert_close(a, b)


def test_traced_model_checks_its_input_as_eager(built: dict) -> None:
    traced = torch.fx.symbolic_trace(make(built, "vit_mnist").eval())
    with pytest.raises(ConfigError, match=r"expected images of shape \(B, 1, 28, 28\)"):
        traced(torch.randn(2, 1, 14, 14))
    dynamic = torch.fx.symbolic_trace(make(built, "vit_mnist", dynamic_img_size=True).eval())
    with pytest.raises(ConfigError, match="not multiples of patch_size 7"):
        dynamic(torch.randn(2, 1, 14, 15))


def _sdpa_nodes(gm: torch.fx.GraphModule) -> int:
    return sum(n.op == "call_function" and n.target is F.scaled_dot_product_attention for n in gm.graph.nodes)


def test_traced_attention_takes_the_fused_kernel_unless_told(built: dict) -> None:
    """A graph has no per-call path choice: ``fused=None`` traces the fused kernel (timm's default), ``False``
    the explicit matmuls; talking heads (CaiT) and re-attention (DeepViT) are explicit in both."""
    model = make(built, "vit_tiny").eval()
    assert _sdpa_nodes(torch.fx.symbolic_trace(model)) == 2
    for blk in model.blocks:
        blk.attn.fused = False
    gm = torch.fx.symbolic_trace(model)
    assert _sdpa_nodes(gm) == 0
    assert sum(n.target is operator.matmul for n in gm.graph.nodes) == 4  # QK^T and AV per block
    assert _sdpa_nodes(torch.fx.symbolic_trace(make(built, "deepvit_16b"))) == 0
    cait = torch.fx.symbolic_trace(make(built, "cait_xxs24"))
    assert _sdpa_nodes(cait) == 2  # the class-attention blocks only


def test_traced_drop_path_draws_from_the_slice_generator(built: dict) -> None:
    """Inside a sliced step (:mod:`vitlab.slice_rng`) the traced model's drop-path masks come from the slice's
    generator, as the eager model's do."""
    from vitlab.slice_rng import _local

    model = make(built, "vit_mnist", drop_path_rate=0.5).train()
    traced = torch.fx.symbolic_trace(model)
    x = images(model, batch=16)
    outs = []
    try:
        for fn in (model, traced, model):
            _local.generator = torch.Generator().manual_seed(3)
            torch.manual_seed(len(outs))  # the global generator differs: only the slice generator can agree
            with torch.no_grad():
                outs.append(fn(x))
    finally:
        _local.generator = None
    assert_close(outs[1], outs[0])
    assert_close(outs[2], outs[0])


def test_gradient_checkpointing_model_traces(built: dict) -> None:
    model = make(built, "vit5_small").train()
    model.set_grad_checkpointing(True)
    assert_same_backward(model, torch.fx.symbolic_trace(model), images(model))


@pytest.mark.parametrize("preset", ["vit5_small", "cait_xxs24", "deepvit_s"])
def test_features_only_fx_builds_timms_feature_graph_net(preset: str) -> None:
    """``timm.create_model(..., features_only=True, feature_cls='fx')`` traces the model: a ``FeatureGraphNet`` whose
    features are the eager model's block outputs (the same weights: the same seed)."""
    kwargs = small_kwargs(preset)
    torch.manual_seed(0)
    net = timm.create_model(PREFIX + preset, features_only=True, feature_cls="fx", out_indices=(0, 1), **kwargs)
    torch.manual_seed(0)
    model = timm.create_model(PREFIX + preset, **kwargs).eval()
    assert isinstance(net, FeatureGraphNet)
    assert net.feature_info.module_name() == ["blocks.0", "blocks.1"]
    captured = []
    for blk in model.blocks:
        blk.register_forward_hook(lambda _m, _i, out: captured.append(out))
    x = images(model)
    with torch.no_grad():
        feats = net.eval()(x)
        model(x)
    assert len(feats) == 2
    for f, ref in zip(feats, captured, strict=True):
        assert_close(f, ref)
