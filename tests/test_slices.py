"""Sliced steps (vitlab.perf.sliced_backward / sliced_forward): the batch as concurrent slices on a thread
pool gives the gradient and outputs of one pass over the batch, the same bits on every run, and the
trainer's --slices option."""

from __future__ import annotations

import json
import random
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import vitlab
from _helpers import run_args
from vitlab import perf
from vitlab.cli import main
from vitlab.errors import ConfigError

TINY = run_args(progress=False, epochs=1)


def grads_of(model: nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters() if p.requires_grad]


def batch(n: int = 24) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return torch.randn(n, 1, 28, 28, generator=g), torch.randint(0, 10, (n,), generator=g)


def sliced_grads(model: nn.Module, x: torch.Tensor, y: torch.Tensor, slices: int, *, jitter: bool = False,
                 seed: int = 0) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Gradients of the mean loss computed as ``slices`` slices (``jitter``: random sleeps reorder threads)."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)

    def loss_fn(a: int, b: int) -> torch.Tensor:
        if jitter:
            time.sleep(random.random() * 0.01)
        return F.cross_entropy(model(x[a:b]), y[a:b], label_smoothing=0.1)

    loss = perf.sliced_backward(loss_fn, len(x), model.parameters(), slices)
    return loss, grads_of(model)


@pytest.mark.parametrize("slices", [2, 3, 5])
def test_sliced_gradient_equals_one_backward(slices):
    model = vitlab.create_model("vit_mnist", depth=2)
    x, y = batch(23)  # uneven slices: their weights must follow their sizes
    loss1, g1 = sliced_grads(model, x, y, 1)
    loss_s, gs = sliced_grads(model, x, y, slices)
    assert torch.allclose(loss_s, loss1, rtol=1e-6, atol=1e-7)
    for a, b in zip(gs, g1):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-6)


def test_sliced_gradient_is_the_same_bits_whatever_the_thread_timing():
    model = vitlab.create_model("vit_mnist", depth=2, drop_path_rate=0.5)  # random layers draw per slice
    model.train()
    x, y = batch(16)
    random.seed(0)
    _, ref = sliced_grads(model, x, y, 2, jitter=True)
    for _ in range(4):
        _, again = sliced_grads(model, x, y, 2, jitter=True)
        assert all(torch.equal(a, b) for a, b in zip(again, ref))
    _, other_seed = sliced_grads(model, x, y, 2, seed=1)
    assert any(not torch.equal(a, b) for a, b in zip(other_seed, ref))  # the masks come from the seed


def test_slices_run_on_concurrent_threads():
    seen, inside, most = set(), [0], [0]
    lock = threading.Lock()

    def loss_fn(a: int, b: int) -> torch.Tensor:
        with lock:
            seen.add(threading.get_ident())
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        time.sleep(0.05)
        with lock:
            inside[0] -= 1
        return (w * (b - a)).sum()

    w = torch.ones(3, requires_grad=True)
    loss = perf.sliced_backward(loss_fn, 8, [w], 2)
    assert len(seen) == 2 and most[0] == 2
    assert loss.item() == pytest.approx(3 * (4 * 4 + 4 * 4) / 8)  # each slice's loss weighted by its share
    assert torch.allclose(w.grad, torch.full((3,), 4.0))


def test_sliced_backward_accumulates_and_skips_unused_parameters():
    w, unused = torch.ones(2, requires_grad=True), torch.ones(2, requires_grad=True)
    w.grad = torch.ones(2)
    perf.sliced_backward(lambda a, b: (w * (b - a)).sum(), 4, [w, unused], 2)
    assert torch.allclose(w.grad, torch.full((2,), 3.0)) and unused.grad is None


def test_sliced_backward_reraises_a_slice_error():
    def loss_fn(a: int, b: int) -> torch.Tensor:
        raise ValueError(f"bad rows {a}:{b}")

    with pytest.raises(ValueError, match="bad rows"):
        perf.sliced_backward(loss_fn, 4, [torch.ones(1, requires_grad=True)], 2)


def test_sliced_forward_equals_one_call_and_keeps_the_mode():
    model = vitlab.create_model("vit_mnist", depth=2).eval()
    x, _ = batch(9)
    modes = []

    def fn(rows: torch.Tensor) -> torch.Tensor:
        modes.append((torch.is_inference_mode_enabled(), torch.is_grad_enabled()))
        return model(rows)

    with torch.inference_mode():
        one = model(x)
        three = perf.sliced_forward(fn, x, 3)
    assert torch.allclose(three, one, atol=1e-6) and three.shape == one.shape
    assert modes == [(True, False)] * 3
    with torch.no_grad():
        perf.sliced_forward(fn, x, 2)
    assert modes[3:] == [(False, False)] * 2


@pytest.mark.parametrize("n,slices,bounds", [
    (10, 3, [(0, 3), (3, 6), (6, 10)]), (4, 4, [(0, 1), (1, 2), (2, 3), (3, 4)]), (2, 5, [(0, 1), (1, 2)]),
    (7, 1, [(0, 7)]),
])
def test_slice_bounds(n, slices, bounds):
    assert perf.slice_bounds(n, slices) == bounds


def test_slice_bounds_refuses_zero():
    with pytest.raises(ConfigError, match="slices must be >= 1"):
        perf.slice_bounds(4, 0)


def test_rng_is_thread_safe_only_with_vitlabs_drop_path():
    assert perf.rng_is_thread_safe(vitlab.create_model("vit_mnist", drop_path_rate=0.2).train())
    assert not perf.rng_is_thread_safe(vitlab.create_model("vit_mnist", drop_rate=0.1).train())
    assert not perf.rng_is_thread_safe(vitlab.create_model("vit_mnist", attn_drop_rate=0.1).train())
    assert perf.rng_is_thread_safe(vitlab.create_model("vit_mnist", drop_rate=0.1).eval())
    from timm.models.vision_transformer import VisionTransformer

    timm_dp = VisionTransformer(img_size=28, patch_size=7, in_chans=1, embed_dim=32, depth=2, num_heads=2,
                                drop_path_rate=0.1).train()
    assert not perf.rng_is_thread_safe(timm_dp)  # timm's DropPath draws from the global generator


def test_batch_norm_couples_the_rows_of_a_batch():
    assert not perf.batch_coupled(vitlab.create_model("vit_mnist").train())
    conv = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.GroupNorm(2, 4))
    assert perf.batch_coupled(conv.train()) and not perf.batch_coupled(conv.eval())


@pytest.mark.parametrize("batch_size,tokens,cores,slices,threads", [
    (128, 17, 2, 2, 1),  # vit_mnist: 64 images x 17 tokens per slice
    (16, 17, 2, 1, 2),  # 8 x 17 = 136 tokens per slice: too little work to split
    (16, 201, 2, 2, 1),  # 224 px inference: 8 images of 201 tokens per slice
    (127, 65, 2, 1, 2),  # an odd batch cannot split evenly
    (128, 17, 1, 1, 1),
    (96, 65, 4, 4, 1),
    (12, 65, 4, 3, 1),  # 4 x 65 = 260 tokens each; 4 slices would get 195
    (8, 65, 4, 2, 2),  # 2 slices of 2 threads each
])
def test_cpu_plan(batch_size, tokens, cores, slices, threads):
    plan = perf.cpu_plan(batch_size, tokens, cores=cores)
    assert (plan.slices, plan.threads) == (slices, threads)
    assert plan.torchrun == (f"torchrun --nproc_per_node={slices}" if slices > 1 else "")


def test_cpu_plan_rejects_bad_sizes():
    with pytest.raises(ConfigError, match="batch_size"):
        perf.cpu_plan(0, 17)
    with pytest.raises(ConfigError, match="tokens_per_image"):
        perf.cpu_plan(8, 0)


# ------------------------------------------------------------------------------------------- the trainer
def summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def epochs(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_trainer_slices_give_the_run_of_one_slice(tmp_path):
    assert main(["train", *TINY, "--drop-path", "0", "--slices", "1", "--output", str(tmp_path / "one")]) == 0
    assert main(["train", *TINY, "--drop-path", "0", "--slices", "2", "--output", str(tmp_path / "two")]) == 0
    one, two = summary(tmp_path / "one"), summary(tmp_path / "two")
    assert (one["slices"], two["slices"]) == (1, 2)
    a, b = epochs(tmp_path / "one")[0], epochs(tmp_path / "two")[0]
    assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-4)
    assert b["test_loss"] == pytest.approx(a["test_loss"], rel=1e-3)
    assert abs(b["test_acc"] - a["test_acc"]) <= 2 / 128


def test_trainer_picks_one_slice_per_core_for_small_models(tmp_path, monkeypatch):
    monkeypatch.setattr(perf.threads, "cpu_cores", lambda: 2)  # where the thread plan looks it up
    assert main(["train", *TINY, "--output", str(tmp_path / "auto")]) == 0
    assert summary(tmp_path / "auto")["slices"] == 2 and summary(tmp_path / "auto")["threads"] == 1
    assert main(["train", *TINY, "--threads", "1", "--output", str(tmp_path / "threads")]) == 0
    assert summary(tmp_path / "threads")["slices"] == 1  # --threads asks for the intra-op plan
    assert main(["train", *TINY, "--set", "drop_rate=0.1", "--output", str(tmp_path / "dropout")]) == 0
    assert summary(tmp_path / "dropout")["slices"] == 1  # dropout draws from the global generator


@pytest.mark.parametrize("extra,match", [
    (["--slices", "2", "--set", "drop_rate=0.1"], "dropout"),
    (["--slices", "2", "--compile"], "compiled"),
    (["--slices", "0"], "slices must be in [1, 4096], got 0"),
])
def test_trainer_refuses_slices_it_cannot_honour(tmp_path, capsys, extra, match):
    out = tmp_path / "o"
    assert main(["train", *TINY, *extra, "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vitlab train: error: ") and err.count("\n") == 1 and match in err
    assert not out.exists()


def test_flush_denormals_restores_and_reaches_the_slice_workers() -> None:
    def seen(x: torch.Tensor) -> torch.Tensor:  # per slice: whether its thread flushes, and a denormal product
        return torch.tensor([[float(perf.flushes_denormals()), (torch.tensor([1e-39]) * 2).item()]] * len(x))

    x = torch.zeros(4, 1)
    assert not perf.flushes_denormals()
    off = perf.sliced_forward(seen, x, 2)  # starts the slice threads outside the block
    assert off[:, 0].eq(0).all() and off[:, 1].gt(0).all()
    with perf.flush_denormals():
        assert perf.flushes_denormals() and (torch.tensor([1e-39]) * 2).item() == 0.0
        on = perf.sliced_forward(seen, x, 2)  # the same, already running, workers now flush too
        with perf.flush_denormals(False):  # nested: off inside, on again after
            assert not perf.flushes_denormals()
        assert perf.flushes_denormals()
    assert on[:, 0].eq(1).all() and on[:, 1].eq(0).all()
    assert not perf.flushes_denormals()
    again = perf.sliced_forward(seen, x, 2)  # and back off in the workers
    assert again[:, 0].eq(0).all()
