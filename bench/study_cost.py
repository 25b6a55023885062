#!/usr/bin/env python3
"""What the sampling study's table costs to judge: CPU seconds of harness/analysis/lossless.py's summary for a
study of P prompts x A arms x N samples per arm (synthetic tokens, 16 per sample), the committed study's settings
otherwise. The plan allows at most 100,000 requests (P x A x N), so the largest tables are 50,000 rows of 2 samples
against 2, or 200 rows of 500 against 500; this prints the relabellings each test drew and the seconds it took.

    python3 bench/study_cost.py [--sizes 100x100x2,200x250x2,40x5x500]
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness import ROOT  # noqa: E402
from harness.analysis import lossless  # noqa: E402
from harness.store.rundir import RunDir  # noqa: E402
from harness.store.runmeta import ArmMeta  # noqa: E402

STUDY_RUN = ROOT / "results" / "real-gemma3-270m-distribution"


def table_seconds(prompts: int, arms: int, samples: int, seed: int = 1) -> tuple[int, int, float]:
    """(rows, relabellings per test, CPU seconds) of one synthetic study's table."""
    d = RunDir(STUDY_RUN).read_meta().plan.distribution
    assert d is not None
    s = dataclasses.replace(d.settings, prompts=tuple(("t", f"p{i}") for i in range(prompts)), samples=samples,
                            batch=samples)
    base = [dataclasses.replace(a, first_seed=s.seed + samples if a.role == "reference" else s.seed)
            for a in d.arms if a.role != "strategy"]
    arm_list = tuple(base) + tuple(ArmMeta(f"s{i}", f"s{i}", "strategy", s.temperature, s.top_k, s.seed, "baseline")
                                   for i in range(arms - len(base)))
    study = dataclasses.replace(d, settings=s, arms=arm_list)
    rng = random.Random(seed)
    records = [{"host": "local", "arm": a.id, "task": t, "prompt": p, "status": "ok",
                "samples": [{"seed": a.first_seed + k, "tokens": [rng.randrange(50) for _ in range(16)],
                             "draft_n": 0, "draft_n_accepted": 0, "logprobs": [-0.5] * 16}
                            for k in range(samples)]}
               for t, p in s.prompts for a in arm_list]
    args = {a.strategy: ("ngram-mod", ()) for a in arm_list}
    t0 = time.process_time()
    out = lossless.summary(study, records, ["local"], args)  # type: ignore[arg-type]
    assert out is not None
    return len(out["rows"]), out["family"]["permutations"], time.process_time() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="100x100x2,200x250x2,40x5x500",
                    help="studies as PROMPTSxARMSxSAMPLES, separated by commas")
    a = ap.parse_args()
    print(f"{'study':>14} {'rows':>7} {'relabellings':>13} {'cpu s':>7}")
    for size in a.sizes.split(","):
        p, arms, n = (int(x) for x in size.split("x"))
        rows, count, cpu = table_seconds(p, arms, n)
        print(f"{size:>14} {rows:>7} {count:>13} {cpu:>7.1f}")


if __name__ == "__main__":
    main()
