"""`invoke compare A B` in words: the comparison (harness/analysis/compare.py) as the table, the rule and the
verdict a terminal and RESULTS.md show. Every name from a run folder is shown with its escapes visible."""

from __future__ import annotations

from tabulate import tabulate

from harness import formatter as fm
from harness.analysis import inference as inf
from harness.analysis.compare import Comparison
from harness.report import lossless as lossless_report


def _sp(x: float | None, iv: inf.Interval | None) -> str:
    if x is None:
        return "-"
    span = f" {fm.interval(iv.low, iv.high)}" if iv is not None and iv.available else ""
    return f"{fm.ratio(x)}{span}"


def table(result: Comparison, fmt: str = "simple") -> str:
    """Every cell of A against B, then each strategy's geometric mean; names from the runs are shown with their
    escapes visible (formatter.console), safe in a terminal and in a Markdown code block."""
    several = len(result.a.hosts) > 1 or len(result.b.hosts) > 1
    rows = []
    c = fm.console  # names come from the run folders: their escapes are shown, never sent to the terminal
    for r in result.rows + result.geomeans:
        rows.append(([c(f"{r.host} / {result.host_b.get(r.host) or '-'}", 200)] if several else []) + [
            c(r.strategy, 100), c(r.task, 100) if r.task else "geomean", _sp(r.speedup_a, r.interval_a),
            _sp(r.speedup_b, r.interval_b), _sp(r.ratio, r.interval), result.row_call(r).value,
            r.fingerprint.value if r.task else "", "-" if r.tok_s_ratio is None else fm.ratio(r.tok_s_ratio)])
    headers = (["hosts (A / B)"] if several else []) + [
        "strategy", "task", "speedup A", "speedup B", "B/A", "verdict", "fingerprint", "tok/s B/A*"]
    return tabulate(rows, headers=headers, tablefmt=fmt, disable_numparse=True)


def _value(v: object) -> str:
    """A workload value: absent (the other run has it), a switch, or the value."""
    if v is None:
        return "(absent)"
    if v == "":
        return "(on)"
    if isinstance(v, dict):
        return " ".join(f"{k}={x}" for k, x in v.items())
    return str(v)


def text(result: Comparison, fmt: str = "simple") -> str:
    c = fm.console  # values from the run folders (run ids, hardware, models): escapes shown, one line each
    lines = [f"A: {c(result.a.run_id, 200)}   B: {c(result.b.run_id, 200)}"]
    env = [d for d in result.differences if d.kind != "workload"]
    work = [d for d in result.differences if d.kind == "workload"]
    if env:
        lines.append("environments differ:")
        for d in env:
            lines.append(f"  {c(d.field, 200)}: A {c(d.a, 70)} | B {c(d.b, 70)}"
                         + ("" if d.blocking else " (does not block: speedups transfer)"))
    else:
        lines.append("environments: same model files, llama.cpp source, backend, flags and hardware")
    if work:
        lines.append("workloads differ (different measurements: not a reproduction):")
        lines += [f"  {c(d.field, 200)}: A {c(_value(d.a), 70)} | B {c(_value(d.b), 70)}" for d in work[:40]]
        if len(work) > 40:
            lines.append(f"  and {len(work) - 40} more")
    else:
        lines.append("workloads: same protocol, server flags, strategy flags, sampling, endpoint, n_predict and "
                     "prompts (sha256)")
    if result.same_records:
        lines.append(f"records: B's {result.shared[1]} measurements are A's own (the same ids, start times and "
                     "containers)")
    lines += [f"{x}: the last line of measurements.jsonl was cut short (a crash mid-write): that measurement is not "
              "counted" for x in result.torn_last_line]
    lines += ["", table(result, fmt), "", rule(result), *lossless_report.compare_lines(result.distribution), "",
              f"verdict: {c(result.verdict, 1000)}"]
    return "\n".join(lines)


def rule(result: Comparison) -> str:
    """The comparison's rule, with its margins, family and estimator."""
    m, cm = fm.pct(result.margin), fm.pct(result.cell_margin)
    return (f"rule: per cell, B/A = speedup B / speedup A with its 95% interval, both speedups by one estimator "
            f"(the 20%-trimmed geometric mean of the paired ratios where both runs have {inf.TRIM_FROM} rounds or "
            f"more, else the geometric mean); a cell "
            f"reproduces when its interval lies within ±{cm} (the cell margin), a geometric mean within ±{m}; "
            f"either differs when its interval lies wholly outside its band, judged as one family of "
            f"{result.reproduction.family} (cells and geometric means, Holm at 5%); else inconclusive. The verdict "
            "reproduces when every strategy's geometric mean and every cell does, none is missing and no "
            "fingerprint differs; \"geometric means reproduce; N cells unresolved\" when only the geometric means "
            "do (the worst cell named); differs when a cell or geometric mean does. fingerprint = draft counts and "
            "output hashes (deterministic at temperature 0). *tok/s B/A depends on hardware and machine state: "
            "shown, never judged.")
