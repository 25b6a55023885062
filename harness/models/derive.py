"""Drafters derived from the target itself: layer-skip self-speculation.

A layer-skip drafter is the target's first N blocks with the target's own embeddings, final norm, output head
and tokenizer: every metadata key is copied, `<arch>.block_count` becomes N and every per-layer array is cut to
its first N entries, the tensors of blocks N.. are left out, and the kept tensors are copied byte for byte
(quantized ones stay quantized). It shares the target's vocabulary, so `--spec-type draft-simple` accepts it,
and it predicts what the target's early layers already know: the easy tokens of text and code.
The same parent and N always give the same bytes, so a manifest can pin the drafter's sha256.

The parent is untrusted (it may come with a bundle): its header is read first by the kit's own bounded reader
(harness/models/gguf_facts.py), and every tensor entry must be of a known type, aligned, inside the file and
apart from every other, so the drafter can never be larger than the parent's own data. The drafter is written
as `<name>.partial`, checked against the pinned sha256 and only then moved into place; a refused or interrupted
one is removed.
"""

from __future__ import annotations

import os
import shutil
import struct
from pathlib import Path
from typing import Any

from harness import KitError
from harness import formatter as fm
from harness.files import file_sha256
from harness.models.gguf_facts import ModelFacts, read_facts
from harness.models.passbytes import tensor_block

#: Bounds on a parent beyond the reader's own: real models have a few thousand tensors and a vocabulary of at
#: most a few hundred thousand entries (tokens, scores, types, merges), which a full GGUF reader holds in memory.
MAX_TENSORS = 1 << 16
MAX_ARRAY_ITEMS = 1 << 22
MAX_DIMS = 4
#: What the drafter's header may hold beyond the parent's (the longer general.name, padding).
_HEADER_SLACK = 1 << 16


def _scalar(reader: Any, key: str) -> Any:
    field = reader.fields.get(key)
    return None if field is None else field.contents()


def check_parent(facts: ModelFacts, file_size: int) -> None:
    """Refuse, in one line, a parent whose tensor entries a writer could not copy faithfully: too many, an
    unknown type, a shape that is not whole blocks, unaligned, outside the file, or overlapping another (3,000
    entries pointing at one MiB would make a drafter thousands of times the parent's size)."""
    src = facts.source
    if len(facts.tensors) > MAX_TENSORS:
        raise KitError(f"{src}: {fm.count(len(facts.tensors))} tensors; a model to derive from has at most "
                       f"{fm.count(MAX_TENSORS)}")
    if facts.array_items > MAX_ARRAY_ITEMS:
        raise KitError(f"{src}: {fm.count(facts.array_items)} array items in the header; a model to derive from has "
                       f"at most {fm.count(MAX_ARRAY_ITEMS)}")
    start, align = facts.data_start, facts.alignment
    spans: list[tuple[int, int, str]] = []
    for name, t in facts.tensors.items():
        shown = repr(name[:80])
        if not 1 <= len(t.shape) <= MAX_DIMS or any(d < 1 for d in t.shape):
            raise KitError(f"{src}: tensor {shown} has shape {list(t.shape)}; expected 1 to {MAX_DIMS} dimensions "
                           "of at least 1")
        block = tensor_block(t.ggml_type)
        if block is None:
            raise KitError(f"{src}: tensor {shown} has ggml type {t.ggml_type}, which the kit does not know")
        per_block, block_bytes = block
        if t.shape[0] % per_block:
            raise KitError(f"{src}: tensor {shown}: a row of {t.shape[0]} is not whole blocks of {per_block}")
        count = 1
        for d in t.shape:
            count *= d
        nbytes = count // per_block * block_bytes
        if t.offset % align:
            raise KitError(f"{src}: tensor {shown} starts at data offset {t.offset}, not a multiple of the "
                           f"alignment {align}")
        if start + t.offset + nbytes > file_size:
            raise KitError(f"{src}: tensor {shown} ({fm.count(nbytes)} bytes at data offset {fm.count(t.offset)}) "
                           f"ends past the end of the file ({fm.count(file_size)} bytes)")
        spans.append((t.offset, t.offset + nbytes, name))
    spans.sort()
    for (a0, a1, an), (b0, _, bn) in zip(spans, spans[1:], strict=False):
        if b0 < a1:
            raise KitError(f"{src}: tensors {an[:80]!r} and {bn[:80]!r} overlap (data offsets "
                           f"{fm.count(a0)}..{fm.count(a1)} and {fm.count(b0)}); every tensor of a model file has "
                           "bytes of its own")


def derive_layer_skip(parent_gguf: Path, out_path: Path, keep_layers: int, sha256: str | None = None) -> Path:
    """Write the layer-skip drafter of `parent_gguf` (its first `keep_layers` blocks) to `out_path`; return it.

    Raises KitError when the parent is not a GGUF model with blocks whose entries check out (`check_parent`),
    `keep_layers` is not 1..block_count-1, or the result does not have the pinned `sha256`. The file is written
    beside `out_path` as `<name>.partial` and moved into place only when complete and verified.
    """
    parent_gguf, out_path = Path(parent_gguf), Path(out_path)
    facts = read_facts(parent_gguf)
    size = parent_gguf.stat().st_size
    check_parent(facts, size)
    n_layer = facts.block_count
    if not isinstance(n_layer, int):
        raise KitError(f"{parent_gguf}: no {facts.architecture or '<arch>'}.block_count: not a model with blocks")
    if not 1 <= keep_layers < n_layer:
        raise KitError(f"keep_layers: expected 1..{n_layer - 1} for {parent_gguf.name} ({n_layer} blocks), "
                       f"got {keep_layers}")
    nextn = facts.nextn_predict_layers
    if nextn > 0 and keep_layers > n_layer - nextn:
        raise KitError(f"keep_layers: {parent_gguf.name}'s last {nextn} blocks are next-token heads; keep at most "
                       f"{n_layer - nextn}")
    bound = size + _HEADER_SLACK  # kept entries are apart and inside the parent: its size bounds the drafter's
    out_path.parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(out_path.parent).free
    if free < bound:
        raise KitError(f"{out_path.parent}: {fm.num(free / 1e6, 0)} MB free; the drafter of {parent_gguf.name} "
                       f"needs up to {fm.num(bound / 1e6, 0)} MB")
    partial = out_path.with_name(out_path.name + ".partial")
    try:
        _write(parent_gguf, partial, keep_layers, n_layer)
        written = partial.stat().st_size
        if written > bound:
            raise KitError(f"{parent_gguf}: the drafter came out {fm.count(written)} bytes, more than its parent's "
                           f"{fm.count(size)}; nothing was kept")
        if sha256:
            actual = file_sha256(partial, cache=False)
            if actual != sha256:
                raise KitError(f"the first {keep_layers} blocks of {parent_gguf.name} have sha256 {actual}, the "
                               f"manifest pins {sha256}; nothing was kept")
        os.replace(partial, out_path)
    finally:
        partial.unlink(missing_ok=True)  # a refused, failed or interrupted drafter never stays
    return out_path


def _write(parent_gguf: Path, partial: Path, keep_layers: int, n_layer: int) -> None:
    """The drafter's bytes, through gguf-py's reader and writer; anything they raise on a crafted file that got
    past `check_parent` is one line."""
    import gguf  # heavy import, only when deriving

    try:
        reader = gguf.GGUFReader(str(parent_gguf), "r")
        arch = _scalar(reader, gguf.Keys.General.ARCHITECTURE)
        kept = [t for t in reader.tensors if (block := _block_of(t.name)) is None or block < keep_layers]
        writer = gguf.GGUFWriter(str(partial), arch, endianess=reader.endianess, use_temp_file=False)
        alignment = _scalar(reader, gguf.Keys.General.ALIGNMENT)
        if isinstance(alignment, int):
            writer.data_alignment = alignment
        for field in reader.fields.values():
            if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
                continue  # the writer writes these itself
            vtype = field.types[0]
            sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
            value = field.contents()
            if field.name == f"{arch}.block_count":
                value = keep_layers
            elif field.name == f"{arch}.nextn_predict_layers":
                value = 0  # the next-token heads were the last blocks; none is kept
            elif field.name == gguf.Keys.General.NAME and isinstance(value, str):
                value = f"{value} (first {keep_layers} of {n_layer} blocks)"
            elif (sub is not None and field.name.startswith(f"{arch}.") and isinstance(value, list)
                  and len(value) == n_layer and sub not in (gguf.GGUFValueType.STRING, gguf.GGUFValueType.ARRAY)):
                value = value[:keep_layers]  # a per-layer array (head counts, sliding-window pattern, ...)
            writer.add_key_value(field.name, value, vtype, sub_type=sub)
        for t in kept:
            writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for t in kept:
            writer.write_tensor_data(t.data, tensor_endianess=reader.endianess)
        writer.close()
    except (ValueError, IndexError, KeyError, TypeError, AttributeError, OverflowError, MemoryError,
            struct.error, UnicodeError) as e:
        raise KitError(f"{parent_gguf}: cannot derive from this GGUF file ({type(e).__name__}: "
                       f"{str(e).splitlines()[0][:200] if str(e) else 'no detail'})") from None


def _block_of(tensor_name: str) -> int | None:
    """The block index of a `blk.N.*` tensor, else None (embeddings, output head, final norm, rope factors)."""
    parts = tensor_name.split(".")
    if len(parts) > 2 and parts[0] == "blk" and parts[1].isdigit():
        return int(parts[1])
    return None
