"""``--logger``: real TensorBoard, MLflow and wandb runs written offline and read back with each backend's own
reader (no mocks of the backends): params, per-epoch metrics, summary, figures, resume, studies, bad input."""

from __future__ import annotations

import importlib.util
import json
import struct
from pathlib import Path

import pytest

from _helpers import run_args, run_config
from vitlab.cli import main
from vitlab.errors import ConfigError
from vitlab.train.config import RunConfig
from vitlab.train.engine import train
from vitlab.train.tracking import STATE, check_logger, flatten

TINY = run_args(depth=1, embed_dim=16, num_heads=2, limit_train=128, limit_test=64, threads=1, progress=False)
TINY_CFG = run_config(depth=1, embed_dim=16, num_heads=2, limit_train=128, limit_test=64, threads=1)
STUDY = ["--epochs", "1", "--limit-train", "64", "--limit-test", "32", "--batch-size", "32", "--threads", "1",
         "--no-progress"]


def rows_of(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def summary_of(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def stop_after(global_step: int):
    def hook(trainer) -> None:
        if trainer.progress.global_step == global_step:
            trainer.stop.request()

    return hook


# ------------------------------------------------------------------------------------------ bad input


def test_unknown_logger_is_refused_before_anything_runs(tmp_path, capsys):
    out = tmp_path / "o"
    assert main(["train", *TINY, "--epochs", "1", "--logger", "comet", "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown logger 'comet'; choose one of none, tensorboard, mlflow, wandb" in err
    assert not out.exists()
    with pytest.raises(ConfigError, match="unknown logger"):
        RunConfig(logger="tb").validate()


@pytest.mark.parametrize("backend", ["tensorboard", "mlflow", "wandb"])
def test_missing_backend_names_the_extra(tmp_path, capsys, monkeypatch, backend):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == backend else real(name, *a))
    with pytest.raises(ConfigError, match=rf"pip install 'vitlab\[{backend}\]'"):
        check_logger(backend)
    out = tmp_path / "o"
    assert main(["train", *TINY, "--epochs", "1", "--logger", backend, "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"needs the {backend} package" in err and "Traceback" not in err
    assert not out.exists()  # refused before any data or folder
    assert main(["sweep", "--param", "depth", "--values", "1", *STUDY, "--logger", backend,
                 "--output", str(tmp_path / "s")]) == 2
    assert f"vitlab[{backend}]" in capsys.readouterr().err and not list((tmp_path / "s").glob("*"))


def test_logger_is_result_neutral_and_may_change_on_resume(tmp_path):
    out = tmp_path / "o"
    assert train(RunConfig(epochs=2, **TINY_CFG, output=str(out)), on_step=stop_after(1)).exit_code == 143
    assert main(["train", "--resume", str(out), "--logger", "tensorboard", "--no-progress"]) == 0
    plain = tmp_path / "plain"
    assert main(["train", *TINY, "--epochs", "2", "--output", str(plain)]) == 0
    assert [{k: v for k, v in r.items() if k != "seconds"} for r in rows_of(out)] == \
           [{k: v for k, v in r.items() if k != "seconds"} for r in rows_of(plain)]
    assert (out / "tensorboard").is_dir() and not (plain / "tensorboard").exists()  # default: no tracker


def test_flatten_nested_params():
    assert flatten({"a": 1, "m": {"depth": 2, "pool": None}, "s": [1.0, 2.0], "b": True}) == \
        {"a": 1, "m.depth": 2, "m.pool": "null", "s": "[1.0, 2.0]", "b": True}


# ------------------------------------------------------------------------------------------ TensorBoard


def tb_events(log_dir: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "images": 0, "tensors": 0})
    acc.Reload()
    return acc


@pytest.mark.full  # tracker round trip
def test_tensorboard_round_trip_with_resume(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.plugins.hparams import plugin_data_pb2

    out = tmp_path / "o"
    cfg = RunConfig(epochs=3, **TINY_CFG, output=str(out), logger="tensorboard")
    assert train(cfg, on_step=stop_after(3)).exit_code == 143  # stopped in epoch 2
    assert main(["train", "--resume", str(out), "--no-progress"]) == 0
    acc = tb_events(out / "tensorboard")
    rows = rows_of(out)
    for key in ("train_loss", "test_loss", "test_acc", "lr", "seconds"):
        events = acc.Scalars(key)
        assert [e.step for e in events] == [1, 2, 3], key  # each epoch once, across the resume
        assert [e.value for e in events] == pytest.approx([r[key] for r in rows], rel=1e-6)
    summary = summary_of(out)
    assert acc.Scalars("summary/final_test_acc")[-1].value == pytest.approx(summary["final_test_acc"])
    assert acc.Scalars("summary/params")[-1].value == summary["params"]
    # the HParams tab: the run's params with the summary numbers as its metrics
    content = acc.PluginTagToContent("hparams")
    start = next(plugin_data_pb2.HParamsPluginData.FromString(c).session_start_info for c in content.values()
                 if plugin_data_pb2.HParamsPluginData.FromString(c).HasField("session_start_info"))
    assert start.hparams["model"].string_value == "vit_mnist"
    assert start.hparams["model_overrides.embed_dim"].number_value == 16
    assert start.hparams["batch_size"].number_value == 64 and start.hparams["logger"].string_value == "tensorboard"
    assert "params/text_summary" in acc.Tags()["tensors"]  # the params as a text table


@pytest.mark.full  # tracker round trip
def test_tensorboard_resume_drops_epochs_logged_after_the_checkpoint(tmp_path):
    pytest.importorskip("tensorboard")
    from vitlab.train.tracking import open_tracker

    first = open_tracker("tensorboard", tmp_path)
    for epoch in (1, 2, 3):  # epochs 2 and 3 were logged, then the run died before their checkpoint
        first.log_metrics({"test_acc": epoch / 10}, epoch)
    first.close("failed")
    again = open_tracker("tensorboard", tmp_path, start_step=1)  # resumed from the epoch-1 checkpoint
    for epoch in (2, 3):
        again.log_metrics({"test_acc": epoch / 100}, epoch)
    again.close()
    events = tb_events(tmp_path / "tensorboard").Scalars("test_acc")
    assert [(e.step, e.value) for e in events] == [(1, pytest.approx(0.1)), (2, pytest.approx(0.02)),
                                                   (3, pytest.approx(0.03))]


@pytest.mark.full  # tracker round trip
def test_tensorboard_study_figures_are_images(tmp_path):
    pytest.importorskip("tensorboard")
    out = tmp_path / "sweep"
    assert main(["sweep", "--param", "depth", "--values", "1", "--set", "embed_dim=16", *STUDY, "--logger",
                 "tensorboard", "--output", str(out)]) == 0
    from PIL import Image

    acc = tb_events(out / "tensorboard")
    (event,) = acc.Images("figures/sweep_depth")
    with Image.open(out / "sweep_depth.png") as figure:
        assert (event.width, event.height) == figure.size
    assert acc.Scalars("summary/runs")[0].value == 1
    assert [p.name for p in out.glob("*/tensorboard")] == ["tensorboard"]  # the training run's own events


# ------------------------------------------------------------------------------------------ MLflow


@pytest.fixture
def mlflow_store(tmp_path_factory, tmp_path, monkeypatch) -> str:
    pytest.importorskip("mlflow")
    # MLflow's file store (a sqlite store is as real but takes 8 s to create); MLflow 3 asks for the opt-in
    uri = (tmp_path_factory.getbasetemp() / "mlruns").as_uri()
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", f"test-{tmp_path.name}")
    monkeypatch.chdir(tmp_path)
    return uri


def mlflow_runs(uri: str, experiment: str) -> list:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    eid = client.get_experiment_by_name(experiment).experiment_id
    return client.search_runs([eid])


@pytest.mark.full  # tracker round trip
def test_mlflow_round_trip_with_resume(tmp_path, mlflow_store):
    from mlflow.tracking import MlflowClient

    out = tmp_path / "o"
    assert main(["train", *TINY, "--epochs", "3", "--logger", "mlflow", "--output", str(out)]) == 0
    client = MlflowClient(mlflow_store)
    run_id = json.loads((out / STATE).read_text())["run_id"]
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "o"
    params = run.data.params
    assert params["model"] == "vit_mnist" and params["model_overrides.embed_dim"] == "16"
    assert params["epochs"] == "3" and float(params["lr"]) == json.loads((out / "config.json").read_text())["run"]["lr"]
    assert json.loads(params["data.classes"]) == [str(i) for i in range(10)]
    rows = rows_of(out)
    for key in ("train_loss", "test_loss", "test_acc", "lr"):
        history = sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)
        assert [(m.step, m.value) for m in history] == [(r["epoch"], pytest.approx(r[key])) for r in rows]
    summary = summary_of(out)
    assert run.data.metrics["final_test_acc"] == pytest.approx(summary["final_test_acc"])
    assert run.data.metrics["params"] == summary["params"] and run.data.tags["summary.device"] == "cpu"

    # a stopped run is KILLED, and --resume continues the same MLflow run to FINISHED
    other = tmp_path / "r"
    cfg = RunConfig(epochs=2, **TINY_CFG, output=str(other), logger="mlflow")
    assert train(cfg, on_step=stop_after(3)).exit_code == 143
    rid = json.loads((other / STATE).read_text())["run_id"]
    assert client.get_run(rid).info.status == "KILLED"
    assert main(["train", "--resume", str(other), "--epochs", "3", "--no-progress"]) == 0
    run = client.get_run(rid)
    assert run.info.status == "FINISHED" and run.data.params["epochs"] == "2" and run.data.tags["resumed.epochs"] == "3"
    steps = sorted(m.step for m in client.get_metric_history(rid, "test_acc"))
    assert steps == [1, 2, 3]
    assert len(mlflow_runs(mlflow_store, f"test-{tmp_path.name}")) == 2


@pytest.mark.full  # tracker round trip
def test_sweep_logs_each_run_and_the_study(tmp_path, mlflow_store):
    from mlflow.tracking import MlflowClient

    out = tmp_path / "sweep"
    argv = ["sweep", "--param", "depth", "--values", "1,2", "--set", "embed_dim=16", *STUDY, "--logger", "mlflow",
            "--output", str(out)]
    assert main(argv) == 0
    runs = {r.info.run_name: r for r in mlflow_runs(mlflow_store, f"test-{tmp_path.name}")}
    assert set(runs) == {"sweep"} | {p.parent.name for p in out.glob("*/summary.json")}
    assert len(runs) == 3
    study = runs.pop("sweep")
    for name, run in runs.items():
        assert run.info.status == "FINISHED"
        assert run.data.metrics["final_test_acc"] == pytest.approx(summary_of(out / name)["final_test_acc"])
        assert study.data.metrics[f"test_acc/{name}".replace("=", "_")] == run.data.metrics["final_test_acc"]
    assert study.data.params["model"] == "vit_mnist" and study.data.metrics["runs"] == 2
    figures = [f.path for f in MlflowClient(mlflow_store).list_artifacts(study.info.run_id, "figures")]
    assert figures == ["figures/sweep_depth.png"]


# ------------------------------------------------------------------------------------------ wandb


def wandb_records(run_dir: Path) -> list:
    """The records of a run's ``.wandb`` file: W&B's LevelDB-style log (7-byte file header; 32 KiB blocks of
    chunks, each ``crc32 (4) | length (2, LE) | type (1: full, 2: first, 3: middle, 4: last)``)."""
    import wandb
    from wandb.proto import wandb_internal_pb2

    wandb.teardown()  # wandb's service writes the file after finish() returns; stopping it flushes everything
    data = next(run_dir.glob("*.wandb")).read_bytes()
    assert data[:4] == b":W&B"
    records, pos, block, pending = [], 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left  # a block's tail too short for a chunk header is padding
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 0 and length == 0:
            continue
        pending += chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def wandb_run(records: list) -> dict:
    """Config, history rows by step and summary of one run's records."""
    config, history, summary = {}, {}, {}
    for r in records:
        kind = r.WhichOneof("record_type")
        if kind == "config":
            config.update({i.key: json.loads(i.value_json) for i in r.config.update})
        elif kind == "history":
            items = {"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in r.history.item}
            history[items.get("_step")] = items
        elif kind == "summary":
            summary.update({"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in r.summary.update})
    return {"config": config, "history": history, "summary": summary}


@pytest.mark.full  # tracker round trip
def test_wandb_offline_round_trip(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb_dir"))
    monkeypatch.setenv("WANDB_PROJECT", "vitlab-test")
    (tmp_path / "wandb_dir").mkdir()
    out = tmp_path / "o"
    assert main(["train", *TINY, "--epochs", "2", "--logger", "wandb", "--output", str(out)]) == 0
    run_id = json.loads((out / STATE).read_text())["run_id"]
    (run_dir,) = (tmp_path / "wandb_dir" / "wandb").glob(f"offline-run-*-{run_id}")
    got = wandb_run(wandb_records(run_dir))
    assert got["config"]["model"] == "vit_mnist" and got["config"]["model_overrides"]["embed_dim"] == 16
    assert got["config"]["data"]["classes"] == [str(i) for i in range(10)] and got["config"]["logger"] == "wandb"
    rows = rows_of(out)
    for r in rows:
        logged = got["history"][r["epoch"]]
        for key in ("train_loss", "test_loss", "test_acc", "lr"):
            assert logged[key] == pytest.approx(r[key]), key
    summary = summary_of(out)
    assert got["summary"]["final_test_acc"] == pytest.approx(summary["final_test_acc"])
    assert got["summary"]["params"] == summary["params"] and got["summary"]["device"] == "cpu"


@pytest.mark.full  # tracker round trip
def test_wandb_study_logs_its_figures(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_DIR", raising=False)
    out = tmp_path / "cmp"
    assert main(["compare", "--models", "vit_mnist", "--set", "depth=1", "--set", "embed_dim=16", *STUDY,
                 "--logger", "wandb", "--output", str(out)]) == 0
    (run_dir,) = (out / "wandb").glob("offline-run-*")  # the study's run, beside its figures
    got = wandb_run(wandb_records(run_dir))
    assert got["config"]["dataset"] == "mnist-5k" and got["summary"]["runs"] == 1
    assert any(k.startswith("figures/compare") for row in got["history"].values() for k in row)
    assert list((run_dir / "files" / "media" / "images" / "figures").glob("compare_*.png"))
    (train_dir,) = [p for p in out.iterdir() if (p / "summary.json").is_file()]
    assert list((train_dir / "wandb").glob("offline-run-*/*.wandb"))  # and one run per training run
