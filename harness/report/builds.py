"""The report of a run of several llama.cpp builds (harness/analysis/builds.py): each build's own tables, then each
later build against the first (B/A of tok/s and of speedup with intervals and marks, and where the output
changed). Every name from the run folder is escaped for Markdown."""

from __future__ import annotations

from harness import formatter as fm
from harness.intake.builds import across
from harness.report import intervals, view
from harness.report.marks import NO_VERDICT, TOO_FEW, marked, too_few
from harness.store import shapes


def by_build(summary: shapes.Summary) -> list[tuple[str | None, shapes.Summary]]:
    """The summary as each build's tables see it (its strategies, cells, geometric means); [(None, summary)] for
    a run of one build."""
    section = summary.get("builds")
    if not section:
        return [(None, summary)]
    out = []
    for b in section["builds"]:
        own = set(b["strategies"])
        out.append((b["name"], {**summary, "strategies": [s for s in summary["strategies"] if s["id"] in own],
                                "cells": [c for c in summary["cells"] if c["strategy"] in own],
                                "geomeans": [g for g in summary.get("geomeans", []) if g["strategy"] in own]}))
    return out


def later_builds(summary: shapes.Summary) -> set[str]:
    """The builds after the first (drawn hatched beside the first's bars)."""
    return {b["name"] for b in (summary.get("builds") or {}).get("builds", [])[1:]}


def colours(summary: shapes.Summary, cols: list[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """A run of several builds: each plotted (host, strategy) coloured by its entry across builds, so a strategy's
    bars on each build share a colour; empty for a run of one build (the plot's own colour cycle)."""
    if not summary.get("builds"):
        return {}
    build = {s["id"]: s.get("build") for s in summary["strategies"]}
    entries = list(dict.fromkeys((h, across(s, build.get(s))) for h, s in cols))
    return {(h, s): f"C{entries.index((h, across(s, build.get(s)))) % 10}" for h, s in cols}


def heading(summary: shapes.Summary, name: str | None, short: bool = False) -> list[str]:
    """The line above one build's table (nothing for a run of one build): the build's source and image, and its
    CMake flags where they are not the first build's; `short`: its name only."""
    if name is None:
        return []
    if short:
        return [f"#### Build {fm.md(name)}", ""]
    all_builds = summary["builds"]["builds"]
    b = next(x for x in all_builds if x["name"] == name)
    flags = " ".join(fm.code(a) for a in b["cmake_args"]) if b["cmake_args"] != all_builds[0]["cmake_args"] else ""
    return [f"#### Build {fm.md(name)}: {fm.md(b['source'])}, image {fm.md(b['tag'])}"
            + (f"; CMake {flags}" if flags else ""), ""]


def family_note(summary: shapes.Summary) -> str:
    """What the family of the speedup tables is in a run of several builds."""
    if not summary.get("builds"):
        return ""
    return (" The builds' tables below are one family together: every build's cells are measured in the same "
            "rounds and judged at once.")


def _text(f: shapes.BuildFigure | None) -> str:
    if not f or f.get("estimate") is None:
        return fm.DASH
    v = f["verdict"]["kind"]
    if v == TOO_FEW:
        return too_few(f["estimate"], f["interval"].get("n", 0))
    return marked(f["estimate"], f["interval"], f["verdict"])


def _ratio_table(table: shapes.BuildTable, tasks: list[str], several_hosts: bool) -> str:
    cells = {(c["host"], c["strategy"], c["task"]): c for c in table["cells"]}
    geo = {(g["host"], g["strategy"]): g for g in table["geomeans"]}
    rows = []
    for host, strategy in dict.fromkeys((c["host"], c["strategy"]) for c in table["cells"]):
        first = next(c for c in table["cells"] if c["host"] == host and c["strategy"] == strategy)
        who = f"{host}: {strategy}" if several_hosts else strategy
        row = [fm.md(who), f"{fm.md(first['b'])} / {fm.md(first['a'])}"]
        row += [_text(cells.get((host, strategy, t))) for t in tasks]
        g = geo.get((host, strategy))
        part = f" (over {len(g['tasks'])} of {len(g['tasks']) + len(g['left_out'])} tasks)" \
            if g and g.get("left_out") else ""
        row.append(f"**{_text(g)}**{part}" if g and g.get("estimate") is not None else fm.DASH)
        rows.append(row)
    if not rows:
        return "(no strategy measured on both builds)"
    return view.table(rows, ["strategy", "B / A"] + [fm.md(t) for t in tasks] + ["geomean"])


def _family(table: shapes.BuildTable) -> str:
    fam = table["family"]
    if not fam["cells"]:
        return NO_VERDICT
    braced = intervals.braces([(f["interval"], f["verdict"]) for f in [*table["cells"], *table["geomeans"]]])
    return (f"One family: {fam['cells']} cell{'s' if fam['cells'] != 1 else ''} and {fam['geomeans']} geometric "
            f"mean{'s' if fam['geomeans'] != 1 else ''} over tasks, {fam['tests']} tests, Holm's procedure at 5%."
            + (" " + intervals.family_note(fam["tests"], fam["alpha"]) if braced else "")
            + (" " + fam["power"]["sentence"] if fam.get("power", {}).get("sentence") else ""))


def _outputs(out: shapes.OutputChanges, several_hosts: bool) -> list[str]:
    lines = [f"- **{fm.md(out['sentence'])}**"]
    for r in out["rows"]:
        if not r["prompts"]:
            continue
        who = fm.md(f"{r['host']}: {r['strategy']}" if several_hosts else r["strategy"])
        head = f"- {who}: output identical on {r['outputs_identical']} of {r['prompts']} prompts, draft counts on " \
               f"{r['drafts_identical']} of {r['prompts']}"
        changed = [f"{fm.md(c['task'])}/{fm.md(c['prompt'])} ({fm.md(c['sentence'])})" for c in r["changed"][:12]]
        lines.append(head + (f"; changed: {'; '.join(changed)}" + (" ..." if len(r["changed"]) > 12 else "")
                             if changed else ""))
    return lines


def section(summary: shapes.Summary) -> list[str]:
    """The report's lines for each later build against the first (nothing for a run of one build)."""
    sec = summary.get("builds")
    if not sec:
        return []
    several = len(summary["hosts"]) > 1
    parts: list[str] = []
    for c in sec["comparisons"]:
        b, a = fm.md(c["build"]), fm.md(c["against"])
        parts += [f"### Build {b} against build {a} (paired by round; 95% interval; ▲ B higher ▼ B lower ≈ "
                  "equivalent · not significant)", "",
                  f"**Throughput: {b}'s tok/s over {a}'s**, the same strategy, task and prompt in the same round. "
                  + _family(c["tok_s"]), "", _ratio_table(c["tok_s"], summary["tasks"], several), "",
                  f"**Speculation: {b}'s speedup over {a}'s speedup**, each over its own build's baseline in the "
                  "same round. " + _family(c["speedup"]), "", _ratio_table(c["speedup"], summary["tasks"], several),
                  "", f"**Output at temperature 0, {b} against {a}** (the deterministic fingerprint per build):", ""]
        parts += _outputs(c["output"], several) + ["", f"> {fm.md(sec['rule'], 2000)}", ""]
    return parts
