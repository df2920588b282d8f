"""Counter-based seeding: every random draw of a step comes from a seed derived from (seed, epoch, step).

Reseeding before each step makes a run reproducible on CPU and lets ``--resume`` continue from any step
without restoring RNG streams.
"""

from __future__ import annotations

import random

import numpy as np
import torch

_MASK = (1 << 64) - 1


def _mix(z: int) -> int:
    """SplitMix64 finaliser on Python ints (the same on every machine)."""
    z = (z + 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def derive_seed(*parts: int) -> int:
    """A 63-bit seed that depends on every part, e.g. ``derive_seed(seed, epoch, step, rank)``."""
    z = 0
    for p in parts:
        z = _mix(z ^ (int(p) & _MASK))
    return z >> 1


def generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g


def seed_everything(seed: int) -> None:
    """Seed torch (all devices), numpy and Python's ``random`` (timm's Mixup and RandomErasing use the latter two)."""
    torch.manual_seed(seed)
    np.random.seed(seed % (1 << 32))
    random.seed(seed)
