"""Is `invoke compare`'s headline calibrated when cells differ in noise? Replicates of one truth, and the same with
one task of one strategy slower in B, in run folders shaped like a committed run, judged by the real compare
code path (harness/analysis/compare.py on run folders written to disk).

- Truth: the committed run's median tok/s of every (strategy, task, prompt), its usable records.
- Noise: each cell's own log sd of tok/s over the committed run's rounds after removing each round's common
  factor (the median over cells of tok/s over the cell's median; floored at 0.5%), times exp(N(0, spread)) drawn
  per cell and comparison (heterogeneous noise: log-normal spread 0.6 by default), the same for A and B (two runs
  of one machine); and a factor per round shared by every cell, of the committed run's round-to-round sd. A
  measurement is truth x round factor x exp(N(0, sd)); nothing is disturbed.
- replicates: A and B drawn from one truth. "differs" is always wrong; "reproduces" is the power.
- regressed: B's truth of one speculative (strategy, task), drawn at random per comparison, is `--slower` (30%)
  slower. "reproduces" is always wrong: the headline must not pass over the cell. The last column is the share
  of headlines that say "differs" or name the regressed cell (as the worst of the unresolved ones).

    python3 bench/compare_calibration.py [RUN_DIR] [--comparisons 100] [--rounds 3 5 10] [--margin 0.15]
                                         [--spread 0.6] [--slower 0.3] [--jobs 2] [--kit DIR] [--validate]
                                         [--scenarios replicates regressed]

--kit runs another checkout's compare on the same synthetic runs (before/after figures); its `compare` may return
the dict of older versions. The schema check of each synthetic measurement line (copies of the committed run's
checked lines with other tok/s) is skipped unless --validate: it is three quarters of a comparison's time and
decides nothing here."""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import copy
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent.parent
Key = tuple[str, str, str]
CALLS = ("reproduces", "geometric means reproduce", "differs", "inconclusive")


def usable(records: list[dict]) -> list[dict]:
    return [r for r in records if r["status"] == "ok" and r["client"].get("decode_tok_s")
            and not (r.get("interference") or {}).get("disturbed")]


def truths(records: list[dict]) -> tuple[dict[Key, float], dict[Key, float], float]:
    """Per (strategy, task, prompt): the median tok/s and the log sd over the run's rounds after removing each
    round's common factor (floored at 0.5%); and the sd of the log round factors."""
    by: dict[Key, dict[int, float]] = collections.defaultdict(dict)
    for r in usable(records):
        by[(r["strategy"], r["task"], r["prompt"])].setdefault(r["round"], r["client"]["decode_tok_s"])
    med = {k: statistics.median(v.values()) for k, v in by.items()}
    rounds = sorted({rd for v in by.values() for rd in v})
    factor = {rd: statistics.median(v[rd] / med[k] for k, v in by.items() if rd in v) for rd in rounds}
    sd = {k: max(0.005, statistics.stdev(math.log(x / factor[rd]) for rd, x in v.items()) if len(v) > 1 else 0.0)
          for k, v in by.items()}
    return med, sd, statistics.stdev(math.log(f) for f in factor.values()) if len(factor) > 1 else 0.0


def synthesize(src: Path, dest: Path, rounds: int, truth: dict[Key, float], sd: dict[Key, float], round_sd: float,
               rng: np.random.Generator) -> Path:
    """A run folder like `src` with `rounds` rounds whose tok/s are truth x round factor x exp(N(0, sd)), no
    disturbance."""
    dest.mkdir(parents=True)
    meta = copy.deepcopy(json.loads((src / "run.json").read_text()))
    recs = [json.loads(x) for x in (src / "measurements.jsonl").read_text().splitlines() if x.strip()]
    templates: dict[Key, dict] = {}
    for r in recs:
        if r["status"] == "ok":
            templates.setdefault((r["strategy"], r["task"], r["prompt"]), r)
    meta["plan"].update(runs=rounds, measurements=len(templates) * rounds, extra_rounds=[])
    meta["status"] = "complete"
    (dest / "run.json").write_text(json.dumps(meta))
    lines, order = [], 0
    keys = [k for k in templates if k in truth]
    for rd in range(1, rounds + 1):
        shared = math.exp(rng.normal(0, round_sd))
        for i in rng.permutation(len(keys)):
            k = keys[i]
            r = copy.deepcopy(templates[k])
            first = templates[k]["measurement_id"].split("/retake")[0].rsplit("/", 1)[0]  # the plan's id, round off
            r.update(round=rd, run_index=rd, order=order, measurement_id=f"{first}/{rd}")
            r.pop("retake_of", None)
            r["client"]["decode_tok_s"] = truth[k] * shared * math.exp(rng.normal(0, sd[k]))
            if r.get("interference"):
                r["interference"]["disturbed"] = False
            lines.append(json.dumps(r))
            order += 1
    (dest / "measurements.jsonl").write_text("\n".join(lines) + "\n")
    return dest


def load_compare(kit: Path, validate: bool = False):
    if str(kit) not in sys.path:
        sys.path.insert(0, str(kit))
    from harness import schema  # noqa: PLC0415
    from harness.analysis import compare  # noqa: PLC0415

    if not validate and not getattr(schema, "_bench_unchecked", False):
        errors = schema.errors
        schema.errors = lambda name, obj: [] if name == "result" else errors(name, obj)
        schema._bench_unchecked = True
    return compare


def call_of(res) -> str:
    """The headline's call, from a Comparison or from an older kit's dict."""
    if isinstance(res, dict):
        return res["verdict"].split(":")[0].split(";")[0]
    return res.call.value


def one(job: tuple) -> tuple[int, str, str, str | None, bool]:
    """One comparison: (rounds, scenario, call, the regressed cell, whether the headline says differs or names the
    regressed cell)."""
    kit, src, rounds, scenario, seed, margin, spread, slower, validate = job
    compare = load_compare(Path(kit), validate)
    src = Path(src)
    meta = json.loads((src / "run.json").read_text())
    recs = [json.loads(x) for x in (src / "measurements.jsonl").read_text().splitlines() if x.strip()]
    med, sd0, round_sd = truths(recs)
    rng = np.random.default_rng(seed)
    sd = {k: v * math.exp(rng.normal(0, spread)) for k, v in sorted(sd0.items())}
    truth_b = dict(med)
    regressed = None
    if scenario == "regressed":
        spec = sorted({(k[0], k[1]) for k in med if any(s["id"] == k[0] and s["baseline"] for s in meta["strategies"])})
        regressed = spec[int(rng.integers(len(spec)))]
        truth_b = {k: v * (1 - slower) if (k[0], k[1]) == regressed else v for k, v in med.items()}
    with tempfile.TemporaryDirectory(prefix="specbench-cc-") as tmp:
        a = synthesize(src, Path(tmp) / "a", rounds, med, sd, round_sd, rng)
        b = synthesize(src, Path(tmp) / "b", rounds, truth_b, sd, round_sd, rng)
        res = compare.compare(a, b, margin)
    verdict = res["verdict"] if isinstance(res, dict) else res.verdict
    named = regressed is not None and (call_of(res) == "differs" or " / ".join(regressed) + " " in verdict)
    return rounds, scenario, call_of(res), "/".join(regressed) if regressed else None, named


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", nargs="?", default=str(HERE / "results" / "demo-cpu"))
    ap.add_argument("--comparisons", type=int, default=100, help="comparisons per row")
    ap.add_argument("--rounds", type=int, nargs="*", default=[3, 5, 10])
    ap.add_argument("--margin", type=float, default=0.15)
    ap.add_argument("--spread", type=float, default=0.6, help="log sd of each cell's noise around its own")
    ap.add_argument("--slower", type=float, default=0.3, help="how much slower the regressed cell is in B")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--kit", default=str(HERE), help="checkout whose compare judges the synthetic runs")
    ap.add_argument("--validate", action="store_true", help="schema-check every synthetic measurement line")
    ap.add_argument("--scenarios", nargs="*", default=["replicates", "regressed"], choices=["replicates", "regressed"])
    args = ap.parse_args()
    kit, src = str(Path(args.kit).resolve()), str(Path(args.run).resolve())
    t0 = time.monotonic()
    print(f"{Path(src).name}: compare at ±{args.margin:.0%} (the kit's default cell margin), each cell's noise "
          f"from the run times a log-normal spread of {args.spread}; {args.comparisons} comparisons per row; "
          f"compare of {kit}")
    print(f"{'rounds':>6} {'scenario':<11} " + " ".join(f"{c:>26}" for c in CALLS) + "   headline differs or names "
          "the regressed cell")
    jobs = [(kit, src, n, sc, args.seed * 100003 + i * 7 + n * 1009 + (sc == "regressed"), args.margin, args.spread,
             args.slower, args.validate)
            for n in args.rounds for sc in args.scenarios for i in range(args.comparisons)]
    results: dict[tuple[int, str], collections.Counter] = collections.defaultdict(collections.Counter)
    passed: collections.Counter = collections.Counter()
    named: collections.Counter = collections.Counter()
    with concurrent.futures.ProcessPoolExecutor(args.jobs) as pool:
        for rounds, scenario, call, cell, said in pool.map(one, jobs, chunksize=4):
            results[(rounds, scenario)][call] += 1
            named[(rounds, scenario)] += said
            if scenario == "regressed" and call == "reproduces":
                passed[cell] += 1
            if sum(results[(rounds, scenario)].values()) == args.comparisons:
                c = results[(rounds, scenario)]
                extra = f"   {named[(rounds, scenario)] / args.comparisons:.1%}" if scenario == "regressed" else ""
                print(f"{rounds:>6} {scenario:<11} " + " ".join(f"{c[k] / args.comparisons:>26.1%}" for k in CALLS)
                      + extra, flush=True)
    if passed:
        print("regressed cells passed over as \"reproduces\": " + ", ".join(f"{k} {v}" for k, v in
                                                                         passed.most_common(8)))
    print(f"wrong calls: \"differs\" of replicates and \"reproduces\" of a regressed task "
          f"({time.monotonic() - t0:.0f} s)")


if __name__ == "__main__":
    main()
