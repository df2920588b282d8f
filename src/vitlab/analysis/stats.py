"""Comparisons of two arms of a study, and the one rule that turns them into a verdict.

Everything here is :mod:`scipy.stats`; nothing is re-derived by hand that scipy computes:

- :func:`welch`: arms trained with different seeds (or with no per-image record): Welch's t over the runs'
  accuracies, ``scipy.stats.ttest_ind(equal_var=False)`` and its ``confidence_interval``;
- :func:`paired`: arms that share seeds and test images, on the stored per-image correctness
  (``test_predictions.json`` of each run): the interval of the difference in accuracy from a paired bootstrap over
  images (``scipy.stats.bootstrap(paired=True)``), the p-value from McNemar's exact test, the binomial test of the
  discordant pairs (``scipy.stats.binomtest``);
- :func:`tost`: "as good as" claims, two one-sided Welch tests against a margin stated beforehand;
- :func:`mde_welch` / :func:`mde_paired`: the smallest true difference the design detects with 80 % power.

A per-image paired test measures the noise of the test sample at the seeds trained, not the seed-to-seed noise of
training: it decides "on these images, with these runs", and Welch over seeds decides "for a new run".
Effects are in the unit of the inputs (the verdict table uses accuracy points); ``effect = mean(a) - mean(b)``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import optimize
from scipy import stats as st

REPRODUCED, CONTRADICTED, UNDECIDED = "reproduced", "contradicted", "undecided"


@dataclass(frozen=True)
class Comparison:
    """The difference ``a - b`` with its ``confidence`` interval, p-value, the test that gave them and the sample
    sizes (runs per arm for Welch, paired units for the paired tests)."""

    effect: float
    ci_low: float
    ci_high: float
    p: float
    test: str
    n_a: int
    n_b: int
    confidence: float = 0.95


def _array(x: Sequence[float]) -> np.ndarray:
    a = np.asarray(x, dtype=float).ravel()
    if a.size < 2:
        raise ValueError(f"an arm needs at least 2 values to compare, got {a.size}")
    return a


def welch(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> Comparison:
    """Welch's t-test of ``mean(a) - mean(b)`` (two-sided) and its confidence interval. When both arms have no
    spread at all the t statistic is undefined: the interval is the point itself when the means are equal and the
    whole line otherwise (nothing can be said from two constant arms), p is NaN."""
    x, y = _array(a), _array(b)
    effect = float(x.mean() - y.mean())
    if x.var() == 0 and y.var() == 0:
        lo, hi = (effect, effect) if effect == 0 else (-math.inf, math.inf)
        return Comparison(effect, lo, hi, math.nan, "welch", x.size, y.size, confidence)
    res = st.ttest_ind(x, y, equal_var=False)
    ci = res.confidence_interval(confidence)
    return Comparison(effect, float(ci.low), float(ci.high), float(res.pvalue), "welch", x.size, y.size, confidence)


def one_sample(a: Sequence[float], value: float, confidence: float = 0.95) -> Comparison:
    """``mean(a) - value`` by the one-sample t-test (``scipy.stats.ttest_1samp``), for a claim about a threshold."""
    x = _array(a)
    res = st.ttest_1samp(x, value)
    ci = res.confidence_interval(confidence)
    return Comparison(float(x.mean() - value), float(ci.low - value), float(ci.high - value), float(res.pvalue),
                      "one-sample t", x.size, 0, confidence)


def mcnemar(correct_a: Sequence[bool], correct_b: Sequence[bool]) -> float:
    """McNemar's exact p-value (two-sided): the binomial test of the pairs only one arm got right."""
    x, y = np.asarray(correct_a, dtype=bool), np.asarray(correct_b, dtype=bool)
    if x.shape != y.shape:
        raise ValueError(f"paired arms need the same images: {x.shape} against {y.shape}")
    only_a, only_b = int((x & ~y).sum()), int((~x & y).sum())
    if only_a + only_b == 0:
        return 1.0
    return float(st.binomtest(only_a, only_a + only_b, 0.5).pvalue)


def paired(correct_a: Sequence[bool], correct_b: Sequence[bool], confidence: float = 0.95,
           n_resamples: int = 9999, random_state: int = 0, method: str = "BCa") -> Comparison:
    """The difference in accuracy of two arms on the same images (``correct_*``: one bool per image, or per
    (run, image) pair when the arms share several seeds, in the same order): a paired bootstrap interval over the
    pairs (``method``: scipy's BCa by default; "percentile" skips BCa's jackknife, whose time grows with the square
    of the number of pairs) and McNemar's p-value. Memory stays about 100 MB whatever the number of pairs."""
    x, y = np.asarray(correct_a, dtype=float).ravel(), np.asarray(correct_b, dtype=float).ravel()
    if x.shape != y.shape:
        raise ValueError(f"paired arms need the same images: {x.shape} against {y.shape}")
    effect = float(x.mean() - y.mean())
    if np.array_equal(x, y):
        return Comparison(0.0, 0.0, 0.0, 1.0, "paired bootstrap + McNemar", x.size, y.size, confidence)
    # resampled in batches of about 2**23 numbers: unbatched, BCa's jackknife holds an n x n array (30,000 pairs,
    # 3 seeds of 10,000 test images: 7 GB); the batches draw the same resamples, so the interval is unchanged
    batch = max(16, min(n_resamples, (1 << 23) // x.size))
    res = st.bootstrap((x, y), lambda u, v, axis=-1: u.mean(axis=axis) - v.mean(axis=axis), paired=True,
                       vectorized=True, confidence_level=confidence, n_resamples=n_resamples, batch=batch,
                       method=method, random_state=np.random.default_rng(random_state))
    ci = res.confidence_interval
    return Comparison(effect, float(ci.low), float(ci.high), mcnemar(x > 0.5, y > 0.5),
                      "paired bootstrap + McNemar", x.size, y.size, confidence)


@dataclass(frozen=True)
class Equivalence:
    """Two one-sided Welch tests of ``|mean(a) - mean(b)| < margin``: ``p`` is the larger one-sided p-value;
    ``ci_low``/``ci_high`` the ``1 - 2 alpha`` interval (90 % at alpha 0.05), inside ``(-margin, margin)``
    exactly when ``p < alpha``."""

    effect: float
    ci_low: float
    ci_high: float
    p: float
    margin: float
    equivalent: bool


def tost(a: Sequence[float], b: Sequence[float], margin: float, alpha: float = 0.05) -> Equivalence:
    """Equivalence of two arms within ``margin`` (> 0, in the unit of the values, stated before looking)."""
    if not margin > 0:
        raise ValueError(f"an equivalence margin must be positive, got {margin}")
    x, y = _array(a), _array(b)
    lower = st.ttest_ind(x + margin, y, equal_var=False, alternative="greater")  # H0: diff <= -margin
    upper = st.ttest_ind(x - margin, y, equal_var=False, alternative="less")  # H0: diff >= +margin
    p = float(max(lower.pvalue, upper.pvalue))
    ci = st.ttest_ind(x, y, equal_var=False).confidence_interval(1 - 2 * alpha)
    return Equivalence(float(x.mean() - y.mean()), float(ci.low), float(ci.high), p, margin, p < alpha)


def _power(delta: float, sd: float, n_a: int, n_b: int, alpha: float) -> float:
    df = n_a + n_b - 2
    nc = delta / (sd * math.sqrt(1 / n_a + 1 / n_b))
    crit = st.t.ppf(1 - alpha / 2, df)
    power = float(st.nct.sf(crit, df, nc) + st.nct.cdf(-crit, df, nc))
    if math.isnan(power):  # scipy's nct gives up far in the tail (large df and noncentrality): t is normal there
        power = float(st.norm.sf(crit - nc) + st.norm.cdf(-crit - nc))
    return power


def mde_welch(n_a: int, n_b: int, sd: float, alpha: float = 0.05, power: float = 0.8) -> float:
    """The minimal detectable effect of a two-sided two-sample t-test with ``n_a`` and ``n_b`` runs and a per-arm
    standard deviation ``sd``: the true difference ``delta`` whose power is ``power``, where power is
    ``P(|T| > t_{1-alpha/2, df})`` for ``T`` noncentral t (``scipy.stats.nct``) with ``df = n_a + n_b - 2`` and
    noncentrality ``delta / (sd * sqrt(1/n_a + 1/n_b))`` (equal variances; Welch's df is at most this, so the true
    MDE of the Welch test is no smaller). NaN without a spread."""
    if n_a < 2 or n_b < 2:
        raise ValueError(f"a detectable effect needs at least 2 runs per arm, got {n_a} and {n_b}")
    if not sd > 0:
        return math.nan
    hi = sd
    while _power(hi, sd, n_a, n_b, alpha) < power:
        hi *= 2
    return float(optimize.brentq(lambda d: _power(d, sd, n_a, n_b, alpha) - power, 0.0, hi, xtol=1e-10 * sd))


def mde_paired(sd_diff: float, n: int, alpha: float = 0.05, power: float = 0.8) -> float:
    """The minimal detectable effect of a paired design with ``n`` pairs whose differences have standard deviation
    ``sd_diff``, by the normal approximation: ``(z_{1-alpha/2} + z_{power}) * sd_diff / sqrt(n)``."""
    return float((st.norm.ppf(1 - alpha / 2) + st.norm.ppf(power)) * sd_diff / math.sqrt(n))


def pooled_sd(a: Sequence[float], b: Sequence[float]) -> float:
    """The per-arm standard deviation of a two-arm design: the root of the mean of the two sample variances."""
    return float(math.sqrt((np.var(_array(a), ddof=1) + np.var(_array(b), ddof=1)) / 2))


def verdict(ci_low: float, ci_high: float) -> str:
    """The rule for a claim of a difference, ``effect`` signed so that positive is the paper's direction:
    *reproduced* when the interval excludes zero on the positive side, *contradicted* when it excludes zero on the
    negative side, *undecided* otherwise."""
    if ci_low > 0:
        return REPRODUCED
    if ci_high < 0:
        return CONTRADICTED
    return UNDECIDED


def equivalence_verdict(eq: Equivalence, ci95_low: float, ci95_high: float) -> str:
    """The rule for an "as good as" claim: *reproduced* when TOST shows equivalence within its margin,
    *contradicted* when the 95 % interval lies wholly outside ``(-margin, margin)``, *undecided* otherwise."""
    if eq.equivalent:
        return REPRODUCED
    if ci95_low >= eq.margin or ci95_high <= -eq.margin:
        return CONTRADICTED
    return UNDECIDED
