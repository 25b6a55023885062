"""Crafted inputs for the trust tests: archives member by member, a real bundle of the committed demo run to
tamper with, and a sandbox that proves nothing was written outside the work folder."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import struct
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness import ROOT
from harness.share import bundle as bu

DEMO_RUN = ROOT / "results" / "demo-cpu"


def tree_state(root: Path, skip: Path) -> dict[str, tuple]:
    """Every entry under root (not under skip): type, size, mtime; links by their target."""
    out: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        here = Path(dirpath)
        dirnames[:] = [d for d in dirnames if here / d != skip]
        for name in dirnames + filenames:
            p = here / name
            st = p.lstat()
            out[str(p.relative_to(root))] = (st.st_mode, st.st_size, st.st_mtime_ns,
                                             os.readlink(p) if p.is_symlink() else None)
    return out


@dataclass
class Sandbox:
    """A work folder for the code under test and, beside it, an `outside` folder that crafted inputs aim at."""

    root: Path
    work: Path
    outside: Path

    def state(self) -> dict[str, tuple]:
        return tree_state(self.root, self.work)


def one_line(e: pytest.ExceptionInfo, *parts: str) -> str:
    """The error's message, asserted to be one line without a traceback and to hold every part."""
    msg = str(e.value)
    assert "\n" not in msg and "Traceback" not in msg, msg
    for p in parts:
        assert p in msg, f"{p!r} not in {msg!r}"
    return msg


def member(name: str, data: bytes = b"", kind: bytes = tarfile.REGTYPE, link: str = "") -> tuple:
    ti = tarfile.TarInfo(name)
    ti.type = kind
    ti.linkname = link
    ti.mode = 0o644
    ti.size = len(data) if kind in (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE) else 0
    return ti, data


def write_tar(path: Path, members: list[tuple], gz: bool = True) -> Path:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz" if gz else "w", format=tarfile.GNU_FORMAT) as tf:
        for ti, data in members:
            tf.addfile(ti, io.BytesIO(data) if ti.size else None)
    path.write_bytes(buf.getvalue())
    return path


def demo_bundle(folder: Path) -> Path:
    """A real bundle of the committed demo run (made from a copy, so the repository is not touched)."""
    folder.mkdir(parents=True, exist_ok=True)
    run = folder / "demo-cpu"
    shutil.copytree(DEMO_RUN, run)
    out = bu.make(run, folder / "demo.bundle.tar.gz", ROOT / "manifests")
    shutil.rmtree(run)
    return out


def bundle_files(archive: Path) -> dict[str, bytes]:
    """name -> bytes of every file member (the run id's folder stripped)."""
    out = {}
    with tarfile.open(archive) as tf:
        for m in tf:
            if m.isreg():
                out[m.name.split("/", 1)[1]] = tf.extractfile(m).read()
    return out


def rebundle(path: Path, files: dict[str, bytes], top: str = "demo-cpu", reindex: bool = True) -> Path:
    """A bundle of these files; with reindex, bundle.json lists each with its sha256 (a re-signed bundle)."""
    files = dict(files)
    if reindex:
        index = json.loads(files["bundle.json"])
        index["files"] = {k: hashlib.sha256(v).hexdigest() for k, v in files.items() if k != "bundle.json"}
        files["bundle.json"] = json.dumps(index).encode()
    return write_tar(path, [member(f"{top}/{k}", v) for k, v in files.items()])


# ---------------------------------------------------------------- GGUF files byte by byte

#: A crafted tensor entry: name, shape (ggml order), ggml type (0 = F32), data offset.
TensorEntry = tuple[str, tuple[int, ...], int, int]


def _gguf_string(s: str) -> bytes:
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def _gguf_value(value: object) -> bytes:
    if isinstance(value, str):
        return struct.pack("<I", 8) + _gguf_string(value)
    if isinstance(value, list):
        if value and isinstance(value[0], str):
            return struct.pack("<IIQ", 9, 8, len(value)) + b"".join(_gguf_string(x) for x in value)
        return struct.pack("<IIQ", 9, 5, len(value)) + struct.pack(f"<{len(value)}i", *value)
    return struct.pack("<Ii", 5, int(value))  # int32


def raw_gguf(kv: dict[str, object], tensors: list[TensorEntry], data: bytes, alignment: int = 32) -> bytes:
    """A GGUF v3 file as the bytes say, entries not checked against the data: what a crafted parent looks like."""
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kv))
    out += b"".join(_gguf_string(k) + _gguf_value(v) for k, v in kv.items())
    for name, shape, ggml_type, offset in tensors:
        out += _gguf_string(name) + struct.pack("<I", len(shape)) + struct.pack(f"<{len(shape)}Q", *shape)
        out += struct.pack("<IQ", ggml_type, offset)
    out += b"\0" * (-len(out) % alignment)
    return out + data


def layered_gguf(blocks: int = 4, width: int = 8) -> tuple[dict[str, object], list[TensorEntry], bytes]:
    """The parts of a small, honest llama-like parent: an embedding, `blocks` blocks of one F32 tensor each, an
    output head; every tensor its own aligned bytes."""
    kv: dict[str, object] = {"general.architecture": "llama", "general.name": "crafted", "llama.block_count": blocks,
                             "llama.embedding_length": width, "tokenizer.ggml.model": "llama",
                             "tokenizer.ggml.tokens": ["<unk>", "a", "b"]}
    names = ["token_embd.weight"] + [f"blk.{i}.attn_norm.weight" for i in range(blocks)] + ["output.weight"]
    tensors, offset = [], 0
    for name in names:
        tensors.append((name, (width,), 0, offset))
        offset += 32  # width 8 x 4 bytes = 32, already aligned
    data = b"".join(struct.pack(f"<{width}f", *[float(i + j) for j in range(width)]) for i in range(len(names)))
    return kv, tensors, data
