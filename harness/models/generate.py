"""The demo's tiny generated GGUF models: llama-architecture files written with the `gguf` package from a seed,
byte for byte the same every time, so their sha256 can be pinned in a manifest. The target has 4 blocks; its draft
is the target's embeddings, first block and output head alone, and the target's later blocks are scaled by
`alpha`, so the draft approximates the target and a speculative strategy accepts a share of its drafts (smaller
alpha, higher acceptance). A "foreign" draft has a different vocabulary: a server refuses it. Drafters of the
other speculative types are built on these in harness/models/drafters.py."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from harness import KitError
from harness import formatter as fm

TARGET_LAYERS = 4
EMBED = 256
FF = 512
HEADS = 4
CTX = 16384
#: The largest generated target: 256M parameters, 1 GiB as float32 (the fidelity bench's heavier model has ~100M);
#: the schema alone allows ~69G (embed 8192, ff 32768, 64 layers), which would exhaust any machine's memory.
MAX_PARAMETERS = 256 << 20
_VOCAB_ROWS = 512  # above the tiny vocabularies' size (a bound for the arithmetic)


def parameter_count(embed: int = EMBED, ff: int = FF, layers: int = TARGET_LAYERS) -> int:
    """Parameters of a generated target of this shape: embeddings and output head, and per block four attention
    matrices and three feed-forward ones (the drafters built on it are smaller)."""
    return 2 * _VOCAB_ROWS * embed + layers * (4 * embed * embed + 3 * embed * ff + 2 * embed)


def check_size(kind: str, embed: int = EMBED, ff: int = FF, layers: int = TARGET_LAYERS) -> None:
    """Refuse, before anything is allocated, a shape whose target exceeds MAX_PARAMETERS."""
    n = parameter_count(embed, ff, layers)
    if n > MAX_PARAMETERS:
        raise KitError(f"models: generate {kind} with embed {embed}, ff {ff}, layers {layers} makes a target of "
                       f"{fm.num(n / 1e6, 0)}M parameters ({fm.num(4 * n / 1e9, 1)} GB as float32); the generator "
                       f"makes at most {fm.num(MAX_PARAMETERS / 1e6, 0)}M (a tiny model for tests and demos)")

#: Word pieces of the tiny vocabulary (SentencePiece style, U+2581 marks a leading space).
_WORDS = (
    "the of and to in is that for it as with was on be by at this are from or an have not but had "
    "his they you which one were all we there can her has been if more when will would who so no "
    "def return import class self if else for in while print json code data value key name list "
    "model token draft speed test file time run cache server prompt output input result error"
).split()


@dataclass(frozen=True)
class Vocab:
    tokens: list[str]
    scores: list[float]
    types: list[int]


def _vocab(foreign: bool = False) -> Vocab:
    """<unk> <s> </s>, the 256 byte tokens, then word pieces; the foreign vocabulary orders them differently."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    scores = [0.0, 0.0, 0.0] + [0.0] * 256
    types = [2, 3, 3] + [6] * 256  # unknown, control, control, byte
    pieces = []
    for ch in "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,:;!?()[]{}\"'=-_+*/#":
        pieces.append(ch)
    pieces.append("\u2581")
    for w in _WORDS:
        pieces.append("\u2581" + w)
    pieces = list(dict.fromkeys(pieces))
    if foreign:
        pieces = list(reversed(pieces)) + ["\u2581foreign" + str(i) for i in range(200)]
    for i, p in enumerate(pieces):
        tokens.append(p)
        scores.append(-float(i))
        types.append(1)
    return Vocab(tokens, scores, types)


def _masked_rows(vocab: Vocab) -> list[int]:
    """Output rows zeroed so greedy decoding never picks them: control tokens and non-printable bytes."""
    rows = [0, 1, 2]
    for i, t in enumerate(vocab.tokens):
        if t.startswith("<0x"):
            b = int(t[3:5], 16)
            if b < 0x20 or b >= 0x7F:
                rows.append(i)
    return rows


def _weights(seed: int, n_vocab: int, layers: int, alpha: float, embed: int = EMBED,
             ff: int = FF) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)

    def mat(rows: int, cols: int, scale: float | None = None) -> np.ndarray:
        s = scale if scale is not None else 1.0 / np.sqrt(cols)
        return (rng.standard_normal((rows, cols)) * s).astype(np.float32)

    w: dict[str, np.ndarray] = {
        "token_embd.weight": mat(n_vocab, embed, 1.0),
        "output_norm.weight": np.ones(embed, dtype=np.float32),
        "output.weight": mat(n_vocab, embed, 4.0 / np.sqrt(embed)),
    }
    for i in range(layers):
        scale = 1.0 if i == 0 else alpha
        w[f"blk.{i}.attn_norm.weight"] = np.ones(embed, dtype=np.float32)
        w[f"blk.{i}.attn_q.weight"] = mat(embed, embed)
        w[f"blk.{i}.attn_k.weight"] = mat(embed, embed)
        w[f"blk.{i}.attn_v.weight"] = mat(embed, embed)
        w[f"blk.{i}.attn_output.weight"] = mat(embed, embed) * np.float32(scale)
        w[f"blk.{i}.ffn_norm.weight"] = np.ones(embed, dtype=np.float32)
        w[f"blk.{i}.ffn_gate.weight"] = mat(ff, embed)
        w[f"blk.{i}.ffn_up.weight"] = mat(ff, embed)
        w[f"blk.{i}.ffn_down.weight"] = mat(embed, ff) * np.float32(scale)
    return w


def write_tiny(path: Path, kind: str, seed: int = 7, alpha: float = 0.1, *, embed: int = EMBED, ff: int = FF,
               layers: int = TARGET_LAYERS) -> Path:
    """Write one tiny GGUF model ('tiny-target', 'tiny-draft' or 'tiny-foreign') to path, deterministically.

    The defaults make the demo's pinned files; a wider or deeper target (the fidelity bench's heavier model,
    slower per token) comes from the embed, ff and layers keywords."""
    import gguf  # heavy import, only when generating

    if kind not in ("tiny-target", "tiny-draft", "tiny-foreign"):
        raise KitError(f"models: unknown generator kind {kind!r}")
    vocab = _vocab(foreign=kind == "tiny-foreign")
    n_vocab = len(vocab.tokens)
    if embed % HEADS or embed < HEADS or ff < 1 or layers < 1:
        raise KitError(f"models: embed must be a multiple of {HEADS}, ff and layers at least 1")
    check_size(kind, embed, ff, layers)
    w = _weights(seed, len(_vocab().tokens), layers, alpha, embed, ff)
    if kind == "tiny-foreign":
        w = _weights(seed + 1000, n_vocab, 1, 1.0, embed, ff)
    layers = layers if kind == "tiny-target" else 1
    keep = {k: v for k, v in w.items() if not k.startswith("blk.") or int(k.split(".")[1]) < layers}
    out = keep["output.weight"].copy()
    out[_masked_rows(vocab)] = 0.0
    keep["output.weight"] = out

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    writer = gguf.GGUFWriter(str(partial), "llama")
    writer.add_name(f"specbench-{kind}")
    writer.add_context_length(CTX)
    writer.add_embedding_length(embed)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(ff)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(embed // HEADS)
    add_vocab(writer, vocab)
    return finish(writer, {n: keep[n] for n in sorted(keep, key=_tensor_order)}, partial, path)


def add_vocab(writer, vocab: Vocab, mask_token_id: int | None = None) -> None:
    """The file type and the SPM tokenizer block of every generated model, in this order: the files' bytes, and so
    their pinned sha256, depend on it."""
    import gguf  # heavy import, only when generating

    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(vocab.tokens)
    writer.add_token_scores(vocab.scores)
    writer.add_token_types(vocab.types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    if mask_token_id is not None:
        writer.add_mask_token_id(mask_token_id)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)


def finish(writer, tensors: dict[str, np.ndarray], partial: Path, path: Path) -> Path:
    """Add the tensors in the order given, write the file and move it into place (a reader never sees half)."""
    for name, data in tensors.items():
        writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(partial, path)
    return path


def _tensor_order(name: str) -> tuple[int, str]:
    if name.startswith("blk."):
        return (1 + int(name.split(".")[1]), name)
    return (0 if name == "token_embd.weight" else 99, name)
