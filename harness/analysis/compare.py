"""`invoke compare A B`: two runs judged on what transfers between machines — per host and cell, the paired
speedups with their intervals (reproduces / differs / inconclusive, harness/analysis/stats.py), the deterministic
fingerprint, and the absolute tok/s ratio, shown but never judged. "not comparable" when the two runs measured
different things (model files, llama.cpp source, backend, flags), each difference named by field."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tabulate import tabulate

from harness import formatter as fm
from harness.analysis import stats
from harness.store.rundir import RunDir
from harness.store.runmeta import RunMeta


@dataclass(frozen=True)
class Fact:
    """One thing a run's numbers depend on. `blocking`: when it differs, the runs measured different things."""

    field: str
    value: Any
    blocking: bool


def facts(meta: RunMeta) -> dict[str, Fact]:
    """What a run measured with, keyed by field name."""
    plan = meta.build["plan"]
    src = plan["source"]
    out = [Fact("llama.cpp commit", src.get("commit"), True),
           Fact("llama.cpp source", src.get("sha256") or src.get("commit") or src.get("content_sha256"), True),
           Fact("backend", plan["backend"], True),
           Fact("cmake flags", " ".join(plan["cmake_args"]), True)]
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
    return stats.analyze(records, {s.id: s.baseline for s in meta.planned_strategies()}, meta.protocol)


def compare(dir_a, dir_b) -> dict[str, Any]:
    """Judge B against A per cell on what transfers between machines: the paired speedups with their intervals
    (reproduces / differs / inconclusive), the deterministic fingerprint (draft counts and output hashes), and
    the absolute tok/s ratio, labelled hardware- and state-dependent and never judged."""
    ra, rb = RunDir.open(dir_a), RunDir.open(dir_b)
    ma, mb = ra.read_meta(), rb.read_meta()
    diffs = differences(ma, mb)
    blocking = [d[0] for d in diffs if d[3]]
    pairs = host_pairs(ma.plan.hosts, mb.plan.hosts)
    rep = stats.reproduction(_stats(ma, ra.measurements()), _stats(mb, _relabel(rb.measurements(), pairs)))
    rows = []
    for c in rep.cells:
        row = c.as_dict()
        row["host_b"] = dict(pairs).get(c.host)
        if blocking and c.verdict not in ("missing", "n/a"):
            row["verdict"] = "not comparable"
            row["rule"] = "different " + " / ".join(blocking)
        rows.append(row)
    at = {field: {x: i for i, x in enumerate(xs)} for field, xs in
          (("host", ma.plan.hosts), ("strategy", ma.plan.strategies), ("task", ma.plan.tasks))}
    rows.sort(key=lambda r: tuple(at[f].get(r[f], len(at[f])) for f in ("host", "strategy", "task")))  # A's plan order
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["verdict"]] = counts.get(r["verdict"], 0) + 1
    overall = ("not comparable: the runs measured different things (" + ", ".join(blocking) + ")") if blocking \
        else rep.sentence
    return {"a": {"run_id": ma.run_id, "path": str(dir_a), "hosts": ma.plan.hosts},
            "b": {"run_id": mb.run_id, "path": str(dir_b), "hosts": mb.plan.hosts},
            "differences": [{"field": f, "a": x, "b": y, "blocking": blk} for f, x, y, blk in diffs],
            "comparable": not blocking, "rows": rows, "counts": counts, "verdict": overall,
            "band": rep.band}


def _sp(x: float | None, iv: dict[str, Any] | None) -> str:
    if x is None:
        return "-"
    span = f" {fm.interval(iv['low'], iv['high'])}" if iv and iv.get("low") is not None else ""
    return f"{fm.ratio(x)}{span}"


def table(result: dict[str, Any], fmt: str = "simple") -> str:
    several = len(result["a"]["hosts"]) > 1 or len(result["b"]["hosts"]) > 1
    rows = []
    c = fm.console  # names come from the run folders: their escapes are shown, never sent to the terminal
    for r in result["rows"]:
        rows.append(([c(f"{r['host']} / {r['host_b'] or '-'}", 200)] if several else []) + [
            c(r["strategy"], 100), c(r["task"], 100), _sp(r["speedup_a"], r["interval_a"]),
            _sp(r["speedup_b"], r["interval_b"]), _sp(r["ratio"], r["ratio_interval"]), r["verdict"], r["fingerprint"],
            "-" if r["tok_s_ratio"] is None else f"{r['tok_s_ratio']:.2f}"])
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
    lines += ["", table(result, fmt), "",
              f"rule: reproduces when the 95% interval of speedup B / speedup A lies within ±{result['band']:.0%}; "
              "differs when the two speedup intervals do not overlap; else inconclusive. fingerprint = draft counts "
              "and output hashes (deterministic at temperature 0). *tok/s B/A depends on hardware and machine "
              "state: shown, never judged.", "", f"verdict: {c(result['verdict'], 1000)}"]
    return "\n".join(lines)
