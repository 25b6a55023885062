"""How often does a speedup interval contain the true speedup, and does one slow outlier fool it? Prints, per
noise model and number of rounds, the coverage and median half-width of:

- kit:        the kit's method (harness/analysis/inference.py): the mean of the log ratios below TRIM_FROM rounds,
              the 20%-trimmed mean from there, the variance moderated toward the table's other cells;
- own-t:      a Student-t interval on the cell's own log ratios (the kit's method before moderation);
- BCa-median: scipy.stats.bootstrap's BCa interval of the median (from 10 rounds; the robust alternative);
- hull:       the hull of the percentile bootstrap of the median and own-t (the kit's earlier method from 10).

Each simulated table has CELLS cells measured in paired rounds: both sides of a pair see the same round factor and
their own run noise, so the log ratio is the true log speedup plus the difference of two run noises. Noise models:
normal 10%; heavy-tailed (Student t, 3 df, scale 8%); interference-like (5% plus, one run in five, a slowdown of
10-60%); mixed (each cell's sd drawn between 5% and 40%, log-uniform). The outlier rows add, in every cell, one
round whose strategy measurement was 3x slower; "faster" is the share of cells whose interval lies above 1 (the
truth is 1.3x, so a robust method says faster almost always).

    python3 bench/interval_coverage.py [--reps 200] [--resamples 999] [--rounds 3 5 10 15]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import warnings
from pathlib import Path

import numpy as np
from scipy import stats as sps

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from harness.analysis import inference as inf  # noqa: E402

TRUE = math.log(1.3)
CELLS = 40
METHODS = ("kit", "own-t", "BCa-median", "hull")


def run_noise(rng: np.random.Generator, kind: str, shape: tuple[int, int], sd: np.ndarray) -> np.ndarray:
    if kind in ("normal", "mixed"):
        return rng.normal(0, 1, shape) * sd[:, None]
    if kind == "heavy":
        return rng.standard_t(3, shape) * 0.08
    slow = rng.random(shape) < 0.2
    return rng.normal(0, 0.05, shape) - slow * rng.uniform(0.1, 0.6, shape)


def table(rng: np.random.Generator, kind: str, n: int, outlier: bool) -> np.ndarray:
    """CELLS x n log ratios."""
    sd = np.exp(rng.uniform(math.log(0.05), math.log(0.40), CELLS)) if kind == "mixed" else np.full(CELLS, 0.10)
    logs = TRUE + run_noise(rng, kind, (CELLS, n), sd) - run_noise(rng, kind, (CELLS, n), sd)
    if outlier:
        logs[:, rng.integers(0, n)] -= math.log(3)
    return logs


def intervals(logs: np.ndarray, method: str, resamples: int, rng: np.random.Generator) -> list[tuple[float, float]]:
    if method == "kit":
        ests, _ = inf.estimates([inf.locate(list(row)) for row in logs])
        return [e.interval() for e in ests]
    out = []
    for row in logs:
        t = sps.ttest_1samp(row, 0.0).confidence_interval(0.95)
        if method == "own-t":
            out.append((t.low, t.high))
            continue
        kind = "BCa" if method == "BCa-median" else "percentile"
        res = sps.bootstrap((row,), np.median, method=kind, n_resamples=resamples, vectorized=True,
                            random_state=rng)
        lo, hi = res.confidence_interval.low, res.confidence_interval.high
        out.append((lo, hi) if method == "BCa-median" else (min(lo, t.low), max(hi, t.high)))
    return out


def measure(kind: str, n: int, outlier: bool, method: str, reps: int, resamples: int,
            rng: np.random.Generator) -> tuple[float, float, float]:
    hit = faster = total = 0
    widths = []
    for _ in range(reps):
        for lo, hi in intervals(table(rng, kind, n, outlier), method, resamples, rng):
            if not (math.isfinite(lo) and math.isfinite(hi)):
                continue
            total += 1
            hit += lo <= TRUE <= hi
            faster += lo > 0
            widths.append((hi - lo) / 2)
    return hit / total, float(np.median(widths)), faster / total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=200, help="simulated tables per row (each of 40 cells)")
    ap.add_argument("--resamples", type=int, default=999)
    ap.add_argument("--rounds", type=int, nargs="*", default=[3, 5, 10, 15])
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    rng = np.random.default_rng(1)
    t0 = time.monotonic()
    print(f"true speedup 1.3x; {CELLS} cells per table, {args.reps} tables per row; coverage of the 95% interval, "
          "median half-width in log units, and (outlier rows) the share called faster by the cell's own interval")
    print(f"{'noise':<13}{'rounds':>7}{'outlier':>8}" + "".join(f"  {m:>24}" for m in METHODS))
    for kind in ("normal", "heavy", "interference", "mixed"):
        for n in args.rounds:
            for outlier in (False, True) if kind == "normal" else (False,):
                cells = []
                for m in METHODS:
                    if m in ("BCa-median", "hull") and n < 10:
                        cells.append(f"  {'-':>24}")
                        continue
                    reps = args.reps if m in ("kit", "own-t") else max(10, args.reps // 10)
                    cov, hw, fast = measure(kind, n, outlier, m, reps, args.resamples, rng)
                    extra = f" f{fast:4.0%}" if outlier else ""
                    cells.append(f"  {cov:6.1%} ({hw:.3f}){extra:>7}")
                print(f"{kind:<13}{n:>7}{'yes' if outlier else '':>8}" + "".join(cells), flush=True)
    print(f"({time.monotonic() - t0:.0f} s; a method is fit where its coverage is at least ~94%)")


if __name__ == "__main__":
    main()
