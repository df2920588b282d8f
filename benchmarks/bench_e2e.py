"""End to end: `vitlab train` images/s against the bare training step of the same model, batch, optimiser,
recipe and runtime (benchmarks/bench.py --e2e)."""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from bench_rows import VIT_MNIST, Row, quick_row
from bench_runners import DEFAULT_THREADS, Runtime, interleaved, make_runner, vitlab_runtime


def e2e(device: str, args: argparse.Namespace) -> list[dict]:
    """`vitlab train` images/s (its summary.json) on mnist-5k against the bare step of the same model, batch,
    optimiser, recipe and runtime: one single-threaded process, and vitlab's plan (torchrun) when it differs."""
    probe = subprocess.run([sys.executable, "-m", "vitlab", "train", "--help"], capture_output=True, text=True)
    if probe.returncode != 0:
        return [{"skipped": "`vitlab train` does not exist yet; re-run with --e2e once it does"}]
    row = quick_row(VIT_MNIST) if args.quick else VIT_MNIST
    runtimes = [Runtime(threads=1, adamw="trainer")]
    plan = vitlab_runtime(row, "train", device)
    if plan.slices > 1:  # the plan in one process (the trainer's default), and as torchrun processes
        runtimes.append(replace(plan, adamw="trainer"))
        runtimes.append(replace(plan, procs=plan.slices, slices=1, adamw="trainer"))
    return [e2e_one(rt, device, args) for rt in runtimes] if device == "cpu" else [
        e2e_one(Runtime(adamw="trainer"), device, args)]


def e2e_one(rt: Runtime, device: str, args: argparse.Namespace) -> dict:
    """One `vitlab train` run pair under ``rt``; the bare step is timed between and after the two runs."""
    cmd = ["vitlab", "train", "--model", "vit_mnist", "--dataset", "mnist-5k", "--epochs", "2", "--no-progress",
           "--device", device]
    if args.quick:
        cmd[cmd.index("--epochs") + 1] = "1"
        cmd += ["--limit-train", "128", "--limit-test", "64", "--batch-size", "32"]
    if device == "cpu":
        cmd += ["--threads", str(rt.threads or DEFAULT_THREADS), "--slices", str(rt.slices)]
    launch = [sys.executable, "-m"]
    if rt.procs > 1:
        launch += ["torch.distributed.run", "--standalone", f"--nproc_per_node={rt.procs}", "-m"]
    with tempfile.TemporaryDirectory() as tmp:
        first = _train(launch + cmd, Path(tmp) / "run1")
        if "skipped" in first:
            return first
        config = first["config"]
        run = config.get("run") or {}
        batch = int(run.get("batch_size") or 128)
        recipe = {k: run[k] for k in ("label_smoothing", "clip_grad", "lr", "weight_decay")
                  if run.get(k) is not None}
        model = {k: v for k, v in (config.get("model") or {}).items() if k != "name"}
        row = Row("vit_mnist (the trainer's model and recipe)", "vit_mnist", model, batch, ("train",), {},
                  recipe=recipe)
        runner = make_runner("vitlab", row, "train", rt, device)
        try:
            samples = interleaved({"bare": runner}, args.repeats * args.rounds, args.target_s)["bare"]
            second = _train(launch + cmd, Path(tmp) / "run2")
            samples += interleaved({"bare": runner}, args.repeats * args.rounds, args.target_s)["bare"]
        finally:
            runner.close()
    runs = [r["summary"] for r in (first, second) if "summary" in r]
    trained = statistics.median(float(r["train_images_per_second"]) for r in runs)
    bare = batch / statistics.median(samples)
    overhead = 1 - trained / bare
    shown = (["torchrun", f"--nproc_per_node={rt.procs}", "-m"] if rt.procs > 1 else []) + cmd
    return {"command": " ".join(shown + ["--output", "DIR"]), "train_images_per_s": trained,
            "train_runs_images_per_s": [float(r["train_images_per_second"]) for r in runs],
            "wall_images_per_s": [r["steps"] * batch / r["wall_time_s"] for r in runs if r.get("wall_time_s")],
            "bare_step_images_per_s": bare, "bare_runtime": rt.label(), "overhead": overhead, "goal": 0.10,
            "met": overhead < 0.10, "batch": batch, "recipe": recipe}


def _train(argv: list[str], out: Path) -> dict:
    """Run ``vitlab train`` (``argv``) into ``out``; its summary and config, or why it could not run."""
    t0 = time.perf_counter()
    proc = subprocess.run([*argv, "--output", str(out)], capture_output=True, text=True)
    if proc.returncode != 0:
        last = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return {"skipped": f"`vitlab train` failed (exit {proc.returncode}): {last[0]}"}
    return {"summary": json.loads((out / "summary.json").read_text()),
            "config": json.loads((out / "config.json").read_text()), "wall_s": time.perf_counter() - t0}
