"""The summary's explanation of its speedups: each speculative cell's speedup decomposed
(harness/analysis/decomposition.py), acceptance by draft position, and the request-by-request figures of a reused
server (harness/analysis/acceptance.py). Parity between settings spans runs and is made for the report from
several run folders (`report_parity`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import cast

from harness.analysis import acceptance as acc
from harness.analysis import builds
from harness.analysis import decomposition as dc
from harness.analysis.records import CellIndex
from harness.analysis.speedups import SpeedupTable
from harness.store import shapes
from harness.store.runmeta import RunMeta

#: Said once in the report where records carry no per-position figures ({build}: `builds.measured_on`).
NO_POSITIONS = ("these records predate the kit's reading of the server's own counters (GET /metrics, every backend, "
                "harness/run/metrics.py), and {build} prints acceptance by draft position only at trace level "
                "(`acc per pos`, -lv 4, the GPU backends' level) and each draft call's accepted length only with "
                "LLAMA_TRACE set; at the CPU backend's info level it prints the mean accepted length per call of "
                "each request")


def no_positions(meta: RunMeta) -> str:
    """NO_POSITIONS said of the run's own builds."""
    return NO_POSITIONS.format(build=builds.measured_on(builds.build_names(meta)))


def summary(meta: RunMeta, index: CellIndex, baselines: Mapping[str, str | None],
            table: SpeedupTable) -> shapes.Explanation:
    """The summary's `decomposition`, `positions` and `requests` parts."""
    spec = acc.speculative_ids(meta)
    order = {(s.id, t.id): i for i, (s, t) in enumerate((s, t) for s in meta.planned_strategies()
                                                        for t in meta.planned_tasks())}
    hosts = {h: i for i, h in enumerate(meta.plan.hosts)}
    parts = sorted(dc.decompose(index, baselines, table).values(),
                   key=lambda d: (hosts.get(d.key.host, len(hosts)), order.get((d.key.strategy, d.key.task), 0)))
    pos = acc.positions(index, spec)
    rank = {s.id: i for i, s in enumerate(meta.planned_strategies())}
    in_order = sorted(pos.items(), key=lambda kv: (hosts.get(kv[0][0], len(hosts)), rank.get(kv[0][1], len(rank))))
    cells = [cast(shapes.CellPositions, {"host": h, "strategy": s, "task": t, **acc.positions_dict(p)})
             for (h, s, t), p in in_order if t is not None]
    strategies = [cast(shapes.PositionFigures, {"host": h, "strategy": s, **acc.positions_dict(p)})
                  for (h, s, t), p in in_order if t is None]
    lacking = sum(p.without for (_, _, t), p in pos.items() if t is None)
    return {
        "decomposition": [dc.as_dict(d) for d in parts],
        "positions": {"cells": cells, "strategies": strategies, "requests_without": lacking,
                      "note": no_positions(meta) if lacking else None},
        "requests": {"servers": acc.request_rows(index, spec) if meta.protocol == "reuse-server" else [],
                     "prompts": acc.prompt_figures(index, spec)},
    }


def report_parity(runs: Sequence[tuple[RunMeta, CellIndex]]) -> list[shapes.ParityJson]:
    """Acceptance parity over every run of a report (see harness/analysis/acceptance.py)."""
    units = [u for meta, index in runs for u in acc.units(meta, index)]
    return [acc.parity_dict(p) for p in acc.parity(units)]
