"""Position tables on another patch grid (``dynamic_img_size``, ``set_input_size``, loading at another size): every
patch keeps its 2-D place. timm's ``resample_abs_pos_embed`` and ``VisionTransformer`` are the oracles."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from timm.layers import resample_abs_pos_embed as timm_resample
from timm.models.vision_transformer import VisionTransformer as TimmViT

import vitlab
from vitlab.interop import save_weights
from vitlab.layers.pos_embed import pos_embed_at_grid, sincos_1d

MNIST = dict(depth=2, num_classes=5)  # vit_mnist: 28x28, patch 7 -> a 4x4 grid, 1-D sinusoid, class slot 0


def mnist(**kwargs) -> vitlab.VitlabModel:
    return vitlab.create_model("vit_mnist", **{**MNIST, **kwargs}).eval()


def patch_table(model: vitlab.VitlabModel, grid: tuple[int, int]) -> torch.Tensor:
    """The ``(h, w, D)`` patch positions ``model`` adds on a ``grid`` of patches."""
    table = model.pos_embed_for(grid)
    return table[0, table.shape[1] - grid[0] * grid[1]:].reshape(*grid, -1)


@pytest.mark.parametrize("grid", [(8, 8), (3, 5), (6, 4), (2, 8)])
def test_sincos1d_on_a_new_grid_is_the_2d_resampling_of_the_training_grid(grid: tuple[int, int]) -> None:
    """The 1-D table numbers the 4x4 training grid row-major; on another grid it is resampled as that 2-D grid
    (timm's resampler of learned tables), not renumbered row-major on the new grid."""
    model = mnist(dynamic_img_size=True)
    torch.testing.assert_close(model.pos_embed[0], sincos_1d(17, 64))
    want = timm_resample(model.pos_embed, list(grid), old_size=[4, 4], num_prefix_tokens=1)
    got = model.pos_embed_for(grid)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(got[:, :1], model.pos_embed[:, :1])  # the class slot is not a place on the grid


def test_sincos1d_patches_land_near_their_own_place() -> None:
    """At twice the resolution the patch at (r, c) is most like the training position of (r // 2, c // 2); a table
    renumbered row-major on the 8x8 grid would put (1, 0) at position 9, the training grid's (2, 0)."""
    model = mnist(dynamic_img_size=True)
    train = F.normalize(patch_table(model, (4, 4)).reshape(16, -1), dim=-1)  # (16, D)
    big = F.normalize(patch_table(model, (8, 8)).reshape(64, -1), dim=-1)  # (64, D)
    nearest = (big @ train.T).argmax(dim=-1).reshape(8, 8)
    rows, cols = torch.meshgrid(torch.arange(8), torch.arange(8), indexing="ij")
    assert torch.equal(nearest, (rows // 2) * 4 + cols // 2)


@pytest.mark.parametrize("kind", ["sincos1d", "sincos2d", "learned"])
def test_a_patch_keeps_its_position_when_the_grid_is_unchanged(kind: str) -> None:
    model = mnist(pos_embed=kind, dynamic_img_size=True)
    assert model.pos_embed_for((4, 4)) is model.pos_embed
    assert pos_embed_at_grid(kind, model.pos_embed, (4, 4), 4, num_prefix=1) is model.pos_embed
    fixed = mnist(pos_embed=kind)
    fixed.load_state_dict(model.state_dict())
    before = fixed.pos_embed.detach().clone()
    fixed.set_input_size(img_size=28)
    assert torch.equal(fixed.pos_embed, before)
    x = torch.randn(2, 1, 28, 28)
    with torch.no_grad():
        torch.testing.assert_close(model(x), fixed(x))


def test_sincos2d_keeps_each_patch_coordinates() -> None:
    """The 2-D table is computed for the new grid: patch (r, c) gets the training table's (r, c) entry wherever both
    grids have that place (the grid grows in patch units, as MAE / big_vision compute it)."""
    model = mnist(pos_embed="sincos2d", dynamic_img_size=True)
    train = patch_table(model, (4, 4))
    for grid in ((6, 5), (8, 8), (4, 7)):
        torch.testing.assert_close(patch_table(model, grid)[:4, :4], train[:min(4, grid[0]), :min(4, grid[1])])
    torch.testing.assert_close(patch_table(model, (2, 3)), train[:2, :3])


@pytest.mark.parametrize("kind", ["sincos1d", "learned"])
def test_dynamic_size_set_input_size_and_loading_agree(kind: str, tmp_path) -> None:
    """The three ways to another grid give the same table: a call on a 56x56 image, ``set_input_size(56)`` and
    loading the weights at ``img_size=56``."""
    model = mnist(pos_embed=kind, dynamic_img_size=True)
    if kind == "learned":
        with torch.no_grad():
            model.pos_embed.add_(0.1 * torch.randn_like(model.pos_embed))
    want = timm_resample(model.pos_embed.detach(), [8, 8], old_size=[4, 4], num_prefix_tokens=1)
    fixed = mnist(pos_embed=kind)
    fixed.load_state_dict(model.state_dict())
    fixed.set_input_size(img_size=56)
    torch.testing.assert_close(fixed.pos_embed.detach(), want, rtol=1e-5, atol=1e-5)
    save_weights(model.state_dict(), tmp_path / "w.safetensors")
    loaded = vitlab.load_pretrained(model.cfg.replace(dynamic_img_size=False), tmp_path / "w.safetensors",
                                    img_size=56).eval()
    torch.testing.assert_close(loaded.pos_embed.detach(), want, rtol=1e-5, atol=1e-5)
    x = torch.randn(2, 1, 56, 56)
    with torch.no_grad():
        torch.testing.assert_close(model(x), fixed(x), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(model(x), loaded(x), rtol=1e-5, atol=1e-5)


def test_dynamic_vit_mnist_matches_timm_on_non_square_images() -> None:
    """timm's dynamic ViT given vit_mnist's table as its position embedding resamples it per call; vitlab agrees."""
    model = mnist(dynamic_img_size=True)
    c = model.cfg
    tm = TimmViT(img_size=28, patch_size=7, in_chans=1, num_classes=5, embed_dim=64, depth=2, num_heads=8,
                 global_pool="token", dynamic_img_size=True)
    tm.load_state_dict(vitlab.to_timm(model).state_dict())
    assert c.pos_embed == "sincos1d" and torch.equal(tm.pos_embed, model.pos_embed)
    for shape in ((56, 56), (21, 35), (49, 14)):
        x = torch.randn(2, 1, *shape)
        with torch.no_grad():
            torch.testing.assert_close(model(x), tm.eval()(x), rtol=1e-4, atol=1e-4)


def test_cait_fixed_tables_follow_the_grid() -> None:
    """CaiT's table holds patches only (no class slot): the same rule."""
    cait = vitlab.create_model("cait_xxs24", img_size=32, patch_size=8, embed_dim=32, num_heads=4, depth=1,
                               pos_embed="sincos1d", dynamic_img_size=True)
    want = timm_resample(cait.pos_embed, [3, 5], old_size=[4, 4], num_prefix_tokens=0)
    torch.testing.assert_close(cait.pos_embed_for((3, 5)), want, rtol=1e-5, atol=1e-5)
