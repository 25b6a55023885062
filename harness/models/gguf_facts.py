"""Facts of a GGUF model file from its header alone: architecture, key/values, tensor names and shapes, a
vocabulary fingerprint, and what a speculative pre-flight needs (target_layers, block_count, widths, NextN and
expert counts, the DFlash flavour).

The header is parsed from a stream, so the same code reads a local file (only its header is read) and a byte
prefix fetched from a remote host (`facts_from_prefix`). The file is untrusted input: every count and length
is bounded, and a header that does not fit in the prefix raises `HeaderIncomplete` with the number of bytes
the parser knows it needs at least (fetch that many, or double the prefix, and try again).
"""

from __future__ import annotations

import hashlib
import io
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from harness import KitError

MAGIC = b"GGUF"
#: Limits on what a header may claim; real files stay far below them (a 250k-token vocabulary, ~3k tensors).
MAX_TENSORS = 1 << 20
MAX_KV = 1 << 16
MAX_KEY_BYTES = 1 << 16
MAX_STRING_BYTES = 1 << 24  # chat templates run to tens of kB; 16 MiB is generous
MAX_ARRAY_ITEMS = 1 << 24
MAX_DIMS = 8
MAX_HEADER_BYTES = 1 << 30
#: Arrays longer than this are summarised (type and length) in `ModelFacts.kv`, not kept item by item.
KEEP_ARRAY_ITEMS = 1024

# GGUF value types (gguf-py's GGUFValueType): scalar struct formats, little-endian.
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_TYPE_NAMES = {0: "uint8", 1: "int8", 2: "uint16", 3: "int16", 4: "uint32", 5: "int32", 6: "float32", 7: "bool",
               8: "string", 9: "array", 10: "uint64", 11: "int64", 12: "float64"}


class HeaderIncomplete(KitError):
    """The bytes given end inside the header; `needed` is how many bytes the parser knows it needs at least."""

    def __init__(self, source: str, have: int, needed: int) -> None:
        super().__init__(f"{source}: the GGUF header does not fit in the first {have} bytes; "
                         f"it needs at least {needed} (read more of the file)")
        self.have = have
        self.needed = needed


@dataclass(frozen=True)
class TensorInfo:
    """One tensor's header entry: shape in ggml `ne` order (fastest dimension first), ggml type id, and where its
    data starts, relative to the data section (`ModelFacts.data_start`)."""

    shape: tuple[int, ...]
    ggml_type: int
    offset: int = 0


@dataclass(frozen=True)
class ModelFacts:
    """What a GGUF header says. `kv` holds every key; arrays longer than KEEP_ARRAY_ITEMS are summarised as
    {"array_of": type, "length": n}. `vocab_sha256` fingerprints the token list (length-prefixed UTF-8).

    Long by design: one short derived property per fact the pre-flight and the physics check read."""

    source: str
    version: int
    kv: dict[str, Any]
    tensors: dict[str, TensorInfo]
    header_bytes: int
    vocab_sha256: str | None = None
    vocab_size: int | None = None
    kv_types: dict[str, str] = field(default_factory=dict)
    #: Items of every array value together (a bound on what a full GGUF reader builds in memory).
    array_items: int = 0

    @property
    def alignment(self) -> int:
        a = self.kv.get("general.alignment")
        return a if isinstance(a, int) and not isinstance(a, bool) and a > 0 else 32

    @property
    def data_start(self) -> int:
        """Where the tensor data section starts in the file: the header's end, padded to the alignment."""
        return -(-self.header_bytes // self.alignment) * self.alignment

    # ---- derived facts (None where the file does not say)

    @property
    def architecture(self) -> str | None:
        a = self.kv.get("general.architecture")
        return a if isinstance(a, str) else None

    @property
    def tensor_count(self) -> int:
        return len(self.tensors)

    def arch_key(self, name: str) -> Any:
        """The value of `<architecture>.<name>`, or None."""
        return self.kv.get(f"{self.architecture}.{name}") if self.architecture else None

    def _int(self, name: str) -> int | None:
        v = self.arch_key(name)
        return int(v) if isinstance(v, int) and not isinstance(v, bool) else None

    @property
    def block_count(self) -> int | None:
        return self._int("block_count")

    @property
    def embedding_length(self) -> int | None:
        return self._int("embedding_length")

    @property
    def nextn_predict_layers(self) -> int:
        return self._int("nextn_predict_layers") or 0

    @property
    def trunk_layers(self) -> int | None:
        """Layers a target runs per token (block_count less its NextN blocks): valid target_layers ids are below."""
        return None if self.block_count is None else self.block_count - self.nextn_predict_layers

    @property
    def target_layers(self) -> list[int] | None:
        v = self.arch_key("target_layers")
        if isinstance(v, list) and all(isinstance(x, int) for x in v):
            return list(v)
        return None

    @property
    def target_hidden_size(self) -> int | None:
        return self._int("target_hidden_size")

    @property
    def expert_count(self) -> int | None:
        return self._int("expert_count")

    @property
    def expert_used_count(self) -> int | None:
        return self._int("expert_used_count")

    @property
    def mask_token_id(self) -> int | None:
        v = self.kv.get("tokenizer.ggml.mask_token_id")
        return v if isinstance(v, int) and not isinstance(v, bool) else None

    @property
    def tokenizer_model(self) -> str | None:
        v = self.kv.get("tokenizer.ggml.model")
        return v if isinstance(v, str) else None

    @property
    def dflash_flavour(self) -> str | None:
        """For a dflash file: 'dspark' (a Markov head), 'dflash2' (a selector), else 'dflash1'; None otherwise.
        llama.cpp switches on the same tensors: `markov_w1.weight` and `selector_hidden.weight`."""
        if self.architecture != "dflash":
            return None
        if "markov_w1.weight" in self.tensors:
            return "dspark"
        if "selector_hidden.weight" in self.tensors:
            return "dflash2"
        return "dflash1"

    @property
    def has_nextn_tensors(self) -> bool:
        return any(".nextn." in n for n in self.tensors)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary (for run metadata): derived facts, tensor count, vocabulary fingerprint."""
        return {"source": self.source, "gguf_version": self.version, "architecture": self.architecture,
                "tensor_count": self.tensor_count, "header_bytes": self.header_bytes,
                "block_count": self.block_count, "embedding_length": self.embedding_length,
                "nextn_predict_layers": self.nextn_predict_layers, "target_layers": self.target_layers,
                "target_hidden_size": self.target_hidden_size, "expert_count": self.expert_count,
                "expert_used_count": self.expert_used_count, "mask_token_id": self.mask_token_id,
                "tokenizer_model": self.tokenizer_model, "vocab_size": self.vocab_size,
                "vocab_sha256": self.vocab_sha256, "dflash_flavour": self.dflash_flavour}


# ---------------------------------------------------------------- reading


def read_facts(path: Path, *, max_header_bytes: int = MAX_HEADER_BYTES) -> ModelFacts:
    """Facts of a local GGUF file, reading its header only."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            return parse_header(io.BufferedReader(f, 1 << 20), str(path), limit=max_header_bytes)
    except OSError as e:
        raise KitError(f"{path}: cannot read: {e.strerror or e}") from None


def facts_from_prefix(data: bytes, source: str) -> ModelFacts:
    """Facts from the first bytes of a GGUF file (e.g. fetched over SSH); raises HeaderIncomplete when short."""
    return parse_header(io.BytesIO(data), source, limit=len(data), prefix=True)


def facts_from_reader(read_prefix: Callable[[int], bytes], source: str, *, first: int = 1 << 20,
                      max_bytes: int = 64 << 20) -> ModelFacts:
    """Facts of a file only reachable by prefix (e.g. `head -c N` over SSH): read `first` bytes, then as many
    as the parser says it needs (at least double), up to max_bytes. read_prefix(n) returns the first n bytes
    (fewer at the end of the file)."""
    want = first
    while True:
        data = read_prefix(want)
        try:
            return facts_from_prefix(data, source)
        except HeaderIncomplete as e:
            if len(data) < want:
                raise KitError(f"{source}: file ends inside the GGUF header ({len(data)} bytes)") from None
            if want >= max_bytes:
                raise KitError(f"{source}: GGUF header is larger than {max_bytes} bytes; not read") from None
            want = min(max_bytes, max(e.needed, 2 * want))


class _Reader:
    def __init__(self, f: BinaryIO, source: str, limit: int, prefix: bool) -> None:
        self.f, self.source, self.limit, self.prefix, self.pos = f, source, limit, prefix, 0
        self.ahead = 0  # bytes the rest of the header takes at least, after the current read (for `needed`)

    def read(self, n: int) -> bytes:
        if self.pos + n > self.limit and not self.prefix:
            raise KitError(f"{self.source}: GGUF header runs past {self.limit} bytes at offset {self.pos}")
        b = self.f.read(n)
        if len(b) < n:
            if self.prefix:
                raise HeaderIncomplete(self.source, self.pos + len(b), self.pos + n + self.ahead)
            raise KitError(f"{self.source}: file ends inside the GGUF header (offset {self.pos + len(b)})")
        self.pos += n
        return b

    def scalar(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.read(struct.calcsize(fmt)))[0]

    def count(self, what: str, limit: int) -> int:
        n = self.scalar("<Q")
        if n > limit:
            raise KitError(f"{self.source}: GGUF header claims {n} {what} at offset {self.pos - 8}; "
                           f"more than the {limit} a model file can hold")
        return n

    def string(self, limit: int = MAX_STRING_BYTES) -> str:
        n = self.count("string bytes", limit)
        raw = self.read(n)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return raw.decode("utf-8", errors="replace")

    def value_type(self) -> int:
        t = self.scalar("<I")
        if t not in _TYPE_NAMES:
            raise KitError(f"{self.source}: unknown GGUF value type {t} at offset {self.pos - 4}")
        return t


def _items(r: _Reader, t: int, n: int) -> Iterator[Any]:
    after = r.ahead
    if t == _STRING:
        for i in range(n):
            r.ahead = after + 8 * (n - i - 1)  # each later string has at least its 8-byte length
            yield r.string()
    elif t in _SCALARS:
        fmt = _SCALARS[t]
        size = struct.calcsize(fmt)
        chunk = 4096
        for start in range(0, n, chunk):
            k = min(chunk, n - start)
            r.ahead = after + size * (n - start - k)
            yield from struct.unpack(f"<{k}{fmt[1]}", r.read(k * size))
    else:
        raise KitError(f"{r.source}: arrays of arrays are not read (offset {r.pos})")


def parse_header(f: BinaryIO, source: str, *, limit: int = MAX_HEADER_BYTES, prefix: bool = False) -> ModelFacts:
    """Parse a GGUF header from a binary stream positioned at the file's start."""
    r = _Reader(f, source, limit, prefix)
    if r.read(4) != MAGIC:
        raise KitError(f"{source}: not a GGUF file (no 'GGUF' magic at the start)")
    version = r.scalar("<I")
    if version not in (2, 3):
        raise KitError(f"{source}: GGUF version {version}; expected 2 or 3")
    n_tensors = r.count("tensors", MAX_TENSORS)
    n_kv = r.count("key/value pairs", MAX_KV)
    kv: dict[str, Any] = {}
    kv_types: dict[str, str] = {}
    vocab_hash: str | None = None
    vocab_size: int | None = None
    array_items = 0
    for i in range(n_kv):
        # a key/value pair takes at least 13 bytes (key length, type, one byte); a tensor entry at least 32
        r.ahead = 13 * (n_kv - i - 1) + 32 * n_tensors
        key = r.string(MAX_KEY_BYTES)
        t = r.value_type()
        if t == _ARRAY:
            it = r.value_type()
            n = r.count("array items", MAX_ARRAY_ITEMS)
            array_items += n
            kv_types[key] = f"array[{_TYPE_NAMES[it]}]"
            if key == "tokenizer.ggml.tokens" and it == _STRING:
                h = hashlib.sha256()
                kept: list[Any] = []
                for tok in _items(r, it, n):
                    b = tok.encode("utf-8")
                    h.update(len(b).to_bytes(4, "little") + b)
                    if len(kept) < KEEP_ARRAY_ITEMS:
                        kept.append(tok)
                vocab_hash, vocab_size = h.hexdigest(), n
                kv[key] = kept if n <= KEEP_ARRAY_ITEMS else {"array_of": _TYPE_NAMES[it], "length": n}
            elif n <= KEEP_ARRAY_ITEMS:
                kv[key] = list(_items(r, it, n))
            else:
                for _ in _items(r, it, n):
                    pass
                kv[key] = {"array_of": _TYPE_NAMES[it], "length": n}
        elif t == _STRING:
            kv_types[key] = "string"
            kv[key] = r.string()
        else:
            kv_types[key] = _TYPE_NAMES[t]
            kv[key] = r.scalar(_SCALARS[t])
    tensors: dict[str, TensorInfo] = {}
    for i in range(n_tensors):
        r.ahead = 32 * (n_tensors - i - 1)
        name = r.string(MAX_KEY_BYTES)
        n_dims = r.scalar("<I")
        if n_dims > MAX_DIMS:
            raise KitError(f"{source}: tensor {name!r} claims {n_dims} dimensions; at most {MAX_DIMS}")
        shape = tuple(r.scalar("<Q") for _ in range(n_dims))
        if any(d >= 1 << 62 for d in shape):
            raise KitError(f"{source}: tensor {name!r} has an impossible shape {list(shape)}")
        ggml_type = r.scalar("<I")
        offset = r.scalar("<Q")
        if name in tensors:
            raise KitError(f"{source}: tensor {name!r} appears twice in the header")
        tensors[name] = TensorInfo(shape, ggml_type, offset)
    return ModelFacts(source, version, kv, tensors, r.pos, vocab_hash, vocab_size, kv_types, array_items)
