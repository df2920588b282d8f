"""The DeiT III recipe (``--recipe deit3``): what it resolves to, its values against the table of docs/training.md,
3-Augment's one operation per image, repeated augmentation as timm's sampler, and a few steps that learn."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from _helpers import run_config
from vitlab.data.augment import THREE_AUGMENT_OPS, ThreeAugment
from vitlab.errors import ConfigError
from vitlab.train.batches import BatchPipeline, epoch_order
from vitlab.train.config import RunConfig
from vitlab.train.optim import build_optimizer
from vitlab.train.plan import plan_run
from vitlab.train.recipes import DEIT3, recipe_defaults

DOCS = Path(__file__).resolve().parents[1] / "docs" / "training.md"


def test_recipe_resolves_to_lamb_bce_mixup_three_augment_and_repeats():
    cfg = RunConfig(recipe="deit3", dataset="mnist-5k").resolve(4000, width=64)
    assert (cfg.optimizer, cfg.loss, cfg.mixup, cfg.cutmix) == ("lamb", "bce", 0.8, 1.0)
    assert cfg.three_augment and cfg.color_jitter == 0.3 and cfg.repeated_aug == 3
    assert cfg.label_smoothing == 0.0 and cfg.erase_prob == 0.0 and cfg.warmup_epochs == 5
    assert cfg.lr == pytest.approx(4e-3 * cfg.batch_size / 2048) and cfg.drop_path == 0.05
    assert cfg.hflip is False  # digits are never flipped, whatever the recipe
    base = RunConfig(recipe="deit3", dataset="cifar10", batch_size=512).resolve(50_000, width=768)
    assert base.lr == pytest.approx(3e-3 * 512 / 2048) and base.drop_path == 0.2 and base.hflip is True
    # flags win over the recipe; the default recipe leaves the new options unset (adamw, ce, no repeats)
    assert RunConfig(recipe="deit3", lr=1e-3, optimizer="adamw").resolve(4000).lr == 1e-3
    plain = RunConfig().resolve(4000)
    assert (plain.optimizer, plain.loss, plain.repeated_aug, plain.three_augment) == (None, None, None, None)


def test_recipe_builds_timm_pieces_and_layerscale():
    import timm.optim
    from timm.data import Mixup

    plan = plan_run(RunConfig(recipe="deit3", **run_config()))
    assert plan.spec.config.gate == "layerscale"
    assert plan_run(plan.run.replace(model_overrides={"gate": "none"})).spec.config.gate == "none"
    cfg = plan.run
    pipeline = BatchPipeline(cfg, (0.5,), (0.5,), 10, 1)
    assert isinstance(pipeline.three, ThreeAugment) and pipeline.three.ops and pipeline.three.color_jitter == 0.3
    assert isinstance(pipeline.mixup, Mixup)
    assert (pipeline.mixup.mixup_alpha, pipeline.mixup.cutmix_alpha) == (0.8, 1.0)
    model = plan.spec.build()
    opt = build_optimizer(model, lr=cfg.lr, weight_decay=cfg.weight_decay, optimizer=cfg.optimizer)
    assert isinstance(opt, timm.optim.Lamb)
    assert opt.defaults["eps"] == 1e-8 and opt.defaults["max_grad_norm"] == 1.0


def test_values_equal_the_documented_table():
    text = DOCS.read_text()
    section = text.split("## The DeiT III recipe", 1)[1].split("\n## ", 1)[0]
    rows = dict(re.findall(r"^\| `(\w+)` \| `([^`]+)`", section, flags=re.M))
    assert set(rows) >= set(DEIT3) - {"lr"}, set(DEIT3) - set(rows)
    for key, value in DEIT3.items():
        documented = {"true": True, "false": False}.get(rows[key], rows[key])
        if isinstance(value, bool) or isinstance(documented, bool):
            assert documented is value, key
        elif isinstance(value, str):
            assert documented == value, key
        else:
            assert float(documented) == value, key
    small, base, large = (recipe_defaults("deit3", batch_size=2048, width=w) for w in (384, 768, 1024))
    assert (small["lr"], base["lr"], large["lr"]) == (4e-3, 3e-3, 3e-3)
    assert (small["drop_path"], base["drop_path"], large["drop_path"]) == (0.05, 0.2, 0.35)
    assert "`4e-3` x batch / 2048 (width <= 384), `3e-3` x batch / 2048" in rows.get("lr", "") + section
    assert "`0.05` (width <= 384), `0.2` (<= 768), `0.35` (wider)" in section


def test_unknown_recipe_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="unknown recipe 'deit4'; choose one of default, deit3"):
        RunConfig(recipe="deit4").validate()
    with pytest.raises(ConfigError, match="unknown optimizer 'sgd'"):
        RunConfig(optimizer="sgd").validate()


def test_three_augment_applies_exactly_one_op_per_image():
    aug = ThreeAugment(color_jitter=0.0)
    images = torch.randint(0, 256, (24, 3, 12, 12), dtype=torch.uint8)
    out = aug(images, generator=torch.Generator().manual_seed(3))
    params = aug.sample(24, torch.Generator().manual_seed(3))
    assert set(params["op"].tolist()) == {0, 1, 2}  # all three are drawn
    for i, img in enumerate(images):
        results = [ThreeAugment.apply_op(img, op, float(params["sigma"][i])) for op in THREE_AUGMENT_OPS]
        matches = [torch.equal(out[i], r) for r in results]
        assert matches == [k == int(params["op"][i]) for k in range(3)], (i, matches)
    again = aug(images, generator=torch.Generator().manual_seed(3))
    assert torch.equal(out, again)
    # one channel: grayscale is the identity; with the jitter the output still stays uint8 in range
    gray = torch.randint(0, 256, (8, 1, 12, 12), dtype=torch.uint8)
    assert torch.equal(ThreeAugment.apply_op(gray[0], "grayscale"), gray[0])
    jittered = ThreeAugment(color_jitter=0.3)(gray, generator=torch.Generator().manual_seed(0))
    assert jittered.dtype == torch.uint8 and jittered.shape == gray.shape and not torch.equal(jittered, gray)


def test_repeated_aug_order_is_timms_sampler():
    from timm.data.distributed_sampler import RepeatAugSampler

    from vitlab.train.seeding import derive_seed

    order = epoch_order(100, seed=0, epoch=2, repeats=3)
    assert len(order) == 100
    assert torch.equal(order[0::3][:33], order[1::3][:33]) and torch.equal(order[0::3][:33], order[2::3][:33])
    assert len(set(order.tolist())) == 34  # a third of the images, each three times (the last one once)
    sampler = RepeatAugSampler(range(100), num_replicas=1, rank=0, num_repeats=3, selected_round=0)
    sampler.set_epoch(derive_seed(0, 2, 0x5EED))
    assert order.tolist() == list(sampler)
    assert not torch.equal(order, epoch_order(100, seed=1, epoch=2, repeats=3))
    assert torch.equal(epoch_order(100, 0, 2), epoch_order(100, 0, 2, repeats=1))  # off: the plain permutation


def test_a_few_deit3_steps_lower_the_loss(tmp_path):
    import timm.optim

    from vitlab.data import normalize
    from vitlab.train.distributed import init_distributed
    from vitlab.train.engine import Trainer

    cfg = RunConfig(recipe="deit3", **{**run_config(), "limit_train": 128, "batch_size": 32}, epochs=4, lr=3e-3,
                    warmup_epochs=0, output=str(tmp_path / "run"), threads=1)
    ctx = init_distributed("cpu")
    try:
        trainer = Trainer(plan_run(cfg, ctx), ctx)
        assert isinstance(trainer.optimizer, timm.optim.Lamb)
        criterion = trainer._criterion()
        assert type(criterion).__name__ == "BinaryCrossEntropy"
        x = trainer.data.pipeline.train_batch(trainer.data.train.images[:32], trainer.data.train.labels[:32],
                                              torch.Generator().manual_seed(0))
        plain = normalize(trainer.data.train.images[:64], trainer.data.mean, trainer.data.std)
        labels = trainer.data.train.labels[:64]

        def loss_now() -> float:
            trainer.model.eval()
            with torch.no_grad():
                return float(criterion(trainer.model(plain), labels))

        assert x[1].shape == (32, 10)  # mixup's soft targets
        before = loss_now()
        result = trainer.fit()
        after = loss_now()
    finally:
        ctx.close()
    assert result.summary["steps"] == 16
    assert after < before - 0.02, (before, after)


def test_a_deit3_run_resumes_bit_exactly(tmp_path):
    """LAMB's state, the repeated-augmentation order and 3-Augment's draws all continue exactly after a stop."""
    from test_train import assert_same_weights, stop_at, weights
    from vitlab.cli import main
    from vitlab.train.engine import train

    cfg = RunConfig(recipe="deit3", **{**run_config(), "limit_train": 128, "batch_size": 32}, epochs=2, threads=1)
    full = train(cfg.replace(output=str(tmp_path / "full")))
    part = train(cfg.replace(output=str(tmp_path / "part")), on_step=stop_at(3))
    assert (full.exit_code, part.exit_code) == (0, 143)
    assert main(["train", "--resume", str(tmp_path / "part")]) == 0
    assert_same_weights(weights(tmp_path / "part"), weights(tmp_path / "full"))
