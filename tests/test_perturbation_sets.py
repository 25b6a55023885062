"""Prompt sets and a perturbation task with real containers on the tiny models: one cell per prompt, per-task
figures over prompts and runs, and each variant compared with its reference prompt."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from harness import ROOT
from harness.analysis.summary import summarize
from harness.report import results as rp
from harness.run import runner
from harness.store.rundir import RunDir
from tests.conftest import DEMO, single_stream, trusted, write_manifest

pytestmark = pytest.mark.image


def test_prompt_sets_and_perturbation_through_the_kit(tmp_path, demo_image, models_dir):
    raw = yaml.safe_load(DEMO.read_text())
    raw["strategies"] = single_stream([s for s in raw["strategies"] if s["id"] in ("baseline", "ngram-mod")])
    raw.pop("distribution")  # the demo's sampling study is not what this measures
    raw["tasks"] = [
        {"id": "code", "n_predict": 48, "prompts": ["tasks/code-gen.md", "tasks/code-edit.md"]},
        {"id": "varied", "n_predict": 48, "perturbation": True,
         "prompts": [{"id": "reference", "file": "tasks/en-prose.md"},
                     {"id": "no-outline", "file": "tasks/en-prose-probe-no-outline.md"}]},
    ]
    raw["runs"] = 2
    shutil_copy = (ROOT / "manifests" / "tasks" / "en-prose-probe-no-outline.md").read_text()
    path = write_manifest(tmp_path, yaml.safe_dump(raw, allow_unicode=True), "sets.yaml")
    (tmp_path / "tasks" / "en-prose-probe-no-outline.md").write_text(shutil_copy)
    # counted figures below: no retakes of disturbed measurements (tests/test_retakes.py has those)
    out = runner.run(trusted(path), results_dir=tmp_path / "r", models_dir=models_dir, run_id="sets", seed=2,
                     progress=False, log=lambda s: None, retakes=0)
    assert "16 ok, 0 failed" in out
    rd = RunDir.open(tmp_path / "r" / "sets")
    recs = rd.measurements()
    assert {(r["task"], r["prompt"]) for r in recs} == {("code", "code-gen"), ("code", "code-edit"),
                                                        ("varied", "reference"), ("varied", "no-outline")}
    assert "local/ngram-mod/code/code-edit/2" in {r["measurement_id"] for r in recs}
    s = summarize(rd)
    code = next(c for c in s["cells"] if (c["strategy"], c["task"]) == ("ngram-mod", "code"))
    assert code["runs_ok"] == 4 and code["speedup"] is not None and len(code["paired_rounds"]) == 2
    # the two prompts draft differently, yet identical requests (the same prompt) are what is judged
    assert code["checks"]["contamination"]["data"]["kind"] != "unstable" or \
        "prompt" in code["checks"]["contamination"]["data"]
    sens = {(x["strategy"], x["variant"]): x for x in s["sensitivity"]}
    assert set(sens) == {("baseline", "no-outline"), ("ngram-mod", "no-outline")}
    x = sens[("ngram-mod", "no-outline")]
    assert x["tok_s_ratio"] > 0 and x["speedup_variant"] is not None and x["output_common_prefix_tokens"] >= 0
    rp.write([rd.path], tmp_path / "R.md", plot=False)
    assert "### Prompt sensitivity" in (tmp_path / "R.md").read_text()
    cli = subprocess.run([sys.executable, "-m", "invoke", "-r", str(ROOT), "sensitivity", str(rd.path)],
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0 and "varied: no-outline" in cli.stdout, cli.stderr
