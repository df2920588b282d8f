"""The trainer read in one sitting: the road a ``vitlab train`` call takes through ``vitlab.train``, and the pieces
it takes from timm and torchvision (schedule, layer-decay groups, the idx reader) with the numbers unchanged."""

from __future__ import annotations

import gzip
import math
import os
import struct
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import torch

import vitlab
from vitlab.errors import DataError
from vitlab.train.optim import WarmupCosine, build_optimizer, no_decay_names, param_groups


def reference_lr(step: int, *, lr: float, min_lr: float, warmup_steps: int, total_steps: int) -> float:
    """The learning rate of step ``step`` as the trainer has always computed it: linear warm-up from
    ``lr / warmup_steps`` to ``lr``, then a cosine from ``lr`` to ``min_lr`` at ``total_steps``."""
    min_lr, warmup_steps, total_steps = min(min_lr, lr), max(0, warmup_steps), max(1, total_steps)
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    span = max(1, total_steps - warmup_steps)
    t = min(1.0, (step - warmup_steps) / span)
    return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * t))


@pytest.mark.parametrize(("warmup", "total"), [(0, 1), (0, 37), (1, 1), (1, 2), (3, 20), (4, 20), (5, 5),
                                               (7, 6), (2, 3), (62, 3125), (188, 3130)])
@pytest.mark.parametrize(("lr", "min_lr"), [(2e-3, 1e-5), (1.0, 0.01), (1e-3, 0.0), (1e-5, 1e-3)])
def test_schedule_equals_the_warmup_cosine_formula_at_every_step(warmup: int, total: int, lr: float,
                                                                  min_lr: float) -> None:
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.AdamW([{"params": [p], "lr_scale": 0.5}], lr=lr)
    sched = WarmupCosine(opt, lr=lr, min_lr=min_lr, warmup_steps=warmup, total_steps=total)
    for step in range(total + 3):  # and a few beyond the end, where the rate stays at min_lr
        want = reference_lr(step, lr=lr, min_lr=min_lr, warmup_steps=warmup, total_steps=total)
        assert abs(sched.lr_at(step) - want) <= 1e-9 * max(1.0, lr)
        assert abs(sched.get_last_lr() - want) <= 1e-9 * max(1.0, lr)
        assert abs(opt.param_groups[0]["lr"] - 0.5 * want) <= 1e-9 * max(1.0, lr)
        sched.step()


def test_schedule_resumes_at_the_saved_step() -> None:
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.AdamW([p], lr=1.0)
    sched = WarmupCosine(opt, lr=1.0, min_lr=0.01, warmup_steps=4, total_steps=20)
    for _ in range(9):
        sched.step()
    opt2 = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    again = WarmupCosine(opt2, lr=1.0, min_lr=0.01, warmup_steps=4, total_steps=20)
    again.load_state_dict(sched.state_dict())
    assert opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"] == sched.lr_at(9)
    assert set(sched.state_dict()) == {"last_step", "base_lr", "min_lr", "warmup_steps", "total_steps"}


def expected_layer(name: str, depth: int) -> int:
    """vit_mnist's layers for layer decay, written out as timm's ViT matcher reads them: the stem 0, block i at
    i + 1, the final norm with the last block, the head last."""
    if name.startswith("blocks."):
        return int(name.split(".")[1]) + 1
    if name.startswith("norm."):
        return depth
    if name.startswith(("head", "fc_norm")):
        return depth + 1
    return 0


@pytest.mark.parametrize("gate", ["none", "layerscale"])
def test_layer_decay_groups_and_scales(gate: str) -> None:
    depth = 3
    model = vitlab.create_model("vit_mnist", depth=depth, gate=gate)
    skip = no_decay_names(model)
    groups = param_groups(model, 0.05, layer_decay=0.75)
    names = {id(p): n for n, p in model.named_parameters()}
    # the groups appear in the order their first parameter does (a saved optimiser state is matched by order)
    want_order = []
    for n, _ in model.named_parameters():
        key = f"layer_{expected_layer(n, depth)}_{'no_decay' if n in skip else 'decay'}"
        if key not in want_order:
            want_order.append(key)
    assert [g["name"] for g in groups] == want_order
    seen = []
    for g in groups:
        layer = int(g["name"].split("_")[1])
        assert g["lr_scale"] == pytest.approx(0.75 ** (depth + 1 - layer), rel=1e-12)
        for p in g["params"]:
            n = names[id(p)]
            seen.append(n)
            assert expected_layer(n, depth) == layer, n
            assert g["weight_decay"] == (0.0 if n in skip else 0.05), n
    assert sorted(seen) == sorted(names.values())  # every parameter once
    opt = build_optimizer(model, lr=1e-3, weight_decay=0.05, layer_decay=0.75)
    assert [g["lr_scale"] for g in opt.param_groups] == [g["lr_scale"] for g in groups]


# ------------------------------------------------------------------------------------------------ idx files

def _idx_bytes(array: np.ndarray, code: int) -> bytes:
    head = struct.pack(">I", 0x0000_0000 | code << 8 | array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    return head + array.astype(array.dtype.newbyteorder(">")).tobytes()


@pytest.mark.parametrize("compress", [False, True])
@pytest.mark.parametrize(("dtype", "code"), [(np.uint8, 0x08), (np.int16, 0x0B), (np.float32, 0x0D)])
def test_idx_files_are_read_by_torchvisions_reader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, compress: bool,
                                                   dtype: type, code: int) -> None:
    import torchvision.datasets.mnist as tv_mnist

    from vitlab.data import read_idx

    calls = []
    real = tv_mnist.read_sn3_pascalvincent_tensor
    monkeypatch.setattr(tv_mnist, "read_sn3_pascalvincent_tensor", lambda *a, **k: calls.append(a) or real(*a, **k))
    array = (np.arange(2 * 3 * 4) * 7 - 20).astype(dtype).reshape(2, 3, 4)
    data = _idx_bytes(array, code)
    path = tmp_path / ("x-idx3-ubyte.gz" if compress else "x-idx3-ubyte")
    path.write_bytes(gzip.compress(data) if compress else data)
    got = read_idx(path, ndim=3)
    assert calls and got.shape == (2, 3, 4)
    np.testing.assert_array_equal(got, array)
    empty = tmp_path / "e-idx1-ubyte"
    empty.write_bytes(_idx_bytes(np.zeros(0, np.uint8), 0x08))
    assert read_idx(empty, ndim=1).shape == (0,)
    with pytest.raises(DataError, match="bytes beyond its declared shape"):
        (tmp_path / "long").write_bytes(data + b"\x00")
        read_idx(tmp_path / "long")


# ------------------------------------------------------------------------------------------- the trainer's road

# the stages of a run, in the order they run (vitlab/train/engine.py's docstring); the loop is engine.py itself
STAGES = ["plan.py", "batches.py", "run_model.py", "optim.py", "resume.py"]
# what every stage may call: the process group, seeds, signals, the run lock, logging and tracking, the progress
# record, the evaluation and the divergence rule
SERVICES = {"distributed.py", "seeding.py", "signals.py", "lock.py", "logging.py", "tracking.py", "progress.py",
            "evaluate.py", "divergence.py", "the plan read"}
PLAN_VALUES = ("RunPlan.", "DataPlan.", "Schedule.")  # the plan's own methods: reading the plan, not making it
DRIVER = ("train", "Trainer.__init__")  # engine.py's stages before the loop (the loop then uses what they built)
TINY_RUN = ["--model", "vit_mnist", "--dataset", "mnist-5k", "--depth", "1", "--embed-dim", "32", "--num-heads",
            "2", "--limit-train", "128", "--limit-test", "32", "--batch-size", "64", "--device", "cpu", "--threads",
            "1", "--no-progress"]


def walk(argv: list[str]) -> tuple[list[str], list[str]]:
    """Run ``vitlab argv`` under a profiler; returns (the files of ``vitlab/train`` the trainer's driver calls into
    before the loop (``engine.py``'s :data:`DRIVER`), consecutive repeats merged; the calls from inside a stage into
    a later stage)."""
    import os
    import sys

    import vitlab.train
    from vitlab.cli import main

    root = os.path.dirname(vitlab.train.__file__) + os.sep
    road: list[str] = []
    forward: list[str] = []

    def name(frame) -> str | None:  # noqa: ANN001
        path = frame.f_code.co_filename
        if path == root + "plan.py" and frame.f_code.co_qualname.startswith(PLAN_VALUES):
            return "the plan read"
        return path[len(root):] if path.startswith(root) else None

    def profile(frame, event: str, arg) -> None:  # noqa: ANN001
        if event != "call":
            return
        callee = name(frame)
        if callee is None or callee == "engine.py":
            return
        caller = name(frame.f_back) if frame.f_back is not None else None
        if caller == "engine.py" and frame.f_back.f_code.co_qualname in DRIVER:
            if not road or road[-1] != callee:
                road.append(callee)
            return
        stages = [f for f in road if f in STAGES]
        if stages and callee in STAGES and STAGES.index(callee) > STAGES.index(stages[-1]):
            forward.append(f"{caller} -> {callee}:{frame.f_code.co_name} during {stages[-1]}")

    sys.setprofile(profile)
    try:
        rc = main(argv)
    finally:
        sys.setprofile(None)
    assert rc == 0
    return road, forward


@pytest.mark.parametrize("resumed", [False, True])
def test_a_train_call_visits_each_stage_once_in_order(tmp_path: Path, resumed: bool) -> None:
    out = tmp_path / "run"
    argv = ["train", *TINY_RUN, "--epochs", "1", "--output", str(out)]
    if resumed:
        from vitlab.cli import main

        assert main(argv) == 0
        argv = ["train", "--resume", str(out), "--epochs", "2", "--no-progress"]
    road, forward = walk(argv)
    stages = [f for f in road if f in STAGES]
    stages = [f for i, f in enumerate(stages) if i == 0 or stages[i - 1] != f]  # the plan: request, then make_plan
    assert stages == STAGES, road  # each stage once, contiguous, in order
    assert set(road) <= set(STAGES) | SERVICES, road
    assert forward == []  # a stage uses what earlier stages decided, never a later one


def test_train_files_import_only_earlier_stages() -> None:
    """Read top to bottom: a stage's file imports no later stage's file."""
    import ast

    import vitlab.train

    root = Path(vitlab.train.__file__).parent
    for i, stage in enumerate(STAGES):
        tree = ast.parse((root / stage).read_text())
        imported = {node.module.rsplit(".", 1)[-1] + ".py" for node in ast.walk(tree)
                    if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("vitlab.train.")}
        assert not imported & set(STAGES[i + 1:]), (stage, imported)


def test_train_files_fit_in_one_sitting() -> None:
    import vitlab.train

    for path in Path(vitlab.train.__file__).parent.glob("*.py"):
        assert len(path.read_text().splitlines()) <= 450, path.name


# ------------------------------------------------------------------------------------------------ names, errors

def test_a_divergence_is_a_numerical_error_not_a_config_error() -> None:
    from vitlab.errors import ConfigError, NumericalError, VitlabError
    from vitlab.train import NonFiniteLoss

    assert issubclass(NonFiniteLoss, NumericalError) and issubclass(NumericalError, VitlabError)
    assert not issubclass(NonFiniteLoss, ConfigError)


def test_progress_names_the_judged_figures_and_reads_older_records() -> None:
    from vitlab.train.progress import Progress

    p = Progress()
    p.end_epoch(0.5, 0.75)
    assert (p.eval_loss, p.eval_acc, p.best_eval_acc, p.best_epoch) == (0.5, 0.75, 0.75, 1)
    assert not any("test" in k for k in p.to_dict())  # with --val-split they are validation figures
    old = Progress()
    old.restore({"epoch": 2, "test_loss": 0.4, "test_acc": 0.8, "best_test_acc": 0.9, "best_epoch": 1})
    assert (old.eval_loss, old.eval_acc, old.best_eval_acc) == (0.4, 0.8, 0.9)


def test_val_split_summary_keeps_its_documented_keys(tmp_path: Path) -> None:
    import json

    from vitlab.cli import main

    out = tmp_path / "run"
    assert main(["train", *TINY_RUN, "--epochs", "1", "--val-size", "32", "--output", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert {"final_val_acc", "best_val_acc", "final_test_acc"} <= set(summary) and "best_test_acc" not in summary
    row = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert "val_acc" in row and "test_acc" not in row


# ------------------------------------------------------------------------------------------ the dataset table

def test_every_dataset_fact_is_read_from_the_catalog() -> None:
    from vitlab.catalog import CATALOG
    from vitlab.data import DATASETS, dataset_stats
    from vitlab.data.reference import REFERENCE_ACCURACY, TRAIN_SIZES
    from vitlab.models.pretrained_cfg import PRESET_STATS
    from vitlab.train import config, recipes, run_model

    assert DATASETS == tuple(CATALOG)
    for name, info in CATALOG.items():
        assert dataset_stats(name) == (info.mean, info.std)
        assert TRAIN_SIZES.get(name) == info.num_train and REFERENCE_ACCURACY.get(name) == info.reference_acc
        assert recipes.data_kind(name) == info.kind
    assert PRESET_STATS["vit_mnist"] == (CATALOG["mnist"].mean, CATALOG["mnist"].std)
    for gone in ("DATA_KIND", "RECIPE_FIELDS"):
        assert not hasattr(config, gone) and not hasattr(recipes, gone)
    assert not hasattr(run_model, "DATA_SHAPES")


def test_timm_models_take_the_catalogs_native_shape() -> None:
    from vitlab.train.config import RunConfig
    from vitlab.train.plan_model import resolve_model

    for dataset, shape in [("cifar10", (32, 3)), ("mnist", (28, 1)), ("fashion-mnist", (28, 1))]:
        _, _, img_size, in_chans = resolve_model(RunConfig(model="timm:vit_tiny_patch16_224", dataset=dataset,
                                                           model_overrides={"patch_size": 4}))
        assert (img_size, in_chans) == shape


# ------------------------------------------------------------------------------------------- CPU planning

def test_cpu_planning_is_a_perf_decision() -> None:
    from vitlab import perf
    from vitlab.errors import ConfigError
    from vitlab.train.engine import Trainer
    from vitlab.train.run_model import token_count

    assert not hasattr(Trainer, "_plan_cpu")
    threads = torch.get_num_threads()
    try:
        model = vitlab.create_model("vit_mnist", depth=1)
        tokens = token_count(model)
        cpu = torch.device("cpu")
        want = perf.cpu_plan(64, tokens).slices
        assert perf.plan_training(model, cpu, batch_size=64, macs=1000, tokens=tokens) == want
        assert perf.plan_training(model, cpu, batch_size=64, threads=1, macs=1000, tokens=tokens) == 1
        assert torch.get_num_threads() == 1
        with pytest.raises(ConfigError, match="--slices 2 is a CPU option"):
            perf.plan_training(model, torch.device("cuda"), batch_size=64, slices=2)
        dropout = vitlab.create_model("vit_mnist", depth=1, drop_rate=0.1)
        with pytest.raises(ConfigError, match="--slices 2: the model has dropout"):
            perf.plan_training(dropout, cpu, batch_size=64, slices=2, macs=1000, tokens=tokens)
        assert perf.plan_training(dropout, cpu, batch_size=64, macs=1000, tokens=tokens) == 1
        # a small model that cannot be sliced takes the cores as intra-op threads; one that can, one per slice
        conv = vitlab.create_model("vit_mnist_conv_patch14", depth=1)
        with mock.patch.dict(os.environ, {"LOCAL_WORLD_SIZE": "1"}):
            os.environ.pop("OMP_NUM_THREADS", None)
            assert perf.plan_training(conv, cpu, batch_size=64, macs=1000, tokens=token_count(conv)) == 1
            assert torch.get_num_threads() == (os.cpu_count() or 1)
            perf.plan_training(model, cpu, batch_size=64, slices=1, macs=1000, tokens=tokens)
            assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)
