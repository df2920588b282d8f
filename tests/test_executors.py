"""Where a study's runs train: the same tiny study gives the same table run by run in this process, on two local
worker processes and on a real local Ray cluster; a worker killed mid-study costs only its run (retried, else
reported failed, never dropped); a run folder another process holds is waited for, never trained twice; Ray stays
out of the base install and of ``vitlab --help``."""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from _study import finish
from vitlab.cli import main
from vitlab.errors import ConfigError
from vitlab.experiments import executors
from vitlab.experiments.executors import ExecutorConfig, default_workers, threads_per_run
from vitlab.experiments.runs import RunSpec, run_all
from vitlab.train.config import RunConfig
from vitlab.train.lock import LOCK, RunBusy, RunLock, claim

ROOT = Path(__file__).resolve().parents[1]
# a tiny sweep of 4 runs (2 depths x 2 training seeds), one thread per run: the same numbers wherever it runs
STUDY = ["sweep", "--model", "vit_mnist", "--param", "depth", "--values", "1,2", "--seeds", "2",
         "--set", "embed_dim=16", "--set", "num_heads=2", "--epochs", "1", "--batch-size", "16",
         "--limit-train", "64", "--limit-test", "32", "--threads", "1", "--device", "cpu", "--no-progress"]
SAME = ("depth", "seed", "test_acc", "params", "macs", "epochs")  # every column but the times


def table(out: Path) -> dict[str, dict[str, str]]:
    with open(out / "results.csv", newline="") as fh:
        return {r["run"]: {k: r[k] for k in SAME} for r in csv.DictReader(fh)}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, str]]:
    """The tiny study run one run after another in this process (``--workers 1``)."""
    out = tmp_path_factory.mktemp("inprocess")
    assert main([*STUDY, "--workers", "1", "--output", str(out)]) == 0
    rows = table(out)
    assert len(rows) == 4 and all(r["test_acc"] not in ("", "nan") for r in rows.values())
    return rows


@pytest.mark.full  # a study on two worker processes
def test_two_local_workers_give_the_same_table(reference, tmp_path: Path, capsys) -> None:
    assert main([*STUDY, "--workers", "2", "--output", str(tmp_path)]) == 0
    assert table(tmp_path) == reference
    capsys.readouterr()
    # finished runs are read back, never trained again, whichever executor trained them
    assert main([*STUDY, "--workers", "1", "--output", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert err.count("already finished, read back") == 4 and ": training" not in err
    assert table(tmp_path) == reference


# ---------------------------------------------------------------- a real Ray cluster on 127.0.0.1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory):
    """``ray start --head`` with 2 CPUs on 127.0.0.1 (its own process group, stopped at the end by that id)."""
    pytest.importorskip("ray")
    ray_bin = shutil.which("ray", path=str(Path(sys.executable).parent)) or shutil.which("ray")
    if ray_bin is None:
        pytest.skip("the ray command is not installed")
    port = free_port()
    temp = Path("/tmp") / f"vt-ray-{os.getpid()}"  # Ray's socket paths must stay short
    # a home of its own for the cluster and this driver: a ~/.ray/auth_token left by the user's own Ray (a local
    # ray.init writes one) would make the two disagree on authentication
    home = tmp_path_factory.mktemp("ray-home")
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "HOME": str(home)}
    proc = subprocess.Popen([ray_bin, "start", "--head", "--block", "--num-cpus", "2", "--num-gpus", "0",
                             "--node-ip-address", "127.0.0.1", "--port", str(port), "--include-dashboard", "false",
                             "--disable-usage-stats", "--temp-dir", str(temp)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True, env=env)
    address = f"127.0.0.1:{port}"
    patch = pytest.MonkeyPatch()
    patch.setenv("HOME", str(home))
    try:
        deadline = time.monotonic() + 90
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"ray start did not come up: {proc.stderr.read().decode()[-2000:]}")
            time.sleep(0.5)
        yield address
    finally:
        import ray

        ray.shutdown()
        patch.undo()
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        shutil.rmtree(temp, ignore_errors=True)


@pytest.mark.full  # a real Ray head on 127.0.0.1
@pytest.mark.xdist_group("ports")  # the head binds ports: never beside another test that does
def test_a_ray_cluster_gives_the_same_table(reference, ray_cluster: str, tmp_path: Path) -> None:
    assert main([*STUDY, "--executor", "ray", "--address", ray_cluster, "--output", str(tmp_path)]) == 0
    assert table(tmp_path) == reference


# ---------------------------------------------------------------- a worker that dies


def fake_trainer(cfg: RunConfig, init: str | None = None) -> dict:
    """A run that writes its record at once (accuracy from its training seed), as the trainer would."""
    out = Path(cfg.output)
    summary = finish(cfg, {"final_test_acc": 0.5 + cfg.seed / 100, "train_time_s": 1.0, "epochs": 1, "params": 10,
                           "macs": 20, "pid": os.getpid()})
    with open(out.parent / "calls.txt", "a") as fh:
        fh.write(f"{out.name}\n")
    return summary


def kill_once_trainer(cfg: RunConfig, init: str | None = None) -> dict:
    """``seed1`` kills its own worker process (SIGKILL, no clean-up) the first time it runs."""
    marker = Path(cfg.output).parent / "killed"
    if Path(cfg.output).name == "seed1" and not marker.exists():
        marker.write_text(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGKILL)
    return fake_trainer(cfg, init)


def kill_always_trainer(cfg: RunConfig, init: str | None = None) -> dict:
    if Path(cfg.output).name == "seed1":
        os.kill(os.getpid(), signal.SIGKILL)
    return fake_trainer(cfg, init)


def specs(n: int = 4) -> list[RunSpec]:
    return [RunSpec(f"seed{i}", RunConfig(seed=i, threads=1), {"seed": i}) for i in range(n)]


@pytest.mark.full  # worker processes killed and restarted
def test_a_killed_worker_costs_only_its_run(tmp_path: Path, capsys) -> None:
    pairs = run_all(specs(), tmp_path, trainer=kill_once_trainer, executor=ExecutorConfig(workers=2, retries=1))
    assert [s["final_test_acc"] for _, s in pairs] == [0.5, 0.51, 0.52, 0.53]
    assert (tmp_path / "killed").is_file()
    assert "seed1: worker process exited with code -9; trying again (1 of 1 retries)" in capsys.readouterr().err
    assert sorted((tmp_path / "calls.txt").read_text().split()) == ["seed0", "seed1", "seed2", "seed3"]
    assert os.getpid() not in {s["pid"] for _, s in pairs}  # trained in worker processes


@pytest.mark.full  # worker processes killed and restarted
def test_a_run_that_always_dies_is_reported_failed_and_retried_next_time(tmp_path: Path, capsys) -> None:
    from vitlab.experiments.sweep import parse_params, sweep_specs, write_sweep

    params = parse_params("vit_mnist", ["depth"], ["1"])
    study = [RunSpec(f"seed{i}", s.config.replace(threads=1), s.info)
             for i, s in enumerate(sweep_specs("vit_mnist", params, [0, 1, 2], RunConfig(epochs=1), {}))]
    pairs = run_all(study, tmp_path, trainer=kill_always_trainer, executor=ExecutorConfig(workers=2, retries=1))
    assert [bool(s.get("failed")) for _, s in pairs] == [False, True, False]
    assert pairs[1][1]["attempts"] == 2 and "exited with code -9" in pairs[1][1]["failed"]
    assert "seed1: failed after 2 attempt(s)" in capsys.readouterr().err
    assert not (tmp_path / "seed1" / "summary.json").exists()
    write_sweep(tmp_path, pairs, params, title="t", command="vitlab sweep", meta={"model": "vit_mnist"})
    with open(tmp_path / "results.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["failed"] for r in rows] == ["False", "True", "False"]  # in the table, not dropped
    assert rows[1]["test_acc"] == "nan"
    assert json.loads((tmp_path / "summary.json").read_text())["results"][0]["failed"] == 1
    # the next invocation trains only the failed run and ends with the table of an uninterrupted study
    again = run_all(study, tmp_path, trainer=fake_trainer, executor=ExecutorConfig(workers=1))
    assert [s["final_test_acc"] for _, s in again] == [0.5, 0.51, 0.52]
    assert (tmp_path / "calls.txt").read_text().split().count("seed0") == 1


def test_a_run_that_raises_is_retried_then_failed_but_a_config_error_stops_the_study(tmp_path: Path) -> None:
    calls = []

    def flaky(cfg: RunConfig, init: str | None = None) -> dict:
        calls.append(cfg.seed)
        if cfg.seed == 1:
            raise RuntimeError("out of memory")
        return fake_trainer(cfg, init)

    pairs = run_all(specs(3), tmp_path, trainer=flaky, executor=ExecutorConfig(workers=1, retries=2))
    assert calls.count(1) == 3 and pairs[1][1]["failed"] == "RuntimeError: out of memory"

    def bad(cfg: RunConfig, init: str | None = None) -> dict:
        raise ConfigError("--lr must be > 0")

    with pytest.raises(ConfigError, match="seed0: --lr must be > 0"):
        run_all(specs(2), tmp_path / "bad", trainer=bad, executor=ExecutorConfig(workers=1))


# ---------------------------------------------------------------- the run lock across processes


HOLD = r"""
import json, sys, time
from pathlib import Path
import vitlab
from vitlab.checkpoint import save_checkpoint
from vitlab.train.config import RunConfig
from vitlab.train.lock import RunLock
folder = Path(sys.argv[1])
lock = RunLock(folder).acquire()
print("held", flush=True)
time.sleep(float(sys.argv[2]))
cfg = RunConfig(seed=1, threads=1, output=str(folder))  # the record of a finished run, as the other process trains it
save_checkpoint(folder, vitlab.create_model("vit_mnist"), run_config=cfg.to_dict())
(folder / "summary.json").write_text(json.dumps({"final_test_acc": 0.99, "epochs": 1, "by": "other"}))
"""


@pytest.mark.full  # a second process holds the run
def test_a_run_another_process_holds_is_waited_for_not_trained_twice(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(executors, "BUSY_WAIT_S", 0.2)
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path / "seed1"), "2"], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunBusy, match=r"another vitlab train run \(process \d+\) on host"):
            RunLock(tmp_path / "seed1").acquire()
        assert claim(tmp_path / "seed1") is None
        pairs = run_all(specs(3), tmp_path, trainer=fake_trainer, executor=ExecutorConfig(workers=1))
    finally:
        holder.wait(30)
    assert pairs[1][1] == {"final_test_acc": 0.99, "epochs": 1, "by": "other"}
    assert sorted((tmp_path / "calls.txt").read_text().split()) == ["seed0", "seed2"]
    assert "seed1: another process is training this run; waiting" in capsys.readouterr().err
    assert (tmp_path / "seed1" / LOCK).read_text().split()[0] == str(holder.pid)  # the holder's pid and host


@pytest.mark.full  # two probe processes
def test_the_lock_is_shared_within_a_process(tmp_path: Path) -> None:
    """A worker's claim and the trainer's own lock of the same folder: one holder, released when both are."""
    outer = RunLock(tmp_path).acquire()
    inner = RunLock(tmp_path).acquire()
    assert outer.held and inner.held
    inner.release()
    probe = [sys.executable, "-c", "import sys; from vitlab.train.lock import claim; "
             "sys.exit(0 if claim(sys.argv[1]) is None else 1)", str(tmp_path)]
    assert subprocess.run(probe, timeout=60).returncode == 0  # still held by this process
    outer.release()
    assert subprocess.run(probe, timeout=60).returncode == 1  # free now


# ---------------------------------------------------------------- options and defaults


def test_default_workers_follow_the_cores_and_the_run_size() -> None:
    small = RunConfig(model="vit_mnist", device="cpu")
    assert default_workers([small], pending=8, cores=2) == 2
    assert default_workers([small], pending=1, cores=2) == 1
    assert default_workers([small], pending=8, cores=16) == 8
    assert default_workers([small.replace(threads=4)], pending=8, cores=16) == 4
    big = RunConfig(model="vit_base", device="cpu")
    assert default_workers([big], pending=8, cores=16) == 1
    assert default_workers([small.replace(device="cuda")], pending=8, cores=16) == 1
    assert threads_per_run(small, 2, cores=8) == 4 and threads_per_run(small, 1, cores=8) is None
    assert threads_per_run(small.replace(threads=1), 2, cores=8) == 1


@pytest.mark.parametrize("argv, message", [
    (["--executor", "local", "--address", "127.0.0.1:1"], "--address and --gpus-per-run belong to --executor ray"),
    (["--workers", "0"], "--workers must be >= 1"),
    (["--retries", "-1"], "--retries must be >= 0"),
    (["--executor", "ray", "--workers", "2"], "--workers is for --executor local"),
])
def test_bad_executor_options_are_one_line(argv, message, tmp_path: Path, capsys) -> None:
    assert main([*STUDY, *argv, "--output", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err


RAY_FREE = """
import contextlib, io, sys
from vitlab.cli import main
for argv in (["--help"], ["sweep", "--help"], ["depth-study", "--help"]):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
        main(argv)
import vitlab.experiments.executors, vitlab.experiments.runs
assert "ray" not in sys.modules, "ray imported"
"""


def test_ray_stays_out_of_the_base_install_and_the_help_path() -> None:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not any(d.split(">")[0].split("=")[0].strip() == "ray" for d in project["dependencies"])
    extras = project["optional-dependencies"]
    assert any(d.startswith("ray") for d in extras["ray"]) and any(d.startswith("ray") for d in extras["dev"])
    proc = subprocess.run([sys.executable, "-c", RAY_FREE], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_a_shared_search_storage_leaves_live_trials_of_other_workers_running(tmp_path: Path) -> None:
    """``--storage``: a worker joining the search fails only trials whose heartbeat stopped, never live ones."""
    optuna = pytest.importorskip("optuna")
    from optuna.trial import TrialState

    from vitlab.experiments.search import requeue_interrupted

    url = f"sqlite:///{tmp_path / 'shared.db'}"
    storage = optuna.storages.RDBStorage(url, heartbeat_interval=60, grace_period=180)
    study = optuna.create_study(storage=storage, study_name="s")
    live = study.ask({"lr": optuna.distributions.FloatDistribution(0.1, 1.0)})  # a heartbeat just now
    storage.record_heartbeat(live._trial_id)
    assert requeue_interrupted(study, shared=True) == []
    assert study.get_trials()[0].state == TrialState.RUNNING
    assert requeue_interrupted(study, shared=False) == [live.number]  # one process: whatever runs is stale
    assert study.get_trials()[0].state == TrialState.FAIL


@pytest.mark.full  # waits out Optuna's heartbeat (5 s)
def test_a_training_trial_beats_its_heartbeat_in_a_shared_storage(tmp_path: Path, monkeypatch) -> None:
    optuna = pytest.importorskip("optuna")
    from optuna.trial import TrialState

    from vitlab.experiments import search

    monkeypatch.setattr(search, "HEARTBEAT_S", 0.2)
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'shared.db'}", heartbeat_interval=1,
                                         grace_period=1)
    study = optuna.create_study(storage=storage, study_name="s")
    trial = study.ask()
    with search.heartbeat(study, trial):
        time.sleep(1.6)  # past the grace period: alive only through the beats
        assert search.requeue_interrupted(study, shared=True) == []
    assert study.get_trials()[0].state == TrialState.RUNNING
    time.sleep(3.0)  # no more beats (heartbeats are stored to the second): stale, failed and queued again
    assert search.requeue_interrupted(study, shared=True) == [trial.number]
    assert study.get_trials()[0].state == TrialState.FAIL


# in CI: 26 s on a quiet 2-core AMD EPYC (four interpreters start), within the suite's budget
@pytest.mark.full  # scripts/gpu_study.sh end to end (four interpreters)
def test_the_gpu_study_script_runs_end_to_end_in_its_smoke_mode(tmp_path: Path) -> None:
    """``scripts/gpu_study.sh --smoke``: the CUDA-path checks, train / eval / analyze and the depth study, on the
    CPU with tiny runs; the study's tables land in OUT."""
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path / "depth"), "LR_OUT": str(tmp_path / "lr"),
           "FASHION_OUT": str(tmp_path / "fashion"), "BUDGET_OUT": str(tmp_path / "budget")}
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_study.sh"), "--smoke"], capture_output=True,
                          text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "fused attention (SDPA) against the explicit maps" in proc.stdout and "bf16 autocast" in proc.stdout
    # the rate x depth study (scripts/depth_budget.sh, phases 1 and 2 at one block): five seeds per arm, seed 0
    # copied from the grid
    with open(tmp_path / "budget" / "depth_budget" / "results.csv", newline="") as fh:
        assert len(list(csv.DictReader(fh))) == 25
    assert (proc.stdout + proc.stderr).count("_seed0: reused from") == 5, proc.stderr[-3000:]
    with open(tmp_path / "depth" / "results.csv", newline="") as fh:
        assert len(list(csv.DictReader(fh))) == 4
    with open(tmp_path / "lr" / "sensitivity.csv", newline="") as fh:  # the learning-rate study, then the depth
        best = {(r["variant"], r["depth"]): float(r["best_lr"]) for r in csv.DictReader(fh)}  # study at its rates
    with open(tmp_path / "fashion" / "results.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 2 and all(json.loads(r["run_options"])["lr"] == best[("vit", r["depth"])] for r in rows)


@pytest.mark.full  # scripts/gpu_study.sh end to end
def test_the_gpu_study_script_with_studies_set_empty_runs_the_checks_alone(tmp_path: Path) -> None:
    """``STUDIES= scripts/gpu_study.sh``: the checks and one run, no study (an empty value is not "unset")."""
    env = {**os.environ, "PYTHON": sys.executable, "STUDIES": "", "OUT": str(tmp_path / "depth"),
           "LR_OUT": str(tmp_path / "lr"), "FASHION_OUT": str(tmp_path / "fashion")}
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_study.sh"), "--smoke"], capture_output=True,
                          text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "bf16 autocast" in proc.stdout and "== 2. train, eval and analyze" in proc.stdout
    assert "== 3" not in proc.stdout and not any((tmp_path / d).exists() for d in ("depth", "lr", "fashion"))


# ---------------------------------------------------------------- the study process stopped from outside


def _children(pid: int) -> set[int]:
    try:
        return {int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}
    except OSError:
        return set()


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads the process tree from Linux's /proc")
@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
@pytest.mark.full  # a 2-worker study killed from outside
def test_a_study_stopped_from_outside_leaves_no_worker_training(tmp_path: Path, how: signal.Signals) -> None:
    """SIGTERM to the study process stops its workers at a checkpoint (as Ctrl-C does); SIGKILL, which the study
    cannot see, still reaches them (Linux: each worker asks for SIGTERM when its parent dies). Either way no
    worker trains on unseen, and the next invocation resumes the interrupted runs."""
    long = [a if a != "1" or STUDY[i - 1] != "--epochs" else "40" for i, a in enumerate(STUDY)]
    long[long.index("64")] = "512"
    out = tmp_path / "study"
    proc = subprocess.Popen([sys.executable, "-m", "vitlab", *long, "--workers", "2", "--output", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=tmp_path,
                            env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    try:
        deadline = time.monotonic() + 120
        while len(list(out.glob("*/metrics.jsonl"))) < 2:  # both workers are past their first epoch
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "the workers did not start training"
            time.sleep(0.2)
        workers = _children(proc.pid)
        assert workers
        os.kill(proc.pid, how)
        proc.wait(60)
        deadline = time.monotonic() + 60
        while any(_alive(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(_alive(w) for w in workers), "a worker went on training after the study ended"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = proc.stderr.read().decode()
    if how == signal.SIGTERM:
        assert "interrupted" in err
    assert "Traceback" not in err  # each worker says where its checkpoint is, in a line, and ends quietly
    assert any((run / "state.pt").is_file() for run in out.iterdir() if run.is_dir())  # stopped at a checkpoint
