"""`invoke compare A B`: two runs judged on what transfers between machines — per host and cell, the paired
speedups with their intervals (reproduces / differs / inconclusive, harness/analysis/stats.py), the deterministic
fingerprint, and the absolute tok/s ratio, shown but never judged. "not comparable" when the two runs measured
different things (model files, llama.cpp source, backend, flags), each difference named by field. A run of
several builds is compared build by build (each strategy is measured on its own build, and each build's source is
a fact of its own); the difference between two builds inside one run is that run's result (its report), never a
failed reproduction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tabulate import tabulate

from harness import formatter as fm
from harness.analysis import inference as inf
from harness.analysis import reproduction as rp
from harness.analysis import stats, words
from harness.analysis.records import CellIndex
from harness.store.rundir import RunDir
from harness.store.runmeta import RunMeta


@dataclass(frozen=True)
class Fact:
    """One thing a run's numbers depend on. `blocking`: when it differs, the runs measured different things."""

    field: str
    value: Any
    blocking: bool


def facts(meta: RunMeta) -> dict[str, Fact]:
    """What a run measured with, keyed by field name (each build's by its name in a run of several builds)."""
    out = []
    for name, record in meta.build_records().items():
        plan, at = record["plan"], f" (build {name})" if name else ""
        src = plan["source"]
        out += [Fact(f"llama.cpp commit{at}", src.get("commit"), True),
                Fact(f"llama.cpp source{at}", src.get("sha256") or src.get("commit") or src.get("content_sha256"),
                     True),
                Fact(f"backend{at}", plan["backend"], True),
                Fact(f"cmake flags{at}", " ".join(plan["cmake_args"]), True)]
    out += [Fact(f"model {key} sha256", m["sha256"], True) for key, m in sorted(meta.models.items())]
    for host, e in sorted(meta.environment.items()):
        hw = ", ".join(str(x) for x in (e.get("cpu_model"), e.get("cpus"), *[g["name"] for g in e.get("gpus") or []]))
        out.append(Fact(f"hardware ({host})", hw, False))
    return {f.field: f for f in out}


def differences(meta_a: RunMeta, meta_b: RunMeta) -> list[tuple[str, Any, Any, bool]]:
    """(field, A's value, B's value, blocking) for every fact that differs; hardware compared as a whole."""
    a, b = facts(meta_a), facts(meta_b)
    out = []
    for name in dict.fromkeys([*a, *b]):
        if name.startswith("hardware"):
            continue
        fa, fb = a.get(name), b.get(name)
        va, vb = (fa.value if fa else None), (fb.value if fb else None)
        if va != vb:
            out.append((name, va, vb, (fa or fb).blocking))
    hw_a = sorted(str(f.value) for f in a.values() if f.field.startswith("hardware"))
    hw_b = sorted(str(f.value) for f in b.values() if f.field.startswith("hardware"))
    if hw_a != hw_b:
        out.append(("hardware", "; ".join(hw_a), "; ".join(hw_b), False))
    return out


def host_pairs(hosts_a: list[str], hosts_b: list[str]) -> list[tuple[str, str]]:
    """Hosts of A matched with hosts of B: by label where they share labels, else in order."""
    common = [h for h in hosts_a if h in hosts_b]
    return [(h, h) for h in common] if common else list(zip(hosts_a, hosts_b, strict=False))


def _relabel(records: list[dict[str, Any]], pairs: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """B's records under A's host labels, so cells match host by host."""
    to_a = {hb: ha for ha, hb in pairs}
    return [dict(r, host=to_a[r["host"]]) for r in records if r["host"] in to_a]


def _stats(meta: RunMeta, records: list[dict[str, Any]]) -> stats.RunStats:
    return stats.analyze(CellIndex(records), {s.id: s.baseline for s in meta.planned_strategies()}, meta.protocol)


def _interval(iv: inf.Interval | None) -> dict[str, Any] | None:
    return None if iv is None or not iv.available else {"low": round(iv.low, 4), "high": round(iv.high, 4),
                                                        "n": iv.n}


def _row(r: rp.Row, margin: float, host_b: str | None, blocking: list[str]) -> dict[str, Any]:
    call, rule = r.call.value, words.row_rule(r, margin)
    if blocking and r.call not in (rp.Call.MISSING, rp.Call.BASELINE):
        call, rule = rp.Call.NOT_COMPARABLE.value, "different " + " / ".join(blocking)
    sa, sb = r.speedup_a, r.speedup_b
    return {"host": r.host, "host_b": host_b, "strategy": r.strategy, "task": r.task,
            "speedup_a": None if sa is None else sa.estimate, "interval_a": None if sa is None else _interval(
                sa.interval), "speedup_b": None if sb is None else sb.estimate,
            "interval_b": None if sb is None else _interval(sb.interval), "ratio": r.ratio,
            "ratio_interval": _interval(r.interval), "verdict": call, "rule": rule,
            "p_within": r.p_within, "p_outside": r.p_outside, "p_adjusted": r.p_adjusted,
            "fingerprint": r.fingerprint.value,
            "fingerprint_detail": _fingerprint_words(r), "tok_s_ratio": r.tok_s_ratio,
            "tok_s_ratio_note": "hardware- and state-dependent", "tasks": list(r.tasks)}


def _fingerprint_words(r: rp.Row) -> str:
    fa, fb = r.fingerprint_a, r.fingerprint_b
    if fa is None or fb is None or r.fingerprint is rp.Match.MISSING:
        return "no runs in one of the two"
    if r.fingerprint is rp.Match.IDENTICAL:
        return words.drafts(fa)
    parts = []
    if set(fa.drafts) != set(fb.drafts):
        parts.append(f"A {words.drafts(fa)}; B {words.drafts(fb)}")
    if set(fa.outputs) != set(fb.outputs):
        parts.append("outputs differ")
    return "; ".join(parts)


def compare(dir_a, dir_b, margin: float = rp.REPRODUCE_MARGIN) -> dict[str, Any]:
    """Judge B against A per cell on what transfers between machines: the B/A ratio of the paired speedups with its
    interval against ±margin (reproduces / differs / inconclusive; differs judged as one family), the same for
    each strategy's geometric mean, the deterministic fingerprint (draft counts and output hashes), and the
    absolute tok/s ratio, labelled hardware- and state-dependent and never judged."""
    ra, rb = RunDir.open(dir_a), RunDir.open(dir_b)
    ma, mb = ra.read_meta(), rb.read_meta()
    diffs = differences(ma, mb)
    blocking = [d[0] for d in diffs if d[3]]
    pairs = host_pairs(ma.plan.hosts, mb.plan.hosts)
    rep = rp.reproduction(_stats(ma, ra.measurements()), _stats(mb, _relabel(rb.measurements(), pairs)), margin)
    to_b = dict(pairs)
    rows = [_row(r, margin, to_b.get(r.host), blocking) for r in rep.rows]
    at = {field: {x: i for i, x in enumerate(xs)} for field, xs in
          (("host", ma.plan.hosts), ("strategy", ma.plan.strategies), ("task", ma.plan.tasks))}
    rows.sort(key=lambda r: tuple(at[f].get(r[f], len(at[f])) for f in ("host", "strategy", "task")))  # A's plan order
    geos = [_row(g, margin, to_b.get(g.host), blocking) for g in rep.geomeans]
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["verdict"]] = counts.get(r["verdict"], 0) + 1
    overall = ("not comparable: the runs measured different things (" + ", ".join(blocking) + ")") if blocking \
        else words.headline(rep)
    return {"a": {"run_id": ma.run_id, "path": str(dir_a), "hosts": ma.plan.hosts},
            "b": {"run_id": mb.run_id, "path": str(dir_b), "hosts": mb.plan.hosts},
            "differences": [{"field": f, "a": x, "b": y, "blocking": blk} for f, x, y, blk in diffs],
            "comparable": not blocking, "rows": rows, "geomeans": geos, "counts": counts,
            "call": "not comparable" if blocking else rep.call.value, "verdict": overall, "margin": margin,
            "family": rep.family, "smallest_margin": rep.smallest_margin, "rounds_needed": rep.rounds_needed}


def _sp(x: float | None, iv: dict[str, Any] | None) -> str:
    if x is None:
        return "-"
    span = f" {fm.interval(iv['low'], iv['high'])}" if iv and iv.get("low") is not None else ""
    return f"{fm.ratio(x)}{span}"


def table(result: dict[str, Any], fmt: str = "simple") -> str:
    """Every cell of A against B, then each strategy's geometric mean; names from the runs are shown with their
    escapes visible (formatter.console), safe in a terminal and in a Markdown code block."""
    several = len(result["a"]["hosts"]) > 1 or len(result["b"]["hosts"]) > 1
    rows = []
    c = fm.console  # names come from the run folders: their escapes are shown, never sent to the terminal
    for r in result["rows"] + result.get("geomeans", []):
        rows.append(([c(f"{r['host']} / {r['host_b'] or '-'}", 200)] if several else []) + [
            c(r["strategy"], 100), c(r["task"], 100) if r["task"] else "geomean", _sp(r["speedup_a"], r["interval_a"]),
            _sp(r["speedup_b"], r["interval_b"]), _sp(r["ratio"], r["ratio_interval"]), r["verdict"],
            r["fingerprint"] if r["task"] else "", "-" if r["tok_s_ratio"] is None else fm.ratio(r["tok_s_ratio"])])
    headers = (["hosts (A / B)"] if several else []) + [
        "strategy", "task", "speedup A", "speedup B", "B/A", "verdict", "fingerprint", "tok/s B/A*"]
    return tabulate(rows, headers=headers, tablefmt=fmt, disable_numparse=True)


def text(result: dict[str, Any], fmt: str = "simple") -> str:
    c = fm.console  # values from the run folders (run ids, hardware, models): escapes shown, one line each
    lines = [f"A: {c(result['a']['run_id'], 200)}   B: {c(result['b']['run_id'], 200)}"]
    if result["differences"]:
        lines.append("environments differ:")
        for d in result["differences"]:
            lines.append(f"  {c(d['field'], 200)}: A {c(d['a'], 70)} | B {c(d['b'], 70)}"
                         + ("" if d["blocking"] else " (does not block: speedups transfer)"))
    else:
        lines.append("environments: same model files, llama.cpp source, backend, flags and hardware")
    m = fm.pct(result["margin"])
    lines += ["", table(result, fmt), "",
              f"rule: per cell, B/A = speedup B / speedup A with its 95% interval; reproduces when the interval "
              f"lies within ±{m}; differs when it lies wholly outside ±{m}, judged as one family of "
              f"{result['family']} (cells and geometric means, Holm at 5%); else inconclusive. The verdict "
              "reproduces when every strategy's geometric mean does, no cell differs or is missing and no "
              "fingerprint differs; differs when a cell or geometric mean does. fingerprint = draft counts and output "
              "hashes (deterministic at temperature 0). *tok/s B/A depends on hardware and machine state: shown, "
              "never judged.", "", f"verdict: {c(result['verdict'], 1000)}"]
    return "\n".join(lines)
