"""Intervals beside marks: an unmarked figure whose 95% interval excludes 1 also shows its interval at the level of
Holm's first step, which includes 1 (the mark is judged there); marked figures and those whose 95% interval holds 1
show none."""

from __future__ import annotations

from harness import ROOT
from harness import formatter as fm
from harness.analysis.summary import summarize
from harness.report import intervals
from harness.store.rundir import RunDir


def _fig(low, high, kind, flow, fhigh):
    return ({"low": low, "high": high}, {"kind": kind, "family_interval": {"low": flow, "high": fhigh,
                                                                            "confidence": 0.999}})


def test_the_family_interval_shows_only_beside_an_unmarked_figure_whose_interval_excludes_1():
    assert intervals.family_span(*_fig(1.14, 1.39, "not significant", 0.88, 1.82)) == " {0.88, 1.82}"
    assert intervals.family_span(*_fig(1.14, 1.39, "faster", 1.02, 1.60)) == ""
    assert intervals.family_span(*_fig(0.91, 1.13, "not significant", 0.70, 1.40)) == ""
    assert intervals.braces([_fig(0.91, 1.13, "not significant", 0.7, 1.4), _fig(1.1, 1.3, "not significant", 0.9,
                                                                                  1.6)])
    assert fm.level(1 - 0.05 / 162) == "99.97%" and fm.level(1 - 0.05 / 6) == "99.2%"


def test_every_unmarked_cell_of_the_committed_demo_has_a_family_interval_that_includes_1():
    s = summarize(RunDir.open(ROOT / "results" / "demo-cpu"))
    unmarked_excluding = 0
    for c in [*s["cells"], *s["geomeans"]]:
        iv, v = c.get("speedup_interval") or c.get("interval"), c.get("verdict")
        if not v or v["kind"] != "not significant":
            continue
        fi = v["family_interval"]
        assert fi["low"] <= 1 <= fi["high"] and fi["low"] <= iv["low"] and iv["high"] <= fi["high"]
        assert fi["confidence"] == round(1 - 0.05 / v["family"], 6)
        unmarked_excluding += not (iv["low"] <= 1 <= iv["high"])
    assert unmarked_excluding  # the demo has such cells: the case is exercised
