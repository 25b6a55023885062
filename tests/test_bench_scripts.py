"""The calibration benches run against the kit as it stands: each is run at its smallest size on the committed
demo's shape, so a change to what a run folder must hold (measurement ids, plan checks) cannot leave them
printing a traceback instead of figures."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("script,args,row", [
    ("aa_calibration.py", ["--reports", "2", "--rounds", "3", "--models", "spread", "t3+slow"], "spread         3"),
    ("compare_calibration.py", ["--comparisons", "2", "--rounds", "3", "--jobs", "1"], "     3 regressed"),
    ("interval_coverage.py", ["--runs", "results/demo-cpu", "--noise", "spread", "--tables", "4", "--rounds", "3"],
     "demo-cpu"),
    ("prompt_coverage.py", ["--reps", "40", "--prompts", "2", "5", "--rounds", "3", "--tau", "0.2", "--sigma", "0.1",
                            "--shape", "normal"], "normal        5      3  0.20  0.10"),
    ("prompt_coverage.py", ["--power", "--reps", "40", "--spreads", "0.1"], "  0.10       7"),
    ("load_aa.py", ["--tables", "3", "--rates", "1", "2", "--slots", "1", "--server-sd", "0.1"],
     "0.1" + " " * 13 + "3"),
    ("crossover_check.py", ["--tables", "3", "--rounds", "3", "--noise", "0.066"], " 0.066      3 |"),
    ("study_cost.py", ["--sizes", "4x5x2"], "         4x5x2      16"),
])
def test_a_calibration_bench_prints_its_figures(script, args, row):
    res = subprocess.run([sys.executable, str(ROOT / "bench" / script), *args], cwd=ROOT, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "Traceback" not in res.stderr
    assert any(line.startswith(row) for line in res.stdout.splitlines()), res.stdout
