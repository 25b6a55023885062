#!/usr/bin/env python3
"""What LLAMA_TRACE=1 costs a speculative server: the demo's draft-simple with and without it, interleaved.

Speculative servers run with LLAMA_TRACE=1 (harness/run/server.py TRACE_ENV) so that they print one line per
draft call, which acceptance by draft position is counted from; the baseline runs without it. If the extra
logging slowed decoding, every speedup would read low by that much. This runs one strategy on one task in pairs
of runs, the two settings in shuffled order within each pair (one fresh container per measurement, as a run
does), and prints tok/s with trace over tok/s without, paired by pair and prompt: the geometric mean with its 95%
interval.

    python3 bench/trace_cost.py [--pairs 6] [--strategy draft-simple] [--task code-edit] [--models-dir models]
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import tempfile
from pathlib import Path

from scipy import stats as st

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness import DEFAULT_MANIFEST  # noqa: E402
from harness.intake import manifest as mf  # noqa: E402
from harness.intake import trust  # noqa: E402
from harness.run import runner, server  # noqa: E402
from harness.store.rundir import RunDir  # noqa: E402


def one(trusted, tmp: Path, name: str, args: argparse.Namespace, trace: bool) -> dict[str, float]:
    """tok/s per prompt of one run of the strategy on the task, with or without the trace setting."""
    saved = server.TRACE_ENV
    server.TRACE_ENV = saved if trace else ()
    try:
        runner.run(trusted, results_dir=tmp, models_dir=args.models_dir, run_id=name, runs=1, progress=False,
                   strategies=[args.strategy], tasks=[args.task], log=lambda s: None, retakes=0)
    finally:
        server.TRACE_ENV = saved
    recs = [r for r in RunDir.open(tmp / name).measurements() if r["status"] == "ok"]
    return {r["prompt"]: r["client"]["decode_tok_s"] for r in recs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--manifest", type=Path, default=DEFAULT_MANIFEST)
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--strategy", default="draft-simple")
    ap.add_argument("--task", default="code-edit")
    ap.add_argument("--models-dir", type=Path, default=Path("models"))
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    trusted = trust.decide(mf.load(args.manifest), False)
    rng = random.Random(args.seed)
    logs, on_all, off_all = [], [], []
    with tempfile.TemporaryDirectory(prefix="specbench-trace-") as tmp:
        for i in range(args.pairs):
            got: dict[bool, dict[str, float]] = {}
            for trace in rng.sample([True, False], 2):
                got[trace] = one(trusted, Path(tmp), f"p{i}-{'on' if trace else 'off'}", args, trace)
            for prompt in got[True].keys() & got[False].keys():
                on, off = got[True][prompt], got[False][prompt]
                logs.append(math.log(on / off))
                on_all.append(on)
                off_all.append(off)
            print(f"pair {i + 1}: with trace {statistics.median(got[True].values()):.1f} tok/s, without "
                  f"{statistics.median(got[False].values()):.1f} tok/s", flush=True)
    n = len(logs)
    if n < 2:
        sys.exit("fewer than two paired measurements")
    m, se = statistics.fmean(logs), statistics.stdev(logs) / math.sqrt(n)
    q = st.t.ppf(0.975, n - 1)
    print(f"{args.strategy} / {args.task}: {n} paired measurements; median tok/s with trace "
          f"{statistics.median(on_all):.1f}, without {statistics.median(off_all):.1f}")
    print(f"with trace / without: {math.exp(m):.3f}x [{math.exp(m - q * se):.3f}, {math.exp(m + q * se):.3f}] "
          f"(geometric mean, 95% interval; log sd of a pair {statistics.stdev(logs):.3f})")


if __name__ == "__main__":
    main()
