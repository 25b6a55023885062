"""Hashing, paths and timestamps: the small facts every stage records, in one place."""

from __future__ import annotations

import hashlib
import os
from datetime import UTC, datetime
from pathlib import Path

#: Files above this size keep their sha256 beside them (<file>.sha256), keyed by size and mtime.
HASH_CACHE_MIN_BYTES = 64 << 20


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_sha256(path: Path, chunk: int = 1 << 20) -> str:
    """sha256 of a file, cached beside large files in <file>.sha256 keyed by size and mtime."""
    path = Path(path)
    st = path.stat()
    cache = path.with_name(path.name + ".sha256")
    key = f"{st.st_size} {st.st_mtime_ns}"
    large = st.st_size > HASH_CACHE_MIN_BYTES
    if large and cache.is_file() and not cache.is_symlink():
        lines = cache.read_text(errors="replace")[:200].split("\n")
        if len(lines) >= 2 and lines[1] == key and len(lines[0]) == 64:
            return lines[0]
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    digest = h.hexdigest()
    if large:
        try:
            cache.write_text(f"{digest}\n{key}\n")
        except OSError:
            pass  # a read-only models folder only costs a re-hash next time
    return digest


def display_path(path: Path | str) -> str:
    """A path relative to the working directory when it is below it, else home-relative (~/...), else absolute."""
    p = Path(path)
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except (ValueError, OSError):
        pass
    try:
        return "~/" + str(p.resolve().relative_to(Path.home().resolve()))
    except (ValueError, OSError, RuntimeError):
        return str(p)


def is_inside(path: Path, root: Path) -> bool:
    """Whether `path`, with every symlink resolved, lies inside `root` (also resolved)."""
    try:
        return Path(os.path.realpath(path)).is_relative_to(os.path.realpath(root))
    except (OSError, ValueError):
        return False


def now_iso() -> str:
    """The current UTC time, ISO 8601 with microseconds and a Z."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def atomic_write_text(path: Path, text: str) -> None:
    """Write a file through <file>.partial and a rename, so a reader never sees half of it."""
    tmp = path.with_name(path.name + ".partial")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def safe_name(label: str) -> str:
    """A host label or id as a file-name part: letters, digits, '.', '_' and '-' only."""
    return "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in label)[:100]
