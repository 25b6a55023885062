"""The report's words and plot for the speedup against output length and context depth (the summary's
`dimensions`, harness/analysis/dimensions.py): one table per manifest entry and dimension, a sentence per curve
that names the crossover its marks show (or says that none lies within the range measured), and a plot of the
curves with their 95% intervals."""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path
from typing import Any

from tabulate import tabulate

from harness import formatter as fm
from harness.report import plotting
from harness.report.marks import TOO_FEW, mark, too_few
from harness.store import shapes

#: How a dimension's values read in a sentence.
UNITS = {"n_predict": "output tokens", "depth": "tokens of context"}
TITLES = {"n_predict": "output length", "depth": "context depth"}


def _fixed(c: shapes.DimensionCurve) -> str:
    return ", ".join(f"{'depth' if k == 'depth' else 'n_predict'} {v}" for k, v in c["fixed"].items())


def _who(c: shapes.DimensionCurve, several_hosts: bool) -> str:
    return fm.md(f"{c['host']}: {c['strategy']}" if several_hosts else c["strategy"])


def point_text(p: shapes.DimensionPoint) -> str:
    if p["speedup"] is None:
        return "-"
    if p["verdict"] == TOO_FEW:
        return too_few(p["speedup"], p["rounds"])
    span = f" {fm.interval(p['low'], p['high'])}" if p["low"] is not None else ""
    return f"{fm.ratio(p['speedup'])}{span} {mark(p['verdict'])}".rstrip()


def sentence(c: shapes.DimensionCurve) -> str:
    """What one curve's marks say of where its speedup crosses 1 (harness/analysis/dimensions.py's rule)."""
    unit = UNITS[c["dimension"]]
    values = [p["value"] for p in c["points"]]
    span = f"{fm.count(min(values))}–{fm.count(max(values))} {unit}"
    x = c["crossover"]
    if x["kind"] == "one":
        est = f" (estimate ≈ {fm.count(round(x['estimate']))})" if x["estimate"] is not None else ""
        way = "slower below, faster above" if x["rising"] else "faster below, slower above"
        return (f"crosses 1 between {fm.count(x['low'])} and {fm.count(x['high'])} {unit}{est}: {way} "
                "(the bracket between the marked points is its uncertainty)")
    if x["kind"] == "several":
        return f"marks of both signs alternate: it crosses 1 more than once within {span}"
    marks = {p["mark"] for p in c["points"] if p["speedup"] is not None}
    tail = ""
    if marks == {1}:
        tail = ": faster at every value measured"
    elif marks == {-1}:
        tail = ": slower at every value measured"
    return f"no crossover within the range measured ({span}){tail}"


def section(summary: shapes.Summary, out_path: Path, plots: dict[str, Path]) -> str:
    """The run's length and depth section ('' for a run without lengths or depths listed)."""
    curves = summary.get("dimensions") or []
    if not curves:
        return ""
    several = len(summary["hosts"]) > 1
    parts = ["### Speedup against output length and context depth (paired by round; 95% interval)", "",
             f"> {fm.md(summary.get('rules_dimensions', ''), 1500)}", ""]
    groups: dict[tuple[str, str, str], list[shapes.DimensionCurve]] = defaultdict(list)
    for c in curves:
        groups[(c["task"], c["dimension"], _fixed(c))].append(c)
    for (task, dim, fixed), cs in groups.items():
        values = sorted({p["value"] for c in cs for p in c["points"]})
        parts += [f"**{fm.md(task)}** against {TITLES[dim]}" + (f" ({fm.md(fixed)})" if fixed else ""), ""]
        rows = []
        for c in cs:
            by = {p["value"]: p for p in c["points"]}
            rows.append([_who(c, several)] + [point_text(by[v]) if v in by else "-" for v in values])
        parts += [tabulate(rows, headers=["strategy"] + [fm.count(v) for v in values], tablefmt="github",
                           disable_numparse=True), ""]
        parts += [f"- {_who(c, several)}: {sentence(c)}" for c in cs] + [""]
    if "dimensions" in plots:
        rel = os.path.relpath(plots["dimensions"].resolve(), out_path.resolve().parent)
        parts += [f"![speedup against output length and context depth, 95% intervals]({Path(rel).as_posix()})", ""]
    return "\n".join(parts) + "\n"


def write_plots(summary: shapes.Summary, folder: Path) -> dict[str, Path]:
    """The curves' plot into the run folder (`dimensions.png`): key -> file; none without curves."""
    curves = summary.get("dimensions") or []
    if not curves:
        return {}
    with plotting.pyplot() as plt:
        return {"dimensions": _draw(plt, curves, len(summary["hosts"]) > 1, summary, folder / "dimensions.png")}


def _draw(plt: Any, curves: list[shapes.DimensionCurve], several: bool, summary: shapes.Summary,
          path: Path) -> Path:
    """One panel per dimension: each curve's speedups with their intervals against the value (log scale; a
    depth of 0 drawn at the panel's left edge on a symmetric-log scale)."""
    dims = [d for d in UNITS if any(c["dimension"] == d for c in curves)]
    fig, axes = plt.subplots(1, len(dims), figsize=(5.2 * len(dims), 3.6), dpi=100, squeeze=False)
    for ax, dim in zip(axes[0], dims, strict=True):
        for i, c in enumerate([c for c in curves if c["dimension"] == dim]):
            pts = [p for p in c["points"] if p["speedup"] is not None]
            xs = [p["value"] for p in pts]
            ys = [p["speedup"] for p in pts]
            lo = [max(0.0, y - (p["low"] if p["low"] is not None else y)) for y, p in zip(ys, pts, strict=True)]
            hi = [max(0.0, (p["high"] if p["high"] is not None else y) - y) for y, p in zip(ys, pts, strict=True)]
            name = f"{c['host']}: {c['strategy']}" if several else c["strategy"]
            name += f" / {c['task']}" + (f" ({_fixed(c)})" if c["fixed"] else "")
            ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", markersize=3, capsize=2, linewidth=1,
                        color=f"C{i % 10}", label=plotting.label(name, 60))
        ax.axhline(1.0, color="black", linewidth=0.8)
        if dim == "depth":
            ax.set_xscale("symlog", linthresh=256)
        else:
            ax.set_xscale("log", base=2)
        ax.set_xlabel(UNITS[dim])
        ax.set_ylabel("speedup vs baseline (95% interval)")
        ax.set_title(f"{plotting.label(summary['manifest']['name'], 60)}: speedup against {TITLES[dim]}",
                     parse_math=False, fontsize=9)
        for text in ax.legend(fontsize=6).get_texts():
            text.set_parse_math(False)
    return plotting.save(plt, fig, path)
