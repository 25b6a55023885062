"""How many cells does a busy first round leave without a verdict, with the retakes spent in a shuffled order (the
kit's earlier rule) or by the pairs they restore (harness/analysis/gaps.py)? Prints, per share of round 1 that
other work disturbed and per cap of retakes, the cells left with fewer than 3 paired rounds (of those that have a
baseline) and the pairs the retakes restored, averaged over simulated runs.

The plan is a manifest's (default: the demo's: 17 strategies x 8 tasks, 3 runs, its confirmation rounds left
out); each measurement of round 1 is disturbed with the given probability, rounds 2 and 3 are quiet, and a retake
finds the host quiet (the issue's case: a busy start, then a quiet machine). The cap defaults to the kit's (10% of
the planned measurements).

    python3 bench/retake_priority.py [--manifest M] [--reps 50] [--busy 0.25 0.5 0.75] [--caps 20 40 80]
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from harness import DEFAULT_MANIFEST  # noqa: E402
from harness.analysis import gaps  # noqa: E402
from harness.analysis.speedups import MIN_ROUNDS  # noqa: E402
from harness.intake import manifest as mf  # noqa: E402
from harness.run import plan as pl  # noqa: E402


def simulate(plan: pl.Plan, baselines: dict[str, str | None], busy: float, cap: int, rule: str,
             seed: str) -> tuple[int, int]:
    """One run: (cells with fewer than MIN_ROUNDS paired rounds, pairs the retakes restored)."""
    slots = [(i.host, i.cell.strategy.id, i.cell.task.id, i.cell.prompt.id, i.round) for i in plan.items]
    host = random.Random(seed)  # the same disturbed measurements for both rules
    disturbed = [s for s in slots if s[4] == 1 and host.random() < busy]
    rng = random.Random(f"{seed}:{rule}")
    present = set(slots) - set(disturbed)
    open_ = [gaps.Gap("/".join(map(str, s)), s, "disturbed") for s in disturbed]
    if rule == "shuffled":
        rng.shuffle(open_)
        chosen = open_[:cap]
    else:
        chosen = gaps.choose(open_, present, baselines, cap, seed)
    restored = gaps.restored(chosen, present, baselines)
    present |= {g.slot for g in chosen}
    blank = 0
    for s in plan.strategies:
        b = baselines.get(s.id)
        if not b:
            continue
        for t in plan.tasks:
            rounds = {r for r in range(1, plan.runs + 1)
                      if any(("local", s.id, t.id, p.id, r) in present and ("local", b, t.id, p.id, r) in present
                             for p in t.prompts)}
            blank += len(rounds) < MIN_ROUNDS
    return blank, restored


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--manifest", type=Path, default=DEFAULT_MANIFEST)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--busy", type=float, nargs="+", default=[0.25, 0.5, 0.75])
    ap.add_argument("--caps", type=int, nargs="+", default=None)
    args = ap.parse_args()
    m = mf.load(args.manifest)
    plan = pl.make_plan(m, ["local"], shuffle_seed=0)
    baselines = {s.id: (b.id if (b := m.baseline_for(s)) is not None and b.id != s.id else None)
                 for s in plan.strategies}
    cells = sum(1 for s in plan.strategies if baselines[s.id]) * len(plan.tasks)
    caps = args.caps or [plan.retake_cap // 2, plan.retake_cap, plan.retake_cap * 2]
    print(f"{m.name}: {len(plan.items)} planned measurements, {cells} cells with a baseline, default cap "
          f"{plan.retake_cap}; {args.reps} runs each; round 1 disturbed at the given share, the rest quiet")
    print(f"{'busy':>5} {'cap':>4} | {'blank cells: shuffled':>22} {'by pairs':>9} | {'pairs restored: shuffled':>25} "
          f"{'by pairs':>9}")
    for busy in args.busy:
        for cap in caps:
            out = {}
            for rule in ("shuffled", "pairs"):
                runs = [simulate(plan, baselines, busy, cap, rule, f"{busy}:{rep}") for rep in range(args.reps)]
                out[rule] = (sum(b for b, _ in runs) / args.reps, sum(r for _, r in runs) / args.reps)
            print(f"{busy:>5.0%} {cap:>4} | {out['shuffled'][0]:>22.1f} {out['pairs'][0]:>9.1f} | "
                  f"{out['shuffled'][1]:>25.1f} {out['pairs'][1]:>9.1f}")
    print(f"(a cell is blank with fewer than {MIN_ROUNDS} paired rounds; a strategy's retake restores at most one "
          "pair, a baseline's one for every strategy on its task and prompt)")


if __name__ == "__main__":
    main()
