"""Several llama.cpp builds in one manifest: which builds there are, which build each strategy runs on, and the
names of a strategy listed once per build.

A manifest's `builds: {name: {llama_cpp: ..., build: ...}}` names builds; each entry's `llama_cpp` and `build`
replace the top-level ones (an empty entry is the top-level build itself). Without `builds` the top-level pair is
the one build, unnamed, as before. A strategy runs on its `build` (default: the first build), or on each of its
`builds`: one strategy per build, named like a sweep's combination (`ngram-mod[build=b10502]`,
`draft-simple[p-min=0.75,build=b10502]`), each paired with the baseline of its own build and measured in the same
rounds as the others, so a build's effect is paired by round like a strategy's. The same entry on another build
is found by taking the build's part out of the name (`across`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from harness.intake.bounded_yaml import ManifestError

#: The part of a strategy's name that says its build (inside the brackets, last).
BUILD_PART = "build="


def named(raw: Mapping[str, Any]) -> list[str]:
    """The build names a schema-checked manifest gives, in order (empty: the one top-level build)."""
    return list((raw.get("builds") or {}).keys())


def entry(raw: Mapping[str, Any], name: str, key: str) -> Any:
    """A build's `llama_cpp` or `build` section: its own, else the top-level one (None when neither is given)."""
    own = (raw.get("builds") or {}).get(name) or {}
    return own.get(key, raw.get(key))


def of_strategy(s: Mapping[str, Any], names: Sequence[str], where: str) -> tuple[list[str], bool]:
    """The builds one strategy entry runs on, and whether its expanded names say the build (a list of more than
    one); ManifestError naming `where` when it names a build the manifest does not have, or gives both keys."""
    if "build" in s and "builds" in s:
        raise ManifestError(f"{where}.builds: give build (one) or builds (a list), not both")
    wanted = list(s["builds"]) if "builds" in s else [s["build"]] if "build" in s else []
    if wanted and not names:
        key = "builds" if "builds" in s else "build"
        raise ManifestError(f"{where}.{key}: the manifest names no builds (give builds: {{name: {{llama_cpp: ..., "
                            "build: ...}}}} at the top level)")
    for i, b in enumerate(wanted):
        if b not in names:
            at = f"builds[{i}]" if "builds" in s else "build"
            raise ManifestError(f"{where}.{at}: {b!r} is not a key of builds (expected one of {list(names)})")
    if not wanted:
        return ([names[0]] if names else [None]), False  # type: ignore[list-item]
    return wanted, len(wanted) > 1


def name_on(sid: str, build: str) -> str:
    """A strategy's name on a build: the build's part last inside the brackets (`x[build=b]`, `x[n=3,build=b]`)."""
    return f"{sid[:-1]},{BUILD_PART}{build}]" if sid.endswith("]") else f"{sid}[{BUILD_PART}{build}]"


def across(sid: str, build: str | None) -> str:
    """The strategy's name without its build's part: the same for one entry on every build."""
    if not build:
        return sid
    part = f"{BUILD_PART}{build}]"
    if sid.endswith(f",{part}"):
        return sid[:-len(part) - 1] + "]"
    if sid.endswith(f"[{part}"):
        return sid[:-len(part) - 1]
    return sid


def backend_problem(backends: Mapping[str, str]) -> tuple[str, str] | None:
    """(build, message) when the builds do not share one backend: one run measures on one kind of device."""
    first = next(iter(backends.items()), None)
    for name, backend in backends.items():
        if first is not None and backend != first[1]:
            return name, (f"{backend!r}, but build {first[0]!r} is {first[1]!r}: the builds of one manifest share "
                          "a backend (one run measures on one kind of device)")
    return None
