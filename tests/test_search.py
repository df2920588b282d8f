"""``vitlab sweep --search optuna``: a real tiny Optuna search that prunes and resumes from its SQLite study,
an interrupted trial re-run from its checkpoint, the report, and every bad input in one line."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

optuna = pytest.importorskip("optuna")

from _helpers import option_args, read_rows  # noqa: E402
from vitlab.cli import main  # noqa: E402
from vitlab.errors import ConfigError  # noqa: E402
from vitlab.experiments.search import parse_range, parse_search_params  # noqa: E402
from vitlab.train import engine  # noqa: E402

TINY = ["--set", "depth=1", "--set", "embed_dim=16",  # a sweep sets the architecture with --set
        *option_args(epochs=3, limit_train=256, limit_test=64, batch_size=32, threads=1, progress=False)]


def search(out: Path, *extra: str) -> list[str]:
    return ["sweep", "--search", "optuna", "--param", "lr", "--range", "1e-5:3e-2:log", *TINY, *extra,
            "--output", str(out)]


def counted_train(monkeypatch) -> list[str]:
    """Wrap the engine's train() so the test sees which run folders were (re)trained."""
    calls: list[str] = []
    real = engine.train

    def train(cfg, **kw):
        calls.append(Path(cfg.output).name)
        return real(cfg, **kw)

    monkeypatch.setattr(engine, "train", train)
    return calls


def stored_trials(out: Path) -> list:
    return optuna.load_study(study_name="vitlab-search", storage=f"sqlite:///{out / 'optuna.db'}").trials


@pytest.mark.full  # a real Optuna search end to end, resumed
def test_optuna_search_prunes_and_resumes(tmp_path: Path, monkeypatch, capsys):
    out = tmp_path / "search"
    calls = counted_train(monkeypatch)
    assert main(search(out, "--trials", "2", "--prune-startup", "1")) == 0
    assert calls == ["trial_0000", "trial_0001"]
    stamps = {n: (out / n / "summary.json").stat().st_mtime_ns for n in calls}
    capsys.readouterr()
    assert main(search(out, "--trials", "4", "--prune-startup", "1")) == 0
    printed = capsys.readouterr().out
    assert calls[2:] == ["trial_0002", "trial_0003"]  # the two finished trials are not trained again
    assert {n: (out / n / "summary.json").stat().st_mtime_ns for n in stamps} == stamps
    trials = stored_trials(out)
    assert [t.number for t in trials] == [0, 1, 2, 3]
    pruned = [t for t in trials if t.state == optuna.trial.TrialState.PRUNED]
    assert pruned, "the median pruner stopped no trial"
    for t in pruned:  # a pruned run stopped early: fewer epochs in its folder than asked for, and it is kept
        rows = [json.loads(line) for line in (out / t.user_attrs["run"] / "metrics.jsonl").read_text().splitlines()]
        assert len(rows) == max(t.intermediate_values) < 3
        assert json.loads((out / t.user_attrs["run"] / "summary.json").read_text())["stopped_early"] is True
        assert t.value == rows[-1]["val_acc"]  # trials are compared on their validation split
    complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert all(len(t.intermediate_values) == 3 for t in complete)
    assert all(1e-5 <= t.params["lr"] <= 3e-2 for t in trials)
    rows = read_rows(out / "trials.csv")
    assert [r["state"] for r in rows] == [t.state.name for t in trials]
    assert {"number", "state", "value", "lr", "duration_s", "run"} <= set(rows[0])
    for name in ("history.png", "curves.png", "importance.png", "index.html", "summary.json"):
        assert (out / name).is_file(), name
    summary = json.loads((out / "summary.json").read_text())
    assert summary["counts"] == {"complete": len(complete), "pruned": len(pruned), "fail": 0}
    assert summary["best"]["value"] == max(t.value for t in complete)
    assert summary["importances"] == {"lr": 1.0}
    page = (out / "index.html").read_text()
    assert "--param lr --range 1e-5:3e-2:log" in page and "history.png" in page
    assert f"{len(pruned)} pruned" in printed
    # the same seed reseeds the sampler per trial: the resumed search picked what a straight one would (TPE's
    # first 10 trials are seeded random draws, so a one-epoch search shows it cheaply)
    straight = tmp_path / "straight"
    assert main([*search(straight, "--trials", "3", "--prune-startup", "1")[:-2], "--epochs", "1",
                 "--output", str(straight)]) == 0
    assert [t.params for t in stored_trials(straight)] == [t.params for t in trials[:3]]
    # a resumed search with other run settings is refused in one line
    assert main(search(out, "--trials", "5", "--lr", "0.1")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "lr null there, 0.1 now" in err


def test_interrupted_trial_is_rerun_from_its_checkpoint(tmp_path: Path, monkeypatch, capsys):
    out = tmp_path / "search"
    real = engine.train
    calls: list[tuple[str, bool]] = []

    def interrupt_once(cfg, **kw):  # SIGINT after the first epoch of the second trial, as Ctrl-C would
        calls.append((Path(cfg.output).name, kw.get("resume") is not None))
        hook = kw["on_epoch"]

        def on_epoch(epoch, row):
            stop = hook(epoch, row)
            if len(calls) == 2:
                os.kill(os.getpid(), signal.SIGINT)
            return stop

        return real(cfg, **{**kw, "on_epoch": on_epoch})

    monkeypatch.setattr(engine, "train", interrupt_once)
    args = search(out, "--trials", "2", "--pruner", "none")
    assert main(args) == 130
    assert [t.state.name for t in stored_trials(out)] == ["COMPLETE", "FAIL"]
    assert main(args) == 0
    assert "[trial 1] was interrupted" in capsys.readouterr().out
    trials = stored_trials(out)
    assert [t.state.name for t in trials] == ["COMPLETE", "FAIL", "COMPLETE"]
    assert trials[2].params == trials[1].params and trials[2].user_attrs["rerun_of"] == 1
    assert calls == [("trial_0000", False), ("trial_0001", False), ("trial_0001", True)]  # resumed, not restarted
    assert sorted(trials[2].intermediate_values) == [1, 2, 3]
    assert len((out / "trial_0001" / "metrics.jsonl").read_text().splitlines()) == 3
    assert read_rows(out / "trials.csv")[2]["note"] == "re-run of trial 1"


@pytest.mark.slow
def test_hyperband_search_runs(tmp_path: Path):
    out = tmp_path / "hb"
    assert main(["sweep", "--search", "optuna", "--param", "lr", "--range", "1e-5:3e-2:log", "--param", "depth",
                 "--range", "1:2", *TINY[2:], "--set", "embed_dim=16", "--trials", "6", "--pruner", "hyperband",
                 "--output", str(out)]) == 0
    rows = read_rows(out / "trials.csv")
    assert len(rows) == 6 and {r["depth"] for r in rows} <= {"1", "2"}


def test_ranges_parse_to_the_option_type():
    lr = parse_range("vit_mnist", "lr", "1e-4:1e-2:log")
    assert (lr.low, lr.high, lr.log, lr.integer) == (1e-4, 1e-2, True, False)
    depth = parse_range("vit_mnist", "depth", "1:4")
    assert (depth.low, depth.high, depth.integer) == (1, 4, True) and isinstance(depth.low, int)
    params = parse_search_params("vit_mnist", [("lr", "range", "0.001:0.01"), ("gate", "values", "none,layerscale")])
    assert params[1].choices == ["none", "layerscale"]


@pytest.mark.parametrize("bad, message", [
    ("1e-2:1e-4", "LOW 0.01 must be below HIGH 0.0001"),
    ("0:1e-2:log", "a log range needs LOW > 0"),
    ("1e-4", "must be LOW:HIGH"),
    ("1e-4:1e-2:cube", "must be LOW:HIGH"),
])
def test_bad_ranges(bad: str, message: str):
    with pytest.raises(ConfigError, match=message):
        parse_range("vit_mnist", "lr", bad)


def test_search_command_errors(tmp_path: Path, capsys, monkeypatch):
    out = tmp_path / "never"
    cases = [
        (["sweep", "--param", "lr", "--range", "1e-4:1e-2", "--output", str(out)], "belong(s) to --search optuna"),
        (["sweep", "--param", "lr", "--values", "0.1", "--trials", "3", "--output", str(out)], "--trials"),
        (["sweep", "--search", "optuna", "--param", "lr", "--range", "1e-2:1e-4", "--output", str(out)],
         "must be below HIGH"),
        (["sweep", "--search", "optuna", "--param", "gate", "--range", "1:2", "--output", str(out)],
         "give its choices with --values"),
        (["sweep", "--search", "optuna", "--param", "depth", "--range", "1:3", "--set", "depth=2", "--output",
          str(out)], "searched by --param and fixed by --set"),
        (["sweep", "--search", "optuna", "--param", "lr", "--range", "1e-4:1e-2", "--trials", "0", "--output",
          str(out)], "--trials must be >= 1"),
        (["sweep", "--search", "optuna", "--param", "lr", "--range", "1e-4:1e-2", "--seeds", "2", "--output",
          str(out)], "--seeds is for the grid"),
    ]
    for argv, message in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, err
    assert not out.exists()
    import builtins

    real_import = builtins.__import__

    def no_optuna(name, *a, **kw):
        if name == "optuna" or name.startswith("optuna."):
            raise ImportError(name)
        return real_import(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_optuna)
    assert main(["sweep", "--search", "optuna", "--param", "lr", "--range", "1e-4:1e-2", "--output", str(out)]) == 2
    assert "pip install 'vitlab[optuna]'" in capsys.readouterr().err and not out.exists()
