"""One call for a whole run: every cell's statistics (tok/s with its interval, the paired speedup and its verdict,
contamination, stability warnings, the deterministic fingerprint) and each strategy's geometric mean, from the
run's CellIndex (harness/analysis/records.py), built once.

The pieces: harness/analysis/inference.py (locations, moderated intervals, Holm), speedups.py (paired speedups and
the table's family of marks), contamination.py (evidence and the family of drift/noise flags), stability.py
(warnings)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from harness.analysis import contamination as ct
from harness.analysis import inference as inf
from harness.analysis import speedups as sp
from harness.analysis import stability as st
from harness.analysis.records import CellIndex, CellKey
from harness.store import result

#: Others (and steal) using more than this many cores on average during the window disturb the measurement:
#: a quarter of a core is well above what an idle host's daemons use, and llama-server keeps every thread busy.
DISTURBED_CORES = 0.25

Baselines = Mapping[str, str | None]


@dataclass(frozen=True)
class CellStats:
    """Everything the statistics say about one cell."""

    key: CellKey
    rounds: int  # rounds with a usable tok/s
    tok_s_median: float | None
    tok_s_interval: inf.Interval  # of the geometric mean of the per-round tok/s
    speedup: sp.Speedup | None  # None for a baseline itself
    contamination: ct.Contamination
    warnings: list[st.StabilityWarning]
    fingerprint: ct.Fingerprint


@dataclass(frozen=True)
class RunStats:
    """Every cell's statistics and the speedup table (cells and geometric means, with their families)."""

    index: CellIndex
    cells: list[CellStats]
    table: sp.SpeedupTable
    baselines: dict[str, str | None]

    @property
    def geomeans(self) -> list[sp.Speedup]:
        return self.table.geomeans

    def cell(self, key: CellKey) -> CellStats | None:
        return self.__dict__["_by_key"].get(key)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_key", {c.key: c for c in self.cells})


def baseline_map(baseline: str | None | Baselines, strategies: Iterable[str]) -> dict[str, str | None]:
    """Each strategy's baseline (None for a baseline itself): one id for every strategy, or a mapping."""
    if isinstance(baseline, Mapping):
        return {s: baseline.get(s) for s in strategies}
    return {s: None if s == baseline or baseline is None else baseline for s in strategies}


def analyze(records: CellIndex | Iterable[result.ResultRecord], baseline: str | None | Baselines,
            protocol: str | None = None, band: float = sp.EQUIVALENCE_BAND) -> RunStats:
    """Statistics for every cell of a run (cells in first-seen order) and per host each strategy's geometric mean.
    `baseline`: the baseline's id, or each strategy's baseline."""
    index = records if isinstance(records, CellIndex) else CellIndex(records)
    bases = baseline_map(baseline, dict.fromkeys(k.strategy for k in index.keys))
    table = sp.table(index, bases, band)
    cont = ct.judge(index, protocol)
    us = ct.units(index)
    series = ct.normalise(index, us)
    scales = {h: st.pooled_noise(series, h) for h in index.hosts}
    tok = _tok_s_estimates(index)
    cells = []
    for key in index.keys:
        s = table.cells.get(key)
        warns = [w for u in us if u.key == key
                 for w in st.warnings(index, u, series, None if s is None else len(s.rounds), scales[key.host])]
        vals = list(index.per_round(key).values())
        cells.append(CellStats(key, len(vals), statistics.median(vals) if vals else None,
                               inf.Interval.of(tok.get(key)), s, cont[key], warns,
                               ct.fingerprint(index.of(key))))
    return RunStats(index, cells, table, bases)


def _tok_s_estimates(index: CellIndex) -> dict[CellKey, inf.Estimate | None]:
    out: dict[CellKey, inf.Estimate | None] = {}
    for host in index.hosts:
        keys = [k for k in index.keys if k.host == host]
        locs = [inf.locate([math.log(v) for v in index.per_round(k).values()]) for k in keys]
        found, _ = inf.estimates(locs)
        out.update((k, e if e is not None and e.n >= sp.MIN_ROUNDS else None) for k, e in zip(keys, found, strict=True))
    return out
