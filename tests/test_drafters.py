"""The generated drafters: byte-deterministic, small, built from the demo target's own weights (which is why
they agree with it in part), and dispatched by kind like today's generator kinds."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from harness import KitError
from harness.models import drafters as dr
from harness.models import gguf_facts as gf
from harness.models.generate import write_tiny


def _sha(p) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _tensors(path) -> dict[str, np.ndarray]:
    import gguf

    return {t.name: np.array(t.data) for t in gguf.GGUFReader(path).tensors}


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    d = tmp_path_factory.mktemp("target")
    return _tensors(write_tiny(d / "t.gguf", "tiny-target", 7, 0.1))


@pytest.mark.parametrize("kind", dr.DRAFTER_KINDS)
def test_same_arguments_same_bytes(tmp_path, kind):
    a = dr.write_generated(tmp_path / "a.gguf", kind, 7, 0.1)
    b = dr.write_generated(tmp_path / "b.gguf", kind, 7, 0.1)
    c = dr.write_generated(tmp_path / "c.gguf", kind, 8, 0.1)
    assert _sha(a) == _sha(b) != _sha(c)
    assert a.stat().st_size < 10e6  # they run beside an 11 MB target on two cores
    assert not list(tmp_path.glob("*.partial"))


def test_dispatch_covers_the_existing_kinds(tmp_path):
    a = dr.write_generated(tmp_path / "t.gguf", "tiny-target", 7, 0.1)
    b = write_tiny(tmp_path / "u.gguf", "tiny-target", 7, 0.1)
    assert _sha(a) == _sha(b)
    assert _sha(dr.write_generated(tmp_path / "w.gguf", "tiny-target", 7, 0.1, embed=128, layers=2)) != _sha(a)
    with pytest.raises(KitError, match="unknown generator kind 'tiny-medusa'"):
        dr.write_generated(tmp_path / "x.gguf", "tiny-medusa")
    with pytest.raises(KitError, match="takes embed, ff, layers, not \\['heads'\\]"):
        dr.write_generated(tmp_path / "x.gguf", "tiny-dflash2", heads=8)
    with pytest.raises(KitError, match="needs more than 3 layers"):
        dr.write_generated(tmp_path / "x.gguf", "tiny-eagle3", layers=3)


@pytest.mark.parametrize("kind, arch, flavour, spec", [
    ("tiny-dflash2", "dflash", "dflash2", "draft-dflash"),
    ("tiny-dspark", "dflash", "dspark", "draft-dspark"),
    ("tiny-eagle3", "eagle3", None, "draft-eagle3"),
    ("tiny-mtp-target", "qwen35", None, "draft-mtp"),
])
def test_each_kind_is_the_file_its_type_reads(tmp_path, kind, arch, flavour, spec):
    f = gf.read_facts(dr.write_generated(tmp_path / "m.gguf", kind))
    assert (f.architecture, f.dflash_flavour) == (arch, flavour)
    borrows = "token_embd.weight" not in f.tensors and "output.weight" not in f.tensors
    assert borrows == (kind != "tiny-mtp-target")  # drafters use the target's embeddings and head


def test_drafters_reuse_the_targets_first_block(tmp_path, target):
    """Where each drafter's agreement comes from: the target's own block-0 weights, byte for byte."""
    d2 = _tensors(dr.write_generated(tmp_path / "d2.gguf", "tiny-dflash2"))
    ds = _tensors(dr.write_generated(tmp_path / "ds.gguf", "tiny-dspark"))
    e3 = _tensors(dr.write_generated(tmp_path / "e3.gguf", "tiny-eagle3"))
    for name in ("attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"):
        assert np.array_equal(d2[f"blk.1.{name}.weight"], target[f"blk.0.{name}.weight"])
        assert np.array_equal(ds[f"blk.0.{name}.weight"], target[f"blk.0.{name}.weight"])
    # Q/K rows are reordered per head for DFlash's NeoX rope: same rows, other order
    q = target["blk.0.attn_q.weight"]
    assert not np.array_equal(d2["blk.1.attn_q.weight"], q)
    assert np.array_equal(np.sort(d2["blk.1.attn_q.weight"], axis=0), np.sort(q, axis=0))
    # EAGLE3: heads 0..3 are the target's attention on the token half of its input; the fused states are off
    assert np.array_equal(e3["blk.0.attn_q.weight"][:256, :256], q)
    assert not e3["blk.0.attn_q.weight"][:, 256:].any() and not e3["blk.0.attn_norm_2.weight"].any()


def test_dspark_markov_head_holds_the_context_free_next_token(tmp_path, target):
    ds = _tensors(dr.write_generated(tmp_path / "ds.gguf", "tiny-dspark"))
    bias = ds["markov_w1.weight"] @ ds["markov_w2.weight"].T  # [previous token, next token]
    e = target["token_embd.weight"].astype(np.float64)
    x = e / np.sqrt((e * e).mean(1, keepdims=True) + 1e-5)
    g, u, dn = (target[f"blk.0.ffn_{n}.weight"].astype(np.float64) for n in ("gate", "up", "down"))
    h = e + ((x @ g.T) / (1 + np.exp(-(x @ g.T))) * (x @ u.T)) @ dn.T
    scores = (h / np.sqrt((h * h).mean(1, keepdims=True) + 1e-5)) @ target["output.weight"].T
    printable = target["output.weight"].any(axis=1)
    agree = (bias[:, printable].argmax(1) == scores[:, printable].argmax(1)).mean()
    assert agree == 1.0  # the target's context-free next-token choice, exactly


def test_mtp_target_nextn_block_repeats_its_attention_layer(tmp_path):
    t = _tensors(dr.write_generated(tmp_path / "m.gguf", "tiny-mtp-target", 7, 0.3))
    for name in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"):
        assert np.array_equal(t[f"blk.2.{name}.weight"], t[f"blk.1.{name}.weight"])
    eh = t["blk.2.nextn.eh_proj.weight"]
    assert np.array_equal(eh[:, :256], np.eye(256, dtype=np.float32)) and not eh[:, 256:].any()
    a1 = dr.drafter_parts("tiny-mtp-target", 7, 0.1).tensors["blk.0.ssm_out.weight"]
    a3 = dr.drafter_parts("tiny-mtp-target", 7, 0.3).tensors["blk.0.ssm_out.weight"]
    assert np.allclose(a3, 3 * a1)  # alpha scales the first (recurrent) layer's contribution
