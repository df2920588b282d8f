"""Shared fixtures: every test starts from the same seed on one thread (the CI machine has 2 cores); one tiny
run folder (``trained``) is trained once per session for the tests that read it.

Plain helpers shared by several files (the tiny training run, ``one_line``, ``read_rows``, ``perturb``) are in
``_helpers.py``; ``_scripts.py`` loads the scripts of ``scripts/`` and ``benchmarks/``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

# every process pytest runs in (each xdist worker of `make test`) computes on one thread from the start: the module-
# and session-scoped fixtures that train run before the first test's fixture below sets it
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed_and_threads() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)


@pytest.fixture
def sdpa_calls(monkeypatch: pytest.MonkeyPatch) -> list:
    """Every call of ``F.scaled_dot_product_attention`` (the fused kernel) is appended to the list."""
    import torch.nn.functional as F

    calls: list = []
    real = F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        calls.append(args[0].shape)
        return real(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    return calls



@pytest.fixture(autouse=True)
def _studies_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """A study without ``--workers`` trains in this process, as on a one-core machine, so that the many tests that
    patch the trainer see their patch; tests of the executors name ``--workers`` (tests/test_executors.py)."""
    from vitlab.experiments import executors

    monkeypatch.setattr(executors, "_cores", lambda: 1)


@pytest.fixture(scope="session")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished one-epoch tiny run folder (vit_mnist, 1 block of 16 dims and 2 heads; 64 train / 32 test images in
    batches of 16 on the CPU), trained once per session (per xdist worker) for the tests that read a run folder
    (tests/test_reliability*.py); a test that changes the folder works on a copy (``shutil.copytree``)."""
    from _helpers import run_args
    from vitlab.cli import main

    out = tmp_path_factory.mktemp("trained") / "run"
    args = run_args(model="vit_mnist", depth=1, embed_dim=16, num_heads=2, limit_train=64, limit_test=32,
                    batch_size=16, device="cpu", threads=1, progress=False)
    assert main(["train", *args, "--epochs", "1", "--output", str(out)]) == 0
    return out
