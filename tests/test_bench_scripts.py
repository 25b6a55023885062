"""The calibration benches run against the kit as it stands: each is run at its smallest size on the committed
demo's shape, so a change to what a run folder must hold (measurement ids, plan checks) cannot leave them
printing a traceback instead of figures."""

from __future__ import annotations

import importlib.util
import json
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
    ("speedbench_fidelity.py", ["--recorded", "tests/data/speedbench_fidelity.json"], "geomean      ngram-simple"),
])
def test_a_calibration_bench_prints_its_figures(script, args, row):
    res = subprocess.run([sys.executable, str(ROOT / "bench" / script), *args], cwd=ROOT, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "Traceback" not in res.stderr
    assert any(line.startswith(row) for line in res.stdout.splitlines()), res.stdout


def _speedbench_fidelity():
    spec = importlib.util.spec_from_file_location("speedbench_fidelity", ROOT / "bench" / "speedbench_fidelity.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _sb(rows):
    return [{"id": q, "category": "c", "ok": True, "predicted_per_second": pps, "draft_n": 4, "draft_n_accepted": a}
            for q, pps, a in rows]


def test_the_speedbench_decomposition_multiplies_out_to_the_kits_figure_over_speed_benchs():
    fb = _speedbench_fidelity()
    kit = [{"strategy": s, "category": "c", "question_id": q, "round": rd, "client_tok_s": c, "server_tok_s": v,
            "accepted": 0} for s, q, rd, c, v in [
                ("baseline", "1", 0, 9.0, 10.0), ("baseline", "2", 0, 36.0, 40.0),
                ("ngram-simple", "1", 0, 19.0, 21.0), ("ngram-simple", "2", 0, 50.0, 62.0),
                ("ngram-mod", "1", 0, 19.0, 20.0)]]  # ngram-mod's prompt 2 failed: no pair
    fig = {"categories": ["c"], "kit": kit, "speed_bench": {
        "baseline": [_sb([("1", 10.0, 0), ("2", 40.0, 0)])] * 2,
        "ngram-simple": [_sb([("1", 20.0, 3), ("2", 60.0, 3)])] * 2,
        "ngram-mod": [_sb([("1", 20.0, 1), ("2", 80.0, 2)]), _sb([("1", 30.0, 4), ("2", 80.0, 4)])]}}
    rows = {r["strategy"]: r for r in fb.decompose(fig)}
    simple = rows["ngram-simple"]
    assert simple["speed_bench"] == pytest.approx(80 / 50)  # speed_bench_compare.py: ratio of arithmetic means
    assert simple["estimator"] == pytest.approx((2 * 1.5) ** 0.5 / 1.6)
    assert simple["process"] == pytest.approx((2.1 * 1.55) ** 0.5 / (2 * 1.5) ** 0.5)
    assert simple["clock"] == pytest.approx((19 / 9 * 50 / 36) ** 0.5 / (2.1 * 1.55) ** 0.5)
    for r in rows.values():
        assert r["estimator"] * r["process"] * r["clock"] == pytest.approx(r["kit"] / r["speed_bench"])
    assert rows["ngram-mod"]["kit"] == pytest.approx(19 / 9)
    assert rows["ngram-mod"]["sb_accepted"] == [1, 2] and rows["ngram-mod"]["sb_again_accepted"] == [4, 4]


def test_the_datasets_stand_in_serves_rows_as_speed_bench_reads_them(tmp_path, monkeypatch):
    fb = _speedbench_fidelity()
    (tmp_path / "datasets").mkdir()
    (tmp_path / "datasets" / "__init__.py").write_text(fb.DATASETS_STAND_IN)
    rows = [{"question_id": "81", "category": "writing", "turns": ["Compose a blog post."]},
            {"question_id": "121", "category": "coding", "turns": ["Write a function."]}]
    (tmp_path / "rows.json").write_text(json.dumps(rows))
    monkeypatch.setenv("SPECBENCH_ROWS", str(tmp_path / "rows.json"))
    monkeypatch.setenv("SPECBENCH_CONFIG", "qualitative")
    spec = importlib.util.spec_from_file_location("datasets", tmp_path / "datasets" / "__init__.py")
    ds = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ds)
    assert ds.get_dataset_config_names("nvidia/SPEED-Bench") == ["qualitative"]
    data = ds.load_dataset("nvidia/SPEED-Bench", name="qualitative", split="test")
    assert data["category"] == ["writing", "coding"]
    assert [dict(r)["question_id"] for r in data] == ["81", "121"]
