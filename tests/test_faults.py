"""Fault injection on real processes: SIGKILL, SIGTERM and SIGINT during training, a kill in the middle of a
checkpoint write, a dead worker under torchrun, and bad input through ``python -m vitlab``.

Each faulty run is a ``vitlab train`` child process started through a small driver script that pauses the
child at a chosen optimiser step (or half-way through writing a chosen checkpoint file) and leaves a marker
file; the test then delivers the fault. The same run uninterrupted (in this process) is the reference the
resumed run must match bit for bit (same seed, CPU, one thread).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from _helpers import run_args
from vitlab.checkpoint import load_model, load_train_state, read_config
from vitlab.cli import main
from vitlab.train.logging import read_metrics

pytestmark = pytest.mark.full  # real processes killed and resumed: make test-all (CI)

# 64 images, batch 16: 4 steps per epoch, 3 epochs = 12 steps; checkpoints after steps 3, 4, 6, 8, 9, 12
TINY = run_args(model="vit_mnist", depth=1, embed_dim=16, num_heads=2, limit_train=64, limit_test=32, epochs=3,
                batch_size=16, seed=7, progress=False, device="cpu", threads=1, checkpoint_every=3)
TIMEOUT = 240  # seconds a child may take on a loaded 2-core machine

DRIVER = r'''
"""Run the vitlab CLI with one fault hook (argv[1]: pause@STEP[@RANK], kill@STEP@RANK or write@FILE@N)."""
import os, signal, sys, tempfile, time
from pathlib import Path

from vitlab import atomic
from vitlab.train import engine

kind, *where = sys.argv[1].split("@")
marker = Path(os.environ["FAULT_MARKER"])


def announce(text):
    tmp = marker.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, marker)


if kind in ("pause", "kill"):
    at, rank = int(where[0]), int(where[1]) if len(where) > 1 else 0
    step = engine.Trainer._train_step

    def hooked(self, *args):
        loss = step(self, *args)
        if self.progress.global_step == at and self.ctx.rank == rank:
            if kind == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            announce(f"{os.getpid()} step {at}")
            deadline = time.time() + 300
            while not self.stop.requested and time.time() < deadline:  # a signal ends the pause
                time.sleep(0.02)
        return loss

    engine.Trainer._train_step = hooked
else:  # write@NAME@N: the N-th write of NAME stops half-way through its temporary file
    name, nth = where[0], int(where[1])
    calls = {"n": 0}
    atomic_write = atomic.atomic_write

    def hooked_write(path, write):
        path = Path(path)
        if path.name == name:
            calls["n"] += 1
            if calls["n"] == nth:
                fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
                os.close(fd)
                write(tmp)
                os.truncate(tmp, os.path.getsize(tmp) // 2)
                announce(f"{os.getpid()} writing {tmp}")
                time.sleep(300)
        return atomic_write(path, write)

    atomic.atomic_write = hooked_write

from vitlab.cli import main

sys.exit(main(sys.argv[2:]))
'''


def child_env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "FAULT_MARKER": str(tmp_path / "marker")}


def start(tmp_path: Path, fault: str, argv: list[str], launcher: list[str] | None = None) -> subprocess.Popen:
    """Start the driver (directly, or under ``launcher`` such as torchrun); stdout/stderr go to files."""
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    cmd = [*(launcher or [sys.executable]), str(driver), fault, *argv]
    with open(tmp_path / "stdout.txt", "w") as out, open(tmp_path / "stderr.txt", "w") as err:
        return subprocess.Popen(cmd, cwd=tmp_path, env=child_env(tmp_path), stdout=out, stderr=err,
                                start_new_session=True)  # its own process group: kill_all reaches every worker


def kill_all(proc: subprocess.Popen) -> None:
    """SIGKILL the child's whole process group (a launcher and its workers)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def wait_for_marker(tmp_path: Path, proc: subprocess.Popen) -> str:
    """The marker the driver leaves at the fault point (the child is then paused there)."""
    marker = tmp_path / "marker"
    deadline = time.time() + TIMEOUT
    while not marker.exists():
        if proc.poll() is not None or time.time() > deadline:
            kill_all(proc)
            pytest.fail(f"child ended (rc {proc.returncode}) before the fault point:\n{stderr_of(tmp_path)}")
        time.sleep(0.05)
    return marker.read_text()


def finish(proc: subprocess.Popen) -> int:
    try:
        return proc.wait(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        kill_all(proc)
        raise


def stderr_of(tmp_path: Path) -> str:
    return (tmp_path / "stderr.txt").read_text()


def weights(out: Path) -> dict[str, torch.Tensor]:
    return load_file(str(out / "model.safetensors"))


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    """Equal up to 1e-6: bit-exact in practice, but a BLAS kernel may round differently with another memory
    alignment; a resume that loses any state (RNG, optimiser moments, schedule, data order) is off by far more."""
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=1e-6, msg=lambda m, key=key: f"{key}: {m}")


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted run, trained in this process."""
    out = tmp_path_factory.mktemp("reference") / "run"
    assert main(["train", *TINY, "--output", str(out)]) == 0
    assert load_train_state(out)["progress"]["global_step"] == 12
    return out


def resume_and_compare(out: Path, reference: Path) -> None:
    """``--resume`` the interrupted run to the end; its weights and per-epoch accuracy equal the reference's."""
    assert main(["train", "--resume", str(out)]) == 0
    assert_same_weights(weights(out), weights(reference))
    assert_same_weights(load_train_state(out)["model"], load_train_state(reference)["model"])
    assert [r["test_acc"] for r in read_metrics(out)] == [r["test_acc"] for r in read_metrics(reference)]
    assert len(read_metrics(out)) == 3
    assert not [p.name for p in out.iterdir() if p.name.endswith(".tmp")], "temporary files left behind"


def test_sigkill_then_resume_matches_an_uninterrupted_run(tmp_path: Path, reference: Path) -> None:
    out = tmp_path / "run"
    proc = start(tmp_path, "pause@5", ["train", *TINY, "--output", str(out)])
    wait_for_marker(tmp_path, proc)  # paused after step 5; the last checkpoint is the one of step 4
    proc.send_signal(signal.SIGKILL)
    assert finish(proc) == -signal.SIGKILL
    assert load_train_state(out)["progress"]["global_step"] == 4
    load_model(out)  # the checkpoint on disk is complete
    resume_and_compare(out, reference)


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)],
                         ids=["SIGTERM", "SIGINT"])
def test_signal_saves_then_resume_matches(tmp_path: Path, reference: Path, signum: int, code: int) -> None:
    out = tmp_path / "run"
    proc = start(tmp_path, "pause@5", ["train", *TINY, "--output", str(out)])
    wait_for_marker(tmp_path, proc)
    proc.send_signal(signum)
    assert finish(proc) == code
    err = stderr_of(tmp_path).strip()
    assert "\n" not in err and signal.Signals(signum).name in err and f"--resume {out}" in err
    assert load_train_state(out)["progress"]["global_step"] == 5  # saved at the step the signal arrived in
    resume_and_compare(out, reference)


@pytest.mark.parametrize("name", ["state.pt", pytest.param("model.safetensors", marks=pytest.mark.slow)])
def test_sigkill_during_a_checkpoint_write_keeps_the_previous_one(tmp_path: Path, reference: Path,
                                                                  name: str) -> None:
    out = tmp_path / "run"
    proc = start(tmp_path, f"write@{name}@2", ["train", *TINY, "--output", str(out)])
    note = wait_for_marker(tmp_path, proc)  # half of the second checkpoint's file is on disk
    proc.send_signal(signal.SIGKILL)
    assert finish(proc) == -signal.SIGKILL
    tmp = Path(note.split("writing ")[1])
    assert tmp.exists() and tmp.parent == out and tmp.name.startswith(f".{name}.")  # the kill was mid-write
    step = load_train_state(out)["progress"]["global_step"]
    assert step == (3 if name == "state.pt" else 4)  # state.pt is written before the weights
    load_model(out)
    assert read_config(out)["run"]["epochs"] == 3
    resume_and_compare(out, reference)  # also removes the stale temporary file


def test_a_live_run_folder_refuses_a_second_writer_and_a_killed_ones_does_not(capsys, tmp_path: Path,
                                                                              reference: Path) -> None:
    out = tmp_path / "run"
    proc = start(tmp_path, "pause@5", ["train", *TINY, "--output", str(out)])
    wait_for_marker(tmp_path, proc)  # live, paused after step 5, holding the lock
    try:
        for argv in (["train", *TINY, "--output", str(out)], ["train", "--resume", str(out)]):
            capsys.readouterr()
            assert main(argv) == 2
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and "Traceback" not in err, err
            assert f"{out} is being written by another vitlab train run (process {proc.pid})" in err, err
            assert "pick another --output" in err
    finally:
        proc.send_signal(signal.SIGKILL)
        finish(proc)
    assert (out / "train.lock").read_text().split()[0] == str(proc.pid)  # the stale lock of the killed run (pid host)
    resume_and_compare(out, reference)  # does not block --resume


@pytest.mark.slow
@pytest.mark.xdist_group("ports")  # the rendezvous binds a port: never beside another test that does
def test_torchrun_dead_worker_fails_the_launch_and_keeps_rank0_checkpoint(tmp_path: Path) -> None:
    out = tmp_path / "run"
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                "--monitor_interval=0.2"]
    proc = start(tmp_path, "kill@5@1", ["train", *TINY, "--output", str(out)], launcher=launcher)
    rc = finish(proc)
    assert rc != 0, "torchrun reported success although a worker was SIGKILLed"
    assert "exitcode  : -9" in stderr_of(tmp_path) or "Signal 9" in stderr_of(tmp_path)
    assert load_train_state(out)["progress"]["global_step"] == 4
    model = load_model(out)
    assert all(torch.isfinite(t).all() for t in model.state_dict().values())
    assert main(["train", "--resume", str(out), "--epochs", "2"]) == 0  # resumable in one process


@pytest.mark.parametrize("case", ["yaml", "checkpoint"])
def test_python_m_vitlab_bad_input_exits_2_with_one_line(tmp_path: Path, case: str) -> None:
    if case == "yaml":
        bad = tmp_path / "bad.yaml"
        bad.write_text("epochs: [1, 2\n")
        argv, needle = ["train", "--config", str(bad)], f"vitlab train: error: config file {bad} is not valid YAML"
    else:
        bad = tmp_path / "ckpt"
        bad.mkdir()
        (bad / "model.safetensors").write_bytes(b"\x00" * 7)
        argv, needle = ["eval", "--checkpoint", str(bad)], f"vitlab eval: error: {bad} has no config.json"
    proc = subprocess.run([sys.executable, "-m", "vitlab", *argv], cwd=tmp_path, env=child_env(tmp_path),
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith(needle), proc.stderr


# ------------------------------------------------------------------------------------------ kill anywhere

ZYGOTE = r'''
"""Import vitlab once, then fork one training process per request line (JSON: argv, kill point, trace, log).

Each forked process runs the CLI with hooks at every event of a run: after a step, after an evaluation, before and
after appending a metrics row, half-way through and right after each atomic file write. An event is
[kind, stage, global step, n-th of its kind there]; the process SIGKILLs itself at the one named ``kill``, and
appends every event to ``trace`` when given. The reply is the process's exit status (-9: killed).
"""
import json, os, signal, sys
from pathlib import Path

from vitlab import atomic
from vitlab.cli import main
from vitlab.train import engine, optim
from vitlab.train.logging import RunLogger

optim.fused_adamw_supported("cpu")  # warm what every run would import again (torch._dynamo: seconds)
try:
    import torch.utils.tensorboard
except ImportError:
    pass


def run(request):
    kill, where, counts = request["kill"], {"stage": "start", "g": 0}, {}
    trace = open(request["trace"], "w") if request["trace"] else None

    def event(kind):
        if where["stage"] == "start":  # the metrics rewrite when a process starts: not part of the run
            return False
        key = (kind, where["stage"], where["g"])
        counts[key] = counts.get(key, 0) + 1
        point = [*key, counts[key]]
        if trace:
            trace.write(json.dumps(point) + "\n")
            trace.flush()
        return point == kill

    def die():
        os.kill(os.getpid(), signal.SIGKILL)

    fit, step, evaluate = engine.Trainer.fit, engine.Trainer._train_step, engine.evaluate
    log_epoch, atomic_write = RunLogger.log_epoch, atomic.atomic_write

    def hooked_fit(self):
        where.update(stage="start", g=self.progress.global_step)
        return fit(self)

    def hooked_step(self, *args):
        loss = step(self, *args)
        where.update(stage="step", g=self.progress.global_step)
        if event("step"):
            die()
        return loss

    def hooked_evaluate(*args, **kwargs):
        result = evaluate(*args, **kwargs)
        where["stage"] = "epoch"
        if event("eval"):
            die()
        return result

    def hooked_log_epoch(self, row):
        if event("log-torn"):
            line = json.dumps(row) + "\n"
            with open(self.metrics_path, "a") as fh:
                fh.write(line[: len(line) // 2])
            die()
        log_epoch(self, row)
        if event("log"):
            die()

    def hooked_write(path, write):
        name = Path(path).name
        if event("write:" + name):
            def torn(tmp):
                write(tmp)
                os.truncate(tmp, os.path.getsize(tmp) // 2)
                die()
            return atomic_write(path, torn)
        atomic_write(path, write)
        if event("after:" + name):
            die()

    engine.Trainer.fit, engine.Trainer._train_step, engine.evaluate = hooked_fit, hooked_step, hooked_evaluate
    RunLogger.log_epoch, atomic.atomic_write = hooked_log_epoch, hooked_write
    return main(request["argv"])


for line in sys.stdin:
    request = json.loads(line)
    pid = os.fork()
    if pid == 0:
        fd = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        code = 1
        try:
            code = run(request)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    print(json.dumps({"status": os.waitstatus_to_exitcode(status)}), flush=True)
'''

KILL_RUN = [*TINY[:-2], "--checkpoint-every", "1"]  # 12 steps over 3 epochs, a checkpoint after each step
# the kind of event of each kill, one kill per tenth of the run: writes (half-way through a file),
# "after" (between the files of a checkpoint), steps, an evaluation, a torn metrics row and a row logged before
# its checkpoint was saved
KILL_KINDS = ["write", "step", "eval", "after", "step", "log-torn", "write", "after", "step", "log"]


class Zygote:
    """The ZYGOTE process: one import of torch and vitlab for every run it forks."""

    def __init__(self, tmp_path: Path) -> None:
        script = tmp_path / "zygote.py"
        script.write_text(ZYGOTE)
        self.tmp_path, self.runs = tmp_path, 0
        self.proc = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, env=child_env(tmp_path),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def run(self, argv: list[str], kill: list | None = None, trace: Path | None = None) -> int:
        self.runs += 1
        log = self.tmp_path / f"run{self.runs}.log"
        request = {"argv": argv, "kill": kill, "trace": str(trace) if trace else None, "log": str(log)}
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        reply = self.proc.stdout.readline()
        assert reply, f"the zygote died:\n{log.read_text() if log.exists() else ''}"
        status = json.loads(reply)["status"]
        assert status in (0, -signal.SIGKILL), f"run {argv} ended with {status}:\n{log.read_text()}"
        return status

    def close(self) -> None:
        self.proc.stdin.close()
        finish(self.proc)


def resumed_from(out: Path) -> tuple[int, int]:
    """(global step, step in its epoch) of the checkpoint a resume continues; (0, 0) when there is none. Loading it
    verifies both files against the manifest: every kill leaves a whole checkpoint or none."""
    if not (out / "config.json").is_file():
        return 0, 0
    load_model(out)
    progress = load_train_state(out)["progress"]
    return progress["global_step"], progress["step"]


def reachable(point: list, g0: int, step0: int, steps_per_epoch: int = 4) -> bool:
    """Whether a process resumed at global step ``g0`` replays the event ``point`` (a checkpoint saved at an epoch's
    last step, before its evaluation, replays that evaluation)."""
    _, stage, g, _ = point
    return g > g0 or (stage == "epoch" and g == g0 and step0 == steps_per_epoch)


def test_sigkill_anywhere_then_resume_gives_the_uninterrupted_weights_bit_for_bit(tmp_path: Path) -> None:
    kills = len(KILL_KINDS)
    zygote = Zygote(tmp_path)
    try:
        reference, trace, out = tmp_path / "reference", tmp_path / "trace.jsonl", tmp_path / "run"
        assert zygote.run(["train", *KILL_RUN, "--output", str(reference)], trace=trace) == 0
        timeline = [json.loads(line) for line in trace.read_text().splitlines()]
        rng, position, killed = random.Random(kills), 0, []
        for i, kind in enumerate(KILL_KINDS[:kills]):
            g0, step0 = resumed_from(out)
            start, end = max(position, i * len(timeline) // kills), (i + 1) * len(timeline) // kills
            candidates = [j for j in range(start, len(timeline)) if timeline[j][0].split(":")[0] == kind
                          and reachable(timeline[j], g0, step0)]
            assert candidates, f"no {kind} event after {timeline[start]} to kill at (killed at {killed})"
            j = rng.choice([j for j in candidates if j < end] or candidates[:1])  # in this tenth of the run
            argv = ["train", "--resume", str(out)] if (out / "config.json").is_file() else \
                ["train", *KILL_RUN, "--output", str(out)]
            assert zygote.run(argv, kill=timeline[j]) == -signal.SIGKILL, f"not killed at {timeline[j]}"
            killed.append(timeline[j])
            position = j + 1
        assert zygote.run(["train", "--resume", str(out)]) == 0
    finally:
        zygote.close()
    assert len(killed) == kills and {k[0].split(":")[0] for k in killed} == set(KILL_KINDS[:kills])
    states = load_train_state(out)["model"], load_train_state(reference)["model"]
    for a, b in ((weights(out), weights(reference)), states):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), killed
    rows, lines = read_metrics(out), (out / "metrics.jsonl").read_text().splitlines()
    assert [r["epoch"] for r in rows] == [1, 2, 3] and len(lines) == 3  # each epoch once, no torn line
    assert [r["test_acc"] for r in rows] == [r["test_acc"] for r in read_metrics(reference)]
    assert (out / "summary.json").is_file() and not [p for p in out.iterdir() if p.name.endswith(".tmp")]
