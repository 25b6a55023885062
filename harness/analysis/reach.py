"""How well a run can be reproduced, said before it is shared: a reproduction B is judged on B/A of the speedups
(harness/analysis/reproduction.py), and B/A's interval carries A's uncertainty whatever B does. So a run's own
intervals bound the margins any reproduction can confirm:

- at best (a B that reproduces A exactly, with A's noise per round and the rounds that make B/A's interval
  narrowest, up to LIMIT): about a geometric mean's own 95% half-width, every cell within the widest cell's;
- with a B of A's rounds and A's noise: the half-width of the difference of two such estimates;
- the rounds B needs (A's noise, B/A exactly 1) for a margin, or None where A's own uncertainty puts it out of reach.

Only the author can tighten the first: adding rounds to A (`invoke run --resume RUN --until P`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from harness.analysis import inference as inf
from harness.analysis import reproduction as repro
from harness.analysis import speedups as sp

#: B's rounds considered at most.
LIMIT = 200


def _half(est: inf.Estimate, extra_var: float = 0.0, extra_df: float = math.inf) -> float:
    """The relative 95% half-width of B/A with A's estimate and another independent part of that variance."""
    var = est.se ** 2 + extra_var
    den = (est.se ** 4 / est.df if math.isfinite(est.df) and est.df > 0 else 0.0) + \
        (extra_var ** 2 / extra_df if math.isfinite(extra_df) and extra_df > 0 else 0.0)
    df = var * var / den if den > 0 else math.inf
    q = inf.Estimate(0.0, 1.0, df, est.n, est.method, False).t_quantile()
    return math.expm1(q * math.sqrt(var))


def _b_at(est: inf.Estimate, m: int) -> tuple[float, float]:
    """(variance, df) of B's estimate at m rounds with A's noise per round."""
    f_now, d_now = inf.shape(est.n)
    f, d = inf.shape(m)
    extra = est.df / d_now if d_now > 0 and math.isfinite(est.df) else 1.0
    return est.se ** 2 / f_now * f, min(d * extra, inf.MAX_DF) if d > 0 else math.inf


def rounds_for(ests: Sequence[inf.Estimate], margin: float) -> int | None:
    """B's rounds for every estimate's B/A interval to lie within ±margin, B/A exactly 1 and B's noise A's."""
    need = 0
    for e in ests:
        found = next((m for m in range(sp.MIN_ROUNDS, LIMIT + 1) if _half(e, *_b_at(e, m)) < margin), None)
        if found is None:
            return None
        need = max(need, found)
    return need


@dataclass(frozen=True)
class Reach:
    """The margins a reproduction of this run can confirm (see the module docstring), and B's rounds for the
    default margins."""

    geomeans_best: float | None
    cells_best: float | None
    geomeans_same: float | None
    cells_same: float | None
    rounds: int
    margin: float
    cell_margin: float
    rounds_for_margin: int | None
    rounds_for_cells: int | None


def reach(table: sp.SpeedupTable, margin: float = repro.REPRODUCE_MARGIN) -> Reach | None:
    """What a reproduction of this table could confirm; None without a judged geometric mean."""
    geos = [g.est for g in table.geomeans if g.est is not None and g.est.testable and g.judgement.family]
    cells = [c.est for c in table.cells.values() if c.est is not None and c.est.testable and c.judgement.family]
    if not geos:
        return None

    def best(e: inf.Estimate) -> float:
        return min(_half(e, *_b_at(e, m)) for m in range(sp.MIN_ROUNDS, LIMIT + 1))

    def worst(xs: list[inf.Estimate], same: bool) -> float | None:
        return max((_half(e, *_b_at(e, e.n)) if same else best(e)) for e in xs) if xs else None

    cell_margin = repro.default_cell_margin(margin)
    return Reach(worst(geos, False), worst(cells, False), worst(geos, True), worst(cells, True),
                 max(e.n for e in geos), margin, cell_margin, rounds_for(geos, margin),
                 rounds_for(cells, cell_margin) if cells else None)
