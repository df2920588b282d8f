"""The benchmark command (benchmarks/bench.py) and the runtime settings it measures (vitlab.perf)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from _scripts import load_script
from vitlab import perf
from vitlab.errors import ConfigError
from vitlab.train import optim

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench.py"


def _bench_module():
    return load_script("bench")


def _run_bench(*args: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(BENCH), *args, "--out", str(tmp_path)], capture_output=True,
                          text=True, env=env, timeout=600)


# ----------------------------------------------------------------------------------------------- vitlab.perf
# cpu_plan and the sliced steps: tests/test_slices.py


def test_cpu_model_reads_the_model_name_and_falls_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel\t\t: 1\n"
                    "model name\t: AMD EPYC 7763 64-Core Processor\nflags\t\t: fpu\n")
    assert perf.cpu_model(info) == "AMD EPYC 7763 64-Core Processor"  # not the "model" line before it
    monkeypatch.setattr(perf.cpu.platform, "processor", lambda: "arm")
    info.write_text("processor\t: 0\nmodel name\t:\n")  # an empty name (some ARM kernels) falls back
    assert perf.cpu_model(info) == "arm"
    assert perf.cpu_model(tmp_path / "missing") == "arm"  # not Linux
    monkeypatch.setattr(perf.cpu.platform, "processor", lambda: "")
    monkeypatch.setattr(perf.cpu.platform, "machine", lambda: "x86_64")
    assert perf.cpu_model(tmp_path / "missing") == "x86_64"


def test_cpu_peak_bytes_is_the_high_water_mark_not_the_sum() -> None:
    n = 1 << 20  # 4 MiB of float32 each

    def two_at_once() -> None:
        a, b = torch.ones(n), torch.ones(n)
        del a, b

    def one_after_another() -> None:
        for _ in range(3):
            a = torch.ones(n)
            del a

    mib = 4 * n
    assert mib * 2 <= perf.cpu_peak_bytes(two_at_once) < mib * 3
    assert mib <= perf.cpu_peak_bytes(one_after_another) < mib * 2  # freed in between: not 3x
    assert perf.cpu_peak_bytes(lambda: None) == 0


def test_benchmark_machine_lines_name_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    # every timing script quotes the CPU through perf.cpu_model, so a figure names its machine, not "x86_64"
    monkeypatch.setattr(perf, "cpu_model", lambda *a: "Test CPU 9000")
    assert _bench_module().machine("cpu").startswith("Test CPU 9000, ")


def test_set_threads() -> None:
    before = torch.get_num_threads()
    try:
        assert perf.set_threads(1) == 1
        assert perf.set_threads(None) == 1
        with pytest.raises(ConfigError, match="threads must be >= 1"):
            perf.set_threads(0)
    finally:
        torch.set_num_threads(before)


def _adamw_steps(impl: str) -> list[torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 3))
    opt = optim.adamw([{"params": model[0].parameters(), "weight_decay": 0.05},
                       {"params": model[2].parameters(), "weight_decay": 0.0}], impl=impl, lr=1e-2)
    for _ in range(3):
        model(torch.randn(4, 8)).square().sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return [p.detach().clone() for p in model.parameters()]


def test_adamw_implementations_give_the_same_updates() -> None:
    ref = _adamw_steps("loop")
    for impl in ("foreach", "fused", "auto"):
        for got, want in zip(_adamw_steps(impl), ref):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_adamw_picks_fused_where_supported() -> None:
    p = torch.nn.Parameter(torch.zeros(3))
    opt = optim.adamw([p], lr=1e-3)
    if optim.fused_adamw_supported("cpu"):
        assert opt.defaults["fused"] is True
    else:
        assert opt.defaults["foreach"] is True
    assert optim.adamw([p], impl="foreach").defaults["foreach"] is True
    with pytest.raises(ConfigError, match="choose auto, fused, foreach or loop"):
        optim.adamw([p], impl="turbo")


# ----------------------------------------------------------------------------------------------- bench.py
def test_timm_peers_have_the_architecture_of_their_rows() -> None:
    bench = _bench_module()
    for row in map(bench.quick_row, bench.ROWS):
        if row.peer == "none":
            continue
        ours, theirs = bench.build("vitlab", row), bench.build("timm", row)
        count = sum(p.numel() for p in ours.parameters() if p.requires_grad)
        peer = sum(p.numel() for p in theirs.parameters() if p.requires_grad)
        if row.peer == "same":
            assert count == peer, row.name
        x = torch.randn(2, ours.cfg.in_chans, ours.cfg.img_size, ours.cfg.img_size)
        assert ours(x).shape == theirs(x).shape


def test_markdown_marks_missed_goals_and_lists_runtimes() -> None:
    bench = _bench_module()
    side = dict(runtime="2 procs x 1 thr, AdamW fused", images_per_s=100.0, samples_s=[1.0], first_step_s=0.1,
                peak_mb=10.0, flops_per_image=1e6, mfu=0.2)
    slow = dict(side, runtime="2 thr, AdamW default", images_per_s=80.0, mfu=0.16)
    rows = [dict(row="a", mode="train", batch=8, peer="same", vitlab=side, timm=slow, ratio=1.25, goal=2.0,
                 met=False, notes=[]),
            dict(row="b", mode="infer", batch=8, peer="none", vitlab=side, timm=None, ratio=None, goal=None,
                 met=None, notes=["no timm peer: absolute figures"])]
    report = dict(command="python benchmarks/bench.py", machine="m", matmul_gflops=100.0, matmul_note="n",
                  load_before="0", load_after="0", rows=rows)
    text = bench.markdown(report)
    assert "| a | train | 8 | 100.0 | 80.0 | **1.25x** | >= 2.0x **MISSED** |" in text
    assert "| b (no timm peer: absolute figures) | infer | 8 | 100.0 | - |" in text
    assert "2 thr, AdamW default" in text


@pytest.mark.full  # benchmarks/bench.py in a subprocess
def test_quick_run_writes_the_table_and_json(tmp_path: Path) -> None:
    proc = _run_bench("--quick", "--rows", "vit_mnist,deepvit_16b", tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((tmp_path / "cpu_quick.json").read_text())
    modes = [(r["row"], r["mode"]) for r in report["rows"]]
    assert ("vit_mnist 28x28x1", "train") in modes and ("deepvit_16b 224", "infer") in modes
    for r in report["rows"]:
        v = r["vitlab"]
        assert v["images_per_s"] > 0 and v["peak_mb"] > 0 and 0 < v["mfu"] < 1.5
        assert v["images_per_s"] == pytest.approx(r["batch"] / sorted(v["samples_s"])[len(v["samples_s"]) // 2])
        if r["timm"]:
            assert r["ratio"] == pytest.approx(v["images_per_s"] / r["timm"]["images_per_s"])
        else:
            assert r["ratio"] is None
    table = (tmp_path / "cpu_quick.md").read_text()
    assert "| vitlab/timm |" in table and table in proc.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cpu_quick.json", "cpu_quick.md"]  # no temp files


@pytest.mark.slow
def test_quick_run_with_data_parallel_processes(tmp_path: Path) -> None:
    proc = _run_bench("--quick", "--rows", "vit_mnist", "--vitlab-procs", "2", tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads((tmp_path / "cpu_quick.json").read_text())["rows"]
    assert rows[0]["vitlab"]["runtime"].startswith("2 procs x 1 thr")
    assert rows[0]["vitlab"]["images_per_s"] > 0


@pytest.mark.full  # benchmarks/bench.py in a subprocess
def test_unknown_row_is_one_clear_error(tmp_path: Path) -> None:
    proc = _run_bench("--quick", "--rows", "vit_huge", tmp_path=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "unknown rows ['vit_huge']; choose from" in proc.stderr
    assert not any(tmp_path.iterdir())


CPU_TIME = BENCH.parent / "cpu_time.py"


@pytest.mark.full  # a benchmark script in a subprocess
def test_cpu_time_sections_print_their_tables() -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(CPU_TIME), "--only", "softmax"], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| softmax over") or
            line.startswith("| over the axis")]
    assert len(rows) == 2 and all(float(r.split("|")[2]) > 0 for r in rows)


@pytest.mark.full  # a benchmark script in a subprocess
def test_cpu_time_unknown_section_is_one_clear_error() -> None:
    proc = subprocess.run([sys.executable, str(CPU_TIME), "--only", "gleu"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().count("\n") == 0 and "unknown sections ['gleu']; choose from" in proc.stderr


def test_denormals_benchmark_times_both_modes_and_says_where(tmp_path: Path) -> None:
    from vitlab.train.config import RunConfig
    from vitlab.train.engine import train

    run = tmp_path / "run"
    train(RunConfig(epochs=1, limit_train=64, limit_test=32, batch_size=32, threads=1, progress=False,
                    model_overrides={"depth": 1, "embed_dim": 16, "num_heads": 2}, output=str(run)))
    threads = torch.get_num_threads()
    try:
        assert load_script("denormals").main(["--checkpoint", str(run), "--batch", "4", "--steps", "1",
                                              "--out", str(tmp_path)]) == 0
    finally:
        torch.set_num_threads(threads)
    report = json.loads((tmp_path / "denormals.json").read_text())
    assert set(report["step_s"]) == {"trained, exact", "trained, flushed", "fresh, exact", "fresh, flushed"}
    assert all(s > 0 for s in report["step_s"].values()) and report["slowdown_trained"] > 0
    assert set(report["denormals_trained"]) == {"forward", "backward"}
    assert "| trained |" in (tmp_path / "denormals.md").read_text()
    assert not perf.flushes_denormals()


def test_the_bf16_lever_runs_the_cpu_step_under_bf16_autocast() -> None:
    """``Runtime(bf16=True)`` (the bf16 lever of bench_levers) computes the step's matmuls in bf16 on the CPU; the
    fp32 runtime does not; both step and update the weights."""
    bench = _bench_module()  # puts benchmarks/ on the path, where bench imports bench_runners from
    runners = sys.modules["bench_runners"]
    row = bench.quick_row(bench.ROWS[0])  # vit_mnist
    seen = {}
    for bf16 in (False, True):
        runner = runners.Runner(bench.build("vitlab", row), "train", row, runners.Runtime(threads=1, bf16=bf16), "cpu")
        before = [p.detach().clone() for p in runner.model.parameters()]
        with torch.no_grad(), runners.autocast("cpu", bf16):
            seen[bf16] = runner.net(runner.x).dtype
        assert runner.time(1) > 0
        assert any(not torch.equal(a, p) for a, p in zip(before, runner.model.parameters()))
        assert ("bf16 autocast" in runner.rt.label()) == bf16
    assert seen == {False: torch.float32, True: torch.bfloat16}


@pytest.mark.full  # two fresh processes per side and a git worktree
def test_first_step_benchmark_times_both_sides_and_states_the_interval(tmp_path: Path) -> None:
    """benchmarks/first_step.py against HEAD: every sample a positive time from a fresh process importing the side's
    own source (the probe checks where vitlab came from), a cold and a warm row each with its paired interval, and
    the baseline's worktree removed afterwards."""
    root = Path(__file__).resolve().parents[1]
    if subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True).returncode != 0:
        pytest.skip("needs the git repository")
    before = subprocess.run(["git", "worktree", "list"], cwd=root, capture_output=True, text=True).stdout
    proc = subprocess.run([sys.executable, str(root / "benchmarks" / "first_step.py"), "--baseline", "HEAD",
                           "--repeats", "2", "--out", str(tmp_path), "--", "--model", "vit_mnist", "--depth", "1",
                           "--embed-dim", "16", "--num-heads", "2", "--dataset", "mnist-5k", "--limit-train", "128",
                           "--limit-test", "32", "--epochs", "1", "--no-progress"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads((tmp_path / "first_step.json").read_text())
    for kind in ("cold", "warm"):
        samples = result[kind]["samples_s"]
        assert len(samples["current"]) == len(samples["baseline"]) == 2
        assert all(0 < t < 120 for side in samples.values() for t in side)
        low, high = result[kind]["difference_ms"]["ci95"]
        assert low <= result[kind]["difference_ms"]["mean"] <= high
    assert "| cold |" in (tmp_path / "first_step.md").read_text()
    after = subprocess.run(["git", "worktree", "list"], cwd=root, capture_output=True, text=True).stdout
    assert after == before


def test_first_step_benchmark_refuses_an_unknown_revision(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve().parents[1] / "benchmarks" / "first_step.py"),
                           "--baseline", "no-such-revision-xyz", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "not a revision" in proc.stderr
    assert not (tmp_path / "first_step.json").exists()
