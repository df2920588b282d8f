"""Writes that cannot be redirected or destroy work: no write follows a planted link, a folder is a run folder
only by vitlab's own marker, ``convert`` never replaces a file it was not told to, the output never lands in
the data, and a file-system error on the output path is one line.

Each case hashes every file that could be lost before and after the command (nothing changed), and checks the
CLI ends with exit 2, one stderr line and no traceback. The table in docs/reliability.md lists them.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from _helpers import cli_error, run_args, run_config
from vitlab.cli import main
from vitlab.errors import ConfigError, WriteError
from vitlab.train.config import RunConfig
from vitlab.train.distributed import DistContext
from vitlab.train.lock import LOCK, RunLock, check_free
from vitlab.train.logging import RunLogger
from vitlab.train.plan import plan_run

SMALL = dict(limit_train=64, limit_test=32, batch_size=16, device="cpu", threads=1)
TINY = run_args(model="vit_mnist", depth=1, embed_dim=16, num_heads=2, **SMALL, progress=False)
TINY_CFG = run_config(depth=1, embed_dim=16, num_heads=2, **SMALL)
USER_FILES = ("metrics.jsonl", "summary.json", "state.pt", "model.safetensors", "manifest.json", "config.json")


def hashes(*paths: Path) -> dict[str, str]:
    """SHA-256 of every file under ``paths`` (links not followed), keyed by path."""
    out = {}
    for root in paths:
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink())
        for f in files:
            out[str(f)] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out



def victim(folder: Path) -> Path:
    """A user's file that a planted link points at."""
    folder.mkdir(parents=True, exist_ok=True)
    f = folder / "thesis.tex"
    f.write_text("\\chapter{Four years of work}\n" * 50)
    return f


def settle_new(out: Path, force: bool = False) -> Path:
    """The output folder a new run in ``out`` gets (the checks before any data loads)."""
    cfg = RunConfig.from_dict({**TINY_CFG, "output": str(out)}, "test")
    return plan_run(cfg, DistContext(), force=force).out_dir


# ----------------------------------------------------------------------------------- links are not followed

def test_a_lock_link_never_empties_its_target(tmp_path) -> None:
    target = victim(tmp_path / "home")
    out = tmp_path / "run"
    out.mkdir()
    (out / LOCK).symlink_to(target)
    before = hashes(target)
    for attempt in (lambda: RunLock(out).acquire(), lambda: check_free(out)):
        with pytest.raises(WriteError) as info:
            attempt()
        msg = str(info.value)
        assert "\n" not in msg and LOCK in msg and "link" in msg, msg
    assert hashes(target) == before


def test_a_lock_link_in_a_new_run_folder_is_refused_in_one_line(capsys, tmp_path) -> None:
    target = victim(tmp_path / "home")
    out = tmp_path / "run"
    out.mkdir()
    (out / LOCK).symlink_to(target)
    before = hashes(target)
    msg = cli_error(capsys, ["train", *TINY, "--epochs", "1", "--output", str(out)])
    assert LOCK in msg, msg
    assert hashes(target) == before and not (out / "config.json").exists()


def test_a_lock_link_in_a_resumed_run_is_refused_in_one_line(capsys, tmp_path, trained) -> None:
    target = victim(tmp_path / "home")
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    (run / LOCK).unlink()
    (run / LOCK).symlink_to(target)
    before = hashes(target, run)
    msg = cli_error(capsys, ["train", "--resume", str(run), "--epochs", "2"])
    assert LOCK in msg and "link" in msg, msg
    assert hashes(target, run) == before


def test_a_metrics_link_planted_mid_run_is_not_appended_through(tmp_path) -> None:
    target = victim(tmp_path / "home")
    out = tmp_path / "run"
    out.mkdir()
    logger = RunLogger(out, progress=False)
    (out / "metrics.jsonl").unlink()
    (out / "metrics.jsonl").symlink_to(target)
    before = hashes(target)
    row = {"epoch": 1, "train_loss": 1.0, "test_loss": 1.0, "test_acc": 0.5, "lr": 1e-3, "seconds": 1.0}
    with pytest.raises(WriteError) as info:
        logger.log_epoch(row)
    assert "\n" not in str(info.value)
    assert hashes(target) == before


def test_resuming_into_another_folder_does_not_copy_through_a_link(tmp_path, trained) -> None:
    from vitlab.train.resume import open_run_folder

    target = victim(tmp_path / "home")
    out = tmp_path / "copy"
    out.mkdir()
    (out / "metrics.jsonl").symlink_to(target)
    before = hashes(target)
    lock = open_run_folder(out, trained, DistContext())
    lock.release()
    assert hashes(target) == before
    assert not (out / "metrics.jsonl").is_symlink()
    assert (out / "metrics.jsonl").read_bytes() == (trained / "metrics.jsonl").read_bytes()


def test_atomic_writes_replace_a_link_instead_of_writing_through_it(tmp_path) -> None:
    from vitlab import atomic

    target = victim(tmp_path / "home")
    before = hashes(target)
    link = tmp_path / "summary.json"
    link.symlink_to(target)
    atomic.atomic_write_text(link, "{}\n")
    assert hashes(target) == before and not link.is_symlink() and link.read_text() == "{}\n"


# ----------------------------------------------------------------------------------- a run folder by its marker

@pytest.mark.parametrize("name", USER_FILES)
def test_a_folder_without_vitlabs_marker_is_not_overwritten(capsys, tmp_path, name) -> None:
    out = tmp_path / "results"
    out.mkdir()
    (out / name).write_text('{"mine": "two weeks of measurements"}\n')
    (out / "notes.txt").write_text("keep me\n")
    before = hashes(out)
    msg = cli_error(capsys, ["train", *TINY, "--epochs", "1", "--output", str(out)])
    assert name in msg and "--force" in msg and "--output" in msg, msg
    assert hashes(out) == before and sorted(p.name for p in out.iterdir()) == sorted([name, "notes.txt"])
    with pytest.raises(ConfigError, match="--force"):
        settle_new(out)


def test_force_writes_into_a_folder_without_the_marker(capsys, tmp_path) -> None:
    out = tmp_path / "results"
    out.mkdir()
    (out / "metrics.jsonl").write_text("not vitlab's\n")
    (out / "notes.txt").write_text("keep me\n")
    assert main(["train", *TINY, "--epochs", "1", "--output", str(out), "--force"]) == 0
    assert (out / "notes.txt").read_text() == "keep me\n"
    assert json.loads((out / "config.json").read_text())["format"] == "vitlab-checkpoint/1"


def test_a_folder_with_vitlabs_marker_or_nothing_to_lose_is_a_run_folder(tmp_path) -> None:
    stopped = tmp_path / "stopped"  # a run stopped before its first checkpoint: its lock and rows only
    stopped.mkdir()
    (stopped / LOCK).write_text("")
    (stopped / "metrics.jsonl").write_text("")
    assert settle_new(stopped) == stopped
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("keep me\n")
    assert settle_new(empty) == empty
    assert settle_new(tmp_path / "new") == tmp_path / "new"


def test_a_checkpoint_is_still_refused_even_with_force(tmp_path, trained) -> None:
    with pytest.raises(ConfigError, match="--resume"):
        settle_new(trained, force=True)
    other = tmp_path / "other"  # resumed into a folder that holds another run's checkpoint
    shutil.copytree(trained, other)
    cfg = RunConfig.from_dict({**TINY_CFG, "output": str(other)}, "test")
    with pytest.raises(ConfigError, match="another run"):
        plan_run(cfg, DistContext(), resume=trained)


def test_output_inside_the_data_folder_is_refused(capsys, tmp_path) -> None:
    data = tmp_path / "flowers"
    (data / "train" / "rose").mkdir(parents=True)
    before = hashes(data)
    for out in (data / "run", data / "train" / "run"):
        msg = cli_error(capsys, ["train", *TINY, "--dataset", "imagefolder", "--data-dir", str(data),
                                 "--output", str(out)])
        assert "--data-dir" in msg and "--output" in msg, msg
        assert not out.exists()
    assert hashes(data) == before and sorted(p.name for p in data.rglob("*")) == ["rose", "train"]


# ----------------------------------------------------------------------------------- convert

def test_convert_refuses_an_existing_output_unless_overwrite(capsys, tmp_path, trained) -> None:
    out = tmp_path / "exported.safetensors"
    out.write_bytes(b"someone's weights")
    before = hashes(out)
    msg = cli_error(capsys, ["convert", str(trained), str(out)])
    assert "--overwrite" in msg and str(out) in msg, msg
    assert hashes(out) == before
    assert main(["convert", str(trained), str(out), "--overwrite"]) == 0
    assert hashes(out) != before


@pytest.mark.parametrize("name", ["model.safetensors", "other.safetensors"])
def test_convert_never_writes_inside_a_run_folder(capsys, tmp_path, trained, name) -> None:
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    before, names = hashes(run), sorted(p.name for p in run.iterdir())
    for extra in ([], ["--overwrite"]):
        msg = cli_error(capsys, ["convert", str(trained), str(run / name), *extra])
        assert "run folder" in msg, msg
    assert hashes(run) == before and sorted(p.name for p in run.iterdir()) == names


# ----------------------------------------------------------------------------------- file-system errors

def test_a_300_character_output_name_is_one_line(capsys, tmp_path, trained) -> None:
    long = tmp_path / ("r" * 300)
    msg = cli_error(capsys, ["train", *TINY, "--epochs", "1", "--output", str(long)])
    assert "too long" in msg.lower() and "--output" in msg, msg
    msg = cli_error(capsys, ["convert", str(trained), str(tmp_path / ("w" * 300 + ".safetensors"))])
    assert "too long" in msg.lower(), msg


def test_an_output_below_a_file_is_one_line(capsys, tmp_path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x\n")
    before = hashes(blocker)
    msg = cli_error(capsys, ["train", *TINY, "--epochs", "1", "--output", str(blocker / "run")])
    assert "--output" in msg, msg
    assert hashes(blocker) == before


def test_analyze_never_writes_into_a_run_folder(capsys, tmp_path, trained) -> None:
    run = tmp_path / "run"  # analyze writes summary.json and index.html: a run's own summary.json would be replaced
    shutil.copytree(trained, run)
    before, names = hashes(run), sorted(p.name for p in run.iterdir())
    msg = cli_error(capsys, ["analyze", "--checkpoint", str(trained), "--output", str(run), "--device", "cpu",
                             "--num-images", "2"])
    assert "run folder" in msg and "--output" in msg, msg
    assert hashes(run) == before and sorted(p.name for p in run.iterdir()) == names
