"""Studies that fail loudly and trust nothing unchecked (docs/reliability.md, "Studies").

A study reads a run back only when its record verifies (:mod:`vitlab.experiments.record`); a study with a failed run
exits 3 with one line per failed run, never 0 and never a traceback on the terminal; retries only where they can
help; a Ray address where nothing answers is refused in seconds; an input refused at the start leaves no folder.
Every study here is one tiny run (vit_mnist at depth 1, dim 16, 64 images, one epoch: about a second)."""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import sys
import time
from pathlib import Path

import pytest

from _helpers import cli_error, read_rows
from vitlab.cli import main
from vitlab.errors import CheckpointError, WriteError
from vitlab.experiments import runs
from vitlab.experiments.executors import ERROR_LOG, RunTask, can_retry, train_task
from vitlab.experiments.record import UnverifiedRun, check_run, finished_run
from vitlab.train.config import RunConfig

STUDY = ["sweep", "--model", "vit_mnist", "--param", "depth", "--values", "1", "--set", "embed_dim=16",
         "--set", "num_heads=2", "--epochs", "1", "--batch-size", "16", "--limit-train", "64", "--limit-test", "32",
         "--threads", "1", "--device", "cpu", "--no-progress"]
RUN = "depth=1_seed=0"


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny study, finished once; each test works on a copy."""
    out = tmp_path_factory.mktemp("finished") / "study"
    assert main([*STUDY, "--output", str(out)]) == 0
    return out


def copy(finished: Path, tmp_path: Path) -> Path:
    out = tmp_path / "study"
    shutil.copytree(finished, out, symlinks=True)
    return out


def test_control_a_verified_run_is_read_back(finished: Path, tmp_path: Path, capsys) -> None:
    out = copy(finished, tmp_path)
    assert main([*STUDY, "--output", str(out)]) == 0
    assert "already finished, read back" in capsys.readouterr().err
    # a run with other settings and an intact config.json is refused, as before
    assert "epochs 1 there, 2 now" in cli_error(capsys, [*STUDY, "--epochs", "2", "--output", str(out)])


def damage_config(run: Path, how: str) -> None:
    if how == "missing":
        (run / "config.json").unlink()
    elif how == "appended":
        with open(run / "config.json", "ab") as fh:
            fh.write(b" ")
    elif how == "weights":
        data = bytearray((run / "model.safetensors").read_bytes())
        data[-1] ^= 1
        (run / "model.safetensors").write_bytes(bytes(data))
    elif how == "no-manifest":
        (run / "manifest.json").unlink()


@pytest.mark.parametrize("how, said", [("missing", "has no config.json"),
                                       ("appended", "config.json does not match the SHA-256"),
                                       ("weights", "model.safetensors does not match the SHA-256"),
                                       ("no-manifest", "has no manifest.json")])
def test_a_run_whose_record_does_not_verify_is_refused_not_read_back(finished: Path, tmp_path: Path, capsys, how,
                                                                      said) -> None:
    """Before: a missing or edited config.json counted as "no differences", and the run (of any settings) was read
    back into the table with exit 0."""
    out = copy(finished, tmp_path)
    results = (out / "results.csv").read_bytes()
    damage_config(out / RUN, how)
    msg = cli_error(capsys, [*STUDY, "--output", str(out)])
    assert said in msg and "cannot be verified" in msg and "delete that run's folder" in msg, msg
    assert (out / "results.csv").read_bytes() == results  # nothing written, nothing trained
    with pytest.raises(UnverifiedRun, match="cannot be verified"):
        finished_run(out / RUN, RunConfig(model="vit_mnist"))


@pytest.mark.parametrize("summary", ["{}", '{"test_acc": "abc"}', '{"final_test_acc": NaN, "epochs": 1}',
                                     '{"final_test_acc": 0.5, "epochs": 0}', "[" * 5000 + "]" * 5000, "{torn"])
def test_a_summary_without_a_result_is_not_a_finished_run(finished: Path, tmp_path: Path, capsys, summary) -> None:
    """Before: ``{}`` or ``{"test_acc": "abc"}`` was "already finished, read back", a NaN row, exit 0 (and JSON
    nested 5,000 deep a RecursionError). Now the checkpoint (verified) is resumed and the summary written again:
    the row holds the run's accuracy."""
    out = copy(finished, tmp_path)
    good = json.loads((out / RUN / "summary.json").read_text())
    (out / RUN / "summary.json").write_text(summary)
    assert main([*STUDY, "--output", str(out)]) == 0
    err = capsys.readouterr().err
    assert "already finished, read back" not in err and "resuming its checkpoint" in err, err
    assert float(read_rows(out / "results.csv")[0]["test_acc"]) == good["final_test_acc"]
    assert json.loads((out / RUN / "summary.json").read_text())["final_test_acc"] == good["final_test_acc"]


def test_a_summary_alone_is_trained_over(tmp_path: Path, capsys) -> None:
    """A run folder holding only a summary.json (no checkpoint: nothing else to lose) is trained, not read back."""
    out = tmp_path / "study"
    (out / RUN).mkdir(parents=True)
    (out / RUN / "summary.json").write_text(json.dumps({"final_test_acc": 0.99, "epochs": 1}))
    assert main([*STUDY, "--output", str(out)]) == 0
    assert "no verified result" in capsys.readouterr().err
    assert float(read_rows(out / "results.csv")[0]["test_acc"]) != 0.99
    assert (out / RUN / "config.json").is_file()


def test_a_kept_record_without_weights_is_read_back_and_one_without_a_result_refused(finished: Path,
                                                                                     tmp_path: Path) -> None:
    """A run's record kept without its weights (scripts/findings_tables.py --keep-runs: summary, config,
    metrics; no manifest) is read back when its settings equal the cell's; with no result in its summary and nothing
    to resume from it is refused, not trained over."""
    from vitlab import checkpoint
    from vitlab.experiments import record

    assert (record.CONFIG, record.WEIGHTS, record.STATE, record.MANIFEST) == (
        checkpoint.CONFIG, checkpoint.WEIGHTS, checkpoint.STATE, checkpoint.MANIFEST)
    out = copy(finished, tmp_path)
    for name in ("model.safetensors", "state.pt", "manifest.json"):
        (out / RUN / name).unlink()
    cfg = RunConfig(model="vit_mnist", epochs=1, model_overrides={"depth": 1, "embed_dim": 16, "num_heads": 2})
    assert finished_run(out / RUN, cfg)["final_test_acc"] >= 0
    with pytest.raises(UnverifiedRun, match="epochs 1 there, 2 now"):
        finished_run(out / RUN, cfg.replace(epochs=2))
    (out / RUN / "summary.json").write_text("{}")
    with pytest.raises(UnverifiedRun, match="holds no state.pt to resume from"):
        finished_run(out / RUN, cfg)


def test_every_executor_asks_the_same_question(finished: Path, tmp_path: Path) -> None:
    """train_task (what the in-process, local-worker and Ray executors run) refuses the unverified run too."""
    out = copy(finished, tmp_path)
    damage_config(out / RUN, "missing")
    cfg = RunConfig(model="vit_mnist", epochs=1)
    task = RunTask(RUN, cfg, str(out / RUN), runs.train_run)
    result = train_task(task)
    assert result["status"] == "error" and result["config"] and "has no config.json" in result["error"]
    assert check_run(out / "new", cfg) == (None, None)


# ---------------------------------------------------------------- failures and exit statuses


def failure_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("vitlab sweep: run ")]


def test_a_damaged_state_fails_once_exits_3_and_keeps_the_traceback_in_the_log(finished: Path, tmp_path: Path,
                                                                              capsys) -> None:
    """Before: two chained tracebacks per attempt, a retry, exit 0 ("run the study again to retry it")."""
    out = copy(finished, tmp_path)
    (out / RUN / "summary.json").unlink()  # an interrupted run, resumed from its damaged state
    with open(out / RUN / "state.pt", "ab") as fh:
        fh.write(b"garbage")
    code = main([*STUDY, "--retries", "2", "--output", str(out)])
    err = capsys.readouterr().err
    assert code == runs.RUNS_FAILED == 3, err
    assert "Traceback" not in err and "trying again" not in err, err
    (line,) = failure_lines(err)
    assert "state.pt does not match the SHA-256" in line and "a retry cannot help" in line, line
    assert f"traceback in {out / RUN / ERROR_LOG}" in line
    assert "Traceback" in (out / RUN / ERROR_LOG).read_text()
    assert read_rows(out / "results.csv")[0]["failed"] == "True"


def test_a_full_disk_fails_the_run_in_one_line_and_exit_3(tmp_path: Path, capsys, monkeypatch) -> None:
    """Before: six tracebacks and exit 0 although the only run failed."""
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if "state.pt" in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    out = tmp_path / "study"
    code = main([*STUDY, "--output", str(out)])
    err = capsys.readouterr().err
    assert code == 3 and "Traceback" not in err and "trying again" not in err, err
    (line,) = failure_lines(err)
    assert "No space left on device" in line and "a retry cannot help" in line, line
    assert err.splitlines()[-1] == "vitlab sweep: 1 of 1 runs failed (rows marked failed); exit status 3"


def test_a_file_where_a_run_folder_belongs_is_refused_before_any_work(tmp_path: Path, capsys) -> None:
    """Before: with --workers 2 a FileExistsError traceback from claim(), "worker process exited with code 1", exit
    0; with --workers 1 exit 2. Now both: one line, exit 2, before any worker starts."""
    out = tmp_path / "study"
    out.mkdir()
    (out / RUN).write_text("a file of the user's\n")
    for workers in ("1", "2"):
        msg = cli_error(capsys, [*STUDY, "--workers", workers, "--output", str(out)])
        assert f"{out / RUN} is where this study keeps a run, but it is not a folder" in msg
    assert sorted(os.listdir(out)) == [RUN] and (out / RUN).read_text() == "a file of the user's\n"


def test_only_failures_a_retry_can_fix_are_retried() -> None:
    assert not can_retry(CheckpointError("state.pt is damaged"))
    assert not can_retry(WriteError("cannot write the checkpoint"))
    assert not can_retry(OSError(errno.ENOSPC, "No space left on device"))
    assert not can_retry(FileExistsError(errno.EEXIST, "File exists"))
    try:  # a full disk under another error
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as inner:
            raise RuntimeError("file write failed") from inner
    except RuntimeError as exc:
        assert not can_retry(exc)
    assert can_retry(RuntimeError("CUDA out of memory")) and can_retry(ConnectionResetError(errno.ECONNRESET, "x"))


# ---------------------------------------------------------------- Ray


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.xdist_group("ports")  # a port found free must stay free: never beside a Ray head or a rendezvous
def test_a_ray_address_where_nothing_answers_is_refused_in_seconds(tmp_path: Path, capsys) -> None:
    """Before: Ray's GCS warnings every ~40 s, still running after 180 s (only ConnectionError was caught)."""
    address = f"127.0.0.1:{free_port()}"
    start = time.monotonic()
    msg = cli_error(capsys, [*STUDY, "--executor", "ray", "--address", address, "--output", str(tmp_path / "s")])
    assert time.monotonic() - start < 15
    assert f"--address {address}: no Ray cluster answers there" in msg and "ray start --head" in msg, msg
    assert not (tmp_path / "s").exists()


def test_ray_not_installed_leaves_no_folder(tmp_path: Path, capsys, monkeypatch) -> None:
    """Before: a folder holding only .vitlab-output.json."""
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray fails
    msg = cli_error(capsys, [*STUDY, "--executor", "ray", "--output", str(tmp_path / "s")])
    assert "pip install 'vitlab[ray]'" in msg and not (tmp_path / "s").exists()


# ---------------------------------------------------------------- the folder rule


def test_a_bad_probe_images_leaves_no_folder(tmp_path: Path, capsys) -> None:
    """Before: the folder and a run folder holding train.lock."""
    out = tmp_path / "depth"
    msg = cli_error(capsys, ["depth-study", "--depths", "1", "--variants", "vit", "--set", "embed_dim=16",
                             "--set", "num_heads=2", "--epochs", "1", "--limit-train", "64", "--probe-images", "-1",
                             "--output", str(out)])
    assert "probe_images must be in [0, 100000]" in msg and not out.exists()


def test_a_non_utf8_output_name_is_refused_before_training(tmp_path: Path, capsys, monkeypatch) -> None:
    """Before: every run trained, then the report failed to write (and again on every re-run)."""
    calls = []
    monkeypatch.setattr(runs, "train_run", lambda cfg, init=None: calls.append(cfg) or {})
    out = os.fsdecode(bytes(tmp_path) + b"/caf\xe9")
    msg = cli_error(capsys, [*STUDY, "--output", out])
    assert "caf\\xe9" in msg and "not UTF-8" in msg and calls == [] and os.listdir(tmp_path) == []


def test_a_study_stopped_before_any_run_finished_removes_the_folder_it_made(tmp_path: Path, capsys,
                                                                           monkeypatch) -> None:
    """A run refused only once it starts (a ConfigError from the trainer) stops the study in one line; the folder
    this invocation created goes with it; a folder that was there before stays, without the empty run folder."""
    from vitlab.errors import ConfigError

    def refuse(cfg, init=None):
        raise ConfigError("--lr too high for this data")

    monkeypatch.setattr(runs, "train_run", refuse)
    out = tmp_path / "study"
    for made in (True, False):
        assert main([*STUDY, "--output", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.splitlines()[-1] == f"vitlab sweep: error: {RUN}: --lr too high for this data" and "Traceback" \
            not in err, err
        assert out.exists() is not made and not (out / RUN).exists()
        out.mkdir(exist_ok=True)
