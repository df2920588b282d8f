"""Progress output: a live bar on a terminal, one line per epoch (and a final line) in a log file."""

from __future__ import annotations

import io
import sys

from _helpers import run_args
from vitlab.cli import main
from vitlab.train.logging import on_terminal

TINY = run_args(depth=1, limit_train=128, limit_test=64, batch_size=32, epochs=2, device="cpu", threads=1)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_log_file_gets_one_line_per_epoch_and_no_carriage_returns(tmp_path, capsys):
    assert not on_terminal()  # captured streams are not terminals
    assert main(["train", *TINY, "--output", str(tmp_path / "run")]) == 0
    out, err = capsys.readouterr()
    assert "\r" not in out + err
    lines = out.splitlines()
    assert [line.split()[:2] for line in lines if line.startswith("epoch")] == [["epoch", "1"], ["epoch", "2"]]
    assert len(lines) == 4 and lines[-1].startswith("final test_acc")  # announce, 2 epochs, final


def test_terminal_gets_the_live_bar(tmp_path, monkeypatch):
    out, err = Terminal(), Terminal()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    assert main(["train", *TINY, "--output", str(tmp_path / "run")]) == 0
    assert "\r" in err.getvalue() and "epoch 1/2" in err.getvalue()
    assert "\r" not in out.getvalue()


def test_progress_cpu_time_is_unknown_after_an_older_record():
    from vitlab.train.progress import Progress

    p = Progress()
    p.restore({"epoch": 3, "train_time_s": 12.0, "train_cpu_s": 10.5})
    assert p.train_cpu_s == 10.5 and p.epoch == 3
    old = Progress()
    old.restore({"epoch": 3, "train_time_s": 12.0})  # saved before CPU time was counted
    assert old.train_cpu_s is None and old.train_time_s == 12.0
    assert Progress().train_cpu_s == 0.0
