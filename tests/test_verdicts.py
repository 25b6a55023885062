"""Verdicts with real containers: interference from a CPU hog is measured and named, fresh containers are never
called a carried cache, the A/A control, and adaptive rounds (--until)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import yaml

from harness.analysis.summary import summarize
from harness.report import results as rp
from harness.run import runner
from harness.store.rundir import RunDir
from tests.conftest import DEMO, single_stream, trusted, write_manifest

pytestmark = pytest.mark.image


def _manifest(tmp_path, runs=4, n_predict=64, tasks=("json-out", "translate")):
    raw = yaml.safe_load(DEMO.read_text())
    raw["strategies"] = single_stream([s for s in raw["strategies"] if s["id"] in ("baseline", "ngram-mod")])
    raw.pop("distribution")  # the demo's sampling study is not what this measures
    raw["tasks"] = [dict(t, n_predict=n_predict) for t in raw["tasks"] if t["id"] in tasks]
    raw["runs"] = runs
    return write_manifest(tmp_path, yaml.safe_dump(raw, allow_unicode=True), "v.yaml")


# bounded, and killed by pid when the run ends: with one of two cores taken, llama-server's threads wait on each
# other and a 0.1 s decode takes 2-20 s here, so the hog must outlast the run's second half
HOG = "import time\nend = time.monotonic() + 900\nwhile time.monotonic() < end:\n    pass\n"


def test_cpu_hog_during_half_a_run_is_measured_and_named(tmp_path, demo_image, models_dir):
    path = _manifest(tmp_path, runs=4)
    hog: list[subprocess.Popen] = []
    started_at: list[int] = []
    lines: list[str] = []

    def log(line: str) -> None:
        lines.append(line)
        done = sum(1 for x in lines if "tok/s (server" in x)
        if done == 8 and not hog:  # half of the 16 measurements: a bounded busy loop on one core, ours by pid
            hog.append(subprocess.Popen([sys.executable, "-c", HOG]))
            started_at.append(done)
            time.sleep(0.5)

    try:
        runner.run(trusted(path), results_dir=tmp_path / "r", models_dir=models_dir, run_id="hog", seed=5,
                   progress=False, log=log)
    finally:
        for p in hog:
            p.kill()
            p.wait(timeout=10)
    assert hog, "the hog never started"
    recs = sorted(RunDir.open(tmp_path / "r" / "hog").measurements(), key=lambda r: r["order"])
    assert all("interference" in r for r in recs)
    during = [r for r in recs if r["order"] >= started_at[0]]
    # the hog keeps one core busy: every measurement while it ran sees at least ~0.6 cores of other work
    assert len(during) >= 6 and all(r["interference"]["others_cores"] >= 0.6 and r["interference"]["disturbed"]
                                    for r in during), \
        " ".join(f'{r["order"]}:{r["interference"]["others_cores"]}:{r["interference"]["disturbed"]}' for r in recs)
    s = summarize(RunDir.open(tmp_path / "r" / "hog"))
    named = set(s["interference"]["local"]["disturbed_ids"])
    assert {r["measurement_id"] for r in during} <= named
    # fresh containers: identical draft counts and outputs, never a carried-over cache
    for c in s["cells"]:
        con = c["checks"]["contamination"]
        assert con["data"]["kind"] not in ("warm-cache", "naive"), con
        assert con["data"]["fingerprint"]["identical"], con
    rp.write([tmp_path / "r" / "hog"], tmp_path / "R.md", plot=False)
    text = (tmp_path / "R.md").read_text()
    assert "### Interference" in text and "disturbed" in text


def test_aa_control_and_until(tmp_path, demo_image, models_dir):
    path = _manifest(tmp_path, runs=2, n_predict=32, tasks=("json-out",))
    out = runner.run(trusted(path), results_dir=tmp_path / "r", models_dir=models_dir, run_id="aa", seed=7,
                     progress=False, log=lambda s: None, aa_control=True, until=0.5, max_rounds=5)
    rd = RunDir.open(tmp_path / "r" / "aa")
    meta = rd.read_meta()
    assert meta.plan.aa_control and meta.strategy("baseline-aa").baseline == "baseline"
    assert meta.plan.until == 0.5 and meta.plan.max_rounds == 5
    recs = rd.measurements()
    rounds = max(r["round"] for r in recs)
    assert 2 <= rounds <= 5 and "ok" in out
    # extra rounds ran only cells not converged yet, with their baselines, as recorded in run.json
    for extra in meta.plan.extra_rounds:
        ran = {(r["host"], r["strategy"], r["task"]) for r in recs if r["round"] == extra.round}
        assert ran == set(extra.cells)
    s = summarize(rd)
    aa = next(c for c in s["cells"] if c["strategy"] == "baseline-aa")
    assert aa["speedup"] is not None and aa["verdict"]["kind"] in ("equivalent", "not significant", "faster",
                                                                   "slower")
    assert s["convergence"]["target"] == 0.5
    if rounds < 5:
        assert s["convergence"]["not_converged"] == []
    rp.write([rd.path], tmp_path / "R.md", plot=False)
    assert "baseline-aa" in (tmp_path / "R.md").read_text()
