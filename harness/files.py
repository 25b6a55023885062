"""Hashing, paths and timestamps: the small facts every stage records, in one place."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tempfile
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

from harness import ROOT

#: Files above this size have their sha256 remembered in the kit's own cache (HASH_CACHE), never beside them.
HASH_CACHE_MIN_BYTES = 64 << 20
#: The kit's own folder of remembered hashes: one small JSON file per hashed file, named by its resolved path.
#: Nothing is ever written into the folder a model lives in (a received folder is not the kit's), and a `.sha256`
#: file found beside a model is never read.
HASH_CACHE = ROOT / ".cache" / "hashes"
_ENTRY_MAX_BYTES = 8192


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


def _identity(real: str, st: os.stat_result) -> dict[str, object]:
    """What a remembered hash is keyed by: the resolved path and the file's inode, device, size, mtime and ctime
    (a file rewritten in place with its mtime restored still changes its ctime)."""
    return {"path": real, "dev": st.st_dev, "ino": st.st_ino, "size": st.st_size, "mtime_ns": st.st_mtime_ns,
            "ctime_ns": st.st_ctime_ns}


def _cache_dir(create: bool) -> Path | None:
    """The hash cache folder when it is the kit's: a real folder owned by this user that no one else may write."""
    d = Path(HASH_CACHE)
    try:
        if create:
            d.mkdir(parents=True, exist_ok=True, mode=0o700)
        st = os.lstat(d)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        return None
    return d


def _entry(real: str) -> str:
    return hashlib.sha256(real.encode("utf-8", "surrogateescape")).hexdigest()[:40] + ".json"


def _remembered(ident: dict[str, object]) -> str | None:
    """The sha256 the kit remembered for exactly this file, or None. The entry is read without following a link
    and only when it is a regular file of this user's in the kit's own folder."""
    d = _cache_dir(create=False)
    if d is None:
        return None
    try:
        fd = os.open(d / _entry(str(ident["path"])), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_size > _ENTRY_MAX_BYTES:
            return None
        entry = json.loads(os.read(fd, _ENTRY_MAX_BYTES))
    except (OSError, ValueError, RecursionError):
        return None
    finally:
        os.close(fd)
    if not isinstance(entry, dict) or {k: entry.get(k) for k in ident} != ident:
        return None
    digest = entry.get("sha256")
    return digest if isinstance(digest, str) and len(digest) == 64 and all(c in "0123456789abcdef"
                                                                           for c in digest) else None


def _remember(ident: dict[str, object], digest: str) -> None:
    """Keep a file's sha256 in the kit's cache: a new file made beside the entry (O_EXCL: never through a link)
    and renamed over it. A cache that cannot be written only costs a re-hash next time."""
    d = _cache_dir(create=True)
    if d is None:
        return
    try:
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".entry-")
    except OSError:
        return
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({**ident, "sha256": digest}, f)
        os.replace(tmp, d / _entry(str(ident["path"])))
    except OSError:
        Path(tmp).unlink(missing_ok=True)


def file_sha256(path: Path, chunk: int = 1 << 20, cache: bool = True) -> str:
    """sha256 of a file, read in blocks. A large file's hash is remembered in the kit's own cache (HASH_CACHE),
    keyed by its resolved path, inode, device, size, mtime and ctime, and reused only while all of them are the
    same; `cache` off neither reads nor writes it."""
    real = os.path.realpath(path)
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        ident = _identity(real, st)
        large = cache and st.st_size > HASH_CACHE_MIN_BYTES
        if large and (known := _remembered(ident)) is not None:
            return known
        h = hashlib.sha256()
        while block := f.read(chunk):
            h.update(block)
        after = _identity(real, os.fstat(f.fileno()))
    digest = h.hexdigest()
    if large and after == ident:  # a file that changed while it was read is not remembered
        _remember(ident, digest)
    return digest


def remember_moved(before: Path, after: Path) -> None:
    """A file the kit hashed and then renamed within one file system (a verified download moved into place): its
    remembered hash follows it when it is the same file (inode, device, size, mtime), so it is not read again."""
    try:
        st = os.stat(after)
    except OSError:
        return
    old = _identity(os.path.realpath(before), st)
    old.pop("ctime_ns")  # a rename changes the ctime; the rest must be as hashed
    d = _cache_dir(create=False)
    if d is None:
        return
    try:
        fd = os.open(d / _entry(str(old["path"])), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        try:
            fst = os.fstat(fd)
            entry = json.loads(os.read(fd, _ENTRY_MAX_BYTES)) if stat.S_ISREG(fst.st_mode) \
                and fst.st_uid == os.getuid() else None
        finally:
            os.close(fd)
    except (OSError, ValueError, RecursionError):
        return
    if isinstance(entry, dict) and all(entry.get(k) == v for k, v in old.items()) \
            and isinstance(entry.get("sha256"), str):
        _remember(_identity(os.path.realpath(after), st), entry["sha256"])


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
