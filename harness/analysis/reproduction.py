"""Run B judged against run A on what transfers between machines: per cell the ratio of the two speedups, B/A,
with its 95% interval, against a margin (default ±5%); per strategy the same for the geometric mean over tasks;
and the deterministic fingerprint (draft counts and output hashes).

- reproduces: the B/A interval lies inside ±margin (two one-sided tests). The headline says "reproduces" when
  every strategy's geometric mean does (an intersection-union test: no correction needed), no cell differs, no
  cell is missing in B and no fingerprint differs. A single cell is one prompt's sample of a task: demanding that
  each of 80 intervals lies inside the margin would make a reproduction unreachable at any honest number of
  rounds, while a cell that differs still decides against it.
- differs: the B/A interval lies wholly outside ±margin: a relevant difference, judged as one family over every
  cell and geometric mean with Holm's procedure, so independent replicates of one truth say "differs" in at
  most 5% of comparisons.
- inconclusive otherwise; the headline then says the smallest margin these rounds could confirm, and how many
  rounds B would need for the asked one (the B/A interval shrinks about as 1/sqrt(rounds)).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from enum import StrEnum

from scipy import stats as sps

from harness.analysis import inference as inf
from harness.analysis import speedups as sp
from harness.analysis.contamination import Fingerprint
from harness.analysis.stats import CellStats, RunStats

#: Two runs' speedups whose B/A interval lies within this band reproduce each other.
REPRODUCE_MARGIN = 0.05


class Call(StrEnum):
    REPRODUCES = "reproduces"
    DIFFERS = "differs"
    INCONCLUSIVE = "inconclusive"
    MISSING = "missing"
    BASELINE = "n/a"
    NOT_COMPARABLE = "not comparable"


class Match(StrEnum):
    IDENTICAL = "identical"
    DIFFER = "differ"
    MISSING = "missing"


@dataclass(frozen=True)
class Row:
    """One cell (or, with task None, one strategy's geometric mean) of A against B."""

    host: str
    strategy: str
    task: str | None
    speedup_a: sp.Speedup | None
    speedup_b: sp.Speedup | None
    ratio: float | None
    interval: inf.Interval | None
    call: Call
    p_within: float | None = None
    p_outside: float | None = None
    p_adjusted: float | None = None  # Holm-adjusted p of "differs"
    fingerprint: Match = Match.MISSING
    fingerprint_a: Fingerprint | None = None
    fingerprint_b: Fingerprint | None = None
    tok_s_ratio: float | None = None
    est: inf.Estimate | None = None  # B/A in logs
    est_a: inf.Estimate | None = None  # A's speedup (or geometric mean) in logs
    est_b: inf.Estimate | None = None
    b_rounds: int = 0
    tasks: tuple[str, ...] = ()


@dataclass(frozen=True)
class Reproduction:
    margin: float
    rows: list[Row]
    geomeans: list[Row]
    call: Call
    family: int
    smallest_margin: float | None  # the smallest margin every judged row's interval lies within
    rounds_needed: int | None  # B's rounds for the asked margin (None: adding rounds to B alone cannot reach it)
    unjudged: int = 0  # cells and geometric means without a B/A interval (too few rounds in A or B)

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


def _judgeable(s: sp.Speedup | None) -> bool:
    return s is not None and s.est is not None and s.est.testable and s.n >= sp.MIN_ROUNDS


def _row(ca: CellStats, cb: CellStats | None) -> Row:
    k = ca.key
    if cb is None:
        return Row(k.host, k.strategy, k.task, ca.speedup, None, None, None, Call.MISSING)
    fp = _match(ca.fingerprint, cb.fingerprint)
    tok = cb.tok_s_median / ca.tok_s_median if ca.tok_s_median and cb.tok_s_median else None
    sa, sb = ca.speedup, cb.speedup
    common = {"fingerprint": fp, "fingerprint_a": ca.fingerprint, "fingerprint_b": cb.fingerprint,
              "tok_s_ratio": tok}
    if sa is None or sb is None:
        return Row(k.host, k.strategy, k.task, sa, sb, None, None, Call.BASELINE, **common)
    if not (_judgeable(sa) and _judgeable(sb)):
        ratio = sb.estimate / sa.estimate if sa.estimate and sb.estimate else None
        return Row(k.host, k.strategy, k.task, sa, sb, ratio, None, Call.INCONCLUSIVE, b_rounds=sb.n, **common)
    d = inf.difference(sb.est, sa.est)
    return Row(k.host, k.strategy, k.task, sa, sb, math.exp(d.estimate), inf.Interval.of(d), Call.INCONCLUSIVE,
               est=d, est_a=sa.est, est_b=sb.est, b_rounds=sb.n, **common)


def _geomean_rows(rows: list[Row]) -> list[Row]:
    """Per host and strategy, B/A of the geometric means over the tasks judged in both runs."""
    groups: dict[tuple[str, str], list[Row]] = defaultdict(list)
    for r in rows:
        if r.speedup_a is not None and r.speedup_b is not None:
            groups[(r.host, r.strategy)].append(r)
    out = []
    for (host, strategy), rs in groups.items():
        use = [r for r in rs if r.est is not None]
        if not use:
            out.append(Row(host, strategy, None, None, None, None, None, Call.INCONCLUSIVE))
            continue
        ga = inf.combine([r.speedup_a.est for r in use])
        gb = inf.combine([r.speedup_b.est for r in use])
        d = inf.difference(gb, ga)
        out.append(Row(host, strategy, None, None, None, math.exp(d.estimate), inf.Interval.of(d),
                       Call.INCONCLUSIVE, est=d, est_a=ga, est_b=gb, b_rounds=min(r.b_rounds for r in use),
                       tasks=tuple(r.task for r in use)))
    return out


def reproduction(a: RunStats, b: RunStats, margin: float = REPRODUCE_MARGIN) -> Reproduction:
    """Judge run B against run A (B's hosts already matched to A's labels); cells are matched by host, strategy
    and task."""
    rows = [_row(ca, b.cell(ca.key)) for ca in a.cells]
    geos = _geomean_rows(rows)
    band = math.log1p(margin)
    judged = [r for r in rows + geos if r.est is not None]
    p_out = [r.est.p_outside(band) for r in judged]
    adj = dict(zip(map(id, judged), inf.holm_adjusted(p_out), strict=True)) if judged else {}
    raw = dict(zip(map(id, judged), p_out, strict=True))

    def decide(r: Row) -> Row:
        if r.est is None:
            return r
        pw = r.est.p_within(band)
        call = Call.DIFFERS if adj[id(r)] <= inf.ALPHA else Call.REPRODUCES if pw <= inf.ALPHA else \
            Call.INCONCLUSIVE
        return Row(**{**r.__dict__, "call": call, "p_within": pw, "p_outside": raw[id(r)],
                      "p_adjusted": adj[id(r)]})

    rows, geos = [decide(r) for r in rows], [decide(r) for r in geos]
    items = [r for r in rows + geos if r.call not in (Call.BASELINE, Call.MISSING, Call.NOT_COMPARABLE)]
    unjudged = sum(1 for r in items if r.est is None)
    if any(r.call is Call.DIFFERS for r in items):
        call = Call.DIFFERS
    elif geos and all(r.call is Call.REPRODUCES for r in geos) and \
            not any(r.call is Call.MISSING or r.fingerprint is Match.DIFFER for r in rows):
        call = Call.REPRODUCES
    else:
        call = Call.INCONCLUSIVE
    decisive = geos or items  # what the headline needs within the margin: the geometric means
    return Reproduction(margin, rows, geos, call, len(judged), smallest_margin(decisive),
                        rounds_needed(decisive, margin), unjudged)


def smallest_margin(items: list[Row]) -> float | None:
    """The smallest margin every 95% B/A interval lies within, over the rows that have one (None: none has)."""
    items = [r for r in items if r.interval is not None and r.interval.available]
    if not items:
        return None
    worst = max(max(abs(math.log(r.interval.low)), abs(math.log(r.interval.high))) for r in items)
    return math.expm1(worst)


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
    factor_now, df_now = inf.shape(max(b.n, 1))
    scale2 = b.se ** 2 / factor_now
    df_extra = b.df - df_now if math.isfinite(b.df) else math.inf
    for m in range(max(b.n, 2), limit + 1):
        factor, df = inf.shape(m)
        b_m = inf.Estimate(b.estimate, math.sqrt(scale2 * factor), df + df_extra, m, b.method, b.moderated)
        d = inf.difference(b_m, a)
        q = float(sps.norm.ppf(0.975)) if not math.isfinite(d.df) else float(sps.t.ppf(0.975, d.df))
        if abs(r.est.estimate) + q * d.se < band:
            return m
    return None
