"""Finding the llama.cpp image a manifest needs on an engine by what the image is, not by who asked for it.

Every image the kit builds carries its identity in labels (harness/image/build.py: source, CMake flags, backend, bases,
recipe, architecture, the build plan's key that names the tag, and the whole build plan as JSON). An image on an
engine serves a manifest when the manifest's build plan, with that image's source and bases, has the same key: the
source must be one the manifest allows (an sdist by sha256; a git repo and ref, and its commit when pinned; a local
folder by its content hash), and the bases must be ones made for the engine's architecture. Two manifests with the
same source, flags and backend therefore share one image, on any host that holds it.

Build records of found images are cached by image id under .cache/builds/images/ (the id names the content, so
one record serves every engine that holds the image)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness import LABEL_PREFIX, schema
from harness.hosts.engine import Engine, Image
from harness.image import backends, bases, recipe
from harness.image.source import CACHE, SourceTree, _kinds, describe_source, resolve_path
from harness.intake.manifest import Manifest
from harness.store.buildrecord import BuildRecord

RECORDS = CACHE / "builds" / "images"


@dataclass(frozen=True)
class Found:
    """An image on an engine that serves a manifest, and the build plan it was built from."""

    image: Image
    build_plan: recipe.BuildPlan

    @property
    def tag(self) -> str:
        return self.build_plan.tag


def identity_known(manifest: Manifest, prefer: str | None = None) -> bool:
    """Is the preferred source pinned without fetching anything (so an image can be matched before resolving it)?
    A git ref without a pinned commit can move: `invoke build` resolves it first."""
    kind = _kinds(manifest, prefer)[0]
    return not (kind == "git" and not manifest.llama_cpp.git.commit)


def source_from_labels(manifest: Manifest, labels: dict[str, str], prefer: str | None = None,
                       local_tree: Callable[[], SourceTree] | None = None) -> SourceTree | None:
    """The source the manifest would resolve to if it resolved to the image's recorded one; None when the
    manifest does not allow that source."""
    try:
        recorded = json.loads(labels.get(f"{LABEL_PREFIX}.source", ""))
        build_number = int(labels.get(f"{LABEL_PREFIX}.llama-build-number", ""))
    except (ValueError, TypeError):
        return None
    if not isinstance(recorded, dict):
        return None
    kind = recorded.pop("kind", None)
    if kind not in _kinds(manifest, prefer):
        return None
    lc = manifest.llama_cpp
    if kind == "sdist":
        want = describe_source(manifest, "sdist")
        return want if want.identity == recorded else None
    if kind == "git":
        g = lc.git
        commit = recorded.get("commit")
        if recorded.get("repo") != g.repo or recorded.get("ref") != g.ref or not isinstance(commit, str) \
                or (g.commit and commit != g.commit):
            return None
        return SourceTree(Path("-"), "git", {"repo": g.repo, "ref": g.ref, "commit": commit},
                          lc.build_number or build_number, lc.commit or commit[:10])
    if recorded.get("path") != str(lc.path):
        return None
    want = (local_tree or (lambda: resolve_path(manifest, lambda s: None)))()
    return want if want.identity == recorded else None


def bases_from_labels(manifest: Manifest, backend: str, labels: dict[str, str], arch: str) -> bases.BaseImages | None:
    """The image's bases when they are ones made for this architecture (a backend whose bases the kit makes, no
    bases in the manifest)."""
    if backends.get(backend).debian is None or manifest.build.base_image:
        return None
    pair = (labels.get(f"{LABEL_PREFIX}.base-image"), labels.get(f"{LABEL_PREFIX}.runtime-image"))
    return next((b for b in bases.candidates(arch, backend) if (b.builder, b.runtime) == pair), None)


def matching_build_plan(manifest: Manifest, labels: dict[str, str], backend: str, arch: str, prefer: str | None = None,
                  local_tree: Callable[[], SourceTree] | None = None) -> recipe.BuildPlan | None:
    """The manifest's build plan for an image with these labels, when it is the image's (same plan key)."""
    if labels.get(f"{LABEL_PREFIX}.backend") != backend or labels.get(f"{LABEL_PREFIX}.arch") != arch:
        return None
    tree = source_from_labels(manifest, labels, prefer, local_tree)
    if tree is None:
        return None
    made = bases_from_labels(manifest, backend, labels, arch)
    if backends.get(backend).debian is not None and not manifest.build.base_image and made is None:
        return None  # bases of another architecture, or ones this kit does not make
    p = recipe.build_plan(manifest, tree, backend, made, arch)
    return p if p.labels[f"{LABEL_PREFIX}.plan-key"] == labels.get(f"{LABEL_PREFIX}.plan-key") else None


def find(engine: Engine, manifest: Manifest, backend: str | None = None, *, prefer: str | None = None,
         arch: str | None = None) -> Found | None:
    """The newest image on the engine that serves the manifest, or None."""
    backend = backend or manifest.build.backend
    arch = arch or bases.engine_arch(engine)
    tree: list[SourceTree] = []

    def local_tree() -> SourceTree:  # a local folder is hashed once, and only when an image names it
        if not tree:
            tree.append(resolve_path(manifest, lambda s: None))
        return tree[0]

    found = []
    for img in engine.images([f"{LABEL_PREFIX}.backend={backend}", f"{LABEL_PREFIX}.plan-key"]):
        p = matching_build_plan(manifest, img.labels, backend, arch, prefer, local_tree)
        if p is not None and p.tag in img.tags:
            found.append((str(img.created or ""), p.tag, Found(img, p)))
    return max(found, key=lambda x: x[:2])[2] if found else None


def _record_path(image_id: str) -> Path:
    return RECORDS / f"{image_id.split(':')[-1]}.json"


def remember(record: BuildRecord) -> None:
    """Cache a build record by its image id."""
    RECORDS.mkdir(parents=True, exist_ok=True)
    record.write(_record_path(record.image_id))


def record_of(engine: Engine, found: Found, host: str) -> BuildRecord:
    """The build record of a found image (cached by image id; made from its labels the first time)."""
    path = _record_path(found.image.id)
    try:
        cached = BuildRecord.from_json(json.loads(path.read_text()), str(path))
        if cached.tag == found.tag and cached.image_id == found.image.id:
            return cached.on(host)
    except Exception:  # noqa: BLE001 - a missing or unreadable cache entry is made again
        pass
    record = BuildRecord(tag=found.tag, image_id=found.image.id, reused=True, built_at=found.image.created,
                         build_seconds=None, host=host, server_version=version_of(engine, found.tag),
                         plan=found.build_plan.as_dict())
    schema.check("build", record.to_json(), "build record")
    remember(record)
    return record


def record(engine: Engine, manifest: Manifest, host: str, backend: str | None = None,
           prefer: str | None = None) -> BuildRecord | None:
    """The build record of the image that serves the manifest on this engine, or None when it holds none."""
    found = find(engine, manifest, backend, prefer=prefer)
    return None if found is None else record_of(engine, found, host)


def version_of(engine: Engine, image: str) -> str:
    """What `llama-server --version` prints inside the image (it prints to stderr)."""
    return engine.run_container(image, ["llama-server", "--version"], {f"{LABEL_PREFIX}.role": "version"},
                                timeout=120).text.strip()
