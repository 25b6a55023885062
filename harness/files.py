"""Hashing, paths and timestamps: the small facts every stage records, in one place."""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

from harness import ROOT

#: Files above this size keep their sha256 beside them (<file>.sha256), keyed by size and mtime.
HASH_CACHE_MIN_BYTES = 64 << 20


def read_bounded(read: Callable[[int], bytes], size: int, block: int = 1 << 20) -> Iterator[bytes]:
    """The blocks `read(n)` gives until `size` bytes came or it gives none: never more than `size`, however much the
    other side has (a socket, an archive member)."""
    got = 0
    while got < size:
        chunk = read(min(block, size - got))
        if not chunk:
            return
        got += len(chunk)
        yield chunk


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_sha256(path: Path, chunk: int = 1 << 20, cache: bool = True) -> str:
    """sha256 of a file, read in blocks; cached beside large files in <file>.sha256 keyed by size and mtime
    (unless `cache` is off: a received bundle's folder gets nothing written into it)."""
    path = Path(path)
    st = path.stat()
    key = f"{st.st_size} {st.st_mtime_ns}"
    large = cache and st.st_size > HASH_CACHE_MIN_BYTES
    cache_file = path.with_name(path.name + ".sha256")
    if large and cache_file.is_file() and not cache_file.is_symlink():
        lines = cache_file.read_text(errors="replace")[:200].split("\n")
        if len(lines) >= 2 and lines[1] == key and len(lines[0]) == 64:
            return lines[0]
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    digest = h.hexdigest()
    if large:
        try:
            cache_file.write_text(f"{digest}\n{key}\n")
        except OSError:
            pass  # a read-only models folder only costs a re-hash next time
    return digest


def display_path(path: Path | str) -> str:
    """A path relative to the working directory when it is below it, else home-relative (~/...), else absolute."""
    p = Path(path)
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except (ValueError, OSError, RuntimeError):  # RuntimeError: a symlink loop (Python < 3.13)
        pass
    try:
        return "~/" + str(p.resolve().relative_to(Path.home().resolve()))
    except (ValueError, OSError, RuntimeError):
        return str(p)


def recorded_path(path: Path | str) -> str:
    """A path as a shared file records it: relative to the working directory or to the kit, else home-relative
    (~/...); only a path outside all three (not a personal one) stays absolute."""
    p = Path(path)
    for base in (Path.cwd(), ROOT):
        try:
            return str(p.resolve().relative_to(base.resolve()))
        except (ValueError, OSError, RuntimeError):
            pass
    return display_path(p)


def is_inside(path: Path, root: Path) -> bool:
    """Whether `path`, with every symlink resolved, lies inside `root` (also resolved)."""
    try:
        return Path(os.path.realpath(path)).is_relative_to(os.path.realpath(root))
    except (OSError, ValueError):
        return False


def now_iso() -> str:
    """The current UTC time, ISO 8601 with microseconds and a Z."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write a file through a new temporary name beside it and a rename, so a reader never sees half of it; a
    link already at `path` (a run folder from elsewhere) is replaced, never written through."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    """atomic_write_bytes of UTF-8 text."""
    atomic_write_bytes(path, text.encode("utf-8"))


def safe_name(label: str) -> str:
    """A host label or id as a file-name part: letters, digits, '.', '_' and '-' only."""
    return "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in label)[:100]
