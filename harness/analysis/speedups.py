"""Paired speedups and their verdicts, judged as one family per table.

Each round runs every cell once in shuffled order, so a round is a block: a strategy's tok/s is divided by its
baseline's tok/s on the same task and prompt, on the same host, in the same round, and whatever the machine did to
the whole round cancels. A task with several prompts pairs each prompt with itself; the round's log ratio is the
mean over its prompts.

A cell's speedup is exp(location) of its per-round log ratios (harness/analysis/inference.py: the mean below
TRIM_FROM rounds, the 20%-trimmed mean from there), with a 95% interval whose variance is moderated toward the
noise of the table's other cells on the same host. The geometric mean over tasks is the mean of the cells'
locations, its interval made from the same cells' standard errors: estimate and interval of one quantity.

Marks. Every cell with at least MIN_ROUNDS paired rounds contributes two hypotheses to its table's family: "no
difference" (rejected: faster or slower) and "a difference of at least EQUIVALENCE_BAND" (rejected: equivalent).
Holm's procedure over the whole family decides which are rejected, so a table's marks are all right in 95% of
tables; the geometric means of a table are a family of their own."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from harness.analysis import inference as inf
from harness.analysis.records import CellIndex, CellKey

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

    @property
    def verdict(self) -> Verdict:
        return self.judgement.verdict

    @property
    def n(self) -> int:
        return self.interval.n


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
class SpeedupTable:
    """Every cell's speedup and each strategy's geometric mean over tasks, per host, with the priors used."""

    cells: dict[CellKey, Speedup]
    geomeans: list[Speedup]
    priors: dict[str, inf.Prior]
    band: float

    @property
    def family_size(self) -> int:
        return next((s.judgement.family for s in self.cells.values() if s.judgement.family), 0)

    @property
    def geomean_family_size(self) -> int:
        return next((g.judgement.family for g in self.geomeans if g.judgement.family), 0)

    def marks(self) -> dict[Verdict, int]:
        out: dict[Verdict, int] = defaultdict(int)
        for s in self.cells.values():
            out[s.verdict] += 1
        return dict(out)


def table(index: CellIndex, baselines: Mapping[str, str | None], band: float = EQUIVALENCE_BAND) -> SpeedupTable:
    """The speedups of every cell that has a baseline, judged as one family; the geometric means as another."""
    keys = [k for k in index.keys if baselines.get(k.strategy)]
    return table_of({k: paired_logs(index, k, baselines[k.strategy]) for k in keys}, baselines, index.hosts, band)


def table_of(logs: Mapping[CellKey, dict[int, float]], baselines: Mapping[str, str | None], hosts: Sequence[str],
             band: float = EQUIVALENCE_BAND) -> SpeedupTable:
    """A table of paired log ratios per cell and round (what `table` pairs, or any other paired comparison such as
    one build against another): each cell's estimate moderated toward its host's cells, the cells judged as one
    family, the geometric means over tasks as another."""
    keys = list(logs)
    ests: dict[CellKey, inf.Estimate | None] = {}
    priors: dict[str, inf.Prior] = {}
    for host in hosts:
        hk = [k for k in keys if k.host == host]
        found, priors[host] = inf.estimates([inf.locate(list(logs[k].values())) for k in hk])
        ests.update(zip(hk, found, strict=True))
    judged = [k for k in keys if (e := ests[k]) is not None and e.n >= MIN_ROUNDS and e.testable]
    verdicts = judge([ests[k] for k in judged], band)
    cells = {}
    for k in keys:
        e = ests[k]
        ok = e is not None and e.n >= MIN_ROUNDS
        cells[k] = Speedup(k.host, k.strategy, k.task, baselines[k.strategy],
                           math.exp(e.estimate) if e is not None else None,
                           inf.Interval.of(e if ok else None) if ok else _none(e),
                           verdicts.get(judged.index(k), Judgement(Verdict.TOO_FEW)) if k in judged
                           else Judgement(Verdict.TOO_FEW),
                           {rd: math.exp(v) for rd, v in logs[k].items()}, (k.task,), (), e)
    return SpeedupTable(cells, geomeans(cells, band), priors, band)


def _none(e: inf.Estimate | None) -> inf.Interval:
    return inf.Interval(None, None, 0 if e is None else e.n, "none", None, False)


def judge(ests: Sequence[inf.Estimate], band: float) -> dict[int, Judgement]:
    """One family: for each estimate, "differs from 0" and "within ±band" (logs), Holm over all of them."""
    if not ests:
        return {}
    lb = math.log1p(band)
    pd = [e.p_differs() for e in ests]
    pw = [e.p_within(lb) for e in ests]
    adj = inf.holm_adjusted(pd + pw)
    m = len(ests)
    out = {}
    for i, e in enumerate(ests):
        a_d, a_w = adj[i], adj[m + i]
        if a_w <= inf.ALPHA:
            v, a = Verdict.EQUIVALENT, a_w
        elif a_d <= inf.ALPHA:
            v, a = (Verdict.FASTER if e.estimate > 0 else Verdict.SLOWER), a_d
        else:
            v, a = Verdict.NOT_SIGNIFICANT, min(a_d, a_w)
        out[i] = Judgement(v, pd[i], pw[i], a, 2 * m, band)
    return out


def geomeans(cells: Mapping[CellKey, Speedup], band: float = EQUIVALENCE_BAND) -> list[Speedup]:
    """Per host and strategy, the geometric mean over the tasks with at least MIN_ROUNDS paired rounds (the
    others are named, left out); the geometric means of one table are one family."""
    groups: dict[tuple[str, str], list[Speedup]] = defaultdict(list)
    for s in cells.values():
        groups[(s.host, s.strategy)].append(s)
    made = []
    for (host, strategy), ss in groups.items():
        use = [s for s in ss if s.est is not None and s.n >= MIN_ROUNDS and s.est.testable]
        est = inf.combine([s.est for s in use]) if use else None
        made.append((host, strategy, ss[0].baseline, est, tuple(s.task for s in use),
                     tuple(s.task for s in ss if s not in use)))
    judged = [i for i, x in enumerate(made) if x[3] is not None]
    verdicts = judge([made[i][3] for i in judged], band)
    out = []
    for i, (host, strategy, base, est, tasks, left) in enumerate(made):
        j = verdicts.get(judged.index(i)) if i in judged else None
        out.append(Speedup(host, strategy, None, base, None if est is None else math.exp(est.estimate),
                           inf.Interval.of(est) if est is not None else _none(None), j or Judgement(Verdict.TOO_FEW),
                           {}, tasks, left, est))
    return out
