"""The `vitlab flops` and `vitlab models` commands, in-process and once through `python -m vitlab`."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

import vitlab
from vitlab import flops
from vitlab.cli import main


def test_flops_vit_mnist_prints_table_totals_and_cross_check(capsys: pytest.CaptureFixture) -> None:
    assert main(["flops", "vit_mnist"]) == 0
    out = capsys.readouterr().out
    model = vitlab.create_model("vit_mnist")
    macs = model.flop_count()
    assert f"MACs         {macs:,}" in out and f"FLOPs        {2 * macs:,}" in out
    assert "blocks.7.mlp" in out and "patch_embed" in out and "= 2 x MACs" in out
    cross = [line for line in out.splitlines() if line.startswith("cross-check")]
    assert len(cross) == 1 and cross[0].endswith("OK, equal")
    assert f"{2 * model.flop_count(matmul_only=True):,}" in cross[0]


def test_flops_json_with_overrides(capsys: pytest.CaptureFixture) -> None:
    argv = ["flops", "cait_xxs24", "--img-size", "64", "--patch-size", "16", "--in-chans", "1", "--num-classes", "7",
            "--json"]
    assert main(argv) == 0
    d = json.loads(capsys.readouterr().out)
    model = vitlab.create_model("cait_xxs24", img_size=64, patch_size=16, in_chans=1, num_classes=7)
    assert (d["img_size"], d["patch_size"], d["in_chans"]) == (64, 16, 1)
    assert d["macs"] == model.flop_count() and d["flops"] == 2 * d["macs"]
    assert d["params"] == sum(p.numel() for p in model.parameters())
    assert d["cross_check"] == {"ours_flops": 2 * model.flop_count(matmul_only=True),
                                "torch_flops": 2 * model.flop_count(matmul_only=True), "equal": True}
    head = [r for r in d["rows"] if r["name"] == "head"]
    assert head[0]["macs"] == 192 * 7


def test_flops_on_cpu_device(capsys: pytest.CaptureFixture) -> None:
    assert main(["flops", "deepvit_s", "--img-size", "32", "--device", "cpu"]) == 0
    assert capsys.readouterr().out.rstrip().endswith("OK, equal")


def test_flops_exits_1_when_the_counts_disagree(capsys: pytest.CaptureFixture,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(flops, "cross_check", lambda model: (100, 104))
    assert main(["flops", "vit_mnist"]) == 1
    assert "MISMATCH by +4" in capsys.readouterr().out


@pytest.mark.parametrize("argv,needle", [
    (["flops", "vit_tinny"], "did you mean vit_tiny"),
    (["flops", "vit_mnist", "--img-size", "30"], "use img_size 28 or 35"),
    (["flops", "vit_mnist", "--device", "tpu"], "use meta, cpu or cuda"),
    (["models", "vitt"], "did you mean vit_tiny"),
])
def test_bad_input_exits_2_with_one_line(capsys: pytest.CaptureFixture, argv: list[str], needle: str) -> None:
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"vitlab {argv[0]}: error: ") and needle in lines[0]


def test_models_lists_every_preset_with_params_and_gmacs(capsys: pytest.CaptureFixture) -> None:
    assert main(["models"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = {line.split()[0]: line.split() for line in lines[1:-1]}
    assert list(rows) == vitlab.list_models()
    assert rows["cait_s24"][-2:] == ["46.92", "9.359"]
    assert rows["vit_mnist"][-2:] == ["0.40", "0.007"]


def test_models_pattern_and_json(capsys: pytest.CaptureFixture) -> None:
    assert main(["models", "cait*", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == vitlab.list_models("cait*")
    s24 = next(r for r in rows if r["name"] == "cait_s24")
    with torch.device("meta"):
        model = vitlab.create_model("cait_s24")
    assert s24["macs"] == model.flop_count() and s24["params"] == sum(p.numel() for p in model.parameters())
    assert main(["models", "vit5"]) == 0  # a plain word is a substring
    names = [line.split()[0] for line in capsys.readouterr().out.splitlines()[1:-1]]
    assert names == vitlab.list_models("vit5*")


def test_python_m_vitlab_bad_preset_exits_2_without_traceback() -> None:
    proc = subprocess.run([sys.executable, "-m", "vitlab", "flops", "cait_s42"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and "unknown model 'cait_s42'" in lines[0] and "cait_s24" in lines[0]


HELP_WITHOUT_TORCH = """
import contextlib, io, sys
from vitlab.cli import build_parser, main

commands = sorted(build_parser()._subparsers._group_actions[0].choices)
for argv in [["--help"]] + [[c, "--help"] for c in commands]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        main(argv)
    assert "usage: vitlab" in out.getvalue(), argv
    heavy = sorted(m for m in ("torch", "numpy", "timm", "yaml") if m in sys.modules)
    assert not heavy, f"vitlab {' '.join(argv)} imported {heavy}"
print(" ".join(commands))
"""


def test_help_answers_without_importing_torch() -> None:
    """`vitlab --help` and every `vitlab COMMAND --help` build their parsers without torch (a fresh process)."""
    proc = subprocess.run([sys.executable, "-c", HELP_WITHOUT_TORCH], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert {"train", "sweep", "compare", "analyze", "flops"} <= set(proc.stdout.split())
