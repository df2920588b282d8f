"""A run's ``summary.json`` names the machine its time came from: ``cpu`` (:func:`vitlab.perf.cpu_id`) and ``gpu``
(the CUDA device's name, None on the CPU); a resumed run records the machine that finished it, and a study reads
back records with and without these keys."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import torch

from _helpers import run_args, run_config
from vitlab import perf
from vitlab.cli import main
from vitlab.experiments.runs import RunSpec, run_or_load
from vitlab.train.config import RunConfig
from vitlab.train.engine import train

TINY_CFG = run_config(limit_train=64, limit_test=32, batch_size=32, threads=1)


def summary(folder: Path) -> dict:
    return json.loads((folder / "summary.json").read_text())


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("machine") / "run"
    args = run_args(progress=False, limit_train=64, limit_test=32, batch_size=32, threads=1)
    assert main(["train", *args, "--epochs", "1", "--device", "cpu", "--output", str(out)]) == 0
    return out


def test_summary_names_the_cpu_and_no_gpu_on_the_cpu(cli_run):
    s = summary(cli_run)
    assert s["device"] == "cpu"
    assert s["cpu"] == perf.cpu_id() and s["cpu"]  # the name with its family and model numbers where known
    assert "gpu" in s and s["gpu"] is None



@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_summary_names_the_gpu_a_run_trained_on(tmp_path):
    result = train(RunConfig(epochs=1, **{**TINY_CFG, "device": "cuda"}, output=str(tmp_path / "run")))
    s = summary(tmp_path / "run")
    assert s["gpu"] == torch.cuda.get_device_name(torch.device(s["device"])) and s["gpu"]
    assert s["cpu"] == perf.cpu_id() and result.summary["gpu"] == s["gpu"]


def test_a_resumed_run_records_the_machine_that_finished_it(tmp_path, monkeypatch):
    cfg = RunConfig(epochs=2, **TINY_CFG, output=str(tmp_path / "run"))

    def stop_after_first_step(loop) -> None:
        if loop.progress.global_step == 1:
            os.kill(os.getpid(), signal.SIGTERM)

    assert train(cfg, on_step=stop_after_first_step).exit_code == 143
    assert not (tmp_path / "run" / "summary.json").exists()
    monkeypatch.setattr(perf, "cpu_id", lambda *a, **k: "Finishing CPU (cpu family 1, model 2)")
    assert main(["train", "--resume", str(tmp_path / "run")]) == 0
    s = summary(tmp_path / "run")
    assert s["cpu"] == "Finishing CPU (cpu family 1, model 2)" and s["gpu"] is None and s["epochs"] == 2


@pytest.mark.parametrize("old", [False, True], ids=["with-machine", "old-record"])
def test_a_study_reads_back_a_finished_run_with_or_without_the_machine(tmp_path, old):
    cfg = RunConfig(epochs=1, **TINY_CFG)
    spec = RunSpec("run", cfg)
    first, ran = run_or_load(spec, tmp_path, lambda c, init=None: train(c).summary)
    assert ran and first["cpu"] == perf.cpu_id()
    if old:  # a record written before vitlab stored the machine (as those under docs/results/runs/)
        path = tmp_path / "run" / "summary.json"
        path.write_text(json.dumps({k: v for k, v in first.items() if k not in ("cpu", "gpu")}, indent=2) + "\n")

    def never(c, init=None):
        raise AssertionError("a finished run was trained again")

    again, ran = run_or_load(spec, tmp_path, never)
    assert not ran and again["final_test_acc"] == first["final_test_acc"]
    assert ("cpu" in again) is not old
