"""How often does a speedup interval contain the true speedup? Prints the coverage of harness.analysis.stats' interval
methods (Student-t on the logs, percentile bootstrap of the median, and their hull, which the kit uses from
stats.MIN_BOOTSTRAP_ROUNDS rounds on) over simulated paired rounds, per number of rounds and noise model.

Each simulated round measures a baseline and a strategy once; both see the same round factor (the machine's
state in that round) and their own run noise. The paired ratio cancels the round factor; its log is the true
log speedup plus the difference of two run noises, symmetric whenever both sides share a noise distribution,
so its median is the true speedup.

    python3 bench/interval_coverage.py [--reps 1000] [--resamples 1999]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from harness.analysis import stats  # noqa: E402

TRUE_SPEEDUP = 1.3


def run_noise(rng: np.random.Generator, kind: str, size: int) -> np.ndarray:
    """Log noise of one run: normal 10%; heavy-tailed (Student t, 3 df, scale 8%); interference-like
    (normal 5% plus, one run in five, a slowdown of 10-60%)."""
    if kind == "normal":
        return rng.normal(0, 0.10, size)
    if kind == "heavy":
        return rng.standard_t(3, size) * 0.08
    slow = rng.random(size) < 0.2
    return rng.normal(0, 0.05, size) - slow * rng.uniform(0.1, 0.6, size)


def coverage(kind: str, n: int, method: str, reps: int, resamples: int, rng: np.random.Generator) -> tuple[float,
                                                                                                          float]:
    hit = width = 0.0
    for _ in range(reps):
        rounds = rng.normal(0, 0.15, n)  # the machine's state per round, shared by both cells
        base = 300 * np.exp(rounds + run_noise(rng, kind, n))
        strat = 300 * TRUE_SPEEDUP * np.exp(rounds + run_noise(rng, kind, n))
        iv = stats.median_interval(list(strat / base), method=method, n_resamples=resamples)
        if iv.low is None:
            continue
        hit += iv.low <= TRUE_SPEEDUP <= iv.high
        width += math.log(iv.high / iv.low) / 2
    return hit / reps, width / reps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=1000)
    ap.add_argument("--resamples", type=int, default=1999)
    ap.add_argument("--rounds", type=int, nargs="*", default=[2, 3, 4, 5, 6, 8, 10, 12, 15, 20])
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    rng = np.random.default_rng(1)
    t0 = time.monotonic()
    print(f"coverage of the 95% interval for a true speedup of {TRUE_SPEEDUP} ({args.reps} simulated runs each); "
          "half-width in log units in brackets")
    methods = ("t-log", "bootstrap", "bootstrap+t")
    print(f"{'noise':<13}{'rounds':>7}" + "".join(f"  {m:>16}" for m in methods))
    for kind in ("normal", "heavy", "interference"):
        for n in args.rounds:
            cols = [coverage(kind, n, m, args.reps, args.resamples, rng) if n >= 3 or m == "t-log" else None
                    for m in methods]
            print(f"{kind:<13}{n:>7}" + "".join(f"  {c[0]:6.1%} ({c[1]:.3f})" if c else f"  {'-':>16}"
                                                 for c in cols))
    print(f"({time.monotonic() - t0:.0f} s; a method is fit where its coverage is at least ~94%)")


if __name__ == "__main__":
    main()
