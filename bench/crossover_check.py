"""Does the crossover sentence say only what is there? Simulated speedup tables of a length (or depth) run, judged by
the kit's own table code (harness/analysis/speedups.py `table_of`: each cell's paired log ratios per round, moderated
intervals, Holm over the whole table, cells and geometric means) and its own crossover rule
(harness/analysis/dimensions.py `crossover`), the table counted as printed.

Each table has --strategies strategies, each measured at the values of --values (one curve per strategy); each
cell's per-round paired log ratio is its true log speedup plus noise of log sd sqrt(2) x --noise (a strategy and its
baseline, each with that per-measurement noise), each cell's noise scaled by a log-normal factor of sd --spread
(cells differ in noise, as the committed runs show).

- A/A: every true speedup is 1. A named crossover (or "crosses more than once") in any curve of a table is false;
  printed: the share of tables without any (the rule's claim: at least 95%).
- A true crossover: the log speedup rises by --slope per doubling of the value and crosses 1 at --at. Printed: the
  share of curves whose sentence names a crossover (of all curves drawn), the share of those whose bracket holds the
  true value, the bracket's median width and the estimate's median error (both in doublings of the value).

The simulated cells have no round factor to take out (the kit's run tables also remove one estimated from the
host's other units); each table is the smallest family a run prints for these curves, so the run's own tables, with
more cells in the family, mark less often still.

    python3 bench/crossover_check.py [--tables 1000] [--rounds 3 5 10] [--noise 0.066 0.24] [--values 64 256 1024]
                                     [--strategies 3] [--slope 0.1] [--at 400] [--spread 0.6] [--seed 1]"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from harness import formatter as fm  # noqa: E402
from harness.analysis import dimensions  # noqa: E402
from harness.analysis import speedups as sp  # noqa: E402
from harness.analysis.records import CellKey  # noqa: E402


def draw_table(truth: list[float], values: list[int], strategies: int, rounds: int, noise: float, spread: float,
               rng: np.random.Generator) -> list[dimensions.Crossover]:
    """One simulated table, judged as the report judges it: each strategy's crossover."""
    logs: dict[CellKey, dict[int, float]] = {}
    for s in range(strategies):
        for v, mu in zip(values, truth, strict=True):
            sd = noise * math.sqrt(2) * math.exp(spread * rng.standard_normal())
            logs[CellKey("local", f"s{s}", f"t[n_predict={v}]")] = {
                r: float(mu + sd * rng.standard_normal()) for r in range(1, rounds + 1)}
    table = sp.table_of(logs, {f"s{s}": "baseline" for s in range(strategies)}, ["local"])
    out = []
    for s in range(strategies):
        pts = []
        for v in values:
            c = table.cells[CellKey("local", f"s{s}", f"t[n_predict={v}]")]
            pts.append(dimensions.Point(v, None if c.estimate is None else math.log(c.estimate),
                                        dimensions.mark(c.verdict)))
        out.append(dimensions.crossover(pts))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tables", type=int, default=1000)
    ap.add_argument("--rounds", type=int, nargs="+", default=[3, 5, 10])
    ap.add_argument("--noise", type=float, nargs="+", default=[0.066, 0.24])
    ap.add_argument("--values", type=int, nargs="+", default=[64, 256, 1024])
    ap.add_argument("--strategies", type=int, default=3)
    ap.add_argument("--slope", type=float, default=0.1, help="true log speedup per doubling of the value")
    ap.add_argument("--at", type=float, default=400.0, help="where the true speedup crosses 1")
    ap.add_argument("--spread", type=float, default=0.6)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    values = sorted(args.values)
    slope_truth = [args.slope * math.log2(v / args.at) for v in values]
    print(f"values {values}, {args.strategies} strategies per table, {args.tables} tables per row; true crossing "
          f"at {fm.num(args.at, 0)}, slope {fm.num(args.slope, 3)} per doubling (speedups "
          + ", ".join(fm.ratio(math.exp(t)) for t in slope_truth) + ")")
    print(f"{'noise':>6} {'rounds':>6} | {'A/A: tables w/o false crossover':>31} | {'named':>13} {'holds':>6} "
          f"{'width':>6} {'error':>6}")
    for noise in args.noise:
        for rounds in args.rounds:
            clean = sum(all(c.kind == "none" for c in draw_table([0.0] * len(values), values, args.strategies,
                                                                   rounds, noise, args.spread, rng))
                        for _ in range(args.tables))
            found = [c for _ in range(args.tables)
                     for c in draw_table(slope_truth, values, args.strategies, rounds, noise, args.spread, rng)]
            named = [c for c in found if c.kind == "one"]
            holds = [c for c in named if c.low <= args.at <= c.high]
            width = statistics.median([math.log2(c.high / c.low) for c in named if c.low]) if named else None
            err = statistics.median([abs(math.log2(c.estimate / args.at)) for c in named if c.estimate]) \
                if named else None
            print(f"{fm.num(noise, 3):>6} {rounds:>6} | {fm.pct(clean / args.tables, 1):>31} | "
                  f"{fm.pct(len(named) / len(found), 0) + ' of ' + fm.count(len(found)):>13} "
                  f"{fm.pct(len(holds) / len(named), 0) if named else '-':>6} "
                  f"{fm.num(width, 1) if width is not None else '-':>6} "
                  f"{fm.num(err, 2) if err is not None else '-':>6}")


if __name__ == "__main__":
    main()
