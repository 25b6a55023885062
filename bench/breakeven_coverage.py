#!/usr/bin/env python3
"""Does the break-even interval cover the true break-even length 95% of the time?

harness/analysis/breakeven.py fits, per round, a line of paired speedup against synthetic acceptance length, and
gives Fieller's 95% interval for where the mean line crosses 1 (t with rounds - 1 degrees of freedom). This draws
runs of known truth and counts how often the printed interval holds the true crossing:

- truth: tok/s of the strategy at length L over the baseline's = c0 + c1 L (a step's cost fixed: c0 = 0; a step
  that costs a little more as more is accepted: c0 < 0), crossing 1 at L* = (1 - c0) / c1;
- each round: a round factor shared by every measurement of the round (cancels in the pairing), one baseline
  measurement shared by every length of the round (its noise moves the whole round's line), and each length's own
  measurement, log-normal with per-measurement sd sigma (the committed demo: 0.07-0.39);
- an unbounded interval (slope not distinguishable from 0) counts as covering; its share is printed.

    python3 bench/breakeven_coverage.py [--sims 2000] [--seed 1]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.analysis import breakeven as be  # noqa: E402

#: (name, lengths, c0, c1): the demo's draft-simple (n_max 8), a DFlash-like drafter at n_max 3, a costlier step
CASES = [("n_max 8, L* 1.67", [1, 2, 3, 5, 9], 0.0, 0.6),
         ("n_max 3, L* 2.5", [1, 2, 3, 4], 0.0, 0.4),
         ("n_max 8, affine, L* 3.0", [1, 2, 3, 5, 9], -0.2, 0.4)]
ROUNDS = [3, 5, 8]
SIGMAS = [0.05, 0.1, 0.2, 0.3]


def simulate(rng: np.random.Generator, lengths: list[float], c0: float, c1: float, rounds: int,
             sigma: float) -> be.Crossing | None:
    by_round = {}
    for r in range(rounds):
        rho = rng.normal(0, 0.1)
        base = math.exp(rho + rng.normal(0, sigma))
        by_round[r] = {x: (c0 + c1 * x) * math.exp(rho + rng.normal(0, sigma)) / base for x in lengths}
    return be.crossing(by_round)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sims", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    print(f"{'case':<26} {'rounds':>6} {'sigma':>6} {'coverage':>9} {'unbounded':>10} {'median width':>13} "
          f"{'median L':>9}")
    worst = 1.0
    for name, lengths, c0, c1 in CASES:
        truth = (1 - c0) / c1
        for rounds in ROUNDS:
            for sigma in SIGMAS:
                covered = unbounded = 0
                widths, ests = [], []
                for _ in range(args.sims):
                    c = simulate(rng, lengths, c0, c1, rounds, sigma)
                    if c.lo is None or c.hi is None:
                        covered += 1
                        unbounded += 1
                        continue
                    covered += c.lo <= truth <= c.hi
                    widths.append(c.hi - c.lo)
                    ests.append(c.length)
                cov = covered / args.sims
                worst = min(worst, cov)
                print(f"{name:<26} {rounds:>6} {sigma:>6.2f} {cov:>9.3f} {unbounded / args.sims:>10.3f} "
                      f"{statistics.median(widths) if widths else float('nan'):>13.3f} "
                      f"{statistics.median(ests) if ests else float('nan'):>9.3f}")
    print(f"lowest coverage: {worst:.3f} (target 0.95; {args.sims} simulated runs per row)")


if __name__ == "__main__":
    main()
