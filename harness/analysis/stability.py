"""Stability warnings about one cell's figures, hyperfine-style: a kind, the numbers behind it, shown beside the
figure (the sentences are harness/analysis/words.py's).

- disturbed: runs other work disturbed (harness/run/interference.py), left out of every figure, or kept on a busy
  host; retaken where the run retook them.
- few-rounds: fewer than MIN_ROUNDS paired rounds: no interval and no verdict.
- dispersion: the coefficient of variation of tok/s above DISPERSION_CV (pyperf warns at 10%), with how much of
  it the round effect explains.
- outlier / first-run: a run whose leave-one-out log residual over the run's pooled robust sd exceeds OUTLIER_Z
  and which is more than FIRST_RUN_MIN away; 3 runs or more. Run 1 in execution order is a first-run warning."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from scipy import stats as sps

from harness.analysis.contamination import Point, Unit
from harness.analysis.records import CellIndex, CellKey
from harness.analysis.speedups import MIN_ROUNDS
from harness.store import shapes

#: Coefficient of variation of a cell's tok/s above which it is called dispersed (pyperf warns at 10%).
DISPERSION_CV = 0.10
#: Modified z-score above which one run is an outlier (Iglewicz and Hoaglin).
OUTLIER_Z = 3.5
#: Smallest first-run deviation worth a warning, however quiet the other runs.
FIRST_RUN_MIN = 0.05


class WarningKind(StrEnum):
    DISTURBED = "disturbed"
    FEW_ROUNDS = "few-rounds"
    DISPERSION = "dispersion"
    OUTLIER = "outlier"
    FIRST_RUN = "first-run"


@dataclass(frozen=True)
class StabilityWarning:
    """One warning: its kind, the cell and (for a task with several prompts) the prompt, and the evidence."""

    kind: WarningKind
    key: CellKey
    prompt: str | None
    evidence: shapes.Evidence


def _loo_residuals(points: Sequence[Point]) -> list[float]:
    # Each run's log distance from the median of the unit's OTHER runs: an outlier cannot hide in its own median.
    logs = [math.log(p.normalised) for p in points]
    return [lg - statistics.median(logs[:i] + logs[i + 1:]) for i, lg in enumerate(logs)]


def pooled_noise(series: Mapping[Unit, list[Point]], host: str) -> float | None:
    """The host's noise: robust sd (1.4826 x MAD) of every run's leave-one-out log residual, pooled over the units
    with 3 runs or more (three runs cannot estimate a unit's own scale; a run of many units can)."""
    res = [x for u, pts in series.items() if u.key.host == host and len(pts) >= 3 for x in _loo_residuals(pts)]
    return float(sps.median_abs_deviation(res, scale="normal")) if res else None


def warnings(index: CellIndex, unit: Unit, series: Mapping[Unit, list[Point]], paired_rounds: int | None,
             scale: float | None) -> list[StabilityWarning]:
    """The warnings of one unit (`paired_rounds`: the cell's paired rounds when it has a baseline; `scale`: the
    host's `pooled_noise`)."""
    def warn(kind: WarningKind, evidence: shapes.Evidence) -> StabilityWarning:
        return StabilityWarning(kind, unit.key, unit.prompt, evidence)

    out: list[StabilityWarning] = []
    ms = [m for m in index.of(unit.key) if unit.prompt is None or m.prompt == unit.prompt]
    disturbed = [m for m in ms if m.measured and m.disturbed]
    if disturbed:
        busy = index.busy.get(unit.key.host)
        retaken = {m.retake_of for m in ms if m.retake_of}
        out.append(warn(WarningKind.DISTURBED, {
            "runs": [m.run_index for m in disturbed], "kept": busy is not None, "busy": list(busy) if busy else None,
            "retaken": sum(m.id in retaken for m in disturbed),
            "others_cores": [(m.raw.get("interference") or {}).get("others_cores") for m in disturbed]}))
    points = series.get(unit, [])
    n = len(points)
    rounds = n if paired_rounds is None else paired_rounds
    if rounds < MIN_ROUNDS:
        out.append(warn(WarningKind.FEW_ROUNDS, {"rounds": rounds, "needed": MIN_ROUNDS}))
    if n < 2:
        return out
    raw = [p.tok_s for p in points]
    cv = float(sps.variation(raw, ddof=1))
    cv_norm = float(sps.variation([p.normalised for p in points], ddof=1))
    if cv > DISPERSION_CV:
        out.append(warn(WarningKind.DISPERSION, {"cv": round(cv, 4), "normalised_cv": round(cv_norm, 4),
                                                 "runs": n, "series": [round(x, 3) for x in raw]}))
    if n < 3 or scale is None:
        return out
    for i, r in enumerate(_loo_residuals(points)):
        z = r / scale if scale > 0 else (math.inf if r else 0.0)
        dev = math.exp(r) - 1
        if abs(z) <= OUTLIER_Z or abs(dev) <= FIRST_RUN_MIN:
            continue
        out.append(warn(WarningKind.FIRST_RUN if i == 0 else WarningKind.OUTLIER, {
            "run": i + 1, "order": points[i].order, "tok_s": round(raw[i], 3), "deviation": round(dev, 4),
            "z": None if math.isinf(z) else round(z, 2), "pooled_sd": round(scale, 4),
            "series": [round(x, 3) for x in raw]}))
    return out
