"""Run B judged against run A on what transfers between machines: per cell the ratio of the two speedups, B/A,
with its 95% interval, against the cell margin (default twice the headline margin); per strategy the same for
the geometric mean over tasks against the headline margin (default ±5%); and the deterministic fingerprint
(draft counts and output hashes).

- One estimator on both sides. A cell's speedup is the 20%-trimmed geometric mean of its paired ratios only
  where both runs have TRIM_FROM rounds or more, else the geometric mean in both runs (the report switches per
  run, and a mean against a trimmed mean compares two quantities when the ratios are skewed). The variances are
  moderated within each run, as its report does (harness/analysis/inference.py).
- reproduces: the B/A interval lies inside the band (two one-sided tests). The headline says "reproduces" only
  when every strategy's geometric mean reproduces within ±margin and every cell within ±cell margin (an
  intersection-union test: each part at 5%, no correction needed), no cell is missing in B and no fingerprint
  differs. A cell is one prompt's sample of a task and noisier than a geometric mean, hence its wider band; but
  no cell is passed over: one regressed task keeps the headline from "reproduces".
- geometric means reproduce: they all do, but some cells are unresolved (inconclusive at the cell margin,
  without an interval, missing in B) or a fingerprint differs; the headline counts them and names the worst: the
  cell with the strongest evidence of a difference beyond the cell margin (the smallest p of "within it").
- differs: a B/A interval lies wholly outside its band, judged as one family over every cell and geometric mean
  with Holm's procedure, so independent replicates of one truth say "differs" in at most 5% of comparisons.
- inconclusive otherwise; the headline then says the smallest margins these rounds could confirm, and how many
  rounds B would need for the asked ones (the B/A interval shrinks about as 1/sqrt(rounds)).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import NamedTuple

import numpy as np
from scipy import stats as sps

from harness.analysis import inference as inf
from harness.analysis import speedups as sp
from harness.analysis.contamination import Fingerprint
from harness.analysis.records import CellKey
from harness.analysis.stats import CellStats, RunStats

#: Two runs' speedups whose B/A interval lies within this band reproduce each other.
REPRODUCE_MARGIN = 0.05
#: The cell margin is this many times the headline margin unless given: a cell is one prompt's sample of a task,
#: about as noisy as the geometric mean of several times as many rounds.
CELL_MARGIN_FACTOR = 2.0


def default_cell_margin(margin: float) -> float:
    """The cell margin when none is given: CELL_MARGIN_FACTOR times the headline margin."""
    return CELL_MARGIN_FACTOR * margin


class Call(StrEnum):
    REPRODUCES = "reproduces"
    GEOMEANS_REPRODUCE = "geometric means reproduce"
    DIFFERS = "differs"
    INCONCLUSIVE = "inconclusive"
    MISSING = "missing"
    BASELINE = "n/a"
    NOT_COMPARABLE = "not comparable"


class RowKey(NamedTuple):
    """Where a row of the reproduction table sits: a cell (records.CellKey), or with task None a strategy's geometric
    mean over the tasks."""

    host: str
    strategy: str
    task: str | None


class Match(StrEnum):
    IDENTICAL = "identical"
    DIFFER = "differ"
    MISSING = "missing"


@dataclass(frozen=True)
class Row:
    """One cell (or, with task None, one strategy's geometric mean) of A against B: both speedups by the same
    estimator, B/A with its interval, and the call against `margin` (the cell margin for a cell)."""

    key: RowKey
    call: Call
    margin: float
    est_a: inf.Estimate | None = None  # A's speedup (or geometric mean) in logs
    est_b: inf.Estimate | None = None
    est: inf.Estimate | None = None  # B/A in logs
    n_a: int = 0  # paired rounds
    n_b: int = 0
    point_a: float | None = None  # a speedup without an estimate to judge (too few rounds): its point value
    point_b: float | None = None
    p_within: float | None = None
    p_outside: float | None = None
    p_adjusted: float | None = None  # Holm-adjusted p of "differs"
    fingerprint: Match = Match.MISSING
    fingerprint_a: Fingerprint | None = None
    fingerprint_b: Fingerprint | None = None
    tok_s_ratio: float | None = None
    tasks: tuple[str, ...] = ()

    @property
    def host(self) -> str:
        return self.key.host

    @property
    def strategy(self) -> str:
        return self.key.strategy

    @property
    def task(self) -> str | None:
        return self.key.task

    @property
    def speedup_a(self) -> float | None:
        return math.exp(self.est_a.estimate) if self.est_a is not None else self.point_a

    @property
    def speedup_b(self) -> float | None:
        return math.exp(self.est_b.estimate) if self.est_b is not None else self.point_b

    @property
    def interval_a(self) -> inf.Interval | None:
        return inf.Interval.of(self.est_a) if self.est_a is not None else None

    @property
    def interval_b(self) -> inf.Interval | None:
        return inf.Interval.of(self.est_b) if self.est_b is not None else None

    @property
    def ratio(self) -> float | None:
        if self.est is not None:
            return math.exp(self.est.estimate)
        a, b = self.speedup_a, self.speedup_b
        return b / a if a and b else None

    @property
    def interval(self) -> inf.Interval | None:
        return inf.Interval.of(self.est) if self.est is not None else None

    @property
    def reach(self) -> float | None:
        """The smallest margin this row's B/A interval lies within (None without one)."""
        iv = self.interval
        if iv is None or not iv.available:
            return None
        return math.expm1(max(abs(math.log(iv.low)), abs(math.log(iv.high))))


@dataclass(frozen=True)
class Reproduction:
    margin: float
    cell_margin: float
    rows: list[Row]
    geomeans: list[Row]
    call: Call
    family: int
    smallest_margin: float | None  # the smallest margin every geometric mean's interval lies within
    cell_smallest_margin: float | None  # the same over the cells that have a B/A interval
    rounds_needed: int | None  # B's rounds for the geometric means at the margin (None: out of reach)
    cell_rounds_needed: int | None  # B's rounds for every cell with an interval at the cell margin
    unjudged: int = 0  # cells and geometric means without a B/A interval (too few rounds in A or B)
    unresolved: list[Row] = field(default_factory=list)  # cells not shown to reproduce, likeliest to differ first
    method: str = ""  # the estimator both sides used ("mean", "trimmed mean" or both where cells differ)

    @property
    def worst(self) -> Row | None:
        return self.unresolved[0] if self.unresolved else None

    @property
    def fingerprints_differ(self) -> int:
        return sum(1 for r in self.rows if r.fingerprint is Match.DIFFER)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for r in self.rows:
            out[r.call.value] += 1
        return dict(out)

    def fingerprints(self) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for r in self.rows:
            out[r.fingerprint.value] += 1
        return dict(out)


def _match(fa: Fingerprint, fb: Fingerprint) -> Match:
    if not fa.drafts or not fb.drafts:
        return Match.MISSING
    same = set(fa.drafts) == set(fb.drafts) and set(fa.outputs) == set(fb.outputs)
    return Match.IDENTICAL if same else Match.DIFFER


def _logs(s: sp.Speedup | None) -> list[float]:
    return [math.log(v) for v in s.rounds.values() if v and v > 0] if s is not None else []


def common_method(n_a: int, n_b: int) -> inf.Method:
    """The estimator for a cell measured in n_a rounds in A and n_b in B: the trimmed mean where both have
    TRIM_FROM rounds or more, else the mean on both sides."""
    return inf.Method.TRIMMED if min(n_a, n_b) >= inf.TRIM_FROM else inf.Method.MEAN


def locate_as(logs: Sequence[float], method: inf.Method) -> inf.Location | None:
    """inference.locate with the estimator fixed: the mean of any number of values, or the trimmed mean (which
    needs TRIM_FROM values; fewer get the mean, as locate gives them)."""
    loc = inf.locate(logs)
    if loc is None or loc.method is method or method is inf.Method.TRIMMED:
        return loc
    x = np.asarray([v for v in logs if v is not None and math.isfinite(v)], dtype=float)
    n = len(x)
    return inf.Location(float(np.mean(x)), float(np.var(x, ddof=1)) if n > 1 else 0.0, n - 1, 1.0 / n, n,
                        inf.Method.MEAN)


def common_estimates(a: RunStats, b: RunStats) -> tuple[dict[CellKey, inf.Estimate], dict[CellKey, inf.Estimate]]:
    """Every speedup cell of A and of B located with the estimator both runs can use for it (common_method), the
    variances moderated within each run and host as the run's own table does; cells with fewer than MIN_ROUNDS
    paired rounds or no standard error are left out."""
    logs_a = {k: _logs(s) for k, s in a.table.cells.items()}
    logs_b = {k: _logs(s) for k, s in b.table.cells.items()}

    def method(k: CellKey) -> inf.Method:  # a cell of one run only keeps the estimator its rounds give it
        ns = [len(logs[k]) for logs in (logs_a, logs_b) if k in logs]
        return common_method(min(ns), min(ns))

    def run(logs: dict[CellKey, list[float]]) -> dict[CellKey, inf.Estimate]:
        out: dict[CellKey, inf.Estimate] = {}
        for host in dict.fromkeys(k.host for k in logs):
            keys = [k for k in logs if k.host == host]
            found, _ = inf.estimates([locate_as(logs[k], method(k)) for k in keys])
            out.update((k, e) for k, e in zip(keys, found, strict=True)
                       if e is not None and e.testable and e.n >= sp.MIN_ROUNDS)
        return out

    return run(logs_a), run(logs_b)


def _row(ca: CellStats, cb: CellStats | None, ea: inf.Estimate | None, eb: inf.Estimate | None,
         cell_margin: float) -> Row:
    k = ca.key
    if cb is None:
        return Row(RowKey(*k), Call.MISSING, cell_margin, est_a=ea,
                   point_a=ca.speedup.estimate if ca.speedup else None)
    fp = _match(ca.fingerprint, cb.fingerprint)
    tok = cb.tok_s_median / ca.tok_s_median if ca.tok_s_median and cb.tok_s_median else None
    sa, sb = ca.speedup, cb.speedup
    common = {"fingerprint": fp, "fingerprint_a": ca.fingerprint, "fingerprint_b": cb.fingerprint,
              "tok_s_ratio": tok, "n_a": len(sa.rounds) if sa else 0, "n_b": len(sb.rounds) if sb else 0,
              "point_a": sa.estimate if sa else None, "point_b": sb.estimate if sb else None}
    if sa is None or sb is None:
        return Row(RowKey(*k), Call.BASELINE, cell_margin, **common)
    if ea is None or eb is None:
        return Row(RowKey(*k), Call.INCONCLUSIVE, cell_margin, est_a=ea, est_b=eb, **common)
    return Row(RowKey(*k), Call.INCONCLUSIVE, cell_margin, est_a=ea, est_b=eb,
               est=inf.difference(eb, ea), **common)


def _geomean_rows(rows: list[Row], margin: float) -> list[Row]:
    """Per host and strategy, B/A of the geometric means over the tasks judged in both runs."""
    groups: dict[tuple[str, str], list[Row]] = defaultdict(list)
    for r in rows:
        if r.call not in (Call.BASELINE, Call.MISSING):
            groups[(r.host, r.strategy)].append(r)
    out = []
    for (host, strategy), rs in groups.items():
        use = [r for r in rs if r.est is not None]
        if not use:
            out.append(Row(RowKey(host, strategy, None), Call.INCONCLUSIVE, margin))
            continue
        ga = inf.combine([r.est_a for r in use])
        gb = inf.combine([r.est_b for r in use])
        out.append(Row(RowKey(host, strategy, None), Call.INCONCLUSIVE, margin, est_a=ga, est_b=gb,
                       est=inf.difference(gb, ga), n_a=min(r.n_a for r in use), n_b=min(r.n_b for r in use),
                       tasks=tuple(r.task for r in use)))
    return out


def _judge(rows: list[Row]) -> tuple[list[Row], int]:
    """Each row's call against its own band: differs as one Holm family over every row with an interval,
    reproduces by two one-sided tests."""
    at = [i for i, r in enumerate(rows) if r.est is not None]
    p_out = [rows[i].est.p_outside(math.log1p(rows[i].margin)) for i in at]
    adjusted = inf.holm_adjusted(p_out) if at else []
    out = list(rows)
    for i, p_o, p_adj in zip(at, p_out, adjusted, strict=True):
        r = rows[i]
        pw = r.est.p_within(math.log1p(r.margin))
        call = Call.DIFFERS if p_adj <= inf.ALPHA else Call.REPRODUCES if pw <= inf.ALPHA else Call.INCONCLUSIVE
        out[i] = replace(r, call=call, p_within=pw, p_outside=p_o, p_adjusted=p_adj)
    return out, len(at)


def reproduction(a: RunStats, b: RunStats, margin: float = REPRODUCE_MARGIN,
                 cell_margin: float | None = None) -> Reproduction:
    """Judge run B against run A (B's hosts already matched to A's labels); cells are matched by host, strategy
    and task, each cell against ±cell_margin (default: twice the margin), each geometric mean against ±margin."""
    cell_margin = default_cell_margin(margin) if cell_margin is None else cell_margin
    ests_a, ests_b = common_estimates(a, b)
    rows = [_row(ca, b.cell(ca.key), ests_a.get(ca.key), ests_b.get(ca.key), cell_margin) for ca in a.cells]
    judged, family = _judge(rows + _geomean_rows(rows, margin))
    rows, geos = judged[:len(rows)], judged[len(rows):]
    cells = [r for r in rows if r.call not in (Call.BASELINE, Call.NOT_COMPARABLE)]
    # worst first: the strongest evidence of a difference beyond the band (p_outside), then the widest reach
    unresolved = sorted((r for r in cells if r.call is not Call.REPRODUCES),
                        key=lambda r: (r.p_outside is None, r.p_outside or 0.0, -(r.reach or 0.0)))
    if any(r.call is Call.DIFFERS for r in cells + geos):
        call = Call.DIFFERS
    elif geos and all(r.call is Call.REPRODUCES for r in geos):
        fp_differ = any(r.fingerprint is Match.DIFFER for r in rows)
        call = Call.REPRODUCES if not unresolved and not fp_differ else Call.GEOMEANS_REPRODUCE
    else:
        call = Call.INCONCLUSIVE
    with_iv = [r for r in cells if r.est is not None]
    methods = sorted({e.method.value for e in (*(r.est_a for r in with_iv), *(r.est_b for r in with_iv))})
    return Reproduction(margin, cell_margin, rows, geos, call, family, smallest_margin(geos or cells),
                        smallest_margin(with_iv), rounds_needed(geos or cells, margin),
                        rounds_needed(with_iv, cell_margin),
                        sum(1 for r in cells + geos if r.est is None and r.call is not Call.MISSING), unresolved,
                        " and ".join(methods))


def smallest_margin(items: Iterable[Row]) -> float | None:
    """The smallest margin every 95% B/A interval lies within, over the rows that have one (None: none has)."""
    reach = [r.reach for r in items if r.reach is not None]
    return max(reach) if reach else None


def rounds_needed(items: list[Row], margin: float, limit: int = 200) -> int | None:
    """B's rounds for every row's B/A interval to lie within ±margin with A as it is, assuming B's noise stays as
    measured (its variance per round fixed, its standard error and degrees of freedom following the rounds); None
    when adding rounds to B alone cannot get there within `limit` (a difference at the margin already, or A's own
    uncertainty too wide)."""
    if not items:
        return None
    band = math.log1p(margin)
    need = 0
    for r in items:
        if r.est is None or r.est_a is None or r.est_b is None:
            return None
        m = _rounds_for(r, band, limit)
        if m is None:
            return None
        need = max(need, m)
    return need


def _rounds_for(r: Row, band: float, limit: int) -> int | None:
    a, b = r.est_a, r.est_b
    trimmed = b.method is inf.Method.TRIMMED
    factor_now, df_now = _shape(max(b.n, 1), trimmed)
    scale2 = b.se ** 2 / factor_now
    df_extra = b.df - df_now if math.isfinite(b.df) else math.inf
    for m in range(max(b.n, 2), limit + 1):
        factor, df = _shape(m, trimmed)
        b_m = inf.Estimate(b.estimate, math.sqrt(scale2 * factor), df + df_extra, m, b.method, b.moderated)
        d = inf.difference(b_m, a)
        q = float(sps.norm.ppf(0.975)) if not math.isfinite(d.df) else float(sps.t.ppf(0.975, d.df))
        if abs(r.est.estimate) + q * d.se < band:
            return m
    return None


def _shape(n: int, trimmed: bool) -> tuple[float, int]:
    """(factor, df) of the location of n values by the estimator in use: the mean keeps 1/n and n - 1 at any n."""
    return inf.shape(n) if trimmed else (1.0 / n, n - 1)
