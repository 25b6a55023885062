"""The numbers behind every verdict: where a cell's log values lie (location and its standard error), how much
the other cells of the same table say about its noise (empirical-Bayes moderation), intervals, p-values, and the
family-wise rule that turns many p-values into marks.

Pure functions of floats; nothing here knows about records, cells or runs.

- Location. Below TRIM_FROM values: the mean of the logs (a geometric mean), standard error s/sqrt(n). From
  TRIM_FROM on: the 20%-trimmed mean of the logs with the Tukey-McLaughlin standard error (the winsorized
  variance over (1-2g)^2 n): one slow outlier among ten rounds moves it little, as it moves a median little,
  and the interval and the test are of the same estimate. `python3 bench/interval_coverage.py` measures both.
- Moderation (Smyth 2004, limma's eBayes). A table of 88 cells measured in 3 rounds has 2 degrees of freedom per
  cell: a t-interval of its own is 4.3 standard errors wide, and nothing survives a family-wise correction. The
  cells of one table share the machine's noise, so their variances are taken as draws from a scaled inverse
  chi-square prior (d0, s0^2) fitted to all of them by the method of moments; each cell's variance is moderated
  to (d0 s0^2 + d s^2) / (d0 + d) with d0 + d degrees of freedom. When the cells' variances agree, d0 is large
  and a cell borrows the table's noise; when they differ, d0 is small and each cell keeps its own.
- Family. Holm's step-down procedure over every p-value of one table: in 95% of tables no mark at all is
  false, whatever the number of cells (Holm 1979). Chosen over Benjamini-Hochberg because a reader takes each
  mark on its own: a false-discovery rate of 5% would still leave a false mark in most large tables.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

import numpy as np
from scipy import special
from scipy import stats as sps

CONFIDENCE = 0.95
ALPHA = 1 - CONFIDENCE
#: Degrees of freedom a moderated variance is granted at most: the cells of a table share their baselines' runs,
#: so their variances are fewer independent pieces of evidence than their count says (measured: with the prior's
#: df uncapped, --until's trimmed cells covered 92%).
MAX_DF = 30.0
#: From this many values on, the location is a trimmed mean (robust to an outlier) instead of the mean.
TRIM_FROM = 10
#: Share trimmed from each end of the sorted values.
TRIM = 0.2


class Method(StrEnum):
    """How a location was estimated."""

    MEAN = "mean"
    TRIMMED = "trimmed mean"


@dataclass(frozen=True)
class Location:
    """The location of some log values and what its standard error is made of: se^2 = scale2 x factor, with `df`
    degrees of freedom in scale2 (before moderation)."""

    estimate: float
    scale2: float
    df: int
    factor: float
    n: int
    method: Method


def locate(logs: Sequence[float]) -> Location | None:
    """Location of log values (see the module docstring); None without values."""
    x = np.sort(np.asarray([v for v in logs if v is not None and math.isfinite(v)], dtype=float))
    n = len(x)
    if n == 0:
        return None
    if n < TRIM_FROM:
        return Location(float(np.mean(x)), float(np.var(x, ddof=1)) if n > 1 else 0.0, n - 1, 1.0 / n, n,
                        Method.MEAN)
    g = int(math.floor(TRIM * n))
    trimmed = x[g:n - g]
    wins = np.concatenate([np.full(g, x[g]), trimmed, np.full(g, x[n - g - 1])])
    factor, df = shape(n)
    return Location(float(np.mean(trimmed)), float(np.var(wins, ddof=1)), df, factor, n, Method.TRIMMED)


def shape(n: int) -> tuple[float, int]:
    """(factor, degrees of freedom) of the location of n values: se^2 = scale2 x factor. Below TRIM_FROM the mean
    (1/n, n - 1); from there Tukey-McLaughlin's trimmed mean: the winsorized variance over (h/n)^2 n, h - 1 degrees
    of freedom, h = n - 2g the values kept."""
    if n < TRIM_FROM:
        return 1.0 / n, n - 1
    h = n - 2 * int(math.floor(TRIM * n))
    return 1.0 / ((h / n) ** 2 * n), h - 1


@dataclass(frozen=True)
class Prior:
    """The table's noise: a scaled inverse chi-square prior of the cells' variances (d0 may be infinite: the cells
    agree so well that each takes the table's variance s0^2). d0 = 0: no prior (too few cells to fit one)."""

    d0: float
    s02: float
    cells: int

    @property
    def sd(self) -> float:
        return math.sqrt(self.s02)


NO_PRIOR = Prior(0.0, 0.0, 0)
#: Fewest cells with a variance before a prior is fitted: fewer cannot say how much cells' variances differ.
MIN_PRIOR_CELLS = 6


def _trigamma_inverse(y: float) -> float:
    # Newton's method as in limma's trigammaInverse: solve trigamma(x) = y for x > 0.
    if y > 1e7:
        return 1 / math.sqrt(y)
    if y < 1e-6:
        return 1 / y
    x = 0.5 + 1 / y
    for _ in range(50):
        tri = float(special.polygamma(1, x))
        dif = tri * (1 - tri / y) / float(special.polygamma(2, x))
        x += dif
        if -dif / x < 1e-8:
            break
    return x


def fit_prior(scales: Sequence[tuple[float, int]]) -> Prior:
    """Fit (d0, s0^2) to cells' (variance, degrees of freedom): d0 by the method of moments on log variances
    (Smyth 2004, section 6.2), s0^2 the pooled variance (unbiased whatever the noise's shape, where the log
    moments assume normal noise: winsorized variances and heavy tails would be underestimated, never the other
    way). Cells with zero degrees of freedom or zero variance say nothing and are left out."""
    pts = [(s2, d) for s2, d in scales if d > 0 and s2 > 0 and math.isfinite(s2)]
    if len(pts) < MIN_PRIOR_CELLS:
        return NO_PRIOR
    s2 = np.array([p[0] for p in pts])
    d = np.array([p[1] for p in pts], dtype=float)
    e = np.log(s2) - special.digamma(d / 2) + np.log(d / 2)
    e_mean = float(np.mean(e))
    excess = float(np.mean((e - e_mean) ** 2) * len(e) / (len(e) - 1) - np.mean(special.polygamma(1, d / 2)))
    if excess <= 0:
        model = Prior(math.inf, math.exp(e_mean), len(pts))
    else:
        d0 = 2 * _trigamma_inverse(excess)
        model = Prior(d0, math.exp(e_mean + float(special.digamma(d0 / 2)) - math.log(d0 / 2)), len(pts))
    # The pooled variance of the cells that are not much noisier than the model says (those keep their own).
    keep = [i for i, (v, k) in enumerate(pts) if _f_sf(v / model.s02, k, model.d0) >= OWN_VARIANCE_P]
    pooled = float(np.dot(d[keep], s2[keep]) / np.sum(d[keep])) if keep else model.s02
    return Prior(model.d0, max(model.s02, pooled), len(pts))


def _f_sf(ratio: float, df: float, d0: float) -> float:
    return float(sps.chi2.sf(ratio * df, df)) if math.isinf(d0) else float(sps.f.sf(ratio, df, d0))


@dataclass(frozen=True)
class Estimate:
    """A location with its moderated standard error and degrees of freedom: what intervals and tests use."""

    estimate: float
    se: float
    df: float
    n: int
    method: Method
    moderated: bool

    @property
    def testable(self) -> bool:
        """Whether there is a standard error to test with (one value and no prior: none)."""
        return not math.isnan(self.df)

    def t_quantile(self, confidence: float = CONFIDENCE) -> float:
        return float(sps.t.ppf(0.5 + confidence / 2, self.df)) if math.isfinite(self.df) else \
            float(sps.norm.ppf(0.5 + confidence / 2))

    def interval(self, confidence: float = CONFIDENCE) -> tuple[float, float]:
        """The interval in logs."""
        if self.se == 0:
            return self.estimate, self.estimate
        h = self.t_quantile(confidence) * self.se
        return self.estimate - h, self.estimate + h

    def _sf(self, z: float) -> float:
        return float(sps.t.sf(z, self.df)) if math.isfinite(self.df) else float(sps.norm.sf(z))

    def p_differs(self, null: float = 0.0) -> float:
        """Two-sided p-value of location == null."""
        if not self.testable:
            return 1.0
        if self.se == 0:
            return 0.0 if self.estimate != null else 1.0
        return min(1.0, 2 * self._sf(abs(self.estimate - null) / self.se))

    def p_within(self, band: float) -> float:
        """p-value of |location| >= band (two one-sided tests, each at half the level, so that the claim 'within
        the band' is made exactly when the 95% interval lies inside it)."""
        if not self.testable:
            return 1.0
        if self.se == 0:
            return 0.0 if abs(self.estimate) < band else 1.0
        lower = self._sf((self.estimate + band) / self.se)
        upper = self._sf((band - self.estimate) / self.se)
        return min(1.0, 2 * max(lower, upper))

    def p_outside(self, band: float) -> float:
        """p-value of |location| <= band: the claim 'a difference beyond the band' is made exactly when the 95%
        interval lies wholly outside it."""
        if not self.testable:
            return 1.0
        if self.se == 0:
            return 0.0 if abs(self.estimate) > band else 1.0
        return min(1.0, 2 * self._sf((abs(self.estimate) - band) / self.se))


def pooled_df(own: float, prior: float) -> float:
    """Degrees of freedom of a variance moderated by a prior: the sum, capped at MAX_DF, never below the cell's own."""
    return max(float(own), min(MAX_DF, own + prior)) if prior else float(own)


def moderate(loc: Location, prior: Prior) -> Estimate:
    """The location's standard error with its variance moderated toward the table's prior."""
    if prior.d0 == 0:
        df = float(loc.df) if loc.df > 0 else math.nan
        return Estimate(loc.estimate, math.sqrt(loc.scale2 * loc.factor), df, loc.n, loc.method, False)
    if math.isinf(prior.d0):
        return Estimate(loc.estimate, math.sqrt(prior.s02 * loc.factor), pooled_df(loc.df, prior.d0), loc.n,
                        loc.method, True)
    s2 = (prior.d0 * prior.s02 + loc.df * loc.scale2) / (prior.d0 + loc.df)
    return Estimate(loc.estimate, math.sqrt(s2 * loc.factor), pooled_df(loc.df, prior.d0), loc.n, loc.method, True)


#: A cell whose variance exceeds the table's prior at this level (one-sided F-test, not corrected: erring toward
#: it) keeps its own variance: borrowing the table's would understate its noise.
OWN_VARIANCE_P = 0.10


def variance_p(loc: Location, prior: Prior) -> float:
    """One-sided p-value of "this cell's variance is the table's" against "it is larger" (F-test against the
    prior; 1 when there is no prior or no variance)."""
    if prior.d0 == 0 or loc.df <= 0 or prior.s02 <= 0:
        return 1.0
    return _f_sf(loc.scale2 / prior.s02, loc.df, prior.d0)


def fit_priors(locs: Sequence[Location | None]) -> dict[Method, Prior]:
    """A prior per kind of location (means and trimmed means scale their variances differently)."""
    return {m: fit_prior([(loc.scale2, loc.df) for loc in locs if loc is not None and loc.method is m])
            for m in Method}


def estimates(locs: Sequence[Location | None]) -> tuple[list[Estimate | None], Prior]:
    """Every cell's moderated estimate under a prior fitted to the cells of its kind (means and trimmed means
    scale their variances differently, so each kind has its own prior); cells much noisier than their prior keep
    their own variance (OWN_VARIANCE_P). Returns the prior of the most numerous kind with them."""
    priors = fit_priors(locs)
    out: list[Estimate | None] = []
    for loc in locs:
        if loc is None:
            out.append(None)
            continue
        prior = priors[loc.method]
        out.append(moderate(loc, NO_PRIOR if variance_p(loc, prior) < OWN_VARIANCE_P else prior))
    counts = {m: sum(1 for loc in locs if loc is not None and loc.method is m) for m in Method}
    return out, priors[max(counts, key=lambda m: counts[m])]


@dataclass(frozen=True)
class Interval:
    """A 95% interval of a positive figure (a speedup, a ratio, a rate) made from an estimate in logs."""

    low: float | None
    high: float | None
    n: int
    method: str
    df: float | None
    moderated: bool
    confidence: float = CONFIDENCE

    @property
    def available(self) -> bool:
        return self.low is not None and self.high is not None

    def half_width(self, estimate: float | None) -> float | None:
        """The larger distance from the estimate to either end, as a fraction of the estimate."""
        if not self.available or not estimate:
            return None
        return max(self.high / estimate - 1, 1 - self.low / estimate)

    @classmethod
    def of(cls, est: Estimate | None, confidence: float = CONFIDENCE) -> Interval:
        if est is None or math.isnan(est.df):
            return cls(None, None, 0 if est is None else est.n, "none", None, False, confidence)
        lo, hi = est.interval(confidence)
        return cls(math.exp(lo), math.exp(hi), est.n, est.method.value, None if math.isinf(est.df) else est.df,
                   est.moderated, confidence)


def combine(parts: Sequence[Estimate], weights: Sequence[float] | None = None) -> Estimate | None:
    """A weighted mean of independent estimates (default: equal weights), with Welch-Satterthwaite degrees of
    freedom; the geometric mean over tasks is this on logs."""
    if not parts:
        return None
    w = np.full(len(parts), 1 / len(parts)) if weights is None else np.asarray(weights, dtype=float)
    est = float(np.dot(w, [p.estimate for p in parts]))
    terms = [(wi * p.se) ** 2 for wi, p in zip(w, parts, strict=True)]
    var = sum(terms)
    if var == 0:
        return Estimate(est, 0.0, math.inf, min(p.n for p in parts), parts[0].method, False)
    den = sum(t * t / p.df for t, p in zip(terms, parts, strict=True) if t > 0 and math.isfinite(p.df))
    df = var * var / den if den > 0 else math.inf
    return Estimate(est, math.sqrt(var), df, min(p.n for p in parts), parts[0].method,
                    any(p.moderated for p in parts))


def difference(b: Estimate, a: Estimate) -> Estimate:
    """b - a of two independent estimates (B/A in logs), Welch-Satterthwaite degrees of freedom."""
    d = combine([b, a], [1.0, -1.0])
    assert d is not None
    return d


def holm(pvalues: Sequence[float], alpha: float = ALPHA) -> list[bool]:
    """Holm's step-down procedure: which hypotheses are rejected with family-wise error rate alpha."""
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
    m = len(pvalues)
    out = [False] * m
    for rank, i in enumerate(order):
        if pvalues[i] > alpha / (m - rank):
            break
        out[i] = True
    return out


def holm_adjusted(pvalues: Sequence[float]) -> list[float]:
    """Holm-adjusted p-values (the smallest family-wise level at which each hypothesis is rejected)."""
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
    m = len(pvalues)
    out = [1.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        out[i] = running
    return out
