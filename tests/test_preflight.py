"""Pre-flight rules: every generated drafter passes under its own spec type, and each crafted bad file (a real
GGUF file, written from the generators' parts with one thing wrong) gives exactly its one line."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from harness import KitError
from harness.image import build as bd
from harness.intake import manifest as mf
from harness.models import drafters as dr
from harness.models import gguf_facts as gf
from harness.models import preflight as pf
from harness.models.generate import _vocab, write_tiny
from tests.conftest import DEMO

ALL = {f: True for f in pf.FLAVOURS}
_serial = itertools.count()


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("preflight")
    write_tiny(d / "target.gguf", "tiny-target", 7, 0.1)
    write_tiny(d / "draft.gguf", "tiny-draft", 7, 0.1)
    write_tiny(d / "foreign.gguf", "tiny-foreign", 7, 0.1)
    for kind in dr.DRAFTER_KINDS:
        dr.write_generated(d / f"{kind}.gguf", kind, 7, 0.3 if kind == "tiny-mtp-target" else 0.1)
    return d


def facts(folder: Path, name: str) -> gf.ModelFacts:
    return gf.read_facts(folder / f"{name}.gguf")


def crafted(folder: Path, kind: str, edit, *, vocab=None, **shape) -> gf.ModelFacts:
    """A generated model with one thing changed by `edit(parts)`, written and read back."""
    parts = dr.drafter_parts(kind, 7, 0.1, **shape)
    edit(parts)
    return gf.read_facts(dr.write_gguf(folder / f"{kind}-{next(_serial)}.gguf", parts, vocab=vocab))


def one_line(problems: list[str], key: str, *needles: str) -> str:
    assert len(problems) == 1, problems
    line = problems[0]
    assert "\n" not in line and line.startswith(f"models.{key} (") and "; expected " in line
    for n in needles:
        assert n in line, line
    return line


@pytest.mark.parametrize("spec, target, draft", [
    ("draft-dflash", "target", "tiny-dflash2"),
    ("draft-dspark", "target", "tiny-dspark"),
    ("draft-eagle3", "target", "tiny-eagle3"),
    ("draft-mtp", "tiny-mtp-target", None),
    ("draft-simple", "target", "draft"),
    ("ngram-map-k", "target", None),
    ("none", "target", None),
])
def test_generated_files_pass_under_their_type(folder, spec, target, draft):
    d = facts(folder, draft) if draft else None
    assert pf.check(spec, facts(folder, target), d, ALL) == []
    assert pf.check(spec, facts(folder, target), d, [f for f in pf.FLAVOURS]) == []


def test_a_draft_where_one_is_needed_and_none_where_not(folder):
    t = facts(folder, "target")
    assert pf.check("draft-dflash", t, None, ALL) == [
        "models.draft: no draft file given; spec type draft-dflash reads one (-md)"]
    one_line(pf.check("ngram-mod", t, facts(folder, "draft"), ALL), "draft", "takes no -md file")


def test_architecture_vs_spec_type(folder):
    t = facts(folder, "target")
    one_line(pf.check("draft-dflash", t, facts(folder, "draft"), ALL), "draft", "architecture llama",
             "a dflash drafter")
    one_line(pf.check("draft-simple", t, facts(folder, "tiny-eagle3"), ALL), "draft", "architecture eagle3",
             "draft-eagle3")
    one_line(pf.check("draft-mtp", t, None, ALL), "target", "no NextN layers", "MTP/NextN")
    one_line(pf.check("none", facts(folder, "tiny-dflash2"), None, ALL), "target", "(a drafter)")


def test_nextn_layers_without_their_tensors(folder):
    def drop_nextn(p):
        for n in [n for n in p.tensors if ".nextn." in n]:
            del p.tensors[n]

    t = crafted(folder, "tiny-mtp-target", drop_nextn)
    one_line(pf.check("draft-mtp", t, None, ALL), "target", "no blk.N.nextn.* tensors")


def test_dflash_flavour_vs_the_image(folder):
    """A DFlash2 file in a build that does not know DFlash2: the study's 81 vs 58 tensors, from a 5-layer file."""
    def five_layers(p):
        for il in range(2, 5):
            for n in [n for n in p.tensors if n.startswith("blk.1.")]:
                p.tensors[n.replace("blk.1.", f"blk.{il}.")] = p.tensors[n]
        p.keys["block_count"] = 5

    d = crafted(folder, "tiny-dflash2", five_layers)
    assert d.tensor_count == 81
    assert pf.check("draft-dflash", facts(folder, "target"), d, ALL) == []
    line = one_line(pf.check("draft-dflash", facts(folder, "target"), d, {"dflash1", "dspark", "eagle3", "mtp"}),
                    "draft", "a dflash2 drafter", "'wrong number of tensors; expected 81, got 58'",
                    "dflash1, dspark, eagle3, mtp")
    assert "dflash2" not in line.split("expected ")[-1]
    one_line(pf.check("draft-dspark", facts(folder, "target"), facts(folder, "tiny-dspark"), {"dflash1"}),
             "draft", "a dspark drafter", "expected 27, got 25")
    one_line(pf.check("draft-eagle3", facts(folder, "target"), facts(folder, "tiny-eagle3"), {"dflash1"}),
             "draft", "unknown model architecture: 'eagle3'")
    one_line(pf.check("draft-mtp", facts(folder, "tiny-mtp-target"), None, {"dflash1"}), "target", "draft-mtp")


def test_tensor_count_vs_what_the_loader_creates(folder):
    def extra(p):
        p.tensors["blk.0.extra_gate.weight"] = np.zeros(256, np.float32)

    d = crafted(folder, "tiny-dflash2", extra)
    # the real server says exactly this (tests/data/serverlogs/fail-extra-tensor.log)
    one_line(pf.check("draft-dflash", facts(folder, "target"), d, ALL), "draft", "blk.0.extra_gate.weight",
             "'wrong number of tensors; expected 37, got 36'")


def test_width_vs_the_target(folder):
    t = facts(folder, "target")
    one_line(pf.check("draft-dflash", t, crafted(folder, "tiny-dflash2", lambda p: None, embed=128), ALL),
             "draft", "embedding_length 128", "the target's 256")

    def hidden128(p):
        p.keys["target_hidden_size"] = 128

    one_line(pf.check("draft-eagle3", t, crafted(folder, "tiny-eagle3", hidden128), ALL), "draft",
             "eagle3.target_hidden_size 128", "embedding_length 256")


def test_target_layers_within_the_target(folder):
    def layer7(p):
        p.keys["target_layers"] = [0, 7]

    one_line(pf.check("draft-dflash", facts(folder, "target"), crafted(folder, "tiny-dflash2", layer7), ALL),
             "draft", "dflash.target_layers [0, 7]", "ids 0..3")

    def layer4(p):
        p.keys["target_layers"] = [0, 2, 4]  # 4 = the target's output state: fine for EAGLE3, not 5

    assert pf.check("draft-eagle3", facts(folder, "target"), crafted(folder, "tiny-eagle3", layer4), ALL) == []


def test_eagle3_needs_three_target_layers(folder):
    def two(p):
        p.keys["target_layers"] = [0, 3]

    one_line(pf.check("draft-eagle3", facts(folder, "target"), crafted(folder, "tiny-eagle3", two), ALL),
             "draft", "2 eagle3.target_layers [0, 3]", "exactly 3")


def test_dflash_needs_a_mask_token(folder):
    def no_mask(p):
        p.mask_token = False

    one_line(pf.check("draft-dflash", facts(folder, "target"), crafted(folder, "tiny-dflash2", no_mask), ALL),
             "draft", "no tokenizer.ggml.mask_token_id", "mask token")


def test_draft_vocabulary_vs_the_target(folder):
    t = facts(folder, "target")
    one_line(pf.check("draft-simple", t, facts(folder, "foreign"), ALL), "draft", "vocabulary of 619 tokens",
             "the target's 419 tokens")
    d = crafted(folder, "tiny-dflash2", lambda p: None, vocab=_vocab(foreign=True))
    one_line(pf.check("draft-dflash", t, d, ALL), "draft", "vocabulary", "token ids must mean the same")


def test_a_file_under_the_other_dflash_type_would_be_mislabelled(folder):
    t = facts(folder, "target")
    one_line(pf.check("draft-dflash", t, facts(folder, "tiny-dspark"), ALL), "draft",
             "a dspark file under spec type draft-dflash", "spec type draft-dspark")
    one_line(pf.check("draft-dspark", t, facts(folder, "tiny-dflash2"), ALL), "draft",
             "a dflash2 file under spec type draft-dspark", "spec type draft-dflash")


def test_missing_required_keys(folder):
    def no_conv(p):
        for k in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"):
            del p.keys[k]

    one_line(pf.check("draft-dflash", facts(folder, "target"), crafted(folder, "tiny-dflash2", no_conv), ALL),
             "draft", "missing dflash.conv_kernel_size, dflash.conv_group_size, dflash.selector_rank, "
                      "dflash.selector_top_k", "dflash2 file")

    def no_block_size(p):
        del p.keys["block_size"]

    one_line(pf.check("draft-dspark", facts(folder, "target"), crafted(folder, "tiny-dspark", no_block_size), ALL),
             "draft", "missing dflash.block_size")


def test_dflash2_geometry(folder):
    def group96(p):
        p.keys["conv_group_size"] = 96

    one_line(pf.check("draft-dflash", facts(folder, "target"), crafted(folder, "tiny-dflash2", group96), ALL),
             "draft", "conv_group_size 96", "divisible")

    def top16(p):
        p.keys["selector_top_k"] = 16

    one_line(pf.check("draft-dflash", facts(folder, "target"), crafted(folder, "tiny-dflash2", top16), ALL),
             "draft", "selector_top_k 16", "272")


def test_keys_name_the_manifest_entries(folder):
    got = pf.check("draft-dflash", facts(folder, "target"), facts(folder, "draft"), ALL, target_key="qwen",
                   draft_key="dflash2")
    assert got[0].startswith(f"models.dflash2 ({folder / 'draft.gguf'}): ")


def test_supported_flavours_of_the_pinned_tree():
    tree = bd.resolve_source(mf.load(DEMO), log=lambda s: None).path
    assert pf.supported_flavours(tree) == ALL
    assert pf.flavour_label(pf.supported_flavours(tree)) == "dflash1,dflash2,dspark,eagle3,mtp"


def test_supported_flavours_of_an_older_tree(tmp_path):
    """A tree whose DFlash loader predates DFlash2 and DSpark (no selector_hidden, no markov head)."""
    (tmp_path / "src" / "models").mkdir(parents=True)
    (tmp_path / "common").mkdir()
    (tmp_path / "src" / "llama-arch.cpp").write_text('{ LLM_ARCH_DFLASH, "dflash" },\n{ LLM_ARCH_EAGLE3, "eagle3" },')
    (tmp_path / "src" / "models" / "dflash.cpp").write_text("fc = create_tensor(tn(LLM_TENSOR_FC, \"weight\"));")
    (tmp_path / "common" / "speculative.cpp").write_text('{"draft-dflash", COMMON_SPECULATIVE_TYPE_DRAFT_DFLASH},')
    got = pf.supported_flavours(tmp_path)
    assert got == {"dflash1": True, "dflash2": False, "dspark": False, "eagle3": True, "mtp": False}
    with pytest.raises(KitError, match="not a llama.cpp source tree"):
        pf.supported_flavours(tmp_path / "common")
