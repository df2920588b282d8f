"""Where a study's runs train: in this process, in N worker processes on this machine, or as Ray tasks on a cluster.

Every executor calls the same function per run, :func:`train_task` (read the run back when it finished, else claim
its folder's lock, train it with :func:`vitlab.experiments.runs.train_run`, return its summary), and the study
folder is the only state: a run whose record verifies (:func:`vitlab.experiments.record.finished_run`, the one
decision of "finished") is read back whichever executor trained it, a study
killed at any point and started again (with the same or another executor) trains only what had not finished, and
a run folder whose lock another live process holds (:mod:`vitlab.train.lock`, also across hosts sharing the
folder) is waited for, never trained twice.

A worker that dies (a killed process, a lost Ray node) or a run that raises costs only that run: it is tried again
up to ``retries`` times when another attempt can end otherwise (:func:`can_retry`: a killed worker, not a damaged
file or a full disk), then reported as failed (a ``failed`` summary, no ``summary.json``, so the next invocation
tries it again; its traceback in the run's ``error.log``, never on the terminal); a
:class:`~vitlab.errors.ConfigError` or Ctrl-C stops the study. A Ray cluster that does not answer is refused
within :data:`RAY_CONNECT_TIMEOUT_S`.

One file (about 500 lines) because the three executors share one contract, the task and the retry loop, and are
read side by side.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import sys
import time
import traceback
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vitlab.errors import ConfigError

EXECUTORS = ("local", "ray")
RAY_INSTALL = "--executor ray needs Ray, which is not installed; run pip install 'vitlab[ray]'"
BUSY_WAIT_S = 5.0  # how often a run folder held by another process is looked at again


@dataclass
class ExecutorConfig:
    """How a study runs its training runs (the study options ``--executor``, ``--workers``, ...)."""

    kind: str = "local"  # local | ray
    workers: int | None = None  # local: runs at once (1: in this process); None: from the cores and the run size
    address: str | None = None  # ray: the cluster (None: RAY_ADDRESS, else a Ray instance on this machine)
    gpus_per_run: float = 0.0  # ray: the share of a GPU each run asks for (0.25: four runs per card)
    retries: int = 1  # further attempts of a run whose worker died or that raised, before it is reported failed

    def validate(self) -> None:
        if self.kind not in EXECUTORS:
            raise ConfigError(f"--executor {self.kind!r} is not one of {', '.join(EXECUTORS)}")
        if self.workers is not None and self.workers < 1:
            raise ConfigError(f"--workers must be >= 1, got {self.workers}")
        if self.retries < 0:
            raise ConfigError(f"--retries must be >= 0, got {self.retries}")
        if not 0 <= self.gpus_per_run <= 64:
            raise ConfigError(f"--gpus-per-run must be in [0, 64], got {self.gpus_per_run}")
        if self.kind == "local" and (self.address or self.gpus_per_run):
            raise ConfigError("--address and --gpus-per-run belong to --executor ray; on this machine pass "
                              "--workers N (with --device cuda the workers share the GPU)")
        if self.kind == "ray" and self.workers is not None:
            raise ConfigError("--workers is for --executor local; Ray runs as many runs at once as the cluster's "
                              "CPUs (and --gpus-per-run) allow")


@dataclass
class RunTask:
    """One run handed to a worker: its folder, its run config, the weights it starts from, and the trainer
    (:func:`vitlab.experiments.runs.train_run` as :func:`~vitlab.experiments.runs.run_all` hands it; another must be
    importable by the workers)."""

    name: str
    config: Any  # RunConfig
    run_dir: str
    trainer: Callable[..., dict]
    init: str | None = None


def train_task(task: RunTask) -> dict[str, Any]:
    """Train one run, or read it back: the function every executor calls. Returns ``{"status": "done", "summary",
    "ran"}``, ``{"status": "busy"}`` when another live process holds the run's folder, or ``{"status": "error",
    "error", "config", "retry", "log"}`` when the run raised: ``error`` one line, ``config`` a ConfigError (which
    stops the study), ``retry`` whether another attempt can help (:func:`can_retry`), ``log`` the file holding the
    traceback (the run's ``error.log``; None when it could not be written). Nothing escapes it but Ctrl-C."""
    from vitlab.experiments.record import finished_run
    from vitlab.train.lock import claim

    run_dir = Path(task.run_dir)
    lock = None
    try:
        done = finished_run(run_dir, task.config)
        if done is not None:
            return {"status": "done", "summary": done, "ran": False}
        lock = claim(run_dir)
        if lock is None:
            return {"status": "busy"}
        done = finished_run(run_dir, task.config)  # finished by another process between the look and the claim
        if done is not None:
            return {"status": "done", "summary": done, "ran": False}
        summary = task.trainer(task.config.replace(output=str(run_dir)), init=task.init)
        if not isinstance(summary, dict):
            raise ConfigError(f"the trainer returned {type(summary).__name__} for {run_dir}, not a summary dict")
        with contextlib.suppress(OSError):
            (run_dir / ERROR_LOG).unlink(missing_ok=True)  # of an earlier attempt
        return {"status": "done", "summary": summary, "ran": True}
    except ConfigError as exc:
        return {"status": "error", "error": str(exc), "config": True}
    except Exception as exc:  # noqa: BLE001 - the run failed; the study goes on and reports it
        return {"status": "error", "error": one_line(exc), "config": False, "retry": can_retry(exc),
                "log": _write_log(run_dir, task.name, traceback.format_exc())}
    finally:
        if lock is not None:
            lock.release()


ERROR_LOG = "error.log"  # in a run folder: the traceback of the run's last failed attempt
# errors of the file system that another attempt meets again: a full disk or quota, a read-only or refused path, a
# name that exists, is no folder, is too long, or is missing
PERMANENT_ERRNO = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EEXIST,
                             errno.ENOTDIR, errno.EISDIR, errno.ENAMETOOLONG, errno.ENOENT, errno.EFBIG, errno.ELOOP})


def can_retry(exc: BaseException) -> bool:
    """Whether another attempt of a run that raised ``exc`` can end otherwise: not for vitlab's own errors (a
    damaged checkpoint, data that cannot be read, a write to a full disk: each names its fix) nor for a file system
    that refuses (:data:`PERMANENT_ERRNO`); yes for the rest (out of memory on a shared GPU, a lost connection). A
    worker that died is always tried again."""
    from vitlab.errors import VitlabError

    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:  # a WriteError or RuntimeError wrapping a full disk
        seen.add(id(exc))
        if isinstance(exc, VitlabError) or (isinstance(exc, OSError) and exc.errno in PERMANENT_ERRNO):
            return False
        exc = exc.__cause__ or exc.__context__
    return True


def one_line(exc: BaseException) -> str:
    """The error of a failed run in one line: vitlab's own message as it is, else the type and the first line."""
    from vitlab.errors import VitlabError

    text = " ".join(str(exc).split())
    if isinstance(exc, VitlabError) and text:
        return text
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _write_log(run_dir: Path, name: str, text: str) -> str | None:
    """Write a failed attempt's traceback to the run's :data:`ERROR_LOG`; its path, or None when it cannot be
    written (no run folder, a full disk)."""
    from vitlab.atomic import atomic_write_text

    path = run_dir / ERROR_LOG
    try:
        if run_dir.is_symlink() or not run_dir.is_dir():
            return None
        atomic_write_text(path, f"vitlab: run {name} failed at {time.strftime('%Y-%m-%d %H:%M:%S')}\n{text}")
    except (OSError, ValueError):
        return None
    return str(path)


def default_workers(configs: Sequence[Any], pending: int, cores: int | None = None) -> int:
    """``--workers`` when not given: on the CPU, one worker per core for small models (below
    :data:`vitlab.perf.SMALL_MODEL_MACS` multiply-accumulates per image, which gain little from intra-op
    threads), else one run at a time on all cores; on a GPU one run at a time (pass ``--workers`` to share the
    card). Never more than the runs left to train."""
    if pending <= 1 or not configs:
        return 1
    cfg = configs[0]
    if str(cfg.device).startswith("cuda") or (cfg.device == "auto" and _cuda()):
        return 1
    if cfg.threads:
        cores = cores or _cores()
        return max(1, min(pending, cores // cfg.threads))
    if _macs(cfg) >= _small():
        return 1
    return max(1, min(pending, cores or _cores()))


def _cores() -> int:
    from vitlab.perf import cpu_cores

    return cpu_cores()


def _small() -> int:
    from vitlab.perf import SMALL_MODEL_MACS

    return SMALL_MODEL_MACS


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _macs(cfg: Any) -> int:
    """Multiply-accumulates per image of the run's model (0 when it cannot be built on the meta device)."""
    if cfg.model.startswith("timm:"):
        return _small()  # timm models are counted as big: one run at a time unless --workers says otherwise
    try:
        from vitlab.flops import model_cost

        return model_cost(cfg.model, dict(cfg.model_overrides or {}))[1]
    except Exception:  # noqa: BLE001 - an unknown size is treated as small
        return 0


def threads_per_run(cfg: Any, workers: int, cores: int | None = None) -> int | None:
    """The torch threads of each run: ``--threads`` when given, else the cores shared among the workers (None with
    one worker: the trainer's own rule, :func:`vitlab.perf.plan_training`)."""
    if cfg.threads or workers <= 1:
        return cfg.threads
    return max(1, (cores or _cores()) // workers)


# ---------------------------------------------------------------- executors: submit a task, wait for outcomes


class InProcess:
    """Runs each task in this process, one after another (``--workers 1``: as a study always ran)."""

    slots = 1

    def __init__(self) -> None:
        self._queue: deque[RunTask] = deque()

    def submit(self, task: RunTask) -> None:
        self._queue.append(task)

    def wait(self) -> list[tuple[RunTask, dict]]:
        task = self._queue.popleft()
        return [(task, train_task(task))]

    def close(self) -> None:
        pass


def _worker_main(conn: Any) -> None:
    """A local worker process: train each task it receives and send back the outcome, until it gets None. On Linux
    it asks the kernel for SIGTERM when the study process ends (killed with no chance to stop its workers), so it
    stops at a checkpoint the next invocation resumes instead of training on unseen. A run stopped that way (the
    trainer has already said where its checkpoint is) ends the worker quietly, with no traceback."""
    _term_with_parent()
    while True:
        try:
            task = conn.recv()
        except EOFError:
            return
        if task is None:
            return
        try:
            outcome = train_task(task)
        except KeyboardInterrupt:  # SIGTERM or Ctrl-C: stopped at a checkpoint; the study says it was interrupted
            raise SystemExit(1) from None
        conn.send(outcome)


def _term_with_parent() -> None:
    """``prctl(PR_SET_PDEATHSIG, SIGTERM)`` where the C library has it (Linux); elsewhere nothing."""
    import ctypes
    import signal

    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the study ended before the request was in place
        os.kill(os.getpid(), signal.SIGTERM)


@contextlib.contextmanager
def _sigterm_stops_the_study() -> Any:
    """SIGTERM to the study process ends it as Ctrl-C does (KeyboardInterrupt, then :meth:`LocalWorkers.close`
    stops each busy worker at a checkpoint), instead of killing it and leaving its workers training unseen. Only in
    the main thread, where Python can handle signals; a trainer running in this process installs its own."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class LocalWorkers:
    """``slots`` worker processes (started with ``spawn``: a fresh interpreter, no forked torch state), each
    training one task at a time; a worker that dies is replaced and its task reported as ``died``."""

    def __init__(self, slots: int) -> None:
        import multiprocessing

        self.slots = slots
        self._ctx = multiprocessing.get_context("spawn")
        self._idle: list[tuple[Any, Any]] = []
        self._busy: dict[Any, tuple[Any, RunTask]] = {}  # connection -> (process, task)

    def _start(self) -> tuple[Any, Any]:
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(target=_worker_main, args=(child,), name="vitlab-study-worker")
        proc.start()
        child.close()
        return proc, parent

    def submit(self, task: RunTask) -> None:
        proc, conn = self._idle.pop() if self._idle else self._start()
        conn.send(task)
        self._busy[conn] = (proc, task)

    def wait(self) -> list[tuple[RunTask, dict]]:
        from multiprocessing.connection import wait

        ready = wait([*self._busy, *(p.sentinel for p, _ in self._busy.values())])
        out = []
        for conn, (proc, task) in list(self._busy.items()):
            if conn not in ready and proc.sentinel not in ready:
                continue
            try:
                result = conn.recv() if conn.poll() else None
            except (EOFError, OSError):
                result = None
            del self._busy[conn]
            if result is None:  # the process ended without an answer: killed, or crashed in native code
                proc.join(5)
                conn.close()
                out.append((task, {"status": "died", "error": f"worker process exited with code {proc.exitcode}"}))
            else:
                self._idle.append((proc, conn))
                out.append((task, result))
        return out

    def close(self) -> None:
        procs = [p for p, _ in self._idle] + [p for p, _ in self._busy.values()]
        for _, conn in self._idle:
            try:
                conn.send(None)
            except OSError:
                pass
        for p in procs:
            if p in [q for q, _ in self._busy.values()]:
                p.terminate()  # SIGTERM: the trainer stops at a checkpoint the next invocation resumes
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
                p.join()
        self._idle, self._busy = [], {}


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigError(RAY_INSTALL) from None
    return ray


RAY_CONNECT_TIMEOUT_S = 10.0  # how long a Ray cluster's address may take to accept a connection
# Ray's own attempts to join a cluster, bounded while vitlab imports Ray and connects (a value the user set wins):
# one attempt at the cluster's GCS instead of 20 (ray._private.node reads RAY_gcs_server_port_wait_time_s as their
# number) of at most 10 s instead of 30 (RayConfig's py_gcs_connect_timeout_s, read when Ray is imported): a port
# that accepts connections but is no Ray cluster is refused after about 20 s instead of about 14 minutes
RAY_BOUNDS = {"RAY_gcs_server_port_wait_time_s": "1", "RAY_py_gcs_connect_timeout_s": "10"}


def ray_address(address: str | None) -> str | None:
    """The cluster a Ray study joins: ``address``, else ``RAY_ADDRESS``; None (or ``auto``/``local``) when Ray
    finds or starts one itself."""
    address = address or os.environ.get("RAY_ADDRESS") or None
    return None if address in (None, "auto", "local") else address


def check_ray_address(address: str, timeout: float = RAY_CONNECT_TIMEOUT_S) -> None:
    """Refuse, in one line and within ``timeout`` seconds, a cluster address (``HOST:PORT`` or
    ``ray://HOST:PORT``) where nothing accepts a connection; Ray itself would retry for minutes."""
    hostport = address.split("://", 1)[-1].rstrip("/")
    host, _, port = hostport.rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit():
        raise ConfigError(f"--address {address} is not HOST:PORT (e.g. 10.0.0.5:6379, the address `ray start "
                          "--head` prints); fix --address or RAY_ADDRESS")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return
    except OSError as exc:
        why = "no answer" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc) or type(exc).__name__)
    raise ConfigError(f"--address {address}: no Ray cluster answers there within {timeout:g} s ({why}); start one "
                      f"there with `ray start --head --port {port}`, or fix --address (or RAY_ADDRESS)")


class RayTasks:
    """Each task a Ray task (``num_cpus``: the run's threads, ``num_gpus``: ``--gpus-per-run``) on the cluster at
    ``address`` (None: ``RAY_ADDRESS``, else a Ray instance started on this machine); Ray's own retries are off,
    the study counts attempts itself, so a lost node or a killed worker reads as ``died``. A cluster address is
    checked first (:func:`check_ray_address`, at most :data:`RAY_CONNECT_TIMEOUT_S`), and Ray's own connection
    attempts are bounded (:data:`RAY_BOUNDS`) when vitlab is the one to import Ray."""

    def __init__(self, address: str | None, cpus: int, gpus: float) -> None:
        import importlib.util

        if "ray" not in sys.modules and importlib.util.find_spec("ray") is None:
            raise ConfigError(RAY_INSTALL)
        target = ray_address(address)
        added: dict[str, str] = {}
        if target is not None:
            check_ray_address(target)
            if "ray" not in sys.modules:  # read when Ray is imported and while it connects; taken back after
                added = {k: v for k, v in RAY_BOUNDS.items() if k not in os.environ}
        os.environ.update(added)
        try:
            ray = import_ray()
            self.ray = ray
            if not ray.is_initialized():
                ray.init(address=address, include_dashboard=False, log_to_driver=True, configure_logging=False)
        except ConfigError:
            raise
        except Exception as exc:  # noqa: BLE001 - ConnectionError, a refused or malformed address: one line
            text = " ".join(str(exc).split())[:300] or type(exc).__name__
            raise ConfigError(f"--address {target or 'auto'}: Ray could not join a cluster there ({text}); start one "
                              "with `ray start --head` or fix --address (or RAY_ADDRESS)") from None
        finally:
            for key in added:
                os.environ.pop(key, None)
        self._remote = ray.remote(num_cpus=cpus, num_gpus=gpus, max_retries=0)(train_task)
        self._refs: dict[Any, RunTask] = {}
        total = ray.cluster_resources()
        self.slots = max(1, int(total.get("CPU", 1) // max(cpus, 1)))
        if gpus:
            self.slots = max(1, min(self.slots, int(total.get("GPU", 0) / gpus) or 1))

    def submit(self, task: RunTask) -> None:
        self._refs[self._remote.remote(task)] = task

    def wait(self) -> list[tuple[RunTask, dict]]:
        done, _ = self.ray.wait(list(self._refs), num_returns=1)
        out = []
        for ref in done:
            task = self._refs.pop(ref)
            try:
                out.append((task, self.ray.get(ref)))
            except self.ray.exceptions.RayError as exc:  # worker crashed, node died, task lost
                out.append((task, {"status": "died", "error": f"{type(exc).__name__}: {str(exc).splitlines()[0]}"}))
        return out

    def close(self) -> None:
        for ref in self._refs:
            self.ray.cancel(ref, force=True)
        self._refs = {}


def open_executor(config: ExecutorConfig, configs: Sequence[Any], pending: int) -> tuple[Any, int | None]:
    """The executor for ``pending`` runs of these run configs, and the threads each run gets."""
    config.validate()
    first = configs[0] if configs else None
    if config.kind == "ray":
        threads = (first.threads if first is not None else None) or 1
        return RayTasks(config.address, threads, config.gpus_per_run), threads
    workers = config.workers or default_workers(configs, pending)
    threads = threads_per_run(first, workers) if first is not None else None
    if workers <= 1:
        return InProcess(), threads
    return LocalWorkers(min(workers, max(pending, 1))), threads


def run_tasks(tasks: Sequence[RunTask], executor: Any, *, retries: int = 1,
              on_start: Callable[[RunTask], None] | None = None,
              on_end: Callable[[RunTask, dict, bool], None] | None = None,
              more: Callable[[RunTask, dict], Sequence[RunTask]] | None = None) -> dict[str, dict]:
    """Train every task on ``executor`` and return ``{name: summary}``; a task whose worker died or that raised is
    tried again up to ``retries`` times, then its summary is ``{"failed": why, "attempts": n}``. A run folder
    another process holds is looked at again every few seconds until that process ends it. ``more(task, summary)``,
    called as each task ends (finished or failed), returns tasks to add: they go to the front of the queue, so a
    slot that frees up takes them next (``--bracket``'s extension of a cell whose curve is complete)."""
    queue: deque[tuple[float, RunTask]] = deque((0.0, t) for t in tasks)
    with _sigterm_stops_the_study():
        return _run_queue(queue, executor, retries, on_start, on_end, more)


def _run_queue(queue: deque, executor: Any, retries: int, on_start: Callable[[RunTask], None] | None,
               on_end: Callable[[RunTask, dict, bool], None] | None,
               more: Callable[[RunTask, dict], Sequence[RunTask]] | None = None) -> dict[str, dict]:
    """:func:`run_tasks`' loop: submit while slots are free, collect outcomes, retry, report, add ``more``."""

    def ended(task: RunTask, summary: dict, ran: bool) -> None:
        results[task.name] = summary
        if on_end is not None:
            on_end(task, summary, ran)
        if more is not None:
            queue.extendleft((0.0, t) for t in reversed(list(more(task, summary))))

    attempts: dict[str, int] = {}
    waiting_said: set[str] = set()
    results: dict[str, dict] = {}
    running = 0
    try:
        while queue or running:
            now = time.monotonic()
            for _ in range(len(queue)):
                if running >= executor.slots:
                    break
                at, task = queue.popleft()
                if at > now:
                    queue.append((at, task))
                    continue
                if on_start is not None and task.name not in waiting_said:
                    on_start(task)
                executor.submit(task)
                running += 1
            if not running:
                time.sleep(min(BUSY_WAIT_S, max(0.05, min(at for at, _ in queue) - time.monotonic())))
                continue
            for task, out in executor.wait():
                running -= 1
                status = out["status"]
                if status == "done":
                    ended(task, out["summary"], out["ran"])
                    continue
                if status == "busy":
                    if task.name not in waiting_said:
                        waiting_said.add(task.name)
                        print(f"{task.name}: another process is training this run; waiting for it to finish",
                              file=sys.stderr, flush=True)
                    queue.append((time.monotonic() + BUSY_WAIT_S, task))
                    continue
                if status == "error" and out.get("config"):
                    raise ConfigError(f"{task.name}: {out['error']}")
                attempts[task.name] = attempts.get(task.name, 0) + 1
                why, retry = out["error"], out.get("retry", True)  # a worker that died: retry
                if retry and attempts[task.name] <= retries:
                    print(f"{task.name}: {why}; trying again ({attempts[task.name]} of {retries} retries)",
                          file=sys.stderr, flush=True)
                    queue.append((0.0, task))
                else:
                    ended(task, {"failed": why, "attempts": attempts[task.name], "retry": retry,
                                 "log": out.get("log")}, True)
    finally:
        executor.close()
    return results
