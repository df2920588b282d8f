"""One plan per run (issue 44): every setting decided once, before the first step, into a frozen value the trainer
alone reads; a resumed run's plan rebuilt from its record; a warm-up the recipe chooses fitted to the run; and
``vitlab train --dry-run`` printing the plan without training or writing anything."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.util
import io
import json
import sys
from pathlib import Path

import pytest

from _helpers import run_args, run_config
from vitlab.cli import main
from vitlab.errors import ConfigError
from vitlab.train import RunConfig, Trainer, plan_run, train
from vitlab.train.recipes import DEFAULT_RECIPES, SIZE_DEFAULTS, WARMUP_SHARE

TINY = run_config(limit_train=128, limit_test=32, threads=1, device="cpu")


def quiet_main(argv: list[str]) -> str:
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert main(argv) == 0
    return stdout.getvalue()


def hashes(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------------------------------ the plan is the decision

# where a setting is decided: after the plan is made, no call may land here
DECIDERS = {
    "vitlab/train/recipes.py": None,  # the recipe tables: every default
    "vitlab/train/plan_model.py": None,  # the model spec, its preset name, its cost
    "vitlab/train/config.py": None,  # options checked, coerced, replaced, resolved
    "vitlab/train/config_file.py": None,
    "vitlab/data/facts.py": None,
    "vitlab/models/registry.py": None,  # presets resolved and named
    "vitlab/models/spec.py": ("ModelSpec.with_options",),  # a spec rebuilt
    "vitlab/perf/threads.py": ("thread_plan", "why_not_sliced", "plan_training"),
    "vitlab/train/plan.py": None,  # but the plan's own methods (reading it)
}
PLAN_VALUES = ("RunPlan.", "DataPlan.", "Schedule.")
READS = ("RunConfig.to_dict",)  # reading the resolved options (config.json's record)


def decisions_after_the_plan(argv: list[str]) -> tuple[list[str], list[str]]:
    """Run ``vitlab argv``; returns (the deciding functions called while the plan was made, those called after)."""
    root = str(Path(importlib.util.find_spec("vitlab").origin).parent.parent) + "/"
    before: list[str] = []
    after: list[str] = []
    state = {"planned": False}

    def where(frame) -> str | None:  # noqa: ANN001
        path, code = frame.f_code.co_filename, frame.f_code
        if not path.startswith(root):
            return None
        rel = path[len(root):]
        if rel not in DECIDERS or code.co_qualname.startswith(PLAN_VALUES) or code.co_qualname in READS:
            return None
        names = DECIDERS[rel]
        if names is not None and code.co_qualname not in names:
            return None
        up = frame.f_back
        while up is not None:  # vitlab's presets registered in timm when timm's first module loads: no run's setting
            if up.f_code.co_qualname == "register_timm":
                return None
            up = up.f_back
        return f"{rel}:{code.co_qualname}"

    def profile(frame, event: str, arg) -> None:  # noqa: ANN001
        if event == "return" and frame.f_code.co_qualname == "make_plan" and \
                frame.f_code.co_filename.endswith("vitlab/train/plan.py"):
            state["planned"] = True
            return
        if event == "call":
            name = where(frame)
            if name is not None:
                (after if state["planned"] else before).append(name)

    sys.setprofile(profile)
    try:
        quiet_main(argv)
    finally:
        sys.setprofile(None)
    return before, after


@pytest.mark.parametrize("resumed", [False, True])
def test_after_the_plan_no_code_fills_a_default_resolves_a_preset_or_rebuilds_the_spec(tmp_path, resumed) -> None:
    out = tmp_path / "run"
    argv = ["train", *run_args(limit_train=128, limit_test=32, threads=1, device="cpu", epochs=1, progress=False),
            "--output", str(out)]
    if resumed:
        quiet_main(argv)
        argv = ["train", "--resume", str(out), "--epochs", "2", "--no-progress"]
    before, after = decisions_after_the_plan(argv)
    assert after == []
    assert any("fill" in b for b in before) and any("resolve_model" in b for b in before)  # the probe sees them


def test_the_plan_is_frozen_and_is_what_the_run_prints_and_stores(tmp_path) -> None:
    cfg = RunConfig(**TINY, epochs=1, output=str(tmp_path / "run"))
    plan = plan_run(cfg)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.schedule = None
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.run.lr = 1.0
    assert all(getattr(plan.run, f) is not None for f in ("epochs", "batch_size", "lr", "warmup_epochs", "degrees"))
    assert not (tmp_path / "run").exists()  # planning creates nothing
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        result = train(cfg)
    assert stdout.getvalue().splitlines()[0] == plan.describe()
    stored = json.loads((result.out_dir / "config.json").read_text())["run"]
    assert stored == json.loads(json.dumps(plan.record(stored["data"]["classes"])))
    assert stored["data"]["num_train"] == plan.data.num_train and result.summary["macs"] == plan.cost.macs
    assert result.summary["steps"] == plan.schedule.total_steps


def test_the_trainer_is_one_class_read_top_to_bottom() -> None:
    import inspect

    assert Trainer.__mro__ == (Trainer, object)  # no Loop mixin
    assert importlib.util.find_spec("vitlab.train.loop") is None
    properties = {n for n, v in inspect.getmembers(Trainer) if isinstance(v, property)}
    assert properties == {"eval_model"}  # no forwarding properties: the data, the plan are read as themselves
    assert list(inspect.signature(Trainer).parameters)[:2] == ["plan", "ctx"]


# ------------------------------------------------------------------------------------------ the recipe sees the run

def test_a_shortened_run_gets_a_warmup_that_fits_it(tmp_path) -> None:
    plan = plan_run(RunConfig(model="vit_mnist", epochs=2, output=str(tmp_path / "a")))
    assert plan.run.warmup_epochs == pytest.approx(0.2) and plan.schedule.warmup_steps == round(0.2 * 62)
    assert plan.notes == ("warm-up 0.2 epochs: the recipe's 3, at most 10 % of the 2 epochs",)
    assert "lr 0.002 (warm-up 0.2 epochs: the recipe's 3" in plan.describe()
    full = plan_run(RunConfig(model="vit_mnist", output=str(tmp_path / "b")))  # the recipe's own 50 epochs
    assert (full.run.epochs, full.run.warmup_epochs, full.notes) == (50, 3, ())
    given = plan_run(RunConfig(model="vit_mnist", epochs=2, warmup_epochs=4, output=str(tmp_path / "c")))
    assert given.run.warmup_epochs == 4 and given.notes == ()  # the user's, kept, and warned about
    assert given.warnings and "--warmup-epochs 2 or less" in given.warnings[0]


def test_every_recipe_warmup_fits_the_share_at_its_own_length() -> None:
    for _, row in SIZE_DEFAULTS:
        assert row["warmup_epochs"] <= WARMUP_SHARE * row["epochs"], row
    for recipe in DEFAULT_RECIPES.values():
        assert recipe["warmup_epochs"] <= WARMUP_SHARE * recipe["epochs"], recipe


def test_the_command_default_recipe_warmup_is_fitted_too(tmp_path) -> None:
    from test_time_to_accuracy_fashion import tiny_fashion

    data = tiny_fashion(tmp_path / "fashion")
    plan = plan_run({"dataset": "fashion-mnist", "data_dir": str(data), "epochs": 1, "output": str(tmp_path / "r")})
    assert plan.spec.config.name == "vit_fashion_conv_patch14" and plan.run.ema_decay == 0.999
    assert plan.run.warmup_epochs == pytest.approx(0.1) and plan.run.lr == 3e-3  # the recipe's 1 of 19, fitted
    typed = plan_run({"dataset": "fashion-mnist", "data_dir": str(data), "epochs": 1, "warmup_epochs": 1,
                      "output": str(tmp_path / "s")})
    assert typed.run.warmup_epochs == 1


def test_the_learning_rate_peaks_in_a_two_epoch_run(tmp_path) -> None:
    out = tmp_path / "run"
    quiet_main(["train", *run_args(limit_train=128, limit_test=32, threads=1, device="cpu", epochs=2,
                                   batch_size=16, progress=False), "--output", str(out)])
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert json.loads((out / "config.json").read_text())["run"]["warmup_epochs"] == pytest.approx(0.2)
    assert rows[-1]["lr"] == pytest.approx(1e-5)  # the cosine reached min_lr: the rate peaked and decayed


# ------------------------------------------------------------------------------------------ resume and dry runs

def test_a_resumed_plan_is_rebuilt_from_its_record(tmp_path) -> None:
    out = tmp_path / "run"
    quiet_main(["train", *run_args(limit_train=128, limit_test=32, threads=1, device="cpu", epochs=1,
                                   progress=False), "--output", str(out)])
    stored = json.loads((out / "config.json").read_text())["run"]
    plan = plan_run({"epochs": 2}, resume=out)
    assert plan.resume == out and plan.out_dir == out and plan.run.epochs == 2
    assert {**plan.run.to_dict(), "epochs": 1} == {k: v for k, v in stored.items() if k != "data"}
    with pytest.raises(ConfigError, match=r"cannot change --lr when resuming \(lr 0\.002 in the run, 0\.1 now\)"):
        plan_run({"lr": 0.1}, resume=out)


def test_dry_run_prints_the_plan_and_writes_nothing(tmp_path, capsys) -> None:
    new = tmp_path / "new"
    text = quiet_main(["train", *run_args(epochs=2), "--dry-run", "--output", str(new)])
    lines = text.splitlines()
    assert lines[0].startswith("vitlab train: vit_mnist") and lines[0].endswith("(dry run: nothing is trained or "
                                                                                 "written)")
    assert "warm-up 0.2 epochs" in lines[0]
    assert any(line.strip().startswith("cost: about ") for line in lines)
    assert any(line.strip() == "warmup_epochs: 0.2" for line in lines)  # the options, as a --config file
    assert not new.exists()
    done = tmp_path / "done"
    quiet_main(["train", *run_args(limit_train=128, limit_test=32, threads=1, device="cpu", epochs=1,
                                   progress=False), "--output", str(done)])
    before = hashes(done)
    text = quiet_main(["train", "--resume", str(done), "--epochs", "3", "--dry-run"])
    assert "3 epochs x 2 steps of 64" in text.splitlines()[0] and hashes(done) == before


def test_data_facts_are_those_of_the_loaded_data(tmp_path) -> None:
    from test_time_to_accuracy_fashion import tiny_fashion
    from vitlab.data import load_dataset
    from vitlab.data.facts import data_facts

    fashion = tiny_fashion(tmp_path / "fashion", n_train=30, n_test=20)
    for name, data_dir in (("mnist-5k", None), ("fashion-mnist", fashion)):
        facts = data_facts(name, data_dir)
        train_split, test_split = load_dataset(name, data_dir=data_dir, img_size=28, in_chans=1)
        assert (facts.num_train, facts.num_test, facts.num_classes) == \
            (len(train_split), len(test_split), len(train_split.classes))
        assert facts.classes == tuple(train_split.classes)


def test_a_study_dry_run_prints_each_runs_plan_and_writes_nothing(tmp_path) -> None:
    out = tmp_path / "sweep"
    common = ["--epochs", "1", "--limit-train", "128", "--limit-test", "32", "--threads", "1", "--no-progress",
              "--set", "depth=1", "--output", str(out)]
    text = quiet_main(["sweep", "--param", "lr", "--values", "1e-3,2e-3", "--seeds", "2", *common, "--dry-run"])
    lines = text.splitlines()
    assert len(lines) == 5 and lines[0].startswith("[1/4] sweep lr=0.001_seed=0: vit_mnist")
    assert "lr 0.002 (warm-up 0.1 epochs" in lines[2] and lines[-1].startswith("sweep: 4 of 4 runs to train, about ")
    assert not out.exists()
    quiet_main(["sweep", "--param", "lr", "--values", "1e-3", *common])  # one run finished: read back, not planned
    text = quiet_main(["sweep", "--param", "lr", "--values", "1e-3,2e-3", *common, "--dry-run"])
    assert "lr=0.001_seed=0: finished, read back" in text and "1 of 2 runs to train" in text
    study = tmp_path / "depth"
    text = quiet_main(["depth-study", "--depths", "1", "--variants", "vit,tfixup", "--epochs", "1", "--limit-train",
                       "128", "--threads", "1", "--output", str(study), "--dry-run"])
    assert text.count("] depth study ") == 2 and "depth study: 2 of 2 runs to train" in text and not study.exists()


@pytest.mark.parametrize("preset", ["vit_mnist", "cait_xxs24", "deepvit_16b", "vit5_small"])
def test_the_plan_measures_a_model_without_running_its_initialisers(preset, monkeypatch) -> None:
    """The plan's meta-device build skips torch.nn.init (it computes nothing on meta, but costs half the build):
    the cost is that of a full meta build, no initialiser runs, and torch.nn.init is whole again afterwards."""
    import torch

    from vitlab.models.registry import resolve_spec
    from vitlab.train import plan_model

    spec = resolve_spec(preset)
    with torch.device("meta"):
        full = spec.build()
    before = dict(vars(torch.nn.init))
    calls: list[str] = []
    for name in ("trunc_normal_", "normal_", "uniform_", "kaiming_uniform_", "zeros_", "ones_", "constant_"):
        real = getattr(torch.nn.init, name)
        monkeypatch.setattr(torch.nn.init, name,
                            lambda t, *a, _n=name, _f=real, **k: calls.append(_n) or _f(t, *a, **k))
    patched = dict(vars(torch.nn.init))
    monkeypatch.setattr(plan_model, "_COSTS", {})
    cost = plan_model.measure(spec, img_size=spec.config.img_size, in_chans=spec.config.in_chans)
    assert calls == []
    assert dict(vars(torch.nn.init)) == patched
    assert cost.params == sum(p.numel() for p in full.parameters())
    assert cost.macs == full.flop_count()
    monkeypatch.undo()
    assert dict(vars(torch.nn.init)) == before


def test_the_initialisers_come_back_when_a_meta_build_fails(monkeypatch) -> None:
    import torch

    from vitlab.models.registry import resolve_spec
    from vitlab.train import plan_model

    spec = resolve_spec("vit_mnist")
    before = dict(vars(torch.nn.init))
    monkeypatch.setattr(plan_model, "_COSTS", {})
    monkeypatch.setattr(type(spec), "build", lambda self, *a, **k: (_ for _ in ()).throw(RuntimeError("boom")))
    with pytest.raises(RuntimeError, match="boom"):
        plan_model.measure(spec, img_size=28, in_chans=1)
    assert dict(vars(torch.nn.init)) == before
