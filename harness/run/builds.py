"""A run of several llama.cpp builds: each build's image found (or built) on every engine, each strategy's model
files checked against its own build's llama.cpp, and each strategy's image chosen for its containers.

One run measures every build in the same rounds (the builds' strategies are cells of one plan, shuffled
together), so a build's effect is paired by round like any strategy's; this module only keeps each strategy on
its own build's image and pre-flight."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from harness.image import builds as image_builds
from harness.intake.manifest import Manifest
from harness.models import preflight
from harness.store.buildrecord import BuildRecord

Flavours = Mapping[str, bool] | Iterable[str] | None


def images(records: Mapping[str | None, BuildRecord]) -> dict[str | None, str]:
    """Each build's image tag, from its build record."""
    return {name: r.tag for name, r in records.items()}


def image_for(images_by_build: Mapping[str | None, str], strategy: Any, default: str) -> str:
    """The image a strategy's containers run: its build's (the run's one image for a run of one build)."""
    return images_by_build.get(getattr(strategy, "build", None), default)


def check_strategies(manifest: Manifest, strategies: Iterable[Any], facts_of: Callable[[str], Any],
                     flavours_of: Callable[[str | None], Flavours],
                     skipped: list[tuple[str, str]] | None = None) -> list[str]:
    """The pre-flight of model files (harness/models/preflight.py), each strategy against the llama.cpp of its own
    build (`flavours_of(build)`: what that build's loader knows, None when unknown); with several builds each
    line names the build, so a drafter a build cannot load is one line naming both."""
    strategies = list(strategies)
    out: list[str] = []
    for name in manifest.build_names():
        group = [s for s in strategies if getattr(s, "build", None) == name]
        if not group:
            continue
        lines = preflight.check_strategies(group, facts_of, flavours_of(name), skipped)
        if name:
            where = image_builds.source_text(manifest.for_build(name)).split(",")[0]
            lines = [f"build {name} ({where}): {x}" for x in lines]
        out += lines
    return out
