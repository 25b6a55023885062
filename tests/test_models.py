"""The tiny model generator: deterministic bytes, shared vocabulary between target and draft."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from harness import KitError
from harness.intake import manifest as mf
from harness.models import ensure as md
from harness.models import generate
from tests.conftest import DEMO


def _sha(p):
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_generation_is_deterministic(tmp_path):
    a = generate.write_tiny(tmp_path / "a.gguf", "tiny-target", 7, 0.1)
    b = generate.write_tiny(tmp_path / "b.gguf", "tiny-target", 7, 0.1)
    c = generate.write_tiny(tmp_path / "c.gguf", "tiny-target", 8, 0.1)
    assert _sha(a) == _sha(b) != _sha(c)
    assert 5e6 < a.stat().st_size < 20e6


def test_pinned_sha256_in_demo_manifest_matches_generation(tmp_path):
    m = mf.load(DEMO)
    paths = md.ensure(m, tmp_path, download=False, log=lambda s: None)
    for key, p in paths.items():
        assert m.models[key].sha256 == _sha(p), f"demo-cpu.yaml pins a different sha256 for {key}"


def test_draft_shares_target_vocabulary_and_weights(tmp_path):
    import gguf

    t = gguf.GGUFReader(generate.write_tiny(tmp_path / "t.gguf", "tiny-target", 7))
    d = gguf.GGUFReader(generate.write_tiny(tmp_path / "d.gguf", "tiny-draft", 7))
    f = gguf.GGUFReader(generate.write_tiny(tmp_path / "f.gguf", "tiny-foreign", 7))

    def tokens(r):
        fld = r.fields["tokenizer.ggml.tokens"]
        return [bytes(fld.parts[i]).decode() for i in fld.data]

    assert tokens(t) == tokens(d) != tokens(f)
    tt = {x.name: np.array(x.data) for x in t.tensors}
    dt = {x.name: np.array(x.data) for x in d.tensors}
    assert np.array_equal(tt["blk.0.attn_q.weight"], dt["blk.0.attn_q.weight"])
    assert "blk.1.attn_q.weight" in tt and "blk.1.attn_q.weight" not in dt


def test_manifest_shapes_a_heavier_generated_target(tmp_path):
    import gguf
    import yaml

    from tests.conftest import write_manifest

    raw = yaml.safe_load(DEMO.read_text())
    raw["models"] = {"target": {"file": "wide.gguf", "generate": {"kind": "tiny-target", "seed": 7, "embed": 320,
                                                                   "ff": 640, "layers": 6}}}
    raw["strategies"] = [s for s in raw["strategies"] if s["spec_type"].startswith("ngram") or
                         s["spec_type"] == "none" and s.get("model", "target") == "target"]
    m = mf.load(write_manifest(tmp_path / "m", yaml.safe_dump(raw)))
    p = md.ensure(m, tmp_path / "models", download=False, log=lambda s: None)["target"]
    r = gguf.GGUFReader(p)
    assert int(r.fields["llama.embedding_length"].parts[-1][0]) == 320
    assert int(r.fields["llama.block_count"].parts[-1][0]) == 6
    assert {x.name for x in r.tensors} >= {"blk.5.ffn_down.weight"}
    assert [int(n) for n in next(x for x in r.tensors if x.name == "blk.0.ffn_up.weight").shape] == [320, 640]
    # a width the attention heads cannot split is one line naming the field
    raw["models"]["target"]["generate"]["embed"] = 322
    with pytest.raises(KitError, match=r"models\.target\.generate\.embed"):
        mf.load(write_manifest(tmp_path / "bad", yaml.safe_dump(raw)))


def test_ensure_reports_sha256_mismatch(tmp_path):
    import yaml

    from tests.conftest import write_manifest

    raw = yaml.safe_load(DEMO.read_text())
    raw["models"]["draft"]["sha256"] = "2" * 64
    m = mf.load(write_manifest(tmp_path / "m", yaml.safe_dump(raw)))
    with pytest.raises(KitError, match=r"models.draft: .*tiny-draft.gguf has sha256 [0-9a-f]{64}, "
                                       r"the manifest pins 2222"):
        md.ensure(m, tmp_path / "models", download=False, log=lambda s: None)


def test_missing_hf_model_without_download_says_how(tmp_path):
    from tests.conftest import SPARK

    m = mf.load(SPARK)
    with pytest.raises(KitError, match=r"models.target: .* is missing; fetch it with `invoke models"):
        md.ensure(m, tmp_path, download=False, log=lambda s: None)
