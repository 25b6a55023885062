"""Extracting archives that came from elsewhere (a bundle, an sdist) without trusting them.

Every member is checked before anything is written: regular files and folders only (no links, devices or
FIFOs), names that normalise to a relative path inside the destination, and caps on the member count, each
member's size and the total. Files are written by this code, not by tarfile, so no Python version's extraction
filter is relied on (CVE-2025-4517 let symlink chains escape `filter="data"`)."""

from __future__ import annotations

import os
import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from harness import KitError
from harness import formatter as fm
from harness.files import read_bounded


@dataclass(frozen=True)
class Limits:
    members: int = 10_000
    member_bytes: int = 1 << 30
    total_bytes: int = 4 << 30


BUNDLE_LIMITS = Limits(members=2_000, member_bytes=256 << 20, total_bytes=512 << 20)
SDIST_LIMITS = Limits(members=20_000, member_bytes=256 << 20, total_bytes=2 << 30)


def member_name(name: str) -> PurePosixPath | None:
    """The member's relative path, normalised, or None when it is not a plain path inside the archive."""
    if not name or "\\" in name or "\0" in name or any(ord(ch) < 32 for ch in name):
        return None
    p = PurePosixPath(name)
    if p.is_absolute():
        return None
    parts = [x for x in p.parts if x not in ("", ".")]
    if not parts or any(x == ".." for x in parts):
        return None
    return PurePosixPath(*parts)


def check_members(tf: tarfile.TarFile, source: str, limits: Limits) -> list[tuple[tarfile.TarInfo, PurePosixPath]]:
    """Every member checked against the rules; the first offender is one line."""
    out = []
    total = 0
    for i, m in enumerate(tf):
        if i >= limits.members:
            raise KitError(f"{source}: more than {fm.count(limits.members)} members; refusing to extract")
        rel = member_name(m.name)
        if rel is None:
            raise KitError(f"{source}: member {m.name[:120]!r} is not a relative path inside the archive")
        if not (m.isreg() or m.isdir()):
            kind = "a link" if m.issym() or m.islnk() else "a device or FIFO" if m.isdev() or m.isfifo() else "special"
            raise KitError(f"{source}: member {m.name[:120]!r} is {kind}; only files and folders are extracted")
        if m.size > limits.member_bytes:
            raise KitError(f"{source}: member {m.name[:120]!r} is {fm.count(m.size)} bytes; at most "
                           f"{fm.count(limits.member_bytes)} per member")
        total += m.size
        if total > limits.total_bytes:
            raise KitError(f"{source}: more than {fm.count(limits.total_bytes)} bytes in all; refusing to extract")
        out.append((m, rel))
    return out


def extract(archive: Path, dest: Path, limits: Limits = Limits()) -> list[PurePosixPath]:
    """Extract a tar (optionally compressed) into `dest` (created, must be empty or new); return the files.

    On any problem nothing stays behind: `dest` is removed again."""
    source = str(archive)
    dest = Path(dest)
    created = not dest.exists()
    dest.mkdir(parents=True, exist_ok=True)
    if any(dest.iterdir()):
        raise KitError(f"{dest}: not empty; extract into a new folder")
    root = Path(os.path.realpath(dest))
    files: list[PurePosixPath] = []
    try:
        with tarfile.open(archive) as tf:
            members = check_members(tf, source, limits)
            for m, rel in members:
                target = root / rel
                if not Path(os.path.realpath(target.parent if not m.isdir() else target)).is_relative_to(root):
                    raise KitError(f"{source}: member {m.name[:120]!r} would land outside {dest}")
                if m.isdir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                if target.exists() or target.is_symlink():
                    raise KitError(f"{source}: member {m.name[:120]!r} appears twice")
                src = tf.extractfile(m)
                if src is None:
                    raise KitError(f"{source}: member {m.name[:120]!r} has no data")
                with src, open(target, "xb") as out:
                    copied = _copy_bounded(src, out, m.size)
                if copied != m.size:
                    raise KitError(f"{source}: member {m.name[:120]!r} is truncated")
                os.chmod(target, 0o755 if m.mode & 0o111 else 0o644)
                files.append(rel)
    except (tarfile.TarError, EOFError, OSError) as e:
        _cleanup(dest, created)
        # tarfile's own message spans lines (one per compression it tried): one line of it
        raise KitError(f"{source}: not a readable archive ({type(e).__name__}: {' '.join(str(e).split())[:200]})") \
            from None
    except BaseException:
        _cleanup(dest, created)
        raise
    return files


def _copy_bounded(src, out, size: int) -> int:
    copied = 0
    for block in read_bounded(src.read, size):
        out.write(block)
        copied += len(block)
    return copied


def _cleanup(dest: Path, created: bool) -> None:
    if created:
        shutil.rmtree(dest, ignore_errors=True)
    else:
        for p in dest.iterdir():
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
