"""Drafters derived from the target itself: layer-skip self-speculation.

A layer-skip drafter is the target's first N blocks with the target's own embeddings, final norm, output head
and tokenizer: every metadata key is copied, `<arch>.block_count` becomes N and every per-layer array is cut to
its first N entries, the tensors of blocks N.. are left out, and the kept tensors are copied byte for byte
(quantized ones stay quantized). It shares the target's vocabulary, so `--spec-type draft-simple` accepts it,
and it predicts what the target's early layers already know: the easy tokens of text and code.
The same parent and N always give the same bytes, so a manifest can pin the drafter's sha256.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from harness import KitError


def _scalar(reader: Any, key: str) -> Any:
    field = reader.fields.get(key)
    return None if field is None else field.contents()


def derive_layer_skip(parent_gguf: Path, out_path: Path, keep_layers: int) -> Path:
    """Write the layer-skip drafter of `parent_gguf` (its first `keep_layers` blocks) to `out_path`; return it.

    Raises KitError when the parent is not a GGUF model with blocks or `keep_layers` is not 1..block_count-1.
    The file is written beside `out_path` as `<name>.partial` and moved into place when complete.
    """
    import gguf  # heavy import, only when deriving

    parent_gguf, out_path = Path(parent_gguf), Path(out_path)
    try:
        reader = gguf.GGUFReader(str(parent_gguf), "r")
    except (OSError, ValueError) as e:
        raise KitError(f"{parent_gguf}: not a readable GGUF file: {e}") from None
    arch = _scalar(reader, gguf.Keys.General.ARCHITECTURE)
    n_layer = _scalar(reader, f"{arch}.block_count") if arch else None
    if not isinstance(n_layer, int):
        raise KitError(f"{parent_gguf}: no {arch or '<arch>'}.block_count: not a model with blocks")
    if not 1 <= keep_layers < n_layer:
        raise KitError(f"keep_layers: expected 1..{n_layer - 1} for {parent_gguf.name} ({n_layer} blocks), "
                       f"got {keep_layers}")
    nextn = _scalar(reader, f"{arch}.nextn_predict_layers")
    if isinstance(nextn, int) and nextn > 0 and keep_layers > n_layer - nextn:
        raise KitError(f"keep_layers: {parent_gguf.name}'s last {nextn} blocks are next-token heads; keep at most "
                       f"{n_layer - nextn}")

    kept = [t for t in reader.tensors if _block_of(t.name) is None or _block_of(t.name) < keep_layers]
    out_path.parent.mkdir(parents=True, exist_ok=True)
    partial = out_path.with_name(out_path.name + ".partial")
    writer = gguf.GGUFWriter(str(partial), arch, endianess=reader.endianess, use_temp_file=False)
    alignment = _scalar(reader, gguf.Keys.General.ALIGNMENT)
    if isinstance(alignment, int):
        writer.data_alignment = alignment
    try:
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
        os.replace(partial, out_path)
    finally:
        partial.unlink(missing_ok=True)
    return out_path


def _block_of(tensor_name: str) -> int | None:
    """The block index of a `blk.N.*` tensor, else None (embeddings, output head, final norm, rope factors)."""
    parts = tensor_name.split(".")
    if len(parts) > 2 and parts[0] == "blk" and parts[1].isdigit():
        return int(parts[1])
    return None
