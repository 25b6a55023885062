"""Paired speedups and their verdicts, judged as one family per table.

Each round runs every cell once in shuffled order, so a round is a block: a strategy's tok/s is divided by its
baseline's tok/s on the same task and prompt, on the same host, in the same round, and whatever the machine did to
the whole round cancels. A task with several prompts pairs each prompt with itself; the round's log ratio is the
mean over its prompts.

A cell's speedup is exp(location) of its per-round log ratios (harness/analysis/inference.py: the mean below
TRIM_FROM rounds, the 20%-trimmed mean from there), with a 95% interval whose variance is the strategy's
run-to-run variance plus its baseline's (each side's residuals after removing the round's common factor, estimated
from the host's other units), each part moderated toward the noise of its kind on the same host. The geometric
mean over tasks is the mean of the cells' locations, its interval made from the same cells' standard errors:
estimate and interval of one quantity, for these prompts. Beside it, an interval for tasks like these: the spread
of the per-task speedups over tasks (inference.between), which also counts how much tasks differ.

Marks. Every cell and every geometric mean with at least MIN_ROUNDS paired rounds contributes two hypotheses to its
table's family: "no difference" (rejected: faster or slower) and "a difference of at least EQUIVALENCE_BAND"
(rejected: equivalent, by two one-sided tests). Holm's procedure over the whole printed table, cells and geometric
means together, decides which are rejected, so all the marks of a table are right in 95% of tables. `Power` says
what the rounds could have marked."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from scipy import stats as sps

from harness.analysis import inference as inf
from harness.analysis.records import CellIndex, CellKey

#: Speedups whose rounds a table's power line counts (the smallest marked and the rounds needed).
POWER_TARGETS = (1.10,)

#: Speedups within this fraction of 1 (in log terms) are practically equal.
EQUIVALENCE_BAND = 0.02
#: Fewest paired rounds for an interval and a verdict: with two, one value's noise decides everything.
MIN_ROUNDS = 3


class Verdict(StrEnum):
    FASTER = "faster"
    SLOWER = "slower"
    EQUIVALENT = "equivalent"
    NOT_SIGNIFICANT = "not significant"
    TOO_FEW = "too few rounds"


@dataclass(frozen=True)
class Judgement:
    """A verdict and the evidence behind it: the raw p-values, the Holm-adjusted p-value of the claim made (or of
    the likelier claim when none is), and the size of the family it was judged in."""

    verdict: Verdict
    p_differs: float | None = None
    p_within: float | None = None
    p_adjusted: float | None = None
    family: int = 0
    band: float = EQUIVALENCE_BAND
    smallest: float | None = None  # the smallest |log speedup| this cell's rounds could mark (inference)


@dataclass(frozen=True)
class Speedup:
    """A strategy's speedup over its baseline on one task, or the geometric mean over tasks (task None)."""

    host: str
    strategy: str
    task: str | None
    baseline: str
    estimate: float | None
    interval: inf.Interval
    judgement: Judgement
    rounds: dict[int, float] = field(default_factory=dict)  # round -> paired ratio (cells only)
    tasks: tuple[str, ...] = ()  # what a geometric mean averages
    left_out: tuple[str, ...] = ()  # tasks a geometric mean leaves out (fewer than MIN_ROUNDS rounds)
    est: inf.Estimate | None = None
    between: inf.Interval | None = None  # a geometric mean's interval for tasks like these (random effects)

    @property
    def verdict(self) -> Verdict:
        return self.judgement.verdict

    @property
    def n(self) -> int:
        return self.interval.n

    def family_interval(self) -> inf.Interval | None:
        """The interval at the family's first Holm step (confidence 1 - alpha / tests: Bonferroni's, which Holm's
        marks never ask more than), None where the speedup was not judged. An unmarked "differs from 1" always has
        this interval include 1, whatever its 95% interval says."""
        j = self.judgement
        if not j.family or self.est is None or not self.est.testable:
            return None
        return inf.Interval.of(self.est, 1 - inf.ALPHA / j.family)


def paired_logs(index: CellIndex, key: CellKey, baseline: str) -> dict[int, float]:
    """Per round, the mean over the cell's prompts of log(strategy tok/s / baseline tok/s), each prompt paired
    with itself in the same round on the same host (a prompt's median where a round holds several records)."""
    s = _by_round_prompt(index, key)
    b = _by_round_prompt(index, CellKey(key.host, baseline, key.task))
    per: dict[int, list[float]] = defaultdict(list)
    for rp in sorted(s.keys() & b.keys()):
        per[rp[0]].append(math.log(s[rp] / b[rp]))
    return {rd: statistics.fmean(v) for rd, v in sorted(per.items())}


def _by_round_prompt(index: CellIndex, key: CellKey) -> dict[tuple[int, str], float]:
    by: dict[tuple[int, str], list[float]] = defaultdict(list)
    for m in index.used(key):
        by[(m.round, m.prompt)].append(float(m.tok_s))
    return {k: statistics.median(v) for k, v in by.items()}


@dataclass(frozen=True)
class Power:
    """What a table's rounds could mark (inference.smallest_marked at the family's first step, `family` its tests):
    the smallest speedup a cell of median noise would be marked faster with (its slowdown counterpart is the
    reciprocal), the same at the noisiest quarter's edge and for the geometric means, and the rounds a cell of the
    table's median noise would need for each of POWER_TARGETS (`rounds_for`), with the range those rounds take
    over the uncertainty of that median (`rounds_range`: the rounds at the median's 95% order-statistic bounds)."""

    family: int
    rounds: int
    cells: float | None
    noisiest: float | None
    geomeans: float | None
    rounds_for: dict[float, int | None]
    rounds_range: dict[float, tuple[int | None, int | None]] = field(default_factory=dict)
    half: float | None = None  # the speedup a cell of the median noise is marked with about half the time
    noise: float | None = None  # the table's median per-round variance the projection uses (`Noise.variance`)


@dataclass(frozen=True)
class Noise:
    """A table's noise per paired round: `variance` the median over its judged cells of one round's log-ratio
    variance, `low`/`high` that median's 95% order-statistic bounds, and `df_share` the median of the cells'
    moderated degrees of freedom over their own (what moderation adds, per own degree of freedom)."""

    variance: float
    low: float
    high: float
    df_share: float
    family: int


def winsorized_share(n: int) -> float:
    """A winsorized variance (inference.spread from TRIM_FROM values) over the variance of the same normal values:
    the expected share at the trimming n gives, g = floor(TRIM n) values replaced at each end."""
    if n < inf.TRIM_FROM:
        return 1.0
    g = math.floor(inf.TRIM * n) / n
    z = float(sps.norm.isf(g))
    return (1 - 2 * g) - 2 * z * float(sps.norm.pdf(z)) + 2 * g * z * z


def table_noise(cells: Sequence[Speedup], family: int) -> Noise | None:
    """The median per-round variance of the paired log ratios of the cells with at least MIN_ROUNDS rounds (see
    `Noise`): each cell's sample variance over its rounds, the median over cells divided by the median of a
    chi-square over its degrees of freedom at the cells' median rounds (a median of sample variances falls below
    the variance: at 3 rounds by 31%)."""
    use = [s for s in cells if s.est is not None and s.est.testable and s.n >= MIN_ROUNDS and len(s.rounds) >= 2]
    if not use:
        return None
    v = sorted(statistics.variance([math.log(r) for r in s.rounds.values()]) for s in use)
    k, n = len(v), int(statistics.median(len(s.rounds) for s in use))
    bias = float(sps.chi2.median(n - 1)) / (n - 1)
    half = 1.96 * math.sqrt(k) / 2  # ranks of the median's 95% bounds (normal approximation to the binomial)
    lo, hi = max(0, math.floor(k / 2 - half)), min(k - 1, math.ceil(k / 2 + half) - 1)
    shares = [s.est.df / inf.shape(s.n)[1] for s in use if inf.shape(s.n)[1] > 0]
    return Noise(statistics.median(v) / bias, v[lo] / bias, v[hi] / bias,
                 statistics.median(shares) if shares else 1.0, family)


@dataclass(frozen=True)
class SpeedupTable:
    """Every cell's speedup and each strategy's geometric mean over tasks, per host, with the priors used; cells and
    geometric means are one family."""

    cells: dict[CellKey, Speedup]
    geomeans: list[Speedup]
    priors: dict[str, inf.Priors]
    band: float

    @property
    def family_size(self) -> int:
        """Tests in the table's family (two per judged cell and geometric mean)."""
        return next((s.judgement.family for s in [*self.cells.values(), *self.geomeans] if s.judgement.family), 0)

    def power(self) -> Power:
        """What these rounds could mark (see `Power`)."""
        judged = [s for s in self.cells.values() if s.judgement.smallest is not None]
        geo = [g.judgement.smallest for g in self.geomeans if g.judgement.smallest is not None]
        fam = self.family_size
        if not judged:
            return Power(fam, 0, None, None, None, {t: None for t in POWER_TARGETS})
        small = sorted(s.judgement.smallest for s in judged)
        noise = table_noise(judged, fam)
        need = {t: rounds_to_mark(noise, math.log(t)) for t in POWER_TARGETS}
        spread = {t: (rounds_to_mark(noise, math.log(t), "low"), rounds_to_mark(noise, math.log(t), "high"))
                  for t in POWER_TARGETS}
        rounds = int(statistics.median(s.n for s in judged))
        half = half_marked(noise, rounds)
        return Power(fam, rounds, math.exp(small[len(small) // 2]),
                     math.exp(small[(3 * len(small)) // 4]), math.exp(statistics.median(geo)) if geo else None,
                     need, spread, None if half is None else math.exp(half), None if noise is None else noise.variance)


def half_marked(noise: Noise | None, rounds: int) -> float | None:
    """The |log effect| a cell of the table's median noise is marked with about half the time at these rounds: the
    family's first-step quantile times the cell's true standard error times the median of sqrt(chi-square/df) (an
    estimate's standard error is below the truth in more than half of the draws with few degrees of freedom, so
    more than half are marked at the bare quantile: 63-74% at 3 unmoderated rounds). None without a noise."""
    if noise is None or rounds < MIN_ROUNDS:
        return None
    f, d = inf.shape(rounds)
    df = min(d * noise.df_share, inf.MAX_DF)
    se = math.sqrt(noise.variance * winsorized_share(rounds) * f)
    small = inf.smallest_marked(inf.Estimate(0.0, se, df, rounds, inf.Method.MEAN, True), noise.family)
    return None if small is None else small * math.sqrt(float(sps.chi2.median(df)) / df)


def rounds_to_mark(noise: Noise | None, effect: float, at: str = "variance", limit: int = 200) -> int | None:
    """Rounds a cell of the table's median noise (`at`: or of its 95% bounds, "low"/"high") would need for `effect`
    (log) to be the smallest it could mark at the family's first step, so that about half of the cells with that
    effect are marked: at m rounds its standard error is that variance times the location's factor (a trimmed
    mean's scale the winsorized share of it, `winsorized_share`), its degrees of freedom m's own times the table's
    moderation share, at most MAX_DF (None: not within `limit`).
    bench/rounds_projection.py checks the share marked by simulation."""
    if noise is None:
        return None
    var = getattr(noise, at)
    for m in range(MIN_ROUNDS, limit + 1):
        f, d = inf.shape(m)
        scale = var * winsorized_share(m)
        e = inf.Estimate(0.0, math.sqrt(scale * f), min(d * noise.df_share, inf.MAX_DF), m,
                         inf.Method.TRIMMED if m >= inf.TRIM_FROM else inf.Method.MEAN, True)
        small = inf.smallest_marked(e, noise.family)
        if small is not None and small <= effect:
            return m
    return None


def _series(index: CellIndex, host: str) -> dict[tuple[str, str, str], dict[int, float]]:
    """Every unit of a host (strategy, task, prompt) with its log tok/s per round."""
    out: dict[tuple[str, str, str], dict[int, float]] = defaultdict(dict)
    for k in index.keys:
        if k.host == host:
            for (rd, prompt), v in _by_round_prompt(index, k).items():
                out[(k.strategy, k.task, prompt)][rd] = math.log(v)
    return out


def _paired(index: CellIndex, key: CellKey, baseline: str, effects: inf.RoundEffects) -> inf.Paired:
    """A cell's paired log ratios per round with its two sides' residuals in the same rounds (None where the round
    factor cannot be estimated without the cell's own units)."""
    s = _by_round_prompt(index, key)
    b = _by_round_prompt(index, CellKey(key.host, baseline, key.task))
    common = sorted(s.keys() & b.keys())
    mine = frozenset({(key.strategy, key.task, p) for _, p in s} | {(baseline, key.task, p) for _, p in b})
    factors = effects.factors(mine)
    rounds = sorted({rd for rd, _ in common})
    logs = [statistics.fmean(math.log(s[rp] / b[rp]) for rp in common if rp[0] == rd) for rd in rounds]
    if factors is None:
        return inf.Paired(logs, baseline_key=(baseline, key.task))
    res_s = {p: effects.residuals((key.strategy, key.task, p), factors) for _, p in common}
    res_b = {p: effects.residuals((baseline, key.task, p), factors) for _, p in common}
    side_s = [statistics.fmean(res_s[p][rd] for r2, p in common if r2 == rd) for rd in rounds]
    side_b = [statistics.fmean(res_b[p][rd] for r2, p in common if r2 == rd) for rd in rounds]
    return inf.Paired(logs, side_s, side_b, (baseline, key.task))


def table(index: CellIndex, baselines: Mapping[str, str | None], band: float = EQUIVALENCE_BAND) -> SpeedupTable:
    """The speedups of every cell that has a baseline and each strategy's geometric mean, judged as one family."""
    keys = [k for k in index.keys if baselines.get(k.strategy)]
    logs = {k: paired_logs(index, k, baselines[k.strategy]) for k in keys}
    ests: dict[CellKey, inf.Estimate | None] = {}
    priors: dict[str, inf.Priors] = {}
    for host in index.hosts:
        hk = [k for k in keys if k.host == host]
        effects = inf.RoundEffects(_series(index, host))
        found, priors[host] = inf.paired_estimates([_paired(index, k, baselines[k.strategy], effects) for k in hk])
        ests.update(zip(hk, found, strict=True))
    return _table(logs, ests, baselines, priors, band)


def table_of(logs: Mapping[CellKey, dict[int, float]], baselines: Mapping[str, str | None], hosts: Sequence[str],
             band: float = EQUIVALENCE_BAND) -> SpeedupTable:
    """A table of paired log ratios per cell and round of any other paired comparison (one build against another):
    each cell's whole paired variance moderated toward its host's cells (no round factor to take out: the two
    sides are not a strategy and its baseline), the cells and geometric means judged as one family."""
    ests: dict[CellKey, inf.Estimate | None] = {}
    priors: dict[str, inf.Priors] = {}
    for host in hosts:
        hk = [k for k in logs if k.host == host]
        found, priors[host] = inf.paired_estimates([inf.Paired(list(logs[k].values())) for k in hk])
        ests.update(zip(hk, found, strict=True))
    return _table(logs, ests, baselines, priors, band)


def _table(logs: Mapping[CellKey, dict[int, float]], ests: Mapping[CellKey, inf.Estimate | None],
           baselines: Mapping[str, str | None], priors: dict[str, inf.Priors], band: float) -> SpeedupTable:
    cells = {}
    for k in logs:
        e = ests[k]
        ok = e is not None and e.n >= MIN_ROUNDS
        cells[k] = Speedup(k.host, k.strategy, k.task, baselines[k.strategy],
                           math.exp(e.estimate) if e is not None else None,
                           inf.Interval.of(e) if ok else _none(e), Judgement(Verdict.TOO_FEW),
                           {rd: math.exp(v) for rd, v in logs[k].items()}, (k.task,), (), e)
    geos = geomeans(cells)
    return SpeedupTable(*_judged(cells, geos, band), priors, band)


def _judgeable(s: Speedup) -> bool:
    return s.est is not None and s.n >= MIN_ROUNDS and s.est.testable


def _judged(cells: dict[CellKey, Speedup], geos: list[Speedup], band: float
            ) -> tuple[dict[CellKey, Speedup], list[Speedup]]:
    """Cells and geometric means with their judgements, all of them one family."""
    items = [*cells.values(), *geos]
    judged = [s for s in items if _judgeable(s)]
    verdicts = judge([s.est for s in judged], band)
    by_id = {id(s): verdicts[i] for i, s in enumerate(judged)}

    def with_verdict(s: Speedup) -> Speedup:
        j = by_id.get(id(s))
        return s if j is None else Speedup(**{**s.__dict__, "judgement": j})

    return {k: with_verdict(s) for k, s in cells.items()}, [with_verdict(g) for g in geos]


def _none(e: inf.Estimate | None) -> inf.Interval:
    return inf.Interval(None, None, 0 if e is None else e.n, "none", None, False)


def judge(ests: Sequence[inf.Estimate], band: float) -> dict[int, Judgement]:
    """One family: for each estimate, "differs from 0" and "within ±band" (logs, two one-sided tests), Holm over
    all of them."""
    if not ests:
        return {}
    lb = math.log1p(band)
    pd = [e.p_differs() for e in ests]
    pw = [e.p_equivalent(lb) for e in ests]
    m = len(ests)
    adj = inf.holm_adjusted(pd + pw)
    out = {}
    for i, e in enumerate(ests):
        a_d, a_w = adj[i], adj[m + i]
        if a_w <= inf.ALPHA:
            v, a = Verdict.EQUIVALENT, a_w
        elif a_d <= inf.ALPHA:
            v, a = (Verdict.FASTER if e.estimate > 0 else Verdict.SLOWER), a_d
        else:
            v, a = Verdict.NOT_SIGNIFICANT, min(a_d, a_w)
        out[i] = Judgement(v, pd[i], pw[i], a, 2 * m, band, inf.smallest_marked(e, 2 * m))
    return out


def geomeans(cells: Mapping[CellKey, Speedup]) -> list[Speedup]:
    """Per host and strategy, the geometric mean over the tasks with at least MIN_ROUNDS paired rounds (the
    others are named, left out), with its interval for these prompts and, beside it, for tasks like these; not yet
    judged (the table judges them with its cells)."""
    groups: dict[tuple[str, str], list[Speedup]] = defaultdict(list)
    for s in cells.values():
        groups[(s.host, s.strategy)].append(s)
    out = []
    for (host, strategy), ss in groups.items():
        use = [s for s in ss if _judgeable(s)]
        est = inf.combine([s.est for s in use]) if use else None
        tasks = inf.between([s.est.estimate for s in use])
        out.append(Speedup(host, strategy, None, ss[0].baseline, None if est is None else math.exp(est.estimate),
                           inf.Interval.of(est) if est is not None else _none(None), Judgement(Verdict.TOO_FEW),
                           {}, tuple(s.task for s in use), tuple(s.task for s in ss if s not in use), est,
                           inf.Interval.of(tasks) if tasks is not None else None))
    return out
