"""Is the load study's judgement calibrated? A/A load studies: every "speculative" arm is the baseline again, so any
▲ / ▼ mark in the printed table is false. Each simulated study is judged by the code `invoke report` runs
(harness/analysis/load.py: paired by round, Holm over the table), and the share of tables that mark no level is
printed; the kit's claim is at least 95%.

The simulation: per (arm, slots, level, round) a fresh server with its own speed factor (log-normal, --server-sd:
a 2-core machine shared with other work moves a whole server's speed), requests arriving on the study's own seeded
schedule (harness/run/load.py: the same times and prompts for every arm at a level and round), each request's
prompt length and output drawn per prompt, served first come first served by `slots` slots whose per-token time
grows with the slots busy (batching shares the machine), per-request noise (--request-sd). Levels past what the
slots serve queue without bound, as a real server does: their latencies are the noisiest.

    python3 bench/load_aa.py [--tables 200] [--rounds 3] [--rates 0.25 0.5 1 2] [--slots 1 4] [--arms 2]
                             [--requests 16] [--server-sd 0.1 0.3] [--request-sd 0.05] [--seed 0]"""

from __future__ import annotations

import argparse
import heapq
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from harness.analysis import load as judged  # noqa: E402
from harness.intake.load import Slo  # noqa: E402
from harness.run import load as load_run  # noqa: E402

#: Per-token decode time of one stream alone (s), prefill time (s), output tokens: gemma-3-270m on 2 cores.
DECODE_S = 0.02
PREFILL_S = 0.15
TOKENS = 64
#: Each further busy slot makes every stream's token this much slower (a batch shares two cores).
SLOT_COST = 0.35


def serve(offsets: list[float], slots: int, speed: float, rng: np.random.Generator,
          request_sd: float) -> list[dict]:
    """First come first served on `slots` slots: each request's TTFT and E2EL, tokens evenly spaced after the
    first (the per-token time set by the slots busy when it starts)."""
    free = [0.0] * slots
    heapq.heapify(free)
    busy_until: list[float] = []
    out = []
    for i, t in enumerate(offsets):
        start = max(t, heapq.heappop(free))
        busy = sum(1 for b in busy_until if b > start)
        noise = float(rng.lognormal(0.0, request_sd))
        per_token = DECODE_S * speed * noise * (1 + SLOT_COST * min(busy, slots - 1))
        prefill = PREFILL_S * speed * noise
        end = start + prefill + per_token * (TOKENS - 1)
        heapq.heappush(free, end)
        busy_until.append(end)
        out.append({"prompt": f"t/p{i % 6}", "scheduled_s": t, "sent_s": t, "ttft_s": start - t + prefill,
                    "e2el_s": end - t, "output_tokens": TOKENS, "error": None, "itl_s": [per_token] * (TOKENS - 1)})
    return out


def study(args: argparse.Namespace, server_sd: float, rng: np.random.Generator, k: int) -> list[dict]:
    arms = ["baseline", *(f"twin-{i + 1}" for i in range(args.arms))]
    out = []
    for r in range(1, args.rounds + 1):
        for n in args.slots:
            for rate in args.rates:
                offsets = load_run.schedule(args.requests, rate, "poisson", 1.0, f"{k}:{n}:{rate}:{r}")
                for arm in arms:
                    speed = float(rng.lognormal(0.0, server_sd))
                    out.append({"format_version": 1, "run_id": "aa", "strategy": f"{arm}@{n}", "entry": arm,
                                "speculative": arm != "baseline", "slots": n, "level": f"{rate:g}", "mode": "rate",
                                "offered_rate": rate, "round": r, "arrivals": "poisson", "burstiness": 1.0,
                                "schedule_seed": "", "warmup": 0, "status": "ok",
                                "baseline": "baseline", "slo": {},
                                "requests": serve(offsets, n, speed, rng, args.request_sd), "wall_s": 0.0})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tables", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rates", type=float, nargs="+", default=[0.25, 0.5, 1.0, 2.0])
    ap.add_argument("--slots", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--arms", type=int, default=2, help="A/A twins of the baseline (the study's speculative arms)")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--server-sd", type=float, nargs="+", default=[0.1, 0.3])
    ap.add_argument("--request-sd", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    slo = Slo(ttft_ms=2000, tpot_ms=50, e2el_ms=10000)
    print(f"A/A load studies: {args.arms} twin arm(s) of the baseline × slots {args.slots} × rates {args.rates} × "
          f"3 figures, {args.rounds} rounds, {args.requests} requests per level, Holm over each table")
    print("server_sd  tables  family  clean  share_clean  false_marks_per_table  seconds")
    for sd in args.server_sd:
        rng = np.random.default_rng(args.seed)
        t0 = time.monotonic()
        clean = marks = family = 0
        for k in range(args.tables):
            j = judged.judge(study(args, sd, rng, k), "baseline", slo)
            m = sum(1 for row in j.rows for c in row.cells.values() if c.mark)
            marks += m
            clean += m == 0
            family = j.family
        print(f"{sd:<9}  {args.tables:6d}  {family:6d}  {clean:5d}  {clean / args.tables:11.1%}  "
              f"{marks / args.tables:21.3f}  {time.monotonic() - t0:7.1f}")


if __name__ == "__main__":
    main()
