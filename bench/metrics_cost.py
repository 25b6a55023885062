#!/usr/bin/env python3
"""What reading the server's own counters costs, and that it stays out of the timed window.

Speculative servers run with `--metrics` and the protocol reads `GET /metrics` before and after the timed request
(harness/run/protocol.py, harness/run/metrics.py). This runs one speculative strategy on one task through the kit's
own runner (one fresh container per measurement) and times every scrape and every timed (streamed) request from
the client's side: it prints each scrape's cost, how many scrapes overlapped a timed request (0: none was inside
the window), and whether each request's counters agree with its `timings` (drafted, accepted). With `--pairs N`
it also measures N pairs of runs with and without `--metrics`, in shuffled order, and prints tok/s with over
without, paired by pair and prompt (the flag only serves an endpoint; the counters are kept either way).

    python3 bench/metrics_cost.py [--runs 3] [--pairs 0] [--strategy ngram-mod] [--task code-edit] [--models-dir models]
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from scipy import stats as st

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness import DEFAULT_MANIFEST  # noqa: E402
from harness.intake import manifest as mf  # noqa: E402
from harness.intake import trust  # noqa: E402
from harness.run import client, metrics, runner, server  # noqa: E402
from harness.store.rundir import RunDir  # noqa: E402

Spans = list[tuple[float, float]]


def timed(fn, spans: Spans):
    def wrapper(*a, **k):
        t0 = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            spans.append((t0, time.perf_counter()))
    return wrapper


def run(trusted, tmp: Path, name: str, args: argparse.Namespace, runs: int, with_metrics: bool = True,
        scrapes: Spans | None = None, windows: Spans | None = None) -> list[dict]:
    """The ok records of one run of the strategy on the task; scrapes and timed requests timed into the lists."""
    saved = (server.METRICS_FLAGS, metrics.scrape, client.stream_completion)
    server.METRICS_FLAGS = saved[0] if with_metrics else []
    if scrapes is not None:
        metrics.scrape = timed(saved[1], scrapes)
    if windows is not None:
        client.stream_completion = timed(saved[2], windows)
    try:
        runner.run(trusted, results_dir=tmp, models_dir=args.models_dir, run_id=name, runs=runs, progress=False,
                   strategies=[args.strategy], tasks=[args.task], log=lambda s: None, retakes=0)
    finally:
        server.METRICS_FLAGS, metrics.scrape, client.stream_completion = saved
    return [r for r in RunDir.open(tmp / name).measurements() if r["status"] == "ok"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--manifest", type=Path, default=DEFAULT_MANIFEST)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--pairs", type=int, default=0)
    ap.add_argument("--strategy", default="ngram-mod")
    ap.add_argument("--task", default="code-edit")
    ap.add_argument("--models-dir", type=Path, default=Path("models"))
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    trusted = trust.decide(mf.load(args.manifest), False)
    with tempfile.TemporaryDirectory(prefix="specbench-metrics-") as tmp:
        scrapes: Spans = []
        windows: Spans = []
        recs = run(trusted, Path(tmp), "scrapes", args, args.runs, scrapes=scrapes, windows=windows)
        cost = [(b - a) * 1000 for a, b in scrapes]
        inside = sum(any(a < we and b > ws for ws, we in windows) for a, b in scrapes)
        spec = [r for r in recs if r.get("spec_type") != "none"]
        counted = [r for r in spec if "drafts" in (r.get("spec_counters") or {})]
        agree = sum((r["spec_counters"]["draft_tokens"], r["spec_counters"]["accepted"])
                    == (r["server"]["draft_n"], r["server"]["draft_n_accepted"]) for r in counted)
        absent = [r["spec_counters"]["absent"] for r in spec if "absent" in (r.get("spec_counters") or {})]
        print(f"{args.strategy} / {args.task}: {len(recs)} measurements, {len(scrapes)} scrapes, "
              f"{len(windows)} timed requests")
        if cost:
            print(f"scrape cost: median {statistics.median(cost):.2f} ms, min {min(cost):.2f}, max {max(cost):.2f}; "
                  f"timed request median {statistics.median([(b - a) * 1000 for a, b in windows]):.1f} ms")
        print(f"scrapes inside a timed request: {inside} of {len(scrapes)}")
        print(f"counters agree with timings (drafted, accepted): {agree} of {len(counted)} requests; "
              f"absent: {len(absent)}" + (f" ({absent[0]})" if absent else ""))
        if args.pairs:
            rng = random.Random(args.seed)
            logs = []
            for i in range(args.pairs):
                got = {}
                for on in rng.sample([True, False], 2):
                    got[on] = {r["prompt"]: r["client"]["decode_tok_s"]
                               for r in run(trusted, Path(tmp), f"p{i}-{on}", args, 1, with_metrics=on)}
                logs += [math.log(got[True][p] / got[False][p]) for p in got[True].keys() & got[False].keys()]
            if len(logs) > 1:
                m, se = statistics.fmean(logs), statistics.stdev(logs) / math.sqrt(len(logs))
                q = st.t.ppf(0.975, len(logs) - 1)
                print(f"tok/s with --metrics / without: {math.exp(m):.3f}x [{math.exp(m - q * se):.3f}, "
                      f"{math.exp(m + q * se):.3f}] ({len(logs)} paired measurements, 95% interval)")


if __name__ == "__main__":
    main()
