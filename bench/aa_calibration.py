"""Are the verdicts calibrated? A/A copies and independent replicates of a committed run, judged by the same code
`invoke report` and `invoke compare` run.

- A/A copies: every strategy's tok/s rewritten to its baseline's true speed (the committed run's median of the
  baseline cell, per prompt) times log-normal noise of the run's own size, so every true speedup is exactly 1:
  any ▲ / ▼ mark is false, and so is a drift or unstable flag. Printed: false marks per report (mean), the share
  of reports with at least one, false geometric-mean marks, false contamination flags, and the cells that drew
  false marks most often.
- Independent replicates: two runs drawn from one truth (the committed run's own per-cell medians, so the
  speedups are real and not 1) and compared: the share of comparisons whose headline says reproduces / differs /
  inconclusive. "differs" is always wrong here.

    python3 bench/aa_calibration.py [RUN_DIR] [--reports 50] [--rounds 3 5 10] [--noise 0.066] [--margin 0.05]
                                    [--kit DIR]

--kit runs another checkout's analysis on the same synthetic runs (for before/after figures; its harness may be the
flat layout of older versions)."""

from __future__ import annotations

import argparse
import collections
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


def load_kit(path: Path):
    """The report and compare modules of a checkout, whichever layout it has."""
    sys.path.insert(0, str(path))
    try:
        from harness.analysis import compare, summary  # noqa: PLC0415
        from harness.store.rundir import RunDir  # noqa: PLC0415
    except ImportError:
        from harness.results import RunDir  # type: ignore[no-redef]  # noqa: PLC0415

        from harness import compare, summary  # type: ignore[no-redef]  # noqa: PLC0415
    return summary, compare, RunDir


def truths(records: list[dict]) -> dict[tuple[str, str, str], float]:
    """Median tok/s of every (strategy, task, prompt) of the committed run (usable records)."""
    by: dict[tuple[str, str, str], list[float]] = collections.defaultdict(list)
    for r in records:
        if r["status"] == "ok" and r["client"].get("decode_tok_s") and not (r.get("interference") or {}).get(
                "disturbed"):
            by[(r["strategy"], r["task"], r["prompt"])].append(r["client"]["decode_tok_s"])
    return {k: statistics.median(v) for k, v in by.items()}


def synthesize(src: Path, dest: Path, rounds: int, truth: dict, noise: float, rng: np.random.Generator) -> Path:
    """A run folder like `src` with `rounds` rounds whose tok/s are truth x exp(N(0, noise)), no disturbance."""
    dest.mkdir(parents=True)
    meta = json.loads((src / "run.json").read_text())
    recs = [json.loads(x) for x in (src / "measurements.jsonl").read_text().splitlines() if x.strip()]
    templates: dict[tuple[str, str, str], dict] = {}
    for r in recs:
        if r["status"] == "ok":
            templates.setdefault((r["strategy"], r["task"], r["prompt"]), r)
    meta = copy.deepcopy(meta)
    meta["plan"]["runs"] = rounds
    meta["plan"]["measurements"] = len(templates) * rounds
    meta["plan"]["extra_rounds"] = []
    meta["status"] = "complete"
    (dest / "run.json").write_text(json.dumps(meta))
    lines, order = [], 0
    keys = list(templates)
    for rd in range(1, rounds + 1):
        for i in rng.permutation(len(keys)):
            k = keys[i]
            r = copy.deepcopy(templates[k])
            r.update(round=rd, run_index=rd, order=order, measurement_id=f"{k[0]}-{k[1]}-{k[2]}-{rd}")
            r["client"]["decode_tok_s"] = truth[k] * math.exp(rng.normal(0, noise))
            if r.get("interference"):
                r["interference"]["disturbed"] = False
            lines.append(json.dumps(r))
            order += 1
    (dest / "measurements.jsonl").write_text("\n".join(lines) + "\n")
    return dest


def aa_truth(records: list[dict], meta: dict) -> dict:
    """Every strategy at its baseline's speed, prompt by prompt."""
    t = truths(records)
    base = {s["id"]: s["baseline"] or s["id"] for s in meta["strategies"]}
    return {k: t.get((base.get(k[0], k[0]), k[1], k[2]), v) for k, v in t.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", nargs="?", default=str(HERE / "results" / "demo-cpu"))
    ap.add_argument("--reports", type=int, default=50, help="synthetic reports (and comparisons) per row")
    ap.add_argument("--rounds", type=int, nargs="*", default=[3, 5, 10])
    ap.add_argument("--noise", type=float, default=0.066, help="log sd of one measurement (the demo's: 6.6%%)")
    ap.add_argument("--margin", type=float, default=0.05)
    ap.add_argument("--kit", default=str(HERE), help="checkout whose analysis judges the synthetic runs")
    args = ap.parse_args()
    summary, compare, RunDir = load_kit(Path(args.kit).resolve())
    src = Path(args.run)
    meta = json.loads((src / "run.json").read_text())
    recs = [json.loads(x) for x in (src / "measurements.jsonl").read_text().splitlines() if x.strip()]
    truth_aa, truth_real = aa_truth(recs, meta), truths(recs)
    rng = np.random.default_rng(7)
    t0 = time.monotonic()
    print(f"{src.name}: A/A copies and independent replicates, measurement noise {args.noise:.1%} (log sd), "
          f"{args.reports} reports per row; analysis of {args.kit}")
    print(f"{'rounds':>6} {'false marks/report':>19} {'reports with one':>17} {'false geomean':>14} "
          f"{'false flags':>12}   compare of replicates: reproduces / differs / inconclusive")
    for rounds in args.rounds:
        false_marks, with_false, geo_false, flags = [], 0, 0, 0
        per_cell: collections.Counter = collections.Counter()
        calls: collections.Counter = collections.Counter()
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(args.reports):
                d = synthesize(src, Path(tmp) / f"aa{i}", rounds, truth_aa, args.noise, rng)
                s = summary.summarize(RunDir.open(d))
                bad = [c for c in s["cells"] if (c.get("verdict") or {}).get("kind") in ("faster", "slower")]
                false_marks.append(len(bad))
                with_false += bool(bad)
                per_cell.update(f"{c['strategy']}/{c['task']}" for c in bad)
                geo_false += sum((g.get("verdict") or {}).get("kind") in ("faster", "slower") for g in s["geomeans"])
                flags += sum(c["checks"]["contamination"]["flagged"] for c in s["cells"])
                a = synthesize(src, Path(tmp) / f"a{i}", rounds, truth_real, args.noise, rng)
                b = synthesize(src, Path(tmp) / f"b{i}", rounds, truth_real, args.noise, rng)
                kwargs = {"margin": args.margin} if "margin" in compare.compare.__code__.co_varnames else {}
                res = compare.compare(a, b, **kwargs)  # a Comparison; older kits return its dict
                calls[res["verdict"].split(":")[0] if isinstance(res, dict) else res.call.value] += 1
        n = args.reports
        print(f"{rounds:>6} {statistics.fmean(false_marks):>19.2f} {with_false / n:>17.0%} {geo_false / n:>14.2f} "
              f"{flags / n:>12.2f}   {calls['reproduces'] / n:.0%} / {calls['differs'] / n:.0%} / "
              f"{calls['inconclusive'] / n:.0%}", flush=True)
        if per_cell:
            print("        most frequent false marks: " + ", ".join(f"{k} {v}" for k, v in per_cell.most_common(5)))
    print(f"({time.monotonic() - t0:.0f} s)")


if __name__ == "__main__":
    main()
