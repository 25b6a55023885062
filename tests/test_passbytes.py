"""What one target pass reads: dense, mixture of experts, the KV cache at depth, a draft's steps, and the
physics check built on it."""

from __future__ import annotations

import pytest

from harness.analysis import checks
from harness.models import generate, gguf_facts, passbytes
from harness.models.gguf_facts import ModelFacts, TensorInfo

F32, F16, Q8_0 = 0, 1, 8


def facts(arch: str, kv: dict, tensors: dict[str, tuple[tuple[int, ...], int]]) -> ModelFacts:
    return ModelFacts("x.gguf", 3, {"general.architecture": arch, **{f"{arch}.{k}": v for k, v in kv.items()}},
                      {n: TensorInfo(s, t) for n, (s, t) in tensors.items()}, 1000)


def test_dense_pass_reads_every_weight_but_the_embedding_table():
    f = facts("llama", {"block_count": 2, "embedding_length": 64, "attention.head_count": 4,
                        "attention.head_count_kv": 2},
              {"token_embd.weight": ((64, 1000), F32), "output.weight": ((64, 1000), F16),
               "blk.0.attn_q.weight": ((64, 64), F16), "blk.1.attn_q.weight": ((64, 64), Q8_0)})
    r = passbytes.model_reads(f)
    emb, out, q0, q1 = 64 * 1000 * 4, 64 * 1000 * 2, 64 * 64 * 2, 64 * 64 // 32 * 34
    assert r.weights_bytes == emb + out + q0 + q1
    assert r.per_pass_bytes == out + q0 + q1  # the embedding is a row lookup
    assert (r.attention_layers, r.kv_heads, r.key_length) == (2, 2, 16)


def test_tied_output_is_read_whole():
    f = facts("llama", {"block_count": 1, "embedding_length": 64, "attention.head_count": 4},
              {"token_embd.weight": ((64, 1000), F16), "blk.0.attn_q.weight": ((64, 64), F16)})
    assert passbytes.model_reads(f).per_pass_bytes == 64 * 1000 * 2 + 64 * 64 * 2


def test_mixture_of_experts_reads_shared_weights_and_the_routed_share():
    f = facts("qwen3moe", {"block_count": 1, "embedding_length": 64, "attention.head_count": 4,
                           "expert_count": 8, "expert_used_count": 2},
              {"token_embd.weight": ((64, 100), F16), "output.weight": ((64, 100), F16),
               "blk.0.attn_q.weight": ((64, 64), F16), "blk.0.ffn_gate_exps.weight": ((64, 128, 8), F16),
               "blk.0.ffn_up_exps.weight": ((64, 128, 8), F16)})
    r = passbytes.model_reads(f)
    experts = 2 * 64 * 128 * 8 * 2
    shared = 64 * 100 * 2 + 64 * 64 * 2
    assert r.expert_bytes == experts and (r.expert_count, r.expert_used_count) == (8, 2)
    assert r.per_pass_bytes == shared + experts * 2 // 8
    assert r.per_pass_bytes < r.weights_bytes / 2


def test_kv_cache_at_depth_and_cache_types():
    f = facts("llama", {"block_count": 4, "embedding_length": 256, "attention.head_count": 4},
              {"output.weight": ((256, 10), F32)})
    r = passbytes.model_reads(f)
    # 4 layers x 4 kv heads x 64 dims x (K + V) x 2 bytes = 4096 bytes per token
    assert passbytes.kv_bytes(r, 1000) == 4096 * 1000
    assert passbytes.kv_bytes(r, 1000, "q8_0", "q8_0") == pytest.approx(4096 * 1000 * 34 / 32 / 2)
    assert passbytes.cache_types(["llama-server", "-ctk", "q8_0", "--cache-type-v", "q4_0"]) == ("q8_0", "q4_0")
    hybrid = facts("qwen35", {"block_count": 4, "embedding_length": 256, "attention.head_count": 4,
                              "full_attention_interval": 2}, {"output.weight": ((256, 10), F32)})
    assert passbytes.model_reads(hybrid).attention_layers == 2  # the recurrent layers keep no KV cache


def test_draft_steps_and_a_pass_with_a_draft():
    assert passbytes.draft_steps("draft-simple", draft_n=90, passes=30) == 3.0
    assert passbytes.draft_steps("draft-dflash", draft_n=90, passes=30) == 1.0
    assert passbytes.draft_steps("draft-dflash", draft_n=90, passes=30, calls=15) == 0.5
    assert passbytes.draft_steps("ngram-mod", draft_n=90, passes=30) == 0.0
    target = passbytes.ModelReads(1000, 900, 0, None, None, 0, 2, 2, 16, 16)
    draft = passbytes.ModelReads(120, 100, 0, None, None, 0, 1, 2, 16, 16)
    pb = passbytes.per_pass(target, 10, draft=draft, steps=3.0)
    assert pb.weights == 900 and pb.draft == 300 and pb.kv == 2 * 2 * (16 * 2 + 16 * 2) * 10
    assert pb.total == 900 + 300 + pb.kv and "3.00 steps/pass" in pb.rule()
    mtp = passbytes.ModelReads(1000, 800, 0, None, None, 150, 1, 2, 16, 16)
    assert passbytes.per_pass(mtp, 0, steps=2.0, mtp=True).draft == 300


def test_physics_ceiling_uses_bytes_per_pass(tmp_path):
    r = passbytes.model_reads(gguf_facts.read_facts(generate.write_tiny(tmp_path / "t.gguf", "tiny-target", 7)))
    pb = passbytes.per_pass(r, 2000)
    ok = checks.physics(10.0, None, 1.0, r.weights_bytes, True, "measured", pb.as_dict(), pb.rule())
    assert not ok.flagged and ok.data["bytes_per_pass"] == round(pb.total)
    assert ok.data["ceiling_passes_s"] == pytest.approx(1e9 / pb.total, rel=1e-3)
    # the same figure against weights alone would have a higher ceiling: the KV read makes the bound tighter
    loose = checks.physics(10.0, None, 1.0, r.weights_bytes, True)
    assert loose.data["ceiling_passes_s"] > ok.data["ceiling_passes_s"]
    bad = checks.physics(1e9 / pb.total * 1.5, None, 1.0, r.weights_bytes, True, "measured", pb.as_dict(), pb.rule())
    assert bad.flagged and "physically impossible" in bad.sentence and "KV cache at depth 2,000" in bad.sentence
