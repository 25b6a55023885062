#!/usr/bin/env python3
"""Kit overhead per measurement on the demo, and client-side vs server-side decode rate. Prints figures.

overhead = wall time of a measurement - (container start to ready) - (timed request) - (baseline's untimed
probability request) - (container stop and removal); i.e. what the kit adds: memory read, HTTP client,
bookkeeping. Docker's own container start and stop are shown beside it.

    python3 bench/overhead.py                 # a fresh demo run (2 runs per cell) on the local engine
    python3 bench/overhead.py --run-dir D     # figures of an existing run folder
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness import DEFAULT_MANIFEST  # noqa: E402
from harness.intake import manifest as mf  # noqa: E402
from harness.intake import trust  # noqa: E402
from harness.run import runner  # noqa: E402
from harness.store.rundir import RunDir  # noqa: E402


def figures(run_dir: Path, matrix_wall_s: float | None) -> None:
    recs = [r for r in RunDir.open(run_dir).measurements() if r["status"] == "ok"]
    fresh = [r for r in recs if r["protocol"] == "fresh-container"]
    if not fresh:
        sys.exit(f"{run_dir}: no successful fresh-container measurements")
    over = [r["timing"]["overhead_s"] for r in fresh]
    start = [r["timing"]["container_start_s"] for r in fresh]
    load = [r["timing"]["load_s"] for r in fresh]
    req = [r["timing"]["request_s"] for r in fresh]
    wall = [r["wall_s"] for r in fresh]
    stop = [r["timing"].get("stop_s", 0.0) for r in fresh]
    ratio = [r["client"]["decode_tok_s"] / r["server"]["predicted_per_second"] for r in fresh
             if r["client"]["decode_tok_s"] and r["server"]["predicted_per_second"]]
    med = statistics.median
    print(f"measurements: {len(fresh)} ({run_dir})")
    print(f"per measurement, median: wall {med(wall):.3f} s = container start {med(start):.3f} s + load (health) "
          f"{med(load):.3f} s + request {med(req):.3f} s + container stop/remove {med(stop):.3f} s "
          f"+ kit overhead {med(over):.3f} s")
    print(f"Docker container start + stop: median {med(start) + med(stop):.3f} s, "
          f"{(sum(start) + sum(stop)) / sum(wall):.1%} of the measurements' wall time")
    print(f"kit overhead: median {med(over):.3f} s, max {max(over):.3f} s, "
          f"{sum(over) / sum(wall):.1%} of the measurements' wall time")
    if matrix_wall_s:
        print(f"matrix wall time {matrix_wall_s:.1f} s; sum of measurements {sum(r['wall_s'] for r in recs):.1f} s; "
              f"outside measurements {matrix_wall_s - sum(r['wall_s'] for r in recs):.1f} s")
    print(f"client-side decode tok/s / server predicted_per_second: median {med(ratio):.4f} "
          f"(min {min(ratio):.4f}, max {max(ratio):.4f})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run-dir", type=Path, help="report on this run folder instead of running")
    ap.add_argument("--manifest", type=Path, default=DEFAULT_MANIFEST)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--models-dir", type=Path, default=Path("models"))
    args = ap.parse_args()
    if args.run_dir:
        figures(args.run_dir, None)
        return
    with tempfile.TemporaryDirectory(prefix="specbench-overhead-") as tmp:
        t0 = time.monotonic()
        print(runner.run(trust.decide(mf.load(args.manifest), False), results_dir=Path(tmp),
                         models_dir=args.models_dir, run_id="overhead", runs=args.runs, progress=False,
                         log=lambda s: None))
        figures(Path(tmp) / "overhead", time.monotonic() - t0)


if __name__ == "__main__":
    main()
