"""Model files: local paths, Hugging Face downloads (sha256-verified), and the demo's tiny generated GGUF models.

The tiny models are llama-architecture GGUF files written with the `gguf` package from a seed, byte for byte
the same every time, so their sha256 can be pinned in a manifest. The target has 4 blocks; its draft is the
target's embeddings, first block and output head alone, and the target's later blocks are scaled by `alpha`,
so the draft approximates the target and a speculative strategy accepts a share of its drafts
(smaller alpha, higher acceptance). A "foreign" draft has a different vocabulary: a server refuses it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from harness import KitError
from harness.files import file_sha256, is_inside
from harness.manifest import Manifest, ModelFile
from harness.trust import model_location

TARGET_LAYERS = 4
EMBED = 256
FF = 512
HEADS = 4
CTX = 16384

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
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(vocab.tokens)
    writer.add_token_scores(vocab.scores)
    writer.add_token_types(vocab.types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    for name in sorted(keep, key=_tensor_order):
        writer.add_tensor(name, keep[name])
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


# ---------------------------------------------------------------- fetching and checking


def default_models_dir() -> Path:
    from harness import ROOT

    return Path(os.environ.get("SPECBENCH_MODELS", ROOT / "models"))


def hf_download(model: ModelFile, models_dir: Path, dest: Path | None = None,
                log: Callable[[str], None] = print) -> Path:
    """Download a model from the Hugging Face hub (HF_ENDPOINT honoured) and move it to `dest` (default: its
    place in the models folder) only once it is complete and matches the pinned sha256.

    The download goes into a kit-owned folder inside the models folder (`.download-*`), removed whatever happens
    (a failure, a wrong hash, Ctrl-C): a partial or wrong file never sits where a model is looked for."""
    assert model.hf is not None
    try:
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import (
            EntryNotFoundError,
            HfHubHTTPError,
            LocalEntryNotFoundError,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )
    except ImportError:
        raise KitError("models: huggingface_hub is not installed (pip install huggingface_hub)") from None
    dest = Path(dest or model.local_path(models_dir))
    what = f"{model.hf.repo}/{model.hf.file}" + (f"@{model.hf.revision}" if model.hf.revision else "")
    log(f"models: downloading {what}")
    Path(models_dir).mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".download-", dir=models_dir))
    try:
        try:
            got = Path(hf_hub_download(repo_id=model.hf.repo, filename=model.hf.file, revision=model.hf.revision,
                                       local_dir=str(tmp), endpoint=os.environ.get("HF_ENDPOINT") or None))
        except RepositoryNotFoundError:
            raise KitError(f"models.{model.key}: repository {model.hf.repo} not found on the hub (private or "
                           "misspelt? set HF_TOKEN for gated models)") from None
        except RevisionNotFoundError:
            raise KitError(f"models.{model.key}: revision {model.hf.revision!r} not found in {model.hf.repo}") \
                from None
        except EntryNotFoundError:
            raise KitError(f"models.{model.key}: {model.hf.file} not found in {model.hf.repo}"
                           + (f"@{model.hf.revision}" if model.hf.revision else "")) from None
        except (HfHubHTTPError, LocalEntryNotFoundError, OSError, ValueError) as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise KitError(f"models.{model.key}: cannot download {model.hf.repo}/{model.hf.file}: {first}") from None
        if not is_inside(got, tmp) or got.is_symlink() or not got.is_file():
            raise KitError(f"models.{model.key}: the hub client put {model.hf.file} outside its download folder")
        actual = file_sha256(got)
        if model.sha256 and actual != model.sha256:
            raise KitError(f"models.{model.key}: downloaded {model.hf.repo}/{model.hf.file} has sha256 {actual}, "
                           f"the manifest pins {model.sha256}; the download was removed")
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(got), dest)
        cache = got.with_name(got.name + ".sha256")
        if cache.is_file():  # the hash just computed, kept beside the model (keyed by size and mtime)
            shutil.move(str(cache), dest.with_name(dest.name + ".sha256"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def ensure(manifest: Manifest, models_dir: Path | None = None, *, download: bool = True,
           log: Callable[[str], None] = print) -> dict[str, Path]:
    """Make every model the manifest uses present and verified; return key -> local path.

    Generated models are written when missing; Hugging Face models are downloaded when `download` is set.
    A pinned sha256 that does not match is an error naming the file and both hashes.
    """
    models_dir = Path(models_dir or default_models_dir())
    out: dict[str, Path] = {}
    for m in manifest.models_used():
        p = model_location(manifest, m, models_dir)
        if not p.exists():
            if m.generate is not None:
                log(f"models: generating {m.key} ({m.generate.kind}, seed {m.generate.seed}) -> {p}")
                g = m.generate
                write_tiny(p, g.kind, g.seed, g.alpha if g.alpha is not None else 0.1, **g.shape())
            elif m.hf is not None and download:
                hf_download(m, models_dir, p, log)
            elif m.hf is not None:
                raise KitError(f"models.{m.key}: {p} is missing; fetch it with `invoke models --manifest "
                               f"{manifest.path}` (from {m.hf.repo}/{m.hf.file})")
            else:
                raise KitError(f"models.{m.key}: {p} does not exist")
            p = model_location(manifest, m, models_dir)
        if m.sha256:
            actual = file_sha256(p)
            if actual != m.sha256:
                raise KitError(f"models.{m.key}: {p} has sha256 {actual}, the manifest pins {m.sha256}")
        out[m.key] = p
    return out
