"""Contamination judged from evidence, per cell: what must not change between identical requests at temperature 0
in fresh servers (draft counts and outputs), and throughput trends after removing each round's common factor.

A unit is what identical requests are: a cell, or one prompt of a cell whose task has several. A cell shows its
worst unit's kind. The statistical flags (drift: a trend in execution order; noisy: a unit's largest deviation
improbable under the run's own noise, heavy tails included, harness/analysis/inference.py `noisier_p`) are judged
as one family over every unit of the run with Holm's procedure, like the speedup marks
(harness/analysis/speedups.py): a clean run shows none in 95% of runs, with normal or heavy-tailed (t, 3 degrees of
freedom) noise alike. The deterministic ones (warm-cache, nondeterministic, naive) need no test: the evidence is
exact."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

import numpy as np
from scipy import stats as sps

from harness import formatter as fm
from harness.analysis import inference as inf
from harness.analysis.records import CellIndex, CellKey, Measurement
from harness.store import shapes

#: Kendall's tau p-value (Holm-adjusted over the run's units) below which a trend in execution order is real.
TREND_P = 0.05
#: A trend must move the unit's normalised throughput by at least this much over its runs...
TREND_MIN_CHANGE = 0.05
#: ...and by more than this many times the unit's own noise (robust sd of the residuals around the trend).
TREND_NOISE_FACTOR = 2.0
#: A unit significantly noisier than the run (Holm) is flagged only when its spread also matters: this CV.
NOISY_MIN_CV = 0.10
#: Accepted/drafted rising by this much (absolute) after the first run is the signature of a carried cache.
ACCEPT_CLIMB = 0.10


class Kind(StrEnum):
    """Contamination kinds, strongest evidence first: a cell shows its worst unit's."""

    WARM_CACHE = "warm-cache"
    NAIVE = "naive"
    UNSTABLE = "unstable"
    DRIFT = "drift"
    NONE = "none"


@dataclass(frozen=True)
class Point:
    """One run of a unit: when it ran, its tok/s, the round's common factor, and the normalised tok/s."""

    order: int
    round: int
    tok_s: float
    factor: float
    normalised: float


@dataclass(frozen=True)
class Unit:
    """Identical requests: a cell, or one prompt of it (`prompt` None: the whole cell)."""

    key: CellKey
    prompt: str | None

    def label(self) -> str:
        return self.key.task if self.prompt is None else f"{self.key.task}/{self.prompt}"


def units(index: CellIndex) -> list[Unit]:
    """Every unit of the run, cells in first-seen order."""
    out = []
    for key in index.keys:
        prompts = index.prompts(key)
        out += [Unit(key, None)] if len(prompts) <= 1 else [Unit(key, p) for p in prompts]
    return out


def _in(unit: Unit, ms: list[Measurement]) -> list[Measurement]:
    return ms if unit.prompt is None else [m for m in ms if m.prompt == unit.prompt]


def _round_values(ms: list[Measurement]) -> dict[int, float]:
    by: dict[int, list[float]] = defaultdict(list)
    for m in ms:
        by[m.round].append(float(m.tok_s))
    return {rd: statistics.median(v) for rd, v in sorted(by.items())}


def normalise(index: CellIndex, us: Sequence[Unit]) -> dict[Unit, list[Point]]:
    """Every unit's tok/s in execution order with the round effect removed: a unit's factor for a round is the
    median over the OTHER units of the host in that round of their tok/s over their own median (leave-one-out,
    so a unit's own climb is not absorbed), and the normalised tok/s is tok/s / factor."""
    rel: dict[tuple[str, int], dict[Unit, float]] = defaultdict(dict)
    used = {u: _in(u, index.used(u.key)) for u in us}
    for u, ms in used.items():
        rounds = _round_values(ms)
        if rounds:
            med = statistics.median(rounds.values())
            for rd, v in rounds.items():
                rel[(u.key.host, rd)][u] = v / med
    out: dict[Unit, list[Point]] = {}
    for u, ms in used.items():
        pts = []
        for m in ms:
            others = [v for k, v in rel[(u.key.host, m.round)].items() if k != u]
            f = statistics.median(others) if others else 1.0
            pts.append(Point(m.order, m.round, float(m.tok_s), f, float(m.tok_s) / f))
        out[u] = pts
    return out


@dataclass(frozen=True)
class Trend:
    """Kendall's tau of the normalised series against execution order, the Theil-Sen change over the unit's span
    as a fraction of its median, the unit's own noise; `testable`: enough runs for the exact test."""

    n: int
    tau: float | None = None
    p: float | None = None
    change: float | None = None
    noise: float | None = None
    testable: bool = False

    @property
    def large(self) -> bool:
        """Whether the change is large enough to matter, whatever its p-value."""
        return self.change is not None and abs(self.change) > max(TREND_MIN_CHANGE,
                                                                  TREND_NOISE_FACTOR * (self.noise or 0))


def min_trend_runs(p: float = TREND_P) -> int:
    """Fewest runs for which a perfect monotone series reaches p (exact two-sided Kendall test: p = 2/n!)."""
    n = 2
    while 2 / math.factorial(n) >= p:
        n += 1
    return n


def trend(points: Sequence[Point]) -> Trend:
    """Kendall's tau and the Theil-Sen change of a unit's normalised throughput against execution order."""
    n = len(points)
    if n < min_trend_runs():
        return Trend(n)
    x = np.array([p.order for p in points], dtype=float)
    y = np.array([p.normalised for p in points], dtype=float)
    if np.all(y == y[0]):
        return Trend(n, 0.0, 1.0, 0.0, 0.0, True)
    tau, p = sps.kendalltau(x, y)
    ts = sps.theilslopes(y, x)
    med = float(np.median(y))
    resid = y - (ts.intercept + ts.slope * x)
    return Trend(n, round(float(tau), 4), round(float(p), 6), round(float(ts.slope * (x[-1] - x[0]) / med), 4),
                 round(float(sps.median_abs_deviation(resid, scale="normal") / med), 4), True)


@dataclass(frozen=True)
class Fingerprint:
    """What must not change between identical requests at temperature 0 in fresh servers: per run in execution
    order, (drafted, accepted) and the output's sha256."""

    drafts: list[tuple[int, int]]
    outputs: list[str]

    @property
    def drafting(self) -> bool:
        return any(d for d, _ in self.drafts)

    @property
    def drafts_identical(self) -> bool:
        return len(set(self.drafts)) <= 1

    @property
    def outputs_identical(self) -> bool:
        return len(set(self.outputs)) <= 1

    @property
    def identical(self) -> bool:
        return self.drafts_identical and self.outputs_identical

    def output_changed_at(self) -> int | None:
        """1-based run number where the output first differs from run 1's."""
        return next((i + 1 for i, h in enumerate(self.outputs) if h != self.outputs[0]), None)

    def as_dict(self) -> shapes.FingerprintJson:
        return {"drafts": [list(d) for d in self.drafts], "outputs": list(self.outputs),
                "identical": self.identical, "output_changed_at": self.output_changed_at()}


def fingerprint(ms: Sequence[Measurement]) -> Fingerprint:
    """The deterministic fingerprint of measurements (their ok ones, in execution order)."""
    ok = sorted((m for m in ms if m.ok), key=lambda m: m.order)
    return Fingerprint([(m.drafted, m.accepted) for m in ok], [m.output_sha for m in ok])


def acceptance(drafts: Sequence[tuple[int, int]]) -> list[float | None]:
    return [a / d if d else None for d, a in drafts]


def acceptance_climbed(drafts: Sequence[tuple[int, int]]) -> bool:
    """A cache carried from earlier runs helps every later run: acceptance never below run 1's, and clearly
    above."""
    acc = acceptance(drafts)
    if len(acc) < 2 or acc[0] is None:
        return False
    later = [a for a in acc[1:] if a is not None]
    return bool(later) and min(later) >= acc[0] and max(later) - acc[0] >= ACCEPT_CLIMB


@dataclass(frozen=True)
class Contamination:
    """A unit's (or a cell's: its worst unit's) kind and the evidence; `why` says which rule decided, for the
    sentence: 'protocol', 'climb', 'changed', 'noisy', 'trend' or 'none'."""

    unit: Unit
    kind: Kind
    why: str
    fingerprint: Fingerprint
    trend: Trend
    evidence: shapes.ContaminationEvidence
    noise_p: float | None = None  # Holm-adjusted p of "as noisy as the run"
    trend_p: float | None = None  # Holm-adjusted p of "no trend"
    family: int = 0

    @property
    def flagged(self) -> bool:
        return self.kind is not Kind.NONE


def judge(index: CellIndex, protocol: str | None = None) -> dict[CellKey, Contamination]:
    """Every cell's contamination: deterministic evidence per unit, then trends and noise as one family."""
    us = units(index)
    series = normalise(index, us)
    trends = {u: trend(series[u]) for u in us}
    # Noise: each unit's largest deviation against its host's pooled deviations, heavy tails allowed.
    noise_raw: dict[Unit, float] = {}
    for host in index.hosts:
        hu = [u for u in us if u.key.host == host]
        noise_raw.update(zip(hu, inf.noisier_p([[math.log(p.normalised) for p in series[u]] for u in hu]),
                             strict=True))
    tested = [u for u in us if trends[u].testable]
    pvals = [trends[u].p for u in tested] + [noise_raw.get(u, 1.0) for u in us]
    adj = inf.holm_adjusted(pvals)
    trend_adj = dict(zip(tested, adj[:len(tested)], strict=True))
    noise_adj = dict(zip(us, adj[len(tested):], strict=True))
    per_unit = {}
    for u in us:
        ms = _in(u, index.of(u.key))
        fp = fingerprint([m for m in ms if m.measured])
        proto = protocol or next((m.protocol for m in ms if m.protocol), "") or "fresh-container"
        pts, tr = series[u], trends[u]
        norm = [p.normalised for p in pts]
        cv = float(sps.variation(norm, ddof=1)) if len(norm) >= 2 else None
        evidence: shapes.ContaminationEvidence = {"protocol": proto, "fingerprint": fp.as_dict(),
                    "acceptance": [None if a is None else round(a, 4) for a in acceptance(fp.drafts)],
                    "series": [round(p.tok_s, 3) for p in pts], "normalised": [round(x, 3) for x in norm],
                    "round_factors": [round(p.factor, 4) for p in pts], "order": [p.order for p in pts],
                    "normalised_cv": None if cv is None else round(cv, 4),
                    "trend": {"n": tr.n, "tau": tr.tau, "p": tr.p, "change": tr.change, "noise": tr.noise,
                              "testable": tr.testable, "p_holm": fm.rounded(trend_adj.get(u), 6)},
                    "noise_p_holm": fm.rounded(noise_adj.get(u), 6), "family": len(pvals)}
        if u.prompt is not None:
            evidence["prompt"] = u.prompt
        tp, npv = trend_adj.get(u), noise_adj.get(u)
        if proto == "reuse-server":
            kind, why = Kind.NAIVE, "protocol"
        elif fp.drafting and not fp.drafts_identical and acceptance_climbed(fp.drafts):
            kind, why = Kind.WARM_CACHE, "climb"
        elif not fp.identical:
            kind, why = Kind.UNSTABLE, "changed"
        elif tp is not None and tp <= TREND_P and tr.large:
            kind, why = Kind.DRIFT, "trend"
        elif npv is not None and npv <= inf.ALPHA and cv is not None and cv > NOISY_MIN_CV:
            kind, why = Kind.UNSTABLE, "noisy"
        else:
            kind, why = Kind.NONE, "none"
        per_unit[u] = Contamination(u, kind, why, fp, tr, evidence, npv, tp, len(pvals))
    order = list(Kind)
    out: dict[CellKey, Contamination] = {}
    for u, c in per_unit.items():
        if u.key not in out or order.index(c.kind) < order.index(out[u.key].kind):
            out[u.key] = c
    return out


