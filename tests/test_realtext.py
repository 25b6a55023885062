"""Real text on this machine's CPU: gemma-3-270m assembled from its PyPI chunk packages (the real index pip
uses), its layer-skip drafter derived from it, and one task of the real-text manifest through the kit: every
strategy drafts (but the baseline), the chat template is applied, the output reads like language."""

from __future__ import annotations

import pytest

from harness import ROOT
from harness.analysis.summary import summarize
from harness.intake import manifest as mf
from harness.models import ensure as md
from harness.run import runner
from harness.store.rundir import RunDir
from tests.conftest import trusted

pytestmark = pytest.mark.image
REAL = ROOT / "manifests" / "real-gemma3-270m.yaml"


@pytest.fixture(scope="session")
def real_models(tmp_path_factory):
    d = tmp_path_factory.mktemp("real-models")
    paths = md.ensure(mf.load(REAL), d, log=lambda s: None)
    assert paths["target"].stat().st_size == 253_113_024
    return d


def test_one_real_text_task_through_the_kit(tmp_path, demo_image, real_models):
    # the single-stream strategies (the sweep and the concurrency levels have their own tests on the demo)
    out = runner.run(trusted(REAL), results_dir=tmp_path / "r", models_dir=real_models, run_id="real", seed=4, runs=1,
                     strategies=["baseline", "ngram-mod", "layer-skip-15"], tasks=["code-edit"], progress=False,
                     log=lambda s: None)
    assert "9 ok, 0 failed" in out, out
    recs = RunDir.open(tmp_path / "r" / "real").measurements()
    assert {r["prompt"] for r in recs} == {"code-edit", "code-edit-2", "code-edit-3"}
    for r in recs:
        text = r["output"]["text"]
        letters = sum(ch.isalpha() or ch.isspace() for ch in text)
        assert len(text) > 40 and letters / len(text) > 0.6, text[:200]
        # the gemma turn format wraps the prompt: more tokens than the bare prompt's words
        assert r["server"]["prompt_n"] > 50
        if r["spec_type"] != "none":
            assert r["server"]["draft_n"] > 0, (r["strategy"], r["prompt"])
    s = summarize(RunDir.open(tmp_path / "r" / "real"))
    assert all(c["speedup"] is not None for c in s["cells"] if c["baseline"])
