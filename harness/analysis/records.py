"""Measurement records as the analysis reads them: a typed view of each line of measurements.jsonl, the cell key,
and the index of one run's records by cell, built once and handed to every stage (statistics, summary, report,
compare).

Which records count (`CellIndex.usable`): status ok with a positive decode rate; not disturbed by other work on
the host (harness/run/interference.py marks `interference.disturbed`), unless more than MAX_DISTURBED_SHARE of the
host's measurements were (a busy host: leaving them out would leave nothing, so they are kept and the host is
named); and not superseded by a retake (a disturbed measurement measured again carries `retake_of`)."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from harness.store import result

#: Above this share of disturbed measurements on a host, they are kept (and said so) rather than left out.
MAX_DISTURBED_SHARE = 0.5


class CellKey(NamedTuple):
    """One cell of a run: a strategy on a task, on one host."""

    host: str
    strategy: str
    task: str


@dataclass(frozen=True)
class Measurement:
    """One line of measurements.jsonl, typed for the analysis; `raw` keeps the record for descriptive figures."""

    id: str
    host: str
    strategy: str
    task: str
    prompt: str
    round: int
    order: int
    run_index: int
    ok: bool
    tok_s: float | None
    disturbed: bool
    retake_of: str | None
    drafted: int
    accepted: int
    output_sha: str
    protocol: str
    raw: result.ResultRecord

    @classmethod
    def of(cls, r: result.ResultRecord) -> Measurement:
        server = r.get("server") or {}
        rate = (r.get("client") or {}).get("decode_tok_s")
        return cls(
            id=str(r.get("measurement_id", r.get("order", ""))), host=str(r.get("host", "local")),
            strategy=str(r["strategy"]), task=str(r["task"]), prompt=str(r.get("prompt", r["task"])),
            round=int(r.get("round", r.get("run_index", 0))), order=int(r.get("order", 0)),
            run_index=int(r.get("run_index", r.get("round", 0))), ok=r.get("status", "ok") == "ok",
            tok_s=float(rate) if isinstance(rate, int | float) and not isinstance(rate, bool) else None,
            disturbed=bool((r.get("interference") or {}).get("disturbed")), retake_of=r.get("retake_of"),
            drafted=int(server.get("draft_n") or 0), accepted=int(server.get("draft_n_accepted") or 0),
            output_sha=str((r.get("output") or {}).get("sha256", "")), protocol=str(r.get("protocol") or ""),
            raw=r)

    @property
    def key(self) -> CellKey:
        return CellKey(self.host, self.strategy, self.task)

    @property
    def measured(self) -> bool:
        """Ok with a positive decode rate."""
        return self.ok and self.tok_s is not None and self.tok_s > 0


class CellIndex:
    """One run's measurements by cell, in execution order, and which of them count (see the module docstring)."""

    def __init__(self, records: Iterable[result.ResultRecord | Measurement], exclude_disturbed: bool = True):
        ms = [r if isinstance(r, Measurement) else Measurement.of(r) for r in records]
        self.measurements: list[Measurement] = sorted(ms, key=lambda m: m.order)
        self.busy: dict[str, tuple[int, int]] = busy_hosts(self.measurements)
        superseded = {m.retake_of for m in self.measurements if m.retake_of}
        self.retakes = sum(1 for m in self.measurements if m.retake_of)
        self.cells: dict[CellKey, list[Measurement]] = defaultdict(list)
        self.usable: dict[CellKey, list[Measurement]] = defaultdict(list)
        for m in self.measurements:
            self.cells[m.key].append(m)
            if not m.measured or m.id in superseded:
                continue
            if exclude_disturbed and m.disturbed and m.host not in self.busy:
                continue
            self.usable[m.key].append(m)
        self.keys: list[CellKey] = list(self.cells)
        self.hosts: list[str] = list(dict.fromkeys(k.host for k in self.keys))

    def of(self, key: CellKey) -> list[Measurement]:
        """Every measurement of a cell, whatever its status."""
        return self.cells.get(key, [])

    def used(self, key: CellKey) -> list[Measurement]:
        """The measurements of a cell that count."""
        return self.usable.get(key, [])

    def prompts(self, key: CellKey) -> list[str]:
        return list(dict.fromkeys(m.prompt for m in self.of(key)))

    def per_round(self, key: CellKey) -> dict[int, float]:
        """A cell's tok/s per round: the geometric mean over its prompts of each prompt's median in the round."""
        return _per_round(self.used(key))

    def strategies(self, host: str) -> list[str]:
        return list(dict.fromkeys(k.strategy for k in self.keys if k.host == host))

    def tasks(self, host: str) -> list[str]:
        return list(dict.fromkeys(k.task for k in self.keys if k.host == host))


def _per_round(ms: list[Measurement]) -> dict[int, float]:
    by: dict[tuple[int, str], list[float]] = defaultdict(list)
    for m in ms:
        by[(m.round, m.prompt)].append(float(m.tok_s))
    per: dict[int, list[float]] = defaultdict(list)
    for (rd, _), vs in sorted(by.items()):
        per[rd].append(math.log(statistics.median(vs)))
    return {rd: math.exp(statistics.fmean(v)) for rd, v in sorted(per.items())}


def busy_hosts(measurements: Iterable[Measurement]) -> dict[str, tuple[int, int]]:
    """Hosts where more than MAX_DISTURBED_SHARE of the ok measurements were disturbed: (disturbed, ok) per host."""
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for m in measurements:
        if m.ok and not m.retake_of:
            c = counts[m.host]
            c[0] += m.disturbed
            c[1] += 1
    return {h: (d, n) for h, (d, n) in counts.items() if n and d / n > MAX_DISTURBED_SHARE}
