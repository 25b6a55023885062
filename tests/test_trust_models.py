"""Model files made here from what a manifest or bundle brings: a derived drafter's parent and a generator's shape.
Each crafted input is one line (or the correct file), and nothing is left in the models folder that was not
verified."""

from __future__ import annotations

import copy
import hashlib
import time
from pathlib import Path

import pytest
import yaml

from harness import KitError
from harness.intake import manifest as mf
from harness.models import drafters
from harness.models import ensure as md
from harness.models.derive import derive_layer_skip
from harness.run import plan as pl
from tests.conftest import DEMO, write_manifest
from tests.crafted import layered_gguf, one_line, raw_gguf

MIB = 1 << 20


def _parent(folder: Path, edit=None, name: str = "parent.gguf") -> Path:
    kv, tensors, data = layered_gguf()
    if edit is not None:
        kv, tensors, data = edit(kv, tensors, data)
    p = folder / name
    p.write_bytes(raw_gguf(kv, tensors, data))
    return p


def _amplifier(kv, tensors, data):
    """The issue's bundle: 3,000 block tensors of one MiB each, every one pointing at the same MiB of data."""
    tensors = [("token_embd.weight", (MIB // 4,), 0, 0)]
    tensors += [(f"blk.{i % 4}.t{i}.weight", (MIB // 4,), 0, 0) for i in range(3000)]
    return kv, tensors, b"\0" * MIB


CRAFTED = {
    "3,000 entries on one MiB": (_amplifier, "overlap (data offsets 0..1,048,576 and 0)"),
    "an entry past the end": (lambda kv, t, d: (kv, t[:-1] + [("output.weight", (8,), 0, 1 << 40)], d),
                              "ends past the end of the file"),
    "an entry that runs off the end": (lambda kv, t, d: (kv, t[:-1] + [("output.weight", (1 << 20,), 0, 160)], d),
                                       "ends past the end of the file"),
    "a shape of 2^61 x 4": (lambda kv, t, d: (kv, t[:-1] + [("output.weight", (1 << 61, 4), 0, 160)], d),
                            "ends past the end of the file"),
    "an unknown ggml type": (lambda kv, t, d: (kv, t[:-1] + [("output.weight", (8,), 99, 160)], d),
                             "ggml type 99, which the kit does not know"),
    "an unaligned entry": (lambda kv, t, d: (kv, t[:-1] + [("output.weight", (4,), 0, 164)], d),
                           "not a multiple of the alignment 32"),
    "a zero dimension": (lambda kv, t, d: (kv, t[:-1] + [("output.weight", (8, 0), 0, 160)], d),
                         "expected 1 to 4 dimensions of at least 1"),
    "a row that is not whole blocks": (lambda kv, t, d: (kv, t[:-1] + [("output.weight", (33,), 8, 160)], d),
                                       "is not whole blocks of 32"),
    "no block count": (lambda kv, t, d: ({k: v for k, v in kv.items() if k != "llama.block_count"}, t, d),
                       "no llama.block_count"),
    "five million array items": (lambda kv, t, d: ({**kv, "x.items": [0] * (5 << 20)}, t, d),
                                 "array items in the header; a model to derive from has at most"),
}


@pytest.mark.parametrize("case", sorted(CRAFTED))
def test_a_crafted_parent_is_one_line_and_leaves_nothing(sandbox, case):
    edit, expected = CRAFTED[case]
    parent = _parent(sandbox.work, edit)
    out = sandbox.work / "models" / "drafter.gguf"
    t0 = time.monotonic()
    with pytest.raises(KitError) as e:
        derive_layer_skip(parent, out, 1)
    one_line(e, expected)
    assert time.monotonic() - t0 < 30
    assert not out.parent.exists() or sorted(out.parent.iterdir()) == []  # neither the drafter nor a partial


def test_the_amplifier_is_refused_before_a_byte_is_written(sandbox):
    """The issue's input wrote a 3.1 GB drafter from a 245 KB bundle; now the parent is refused by arithmetic."""
    parent = _parent(sandbox.work, _amplifier)
    assert parent.stat().st_size < 2 * MIB
    with pytest.raises(KitError) as e:
        derive_layer_skip(parent, sandbox.work / "d.gguf", 2)
    one_line(e, "parent.gguf: tensors 'blk.0.t0.weight' and ", "overlap",
             "every tensor of a model file has bytes of its own")
    assert sorted(p.name for p in sandbox.work.iterdir()) == ["parent.gguf"]


def test_an_honest_parent_derives_and_a_wrong_pin_keeps_nothing(sandbox):
    parent = _parent(sandbox.work)
    good = derive_layer_skip(parent, sandbox.work / "a.gguf", 2)
    assert good.stat().st_size <= parent.stat().st_size
    sha = hashlib.sha256(good.read_bytes()).hexdigest()
    assert derive_layer_skip(parent, sandbox.work / "b.gguf", 2, sha).read_bytes() == good.read_bytes()
    with pytest.raises(KitError) as e:
        derive_layer_skip(parent, sandbox.work / "c.gguf", 2, "0" * 64)
    one_line(e, f"the first 2 blocks of parent.gguf have sha256 {sha}, the manifest pins {'0' * 64}",
             "nothing was kept")
    assert sorted(p.name for p in sandbox.work.iterdir()) == ["a.gguf", "b.gguf", "parent.gguf"]


def test_ensure_removes_a_drafter_whose_pin_does_not_match(sandbox):
    """Through the manifest: the parent is a local file here, the drafter's sha256 is pinned wrong."""
    raw = yaml.safe_load(DEMO.read_text())
    folder = sandbox.work / "m"
    models = sandbox.work / "models"
    models.mkdir()
    _parent(models)
    raw["models"] = {"target": {"file": "parent.gguf"},
                     "draft": {"file": "ls.gguf", "derive": {"from": "target", "layer_skip": 1}, "sha256": "0" * 64}}
    raw["strategies"] = [{"id": "baseline", "spec_type": "none"},
                         {"id": "ls", "spec_type": "draft-simple", "draft": "draft"}]
    m = mf.load(write_manifest(folder, yaml.safe_dump(raw)))
    with pytest.raises(KitError) as e:
        md.ensure(m, models, log=lambda s: None)
    one_line(e, "the manifest pins " + "0" * 64, "nothing was kept")
    assert sorted(p.name for p in models.iterdir()) == ["parent.gguf"]


# ---------------------------------------------------------------- the generator


@pytest.mark.parametrize("kind", ["tiny-target", "tiny-dflash2", "tiny-mtp-target"])
def test_a_generated_shape_within_the_schema_but_huge_is_one_line(sandbox, kind):
    raw = copy.deepcopy(yaml.safe_load(DEMO.read_text()))
    raw["models"]["target"] = {"file": "big.gguf", "generate": {"kind": kind, "embed": 8192, "ff": 32768,
                                                                 "layers": 64}}
    m = mf.load(write_manifest(sandbox.work / "m", yaml.safe_dump(raw)))
    with pytest.raises(KitError) as e:
        pl.render(m, sandbox.work / "models")
    one_line(e, "models.target.generate: generate", "68,729M parameters", "the generator makes at most 268M")
    t0 = time.monotonic()
    with pytest.raises(KitError) as e:
        md.ensure(m, sandbox.work / "models", log=lambda s: None, strategies=["baseline"])
    one_line(e, "68,729M parameters (274.9 GB as float32)")
    assert time.monotonic() - t0 < 5 and not (sandbox.work / "models" / "big.gguf").exists()
    with pytest.raises(KitError):
        drafters.write_generated(sandbox.work / "x.gguf", kind, embed=4096, ff=16384, layers=8)
