"""Behaviour of the building blocks in vitlab.layers, checked against the seed equations and hand formulas."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from _helpers import one_line
from vitlab.errors import ConfigError
from vitlab.layers import (
    Attention,
    Block,
    ClassAttention,
    ConvStem,
    DropPath,
    LayerNorm,
    LayerScale,
    PatchEmbed,
    ReAttention,
    RMSNorm,
    ScalarGate,
    apply_rope,
    build_pos_embed,
    cait_init_value,
    check_heads,
    drop_path_rates,
    layout_rope,
    make_gate,
    record_attention,
    rope_2d_angles,
    sincos_1d,
    sincos_2d,
)
from vitlab.layers.rope import rope_table

# --- LayerScale: the LayerScale contract -------------------------------------------------------------


def test_layerscale_gamma_shape_init_and_tag() -> None:
    ls = LayerScale(48)
    assert ls.gamma.shape == (48,)
    assert torch.equal(ls.gamma.detach(), torch.full((48,), 1e-4))
    assert ls.gamma._no_weight_decay is True
    assert [n for n, _ in ls.named_parameters()] == ["gamma"]
    custom = LayerScale(5, init_value=0.1)
    assert torch.equal(custom.gamma.detach(), torch.full((5,), 0.1))
    custom.gamma.data.fill_(3.0)
    custom.reset_parameters()
    assert torch.equal(custom.gamma.detach(), torch.full((5,), 0.1))


@pytest.mark.parametrize("shape", [(2, 7, 6), (2, 3, 4, 6), (2, 3, 2, 4, 6)],
                         ids=["B,T,C", "B,H,W,C", "B,T,H,W,C"])
def test_layerscale_broadcasts_over_leading_dims(shape: tuple[int, ...]) -> None:
    ls = LayerScale(6)
    with torch.no_grad():
        ls.gamma.copy_(torch.tensor([0.5, -1.0, 2.0, 0.0, 3.0, 1e-4]))
    x = torch.randn(shape)
    out = ls(x)
    assert out.shape == x.shape and out.dtype == x.dtype
    for c in range(6):
        assert torch.equal(out[..., c], x[..., c] * ls.gamma[c])


@pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight")  # RMSNorm's unfused path
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
def test_gates_keep_the_input_dtype(dtype: torch.dtype) -> None:
    """The LayerScale contract: same shape and dtype as ``x`` (the fp32 gamma must not promote bf16/fp16)."""
    x = torch.randn(2, 7, 6).to(dtype)
    ls = LayerScale(6, init_value=0.5)
    out = ls(x)
    assert out.dtype == dtype
    torch.testing.assert_close(out, (x.float() * 0.5).to(dtype))
    assert ScalarGate(0.5)(x).dtype == dtype
    for block in (Block(16, 2, gate="layerscale", init_values=0.1, gates_first=True),  # CaiT's parameter order
                  Block(16, 2, gate="layerscale", init_values=0.1), Block(16, 2, gate="scalar")):
        y = torch.randn(2, 5, 16).to(dtype)
        assert block._residual(1, y, y).dtype == dtype
    for norm in (LayerNorm(6), RMSNorm(6)):
        assert norm(x).dtype == dtype


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("grad", [True, False], ids=["autograd", "no_grad"])
def test_rope_keeps_the_input_dtype(dtype: torch.dtype, grad: bool) -> None:
    rope = _rope(1, 2, 0, 8)  # an fp32 table
    x = torch.randn(2, 2, 5, 8).to(dtype).requires_grad_(grad)
    with torch.set_grad_enabled(grad):
        out = apply_rope(x, rope)
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), apply_rope(x.detach().float(), rope), atol=2e-2, rtol=2e-2)


def test_layerscale_gradient_is_sum_over_leading_dims() -> None:
    ls = LayerScale(4, init_value=0.3)
    x = torch.randn(2, 3, 5, 4)
    ls(x).sum().backward()
    torch.testing.assert_close(ls.gamma.grad, x.sum(dim=(0, 1, 2)))


@pytest.mark.parametrize("tokens,dim", [(1, 1), (197, 768), (50, 3)])
def test_layerscale_flop_count(tokens: int, dim: int) -> None:
    assert LayerScale(dim).flop_count(tokens) == tokens * dim
    assert LayerScale(dim).flop_count(tokens, matmul_only=True) == 0


def test_layerscale_wrong_last_dim_is_one_clear_error() -> None:
    ls = LayerScale(8)
    with pytest.raises(ConfigError) as exc:
        ls(torch.randn(2, 8, 4, 4))  # channels-first by mistake
    msg = one_line(exc)
    assert "8" in msg and "(2, 8, 4, 4)" in msg and "permute" in msg
    with pytest.raises(ConfigError):
        LayerScale(0)


@pytest.mark.parametrize("depth,value", [(1, 0.1), (12, 0.1), (18, 0.1), (19, 1e-5), (24, 1e-5), (25, 1e-6),
                                         (36, 1e-6), (48, 1e-6)])
def test_cait_init_value_depth_rule(depth: int, value: float) -> None:
    assert cait_init_value(depth) == value


def test_cait_init_value_rejects_bad_depth() -> None:
    with pytest.raises(ConfigError):
        cait_init_value(0)


# --- scalar gates and zero-gate blocks -------------------------------------------------------------


@pytest.mark.parametrize("kind", ["rezero", "skipinit"])
def test_rezero_and_skipinit_start_at_zero(kind: str) -> None:
    gate = make_gate(kind, 16, 0.5)  # the init value is for LayerScale / scalar gates only
    assert isinstance(gate, ScalarGate)
    assert gate.alpha.ndim == 0 and gate.alpha.item() == 0.0


def test_scalar_gate_starts_at_eps_and_layerscale_at_its_init() -> None:
    assert make_gate("scalar", 16, 1e-3).alpha.item() == pytest.approx(1e-3)
    assert make_gate("scalar", 16, None).alpha.item() == pytest.approx(1e-4)
    ls = make_gate("layerscale", 16, 1e-5)
    assert isinstance(ls, LayerScale) and ls.gamma.shape == (16,) and ls.gamma[0].item() == pytest.approx(1e-5)
    assert isinstance(make_gate("none", 16), nn.Identity)
    with pytest.raises(ConfigError) as exc:
        make_gate("rezeroo", 16)
    assert "rezero" in one_line(exc)


@pytest.mark.parametrize("gate,init", [("rezero", None), ("skipinit", None), ("layerscale", 0.0)])
def test_block_with_zero_gate_is_identity_at_init(gate: str, init: float | None) -> None:
    block = Block(32, 4, gate=gate, init_values=init)
    x = torch.randn(2, 9, 32)
    assert torch.equal(block(x), x)
    assert isinstance(block.norm1, nn.Identity) == (gate == "rezero")  # ReZero drops the pre-norms


def test_block_with_small_gate_is_close_to_identity_but_not_equal() -> None:
    torch.manual_seed(1)
    x = torch.randn(2, 9, 32)
    small = Block(32, 4, gate="scalar", init_values=1e-4)(x) - x
    plain = Block(32, 4, gate="none")(x) - x
    assert 0 < small.abs().max() < 1e-3 * plain.abs().max()


# --- position embeddings ---------------------------------------------------------------------------


def test_sincos_1d_matches_the_seed_formula() -> None:
    positions, d = 17, 64
    table = sincos_1d(positions, d)
    assert table.shape == (positions, d)
    for i in range(positions):  # i: position in the sequence
        for j in range(d):  # j: channel
            expected = math.sin(i / 10000 ** (j / d)) if j % 2 == 0 else math.cos(i / 10000 ** ((j - 1) / d))
            assert table[i, j].item() == pytest.approx(expected, abs=1e-6)


def test_sincos_1d_prefix_slot_is_position_zero() -> None:
    table = build_pos_embed("sincos1d", grid_size=4, dim=8, num_prefix=1)
    assert table.shape == (1, 17, 8)
    assert torch.equal(table[0, 0], torch.tensor([0.0, 1.0] * 4))  # sin(0), cos(0)
    torch.testing.assert_close(table[0], sincos_1d(17, 8))


def test_sincos_2d_encodes_column_then_row() -> None:
    grid, d = 3, 8
    table = sincos_2d(grid, d)
    omega = [1.0 / 10000 ** (k / 2) for k in range(2)]
    for n in range(grid * grid):
        row, col = divmod(n, grid)
        expected = [math.sin(col * w) for w in omega] + [math.cos(col * w) for w in omega]
        expected += [math.sin(row * w) for w in omega] + [math.cos(row * w) for w in omega]
        torch.testing.assert_close(table[n], torch.tensor(expected))
    with pytest.raises(ConfigError):
        sincos_2d(2, 6)


# --- normalisation ---------------------------------------------------------------------------------


def test_rmsnorm_matches_hand_formula() -> None:
    norm = RMSNorm(10)
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.5, 2.0, 10))
    x = torch.randn(3, 5, 10) * 4
    expected = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * norm.weight
    torch.testing.assert_close(norm(x), expected)
    assert norm.eps == 1e-6


def test_layernorm_uses_timm_eps() -> None:
    x = torch.randn(2, 3, 10)
    torch.testing.assert_close(LayerNorm(10)(x), F.layer_norm(x, (10,), eps=1e-6))


# --- stochastic depth ------------------------------------------------------------------------------


def test_drop_path_schedules() -> None:
    assert drop_path_rates(0.1, 4, "uniform") == [0.1] * 4
    assert drop_path_rates(0.2, 5, "linear") == pytest.approx([0.0, 0.05, 0.1, 0.15, 0.2])
    assert drop_path_rates(0.3, 1, "linear") == [0.3]
    assert drop_path_rates(0.0, 3, "linear") == [0.0] * 3
    with pytest.raises(ConfigError):
        drop_path_rates(0.1, 4, "cosine")
    with pytest.raises(ConfigError):
        drop_path_rates(1.0, 4)


def test_drop_path_drops_whole_samples_and_rescales() -> None:
    dp = DropPath(0.5)
    x = torch.ones(64, 3, 4)
    dp.eval()
    assert torch.equal(dp(x), x)
    dp.train()
    y = dp(x)
    per_sample = y.flatten(1)
    kept = per_sample[:, 0] > 0
    assert torch.equal(per_sample[kept], torch.full_like(per_sample[kept], 2.0))  # 1 / (1 - p)
    assert torch.equal(per_sample[~kept], torch.zeros_like(per_sample[~kept]))
    assert 0 < kept.sum() < 64


# --- attention -------------------------------------------------------------------------------------


def _rope(num_prefix: int, grid: int, num_end: int, head_dim: int) -> torch.Tensor:
    return layout_rope(num_prefix, grid, num_end, head_dim, 10000.0, 100.0)


@pytest.mark.parametrize("qk_norm,use_rope", [(False, False), (True, False), (False, True), (True, True)],
                         ids=["plain", "qk_norm", "rope", "qk_norm+rope"])
def test_attention_explicit_path_equals_fused(qk_norm: bool, use_rope: bool, sdpa_calls: list) -> None:
    attn = Attention(32, 4, qk_norm=qk_norm).eval()
    rope = _rope(1, 3, 4, 8) if use_rope else None
    x = torch.randn(2, 14, 32)
    attn.fused = True  # 14 tokens with autograd on would pick the explicit path: force SDPA
    fused = attn(x, rope=rope)
    assert len(sdpa_calls) == 1  # the fused kernel really ran
    with record_attention([attn]) as maps:
        explicit = attn(x, rope=rope)
    assert len(sdpa_calls) == 1  # and the recorder took the explicit path
    torch.testing.assert_close(explicit, fused, atol=1e-5, rtol=1e-5)
    assert len(maps) == 1 and maps[0].shape == (2, 4, 14, 14)
    torch.testing.assert_close(maps[0].sum(-1), torch.ones(2, 4, 14))
    assert attn._maps is None  # the recorder is removed on exit


def test_attention_explicit_map_is_softmax_of_scaled_logits() -> None:
    attn = Attention(16, 2)
    x = torch.randn(1, 5, 16)
    with record_attention([attn]) as maps:
        attn(x)
    q, k, _ = attn.qkv(x).reshape(1, 5, 3, 2, 8).permute(2, 0, 3, 1, 4)
    torch.testing.assert_close(maps[0], (q @ k.transpose(-2, -1) / math.sqrt(8)).softmax(-1))


def test_talking_heads_with_identity_mixing_equals_plain_attention() -> None:
    talking = Attention(24, 3, talking_heads=True)
    plain = Attention(24, 3)
    plain.load_state_dict({k: v for k, v in talking.state_dict().items() if not k.startswith(("proj_l", "proj_w"))})
    with torch.no_grad():
        for lin in (talking.proj_l, talking.proj_w):
            lin.weight.copy_(torch.eye(3))
            lin.bias.zero_()
    x = torch.randn(2, 6, 24)
    torch.testing.assert_close(talking(x), plain(x), atol=1e-6, rtol=1e-5)
    with torch.no_grad():
        talking.proj_w.weight.copy_(torch.randn(3, 3))
    assert not torch.allclose(talking(x), plain(x), atol=1e-4)


def _copy_qkv_proj(src: nn.Module, dst: nn.Module) -> None:
    dst.qkv.load_state_dict(src.qkv.state_dict())
    dst.proj.load_state_dict(src.proj.state_dict())


@pytest.mark.parametrize("norm", ["batch", "layer"])
def test_reattention_with_identity_mixing_and_no_norm_equals_plain_attention(norm: str) -> None:
    reattn = ReAttention(32, 4, norm=norm)
    plain = Attention(32, 4)
    _copy_qkv_proj(reattn, plain)
    with torch.no_grad():
        reattn.reattn_weights.copy_(torch.eye(4))
    reattn.reattn_norm = nn.Identity()  # norm disabled
    x = torch.randn(2, 10, 32)
    torch.testing.assert_close(reattn(x), plain(x), atol=1e-5, rtol=1e-5)


def test_reattention_map_mixes_heads_with_theta() -> None:
    reattn = ReAttention(32, 4, norm="layer")
    reattn.reattn_norm = nn.Identity()
    with torch.no_grad():
        reattn.reattn_weights.copy_(torch.randn(4, 4))  # far from the identity init
    x = torch.randn(2, 7, 32)
    with record_attention([reattn]) as maps:
        reattn(x)
    theta = reattn.reattn_weights.detach()
    w, b = reattn.qkv.weight.detach(), reattn.qkv.bias.detach()
    expected, transposed = torch.zeros(2, 4, 7, 7), torch.zeros(2, 4, 7, 7)
    for n in range(2):  # new map g = sum over heads h of Theta[h, g] * softmax map h, head by head
        for h in range(4):
            cols = slice(8 * h, 8 * h + 8)  # head h's channels of q (rows 0:32), k (rows 32:64)
            q = x[n] @ w[cols].T + b[cols]  # (7, 8)
            k = x[n] @ w[32:64][cols].T + b[32:64][cols]
            logits = torch.tensor([[float(q[i] @ k[j]) / math.sqrt(8) for j in range(7)] for i in range(7)])
            soft = logits.exp() / logits.exp().sum(dim=1, keepdim=True)
            for g in range(4):
                expected[n, g] += theta[h, g] * soft
                transposed[n, g] += theta[g, h] * soft
    torch.testing.assert_close(maps[0].detach(), expected, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(maps[0].detach(), transposed, atol=1e-3)  # Theta^T, not Theta


def test_reattention_dropout_acts_on_the_softmax_maps_before_the_mix() -> None:
    """vit-pytorch's deepvit.py order: softmax, dropout, head mix, norm over heads, @ v."""
    torch.manual_seed(0)
    reattn = ReAttention(32, 4, norm="layer", attn_drop=0.5).train()
    with torch.no_grad():
        reattn.reattn_weights.copy_(torch.randn(4, 4))
    x = torch.randn(2, 6, 32)
    torch.manual_seed(1)
    out = reattn(x)
    torch.manual_seed(1)
    qkv = reattn.qkv(x).reshape(2, 6, 3, 4, 8).permute(2, 0, 3, 1, 4)  # (3, B, H, T, d)
    q, k, v = qkv[0], qkv[1], qkv[2]
    attn = (torch.einsum("bhid,bhjd->bhij", q, k) * 8**-0.5).softmax(dim=-1)
    attn = F.dropout(attn, 0.5, training=True)
    attn = torch.einsum("bhij,hg->bgij", attn, reattn.reattn_weights)
    norm = reattn.reattn_norm
    attn = F.layer_norm(attn.permute(0, 2, 3, 1), (4,), norm.weight, norm.bias, norm.eps).permute(0, 3, 1, 2)
    ref = reattn.proj(torch.einsum("bhij,bhjd->bhid", attn, v).transpose(1, 2).reshape(2, 6, 32))
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("norm", ["batch", "layer"])
def test_reattention_map_shape_and_norm(norm: str) -> None:
    reattn = ReAttention(48, 6, norm=norm).train()
    x = torch.randn(3, 9, 48)
    with record_attention([reattn]) as maps:
        out = reattn(x)
    assert out.shape == x.shape and maps[0].shape == (3, 6, 9, 9)
    m = maps[0].detach()
    if norm == "batch":  # per head over (batch, query, key): zero mean, unit variance in training
        torch.testing.assert_close(m.mean(dim=(0, 2, 3)), torch.zeros(6), atol=1e-5, rtol=0)
    else:  # per position over the heads
        torch.testing.assert_close(m.mean(dim=1), torch.zeros(3, 9, 9), atol=1e-5, rtol=0)
    with pytest.raises(ConfigError):
        ReAttention(48, 6, norm="group")


def test_reattention_init_is_near_identity() -> None:
    reattn = ReAttention(32, 4)
    delta = reattn.reattn_weights.detach() - torch.eye(4)
    assert 0 < delta.abs().max() < 0.2


def test_class_attention_explicit_equals_fused_and_hand_formula(sdpa_calls: list) -> None:
    ca = ClassAttention(32, 4).eval()
    x = torch.randn(2, 11, 32)
    fused = ca(x)
    assert len(sdpa_calls) == 1
    with record_attention([ca]) as maps:
        explicit = ca(x)
    assert len(sdpa_calls) == 1
    assert fused.shape == (2, 1, 32)
    torch.testing.assert_close(explicit, fused, atol=1e-5, rtol=1e-5)
    assert maps[0].shape == (2, 4, 1, 11)
    torch.testing.assert_close(maps[0].sum(-1), torch.ones(2, 4, 1))
    q = ca.q(x[:, :1]).reshape(2, 1, 4, 8).transpose(1, 2)
    k = ca.k(x).reshape(2, 11, 4, 8).transpose(1, 2)
    v = ca.v(x).reshape(2, 11, 4, 8).transpose(1, 2)
    hand = ((q @ k.transpose(-2, -1)) / math.sqrt(8)).softmax(-1) @ v  # (B, H, 1, d)
    torch.testing.assert_close(fused, ca.proj(hand.transpose(1, 2).reshape(2, 1, 32)), atol=1e-5, rtol=1e-5)


# --- rotary position embedding ---------------------------------------------------------------------


def test_rope_is_a_rotation_that_depends_on_relative_position_only() -> None:
    grid, d = 4, 8
    rope = rope_table(rope_2d_angles(grid, grid, d))  # (2, 16, d)
    q = torch.randn(d).expand(1, 1, grid * grid, d)
    k = torch.randn(d).expand(1, 1, grid * grid, d)
    rq, rk = apply_rope(q, rope), apply_rope(k, rope)
    torch.testing.assert_close(rq.norm(dim=-1), q.norm(dim=-1))
    logits = (rq @ rk.transpose(-2, -1))[0, 0]  # (16, 16)

    def at(r: int, c: int) -> int:
        return r * grid + c

    # same displacement (dy, dx) = (1, 2) at two places gives the same logit
    torch.testing.assert_close(logits[at(0, 0), at(1, 2)], logits[at(2, 1), at(3, 3)])
    assert not torch.allclose(logits[at(0, 0), at(1, 2)], logits[at(0, 0), at(2, 1)])


def test_rope_layout_leaves_prefix_tokens_unrotated() -> None:
    rope = _rope(1, 2, 4, 8)
    assert rope.shape == (2, 1 + 4 + 4, 8)
    x = torch.randn(1, 2, 9, 8)
    out = apply_rope(x, rope)
    torch.testing.assert_close(out[:, :, 0], x[:, :, 0])
    assert not torch.allclose(out[:, :, 2], x[:, :, 2])
    with pytest.raises(ConfigError):
        rope_2d_angles(2, 2, 6)


def test_rope_without_autograd_takes_fewer_passes_to_the_same_values() -> None:
    rope = _rope(1, 3, 4, 16)  # T = 1 + 9 + 4
    x = torch.randn(2, 3, 14, 16, requires_grad=True)
    with_grad = apply_rope(x, rope)  # x cos + rotate_half(x) sin, differentiable
    assert with_grad.grad_fn is not None
    with torch.no_grad():
        fast = apply_rope(x, rope)
    with torch.inference_mode():
        fast_im = apply_rope(x.detach(), rope)
    torch.testing.assert_close(fast, with_grad.detach(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(fast_im, fast, rtol=0, atol=0)
    x1, x2 = x.detach().chunk(2, dim=-1)
    manual = x.detach() * rope[0] + torch.cat([-x2, x1], dim=-1) * rope[1]
    torch.testing.assert_close(fast, manual, rtol=1e-6, atol=1e-6)


# --- clear errors ----------------------------------------------------------------------------------


def test_heads_not_dividing_dim() -> None:
    with pytest.raises(ConfigError) as exc:
        check_heads(64, 5)
    msg = one_line(exc)
    assert "num_heads 5" in msg and "embed_dim 64" in msg and "[1, 2, 4, 8, 16, 32]" in msg
    with pytest.raises(ConfigError):
        Attention(64, 5)
    with pytest.raises(ConfigError):
        ClassAttention(30, 4)
    assert check_heads(64, 8) == 8


def test_patch_embed_errors_name_the_fix() -> None:
    with pytest.raises(ConfigError) as exc:
        PatchEmbed(30, 8, 3, 16)
    msg = one_line(exc)
    assert "24" in msg and "32" in msg
    pe = PatchEmbed(32, 8, 3, 16)
    assert pe(torch.randn(2, 3, 32, 32)).shape == (2, 16, 16)
    for bad in (torch.randn(2, 1, 32, 32), torch.randn(2, 3, 28, 28), torch.randn(3, 32, 32)):
        with pytest.raises(ConfigError) as exc:
            pe(bad)
        assert "(B, 3, 32, 32)" in one_line(exc)
    with pytest.raises(ConfigError) as exc:
        ConvStem(28, 7, 3, 16)
    assert "even" in one_line(exc)


def test_conv_stem_output_tokens() -> None:
    stem = ConvStem(32, 8, 3, 24).eval()
    assert stem(torch.randn(2, 3, 32, 32)).shape == (2, 16, 24)
    assert stem.num_patches == 16
