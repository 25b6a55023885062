"""Does the interval for "prompts like these" (harness/analysis/prompt_sample.py) cover a category's speedup over the
prompts it stands for, and how far off is the interval for "these prompts" when read that way?

A category's paired log ratio on prompt j in round r is mu + u_j + e_jr: mu the category's speedup (in logs) over
prompts like these, u_j the prompt's own departure (sd tau; normal, Student-t with 3 df, or a skewed centred
log-normal, each scaled to sd tau), e_jr the round's noise on that prompt (normal, sd sigma). Each simulated category
is drawn with k prompts and R rounds, and judged by the kit's own code: prompt_sample.like_these over the prompts'
means (k - 1 df). Beside it, the "these prompts" interval a cell prints, read as if it were about prompts like these:
the t-interval of the round-wise means over prompts (R - 1 df), which holds the rounds' noise alone.

    python3 bench/prompt_coverage.py [--reps 4000] [--prompts 2 3 5 10] [--rounds 3 5] [--tau 0 0.05 0.2]
                                     [--sigma 0.1 0.3] [--shape normal t3 skewed] [--seed 1]

Prints one row per setting: coverage of mu by each interval (nominal 95%) and the like-these interval's median
half-width in log units.

    python3 bench/prompt_coverage.py --power [--spreads 0.05 0.1 0.2 0.4] [--reps 4000]

checks the report's power sentence instead: for prompts whose mean log speedups spread by sd s, the prompts per
category it says a ±10% interval needs (prompt_sample.prompts_needed) and the half-width it says 2 prompts give,
against the simulated intervals' median half-width and the share of them within ±10%."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.analysis import inference as inf  # noqa: E402
from harness.analysis.prompt_sample import POWER_TARGET, like_these, prompts_needed  # noqa: E402


def departures(rng: np.random.Generator, shape: str, tau: float, size: tuple[int, ...]) -> np.ndarray:
    if tau == 0:
        return np.zeros(size)
    if shape == "normal":
        return rng.normal(0, tau, size)
    if shape == "t3":
        return rng.standard_t(3, size) * tau / math.sqrt(3.0)
    x = rng.lognormal(0, 0.75, size)  # skewed: a few prompts far faster than the rest
    mean, sd = math.exp(0.75**2 / 2), math.sqrt((math.exp(0.75**2) - 1) * math.exp(0.75**2))
    return (x - mean) / sd * tau


def row(rng: np.random.Generator, reps: int, k: int, rounds: int, tau: float, sigma: float, shape: str
        ) -> tuple[float, float, float]:
    mu = 0.2
    y = mu + departures(rng, shape, tau, (reps, k, 1)) + rng.normal(0, sigma, (reps, k, rounds))
    like_hit = these_hit = 0
    widths = []
    t_these = inf._t_isf(0.025, rounds - 1)
    for i in range(reps):
        means = y[i].mean(axis=1)
        est = like_these({f"q{j}": float(m) for j, m in enumerate(means)})
        lo, hi = est.interval()
        like_hit += lo <= mu <= hi
        widths.append((hi - lo) / 2)
        per_round = y[i].mean(axis=0)
        c, se = per_round.mean(), per_round.std(ddof=1) / math.sqrt(rounds)
        these_hit += c - t_these * se <= mu <= c + t_these * se
    return like_hit / reps, these_hit / reps, float(np.median(widths))


def half_widths(rng: np.random.Generator, reps: int, k: int, spread: float) -> np.ndarray:
    """Half-widths (as fractions) of the kit's interval for prompts like these over k prompts whose mean log
    speedups are normal with sd `spread`."""
    out = []
    for means in rng.normal(0.2, spread, (reps, k)):
        lo, hi = like_these({f"q{j}": float(m) for j, m in enumerate(means)}).interval()
        out.append(math.expm1((hi - lo) / 2))
    return np.asarray(out)


def power(rng: np.random.Generator, reps: int, spreads: list[float]) -> None:
    print(f"the power sentence against {reps} simulated categories per row (target ±{POWER_TARGET:.0%})")
    print(f"{'spread':>6} {'prompts':>7} {'said half-width':>15} {'median half-width':>17} {'within target':>13}")
    for sd in spreads:
        need = prompts_needed(sd)
        for k in sorted({2, *([need - 1, need] if need and need > 2 else [])}):
            said = math.expm1(inf._t_isf(0.025, k - 1) * sd / math.sqrt(k))
            hw = half_widths(rng, reps, k, sd)
            tag = " (said needed)" if k == need else ""
            print(f"{sd:6.2f} {k:7d} {said:15.1%} {float(np.median(hw)):17.1%} "
                  f"{float(np.mean(hw <= POWER_TARGET)):13.1%}{tag}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=4000)
    ap.add_argument("--prompts", type=int, nargs="+", default=[2, 3, 5, 10])
    ap.add_argument("--rounds", type=int, nargs="+", default=[3, 5])
    ap.add_argument("--tau", type=float, nargs="+", default=[0.0, 0.05, 0.2])
    ap.add_argument("--sigma", type=float, nargs="+", default=[0.1, 0.3])
    ap.add_argument("--shape", nargs="+", default=["normal", "t3", "skewed"], choices=["normal", "t3", "skewed"])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--power", action="store_true", help="check the power sentence instead of the coverage")
    ap.add_argument("--spreads", type=float, nargs="+", default=[0.05, 0.1, 0.2, 0.4])
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    if a.power:
        power(rng, a.reps, a.spreads)
        return 0
    print(f"coverage of a category's speedup over prompts like these, {a.reps} categories per row (nominal 95%)")
    print(f"{'shape':7} {'prompts':>7} {'rounds':>6} {'tau':>5} {'sigma':>5}  {'like these':>10}  "
          f"{'these prompts':>13}  {'half-width':>10}")
    for shape in a.shape:
        for tau in a.tau:
            if tau == 0 and shape != a.shape[0]:
                continue  # no departures: the shape does not matter
            for sigma in a.sigma:
                for k in a.prompts:
                    for r in a.rounds:
                        like, these, hw = row(rng, a.reps, k, r, tau, sigma, shape)
                        print(f"{shape:7} {k:7d} {r:6d} {tau:5.2f} {sigma:5.2f}  {like:10.1%}  {these:13.1%}  "
                              f"{hw:10.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
