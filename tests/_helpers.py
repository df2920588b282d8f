"""Helpers shared by the test files (imported as ``from _helpers import ...``; pytest puts ``tests/`` on the path).

The tiny training run lives here once: :func:`run_args` spells it for the command line, :func:`run_config` as
``RunConfig`` keywords, both from the same sizes, so a test file states only where its run differs.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

# a vit_mnist small enough that a few epochs take seconds on one core of a loaded 2-core machine
TINY_MODEL = {"depth": 2, "embed_dim": 32, "num_heads": 4}
TINY_DATA = {"limit_train": 256, "limit_test": 128, "batch_size": 64}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def run_args(*, model: str | None = None, depth: int = TINY_MODEL["depth"], embed_dim: int = TINY_MODEL["embed_dim"],
             num_heads: int = TINY_MODEL["num_heads"], **options: Any) -> list[str]:
    """``vitlab train`` arguments of a tiny run: ``--model`` (default vit_mnist, not the command's default model on
    digits) and the architecture flags first, then the data sizes of :data:`TINY_DATA` unless overridden, then
    ``options`` in order (``x=True`` is ``--x``, ``x=False`` is ``--no-x``, anything else ``--x value``; underscores
    become dashes)."""
    args = ["--model", model or "vit_mnist"]  # the plain ViT: the tiny runs' sizes are vit_mnist's overrides
    args += ["--depth", str(depth), "--embed-dim", str(embed_dim), "--num-heads", str(num_heads)]
    return args + option_args(**{**TINY_DATA, **options})


def option_args(**options: Any) -> list[str]:
    """Command-line flags for ``options`` as :func:`run_args` spells them (for runs that set the model elsewhere)."""
    args: list[str] = []
    for name, value in options.items():
        if value is True:
            args.append(_flag(name))
        elif value is False:
            args.append("--no-" + name.replace("_", "-"))
        else:
            args += [_flag(name), str(value)]
    return args


def run_config(*, depth: int = TINY_MODEL["depth"], embed_dim: int = TINY_MODEL["embed_dim"],
               num_heads: int = TINY_MODEL["num_heads"], **options: Any) -> dict[str, Any]:
    """``RunConfig`` keywords of the same tiny run as :func:`run_args` (progress bar off)."""
    return {**TINY_DATA, "progress": False, **options,
            "model_overrides": {"depth": depth, "embed_dim": embed_dim, "num_heads": num_heads}}


def one_line(exc: pytest.ExceptionInfo) -> str:
    """The message of a raised error, checked to be one non-empty line (what the CLI prints)."""
    msg = str(exc.value)
    assert msg and "\n" not in msg
    return msg


def read_rows(path: Path) -> list[dict[str, str]]:
    """The rows of a CSV file as dicts keyed by its header."""
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def perturb(model: nn.Module, scale: float = 0.2) -> nn.Module:
    """Move every parameter away from its initial value (zero or symmetric initialisations would hide a wrong
    mapping); draws from the global generator, which every test starts at the same state."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * scale)
    return model


def cli_error(capsys: pytest.CaptureFixture, argv: list[str]) -> str:
    """Run the CLI in process; assert exit 2, exactly one stderr line, no traceback; return the message after the
    ``vitlab CMD: error:`` prefix."""
    from vitlab.cli import main

    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and err.endswith("\n") and "Traceback" not in err, err
    prefix = f"vitlab {argv[0]}: error: "
    assert err.startswith(prefix), err
    return err[len(prefix):-1]
