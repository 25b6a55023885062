"""Share a manifest, reproduce someone else's numbers: bundle, reproduce, compare; the hub path up to the
network boundary (a local server that answers like the hub)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile

import pytest
import yaml

from harness import ROOT, KitError
from harness.analysis import compare as cmp
from harness.analysis.records import CellKey
from harness.analysis.reproduction import Call, Match
from harness.intake import manifest as mf
from harness.models import ensure as md
from harness.models import generate
from harness.run import runner
from harness.share import bundle as bu
from harness.share import reproduce
from harness.store.rundir import RunDir
from tests.conftest import DEMO, single_stream, trusted, write_manifest
from tests.fakehub import FakeHub


def _hf_manifest(tmp_path, sha256):
    raw = yaml.safe_load(DEMO.read_text())
    raw["models"] = {"target": {"file": "hub-target.gguf", "hf": {"repo": "org/tiny", "file": "t.gguf",
                                                                 "revision": "main"}, "sha256": sha256}}
    raw["strategies"] = [{"id": "baseline", "spec_type": "none"}]
    return mf.load(write_manifest(tmp_path / "m", yaml.safe_dump(raw, allow_unicode=True), "hub.yaml"))


def test_hub_download_verified_and_mismatch_refused(tmp_path, monkeypatch):
    data = generate.write_tiny(tmp_path / "src.gguf", "tiny-draft", 3).read_bytes()
    good = hashlib.sha256(data).hexdigest()
    with FakeHub({"org/tiny/t.gguf": data}) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        paths = md.ensure(_hf_manifest(tmp_path, good), tmp_path / "models", log=lambda s: None)
        assert hashlib.sha256(paths["target"].read_bytes()).hexdigest() == good
        assert any(r.startswith("GET /org/tiny/resolve/main/t.gguf") for r in hub.requests)
        with pytest.raises(KitError, match=r"models.target: downloaded org/tiny/t.gguf has sha256 [0-9a-f]{64}, "
                                           r"the manifest pins 4444.*removed"):
            md.ensure(_hf_manifest(tmp_path / "x", "4" * 64), tmp_path / "models2", log=lambda s: None)
        assert not (tmp_path / "models2" / "hub-target.gguf").exists()
        raw = yaml.safe_load(DEMO.read_text())
        raw["models"] = {"target": {"file": "nope.gguf", "hf": {"repo": "org/tiny", "file": "nope.gguf"}}}
        raw["strategies"] = [{"id": "baseline", "spec_type": "none"}]
        m = mf.load(write_manifest(tmp_path / "y", yaml.safe_dump(raw, allow_unicode=True), "nope.yaml"))
        with pytest.raises(KitError, match="models.target: nope.gguf not found in org/tiny"):
            md.ensure(m, tmp_path / "models3", log=lambda s: None)


def test_strict_validate_names_unpinned_fields(tmp_path):
    from harness.intake.manifest import unpinned
    from harness.run.plan import render as describe

    assert unpinned(mf.load(DEMO)) == []
    assert "strict: every field that decides the numbers is pinned" in describe(mf.load(DEMO), tmp_path, strict=True)
    spark = unpinned(mf.load(ROOT / "manifests" / "spark-qwen3.8-27b.yaml"))
    assert any("models.target.sha256: not pinned" in p for p in spark)
    assert any("models.dflash2.hf.revision: not pinned" in p for p in spark)
    assert any("tasks[0].prompts[1].sha256: not pinned (zh-prose/zh-prose-2)" in p for p in spark)
    with pytest.raises(KitError, match="problems"):
        describe(mf.load(ROOT / "manifests" / "spark-qwen3.8-27b.yaml"), tmp_path, strict=True)


def _small_run(tmp_path, models_dir, run_id):
    raw = yaml.safe_load(DEMO.read_text())
    raw["strategies"] = single_stream([s for s in raw["strategies"] if s["id"] in ("baseline", "ngram-mod")])
    raw.pop("distribution")  # the demo's sampling study is not what this measures
    raw["tasks"] = [t for t in raw["tasks"] if t["id"] in ("json-out", "translate")]
    raw["runs"] = 3
    path = write_manifest(tmp_path / "shared", yaml.safe_dump(raw, allow_unicode=True), "shared.yaml")
    runner.run(trusted(path), results_dir=tmp_path / "results", models_dir=models_dir, run_id=run_id, seed=9,
                progress=False, log=lambda s: None)
    return path, tmp_path / "results" / run_id


@pytest.mark.image
def test_bundle_reproduce_compare(tmp_path, demo_image, models_dir):
    _, run_dir = _small_run(tmp_path / "alice", models_dir, "alice")
    archive = bu.make(run_dir, tmp_path / "alice.bundle.tar.gz")
    names = tarfile.open(archive).getnames()
    assert "alice/bundle.json" in names and "alice/manifest/shared.yaml" in names
    assert "alice/manifest/tasks/json-out.md" in names and "alice/run/measurements.jsonl" in names
    # Bob has the bundle alone, in a fresh folder
    bob = tmp_path / "bob"
    res = reproduce.reproduce(archive, bob, models_dir=models_dir, progress=False, log=lambda s: None)
    c = res.comparison
    assert c.comparable and not [d for d in c.differences if not d.field.startswith("hardware")]
    assert len(c.rows) == 4
    # draft counts and outputs are deterministic in a fresh server: a true reproduction has the same fingerprint
    assert all(r.fingerprint is Match.IDENTICAL for r in c.rows), c.rows
    # judged on speedups (what transfers), never "differs" for the same setup on the same machine
    judged = [r for r in c.rows if r.strategy == "ngram-mod"]
    assert len(judged) == 2 and all(r.call in (Call.REPRODUCES, Call.INCONCLUSIVE) for r in judged), judged
    assert all(r.tok_s_ratio and r.tok_s_ratio > 0 for r in c.rows)
    assert c.call in (Call.REPRODUCES, Call.GEOMEANS_REPRODUCE, Call.INCONCLUSIVE)
    text = (bob / "RESULTS.md").read_text()
    assert "## Comparison: alice (A) vs" in text and "speedup A" in text and "verdict:" in text
    saved = json.loads((bob / "compare.json").read_text())
    assert saved["a"]["run_id"] == "alice" and saved["call"] == c.call.value and saved["verdict"] == c.verdict
    out = subprocess.run([sys.executable, "-m", "invoke", "-r", str(ROOT), "compare", str(archive), str(res.run)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "verdict: " in out.stdout and "json-out" in out.stdout and "never judged" in out.stdout


@pytest.mark.image
def test_tampering_is_detected(tmp_path, demo_image, models_dir):
    manifest_path, run_dir = _small_run(tmp_path, models_dir, "t")
    archive = bu.make(run_dir, tmp_path / "t.tar.gz")
    # a modified measurement inside the bundle
    work = tmp_path / "unpacked"
    from harness.store import archive as arc

    arc.extract(archive, work)
    mfile = work / "t" / "run" / "measurements.jsonl"
    lines = mfile.read_text().splitlines()
    rec = json.loads(lines[0])
    rec["client"]["decode_tok_s"] *= 10
    mfile.write_text("\n".join([json.dumps(rec)] + lines[1:]) + "\n")
    bad = tmp_path / "bad.tar.gz"
    with tarfile.open(bad, "w:gz") as tf:
        tf.add(work / "t", "t")
    with pytest.raises(KitError, match="run/measurements.jsonl was modified"):
        bu.open_bundle(bad, tmp_path / "x")
    # an edited prompt since the run
    prompt = manifest_path.parent / "tasks" / "json-out.md"
    prompt.write_text(prompt.read_text() + "\nAlso add a field.\n")
    with pytest.raises(KitError, match="json-out.md: sha256 .* differs from the one run t used .*edited"):
        bu.make(run_dir, tmp_path / "t2.tar.gz")
    # not a bundle at all
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(os.urandom(100))
    with pytest.raises(KitError, match="not a specbench bundle"):
        bu.open_bundle(junk, tmp_path / "y")
    # a results file that fails the schema
    (run_dir / "measurements.jsonl").write_text(json.dumps({"format_version": 1, "run_id": "t"}) + "\n"
                                                 + (run_dir / "measurements.jsonl").read_text())
    with pytest.raises(KitError, match="measurements.jsonl: line 1: .*is a required property"):
        cmp.compare(run_dir, run_dir)


def _replicate(source, dest):
    """A copy of a run whose measurements are its own (other containers): the same figures, not the same records."""
    shutil.copytree(source, dest)
    recs = [json.loads(x) for x in (dest / "measurements.jsonl").read_text().splitlines() if x.strip()]
    (dest / "measurements.jsonl").write_text("".join(json.dumps({**r, "container_id": f"b{r.get('container_id')}"})
                                                     + "\n" for r in recs))
    return dest


def test_reproduce_until_adds_rounds_to_the_unresolved_cells_until_the_verdict_is_decided(tmp_path):
    """`invoke reproduce --until` reads the comparison's calls (not its words): a cell unresolved at the cell margin
    runs again with its baseline while only the geometric means reproduce; a decided comparison stops."""
    original = ROOT / "results" / "real-gemma3-270m-naive"
    here = _replicate(original, tmp_path / "here")
    rd = RunDir.open(here)
    cells, said = reproduce.decided(original, 0.15)(rd, 3)
    assert cells == [CellKey("local", "ngram-mod", "code-edit"), CellKey("local", "baseline", "code-edit")]
    assert said.startswith("reproduce --until: still geometric means reproduce; 1 cell unresolved (worst ngram-mod "
                           "/ code-edit B/A 1.00x"), said
    assert reproduce.decided(original, 0.15, 1.0)(rd, 3) == (None, "reproduce --until: reproduces after 3 rounds here")


def test_compare_takes_a_cell_margin_from_the_command_line(tmp_path):
    naive = str(ROOT / "results" / "real-gemma3-270m-naive")
    again = str(_replicate(ROOT / "results" / "real-gemma3-270m-naive", tmp_path / "again"))

    def compare(*flags: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "invoke", "-r", str(ROOT), "compare", naive, again, *flags],
                              capture_output=True, text=True, timeout=120)

    default = compare("--margin", "15%")
    assert default.returncode == 0, default.stderr
    assert "verdict: geometric means reproduce; 1 cell unresolved (worst ngram-mod / code-edit" in default.stdout
    wide = compare("--margin", "15%", "--cell-margin", "60%")
    assert wide.returncode == 0 and "verdict: reproduces: speedups 2 reproduce (B/A within ±60%)" in wide.stdout
    bad = compare("--margin", "15%", "--cell-margin", "5%")
    assert bad.returncode == 1 and "--cell-margin: expected a percentage from --margin (15%)" in bad.stderr + bad.stdout
