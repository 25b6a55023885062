"""The numbers behind every verdict: where a cell's log values lie (location and its standard error), how much
the other cells of the same table say about its noise (empirical-Bayes moderation), intervals, p-values, the
family-wise rule that turns many p-values into marks, the smallest effect a table could mark, and the test that
calls one unit noisier than the run.

Pure functions of floats; nothing here knows about records, cells or runs.

- Location. Below TRIM_FROM values: the mean of the logs (a geometric mean), standard error s/sqrt(n). From
  TRIM_FROM on: the 20%-trimmed mean of the logs with the Tukey-McLaughlin standard error (the winsorized
  variance over (1-2g)^2 n): one slow outlier among ten rounds moves it little, as it moves a median little,
  and the interval and the test are of the same estimate. The winsorized variance carries fewer degrees of freedom
  than the h - 1 of Yuen's test: under normal noise the studentized trimmed mean has the tails of a t with
  TRIMMED_DF_SHARE x (h - 1) (measured at 10-30 values; with h - 1 a 5% test rejected 1.1-1.3x as often as it
  should and a 0.05% test 1.6-2.2x). `python3 bench/interval_coverage.py` measures both.
- Two parts of a paired variance. A speedup's log ratio in a round is the strategy's log tok/s minus its
  baseline's, so its variance is the strategy's run-to-run variance plus the baseline's; the baseline's part is
  shared by every strategy on that task. Where the run has enough other cells to estimate each round's common
  factor (RoundEffects: every unit's deviation from its own mean, the round's median deviation over the other
  units), each side's residuals give its own part, with the cell's degrees of freedom each: together up to twice
  what the paired ratios alone carry. Each part is moderated on its own, the baseline parts among baselines, and
  the cell's variance is their sum with Satterthwaite's degrees of freedom. Leaving the cell's own units out of the
  round factor keeps the sum from understating: an error in the factor adds to both parts. Where the round
  factor cannot be estimated (fewer than MIN_ROUND_UNITS other units in a round) the cell's whole paired variance
  is moderated among the cells in the same case.
- Moderation (Smyth 2004, limma's eBayes, made robust). The variances of a table's cells are taken as draws from
  a scaled inverse chi-square prior (d0, s0^2), fitted to the central cells only: the median and the interquartile
  range of the log variances are matched to those of s0^2 F(d, d0), so that the noisiest and the quietest quarter
  do not move it. Its weight d0 is at most PRIOR_WEIGHT x the cells' own degrees of freedom (BASELINE_PRIOR_WEIGHT
  for the baseline parts, fitted on a handful of baselines each shared by many cells): fitted on tables whose
  cells differ in noise, an unbounded weight made the noisiest cells' intervals too narrow. A cell quieter than the
  prior's scale is moderated to (d0 s0^2 + d s^2) / (d0 + d), with Satterthwaite's degrees of freedom for that
  weighted sum (d0 for the table's part, d for the cell's): one that borrows most of its variance has about as many
  as the prior's weight, so a noisy cell quiet by chance in its few rounds is not trusted as if its variance were
  known. A cell noisier than the prior's scale keeps its own variance and its own degrees of freedom: its interval
  is never narrower than its own evidence gives (measured: granting it Satterthwaite's degrees of freedom instead
  left the noisiest quarter of a sweep's cells at 92% coverage). `python3 bench/interval_coverage.py` measures the
  coverage by noise quartile with heterogeneous noise.
- Family. Holm's step-down procedure over every p-value of one printed table: each cell's and each geometric
  mean's "differs from 1" and "within the band". In 95% of tables no mark at all is false, whatever the number of
  cells (Holm 1979). Chosen over Benjamini-Hochberg because a reader takes each mark on its own: a false-discovery
  rate of 5% would still leave a false mark in most large tables. (Shaffer's bound, which counts a cell's two
  mutually exclusive hypotheses once, would halve the first step's divisor; on simulated A/A tables it left no
  margin below 5% for the tails of moderated intervals.)
- Equivalence: two one-sided tests at 5% each (TOST, Schuirmann 1987): "within the band" is claimed when the 90%
  interval lies inside it (at the family's level: inside the correspondingly wider interval).
- Power (`smallest_marked`): the smallest true effect whose estimate, landing on the truth, these rounds would mark
  at the first step of the family, from the cell's standard error and degrees of freedom.
- Instability (`noisier_p`): each unit's largest deviation from its own median against the run's deviations,
  modelled as a Student t whose scale and tail weight are fitted to every unit's (maximum likelihood): heavy-tailed
  noise of one scale everywhere raises the fitted tail weight, not the flags, and one run 3x slower than its
  unit's others still stands out of light-tailed noise. Replaces a variance F-test against the table's prior,
  which heavy tails fooled.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache

import numpy as np
from scipy import special
from scipy import stats as sps

from harness import formatter as fm
from harness.store import shapes

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
#: The trimmed mean's degrees of freedom as a share of Yuen's h - 1 (see the module docstring).
TRIMMED_DF_SHARE = 0.8
#: The prior's weight d0 at most, in multiples of the cells' own degrees of freedom (strategy parts and single
#: variances); chosen with bench/interval_coverage.py: larger weights gain power where noise is alike and cost
#: coverage of the noisiest cells where it is not.
PRIOR_WEIGHT = 4.0
#: The same for the baselines' parts: a table has few baselines (one per task), each shared by every strategy on
#: its task, so an error in their prior repeats across a whole column of cells (simulated on the demo's shape at
#: 3 rounds with heterogeneous noise: weight 1 drew about a third more A/A tables with a false mark than 0.5).
BASELINE_PRIOR_WEIGHT = 0.5
#: Fewest cells with a variance before a prior is fitted: fewer cannot say how much cells' variances differ.
MIN_PRIOR_CELLS = 6
#: Fewest other units measured in a round for its common factor to be estimated (the median of their deviations).
MIN_ROUND_UNITS = 4


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
    df: float
    factor: float
    n: int
    method: Method


def _finite(values: Sequence[float | None]) -> np.ndarray:
    return np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)


def locate(logs: Sequence[float | None]) -> Location | None:
    """Location of log values (see the module docstring); None without values."""
    x = np.sort(_finite(logs))
    n = len(x)
    if n == 0:
        return None
    factor, df = shape(n)
    if n < TRIM_FROM:
        return Location(float(np.mean(x)), spread(x), df, factor, n, Method.MEAN)
    g = int(math.floor(TRIM * n))
    return Location(float(np.mean(x[g:n - g])), spread(x), df, factor, n, Method.TRIMMED)


def spread(values: Sequence[float | None]) -> float:
    """The variance that goes with the location of these values (`shape`): below TRIM_FROM the sample variance,
    from there the winsorized variance; 0 for fewer than two values."""
    x = np.sort(_finite(values))
    n = len(x)
    if n < 2:
        return 0.0
    if n < TRIM_FROM:
        return float(np.var(x, ddof=1))
    g = int(math.floor(TRIM * n))
    wins = np.concatenate([np.full(g, x[g]), x[g:n - g], np.full(g, x[n - g - 1])])
    return float(np.var(wins, ddof=1))


def shape(n: int) -> tuple[float, float]:
    """(factor, degrees of freedom) of the location of n values: se^2 = scale2 x factor. Below TRIM_FROM the mean
    (1/n, n - 1); from there Tukey-McLaughlin's trimmed mean: the winsorized variance over (h/n)^2 n, with
    TRIMMED_DF_SHARE x (h - 1) degrees of freedom, h = n - 2g the values kept."""
    if n < TRIM_FROM:
        return 1.0 / max(n, 1), float(max(n - 1, 0))
    h = n - 2 * int(math.floor(TRIM * n))
    return 1.0 / ((h / n) ** 2 * n), TRIMMED_DF_SHARE * (h - 1)


@dataclass(frozen=True)
class Prior:
    """The table's noise: a scaled inverse chi-square prior of the cells' variances with weight d0 (pseudo degrees
    of freedom) and scale s0^2. d0 = 0: no prior (too few cells to fit one)."""

    d0: float
    s02: float
    cells: int

    @property
    def sd(self) -> float:
        return math.sqrt(self.s02)


NO_PRIOR = Prior(0.0, 0.0, 0)


@lru_cache(maxsize=4096)
def _log_f_quartiles(d: float, d0: float) -> tuple[float, float]:
    """(interquartile range, median) of log F(d, d0)."""
    q = np.log(sps.f.ppf([0.25, 0.5, 0.75], d, d0))
    return float(q[2] - q[0]), float(q[1])


#: The lightest prior weight the fit considers: below it the prior says nothing a cell's own variance does not.
_MIN_D0 = 0.1


def fit_prior(scales: Sequence[tuple[float, float]], weight: float = PRIOR_WEIGHT) -> Prior:
    """Fit (d0, s0^2) to cells' (variance, degrees of freedom) on the central cells: d0 so that the interquartile
    range of the log variances is that of log F(d, d0) (d the cells' median degrees of freedom), at most
    `weight` x d; s0^2 so that their median is that of s0^2 F(d, d0). Cells with zero degrees of freedom or zero
    variance say nothing and are left out."""
    pts = [(s2, d) for s2, d in scales if d > 0 and s2 > 0 and math.isfinite(s2)]
    if len(pts) < MIN_PRIOR_CELLS or weight <= 0:
        return NO_PRIOR
    logs = np.log([p[0] for p in pts])
    d = float(np.median([p[1] for p in pts]))
    q25, med, q75 = (float(v) for v in np.quantile(logs, [0.25, 0.5, 0.75]))
    iqr, cap = q75 - q25, max(weight * d, _MIN_D0)
    if iqr >= _log_f_quartiles(d, _MIN_D0)[0]:
        d0 = _MIN_D0
    elif iqr <= _log_f_quartiles(d, cap)[0]:
        d0 = cap
    else:  # the range falls as d0 grows: bisect on a log scale
        lo, hi = _MIN_D0, cap
        for _ in range(40):
            mid = math.sqrt(lo * hi)
            lo, hi = (mid, hi) if _log_f_quartiles(d, round(mid, 6))[0] > iqr else (lo, mid)
        d0 = math.sqrt(lo * hi)
    return Prior(d0, math.exp(med - _log_f_quartiles(d, round(d0, 6))[1]), len(pts))


def moderated(scale2: float, df: float, prior: Prior) -> tuple[float, float, bool]:
    """(variance, degrees of freedom, borrowed) of a variance moderated toward a prior. A cell quieter than the
    prior's scale takes (d0 s0^2 + d s^2) / (d0 + d) with Satterthwaite's degrees of freedom for that weighted sum,
    at most d0 + d and MAX_DF (`borrowed`); one noisier keeps its own variance and its own degrees of freedom. Without
    a prior, the cell's own."""
    if prior.d0 <= 0 or prior.s02 <= 0:
        return scale2, df, False
    d0 = min(prior.d0, MAX_DF)  # a prior is never worth more than the most degrees of freedom granted
    table, own = d0 * prior.s02, df * scale2
    post = (table + own) / (d0 + df)
    den = table * prior.s02 + own * scale2
    sat = (table + own) ** 2 / den if den > 0 else d0 + df
    if scale2 >= post:  # noisier than the table: its own variance with its own degrees of freedom
        return scale2, df, False
    return post, min(d0 + df, sat, MAX_DF), True


def pooled_df(own: float, prior: float) -> float:
    """Degrees of freedom of a variance moderated by a prior of weight `prior`: the sum, capped at MAX_DF, never
    below the cell's own (the most `moderated` grants)."""
    return max(float(own), min(MAX_DF, own + prior)) if prior else float(own)


#: A cell whose variance exceeds the table's prior at this level (one-sided F-test, not corrected) is treated as
#: not following the table where a caller must decide one way (harness/analysis/convergence.py).
OWN_VARIANCE_P = 0.10


def variance_p(loc: Location, prior: Prior) -> float:
    """One-sided p-value of "this cell's variance is the table's" against "it is larger" (F-test against the
    prior; 1 when there is no prior or no variance)."""
    if prior.d0 == 0 or loc.df <= 0 or prior.s02 <= 0:
        return 1.0
    return float(sps.f.sf(loc.scale2 / prior.s02, loc.df, prior.d0))


def _t_sf(z: float, df: float) -> float:
    """Upper tail of Student's t (the normal's for infinite df); scipy.special's, many times faster than
    scipy.stats' for one value."""
    return float(special.stdtr(df, -z)) if math.isfinite(df) else float(special.ndtr(-z))


def _t_isf(tail: float, df: float) -> float:
    """The t quantile with `tail` above it."""
    return float(-special.stdtrit(df, tail)) if math.isfinite(df) else float(-special.ndtri(tail))


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
        return _t_isf((1 - confidence) / 2, self.df)

    def interval(self, confidence: float = CONFIDENCE) -> tuple[float, float]:
        """The interval in logs."""
        if self.se == 0:
            return self.estimate, self.estimate
        h = self.t_quantile(confidence) * self.se
        return self.estimate - h, self.estimate + h

    def _sf(self, z: float) -> float:
        return _t_sf(z, self.df)

    def p_differs(self, null: float = 0.0) -> float:
        """Two-sided p-value of location == null."""
        if not self.testable:
            return 1.0
        if self.se == 0:
            return 0.0 if self.estimate != null else 1.0
        return min(1.0, 2 * self._sf(abs(self.estimate - null) / self.se))

    def p_equivalent(self, band: float) -> float:
        """p-value of |location| >= band by two one-sided tests (TOST): the larger of the two one-sided p-values,
        so that 'within the band' is claimed at 5% exactly when the 90% interval lies inside it."""
        if not self.testable:
            return 1.0
        if self.se == 0:
            return 0.0 if abs(self.estimate) < band else 1.0
        lower = self._sf((self.estimate + band) / self.se)
        upper = self._sf((band - self.estimate) / self.se)
        return min(1.0, max(lower, upper))

    def p_within(self, band: float) -> float:
        """p-value of |location| >= band, the stricter form: twice the TOST p-value, so that the claim is made at
        5% exactly when the 95% interval lies inside the band (what a comparison's 'reproduces' asks)."""
        return min(1.0, 2 * self.p_equivalent(band))

    def p_outside(self, band: float) -> float:
        """p-value of |location| <= band: the claim 'a difference beyond the band' is made exactly when the 95%
        interval lies wholly outside it."""
        if not self.testable:
            return 1.0
        if self.se == 0:
            return 0.0 if abs(self.estimate) > band else 1.0
        return min(1.0, 2 * self._sf((abs(self.estimate) - band) / self.se))


def moderate(loc: Location, prior: Prior) -> Estimate:
    """The location's standard error with its variance moderated toward the table's prior (`moderated`)."""
    if prior.d0 == 0:
        df = float(loc.df) if loc.df > 0 else math.nan
        return Estimate(loc.estimate, math.sqrt(loc.scale2 * loc.factor), df, loc.n, loc.method, False)
    var, df, borrowed = moderated(loc.scale2, loc.df, prior)
    return Estimate(loc.estimate, math.sqrt(var * loc.factor), df, loc.n, loc.method, borrowed)


def fit_priors(locs: Sequence[Location | None]) -> dict[Method, Prior]:
    """A prior per kind of location (means and trimmed means scale their variances differently)."""
    return {m: fit_prior([(loc.scale2, loc.df) for loc in locs if loc is not None and loc.method is m])
            for m in Method}


def _most_numerous(methods: Sequence[Method]) -> Method:
    counts = {m: sum(1 for x in methods if x is m) for m in Method}
    return max(counts, key=lambda m: counts[m])


def estimates(locs: Sequence[Location | None]) -> tuple[list[Estimate | None], Prior]:
    """Every cell's moderated estimate under a prior fitted to the cells of its kind (means and trimmed means
    scale their variances differently, so each kind has its own prior). Returns the prior of the most numerous
    kind with them."""
    priors = fit_priors(locs)
    out = [None if loc is None else moderate(loc, priors[loc.method]) for loc in locs]
    return out, priors[_most_numerous([loc.method for loc in locs if loc is not None])]


class RoundEffects:
    """Each round's common factor over a host's units (a unit: one strategy, task and prompt; its log tok/s per
    round), so that a unit's run-to-run noise can be told from what the machine did to the whole round.

    A unit's level is its mean over its rounds after removing the rounds' factors, a round's factor the median
    over the units measured in it of their deviation from their level (alternated a few times: rounds missing in
    some units would otherwise tilt their levels). `factors` leaves chosen units (a cell's own) out of each round's
    median."""

    def __init__(self, series: Mapping[Hashable, Mapping[int, float]]):
        self.series = {u: dict(v) for u, v in series.items() if v}
        rounds = sorted({r for v in self.series.values() for r in v})
        rho = dict.fromkeys(rounds, 0.0)
        level: dict[Hashable, float] = {}
        for _ in range(5):
            level = {u: float(np.mean([x - rho[r] for r, x in v.items()])) for u, v in self.series.items()}
            rho = {r: float(np.median([v[r] - level[u] for u, v in self.series.items() if r in v])) for r in rounds}
        self.deviation = {u: {r: x - level[u] for r, x in v.items()} for u, v in self.series.items()}
        self._by_round = {r: [(u, d[r]) for u, d in self.deviation.items() if r in d] for r in rounds}

    def factors(self, leave_out: frozenset[Hashable]) -> dict[int, float] | None:
        """Each round's factor from the units not left out; None when a round has fewer than MIN_ROUND_UNITS."""
        out = {}
        for r, pairs in self._by_round.items():
            others = [d for u, d in pairs if u not in leave_out]
            if len(others) < MIN_ROUND_UNITS:
                return None
            out[r] = float(np.median(others))
        return out

    def residuals(self, unit: Hashable, factors: Mapping[int, float]) -> dict[int, float]:
        """A unit's deviation from its level in each of its rounds, less the round's factor."""
        return {r: d - factors[r] for r, d in self.deviation.get(unit, {}).items()}


@dataclass(frozen=True)
class Paired:
    """One cell's paired log ratios per round and, where the round factor could be removed, the two sides'
    residuals in the same rounds (strategy, baseline); `baseline_key` names the baseline series (its strategy and
    task) so that a baseline shared by many cells is one point of the baselines' prior."""

    logs: Sequence[float]
    strategy: Sequence[float] | None = None
    baseline: Sequence[float] | None = None
    baseline_key: Hashable = None


@dataclass(frozen=True)
class Priors:
    """The priors a table's paired cells were moderated with (of the most numerous kind of location): the
    strategies' parts, the baselines' parts, and whole paired variances where no round factor could be removed."""

    strategy: Prior
    baseline: Prior
    paired: Prior

    @property
    def main(self) -> Prior:
        return self.strategy if self.strategy.cells else self.paired


def paired_estimates(cells: Sequence[Paired]) -> tuple[list[Estimate | None], Priors]:
    """Every cell's estimate with its variance in two moderated parts where the residuals are there (see the module
    docstring), else its whole paired variance moderated among the cells without parts."""
    locs = [locate(c.logs) for c in cells]
    parts = [None if loc is None or c.strategy is None or c.baseline is None else
             (spread(c.strategy), spread(c.baseline)) for c, loc in zip(cells, locs, strict=True)]
    by_method: dict[Method, tuple[Prior, Prior, Prior]] = {}
    for m in Method:
        mine = [i for i, loc in enumerate(locs) if loc is not None and loc.method is m]
        with_parts = [i for i in mine if parts[i] is not None]
        base: dict[Hashable, tuple[float, float]] = {}
        for i in with_parts:  # one point per baseline series: the one seen with the most rounds
            if cells[i].baseline_key not in base or base[cells[i].baseline_key][1] < locs[i].df:
                base[cells[i].baseline_key] = (parts[i][1], locs[i].df)
        by_method[m] = (fit_prior([(parts[i][0], locs[i].df) for i in with_parts]),
                        fit_prior(list(base.values()), BASELINE_PRIOR_WEIGHT),
                        fit_prior([(locs[i].scale2, locs[i].df) for i in mine if parts[i] is None]))
    out: list[Estimate | None] = []
    for loc, part in zip(locs, parts, strict=True):
        if loc is None:
            out.append(None)
        elif part is None or loc.df <= 0:
            out.append(moderate(loc, by_method[loc.method][2]))
        else:
            out.append(_two_parts(loc, part, *by_method[loc.method][:2]))
    top = by_method[_most_numerous([loc.method for loc in locs if loc is not None])]
    return out, Priors(*top)


def _two_parts(loc: Location, part: tuple[float, float], strategy: Prior, baseline: Prior) -> Estimate:
    vs, ds, bs = moderated(part[0], loc.df, strategy)
    vb, db, bb = moderated(part[1], loc.df, baseline)
    var = vs + vb
    if var <= 0:
        return moderate(loc, NO_PRIOR)
    den = (vs * vs / ds if ds > 0 else 0.0) + (vb * vb / db if db > 0 else 0.0)
    df = min(var * var / den, MAX_DF) if den > 0 else loc.df
    return Estimate(loc.estimate, math.sqrt(var * loc.factor), df, loc.n, loc.method, bs or bb)


@dataclass(frozen=True)
class Figure:
    """A positive figure (a speedup, a ratio of two settings, an aggregate rate) with its 95% interval over `rounds`
    rounds, as the sweep and the serving study keep it."""

    estimate: float | None
    low: float | None
    high: float | None
    rounds: int

    def as_dict(self) -> shapes.FigureJson:
        return {"estimate": fm.rounded(self.estimate, 4), "low": fm.rounded(self.low, 4),
                "high": fm.rounded(self.high, 4), "rounds": self.rounds}


#: A figure with nothing to show (no rounds).
NO_FIGURE = Figure(None, None, None, 0)


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

    def bounds(self) -> shapes.BoundsJson:
        """Its ends and its confidence, as summary.json keeps an interval beside another."""
        return {"low": fm.rounded(self.low, 4), "high": fm.rounded(self.high, 4),
                "confidence": fm.rounded(self.confidence, 6)}

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


def between(logs: Sequence[float]) -> Estimate | None:
    """The mean of per-task log estimates as a sample of tasks: its standard error from their spread over tasks
    (s/sqrt(k), k - 1 degrees of freedom), a random-effects interval for tasks like these rather than for these
    prompts; None below two tasks."""
    x = _finite(logs)
    if len(x) < 2:
        return None
    return Estimate(float(np.mean(x)), float(np.std(x, ddof=1) / math.sqrt(len(x))), float(len(x) - 1), len(x),
                    Method.MEAN, False)


def difference(b: Estimate, a: Estimate) -> Estimate:
    """b - a of two independent estimates (B/A in logs), Welch-Satterthwaite degrees of freedom."""
    d = combine([b, a], [1.0, -1.0])
    assert d is not None
    return d


def holm(pvalues: Sequence[float], alpha: float = ALPHA) -> list[bool]:
    """Holm's step-down procedure: which hypotheses are rejected with family-wise error rate alpha."""
    return [p <= alpha for p in holm_adjusted(pvalues)]


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


def smallest_marked(est: Estimate, family: int, alpha: float = ALPHA) -> float | None:
    """The smallest |log effect| these rounds would mark in a family of `family` tests: an estimate landing on it
    has its two-sided p at the first Holm step, alpha / family; about half of the cells with that true effect are
    marked (with this standard error and these degrees of freedom). None without a standard error."""
    if not est.testable or family < 1:
        return None
    return _t_isf(alpha / (2 * family), est.df) * est.se


def noisier_p(groups: Sequence[Sequence[float]]) -> list[float]:
    """One-sided p-value per group (a unit's log values) of "its noise is the run's" against "it is noisier":
    its largest absolute deviation from its own median against the run's pooled deviations fitted as a Student t
    (scale and degrees of freedom by maximum likelihood; a median of an odd count deviates 0 from itself and is
    left out): p = 1 - (1 - P(|t| > largest))^k over its k deviations. Groups of fewer than 3 values get 1."""
    devs = []
    for g in groups:
        x = np.sort(_finite(g))
        if len(x) < 3:
            devs.append(None)
            continue
        d = x - float(np.median(x))
        devs.append(d[np.abs(d) > 0] if len(x) % 2 else d)
    pool = np.concatenate([d for d in devs if d is not None and len(d)] or [np.zeros(0)])
    if len(pool) < 2 * MIN_PRIOR_CELLS or not np.any(pool):
        return [1.0] * len(groups)
    nu, _, scale = sps.t.fit(pool, floc=0)
    nu = max(float(nu), 0.5)
    out = []
    for d in devs:
        if d is None or not len(d):
            out.append(1.0)
            continue
        one = 2 * float(sps.t.sf(float(np.max(np.abs(d))) / scale, nu))
        out.append(float(-np.expm1(len(d) * np.log1p(-min(one, 1.0)))) if one < 1 else 1.0)
    return out
