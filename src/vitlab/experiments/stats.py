"""Comparisons of two arms of a study, and the one rule that turns them into a verdict.

**The run is the unit of replication.** A verdict says what a *new* run would show, so its sample is runs (seeds):

- :func:`paired_t`: arms trained with the same seeds: the one-sample t over the per-seed differences
  (``scipy.stats.ttest_rel`` and its ``confidence_interval``). A seed fixes the initialisation and the data order, so
  two arms' runs of one seed are correlated and their difference is the fair unit;
- :func:`welch`: arms with different seeds (or not the same set): Welch's t over the runs' values
  (``scipy.stats.ttest_ind(equal_var=False)``);
- :func:`tost`: "as good as" claims, two one-sided tests against a margin stated beforehand (paired or Welch);
- :func:`mde_welch` / :func:`mde_paired_t`: the smallest true difference the design detects with 80 % power, from
  the noncentral t of the same test; :func:`runs_to_decide` the runs per arm at which it would reach a target.

Why t over runs and not a bootstrap: with 3-5 seeds a bootstrap over seeds has a handful of distinct resamples (10
for 3 seeds) and its intervals undercover badly; a hierarchical bootstrap (seeds, then images) needs tens of seeds
to be valid. The t interval over runs is exact for normal run-to-run noise and close to nominal for the accuracies
seen here (``tests/test_stats_coverage.py`` simulates studies with a known seed variance and per-image noise: the
95 % interval covers the true difference in >= 93 % of 1,000 studies at 3 and at 5 seeds, where the per-(seed,
image) bootstrap covers far less, because it measures the noise of the test images at the seeds that happened to
be trained, not the noise of training a new run).

:func:`paired` (bootstrap over images, with McNemar's exact p) stays as a *description* of "these runs on these
images", never as a verdict; with fewer than :data:`MIN_DISCORDANT` images that differ its interval is the exact one
of McNemar's conditional binomial, so it never decides where McNemar does not.

**The rule** (:func:`compare`, one claim; :func:`decide_family`, the claims of one page): a claim has one p-value
whose "p < alpha" is its decision at level alpha: the two-sided p of a difference; for non-inferiority within a
margin m, twice the one-sided p of ``effect > -m`` (so that it decides exactly when the 95 % interval's lower end is
above -m); for equivalence, the TOST p. Alone, a difference is *reproduced* when the 95 % interval excludes zero on
the claim's side, *contradicted* on the other side, *undecided* otherwise. A family of claims (a findings page) is
corrected as a family by the Benjamini-Hochberg false discovery rate (q-values, ``scipy.stats
.false_discovery_control``): a page of ~50 mostly independent questions wants the expected share of wrong decided
rows bounded, which Holm's family-wise error would buy at the price of deciding almost nothing at 3 seeds. The
decided rows are those with ``q <= alpha``; their intervals are the false-coverage-rate adjusted ones of Benjamini and
Yekutieli (2005), at level ``1 - R alpha / m`` for R decided of m tested claims, so an adjusted interval excludes
zero for every decided difference. A value that is not finite, an arm of fewer than 2 runs, or arms with no spread
at all give *undecidable* (no p, no interval), never a decision.
Effects are in the unit of the inputs (the verdict table uses accuracy points); ``effect = mean(a) - mean(b)``.

scipy does the tests. It is the optional extra ``vitlab[stats]``, imported by the functions that need it (nothing
``vitlab train`` or :func:`vitlab.create_model` imports reaches this module); without it they raise
:class:`~vitlab.errors.ConfigError` naming ``pip install 'vitlab[stats]'``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from vitlab.errors import ConfigError

REPRODUCED, CONTRADICTED, UNDECIDED = "reproduced", "contradicted", "undecided"
DIFFERENCE, EQUIVALENCE, NONINFERIOR = "difference", "equivalence", "non-inferiority"
MIN_DISCORDANT = 25  # below this many differing images, paired()'s interval is McNemar's exact conditional one
MAX_RUNS = 50  # runs_to_decide looks no further


def _scipy(module: str = "stats") -> Any:
    """``scipy.stats`` (or ``scipy.optimize``), imported on first use: scipy is the optional extra ``vitlab[stats]``."""
    try:
        if module == "optimize":
            from scipy import optimize

            return optimize
        from scipy import stats

        return stats
    except ImportError:
        raise ConfigError("the statistics of vitlab verdict and vitlab.experiments.stats need scipy, which is not "
                          "installed; pip install 'vitlab[stats]'") from None


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


def _array(x: Sequence[float], name: str = "an arm") -> np.ndarray:
    a = np.asarray(x, dtype=float).ravel()
    if a.size < 2:
        raise ValueError(f"{name} needs at least 2 values to compare, got {a.size}")
    if not np.isfinite(a).all():
        raise ValueError(f"{name} holds a value that is not finite ({a.tolist()}): a run without a result cannot be "
                         "compared; re-run it or leave it out")
    return a


def _undecidable(effect: float, test: str, n_a: int, n_b: int, confidence: float) -> Comparison:
    """No spread at all: the t statistic is undefined and nothing can be said, whatever the means."""
    return Comparison(effect, -math.inf, math.inf, math.nan, f"{test} (no spread: undecidable)", n_a, n_b, confidence)


def welch(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> Comparison:
    """Welch's t-test of ``mean(a) - mean(b)`` (two-sided) and its confidence interval. When both arms have no
    spread at all the t statistic is undefined: undecidable (the interval is the whole line, p is NaN), also when
    the means are equal; accuracies on 1,000 images move in steps of 0.1 points, so two constant arms happen."""
    st = _scipy()
    x, y = _array(a), _array(b)
    effect = float(x.mean() - y.mean())
    if x.var() == 0 and y.var() == 0:
        return _undecidable(effect, "welch", x.size, y.size, confidence)
    res = st.ttest_ind(x, y, equal_var=False)
    ci = res.confidence_interval(confidence)
    return Comparison(effect, float(ci.low), float(ci.high), float(res.pvalue), "welch", x.size, y.size, confidence)


def paired_t(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> Comparison:
    """The paired t-test over per-seed differences ``a[i] - b[i]`` (``a`` and ``b`` in the same seed order):
    ``scipy.stats.ttest_rel`` and its interval. Constant differences: undecidable."""
    st = _scipy()
    x, y = _array(a), _array(b)
    if x.size != y.size:
        raise ValueError(f"a paired comparison needs one value per seed in each arm, got {x.size} and {y.size}")
    d = x - y
    effect = float(d.mean())
    if d.var() == 0:
        return _undecidable(effect, "paired t over seeds", x.size, y.size, confidence)
    res = st.ttest_rel(x, y)
    ci = res.confidence_interval(confidence)
    return Comparison(effect, float(ci.low), float(ci.high), float(res.pvalue), "paired t over seeds", x.size, y.size,
                      confidence)


def one_sample(a: Sequence[float], value: float, confidence: float = 0.95) -> Comparison:
    """``mean(a) - value`` by the one-sample t-test (``scipy.stats.ttest_1samp``), for a claim about a threshold
    (a goal: "92.5 % reached" is shown only when the whole interval is above it)."""
    st = _scipy()
    x = _array(a)
    if x.var() == 0:
        return _undecidable(float(x.mean() - value), "one-sample t", x.size, 0, confidence)
    res = st.ttest_1samp(x, value)
    ci = res.confidence_interval(confidence)
    return Comparison(float(x.mean() - value), float(ci.low - value), float(ci.high - value), float(res.pvalue),
                      "one-sample t", x.size, 0, confidence)


def mcnemar(correct_a: Sequence[bool], correct_b: Sequence[bool]) -> float:
    """McNemar's exact p-value (two-sided): the binomial test of the pairs only one arm got right."""
    st = _scipy()
    x, y = np.asarray(correct_a, dtype=bool), np.asarray(correct_b, dtype=bool)
    if x.shape != y.shape:
        raise ValueError(f"paired arms need the same images: {x.shape} against {y.shape}")
    only_a, only_b = int((x & ~y).sum()), int((~x & y).sum())
    if only_a + only_b == 0:
        return 1.0
    return float(st.binomtest(only_a, only_a + only_b, 0.5).pvalue)


def paired(correct_a: Sequence[bool], correct_b: Sequence[bool], confidence: float = 0.95,
           n_resamples: int = 9999, random_state: int = 0, method: str = "BCa") -> Comparison:
    """A *description* of two runs (or sets of runs) on the same images, never a verdict for a new run: the
    difference in accuracy (``correct_*``: one bool per image, or per (run, image) pair in the same order), a paired
    bootstrap interval over the pairs (``method``: scipy's BCa by default; "percentile" skips BCa's jackknife) and
    McNemar's p-value. With fewer than :data:`MIN_DISCORDANT` images that differ the bootstrap's interval is too
    narrow (3 differing images of 1,000 gave 0.10..0.80 points where McNemar's p is 0.25): the interval is then the
    exact one of McNemar's conditional binomial (Clopper-Pearson on the share of the differing images that ``a``
    got right, times their share of all images), which excludes zero only when McNemar's exact test rejects.
    Memory stays about 100 MB whatever the number of pairs."""
    st = _scipy()
    x, y = np.asarray(correct_a, dtype=float).ravel(), np.asarray(correct_b, dtype=float).ravel()
    if x.shape != y.shape:
        raise ValueError(f"paired arms need the same images: {x.shape} against {y.shape}")
    effect = float(x.mean() - y.mean())
    if np.array_equal(x, y):
        return Comparison(0.0, 0.0, 0.0, 1.0, "paired bootstrap + McNemar", x.size, y.size, confidence)
    only_a, only_b = int(((x > 0.5) & (y < 0.5)).sum()), int(((x < 0.5) & (y > 0.5)).sum())
    p = mcnemar(x > 0.5, y > 0.5)
    if only_a + only_b < MIN_DISCORDANT:
        d = only_a + only_b
        ci = st.binomtest(only_a, d, 0.5).proportion_ci(confidence, method="exact")
        share = d / x.size
        return Comparison(effect, share * (2 * ci.low - 1), share * (2 * ci.high - 1), p,
                          "McNemar exact (few differing images)", x.size, y.size, confidence)
    # resampled in batches of about 2**23 numbers: unbatched, BCa's jackknife holds an n x n array (30,000 pairs,
    # 3 seeds of 10,000 test images: 7 GB); the batches draw the same resamples, so the interval is unchanged
    batch = max(16, min(n_resamples, (1 << 23) // x.size))
    res = st.bootstrap((x, y), lambda u, v, axis=-1: u.mean(axis=axis) - v.mean(axis=axis), paired=True,
                       vectorized=True, confidence_level=confidence, n_resamples=n_resamples, batch=batch,
                       method=method, random_state=np.random.default_rng(random_state))
    ci = res.confidence_interval
    return Comparison(effect, float(ci.low), float(ci.high), p, "paired bootstrap + McNemar", x.size, y.size,
                      confidence)


@dataclass(frozen=True)
class Equivalence:
    """Two one-sided tests of ``|mean(a) - mean(b)| < margin``: ``p`` is the larger one-sided p-value;
    ``ci_low``/``ci_high`` the ``1 - 2 alpha`` interval (90 % at alpha 0.05), inside ``(-margin, margin)``
    exactly when ``p < alpha``. Arms with no spread are never equivalent (p NaN)."""

    effect: float
    ci_low: float
    ci_high: float
    p: float
    margin: float
    equivalent: bool


def tost(a: Sequence[float], b: Sequence[float], margin: float, alpha: float = 0.05,
         paired: bool = False) -> Equivalence:
    """Equivalence of two arms within ``margin`` (> 0, in the unit of the values, stated before looking): Welch's
    two one-sided tests, or with ``paired`` the one-sample t's over the per-seed differences."""
    st = _scipy()
    if not margin > 0:
        raise ValueError(f"an equivalence margin must be positive, got {margin}")
    x, y = _array(a), _array(b)
    if paired:
        d = x - y
        if d.size != y.size or x.size != y.size:
            raise ValueError(f"a paired comparison needs one value per seed in each arm, got {x.size} and {y.size}")
        if d.var() == 0:
            return Equivalence(float(d.mean()), -math.inf, math.inf, math.nan, margin, False)
        lower = st.ttest_1samp(d + margin, 0.0, alternative="greater")  # H0: diff <= -margin
        upper = st.ttest_1samp(d - margin, 0.0, alternative="less")  # H0: diff >= +margin
        ci = st.ttest_1samp(d, 0.0).confidence_interval(1 - 2 * alpha)
    else:
        if x.var() == 0 and y.var() == 0:  # t undefined: a constant pair of arms shows nothing, not equivalence
            return Equivalence(float(x.mean() - y.mean()), -math.inf, math.inf, math.nan, margin, False)
        lower = st.ttest_ind(x + margin, y, equal_var=False, alternative="greater")
        upper = st.ttest_ind(x - margin, y, equal_var=False, alternative="less")
        ci = st.ttest_ind(x, y, equal_var=False).confidence_interval(1 - 2 * alpha)
    p = float(max(lower.pvalue, upper.pvalue))
    return Equivalence(float(x.mean() - y.mean()), float(ci.low), float(ci.high), p, margin, p < alpha)


def _power(delta: float, sd: float, n_a: int, n_b: int, alpha: float) -> float:
    df = n_a + n_b - 2
    nc = delta / (sd * math.sqrt(1 / n_a + 1 / n_b))
    return _t_power(nc, df, alpha)


def _t_power(nc: float, df: int, alpha: float) -> float:
    st = _scipy()
    crit = st.t.ppf(1 - alpha / 2, df)
    power = float(st.nct.sf(crit, df, nc) + st.nct.cdf(-crit, df, nc))
    if math.isnan(power):  # scipy's nct gives up far in the tail (large df and noncentrality): t is normal there
        power = float(st.norm.sf(crit - nc) + st.norm.cdf(-crit - nc))
    return power


def _solve(power_of: object, sd: float, power: float) -> float:
    optimize = _scipy("optimize")
    hi = sd
    while power_of(hi) < power:  # type: ignore[operator]
        hi *= 2
    return float(optimize.brentq(lambda d: power_of(d) - power, 0.0, hi, xtol=1e-10 * sd))  # type: ignore[operator]


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
    return _solve(lambda d: _power(d, sd, n_a, n_b, alpha), sd, power)


def mde_paired_t(n: int, sd_diff: float, alpha: float = 0.05, power: float = 0.8) -> float:
    """The minimal detectable effect of the paired t-test over ``n`` seeds whose per-seed differences have standard
    deviation ``sd_diff``: noncentral t with ``df = n - 1`` and noncentrality ``delta sqrt(n) / sd_diff``. NaN
    without a spread."""
    if n < 2:
        raise ValueError(f"a detectable effect needs at least 2 seeds, got {n}")
    if not sd_diff > 0:
        return math.nan
    return _solve(lambda d: _t_power(d * math.sqrt(n) / sd_diff, n - 1, alpha), sd_diff, power)


def mde_paired(sd_diff: float, n: int, alpha: float = 0.05, power: float = 0.8) -> float:
    """The minimal detectable effect of a paired design with ``n`` pairs whose differences have standard deviation
    ``sd_diff``, by the normal approximation: ``(z_{1-alpha/2} + z_{power}) * sd_diff / sqrt(n)`` (for many pairs;
    over seeds use :func:`mde_paired_t`)."""
    st = _scipy()
    return float((st.norm.ppf(1 - alpha / 2) + st.norm.ppf(power)) * sd_diff / math.sqrt(n))


def pooled_sd(a: Sequence[float], b: Sequence[float]) -> float:
    """The per-arm standard deviation of a two-arm design: the root of the mean of the two sample variances."""
    return float(math.sqrt((np.var(_array(a), ddof=1) + np.var(_array(b), ddof=1)) / 2))


def runs_to_decide(target: float, sd: float, paired: bool = False, alpha: float = 0.05,
                   max_runs: int = MAX_RUNS) -> str:
    """The runs per arm (seeds, when ``paired``) at which the design's MDE at the spread ``sd`` (per arm, or of the
    per-seed differences) would reach ``target``: a number, ``"> max_runs"``, or "" without a spread."""
    if not sd > 0 or not math.isfinite(sd):
        return ""
    for n in range(2, max_runs + 1):
        mde = mde_paired_t(n, sd, alpha) if paired else mde_welch(n, n, sd, alpha)
        if mde <= target:
            return str(n)
    return f"> {max_runs}"


def verdict(ci_low: float, ci_high: float) -> str:
    """The rule for a claim of a difference, ``effect`` signed so that positive is the paper's direction:
    *reproduced* when the interval excludes zero on the positive side, *contradicted* when it excludes zero on the
    negative side, *undecided* otherwise (also for an interval that is not finite)."""
    if ci_low > 0 and math.isfinite(ci_high):
        return REPRODUCED
    if ci_high < 0 and math.isfinite(ci_low):
        return CONTRADICTED
    return UNDECIDED


def equivalence_verdict(eq: Equivalence, ci95_low: float, ci95_high: float) -> str:
    """The rule for an "as good as" claim: *reproduced* when TOST shows equivalence within its margin,
    *contradicted* when the 95 % interval lies wholly outside ``(-margin, margin)``, *undecided* otherwise."""
    if eq.equivalent:
        return REPRODUCED
    if (ci95_low >= eq.margin or ci95_high <= -eq.margin) and math.isfinite(ci95_low) and math.isfinite(ci95_high):
        return CONTRADICTED
    return UNDECIDED


Values = Sequence[float] | Mapping[int, float]


@dataclass(frozen=True)
class Result:
    """One claim's comparison (:func:`compare`): ``effect = mean(a) - mean(b)`` (or ``mean(a) - threshold``), its
    interval at ``confidence``, ``p`` (the claim's decision p-value, see the module), the ``test`` by name, the runs
    per arm, the ``mde`` at 80 % power of this design, ``runs_to_decide`` (for an undecided claim), the ``verdict``
    and, once a family is decided (:func:`decide_family`), ``q`` and the adjusted interval. ``a``/``b`` keep the
    values compared (in seed order when paired) so that the family can recompute the interval at its level."""

    effect: float
    ci_low: float
    ci_high: float
    p: float
    test: str
    n_a: int
    n_b: int
    mde: float
    runs_to_decide: str
    verdict: str
    kind: str = DIFFERENCE
    margin: float = 0.0
    paired: bool = False
    confidence: float = 0.95
    q: float = math.nan
    adj_low: float = math.nan
    adj_high: float = math.nan
    adj_confidence: float = math.nan
    sd: float = math.nan
    a: tuple[float, ...] = ()
    b: tuple[float, ...] | float = ()

    def row(self) -> dict[str, str]:
        """The CSV/terminal row: numbers to 4 significant digits."""
        g = lambda v: f"{v:.4g}"  # noqa: E731
        return {"effect": g(self.effect), "ci_low": g(self.ci_low), "ci_high": g(self.ci_high), "p": f"{self.p:.3g}",
                "q": f"{self.q:.3g}", "adj_ci_low": g(self.adj_low), "adj_ci_high": g(self.adj_high),
                "test": self.test, "runs": f"{self.n_a}/{self.n_b}" if self.n_b else str(self.n_a),
                "mde": f"{self.mde:.3g}", "margin": f"{self.margin:g}" if self.margin else "",
                "verdict": self.verdict, "runs_to_decide": self.runs_to_decide}


def _pair(a: Values, b: Values) -> tuple[list[float], list[float]]:
    """The two arms in one seed order: mappings by their shared seeds (which must be the same set), sequences as
    given (the same length)."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        if set(a) != set(b):
            raise ValueError(f"paired arms need the same seeds: {sorted(a)} against {sorted(b)}; compare them "
                             "unpaired (Welch), or train the missing seeds")
        seeds = sorted(a)
        return [a[s] for s in seeds], [b[s] for s in seeds]
    if isinstance(a, Mapping) or isinstance(b, Mapping):
        raise ValueError("paired arms are both {seed: value} mappings or both sequences in one seed order")
    if len(a) != len(b):
        raise ValueError(f"paired arms need one value per seed in each, got {len(a)} and {len(b)}")
    return list(a), list(b)


def _kind(margin: float, noninferior: bool) -> str:
    if margin < 0 or not math.isfinite(margin):
        raise ValueError(f"a margin is a positive number in the unit of the values, got {margin}")
    if noninferior and not margin > 0:
        raise ValueError("a non-inferiority claim needs its margin (--margin M > 0), stated before looking")
    return NONINFERIOR if noninferior else EQUIVALENCE if margin > 0 else DIFFERENCE


def compare(a: Values, b: Values | float, *, paired: bool = False, margin: float = 0.0, noninferior: bool = False,
            confidence: float = 0.95) -> Result:
    """One claim, ``a`` against ``b``, with the run as the unit: the effect, its interval, p, test, MDE, runs to
    decide and the verdict of the rule (module docstring) at ``alpha = 1 - confidence``.

    ``a``/``b``: one value per run (a list), or ``{seed: value}``; ``b`` may be a number, a threshold ("the goal is
    reached": one-sample t). ``paired``: the arms share their seeds (paired t over the per-seed differences; both
    mappings with the same seeds, or two lists in one seed order); otherwise Welch. ``margin`` > 0: an "as good as"
    claim (TOST), or with ``noninferior`` a "no worse than" claim. An arm with fewer than 2 runs gives the effect and
    *undecided*; a value that is not finite raises ``ValueError``."""
    kind = _kind(margin, noninferior)
    alpha = 1 - confidence
    threshold = isinstance(b, int | float) and not isinstance(b, bool)
    if paired and not threshold:
        xa, xb = _pair(a, b)  # type: ignore[arg-type]
    else:
        xa = list(a.values()) if isinstance(a, Mapping) else list(a)
        xb = b if threshold else list(b.values()) if isinstance(b, Mapping) else list(b)  # type: ignore[union-attr]
    for name, values in (("arm a", xa), ("arm b", [xb] if threshold else xb)):
        bad = [v for v in values if not math.isfinite(float(v))]  # type: ignore[arg-type]
        if bad:
            raise ValueError(f"{name} holds a value that is not finite ({bad[0]}): a run without a result cannot be "
                             "compared; re-run it or leave it out")
    n_b = 0 if threshold else len(xb)  # type: ignore[arg-type]
    keep = {"kind": kind, "margin": margin, "paired": paired and not threshold, "confidence": confidence,
            "a": tuple(float(v) for v in xa), "b": float(xb) if threshold else tuple(float(v) for v in xb)}  # type: ignore[arg-type]
    if len(xa) < 2 or (not threshold and n_b < 2):
        mean_b = float(xb) if threshold else (float(np.mean(xb)) if n_b else math.nan)  # type: ignore[arg-type]
        effect = float(np.mean(xa)) - mean_b if xa else math.nan
        return Result(effect, math.nan, math.nan, math.nan, "none yet (a test needs 2 runs per arm)", len(xa), n_b,
                      math.nan, "unknown: 1 run per arm" if xa and (threshold or n_b) else "unknown: not run yet",
                      UNDECIDED, **keep)
    if threshold:
        c, sd = one_sample(xa, float(xb), confidence), float(np.std(xa, ddof=1))  # type: ignore[arg-type]
        test_paired = True  # the MDE of a one-sample t is the paired one's
    elif keep["paired"]:
        c, sd = paired_t(xa, xb, confidence), float(np.std(np.subtract(xa, xb), ddof=1))  # type: ignore[arg-type]
        test_paired = True
    else:
        c, sd = welch(xa, xb, confidence), pooled_sd(xa, xb)  # type: ignore[arg-type]
        test_paired = False
    n = len(xa)
    mde = (mde_paired_t(n, sd, alpha) if test_paired else mde_welch(n, n_b, sd, alpha)) if sd > 0 else math.nan
    test, p = c.test, c.p
    if kind == DIFFERENCE:
        v, target = verdict(c.ci_low, c.ci_high), abs(c.effect)
    elif kind == NONINFERIOR:
        p = _noninferior_p(xa, xb, margin, keep["paired"], threshold) if math.isfinite(c.p) else math.nan
        v, target = verdict(c.ci_low + margin, c.ci_high + margin), abs(c.effect + margin)
        test += f" + non-inferiority (margin {margin:g})"
    else:
        if threshold:
            raise ValueError("an equivalence claim compares two arms, not an arm and a threshold")
        eq = tost(xa, xb, margin, alpha, paired=keep["paired"])  # type: ignore[arg-type]
        p = eq.p
        v, target = equivalence_verdict(eq, c.ci_low, c.ci_high), margin / 2
        test += f" + TOST (margin {margin:g})"
    decide = runs_to_decide(target, sd, test_paired, alpha) if v == UNDECIDED and math.isfinite(c.p) else ""
    if not math.isfinite(c.p):
        decide = "unknown: no spread"
    return Result(c.effect, c.ci_low, c.ci_high, p, test, n, n_b, mde, decide, v, sd=sd, **keep)


def _noninferior_p(xa: list[float], xb: list[float] | float, margin: float, paired: bool, threshold: bool) -> float:
    """Twice the one-sided p of ``effect > -margin``: below alpha exactly when the two-sided ``1 - alpha`` interval's
    lower end is above ``-margin``."""
    st = _scipy()
    if threshold:
        one = st.ttest_1samp(np.asarray(xa) + margin, float(xb), alternative="greater").pvalue  # type: ignore[arg-type]
    elif paired:
        one = st.ttest_1samp(np.subtract(xa, xb) + margin, 0.0, alternative="greater").pvalue
    else:
        one = st.ttest_ind(np.asarray(xa) + margin, xb, equal_var=False, alternative="greater").pvalue
    return float(min(1.0, 2 * one))


def decide_family(results: Sequence[Result], alpha: float = 0.05) -> list[Result]:
    """The claims of one page decided as a family: Benjamini-Hochberg q-values over the claims that have a p-value
    (``m`` of them), ``R`` decided where ``q <= alpha``, and every tested claim's interval recomputed at the
    false-coverage-rate level ``1 - max(R, 1) alpha / m`` (Benjamini and Yekutieli 2005). Verdicts: a difference
    decided by ``q`` is reproduced or contradicted by the sign of its effect; an equivalence or non-inferiority claim
    is reproduced when ``q <= alpha`` and contradicted when its adjusted interval lies wholly beyond the margin.
    Claims without a p-value stay as they are (undecided)."""
    st = _scipy()
    tested = [i for i, r in enumerate(results) if math.isfinite(r.p)]
    out = list(results)
    if not tested:
        return out
    q = st.false_discovery_control([results[i].p for i in tested], method="bh")
    decided = int(np.sum(q <= alpha))
    level = 1 - max(decided, 1) * alpha / len(tested)
    for i, qi in zip(tested, q):
        r = results[i]
        adj = compare(dict(enumerate(r.a)) if r.paired else r.a, r.b if not r.paired else dict(enumerate(r.b)),  # type: ignore[arg-type]
                      paired=r.paired, margin=r.margin, noninferior=r.kind == NONINFERIOR, confidence=level)
        lo, hi, m = adj.ci_low, adj.ci_high, r.margin
        if qi <= alpha:
            v = (REPRODUCED if r.effect > 0 else CONTRADICTED) if r.kind == DIFFERENCE else REPRODUCED
        elif r.kind == NONINFERIOR and hi + m < 0:
            v = CONTRADICTED
        elif r.kind == EQUIVALENCE and (lo >= m or hi <= -m) and math.isfinite(lo) and math.isfinite(hi):
            v = CONTRADICTED
        else:
            v = UNDECIDED
        decide = ""
        if v == UNDECIDED:  # at the unadjusted alpha: the runs that would decide this claim alone
            target = {DIFFERENCE: abs(r.effect), NONINFERIOR: abs(r.effect + m), EQUIVALENCE: m / 2}[r.kind]
            decide = r.runs_to_decide or runs_to_decide(target, r.sd, r.paired or not r.n_b, alpha)
        out[i] = replace(r, q=float(qi), adj_low=lo, adj_high=hi, adj_confidence=level, verdict=v,
                         runs_to_decide=decide)
    return out
