"""DistributedDataParallel: two gloo processes under torchrun end where one process with the same global batch ends."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from _helpers import run_args
from vitlab.cli import main
from vitlab.errors import ConfigError
from vitlab.train.distributed import DistContext, check_batch, shard

# augmentation and stochastic layers off, so the only difference is who computes which half of each batch
ARGS = run_args(limit_train=128, limit_test=64, batch_size=32, epochs=2, augment=False, drop_path=0, progress=False,
                device="cpu")

# `vitlab train` as each torchrun process runs it, then the names of the threads left when the interpreter is about
# to finalize: a gloo thread alive then can abort the process (vitlab.train.distributed). The cyclic collector is
# off, as it may be at that point in any run: whether it happened to run must not decide the teardown.
DRIVER = """
import gc, os, sys
gc.disable()
from vitlab.cli import main
code = main(sys.argv[1:])
tasks = "/proc/self/task"
names = sorted(open(f"{tasks}/{t}/comm").read().strip() for t in os.listdir(tasks)) if os.path.isdir(tasks) else []
print(f"rank {os.environ['RANK']} gloo threads left: {[n for n in names if 'gloo' in n]}", flush=True)
sys.exit(code)
"""


def torchrun(nproc: int, out: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    driver = out.parent / "driver.py"
    driver.write_text(DRIVER)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", str(driver),
           "train", *ARGS, *extra, "--output", str(out)]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.full  # torchrun: two processes and a gloo process group
@pytest.mark.xdist_group("ports")  # the rendezvous binds a port: never beside another test that does
def test_two_gloo_processes_match_one_process(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    assert main(["train", *ARGS, "--output", str(one)]) == 0
    proc = torchrun(2, two)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.count("epoch   2") == 1  # only rank 0 prints and writes
    if Path("/proc/self/task").is_dir():  # Linux names its threads there
        for rank in range(2):  # the process group's worker and transport threads were joined at teardown
            assert f"rank {rank} gloo threads left: []" in proc.stdout, proc.stdout[-2000:]
    a, b = load_file(str(one / "model.safetensors")), load_file(str(two / "model.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-5, atol=1e-5, msg=k)
    rows_one = [json.loads(x) for x in (one / "metrics.jsonl").read_text().splitlines()]
    rows_two = [json.loads(x) for x in (two / "metrics.jsonl").read_text().splitlines()]
    for r1, r2 in zip(rows_one, rows_two, strict=True):
        assert r1["test_acc"] == r2["test_acc"]  # the sharded evaluation sums to the whole test set
        assert r1["train_loss"] == pytest.approx(r2["train_loss"], rel=1e-5)
        assert r1["test_loss"] == pytest.approx(r2["test_loss"], rel=1e-5)
    summary = json.loads((two / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == 8


def test_global_batch_is_split_into_contiguous_shards():
    batch = torch.arange(12)
    parts = [shard(batch, DistContext(rank=r, world_size=3)) for r in range(3)]
    assert torch.equal(torch.cat(parts), batch) and all(len(p) == 4 for p in parts)
    with pytest.raises(ConfigError, match="multiple of 3"):
        check_batch(32, DistContext(rank=0, world_size=3))
