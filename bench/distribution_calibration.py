"""Is the distribution test calibrated? A/A tables and the positive control, resampled from a committed sampling
study and judged by the code `invoke report` runs (harness/analysis/lossless.py).

- A/A: every arm of the study (each strategy, the baseline with its seeds, the reference, the control) drawn again
  from one population: the baseline's own samples (its arm and its reference arm together, per prompt), with
  replacement, as many as the study drew. Every "differs" is false; the family is the whole table, as in the
  report. Printed: the share of tables with at least one false "differs" (the family error Holm's procedure holds
  at 5%), and each test's share of false rejections before the family's correction.
- Control: the same, but the control arm drawn from the control's own samples: the share of tables in which the
  control comes out as "differs" on every prompt, and per prompt (the power the report's "the study had power"
  line claims; resampling the observed control estimates the power at the effect this study saw).
- Departures at the stated distance: per prompt, the "could detect TV ≥ X" its rows state (simulated by the kit
  on the reference's outcomes with the chi-square distribution), checked at X with the kit's permutation tests.
  The strategy's arm drawn from the baseline's population (its arm and its reference, twice the reference's
  outcomes) reweighted by harness/analysis/lossless.py's `departure`: its first m tokens' categories X apart from
  the reference's the least detectable way, at the first token and at later tokens. Printed: the share of draws in
  which the row's tests reject at the family's strictest level, with its 95% interval (the claim: 80%), or the
  largest distance such a departure reaches among these outcomes where X is beyond it.

    python3 bench/distribution_calibration.py [RUN_DIR] [--tables 200] [--seed 1]"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats as sps

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE))

from harness import KitError  # noqa: E402
from harness.analysis import lossless  # noqa: E402
from harness.store.rundir import RunDir  # noqa: E402
from harness.store.runmeta import StudyMeta  # noqa: E402

DEFAULT_RUN = HERE / "results" / "real-gemma3-270m-distribution"


def populations(study: StudyMeta, records: list[dict[str, Any]]) -> dict[tuple[str, str, str, str], Any]:
    """Per (host, task, prompt, baseline): the baseline's samples (its arm and its reference) and the control's."""
    out: dict[tuple[str, str, str, str], Any] = collections.defaultdict(lambda: {"null": [], "control": []})
    roles = {a.id: (a.role, a.baseline) for a in study.arms}
    for r in records:
        role, base = roles[r["arm"]]
        if r["status"] != "ok" or role == "strategy":
            continue
        out[(r["host"], r["task"], r["prompt"], base)]["control" if role == "control" else "null"] += r["samples"]
    return out


def table(study: StudyMeta, pops: dict, control: bool, rng: np.random.Generator) -> list[dict[str, Any]]:
    """One resampled study's batch records: every arm drawn from the baseline's population (the control from its
    own with `control`), with the arm's seeds."""
    n = study.settings.samples
    records = []
    for (host, task, prompt, base), pop in pops.items():
        for arm in [a for a in study.arms if a.baseline == base]:
            source = pop["control"] if control and arm.role == "control" else pop["null"]
            picks = rng.integers(0, len(source), n)
            samples = [{**source[i], "seed": arm.first_seed + j} for j, i in enumerate(picks)]
            if arm.role == "strategy":  # a drafting server reports no log-probabilities
                samples = [{**s, "logprobs": None, "top": None} for s in samples]
            records.append({"host": host, "arm": arm.id, "task": task, "prompt": prompt, "status": "ok",
                            "samples": samples})
    return records


def departures(study: StudyMeta, pops: dict, judged: dict[str, Any], tables: int, rng: np.random.Generator) -> None:
    """Each prompt's stated detectable distance checked at that distance (the module's docstring)."""
    family = judged["family"]["tests"]
    level = lossless.ALPHA / max(1, family)
    count = judged["family"]["permutations"]
    prefix = study.settings.prefix
    stated: dict[tuple[str, str, str, str], set[tuple[float, int, int, int]]] = collections.defaultdict(set)
    for r in judged["rows"]:
        if r["kind"] == "strategy" and r.get("detectable_tv") is not None and r["detectable_tv"] < 1:
            k = next(t["categories"] for t in r["tests"] if t["name"] == "first tokens")
            stated[(r["host"], r["task"], r["prompt"], r["baseline"])].add(
                (r["detectable_tv"], k, r["samples"], r["reference_samples"]))
    print(f"departures at the stated distance: {tables} draws each, the row's tests at the family's strictest "
          f"level (0.05 / {family}); the claim: 80%")
    for key, values in sorted(stated.items()):
        pop = [lossless.Sample(i, tuple(s["tokens"]), None, None, 0) for i, s in enumerate(pops[key]["null"])]
        outcomes = tuple(s.tokens[:prefix] for s in pop)
        for tv, k, n_a, n_b in sorted(values):
            said = []
            for where in ("first", "later"):
                w, reach = lossless.departure(outcomes, tv, where, n_a + n_b)
                if w is None:
                    said.append(f"at the {where} token{'s' if where == 'later' else ''}: none that far among these "
                            f"outcomes (at most TV {reach:.3f})")
                    continue
                hits = 0
                for _ in range(tables):
                    a = [pop[i] for i in rng.choice(len(pop), n_a, p=w)]
                    b = [pop[i] for i in rng.integers(0, len(pop), n_b)]
                    tests = lossless.two_sample(a, b, prefix, rng, count=count).tests
                    hits += min(t["p"] for t in tests if t["p"] is not None) <= level
                ci = sps.binomtest(hits, tables).proportion_ci()
                said.append(f"at the {where} token{'s' if where == 'later' else ''} detected in "
                            f"{hits / tables:.1%} [{ci.low:.1%}, {ci.high:.1%}]")
            print(f"  {key[1]}/{key[2]} (vs {key[3]}): TV ≥ {tv} on {k} categories, {n_a} against {n_b} samples: "
                  + "; ".join(said))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", nargs="?", type=Path, default=DEFAULT_RUN)
    ap.add_argument("--tables", type=int, default=200, help="resampled tables per mode")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    try:
        rd = RunDir.open(args.run_dir)
        meta = rd.read_meta()
    except KitError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    study = meta.plan.distribution
    if not study:
        print(f"{args.run_dir}: no sampling study in this run", file=sys.stderr)
        return 1
    pops = populations(study, rd.samples())
    kinds = {s.id: (s.spec_type, s.args) for s in meta.strategies}
    rng = np.random.default_rng(args.seed)
    started = time.monotonic()
    print(f"{meta.run_id}: {study.settings.samples} samples of {study.settings.tokens} tokens per arm, "
          f"{len(pops)} baselines x "
          f"prompts, {args.tables} resampled tables per mode")
    for control in (False, True):
        any_false, detected_all, per_test, run_tests = 0, 0, collections.Counter(), collections.Counter()
        detected: collections.Counter = collections.Counter()
        tests = rows = 0
        for _ in range(args.tables):
            judged = lossless.summary(study, table(study, pops, control, rng), meta.plan.hosts, kinds)
            nulls = [r for r in judged["rows"] if not (control and r["kind"] == "control")]
            controls = [r for r in judged["rows"] if control and r["kind"] == "control"]
            any_false += any(r["verdict"] == "differs" for r in nulls)
            for r in nulls:
                per_test.update(t["name"] for t in r["tests"] if t["p"] is not None and t["p"] <= lossless.ALPHA)
                run_tests.update(t["name"] for t in r["tests"] if t["p"] is not None)
            for r in controls:
                detected[(r["baseline"], r["task"], r["prompt"])] += r["verdict"] == "differs"
            detected_all += bool(controls) and all(r["verdict"] == "differs" for r in controls)
            tests, rows = judged["family"]["tests"], len(nulls)
        if not control:
            print(f"A/A: {rows} rows, {tests} tests per table; at least one false \"differs\" in "
                  f"{any_false / args.tables:.1%} of tables (the family's level: 5%)")
            print("  false rejections per test before the family's correction (each at its own 5%): "
                  + ", ".join(f"{k} {per_test[k] / n:.1%}" for k, n in sorted(run_tests.items())))
        else:
            print(f"control: detected on every prompt in {detected_all / args.tables:.1%} of tables; each: "
                  + ", ".join(f"{b} on {t}/{p} {v / args.tables:.1%}" for (b, t, p), v in sorted(detected.items()))
                  + f"; a false \"differs\" elsewhere in {any_false / args.tables:.1%}")
    judged = lossless.summary(study, rd.samples(), meta.plan.hosts, kinds)
    if judged is not None:
        departures(study, pops, judged, args.tables, rng)
    print(f"({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
