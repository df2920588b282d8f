"""The optimised paths compute what the reference paths compute (issue "performance": same outputs to 1e-5)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import vitlab
from vitlab.interop.timm_convert import to_timm_state_dict
from vitlab.layers.attention import Attention, mix_heads


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item()


def _run(model: nn.Module, x: torch.Tensor, fused: bool | None) -> tuple[torch.Tensor, list[torch.Tensor]]:
    for m in model.modules():
        if isinstance(m, Attention):
            m.fused = fused
    model.zero_grad(set_to_none=True)
    out = model(x)
    (out * torch.linspace(-1, 1, out.shape[-1])).sum().backward()
    return out.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]


@pytest.mark.parametrize("name,overrides", [
    ("vit_mnist", {"depth": 2}),
    ("vit5_small", dict(img_size=32, patch_size=8, depth=2, embed_dim=64, num_heads=4)),
    ("cait_xxs24", dict(img_size=32, patch_size=8, depth=2, depth_token_only=1, embed_dim=64, num_heads=4)),
    ("vit_tiny", dict(img_size=32, patch_size=4, depth=1, embed_dim=48, num_heads=3)),
])
def test_attention_paths_agree_on_outputs_and_gradients(name: str, overrides: dict) -> None:
    torch.manual_seed(0)
    model = vitlab.create_model(name, **overrides).train()
    x = torch.randn(3, model.cfg.in_chans, model.cfg.img_size, model.cfg.img_size)
    ref_out, ref_grads = _run(model, x, fused=True)  # SDPA wherever the layer allows it
    for fused in (False, None):  # the explicit path, and the per-call choice
        out, grads = _run(model, x, fused=fused)
        assert _rel(out, ref_out) < 1e-5
        assert len(grads) == len(ref_grads)
        assert max(_rel(g, r) for g, r in zip(grads, ref_grads)) < 1e-5


def _count_sdpa(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls = [0]
    real = F.scaled_dot_product_attention

    def counting(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", counting)
    return calls


def test_auto_path_is_explicit_for_few_tokens_with_autograd_only(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _count_sdpa(monkeypatch)
    attn = Attention(32, 4)
    few = torch.randn(2, Attention.explicit_max_tokens, 32)
    many = torch.randn(2, Attention.explicit_max_tokens + 1, 32)
    attn(few)
    assert calls[0] == 0  # training with autograd and few tokens: explicit matmuls
    with torch.no_grad():
        attn(few)
    assert calls[0] == 1  # inference: the fused kernel
    attn(many)
    assert calls[0] == 2  # many tokens: the fused kernel
    attn.fused = False
    attn(many)
    assert calls[0] == 2  # forced explicit
    attn.fused = True
    attn(few)
    assert calls[0] == 3  # forced fused


def test_attention_dropout_keeps_the_fused_path(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _count_sdpa(monkeypatch)
    attn = Attention(32, 4, attn_drop=0.1).train()
    attn(torch.randn(2, 5, 32))
    assert calls[0] == 1  # the dropout mask's random stream stays the one SDPA draws


def test_attention_maps_are_still_recorded() -> None:
    torch.manual_seed(0)
    model = vitlab.create_model("vit_mnist", depth=2)
    x = torch.randn(2, 1, 28, 28)
    maps = model.attention_maps(x)
    assert len(maps) == 2 and maps[0].shape == (2, 8, 17, 17)
    assert torch.allclose(maps[0].sum(-1), torch.ones(2, 8, 17), atol=1e-5)


@pytest.mark.parametrize("heads,tq,tk", [(4, 17, 17), (3, 1, 9), (6, 8, 5)])
def test_mix_heads_equals_the_permuted_linear(heads: int, tq: int, tk: int) -> None:
    torch.manual_seed(0)
    mix = nn.Linear(heads, heads)
    a = torch.randn(5, heads, tq, tk, requires_grad=True)
    ref = mix(a.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)  # timm's TalkingHeadAttn
    g = torch.randn_like(ref)
    ref_grads = torch.autograd.grad(ref, (a, mix.weight, mix.bias), g)
    out = mix_heads(a, mix)
    grads = torch.autograd.grad(out, (a, mix.weight, mix.bias), g)
    assert out.shape == ref.shape
    assert _rel(out, ref) < 1e-6
    for got, want in zip(grads, ref_grads):
        assert _rel(got, want) < 1e-5


def test_mix_heads_without_bias_and_to_other_head_counts() -> None:
    torch.manual_seed(0)
    mix = nn.Linear(4, 2, bias=False)
    a = torch.randn(2, 4, 3, 3)
    ref = mix(a.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
    assert _rel(mix_heads(a, mix), ref) < 1e-6


def test_cait_logits_match_timm_with_the_same_weights() -> None:
    """CaiT's talking heads now mix by a batched matmul; timm's permuted Linear must still agree."""
    from timm.models.cait import Cait

    torch.manual_seed(0)
    ours = vitlab.create_model("cait_xxs24", img_size=32, patch_size=8, depth=2, depth_token_only=1,
                               num_classes=10).eval()
    theirs = Cait(img_size=32, patch_size=8, num_classes=10, embed_dim=192, depth=2, num_heads=4,
                  init_values=1e-5, depth_token_only=1).eval()
    missing = theirs.load_state_dict(to_timm_state_dict(ours), strict=True)  # CaiT's ls{j}.gamma as timm's gamma_{j}
    assert not missing.missing_keys and not missing.unexpected_keys
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert _rel(ours(x), theirs(x)) < 1e-5
