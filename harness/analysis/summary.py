"""From a run folder to its summary: per cell (host x strategy x task, over prompts and runs) the tok/s with its
interval, the paired speedup against the strategy's baseline with its interval and verdict, acceptance, the
checks (contamination from evidence, physics, determinism), stability warnings, and the interference each host
saw. The statistics are harness/analysis/stats.py's; this module puts them beside the figures the report shows.

Reads only run.json (typed, harness/store/runmeta.py) and measurements.jsonl (the stage before); writes nothing."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from harness import formatter as fm
from harness.analysis import (
    breakeven,
    builds,
    checks,
    completion,
    dimensions,
    explanation,
    gaps,
    lossless,
    reach,
    stats,
    tuning,
    words,
)
from harness.analysis import convergence as cv
from harness.analysis import inference as inf
from harness.analysis import prompt_sample as suite_categories
from harness.analysis import speedups as sp
from harness.analysis.records import MAX_DISTURBED_SHARE, CellIndex, CellKey, Measurement
from harness.analysis.speedups import Speedup
from harness.models import passbytes
from harness.schema import FORMAT_VERSIONS
from harness.store import answers, result, shapes
from harness.store.rundir import RunDir
from harness.store.runmeta import RunMeta


def describe(xs: list[float | None]) -> shapes.Described:
    """n, median, min, max, spread (± half the range as % of the median), stdev."""
    vals = [x for x in xs if x is not None]
    if not vals:
        return {"n": 0, "median": None, "min": None, "max": None, "spread_pct": None, "stdev": None}
    med = statistics.median(vals)
    return {"n": len(vals), "median": fm.rounded(med, 3), "min": fm.rounded(min(vals), 3),
            "max": fm.rounded(max(vals), 3),
            "spread_pct": fm.rounded((max(vals) - min(vals)) / 2 / med * 100, 1) if med else None,
            "stdev": fm.rounded(statistics.stdev(vals), 3) if len(vals) > 1 else 0.0}


def _interval(iv: inf.Interval | None) -> shapes.IntervalJson | None:
    if iv is None:
        return None
    return {"low": fm.rounded(iv.low, 4), "high": fm.rounded(iv.high, 4), "n": iv.n, "method": iv.method,
            "df": fm.rounded(iv.df, 1), "moderated": iv.moderated, "note": words.interval_note(iv)}


def _verdict(s: Speedup) -> shapes.VerdictJson:
    j = s.judgement
    return {"kind": j.verdict.value, "rule": words.verdict_rule(s), "p_differs": fm.rounded(j.p_differs, 6),
            "p_within": fm.rounded(j.p_within, 6), "p_adjusted": fm.rounded(j.p_adjusted, 6), "family": j.family,
            "smallest_marked": None if j.smallest is None else fm.rounded(math.exp(j.smallest), 4),
            "family_interval": _bounds(s.family_interval())}


def _bounds(iv: inf.Interval | None) -> shapes.BoundsJson | None:
    return None if iv is None or not iv.available else iv.bounds()


def _prior(p: inf.Prior) -> shapes.PriorJson:
    return {"d0": fm.rounded(p.d0, 2), "sd": fm.rounded(p.sd, 5), "cells": p.cells}


def _family(table: sp.SpeedupTable) -> shapes.FamilyJson:
    """The family the printed table's marks are judged in, the priors its variances were moderated with, and what
    its rounds could mark."""
    pw = table.power()
    return {"cells": len([c for c in table.cells.values() if c.judgement.family]),
            "geomeans": len([g for g in table.geomeans if g.judgement.family]),
            "tests": table.family_size, "method": "holm", "alpha": inf.ALPHA,
            "band": table.band,
            "priors": {h: {"strategy": _prior(p.strategy), "baseline": _prior(p.baseline), "paired": _prior(p.paired)}
                       for h, p in table.priors.items()},
            "power": {"family": pw.family, "rounds": pw.rounds, "cells": fm.rounded(pw.cells, 4),
                      "noisiest_quarter": fm.rounded(pw.noisiest, 4), "geomeans": fm.rounded(pw.geomeans, 4),
                      "rounds_for": {fm.fixed(t, 2): n for t, n in pw.rounds_for.items()},
                      "rounds_range": {fm.fixed(t, 2): list(r) for t, r in pw.rounds_range.items()},
                      "noise": fm.rounded(pw.noise, 6),
                      "sentence": words.power(pw)}}


def _reach(table: sp.SpeedupTable, run_id: str) -> shapes.ReachJson | None:
    """What a reproduction of this run can confirm (harness/analysis/reach.py), None without a judged geometric
    mean."""
    r = reach.reach(table)
    if r is None:
        return None
    return {"geomeans_best": fm.rounded(r.geomeans_best, 4), "cells_best": fm.rounded(r.cells_best, 4),
            "geomeans_same_rounds": fm.rounded(r.geomeans_same, 4), "cells_same_rounds": fm.rounded(r.cells_same, 4),
            "rounds": r.rounds, "margin": r.margin, "cell_margin": r.cell_margin,
            "rounds_for_margin": r.rounds_for_margin, "rounds_for_cell_margin": r.rounds_for_cells,
            "command": words.reach_command(r, run_id), "sentence": words.reach(r, run_id)}


def bandwidth(meta: RunMeta, host: str) -> tuple[float, str]:
    """Measured bandwidth (invoke probe) for this host when present, else the manifest's."""
    bw = meta.bandwidth
    if bw and bw.on(host) and bw.gbs:
        return float(bw.gbs), "measured"
    return float(meta.hardware.memory_bandwidth_gbs), meta.hardware.bandwidth_source


def same_target_baseline(meta: RunMeta, sid: str) -> str | None:
    """The baseline on the strategy's own target and build (what its output is compared with)."""
    s = meta.strategy(sid)
    return next((b.id for b in meta.planned_strategies() if not b.speculative and b.model == s.model
                 and b.build == s.build), None)


def summarize(rd: RunDir) -> shapes.Summary:
    """The summary of one run folder (also valid for a partial run: missing cells are named)."""
    full = rd.read_meta()
    if full.answers is not None:  # a suite's later turns were sent after these answers: as run.json recorded them
        answers.read(rd.path, full.answers)
    measured = rd.measurements()
    # synthetic acceptance (benchmarking only) has a section of its own and no place in any other table
    meta, records = breakeven.split(full, measured)
    everything = CellIndex(records)
    index, _ = tuning.split(meta, everything)  # a sweep's confirmation rounds have their own table
    baselines = {s.id: s.baseline for s in meta.planned_strategies()}
    run_stats = stats.analyze(index, baselines, meta.protocol)
    cells, missing = [], []
    for host in meta.plan.hosts:
        bw, bw_source = bandwidth(meta, host)
        for s in meta.planned_strategies():
            for t in meta.planned_tasks():
                key = CellKey(host, s.id, t.id)
                ms = [m for m in index.of(key) if not m.retake_of]
                expected = meta.plan.runs * len(t.prompts)
                if len(ms) < expected:
                    missing.append({"host": host, "strategy": s.id, "task": t.id, "recorded": len(ms),
                                    "expected": expected})
                cell = _cell(s, index, key, run_stats.cell(key))
                if cell["decode_tok_s"]["median"] is not None:
                    pb = pass_bytes(meta, s, [m.raw for m in index.of(key) if m.ok])
                    v = checks.physics(cell["decode_tok_s"]["median"], cell["tokens_per_pass"]["median"], bw,
                                       meta.models[s.model].size_bytes, not s.speculative, bw_source,
                                       pb.as_dict() if pb else None, pb.rule() if pb else None)
                    cell["checks"]["physics"] = v.as_dict()
                used = device_use([m.raw for m in index.of(key) if m.ok])
                if used is not None:  # GPU backends only: CPU runs' summaries stay as they were
                    cell["device"] = used
                cells.append(cell)
        _determinism(cells, index, host, meta)
    _speculation(cells, index, meta)
    table = run_stats.table
    interference = interference_summary(everything, meta.plan.hosts)
    out: shapes.Summary = {
        "format_version": FORMAT_VERSIONS["summary"], "run_id": meta.run_id, "status": meta.status,
        "protocol": meta.protocol, "manifest": {"name": meta.manifest.name, "sha256": meta.manifest.sha256},
        "hardware": meta.hardware_json(),
        "baseline": next(iter(meta.baselines()), None),
        "strategies": [{"id": s.id, "spec_type": s.spec_type, "model": s.model, "baseline": s.baseline}
                       | ({"build": s.build} if s.build else {}) for s in meta.planned_strategies()],
        "tasks": meta.plan.tasks, "hosts": meta.plan.hosts, "runs": meta.plan.runs,
        "measurements": {"recorded": len(records), "ok": sum(m.ok for m in everything.measurements),
                         "failed": sum(not m.ok for m in everything.measurements),
                         "retakes": everything.retakes,
                         "retake_pairs": gaps.restored_by_retakes(everything.measurements, baselines,
                                                                  everything.busy),
                         "planned": meta.plan.measurements + _extra_planned(meta),
                         "torn_last_line": rd.torn_last_line},
        "missing": missing, "cells": cells, "determinism": _determinism_totals(cells, meta),
        "geomeans": [_geomean(g) for g in table.geomeans],
        "family": _family(table),
        "reproduction_reach": _reach(table, meta.run_id),
        "interference": interference,
        "checks_ran": checks_ran(cells, interference, meta),
        "rules": {"speedup": words.speedup_rule(),
                  "contamination": words.contamination_rule(),
                  "interference": words.interference_rule(stats.DISTURBED_CORES, MAX_DISTURBED_SHARE,
                                                               meta.plan.retake_cap)},
        "convergence": _convergence(meta, index, baselines),
        "sensitivity": sensitivity(index, meta),
        "quiet_wait": quiet_wait_summary(meta, everything),
        "completion": completion.of(meta, everything).as_dict(),
    } | tuning.summary(meta, everything) | explanation.summary(meta, index, baselines, run_stats.table)
    out |= dimensions.summary(meta, run_stats.table)  # a run with lengths or depths listed: its curves
    section = builds.summary(meta, index)  # a run of several builds: each later build against the first
    if section is not None:
        out["builds"] = section
    categories, design = suite_categories.summary(meta, index, baselines, table)  # prompt suites: two intervals
    if categories:
        out["categories"], out["categories_power"] = categories, design
    samples = rd.samples()  # read and checked whenever the file is there, as compare reads it
    if rd.torn_samples_line:
        out["measurements"]["torn_samples_line"] = True
    out |= breakeven.summary(full, CellIndex(measured))  # nothing for a run without breakeven blocks
    if meta.plan.distribution:  # the sampling study's table (harness/analysis/lossless.py), for a run that drew one
        study = lossless.summary(meta.plan.distribution, samples, meta.plan.hosts,
                                 {s.id: (s.spec_type, s.args) for s in meta.strategies})
        if study is not None:
            out["distribution"] = study
    return out


def device_use(recs: list[result.ResultRecord]) -> shapes.DeviceUse | None:
    """Where a cell's measurements ran (GPU backends: the server's load lines, harness/run/serverlog.py): the
    devices named, layers offloaded of the target's and of the drafter's (the commonest), device memory (MiB).
    None when no record carries device facts (a CPU run); "devices": [] when llama.cpp named none (it ran on the
    CPU)."""
    with_facts = [r for r in recs if "device" in r]
    if not with_facts:
        return None
    used = [r["device"] for r in with_facts if r["device"]]

    def commonest(values: list[str]) -> str | None:
        return max(set(values), key=values.count) if values else None

    def layers(i: int) -> str | None:
        return commonest([f"{m['layers_offloaded']}/{m['layers']}" for u in used if len(u["models"]) > i
                          for m in [u["models"][i]] if m["layers"] is not None])

    return {"devices": sorted({f"{m['device']} ({m['description']})" for u in used for m in u["models"]}),
            "target_layers": layers(0), "draft_layers": layers(1),
            "device_mib": describe([u["device_mib"] for u in used]), "runs": len(with_facts),
            "runs_without_device": len(with_facts) - len(used)}


def _by_prompt_round(ms: list[Measurement]) -> dict[str, dict[int, Measurement]]:
    out: dict[str, dict[int, Measurement]] = defaultdict(dict)
    for m in ms:
        out[m.prompt].setdefault(m.round, m)
    return out


def _acceptance_of(ms: list[Measurement]) -> float | None:
    drafted = sum(m.drafted for m in ms)
    return fm.rounded(sum(m.accepted for m in ms) / drafted, 4) if drafted else None


def _common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def sensitivity(index: CellIndex, meta: RunMeta) -> list[shapes.Variant]:
    """For each perturbation task (its first prompt the reference, the others variants with a phrase added or
    removed): per strategy and variant, throughput against the reference paired by round, acceptance of both, the
    output's agreement with the reference's (common prefix in tokens), and the speedup against the baseline."""
    out = []
    for t in meta.planned_tasks():
        if not t.perturbation:
            continue
        ref = t.prompts[0].id
        for host in meta.plan.hosts:
            for s in meta.planned_strategies():
                by = _by_prompt_round(index.used(CellKey(host, s.id, t.id)))
                base_by = _by_prompt_round(index.used(CellKey(host, s.baseline, t.id))) if s.baseline else {}
                if ref not in by:
                    continue
                for p in t.prompts[1:]:
                    out.append(_variant(host, s.id, t.id, ref, p.id, by, base_by))
    return out


def _variant(host: str, strategy: str, task: str, ref: str, var: str, by: dict[str, dict[int, Measurement]],
             base_by: dict[str, dict[int, Measurement]]) -> shapes.Variant:
    rounds = sorted(by[ref].keys() & by.get(var, {}).keys())
    logs = [math.log(by[var][r].tok_s / by[ref][r].tok_s) for r in rounds]
    loc = inf.locate(logs)
    est = inf.moderate(loc, inf.NO_PRIOR) if loc is not None and loc.n >= 3 else None
    iv = inf.Interval.of(est) if est is not None else inf.Interval(None, None, len(logs), "none", None, False)

    def speedup(prompt: str) -> float | None:
        pr = [by[prompt][r].tok_s / base_by[prompt][r].tok_s
              for r in sorted(by.get(prompt, {}).keys() & base_by.get(prompt, {}).keys())]
        return fm.rounded(math.exp(statistics.fmean(math.log(x) for x in pr)), 4) if pr else None

    first_ref = by[ref][min(by[ref])].raw["output"]
    first_var = by[var][min(by[var])].raw["output"] if by.get(var) else None
    return {"host": host, "strategy": strategy, "task": task, "reference": ref, "variant": var,
            "tok_s_ratio": fm.rounded(math.exp(statistics.fmean(logs)), 4) if logs else None, "tok_s_ratio_interval":
            _interval(iv), "acceptance_reference": _acceptance_of(list(by[ref].values())),
            "acceptance_variant": _acceptance_of(list(by.get(var, {}).values())),
            "speedup_reference": speedup(ref), "speedup_variant": speedup(var),
            "output_common_prefix_tokens": None if first_var is None else
            _common_prefix(first_ref.get("tokens") or [], first_var.get("tokens") or []),
            "output_tokens": None if first_var is None else first_var.get("n_tokens")}


def _extra_planned(meta: RunMeta) -> int:
    prompts = {t.id: len(t.prompts) for t in meta.tasks}
    return sum(prompts.get(task, 1) for x in meta.plan.extra_rounds for _, _, task in x.cells)


def _convergence(meta: RunMeta, index: CellIndex, baselines: dict[str, str | None]) -> shapes.ConvergenceJson | None:
    """For a run with --until: the target, the rounds run, and every cell still wider than the target."""
    if meta.plan.until is None:
        return None
    conv = cv.convergence(index, baselines, meta.plan.until)
    return {"target": meta.plan.until, "max_rounds": meta.plan.max_rounds,
            "rounds": max((m.round for m in index.measurements), default=0),
            "not_converged": [{"host": c.key.host, "strategy": c.key.strategy, "task": c.key.task,
                               "rounds": c.rounds, "half_width": c.half_width, "rounds_estimate": c.rounds_estimate}
                              for c in conv.cells if not c.converged]}


def pass_bytes(meta: RunMeta, s: Any, ok: list[result.ResultRecord]) -> passbytes.PassBytes | None:
    """What one target pass of this cell read (harness/models/passbytes.py): the target's weights, the KV cache
    at the median decode depth, and the draft's weights times its steps per pass; None without header facts."""
    target = meta.models[s.model].reads if s.model in meta.models else None
    if target is None or not ok:
        return None
    draft = meta.models[s.draft].reads if s.draft in meta.models else None
    depths, steps = [], []
    for r in ok:
        sv = r["server"]
        depths.append((sv.get("prompt_n") or 0) + (sv.get("predicted_n") or 0) / 2)
        passes = (sv.get("predicted_n") or 0) - sv["draft_n_accepted"]
        calls = ((r.get("server_log") or {}).get("statistics") or {}).get(s.spec_type, {}).get("calls_draft")
        steps.append(passbytes.draft_steps(s.spec_type, sv["draft_n"], passes, calls))
    k, v = passbytes.cache_types(ok[0].get("server_command") or [])
    return passbytes.per_pass(target, statistics.median(depths), k_type=k, v_type=v, draft=draft,
                              steps=statistics.median(steps) if s.speculative else 0.0,
                              mtp=passbytes.nextn_draft(s.spec_type))


def _geomean(g: Speedup) -> shapes.Geomean:
    """A geometric mean: its interval for these prompts (what the mark judges) and, beside it, for tasks like
    these (the spread over tasks; null below two tasks)."""
    return {"host": g.host, "strategy": g.strategy, "estimate": fm.rounded(g.estimate, 4),
            "interval": _interval(g.interval),
            "interval_scope": "these prompts",
            "between_tasks": None if g.between is None else
            _interval(g.between) | {"scope": "tasks like these", "note": words.between_note(g.between)},
            "verdict": _verdict(g), "tasks": list(g.tasks), "left_out": list(g.left_out)}


def _acceptance(ok: list[result.ResultRecord]) -> tuple[int, int, list[float | None]]:
    drafted = sum(r["server"]["draft_n"] for r in ok)
    accepted = sum(r["server"]["draft_n_accepted"] for r in ok)
    tpps = [checks.tokens_per_pass(r["server"]["predicted_n"] or 0, r["server"]["draft_n_accepted"]) for r in ok]
    return drafted, accepted, tpps


def _cell(s: Any, index: CellIndex, key: CellKey, cs: stats.CellStats | None) -> shapes.CellSummary:
    all_ms = index.of(key)
    ok = [m.raw for m in all_ms if m.ok]
    used = [m.raw for m in index.used(key)]
    failed = [m.raw for m in all_ms if not m.ok]
    drafted, accepted, tpps = _acceptance(ok)
    sp = cs.speedup if cs is not None else None
    con = cs.contamination if cs is not None else None
    return {
        "host": key.host, "strategy": s.id, "spec_type": s.spec_type, "model": s.model, "task": key.task,
        "baseline": s.baseline,
        "runs_ok": len(ok), "runs_used": len(used), "runs_failed": len(failed),
        "retakes": sum(1 for m in all_ms if m.retake_of),
        "failures": [{"run_index": r["run_index"], "prompt": r["prompt"], "reason": r["failure"]["reason"]}
                     for r in failed],
        "decode_tok_s": describe([r["client"]["decode_tok_s"] for r in used]),
        "decode_tok_s_interval": _interval(cs.tok_s_interval) if cs is not None else None,
        "server_decode_tok_s": describe([r["server"]["predicted_per_second"] for r in used]),
        "prefill_tok_s": describe([r["server"]["prompt_per_second"] for r in used]),
        "ttft_s": describe([r["client"]["ttft_s"] for r in used]),
        "load_s": describe([r["timing"]["load_s"] for r in ok]),
        "memory_peak_mb": describe([r["memory_peak_bytes"] / 2**20 for r in ok if r.get("memory_peak_bytes")]),
        "draft_n": drafted, "draft_n_accepted": accepted,
        "acceptance": fm.rounded(accepted / drafted, 4) if drafted else None,
        "tokens_per_pass": describe(tpps),
        "series": [fm.rounded(r["client"]["decode_tok_s"], 3) for r in ok],
        "streams": max((r.get("concurrency", {}).get("streams", 1) for r in ok), default=1),
        "aggregate_tok_s": describe([r["concurrency"]["aggregate_tok_s"] for r in used if "concurrency" in r]),
        "per_stream_tok_s": describe([x for r in used if "concurrency" in r
                                      for x in r["concurrency"]["per_stream_tok_s"]]),
        "speedup": fm.rounded(sp.estimate, 4) if sp is not None else None,
        "speedup_interval": _interval(sp.interval) if sp is not None else None,
        "verdict": _verdict(sp) if sp is not None else None,
        "paired_rounds": {str(k): fm.rounded(v, 4) for k, v in sp.rounds.items()} if sp is not None else {},
        "warnings": [{"kind": w.kind.value, "sentence": words.warning(w), "evidence": w.evidence}
                     for w in (cs.warnings if cs is not None else [])],
        "checks": {"contamination": {"check": "contamination", "flagged": con.flagged,
                                     "sentence": words.contamination(con),
                                     "data": {"kind": con.kind.value, **con.evidence}}} if con is not None else {},
        "server_mean_len": describe([((r.get("server_log") or {}).get("draft_acceptance") or {}).get("mean_len")
                                     for r in ok]),
    }


def _speculation(cells: list[shapes.CellSummary], index: CellIndex, meta: RunMeta) -> None:
    """A speculative strategy whose server drafted nothing in any run of any task did not speculate (a draft model
    given with the wrong spec type, a type the build ignores): its row would be a baseline under another name.
    (One task without drafts is a result: an n-gram table finds nothing to copy in some texts.)"""
    for host in meta.plan.hosts:
        for s in meta.planned_strategies():
            ok = [m for m in index.measurements if m.ok and m.host == host and m.strategy == s.id]
            if not s.speculative or not ok:
                continue
            drafted = sum(m.drafted for m in ok)
            impls = sorted({i for m in ok for i in (m.raw.get("server_log") or {}).get("implementations", [])})
            sentence = (f"speculation ran: drafted {fm.count(drafted)} tokens over {len(ok)} runs" if drafted else
                        f"speculation did not run: draft_n absent in all {len(ok)} runs of every task "
                        f"(--spec-type {s.spec_type}; the server added "
                        + (", ".join(impls) if impls else "no speculative implementation") + ")")
            check: shapes.Check = {"check": "speculation", "flagged": not drafted, "sentence": sentence,
                                   "data": {"drafted": drafted, "runs": len(ok), "implementations": impls}}
            for c in cells:
                if c["host"] == host and c["strategy"] == s.id:
                    c["checks"]["speculation"] = check


def quiet_wait_summary(meta: RunMeta, index: CellIndex) -> shapes.QuietWaitSummary | None:
    """A run that waited for a quiet host before its measurements (--quiet-wait): the bound, how many waited, how
    long (median, max), and how many met the bound with the host still busy. None for a run that never waited."""
    waits = [w for m in index.measurements if (w := (m.raw.get("quiet") or {}).get("wait"))]
    if not waits and not meta.plan.quiet_wait_s:
        return None
    waited = [w["waited_s"] for w in waits]
    return {"bound_s": meta.plan.quiet_wait_s or max((w["bound_s"] for w in waits), default=0.0),
            "measurements": len(waits), "waited_median_s": fm.rounded(statistics.median(waited), 3) if waited else None,
            "waited_max_s": fm.rounded(max(waited), 3) if waited else None,
            "bound_reached": sum(1 for w in waits if not w["quiet"] and w.get("others_cores") is not None)}


def interference_summary(index: CellIndex, hosts: list[str]) -> dict[str, shapes.HostInterference]:
    """Per host: how many measurements other work disturbed, how much it used, which, and how many were retaken."""
    out = {}
    for host in hosts:
        ok = [m for m in index.measurements if m.host == host and m.ok]
        figs = [m.raw["interference"] for m in ok if m.raw.get("interference")]
        cores = [f["others_cores"] for f in figs if f.get("others_cores") is not None]
        disturbed = [m for m in ok if m.disturbed]
        out[host] = {"measured": len(figs), "disturbed": len(disturbed), "kept": host in index.busy,
                     "retaken": sum(1 for m in ok if m.retake_of),
                     "others_cores_median": fm.rounded(statistics.median(cores), 3) if cores else None,
                     "others_cores_max": fm.rounded(max(cores), 3) if cores else None,
                     "disturbed_ids": [m.id for m in disturbed][:200]}
    return out


def _determinism(cells: list[shapes.CellSummary], index: CellIndex, host: str, meta: RunMeta) -> None:
    """Byte match against the baseline of the same target, prompt by prompt."""
    for c in cells:
        if c["host"] != host:
            continue
        base = same_target_baseline(meta, c["strategy"])
        if base is None:
            continue
        base_ok = [m.raw for m in index.of(CellKey(host, base, c["task"])) if m.ok]
        runs = [m.raw for m in index.of(CellKey(host, c["strategy"], c["task"])) if m.ok]
        if not base_ok or not runs:
            continue
        refs: dict[str, result.ResultRecord] = {}
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


def _check(c: shapes.CellSummary, name: str) -> shapes.Check:
    return c["checks"][name]


def _contamination_ran(cells: list[shapes.CellSummary], interference: dict[str, shapes.HostInterference],
                       meta: RunMeta) -> tuple[int, str]:
    con = [c for c in cells if "contamination" in c["checks"]]
    data = [_check(c, "contamination")["data"] for c in con]
    flagged = sum(_check(c, "contamination")["flagged"] for c in con)
    return flagged, words.contamination_ran(
        len(con), sum(c["runs_ok"] for c in con), sum(d["fingerprint"]["identical"] for d in data),
        sum(c["draft_n"] > 0 for c in con), sum(d["trend"]["testable"] for d in data),
        max((d["family"] for d in data), default=0), flagged, meta.protocol == "reuse-server")


def _determinism_ran(cells: list[shapes.CellSummary], interference: dict[str, shapes.HostInterference],
                     meta: RunMeta) -> tuple[int, str]:
    det = [c for c in cells if "determinism" in c["checks"]]
    spec = [c for c in det if meta.strategy(c["strategy"]).speculative]
    base = [c for c in det if not meta.strategy(c["strategy"]).speculative]
    same = sum(1 for c in spec if not _check(c, "determinism")["flagged"])
    unstable = sum(_check(c, "determinism")["flagged"] for c in base)
    return len(spec) - same + unstable, words.determinism_ran(
        len({(c["host"], c["strategy"]) for c in spec}), len(spec),
        sum(_check(c, "determinism")["data"].get("runs", 1) for c in spec), same, len(base), len(base) - unstable)


def _physics_ran(cells: list[shapes.CellSummary], interference: dict[str, shapes.HostInterference],
                 meta: RunMeta) -> tuple[int, str]:
    phy = [_check(c, "physics") for c in cells if "physics" in c["checks"]]
    bw = sorted({f"{fm.gbs(x['data']['bandwidth_gbs'])} ({x['data']['bandwidth_source']})" for x in phy})
    above = sum(x["flagged"] for x in phy)
    return above, words.physics_ran(len(phy), above, max((x["data"]["fraction"] for x in phy), default=None),
                                    ", ".join(bw))


def _interference_ran(cells: list[shapes.CellSummary], interference: dict[str, shapes.HostInterference],
                      meta: RunMeta) -> tuple[int, str]:
    inter = list(interference.values())
    disturbed = sum(x["disturbed"] for x in inter)
    return disturbed, words.interference_ran(
        sum(x["measured"] for x in inter), disturbed, sum(x["retaken"] for x in inter),
        [h for h, x in interference.items() if x["kept"]])


#: The checks that say what they compared in every run, in the order RESULTS.md lists them: each is its name and
#: what it found over a run's cells (how many it flagged, and the sentence). A new check is one row here.
CHECKS_RAN: tuple[tuple[str, Callable[[list[shapes.CellSummary], dict[str, shapes.HostInterference], RunMeta],
                                      tuple[int, str]]], ...] = (
    ("contamination", _contamination_ran), ("determinism", _determinism_ran), ("physics", _physics_ran),
    ("interference", _interference_ran))


def checks_ran(cells: list[shapes.CellSummary], interference: dict[str, shapes.HostInterference],
               meta: RunMeta) -> list[shapes.CheckRan]:
    """One line per check, whether it found anything or not: what it compared, in how many cells and runs, and what
    it found (a check that passes is otherwise invisible)."""
    out: list[shapes.CheckRan] = []
    for name, ran in CHECKS_RAN:
        found, sentence = ran(cells, interference, meta)
        out.append({"check": name, "found": found, "sentence": sentence})
    return out


def _determinism_totals(cells: list[shapes.CellSummary], meta: RunMeta) -> dict[str, shapes.DeterminismTotal]:
    out: dict[str, shapes.DeterminismTotal] = {}
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
