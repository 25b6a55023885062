"""The mark each verdict prints with: one table for every report table (speedups, builds, dimensions, headline)."""

from __future__ import annotations

from harness import formatter as fm
from harness.analysis.speedups import MIN_ROUNDS, Verdict
from harness.report import intervals
from harness.store import shapes

#: A verdict's mark beside its figure (StrEnum keys: summary.json's verdict words look them up as they are).
MARKS: dict[str, str] = {Verdict.FASTER: "▲", Verdict.SLOWER: "▼", Verdict.EQUIVALENT: "≈",
                         Verdict.NOT_SIGNIFICANT: "·", Verdict.TOO_FEW: "?"}
#: The verdict a cell gets with fewer paired rounds than an interval needs.
TOO_FEW = Verdict.TOO_FEW
#: The sentence of a table no cell of which has the rounds a verdict needs.
NO_VERDICT = (f"No cell has the {fm.count(MIN_ROUNDS)} paired rounds a verdict needs: estimates only, no marks.")


def mark(verdict: str | None) -> str:
    """The mark of a verdict word, or nothing for none or a word no verdict has."""
    return MARKS.get(verdict or "", "")


def marked(estimate: float, iv: shapes.IntervalJson | None,
           verdict: shapes.VerdictJson | shapes.BuildVerdict | None) -> str:
    """A figure as the tables print it: its estimate, its 95% interval where it has one, its mark, and beside an
    unmarked figure whose interval excludes 1 its interval at the family's level (report/intervals.py)."""
    span = f" {fm.interval(iv['low'], iv['high'])}" if iv and iv.get("low") is not None else ""
    sign = mark(verdict["kind"] if verdict else None)
    return f"{fm.ratio(estimate)}{span} {sign}".rstrip() + intervals.family_span(iv, verdict)


def too_few(estimate: float, rounds: int) -> str:
    """A figure whose rounds are too few for an interval: its estimate and how many rounds it has."""
    return f"{fm.ratio(estimate)} ? {TOO_FEW} ({rounds})"
