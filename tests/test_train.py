"""`vitlab train`: real short runs on mnist-5k, the recipe pieces, determinism, resume, signals, bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from _helpers import run_args, run_config
from vitlab.checkpoint import load_model, load_train_state, read_config
from vitlab.cli import main
from vitlab.errors import ConfigError
from vitlab.train.config import RunConfig, load_yaml, size_defaults
from vitlab.train.engine import NonFiniteLoss, train
from vitlab.train.optim import WarmupCosine, build_optimizer, no_decay_names

TINY = run_args(progress=False)
TINY_CFG = run_config()


def run_cli(*args: str) -> int:
    return main(["train", *args])


def metrics(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


def without_time(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "seconds"} for r in rows]


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model.safetensors"))


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("vitlab train: error: ") and err.count("\n") == 1 and "Traceback" not in err
    return err


# ------------------------------------------------------------------------------------------- real runs


@pytest.fixture(scope="module")
def short_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("run") / "out"
    assert run_cli(*TINY, "--epochs", "2", "--output", str(out)) == 0
    return out


def test_short_run_writes_every_output(short_run):
    names = {p.name for p in short_run.iterdir()}
    assert {"model.safetensors", "config.json", "metrics.jsonl", "summary.json", "state.pt"} <= names
    assert not [n for n in names if n.startswith(".")]  # no temporary files left
    rows = metrics(short_run)
    assert [r["epoch"] for r in rows] == [1, 2]
    for r in rows:
        assert {"epoch", "train_loss", "test_loss", "test_acc", "lr", "seconds"} <= r.keys()
        assert 0 <= r["test_acc"] <= 1 and r["train_loss"] > 0 and r["seconds"] > 0
    summary = json.loads((short_run / "summary.json").read_text())
    assert summary["final_test_acc"] == rows[-1]["test_acc"]
    assert summary["best_test_acc"] == max(r["test_acc"] for r in rows)
    assert summary["steps"] == 2 * 4 and summary["train_images_per_second"] > 0 and summary["wall_time_s"] > 0
    # CPU seconds of the steps: counted, and at most what the process could spend in the steps' time on this
    # machine's cores (process CPU time includes threads beside torch's intra-op pool: 0.30 s in 0.23 s was seen
    # with one torch thread on a 2-core AMD EPYC Zen 3)
    assert 0 < summary["train_cpu_s"] <= summary["train_time_s"] * (os.cpu_count() or 1) * 1.1 + 0.05
    model = load_model(short_run)
    assert summary["params"] == sum(p.numel() for p in model.parameters())
    assert summary["macs"] == model.flop_count() and summary["flops"] == 2 * summary["macs"]
    run = read_config(short_run)["run"]
    assert run["epochs"] == 2 and run["lr"] == size_defaults(256)["lr"] and run["data"]["num_train"] == 256
    assert run["data"]["classes"] == [str(i) for i in range(10)] and run["data"]["img_size"] == 28
    state = load_train_state(short_run)
    assert state["progress"]["epoch"] == 2 and state["progress"]["global_step"] == 8


def test_same_seed_same_metrics_other_seed_differs(short_run, tmp_path):
    again = tmp_path / "again"
    assert run_cli(*TINY, "--epochs", "2", "--output", str(again)) == 0
    assert without_time(metrics(again)) == without_time(metrics(short_run))
    assert_same_weights(weights(again), weights(short_run))
    other = tmp_path / "other"
    assert run_cli(*TINY, "--epochs", "1", "--seed", "1", "--output", str(other)) == 0
    assert metrics(other)[0]["train_loss"] != metrics(short_run)[0]["train_loss"]


def test_loss_goes_down_without_augmentation(tmp_path):
    out = tmp_path / "o"
    assert run_cli(*TINY, "--epochs", "4", "--no-augment", "--lr", "3e-3", "--set", "global_pool=avg",
                   "--output", str(out)) == 0
    rows = metrics(out)
    assert rows[-1]["train_loss"] < rows[0]["train_loss"] - 0.05
    assert rows[-1]["test_acc"] > 0.2  # 10 classes: chance is 0.1


def stop_at(global_step: int, signum: int | None = None):
    """An on_step callback that stops the run after ``global_step`` (with a real signal when ``signum``)."""

    def hook(trainer) -> None:
        if trainer.progress.global_step == global_step:
            if signum is None:
                trainer.stop.request()
            else:
                os.kill(os.getpid(), signum)

    return hook


@pytest.mark.parametrize("stop_step", [6, 4], ids=["mid-epoch", "epoch-end"])
def test_resume_is_bit_exact(tmp_path, stop_step):
    cfg = RunConfig(epochs=3, **TINY_CFG, erase_prob=0.25, ema_decay=0.9)  # random erasing and EMA too
    full = train(cfg.replace(output=str(tmp_path / "full")))
    assert full.exit_code == 0
    part = train(cfg.replace(output=str(tmp_path / "part")), on_step=stop_at(stop_step))
    assert part.exit_code == 143
    assert load_train_state(tmp_path / "part")["progress"]["global_step"] == stop_step
    assert main(["train", "--resume", str(tmp_path / "part")]) == 0
    assert_same_weights(weights(tmp_path / "part"), weights(tmp_path / "full"))
    assert_same_weights(load_train_state(tmp_path / "part")["model"], load_train_state(tmp_path / "full")["model"])
    assert without_time(metrics(tmp_path / "part")) == without_time(metrics(tmp_path / "full"))


@pytest.mark.parametrize("signum,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)], ids=["TERM", "INT"])
def test_signal_saves_a_resumable_checkpoint(tmp_path, capsys, signum, code):
    out = tmp_path / "o"
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    result = train(RunConfig(epochs=2, **TINY_CFG, output=str(out)), on_step=stop_at(3, signum))
    assert result.exit_code == code
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and signal.Signals(signum).name in err[0] and f"--resume {out}" in err[0]
    state = load_train_state(out)
    assert state["progress"]["epoch"] == 0 and state["progress"]["step"] == 3
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers  # restored
    assert main(["train", "--resume", str(out), "--epochs", "1"]) == 0
    assert [r["epoch"] for r in metrics(out)] == [1]


def test_signal_during_evaluation_stops_after_the_epoch_checkpoint(tmp_path, monkeypatch):
    import vitlab.train.engine as loop  # the loop evaluates each epoch

    trainers = []
    real_evaluate = loop.evaluate

    def evaluate_then_signal(*args, **kwargs):
        trainers[0].stop.request(signal.SIGTERM)
        return real_evaluate(*args, **kwargs)

    monkeypatch.setattr(loop, "evaluate", evaluate_then_signal)
    out = tmp_path / "o"
    result = train(RunConfig(epochs=3, **TINY_CFG, output=str(out)), on_step=lambda t: trainers.append(t))
    assert result.exit_code == 143 and [r["epoch"] for r in metrics(out)] == [1]
    progress = load_train_state(out)["progress"]
    assert progress["epoch"] == 1 and progress["step"] == 0


@pytest.mark.slow
def test_sigterm_to_a_real_process(tmp_path):
    out = tmp_path / "o"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "vitlab", "train", *TINY, "--epochs", "500", "--output", str(out)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and not (out / "metrics.jsonl").is_file():
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143
    assert err.strip().count("\n") == 0 and "SIGTERM" in err and "Traceback" not in err
    assert main(["train", "--resume", str(out), "--epochs", str(load_train_state(out)["progress"]["epoch"] + 1)]) == 0


def test_init_weights_start_the_model_and_its_ema(short_run, tmp_path):
    from vitlab.train.distributed import init_distributed
    from vitlab.train.engine import Trainer
    from vitlab.train.plan import plan_run

    cfg = RunConfig(epochs=1, **TINY_CFG, ema_decay=0.9, output=str(tmp_path / "ft"))
    ctx = init_distributed("cpu")
    try:
        trainer = Trainer(plan_run(cfg, ctx, init_weights=short_run), ctx)
        assert_same_weights(trainer.model.state_dict(), weights(short_run))
        assert_same_weights(trainer.ema.module.state_dict(), weights(short_run))
        with pytest.raises(ConfigError, match="drop the initial weights"):
            plan_run(cfg, ctx, resume=short_run, init_weights=short_run)
        trainer.lock.release()  # a Trainer holds its folder's lock until fit() ends
    finally:
        ctx.close()
    tuned = train(cfg.replace(ema_decay=0.0, lr=1e-12, min_lr=0.0), init_weights=short_run)  # steps too small to move
    for key, value in weights(short_run).items():
        assert torch.allclose(weights(tuned.out_dir)[key], value, atol=1e-6), key


def test_resume_a_moved_folder_writes_there(tmp_path):
    first = tmp_path / "first"
    assert train(RunConfig(epochs=2, **TINY_CFG, output=str(first)), on_step=stop_at(2)).exit_code == 143
    moved = tmp_path / "moved"
    first.rename(moved)
    assert run_cli("--resume", str(moved)) == 0
    assert not first.exists() and [r["epoch"] for r in metrics(moved)] == [1, 2]


def test_checkpoint_every_saves_mid_epoch(tmp_path):
    out = tmp_path / "o"
    seen = []

    def hook(trainer) -> None:
        if (out / "state.pt").exists():
            seen.append(load_train_state(out)["progress"]["global_step"])

    train(RunConfig(epochs=1, checkpoint_every=3, **TINY_CFG, output=str(out)), on_step=hook)
    assert seen == [3]  # saved after step 3 (the hook of step 4 sees it), not yet at the epoch end


# ------------------------------------------------------------------------------------- non-finite loss


def test_nonfinite_loss_stops_with_a_message(tmp_path, capsys, monkeypatch):
    out = tmp_path / "o"
    real = torch.nn.CrossEntropyLoss.forward  # a NaN loss, as --lr 1e30 gave before such rates were refused
    monkeypatch.setattr(torch.nn.CrossEntropyLoss, "forward", lambda self, x, y: real(self, x, y) * float("nan"))
    assert run_cli(*TINY, "--epochs", "1", "--output", str(out)) == 2
    err = one_error_line(capsys)
    assert "non-finite loss" in err and "epoch 1 step" in err and "learning rate too high" in err
    assert "--skip-nonfinite" in err and not (out / "model.safetensors").exists()


def test_nonfinite_keeps_the_last_good_checkpoint(tmp_path):
    out = tmp_path / "o"

    def poison(trainer) -> None:
        if trainer.progress.global_step == 5:  # in epoch 2
            with torch.no_grad():
                trainer.model.head.weight.fill_(float("nan"))

    with pytest.raises(NonFiniteLoss, match="epoch 2 step 2 .*last good checkpoint in"):
        train(RunConfig(epochs=2, **TINY_CFG, output=str(out)), on_step=poison)
    assert load_train_state(out)["progress"]["epoch"] == 1
    assert all(torch.isfinite(t).all() for t in weights(out).values())


def test_skip_nonfinite_skips_steps(tmp_path):
    out = tmp_path / "o"
    calls = []

    def poison_once(trainer) -> None:
        calls.append(trainer.progress.global_step)
        if trainer.progress.global_step == 2:
            trainer.data.pipeline.augment.register_forward_hook(_nan_once(trainer))

    result = train(RunConfig(epochs=1, skip_nonfinite=True, **TINY_CFG, output=str(out)), on_step=poison_once)
    assert result.exit_code == 0 and result.summary["skipped_steps"] == 1
    assert all(torch.isfinite(t).all() for t in weights(out).values())


def _nan_once(trainer):
    fired = []

    def hook(module, inputs, output):
        if not fired:
            fired.append(1)
            return output * float("nan")
        return output

    return hook


# ------------------------------------------------------------------------------------ models and config


def test_cait_preset_with_overrides_trains(tmp_path):
    out = tmp_path / "o"
    assert run_cli("--model", "cait_xxs24", "--img-size", "28", "--patch-size", "4", "--in-chans", "1", "--depth",
                   "1", "--embed-dim", "32", "--num-heads", "2", "--set", "depth_token_only=1", "--set",
                   "init_values=1e-5", "--drop-path", "0.2", "--drop-path-rule", "uniform", "--limit-train", "64",
                   "--limit-test", "32", "--batch-size", "32", "--epochs", "1", "--no-progress",
                   "--output", str(out)) == 0
    model = read_config(out)["model"]
    assert model["arch"] == "cait" and model["patch_size"] == 4 and model["depth_token_only"] == 1
    assert model["drop_path_rate"] == 0.2 and model["drop_path_rule"] == "uniform" and model["num_classes"] == 10
    assert model["init_values"] == 1e-5


def test_timm_model_trains_at_the_data_size(tmp_path):
    out = tmp_path / "o"
    assert run_cli("--model", "timm:vit_tiny_patch16_224", "--set", "patch_size=7", "--set", "embed_dim=32", "--set",
                   "depth=1", "--set", "num_heads=2", "--limit-train", "64", "--limit-test", "32", "--batch-size",
                   "32", "--epochs", "1", "--no-progress", "--output", str(out)) == 0
    spec = read_config(out)["model"]
    assert spec["timm"] == "vit_tiny_patch16_224"
    assert spec["kwargs"]["img_size"] == 28 and spec["kwargs"]["in_chans"] == 1 and spec["kwargs"]["num_classes"] == 10
    summary = json.loads((out / "summary.json").read_text())
    assert summary["macs"] > 0 and summary["params"] == sum(p.numel() for p in load_model(out).parameters())


def test_yaml_config_with_cli_overrides(tmp_path):
    yaml_file = tmp_path / "run.yaml"
    yaml_file.write_text("epochs: 1\nlr: 0.01\nweight_decay: 1e-2\nbatch-size: 32\nmodel_overrides: {depth: 1, "
                         "embed_dim: 16, num_heads: 2, drop_path_rate: 1e-2}\nlimit_train: 64\nlimit_test: 32\n"
                         "progress: false\ndataset: MNIST_5k\n")
    out = tmp_path / "o"
    assert run_cli("--config", str(yaml_file), "--lr", "0.005", "--depth", "2", "--output", str(out)) == 0
    config = read_config(out)
    assert config["run"]["lr"] == 0.005 and config["run"]["epochs"] == 1 and config["run"]["batch_size"] == 32
    assert config["model"]["depth"] == 2 and config["model"]["embed_dim"] == 16
    assert config["run"]["weight_decay"] == 0.01 and config["model"]["drop_path_rate"] == 0.01  # YAML 1.1 "1e-2"
    assert config["run"]["dataset"] == "mnist-5k" and config["run"]["degrees"] == 12.0  # digit defaults


def test_bad_yaml_key_is_one_line(tmp_path, capsys):
    yaml_file = tmp_path / "run.yaml"
    yaml_file.write_text("epoch: 3\n")
    assert run_cli("--config", str(yaml_file)) == 2
    assert "unknown option 'epoch' (did you mean epochs" in one_error_line(capsys)
    with pytest.raises(ConfigError, match="lr must be a finite number"):
        yaml_file.write_text("lr: fast\n")
        load_yaml(yaml_file)


def test_missing_data_folder_is_one_line(tmp_path, capsys):
    out = tmp_path / "o"
    assert run_cli("--dataset", "mnist", "--data-dir", str(tmp_path / "nope"), "--output", str(out)) == 2
    err = one_error_line(capsys)
    assert "does not exist" in err and "--data-dir" in err and not out.exists()


def test_unknown_model_option_is_one_line(capsys):
    assert run_cli("--set", "dept=3") == 2
    assert "did you mean depth" in one_error_line(capsys)


def test_batch_larger_than_data_is_refused(tmp_path, capsys):
    assert run_cli(*TINY, "--batch-size", "512", "--output", str(tmp_path / "o")) == 2
    assert "--batch-size 256 or less" in one_error_line(capsys)


def test_existing_checkpoint_is_not_overwritten(short_run, capsys):
    before = (short_run / "model.safetensors").read_bytes()
    assert run_cli(*TINY, "--epochs", "1", "--output", str(short_run)) == 2
    assert f"--resume {short_run}" in one_error_line(capsys)
    assert (short_run / "model.safetensors").read_bytes() == before


def test_resume_refuses_recipe_changes_and_other_architectures(short_run, capsys):
    assert run_cli("--resume", str(short_run), "--lr", "0.1") == 2
    assert "cannot change --lr when resuming" in one_error_line(capsys)
    assert run_cli("--resume", str(short_run), "--model", "cait_xxs24", "--epochs", "3") == 2
    err = one_error_line(capsys)
    assert "holds a vit (vit_mnist) model but this run builds a cait (cait_xxs24)" in err


# ------------------------------------------------------------------------------------------ recipe parts


def test_weight_decay_groups_follow_no_weight_decay():
    import timm

    from vitlab import create_model

    model = create_model("vit_mnist", depth=1)
    opt = build_optimizer(model, lr=1e-3, weight_decay=0.05)
    decay, no_decay = opt.param_groups
    names = {id(p): n for n, p in model.named_parameters()}
    assert {names[id(p)] for p in no_decay["params"]} == model.no_weight_decay()
    assert decay["weight_decay"] == 0.05 and no_decay["weight_decay"] == 0.0
    assert all(p.ndim == 2 or p.ndim == 4 for p in decay["params"])
    tm = timm.create_model("vit_tiny_patch16_224", img_size=28, patch_size=7, in_chans=1, embed_dim=32, depth=1,
                           num_heads=2, num_classes=10)
    skip = no_decay_names(tm)
    assert {"cls_token", "pos_embed", "blocks.0.norm1.weight", "head.bias"} <= skip
    assert "blocks.0.attn.qkv.weight" not in skip and "patch_embed.proj.weight" not in skip


def test_warmup_cosine_schedule():
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.AdamW([p], lr=1.0)
    sched = WarmupCosine(opt, lr=1.0, min_lr=0.01, warmup_steps=4, total_steps=20)
    lrs = []
    for _ in range(20):
        lrs.append(opt.param_groups[0]["lr"])
        sched.step()
    assert lrs[:4] == [0.25, 0.5, 0.75, 1.0]
    assert lrs[4] == 1.0 and all(a > b for a, b in zip(lrs[4:], lrs[5:]))
    assert lrs[-1] > 0.01 and sched.lr_at(20) == pytest.approx(0.01)
    again = WarmupCosine(opt, lr=1.0, min_lr=0.01, warmup_steps=4, total_steps=20)
    again.load_state_dict(sched.state_dict())
    assert opt.param_groups[0]["lr"] == sched.get_last_lr()


def test_defaults_depend_on_size_and_kind():
    small = RunConfig(dataset="mnist-5k").resolve(4000)
    big = RunConfig(dataset="mnist").resolve(60000)
    rgb = RunConfig(dataset="cifar10").resolve(50000)
    assert small.epochs > big.epochs and small.hflip is False and small.degrees > 0
    assert rgb.hflip is True and rgb.pad_crop > 0 and rgb.degrees == 0
    assert RunConfig(dataset="mnist-5k", lr=0.1, hflip=True).resolve(4000).lr == 0.1


@pytest.mark.parametrize("changes,match", [
    (dict(epochs=0), r"epochs must be in \[1, 100000\], got 0"),
    (dict(label_smoothing=1.5), "label_smoothing must be in"),
    (dict(amp="fp16"), "unknown amp"),
    (dict(lr=-1.0), r"lr must be in \(0, 10\]"),
])
def test_bad_run_values_are_refused(changes, match):
    with pytest.raises(ConfigError, match=match):
        RunConfig(**changes).resolve(100)


@pytest.mark.parametrize("flush", [True, False])
def test_training_flushes_denormals_on_cpu_unless_told_and_restores_the_flag(tmp_path: Path, flush: bool) -> None:
    from vitlab import perf

    seen = []
    cfg = RunConfig(epochs=1, **{**TINY_CFG, "limit_train": 128}, threads=1, flush_denormal=flush,
                    output=str(tmp_path / "run"))
    train(cfg, on_step=lambda trainer: seen.append(perf.flushes_denormals()))
    assert seen and set(seen) == {flush}
    assert not perf.flushes_denormals()  # the process's setting is back


def test_keep_denormals_flag_reaches_the_run_config(tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert run_cli(*TINY, "--epochs", "1", "--keep-denormals", "--output", str(out)) == 0
    assert read_config(out)["run"]["flush_denormal"] is False
