"""Known-answer tests of the per-layer probes (vitlab.analysis.probes) and of model.probe on small models."""

from __future__ import annotations

import math

import pytest
import torch

from vitlab.analysis import probes
from vitlab.errors import ConfigError


def test_identical_tokens_are_collapsed():
    x = torch.randn(1, 1, 8).expand(2, 5, 8)
    assert torch.allclose(probes.token_similarity(x), torch.ones(2))
    assert torch.allclose(probes.rank_residual(x), torch.zeros(2), atol=1e-6)
    assert torch.equal(probes.effective_rank(x), torch.zeros(2))  # centred: no spread at all
    assert torch.allclose(probes.effective_rank(x, centre=False), torch.ones(2), atol=1e-5)


def test_orthogonal_tokens():
    n = 6
    x = 3.0 * torch.eye(n).unsqueeze(0)  # n orthogonal tokens of equal norm
    assert torch.allclose(probes.token_similarity(x), torch.zeros(1), atol=1e-6)
    assert torch.allclose(probes.effective_rank(x, centre=False), torch.tensor([float(n)]), atol=1e-4)
    # centred, the n tokens span n - 1 equal directions; the residual is sqrt((n - 1) / n)
    assert torch.allclose(probes.effective_rank(x), torch.tensor([float(n - 1)]), atol=1e-4)
    assert torch.allclose(probes.rank_residual(x), torch.tensor([math.sqrt((n - 1) / n)]), atol=1e-6)


def test_effective_rank_counts_equal_directions_around_any_mean():
    e = torch.eye(5)
    x = torch.stack([e[0], -e[0], e[1], -e[1], 2 * e[2], -2 * e[2]]) + torch.randn(5)  # 3 directions, unequal
    r = float(probes.effective_rank(x))
    s = torch.tensor([math.sqrt(2), math.sqrt(2), 2 * math.sqrt(2)])
    p = s / s.sum()
    assert r == pytest.approx(float((-(p * p.log()).sum()).exp()), rel=1e-4)
    y = torch.stack([e[0], -e[0], e[1], -e[1]]) + 7.0
    assert float(probes.effective_rank(y)) == pytest.approx(2.0, rel=1e-5)


def test_planted_high_norm_token_is_found():
    torch.manual_seed(0)
    x = torch.randn(3, 49, 16)
    x[1, 17] *= 30.0
    mask = probes.outlier_mask(probes.token_norms(x))
    assert mask.sum() == 1 and bool(mask[1, 17])
    # identical norms flag nothing; one larger norm among them is flagged
    same = torch.ones(1, 10)
    assert not probes.outlier_mask(same).any()
    same[0, 3] = 1.5
    assert probes.outlier_mask(same)[0].nonzero().flatten().tolist() == [3]
    with pytest.raises(ConfigError, match="k must be > 0"):
        probes.outlier_mask(same, k=0)


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


def test_probe_batches_agree_with_one_pass():
    torch.manual_seed(1)
    model = _tiny()
    x = torch.randn(6, 1, 16, 16)
    a, b = probes.probe_model(model, x, batch_size=6), probes.probe_model(model, x, batch_size=4)
    for name in ("token_similarity", "effective_rank", "rank_residual", "artifact_count", "max_logit"):
        assert getattr(a, name) == pytest.approx(getattr(b, name), rel=1e-4, abs=1e-6)


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
        for name in ("token_similarity", "effective_rank", "artifact_count", "max_logit", "attn_entropy"):
            assert {f"probe/{name}/block0", f"probe/{name}/block1"} <= set(r), name
    # the last row's probes are those of the saved model on the first 8 training images
    again = probes.probe_model(load_model(out), seen["x"]).columns()
    for key in ("probe/token_similarity/block1", "probe/effective_rank/block0", "probe/max_logit/block1"):
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
