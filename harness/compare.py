"""`invoke compare A B`: two runs side by side, per host and cell, with a verdict that respects the runs' own
spread. "same" when the two ranges of runs overlap, else "faster" or "slower"; "not comparable" when the two
runs measured different things (model files, llama.cpp source, backend, flags), each difference named."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tabulate import tabulate

from harness.results import RunDir
from harness.runmeta import RunMeta
from harness.summary import summarize


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


def verdict(a: dict[str, Any], b: dict[str, Any]) -> str:
    """'same' when the ranges of runs overlap or the medians differ by less than the larger spread."""
    if a["median"] is None or b["median"] is None:
        return "missing"
    if a["max"] >= b["min"] and b["max"] >= a["min"]:
        return "same"
    spread = max(a["spread_pct"] or 0.0, b["spread_pct"] or 0.0) / 100
    if abs(b["median"] / a["median"] - 1) <= spread:
        return "same"
    return "faster" if b["median"] > a["median"] else "slower"


def host_pairs(hosts_a: list[str], hosts_b: list[str]) -> list[tuple[str, str]]:
    """Hosts of A matched with hosts of B: by label where they share labels, else in order."""
    common = [h for h in hosts_a if h in hosts_b]
    return [(h, h) for h in common] if common else list(zip(hosts_a, hosts_b, strict=False))


def _row(ca: dict[str, Any], cb: dict[str, Any] | None, blocking: list[str]) -> dict[str, Any]:
    row = {"host_a": ca["host"], "host_b": cb["host"] if cb else None, "strategy": ca["strategy"], "task": ca["task"],
           "a": ca["decode_tok_s"]["median"]}
    if cb is None:
        return {**row, "b": None, "ratio": None, "verdict": "missing in B"}
    a, b = ca["decode_tok_s"], cb["decode_tok_s"]
    ratio = b["median"] / a["median"] if a["median"] and b["median"] else None
    v = "not comparable: different " + " / ".join(blocking) if blocking else verdict(a, b)
    # Draft counts are deterministic in a fresh server: equal counts are a strong sign of the same setup.
    same_drafts = (ca["draft_n"], ca["draft_n_accepted"]) == (cb["draft_n"], cb["draft_n_accepted"])
    drafts = "same" if same_drafts else \
        f"{ca['draft_n_accepted']}/{ca['draft_n']} vs {cb['draft_n_accepted']}/{cb['draft_n']}"
    return {**row, "b": b["median"], "a_spread_pct": a["spread_pct"], "b_spread_pct": b["spread_pct"],
            "ratio": None if ratio is None else round(ratio, 4), "verdict": v, "drafts": drafts}


def compare(dir_a, dir_b) -> dict[str, Any]:
    ra, rb = RunDir.open(dir_a), RunDir.open(dir_b)
    ma, mb = ra.read_meta(), rb.read_meta()
    sa, sb = summarize(ra), summarize(rb)
    diffs = differences(ma, mb)
    blocking = [d[0] for d in diffs if d[3]]
    cells_b = {(c["host"], c["strategy"], c["task"]): c for c in sb["cells"]}
    rows = []
    for ha, hb in host_pairs(sa["hosts"], sb["hosts"]):
        for c in sa["cells"]:
            if c["host"] == ha:
                rows.append(_row(c, cells_b.get((hb, c["strategy"], c["task"])), blocking))
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["verdict"]] = counts.get(r["verdict"], 0) + 1
    return {"a": {"run_id": sa["run_id"], "path": str(dir_a), "hosts": sa["hosts"]},
            "b": {"run_id": sb["run_id"], "path": str(dir_b), "hosts": sb["hosts"]},
            "differences": [{"field": f, "a": x, "b": y, "blocking": blk} for f, x, y, blk in diffs],
            "comparable": not blocking, "rows": rows, "counts": counts}


def table(result: dict[str, Any], fmt: str = "simple") -> str:
    several = len(result["a"]["hosts"]) > 1 or len(result["b"]["hosts"]) > 1
    rows = [([f"{r['host_a']} / {r['host_b'] or '-'}"] if several else [])
            + [r["strategy"], r["task"], "-" if r["a"] is None else f"{r['a']:,.2f}",
               "-" if r["b"] is None else f"{r['b']:,.2f}", "-" if r["ratio"] is None else f"{r['ratio']:.3f}",
               r["verdict"], r.get("drafts", "-")] for r in result["rows"]]
    headers = (["hosts (A / B)"] if several else []) + [
        "strategy", "task", f"A tok/s ({result['a']['run_id']})", f"B tok/s ({result['b']['run_id']})", "B/A",
        "verdict", "accepted/drafted"]
    return tabulate(rows, headers=headers, tablefmt=fmt, disable_numparse=True)


def text(result: dict[str, Any], fmt: str = "simple") -> str:
    lines = []
    if result["differences"]:
        lines.append("environments differ:")
        for d in result["differences"]:
            lines.append(f"  {d['field']}: A {d['a']!s:.70} | B {d['b']!s:.70}")
    else:
        lines.append("environments: same model files, llama.cpp source, backend, flags and hardware")
    lines.append("")
    lines.append(table(result, fmt))
    lines.append("")
    lines.append("verdicts: " + ", ".join(f"{v} {n}" for v, n in sorted(result["counts"].items()))
                 + " (same = the two runs' ranges overlap)")
    return "\n".join(lines)
