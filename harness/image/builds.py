"""Every build a manifest names, as an image: `invoke build` builds (or finds) each of them, `invoke validate` says
each build's source and whether an engine holds its image. Each build is the manifest as that build sees it
(harness/intake/manifest.py `for_build`), so finding and building an image is what it is for a manifest of one
build (harness/image/build.py, images.py): an image is known by its identity, whichever manifest asked for it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from harness import KitError
from harness.formatter import console
from harness.hosts.engine import Engine
from harness.image import build as bd
from harness.image import images
from harness.image.source import describe_source
from harness.intake.manifest import Manifest
from harness.intake.trust import Trusted
from harness.store.buildrecord import BuildRecord


def chosen(manifest: Manifest, only: str | None) -> list[str | None]:
    """The builds a task works on: every build of the manifest, or the one named (`--build NAME`)."""
    names = manifest.build_names()
    if only is None:
        return names
    if only not in names:
        known = [n for n in names if n] or ["(none: the manifest has one build, give no --build)"]
        raise KitError(f"--build: {only!r} is not a build of {manifest.name} (builds: {', '.join(known)})")
    return [only]


def build_each(engine: Engine, trusted: Trusted, only: str | None = None, log: Callable[[str], None] = print,
               **kwargs: Any) -> list[tuple[str | None, BuildRecord]]:
    """Build (or reuse) the image of every build of the manifest, or of the one named, on an engine: (build name,
    build record) each; `kwargs` as harness/image/build.py `build` takes them."""
    out = []
    for name in chosen(trusted.manifest, only):
        if name:
            log(f"build {name}: {source_text(trusted.manifest.for_build(name))}")
        out.append((name, bd.build(engine, trusted.on_build(name), log=log, **kwargs)))
    return out


def source_text(manifest: Manifest) -> str:
    """The (one) build's source in a few words, fetching nothing: sdist package==version (sha256), a git ref
    (commit), or a local folder; with its llama.cpp build number and the backend."""
    tree = describe_source(manifest)
    ident = tree.identity
    if tree.kind == "sdist":
        what = f"sdist {ident['package']}=={ident['version']} (sha256 {ident['sha256'][:12]})"
    elif tree.kind == "git":
        what = f"git {ident['repo']} {ident['ref']}" + (f" (commit {ident['commit'][:12]})" if ident.get("commit")
                                                        else " (commit not pinned)")
    else:
        what = f"local folder {ident['path']}"
    flags = " ".join(manifest.build.cmake_args)
    return (f"llama.cpp b{tree.build_number} ({tree.commit}), {what}, {manifest.build.backend}"
            + (f", {flags}" if flags else ""))


def presence(engine: Engine | None, manifest: Manifest, why_none: str = "") -> list[str]:
    """One line per build: its name, source and whether the engine holds its image (found by identity); without
    an engine (`why_none` says why), that it could not be looked for."""
    lines = []
    for name in manifest.build_names():
        m = manifest.for_build(name)
        head = f"  {name}: " if name else "  "
        if engine is None:
            state = f"image not looked for ({why_none})"
        elif not images.identity_known(m):
            state = "image: found once built (a git ref without a pinned commit is resolved by `invoke build`)"
        else:
            found = images.find(engine, m)
            state = f"image {found.tag} present on {engine.name}" if found else \
                f"no image on {engine.name} yet (`invoke build --manifest {manifest.path.name}" + \
                (f" --build {name}" if name else "") + "` or `invoke run` builds it)"
        lines.append(console(f"{head}{source_text(m)}; {state}", 600))
    return lines
