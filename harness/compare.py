"""`invoke compare A B`: two runs side by side, per cell, with a verdict that respects the runs' own spread.

"same" when the two ranges of runs overlap, else "faster" or "slower"; "not comparable" when the two runs
measured different things (model files, llama.cpp source, backend), each difference named field by field."""

from __future__ import annotations

from typing import Any

from tabulate import tabulate

from harness.results import RunDir
from harness.summary import summarize


def _env(meta: dict[str, Any]) -> dict[str, Any]:
    b = meta["build"]
    src = b["plan"]["source"]
    env = {
        "llama.cpp commit": src.get("commit"),
        "llama.cpp source": src.get("sha256") or src.get("commit") or src.get("content_sha256"),
        "backend": b["plan"]["backend"],
        "cmake flags": " ".join(b["plan"]["cmake_args"]),
    }
    for key, m in meta["models"].items():
        env[f"model {key} sha256"] = m["sha256"]
    for host, facts in meta["environment"].items():
        env[f"hardware ({host})"] = ", ".join(str(x) for x in (facts.get("cpu_model"), facts.get("cpus"),
                                                              *[g["name"] for g in facts.get("gpus") or []]))
    return env


#: Differences that make two runs measure different things.
BLOCKING = ("model ", "llama.cpp ", "backend", "cmake flags")


def differences(meta_a: dict[str, Any], meta_b: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    a, b = _env(meta_a), _env(meta_b)
    keys = list(dict.fromkeys([*a, *b]))
    hw_a = [v for k, v in a.items() if k.startswith("hardware")]
    hw_b = [v for k, v in b.items() if k.startswith("hardware")]
    out = [(k, a.get(k), b.get(k)) for k in keys if not k.startswith("hardware") and a.get(k) != b.get(k)]
    if sorted(map(str, hw_a)) != sorted(map(str, hw_b)):
        out.append(("hardware", "; ".join(map(str, hw_a)), "; ".join(map(str, hw_b))))
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


def compare(dir_a, dir_b) -> dict[str, Any]:
    ra, rb = RunDir.open(dir_a), RunDir.open(dir_b)
    ma, mb = ra.read_meta(), rb.read_meta()
    sa, sb = summarize(ra), summarize(rb)
    diffs = differences(ma, mb)
    blocking = [d for d in diffs if d[0].startswith(BLOCKING)]
    cells_b = {(c["strategy"], c["task"]): c for c in sb["cells"] if c["host"] == sb["hosts"][0]}
    rows = []
    for c in sa["cells"]:
        if c["host"] != sa["hosts"][0]:
            continue
        other = cells_b.get((c["strategy"], c["task"]))
        if other is None:
            rows.append({"strategy": c["strategy"], "task": c["task"], "a": c["decode_tok_s"]["median"], "b": None,
                         "ratio": None, "verdict": "missing in B"})
            continue
        a, b = c["decode_tok_s"], other["decode_tok_s"]
        ratio = b["median"] / a["median"] if a["median"] and b["median"] else None
        v = verdict(a, b)
        if blocking:
            v = "not comparable: different " + " / ".join(d[0] for d in blocking)
        # Draft counts are deterministic in a fresh server: equal counts are a strong sign of the same setup.
        drafts = "same" if (c["draft_n"], c["draft_n_accepted"]) == (other["draft_n"], other["draft_n_accepted"]) \
            else f"{c['draft_n_accepted']}/{c['draft_n']} vs {other['draft_n_accepted']}/{other['draft_n']}"
        rows.append({"strategy": c["strategy"], "task": c["task"], "a": a["median"], "b": b["median"],
                     "a_spread_pct": a["spread_pct"], "b_spread_pct": b["spread_pct"],
                     "ratio": None if ratio is None else round(ratio, 4), "verdict": v, "drafts": drafts})
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["verdict"]] = counts.get(r["verdict"], 0) + 1
    return {"a": {"run_id": sa["run_id"], "path": str(dir_a)}, "b": {"run_id": sb["run_id"], "path": str(dir_b)},
            "differences": [{"field": f, "a": x, "b": y} for f, x, y in diffs],
            "comparable": not blocking, "rows": rows, "counts": counts}


def table(result: dict[str, Any], fmt: str = "simple") -> str:
    rows = [[r["strategy"], r["task"], "-" if r["a"] is None else f"{r['a']:,.2f}",
             "-" if r["b"] is None else f"{r['b']:,.2f}", "-" if r["ratio"] is None else f"{r['ratio']:.3f}",
             r["verdict"], r.get("drafts", "-")] for r in result["rows"]]
    return tabulate(rows, headers=["strategy", "task", f"A tok/s ({result['a']['run_id']})",
                                   f"B tok/s ({result['b']['run_id']})", "B/A", "verdict",
                                   "accepted/drafted"], tablefmt=fmt,
                    disable_numparse=True)


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
