"""From a run folder to its summary: per cell median, min, max and spread; speedups; acceptance; checks.

Reads only run.json and measurements.jsonl (the stage before); writes nothing itself."""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

import yaml

from harness import checks
from harness.results import RunDir

FORMAT_VERSION = 1


def _r(x: float | None, nd: int = 3) -> float | None:
    return None if x is None else round(float(x), nd)


def stats(xs: list[float]) -> dict[str, Any]:
    xs = [x for x in xs if x is not None]
    if not xs:
        return {"n": 0, "median": None, "min": None, "max": None, "spread_pct": None, "stdev": None}
    med = statistics.median(xs)
    return {"n": len(xs), "median": _r(med), "min": _r(min(xs)), "max": _r(max(xs)),
            # ± half the range, as a percentage of the median
            "spread_pct": _r((max(xs) - min(xs)) / 2 / med * 100, 1) if med else None,
            "stdev": _r(statistics.stdev(xs)) if len(xs) > 1 else 0.0}


def bandwidth(meta: dict[str, Any], manifest_raw: dict[str, Any], host: str) -> tuple[float, str]:
    """Measured bandwidth (invoke probe) for this host when present, else the manifest's."""
    bw = meta.get("bandwidth") or {}
    if isinstance(bw, dict) and bw.get("gbs") and bw.get("host") in (None, host):
        return float(bw["gbs"]), "measured"
    hw = manifest_raw["hardware"]
    return float(hw["memory_bandwidth_gbs"]), hw["bandwidth_source"]


def summarize(rd: RunDir) -> dict[str, Any]:
    """The summary of one run folder (also valid for a partial run: missing cells are named)."""
    meta = rd.read_meta()
    records = rd.measurements()
    raw = yaml.safe_load(meta["manifest"]["text"])
    plan = meta["plan"]
    strategies, tasks, hosts = plan["strategies"], plan["tasks"], plan["hosts"]
    spec_types = {s["id"]: s["spec_type"] for s in raw["strategies"]}
    baseline = next((s for s in strategies if spec_types.get(s) == "none"), None)
    target_bytes = meta["models"]["target"]["size_bytes"]

    by_cell: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in sorted(records, key=lambda r: r["order"]):
        by_cell[(r["host"], r["strategy"], r["task"])].append(r)

    cells = []
    missing = []
    for host in hosts:
        bw, bw_source = bandwidth(meta, raw, host)
        for s in strategies:
            for t in tasks:
                recs = by_cell.get((host, s, t), [])
                ok = [r for r in recs if r["status"] == "ok"]
                failed = [r for r in recs if r["status"] == "failed"]
                expected = plan["runs"]
                if len(recs) < expected:
                    missing.append({"host": host, "strategy": s, "task": t, "recorded": len(recs),
                                    "expected": expected})
                cell = _cell(host, s, t, spec_types.get(s, "?"), ok, failed, meta["protocol"])
                if cell["decode_tok_s"]["median"] is not None:
                    v = checks.physics(cell["decode_tok_s"]["median"], cell["tokens_per_pass"]["median"], bw,
                                       target_bytes, s == baseline, bw_source)
                    cell["checks"]["physics"] = v.as_dict()
                cells.append(cell)
        _speedups(cells, host, baseline)
        _determinism(cells, by_cell, host, baseline, tasks, strategies)

    return {
        "format_version": FORMAT_VERSION,
        "run_id": meta["run_id"],
        "status": meta["status"],
        "protocol": meta["protocol"],
        "manifest": {"name": meta["manifest"]["name"], "sha256": meta["manifest"]["sha256"]},
        "hardware": raw["hardware"],
        "baseline": baseline,
        "strategies": [{"id": s, "spec_type": spec_types.get(s)} for s in strategies],
        "tasks": tasks,
        "hosts": hosts,
        "runs": plan["runs"],
        "measurements": {"recorded": len(records), "ok": sum(r["status"] == "ok" for r in records),
                         "failed": sum(r["status"] == "failed" for r in records),
                         "planned": plan.get("measurements", len(hosts) * len(strategies) * len(tasks) * plan["runs"])},
        "missing": missing,
        "cells": cells,
        "determinism": _determinism_totals(cells, baseline),
    }


def _cell(host: str, s: str, t: str, spec_type: str, ok: list[dict], failed: list[dict], protocol: str) -> dict:
    tps = [r["client"]["decode_tok_s"] for r in ok]
    server_tps = [r["server"]["predicted_per_second"] for r in ok]
    acc_rates, tpps = [], []
    drafted = accepted = 0
    for r in ok:
        sv = r["server"]
        drafted += sv["draft_n"]
        accepted += sv["draft_n_accepted"]
        tpps.append(checks.tokens_per_pass(sv["predicted_n"] or 0, sv["draft_n_accepted"]))
        acc_rates.append(sv["draft_n_accepted"] / sv["draft_n"] if sv["draft_n"] else None)
    verdict = checks.contamination([x for x in tps if x is not None],
                                   [a if a is not None else 0.0 for a in acc_rates] if drafted else None, protocol,
                                   drafts=[r["server"]["draft_n"] for r in ok] if drafted else None)
    return {
        "host": host, "strategy": s, "spec_type": spec_type, "task": t,
        "runs_ok": len(ok), "runs_failed": len(failed),
        "failures": [{"run_index": r["run_index"], "reason": r["failure"]["reason"]} for r in failed],
        "decode_tok_s": stats(tps),
        "server_decode_tok_s": stats(server_tps),
        "prefill_tok_s": stats([r["server"]["prompt_per_second"] for r in ok]),
        "ttft_s": stats([r["client"]["ttft_s"] for r in ok]),
        "load_s": stats([r["timing"]["load_s"] for r in ok]),
        "memory_peak_mb": stats([r["memory_peak_bytes"] / 2**20 for r in ok if r.get("memory_peak_bytes")]),
        "draft_n": drafted, "draft_n_accepted": accepted,
        "acceptance": _r(accepted / drafted, 4) if drafted else None,
        "tokens_per_pass": stats([x for x in tpps if x is not None]),
        "series": [_r(x) for x in tps],
        "streams": max((r.get("concurrency", {}).get("streams", 1) for r in ok), default=1),
        "aggregate_tok_s": stats([r["concurrency"]["aggregate_tok_s"] for r in ok if "concurrency" in r]),
        "per_stream_tok_s": stats([x for r in ok if "concurrency" in r for x in r["concurrency"]["per_stream_tok_s"]
                                   if x is not None]),
        "speedup": None,
        "checks": {"contamination": verdict.as_dict()},
    }


def _speedups(cells: list[dict], host: str, baseline: str | None) -> None:
    if baseline is None:
        return
    base = {c["task"]: c["decode_tok_s"]["median"] for c in cells if c["host"] == host and c["strategy"] == baseline}
    for c in cells:
        b = base.get(c["task"])
        if c["host"] == host and b and c["decode_tok_s"]["median"] is not None:
            c["speedup"] = _r(c["decode_tok_s"]["median"] / b)


def _determinism(cells: list[dict], by_cell: dict, host: str, baseline: str | None, tasks: list[str],
                 strategies: list[str]) -> None:
    if baseline is None:
        return
    for t in tasks:
        base_ok = [r for r in by_cell.get((host, baseline, t), []) if r["status"] == "ok"]
        if not base_ok:
            continue
        ref = base_ok[0]
        base_stable = len({r["output"]["sha256"] for r in base_ok}) == 1
        for c in cells:
            if c["host"] != host or c["task"] != t:
                continue
            runs = [r for r in by_cell.get((host, c["strategy"], t), []) if r["status"] == "ok"]
            if not runs:
                continue
            if c["strategy"] == baseline:
                c["checks"]["determinism"] = {
                    "check": "determinism", "flagged": not base_stable,
                    "sentence": "the reference" if base_stable else "baseline outputs differ between runs",
                    "data": {"identical": base_stable}}
                continue
            verdicts = [checks.determinism(ref["output"], r["output"], ref.get("probs")) for r in runs]
            first_bad = next((v for v in verdicts if v.flagged), None)
            n_same = sum(not v.flagged for v in verdicts)
            v = first_bad or verdicts[0]
            d = v.as_dict()
            d["data"]["runs_identical"] = n_same
            d["data"]["runs"] = len(verdicts)
            if first_bad and n_same:
                d["sentence"] = f"{n_same}/{len(verdicts)} runs identical; {v.sentence}"
            c["checks"]["determinism"] = d


def _determinism_totals(cells: list[dict], baseline: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for c in cells:
        if c["strategy"] == baseline or "determinism" not in c["checks"]:
            continue
        key = f"{c['host']}/{c['strategy']}"
        d = out.setdefault(key, {"host": c["host"], "strategy": c["strategy"], "identical": 0, "tasks": 0})
        d["tasks"] += 1
        d["identical"] += int(c["checks"]["determinism"]["data"]["identical"]
                              and c["checks"]["determinism"]["data"].get("runs_identical", 1)
                              == c["checks"]["determinism"]["data"].get("runs", 1))
    return out
