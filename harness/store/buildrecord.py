"""An image's build record: which image (tag and id), made how (the recipe's plan: backend, source, CMake flags),
on which host, reused or built in how long, and what its checks found. `invoke build` writes it (the image cache,
build.json beside a run) and run.json holds it as `build` (and `builds`, one per build of a run of several).

The record is read and written here only: `from_json` checks it against schemas/build.schema.json, `to_json` writes
the keys in the order the files have always had."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, TypedDict

from harness import schema
from harness.files import atomic_write_text

#: The keys of a build record in the order its files hold them (the checks only where a check ran).
_ORDER = ("format_version", "tag", "image_id", "reused", "built_at", "build_seconds", "host", "server_version",
          "plan", "vulkan_checks", "cuda_checks")
_OPTIONAL = ("vulkan_checks", "cuda_checks")


class SourceIdentity(TypedDict, total=False):
    """What pins a llama.cpp source: an sdist's package, version and sha256 (and index when not PyPI), a git
    repository's ref and commit, or a local folder's path and content hash (harness/image/source.py)."""

    package: str
    version: str
    sha256: str
    index: str
    repo: str
    ref: str | None
    commit: str
    path: str
    dirty: bool
    content_sha256: str


class Source(SourceIdentity):
    """The source an image was built from: its kind, identity, build number and commit."""

    kind: str  # sdist | git | path
    build_number: int


class _PlanJsonRequired(TypedDict):
    backend: str
    base_image: str
    runtime_image: str
    cmake_args: list[str]
    build_args: dict[str, str]
    labels: dict[str, str]
    tag: str
    source: Source


class PlanJson(_PlanJsonRequired, total=False):
    """The recipe's plan as the record keeps it (harness/image/recipe.py `BuildPlan`)."""

    base_reason: str
    dockerfile_sha256: str
    registry_free: bool
    notes: list[str]
    arch: str


@dataclass(frozen=True)
class BuildRecord:
    tag: str
    image_id: str
    reused: bool
    host: str
    server_version: str
    #: The recipe's plan (harness/image/recipe.py `Plan.as_dict`): backend, base and runtime images, CMake and
    #: build arguments, labels, tag and the llama.cpp source.
    plan: PlanJson
    built_at: str | None = None
    build_seconds: float | None = None  # None when the image was found, not built
    vulkan_checks: dict[str, Any] | None = None  # the Vulkan image's check when it was built
    cuda_checks: dict[str, Any] | None = None  # the CUDA image's library check when it was built
    format_version: int = schema.FORMAT_VERSIONS["build"]

    @property
    def backend(self) -> str:
        return str(self.plan["backend"])

    @property
    def source(self) -> Source:
        """The llama.cpp source the image was built from (kind, build number, commit, ...)."""
        return Source(**(self.plan.get("source") or {}))

    def on(self, host: str) -> BuildRecord:
        """The same image found again on `host`."""
        return replace(self, host=host, reused=True)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        return {k: out[k] for k in _ORDER if not (k in _OPTIONAL and out[k] is None)}

    @classmethod
    def from_json(cls, x: Any, where: str) -> BuildRecord:
        """A build record from a file (its types checked by the schema; keys the kit does not know left out)."""
        x = schema.read("build", x, where)
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in x.items() if k in names})

    def write(self, path: Path) -> None:
        atomic_write_text(path, json.dumps(self.to_json(), indent=2) + "\n")
