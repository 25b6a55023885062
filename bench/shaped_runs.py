"""Run folders shaped like the committed runs, for the bench scripts that check a verdict rule
(bench/interval_coverage.py, bench/aa_calibration.py): the same strategies, baselines, tasks and prompts; each unit's
(strategy, task, prompt) speed and run-to-run noise taken from the committed run; tok/s drawn round by round with
a round factor, as real runs have it, and a shared baseline per task.

Noise models (`Shape.sigma`):
- committed: each unit's own per-measurement noise in the committed run (the sd of its log tok/s after removing
  each round's common factor; a unit with one value takes the run's median);
- spread:    the committed noise times a log-normal factor of sd SPREAD, drawn per unit and per simulated run
             (cells differ in noise more than the committed run shows);
- uniform:   one noise for every unit (the older check's model);
and the draw's tails: normal, or Student t with 3 degrees of freedom scaled to the same sd (`tails="t3"`).

Nothing here imports the kit: the scripts judge these runs with whichever checkout they are given. Run alone, it
prints the shape of committed runs: units, cells, the round factor's sd and the per-unit noise by quartile.

    python3 bench/shaped_runs.py [RUN_DIR ...]"""

from __future__ import annotations

import argparse
import collections
import copy
import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

#: Log-normal spread of per-unit noise around the committed noise.
SPREAD = 0.6
#: Smallest per-measurement noise a unit is given (a committed unit whose rounds happened to agree exactly).
FLOOR = 0.002

Unit = tuple[str, str, str]  # strategy, task, prompt


def _usable(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    superseded = {r.get("retake_of") for r in records if r.get("retake_of")}
    return [r for r in records if r.get("status") == "ok" and (r.get("client") or {}).get("decode_tok_s")
            and not (r.get("interference") or {}).get("disturbed") and r.get("measurement_id") not in superseded]


def _residual_sd(values: dict[Unit, dict[int, float]]) -> tuple[dict[Unit, float], float]:
    """Each unit's sd of log tok/s around its level after removing each round's median factor; and the sd of the
    round factors."""
    rounds = sorted({r for v in values.values() for r in v})
    rho = dict.fromkeys(rounds, 0.0)
    level: dict[Unit, float] = {}
    for _ in range(10):
        level = {u: float(np.mean([x - rho[r] for r, x in v.items()])) for u, v in values.items()}
        rho = {r: float(np.median([v[r] - level[u] for u, v in values.items() if r in v])) for r in rounds}
    sd = {}
    for u, v in values.items():
        res = [x - level[u] - rho[r] for r, x in v.items()]
        if len(res) > 1:
            sd[u] = max(FLOOR, math.sqrt(sum(e * e for e in res) / (len(res) - 1)))
    med = statistics.median(sd.values()) if sd else 0.05
    return {u: sd.get(u, med) for u in values}, float(np.std(list(rho.values()))) if len(rho) > 1 else 0.0


@dataclass
class Shape:
    """A committed run's structure, speeds and noise."""

    run: Path
    meta: dict[str, Any]
    templates: dict[Unit, dict[str, Any]]
    speed: dict[Unit, float]  # log of the median tok/s
    noise: dict[Unit, float]  # committed per-measurement log sd
    round_sd: float
    baselines: dict[str, str | None]

    @classmethod
    def load(cls, run: Path) -> Shape:
        meta = json.loads((run / "run.json").read_text())
        recs = _usable([json.loads(x) for x in (run / "measurements.jsonl").read_text().splitlines() if x.strip()])
        values: dict[Unit, dict[int, float]] = collections.defaultdict(dict)
        templates: dict[Unit, dict[str, Any]] = {}
        for r in recs:
            u = (r["strategy"], r["task"], r["prompt"])
            values[u][int(r["round"])] = math.log(r["client"]["decode_tok_s"])
            templates.setdefault(u, r)
        noise, round_sd = _residual_sd(values)
        speed = {u: statistics.median(v.values()) for u, v in values.items()}
        bases = {s["id"]: s.get("baseline") for s in meta["strategies"]}
        return cls(run, meta, templates, speed, noise, max(round_sd, 0.01), bases)

    @property
    def units(self) -> list[Unit]:
        return list(self.templates)

    def baseline_unit(self, u: Unit) -> Unit | None:
        b = self.baselines.get(u[0])
        return (b, u[1], u[2]) if b and (b, u[1], u[2]) in self.templates else None

    def sigma(self, kind: str, rng: np.random.Generator, uniform: float = 0.066) -> dict[Unit, float]:
        """Per-unit noise of one simulated run (see the module docstring)."""
        if kind == "committed":
            return dict(self.noise)
        if kind == "spread":
            return {u: s * math.exp(rng.normal(0, SPREAD)) for u, s in self.noise.items()}
        if kind == "uniform":
            return dict.fromkeys(self.noise, uniform)
        raise ValueError(kind)

    def speeds(self, truth: str | float) -> dict[Unit, float]:
        """Log speed per unit: "aa" every strategy at its baseline's speed, "committed" the committed run's, a
        number: every strategy that speedup over its baseline."""
        out = {}
        for u, v in self.speed.items():
            b = self.baseline_unit(u)
            if truth == "committed" or b is None:
                out[u] = v
            elif truth == "aa":
                out[u] = self.speed[b]
            else:
                out[u] = self.speed[b] + math.log(float(truth))
        return out

    def true_log_speedup(self, speeds: dict[Unit, float]) -> dict[tuple[str, str], float]:
        """Per cell (strategy, task) with a baseline: the true log speedup (mean over its prompts)."""
        by: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
        for u in self.units:
            b = self.baseline_unit(u)
            if b is not None:
                by[(u[0], u[1])].append(speeds[u] - speeds[b])
        return {k: statistics.fmean(v) for k, v in by.items()}

    def cell_noise(self, sigma: dict[Unit, float]) -> dict[tuple[str, str], float]:
        """Per cell the true sd of one round's paired log ratio (mean over its prompts of strategy minus baseline)."""
        by: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
        for u in self.units:
            b = self.baseline_unit(u)
            if b is not None:
                by[(u[0], u[1])].append(sigma[u] ** 2 + sigma[b] ** 2)
        return {k: math.sqrt(sum(v)) / len(v) for k, v in by.items()}

    def draw(self, rounds: int, sigma: dict[Unit, float], speeds: dict[Unit, float], rng: np.random.Generator,
             tails: str = "normal", full: bool = False) -> list[dict[str, Any]]:
        """Records of one simulated run: every unit once per round, shuffled, tok/s = exp(speed + round factor +
        noise). `full`: copies of the committed records (for the whole report), else the fields the statistics
        read."""
        out, order = [], 0
        units = self.units
        for rd in range(1, rounds + 1):
            factor = rng.normal(0, self.round_sd)
            for i in rng.permutation(len(units)):
                u = units[i]
                e = rng.standard_t(3) / math.sqrt(3) if tails == "t3" else rng.normal()
                tok_s = math.exp(speeds[u] + factor + sigma[u] * e)
                mid = f"{u[0]}/{u[1]}/{u[2]}/{rd}"
                if full:  # the id the plan gives it (harness/store/plan_check.py): a report checks it
                    r = copy.deepcopy(self.templates[u])
                    mid = r["measurement_id"].split("/retake")[0].rsplit("/", 1)[0] + f"/{rd}"
                    r.pop("retake_of", None)
                    r.update(round=rd, run_index=rd, order=order, measurement_id=mid)
                    r["client"]["decode_tok_s"] = tok_s
                    if r.get("interference"):
                        r["interference"]["disturbed"] = False
                else:
                    r = {"strategy": u[0], "task": u[1], "prompt": u[2], "round": rd, "run_index": rd, "order": order,
                         "host": "local", "status": "ok", "client": {"decode_tok_s": tok_s}, "measurement_id": mid}
                out.append(r)
                order += 1
        return out

    def write(self, dest: Path, records: list[dict[str, Any]], rounds: int) -> Path:
        """A run folder with these records and the committed run.json (its plan set to the rounds drawn)."""
        dest.mkdir(parents=True)
        meta = copy.deepcopy(self.meta)
        meta["plan"]["runs"] = rounds
        meta["plan"]["measurements"] = len(records)
        meta["plan"]["extra_rounds"] = []
        meta["status"] = "complete"
        (dest / "run.json").write_text(json.dumps(meta))
        (dest / "measurements.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
        return dest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    here = Path(__file__).resolve().parent.parent
    ap.add_argument("runs", nargs="*", default=[str(here / "results" / r) for r in
                                                ("demo-cpu", "real-gemma3-270m", "real-gemma3-270m-sweep")])
    args = ap.parse_args()
    print(f"{'run':<24}{'units':>6}{'cells':>6}{'round sd':>9}   per-measurement log sd (min / q1 / median / q3 / max)")
    for run in args.runs:
        shape = Shape.load(Path(run))
        for who, units in (("baselines", [u for u in shape.units if shape.baseline_unit(u) is None]),
                           ("strategies", [u for u in shape.units if shape.baseline_unit(u) is not None])):
            q = np.quantile([shape.noise[u] for u in units], [0, 0.25, 0.5, 0.75, 1]) if units else []
            print(f"{shape.run.name:<24}{len(shape.units):>6}{len(shape.true_log_speedup(shape.speed)):>6}"
                  f"{shape.round_sd:>9.3f}   {who:<11}" + " / ".join(f"{x:.3f}" for x in q))


if __name__ == "__main__":
    main()
