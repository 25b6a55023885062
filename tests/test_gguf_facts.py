"""GGUF header facts: the stream parser agrees with the gguf package's reader on real generated files, reads
byte prefixes (saying how much more it needs), and refuses hostile headers with one line."""

from __future__ import annotations

import hashlib
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness import KitError
from harness.models import gguf_facts as gf
from harness.models.drafters import write_generated
from harness.models.generate import _vocab

KINDS = {"tiny-target": 0.1, "tiny-dflash2": 0.1, "tiny-dspark": 0.1, "tiny-eagle3": 0.1, "tiny-mtp-target": 0.3}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("facts")
    return {k: write_generated(d / f"{k}.gguf", k, 7, a) for k, a in KINDS.items()}


def _reader_value(field):
    """A GGUFReader field's value as plain Python (strings decoded, arrays as lists)."""
    import gguf

    if field.types and field.types[0] == gguf.GGUFValueType.ARRAY:
        if field.types[-1] == gguf.GGUFValueType.STRING:
            return [bytes(field.parts[i]).decode() for i in field.data]
        return [field.parts[i].tolist()[0] for i in field.data]
    if field.types[0] == gguf.GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]).decode()
    return field.parts[field.data[0]].tolist()[0]


@pytest.mark.parametrize("kind", list(KINDS))
def test_agrees_with_gguf_reader(files, kind):
    import gguf

    facts = gf.read_facts(files[kind])
    reader = gguf.GGUFReader(files[kind])
    assert set(facts.tensors) == {t.name for t in reader.tensors}
    for t in reader.tensors:
        assert facts.tensors[t.name].shape == tuple(int(x) for x in t.shape)
        assert facts.tensors[t.name].ggml_type == int(t.tensor_type)
    for name, field in reader.fields.items():
        if name.startswith("GGUF."):
            continue
        want = _reader_value(field)
        got = facts.kv[name]
        if isinstance(want, list) and len(want) > gf.KEEP_ARRAY_ITEMS:
            assert got == {"array_of": facts.kv_types[name][6:-1], "length": len(want)}
        elif isinstance(want, float):
            assert got == pytest.approx(want)
        elif isinstance(want, list) and want and isinstance(want[0], float):
            assert got == pytest.approx(want)
        else:
            assert got == want, name
    # the header ends where the reader's first tensor data begins (less alignment padding)
    assert facts.header_bytes <= min(t.data_offset for t in reader.tensors) < facts.header_bytes + 32


def test_derived_facts(files):
    t, d2, ds, e3, mtp = (gf.read_facts(files[k]) for k in KINDS)
    assert (t.architecture, t.block_count, t.embedding_length, t.trunk_layers) == ("llama", 4, 256, 4)
    assert (d2.architecture, d2.dflash_flavour, d2.target_layers, d2.mask_token_id) == ("dflash", "dflash2", [0], 0)
    assert ds.dflash_flavour == "dspark" and ds.arch_key("block_size") == 4
    assert (e3.architecture, e3.target_layers, e3.target_hidden_size) == ("eagle3", [0, 2, 3], 256)
    assert (mtp.architecture, mtp.block_count, mtp.nextn_predict_layers, mtp.trunk_layers) == ("qwen35", 3, 1, 2)
    assert mtp.has_nextn_tensors and not t.has_nextn_tensors
    assert t.expert_count is None and t.dflash_flavour is None
    tokens = _vocab().tokens
    h = hashlib.sha256(b"".join(len(x.encode()).to_bytes(4, "little") + x.encode() for x in tokens)).hexdigest()
    assert {f.vocab_sha256 for f in (t, d2, ds, e3, mtp)} == {h}
    assert t.vocab_size == len(tokens)
    assert t.to_dict()["vocab_sha256"] == h and d2.to_dict()["dflash_flavour"] == "dflash2"


def test_prefix_reads_only_the_header(files):
    data = files["tiny-dflash2"].read_bytes()
    whole = gf.read_facts(files["tiny-dflash2"])
    part = gf.facts_from_prefix(data[:whole.header_bytes], "remote:/m/d.gguf")
    assert part.tensors == whole.tensors and part.kv == whole.kv and part.source == "remote:/m/d.gguf"


def test_short_prefix_says_what_it_needs_and_converges(files):
    data = files["tiny-target"].read_bytes()
    header = gf.read_facts(files["tiny-target"]).header_bytes
    have, rounds = 64, 0
    while True:
        try:
            facts = gf.facts_from_prefix(data[:have], "remote")
            break
        except gf.HeaderIncomplete as e:
            assert e.have <= have < e.needed <= header  # a lower bound, never past the real header
            assert "remote" in str(e) and str(e.needed) in str(e) and "\n" not in str(e)
            have, rounds = e.needed, rounds + 1
    assert facts.header_bytes == header and rounds >= 2


def _header(n_tensors=0, n_kv=1, version=3, magic=b"GGUF") -> bytes:
    return magic + struct.pack("<IQQ", version, n_tensors, n_kv)


def _str(s: bytes) -> bytes:
    return struct.pack("<Q", len(s)) + s


@pytest.mark.parametrize("data, says", [
    (b"GGML" + b"\0" * 20, "not a GGUF file"),
    (_header(version=7), "GGUF version 7"),
    (_header(n_tensors=1 << 40), "claims 1099511627776 tensors"),
    (_header(n_kv=1 << 30), "key/value pairs"),
    (_header() + struct.pack("<Q", 1 << 40), "string bytes"),
    (_header() + _str(b"k") + struct.pack("<I", 99), "unknown GGUF value type 99"),
    (_header() + _str(b"k") + struct.pack("<IIQ", 9, 8, 1 << 40), "array items"),
    (_header() + _str(b"k") + struct.pack("<IIQ", 9, 9, 1), "arrays of arrays"),
    (_header(n_tensors=1, n_kv=0) + _str(b"t") + struct.pack("<I", 9), "9 dimensions"),
    (_header(n_tensors=1, n_kv=0) + _str(b"t") + struct.pack("<IQ", 1, 1 << 63) + struct.pack("<IQ", 0, 0),
     "impossible shape"),
    (_header(n_tensors=2, n_kv=0) + (_str(b"t") + struct.pack("<IQIQ", 1, 4, 0, 0)) * 2, "appears twice"),
])
def test_hostile_headers_are_refused_in_one_line(data, says):
    with pytest.raises(KitError) as e:
        gf.facts_from_prefix(data + b"\0" * 64, "evil.gguf")
    assert says in str(e.value) and "evil.gguf" in str(e.value) and "\n" not in str(e.value)


def test_local_file_cut_short_is_an_error_not_incomplete(tmp_path, files):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(files["tiny-eagle3"].read_bytes()[:3000])
    with pytest.raises(KitError) as e:
        gf.read_facts(cut)
    assert not isinstance(e.value, gf.HeaderIncomplete) and "file ends inside the GGUF header" in str(e.value)
    with pytest.raises(KitError, match="cannot read"):
        gf.read_facts(tmp_path / "missing.gguf")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(0, 12_500), flips=st.lists(st.tuples(st.integers(0, 12_500), st.integers(0, 255)),
                                                   max_size=4))
def test_fuzzed_headers_fail_only_with_kit_errors(files, cut, flips):
    raw = bytearray(files["tiny-dspark"].read_bytes()[:12_600])
    for pos, byte in flips:
        raw[pos] = byte
    try:
        facts = gf.facts_from_prefix(bytes(raw[:cut]), "fuzz")
    except KitError:
        return
    assert facts.tensor_count <= gf.MAX_TENSORS and np.isfinite(facts.header_bytes)


def test_reading_by_prefix_asks_for_more_until_the_header_fits(files):
    data = files["tiny-target"].read_bytes()
    asked: list[int] = []

    def head(n: int) -> bytes:  # what `head -c n` over SSH returns
        asked.append(n)
        return data[:n]

    facts = gf.facts_from_reader(head, "host:/m/t.gguf", first=1024)
    assert facts.tensors == gf.read_facts(files["tiny-target"]).tensors
    assert asked[0] == 1024 and all(b >= 2 * a for a, b in zip(asked, asked[1:], strict=False)) and len(asked) < 6
    with pytest.raises(KitError, match="larger than 4096 bytes"):
        gf.facts_from_reader(head, "host:/m/t.gguf", first=1024, max_bytes=4096)
    with pytest.raises(KitError, match="file ends inside the GGUF header"):
        gf.facts_from_reader(lambda n: data[:500], "host:/m/cut.gguf", first=1024)
