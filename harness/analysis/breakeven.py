"""The acceptance a strategy needs to pay on this machine: its break-even curve from synthetic acceptance.

A strategy with a `breakeven:` block (harness/intake/breakeven.py) was also measured at synthetic acceptance
lengths L (`--spec-synth-len`, or rates whose length is 1 + their sum): the drafter runs and costs what it costs,
acceptance follows the given law. Each such strategy is paired by round with the baseline, like any other
(harness/analysis/speedups.py `paired_logs`), and kept out of the speedup table, the geometric means and the
lossless checks: its output is not valid (`split`).

Per (host, strategy, task):
- the curve: at each length, the paired speedup (geometric mean over rounds) with its 95% Student-t interval on
  the log ratios (the speedup table's per-cell interval before moderation);
- the fit: per round, the least-squares line of speedup against length through that round's lengths (a step costs
  about the same whatever is accepted, so tok/s grows about linearly with the length); the rounds are
  independent blocks, so the mean intercept and slope over rounds have the round-to-round covariance / rounds;
- the break-even length: where the mean line crosses 1, with Fieller's 95% interval (the lengths where the
  line's own interval contains 1; t with rounds - 1 degrees of freedom). Unbounded where the slope is not
  distinguishable from 0. Its coverage, by simulation (bench/breakeven_coverage.py: 1,000 runs per setting, 3, 5
  and 8 rounds, per-measurement noise 5-30%, a shared baseline per round, lines through the origin and not):
  93.6-97.0%. At 3 rounds and 20-30% noise a sixth to a half of the intervals are unbounded, and at 30% noise the
  estimate reads 5-10% low (a ratio of log-normal measurements);
- the achieved length: the real strategy's mean acceptance length per step (1 + accepted / drafts, from the
  server's counters, else from its log line), per round pooled over prompts, with a t interval over rounds;
- the ceiling: the speedup at full acceptance (length n_max + 1), measured where that length was, else the line's.

What it says, per curve (`verdict`): NEEDS (the line crosses 1 within [1, n_max + 1]), PAYS (the line is above 1
at length 1: any acceptance pays), NEVER (below 1 even at n_max + 1)."""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections import defaultdict
from typing import Any

from scipy import stats as sps

from harness.analysis.records import CellIndex, CellKey, Measurement
from harness.analysis.speedups import paired_logs
from harness.intake import breakeven as synth_rules
from harness.store import result, shapes
from harness.store.runmeta import RunMeta, StrategyMeta

CONFIDENCE = 0.95
NEEDS, PAYS, NEVER, UNKNOWN = "needs", "pays", "never", "unknown"
#: Where an achieved length came from.
COUNTERS, LOG = "server's counters", "server's log"


def split(meta: RunMeta, records: list[result.ResultRecord]) -> tuple[RunMeta, list[result.ResultRecord]]:
    """The run without its synthetic strategies (the one every other table is made from), and their records out
    of it: nothing measured at synthetic acceptance reaches a speedup, a geometric mean or a lossless check."""
    synth = {s.id for s in meta.strategies if s.synthetic}
    if not synth:
        return meta, records
    per_strategy = meta.plan.runs * len(meta.plan.hosts) * sum(len(t.prompts) for t in meta.planned_tasks())
    planned = [s for s in meta.plan.strategies if s in synth]
    plan = dataclasses.replace(meta.plan, strategies=[s for s in meta.plan.strategies if s not in synth],
                               measurements=max(0, meta.plan.measurements - len(planned) * per_strategy))
    return dataclasses.replace(meta, plan=plan), [r for r in records if r.get("strategy") not in synth]


# ---------------------------------------------------------------- pure figures


def t_interval(xs: list[float]) -> tuple[float, float, float] | None:
    """Mean of xs with its 95% Student-t interval; None for fewer than two values."""
    if len(xs) < 2:
        return None
    m, sd = statistics.fmean(xs), statistics.stdev(xs)
    h = sps.t.ppf(0.5 + CONFIDENCE / 2, len(xs) - 1) * sd / math.sqrt(len(xs))
    return m, m - h, m + h


def line(points: list[tuple[float, float]]) -> tuple[float, float] | None:
    """Least-squares intercept and slope of y against x; None with fewer than two distinct x."""
    xs = [x for x, _ in points]
    if len(set(xs)) < 2:
        return None
    mx, my = statistics.fmean(xs), statistics.fmean(y for _, y in points)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in points) / sxx
    return my - b * mx, b


@dataclasses.dataclass(frozen=True)
class Crossing:
    """Where the fitted line crosses 1 and its interval (None: unbounded on that side)."""

    intercept: float
    slope: float
    length: float | None
    lo: float | None
    hi: float | None
    rounds: int


def crossing(by_round: dict[int, dict[float, float]]) -> Crossing | None:
    """The break-even length from per-round speedups by length (rounds that measured every length), with Fieller's
    interval; None without two such rounds."""
    lengths = sorted({x for v in by_round.values() for x in v})
    full = [v for v in by_round.values() if set(v) == set(lengths)]
    fits = [f for v in full if (f := line(sorted(v.items()))) is not None]
    if len(fits) < 2:
        return None
    n = len(fits)
    a = statistics.fmean(f[0] for f in fits)
    b = statistics.fmean(f[1] for f in fits)
    vaa = statistics.variance([f[0] for f in fits]) / n
    vbb = statistics.variance([f[1] for f in fits]) / n
    vab = sum((f[0] - a) * (f[1] - b) for f in fits) / (n - 1) / n
    t2 = sps.t.ppf(0.5 + CONFIDENCE / 2, n - 1) ** 2
    est = (1 - a) / b if b != 0 else None
    # (a + bL - 1)^2 <= t^2 (vaa + 2 L vab + L^2 vbb): A L^2 + B L + C <= 0
    qa, qb, qc = b * b - t2 * vbb, 2 * ((a - 1) * b - t2 * vab), (a - 1) ** 2 - t2 * vaa
    disc = qb * qb - 4 * qa * qc
    if qa > 0 and disc >= 0:
        r1, r2 = sorted(((-qb - math.sqrt(disc)) / (2 * qa), (-qb + math.sqrt(disc)) / (2 * qa)))
        return Crossing(a, b, est, r1, r2, n)
    return Crossing(a, b, est, None, None, n)  # the slope is not distinguishable from 0: unbounded


def verdict(c: Crossing | None, n_max: int) -> str:
    """What the fitted line says within [1, n_max + 1]."""
    if c is None:
        return UNKNOWN
    at = [c.intercept + c.slope * x for x in (1.0, n_max + 1.0)]
    if min(at) > 1:
        return PAYS
    if max(at) < 1:
        return NEVER
    return NEEDS


# ---------------------------------------------------------------- from a run


def _mean_len(m: Measurement) -> tuple[int, int, str] | None:
    """(accepted, drafts, source) of one request."""
    c = m.raw.get("spec_counters")
    if isinstance(c, dict) and isinstance(c.get("drafts"), int):
        return int(c["accepted"]), int(c["drafts"]), COUNTERS
    da = (m.raw.get("server_log") or {}).get("draft_acceptance") or {}
    mean_len, acc = da.get("mean_len"), m.accepted
    if isinstance(mean_len, int | float) and mean_len > 1 and acc:
        return int(acc), round(acc / (mean_len - 1)), LOG
    return None


def achieved(index: CellIndex, key: CellKey) -> shapes.AchievedLength | None:
    """The real strategy's mean acceptance length per step: per round, pooled over its prompts."""
    per: dict[int, list[tuple[int, int]]] = defaultdict(list)
    sources: set[str] = set()
    for m in index.used(key):
        got = _mean_len(m)
        if got is not None:
            per[m.round].append(got[:2])
            sources.add(got[2])
    lens = [1 + sum(a for a, _ in v) / sum(d for _, d in v) for v in per.values() if sum(d for _, d in v)]
    if not lens:
        return None
    iv = t_interval(lens)
    mean = iv[0] if iv else lens[0]
    return {"length": round(mean, 3), "lo": round(iv[1], 3) if iv else None, "hi": round(iv[2], 3) if iv else None,
            "rounds": len(lens), "sources": sorted(sources)}


def _n_max(family: StrategyMeta, members: list[tuple[StrategyMeta, float]]) -> int:
    try:
        n = synth_rules.n_max(family.spec_type, family.args, ())
    except synth_rules.BreakevenError:
        n = 0
    return max([n] + [math.ceil(x - 1) for _, x in members])


def _real(meta: RunMeta, family: str, synthetic: StrategyMeta) -> StrategyMeta | None:
    """The real strategy a synthetic one stands beside: of its entry, at one client, the combination whose swept
    values its arguments carry (a swept entry's `at`), else the entry itself."""
    args = list(synthetic.args)
    pairs = {(args[i], args[i + 1]) for i in range(len(args) - 1)}
    return next((s for s in meta.planned_strategies() if s.family_id == family and not s.synthetic
                 and s.parallel == 1 and all(p in pairs for p in s.sweep)), None)


def curves(meta: RunMeta, index: CellIndex) -> list[shapes.BreakevenCurve]:
    """Every break-even curve of a run (its full index: synthetic records included), in plan order."""
    fams: dict[str, list[tuple[StrategyMeta, float]]] = defaultdict(list)
    for s in meta.planned_strategies():
        got = synth_rules.setting(s.args)
        if s.synthetic and got is not None:
            fams[s.family_id].append((s, synth_rules.length_of(*got)))
    out: list[shapes.BreakevenCurve] = []
    for host in meta.plan.hosts:
        for fid, members in fams.items():
            real = _real(meta, fid, members[0][0])
            n_max = _n_max(real or members[0][0], members)
            for t in meta.planned_tasks():
                by_round: dict[int, dict[float, float]] = defaultdict(dict)
                points: list[shapes.BreakevenPoint] = []
                for s, length in sorted(members, key=lambda m: m[1]):
                    if not s.baseline:
                        continue
                    logs = paired_logs(index, CellKey(host, s.id, t.id), s.baseline)
                    for r, v in logs.items():
                        by_round[r][length] = math.exp(v)
                    iv = t_interval(list(logs.values()))
                    g = statistics.fmean(logs.values()) if logs else None
                    points.append({"strategy": s.id, "length": round(length, 4), "rounds": len(logs),
                                   "speedup": None if g is None else round(math.exp(g), 4),
                                   "lo": round(math.exp(iv[1]), 4) if iv else None,
                                   "hi": round(math.exp(iv[2]), 4) if iv else None})
                if not any(index.of(CellKey(host, s.id, t.id)) for s, _ in members):
                    continue  # not measured (yet): a partial run names its missing cells elsewhere
                c = crossing(by_round)
                top = next((p for p in points if p["length"] == n_max + 1 and p["speedup"] is not None), None)
                ceiling: shapes.Ceiling = {"length": n_max + 1, "measured": top is not None,
                                           "speedup": top["speedup"] if top else (
                                               round(c.intercept + c.slope * (n_max + 1), 4) if c else None)}
                out.append({"host": host, "strategy": fid, "task": t.id, "n_max": n_max, "points": points,
                            "fit": None if c is None else {
                                "intercept": round(c.intercept, 4), "slope": round(c.slope, 4), "rounds": c.rounds},
                            "breakeven": None if c is None or c.length is None else {
                                "length": round(c.length, 3), "lo": None if c.lo is None else round(c.lo, 3),
                                "hi": None if c.hi is None else round(c.hi, 3)},
                            "verdict": verdict(c, n_max), "ceiling": ceiling,
                            "real": real.id if real else None,
                            "achieved": achieved(index, CellKey(host, real.id, t.id)) if real else None})
    return out


def summary(meta: RunMeta, index: CellIndex) -> dict[str, Any]:
    """The summary's `breakeven` part: nothing for a run without synthetic strategies."""
    got = curves(meta, index)
    return {"breakeven": {"label": synth_rules.LABEL, "curves": got}} if got else {}
