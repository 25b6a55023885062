"""What `invoke run --until 5%` would do on a run, predicted without measuring: a simulation of a new run of
the same matrix (or, with --continue, of the recorded run continued), round by round, with
harness.analysis.stats.convergence deciding which cells run next.

Each simulated round runs only the cells not yet converged plus the baseline of their tasks (pairing needs it),
in the round's shuffled order; a cell's new tok/s is its recorded median x a round factor x its run noise, both
log-normal with the spreads measured in the recorded run after removing the round effect. The loop stops when every
cell's speedup interval is within the target or at --max-rounds. Prints, per round, how many cells are still
open, and at the end which cells converged, the rounds and measurements used and the time they would take.

    python3 bench/until.py [RUN_DIR] [--target 0.05] [--max-rounds 30] [--seed 0] [--run-noise 0.03] [--continue]

--run-noise replaces the measured per-run noise (log sd), to see what a quieter machine would need.

Once `invoke run --until` exists, run it on the same manifest and compare its rounds and verdicts with this.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from harness import ROOT  # noqa: E402
from harness.analysis import stats  # noqa: E402


def noise_levels(records: list[dict]) -> tuple[float, float]:
    """(per-run log sd after the round effect, log sd of the round factors), from a recorded run."""
    series = stats.normalise(records)
    variances = [statistics.variance([math.log(p.normalised) for p in pts]) for pts in series.values() if len(pts) > 1]
    factors = {(p.round, k): p.factor for k, pts in series.items() for p in pts}
    by_round: dict[int, list[float]] = {}
    for (rd, _), f in factors.items():
        by_round.setdefault(rd, []).append(f)
    round_logs = [math.log(statistics.median(v)) for v in by_round.values()]
    return math.sqrt(statistics.fmean(variances)), statistics.pstdev(round_logs) if len(round_logs) > 1 else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", nargs="?", default=str(ROOT / "results" / "demo-cpu"))
    ap.add_argument("--target", type=float, default=stats.CONVERGENCE_TARGET)
    ap.add_argument("--max-rounds", type=int, default=30)
    ap.add_argument("--baseline", default="baseline")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--run-noise", type=float, default=None, help="per-run log sd instead of the measured one")
    ap.add_argument("--continue", dest="cont", action="store_true", help="add rounds to the recorded ones")
    args = ap.parse_args()
    records = [json.loads(line) for line in (Path(args.run_dir) / "measurements.jsonl").read_text().splitlines()]
    records = [r for r in records if r.get("status") == "ok"]
    run_noise, round_noise = noise_levels(records)
    if args.run_noise is not None:
        print(f"(measured run noise {run_noise:.1%} replaced by {args.run_noise:.1%})")
        run_noise = args.run_noise
    medians = {k: statistics.median(stats.per_round(v).values()) for k, v in stats.group_cells(records).items()}
    wall = statistics.fmean(r["wall_s"] for r in records)
    print(f"{Path(args.run_dir).name}: {len(records)} records, {len(medians)} cells; run noise {run_noise:.1%} "
          f"(log sd after the round effect), round noise {round_noise:.1%}; {wall:.2f} s per measurement")
    rng = np.random.default_rng(args.seed)
    shuffle = random.Random(args.seed)
    if args.cont:
        order = max(r["order"] for r in records) + 1
        rnd = max(r["round"] for r in records) + 1
        conv = stats.convergence(records, args.baseline, args.target)
        print(f"round {rnd - 1} (recorded): {len(conv.pending)} of {len(conv.cells)} cells not within "
              f"±{args.target:.0%}")
    else:
        records, order, rnd, conv = [], 0, 1, None
    added = 0
    while (conv is None or not conv.done) and rnd <= args.max_rounds:
        todo = list(conv.to_run if conv else medians)
        shuffle.shuffle(todo)
        factor = math.exp(rng.normal(0, round_noise))
        for host, s, t in todo:
            v = medians[(host, s, t)] * factor * math.exp(rng.normal(0, run_noise))
            records.append({"strategy": s, "task": t, "host": host, "round": rnd, "run_index": rnd, "order": order,
                            "status": "ok", "client": {"decode_tok_s": v}, "server": {}, "output": {}})
            order += 1
            added += 1
        conv = stats.convergence(records, args.baseline, args.target)
        print(f"round {rnd}: ran {len(todo)} cells, {len(conv.pending)} still open")
        rnd += 1
    done = [c for c in conv.cells if c.converged]
    print(f"\n{len(done)} of {len(conv.cells)} cells within ±{args.target:.0%} after {rnd - 1} rounds; "
          f"{added} measurements added (~{added * wall / 60:.0f} min at {wall:.2f} s each)")
    for c in sorted(conv.cells, key=lambda c: (not c.converged, c.half_width or 9)):
        state = "converged" if c.converged else f"open, ~{c.rounds_estimate} rounds by the spread so far"
        print(f"  {c.strategy:>14} / {c.task:<10} {c.rounds:>3} rounds  ±{c.half_width:.1%}  {state}")


if __name__ == "__main__":
    main()
