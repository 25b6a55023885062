"""`invoke run --until 5%`: which cells' speedup intervals are as narrow as asked, and which must run again.

A cell converges when the interval the report prints for it (the table's moderated 95% interval,
harness/analysis/speedups.py) lies within the target: that is what the README promises, and it is checked on
the cell's own interval, never inferred from the table's noise. Stopping a cell as soon as its interval looks
narrow would stop the cells whose few rounds happened to agree, and their intervals would then cover less than
they claim (measured: 86% at a ratio noise of 4.5%, 63% at 8%). Two more conditions keep the coverage: a cell
may stop only after the rounds a cell with the table's typical noise needs for the target (`rounds_needed`
with the prior's sd; the moderated interval pulls luckily quiet rounds toward the table's noise), and never
before MIN_CONVERGED_ROUNDS; a cell that keeps its own variance must also have its own interval within the
target at STOP_CONFIDENCE. `python3 bench/until.py --coverage` measures the coverage of the cells that stop
and how many of them the report shows wider than the target."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from scipy import stats as sps

from harness.analysis import inference as inf
from harness.analysis import speedups as sp
from harness.analysis.records import CellIndex, CellKey

#: Relative half-width of a speedup interval that `invoke run --until` aims for by default.
CONVERGENCE_TARGET = 0.05
#: Fewest rounds before a cell may stop, whatever its interval says.
MIN_CONVERGED_ROUNDS = 5
#: A cell stops when its interval at this confidence is within the target (the report shows the 95% interval): the
#: stricter level keeps a table whose noise was underestimated by chance from stopping every cell too early.
STOP_CONFIDENCE = 0.975


@dataclass(frozen=True)
class CellConvergence:
    """Whether one cell's interval is as narrow as asked: relative half-width against the target."""

    key: CellKey
    rounds: int
    half_width: float | None
    converged: bool
    rounds_estimate: int | None  # see `rounds_needed`


@dataclass(frozen=True)
class Convergence:
    """Per cell convergence, the cells not converged, and the cells the next round must run: the unconverged
    ones plus, for pairing, the baseline of every task they belong to."""

    target: float
    cells: list[CellConvergence]
    pending: list[CellKey]
    to_run: list[CellKey]

    @property
    def done(self) -> bool:
        return not self.pending


def rounds_needed(scale2: float | None, target: float = CONVERGENCE_TARGET, df_prior: float = 0.0,
                  limit: int = 1000, confidence: float = STOP_CONFIDENCE) -> int | None:
    """Fewest rounds m whose interval (at `confidence`) would be within `target`, for a cell whose variance (on the
    scale of the location's own variance, harness/analysis/inference.py `shape`) is `scale2`:
    t x sqrt(scale2 x factor(m)) <= log(1 + target), with the location's degrees of freedom at m plus `df_prior`.
    None without a variance."""
    if scale2 is None or not math.isfinite(scale2):
        return None
    if scale2 == 0:
        return 1
    goal = math.log1p(target)
    for m in range(2, limit + 1):
        factor, df = inf.shape(m)
        df_all = inf.pooled_df(df, df_prior)
        tail = 0.5 + confidence / 2
        q = float(sps.norm.ppf(tail)) if math.isinf(df_all) else float(sps.t.ppf(tail, df_all))
        if q * math.sqrt(scale2 * factor) <= goal:
            return m
    return limit


def convergence(index: CellIndex, baselines: Mapping[str, str | None], target: float = CONVERGENCE_TARGET,
                min_rounds: int = MIN_CONVERGED_ROUNDS) -> Convergence:
    """For each cell with a baseline (every cell's tok/s where the run has no baseline): converged when the 95%
    interval the report shows for it lies within the target, it has the rounds its host's noise needs for the
    target (the table's prior, so that a cell whose few rounds happened to agree does not stop on that luck) and
    at least `min_rounds`; a cell significantly noisier than the table, or a table too small for a prior, also
    needs its own variance's interval within the target at STOP_CONFIDENCE."""
    logs: dict[CellKey, list[float]] = {}
    shown: dict[CellKey, inf.Estimate | None] = {}
    if any(baselines.get(k.strategy) for k in index.keys):
        table = sp.table(index, baselines)
        for k, s in table.cells.items():
            logs[k] = [math.log(v) for v in s.rounds.values()]
            shown[k] = s.est if s.interval.available else None
    else:
        logs = {k: [math.log(v) for v in index.per_round(k).values()] for k in index.keys}
    out = []
    for host in index.hosts:
        keys = [k for k in logs if k.host == host]
        locs = [inf.locate(logs[k]) for k in keys]
        priors = inf.fit_priors(locs)
        ests, _ = inf.estimates(locs)
        for key, loc, est in zip(keys, locs, ests, strict=True):
            out.append(_cell(key, loc, shown[key] if shown else est,
                             priors[loc.method] if loc is not None else inf.NO_PRIOR, target, min_rounds))
    pending = [c.key for c in out if not c.converged]
    to_run = list(pending)
    for k in pending:
        b = baselines.get(k.strategy)
        bk = CellKey(k.host, b, k.task) if b else None
        if bk is not None and bk in index.cells and bk not in to_run:
            to_run.append(bk)
    return Convergence(target, out, pending, to_run)


def _cell(key: CellKey, loc: inf.Location | None, est: inf.Estimate | None, prior: inf.Prior, target: float,
          min_rounds: int) -> CellConvergence:
    """`est`: the estimate whose interval the report shows for the cell."""
    n = 0 if loc is None else loc.n
    if loc is None or est is None or not est.testable:
        return CellConvergence(key, n, None, False, min_rounds)
    hw = inf.Interval.of(est).half_width(math.exp(est.estimate))
    shown_ok = hw is not None and hw <= target
    # the rounds the shown interval itself needs, its variance per round as it is now
    own = rounds_needed(est.se ** 2 / inf.shape(max(n, 1))[0], target, confidence=inf.CONFIDENCE) or 0
    if prior.d0 > 0 and inf.variance_p(loc, prior) >= inf.OWN_VARIANCE_P:
        need = max(min_rounds, rounds_needed(prior.s02, target, prior.d0) or 0)
        done = n >= need and shown_ok
        return CellConvergence(key, n, None if hw is None else round(hw, 4), done,
                           need if done or n < need else max(need, own, n + 1))
    need = max(min_rounds, rounds_needed(loc.scale2, target) or 0)
    strict = inf.Interval.of(inf.moderate(loc, inf.NO_PRIOR), STOP_CONFIDENCE).half_width(math.exp(loc.estimate))
    done = n >= need and strict is not None and strict <= target and shown_ok
    return CellConvergence(key, n, None if hw is None else round(hw, 4), done,
                           need if done or n < need else max(need, own, n + 1))
