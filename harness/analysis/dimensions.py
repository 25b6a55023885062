"""The speedup against output length and against context depth (tasks expanded from one manifest entry,
harness/intake/dimensions.py), and where it crosses 1.

Each point of a curve is a cell of the run's speedup table (harness/analysis/speedups.py): the strategy against its
baseline on that task (one length, one depth), paired by round, with its 95% interval and its mark, judged with
Holm's procedure over the whole printed speedup table. A curve runs along one dimension with the other held at one
of its values.

The crossover rule. A crossover is named only where the marks show one: a point marked slower and a point marked
faster on the same curve, every marked point on one side of the other. Its uncertainty is the bracket between the
last marked point of one sign and the first of the other (the true crossing lies between them, if the speedup
moves monotonically between measured points); its estimate is where the point estimates cross 1 inside that
bracket, interpolated in log length (linearly in depth where a depth is 0). Marks of both signs that alternate are
said to cross more than once. Without marks of both signs the curve says "no crossover within the range measured",
whatever its point estimates do: an interval that merely touches 1 is no crossing. bench/crossover_check.py checks
the rule by simulation (A/A tables, and a true crossing at a known length)."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from harness import formatter as fm
from harness.analysis.records import CellKey
from harness.analysis.speedups import SpeedupTable, Verdict
from harness.intake.dimensions import family
from harness.store import shapes
from harness.store.runmeta import RunMeta, TaskMeta

#: The dimensions a curve can run along, as the manifest names them.
DIMENSIONS = ("n_predict", "depth")


@dataclass(frozen=True)
class Point:
    """One measured value of a curve: the dimension's value, the estimate (log speedup, None without one) and the
    mark the speedup table gave it (+1 faster, -1 slower, 0 neither)."""

    value: int
    log_speedup: float | None
    mark: int


@dataclass(frozen=True)
class Crossover:
    """What a curve's marks say: `kind` is "none" (no crossover within the range measured), "one" (named: between
    `low` and `high`, estimated at `estimate`, `rising` when the speedup goes from below 1 to above), or "several"
    (marks of both signs alternate)."""

    kind: str
    low: int | None = None
    high: int | None = None
    estimate: float | None = None
    rising: bool | None = None


def mark(verdict: Verdict | str) -> int:
    v = Verdict(verdict)
    return 1 if v is Verdict.FASTER else -1 if v is Verdict.SLOWER else 0


def crossover(points: Sequence[Point]) -> Crossover:
    """The crossover rule (module docstring) on one curve's points, in increasing value."""
    pts = sorted(points, key=lambda p: p.value)
    marked = [p for p in pts if p.mark]
    signs = [p.mark for p in marked]
    if not (1 in signs and -1 in signs):
        return Crossover("none")
    changes = [i for i in range(1, len(marked)) if marked[i].mark != marked[i - 1].mark]
    if len(changes) > 1:
        return Crossover("several")
    a, b = marked[changes[0] - 1], marked[changes[0]]
    inside = [p for p in pts if a.value <= p.value <= b.value and p.log_speedup is not None]
    est = None
    for p, q in zip(inside, inside[1:], strict=False):
        if p.log_speedup is not None and q.log_speedup is not None and (p.log_speedup <= 0) != (q.log_speedup <= 0):
            f = p.log_speedup / (p.log_speedup - q.log_speedup)
            if p.value > 0:
                est = math.exp(math.log(p.value) + f * (math.log(q.value) - math.log(p.value)))
            else:
                est = p.value + f * (q.value - p.value)
            break
    return Crossover("one", a.value, b.value, est, b.mark > 0)


def curves(meta: RunMeta, table: SpeedupTable) -> list[shapes.DimensionCurve]:
    """Every curve of a run's expanded tasks: per host, strategy, entry, dimension and value of the other one."""
    tasks = [t for t in meta.planned_tasks() if t.dims]
    out: list[shapes.DimensionCurve] = []
    by_entry: dict[str, list[TaskMeta]] = defaultdict(list)
    for t in tasks:
        by_entry[family(t.id, t.dims)].append(t)
    sids = [s.id for s in meta.planned_strategies()]
    for host in meta.plan.hosts:
        for sid in sids:
            for entry, ts in by_entry.items():
                for dim in DIMENSIONS:
                    for fixed, line in _lines(ts, dim).items():
                        pts = [_point(table, CellKey(host, sid, t.id), _value(t, dim), t.id) for t in line]
                        if not any(p is not None for p, _ in pts):
                            continue
                        out.append(_curve(host, sid, entry, dim, fixed, pts))
    return out


def _value(t: TaskMeta, dim: str) -> int:
    return t.n_predict if dim == "n_predict" else t.depth


def _lines(ts: list[TaskMeta], dim: str) -> dict[tuple[tuple[str, int], ...], list[TaskMeta]]:
    """The tasks of one entry along `dim`, grouped by the other listed dimension's value (two or more values)."""
    groups: dict[tuple[tuple[str, int], ...], list[TaskMeta]] = defaultdict(list)
    for t in ts:
        dims = dict(t.dims)
        if dim not in dims:
            continue
        groups[tuple((k, v) for k, v in t.dims if k != dim)].append(t)
    return {k: sorted(v, key=lambda t: _value(t, dim)) for k, v in groups.items() if len(v) > 1}


def _point(table: SpeedupTable, key: CellKey, value: int, task: str) -> tuple[Point | None, shapes.DimensionPoint]:
    s = table.cells.get(key)
    if s is None:
        return None, {"value": value, "task": task, "speedup": None, "low": None, "high": None, "mark": 0,
                      "verdict": None, "rounds": 0}
    iv = s.interval
    p = Point(value, None if s.estimate is None else math.log(s.estimate), mark(s.verdict))
    return p, {"value": value, "task": task, "speedup": fm.rounded(s.estimate, 4), "low": fm.rounded(iv.low, 4),
               "high": fm.rounded(iv.high, 4), "mark": p.mark, "verdict": s.verdict.value, "rounds": iv.n}


def _curve(host: str, sid: str, entry: str, dim: str, fixed: tuple[tuple[str, int], ...],
           pts: list[tuple[Point | None, shapes.DimensionPoint]]) -> shapes.DimensionCurve:
    c = crossover([p for p, _ in pts if p is not None])
    return {"host": host, "strategy": sid, "task": entry, "dimension": dim, "fixed": {k: v for k, v in fixed},
            "points": [j for _, j in pts],
            "crossover": {"kind": c.kind, "low": c.low, "high": c.high, "estimate": fm.rounded(c.estimate, 1),
                          "rising": c.rising}}


RULE = ("each point is the strategy's speedup on that task (one output length, one context depth) as the speedup "
        "table gives it: paired by round, 95% interval, marked with Holm's procedure over that whole table. A "
        "crossover is named only where a point marked slower and a point marked faster lie on one curve, all marked "
        "points on either side of each other: it lies between those two points (the bracket is its uncertainty; "
        "the estimate interpolates the point estimates in log length). Otherwise the curve has no crossover within "
        "the range measured, whatever its point estimates do. Checked by simulation in bench/crossover_check.py")


def summary(meta: RunMeta, table: SpeedupTable) -> shapes.Dimensions:
    """The summary's `dimensions` part; empty for a run without lengths or depths listed."""
    found = curves(meta, table)
    return {"dimensions": found, "rules_dimensions": RULE} if found else {}
