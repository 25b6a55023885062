"""Layer-skip drafters derived from a target: the first N blocks with the target's own embeddings, head, norms and
tokenizer, byte-deterministic, per-layer arrays cut, and loaded by the real llama-server as a draft-simple drafter."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from harness import KitError
from harness.hosts.engine import LocalEngine, Mount
from harness.models import generate as gen
from harness.models.derive import derive_layer_skip
from harness.run.server import wait_ready


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _with_per_layer_heads(src: Path, dst: Path) -> Path:
    """The tiny target again, with `llama.attention.head_count_kv` as a per-layer array (as some models carry)."""
    import gguf

    r = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(dst), "llama")
    for f in r.fields.values():
        if f.name == "general.architecture" or f.name.startswith("GGUF."):
            continue
        vtype = f.types[0]
        sub = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        value = f.contents()
        if f.name == "llama.attention.head_count_kv":
            n = r.fields["llama.block_count"].contents()
            value, vtype, sub = [value] * n, gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.UINT32
        w.add_key_value(f.name, value, vtype, sub_type=sub)
    for t in r.tensors:
        w.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for t in r.tensors:
        w.write_tensor_data(t.data)
    w.close()
    return dst


@pytest.fixture(scope="module")
def parent(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("derive")
    return _with_per_layer_heads(gen.write_tiny(d / "plain.gguf", "tiny-target", 7), d / "target.gguf")


def test_layer_skip_keeps_the_first_blocks_and_everything_else(parent, tmp_path):
    import gguf

    out = derive_layer_skip(parent, tmp_path / "ls2.gguf", 2)
    p, d = gguf.GGUFReader(str(parent)), gguf.GGUFReader(str(out))
    assert d.fields["llama.block_count"].contents() == 2
    assert d.fields["llama.attention.head_count_kv"].contents() == [4, 4]  # the per-layer array is cut
    assert d.fields["general.name"].contents().endswith("(first 2 of 4 blocks)")
    same = set(p.fields) - {"llama.block_count", "llama.attention.head_count_kv", "general.name"}
    assert same <= set(d.fields) and len(same) > 15
    for k in same - {"GGUF.tensor_count"}:
        assert d.fields[k].contents() == p.fields[k].contents(), k
    pt, dt = {t.name: t for t in p.tensors}, {t.name: t for t in d.tensors}
    assert set(dt) == {n for n in pt if not n.startswith(("blk.2.", "blk.3."))}
    for name, t in dt.items():
        assert t.tensor_type == pt[name].tensor_type and np.array_equal(np.asarray(t.data), np.asarray(pt[name].data))
    assert not list(tmp_path.glob("*.partial"))


def test_same_parent_and_layers_give_the_same_bytes(parent, tmp_path):
    a = derive_layer_skip(parent, tmp_path / "a.gguf", 1)
    b = derive_layer_skip(parent, tmp_path / "b.gguf", 1)
    c = derive_layer_skip(parent, tmp_path / "c.gguf", 3)
    assert _sha(a) == _sha(b) != _sha(c)


def test_keep_layers_out_of_range_and_a_file_that_is_no_model(parent, tmp_path):
    for n in (0, 4, 9):
        with pytest.raises(KitError, match=r"^keep_layers: expected 1\.\.3 for target\.gguf \(4 blocks\), got "):
            derive_layer_skip(parent, tmp_path / "x.gguf", n)
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all")
    with pytest.raises(KitError, match=r"junk\.gguf: not a GGUF file \(no .GGUF. magic at the start\)$"):
        derive_layer_skip(junk, tmp_path / "y.gguf", 1)
    assert not (tmp_path / "x.gguf").exists() and not (tmp_path / "y.gguf").exists()


@pytest.mark.docker
@pytest.mark.image
def test_llama_server_drafts_with_the_derived_model(parent, tmp_path, demo_image):
    """The real server loads the derived file as -md under draft-simple, drafts with it and accepts drafts."""
    import http.client

    folder = tmp_path / "models"
    folder.mkdir()
    (folder / "target.gguf").write_bytes(parent.read_bytes())
    derive_layer_skip(parent, folder / "ls1.gguf", 1)
    eng = LocalEngine()
    port = eng.free_port()
    cmd = ["llama-server", "-m", "/models/target.gguf", "-md", "/models/ls1.gguf", "--spec-type", "draft-simple",
           "-c", "2048", "-t", "2", "--host", "127.0.0.1", "--port", str(port), "--no-webui"]
    ctr = eng.start_server(demo_image.tag, cmd, [Mount(folder, "/models")], {"specbench.role": "test"})
    try:
        wait_ready(eng, ctr, eng.endpoint(port), 120)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        conn.request("POST", "/completion", json.dumps({"prompt": "the model token draft", "n_predict": 48,
                                                        "temperature": 0, "cache_prompt": False}),
                     {"Content-Type": "application/json"})
        t = json.loads(conn.getresponse().read())["timings"]
        log = eng.logs(ctr, 200)
    finally:
        eng.remove(ctr)
    assert "loading draft model '/models/ls1.gguf'" in log
    assert t["predicted_n"] == 48 and t["draft_n"] > 0 and t["draft_n_accepted"] > 0
