"""Every command's output folder follows one rule (:mod:`vitlab.outputs`): a folder is vitlab's only by vitlab's
marker for that kind of output, and one holding files the command would write, without the marker, is refused
(``--force`` or another ``--output``), so no user file outside vitlab's own folders is changed.

Each refusal hashes the user's files before and after (nothing changed) and checks the CLI ends with exit 2, one
stderr line and no traceback. The table in docs/reliability.md lists the cases.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from _helpers import cli_error, option_args
from _study import finish
from vitlab.cli import main
from vitlab.experiments import runs
from vitlab.outputs import FORMAT, MARKER, marked_by

TINY_RUN = option_args(epochs=1, limit_train=64, limit_test=32, batch_size=32, threads=1, progress=False)


def hashes(root: Path) -> dict[str, str]:
    """SHA-256 of every file under ``root`` (links not followed), keyed by path."""
    return {str(f): hashlib.sha256(f.read_bytes()).hexdigest()
            for f in sorted(root.rglob("*")) if f.is_file() and not f.is_symlink()}



def user_folder(folder: Path, *names: str) -> Path:
    """A user's folder holding ``names`` (files a command would write) and a file of their own."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in (*names, "notes.txt"):
        (folder / name).write_text(f"the user's {name}\n" * 20)
    return folder


def fake_trainer(cfg, init=None) -> dict:
    """Stands in for the trainer: a finished run's record (checkpoint, summary.json) in the run's folder."""
    return finish(cfg, {"final_test_acc": 0.5, "best_test_acc": 0.5, "train_time_s": 1.0, "train_cpu_s": 0.5,
                        "wall_time_s": 2.0, "epochs": 1, "params": 1000, "macs": 5000})


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    """A tiny vitlab checkpoint trained on nothing (analyze and eval only read it)."""
    import vitlab
    from vitlab.checkpoint import save_checkpoint

    model = vitlab.create_model("vit_mnist", depth=1, embed_dim=16, num_heads=2)
    return save_checkpoint(tmp_path / "ckpt", model, run_config={"dataset": "mnist-5k", "limit_test": 16})


def study(command: str, out: Path) -> list[str]:
    """The argv of a small ``command`` study into ``out`` (the trainer is faked by the tests that train)."""
    args = {
        "sweep": ["sweep", "--param", "depth", "--values", "1", "--set", "embed_dim=16", *TINY_RUN],
        "compare": ["compare", "--models", "vit_mnist", "--set", "depth=1", "--set", "embed_dim=16", *TINY_RUN],
        "depth-study": ["depth-study", "--depths", "1", "--variants", "layerscale", *TINY_RUN],
        "complexity": ["complexity", "--img-sizes", "14,28", "--set", "depth=1", "--repeats", "1", "--batch-size",
                       "2", "--threads", "1"],
        "search": ["sweep", "--search", "optuna", "--param", "lr", "--range", "1e-4:1e-2", "--trials", "1",
                   "--set", "depth=1", "--set", "embed_dim=16", *TINY_RUN],
    }[command]
    return [*args, "--output", str(out)]


# ------------------------------------------------------------------------------------------------- analyze

def test_analyze_refuses_a_folder_holding_files_it_would_write(tmp_path, checkpoint, capsys) -> None:
    out = user_folder(tmp_path / "mine", "summary.json", "index.html", "probes.png")
    before = hashes(out)
    msg = cli_error(capsys, ["analyze", "--checkpoint", str(checkpoint), "--output", str(out), "--num-images", "4",
                             "--device", "cpu"])
    assert "index.html, probes.png, summary.json" in msg and "--force" in msg and "another --output" in msg, msg
    assert hashes(out) == before and not (out / MARKER).exists()


def test_analyze_claims_a_folder_of_other_files_and_force_replaces(tmp_path, checkpoint, capsys) -> None:
    out = user_folder(tmp_path / "mine")
    notes = hashes(out)
    argv = ["analyze", "--checkpoint", str(checkpoint), "--output", str(out), "--num-images", "4", "--show", "2",
            "--device", "cpu"]
    assert main(argv) == 0
    assert {k: v for k, v in hashes(out).items() if k in notes} == notes  # the user's own file is untouched
    assert marked_by(out) == ["analyze"] and (out / "index.html").is_file()
    assert main(argv) == 0  # its own folder: the report is replaced
    forced = user_folder(tmp_path / "forced", "summary.json")
    assert main([*argv[:4], str(forced), *argv[5:], "--force"]) == 0
    assert json.loads((forced / "summary.json").read_text())["num_images"] == 4 and marked_by(forced) == ["analyze"]


# ---------------------------------------------------------------------------------------------------- eval

def test_eval_refuses_a_user_confusion_matrix(tmp_path, checkpoint, capsys) -> None:
    out = user_folder(tmp_path / "mine", "confusion_matrix.png")
    before = hashes(out)
    msg = cli_error(capsys, ["eval", "--checkpoint", str(checkpoint), "--output", str(out), "--device", "cpu"])
    assert "confusion_matrix.png" in msg and "--force" in msg, msg
    assert hashes(out) == before
    assert main(["eval", "--checkpoint", str(checkpoint), "--output", str(out), "--device", "cpu", "--force"]) == 0
    assert marked_by(out) == ["eval"] and hashes(out)[str(out / "notes.txt")] == before[str(out / "notes.txt")]


def test_eval_writes_into_its_run_folder_as_before(checkpoint) -> None:
    assert main(["eval", "--checkpoint", str(checkpoint), "--device", "cpu"]) == 0
    assert (checkpoint / "confusion_matrix.png").is_file() and not (checkpoint / MARKER).exists()


# ------------------------------------------------------------------------------------------------- studies

STUDY_FILES = {"sweep": ("results.csv", "summary.csv", "index.html"), "compare": ("results.csv", "compare.png"),
               "depth-study": ("summary.json", "accuracy_vs_depth.png"), "complexity": ("complexity.csv", "fits.csv"),
               "search": ("optuna.db", "trials.csv", "summary.json")}


@pytest.mark.parametrize("command", list(STUDY_FILES))
def test_a_study_refuses_a_user_folder_holding_its_files(tmp_path, monkeypatch, capsys, command) -> None:
    monkeypatch.setattr(runs, "train_run", fake_trainer)
    out = user_folder(tmp_path / "mine", *STUDY_FILES[command])
    before = hashes(out)
    msg = cli_error(capsys, study(command, out))
    assert ", ".join(sorted(STUDY_FILES[command])) in msg and "--force" in msg and "another --output" in msg, msg
    assert hashes(out) == before and sorted(p.name for p in out.iterdir()) == sorted(
        [*STUDY_FILES[command], "notes.txt"])


def test_a_study_claims_its_folder_resumes_there_and_force_replaces(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(runs, "train_run", fake_trainer)
    out = user_folder(tmp_path / "mine")  # a folder of other files is claimed; they stay as they were
    notes = (out / "notes.txt").read_bytes()
    assert main(study("sweep", out)) == 0
    assert marked_by(out) == ["sweep"] and (out / "results.csv").is_file() and (out / "notes.txt").read_bytes() == notes
    calls: list = []
    monkeypatch.setattr(runs, "train_run", lambda cfg, init=None: calls.append(cfg) or {})
    capsys.readouterr()
    assert main(study("sweep", out)) == 0 and calls == []  # its own folder: the finished run is read back
    assert "already finished" in capsys.readouterr().err
    forced = user_folder(tmp_path / "forced", "results.csv")
    assert main([*study("sweep", forced), "--force"]) == 0
    assert "depth" in (forced / "results.csv").read_text() and marked_by(forced) == ["sweep"]


def test_another_commands_study_folder_is_refused(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(runs, "train_run", fake_trainer)
    out = tmp_path / "study"
    assert main(study("compare", out)) == 0
    capsys.readouterr()
    before = hashes(out)
    msg = cli_error(capsys, study("sweep", out))
    assert "is the folder of vitlab compare" in msg and "results.csv" in msg and "--force" in msg, msg
    assert hashes(out) == before and marked_by(out) == ["compare"]


def test_a_study_an_older_vitlab_wrote_is_recognised(tmp_path, monkeypatch, capsys) -> None:
    """A study folder without the marker (an older vitlab) holds vitlab run folders: it is the study's."""
    import vitlab
    from vitlab.checkpoint import save_checkpoint

    monkeypatch.setattr(runs, "train_run", fake_trainer)
    out = user_folder(tmp_path / "old", "results.csv", "summary.csv")
    run = save_checkpoint(out / "depth1_seed0_old", vitlab.create_model("vit_mnist", depth=1, embed_dim=16))
    kept = hashes(run)
    assert main(study("sweep", out)) == 0
    assert marked_by(out) == ["sweep"] and hashes(run) == kept
    assert "depth" in (out / "results.csv").read_text()


def test_a_run_folder_is_never_a_study_folder(tmp_path, checkpoint, monkeypatch, capsys) -> None:
    monkeypatch.setattr(runs, "train_run", fake_trainer)
    before = hashes(checkpoint)
    for extra in ([], ["--force"]):
        msg = cli_error(capsys, [*study("sweep", checkpoint), *extra])
        assert "is a run folder of vitlab" in msg, msg
    msg = cli_error(capsys, ["analyze", "--checkpoint", str(checkpoint), "--output", str(checkpoint), "--force"])
    assert "is a run folder of vitlab" in msg, msg
    assert hashes(checkpoint) == before


def test_a_marker_that_is_a_link_is_not_trusted(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(runs, "train_run", fake_trainer)
    real = tmp_path / "elsewhere.json"
    real.write_text(json.dumps({"format": FORMAT, "commands": ["sweep"]}))
    out = user_folder(tmp_path / "mine", "results.csv")
    (out / MARKER).symlink_to(real)
    before = hashes(tmp_path)
    assert "results.csv" in cli_error(capsys, study("sweep", out))
    assert hashes(tmp_path) == before
