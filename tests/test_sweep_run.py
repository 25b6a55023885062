"""A sweep and a serving curve through the real kit: fresh containers of the real llama-server on the demo's tiny
models, the confirmation rounds after the sweep, the slots read from the server, the report's sections and
plots, and a resume that adds nothing to a finished run."""

from __future__ import annotations

import json

import pytest
import yaml

from harness import schema
from harness.report import results as rp
from harness.run.runner import run
from harness.store.rundir import RunDir
from tests.conftest import DEMO, first_takes, trusted, write_manifest

pytestmark = pytest.mark.image


def test_sweep_with_confirmation_and_serving_curve(tmp_path, demo_image, models_dir):
    raw = yaml.safe_load(DEMO.read_text())
    raw["strategies"] = [
        {"id": "baseline", "spec_type": "none", "parallel": [1, 2]},
        {"id": "ngram-simple", "spec_type": "ngram-simple", "sweep": {"--spec-ngram-simple-size-n": [2, 4]}},
        {"id": "ngram-mod", "spec_type": "ngram-mod", "parallel": [1, 2]},
    ]
    raw.pop("distribution")  # the demo's sampling study is not what this measures
    raw["tasks"] = [dict(t, n_predict=48) for t in raw["tasks"] if t["id"] in ("code-edit", "json-out")]
    raw["runs"], raw["confirm_rounds"] = 2, 1
    path = write_manifest(tmp_path / "m", yaml.safe_dump(raw, allow_unicode=True, sort_keys=False), "sweep.yaml")
    lines: list[str] = []
    out = run(trusted(path), results_dir=tmp_path / "r", models_dir=models_dir, run_id="sw", progress=False,
              log=lines.append)
    # 6 strategies x 2 tasks x 2 rounds, then 1 round of the best two combinations and their baseline at both levels
    assert "run sw: 32 ok, 0 failed" in out, out
    assert any("sweep ngram-simple: confirming ngram-simple[size-n=" in x for x in lines), lines
    rd = RunDir.open(tmp_path / "r" / "sw")
    meta = rd.read_meta()
    confirm = [x for x in meta.plan.extra_rounds if x.confirms]
    assert meta.plan.confirm_rounds == 1 and [x.round for x in confirm] == [3]
    assert {c[1] for c in confirm[0].cells} == {"ngram-simple[size-n=2]", "ngram-simple[size-n=4]", "baseline",
                                                   "baseline[parallel=2]"}
    recs = rd.measurements()
    assert all(schema.errors("result", r) == [] for r in recs)
    two = [r for r in recs if r["strategy"] == "ngram-mod[parallel=2]"]
    # the server's word: two slots, each speculating; each stream's first token and drafts, latencies pooled
    assert all(r["slots"]["total"] == 2 and r["slots"]["speculative"] == [True, True] for r in two)
    assert all(len(r["concurrency"]["ttft_s"]) == 2 and len(r["concurrency"]["draft_n"]) == 2 for r in two)
    assert all(r["concurrency"]["itl_p99_s"] >= r["concurrency"]["itl_p50_s"] >= 0 for r in two)
    assert all(r["slots"]["speculative"] == [False] for r in recs if r["strategy"] == "baseline")
    # each of the two clients keeps the manifest's context
    assert all(r["slots"]["n_ctx"] == 12288 for r in recs if r["strategy"] == "baseline[parallel=2]")

    written = rp.write([rd.path], tmp_path / "R.md")
    summary = json.loads((rd.path / "summary.json").read_text())
    assert schema.errors("summary", summary) == []
    res = summary["sweeps"][0]
    assert res["family"] == "ngram-simple" and len(res["combinations"]) == 2
    # the confirmation rounds measure the best two again, ordered by the selection table's figures
    assert res["confirmation"]["rounds"] == [3] and res["confirmation"]["winner"] == res["overall"]["best"]
    assert {res["confirmation"]["winner"], res["confirmation"]["runner_up"]} == set(res["combinations"])
    curves = summary["serving"][0]["curves"]
    assert [p["streams"] for p in curves["baseline"]] == [1, 2] == [p["streams"] for p in curves["ngram-mod"]]
    crossing = [c["strategy"] for c in summary["serving"][0]["crossovers"]]
    assert crossing[0] == res["confirmation"]["winner"] and crossing[1] == "ngram-mod"
    text = (tmp_path / "R.md").read_text()
    # one confirmation round cannot tell the best two apart (no interval of one over the other): no winner named
    assert res["winner"] is None and res["confirmation"]["winner_vs_runner_up"]["low"] is None
    assert "### Sweeps: which setting" in text and "**Best two not distinguishable: ngram-simple\\[size-n=" in text
    assert "(too few confirmation rounds to compare them): no winner is named" in text
    assert "### Serving: throughput against per-stream latency" in text and "ngram-mod** against baseline" in text
    assert {p.name for p in written} >= {"sweep-ngram-simple.png", "serving.png", "R.md"}

    again = run(trusted(path), results_dir=tmp_path / "r", models_dir=models_dir, resume="sw", progress=False,
                log=lines.append)
    assert "0 ok, 0 failed, 32 already recorded" in again, again
    assert len(first_takes(rd.measurements())) == 32  # a busy machine adds retakes
