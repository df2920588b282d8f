"""Tests of vitlab.analysis and `vitlab analyze`: the numbers behind every figure, the files, the report."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from PIL import Image

import vitlab
from _helpers import one_line, read_rows
from vitlab.analysis import (
    TokenLayout,
    analyze_model,
    atomic_path,
    attention_entropy,
    attention_gradients,
    class_attention_rollout,
    class_token_attention,
    collapse_groups,
    cross_layer_similarity,
    discard_lowest,
    explain,
    fuse_heads,
    gated_blocks,
    gradient_rollout,
    model_rollout,
    patch_pos_embed,
    pos_embed_similarity,
    readout_label,
    residual_ratios,
    rollout,
    similar_blocks,
    similarity_grid,
    write_csv,
    write_report,
)
from vitlab.analysis.analyze import default_layer
from vitlab.analysis.collapse import SimilarityMeter, adjacent_similarity
from vitlab.cli import main
from vitlab.errors import ConfigError, DataError

TINY = dict(img_size=28, patch_size=7, in_chans=1, num_classes=10, embed_dim=32, depth=3, num_heads=4)
FAMILIES = {
    "vit": ("vit_mnist", dict(depth=3, embed_dim=32, num_heads=4)),
    "vit_avg_registers": ("vit_mnist", dict(depth=3, embed_dim=32, num_heads=4, class_token=False,
                                            global_pool="avg", reg_tokens=2, pos_embed="learned")),
    "deepvit": ("deepvit_16b", TINY),
    "vit5": ("vit5_small", TINY),
    "cait": ("cait_xxs24", dict(TINY, init_values=1e-5)),  # the preset's init pinned at depth 3
}


def tiny(family: str, seed: int = 0) -> vitlab.models.VitlabModel:
    torch.manual_seed(seed)
    name, kw = FAMILIES[family]
    return vitlab.create_model(name, **kw).eval()


def random_maps(L: int, B: int = 2, H: int = 3, T: int = 10, scale: float = 4.0, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(B, H, T, T, generator=g) * scale).softmax(dim=-1) for _ in range(L)]


# ------------------------------------------------------------------------------------- attention collapse


def test_identical_maps_score_one_and_every_block_is_similar():
    m = random_maps(1)[0]
    for along in ("column", "row"):
        sim = cross_layer_similarity([m.clone() for _ in range(5)], along=along)
        torch.testing.assert_close(sim, torch.ones(5, 5), atol=1e-5, rtol=0)
        assert similar_blocks(sim, 0.9).tolist() == [4] * 5


def test_independent_random_maps_are_far_from_similar():
    sim = cross_layer_similarity(random_maps(6))
    off = sim[~torch.eye(6, dtype=torch.bool)]
    assert off.max() < 0.6 and off.mean() < 0.5
    torch.testing.assert_close(sim.diagonal(), torch.ones(6), atol=1e-5, rtol=0)
    assert similar_blocks(sim, 0.9).tolist() == [0] * 6


def test_similarity_matches_the_seed_formula_term_by_term():
    maps = random_maps(3, B=2, H=2, T=5, scale=1.0, seed=3)
    L, B, H, T = 3, 2, 2, 5
    for along in ("column", "row"):
        want = torch.zeros(L, L)
        for p in range(L):
            for q in range(L):
                vals = []
                for b in range(B):
                    for h in range(H):
                        for t in range(T):
                            u = maps[p][b, h, :, t] if along == "column" else maps[p][b, h, t, :]
                            v = maps[q][b, h, :, t] if along == "column" else maps[q][b, h, t, :]
                            vals.append(F.cosine_similarity(u, v, dim=0))
                want[p, q] = torch.stack(vals).mean()
        torch.testing.assert_close(cross_layer_similarity(maps, along=along), want, atol=1e-5, rtol=0)


def test_column_and_row_similarity_on_hand_built_maps():
    # layer 0 attends to token 0 from every query, layer 1 to token 1: rows orthogonal, columns too
    a = torch.tensor([[1.0, 0.0], [1.0, 0.0]])[None, None]
    b = torch.tensor([[0.0, 1.0], [0.0, 1.0]])[None, None]
    assert cross_layer_similarity([a, b], along="row")[0, 1] == pytest.approx(0.0)
    # columns: token 0's column (1, 1) vs (0, 0) -> 0; token 1's (0, 0) vs (1, 1) -> 0
    assert cross_layer_similarity([a, b], along="column")[0, 1] == pytest.approx(0.0)
    c = torch.tensor([[1.0, 0.0], [0.0, 1.0]])[None, None]  # columns (1,0),(0,1) vs a's (1,1),(0,0)
    assert cross_layer_similarity([a, c], along="column")[0, 1] == pytest.approx(0.5 * 2**-0.5)


def test_similar_blocks_counts_other_layers_above_threshold():
    sim = torch.tensor([[1.0, 0.95, 0.5], [0.95, 1.0, 0.91], [0.5, 0.91, 1.0]])
    assert similar_blocks(sim, 0.9).tolist() == [1, 2, 1]
    assert similar_blocks(sim, 0.92).tolist() == [1, 1, 0]
    assert adjacent_similarity(sim)[1:].tolist() == pytest.approx([0.95, 0.91])


def test_collapse_bad_input_is_one_line():
    with pytest.raises(ConfigError) as exc:
        cross_layer_similarity([torch.rand(1, 2, 3, 3), torch.rand(1, 2, 1, 3)])
    assert "collapse_groups" in one_line(exc)
    with pytest.raises(ConfigError) as exc:
        cross_layer_similarity([])
    one_line(exc)
    with pytest.raises(ConfigError) as exc:
        cross_layer_similarity(random_maps(2), along="diagonal")
    one_line(exc)
    with pytest.raises(ConfigError) as exc:
        similar_blocks(torch.eye(3), threshold=1.5)
    one_line(exc)


def test_attention_entropy_on_hand_built_maps():
    uniform = torch.full((2, 3, 5, 5), 1 / 5)
    one_hot = F.one_hot(torch.randint(0, 5, (2, 3, 5)), 5).float()
    half = torch.zeros(1, 1, 1, 4)
    half[..., :2] = 0.5  # two keys of four: log 2 / log 4
    got = attention_entropy([uniform, one_hot, half])
    torch.testing.assert_close(got, torch.tensor([1.0, 0.0, 0.5]))
    logits = torch.randn(2, 3, 5, 5)
    p = logits.softmax(-1)
    expected = (-(p * p.log()).sum(-1) / torch.log(torch.tensor(5.0))).mean()
    torch.testing.assert_close(attention_entropy([p])[0], expected)
    # maps mixed over heads after the softmax are not probability rows: refused with the fix named
    with pytest.raises(ConfigError) as exc:
        attention_entropy([p - 0.2])
    assert "record_pre_mix" in one_line(exc)
    with pytest.raises(ConfigError):
        attention_entropy([torch.ones(1, 1, 1, 1)])


def test_cait_groups_self_and_class_attention_apart():
    model = tiny("cait")
    with torch.no_grad():
        maps = model.attention_maps(torch.randn(2, 1, 28, 28))
    groups = collapse_groups(maps)
    assert [(g.name, g.along, g.layers) for g in groups] == [
        ("self_attention", "column", [0, 1, 2]), ("class_attention", "row", [3, 4])]
    torch.testing.assert_close(groups[1].similarity, cross_layer_similarity(maps[3:], along="row"))


def test_uniform_attention_model_has_collapsed_layers():
    """Zero query and key weights make every layer's attention uniform: identical maps, similarity 1."""
    model = tiny("vit")
    d = model.cfg.embed_dim
    with torch.no_grad():
        for blk in model.blocks:
            blk.attn.qkv.weight[: 2 * d] = 0
            blk.attn.qkv.bias[: 2 * d] = 0
        maps = model.attention_maps(torch.randn(3, 1, 28, 28))
    (group,) = collapse_groups(maps)
    torch.testing.assert_close(group.similarity, torch.ones(3, 3), atol=1e-5, rtol=0)
    assert group.similar.tolist() == [2, 2, 2]


def test_meter_over_chunks_equals_one_batch():
    maps = random_maps(4, B=6, seed=5)
    meter = SimilarityMeter(0.5)
    meter.update([m[:4] for m in maps])
    meter.update([m[4:] for m in maps])
    (whole,) = collapse_groups(maps, 0.5)
    (chunked,) = meter.compute()
    torch.testing.assert_close(chunked.similarity, whole.similarity, atol=1e-6, rtol=0)
    assert chunked.similar.tolist() == whole.similar.tolist()


# ---------------------------------------------------------------------------------------- residual ratios


@pytest.mark.parametrize("gate", ["skipinit", "rezero"])
def test_zero_gates_give_zero_residual_ratios(gate):
    torch.manual_seed(0)
    model = vitlab.create_model("vit_mnist", depth=2, embed_dim=32, num_heads=4, gate=gate).eval()
    rows = residual_ratios(model, torch.randn(4, 1, 28, 28))
    assert len(rows) == 2
    assert all(r.attn_mean == 0.0 and r.mlp_mean == 0.0 for r in rows)


def test_residual_ratio_equals_hand_computation_for_one_block():
    torch.manual_seed(1)
    model = vitlab.create_model("vit_mnist", depth=1, embed_dim=32, num_heads=4, gate="layerscale",
                                init_values=0.5).eval()
    x = torch.randn(5, 1, 28, 28)
    with torch.no_grad():
        t = model._tokens(model.patch_embed(x))  # (B, T, D): the block's input
        blk = model.blocks[0]
        a = blk.ls1(blk.attn(blk.norm1(t)))
        r_attn = a.flatten(1).norm(dim=1) / t.flatten(1).norm(dim=1)
        x1 = t + a
        m = blk.ls2(blk.mlp(blk.norm2(x1)))
        r_mlp = m.flatten(1).norm(dim=1) / x1.flatten(1).norm(dim=1)
    (row,) = residual_ratios(model, x, batch_size=2)  # chunks must not change the numbers
    assert row.name == "blocks.0" and row.kind == "self_attention"
    assert row.attn_mean == pytest.approx(float(r_attn.mean()), rel=1e-5)
    assert row.attn_std == pytest.approx(float(r_attn.std()), rel=1e-4)
    assert row.mlp_mean == pytest.approx(float(r_mlp.mean()), rel=1e-5)
    assert 0 < row.attn_mean < 1 and 0 < row.mlp_mean < 1


def test_residual_ratios_of_cait_list_self_then_class_attention_blocks():
    model = tiny("cait")
    rows = residual_ratios(model, torch.randn(2, 1, 28, 28))
    assert [(r.name, r.kind) for r in rows] == gated_blocks(model) == [
        ("blocks.0", "self_attention"), ("blocks.1", "self_attention"), ("blocks.2", "self_attention"),
        ("blocks_token_only.0", "class_attention"), ("blocks_token_only.1", "class_attention")]
    # LayerScale 1e-5 at init: every branch is a tiny fraction of its input
    assert all(0 < r.attn_mean < 1e-3 and 0 < r.mlp_mean < 1e-3 for r in rows)


# -------------------------------------------------------------------------------- attention maps, rollout


def test_rollout_hand_built_two_layers():
    # head means: layer 1 [[.5, .5], [0, 1]], layer 2 [[1, 0], [.5, .5]]
    l1 = torch.tensor([[[1.0, 0.0], [0.0, 1.0]], [[0.0, 1.0], [0.0, 1.0]]])[None]  # (1, 2, 2, 2)
    l2 = torch.tensor([[[1.0, 0.0], [1.0, 0.0]], [[1.0, 0.0], [0.0, 1.0]]])[None]
    # (A + I) row-normalised: [[.75, .25], [0, 1]] and [[1, 0], [.25, .75]]; R = A2~ @ A1~
    want = torch.tensor([[0.75, 0.25], [0.1875, 0.8125]])
    torch.testing.assert_close(rollout([l1, l2])[0], want)
    torch.testing.assert_close(rollout([l1])[0], torch.tensor([[0.75, 0.25], [0.0, 1.0]]))


def test_class_attention_rollout_hand_built():
    patches = torch.tensor([[0.75, 0.25], [0.0, 1.0]])[None]  # (1, N, N) self-attention rollout
    ca1 = torch.tensor([0.5, 0.5, 0.0]).view(1, 1, 1, 3)  # keys [cls, p0, p1] -> (+e0)/2 = [.75, .25, 0]
    ca2 = torch.tensor([0.0, 0.0, 1.0]).view(1, 1, 1, 3)  # -> [.5, 0, .5]
    # r = .5 * [.75, .25, 0] + [0, 0, .5] = [.375, .125, .5]; patches [.125, .5] @ P = [.09375, .53125]
    got = class_attention_rollout([ca1, ca2], patches)
    torch.testing.assert_close(got[0], torch.tensor([0.375, 0.09375, 0.53125]))
    torch.testing.assert_close(class_attention_rollout([ca1])[0], torch.tensor([0.75, 0.25, 0.0]))


def test_class_token_attention_reads_the_right_entries():
    # layout: [cls, register, 4 patches (2x2), end register] -> T = 7
    layout = TokenLayout(num_front=2, num_patches=4, num_end=1, grid_size=2, class_token=True)
    attn = torch.arange(2 * 3 * 7 * 7, dtype=torch.float32).view(2, 3, 7, 7)
    got = class_token_attention(attn, layout)
    assert got.shape == (2, 3, 2, 2)
    torch.testing.assert_close(got.flatten(2), attn[:, :, 0, 2:6])
    no_cls = TokenLayout(num_front=1, num_patches=4, num_end=2, grid_size=2, class_token=False)
    # the head averages the patch tokens: the mean over the patch queries (rows 1..4), not over all queries
    torch.testing.assert_close(class_token_attention(attn, no_cls).flatten(2), attn[:, :, 1:5, 1:5].mean(dim=2))
    pooled = TokenLayout(num_front=2, num_patches=4, num_end=1, grid_size=2, class_token=True, pool="avg")
    torch.testing.assert_close(class_token_attention(attn, pooled).flatten(2), attn[:, :, 2:6, 2:6].mean(dim=2))
    cait = TokenLayout(num_front=1, num_patches=4, num_end=0, grid_size=2, class_token=True)
    ca = torch.rand(2, 3, 1, 5)
    torch.testing.assert_close(class_token_attention(ca, cait).flatten(2), ca[:, :, 0, 1:])
    with pytest.raises(ConfigError) as exc:
        class_token_attention(torch.rand(1, 1, 9, 9), layout)
    one_line(exc)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_attention_kind_gives_maps_and_rollout(family):
    model = tiny(family)
    layout = TokenLayout.of(model)
    with torch.no_grad():
        maps = model.attention_maps(torch.randn(2, 1, 28, 28))
    heads = class_token_attention(maps[-1], layout)
    assert heads.shape == (2, 4, 4, 4) and torch.isfinite(heads).all()
    r = model_rollout(maps, layout)
    assert r.relevance.shape == (2, 4, 4) and (r.relevance >= 0).all()
    torch.testing.assert_close(r.relevance.flatten(1).sum(dim=1), r.patch_mass)
    assert ((r.patch_mass > 0) & (r.patch_mass <= 1 + 1e-5)).all()
    if family in ("vit", "vit5", "vit_avg_registers"):  # class token / registers keep a share
        sa = rollout(maps)
        torch.testing.assert_close(sa.sum(dim=-1), torch.ones(sa.shape[:2]))
        assert (r.patch_mass < 1).all()
    groups = collapse_groups(maps)
    assert all(torch.isfinite(g.similarity).all() for g in groups)


def test_rollout_of_cait_composes_both_stages():
    model = tiny("cait")
    with torch.no_grad():
        maps = model.attention_maps(torch.randn(2, 1, 28, 28))
    r = model_rollout(maps, TokenLayout.of(model))
    full = class_attention_rollout(maps[3:], rollout(maps[:3]))  # (B, 1 + N), sums to 1
    torch.testing.assert_close(full.sum(dim=-1), torch.ones(2))
    torch.testing.assert_close(r.relevance.flatten(1), full[:, 1:])


# ------------------------------------------------------- rollout options: head fusion, discard, gradient


def test_fuse_heads_mean_max_min_hand_built():
    two = torch.tensor([[[0.2, 0.8], [0.6, 0.4]], [[0.6, 0.4], [0.0, 1.0]]])[None]  # (1, 2 heads, 2, 2)
    torch.testing.assert_close(fuse_heads(two, "mean")[0], torch.tensor([[0.4, 0.6], [0.3, 0.7]]))
    torch.testing.assert_close(fuse_heads(two, "max")[0], torch.tensor([[0.6, 0.8], [0.6, 1.0]]))
    torch.testing.assert_close(fuse_heads(two, "min")[0], torch.tensor([[0.2, 0.4], [0.0, 0.4]]))


def test_discard_lowest_keeps_the_class_tokens_own_entry():
    a = torch.tensor([[0.01, 0.5, 0.2], [0.3, 0.05, 0.6], [0.4, 0.1, 0.7]])[None]
    # 8 entries besides (0, 0); ratio 0.5 drops the 4 lowest of them: 0.05, 0.1, 0.2, 0.3
    want = torch.tensor([[0.01, 0.5, 0.0], [0.0, 0.0, 0.6], [0.4, 0.0, 0.7]])
    torch.testing.assert_close(discard_lowest(a, 0.5)[0], want)
    # without keep_first, int(0.5 * 9) = 4 lowest of all nine: 0.01, 0.05, 0.1, 0.2
    want = torch.tensor([[0.0, 0.5, 0.0], [0.3, 0.0, 0.6], [0.4, 0.0, 0.7]])
    torch.testing.assert_close(discard_lowest(a, 0.5, keep_first=False)[0], want)
    torch.testing.assert_close(discard_lowest(a, 0.0), a)


def test_rollout_max_fusion_and_discard_hand_built():
    l1 = torch.tensor([[[0.9, 0.1], [0.3, 0.7]], [[0.5, 0.5], [0.1, 0.9]]])[None]  # (1, 2, 2, 2)
    l2 = torch.tensor([[[0.6, 0.4], [0.8, 0.2]], [[0.2, 0.8], [0.4, 0.6]]])[None]
    # max over heads: l1 [[.9, .5], [.3, .9]], l2 [[.6, .8], [.8, .6]];
    # discard 1/3 of the 3 entries besides (0, 0) -> the lowest: l1 drops .3, l2 drops .6 at (1, 1)
    # + I, rownorm: l1 [[1.9, .5], [0, 1.9]] -> [[19/24, 5/24], [0, 1]]
    #              l2 [[1.6, .8], [.8, 1]] -> [[2/3, 1/3], [4/9, 5/9]]
    a1 = torch.tensor([[19 / 24, 5 / 24], [0.0, 1.0]])
    a2 = torch.tensor([[2 / 3, 1 / 3], [4 / 9, 5 / 9]])
    got = rollout([l1, l2], head_fusion="max", discard_ratio=1 / 3)[0]
    torch.testing.assert_close(got, a2 @ a1)
    # min fusion, no discard: l1 [[.5, .1], [.1, .7]] -> [[1.5, .1], [.1, 1.7]] / rows
    a1 = torch.tensor([[1.5 / 1.6, 0.1 / 1.6], [0.1 / 1.8, 1.7 / 1.8]])
    torch.testing.assert_close(rollout([l1], head_fusion="min")[0], a1)


def test_gradient_rollout_hand_built():
    attn = torch.tensor([[[0.5, 0.5], [0.2, 0.8]], [[1.0, 0.0], [0.5, 0.5]]])[None]  # (1, 2, 2, 2)
    grad = torch.tensor([[[2.0, -1.0], [1.0, 0.5]], [[-1.0, 3.0], [0.4, 0.0]]])[None]
    # grad * attn: head 0 [[1, -.5], [.2, .4]], head 1 [[-1, 0], [.2, 0]]; clipped at 0 then mean over heads:
    abar = torch.tensor([[0.5, 0.0], [0.2, 0.2]])
    eye = torch.eye(2)
    torch.testing.assert_close(gradient_rollout([attn], [grad])[0], eye + abar)  # R = I + Ā R, R = I
    # two layers: R = (I + Ā2)(I + Ā1); a zero gradient leaves R unchanged
    torch.testing.assert_close(gradient_rollout([attn, attn], [grad, grad])[0], (eye + abar) @ (eye + abar))
    torch.testing.assert_close(gradient_rollout([attn, attn], [grad, torch.zeros_like(grad)])[0], eye + abar)
    # max fusion of the clipped products: [[1, 0], [.2, .4]]
    torch.testing.assert_close(gradient_rollout([attn], [grad], head_fusion="max")[0],
                               eye + torch.tensor([[1.0, 0.0], [0.2, 0.4]]))


def test_gradient_class_attention_rollout_hand_built():
    ca = torch.tensor([0.5, 0.25, 0.25]).view(1, 1, 1, 3)  # keys [cls, p0, p1], one head
    g1 = torch.tensor([2.0, 4.0, -4.0]).view(1, 1, 1, 3)  # products [1, 1, -1] -> clipped [1, 1, 0]
    g2 = torch.tensor([0.0, 0.0, 4.0]).view(1, 1, 1, 3)  # products [0, 0, 1]
    # layer 1: r = e0 + Ā = [2, 1, 0]; layer 2: r = (1 + 0) r + [0, 0, 1] = [2, 1, 1]
    got = class_attention_rollout([ca, ca], grads=[g1, g2])
    torch.testing.assert_close(got[0], torch.tensor([2.0, 1.0, 1.0]))
    patches = torch.tensor([[1.0, 0.5], [0.0, 2.0]])[None]  # patch relevance of the self-attention stage
    torch.testing.assert_close(class_attention_rollout([ca, ca], patches, grads=[g1, g2])[0],
                               torch.tensor([2.0, 1.0, 2.5]))


def test_rollout_options_are_checked():
    maps = random_maps(2)
    for kwargs in (dict(head_fusion="median"), dict(discard_ratio=1.0), dict(discard_ratio=-0.1)):
        with pytest.raises(ConfigError) as exc:
            rollout(maps, **kwargs)
        one_line(exc)
    with pytest.raises(ConfigError) as exc:
        gradient_rollout(maps, maps[:1])
    assert "one per map" in one_line(exc)
    model = tiny("vit")
    with pytest.raises(ConfigError) as exc:
        explain(model, torch.randn(1, 1, 28, 28), method="gradient", target_class=10)
    assert "0..9" in one_line(exc)
    with pytest.raises(ConfigError) as exc:
        explain(model, torch.randn(1, 1, 28, 28), target_class=3)
    assert "gradient" in one_line(exc)


def _loop_fused(attn: torch.Tensor, grad: torch.Tensor | None, fusion: str, ratio: float, keep_first: bool) -> dict:
    """One image's fused map ``{(i, j): value}`` by plain loops: per entry, fuse the heads' (clipped) values,
    then zero the lowest ``int(ratio * eligible)`` entries."""
    H, Tq, Tk = attn.shape
    vals = {}
    for i in range(Tq):
        for j in range(Tk):
            if grad is None:
                per_head = [float(attn[h, i, j]) for h in range(H)]
            else:
                per_head = [max(float(grad[h, i, j]) * float(attn[h, i, j]), 0.0) for h in range(H)]
            v = {"mean": sum(per_head) / H, "max": max(per_head), "min": min(per_head)}[fusion]
            vals[(i, j)] = max(v, 0.0)
    eligible = sorted((v, ij) for ij, v in vals.items() if not (keep_first and ij == (0, 0)))
    for _, ij in eligible[:int(ratio * len(eligible))]:
        vals[ij] = 0.0
    return vals


def _loop_rollout(maps, grads, layout: TokenLayout, fusion: str, ratio: float) -> list[list[float]]:
    """Per image, the patch relevance read as the head reads the model, by plain loops (the reference)."""
    sa = [k for k, m in enumerate(maps) if m.shape[-2] == m.shape[-1]]
    ca = [k for k, m in enumerate(maps) if m.shape[-2] == 1]
    out = []
    for b in range(maps[0].shape[0]):
        T = maps[sa[0]].shape[-1]
        keys = layout.for_map(maps[sa[0]])
        R = [[float(i == j) for j in range(T)] for i in range(T)]
        for k in sa:
            f = _loop_fused(maps[k][b], None if grads is None else grads[k][b], fusion, ratio, keys.class_token)
            A = [[f[(i, j)] + (i == j) for j in range(T)] for i in range(T)]
            if grads is None:
                A = [[v / sum(row) for v in row] for row in A]
            R = [[sum(A[i][m] * R[m][j] for m in range(T)) for j in range(T)] for i in range(T)]
        patches = list(range(keys.patches.start, keys.patches.stop))
        if ca and layout.reads_class_token:
            r = None
            for k in ca:
                f = _loop_fused(maps[k][b], None if grads is None else grads[k][b], fusion, ratio, True)
                a = [f[(0, j)] + (j == 0) for j in range(T + 1)]
                if grads is None:
                    a = [v / sum(a) for v in a]
                r = a if r is None else [a[0] * r[0]] + [a[0] * r[j] + a[j] for j in range(1, T + 1)]
            out.append([sum(r[1 + m] * R[m][j] for m in range(T)) for j in range(T)])
        elif keys.reads_class_token:
            out.append([R[0][j] for j in patches])
        else:
            out.append([sum(R[i][j] for i in patches) / len(patches) for j in patches])
    return out


@pytest.mark.parametrize("family", ["vit", "vit_avg_registers", "deepvit", "vit5", "cait", "cait_avg"])
def test_every_attention_kind_matches_a_loop_reference(family):
    """Plain, register/avg-pooled, re-attention, QK-norm + RoPE, talking heads + class attention, and CaiT
    pooling its patches: every option of both methods equals the plain-loop reference."""
    if family == "cait_avg":
        torch.manual_seed(0)
        model = vitlab.create_model("cait_xxs24", **TINY, global_pool="avg").eval()
    else:
        model = tiny(family)
    layout = TokenLayout.of(model)
    x = torch.randn(2, 1, 28, 28, generator=torch.Generator().manual_seed(1))
    ag = attention_gradients(model, x)
    assert not any(p.grad is not None for p in model.parameters())
    for method, fusion, ratio in (("attention", "mean", 0.0), ("attention", "max", 0.6), ("attention", "min", 0.3),
                                  ("gradient", "mean", 0.0), ("gradient", "max", 0.5)):
        grads = ag.grads if method == "gradient" else None
        got = model_rollout(ag.maps, layout, grads=grads, head_fusion=fusion, discard_ratio=ratio)
        want = torch.tensor(_loop_rollout(ag.maps, grads, layout, fusion, ratio))
        torch.testing.assert_close(got.relevance.flatten(1), want, rtol=1e-4, atol=1e-6)
        r = explain(model, x, method=method, head_fusion=fusion, discard_ratio=ratio)
        torch.testing.assert_close(r.relevance, got.relevance)
        assert ((r.patch_mass > 0) & (r.patch_mass <= 1 + 1e-5)).all()


def test_gradient_rollout_is_class_specific_and_zero_for_a_blind_class():
    model = tiny("vit")
    x = torch.randn(3, 1, 28, 28, generator=torch.Generator().manual_seed(2))
    a = explain(model, x, method="gradient", target_class=1)
    b = explain(model, x, method="gradient", target_class=2)
    assert a.target.tolist() == [1, 1, 1] and not torch.allclose(a.relevance, b.relevance)
    pred = explain(model, x, method="gradient")
    torch.testing.assert_close(pred.target, model(x).argmax(dim=-1))
    with torch.no_grad():
        model.head.weight[4] = 0  # class 4's logit no longer depends on the tokens: every gradient is 0
    blind = explain(model, x, method="gradient", target_class=4)
    assert blind.relevance.abs().max() == 0 and (blind.patch_mass == 0).all()  # R = I: the class token only
    avg = tiny("vit_avg_registers")
    with torch.no_grad():
        avg.head.weight[4] = 0
    blind = explain(avg, x, method="gradient", target_class=4)  # R = I read by average pooling: uniform
    torch.testing.assert_close(blind.relevance, torch.full((3, 4, 4), 1 / 16))


# -------------------------------------------------------------------------- what the head reads (pooling)


def test_layout_follows_the_head():
    assert TokenLayout.of(tiny("vit")).reads_class_token
    pooled = vitlab.create_model("vit_mnist", depth=1, global_pool="avg")  # class token kept, not read
    layout = TokenLayout.of(pooled)
    assert layout.class_token and not layout.reads_class_token and layout.pool == "avg"
    assert not TokenLayout.of(tiny("vit_avg_registers")).reads_class_token
    with pytest.raises(ConfigError) as exc:
        TokenLayout(1, 4, 0, 2, True, pool="max")
    one_line(exc)


def test_cait_with_average_pooling_reads_its_self_attention_stage():
    torch.manual_seed(0)
    model = vitlab.create_model("cait_xxs24", **TINY, global_pool="avg").eval()
    with torch.no_grad():
        maps = model.attention_maps(torch.randn(2, 1, 28, 28))
    r = model_rollout(maps, TokenLayout.of(model))
    torch.testing.assert_close(r.relevance.flatten(1), rollout(maps[:3]).mean(dim=1))  # CA stage ignored
    torch.testing.assert_close(r.patch_mass, torch.ones(2))
    assert default_layer(maps, TokenLayout.of(model)) == 2  # the last self-attention map, not a CA map
    assert "not read by the head" in readout_label(maps[-1], TokenLayout.of(model))


def test_analyze_default_digit_model_shows_what_its_head_reads(tmp_path):
    """vitlab's default on digit data averages the patch tokens: maps, rollout and titles follow it."""
    from vitlab.train.config import MODEL_DEFAULTS

    torch.manual_seed(0)
    model = vitlab.create_model("vit_mnist", depth=2, embed_dim=32, num_heads=4, **MODEL_DEFAULTS["digits"]).eval()
    x = torch.randn(3, 1, 28, 28)
    res = analyze_model(model, x, tmp_path, num_show=2)
    with torch.no_grad():
        maps = model.attention_maps(x)
    torch.testing.assert_close(res.cls_attention, maps[-1][:2, :, 1:, 1:].mean(dim=2).view(2, 4, 4, 4))
    torch.testing.assert_close(res.rollout, rollout(maps)[:2, 1:, 1:].mean(dim=1).view(2, 4, 4))
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["head_reads"] == "mean of patch tokens"
    assert "mean over patch queries" in summary["attention_readout"]
    assert "the head averages the patch tokens" in (tmp_path / "index.html").read_text()


def test_analyze_model_gradient_rollout_options(tmp_path):
    model = tiny("deepvit")
    x = torch.randn(3, 1, 28, 28)
    res = analyze_model(model, x, tmp_path, num_show=3, batch_size=2, method="gradient", head_fusion="max",
                        discard_ratio=0.5, target_class=3)
    want = explain(model, x, method="gradient", head_fusion="max", discard_ratio=0.5, target_class=3)
    torch.testing.assert_close(res.rollout, want.relevance)
    assert res.target.tolist() == [3, 3, 3]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["rollout"]["method"] == "gradient" and summary["rollout"]["discard_ratio"] == 0.5
    assert "gradient-weighted rollout for the class 3 (heads max, lowest 0.5 discarded)" in summary["rollout"]["label"]
    assert {r["image"] for r in read_rows(tmp_path / "attention_maps.csv")} == {"#0 -> 3", "#1 -> 3", "#2 -> 3"}
    with pytest.raises(ConfigError) as exc:
        analyze_model(model, x, tmp_path / "bad", target_class=3)
    assert "--rollout gradient" in one_line(exc)
    assert not (tmp_path / "bad").exists()


# ------------------------------------------------------------------------------------- position embedding


@pytest.mark.parametrize("kind", ["sincos1d", "sincos2d", "learned"])
def test_pos_embed_similarity_diagonal_is_one(kind):
    torch.manual_seed(0)
    model = vitlab.create_model("vit_mnist", depth=1, pos_embed=kind)
    table = patch_pos_embed(model)
    assert table.shape == (16, 64)
    sim = pos_embed_similarity(table)
    torch.testing.assert_close(sim.diagonal(), torch.ones(16), atol=1e-5, rtol=0)
    torch.testing.assert_close(sim, sim.T)
    want = F.cosine_similarity(table[:, None], table[None], dim=-1)
    torch.testing.assert_close(sim, want, atol=1e-5, rtol=0)


def test_patch_pos_embed_drops_prefix_slots():
    vit = vitlab.create_model("vit_mnist", depth=1)  # class slot first (the 1-D sinusoid numbers it 0)
    torch.testing.assert_close(patch_pos_embed(vit), vit.pos_embed[0, 1:])
    for family in ("vit5", "cait"):  # position embedding on the patches only
        model = tiny(family)
        torch.testing.assert_close(patch_pos_embed(model), model.pos_embed[0])
    with pytest.raises(ConfigError) as exc:
        patch_pos_embed(vitlab.create_model("vit_mnist", depth=1, pos_embed="none"))
    assert "pos_embed" in one_line(exc)


def test_sincos2d_similarity_falls_with_distance_and_grid_layout():
    model = vitlab.create_model("vit_mnist", depth=1, pos_embed="sincos2d", img_size=56)  # 8x8 grid
    sim = pos_embed_similarity(patch_pos_embed(model))
    grid = similarity_grid(sim, 8)
    assert grid[2, 3, 5, 1] == sim[2 * 8 + 3, 5 * 8 + 1]
    assert grid[0, 0, 0, 1] > grid[0, 0, 0, 4] and grid[0, 0, 1, 0] > grid[0, 0, 4, 0]


# ------------------------------------------------------------------------------------------------ report


def test_write_report_embeds_figures_tables_command_and_versions(tmp_path):
    Image.new("RGB", (4, 4)).save(tmp_path / "fig.png")
    (tmp_path / "sub").mkdir()
    Image.new("RGB", (4, 4)).save(tmp_path / "sub" / "b.png")
    write_csv(tmp_path / "t.csv", [{"layer": 0, "value": 0.123456}, {"layer": 1, "value": float("nan")}])
    page = write_report(tmp_path, "A <study>", ["vitlab", "analyze", "--output", "my dir"], [
        {"title": "One", "text": "x < y", "figures": ["fig.png", tmp_path / "sub" / "b.png"], "tables": ["t.csv"]},
        {"title": "Two", "tables": [[{"k": "a&b", "v": 2}]]},
    ]).read_text()
    assert '<img src="fig.png"' in page and '<img src="sub/b.png"' in page and str(tmp_path) not in page
    assert "vitlab analyze --output &#x27;my dir&#x27;" in page and "A &lt;study&gt;" in page
    assert "<td>0.1235</td>" in page and "a&amp;b" in page and 'href="t.csv"' in page
    import timm

    for name, version in (("python", None), ("torch", torch.__version__), ("timm", timm.__version__),
                          ("vitlab", vitlab.__version__)):
        assert f"<td>{name}</td>" in page and (version is None or f"<td>{version}</td>" in page)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fig.png", "index.html", "sub", "t.csv"]


def test_write_report_refuses_missing_or_outside_figures(tmp_path):
    out = tmp_path / "report"
    out.mkdir()
    Image.new("RGB", (4, 4)).save(tmp_path / "outside.png")
    for fig in ("missing.png", tmp_path / "outside.png"):
        with pytest.raises(ConfigError) as exc:
            write_report(out, "t", "cmd", [{"title": "s", "figures": [fig]}])
        one_line(exc)
    assert list(out.iterdir()) == []


def test_atomic_path_leaves_nothing_on_error(tmp_path):
    target = tmp_path / "a.txt"
    target.write_text("old")
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("boom")
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["a.txt"]


# ------------------------------------------------------------------------------------------ analyze_model


def test_analyze_model_cait_files_and_numbers(tmp_path):
    model = tiny("cait")
    images = (torch.rand(6, 1, 28, 28, generator=torch.Generator().manual_seed(0)) * 255).to(torch.uint8)
    out = tmp_path / "out"
    res = analyze_model(model, images, out, labels=torch.arange(6), classes=[str(i) for i in range(10)],
                        mean=(0.1307,), std=(0.3081,), num_show=2, batch_size=4, command="vitlab analyze x")
    assert sorted([*res.files, ".vitlab-output.json"]) == sorted(p.name for p in out.iterdir())  # + the marker
    for name in ("collapse_similarity.png", "collapse_similar_blocks.png", "residual_ratios.png",
                 "attention_heads.png", "attention_rollout.png", "pos_embed_similarity.png"):
        with Image.open(out / name) as im:
            assert im.format == "PNG" and im.size[0] > 100
    # the CSVs hold the numbers the functions give on the same (standardised) images
    x = (images.float() / 255 - 0.1307) / 0.3081
    with torch.no_grad():
        maps = model.attention_maps(x)
    groups = collapse_groups(maps)
    pairs = read_rows(out / "collapse_similarity.csv")
    assert len(pairs) == 3 * 3 + 2 * 2
    for row in pairs:
        g = groups[0] if row["group"] == "self_attention" else groups[1]
        i, j = g.layers.index(int(row["layer_p"])), g.layers.index(int(row["layer_q"]))
        assert float(row["similarity"]) == pytest.approx(float(g.similarity[i, j]), abs=1e-5)
    ratios = residual_ratios(model, x)
    rows = read_rows(out / "residual_ratios.csv")
    assert [r["kind"] for r in rows] == ["self_attention"] * 3 + ["class_attention"] * 2
    assert [float(r["attn_mean"]) for r in rows] == pytest.approx([r.attn_mean for r in ratios], rel=1e-5)
    att = read_rows(out / "attention_maps.csv")
    assert len(att) == 2 * (4 + 2) * 16  # images x (heads + mean + rollout) x patches
    want = class_token_attention(maps[-1][:2], TokenLayout.of(model))
    first = [float(r["value"]) for r in att if r["image"] == "#0 (0)" and r["map"] == "head1"]
    assert first == pytest.approx(want[0, 1].flatten().tolist(), rel=1e-5)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["model"]["arch"] == "cait" and summary["attention_layer"] == "blocks_token_only.1.attn"
    assert [c["group"] for c in summary["collapse"]] == ["self_attention", "class_attention"]
    html = (out / "index.html").read_text()
    assert all(f'src="{n}"' in html for n in res.files if n.endswith(".png"))
    assert "vitlab analyze x" in html
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # staging folder removed


def test_analyze_model_uniform_attention_reports_collapse(tmp_path):
    model = tiny("vit5")
    d = model.cfg.embed_dim
    with torch.no_grad():
        for blk in model.blocks:
            blk.attn.qkv.weight[: 2 * d] = 0  # zero queries and keys: uniform attention everywhere
    model.train()
    analyze_model(model, torch.randn(3, 1, 28, 28), tmp_path, num_show=1)
    assert model.training  # mode restored
    layers = read_rows(tmp_path / "collapse_layers.csv")
    assert [int(r["similar_blocks"]) for r in layers] == [2, 2, 2]
    assert all(float(r["mean_similarity_others"]) == pytest.approx(1.0, abs=1e-5) for r in layers)
    rollout_rows = [float(r["value"]) for r in read_rows(tmp_path / "attention_maps.csv") if r["map"] == "rollout"]
    assert max(rollout_rows) == pytest.approx(min(rollout_rows), abs=1e-6)  # uniform attention, flat rollout


def test_analyze_model_bad_input_writes_nothing(tmp_path):
    model = tiny("vit")
    out = tmp_path / "out"
    with pytest.raises(DataError) as exc:
        analyze_model(model, torch.rand(2, 3, 32, 32), out)
    assert "img_size=28" in one_line(exc)
    with pytest.raises(ConfigError) as exc:
        analyze_model(model, torch.rand(2, 1, 28, 28), out, layer=7)
    assert "3 attention layers" in one_line(exc)
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------------------- CLI


def write_checkpoint(folder: Path, model: torch.nn.Module, run: dict | None = None) -> Path:
    from vitlab.checkpoint import save_checkpoint

    return save_checkpoint(folder, model, run_config=run)


def test_cli_analyze_writes_every_file(tmp_path, capsys):
    ckpt = write_checkpoint(tmp_path / "ckpt", tiny("vit"), run={"dataset": "mnist-5k", "epochs": 1})
    out = tmp_path / "analysis"
    start = time.perf_counter()
    rc = main(["analyze", "--checkpoint", str(ckpt), "--output", str(out), "--num-images", "12", "--show", "3",
               "--device", "cpu"])
    assert rc == 0 and time.perf_counter() - start < 10
    names = {p.name for p in out.iterdir()}
    assert names == {"collapse_similarity.png", "collapse_similarity.csv", "collapse_layers.csv",
                     "collapse_similar_blocks.png", "residual_ratios.png", "residual_ratios.csv",
                     "attention_heads.png", "attention_rollout.png", "attention_maps.csv", "pos_embed_similarity.png",
                     "pos_embed_similarity.csv", "probes_layers.csv", "probes_heads.csv", "probes.png",
                     "artifact_tokens.png", "summary.json", "index.html", ".vitlab-output.json"}
    html = (out / "index.html").read_text()
    assert "--dataset mnist-5k --num-images 12 --show 3" in html
    assert "Probes per block" in html
    assert len(read_rows(out / "probes_layers.csv")) == len(read_rows(out / "residual_ratios.csv"))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_images"] == 12
    # images are taken class by class, so the three drawn are one digit each
    assert {r["image"] for r in read_rows(out / "attention_maps.csv")} == {"#0 (0)", "#1 (1)", "#2 (2)"}
    assert "index.html" in capsys.readouterr().out


def test_images_are_taken_class_by_class():
    from vitlab.commands.analyze import classes_in_turn

    labels = torch.tensor([0, 0, 0, 1, 1, 2])
    assert classes_in_turn(labels, 4).tolist() == [0, 3, 5, 1]
    assert sorted(classes_in_turn(labels, 100).tolist()) == list(range(6))


def test_cli_missing_checkpoint_exits_2_with_one_line(tmp_path, capsys):
    rc = main(["analyze", "--checkpoint", str(tmp_path / "nope"), "--output", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("vitlab analyze: error: ") and err.count("\n") == 1
    assert "--checkpoint" in err and not (tmp_path / "out").exists()


def test_cli_checkpoint_of_another_architecture_exits_2(tmp_path, capsys):
    ckpt = write_checkpoint(tmp_path / "ckpt", tiny("vit"))
    meta = json.loads((ckpt / "config.json").read_text())
    meta["model"]["depth"] = 4
    (ckpt / "config.json").write_text(json.dumps(meta))
    rc = main(["analyze", "--checkpoint", str(ckpt), "--output", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("vitlab analyze: error: ") and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_cli_timm_checkpoint_exits_2_naming_the_fix(tmp_path, capsys):
    timm_model = vitlab.create_model("timm:vit_tiny_patch16_224", img_size=28, patch_size=7, in_chans=1,
                                     num_classes=10, embed_dim=32, depth=1, num_heads=2)
    ckpt = write_checkpoint(tmp_path / "ckpt", timm_model)
    rc = main(["analyze", "--checkpoint", str(ckpt), "--output", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "vitlab.interop" in err
    assert not (tmp_path / "out").exists()


def test_cli_rollout_options_pass_through(tmp_path, capsys):
    ckpt = write_checkpoint(tmp_path / "ckpt", tiny("vit"), run={"dataset": "mnist-5k"})
    out = tmp_path / "analysis"
    rc = main(["analyze", "--checkpoint", str(ckpt), "--output", str(out), "--num-images", "4", "--show", "2",
               "--device", "cpu", "--rollout", "gradient", "--head-fusion", "max", "--discard-ratio", "0.9",
               "--target-class", "7"])
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rollout"] | {"label": None, "targets": None} == {
        "method": "gradient", "head_fusion": "max", "discard_ratio": 0.9, "target_class": 7, "label": None,
        "targets": None}
    assert summary["rollout"]["targets"] == [7, 7, 7, 7]
    html = (out / "index.html").read_text()
    assert "--rollout gradient --head-fusion max --discard-ratio 0.9 --target-class 7" in html
    assert "gradient-weighted rollout for the class 7" in capsys.readouterr().out
    for bad in (["--discard-ratio", "1.5"], ["--target-class", "3"], ["--rollout", "gradient", "--target-class", "10"]):
        rc = main(["analyze", "--checkpoint", str(ckpt), "--output", str(tmp_path / "bad"), "--num-images", "2",
                   "--device", "cpu", *bad])
        err = capsys.readouterr().err
        assert rc == 2 and err.startswith("vitlab analyze: error: ") and err.count("\n") == 1
        assert not (tmp_path / "bad").exists()
