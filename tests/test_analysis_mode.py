"""Analysis looks at a model without changing it: eval mode inside, the caller's mode restored, no batch-norm
statistics updated, and an image's maps the same alone and inside a batch (DeepViT's batch-normed re-attention,
dropout and drop-path all on in training mode)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

import vitlab
from vitlab.analysis import analyze_model, attention_gradients, explain, residual_ratios, stack_ratios
from vitlab.models.eval_mode import analysis_mode


def _deepvit() -> vitlab.models.VitlabModel:
    torch.manual_seed(0)
    model = vitlab.create_model("deepvit_16b", img_size=32, patch_size=8, depth=2, num_classes=5, drop_rate=0.3,
                                attn_drop_rate=0.3, drop_path_rate=0.3)
    assert any(isinstance(m, nn.BatchNorm2d) for m in model.modules())
    return model.train()


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


ANALYSES: dict[str, Callable[[nn.Module, torch.Tensor], torch.Tensor]] = {
    "attention_maps": lambda m, x: torch.stack([a[:, :, 0] for a in m.attention_maps(x)], 1),
    "residual_ratios_method": lambda m, x: stack_ratios(m.residual_ratios(x))["attn"].T,
    "explain_attention": lambda m, x: explain(m, x).relevance,
    "explain_gradient": lambda m, x: explain(m, x, method="gradient", target_class=1).relevance,
    "attention_gradients": lambda m, x: torch.stack([g[:, :, 0] for g in attention_gradients(m, x, 2).grads], 1),
}


@pytest.mark.parametrize("name", ANALYSES)
def test_an_image_reads_the_same_alone_and_in_a_batch_and_the_model_is_unchanged(name: str) -> None:
    model = _deepvit()
    torch.manual_seed(1)
    x = torch.randn(6, 3, 32, 32)
    before = _state(model)
    with torch.no_grad():
        batch, alone = ANALYSES[name](model, x), ANALYSES[name](model, x[2:3])
    torch.testing.assert_close(alone[0], batch[2], rtol=1e-4, atol=1e-6)
    after = model.state_dict()
    assert before.keys() == after.keys()
    for k, v in before.items():  # the batch norms' running_mean, running_var and num_batches_tracked included
        assert torch.equal(v, after[k]), k
    assert model.training and all(m.training for m in model.modules())


def test_residual_ratios_function_runs_in_eval_mode() -> None:
    model = _deepvit()
    x = torch.randn(5, 3, 32, 32)
    before = _state(model)
    rows = residual_ratios(model, x, batch_size=2)
    alone = [residual_ratios(model, x[i:i + 1]) for i in range(len(x))]
    for j, r in enumerate(rows):  # the mean over images equals the mean of each image alone
        mean = sum(a[j].attn_mean for a in alone) / len(alone)
        assert r.attn_mean == pytest.approx(mean, rel=1e-5)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    assert model.training


def test_analyze_model_leaves_the_model_as_it_was(tmp_path) -> None:
    model = _deepvit()
    model.blocks[0].attn.reattn_norm.eval()  # a caller's mixed mode: a frozen batch norm in a training model
    modes = {n: m.training for n, m in model.named_modules()}
    before = _state(model)
    images = torch.randint(0, 256, (4, 3, 32, 32), dtype=torch.uint8)
    analyze_model(model, images, tmp_path / "out", mean=(0.5,) * 3, std=(0.25,) * 3, num_show=2, batch_size=3)
    assert {n: m.training for n, m in model.named_modules()} == modes
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


def test_analysis_mode_restores_each_module_even_after_an_error() -> None:
    model = _deepvit()
    model.blocks[1].eval()
    modes = {n: m.training for n, m in model.named_modules()}
    with pytest.raises(RuntimeError, match="inside"):
        with analysis_mode(model):
            assert not any(m.training for m in model.modules())
            raise RuntimeError("inside")
    assert {n: m.training for n, m in model.named_modules()} == modes
    model.eval()
    model.attention_maps(torch.randn(1, 3, 32, 32))
    assert not model.training  # an eval model stays in eval mode
