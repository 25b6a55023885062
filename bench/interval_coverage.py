"""Do the speedup intervals cover the truth for the noisiest cells too, are the printed tables' marks right, and what
can the rounds mark? Judged by the kit's own table code (harness/analysis/speedups.py `table`, what `invoke report`
prints) on runs shaped like the committed ones (bench/shaped_runs.py: their strategies, shared baselines, tasks,
prompts, speeds and per-unit noise, a round factor per round).

Per committed run, noise model and number of rounds it prints:
- coverage of the 95% cell intervals, overall and in each quartile of the cells' true noise (within each table);
- the share of A/A tables (every true speedup 1) whose printed marks, cells and geometric means, include a false
  ▲ or ▼;
- power: the share of cells marked ▲ when every strategy is truly 1.1x (and 1.3x) faster than its baseline;
- the median half-width of the cell intervals (log units).

Noise models: committed (each unit's own noise in the committed run), spread (that times a log-normal factor of sd
0.6 per unit), t3 (the committed noise with Student-t tails, 3 degrees of freedom, scaled to the same sd).

    python3 bench/interval_coverage.py [--runs results/demo-cpu ...] [--tables 200] [--rounds 3 5 10]
                                       [--noise committed spread t3] [--kit DIR]

--kit judges the same tables with another checkout's analysis (for before/after figures)."""

from __future__ import annotations

import argparse
import math
import sys
import time
import warnings
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE / "bench"))
from shaped_runs import Shape  # noqa: E402

RUNS = ("results/demo-cpu", "results/real-gemma3-270m", "results/real-gemma3-270m-sweep")
MARKED = ("faster", "slower")


def load_kit(path: Path):
    """The speedup table and record index of a checkout."""
    sys.path.insert(0, str(path))
    from harness.analysis import speedups  # noqa: PLC0415
    from harness.analysis.records import CellIndex  # noqa: PLC0415
    return speedups, CellIndex


def judge(kit, shape: Shape, records: list[dict]):
    speedups, cell_index = kit
    return speedups.table(cell_index(records), shape.baselines)


def aa_row(kit, shape: Shape, kind: str, rounds: int, tables: int, rng: np.random.Generator) -> dict:
    """Coverage by noise quartile and the printed tables' false marks, from A/A tables."""
    hits, quart, width, false_tables = [], [], [], 0
    speeds = shape.speeds("aa")
    for _ in range(tables):
        sigma = shape.sigma("committed" if kind == "t3" else kind, rng)
        table = judge(kit, shape, shape.draw(rounds, sigma, speeds, rng, "t3" if kind == "t3" else "normal"))
        noise = shape.cell_noise(sigma)
        cells = [s for s in table.cells.values() if s.interval.available]
        if not cells:
            continue
        cuts = np.quantile([noise[(s.strategy, s.task)] for s in cells], [0.25, 0.5, 0.75])
        for s in cells:
            hits.append(s.interval.low <= 1.0 <= s.interval.high)
            quart.append(int(np.searchsorted(cuts, noise[(s.strategy, s.task)], side="right")))
            width.append(math.log(s.interval.high / s.interval.low) / 2)
        marks = [x.verdict.value for x in [*table.cells.values(), *table.geomeans]]
        false_tables += any(m in MARKED for m in marks)
    hits_a, quart_a = np.array(hits), np.array(quart)
    return {"coverage": hits_a.mean(), "quartiles": [hits_a[quart_a == q].mean() for q in range(4)],
            "false": false_tables / tables, "width": float(np.median(width))}


def power(kit, shape: Shape, kind: str, rounds: int, truth: float, tables: int, rng: np.random.Generator) -> float:
    """Share of cells marked faster when every strategy is `truth` times faster than its baseline."""
    speeds = shape.speeds(truth)
    marked = total = 0
    for _ in range(tables):
        sigma = shape.sigma("committed" if kind == "t3" else kind, rng)
        table = judge(kit, shape, shape.draw(rounds, sigma, speeds, rng, "t3" if kind == "t3" else "normal"))
        total += len(table.cells)
        marked += sum(s.verdict.value == "faster" for s in table.cells.values())
    return marked / total if total else math.nan


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", nargs="*", default=list(RUNS), help="committed run folders whose shape to use")
    ap.add_argument("--tables", type=int, default=200, help="A/A tables per row (a quarter as many per power row)")
    ap.add_argument("--rounds", type=int, nargs="*", default=[3, 5, 10])
    ap.add_argument("--noise", nargs="*", default=["committed", "spread", "t3"])
    ap.add_argument("--kit", default=str(HERE), help="checkout whose analysis judges the tables")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    kit = load_kit(Path(args.kit).resolve())
    t0 = time.monotonic()
    print(f"analysis of {args.kit}; {args.tables} A/A tables per row; coverage of the 95% cell intervals overall and "
          "by quartile of the cells' true noise (q4 the noisiest); tables as printed (cells and geometric means) "
          "with any false mark; share of cells marked faster at a true 1.1x / 1.3x")
    print(f"{'run':<24}{'noise':<10}{'rounds':>6}{'coverage':>10}{'q1':>7}{'q2':>7}{'q3':>7}{'q4':>7}"
          f"{'false tables':>14}{'1.1x':>7}{'1.3x':>7}{'half-width':>12}")
    for run in args.runs:
        shape = Shape.load(HERE / run if not Path(run).is_absolute() else Path(run))
        for kind in args.noise:
            for rounds in args.rounds:
                rng = np.random.default_rng(args.seed)
                row = aa_row(kit, shape, kind, rounds, args.tables, rng)
                p11 = power(kit, shape, kind, rounds, 1.1, max(10, args.tables // 4), rng)
                p13 = power(kit, shape, kind, rounds, 1.3, max(10, args.tables // 4), rng)
                q = "".join(f"{x:>7.1%}" for x in row["quartiles"])
                print(f"{Path(run).name:<24}{kind:<10}{rounds:>6}{row['coverage']:>10.1%}{q}{row['false']:>14.1%}"
                      f"{p11:>7.1%}{p13:>7.1%}{row['width']:>12.3f}", flush=True)
    print(f"({time.monotonic() - t0:.0f} s; targets: q4 coverage at least 93%, false tables at most 5%)")


if __name__ == "__main__":
    main()
