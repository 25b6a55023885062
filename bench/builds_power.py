"""Does the builds table's power sentence hold? "A cell of the table's median noise is marked ▼ about half the time
when its true B/A is X": tables of B/A per round shaped like a committed run of several builds (its cells, its
rounds, each cell's log sd as committed), judged by the kit's own table (harness/analysis/speedups.py `table_of`,
what the builds tables print), the cell of median noise set to the stated X (every other at 1), the share of tables
that mark it ▼ counted; and, for the audit's figure, the share that mark a true 0.75x there.

    python3 bench/builds_power.py [RUN_DIR] [--tables 400] [--kit DIR]"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent.parent


def load_kit(path: Path):
    sys.path.insert(0, str(path))
    from harness.analysis import builds, speedups, summary  # noqa: PLC0415
    from harness.analysis.records import CellIndex  # noqa: PLC0415
    from harness.store.rundir import RunDir  # noqa: PLC0415
    return builds, speedups, summary, CellIndex, RunDir


def share_marked(sp, logs, against, hosts, target, truth: float, rounds: int, tables: int,
                 rng: np.random.Generator) -> float:
    sd = {k: statistics.stdev(v.values()) if len(v) > 1 else 0.0 for k, v in logs.items()}
    hits = 0
    for _ in range(tables):
        drawn = {k: {r: (math.log(truth) if k == target else 0.0) + rng.normal(0, sd[k]) for r in range(1, rounds + 1)}
                 for k in logs}
        t = sp.table_of(drawn, against, hosts)
        hits += t.cells[target].verdict.value == "slower"
    return hits / tables


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", nargs="?", default=str(HERE / "results" / "builds-gemma3-270m"))
    ap.add_argument("--tables", type=int, default=400)
    ap.add_argument("--kit", default=str(HERE))
    ap.add_argument("--seed", type=int, default=5)
    args = ap.parse_args()
    builds, sp, summary, cell_index, run_dir = load_kit(Path(args.kit).resolve())
    t0 = time.monotonic()
    rd = run_dir.open(Path(args.run))
    meta, index = rd.read_meta(), cell_index(rd.measurements())
    s = summary.summarize(rd)
    names = list(meta.builds)
    for comp, (a, b) in zip(s["builds"]["comparisons"], [(names[0], n) for n in names[1:]], strict=True):
        tok_logs, speed_logs, against = builds.paired(meta, index, a, b)
        for label, logs in (("tok_s", tok_logs), ("speedup", speed_logs)):
            logs = {k: v for k, v in logs.items() if len(v) >= 2}
            power = comp[label]["family"]["power"]
            print(f"{comp['build']} / {comp['against']} {label}: {power['sentence']}")
            if not logs or power["cells_below"] is None:
                continue
            sd = {k: statistics.stdev(v.values()) for k, v in logs.items()}
            target = sorted(sd, key=sd.get)[len(sd) // 2]
            rounds = power["rounds"]
            for truth in (power["cells_below"], 0.75):
                share = share_marked(sp, logs, against, meta.plan.hosts, target, truth, rounds, args.tables,
                                     np.random.default_rng(args.seed))
                print(f"  {target.strategy}/{target.task} (median noise, log sd {sd[target]:.3f}) truly "
                      f"{truth:.4g}x: marked ▼ in {share:.1%} of {args.tables} tables"
                      + ("   <- stated (about half)" if truth == power["cells_below"] else ""), flush=True)
    print(f"({time.monotonic() - t0:.0f} s)")


if __name__ == "__main__":
    main()
