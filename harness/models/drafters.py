"""Tiny drafters for every speculative type llama-server b11434 runs, built for the demo target.

Each writer is deterministic (same arguments, same bytes) and derives its weights from the demo target's
(`harness.models.ensure`, same seed), so a drafter agrees with its target in part:

- `tiny-dflash2` (arch dflash + conv/selector tensors): a DFlash block is [last token, mask, mask, ...] and the
  mask at position i predicts the token at i in place. Layer 0 moves the last token's embedding into the first
  mask position (self-attention plus the DFlash2 convolution across block positions, which also cancels the
  mask's own embedding); layer 1 is the target's first block, reading the target's layer-0 input (the token
  embeddings) through `fc` as its attention context. Only the first mask knows the token before it, so about
  one draft in a block is right.
- `tiny-dspark` (DFlash body + Markov head): DSpark drafts from the last token's own position first (the
  target's first block, as above), then chains a Markov head holding the target's context-free next-token
  scores (its output head on the previous token's first-block state); a second layer flattens the mask
  positions' own logits so the chain is the head's. Later drafts are right where context matters little.
- `tiny-eagle3` (arch eagle3): EAGLE3 feeds the token after position P together with `fc` of the target's
  states at P. Those states predict the token at P+1, which the target has already chosen, so passing them
  through would draft the wrong position; the drafter ignores them (`attn_norm_2` zero) and runs the target's
  first block on its own cache of tokens, extra heads copying each token's embedding into the residual.
- `tiny-mtp-target` (arch qwen35): a hybrid target (a gated-delta-net layer scaled by `alpha`, then a full
  attention layer) with one NextN block that is the attention layer again, fed the next token's embedding and
  not the trunk's state: `draft-mtp` drafts what the target would say without its `alpha`-scaled first layer.

All drafters borrow the target's token embeddings and output head (no `token_embd`/`output` in the file) and
carry the target's vocabulary, with `<unk>` as DFlash's mask token.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from harness import KitError
from harness.models.generate import (
    CTX,
    EMBED,
    FF,
    HEADS,
    TARGET_LAYERS,
    Vocab,
    _masked_rows,
    _vocab,
    _weights,
    add_vocab,
    check_size,
    finish,
    write_tiny,
)

#: Generator kinds of `harness.models.generate.write_tiny`: a target, its draft-simple draft, a foreign-vocabulary one.
TINY_KINDS = ("tiny-target", "tiny-draft", "tiny-foreign")
#: Generator kinds written here, one per speculative type that needs a file of its own.
DRAFTER_KINDS = ("tiny-dflash2", "tiny-dspark", "tiny-eagle3", "tiny-mtp-target")
KINDS = TINY_KINDS + DRAFTER_KINDS

MASK_TOKEN_ID = 0  # <unk>: the SPM vocabulary has no mask token; DFlash only needs an id its embedding row has
DFLASH_BLOCK = 4  # a block of 4 drafts 3 tokens per step (DFlash) or 4 (DSpark drafts from the anchor too)
DFLASH2_CONV_KERNEL = 2
DFLASH2_CONV_GROUP = 64
DFLASH2_SELECTOR_RANK = 4
DFLASH2_SELECTOR_TOP_K = 4
DSPARK_MARKOV_WEIGHT = 0.5
EAGLE3_TARGET_LAYERS = (0, 2, 3)
COPY_GAIN = 3.0  # q/k gain of the heads that copy a token's own embedding: self-attention wins by ~e^60
MTP_SSM = {"conv_kernel": 4, "state_size": 32, "group_count": 2, "time_step_rank": 2}
RMS_EPS = 1e-5


@dataclass
class GgufParts:
    """A generated model before writing: its architecture, `<arch>.`-relative keys and tensors (numpy order)."""

    arch: str
    name: str
    keys: dict[str, Any]
    tensors: dict[str, np.ndarray]
    mask_token: bool = False


def write_generated(path: Path, kind: str, seed: int = 7, alpha: float = 0.1, **shape: int) -> Path:
    """Write the generated model `kind` to path, deterministically, and return the path.

    kind: one of KINDS. seed and alpha are the demo target's (a drafter is built for the target that
    `write_tiny(..., "tiny-target", seed, alpha, **shape)` writes; for `tiny-mtp-target` they make the target
    itself, alpha scaling its context terms). shape: embed, ff, layers (the target's; defaults 256, 512, 4).
    """
    if kind in TINY_KINDS:
        _check_shape(kind, shape)
        return write_tiny(path, kind, seed, alpha, **shape)
    return write_gguf(path, drafter_parts(kind, seed, alpha, **shape))


def drafter_parts(kind: str, seed: int = 7, alpha: float = 0.1, **shape: int) -> GgufParts:
    """The keys and tensors `write_generated` writes for a drafter kind (a test edits them to craft bad files)."""
    _check_shape(kind, shape)
    builders: dict[str, Callable[..., tuple[str, dict, dict[str, np.ndarray]]]] = {
        "tiny-dflash2": _dflash2, "tiny-dspark": _dspark, "tiny-eagle3": _eagle3, "tiny-mtp-target": _mtp_target}
    if kind not in builders:
        raise KitError(f"models: unknown generator kind {kind!r}; expected one of {list(KINDS)}")
    embed, ff, layers = shape.get("embed", EMBED), shape.get("ff", FF), shape.get("layers", TARGET_LAYERS)
    if embed % HEADS or embed < 64 or ff < 1 or layers < 1:
        raise KitError(f"models: {kind} needs embed a multiple of {HEADS} and at least 64, ff and layers >= 1")
    check_size(kind, embed, ff, layers)
    if kind == "tiny-eagle3" and layers <= max(EAGLE3_TARGET_LAYERS):
        raise KitError(f"models: tiny-eagle3 reads target layers {list(EAGLE3_TARGET_LAYERS)}; the target "
                       f"needs more than {max(EAGLE3_TARGET_LAYERS)} layers, not {layers}")
    arch, keys, tensors = builders[kind](seed, alpha, embed, ff, layers)
    return GgufParts(arch, f"specbench-{kind}", keys, tensors, mask_token=arch == "dflash")


def _check_shape(kind: str, shape: dict[str, int]) -> None:
    unknown = set(shape) - {"embed", "ff", "layers"}
    if unknown:
        raise KitError(f"models: generator kind {kind!r} takes embed, ff, layers, not {sorted(unknown)}")


# ---------------------------------------------------------------- the target's weights, as the drafters see them


def _target(seed: int, alpha: float, embed: int, ff: int, layers: int) -> dict[str, np.ndarray]:
    """The demo target's tensors (numpy order: rows are outputs), exactly as `write_tiny` writes them."""
    vocab = _vocab()
    w = _weights(seed, len(vocab.tokens), layers, alpha, embed, ff)
    out = w["output.weight"].copy()
    out[_masked_rows(vocab)] = 0.0
    w["output.weight"] = out
    return w


def _rms_norm(x: np.ndarray) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + RMS_EPS)


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def _context_free_hidden(t: dict[str, np.ndarray]) -> np.ndarray:
    """Per token, the target's first block without its attention: e + ffn(norm(e)), one row per token."""
    e = t["token_embd.weight"].astype(np.float64)
    x = _rms_norm(e)
    g, u, d = (t[f"blk.0.ffn_{n}.weight"].astype(np.float64) for n in ("gate", "up", "down"))
    return e + (_silu(x @ g.T) * (x @ u.T)) @ d.T


def _neox_from_norm(w: np.ndarray, head_dim: int) -> np.ndarray:
    """Reorder Q/K rows per head so that NeoX rope (pairs i, i+d/2) rotates what llama's rope (pairs 2i, 2i+1)
    rotates: the drafter's attention scores then equal the target's."""
    order = np.concatenate([np.arange(0, head_dim, 2), np.arange(1, head_dim, 2)])
    heads = w.shape[0] // head_dim
    return np.concatenate([w[h * head_dim + order] for h in range(heads)])


def _ones(n: int) -> np.ndarray:
    return np.ones(n, dtype=np.float32)


def _f32(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=np.float32)


# ---------------------------------------------------------------- DFlash2, DSpark


def _dflash_keys(embed: int, ff: int, layers: int, heads: int, target_layers: list[int]) -> dict:
    return {"context_length": CTX, "embedding_length": embed, "block_count": layers, "feed_forward_length": ff,
            "attention.head_count": heads, "attention.head_count_kv": heads,
            "attention.key_length": embed // heads, "attention.value_length": embed // heads,
            "attention.layer_norm_rms_epsilon": RMS_EPS, "rope.dimension_count": embed // heads,
            "target_layers": target_layers, "block_size": DFLASH_BLOCK}


def _block0_replica(t: dict[str, np.ndarray], il: int, embed: int) -> dict[str, np.ndarray]:
    """The target's first block as a DFlash layer: same Q/K (reordered for NeoX rope), V, output, feed-forward."""
    hd = embed // HEADS
    return {
        f"blk.{il}.attn_norm.weight": _ones(embed),
        f"blk.{il}.attn_q.weight": _neox_from_norm(t["blk.0.attn_q.weight"], hd),
        f"blk.{il}.attn_k.weight": _neox_from_norm(t["blk.0.attn_k.weight"], hd),
        f"blk.{il}.attn_v.weight": t["blk.0.attn_v.weight"],
        f"blk.{il}.attn_output.weight": t["blk.0.attn_output.weight"],
        f"blk.{il}.attn_q_norm.weight": _ones(hd),
        f"blk.{il}.attn_k_norm.weight": _ones(hd),
        f"blk.{il}.ffn_norm.weight": _ones(embed),
        f"blk.{il}.ffn_gate.weight": t["blk.0.ffn_gate.weight"],
        f"blk.{il}.ffn_up.weight": t["blk.0.ffn_up.weight"],
        f"blk.{il}.ffn_down.weight": t["blk.0.ffn_down.weight"],
    }


def _conv(embed: int, side0: tuple[float, ...], side1: tuple[float, ...]) -> np.ndarray:
    """A DFlash2 convolution base {E, K, 2}: per side, one weight per tap (tap t reads block position i - t)."""
    base = np.zeros((2, DFLASH2_CONV_KERNEL, embed), dtype=np.float32)
    for side, taps in enumerate((side0, side1)):
        for tap, w in enumerate(taps):
            base[side, tap, :] = w
    return base


def _dflash2(seed: int, alpha: float, embed: int, ff: int, layers: int) -> tuple[str, dict, dict[str, np.ndarray]]:
    t = _target(seed, alpha, embed, ff, layers)
    hd = embed // HEADS
    eye = np.eye(embed, dtype=np.float32)
    mask_rms = float(np.sqrt(np.mean(t["token_embd.weight"][MASK_TOKEN_ID].astype(np.float64) ** 2) + RMS_EPS))
    projected = 2 * DFLASH2_CONV_KERNEL * (embed // DFLASH2_CONV_GROUP)
    w: dict[str, np.ndarray] = {
        "fc.weight": eye,  # target layer 0's input is the token embeddings: the context, as the target saw it
        "enc.output_norm.weight": _ones(embed),
        "output_norm.weight": _ones(embed),
        "selector_predecessor.weight": np.zeros((len(_vocab().tokens), DFLASH2_SELECTOR_RANK), np.float32),
        "selector_successor.weight": np.zeros((len(_vocab().tokens), DFLASH2_SELECTOR_RANK), np.float32),
        "selector_hidden.weight": np.zeros((DFLASH2_SELECTOR_RANK, embed), np.float32),
        # layer 0: every head attends to its own position (large q/k gain) and returns the normalised
        # embedding; the convolution after attention adds the previous position's and subtracts the mask's own
        "blk.0.attn_norm.weight": _ones(embed),
        "blk.0.attn_q.weight": eye, "blk.0.attn_k.weight": eye, "blk.0.attn_v.weight": eye,
        "blk.0.attn_output.weight": eye,
        "blk.0.attn_q_norm.weight": np.full(hd, COPY_GAIN, np.float32),
        "blk.0.attn_k_norm.weight": np.full(hd, COPY_GAIN, np.float32),
        "blk.0.attn_conv_base": _conv(embed, (1.0, 0.0), (-mask_rms, 1.0)),
        "blk.0.ffn_conv_base": _conv(embed, (1.0, 0.0), (1.0, 0.0)),
        "blk.0.ffn_norm.weight": _ones(embed),
        # DFlash reads one feed-forward length for all layers: layer 0's is there, and zero
        "blk.0.ffn_gate.weight": np.zeros((ff, embed), np.float32),
        "blk.0.ffn_up.weight": np.zeros((ff, embed), np.float32),
        "blk.0.ffn_down.weight": np.zeros((embed, ff), np.float32),
        "blk.1.attn_conv_base": _conv(embed, (1.0, 0.0), (1.0, 0.0)),
        "blk.1.ffn_conv_base": _conv(embed, (1.0, 0.0), (1.0, 0.0)),
    }
    for il in (0, 1):
        w[f"blk.{il}.attn_conv_proj.weight"] = np.zeros((projected, embed), np.float32)
        w[f"blk.{il}.ffn_conv_proj.weight"] = np.zeros((projected, embed), np.float32)
    w.update(_block0_replica(t, 1, embed))
    keys = _dflash_keys(embed, ff, 2, HEADS, [0])
    keys.update({"conv_kernel_size": DFLASH2_CONV_KERNEL, "conv_group_size": DFLASH2_CONV_GROUP,
                 "selector_rank": DFLASH2_SELECTOR_RANK, "selector_top_k": DFLASH2_SELECTOR_TOP_K})
    return "dflash", keys, w


def _dspark(seed: int, alpha: float, embed: int, ff: int, layers: int) -> tuple[str, dict, dict[str, np.ndarray]]:
    t = _target(seed, alpha, embed, ff, layers)
    out = t["output.weight"].astype(np.float64)
    cf = _context_free_hidden(t)
    # the Markov head's bias for the token after `prev` is W2 @ W1[prev]: here the target's output head applied
    # to `prev`'s context-free hidden state (rank = width, exact), at a weight below the drafter's own logits
    # so that at the last token's position those (the target's first block, with context) still lead
    w1 = _rms_norm(cf) * np.sqrt(DSPARK_MARKOV_WEIGHT)
    w2 = out * np.sqrt(DSPARK_MARKOV_WEIGHT)
    # layer 1 flattens the mask positions' own logits so the chain is the Markov head's: one feed-forward unit
    # fires on the mask's hidden state and writes the direction the output head maps to the flattest logits
    mask_dir = cf[MASK_TOKEN_ID] / np.linalg.norm(cf[MASK_TOKEN_ID])
    flattest = np.linalg.svd(out, full_matrices=False)[2][-1]
    gate, up, down = (np.zeros((ff, embed)), np.zeros((ff, embed)), np.zeros((embed, ff)))
    gate[0], up[0], down[:, 0] = mask_dir, mask_dir, 2.0 * flattest
    zero_attn = np.zeros((embed, embed), np.float32)
    w: dict[str, np.ndarray] = {
        "fc.weight": np.eye(embed, dtype=np.float32),
        "enc.output_norm.weight": _ones(embed),
        "output_norm.weight": _ones(embed),
        "markov_w1.weight": _f32(w1),
        "markov_w2.weight": _f32(w2),
        "blk.1.attn_norm.weight": _ones(embed),
        "blk.1.attn_q.weight": zero_attn, "blk.1.attn_k.weight": zero_attn, "blk.1.attn_v.weight": zero_attn,
        "blk.1.attn_output.weight": zero_attn,
        "blk.1.attn_q_norm.weight": _ones(embed // HEADS), "blk.1.attn_k_norm.weight": _ones(embed // HEADS),
        "blk.1.ffn_norm.weight": _ones(embed),
        "blk.1.ffn_gate.weight": _f32(gate), "blk.1.ffn_up.weight": _f32(up), "blk.1.ffn_down.weight": _f32(down),
    }
    w.update(_block0_replica(t, 0, embed))
    return "dflash", _dflash_keys(embed, ff, 2, HEADS, [0]), w


# ---------------------------------------------------------------- EAGLE3


def _eagle3(seed: int, alpha: float, embed: int, ff: int, layers: int) -> tuple[str, dict, dict[str, np.ndarray]]:
    t = _target(seed, alpha, embed, ff, layers)
    hd = embed // HEADS
    heads = 2 * HEADS  # heads 0..3: the target's first-block attention; 4..7 copy the token's own embedding
    inner = heads * hd
    wq = np.zeros((inner, 2 * embed), np.float32)
    wk, wv = wq.copy(), wq.copy()
    wo = np.zeros((embed, inner), np.float32)
    half = HEADS * hd
    wq[:half, :embed] = t["blk.0.attn_q.weight"]
    wk[:half, :embed] = t["blk.0.attn_k.weight"]
    wv[:half, :embed] = t["blk.0.attn_v.weight"]
    wo[:, :half] = t["blk.0.attn_output.weight"]
    eye = np.eye(embed, dtype=np.float32)
    wq[half:, :embed] = COPY_GAIN * eye
    wk[half:, :embed] = COPY_GAIN * eye
    wv[half:, :embed] = eye
    wo[:, half:] = eye
    w = {
        "fc.weight": np.zeros((embed, 3 * embed), np.float32),
        "output_norm.weight": _ones(embed),
        "blk.0.attn_norm.weight": _ones(embed),
        "blk.0.attn_norm_2.weight": np.zeros(embed, np.float32),  # the fused target states do not enter
        "blk.0.attn_q.weight": wq, "blk.0.attn_k.weight": wk, "blk.0.attn_v.weight": wv,
        "blk.0.attn_output.weight": wo,
        "blk.0.ffn_norm.weight": _ones(embed),
        "blk.0.ffn_gate.weight": t["blk.0.ffn_gate.weight"],
        "blk.0.ffn_up.weight": t["blk.0.ffn_up.weight"],
        "blk.0.ffn_down.weight": t["blk.0.ffn_down.weight"],
    }
    keys = {"context_length": CTX, "embedding_length": embed, "block_count": 1, "feed_forward_length": ff,
            "attention.head_count": heads, "attention.head_count_kv": heads,
            "attention.key_length": hd, "attention.value_length": hd,
            "attention.layer_norm_rms_epsilon": RMS_EPS, "rope.dimension_count": hd,
            "target_layers": list(EAGLE3_TARGET_LAYERS), "target_hidden_size": embed,
            "norm_before_residual": True}
    return "eagle3", keys, w


# ---------------------------------------------------------------- an MTP-capable hybrid target (qwen35)


def _mtp_target(seed: int, alpha: float, embed: int, ff: int,
                layers: int) -> tuple[str, dict, dict[str, np.ndarray]]:
    del layers  # the hybrid trunk is fixed: one gated-delta-net layer, one attention layer, one NextN block
    vocab = _vocab()
    rng = np.random.default_rng(seed + 5000)

    def mat(rows: int, cols: int, scale: float | None = None) -> np.ndarray:
        s = scale if scale is not None else 1.0 / np.sqrt(cols)
        return (rng.standard_normal((rows, cols)) * s).astype(np.float32)

    hd = embed // HEADS
    n_vocab = len(vocab.tokens)
    d_state, n_group, n_v = MTP_SSM["state_size"], MTP_SSM["group_count"], MTP_SSM["time_step_rank"]
    key_dim, value_dim = d_state * n_group, d_state * n_v
    out = mat(n_vocab, embed, 4.0 / np.sqrt(embed))
    out[_masked_rows(vocab)] = 0.0
    w: dict[str, np.ndarray] = {"token_embd.weight": mat(n_vocab, embed, 1.0), "output_norm.weight": _ones(embed),
                                "output.weight": out}
    a = np.float32(alpha)
    # layer 0: gated delta net (recurrent) and its feed-forward, both scaled by alpha
    w |= {
        "blk.0.attn_norm.weight": _ones(embed), "blk.0.post_attention_norm.weight": _ones(embed),
        "blk.0.attn_qkv.weight": mat(2 * key_dim + value_dim, embed),
        "blk.0.attn_gate.weight": mat(value_dim, embed),
        "blk.0.ssm_conv1d.weight": mat(2 * key_dim + value_dim, MTP_SSM["conv_kernel"], 0.5),
        "blk.0.ssm_dt.bias": np.zeros(n_v, np.float32),
        "blk.0.ssm_a": np.full(n_v, -1.0, np.float32),
        "blk.0.ssm_beta.weight": mat(n_v, embed), "blk.0.ssm_alpha.weight": mat(n_v, embed),
        "blk.0.ssm_norm.weight": _ones(d_state),
        "blk.0.ssm_out.weight": mat(embed, value_dim) * a,
        "blk.0.ffn_gate.weight": mat(ff, embed), "blk.0.ffn_up.weight": mat(ff, embed),
        "blk.0.ffn_down.weight": mat(embed, ff) * a,
    }
    # layer 1: gated full attention and a feed-forward at full strength: the target's main terms
    attn = {"attn_q": mat(2 * HEADS * hd, embed), "attn_k": mat(HEADS * hd, embed), "attn_v": mat(HEADS * hd, embed),
            "attn_output": mat(embed, HEADS * hd), "ffn_gate": mat(ff, embed), "ffn_up": mat(ff, embed),
            "ffn_down": mat(embed, ff)}
    for il in (1, 2):
        w |= {f"blk.{il}.{n}.weight": m for n, m in attn.items()}
        w |= {f"blk.{il}.attn_norm.weight": _ones(embed), f"blk.{il}.post_attention_norm.weight": _ones(embed),
              f"blk.{il}.attn_q_norm.weight": _ones(hd), f"blk.{il}.attn_k_norm.weight": _ones(hd)}
    # layer 2, the NextN block, is layer 1 again: eh_proj keeps the next token's normalised embedding and drops
    # the trunk's state, so the block sees the tokens as layer 1 does, less layer 0's alpha-scaled terms
    eh = np.zeros((embed, 2 * embed), np.float32)
    eh[:, :embed] = np.eye(embed, dtype=np.float32)
    w |= {"blk.2.nextn.eh_proj.weight": eh, "blk.2.nextn.enorm.weight": _ones(embed),
          "blk.2.nextn.hnorm.weight": _ones(embed)}
    keys = {"context_length": CTX, "embedding_length": embed, "block_count": 3, "feed_forward_length": ff,
            "attention.head_count": HEADS, "attention.head_count_kv": HEADS,
            "attention.key_length": hd, "attention.value_length": hd,
            "attention.layer_norm_rms_epsilon": RMS_EPS, "rope.dimension_count": hd,
            "rope.dimension_sections": [hd // 6 + 1, hd // 6 + 1, hd // 2 - 2 * (hd // 6 + 1), 0],
            "ssm.conv_kernel": MTP_SSM["conv_kernel"], "ssm.inner_size": value_dim, "ssm.state_size": d_state,
            "ssm.time_step_rank": n_v, "ssm.group_count": n_group, "full_attention_interval": 2,
            "nextn_predict_layers": 1}
    return "qwen35", keys, w


# ---------------------------------------------------------------- writing


def write_gguf(path: Path, parts: GgufParts, *, vocab: Vocab | None = None) -> Path:
    """Write a GGUF file: `<arch>.<key>` for each key (ints as uint32, int lists as int32 arrays, floats as
    float32, bools), the SPM tokenizer block, then the tensors in a fixed order; atomically, byte-deterministic."""
    import gguf  # heavy import, only when generating

    vocab = vocab or _vocab()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    arch = parts.arch
    writer = gguf.GGUFWriter(str(partial), arch)
    writer.add_name(parts.name)
    for key, value in parts.keys.items():
        full = f"{arch}.{key}"
        if isinstance(value, bool):
            writer.add_bool(full, value)
        elif isinstance(value, int):
            writer.add_uint32(full, value)
        elif isinstance(value, float):
            writer.add_float32(full, value)
        elif isinstance(value, list):
            writer.add_array(full, [int(v) for v in value])
        else:
            raise TypeError(f"{full}: unsupported value {value!r}")
    add_vocab(writer, vocab, MASK_TOKEN_ID if parts.mask_token else None)
    return finish(writer, {n: _f32(parts.tensors[n]) for n in sorted(parts.tensors, key=_tensor_order)}, partial,
                  path)


def _tensor_order(name: str) -> tuple[int, str]:
    if name.startswith("blk."):
        return (1 + int(name.split(".")[1]), name)
    return (0, name)
