"""Crafted inputs for the trust tests: archives member by member, a real bundle of the committed demo run to
tamper with, and a sandbox that proves nothing was written outside the work folder."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
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
