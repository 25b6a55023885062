"""What a run says in a few lines: after `invoke report` in the terminal and atop each run's section of RESULTS.md,
per strategy its geometric-mean speedup with interval and mark, the best strategy per task, the checks that fired."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from harness import ROOT
from harness.analysis.summary import summarize
from harness.report import headline
from harness.report.marks import MARKS
from harness.store.rundir import RunDir


@pytest.fixture(scope="module")
def demo():
    return summarize(RunDir.open(ROOT / "results" / "demo-cpu"))


def test_the_headline_has_one_line_per_strategy_with_its_geomean_and_mark(demo):
    lines = headline.lines(demo)
    geos = demo["geomeans"]
    assert len(lines) == 1 + len(geos) + 2
    plan = [s["id"] for s in demo["strategies"] if s["baseline"]]
    assert [ln.split()[0] for ln in lines[1:1 + len(geos)]] == [s for s in plan if s in {g["strategy"] for g in geos}]
    for g, ln in zip(sorted(geos, key=lambda g: plan.index(g["strategy"])), lines[1:], strict=False):
        assert f"{g['estimate']:.2f}x [{g['interval']['low']:.2f}, {g['interval']['high']:.2f}] " \
               f"{MARKS[g['verdict']['kind']]}" in ln
        excludes = not g["interval"]["low"] <= 1 <= g["interval"]["high"]
        assert ("{" in ln) == (g["verdict"]["kind"] == "not significant" and excludes)  # the family's interval


def test_the_best_per_task_is_the_fastest_cell_marked_faster_and_the_checks_that_fired_are_counted(demo):
    lines = headline.lines(demo)
    faster = [c for c in demo["cells"] if (c["verdict"] or {}).get("kind") == "faster"]
    assert faster
    for task in {c["task"] for c in faster}:
        best = max((c for c in faster if c["task"] == task), key=lambda c: c["speedup"])
        assert f"{task} {best['strategy']} {best['speedup']:.2f}x ▲" in lines[-2]
    flagged = sum(1 for c in demo["cells"] if c["checks"]["determinism"]["flagged"])
    assert (f"determinism in {flagged} cells" in lines[-1]) == bool(flagged)
    md = headline.markdown(demo)
    assert md[0] == "### What this run says" and md[2] == lines[0] and len(md) == len(lines) + 4


def test_invoke_report_ends_with_the_headline(tmp_path):
    run = tmp_path / "results" / "real-gemma3-270m-naive"
    shutil.copytree(ROOT / "results" / "real-gemma3-270m-naive", run)
    res = subprocess.run([sys.executable, "-m", "invoke", "-r", str(ROOT), "report", str(run), "--out",
                          str(tmp_path / "R.md"), "--no-plot"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    said = headline.terminal(summarize(RunDir.open(run)))
    assert said and res.stdout.rstrip().endswith(said)
    text = (tmp_path / "R.md").read_text()
    assert text.index("### What this run says") < text.index("| manifest ")


def test_invoke_run_ends_with_the_headline_of_the_run_it_made(world, models_dir):
    import tasks
    from tests.fake_engine import fake, run_demo

    out = run_demo(world, models_dir, [fake()], said=tasks._headline)
    said = headline.terminal(summarize(RunDir.open(world / "r" / "fake")))
    assert said and out.endswith("\n\n" + said) and said.startswith("fake: ")
