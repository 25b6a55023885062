"""What `invoke run --until 5%` does, without measuring: simulated rounds with harness.analysis.convergence deciding
which cells run next, the same rule the runner uses.

Default: a simulation of a recorded run's matrix (its cells' medians, its measured run and round noise), round by
round, printing how many cells stay open and the measurements it takes.

--coverage N: N simulated tables with known speedups, run until convergence; prints how often the final 95%
interval of the cells that stopped contains the true speedup, by the round they stopped in, for the kit's rule and
for the naive rule (stop when the cell's own Student-t interval is within the target, after 5 rounds; its own
interval judged), at each ratio noise given; and, for the kit's rule, how many of the cells the final
convergence calls converged the report shows wider than the target (none, by the rule).

    python3 bench/until.py [RUN_DIR] [--target 0.05] [--max-rounds 30] [--seed 0] [--run-noise 0.03]
    python3 bench/until.py --coverage 40 [--ratio-noise 0.045 0.08] [--spread 0.6]
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import random
import statistics
import sys
from pathlib import Path

import numpy as np
from scipy import stats as sps

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from harness import ROOT  # noqa: E402
from harness.analysis import contamination as ct  # noqa: E402
from harness.analysis import convergence as cv  # noqa: E402
from harness.analysis import speedups as sp  # noqa: E402
from harness.analysis.records import CellIndex, CellKey  # noqa: E402


def noise_levels(index: CellIndex) -> tuple[float, float]:
    """(per-run log sd after the round effect, log sd of the round factors), from a recorded run."""
    series = ct.normalise(index, ct.units(index))
    variances = [statistics.variance([math.log(p.normalised) for p in pts]) for pts in series.values() if len(pts) > 1]
    by_round: dict[int, list[float]] = collections.defaultdict(list)
    for pts in series.values():
        for p in pts:
            by_round[p.round].append(p.factor)
    round_logs = [math.log(statistics.median(v)) for v in by_round.values()]
    return math.sqrt(statistics.fmean(variances)), statistics.pstdev(round_logs) if len(round_logs) > 1 else 0.0


def record(key: CellKey, rnd: int, order: int, v: float) -> dict:
    return {"strategy": key.strategy, "task": key.task, "host": key.host, "round": rnd, "run_index": rnd,
            "order": order, "status": "ok", "client": {"decode_tok_s": v}, "server": {}, "output": {}}


def simulate(medians: dict[CellKey, float], baselines: dict[str, str | None], run_noise: float | dict[CellKey, float],
             round_noise: float,
             target: float, max_rounds: int, rng: np.random.Generator, shuffle: random.Random,
             rule: str = "kit", log=None) -> tuple[list[dict], dict[CellKey, int]]:
    """Rounds until every cell converged (or max_rounds); returns the records and the round each cell stopped."""
    records: list[dict] = []
    order, rnd = 0, 1
    todo = list(medians)
    stopped: dict[CellKey, int] = {}
    while todo and rnd <= max_rounds:
        shuffle.shuffle(todo)
        factor = math.exp(rng.normal(0, round_noise))
        for k in todo:
            sd = run_noise[k] if isinstance(run_noise, dict) else run_noise
            records.append(record(k, rnd, order, medians[k] * factor * math.exp(rng.normal(0, sd))))
            order += 1
        index = CellIndex(records)
        if rule == "kit":
            conv = cv.convergence(index, baselines, target)
            done = {c.key for c in conv.cells if c.converged}
            todo = conv.to_run
        else:
            done = set()
            for k in medians:
                if baselines.get(k.strategy):
                    logs = list(sp.paired_logs(index, k, baselines[k.strategy]).values())
                    if len(logs) >= cv.MIN_CONVERGED_ROUNDS:
                        h = sps.t.ppf(0.975, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
                        if math.expm1(h) <= target:
                            done.add(k)
            todo = [k for k in medians if baselines.get(k.strategy) and k not in done]
            todo += list(dict.fromkeys(CellKey(k.host, baselines[k.strategy], k.task) for k in todo))
        for k in done:
            stopped.setdefault(k, rnd)
        if log:
            log(f"round {rnd}: ran {len(records) and order}, {len(todo)} cells to run next")
        rnd += 1
    return records, stopped


def coverage(args: argparse.Namespace) -> None:
    rng = np.random.default_rng(args.seed)
    shuffle = random.Random(args.seed)
    tasks = [f"t{i}" for i in range(8)]
    strategies = [f"s{i}" for i in range(6)]
    baselines = {"baseline": None, **{s: "baseline" for s in strategies}}
    print(f"--until ±{args.target:.0%}: coverage of the final 95% interval of the cells that stopped, by the round "
          f"they stopped in ({args.coverage} tables of {len(strategies) * len(tasks)} cells each)")
    for ratio_noise in args.ratio_noise:
        run_noise = ratio_noise / math.sqrt(2)
        for rule in ("naive", "kit"):
            by_stop: dict[int, list[bool]] = collections.defaultdict(list)
            rounds_used = []
            called, wider = 0, 0  # cells the final convergence calls converged; of those, shown wider than the target
            for _ in range(args.coverage):
                truth = {s: math.exp(rng.uniform(math.log(0.4), math.log(1.5))) for s in strategies}
                medians = {CellKey("local", "baseline", t): 100.0 for t in tasks}
                medians.update({CellKey("local", s, t): 100.0 * truth[s] for s in strategies for t in tasks})
                noise = {k: run_noise * math.exp(rng.normal(0, args.spread)) for k in medians} if args.spread \
                    else run_noise
                recs, stopped = simulate(medians, baselines, noise, 0.05, args.target, args.max_rounds, rng,
                                         shuffle, rule)
                table = sp.table(CellIndex(recs), baselines)
                rounds_used.append(max(r["round"] for r in recs))
                if rule == "kit":
                    for c in cv.convergence(CellIndex(recs), baselines, args.target).cells:
                        if c.converged:
                            s = table.cells[c.key]
                            hw = s.interval.half_width(s.estimate)
                            called += 1
                            wider += hw is None or hw > args.target
                for k, rd in stopped.items():
                    if rule == "kit":
                        iv = table.cells[k].interval
                        if iv.available:
                            by_stop[rd].append(iv.low <= truth[k.strategy] <= iv.high)
                        continue
                    logs = np.array(list(sp.paired_logs(CellIndex(recs), k, "baseline").values()))
                    ci = sps.ttest_1samp(logs, 0.0).confidence_interval(0.95)
                    by_stop[rd].append(math.exp(ci.low) <= truth[k.strategy] <= math.exp(ci.high))
            allv = [x for v in by_stop.values() for x in v]
            first = min(by_stop) if by_stop else None
            parts = ", ".join(f"round {rd}: {statistics.fmean(v):.0%} of {len(v)}" for rd, v in sorted(by_stop.items()))
            print(f"ratio noise {ratio_noise:.3f} {rule:>5}: {statistics.fmean(allv) if allv else float('nan'):.1%} "
                  f"overall; first stoppers (round {first}) {statistics.fmean(by_stop[first]) if first else 0:.1%}; "
                  f"median rounds {statistics.median(rounds_used):.0f}; by stopping round: {parts}"
                  + (f"; called converged but shown wider than ±{args.target:.0%}: {wider} of {called}"
                     if rule == "kit" else ""), flush=True)


def replay(args: argparse.Namespace) -> None:
    records = [json.loads(line) for line in (Path(args.run_dir) / "measurements.jsonl").read_text().splitlines()]
    index = CellIndex([r for r in records if r.get("status") == "ok"])
    run_noise, round_noise = noise_levels(index)
    if args.run_noise is not None:
        print(f"(measured run noise {run_noise:.1%} replaced by {args.run_noise:.1%})")
        run_noise = args.run_noise
    meta = json.loads((Path(args.run_dir) / "run.json").read_text())
    baselines = {s["id"]: s["baseline"] for s in meta["strategies"]}
    medians = {k: statistics.median(index.per_round(k).values()) for k in index.keys if index.per_round(k)}
    wall = statistics.fmean(r["wall_s"] for r in records if r.get("status") == "ok")
    print(f"{Path(args.run_dir).name}: {len(index.measurements)} records, {len(medians)} cells; run noise "
          f"{run_noise:.1%} (log sd after the round effect), round noise {round_noise:.1%}; {wall:.2f} s per "
          "measurement")
    recs, stopped = simulate(medians, baselines, run_noise, round_noise, args.target, args.max_rounds,
                             np.random.default_rng(args.seed), random.Random(args.seed), "kit", print)
    conv = cv.convergence(CellIndex(recs), baselines, args.target)
    done = [c for c in conv.cells if c.converged]
    print(f"\n{len(done)} of {len(conv.cells)} cells within ±{args.target:.0%} after "
          f"{max(r['round'] for r in recs)} rounds; {len(recs)} measurements (~{len(recs) * wall / 60:.0f} min at "
          f"{wall:.2f} s each)")
    for c in sorted(conv.cells, key=lambda c: (not c.converged, c.half_width or 9)):
        state = "converged" if c.converged else f"open, ~{c.rounds_estimate} rounds needed"
        hw = "-" if c.half_width is None else f"±{c.half_width:.1%}"
        print(f"  {c.key.strategy:>14} / {c.key.task:<10} {c.rounds:>3} rounds  {hw}  {state}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", nargs="?", default=str(ROOT / "results" / "demo-cpu"))
    ap.add_argument("--target", type=float, default=cv.CONVERGENCE_TARGET)
    ap.add_argument("--max-rounds", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--run-noise", type=float, default=None, help="per-run log sd instead of the measured one")
    ap.add_argument("--coverage", type=int, default=0, help="simulated tables for the coverage figures")
    ap.add_argument("--ratio-noise", type=float, nargs="*", default=[0.045, 0.08])
    ap.add_argument("--spread", type=float, default=0.0,
                    help="--coverage: each cell's noise times exp(N(0, spread)) (heterogeneous noise, e.g. 0.6)")
    args = ap.parse_args()
    coverage(args) if args.coverage else replay(args)


if __name__ == "__main__":
    main()
