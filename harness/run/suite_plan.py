"""`invoke validate`'s lines for a manifest's prompt suites: categories, prompts, measurements and how long they
take, at the baseline rate an earlier run measured for the same target file where one did, else at the target's
roofline rate (an upper bound), else at a stated assumed rate."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from pathlib import Path

from harness import formatter as fm
from harness.formatter import size
from harness.intake import suites
from harness.intake.manifest import Manifest

#: Earlier run folders looked at for a measured rate, and the largest summary.json / run.json read.
MAX_RUNS = 200
MAX_FILE_BYTES = 64 << 20


def measured_rate(results_dir: Path | None, target_sha256: str | None, backend: str) -> tuple[float, list[str]] | None:
    """The median over earlier fresh-container runs on this target file (by its sha256) and backend of each run's
    median single-client baseline decode rate (tok/s), and those runs' ids; None when no run folder says so. Run
    folders are read as untrusted: bounded, and every value checked before it is used."""
    if results_dir is None or not target_sha256 or not Path(results_dir).is_dir():
        return None
    found: list[tuple[float, str]] = []
    for d in sorted(Path(results_dir).iterdir())[:MAX_RUNS]:
        meta, summ = _json(d / "run.json"), _json(d / "summary.json")
        if not isinstance(meta, dict) or not isinstance(summ, dict) or meta.get("protocol") != "fresh-container":
            continue
        target = _get(meta, "models", "target")
        if not isinstance(target, dict) or target.get("sha256") != target_sha256 \
                or _get(meta, "build", "plan", "backend") != backend:
            continue
        rates = []
        for c in summ.get("cells") or []:
            if isinstance(c, dict) and c.get("spec_type") == "none" and c.get("model") == "target" \
                    and c.get("streams", 1) == 1:
                v = _get(c, "decode_tok_s", "median")
                if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and 0 < v < 1e6:
                    rates.append(float(v))
        if rates:
            found.append((statistics.median(rates), d.name))
    if not found:
        return None
    return statistics.median(r for r, _ in found), [run for _, run in found]


def _get(d: object, *keys: str) -> object:
    for k in keys:
        d = d.get(k) if isinstance(d, dict) else None
    return d


def _json(path: Path) -> object:
    try:
        if not path.is_file() or path.stat().st_size > MAX_FILE_BYTES:
            return None
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None


def lines(manifest: Manifest, planned_tasks: Sequence[str], models_dir: Path, results_dir: Path | None) -> list[str]:
    """Each suite's lines; `planned_tasks`: the task of every planned measurement."""
    t = manifest.target
    measured = measured_rate(results_dir, t.sha256, manifest.build.backend)
    rate: float | None
    if measured is not None:
        runs = ", ".join(fm.console(r, 80) for r in measured[1][:4]) + (", ..." if len(measured[1]) > 4 else "")
        rate, said = measured[0], (f"{fm.rate(measured[0])} tok/s, the median of the baseline's rates in "
                                   f"{len(measured[1])} earlier run(s) of this target on {manifest.build.backend} "
                                   f"({runs})")
    else:
        p = t.local_path(models_dir)
        size_b = p.stat().st_size if p.is_file() else t.size_bytes
        rate = manifest.hardware.memory_bandwidth_gbs * 1e9 / size_b if size_b else None
        gbs = fm.plain(manifest.hardware.memory_bandwidth_gbs)
        said = (f"the target's roofline rate {fm.plain(round(rate))} tok/s ({gbs} GB/s over {size(size_b)}, an "
                "upper bound)") if rate else ""
    out = []
    for d in manifest.suites:
        ids = {suites.turn_task(c.task_id, k) for c in d.categories for k, _ in suites.turns_of(c, d.suite.turns)}
        out += suites.describe(d, sum(1 for task in planned_tasks if task in ids), rate, said)
    return out
