"""What a run says, in a few lines (hyperfine's "X ran 1.52 ± 0.03 times faster than Y", pyperf compare_to's five
seconds): per strategy its geometric-mean speedup over tasks with its 95% interval and mark, the best strategy per
task (the fastest cell marked ▲, or none), and every check that fired. The terminal shows it after `invoke report`
and at the end of `invoke run`; RESULTS.md opens each run's section with the same lines.

Built from summary.json alone; names from the run folder are escaped by the caller's formatter (`fm.console` for a
terminal, `fm.md` for Markdown)."""

from __future__ import annotations

from collections.abc import Callable

from harness import formatter as fm
from harness.analysis.speedups import Verdict
from harness.report import intervals
from harness.report.marks import marked
from harness.store import shapes

#: Checks a cell carries whose flag is shown here (a flag is the check's own judgement that something is wrong).
CHECKS = ("contamination", "physics", "determinism")
#: Cells named per fired check at most (the report's tables name them all).
NAMED = 3


def _figure(estimate: float | None, iv: shapes.IntervalJson | None, verdict: shapes.VerdictJson | None) -> str:
    if estimate is None:
        return fm.DASH
    return marked(estimate, iv, verdict)


def _who(host: str, strategy: str, several: bool, esc: Callable[[str], str]) -> str:
    return esc(f"{host}: {strategy}" if several else strategy)


def lines(summary: shapes.Summary, esc: Callable[[str], str] = fm.console) -> list[str]:
    """The headline: a title line, one line per strategy's geometric mean (in the plan's order), the best per task
    and the checks that fired (empty for a run with no speedup: a sampling study drawn alone)."""
    order = {s["id"]: i for i, s in enumerate(summary.get("strategies") or [])}
    geos = sorted(summary.get("geomeans") or [], key=lambda g: (g["host"], order.get(g["strategy"], len(order))))
    if not geos:
        return []
    several = len(summary.get("hosts") or []) > 1
    tests = (summary.get("family") or {}).get("tests", 0)
    rounds = summary.get("runs", 0)
    out = [f"{esc(summary['run_id'])}: {len(geos)} strateg{'ies' if len(geos) != 1 else 'y'} x "
           f"{len(summary['tasks'])} task{'s' if len(summary['tasks']) != 1 else ''}, {rounds} "
           f"round{'s' if rounds != 1 else ''} planned; geometric-mean speedup over tasks (95% interval"
           + (f"; marks judged as one family of {tests} tests, Holm at 5%" if tests else "")
           + ("; {…}: the interval at the level of Holm's first step, beside an unmarked one whose 95% interval "
              "excludes 1" if intervals.braces([(g["interval"], g["verdict"]) for g in geos]) else "") + "):"]
    width = max(len(_who(g["host"], g["strategy"], several, esc)) for g in geos)
    for g in geos:
        who = _who(g["host"], g["strategy"], several, esc)
        if g["estimate"] is None:
            text = "no estimate: no task has the paired rounds a verdict needs"
        else:
            text = _figure(g["estimate"], g["interval"], g["verdict"]) + (
                f" (over {len(g['tasks'])} of {len(g['tasks']) + len(g['left_out'])} tasks)" if g["left_out"] else "")
        out.append(f"  {who}{' ' * (width - len(who))}  {text}")
    out.append("  " + _best(summary, several, esc))
    out.append("  " + _checks(summary, several, esc))
    return out


def _best(summary: shapes.Summary, several: bool, esc: Callable[[str], str]) -> str:
    """Per task the fastest cell marked ▲; the tasks where none is, named together."""
    best, none = [], []
    for task in summary["tasks"]:
        faster = [c for c in summary["cells"] if c["task"] == task and c.get("speedup") is not None
                  and (c.get("verdict") or {}).get("kind") == Verdict.FASTER]
        if faster:
            c = max(faster, key=lambda x: x["speedup"])
            best.append(f"{esc(task)} {_who(c['host'], c['strategy'], several, esc)} {fm.ratio(c['speedup'])} ▲")
        else:
            none.append(esc(task))
    if not best:
        return "best per task: no strategy is marked faster on any task"
    return "best per task: " + "; ".join(best) + (f"; none marked faster on {', '.join(none)}" if none else "")


def _checks(summary: shapes.Summary, several: bool, esc: Callable[[str], str]) -> str:
    """Every check that flagged a cell, with how many and the first few; a stability warning and a cut-off last
    line too."""
    fired = []
    for check in CHECKS:
        cells = [c for c in summary["cells"] if ((c.get("checks") or {}).get(check) or {}).get("flagged")]
        if cells:
            named = ", ".join(f"{_who(c['host'], c['strategy'], several, esc)}/{esc(c['task'])}" for c in cells[:NAMED])
            fired.append(f"{check} in {fm.count(len(cells))} cell{'s' if len(cells) != 1 else ''} ({named}"
                         + (", ..." if len(cells) > NAMED else "") + ")")
    warned = [c for c in summary["cells"] if c.get("warnings")]
    if warned:
        fired.append(f"stability warnings in {fm.count(len(warned))} cell{'s' if len(warned) != 1 else ''}")
    if summary["measurements"].get("torn_last_line"):
        fired.append("the last line of measurements.jsonl was cut short")
    return "checks that fired: " + "; ".join(fired) if fired else "checks: none fired"


def terminal(summary: shapes.Summary) -> str:
    """The headline for a terminal (names with their escapes shown)."""
    return "\n".join(lines(summary, fm.console))


def markdown(summary: shapes.Summary) -> list[str]:
    """The headline as the opening of a run's section in RESULTS.md ('' lines included; empty without one)."""
    body = lines(summary, fm.md)
    if not body:
        return []
    return ["### What this run says", "", body[0], "", *[f"- {x.strip()}" for x in body[1:]], ""]
