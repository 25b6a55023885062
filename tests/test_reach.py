"""How well a run can be reproduced, said before it is shared: the margins a reproduction can confirm (at best and
with a B of the run's rounds), the rounds B needs for the default margins, and the command that tightens them."""

from __future__ import annotations

import math
import re
import shutil
import subprocess
import sys

from harness import ROOT
from harness.analysis import inference as inf
from harness.analysis import reach
from harness.analysis.summary import summarize
from harness.store.rundir import RunDir


def _est(se: float, n: int = 3) -> inf.Estimate:
    return inf.Estimate(0.0, se, float(n - 1), n, inf.Method.MEAN, False)


def test_a_precise_run_can_be_confirmed_in_a_few_rounds_and_a_noisy_one_not_at_all():
    quiet, loud = _est(0.002), _est(0.05)
    assert reach.rounds_for([quiet], 0.05) == 3
    assert reach.rounds_for([loud], 0.05) is None  # A's own interval is wider than the margin
    # the best B narrows B/A towards A's own half-width, never below it by much
    best = min(reach._half(loud, *reach._b_at(loud, m)) for m in range(3, 201))
    assert math.expm1(inf.Estimate(0, 0.05, 2.0, 3, inf.Method.MEAN, False).t_quantile() * 0.05) * 0.5 < best


def test_the_committed_demo_says_what_a_reproduction_can_confirm_and_how_to_tighten_it():
    r = summarize(RunDir.open(ROOT / "results" / "demo-cpu"))["reproduction_reach"]
    assert r["geomeans_best"] < r["geomeans_same_rounds"] and r["rounds"] == 3
    assert r["rounds_for_margin"] is None and r["rounds_for_cell_margin"] is None
    assert r["command"] == "invoke run --resume demo-cpu --until 5%" and r["command"] in r["sentence"]
    said = float(re.search(r"geometric means within ±([0-9.]+)% at best", r["sentence"]).group(1))
    assert abs(said - r["geomeans_best"] * 100) <= 0.051


def test_invoke_bundle_states_the_reach_before_the_run_is_shared(tmp_path):
    run = tmp_path / "results" / "real-gemma3-270m-naive"
    shutil.copytree(ROOT / "results" / "real-gemma3-270m-naive", run)
    res = subprocess.run([sys.executable, "-m", "invoke", "-r", str(ROOT), "bundle", str(run), "--out",
                          str(tmp_path / "b.tar.gz"), "--manifest-dir", str(ROOT / "manifests")],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    r = summarize(RunDir.open(run))["reproduction_reach"]
    assert r and f"reproduction: {r['sentence']}" in res.stdout
