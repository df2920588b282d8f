"""The verdict's interval covers the true difference for a *new run*: studies simulated with a known training
(seed) variance and per-image test noise, 1,000 studies at 3 and at 5 seeds. The run-level tests (paired t over
per-seed differences, Welch over runs) cover it in at least 93 % of the studies; the old per-(seed, image) paired
bootstrap, which counts one image seen under three seeds as three samples, covers it far less often."""

from __future__ import annotations

import numpy as np
import pytest

from vitlab.experiments import stats

IMAGES = 1000
DELTA = 0.01  # arm a is one point better than arm b for a new run


def _study(rng: np.random.Generator, seeds: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One simulated study: per seed, a run of each arm whose true accuracy is the arm's mean plus seed noise
    (a part shared by the two arms of one seed, as one initialisation and data order give, and a part of its own),
    scored on one fixed test set of 1,000 images (one uniform draw per image, shared by every run: hard images are
    hard for both arms). Returns per-run accuracies of a and b and their (seed, image) correctness."""
    shared = rng.normal(0.0, 0.006, seeds)
    p_a = 0.90 + DELTA + shared + rng.normal(0.0, 0.008, seeds)
    p_b = 0.90 + shared + rng.normal(0.0, 0.008, seeds)
    u = rng.random(IMAGES)
    noise = rng.normal(0.0, 0.05, (2, seeds, IMAGES))  # each run also errs on images of its own
    correct_a = (u + noise[0]) < p_a[:, None]
    correct_b = (u + noise[1]) < p_b[:, None]
    return correct_a.mean(axis=1), correct_b.mean(axis=1), correct_a.ravel(), correct_b.ravel()


def _coverage(method: str, seeds: int, studies: int) -> float:
    rng = np.random.default_rng(1000 + seeds)
    hits = 0
    for _ in range(studies):
        acc_a, acc_b, ca, cb = _study(rng, seeds)
        if method == "paired t":
            c = stats.paired_t(acc_a, acc_b)
        elif method == "welch":
            c = stats.welch(acc_a, acc_b)
        else:  # the old verdict: bootstrap over (seed, image) pairs
            c = stats.paired(ca, cb, n_resamples=199, method="percentile")
        hits += c.ci_low <= DELTA <= c.ci_high
    return hits / studies


@pytest.mark.parametrize("seeds", [3, 5])
@pytest.mark.parametrize("method", ["paired t", "welch"])
def test_the_run_level_interval_covers_the_true_difference(method: str, seeds: int) -> None:
    assert _coverage(method, seeds, 1000) >= 0.93


@pytest.mark.parametrize("seeds", [3, 5])
def test_the_per_image_interval_does_not(seeds: int) -> None:
    """The same simulated studies (300 of them: the bootstrap is slower) with the per-(seed, image) bootstrap."""
    assert _coverage("per image", seeds, 300) < 0.80
