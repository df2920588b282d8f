"""``vitlab compare --dry-run`` and ``vitlab lr-sensitivity --dry-run`` (issue "one plan per run"), the way
``vitlab depth-study --dry-run`` works: one plan line per cell of the grid, a finished cell read back rather than
planned, nothing trained, nothing written into ``--output``, and a bad option or cell refused in one line (exit 2)."""

from __future__ import annotations

import contextlib
import hashlib
import io
from pathlib import Path

import pytest

from _helpers import cli_error
from _study import finish
from vitlab.cli import main
from vitlab.experiments import runs

FAST = ["--epochs", "1", "--limit-train", "64", "--limit-test", "32", "--batch-size", "32", "--threads", "1",
        "--no-progress"]


def compare_args(out: Path, *extra: str) -> list[str]:
    """2 models x 2 seeds: 4 cells."""
    return ["compare", "--models", "vit_mnist,vit_tiny", "--set", "vit_mnist:depth=1", "--seeds", "2", *FAST,
            "--output", str(out), "--dry-run", *extra]


def lr_args(out: Path, *extra: str) -> list[str]:
    """2 depths x 2 variants x 2 learning rates x 2 seeds: 16 cells."""
    return ["lr-sensitivity", "--depths", "1,2", "--variants", "vit,layerscale", "--lrs", "1e-3,3e-3", "--seeds",
            "2", "--val-split", "0.25", "--probe-images", "8", "--set", "embed_dim=16", "--set", "num_heads=2",
            *FAST, "--output", str(out), "--dry-run", *extra]


STUDIES = [("compare", compare_args, 4), ("lr sensitivity", lr_args, 16)]


@pytest.fixture
def trained(monkeypatch: pytest.MonkeyPatch) -> list:
    """The runs a trainer was asked for (each refused): a dry run asks for none."""
    from vitlab.train import engine

    calls: list = []

    def refuse(cfg, *args, **kwargs):
        calls.append(cfg)
        raise AssertionError("a dry run trained a run")

    monkeypatch.setattr(runs, "train_run", refuse)
    monkeypatch.setattr(engine, "train", refuse)
    return calls


def dry_run(argv: list[str]) -> list[str]:
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert main(argv) == 0
    return stdout.getvalue().splitlines()


def hashes(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("title, argv, cells", STUDIES)
def test_a_dry_run_plans_one_line_per_cell_and_trains_and_writes_nothing(tmp_path, trained, title, argv, cells):
    out = tmp_path / "study"
    lines = dry_run(argv(out))
    plans = [line for line in lines if line.startswith("[")]
    assert len(plans) == cells and len(lines) == cells + 1
    for i, line in enumerate(plans):
        assert line.startswith(f"[{i + 1}/{cells}] {title} ") and " on mnist-5k (" in line and "epochs x" in line
    assert len({line.split(":")[0].split()[-1] for line in plans}) == cells  # every cell once, by its run's name
    assert lines[-1].startswith(f"{title}: {cells} of {cells} runs to train, about ")
    assert not out.exists() and trained == []


@pytest.mark.parametrize("title, argv, cells", STUDIES)
def test_a_finished_cell_is_read_back_not_planned(tmp_path, trained, monkeypatch, title, argv, cells):
    planned: list = []
    plans = runs.print_plans
    monkeypatch.setattr(runs, "print_plans", lambda specs, *a: planned.extend(specs) or plans(specs, *a))
    out = tmp_path / "study"
    dry_run(argv(out))
    assert len(planned) == cells
    done = planned[1]  # the record a finished run leaves, for the cell as the study plans it
    (out / done.name).mkdir(parents=True)
    finish(done.config.replace(output=str(out / done.name)), {"final_test_acc": 0.5, "epochs": 1})
    before = hashes(out)
    lines = dry_run(argv(out))
    assert f"[2/{cells}] {title} {done.name}: finished, read back" in lines
    assert sum("finished, read back" in line for line in lines) == 1
    assert lines[-1].startswith(f"{title}: {cells - 1} of {cells} runs to train, about ")
    assert hashes(out) == before and sorted(p.name for p in out.iterdir()) == [done.name] and trained == []


@pytest.mark.parametrize("argv, change, words", [
    (compare_args, ["--seeds", "0"], "--seeds must be >= 1"),
    (compare_args, ["--set", "vit_mnist:no_such_option=1"], "no_such_option"),
    (compare_args, ["--models", "vit_mnist,no_such_model"], "unknown preset 'no_such_model'"),
    (lr_args, ["--lrs", "1e-3"], "at least two learning rates"),
    (lr_args, ["--variants", "vit,no_such_variant"], "no_such_variant"),
    (lr_args, ["--set", "depth=3"], "would change what the vit variant sets itself"),  # refused as the cells are made
    (lr_args, ["--val-split", "0"], "val_split"),
])
def test_a_dry_run_refuses_a_bad_option_in_one_line(tmp_path, capsys, trained, argv, change, words):
    out = tmp_path / "study"
    args = argv(out)
    flag, value = change
    args[args.index(flag) + 1] = value
    assert words in cli_error(capsys, args)
    assert not out.exists() and trained == []


@pytest.mark.parametrize("title, argv, cells", STUDIES)
def test_a_dry_run_of_a_running_study_lists_the_runs_another_process_trains(tmp_path, trained, monkeypatch, title,
                                                                            argv, cells):
    from vitlab.train import lock

    out = tmp_path / "study"
    names = [line.split(":")[0].split()[-1] for line in dry_run(argv(out)) if line.startswith("[")]
    busy = out / names[0]
    free = lock.check_free

    def check_free(folder):  # the lock a live study's worker holds on its run
        if Path(folder) == busy:
            exc = lock.RunBusy(f"{folder} is being written by another vitlab train run (process 7281) on host vm")
            exc.holder = "process 7281 on host vm"
            raise exc
        free(folder)

    monkeypatch.setattr(lock, "check_free", check_free)
    lines = dry_run(argv(out))
    assert lines[0] == (f"[1/{cells}] {title} {names[0]}: being trained now by another vitlab run (process 7281 on "
                        "host vm); the study waits for it and reads it back")
    assert lines[-1].startswith(f"{title}: {cells - 1} of {cells} runs to train, about ")
    assert "; 1 being trained now by another run (dry run" in lines[-1] and trained == []


def test_the_lock_names_the_process_that_holds_it(tmp_path):
    import fcntl

    from vitlab.train.lock import LOCK, RunBusy, RunLock

    (tmp_path / "run").mkdir()
    with open(tmp_path / "run" / LOCK, "w") as fh:  # a lock as another process holds it: flock taken, pid and host
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        fh.write("7281 vm\n")
        fh.flush()
        with pytest.raises(RunBusy, match=r"\(process 7281\) on host vm") as exc:
            RunLock(tmp_path / "run").acquire()
    assert exc.value.holder == "process 7281 on host vm"
    assert RunBusy("x").holder == ""
