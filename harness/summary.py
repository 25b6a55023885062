"""From a run folder to its summary: per cell (host x strategy x task, over prompts and runs) median, min, max and
spread; speedups against each strategy's baseline; acceptance; checks.

Reads only run.json (typed, harness/runmeta.py) and measurements.jsonl (the stage before); writes nothing."""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

from harness import checks
from harness.results import RunDir
from harness.runmeta import RunMeta
from harness.schema import FORMAT_VERSIONS

Key = tuple[str, str, str]  # host, strategy, task


def _r(x: float | None, nd: int = 3) -> float | None:
    return None if x is None else round(float(x), nd)


def stats(xs: list[float | None]) -> dict[str, Any]:
    """n, median, min, max, spread (± half the range as % of the median), stdev."""
    vals = [x for x in xs if x is not None]
    if not vals:
        return {"n": 0, "median": None, "min": None, "max": None, "spread_pct": None, "stdev": None}
    med = statistics.median(vals)
    return {"n": len(vals), "median": _r(med), "min": _r(min(vals)), "max": _r(max(vals)),
            "spread_pct": _r((max(vals) - min(vals)) / 2 / med * 100, 1) if med else None,
            "stdev": _r(statistics.stdev(vals)) if len(vals) > 1 else 0.0}


def bandwidth(meta: RunMeta, host: str) -> tuple[float, str]:
    """Measured bandwidth (invoke probe) for this host when present, else the manifest's."""
    bw = meta.bandwidth or {}
    if bw.get("gbs") and bw.get("host") in (None, host):
        return float(bw["gbs"]), "measured"
    return float(meta.hardware["memory_bandwidth_gbs"]), meta.hardware["bandwidth_source"]


def same_target_baseline(meta: RunMeta, sid: str) -> str | None:
    """The baseline on the strategy's own target (what its output is compared with)."""
    model = meta.strategy(sid).model
    return next((s.id for s in meta.planned_strategies() if not s.speculative and s.model == model), None)


def summarize(rd: RunDir) -> dict[str, Any]:
    """The summary of one run folder (also valid for a partial run: missing cells are named)."""
    meta = rd.read_meta()
    records = rd.measurements()
    by_cell: dict[Key, list[dict[str, Any]]] = defaultdict(list)
    for r in sorted(records, key=lambda r: r["order"]):
        by_cell[(r["host"], r["strategy"], r["task"])].append(r)
    cells, missing = [], []
    for host in meta.plan.hosts:
        bw, bw_source = bandwidth(meta, host)
        for s in meta.planned_strategies():
            target_bytes = meta.models[s.model]["size_bytes"]
            for t in meta.planned_tasks():
                recs = by_cell.get((host, s.id, t.id), [])
                expected = meta.plan.runs * len(t.prompts)
                if len(recs) < expected:
                    missing.append({"host": host, "strategy": s.id, "task": t.id, "recorded": len(recs),
                                    "expected": expected})
                cell = _cell(host, s, t.id, recs, meta.protocol)
                if cell["decode_tok_s"]["median"] is not None:
                    v = checks.physics(cell["decode_tok_s"]["median"], cell["tokens_per_pass"]["median"], bw,
                                       target_bytes, not s.speculative, bw_source)
                    cell["checks"]["physics"] = v.as_dict()
                cells.append(cell)
        _speedups(cells, host, meta)
        _determinism(cells, by_cell, host, meta)
    return {
        "format_version": FORMAT_VERSIONS["summary"], "run_id": meta.run_id, "status": meta.status,
        "protocol": meta.protocol, "manifest": {"name": meta.manifest["name"], "sha256": meta.manifest["sha256"]},
        "hardware": meta.hardware,
        "baseline": next(iter(meta.baselines()), None),
        "strategies": [{"id": s.id, "spec_type": s.spec_type, "model": s.model, "baseline": s.baseline}
                       for s in meta.planned_strategies()],
        "tasks": meta.plan.tasks, "hosts": meta.plan.hosts, "runs": meta.plan.runs,
        "measurements": {"recorded": len(records), "ok": sum(r["status"] == "ok" for r in records),
                         "failed": sum(r["status"] == "failed" for r in records),
                         "planned": meta.plan.measurements, "torn_last_line": rd.torn_last_line},
        "missing": missing, "cells": cells, "determinism": _determinism_totals(cells, meta),
    }


def _acceptance(ok: list[dict[str, Any]]) -> tuple[int, int, list[float | None], list[float | None]]:
    drafted = accepted = 0
    acc_rates, tpps = [], []
    for r in ok:
        sv = r["server"]
        drafted += sv["draft_n"]
        accepted += sv["draft_n_accepted"]
        tpps.append(checks.tokens_per_pass(sv["predicted_n"] or 0, sv["draft_n_accepted"]))
        acc_rates.append(sv["draft_n_accepted"] / sv["draft_n"] if sv["draft_n"] else None)
    return drafted, accepted, acc_rates, tpps


def _contamination(ok: list[dict[str, Any]], protocol: str) -> checks.Verdict:
    """The contamination verdict of a cell: each prompt's runs are a series; the first flagged one speaks."""
    by_prompt: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in ok:
        by_prompt[r["prompt"]].append(r)
    verdicts = []
    for recs in by_prompt.values():
        tps = [r["client"]["decode_tok_s"] for r in recs if r["client"]["decode_tok_s"] is not None]
        drafted, _, acc, _ = _acceptance(recs)
        verdicts.append(checks.contamination(tps, [a if a is not None else 0.0 for a in acc] if drafted else None,
                                             protocol, drafts=[r["server"]["draft_n"] for r in recs] if drafted
                                             else None))
    rank = {"warm-cache": 0, "naive": 1, "drift": 2, None: 3}
    return min(verdicts, key=lambda v: rank.get(v.data.get("kind"), 3)) if verdicts else \
        checks.contamination([], None, protocol)


def _cell(host: str, s: Any, task: str, recs: list[dict[str, Any]], protocol: str) -> dict[str, Any]:
    ok = [r for r in recs if r["status"] == "ok"]
    failed = [r for r in recs if r["status"] == "failed"]
    tps = [r["client"]["decode_tok_s"] for r in ok]
    drafted, accepted, _, tpps = _acceptance(ok)
    return {
        "host": host, "strategy": s.id, "spec_type": s.spec_type, "model": s.model, "task": task,
        "runs_ok": len(ok), "runs_failed": len(failed),
        "failures": [{"run_index": r["run_index"], "prompt": r["prompt"], "reason": r["failure"]["reason"]}
                     for r in failed],
        "decode_tok_s": stats(tps),
        "server_decode_tok_s": stats([r["server"]["predicted_per_second"] for r in ok]),
        "prefill_tok_s": stats([r["server"]["prompt_per_second"] for r in ok]),
        "ttft_s": stats([r["client"]["ttft_s"] for r in ok]),
        "load_s": stats([r["timing"]["load_s"] for r in ok]),
        "memory_peak_mb": stats([r["memory_peak_bytes"] / 2**20 for r in ok if r.get("memory_peak_bytes")]),
        "draft_n": drafted, "draft_n_accepted": accepted,
        "acceptance": _r(accepted / drafted, 4) if drafted else None,
        "tokens_per_pass": stats(tpps),
        "series": [_r(x) for x in tps],
        "streams": max((r.get("concurrency", {}).get("streams", 1) for r in ok), default=1),
        "aggregate_tok_s": stats([r["concurrency"]["aggregate_tok_s"] for r in ok if "concurrency" in r]),
        "per_stream_tok_s": stats([x for r in ok if "concurrency" in r for x in r["concurrency"]["per_stream_tok_s"]]),
        "speedup": None,
        "checks": {"contamination": _contamination(ok, protocol).as_dict()},
    }


def _speedups(cells: list[dict[str, Any]], host: str, meta: RunMeta) -> None:
    med = {(c["strategy"], c["task"]): c["decode_tok_s"]["median"] for c in cells if c["host"] == host}
    for c in cells:
        base = meta.strategy(c["strategy"]).baseline
        b = med.get((base, c["task"])) if base else None
        if c["host"] == host and b and c["decode_tok_s"]["median"] is not None:
            c["speedup"] = _r(c["decode_tok_s"]["median"] / b)


def _determinism(cells: list[dict[str, Any]], by_cell: dict[Key, list[dict[str, Any]]], host: str,
                 meta: RunMeta) -> None:
    """Byte match against the baseline of the same target, prompt by prompt."""
    for c in cells:
        if c["host"] != host:
            continue
        base = same_target_baseline(meta, c["strategy"])
        if base is None:
            continue
        base_ok = [r for r in by_cell.get((host, base, c["task"]), []) if r["status"] == "ok"]
        runs = [r for r in by_cell.get((host, c["strategy"], c["task"]), []) if r["status"] == "ok"]
        if not base_ok or not runs:
            continue
        refs = {}
        for r in base_ok:
            refs.setdefault(r["prompt"], r)
        if c["strategy"] == base:
            stable = all(r["output"]["sha256"] == refs[r["prompt"]]["output"]["sha256"] for r in base_ok)
            c["checks"]["determinism"] = {"check": "determinism", "flagged": not stable,
                                          "sentence": "the reference" if stable else
                                          "baseline outputs differ between runs", "data": {"identical": stable}}
            continue
        verdicts = [checks.determinism(refs[r["prompt"]]["output"], r["output"], refs[r["prompt"]].get("probs"))
                    for r in runs if r["prompt"] in refs]
        if not verdicts:
            continue
        first_bad = next((v for v in verdicts if v.flagged), None)
        n_same = sum(not v.flagged for v in verdicts)
        d = (first_bad or verdicts[0]).as_dict()
        d["data"].update(runs_identical=n_same, runs=len(verdicts), baseline=base)
        if first_bad and n_same:
            d["sentence"] = f"{n_same}/{len(verdicts)} runs identical; {first_bad.sentence}"
        c["checks"]["determinism"] = d


def _determinism_totals(cells: list[dict[str, Any]], meta: RunMeta) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for c in cells:
        det = c["checks"].get("determinism")
        if not meta.strategy(c["strategy"]).speculative or det is None:
            continue
        key = f"{c['host']}/{c['strategy']}"
        d = out.setdefault(key, {"host": c["host"], "strategy": c["strategy"], "identical": 0, "tasks": 0})
        d["tasks"] += 1
        d["identical"] += int(det["data"]["identical"] and det["data"].get("runs_identical", 1)
                              == det["data"].get("runs", 1))
    return out
