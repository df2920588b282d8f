"""`vitlab export`: the Hub folder timm reads (``timm.create_model("local-dir:...")`` against ``vitlab eval``, and
timm's own ``save_config_for_hf`` as the oracle of ``config.json``), ONNX in onnxruntime and torch.export's
``.pt2`` against PyTorch for each preset family and attention kind, and the one-line refusals."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import timm
import torch

import vitlab
from _helpers import cli_error, perturb
from vitlab.checkpoint import load_model
from vitlab.cli import main
from vitlab.data import load_dataset, normalize
from vitlab.interop import export as ex
from vitlab.interop import hub

# one tiny model per family and attention kind (Dosovitskiy et al. 2021; Touvron et al. 2021, CaiT: class attention
# and talking heads; Zhou et al. 2021, DeepViT: re-attention, here in the last block only, behind its conv stem;
# ViT-5: RMSNorm, QK-norm, 2-D RoPE and registers after the patches; Darcet et al. 2024: registers in front)
TINY = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=4, num_classes=5)
FAMILIES = {
    "vit_registers": ("vit_mnist", dict(TINY, img_size=28, patch_size=7, in_chans=1, reg_tokens=2)),
    "cait": ("cait_xxs24", dict(TINY, depth_token_only=1)),
    "deepvit": ("deepvit_s", dict(TINY, reattn_last=1, stem_chans=8)),
    "vit5": ("vit5_small", TINY),
}


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A default `vitlab train` run (no --model: the digits default, vit_mnist_conv_patch14), one short epoch."""
    out = tmp_path_factory.mktemp("export") / "run"
    assert main(["train", "--limit-train", "256", "--limit-test", "128", "--batch-size", "64", "--epochs", "1",
                 "--no-progress", "--output", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def hub_dir(run: Path) -> Path:
    out = run.parent / "hub"
    assert main(["export", str(run), "--format", "hf", "--output", str(out)]) == 0
    return out


def test_timm_loads_the_hub_folder_with_the_logits_of_vitlab_eval(run, hub_dir, capsys):
    capsys.readouterr()
    assert sorted(p.name for p in hub_dir.iterdir()) == ["README.md", "config.json", "manifest.json",
                                                        "model.safetensors"]
    config = json.loads((hub_dir / "config.json").read_text())
    assert config["architecture"] == "vitlab_vit_mnist_conv_patch14"
    theirs = timm.create_model(f"local-dir:{hub_dir}", pretrained=True).eval()
    ours = load_model(run).eval()  # what `vitlab eval --checkpoint RUN` evaluates
    data = timm.data.resolve_data_config(model=theirs)
    assert data["input_size"] == (1, 28, 28) and data["crop_pct"] == 1.0
    assert tuple(data["mean"]) == ours.pretrained_cfg["mean"] and tuple(data["std"]) == ours.pretrained_cfg["std"]
    assert list(theirs.pretrained_cfg["label_names"]) == [str(i) for i in range(10)]
    _, test = load_dataset("mnist-5k", img_size=28, in_chans=1, limit_test=64)
    with torch.no_grad():
        a = theirs(normalize(test.images, data["mean"], data["std"]))
        b = ours(normalize(test.images, ours.pretrained_cfg["mean"], ours.pretrained_cfg["std"]))
    assert torch.equal(a, b)
    # `vitlab eval` reads the Hub folder as it reads the run: the same loss and accuracy
    lines = []
    for folder in (run, hub_dir):
        assert main(["eval", "--checkpoint", str(folder)]) == 0
        lines.append(capsys.readouterr().out.splitlines()[0])
    assert lines[0] == lines[1] and "(128 images, mnist-5k test)" in lines[0]
    (hub_dir / "confusion_matrix.png").unlink()


def test_timm_adapts_the_hub_weights_to_another_shape(hub_dir):
    """Another class count, channel count or image size at creation: the weights adapted as vitlab.load_pretrained
    adapts them (fresh head, summed/repeated stem, resampled positions), the class names dropped with the head."""
    same = timm.create_model(f"local-dir:{hub_dir}", pretrained=True)
    other = timm.create_model(f"local-dir:{hub_dir}", pretrained=True, num_classes=3, in_chans=3, img_size=56).eval()
    assert other.pretrained_cfg["input_size"] == (3, 56, 56) and "label_names" not in other.pretrained_cfg
    assert tuple(other(torch.randn(2, 3, 56, 56)).shape) == (2, 3)
    blocks = {k: v for k, v in same.state_dict().items() if k.startswith("blocks.")}
    assert all(torch.equal(other.state_dict()[k], v) for k, v in blocks.items())


def test_the_model_card_comes_from_the_run_record(run, hub_dir):
    from huggingface_hub.repocard import metadata_load

    summary = json.loads((run / "summary.json").read_text())
    card = (hub_dir / "README.md").read_text()
    meta = metadata_load(hub_dir / "README.md")  # the header the Hub reads
    assert meta["library_name"] == "timm" and meta["license"] == "apache-2.0" and "vitlab" in meta["tags"]
    assert meta["pipeline_tag"] == "image-classification" and meta["datasets"] == ["mnist"]
    assert f"`{summary['command']}`" in card and summary["git_commit"] in card
    assert f"| final test acc | {100 * summary['final_test_acc']:.2f} % |" in card
    assert "mnist-5k (256 training images, 128 test images)" in card and "device cpu" in card
    assert "1 epochs, 64 images per batch, peak lr 0.002" in card and "Dosovitskiy et al. 2021" in card


def test_config_json_is_what_timms_own_writer_writes(run, tmp_path):
    """timm's save_config_for_hf on the same model, told the architecture name, global pool and model_args vitlab
    chose, writes the same config.json but for vitlab's own record under "vitlab"."""
    from timm.models._hub import save_config_for_hf

    model, checkpoint_config = hub.load_checkpoint(run)
    ours = json.loads(json.dumps(hub.hub_config(model, checkpoint_config)))
    assert ours.pop("vitlab") == checkpoint_config
    save_config_for_hf(model, tmp_path / "timm.json", model_args=ours["model_args"],
                       model_config={"pretrained_cfg": {"architecture": ours["architecture"]},
                                     "global_pool": ours["global_pool"]})
    assert json.loads((tmp_path / "timm.json").read_text()) == ours


@pytest.mark.parametrize("name, overrides", [
    ("cait_xxs24", dict(TINY, depth=3, depth_token_only=1)),  # CaiT's LayerScale init re-derived at the new depth
    ("cait_xxs24", dict(TINY, depth=3, depth_token_only=1, init_values=1e-5)),  # ... or kept at the preset's value
    ("vit5_small", dict(TINY, mlp_ratio=2.0, reg_tokens=1, qk_norm=False)),
    (vitlab.ModelConfig(embed_dim=24, depth=1, num_heads=2, img_size=16, patch_size=4, num_classes=3,
                        gate="scalar", block="parallel"), {}),  # no preset name: the closest preset's kwargs
])
def test_model_args_rebuild_a_non_default_architecture_in_timm(name, overrides, tmp_path):
    model = perturb(vitlab.create_model(name, **overrides)).eval()
    hub.save_for_hf(model, tmp_path / "hub")
    config = json.loads((tmp_path / "hub" / "config.json").read_text())
    assert config["vitlab"]["run"] is None and config["architecture"].startswith("vitlab_")
    loaded = timm.create_model(f"local-dir:{tmp_path / 'hub'}", pretrained=True).eval()
    keep = {k: v for k, v in model.cfg.to_dict().items() if k != "name"}
    assert {k: v for k, v in loaded.cfg.to_dict().items() if k != "name"} == keep
    x = torch.randn(2, model.cfg.in_chans, model.cfg.img_size, model.cfg.img_size)
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))


def test_a_timm_model_exports_under_its_own_name(tmp_path):
    model = perturb(vitlab.create_model("timm:vit_tiny_patch16_224", img_size=32, patch_size=8, embed_dim=32,
                                        depth=1, num_heads=2, num_classes=4)).eval()
    hub.save_for_hf(model, tmp_path / "hub")
    loaded = timm.create_model(f"local-dir:{tmp_path / 'hub'}", pretrained=True).eval()
    assert type(loaded) is type(model) and loaded.patch_embed.patch_size == (8, 8)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))


def test_the_hub_folder_is_written_whole_or_not_at_all(run, tmp_path, monkeypatch, capsys):
    out = tmp_path / "hub"
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    msg = cli_error(capsys, ["export", str(run), "--format", "hf", "--output", str(tmp_path / "mine"), "--force"])
    assert "not a Hub folder of vitlab" in msg and (tmp_path / "mine" / "notes.txt").read_text() == "keep"
    assert "is a run folder" in cli_error(capsys, ["export", str(run), "--format", "hf", "--output", str(run),
                                                    "--force"])

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(hub.manifests, "commit", full_disk)
    assert "No space left on device" in cli_error(capsys, ["export", str(run), "--format", "hf", "--output", str(out)])
    assert sorted(os.listdir(tmp_path)) == ["mine"]  # no folder, no temporary left behind
    monkeypatch.undo()
    assert main(["export", str(run), "--format", "hf", "--output", str(out), "--name", "digits"]) == 0
    assert "# Model card for digits" in (out / "README.md").read_text()
    assert "--force" in cli_error(capsys, ["export", str(run), "--format", "hf", "--output", str(out)])
    assert main(["export", str(run), "--format", "hf", "--output", str(out), "--force", "--license", "mit"]) == 0
    assert "license: mit" in (out / "README.md").read_text()
    assert sorted(os.listdir(tmp_path)) == ["hub", "mine"]


def test_an_edited_hub_folder_is_refused(hub_dir, tmp_path, capsys):
    import shutil

    edited = tmp_path / "edited"
    shutil.copytree(hub_dir, edited)
    config = json.loads((edited / "config.json").read_text())
    config["model_args"]["depth"] = 3  # timm would build another model than the one the weights and record are
    (edited / "config.json").write_text(json.dumps(config))
    assert "SHA-256" in cli_error(capsys, ["eval", "--checkpoint", str(edited)])
    assert "do not describe the model" in cli_error(capsys, ["eval", "--checkpoint", str(edited), "--no-verify"])


def test_timm_reads_the_folder_from_the_hub(hub_dir, monkeypatch):
    """Published with ``HfApi().upload_folder(folder_path=DIR)``, the folder's files are what the Hub serves:
    ``timm.create_model("hf-hub:ORG/NAME")`` with timm's download answered from the folder (no network) reads
    config.json and model.safetensors and builds the model that "local-dir:" builds."""
    from huggingface_hub import ModelCard
    from huggingface_hub.errors import EntryNotFoundError
    from timm.models import _hub as timm_hub

    asked = []

    def download(repo_id, filename, revision=None, cache_dir=None, **kwargs):
        asked.append((repo_id, filename))
        if not (hub_dir / filename).is_file():
            raise EntryNotFoundError(f"{filename} is not in {repo_id}")
        return str(hub_dir / filename)

    monkeypatch.setattr(timm_hub, "hf_hub_download", download)
    model = timm.create_model("hf-hub:org/digits", pretrained=True).eval()
    assert ("org/digits", "config.json") in asked and ("org/digits", "model.safetensors") in asked
    assert model.pretrained_cfg["hf_hub_id"] == "org/digits" and model.pretrained_cfg["source"] == "hf-hub"
    local = timm.create_model(f"local-dir:{hub_dir}", pretrained=True).eval()
    x = torch.randn(2, 1, 28, 28)
    with torch.no_grad():
        assert torch.equal(model(x), local(x))
    card = ModelCard((hub_dir / "README.md").read_text())  # the Hub's own parser of the card's header
    assert card.data.library_name == "timm" and card.data.pipeline_tag == "image-classification"


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.full  # ONNX and torch.export of four families (onnxruntime)
def test_onnx_and_pt2_give_pytorchs_logits(family, tmp_path):
    name, overrides = FAMILIES[family]
    model = perturb(vitlab.create_model(name, **overrides)).eval()
    onnx_report = ex.export_onnx(model, tmp_path / "m.onnx")
    pt2_report = ex.export_pt2(model, tmp_path / "m.pt2")
    assert onnx_report.max_diff <= ex.TOLERANCE and pt2_report.max_diff <= ex.TOLERANCE
    session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["images"] and session.get_inputs()[0].shape[0] == "batch"
    meta = json.loads(session.get_modelmeta().custom_metadata_map["vitlab"])
    assert meta["input_size"] == list(model.pretrained_cfg["input_size"]) and meta["num_classes"] == 5
    program = torch.export.load(tmp_path / "m.pt2").module()
    c, h, w = model.pretrained_cfg["input_size"]
    for batch in (1, 5):  # other batch sizes than the one traced
        x = torch.randn(batch, c, h, w)
        with torch.no_grad():
            want = model(x)
            np.testing.assert_allclose(session.run(None, {"images": x.numpy()})[0], want.numpy(), atol=ex.TOLERANCE,
                                       rtol=0)
            torch.testing.assert_close(program(x), want, atol=ex.TOLERANCE, rtol=0)


def test_export_command_defaults_and_refusals(run, tmp_path, monkeypatch, capsys):
    assert main(["export", str(run), "--format", "pt2"]) == 0
    line = capsys.readouterr().out
    assert f"wrote {run.parent / 'run.pt2'}" in line and "torch.export.load on a batch of 3" in line
    assert "--force" in cli_error(capsys, ["export", str(run), "--format", "pt2"])
    assert "--license" in cli_error(capsys, ["export", str(run), "--format", "onnx", "--license", "mit"])
    monkeypatch.setattr(ex, "TOLERANCE", -1.0)  # no export can pass: the file must go
    msg = cli_error(capsys, ["export", str(run), "--format", "pt2", "--output", str(tmp_path / "m.pt2")])
    assert "differs from PyTorch" in msg and "torch.export.load" in msg and not (tmp_path / "m.pt2").exists()
    monkeypatch.setattr(torch.export, "export", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("no\ngraph")))
    msg = cli_error(capsys, ["export", str(run), "--format", "pt2", "--output", str(tmp_path / "m.pt2")])
    assert "cannot be exported with torch.export (no)" in msg and not (tmp_path / "m.pt2").exists()
    monkeypatch.setitem(sys.modules, "onnxscript", None)
    assert "pip install 'vitlab[export]'" in cli_error(capsys, ["export", str(run), "--format", "onnx", "--output",
                                                                 str(tmp_path / "m.onnx")])
    (run.parent / "run.pt2").unlink()


@pytest.mark.slow
@pytest.mark.parametrize("preset", vitlab.list_models())
def test_every_preset_exports(preset, tmp_path):
    """Every preset, at a tiny size, through ONNX in onnxruntime and torch.export (the default tests take one model
    of each family)."""
    row = vitlab.models.PRESETS[preset]
    kw = dict(TINY)
    if row.get("arch") == "cait":
        kw["depth_token_only"] = 1
    if row.get("reattn_last"):
        kw["reattn_last"] = 1
    if row.get("stem") == "conv":
        kw.update(stem_chans=8, patch_size=16)
    model = perturb(vitlab.create_model(preset, **kw)).eval()
    assert ex.export_onnx(model, tmp_path / "m.onnx").max_diff <= ex.TOLERANCE
    assert ex.export_pt2(model, tmp_path / "m.pt2").max_diff <= ex.TOLERANCE
