"""What one target forward pass reads from memory, from the GGUF headers: the physics check's denominator.

A decode pass of a bandwidth-bound model reads
- the target's weights: every tensor for a dense model; for a mixture of experts the shared tensors plus
  expert_used_count / expert_count of each expert tensor (`*_exps`), since only the routed experts are read;
  the token embedding is a lookup of one row, not a read of the table;
- the KV cache at the pass's context depth: per attention layer, K and V of every earlier token
  (head_count_kv x key_length, and x value_length, at the cache type's bytes per element);
- the draft's weights once per draft step, where a drafter runs: a sequential drafter (draft-simple, EAGLE3,
  MTP's NextN block) once per drafted token, a block drafter (DFlash, DSpark) once per draft call.
Tokens per pass and draft steps come from the server's counts, so the ceiling is bandwidth / these bytes.
This is a lower bound on what a pass reads (activations, the output softmax and the draft's own KV are left
out): a figure above it is impossible, and the baseline's fraction of it shows how tight the bound is."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, TypedDict, cast

from harness import formatter as fm
from harness.intake import spec_types
from harness.models.gguf_facts import ModelFacts

#: Bytes per element of the KV cache types llama-server accepts (-ctk / -ctv), per 32-element block for quants.
KV_TYPE_BYTES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32, "q4_1": 20 / 32,
                 "iq4_nl": 18 / 32, "q5_0": 22 / 32, "q5_1": 24 / 32}


def tensor_block(ggml_type: int) -> tuple[int, int] | None:
    """(elements, bytes) of one block of a ggml type (the gguf package's table); None for a type it does not know."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        return GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    except (ValueError, KeyError):
        return None


def tensor_bytes(shape: tuple[int, ...], ggml_type: int) -> int:
    """Bytes of one tensor's data, from ggml's block sizes (the gguf package's table)."""
    block = tensor_block(ggml_type)
    if block is None:
        return 0
    n = math.prod(shape) if shape else 0
    return n // block[0] * block[1]


@dataclass(frozen=True)
class ModelReads:
    """A model's per-pass facts from its header (recorded in run.json beside the file)."""

    weights_bytes: int  # every tensor's data
    per_pass_bytes: int  # what one pass reads: shared + the routed share of experts, embeddings not counted
    expert_bytes: int
    expert_count: int | None
    expert_used_count: int | None
    nextn_bytes: int  # a NextN (MTP) block's tensors: read once per MTP draft step
    attention_layers: int  # layers with a KV cache
    kv_heads: int | None
    key_length: int | None
    value_length: int | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _int(facts: ModelFacts, name: str) -> int | None:
    v = facts.arch_key(name)
    if isinstance(v, list):  # per-layer arrays (some hybrids): the largest entry is what a full layer holds
        nums = [x for x in v if isinstance(x, int)]
        return max(nums) if nums else None
    return int(v) if isinstance(v, int) and not isinstance(v, bool) else None


def model_reads(facts: ModelFacts) -> ModelReads:
    """Per-pass reads of a model from its GGUF header."""
    total = expert = nextn = embed = 0
    for name, t in facts.tensors.items():
        b = tensor_bytes(t.shape, t.ggml_type)
        total += b
        if "_exps" in name:
            expert += b
        if ".nextn." in name:
            nextn += b
        if name == "token_embd.weight":
            embed = b
    used, count = facts.expert_used_count, facts.expert_count
    routed = expert * used / count if expert and used and count else expert
    heads = _int(facts, "attention.head_count") or 0
    embed_len = facts.embedding_length or 0
    kv_heads = _int(facts, "attention.head_count_kv") or heads or None
    head_dim = embed_len // heads if heads else None
    layers = facts.trunk_layers or 0
    interval = _int(facts, "full_attention_interval")
    attention_layers = layers // interval if interval else layers  # hybrids: one attention layer in `interval`
    # An output tied to the embedding is read whole each pass (it is the output matrix): keep it then.
    tied = "output.weight" not in facts.tensors
    per_pass = total - expert + routed - nextn - (0 if tied else embed)
    return ModelReads(total, int(per_pass), expert, count, used, nextn, attention_layers, kv_heads,
                      _int(facts, "attention.key_length") or head_dim, _int(facts, "attention.value_length")
                      or head_dim)


class PassBytesJson(TypedDict):
    """What one target pass reads, as a physics check's data keeps it (bytes; depth in tokens)."""

    weights: float
    kv: float
    draft: float
    depth: float
    draft_steps: float
    total: float


@dataclass(frozen=True)
class PassBytes:
    weights: float
    kv: float
    draft: float
    depth: float
    draft_steps: float

    @property
    def total(self) -> float:
        return self.weights + self.kv + self.draft

    def as_dict(self) -> PassBytesJson:
        return cast(PassBytesJson, {**asdict(self), "total": self.total})

    def rule(self) -> str:
        """The rule with its figures, in words."""
        parts = [f"weights {fm.num(self.weights / 1e6, 2)} MB"]
        parts.append(f"KV cache at depth {fm.num(self.depth, 0)} {fm.num(self.kv / 1e6, 2)} MB")
        if self.draft:
            parts.append(f"draft {fm.num(self.draft / 1e6, 2)} MB ({fm.fixed(self.draft_steps, 2)} steps/pass)")
        return " + ".join(parts) + f" = {fm.num(self.total / 1e6, 2)} MB per target pass"


def kv_bytes(reads: ModelReads, depth: float, k_type: str = "f16", v_type: str = "f16") -> float:
    """K and V of `depth` earlier tokens over every attention layer."""
    if not reads.attention_layers or not reads.kv_heads or not reads.key_length:
        return 0.0
    per_token = reads.kv_heads * (reads.key_length * KV_TYPE_BYTES.get(k_type, 2.0)
                                  + (reads.value_length or reads.key_length) * KV_TYPE_BYTES.get(v_type, 2.0))
    return reads.attention_layers * per_token * depth


def draft_steps(spec_type: str, draft_n: int, passes: float, calls: int | None = None) -> float:
    """Draft forward steps per target pass: per drafted token for a sequential drafter, per call for a block
    drafter (the server's call count when its log gives one, else one per pass)."""
    if passes <= 0:
        return 0.0
    row = spec_types.find(spec_type)
    drafting = row.drafting if row is not None else None
    if drafting == spec_types.SEQUENTIAL:
        return draft_n / passes
    if drafting == spec_types.BLOCK:
        return (calls / passes) if calls else 1.0
    return 0.0


def nextn_draft(spec_type: str) -> bool:
    """Whether the type drafts with the target's own NextN (MTP) block, whose bytes a pass then reads."""
    row = spec_types.find(spec_type)
    return row is not None and row.mtp_target


def per_pass(target: ModelReads, depth: float, *, k_type: str = "f16", v_type: str = "f16",
             draft: ModelReads | None = None, steps: float = 0.0, mtp: bool = False) -> PassBytes:
    """Bytes one target pass reads at a context depth, with the draft's weights times its steps per pass (for
    MTP the target's own NextN block)."""
    draft_weights = target.nextn_bytes if mtp else (draft.per_pass_bytes if draft else 0)
    return PassBytes(float(target.per_pass_bytes), kv_bytes(target, depth, k_type, v_type),
                     float(draft_weights) * steps, depth, steps)


def cache_types(server_command: list[str]) -> tuple[str, str]:
    """The KV cache types a server command line sets (f16 by default)."""
    k = v = "f16"
    for i, a in enumerate(server_command[:-1]):
        if a in ("-ctk", "--cache-type-k"):
            k = server_command[i + 1]
        elif a in ("-ctv", "--cache-type-v"):
            v = server_command[i + 1]
    return k, v
