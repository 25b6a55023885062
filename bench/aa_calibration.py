"""Are the verdicts calibrated? A/A copies and independent replicates of a committed run, judged by the same code
`invoke report` and `invoke compare` run, the table counted as printed.

- A/A copies: every strategy's tok/s drawn at its baseline's true speed (the committed run's median of the
  baseline's unit, per prompt), so every true speedup is exactly 1: any ▲ / ▼ mark is false, in a cell or in the
  geometric-mean column, and so is a drift or unstable flag. Printed: false cell marks per report (mean), the share
  of reports whose printed table (cells and geometric means) carries at least one, the share with a false
  geometric-mean mark, the share with a false contamination flag, and the cells that drew false marks most often.
- Independent replicates: two runs drawn from one truth (the committed run's own per-unit medians, so the
  speedups are real and not 1) and compared: the share of comparisons whose headline says reproduces / differs /
  inconclusive. "differs" is always wrong here.

Runs are shaped like the committed one (bench/shaped_runs.py: its units, shared baselines, a round factor per
round). Noise models: uniform (one log sd, --noise, everywhere), committed (each unit's own noise in the committed
run), spread (that times a log-normal factor of sd 0.6 per unit), t3 (uniform, with Student-t tails of 3 degrees
of freedom scaled to the same sd: one scale everywhere, heavy tails). A model with "+slow" (e.g. t3+slow) has one
run of one strategy's unit 3x slower: "slow found" is the share of reports that call its cell unstable, and the
false flags leave that cell out.

    python3 bench/aa_calibration.py [RUN_DIR] [--reports 50] [--rounds 3 5 10] [--noise 0.066] [--margin 0.05]
                                    [--models uniform committed spread t3 t3+slow] [--kit DIR]

--kit runs another checkout's analysis on the same synthetic runs (for before/after figures; its harness may be the
flat layout of older versions)."""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE / "bench"))
from shaped_runs import Shape  # noqa: E402

MARKED = ("faster", "slower")


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


def _draw(shape: Shape, model: str, rounds: int, truth: str, noise: float, rng: np.random.Generator) -> list[dict]:
    """One run's records; a "+slow" model has one run of one strategy's unit 3x slower (SLOW)."""
    base = model.removesuffix("+slow")
    kind = "uniform" if base in ("uniform", "t3") else base
    recs = shape.draw(rounds, shape.sigma(kind, rng, noise), shape.speeds(truth), rng,
                      "t3" if base == "t3" else "normal", full=True)
    if model.endswith("+slow"):
        unit = slow_unit(shape)
        r = next(r for r in recs if (r["strategy"], r["task"], r["prompt"]) == unit and r["round"] == 2)
        r["client"]["decode_tok_s"] /= 3
    return recs


def slow_unit(shape: Shape) -> tuple[str, str, str]:
    """The unit a "+slow" model slows: the first strategy's first unit that has a baseline."""
    return next(u for u in shape.units if shape.baseline_unit(u) is not None)


def row(kit, shape: Shape, model: str, rounds: int, args: argparse.Namespace, rng: np.random.Generator) -> str:
    summary, compare, run_dir = kit
    false_marks, printed, geo, flags, found = [], 0, 0, 0, 0
    per_cell: collections.Counter = collections.Counter()
    calls: collections.Counter = collections.Counter()
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.reports):
            d = shape.write(Path(tmp) / f"aa{i}", _draw(shape, model, rounds, "aa", args.noise, rng), rounds)
            s = summary.summarize(run_dir.open(d))
            bad = [c for c in s["cells"] if (c.get("verdict") or {}).get("kind") in MARKED]
            bad_geo = [g for g in s["geomeans"] if (g.get("verdict") or {}).get("kind") in MARKED]
            false_marks.append(len(bad))
            printed += bool(bad or bad_geo)
            geo += bool(bad_geo)
            per_cell.update(f"{c['strategy']}/{c['task']}" for c in bad)
            slowed = slow_unit(shape)[:2] if model.endswith("+slow") else None
            flags += any(c["checks"]["contamination"]["flagged"] for c in s["cells"]
                         if (c["strategy"], c["task"]) != slowed)
            found += any(c["checks"]["contamination"]["data"]["kind"] == "unstable" for c in s["cells"]
                         if (c["strategy"], c["task"]) == slowed)
            if not args.replicates:
                continue
            a = shape.write(Path(tmp) / f"a{i}", _draw(shape, model, rounds, "committed", args.noise, rng), rounds)
            b = shape.write(Path(tmp) / f"b{i}", _draw(shape, model, rounds, "committed", args.noise, rng), rounds)
            kwargs = {"margin": args.margin} if "margin" in compare.compare.__code__.co_varnames else {}
            res = compare.compare(a, b, **kwargs)  # a Comparison; older kits return its dict
            calls[res["verdict"].split(":")[0] if isinstance(res, dict) else res.call.value] += 1
    n = args.reports
    rep = (f"   {calls['reproduces'] / n:.0%} / {calls['differs'] / n:.0%} / {calls['inconclusive'] / n:.0%}"
           if args.replicates else "")
    slow = f"{found / n:>12.0%}" if model.endswith("+slow") else f"{'-':>12}"
    out = (f"{model:<10}{rounds:>6} {statistics.fmean(false_marks):>11.2f} {printed / n:>15.0%} {geo / n:>14.0%} "
           f"{flags / n:>12.0%}{slow}{rep}")
    if per_cell:
        out += "\n" + " " * 16 + "most frequent false marks: " + ", ".join(f"{k} {v}" for k, v in
                                                                            per_cell.most_common(5))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", nargs="?", default=str(HERE / "results" / "demo-cpu"))
    ap.add_argument("--reports", type=int, default=50, help="synthetic reports (and comparisons) per row")
    ap.add_argument("--rounds", type=int, nargs="*", default=[3, 5, 10])
    ap.add_argument("--noise", type=float, default=0.066, help="log sd of one measurement for the uniform and t3 "
                    "models (the demo's: 6.6%%)")
    ap.add_argument("--models", nargs="*", default=["uniform", "committed", "spread", "t3", "t3+slow"])
    ap.add_argument("--margin", type=float, default=0.05)
    ap.add_argument("--no-replicates", dest="replicates", action="store_false",
                    help="A/A copies only (no comparisons of replicates)")
    ap.add_argument("--kit", default=str(HERE), help="checkout whose analysis judges the synthetic runs")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    kit = load_kit(Path(args.kit).resolve())
    shape = Shape.load(Path(args.run))
    t0 = time.monotonic()
    print(f"{shape.run.name}: A/A copies{' and independent replicates' if args.replicates else ''}, "
          f"{args.reports} reports per row; uniform/t3 noise {args.noise:.1%} (log sd); analysis of {args.kit}")
    print(f"{'noise':<10}{'rounds':>6} {'false cells':>11} {'printed table':>15} {'false geomean':>14} "
          f"{'false flags':>12}{'slow found':>12}" + ("   compare of replicates: reproduces / differs / inconclusive"
                                   if args.replicates else ""))
    for model in args.models:
        for rounds in args.rounds:
            print(row(kit, shape, model, rounds, args, np.random.default_rng(args.seed)), flush=True)
    print(f"({time.monotonic() - t0:.0f} s; 'false cells' per report, the others the share of reports with one; "
          "target: printed table at most 5%)")


if __name__ == "__main__":
    main()
