"""Known-answer tests of the per-layer probes (vitlab.analysis.probes), each case over many random draws, and of
probe_model on small models and freshly initialised presets."""

from __future__ import annotations

import math

import pytest
import torch

from vitlab.analysis import probes
from vitlab.errors import ConfigError

DRAWS = 200  # random draws per known-answer case
SHAPES = ((2, 3), (4, 64), (16, 8), (49, 64), (196, 32))  # (N tokens, D channels)


def _scales(g: torch.Generator) -> torch.Tensor:
    """``(DRAWS, 1, 1)`` token scales spread over six decades."""
    return 10 ** (6 * torch.rand(DRAWS, 1, 1, generator=g) - 3)


@pytest.mark.parametrize("n,d", SHAPES)
def test_identical_tokens_have_rank_one_and_no_spread(n, d):
    g = torch.Generator().manual_seed(n * 1000 + d)
    x = (torch.randn(DRAWS, 1, d, generator=g) * _scales(g)).expand(DRAWS, n, d)  # each draw: one vector n times
    assert torch.equal(probes.effective_rank(x, centre=True), torch.zeros(DRAWS))  # exactly 0, every draw
    assert torch.allclose(probes.effective_rank(x, centre=False), torch.ones(DRAWS), atol=1e-5)
    assert torch.allclose(probes.rank_residual(x), torch.zeros(DRAWS), atol=1e-6)
    if n > 1:
        assert torch.allclose(probes.token_similarity(x), torch.ones(DRAWS), atol=1e-5)
    assert torch.equal(probes.effective_rank(torch.zeros(3, n, d), centre=False), torch.zeros(3))


@pytest.mark.parametrize("n,d", SHAPES[1:])
def test_collapsed_tokens_with_tiny_noise_show_rank_one_uncentred_only(n, d):
    """Tokens that are one vector up to a residual of 3e-6 of their size (cosine similarity 1.0): the uncentred
    rank sees the collapse; the centred one is scale-invariant and sees the shape of the tiny noise, as high as for
    random tokens (why both are reported)."""
    g = torch.Generator().manual_seed(n * 1000 + d + 1)
    v = torch.randn(DRAWS, 1, d, generator=g) * _scales(g)
    x = v + 3e-6 * v.norm(dim=-1, keepdim=True) / d ** 0.5 * torch.randn(DRAWS, n, d, generator=g)
    res = probes.rank_residual(x)
    assert bool(((res > 1e-6) & (res < 1e-5)).all())
    assert float(probes.effective_rank(x, centre=False).max()) < 1.01
    assert float(probes.effective_rank(x, centre=True).min()) > 0.5 * min(n - 1, d)


@pytest.mark.parametrize("n,d", SHAPES[1:])
def test_random_tokens_have_a_high_rank(n, d):
    g = torch.Generator().manual_seed(n * 1000 + d + 2)
    x = torch.randn(DRAWS, n, d, generator=g) * _scales(g)
    assert float(probes.effective_rank(x, centre=False).min()) > 0.6 * min(n, d)
    assert float(probes.effective_rank(x, centre=True).min()) > 0.6 * min(n - 1, d)


def test_orthogonal_tokens():
    n = 6
    x = 3.0 * torch.eye(n).unsqueeze(0)  # n orthogonal tokens of equal norm
    assert torch.allclose(probes.token_similarity(x), torch.zeros(1), atol=1e-6)
    assert torch.allclose(probes.effective_rank(x, centre=False), torch.tensor([float(n)]), atol=1e-4)
    # centred, the n tokens span n - 1 equal directions; the residual is sqrt((n - 1) / n)
    assert torch.allclose(probes.effective_rank(x, centre=True), torch.tensor([float(n - 1)]), atol=1e-4)
    assert torch.allclose(probes.rank_residual(x), torch.tensor([math.sqrt((n - 1) / n)]), atol=1e-6)


def test_effective_rank_counts_equal_directions_around_any_mean():
    e = torch.eye(5)
    x = torch.stack([e[0], -e[0], e[1], -e[1], 2 * e[2], -2 * e[2]]) + torch.randn(5)  # 3 directions, unequal
    r = float(probes.effective_rank(x, centre=True))
    s = torch.tensor([math.sqrt(2), math.sqrt(2), 2 * math.sqrt(2)])
    p = s / s.sum()
    assert r == pytest.approx(float((-(p * p.log()).sum()).exp()), rel=1e-4)
    y = torch.stack([e[0], -e[0], e[1], -e[1]]) + 7.0
    assert float(probes.effective_rank(y, centre=True)) == pytest.approx(2.0, rel=1e-5)


NOISE = ((8, 16, 16), (8, 49, 64), (4, 196, 192), (64, 16, 64))  # (images, patch tokens, channels)


@pytest.mark.parametrize("b,n,d", NOISE)
def test_noise_has_no_artifacts(b, n, d):
    """Pure noise crosses the artifact cut in no draw: Gaussian tokens, and Gaussian norms (mean 1, sd up to 0.3)
    with a scale of its own per image."""
    g = torch.Generator().manual_seed(b * n + d)
    flagged = 0
    for _ in range(DRAWS):
        tokens = torch.randn(b, n, d, generator=g) * float(_scales(g)[0])
        sd = 0.3 * float(torch.rand(1, generator=g))
        norms = (1 + sd * torch.randn(b, n, generator=g)).abs() * (1 + torch.rand(b, 1, generator=g))
        flagged += bool(probes.outlier_mask(probes.token_norms(tokens)).any())
        flagged += bool(probes.outlier_mask(norms).any())
    assert flagged <= 0.01 * 2 * DRAWS


@pytest.mark.parametrize("b,n,d", NOISE)
def test_planted_high_norm_tokens_are_found(b, n, d):
    """A few tokens (up to 5 % of them) scaled to 10-100 times the norm of the others are found, and only they,
    among Gaussian tokens; also among norms as bimodal as MNIST digits upsampled to 224 pixels at initialisation
    (75 % blank patches of one norm, ink patches up to 6.6 times it), when planted at 10-100 times the ink."""
    g = torch.Generator().manual_seed(b * n + d + 1)
    exact = 0
    for _ in range(DRAWS):
        tokens = torch.randn(b, n, d, generator=g) * float(_scales(g)[0])
        count = 1 + int(torch.randint(max(1, b * n // 20), (1,), generator=g))
        planted = torch.randperm(b * n, generator=g)[:count]
        factor = 10 ** (1 + torch.rand(count, 1, generator=g))  # 10 to 100
        flat = tokens.view(b * n, d)
        flat[planted] *= factor * tokens.norm(dim=-1).median() / flat[planted].norm(dim=-1, keepdim=True)
        want = torch.zeros(b * n, dtype=torch.bool)
        want[planted] = True
        exact += torch.equal(probes.outlier_mask(probes.token_norms(tokens)).flatten(), want)
        ink = torch.rand(b * n, generator=g) < 0.25
        norms = torch.where(ink, 1.5 + 5.1 * torch.rand(b * n, generator=g), torch.ones(b * n))
        norms[planted] = 6.6 * factor.flatten()
        exact += torch.equal(probes.outlier_mask(norms.view(b, n)).flatten(), want)
    assert exact >= 0.99 * 2 * DRAWS


def test_artifact_rule_known_cut_and_too_few_tokens():
    norms = torch.ones(2, 16)
    norms[0, :5] = 2.0  # the 90th percentile of the 32 norms is 2.0 (0.9 * 31 = 27.9: between two 2.0); log MAD 0
    assert probes.artifact_threshold(norms) == pytest.approx(6.0)
    norms[1, 3] = 6.01
    assert probes.outlier_mask(norms).nonzero().tolist() == [[1, 3]]
    assert probes.artifact_count(norms) == pytest.approx(0.5)
    assert probes.artifact_threshold(norms, ratio=4.0) == pytest.approx(8.0)
    # a broad bulk: k robust standard deviations of the log norms set the cut, not the ratio
    broad = torch.tensor([[2.0 ** i for i in range(-8, 8)]])
    logs = broad.log().flatten()
    sd = probes.MAD_TO_STD * float((logs - logs.sort().values[7]).abs().median())
    assert probes.artifact_threshold(broad, k=6) == pytest.approx(math.exp(float(logs.sort().values[7]) + 6 * sd))
    # fewer than MIN_ARTIFACT_TOKENS patch tokens per image: not measurable, even for 10 x outliers
    few = torch.tensor([[1.00, 1.00, 1.01, 1.02], [1.0, 1.0, 1.0, 10.0]])
    assert math.isnan(probes.artifact_threshold(few)) and math.isnan(probes.artifact_count(few))
    assert not probes.outlier_mask(few).any()
    with pytest.raises(ConfigError, match="k must be > 0"):
        probes.outlier_mask(norms, k=0)
    with pytest.raises(ConfigError, match="ratio must be >= 1"):
        probes.outlier_mask(norms, ratio=0.5)


def test_uniform_attention_entropy_and_mass():
    T = 7
    attn = torch.full((2, 3, T, T), 1.0 / T)
    assert torch.allclose(probes.head_entropy(attn), torch.full((2, 3), math.log(T)))
    keys = torch.zeros(T, dtype=torch.bool)
    keys[[2, 5]] = True
    assert torch.allclose(probes.attention_mass(attn, keys), torch.full((2,), 2 / T))
    one_hot = torch.zeros(1, 1, T, T)
    one_hot[..., 2] = 1.0
    assert torch.allclose(probes.head_entropy(one_hot), torch.zeros(1, 1), atol=1e-6)
    assert float(probes.attention_mass(one_hot, keys, query=0)) == pytest.approx(1.0)


def _tiny(**over):
    from vitlab.models import create_model

    opts = dict(img_size=16, patch_size=4, in_chans=1, num_classes=3, embed_dim=32, depth=2, num_heads=2)
    opts.update(over)
    return create_model("vit_mnist", **opts)


def test_known_max_logit_from_planted_queries_and_keys():
    from vitlab.layers.attention import Attention, record_logits

    attn = Attention(8, num_heads=2, qkv_bias=False)
    with torch.no_grad():
        attn.qkv.weight.zero_()
        attn.qkv.weight[:8] = torch.eye(8)  # q = x
        attn.qkv.weight[8:16] = torch.eye(8)  # k = x
    x = torch.zeros(1, 3, 8)
    x[0, 0, :4] = 2.0  # head 0: q.k of token 0 with itself = 4 * 4 = 16, scaled by 4 ** -0.5
    with torch.no_grad(), record_logits([attn]) as logits:
        attn(x)
    assert probes.max_logit(logits[0]) == pytest.approx(16 / 2)
    assert attn._logits is None  # the recorder is detached again


def test_model_probe_per_layer_and_mode_restored():
    torch.manual_seed(0)
    model = _tiny(reg_tokens=2).train()
    x = torch.randn(5, 1, 16, 16)
    p = probes.probe_model(model, x)
    assert model.training and all(m.training for m in model.modules())
    assert p.layers == [0, 1] and p.num_images == 5
    assert p.token_norms.shape == (2, 5, 16)  # patches only: class and register tokens excluded
    for name in probes.PROBES:
        assert len(getattr(p, name)) == 2
    assert all(len(e) == 2 for e in p.attn_entropy)
    assert all(0 < e <= math.log(1 + 2 + 16) + 1e-5 for ents in p.attn_entropy for e in ents)
    assert all(0 <= m <= 1 for m in p.register_mass_cls + p.register_mass_all)
    # the max logit matches one recomputed from the block's own q and k
    from vitlab.layers.attention import record_logits

    with torch.no_grad(), record_logits(model.blocks[0].modules()) as logits:
        model.eval()(x)
    assert p.max_logit[0] == pytest.approx(float(logits[0].max()), rel=1e-5)
    cols = p.columns()
    assert cols["probe/max_logit/block1"] == pytest.approx(p.max_logit[1])
    # the studies read the columns back per layer: the inverse gives every row's values, other columns ignored
    back = probes.layer_columns({**cols, "epoch": 3, "train_loss": 0.5, "probe/max_logit/blockx": 1.0})
    assert sorted(back) == [0, 1]
    assert back == {r["layer"]: {k: pytest.approx(v, nan_ok=True) for k, v in r.items() if k != "layer"}
                    for r in p.rows()}
    assert len(p.rows()) == 2 and {"norm_q50", "norm_max", "attn_entropy_min_head"} <= set(p.rows()[0])


def test_probe_without_class_token_or_registers_reports_nan_masses():
    model = _tiny(class_token=False, global_pool="avg")
    p = probes.probe_model(model, torch.randn(2, 1, 16, 16))
    assert all(math.isnan(v) for v in p.artifact_mass_cls + p.register_mass_all)
    assert all(math.isfinite(v) for v in p.artifact_mass_all + p.token_similarity)


def _plant(model, token: int = 5, factor: float = 50.0):
    """A forward hook that scales patch token ``token`` of every image by ``factor`` as it leaves the patch
    embedding: a planted high-norm token that every block reads (removed with ``.remove()``)."""
    def scale(_m, _args, out):
        out = out.clone()
        out[:, token] *= factor
        return out
    return model.patch_embed.register_forward_hook(scale)


def test_planted_artifact_in_a_model_is_found_and_its_attention_measured():
    from vitlab.layers.attention import record_attention

    torch.manual_seed(2)
    model = _tiny(reg_tokens=2).eval()  # class token, 2 registers, 16 patch tokens
    x = torch.randn(6, 1, 16, 16)
    clean = probes.probe_model(model, x)
    assert clean.artifact_count == [0.0, 0.0] and clean.artifact_mass_all == [0.0, 0.0]
    hook = _plant(model)
    try:
        p = probes.probe_model(model, x, batch_size=4)
        with torch.no_grad(), record_attention(model.blocks[0].modules()) as maps:
            model(x)
    finally:
        hook.remove()
    assert p.artifact_count == [1.0, 1.0]  # the planted token, in every image, and nothing else
    assert bool(p.outliers[:, :, 5].all()) and int(p.outliers.sum()) == 2 * 6
    front = 1 + 2
    keys = torch.zeros(maps[0].shape[-1], dtype=torch.bool)
    keys[front + 5] = True
    regs = torch.zeros_like(keys)
    regs[1:front] = True
    assert p.artifact_mass_all[0] == pytest.approx(float(probes.attention_mass(maps[0], keys).mean()), rel=1e-5)
    assert p.artifact_mass_cls[0] == pytest.approx(float(probes.attention_mass(maps[0], keys, 0).mean()), rel=1e-5)
    assert p.register_mass_all[0] == pytest.approx(float(probes.attention_mass(maps[0], regs).mean()), rel=1e-5)
    assert p.artifact_mass_all[0] > 0


def test_probe_batches_agree_with_one_pass():
    torch.manual_seed(1)
    model = _tiny()
    x = torch.randn(6, 1, 16, 16)
    hook = _plant(model, token=3, factor=20.0)
    try:
        a, b = probes.probe_model(model, x, batch_size=6), probes.probe_model(model, x, batch_size=4)
    finally:
        hook.remove()
    assert a.artifact_count[0] == 1.0  # the rule pools all 6 images whatever the batch size
    assert a.artifact_threshold == [probes.artifact_threshold(n) for n in a.token_norms]
    for ra, rb in zip(a.rows(), b.rows(), strict=True):  # every probe and norm quantile of every block
        assert ra == pytest.approx(rb, rel=1e-4, abs=1e-6, nan_ok=True)
    assert torch.equal(a.outliers, b.outliers)


def _digits(model, n: int) -> torch.Tensor:
    from vitlab.data import load_dataset, normalization, normalize

    cfg = model.cfg
    train, _ = load_dataset("mnist-5k", img_size=cfg.img_size, in_chans=cfg.in_chans, limit_train=n, limit_test=1)
    return normalize(train.images, *normalization("mnist-5k", cfg.in_chans))


@pytest.mark.parametrize("name,images", [("vit_mnist", 64), ("vit_mnist_conv", 64), ("vit_tiny", 4), ("cait_xxs24", 2)])
def test_fresh_presets_have_no_artifacts(name, images):
    """A freshly initialised model on MNIST digits flags no artifact in any block (vit_tiny: digits upsampled to
    224 pixels, whose mostly blank patches make the norms bimodal; a median-based cut flagged ~53 per image)."""
    from vitlab.models import create_model

    model = create_model(name)
    p = probes.probe_model(model, _digits(model, images))
    assert p.artifact_count == [0.0] * len(model.blocks)
    assert p.artifact_mass_all == [0.0] * len(model.blocks)
    assert all(t > 0 for t in p.artifact_threshold)


def test_four_token_default_model_reports_artifacts_not_measurable():
    """The digits default, vit_mnist_conv_patch14, has 4 patch tokens: fewer than MIN_ARTIFACT_TOKENS, so the
    artifact probes are NaN (a per-image median + 6 MAD flagged 0.3-0.7 per image at initialisation)."""
    from vitlab.models import create_model
    from vitlab.train.config import DEFAULT_MODELS

    assert DEFAULT_MODELS["digits"] == "vit_mnist_conv_patch14"
    model = create_model("vit_mnist_conv_patch14")
    p = probes.probe_model(model, _digits(model, 64))
    assert p.token_norms.shape[-1] == 4 < probes.MIN_ARTIFACT_TOKENS
    for name in ("artifact_count", "artifact_threshold", "artifact_mass_all"):
        assert all(math.isnan(v) for v in getattr(p, name)), name
    assert not p.outliers.any()
    assert all(math.isfinite(v) for v in p.effective_rank_uncentred + p.token_similarity)


def test_older_records_effective_rank_reads_as_the_centred_one():
    old = {"probe/effective_rank/block0": 3.5, "probe/max_logit/block0": 2.0}
    assert probes.layer_columns(old) == {0: {"effective_rank_centred": 3.5, "max_logit": 2.0}}
    both = {"effective_rank": 1.0, "effective_rank_centred": 2.0}
    assert probes.current_names(both) == {"effective_rank_centred": 2.0}


def test_probes_per_epoch_in_metrics_and_tensorboard(tmp_path):
    from _helpers import run_config
    from vitlab.checkpoint import load_model
    from vitlab.data import normalize
    from vitlab.train import RunConfig, train
    from vitlab.train.logging import read_metrics

    out = tmp_path / "run"
    tb = _has("tensorboard")
    cfg = RunConfig(**run_config(depth=2, embed_dim=16, num_heads=2, limit_train=64, limit_test=32, batch_size=32),
                    epochs=2, output=str(out), device="cpu", threads=1, probe_images=8,
                    logger="tensorboard" if tb else "none")
    seen = {}

    def grab(trainer) -> None:  # the run's own first training images and normalisation
        seen.setdefault("x", normalize(trainer.data.train.images[:8], trainer.data.mean, trainer.data.std))

    train(cfg, on_step=grab)
    rows = read_metrics(out)
    assert [r["epoch"] for r in rows] == [1, 2]
    for r in rows:
        for name in ("token_similarity", "effective_rank_uncentred", "effective_rank_centred", "artifact_count",
                     "max_logit", "attn_entropy"):
            assert {f"probe/{name}/block0", f"probe/{name}/block1"} <= set(r), name
    # the last row's probes are those of the saved model on the first 8 training images
    again = probes.probe_model(load_model(out), seen["x"]).columns()
    for key in ("probe/token_similarity/block1", "probe/effective_rank_uncentred/block0", "probe/max_logit/block1"):
        assert rows[-1][key] == pytest.approx(again[key], rel=1e-4), key
    if tb:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        acc = EventAccumulator(str(out / "tensorboard"))
        acc.Reload()
        events = acc.Scalars("probe/token_similarity/block1")
        assert [e.step for e in events] == [1, 2]
        assert events[-1].value == pytest.approx(rows[-1]["probe/token_similarity/block1"], rel=1e-5)


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


@pytest.mark.slow
def test_depth_study_records_probes_per_layer_and_epoch(tmp_path):
    from _helpers import read_rows
    from vitlab.cli import main

    out = tmp_path / "depth"
    argv = ["depth-study", "--depths", "1,2", "--variants", "vit,layerscale", "--num-images", "8",
            "--probe-images", "8", "--epochs", "2", "--limit-train", "64", "--limit-test", "32", "--batch-size", "32",
            "--set", "embed_dim=16", "--set", "num_heads=2", "--threads", "1", "--no-progress", "--output", str(out)]
    assert main(argv) == 0
    layers = read_rows(out / "probes_layers.csv")
    assert sorted((r["variant"], r["depth"], r["layer"]) for r in layers) == sorted(
        [(v, "1", "0") for v in ("vit", "layerscale")] + [(v, "2", b) for v in ("vit", "layerscale") for b in "01"])
    epochs = read_rows(out / "probes_epochs.csv")
    deep = [r for r in epochs if r["variant"] == "vit" and r["depth"] == "2"]
    assert sorted((r["epoch"], r["layer"]) for r in deep) == [("1", "0"), ("1", "1"), ("2", "0"), ("2", "1")]
    # the study's columns summarise the per-layer end probes of each run
    results = {(r["variant"], r["depth"]): r for r in read_rows(out / "results.csv")}
    mine = [r for r in layers if r["variant"] == "vit" and r["depth"] == "2"]
    assert float(results[("vit", "2")]["probe_max_logit"]) == pytest.approx(max(float(r["max_logit"]) for r in mine))
    assert float(results[("vit", "2")]["probe_similarity_last"]) == pytest.approx(float(mine[-1]["token_similarity"]))
    html = (out / "index.html").read_text()
    assert "Probes against depth" in html and "probes_vs_depth.png" in html and "probes_epochs.png" in html
    assert (out / "probes_vs_depth.png").stat().st_size > 0


def test_probe_rows_read_each_epoch_and_block(tmp_path):
    import json

    from vitlab.experiments.depth_study import probe_rows
    from vitlab.experiments.runs import RunSpec

    rows = [{"epoch": e, "test_acc": 0.5, "probe/max_logit/block0": e, "probe/max_logit/block1": 2 * e,
             "probe/token_similarity/block1": 0.1 * e} for e in (1, 2)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = RunSpec("vit_depth2_seed0", None, {"variant": "vit", "depth": 2, "seed": 0})
    end, epochs = probe_rows(spec, {"probes": [{"layer": 0, "max_logit": 3.0}]}, tmp_path)
    assert end == [{"variant": "vit", "depth": 2, "seed": 0, "layer": 0, "max_logit": 3.0}]
    assert [(r["epoch"], r["layer"], r["max_logit"]) for r in epochs] == [(1, 0, 1), (1, 1, 2), (2, 0, 2), (2, 1, 4)]
    assert epochs[-1]["token_similarity"] == pytest.approx(0.2) and "token_similarity" not in epochs[0]


def test_train_cli_takes_probe_images(tmp_path):
    from vitlab.cli import main

    out = tmp_path / "run"
    rc = main(["train", "--model", "vit_mnist", "--dataset", "mnist-5k", "--epochs", "1", "--limit-train", "64",
               "--limit-test", "32", "--depth", "2", "--threads", "1", "--no-progress", "--probe-images", "8",
               "--output", str(out)])
    assert rc in (0, None)
    import json

    row = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert {"probe/token_similarity/block0", "probe/token_similarity/block1"} <= set(row)


def test_study_columns_name_both_ranks_and_leave_unmeasurable_artifacts_nan():
    from vitlab.analysis.depth_diagnostics import DIAG_VALUES, probe_columns

    nan = float("nan")
    rows = [{"layer": i, "token_similarity": 0.5, "effective_rank_uncentred": 1.5 + i, "effective_rank_centred": 3.0,
             "rank_residual": 0.1, "max_logit": 2.0 * i, "artifact_count": nan, "artifact_mass_all": nan}
            for i in range(2)]
    cols = probe_columns(rows)
    assert {"probe_erank_uncentred_last", "probe_erank_centred_last"} <= set(DIAG_VALUES)
    assert cols["probe_erank_uncentred_last"] == 2.5 and cols["probe_erank_centred_last"] == 3.0
    assert math.isnan(cols["probe_artifacts"]) and math.isnan(cols["probe_artifact_mass"])  # not measurable, not 0
    rows[0]["artifact_count"] = 0.0
    assert probe_columns(rows)["probe_artifacts"] == 0.0
    # a run's diagnostics written before the two ranks: its effective_rank was the centred one
    old = probe_columns([{"effective_rank": 4.0, "artifact_count": 1.0}])
    assert old["probe_erank_centred_last"] == 4.0 and math.isnan(old["probe_erank_uncentred_last"])
