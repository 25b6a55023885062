"""Does the power sentence's "at the median noise 1.10x needs about N rounds" hold? Tables shaped like a committed
run (bench/shaped_runs.py: its units, shared baselines, speeds, per-unit noise and round factor), judged by the
kit's own table code (harness/analysis/speedups.py `table`, what `invoke report` prints).

1. The stated N: the committed run's own power line (its `rounds_for`, with the range over the median's bounds).
2. At N rounds (and at half and twice N): the cells nearest the table's median noise are made truly 1.10x faster
   than their baseline, every other cell keeps the committed speed, and the share of those cells marked ▲ is
   counted over many tables. The sentence claims about half (target 40-60% at N).
3. Its stability: the N that tables of the committed run's rounds and noise would print (median, 10th and 90th
   percentile over simulated runs).

The simulated truth is bench/shaped_runs.py's per-unit noise (over all the run's rounds, each round's factor
removed); where it is quieter than the table the kit judged (a sweep's selection rounds), the stated N marks more
than half of the simulated cells: both noises are printed, and --match-noise scales the simulated one to the
table's.

    python3 bench/rounds_projection.py [RUN_DIR] [--tables 100] [--cells 5] [--target 1.10] [--match-noise]
                                       [--kit DIR]"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE / "bench"))
from shaped_runs import Shape  # noqa: E402


def load_kit(path: Path):
    """The speedup table, record index, run folder and summary of a checkout."""
    sys.path.insert(0, str(path))
    from harness.analysis import speedups, summary  # noqa: PLC0415
    from harness.analysis.records import CellIndex  # noqa: PLC0415
    from harness.store.rundir import RunDir  # noqa: PLC0415
    return speedups, CellIndex, summary, RunDir


def median_cells(shape: Shape, k: int) -> list[tuple[str, str]]:
    """The k cells whose true per-round noise is nearest the median of the run's cells."""
    noise = shape.cell_noise(shape.sigma("committed", np.random.default_rng(0)))
    mid = statistics.median(noise.values())
    return sorted(noise, key=lambda c: abs(math.log(noise[c] / mid)))[:k]


def _sigma(shape: Shape, rng: np.random.Generator, scale: float) -> dict:
    return {u: s * scale for u, s in shape.sigma("committed", rng).items()}


def marked_share(kit, shape: Shape, rounds: int, target: float, cells: list[tuple[str, str]], tables: int,
                 rng: np.random.Generator, scale: float = 1.0) -> float:
    speedups, cell_index = kit[:2]
    speeds = shape.speeds("committed")
    for u in shape.units:
        b = shape.baseline_unit(u)
        if b is not None and (u[0], u[1]) in cells:
            speeds[u] = speeds[b] + math.log(target)
    hits = 0
    for _ in range(tables):
        t = speedups.table(cell_index(shape.draw(rounds, _sigma(shape, rng, scale), speeds, rng)), shape.baselines)
        hits += sum(1 for k, s in t.cells.items() if (k.strategy, k.task) in cells and s.verdict.value == "faster")
    return hits / (tables * len(cells))


def stated(kit, shape: Shape, rounds: int, target: float, tables: int, rng: np.random.Generator,
           scale: float = 1.0) -> list[float]:
    """The rounds a table of `rounds` rounds at the committed noise and speeds states (inf where out of reach)."""
    speedups, cell_index = kit[:2]
    out = []
    for _ in range(tables):
        t = speedups.table(cell_index(shape.draw(rounds, _sigma(shape, rng, scale), shape.speeds("committed"),
                                                 rng)), shape.baselines)
        n = t.power().rounds_for.get(target)
        out.append(math.inf if n is None else float(n))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", nargs="?", default=str(HERE / "results" / "demo-cpu"))
    ap.add_argument("--tables", type=int, default=100)
    ap.add_argument("--cells", type=int, default=5, help="cells near the median noise made truly --target faster")
    ap.add_argument("--target", type=float, default=1.10)
    ap.add_argument("--kit", default=str(HERE))
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--match-noise", action="store_true", help="scale the simulated noise so that its median cell "
                    "noise is the committed table's as the kit measured it")
    args = ap.parse_args()
    kit = load_kit(Path(args.kit).resolve())
    shape = Shape.load(Path(args.run))
    t0 = time.monotonic()
    power = kit[2].summarize(kit[3].open(Path(args.run)))["family"]["power"]
    n = power["rounds_for"].get(f"{args.target:.2f}")
    print(f"{shape.run.name}: {power['rounds']} rounds; the power line says: {power['sentence']}")
    if n is None:
        print(f"{args.target:.2f}x is not projected within reach: nothing to check")
        return
    sd = shape.cell_noise(shape.sigma("committed", np.random.default_rng(0)))
    scale = math.sqrt(power["noise"]) / statistics.median(sd.values()) if args.match_noise and power.get("noise") \
        else 1.0
    print(f"the simulated truth's median cell noise (log sd of one paired round): {statistics.median(sd.values()):.4f};"
          " the committed table's, as the kit measured it for the stated rounds: "
          f"{math.sqrt(power['noise']):.4f}" + (f"; simulated noise scaled by {scale:.2f}" if scale != 1 else "")
          if power.get("noise") else "")
    cells = median_cells(shape, args.cells)
    print(f"cells made {args.target:.2f}x faster (nearest the median noise): " + ", ".join("/".join(c) for c in cells))
    print(f"{'rounds':>7} {'marked ▲':>9}")
    for m in sorted({max(3, n // 2), n, 2 * n}):
        share = marked_share(kit, shape, m, args.target, cells, args.tables, np.random.default_rng(args.seed + m),
                             scale)
        print(f"{m:>7} {share:>9.0%}" + ("   <- stated (target 40-60%)" if m == n else ""), flush=True)
    says = stated(kit, shape, power["rounds"], args.target, args.tables, np.random.default_rng(args.seed), scale)
    q = np.quantile(says, [0.1, 0.5, 0.9])
    print(f"stated by {args.tables} simulated {power['rounds']}-round runs of this noise: median {q[1]:g}, "
          f"10th-90th percentile {q[0]:g}-{q[2]:g}")
    print(f"({time.monotonic() - t0:.0f} s)")


if __name__ == "__main__":
    main()
