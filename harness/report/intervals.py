"""Intervals beside marks: a mark is judged at its table's family level (Holm), a printed interval is 95% on its
own, so where the two could seem to disagree (an unmarked figure whose 95% interval excludes 1) the figure also
shows its interval at the level of Holm's first step, which includes 1 whenever the mark is absent."""

from __future__ import annotations

from harness import formatter as fm
from harness.analysis.speedups import Verdict
from harness.store import shapes


def family_span(iv: shapes.IntervalJson | None, verdict: shapes.VerdictJson | shapes.BuildVerdict | None) -> str:
    """' {0.97, 1.63}': beside an unmarked figure whose 95% interval excludes 1, its interval at the family's level
    (which includes 1: the mark is judged there); '' elsewhere."""
    fi = (verdict or {}).get("family_interval")
    if (verdict or {}).get("kind") != Verdict.NOT_SIGNIFICANT or not fi or not iv or iv.get("low") is None:
        return ""
    if iv["low"] <= 1 <= iv["high"] or fi["low"] is None:
        return ""
    return f" {fm.braced(fi['low'], fi['high'])}"


def family_note(tests: int, alpha: float) -> str:
    """The sentence above a table that explains the braces (`family_span`)."""
    return ("Each interval is 95% on its own, and a mark is judged at the family's level: where a figure is "
            "unmarked (·) although its 95% interval excludes 1, its interval at the level of Holm's first step "
            f"({fm.level(1 - alpha / tests)}) follows in braces, and it includes 1, as the mark says.")


def braces(figures: list[tuple[shapes.IntervalJson | None, shapes.VerdictJson | shapes.BuildVerdict | None]]) -> bool:
    """Whether any of these figures prints its family-level interval (`family_span`)."""
    return any(family_span(iv, v) for iv, v in figures)
