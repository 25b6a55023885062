"""The build plan of an image (what `invoke build --plan` prints): base and runtime images, build arguments, CMake
flags, and the identity labels that name the image by what it is (source, flags, backend, bases, recipe,
architecture). A pure function of the manifest, the source tree and the bases; nothing here talks to an engine."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import cast

from harness import DOCKER, LABEL_PREFIX, __version__
from harness.image import backends, bases
from harness.image.source import SourceTree
from harness.intake.manifest import Manifest
from harness.models import preflight
from harness.store.buildrecord import PlanJson, Source

DOCKERFILE = DOCKER / "Dockerfile"
PROBE_DIR = DOCKER / "probe"
#: Programs built after the compile step (the Vulkan device list, the ggml bandwidth probe).
DEVICE_DIR = DOCKER / "device"
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
    source: Source
    dockerfile_sha256: str
    registry_free: bool = False
    notes: list[str] = field(default_factory=list)
    arch: str = ""

    def as_dict(self) -> PlanJson:
        return cast(PlanJson, asdict(self))


# ---------------------------------------------------------------- plan


def cmake_args(manifest: Manifest, backend: str, source: SourceTree) -> list[str]:
    args = list(COMMON_CMAKE) + backends.get(backend).cmake_flags(manifest.build.cuda_architectures)
    args += [f"-DLLAMA_BUILD_NUMBER={source.build_number}", f"-DLLAMA_BUILD_COMMIT={source.commit}"]
    args += list(manifest.build.cmake_args)
    return args


def _recipe_sha256() -> str:
    h = hashlib.sha256(DOCKERFILE.read_bytes())
    for p in sorted(PROBE_DIR.iterdir()):
        h.update(p.name.encode() + p.read_bytes())
    for p in sorted(DEVICE_DIR.iterdir()):
        h.update(b"device/" + p.name.encode() + p.read_bytes())
    return h.hexdigest()


def build_plan(manifest: Manifest, source: SourceTree, backend: str | None = None,
         made: bases.BaseImages | None = None, arch: str | None = None) -> BuildPlan:
    """Render what would be built: base images, build args, CMake flags, labels and the derived tag.

    arch: the target engine's architecture (default: this machine's); it is part of the identity."""
    backend = backend or manifest.build.backend
    row = backends.get(backend)
    arch = arch or bases.local_arch()
    notes: list[str] = []
    registry_free = False
    if manifest.build.base_image:
        base_image = manifest.build.base_image
        runtime_image = manifest.build.runtime_image or base_image
        reason = "from the manifest's build.base_image/runtime_image"
    elif row.debian is None and made is not None:
        # image/cuda_base.py: nvidia/cuda devel with CMake added, or (`--base offline`) the toolkit from PyPI wheels.
        registry_free = made.registry_free
        base_image, runtime_image, reason = made.builder, made.runtime, made.reason
    elif row.debian is None:
        base_image, runtime_image = CUDA_BASE, CUDA_RUNTIME
        reason = "NVIDIA CUDA devel/runtime images (the toolkit cannot be made without a registry)"
    else:
        made = made or bases.planned(arch, backend)
        base_image, runtime_image, reason = made.builder, made.runtime, made.reason
        registry_free = "-registry-" not in base_image
    flags = cmake_args(manifest, backend, source)
    recipe = _recipe_sha256()
    key = json.dumps({"source": source.key, "backend": backend, "cmake": flags, "base": base_image,
                      "runtime": runtime_image, "recipe": recipe, "arch": manifest.build.cuda_architectures,
                      "platform": arch},
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
        f"{LABEL_PREFIX}.cuda-architectures": manifest.build.cuda_architectures if row.architectures else "",
        f"{LABEL_PREFIX}.base-image": base_image,
        f"{LABEL_PREFIX}.runtime-image": runtime_image,
        f"{LABEL_PREFIX}.recipe-sha256": recipe,
        f"{LABEL_PREFIX}.plan-key": digest,
        f"{LABEL_PREFIX}.arch": arch,
    }
    if (source.path / "src").is_dir():  # read from the source itself: what its loader knows (the pre-flight checks it)
        labels[f"{LABEL_PREFIX}.spec-flavours"] = preflight.flavour_label(preflight.supported_flavours(source.path))
    notes += row.notes(manifest.build.cuda_architectures)
    # a git source's identity names its commit too: the tree's own is the one recorded
    src: Source = {"kind": source.kind, **source.identity, "build_number": source.build_number,
                   "commit": source.commit}
    p = BuildPlan(backend, base_image, runtime_image, reason, flags, build_args, labels, tag, src, recipe,
                  registry_free, notes, arch)
    # The whole plan rides on the image, so any engine's copy says what it is (harness/image/images.py reads it).
    p.labels[f"{LABEL_PREFIX}.plan"] = json.dumps({k: v for k, v in p.as_dict().items() if k != "labels"},
                                                  sort_keys=True)
    return p


# ---------------------------------------------------------------- context and build
